"""Ops whose output size depends on the data: NonZero, Unique and NonMaxSuppression.

A compiled library has fixed output shapes, so such an output is allocated at the op's static upper
bound (NonZero: [rank, numel]; Unique: [numel], or the axis length along ``axis``; NonMaxSuppression:
[batches * classes * min(max_output_boxes_per_class, boxes), 3]) and the kernel fills its leading
part, as embedded detectors do. How much is valid, the extent along the data-dependent axis, goes to
an extra int64 scalar output that ``aotc.passes.counts.expose_counts`` adds right after the bounded output (``y_count``
for ``y``). The buffer keeps the strides of the bound shape (NonZero's coordinate d of the j-th hit
is at ``y[d * numel + j]``), and every element past the valid extent is zero, so the result is
deterministic. Unique's Y, indices and counts share one length and one count output, placed after
the first of them that is fetched; its inverse_indices has a static shape.

A bounded tensor must be a graph output: a consumer would need the true shape at compile time, so
``expose_counts`` refuses one by name. The metadata JSON marks bounded outputs (``aotc.codegen.library``)
and ``aotc.bindings`` trims them, so Python callers get exactly ONNX's shapes.

The kernels are sequential (task 0 does all the work): these ops are rare and cheap next to the
networks around them. They are never folded on constants, so that the kernel is the one definition
of the bounded layout.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.common import FLOAT_CTYPES, aligned_inputs, const_input, norm_axis, optional_input
from aotc.ops.registry import OpDef, register

COUNT_ATTR = "_count_output"  # set on a node whose last output is the count expose_counts added


def _err(node: Node, msg: str) -> AotcError:
    return AotcError(f"{node.op} node {node.name!r}: {msg}")


def _onnx_outputs(node: Node) -> int:
    """The node's outputs as ONNX defines them (without the count output)."""
    return len(node.outputs) - (1 if node.attr(COUNT_ATTR) else 0)


def _with_count(node: Node, shapes: list[tuple[tuple[int, ...], np.dtype]]) -> list:
    shapes = shapes[:_onnx_outputs(node)]
    return [*shapes, ((), np.dtype(np.int64))] if node.attr(COUNT_ATTR) else shapes


def _no_fold(node: Node, args: list) -> list[np.ndarray]:
    raise NotImplementedError("computed by the kernel, which defines the bounded layout")


def _input(node: Node, i: int) -> Value:
    v = optional_input(node, i)
    if v is None or v.shape is None:
        raise _err(node, f"input {i} is missing")
    return v


# -- NonZero ---------------------------------------------------------------------------------------
def _nonzero_infer(node: Node):
    x = _input(node, 0)
    return _with_count(node, [((len(x.shape), x.size), np.dtype(np.int64))])


def _nonzero_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _input(node, 0)
    shape, numel = x.shape, x.size
    y, count = outs[0], outs[1] if node.attr(COUNT_ATTR) else None
    lines = ["if (task) return; /* sequential: task 0 does it all */", "size_t n = 0;",
             f"for (size_t i = 0; i < {numel}; i++) {{",
             f"  if (!({ins[0]}[i] != 0)) continue;",
             "  size_t r = i;"]
    # The coordinates of flat index i, last axis first; row d of y holds axis d's coordinates.
    for d in reversed(range(len(shape))):
        lines.append(f"  {y}[{d * numel} + n] = (int64_t)(r % {shape[d]});")
        if d:
            lines.append(f"  r /= {shape[d]};")
    lines += ["  (void)r;", "  n++;", "}"]
    for d in range(len(shape)):  # zeros past the valid extent of each row
        lines.append(f"for (size_t j = n; j < {numel}; j++) {y}[{d * numel} + j] = 0;")
    if count:
        lines.append(f"{count}[0] = (int64_t)n;")
    lines.append("(void)n;")
    return "\n".join(lines)


register(OpDef("NonZero", "kernel", _nonzero_infer, emit=_nonzero_emit, fold=_no_fold))


# -- Unique ----------------------------------------------------------------------------------------
def _unique_layout(node: Node) -> tuple[int | None, int, int, int]:
    """(axis or None, outer, n, inner): the n items compared are x[o, k, i] for fixed k (each a
    single element when there is no axis)."""
    x = _input(node, 0)
    axis = node.attr("axis")
    if axis is None:
        return None, 1, x.size, 1
    a = norm_axis(int(axis), len(x.shape), node)
    return a, int(np.prod(x.shape[:a])), x.shape[a], int(np.prod(x.shape[a + 1:]))


