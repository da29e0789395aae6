"""Gradients of the ops that move data without arithmetic: the reshape family, Transpose, Expand,
Concat, Split, Slice, Pad and Gather. Slice and Gather scatter their cotangent back into zeros with
internal kernels (``aotc.SliceGrad``, ``aotc.GatherGrad``)."""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.common import const_input, norm_axis
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.registry import OpDef, register
from aotc.ops.shape import slice_params


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    return [b.reshape(g, x.shape)]


@rule("Transpose")
def _transpose(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    assert g is not None
    perm = node.attr("perm", list(range(len(g.shape)))[::-1])
    return [b.transpose(g, np.argsort([norm_axis(int(p), len(g.shape), node) for p in perm]))]


@rule("Expand")
def _expand(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    return [b.sum_to(g, x.shape), None]


def _slice_of(b: GradBuilder, g: Value, axis: int, start: int, stop: int) -> Value:
    if start == 0 and stop == g.shape[axis]:
        return g
    return b.op("Slice", g, b.ints([start]), b.ints([stop]), b.ints([axis]))


@rule("Concat")
def _concat(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    assert g is not None
    axis = norm_axis(int(node.attr("axis", 0)), len(g.shape), node)
    grads: Grads = []
    at = 0
    for v, need in zip(node.inputs, needs, strict=True):
        assert v is not None
        grads.append(_slice_of(b, g, axis, at, at + v.shape[axis]) if need else None)
        at += v.shape[axis]
    return grads


@rule("Split")
def _split(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x = node.inputs[0]
    assert x is not None
    axis = norm_axis(int(node.attr("axis", 0)), len(x.shape), node)
    parts = [g if g is not None else b.zeros(v.shape, v.dtype) for g, v in zip(dys, node.outputs, strict=True)]
    return [parts[0] if len(parts) == 1 else b.op("Concat", *parts, axis=axis)]


def _input_shaped(node: Node):
    """The scatter-back kernels' output: the forward input's shape (attribute ``shape``), the cotangent's dtype."""
    return [(tuple(node.attrs["shape"]), node.inputs[0].dtype)]


def _slice_grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Zeros, then the cotangent written at the sliced positions; one task (a copy's worth of work)."""
    shape = node.attrs["shape"]
    params = node.attrs["params"]
    g = node.inputs[0]
    size = int(np.prod(shape))
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    lines = ["if (task != 0) return;", "(void)ntasks;",
             f"for (size_t i = 0; i < {size}; i++) {outs[0]}[i] = 0;",
             f"for (size_t e = 0; e < {g.size}; e++) {{", "  size_t rest = e, at = 0;"]
    for axis in reversed(range(len(shape))):
        start, step, count = params[axis]
        lines.append(f"  at += (size_t)((int64_t){start} + (int64_t){step} * (int64_t)(rest % {max(count, 1)})) "
                     f"* {strides[axis]}; rest /= {max(count, 1)};")
    lines += [f"  {outs[0]}[at] = {ins[0]}[e];", "}"]
    return "\n".join(lines)


register(OpDef("aotc.SliceGrad", "kernel", _input_shaped, emit=_slice_grad_emit))


@rule("Slice")
def _slice(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    params = slice_params(node)
    if all(step == 1 for _, step, _ in params):  # zeros around it: a Pad
        pads = [s for s, _, _ in params] + [d - s - c for d, (s, _, c) in zip(x.shape, params, strict=True)]
        return [b.op("Pad", g, b.ints(pads), b.scalar(0, g))]
    return [b.op("aotc.SliceGrad", g, shape=list(x.shape), params=[list(p) for p in params])]


@rule("Pad")
def _pad(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    mode = node.attr("mode", "constant")
    pads = node.attr("pads") if "pads" in node.attrs else const_input(node, 1, "pads")
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes_in = const_input(node, 3, "axes") if len(node.inputs) > 3 else None
    rank = len(x.shape)
    axes = list(range(rank)) if axes_in is None else [norm_axis(int(a), rank, node) for a in axes_in.reshape(-1)]
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    if mode != "constant" or min(begin + end) < 0:
        raise AotcError(f"Pad node {node.name!r}: no gradient for mode {mode!r} or negative pads")
    out = g
    for a in range(rank):
        out = _slice_of(b, out, a, begin[a], begin[a] + x.shape[a])
    return [out]


def _gather_grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """dX[o, k, i] += dY[o, j, i] for k = indices[j]; the tasks share the rows by columns ``i``, so two
    never add into the same element, and each adds its indices in order (the same result for any count)."""
    shape, axis = node.attrs["shape"], node.attrs["axis"]
    idx = node.inputs[1]
    outer, dim = int(np.prod(shape[:axis])), shape[axis]
    inner, n = int(np.prod(shape[axis + 1:])), idx.size
    return (f"const size_t lo = {inner} * (size_t)task / (size_t)ntasks, "
            f"hi = {inner} * ((size_t)task + 1) / (size_t)ntasks;\n"
            f"for (size_t o = 0; o < {outer}; o++) {{\n"
            f"  for (size_t k = 0; k < {dim}; k++) for (size_t i = lo; i < hi; i++) "
            f"{outs[0]}[(o * {dim} + k) * {inner} + i] = 0;\n"
            f"  for (size_t j = 0; j < {n}; j++) {{\n"
            f"    int64_t k = (int64_t){ins[1]}[j];\n"
            f"    if (k < 0) k += {dim};\n"
            f"    if (k < 0 || k >= {dim}) continue;  /* the forward Gather stopped the run already */\n"
            f"    {ctype} *d = {outs[0]} + (o * {dim} + (size_t)k) * {inner};\n"
            f"    const {ctype} *s = {ins[0]} + (o * {n} + j) * {inner};\n"
            f"    for (size_t i = lo; i < hi; i++) d[i] += s[i];\n"
            f"  }}\n}}")


register(OpDef("aotc.GatherGrad", "kernel", _input_shaped, emit=_gather_grad_emit))


def _added_back(b: GradBuilder, node: Node, g: Value | None, kernel: str, idx: Value | None,
                axis: int = 0) -> Grads:
    """The cotangent ``g`` added back by ``kernel`` where ``node`` read its input at indices ``idx``
    along its ``axis`` attribute (``axis`` when it has none)."""
    x = node.inputs[0]
    assert x is not None and idx is not None and g is not None
    axis = norm_axis(int(node.attr("axis", axis)), len(x.shape), node)
    return [b.op(kernel, g, idx, shape=list(x.shape), axis=axis), None]


@rule("Gather")
def _gather(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return _added_back(b, node, dys[0], "aotc.GatherGrad", node.inputs[1])


@rule("Tile")
def _tile(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Each copy's cotangent summed: g as [r0, d0, r1, d1, ...], reduced over the r axes."""
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    reps = [int(r) for r in const_input(node, 1, "repeats").reshape(-1)]
    split = b.reshape(g, [v for r, d in zip(reps, x.shape, strict=True) for v in (r, d)])
    return [b.reshape(b.reduce_sum(split, list(range(0, 2 * len(reps), 2))), x.shape), None]


def _elements_grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """dX[..., k, ...] += dY[..., j, ...] for k = indices[..., j, ...] along ``axis``, the other coordinates
    shared by X, Y and the indices; one task (a scatter with collisions, for ops rarely on a gradient path)."""
    shape, axis = node.attrs["shape"], node.attrs["axis"]
    idx = node.inputs[1]
    rank = len(shape)
    size = int(np.prod(shape))
    lines = ["if (task != 0) return;", "(void)ntasks;", f"for (size_t i = 0; i < {size}; i++) {outs[0]}[i] = 0;",
             f"for (size_t e = 0; e < {idx.size}; e++) {{", "  size_t rest = e, at = 0;"]
    for a in reversed(range(rank)):
        stride = int(np.prod(shape[a + 1:]))
        if a == axis:
            lines += [f"  int64_t k = (int64_t){ins[1]}[e];", f"  if (k < 0) k += {shape[a]};",
                      f"  if (k < 0 || k >= {shape[a]}) continue;  /* the forward op stopped the run already */",
                      f"  at += (size_t)k * {stride}; rest /= {idx.shape[a]};"]
        else:
            lines.append(f"  at += rest % {idx.shape[a]} * {stride}; rest /= {idx.shape[a]};")
    lines += ["  (void)rest;", f"  {outs[0]}[at] += {ins[0]}[e];", "}"]
    return "\n".join(lines)


register(OpDef("aotc.GatherElementsGrad", "kernel", _input_shaped, emit=_elements_grad_emit))


@rule("GatherElements")
def _gather_elements(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return _added_back(b, node, dys[0], "aotc.GatherElementsGrad", node.inputs[1])


@rule("TopK")
def _top_k(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """The values are the input gathered at the indices output along the axis."""
    return _added_back(b, node, dys[0], "aotc.GatherElementsGrad", node.outputs[1], axis=-1)


def _space_depth_steps(node: Node) -> tuple[tuple[int, ...], list[int]]:
    """DepthToSpace / SpaceToDepth as reshape -> transpose -> reshape: (the first shape, the perm)."""
    x = node.inputs[0]
    assert x is not None
    n, c, h, w = x.shape
    bs = int(node.attr("blocksize"))
    if node.op == "SpaceToDepth":
        return (n, c, h // bs, bs, w // bs, bs), [0, 3, 5, 1, 2, 4]
    if node.attr("mode", "DCR") == "CRD":
        return (n, c // (bs * bs), bs, bs, h, w), [0, 1, 4, 2, 5, 3]
    return (n, bs, bs, c // (bs * bs), h, w), [0, 3, 4, 1, 5, 2]


@rule("DepthToSpace", "SpaceToDepth")
def _space_depth(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """The forward's reshape -> transpose -> reshape, undone in reverse on the cotangent."""
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    first, perm = _space_depth_steps(node)
    moved = b.reshape(g, [first[p] for p in perm])
    return [b.reshape(b.transpose(moved, np.argsort(perm)), x.shape)]


@rule("Trilu")
def _trilu(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """The kept triangle is a constant mask: the cotangent keeps the same one."""
    g = dys[0]
    assert g is not None
    return [b.op("Trilu", g, *node.inputs[1:], upper=int(node.attr("upper", 1))), None]


@rule("CumSum")
def _cumsum(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Each input reaches the outputs after it (before it, reversed): the cotangent summed the other way."""
    g = dys[0]
    assert g is not None
    return [b.op("CumSum", g, node.inputs[1], exclusive=int(node.attr("exclusive", 0)),
                 reverse=1 - int(node.attr("reverse", 0))), None]
