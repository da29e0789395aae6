"""Normalization ops as fused row kernels: LayerNormalization, InstanceNormalization, GroupNormalization.

Each one normalizes contiguous "rows" of the input (LayerNorm: the trailing axes from ``axis``;
InstanceNorm: one (n, c) plane; GroupNorm: one (n, group) block) and applies a per-element scale
and shift. A row is read three times (mean, variance around the mean, normalize) instead of using
E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std; the mean itself is summed
relative to the row's first element for the same reason. The sums run in independent lanes so
the compiler vectorizes them without -ffast-math. Tasks take contiguous ranges of rows; a row is
always computed whole by one task, so results do not depend on ``ntasks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.common import c_literal, norm_axis, optional_input
from aotc.ops.registry import OPS, OpDef, register

if TYPE_CHECKING:
    from aotc.target import Target

# Lanes of the row sums: 16 on short rows; on long ones 256 bytes of them (8 AVX2 registers), enough
# independent adds to hide their latency -- 16 lanes (two chains) made LayerNorm's two sums
# latency-bound, about 10% of a 4096x1024 LayerNorm.
LANES = 16
LONG_ROW_BYTES = 1024

# Rows are prefetched this many bytes ahead of the one being normalized. Each row starts a new
# stream the hardware prefetchers pick up only after a few misses (they stop at 4 KB pages), and
# the three passes over a row give the memory system time to fetch the next one: a 4096x1024
# LayerNorm ran 1.3x faster prefetching one row (4 KB) ahead, the same two or four rows ahead.
# A fused row (a producer chain computes it) is not prefetched: its fill loop reads its inputs
# in one sequential sweep the hardware prefetchers follow, and software prefetches on top made a
# 4096x1024 GELU+LayerNorm and an Add+LayerNorm 10-16% slower on 1 and 2 threads.
PREFETCH_BYTES = 4096


def _size(ctype: str) -> int:
    return 8 if ctype == "double" else 4


def _lanes(ctype: str, n: int) -> int:
    return 256 // _size(ctype) if n * _size(ctype) >= LONG_ROW_BYTES else LANES


def _x(node: Node) -> Value:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    return x


def _lane_sum(ctype: str, acc: str, xr: str, n: int, term: str) -> list[str]:
    """C lines that set ``acc`` to the sum over the row of ``term`` (a C expression of ``v``)."""
    lanes = _lanes(ctype, n)
    main = n - n % lanes
    lines = [f"{ctype} {acc};", "{",
             f"  {ctype} s[{lanes}] = {{0}};"]
    if main:
        lines += [f"  for (size_t i = 0; i < {main}; i += {lanes})",
                  f"    for (size_t l = 0; l < {lanes}; l++) {{ const {ctype} v = {xr}[i + l]; "
                  f"s[l] += {term}; }}"]
    if main != n:
        lines.append(f"  for (size_t i = {main}; i < {n}; i++) {{ const {ctype} v = {xr}[i]; "
                     f"s[0] += {term}; }}")
    # The lanes fold in halves; constant trip counts let the compiler keep the folds in registers
    # (a loop over the width went through memory with a branch per level).
    w = lanes // 2
    while w > 1:
        lines.append(f"  for (size_t l = 0; l < {w}; l++) s[l] += s[l + {w}];")
        w //= 2
    lines += [f"  {acc} = s[0] + s[1];", "}"]
    return lines


def _row_kernel(ctype: str, rows: int, n: int, blocks: int, eps: float, x: str, y: str,
                scale: str | None, bias: str | None, mean_out: str | None = None,
                inv_out: str | None = None, fill: tuple[list[str], str] | None = None) -> str:
    """Normalize ``rows`` rows of ``n`` contiguous elements.

    The last pass runs as ``blocks`` blocks of ``n / blocks`` elements so that per-block scales
    (GroupNorm's channels) and scales repeating along the row (LayerNorm's suffix-broadcast
    weights) index without a division in the inner loop. ``scale``/``bias`` are C expressions in
    ``r`` (row), ``j`` (block) and ``k`` (element in block); None means 1 / 0.

    ``fill`` = (statements, value): the row is not read from ``x`` but computed, element ``k`` of
    row ``r`` being ``value`` after ``statements`` (a fused producer chain). It is computed into
    the output row, which then stays in L1 for the three passes, so the input makes one trip
    through memory instead of being written by one kernel and read back by this one.
    """
    inner = n // blocks
    sqrt = "sqrtf" if ctype == "float" else "sqrt"
    if fill is None:
        body = [*_prefetch(ctype, n, x), f"const {ctype} *restrict xr = {x} + r * {n};",
                f"{ctype} *restrict yr = {y} + r * {n};"]
        xr = "xr"
    else:
        # The passes below read the row back through yr itself (xr aliasing yr would break restrict).
        body = [f"{ctype} *restrict yr = {y} + r * {n};", f"for (size_t k = 0; k < {n}; k++) {{",
                *("  " + s for s in fill[0]), f"  yr[k] = {fill[1]};", "}"]
        xr = "yr"
    # Summing x - x[0] instead of x keeps the partial sums near the row's spread, not its offset.
    body.append(f"const {ctype} pivot = {xr}[0];")
    body += _lane_sum(ctype, "sum", xr, n, "(v - pivot)")
    body.append(f"const {ctype} mean = pivot + sum / {c_literal(n, ctype)};")
    body += _lane_sum(ctype, "ssd", xr, n, "(v - mean) * (v - mean)")
    body.append(f"const {ctype} inv = 1 / {sqrt}(ssd / {c_literal(n, ctype)} + {c_literal(eps, ctype)});")
    if mean_out:
        body.append(f"{mean_out}[r] = mean;")
    if inv_out:
        body.append(f"{inv_out}[r] = inv;")
    y_expr = f"({xr}[o + k] - mean) * " + (f"(inv * {scale})" if scale else "inv")
    if bias:
        y_expr += f" + {bias}"
    if blocks == 1:
        body.append(f"for (size_t k = 0, o = 0; k < {n}; k++) yr[k] = {y_expr};")
    else:
        body += [f"for (size_t j = 0; j < {blocks}; j++) {{",
                 f"  const size_t o = j * {inner};",
                 f"  for (size_t k = 0; k < {inner}; k++) yr[o + k] = {y_expr};",
                 "}"]
    return (f"const size_t r1 = (size_t){rows} * (task + 1) / ntasks;\n"
            f"for (size_t r = (size_t){rows} * task / ntasks; r < r1; r++) {{\n  "
            + "\n  ".join(body) + "\n}")


def _prefetch(ctype: str, n: int, x: str) -> list[str]:
    """Statements prefetching the row of ``x`` PREFETCH_BYTES ahead of row ``r`` if this task
    computes it (so a prefetch never leaves the tensor)."""
    ahead = max(1, PREFETCH_BYTES // (n * _size(ctype)))
    return [f"if (r + {ahead} < r1)", f"  for (size_t q = 0; q < {n}; q += {64 // _size(ctype)})",
            f"    __builtin_prefetch({x} + (r + {ahead}) * {n} + q);"]


# -- LayerNormalization -----------------------------------------------------------------------

def ln_axis(node: Node) -> int:
    """The first normalized axis of a LayerNormalization (rows are the axes before it)."""
    x = _x(node)
    return norm_axis(node.attr("axis", -1), len(x.shape), node)


def _stash_dtype(node: Node, x: Value) -> np.dtype:
    # stash_type 1 (the default) computes and returns Mean/InvStdDev as float32.
    return np.dtype(np.float32) if node.attr("stash_type", 1) == 1 else np.dtype(x.dtype)


def _ln_infer(node: Node):
    x = _x(node)
    if len(x.shape) == 0:
        raise AotcError(f"LayerNormalization node {node.name!r}: input must have rank >= 1")
    axis = ln_axis(node)
    stat = (tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis), _stash_dtype(node, x))
    return [(x.shape, x.dtype)] + [stat] * (len(node.outputs) - 1)


def _suffix_param(node: Node, v: Value | None, norm_shape: tuple[int, ...], what: str) -> int | None:
    """How many trailing elements a scale/bias repeats over along the row (None when absent).

    Supported: shapes that, without leading 1s, equal a suffix of the normalized shape (the usual
    [hidden] weights, or [] for a scalar)."""
    if v is None:
        return None
    shape = list(v.shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    if len(shape) > len(norm_shape) or (shape and tuple(shape) != tuple(norm_shape[-len(shape):])):
        raise AotcError(f"{node.op} node {node.name!r}: {what} of shape {list(v.shape)} is not "
                        f"broadcastable over the normalized shape {list(norm_shape)}")
    return int(np.prod(shape))


def layernorm_kernel(node: Node, ins: list[str], outs: list[str], ctype: str,
                     fill: tuple[list[str], str] | None = None) -> str:
    """The LayerNorm row kernel; ``fill`` computes the input row instead of reading ``ins[0]``
    (statements and a value in ``r``, the row, and ``k``, the element in the row)."""
    x = _x(node)
    axis = ln_axis(node)
    norm_shape = tuple(x.shape[axis:])
    n = int(np.prod(norm_shape))
    rows = int(np.prod(x.shape[:axis]))
    s_len = _suffix_param(node, node.inputs[1], norm_shape, "Scale")
    b = optional_input(node, 2)
    b_len = _suffix_param(node, b, norm_shape, "B")
    # Absent optional inputs are not passed: ins holds the present ones in order.
    b_name = ins[2] if b is not None else None
    period = max(s_len or 1, b_len or 1)  # both are suffixes: the longer one sets the block size
    blocks = n // period if n else 1

    def idx(length: int | None) -> str:
        return "0" if length == 1 else "k" if length == period else f"k % {length}"

    scale = f"{ins[1]}[{idx(s_len)}]"
    bias = f"{b_name}[{idx(b_len)}]" if b_name else None
    if x.dtype != np.float32 and x.dtype != np.float64:
        raise AotcError(f"LayerNormalization node {node.name!r}: dtype {x.dtype} not supported")
    if n == 0 or rows == 0:
        return "/* empty */"
    mean_out = outs[1] if len(outs) > 1 and node.outputs[1].name else None
    inv_out = outs[2] if len(outs) > 2 and node.outputs[2].name else None
    return _row_kernel(ctype, rows, n, max(blocks, 1), float(node.attr("epsilon", 1e-5)), ins[0],
                       outs[0], scale, bias, mean_out, inv_out, fill)


def _ln_takes_prologue(node: Node, producer: Node, target: Target) -> bool:
    """The row kernel can compute a float input row from its elementwise chain (e.g. a GELU), views
    (a Transpose the layout pass moved after the chain) included, into the output row and normalize it
    there while it is in L1 (aotc/codegen/kernels.py)."""
    return OPS[producer.op].kind in ("elementwise", "view") and node.inputs[0].dtype in (np.float32, np.float64)


register(OpDef("LayerNormalization", "kernel", _ln_infer, emit=layernorm_kernel, can_take_prologue=_ln_takes_prologue))


# -- InstanceNormalization / GroupNormalization -----------------------------------------------

def _same(node: Node):
    x = _x(node)
    if len(x.shape) < 2:
        raise AotcError(f"{node.op} node {node.name!r}: input must have rank >= 2")
    return [(x.shape, x.dtype)]


def _check_float(node: Node) -> None:
    if _x(node).dtype not in (np.float32, np.float64):
        raise AotcError(f"{node.op} node {node.name!r}: dtype {_x(node).dtype} not supported")


def _instance_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    _check_float(node)
    shape = _x(node).shape
    c, n = shape[1], int(np.prod(shape[2:]))
    if 0 in shape:
        return "/* empty */"
    return _row_kernel(ctype, shape[0] * c, n, 1, float(node.attr("epsilon", 1e-5)), ins[0], outs[0],
                       f"{ins[1]}[r % {c}]", f"{ins[2]}[r % {c}]")


def _group_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    _check_float(node)
    shape = _x(node).shape
    g = int(node.attr("num_groups"))
    c, spatial = shape[1], int(np.prod(shape[2:]))
    if g <= 0 or c % g:
        raise AotcError(f"GroupNormalization node {node.name!r}: {c} channels not divisible into "
                        f"{g} groups")
    if 0 in shape:
        return "/* empty */"
    per = c // g
    eps = float(node.attr("epsilon", 1e-5))
    if node.attr("_opset", 21) < 21 and node.inputs[1].shape[0] == g:
        # Opset 18: one scale/bias per group (the ambiguity opset 21 removed).
        return _row_kernel(ctype, shape[0] * g, per * spatial, 1, eps, ins[0], outs[0],
                           f"{ins[1]}[r % {g}]", f"{ins[2]}[r % {g}]")
    ch = f"(r % {g}) * {per} + j"
    return _row_kernel(ctype, shape[0] * g, per * spatial, per, eps, ins[0], outs[0],
                       f"{ins[1]}[{ch}]", f"{ins[2]}[{ch}]")


register(OpDef("InstanceNormalization", "kernel", _same, emit=_instance_emit))
register(OpDef("GroupNormalization", "kernel", _same, emit=_group_emit))


# -- MeanVarianceNormalization: (x - mean) / (std + 1e-9) over ``axes`` (default N, H, W) ------------

def _mvn_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    _check_float(node)
    shape = _x(node).shape
    rank = len(shape)
    axes = sorted({norm_axis(int(a), rank, node) for a in node.attr("axes", [0, 2, 3])})
    kept = [a for a in range(rank) if a not in axes]
    groups, n = int(np.prod([shape[a] for a in kept])), int(np.prod([shape[a] for a in axes]))
    if groups * n == 0:
        return "/* empty */"
    stride = [int(np.prod(shape[a + 1:])) for a in range(rank)]

    def offset(var: str, dims: list[int]) -> str:
        """The element offset of the multi-index that ``var`` enumerates over ``dims`` (row-major)."""
        terms, inner = [], 1
        for a in reversed(dims):
            terms.append(f"({var} / {inner} % {shape[a]}) * {stride[a]}")
            inner *= shape[a]
        return " + ".join(terms) or "0"

    # The reduced elements are generally not contiguous: their offsets are recomputed from the
    # index (divisions by constants, which compile to multiplications).
    at = offset("i", axes)
    sqrt = "sqrtf" if ctype == "float" else "sqrt"
    return (f"for (size_t gi = task; gi < {groups}; gi += ntasks) {{\n"
            f"  const {ctype} *xr = {ins[0]} + {offset('gi', kept)};\n"
            f"  {ctype} *yr = {outs[0]} + {offset('gi', kept)};\n"
            f"  double s = 0, ss = 0;\n"
            f"  for (size_t i = 0; i < {n}; i++) s += xr[{at}];\n"
            f"  const double mean = s / {n};\n"
            f"  for (size_t i = 0; i < {n}; i++) {{ const double v = xr[{at}] - mean; ss += v * v; }}\n"
            f"  const {ctype} m = ({ctype})mean, inv = 1 / (({ctype}){sqrt}(ss / {n}) + {c_literal(1e-9, ctype)});\n"
            f"  for (size_t i = 0; i < {n}; i++) yr[{at}] = (xr[{at}] - m) * inv;\n}}")


register(OpDef("MeanVarianceNormalization", "kernel", _same, emit=_mvn_emit))