def _unique_infer(node: Node):
    x = _input(node, 0)
    axis, _, n, _ = _unique_layout(node)
    y_shape = (n,) if axis is None else x.shape
    i64 = np.dtype(np.int64)
    return _with_count(node, [(y_shape, x.dtype), ((n,), i64), ((n,), i64), ((n,), i64)])


def _unique_scratch(node: Node) -> int:
    n = _unique_layout(node)[2]
    return 8 * (5 * n + 1)


def _merge_sort(n: str, before: str) -> list[str]:
    """C that stably sorts the item indices in ``idx[0..n)`` (``n`` a C expression; ``tmp`` holds n
    more entries) so that item
    ``p`` goes before an earlier item ``q`` only when ``before`` (C code setting ``int c``: c < 0 when
    p must go first) says so. Bottom-up merges, no recursion; the result ends in ``idx``."""
    return [
        "{",
        "  int64_t *src = idx, *dst = tmp;",
        f"  for (size_t w = 1; w < {n}; w *= 2) {{",
        f"    for (size_t lo = 0; lo < {n}; lo += 2 * w) {{",
        f"      const size_t mid = lo + w < {n} ? lo + w : {n}, hi = lo + 2 * w < {n} ? lo + 2 * w : {n};",
        "      size_t a = lo, b = mid, t = lo;",
        "      while (a < mid && b < hi) {",
        "        const int64_t p = src[b], q = src[a];",
        "        int c = 0;",
        "        " + before.replace("\n", "\n        "),
        "        dst[t++] = c < 0 ? src[b++] : src[a++];",
        "      }",
        "      while (a < mid) dst[t++] = src[a++];",
        "      while (b < hi) dst[t++] = src[b++];",
        "    }",
        "    int64_t *s = src; src = dst; dst = s;",
        "  }",
        f"  if (src != idx) for (size_t i = 0; i < {n}; i++) idx[i] = src[i];",
        "}",
    ]


def _unique_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = ins[0]
    t = dtypes.c_type(_input(node, 0).dtype)
    _, outer, n, inner = _unique_layout(node)
    names = outs[:_onnx_outputs(node)] + [None] * 4
    y, indices, inverse, counts = names[:4]
    count = outs[-1] if node.attr(COUNT_ATTR) else None
    if n == 0:
        return f"{count}[0] = 0;" if count else "/* empty */"
    # numpy's order: items compare lexicographically, element by element in row-major order; NaN
    # sorts after every number and equals NaN (np.unique's equal_nan), so groups stay well defined.
    nan = " : (u != u) - (v != v)" if t in FLOAT_CTYPES else " : 0"
    compare = (f"for (size_t e = 0; e < {outer * inner} && !c; e++) {{\n"
               f"  const size_t o = e / {inner}, i = e % {inner};\n"
               f"  const {t} u = {x}[(o * {n} + (size_t)p) * {inner} + i];\n"
               f"  const {t} v = {x}[(o * {n} + (size_t)q) * {inner} + i];\n"
               f"  c = u < v ? -1 : u > v ? 1{nan};\n"
               "}")
    lines = [
        "if (task) return; /* sequential: task 0 does it all */",
        # scratch: idx = items in sorted order, tmp = merge buffer (then groups in output order),
        # grp = each item's group in sorted order, start = first sorted position of each group,
        # pos = each group's position in the output.
        "int64_t *restrict idx = (int64_t *)scratch, *restrict tmp = idx + "
        f"{n}, *restrict grp = tmp + {n}, *restrict pos = grp + {n}, *restrict start = pos + {n};",
        f"for (size_t i = 0; i < {n}; i++) idx[i] = (int64_t)i;",
        *_merge_sort(str(n), compare),
        "size_t groups = 0;",
        f"for (size_t s = 0; s < {n}; s++) {{",
        "  int c = 1;",
        "  if (s) {",
        "    const int64_t p = idx[s], q = idx[s - 1];",
        "    c = 0;",
        "    " + compare.replace("\n", "\n    "),
        "  }",
        "  if (c) start[groups++] = (int64_t)s;",
        "  grp[idx[s]] = (int64_t)(groups - 1);",
        "}",
        "start[groups] = " + str(n) + ";",
    ]
    # The stable sort puts each group's first occurrence first: idx[start[g]].
    if node.attr("sorted", 1):
        lines.append("for (size_t g = 0; g < groups; g++) tmp[g] = (int64_t)g;")
    else:  # first-occurrence order: walk the items, a group joins when its first item is met
        lines += ["size_t met = 0;",
                  f"for (size_t k = 0; k < {n}; k++)",
                  "  if (idx[start[grp[k]]] == (int64_t)k) tmp[met++] = grp[k];"]
    lines.append("for (size_t g = 0; g < groups; g++) pos[tmp[g]] = (int64_t)g;")

    def write(value: str, index: str, count_: str) -> list[str]:
        """Statements storing group g's unique value, first index and count."""
        out = []
        if y:
            out += [f"  for (size_t o = 0; o < {outer}; o++) for (size_t i = 0; i < {inner}; i++)",
                    f"    {y}[(o * {n} + g) * {inner} + i] = {value};"]
        if indices:
            out.append(f"  {indices}[g] = {index};")
        if counts:
            out.append(f"  {counts}[g] = {count_};")
        return out

    lines += ["for (size_t g = 0; g < groups; g++) {",
              "  const int64_t first = idx[start[tmp[g]]];",
              *write(f"{x}[(o * {n} + (size_t)first) * {inner} + i]", "first", "start[tmp[g] + 1] - start[tmp[g]]"),
              "  (void)first;", "}",
              f"for (size_t g = groups; g < {n}; g++) {{ /* zeros past the valid extent */",
              *write("0", "0", "0"), "}"]
    if inverse:
        lines.append(f"for (size_t k = 0; k < {n}; k++) {inverse}[k] = pos[grp[k]];")
    if count:
        lines.append(f"{count}[0] = (int64_t)groups;")
    return "\n".join(lines)


