"""Shape and data-movement ops: aliases (reshape family), views (transpose, expand, slice), concat,
and the shape queries that always fold because every shape is static."""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.common import broadcast_shapes, const_input, norm_axis
from aotc.ops.index import checked_index
from aotc.ops.registry import OpDef, register

# An index map gives, for each dimension of a tensor, the loop it follows: (loop, scale, offset)
# means index = offset + scale * i_loop; loop -1 means the index is the constant ``offset``.
IndexMap = tuple[tuple[int, int, int], ...]


def _in(node: Node, i: int = 0):
    v = node.inputs[i]
    assert v is not None and v.shape is not None
    return v


# -- aliases: same bytes, another shape ------------------------------------------------------------
def _reshape_infer(node: Node):
    x = _in(node)
    target = [int(d) for d in const_input(node, 1, "the target shape")]
    allow_zero = bool(node.attr("allowzero", 0))
    out = [x.shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise AotcError(f"Reshape node {node.name!r}: more than one -1 in shape {target}")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or x.size % known:
            raise AotcError(f"Reshape node {node.name!r}: cannot reshape {x.shape} to {target}")
        out[out.index(-1)] = x.size // known
    if int(np.prod(out)) != x.size:
        raise AotcError(f"Reshape node {node.name!r}: cannot reshape {x.shape} to {target}")
    return [(tuple(out), x.dtype)]


def _flatten_infer(node: Node):
    x = _in(node)
    rank = len(x.shape)
    axis = int(node.attr("axis", 1))
    if not -rank <= axis <= rank:  # Flatten's axis may equal the rank; a negative one counts from it
        raise AotcError(f"Flatten node {node.name!r}: axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis]))
    return [((outer, int(np.prod(x.shape[axis:]))), x.dtype)]


def _axes(node: Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    a = const_input(node, 1, "axes")
    return None if a is None else [int(v) for v in a.reshape(-1)]


def _squeeze_infer(node: Node):
    x = _in(node)
    axes = _axes(node)
    if axes is None:
        return [(tuple(d for d in x.shape if d != 1), x.dtype)]
    axes = [norm_axis(a, len(x.shape), node) for a in axes]
    if any(x.shape[a] != 1 for a in axes):
        raise AotcError(f"Squeeze node {node.name!r}: axes {axes} of shape {x.shape} are not 1")
    return [(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)]


def _unsqueeze_infer(node: Node):
    x = _in(node)
    axes = _axes(node) or []
    rank = len(x.shape) + len(axes)
    axes = sorted(norm_axis(a, rank, node) for a in axes)
    out = list(x.shape)
    for a in axes:
        out.insert(a, 1)
    return [(tuple(out), x.dtype)]


def _same_infer(node: Node):
    x = _in(node)
    return [(x.shape, x.dtype)]


register(OpDef("Reshape", "alias", _reshape_infer, const_inputs=(1,)))
register(OpDef("Flatten", "alias", _flatten_infer))
register(OpDef("Squeeze", "alias", _squeeze_infer, const_inputs=(1,)))
register(OpDef("Unsqueeze", "alias", _unsqueeze_infer, const_inputs=(1,)))
register(OpDef("Identity", "alias", _same_infer))


# -- views: index remaps fused into the consumer's loops -------------------------------------------
def _transpose_perm(node: Node) -> list[int]:
    rank = len(_in(node).shape)
    perm = node.attr("perm")
    return list(range(rank))[::-1] if perm is None else [norm_axis(p, rank, node) for p in perm]


def _transpose_infer(node: Node):
    x = _in(node)
    perm = _transpose_perm(node)
    if sorted(perm) != list(range(len(x.shape))):
        raise AotcError(f"Transpose node {node.name!r}: bad perm {perm}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_view(node: Node, out: IndexMap) -> IndexMap:
    perm = _transpose_perm(node)
    res: list[tuple[int, int, int]] = [(-1, 0, 0)] * len(perm)
    for d, p in enumerate(perm):
        res[p] = out[d]
    return tuple(res)


def broadcast_view(in_shape: tuple[int, ...], out_shape: tuple[int, ...], out: IndexMap) -> IndexMap:
    """The index map of an input broadcast (numpy rules) to ``out_shape``."""
    lead = len(out_shape) - len(in_shape)
    return tuple((-1, 0, 0) if d == 1 and out_shape[k + lead] != 1 else out[k + lead]
                 for k, d in enumerate(in_shape))


def _expand_infer(node: Node):
    x = _in(node)
    shape = tuple(int(d) for d in const_input(node, 1, "the target shape"))
    return [(broadcast_shapes(x.shape, shape, where=f"Expand node {node.name!r}"), x.dtype)]


def _expand_view(node: Node, out: IndexMap) -> IndexMap:
    return broadcast_view(_in(node).shape, node.outputs[0].shape, out)


def slice_params(node: Node) -> list[tuple[int, int, int]]:
    """Per input axis: (start, step, count) after clamping, as ONNX Slice defines them."""
    x = _in(node)
    rank = len(x.shape)
    if "starts" in node.attrs:  # opset < 10
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts = const_input(node, 1, "starts")
        ends = const_input(node, 2, "ends")
        axes = const_input(node, 3, "axes")
        steps = const_input(node, 4, "steps")
    starts = [int(s) for s in np.asarray(starts).reshape(-1)]
    ends = [int(e) for e in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [norm_axis(int(a), rank, node)
                                                          for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    params = [(0, 1, d) for d in x.shape]
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if st == 0:
            raise AotcError(f"Slice node {node.name!r}: step 0")
        dim = x.shape[a]
        rng = range(dim)[slice(s, e, st)]
        params[a] = (rng.start if len(rng) else 0, st, len(rng))
    return params


def _slice_infer(node: Node):
    x = _in(node)
    return [(tuple(c for _, _, c in slice_params(node)), x.dtype)]


def _slice_view(node: Node, out: IndexMap) -> IndexMap:
    res = []
    for (start, step, _), (loop, scale, off) in zip(slice_params(node), out, strict=True):
        res.append((loop, scale * step, start + step * off))
    return tuple(res)


register(OpDef("Transpose", "view", _transpose_infer, view=_transpose_view))
register(OpDef("Expand", "view", _expand_infer, view=_expand_view, const_inputs=(1,)))
register(OpDef("Slice", "view", _slice_infer, view=_slice_view, const_inputs=(1, 2, 3, 4)))


# -- concat: a copy kernel -----------------------------------------------------------------------------
def _concat_infer(node: Node):
    ins = [v for v in node.inputs if v is not None]
    rank = len(ins[0].shape)
    axis = norm_axis(node.attr("axis", 0), rank, node)
    out = list(ins[0].shape)
    for v in ins[1:]:
        if len(v.shape) != rank or any(a != b for i, (a, b) in enumerate(zip(v.shape, out, strict=True))
                                       if i != axis):
            raise AotcError(f"Concat node {node.name!r}: shapes do not match")
        out[axis] += v.shape[axis]
    return [(tuple(out), ins[0].dtype)]


def _concat_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = [v for v in node.inputs if v is not None]
    shape = node.outputs[0].shape
    axis = norm_axis(node.attr("axis", 0), len(shape), node)
    outer = int(np.prod(shape[:axis]))
    inner = int(np.prod(shape[axis + 1:]))
    row = shape[axis] * inner
    lines = [f"for (size_t o = task; o < {outer}; o += ntasks) {{", "  size_t at = 0;"]
    for name, v in zip(ins, x, strict=True):
        n = v.shape[axis] * inner
        if n:
            lines.append(f"  memcpy({outs[0]} + o * {row} + at, {name} + o * {n}, {n} * sizeof({ctype}));")
            lines.append(f"  at += {n};")
    lines.append("  (void)at;")
    lines.append("}")
    return "\n".join(lines)


register(OpDef("Concat", "kernel", _concat_infer, emit=_concat_emit))


# -- shape queries: always folded ---------------------------------------------------------------------
def _shape_fold(node: Node, _args: list[np.ndarray]) -> list[np.ndarray]:
    shape = _in(node).shape
    start = node.attr("start", 0)
    end = node.attr("end", None)
    return [np.array(shape[slice(start, end)], dtype=np.int64)]


def _shape_infer(node: Node):
    return [(_shape_fold(node, [])[0].shape, np.dtype(np.int64))]


register(OpDef("Shape", "static", _shape_infer, fold=_shape_fold))
register(OpDef("Size", "static", lambda n: [((), np.dtype(np.int64))],
               fold=lambda n, _a: [np.array(_in(n).size, dtype=np.int64)]))


# -- gather: a kernel indexing with run-time indices ---------------------------------------------------
def _gather_infer(node: Node):
    x, idx = _in(node, 0), _in(node, 1)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    return [((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]), x.dtype)]


def _gather_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node, 0), _in(node, 1)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    outer = int(np.prod(x.shape[:axis]))
    inner = int(np.prod(x.shape[axis + 1:]))
    n, dim = idx.size, x.shape[axis]
    if outer * n == 0:
        return "(void)0;"
    # An out-of-range index stops the run with ERR_INDEX_OUT_OF_RANGE (a constant one fails the compile).
    k = checked_index(node, "k", f"{ins[1]}[j]", dim, idx.const.astype(np.int64) if idx.is_const else None)
    return (f"for (size_t o = task; o < {outer}; o += ntasks)\n"
            f"  for (size_t j = 0; j < {n}; j++) {{\n"
            + "".join(f"    {line}\n" for line in k.split("\n")) +
            f"    memcpy({outs[0]} + (o * {n} + j) * {inner}, {ins[0]} + (o * {dim} + (size_t)k) * {inner}, "
            f"{inner} * sizeof({ctype}));\n"
            f"  }}")


register(OpDef("Gather", "kernel", _gather_infer, emit=_gather_emit))


# -- BitCast: the same bytes read as another type of the same width -----------------------------------
def _bitcast_infer(node: Node):
    from aotc.ir import dtypes

    x = _in(node)
    to = dtypes.from_onnx(int(node.attr("to")))
    if np.dtype(to).itemsize != np.dtype(x.dtype).itemsize:
        raise AotcError(f"BitCast node {node.name!r}: {np.dtype(x.dtype)} and {np.dtype(to)} differ in width")
    return [(x.shape, to)]


def _bitcast_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    # A byte copy (never a pointer cast): reading one type through another's pointer breaks C's aliasing rules.
    return f"if (task == 0) memcpy({outs[0]}, {ins[0]}, {_in(node).nbytes});\n(void)ntasks;"


register(OpDef("BitCast", "kernel", _bitcast_infer, emit=_bitcast_emit,
               fold=lambda n, a: [a[0].view(_bitcast_infer(n)[0][1])]))