register(OpDef("Unique", "kernel", _unique_infer, emit=_unique_emit, fold=_no_fold, scratch=_unique_scratch))


# -- NonMaxSuppression ---------------------------------------------------------------------------
def _nms_dims(node: Node) -> tuple[int, int, int, int]:
    """(batches, classes, boxes, kept per class at most)."""
    boxes, scores = _input(node, 0), _input(node, 1)
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3 \
            or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise _err(node, f"boxes {list(boxes.shape)} and scores {list(scores.shape)} must be "
                         "[batches, boxes, 4] and [batches, classes, boxes]")
    limit = const_input(node, 2, "max_output_boxes_per_class (it sets the output's size)")
    per_class = 0 if limit is None or limit.size == 0 else max(0, int(limit.reshape(-1)[0]))
    return boxes.shape[0], scores.shape[1], boxes.shape[1], min(per_class, boxes.shape[1])


def _nms_infer(node: Node):
    b, c, _, k = _nms_dims(node)
    return _with_count(node, [((b * c * k, 3), np.dtype(np.int64))])


def _nms_scratch(node: Node) -> int:
    n, k = _nms_dims(node)[2:]
    return 8 * (2 * n + k)


def _nms_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    nb, nc, n, k = _nms_dims(node)
    boxes, scores, _, iou_in, score_in = (aligned_inputs(node, ins) + [None] * 5)[:5]
    t = dtypes.c_type(_input(node, 0).dtype)
    y, count = outs[0], outs[1] if node.attr(COUNT_ATTR) else None
    total = nb * nc * k
    if total == 0:  # nothing can be kept (no boxes, or max_output_boxes_per_class 0 or absent)
        return f"{count}[0] = 0;" if count else "/* empty */"
    if node.attr("center_point_box", 0):  # [x_center, y_center, width, height]
        corners = ["const {t} {v}x0 = {b}[0] - {b}[2] / 2, {v}x1 = {b}[0] + {b}[2] / 2;",
                   "const {t} {v}y0 = {b}[1] - {b}[3] / 2, {v}y1 = {b}[1] + {b}[3] / 2;"]
    else:  # [y1, x1, y2, x2], either corner first
        corners = ["const {t} {v}x0 = {b}[1] < {b}[3] ? {b}[1] : {b}[3], {v}x1 = {b}[1] < {b}[3] ? {b}[3] : {b}[1];",
                   "const {t} {v}y0 = {b}[0] < {b}[2] ? {b}[0] : {b}[2], {v}y1 = {b}[0] < {b}[2] ? {b}[2] : {b}[0];"]
    box = [line.format(t=t, v=v, b=b) for v, b in (("a", "ba"), ("s", "bs")) for line in corners]
    lines = ["if (task) return; /* sequential: task 0 does it all */",
             f"int64_t *restrict idx = (int64_t *)scratch, *restrict tmp = idx + {n}, *restrict kept = tmp + {n};",
             f"const {t} iou_max = {f'{iou_in}[0]' if iou_in else '0'};",
             "size_t total = 0;"]
    if score_in:
        lines.append(f"const {t} score_min = {score_in}[0];")
    lines += [f"for (size_t b = 0; b < {nb}; b++) for (size_t cls = 0; cls < {nc}; cls++) {{",
              f"  const {t} *restrict sc = {scores} + (b * {nc} + cls) * {n};",
              f"  const {t} *restrict bx = {boxes} + b * {n * 4};",
              "  size_t m = 0, nk = 0;",
              f"  for (size_t i = 0; i < {n}; i++)",
              "    if (" + ("sc[i] > score_min" if score_in else "1") + ") idx[m++] = (int64_t)i;"]
    # Highest score first; equal scores keep the lower box index first (the reference's order).
    lines += ["  " + line for line in _merge_sort("m", "c = sc[p] > sc[q] ? -1 : 0;")]
    # A candidate is dropped when its IoU with a kept box exceeds the threshold; degenerate boxes
    # (no area) never suppress, as in the reference.
    lines += [f"  for (size_t j = 0; j < m && nk < {k}; j++) {{",
              f"    const {t} *ba = bx + idx[j] * 4;",
              "    int keep = 1;",
              "    for (size_t q = 0; q < nk && keep; q++) {",
              f"      const {t} *bs = bx + kept[q] * 4;",
              *["      " + line for line in box],
              f"      const {t} ix0 = ax0 > sx0 ? ax0 : sx0, ix1 = ax1 < sx1 ? ax1 : sx1;",
              f"      const {t} iy0 = ay0 > sy0 ? ay0 : sy0, iy1 = ay1 < sy1 ? ay1 : sy1;",
              "      if (ix1 <= ix0 || iy1 <= iy0) continue;",
              f"      const {t} inter = (ix1 - ix0) * (iy1 - iy0);",
              f"      const {t} area_a = (ax1 - ax0) * (ay1 - ay0), area_s = (sx1 - sx0) * (sy1 - sy0);",
              f"      const {t} uni = area_a + area_s - inter;",
              "      if (inter <= 0 || area_a <= 0 || area_s <= 0 || uni <= 0) continue;",
              "      if (inter / uni > iou_max) keep = 0;",
              "    }",
              "    if (!keep) continue;",
              "    kept[nk++] = idx[j];",
              "    "
              f"{y}[total * 3] = (int64_t)b; {y}[total * 3 + 1] = (int64_t)cls; {y}[total * 3 + 2] = idx[j];",
              "    total++;",
              "  }",
              "}",
              f"for (size_t r = total * 3; r < {total * 3}; r++) {y}[r] = 0; /* zeros past the valid extent */"]
    if count:
        lines.append(f"{count}[0] = (int64_t)total;")
    lines.append("(void)iou_max; (void)kept;")
    return "\n".join(lines)


register(OpDef("NonMaxSuppression", "kernel", _nms_infer, emit=_nms_emit, fold=_no_fold,
               const_inputs=(2,), scratch=_nms_scratch))


# -- bounded outputs at the graph's edge -----------------------------------------------------------
def bounded_outputs(node: Node) -> dict[int, int]:
    """Output index -> its data-dependent axis (negative: from the end), for the outputs of ``node``
    that have one."""
    if node.op == "NonZero":
        return {0: 1}
    if node.op == "NonMaxSuppression":
        return {0: 0}
    if node.op == "Unique":  # Y along its axis (numbered from the end when negative: the rank of an
        # intermediate input is unknown before shape inference), indices and counts along their only one
        axis = int(node.attr("axis", 0))
        return {i: a for i, a in ((0, axis), (1, 0), (3, 0)) if i < _onnx_outputs(node)}
    return {}
