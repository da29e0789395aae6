"""Data-movement and indexing kernels: tile, pad, resize, split, depth/space shuffles, arg/top-k,
cumulative sums, gathers and scatters, einsum, and the generators (range, constant-of-shape, eye).

Most of the movement ops are one template: a *separable gather*. Every output dimension ``d`` has a
table that maps its index ``i_d`` to ``T_d`` taps, each a contribution to the flat input offset
(and, for interpolation, a weight); an output element is ``sum over taps of prod(w) * x[sum(off)]``.
Tile, Pad (all modes), DepthToSpace/SpaceToDepth, Split and Resize (nearest/linear/cubic, every
coordinate transformation, antialias) are all tables computed here at compile time, so one small C
loop nest serves them all. A negative offset marks "outside the input" (Pad's constant, Resize's
extrapolation value).

A table costs compile-time memory and C source in proportion to its dimension, which a model can
make huge (Tile with repeats [2^30]), so a dimension longer than ``MAX_TABLE`` computes its offsets
in C instead (``DimExpr``); Resize, whose taps have no closed form here, refuses such a dimension.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aotc.errors import AotcError, IndexOutOfRangeError
from aotc.ir import dtypes
from aotc.ir.graph import Node
from aotc.ops.affine import Ix
from aotc.ops.common import (
    axis_layout,
    c_array,
    c_literal,
    const_input,
    contiguous_strides,
    norm_axis,
    row_loop_head,
)
from aotc.ops.registry import OpDef, register

Shape = tuple[int, ...]
_OUTSIDE = -(1 << 60)  # any sum containing it stays negative


def _in(node: Node, i: int = 0):
    v = node.inputs[i]
    assert v is not None and v.shape is not None
    return v


def _where(node: Node) -> str:
    return f"{node.op} node {node.name!r}"


# Entries of one dimension's offset table (about 0.5 MB of C); a longer dimension uses a DimExpr.
MAX_TABLE = 1 << 16


@dataclass(frozen=True)
class DimExpr:
    """The offsets along one output dimension as a C int64 expression of its index ``{i}`` (one tap,
    no weight); ``fills``: it is negative where the output is outside the input."""

    code: str
    fills: bool = False


Offsets = np.ndarray | DimExpr


def dim_offsets(n: int, table: Callable[[], np.ndarray], code: str, fills: bool = False) -> Offsets:
    """A dimension of length ``n``: its table from ``table()`` when short, else the expression ``code``."""
    return table() if n <= MAX_TABLE else DimExpr(code, fills)


def separable_gather(x: str, y: str, ctype: str, out_shape: Shape, offsets: list[Offsets],
                     weights: list[np.ndarray | None] | None = None, fill: str = "0",
                     tag: str = "g") -> str:
    """C statements writing ``y`` (``out_shape``) from ``x``. ``offsets[d]`` is (out_shape[d], T_d)
    int64 input-offset contributions, or a DimExpr; ``weights[d]`` (same shape) or None for a plain
    gather."""
    if math.prod(out_shape) == 0:
        return "(void)0;"
    if not out_shape:  # rank 0: one element
        out_shape, offsets = (1,), [np.zeros((1, 1), np.int64)]
        weights = None
    weights = weights or [None] * len(out_shape)
    rank = len(out_shape)
    wtype = ctype if ctype in ("float", "double") else "double"
    lines: list[str] = []
    taps = []
    exprs: dict[int, str] = {}
    may_fill = False
    for d, (off, w) in enumerate(zip(offsets, weights, strict=True)):
        if isinstance(off, DimExpr):
            assert w is None
            taps.append(1)
            exprs[d] = "(" + off.code.format(i=f"(int64_t)i{d}") + ")"
            may_fill |= off.fills
            continue
        off = np.asarray(off, np.int64).reshape(out_shape[d], -1)
        taps.append(off.shape[1])
        may_fill |= bool((off < 0).any())
        lines.append(c_array("int64_t", f"{tag}o{d}", off))
        if w is not None:
            lines.append(c_array(wtype, f"{tag}w{d}", np.asarray(w).reshape(off.shape)))
    lines.append(f"for (size_t i0 = task; i0 < {out_shape[0]}; i0 += ntasks) {{")
    for d in range(1, rank):
        lines.append(f"for (size_t i{d} = 0; i{d} < {out_shape[d]}; i{d}++) {{")
    flat = "i0"
    for d in range(1, rank):
        flat = f"({flat}) * {out_shape[d]} + i{d}"
    tap_dims = [d for d in range(rank) if taps[d] > 1 or weights[d] is not None]

    def at(d: int, t: str) -> str:
        if d in exprs:
            return exprs[d]
        return f"{tag}o{d}[i{d} * {taps[d]} + {t}]" if taps[d] > 1 else f"{tag}o{d}[i{d}]"

    def read(off: str) -> str:
        return f"({off} < 0 ? {fill} : {x}[{off}])" if may_fill else f"{x}[{off}]"

    if not tap_dims:
        lines.append(f"  const int64_t off = {' + '.join(at(d, '0') for d in range(rank))};")
        lines.append(f"  {y}[{flat}] = {read('off')};")
    else:
        lines.append(f"  {wtype} acc = 0;")
        for d in tap_dims:
            lines.append(f"  for (size_t t{d} = 0; t{d} < {taps[d]}; t{d}++) {{")
        off = " + ".join(at(d, f"t{d}") if d in tap_dims else at(d, "0") for d in range(rank))
        wexpr = " * ".join(f"{tag}w{d}[i{d} * {taps[d]} + t{d}]" for d in tap_dims if weights[d] is not None)
        lines.append(f"    const int64_t off = {off};")
        lines.append(f"    acc += {wexpr or '1'} * ({wtype}){read('off')};")
        lines.append("  " + "}" * len(tap_dims))
        lines.append(f"  {y}[{flat}] = ({ctype})acc;")
    lines.append("}" * rank)
    return "\n".join(lines)


def _dim_offsets(idx: np.ndarray, stride: int, valid: np.ndarray | None = None) -> np.ndarray:
    off = np.asarray(idx, np.int64) * stride
    if valid is not None:
        off = np.where(valid, off, _OUTSIDE)
    return off.reshape(len(off), 1)


# -- Tile ----------------------------------------------------------------------------------------------
def _repeats(node: Node) -> list[int]:
    r = np.asarray(const_input(node, 1, "repeats"))
    reps = [int(v) for v in r.reshape(-1)]
    if r.ndim != 1 or len(reps) != len(_in(node).shape) or any(v < 0 for v in reps):  # 1-D, as onnxruntime checks
        raise AotcError(f"{_where(node)}: bad repeats {reps}")
    return reps


def _tile_infer(node: Node):
    x = _in(node)
    return [(tuple(d * r for d, r in zip(x.shape, _repeats(node), strict=True)), x.dtype)]


def _tile_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    out = node.outputs[0].shape
    offs = [dim_offsets(n, lambda n=n, d=d, s=s: _dim_offsets(np.arange(n) % max(d, 1), s), f"({{i}} % {d}) * {s}")
            for n, d, s in zip(out, x.shape, contiguous_strides(x.shape), strict=True)]
    return separable_gather(ins[0], outs[0], ctype, out, offs)


register(OpDef("Tile", "kernel", _tile_infer, emit=_tile_emit, const_inputs=(1,)))


# -- Pad -----------------------------------------------------------------------------------------------
def _pads(node: Node) -> list[tuple[int, int]]:
    x = _in(node)
    rank = len(x.shape)
    if "pads" in node.attrs:  # opset < 11
        p = [int(v) for v in node.attrs["pads"]]
    else:
        p = [int(v) for v in np.asarray(const_input(node, 1, "pads")).reshape(-1)]
    axes = const_input(node, 3, "axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank, node) for a in axes.reshape(-1)]
    if len(p) != 2 * len(axes):
        raise AotcError(f"{_where(node)}: {len(p)} pads for {len(axes)} axes")
    res = [(0, 0)] * rank
    for k, a in enumerate(axes):
        res[a] = (p[k], p[k + len(axes)])
    return res


def _pad_infer(node: Node):
    x = _in(node)
    shape = tuple(d + b + e for d, (b, e) in zip(x.shape, _pads(node), strict=True))
    if any(d < 0 for d in shape):
        raise AotcError(f"{_where(node)}: negative output shape {shape}")
    return [(shape, x.dtype)]


def _pad_index(j: np.ndarray, n: int, mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Input index for (possibly outside) index ``j`` along a dimension of length ``n``."""
    inside = (j >= 0) & (j < n)
    if mode == "constant" or n == 0:
        return np.clip(j, 0, max(n - 1, 0)), inside
    if mode == "edge":
        return np.clip(j, 0, n - 1), None
    if mode == "wrap":
        return j % n, None
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(j), None
        period = 2 * (n - 1)
        k = np.abs(j) % period
        return np.where(k >= n, period - k, k), None
    raise AotcError(f"Pad: unknown mode {mode!r}")


def _pad_expr(b: int, n: int, mode: str, stride: int) -> DimExpr:
    """``_pad_index`` in C: the offset of output index {i} (input index j = i - b, n long)."""
    j = f"({{i}} - {b})"
    if mode == "constant" or n == 0:
        return DimExpr(f"{j} >= 0 && {j} < {n} ? {j} * {stride} : {_OUTSIDE}", fills=True)
    if mode == "edge":
        at = f"({j} < 0 ? 0 : {j} >= {n} ? {n - 1} : {j})"
    elif mode == "wrap":
        at = f"(({j} % {n} + {n}) % {n})"
    elif mode == "reflect":
        period = 2 * (n - 1)
        k = f"(({j} < 0 ? -{j} : {j}) % {period})" if n > 1 else "0"
        at = f"({k} >= {n} ? {period} - {k} : {k})" if n > 1 else "0"
    else:
        raise AotcError(f"Pad: unknown mode {mode!r}")
    return DimExpr(f"{at} * {stride}")


def _pad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    mode = node.attr("mode", "constant")
    out = node.outputs[0].shape
    offs: list[Offsets] = []
    for n, d, s, (b, _) in zip(out, x.shape, contiguous_strides(x.shape), _pads(node), strict=True):
        if n > MAX_TABLE:
            offs.append(_pad_expr(b, d, mode, s))
            continue
        idx, valid = _pad_index(np.arange(n) - b, d, mode)
        offs.append(_dim_offsets(idx, s, valid))
    fill = pad_fill(node, ctype, ins[2] if len(ins) > 2 else "")
    return separable_gather(ins[0], outs[0], ctype, out, offs, fill=fill)


def pad_fill(node: Node, ctype: str, value_ptr: str) -> str:
    """Pad's fill value as C: the attribute (opset < 11), the constant input, or the first element of the
    run-time input at ``value_ptr``; 0 without either."""
    if "value" in node.attrs:
        return c_literal(node.attrs["value"], ctype)
    v = node.inputs[2] if len(node.inputs) > 2 else None
    if v is None:
        return c_literal(0, ctype)
    return c_literal(v.const.reshape(-1)[0].item(), ctype) if v.is_const else f"{value_ptr}[0]"


register(OpDef("Pad", "kernel", _pad_infer, emit=_pad_emit, const_inputs=(1, 3)))


# -- DepthToSpace / SpaceToDepth -----------------------------------------------------------------------------
def _d2s_infer(node: Node):
    x = _in(node)
    b = int(node.attr("blocksize"))
    if len(x.shape) != 4:
        raise AotcError(f"{_where(node)}: input must be 4-D")
    n, c, h, w = x.shape
    if node.op == "DepthToSpace":
        if c % (b * b):
            raise AotcError(f"{_where(node)}: channels {c} not divisible by blocksize² {b * b}")
        return [((n, c // (b * b), h * b, w * b), x.dtype)]
    if h % b or w % b:
        raise AotcError(f"{_where(node)}: spatial dims {h}x{w} not divisible by blocksize {b}")
    return [((n, c * b * b, h // b, w // b), x.dtype)]


class _CIndex:
    """A C int64 expression that numpy-style index arithmetic (``i // b * s + i % b``) builds on, so
    one formula gives both a dimension's table and its C expression. Every operand is non-negative,
    where C's / and % agree with Python's // and %."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _op(self, op: str, other: object) -> _CIndex:
        return _CIndex(f"({self.text} {op} {other.text if isinstance(other, _CIndex) else other})")

    def __add__(self, o: object) -> _CIndex:
        return self._op("+", o)

    def __mul__(self, o: object) -> _CIndex:
        return self._op("*", o)

    def __floordiv__(self, o: object) -> _CIndex:
        return self._op("/", o)

    def __mod__(self, o: object) -> _CIndex:
        return self._op("%", o)


def _d2s_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    b = int(node.attr("blocksize"))
    sn, sc, sh, sw = contiguous_strides(x.shape)
    on, oc, oh, ow = node.outputs[0].shape
    # Each dimension's offset as a function of its index, for numpy (a table) and for C.
    if node.op == "DepthToSpace":
        cp = oc
        crd = node.attr("mode", "DCR") == "CRD"
        hs, ws = (b * sc, sc) if crd else (b * cp * sc, cp * sc)
        maps = [lambda i: i * sn, lambda i: i * (b * b * sc if crd else sc),
                lambda i: (i // b) * sh + (i % b) * hs, lambda i: (i // b) * sw + (i % b) * ws]
    else:
        c = x.shape[1]
        crd = node.attr("mode", "DCR") == "CRD"  # channel-major: c * b * b + block
        bb = b * b

        def chan(i):
            blk, ch = (i % bb, i // bb) if crd else (i // c, i % c)
            return ch * sc + (blk // b) * sh + (blk % b) * sw
        maps = [lambda i: i * sn, chan, lambda i: i * b * sh, lambda i: i * b * sw]
    offs = [dim_offsets(n, lambda n=n, f=f: np.asarray(f(np.arange(n)), np.int64).reshape(-1, 1),
                        f(_CIndex("{i}")).text) for n, f in zip((on, oc, oh, ow), maps, strict=True)]
    return separable_gather(ins[0], outs[0], ctype, (on, oc, oh, ow), offs)


register(OpDef("DepthToSpace", "kernel", _d2s_infer, emit=_d2s_emit))
register(OpDef("SpaceToDepth", "kernel", _d2s_infer, emit=_d2s_emit))


# -- Split ---------------------------------------------------------------------------------------------------
def _split_sizes(node: Node) -> tuple[int, list[int]]:
    x = _in(node)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    dim = x.shape[axis]
    if "split" in node.attrs:
        sizes = [int(s) for s in node.attrs["split"]]
    else:
        s = const_input(node, 1, "split")
        if s is not None and s.size:
            sizes = [int(v) for v in s.reshape(-1)]
        else:
            n = int(node.attr("num_outputs", len(node.outputs)))
            chunk = -(-dim // n)  # the last chunk may be smaller (opset 18)
            sizes = [min(chunk, max(dim - chunk * k, 0)) for k in range(n)]
    if sum(sizes) != dim or len(sizes) != len(node.outputs):
        raise AotcError(f"{_where(node)}: split {sizes} does not fit dimension {dim} into "
                        f"{len(node.outputs)} outputs")
    return axis, sizes


def _split_infer(node: Node):
    x = _in(node)
    axis, sizes = _split_sizes(node)
    return [((*x.shape[:axis], s, *x.shape[axis + 1:]), x.dtype) for s in sizes]


def _split_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    axis, sizes = _split_sizes(node)
    strides = contiguous_strides(x.shape)
    code, start = [], 0
    for k, (y, s) in enumerate(zip(outs, sizes, strict=True)):
        shape = (*x.shape[:axis], s, *x.shape[axis + 1:])
        offs = [dim_offsets(n, lambda n=n, d=d, k=start if d == axis else 0: _dim_offsets(np.arange(n) + k, strides[d]),
                            f"({{i}} + {start if d == axis else 0}) * {strides[d]}")
                for d, n in enumerate(shape)]
        code.append("{\n" + separable_gather(ins[0], y, ctype, shape, offs, tag=f"s{k}_") + "\n}")
        start += s
    return "\n".join(code)


register(OpDef("Split", "kernel", _split_infer, emit=_split_emit, const_inputs=(1,)))


# -- Resize / Upsample ------------------------------------------------------------------------------------------
def resize_params(node: Node) -> tuple[Shape, list[float], np.ndarray | None]:
    """(output shape, per-dim scale, roi as [starts..., ends...] or None)."""
    x = _in(node)
    rank = len(x.shape)
    if node.op == "Upsample" or node.attr("_opset", 13) < 11:  # (X, scales) or scales attribute
        sc = node.attrs.get("scales")
        if sc is None:
            sc = const_input(node, 1, "scales")
        scales = [float(s) for s in np.asarray(sc).reshape(-1)]
        return tuple(int(d * s) for d, s in zip(x.shape, scales, strict=True)), scales, None
    roi = const_input(node, 1, "roi")
    sc = const_input(node, 2, "scales")
    sz = const_input(node, 3, "sizes")
    axes = node.attr("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank, node) for a in axes]
    scales = [1.0] * rank
    out = list(x.shape)
    if sc is not None and sc.size:
        for a, s in zip(axes, sc.reshape(-1), strict=True):
            scales[a] = float(s)
            out[a] = int(np.floor(x.shape[a] * float(s)))
    elif sz is not None and sz.size:
        sizes = [int(s) for s in sz.reshape(-1)]
        ratio = [s / x.shape[a] for a, s in zip(axes, sizes, strict=True)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            for a, s, r in zip(axes, sizes, ratio, strict=True):
                out[a], scales[a] = s, r
        else:
            r = min(ratio) if policy == "not_larger" else max(ratio)
            for a in axes:
                scales[a], out[a] = r, int(r * x.shape[a] + 0.5)
    else:
        raise AotcError(f"{_where(node)}: needs scales or sizes")
    full_roi = None
    if roi is not None and roi.size and node.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
        full_roi = np.array([0.0] * rank + [1.0] * rank)
        r = roi.reshape(-1).astype(np.float64)
        for k, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = r[k], r[len(axes) + k]
    return tuple(out), scales, full_roi


def _resize_infer(node: Node):
    x = _in(node)
    return [(resize_params(node)[0], x.dtype)]


def _coeffs(mode: str, ratio: np.ndarray, scale: float, node: Node) -> np.ndarray:
    """(n, taps) interpolation weights for fractional positions ``ratio`` in (0, 1]."""
    aa = bool(node.attr("antialias", 0)) and scale < 1
    if mode == "nearest":
        nm = node.attr("nearest_mode", "floor" if node.op == "Upsample" else "round_prefer_floor")
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": np.zeros_like(ratio, bool), "ceil": np.ones_like(ratio, bool)}[nm]
        right = np.where(ratio == 1, True, right)  # an exact integer position is that pixel
        return np.stack([~right, right], 1).astype(np.float64)
    if mode == "linear":
        if not aa:
            return np.stack([1 - ratio, ratio], 1)
        start = int(np.floor(-1 / scale) + 1)
        t = (np.arange(start, 2 - start)[None, :] - ratio[:, None]) * scale
        w = np.clip(1 - np.abs(t), 0, 1)
        return w / w.sum(1, keepdims=True)
    a = float(node.attr("cubic_coeff_a", -0.75))

    def cubic(t: np.ndarray) -> np.ndarray:
        t = np.abs(t)
        return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                        np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))
    if not aa:
        return cubic(np.stack([ratio + 1, ratio, 1 - ratio, 2 - ratio], 1))
    start = int(np.floor(-2 / scale) + 1)
    w = cubic((np.arange(start, 2 - start)[None, :] - ratio[:, None]) * scale)
    return w / w.sum(1, keepdims=True)


def resize_axis_weights(node: Node, n_in: int, n_out: int, scale: float,
                        roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """For one axis: (out, taps) input indices (-1: extrapolated) and weights."""
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode",
                    "half_pixel" if node.attr("_opset", 13) >= 11 and node.op == "Resize" else "asymmetric")
    y = np.arange(n_out, dtype=np.float64)
    length = scale * n_in
    extrap = np.zeros(n_out, bool)
    if ctm == "align_corners":
        xo = np.zeros(n_out) if length == 1 else y * (n_in - 1) / (length - 1)
    elif ctm == "asymmetric":
        xo = y / scale
    elif ctm == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        xo = (np.full(n_out, (hi - lo) * (n_in - 1) / 2) if length == 1
              else y * (hi - lo) * (n_in - 1) / (length - 1)) + lo * (n_in - 1)
        extrap = (xo < 0) | (xo > n_in - 1)
    elif ctm == "pytorch_half_pixel":
        xo = np.full(n_out, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        xo = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        xo = n_in / 2 * (1 - n_out / length) + (y + 0.5) / scale - 0.5
    else:
        raise AotcError(f"{_where(node)}: unknown coordinate_transformation_mode {ctm!r}")
    if mode not in ("nearest", "linear", "cubic"):
        raise AotcError(f"{_where(node)}: unknown mode {mode!r}")
    base = np.floor(xo)
    ratio = np.where(xo == base, 1.0, xo - base)  # in (0, 1]: prefer the left pixel
    w = _coeffs(mode, ratio, scale, node)
    taps = w.shape[1]
    # The taps sit around xo: for an even count the window starts taps/2 - 1 left of floor(xo)
    # (ratio 1 means xo itself is the right-hand one of the middle pair).
    first = (base + np.where(ratio == 1, -1, 0)).astype(np.int64) - (taps // 2 - 1)
    idx = first[:, None] + np.arange(taps)[None, :]
    if node.attr("exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        s = w.sum(1, keepdims=True)
        w = w / np.where(s == 0, 1, s)
    idx = np.clip(idx, 0, n_in - 1)  # the input is edge-padded
    idx[extrap] = -1
    return idx, w


# Taps (output length x taps per output) a resized axis may tabulate.
MAX_RESIZE_TABLE = 1 << 20


def _resize_taps(node: Node, scale: float) -> int:
    """An upper bound of the taps per output index that ``_coeffs`` computes."""
    mode = node.attr("mode", "nearest")
    support = {"nearest": 1, "linear": 1}.get(mode, 2)
    if bool(node.attr("antialias", 0)) and 0 < scale < 1 and mode != "nearest":
        return 2 * int(np.floor(support / scale)) + 2
    return 2 * support


def _resize_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    out, scales, roi = resize_params(node)
    rank = len(out)
    offs, weights = [], []
    is_float = ctype in ("float", "double", "_Float16")
    for d in range(rank):
        n_in, n_out = x.shape[d], out[d]
        stride = contiguous_strides(x.shape)[d]
        ident = n_in == n_out and abs(scales[d] - 1) < 1e-12 and (
            roi is None or (roi[d] == 0 and roi[rank + d] == 1))
        if ident:
            offs.append(dim_offsets(n_out, lambda n=n_out, s=stride: np.arange(n, dtype=np.int64).reshape(-1, 1) * s,
                                    f"{{i}} * {stride}"))
            weights.append(None)
            continue
        if n_out * _resize_taps(node, scales[d]) > MAX_RESIZE_TABLE:
            raise AotcError(f"{_where(node)}: output axis {d} of {n_out} elements needs a table of more than "
                            f"{MAX_RESIZE_TABLE} taps")
        idx, w = resize_axis_weights(node, n_in, n_out, scales[d],
                                     None if roi is None else (roi[d], roi[rank + d]))
        # Merge taps that read the same (clamped) pixel, and drop zero weights.
        keep = np.abs(w) > 0
        nt = max(int(keep.sum(1).max()) if n_out else 1, 1)
        cidx = np.zeros((n_out, nt), np.int64)
        cw = np.zeros((n_out, nt))
        for r in range(n_out):
            if idx[r, 0] < 0:  # extrapolated: the fill value, with weight 1
                cidx[r], cw[r, 0] = -1, 1.0
                continue
            uniq: dict[int, float] = {}
            for i, ww in zip(idx[r], w[r], strict=True):
                if ww != 0:
                    uniq[int(i)] = uniq.get(int(i), 0.0) + float(ww)
            items = list(uniq.items()) or [(0, 0.0)]
            for t, (i, ww) in enumerate(items):
                cidx[r, t], cw[r, t] = i, ww
        off = np.where(cidx < 0, _OUTSIDE, cidx * stride)
        offs.append(off)
        plain = nt == 1 and np.all((cw == 1) | (cidx < 0))
        if not plain and not is_float:
            raise AotcError(f"{_where(node)}: interpolation of {ctype} tensors is not supported")
        weights.append(None if plain else cw)
    fill = c_literal(float(node.attr("extrapolation_value", 0.0)), ctype) if is_float else "0"
    return separable_gather(ins[0], outs[0], ctype, out, offs, weights, fill=fill)


register(OpDef("Resize", "kernel", _resize_infer, emit=_resize_emit, const_inputs=(1, 2, 3)))
register(OpDef("Upsample", "kernel", _resize_infer, emit=_resize_emit, const_inputs=(1,)))


# -- Arg{Max,Min}, CumSum/CumProd, TopK, Hardmax: per-row kernels over one axis -------------------------------
def _arg_infer(node: Node):
    x = _in(node)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    keep = node.attr("keepdims", 1)
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
    return [(shape, np.dtype(np.int64))]


def _arg_emit(node: Node, ins: list[str], outs: list[str], _ctype: str) -> str:
    x = _in(node)
    t = dtypes.c_type(x.dtype)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    outer, n, inner = axis_layout(x.shape, axis)
    better = ">" if node.op == "ArgMax" else "<"
    if node.attr("select_last_index", 0):
        better += "="
    # NaN wins (the first one), as in numpy's argmax.
    return (row_loop_head(outer, inner)
            + f"  const {t} *xr = {ins[0]} + o * {n * inner} + k;\n"
            f"  {t} best = xr[0]; int64_t bi = 0;\n"
            f"  for (size_t i = 1; i < {n}; i++) {{\n"
            f"    const {t} v = xr[i * {inner}];\n"
            f"    if (best == best && (v != v || v {better} best)) {{ best = v; bi = (int64_t)i; }}\n"
            f"  }}\n"
            f"  {outs[0]}[r] = bi;\n}}")


register(OpDef("ArgMax", "kernel", _arg_infer, emit=_arg_emit))
register(OpDef("ArgMin", "kernel", _arg_infer, emit=_arg_emit))


def _same(node: Node):
    x = _in(node)
    return [(x.shape, x.dtype)]


def _cum_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    a = const_input(node, 1, "axis")
    axis = norm_axis(int(np.asarray(a).reshape(-1)[0]), len(x.shape), node) if x.shape else 0
    outer, n, inner = axis_layout(x.shape, axis) if x.shape else (1, 1, 1)
    op, init = ("+", "0") if node.op == "CumSum" else ("*", "1")
    rev = node.attr("reverse", 0)
    excl = node.attr("exclusive", 0)
    idx = f"({n - 1} - j)" if rev else "j"
    upd = f"y[{idx} * {inner}] = acc; acc = acc {op} x[{idx} * {inner}];" if excl else \
        f"acc = acc {op} x[{idx} * {inner}]; y[{idx} * {inner}] = acc;"
    return (row_loop_head(outer, inner)
            + f"  const {ctype} *x = {ins[0]} + o * {n * inner} + k;\n"
            f"  {ctype} *y = {outs[0]} + o * {n * inner} + k;\n"
            f"  {ctype} acc = {init};\n"
            f"  for (size_t j = 0; j < {n}; j++) {{ {upd} }}\n}}")


register(OpDef("CumSum", "kernel", _same, emit=_cum_emit, const_inputs=(1,)))
register(OpDef("CumProd", "kernel", _same, emit=_cum_emit, const_inputs=(1,)))


def _topk_k(node: Node) -> int:
    if "k" in node.attrs:  # opset < 10
        return int(node.attrs["k"])
    return int(np.asarray(const_input(node, 1, "k")).reshape(-1)[0])


def _topk_infer(node: Node):
    x = _in(node)
    axis = norm_axis(node.attr("axis", -1), len(x.shape), node)
    k = _topk_k(node)
    if not 0 <= k <= x.shape[axis]:
        raise AotcError(f"{_where(node)}: k={k} out of range for dimension {x.shape[axis]}")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [(shape, x.dtype), (shape, np.dtype(np.int64))]


def _topk_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    axis = norm_axis(node.attr("axis", -1), len(x.shape), node)
    outer, n, inner = axis_layout(x.shape, axis)
    k = _topk_k(node)
    if k == 0:
        return "(void)0;"
    # Insertion into a sorted list of k: ties keep the lower index first, as ONNX asks. ``sorted=0``
    # leaves the order unspecified, so the sorted order is fine there too.
    before = "v > bv[p - 1]" if node.attr("largest", 1) else "v < bv[p - 1]"
    return (_topk_arrays(node)[1] + "\n" + row_loop_head(outer, inner)
            + f"  const {ctype} *xr = {ins[0]} + o * {n * inner} + k;\n"
            f"  size_t m = 0;\n"
            f"  for (size_t i = 0; i < {n}; i++) {{\n"
            f"    const {ctype} v = xr[i * {inner}];\n"
            f"    size_t p = m < {k} ? m++ : {k};\n"
            f"    if (p == {k} && !({before.replace('p - 1', str(k - 1))})) continue;\n"
            f"    if (p == {k}) p = {k - 1};\n"
            f"    while (p > 0 && ({before})) {{ bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; p--; }}\n"
            f"    bv[p] = v; bi[p] = (int64_t)i;\n"
            f"  }}\n"
            f"  for (size_t j = 0; j < {k}; j++) {{ {outs[0]}[o * {k * inner} + j * {inner} + k] = bv[j]; "
            f"{outs[1]}[o * {k * inner} + j * {inner} + k] = bi[j]; }}\n}}")


def _topk_arrays(node: Node) -> tuple[int, str]:
    """The row's best k values and their indices (k is as large as the axis, which may be huge)."""
    k = _topk_k(node)
    return task_arrays([("bv", _in(node).dtype, k), ("bi", np.dtype(np.int64), k)])


register(OpDef("TopK", "kernel", _topk_infer, emit=_topk_emit, const_inputs=(1,),
               scratch=lambda node: _topk_arrays(node)[0]))


def _hardmax_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    rank = len(x.shape)
    if node.attr("_opset", 13) < 13:  # coerced to 2-D at axis
        axis = norm_axis(node.attr("axis", 1), rank, node)
        outer, n, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
    else:
        outer, n, inner = axis_layout(x.shape, norm_axis(node.attr("axis", -1), rank, node))
    return (row_loop_head(outer, inner)
            + f"  const {ctype} *xr = {ins[0]} + o * {n * inner} + k;\n"
            f"  {ctype} *yr = {outs[0]} + o * {n * inner} + k;\n"
            f"  size_t bi = 0;\n"
            f"  for (size_t i = 1; i < {n}; i++) if (xr[i * {inner}] > xr[bi * {inner}]) bi = i;\n"
            f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] = i == bi;\n}}")


register(OpDef("Hardmax", "kernel", _same, emit=_hardmax_emit))


# -- Trilu ---------------------------------------------------------------------------------------------------
def _trilu_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    kk = const_input(node, 1, "k")
    k = 0 if kk is None else int(np.asarray(kk).reshape(-1)[0])
    *batch, n, m = x.shape
    keep = f"(int64_t)j - (int64_t)i >= {k}" if node.attr("upper", 1) else f"(int64_t)j - (int64_t)i <= {k}"
    return (f"for (size_t b = task; b < {math.prod(batch)}; b += ntasks)\n"
            f"  for (size_t i = 0; i < {n}; i++)\n"
            f"    for (size_t j = 0; j < {m}; j++) {{\n"
            f"      const size_t at = (b * {n} + i) * {m} + j;\n"
            f"      {outs[0]}[at] = {keep} ? {ins[0]}[at] : 0;\n"
            f"    }}")


register(OpDef("Trilu", "kernel", _same, emit=_trilu_emit, const_inputs=(1,)))


# -- Shared by kernels of every module: run-time index checks, per-task working arrays -----------------------
def set_status(code: int) -> str:
    """A C statement reporting ``code`` through the run's status word (see aotc/codegen/kernels.py);
    atomic, as several tasks of a kernel may fail at once."""
    return f"__atomic_store_n(aotc_status, {code}, __ATOMIC_RELAXED);"


def checked_index(node: Node, var: str, e: str, dim: int, values: np.ndarray | None, what: str = "index",
                  negative: bool = True) -> str:
    """C statements setting ``int64_t var`` to the index ``e`` on an axis of length ``dim``, a negative
    one counting from the end as in ONNX (-dim..-1), or out of range if not ``negative`` (ops whose
    indices onnxruntime takes in 0..dim-1 only). An index outside the range makes the kernel
    set ERR_INDEX_OUT_OF_RANGE and return before it reads or writes anything with it: one compare,
    as the clamp it replaced. ``values``: the index's values when they are compile-time constants,
    checked here instead, so that the C does not check them."""
    lo = -dim if negative else 0
    head = f"int64_t {var} = (int64_t)({e});" + (f"\nif ({var} < 0) {var} += {dim};" if negative else "")
    if values is None:
        return head + f"\nif ({var} < 0 || {var} >= {dim}) {{ {set_status(IndexOutOfRangeError.code)} return; }}"
    bad = values[(values < lo) | (values >= dim)]
    if bad.size:
        raise AotcError(f"{_where(node)}: {what} {int(bad.reshape(-1)[0])} is out of range for an axis of "
                        f"length {dim} (valid: {lo}..{dim - 1})")
    return head


STACK_ARRAY_BYTES = 4096


def task_arrays(arrays: list[tuple[str, np.dtype, int]]) -> tuple[int, str]:
    """Working arrays of one kernel task, sized by tensor shapes or attributes: ``arrays`` holds
    (C name, dtype, elements). Up to ``STACK_ARRAY_BYTES`` in all they are stack arrays; larger ones
    would overflow a thread's stack for a big but valid model (pool threads may have small stacks),
    so they are pointers into the task's scratch slot instead, each 64-byte aligned. Returns (scratch
    bytes per task, for ``OpDef.scratch``: 0 for stack arrays; the C declarations). Either way the
    code indexes them as ``name[i]``."""
    sizes = [-(-max(n, 1) * np.dtype(dt).itemsize // 64) * 64 for _, dt, n in arrays]
    if sum(sizes) <= STACK_ARRAY_BYTES:
        return 0, "\n".join(f"{dtypes.c_type(dt)} {name}[{max(n, 1)}];" for name, dt, n in arrays)
    lines = [f"unsigned char *const aotc_slot = (unsigned char *)scratch + task * (size_t){sum(sizes)};"]
    at = 0
    for (name, dt, _), size in zip(arrays, sizes, strict=True):
        t = dtypes.c_type(dt)
        lines.append(f"{t} *restrict {name} = ({t} *)(aotc_slot + {at});")
        at += size
    return sum(sizes), "\n".join(lines)


# -- GatherElements, GatherND, ScatterElements, ScatterND, OneHot --------------------------------------------
def _unravel(name: str, shape: Shape) -> list[str]:
    """C expressions of the multi-index of flat index ``name`` in ``shape``."""
    strides = contiguous_strides(shape)
    return [f"(({name} / {s}) % {d})" for s, d in zip(strides, shape, strict=True)]


def _const_indices(node: Node, i: int = 1) -> np.ndarray | None:
    v = _in(node, i)
    return np.asarray(v.const).astype(np.int64) if v.is_const else None


def _indent(code: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in code.split("\n"))


def _elements_infer(node: Node):
    """GatherElements, ScatterElements: indices of the data's rank that fit in it off the axis (or
    their off-axis coordinates would address past the data)."""
    x, idx = _in(node), _in(node, 1)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    if len(idx.shape) != len(x.shape):
        raise AotcError(f"{_where(node)}: indices have rank {len(idx.shape)}, data has rank {len(x.shape)}")
    too_big = [d for d in range(len(x.shape)) if d != axis and idx.shape[d] > x.shape[d]]
    if too_big:
        d = too_big[0]
        raise AotcError(f"{_where(node)}: indices shape {list(idx.shape)} exceeds data shape {list(x.shape)} "
                        f"on axis {d}")
    if node.op == "GatherElements":
        return [(idx.shape, x.dtype)]
    upd = _in(node, 2)
    if upd.shape != idx.shape:
        raise AotcError(f"{_where(node)}: updates shape {list(upd.shape)} differs from indices shape "
                        f"{list(idx.shape)}")
    return [(x.shape, x.dtype)]


def _element_offset(node: Node, idx_shape: Shape, axis: int) -> str:
    """The flat data offset of element ``e`` of the indices, with ``k`` its checked index on ``axis``."""
    x = _in(node)
    pos = _unravel("e", idx_shape)
    pos[axis] = "k"
    return " + ".join(f"(size_t){p} * {s}" for p, s in zip(pos, contiguous_strides(x.shape), strict=True)) or "0"


def _gather_elements_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    if idx.size == 0:
        return "(void)0;"
    k = checked_index(node, "k", f"{ins[1]}[e]", x.shape[axis], _const_indices(node))
    return (f"for (size_t e = task; e < {idx.size}; e += ntasks) {{\n{_indent(k)}\n"
            f"  {outs[0]}[e] = {ins[0]}[{_element_offset(node, idx.shape, axis)}];\n}}")


register(OpDef("GatherElements", "kernel", _elements_infer, emit=_gather_elements_emit))


# ScatterElements/ScatterND ``reduction``: the C statement that combines an update u into d.
_SCATTER_UPDATE = {"none": "{d} = {u};", "add": "{d} += {u};", "mul": "{d} *= {u};",
                   "max": "if ({u} > {d}) {d} = {u};", "min": "if ({u} < {d}) {d} = {u};"}


def _scatter_elements_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    upd = _SCATTER_UPDATE[node.attr("reduction", "none")]
    # Sequential: later updates win, like the reference; one task does it all.
    code = f"if (task != 0) return;\nmemcpy({outs[0]}, {ins[0]}, {x.size} * sizeof({ctype}));"
    if idx.size == 0:
        return code
    k = checked_index(node, "k", f"{ins[1]}[e]", x.shape[axis], _const_indices(node))
    return (code + f"\nfor (size_t e = 0; e < {idx.size}; e++) {{\n{_indent(k)}\n"
            f"  const size_t at = {_element_offset(node, idx.shape, axis)};\n"
            f"  {upd.format(d=f'{outs[0]}[at]', u=f'{ins[2]}[e]')}\n}}")


register(OpDef("ScatterElements", "kernel", _elements_infer, emit=_scatter_elements_emit))


def _nd_address(node: Node, ins: list[str], first_axis: int) -> str:
    """C statements: ``size_t at``, the data offset that index tuple ``j`` (the last axis of the
    indices) addresses, each component checked against its axis from ``first_axis`` on."""
    x, idx = _in(node), _in(node, 1)
    q = idx.shape[-1]
    xs = contiguous_strides(x.shape)
    values = _const_indices(node)
    lines = ["size_t at = 0;"]
    for t in range(q):
        col = None if values is None else values[..., t]
        lines += [checked_index(node, f"k{t}", f"{ins[1]}[j * {q} + {t}]", x.shape[first_axis + t], col),
                  f"at += (size_t)k{t} * {xs[first_axis + t]};"]
    return "\n".join(lines)


def _gather_nd_infer(node: Node):
    x, idx = _in(node), _in(node, 1)
    b = int(node.attr("batch_dims", 0))
    q = idx.shape[-1] if idx.shape else -1
    if not 0 <= b < min(len(x.shape), len(idx.shape)) or idx.shape[:b] != x.shape[:b]:
        raise AotcError(f"{_where(node)}: batch_dims {b} does not fit data shape {list(x.shape)} and indices "
                        f"shape {list(idx.shape)}")
    if not 1 <= q <= len(x.shape) - b:
        raise AotcError(f"{_where(node)}: index tuples of length {q} for data of rank {len(x.shape)} "
                        f"(batch_dims {b})")
    return [((*idx.shape[:-1], *x.shape[b + q:]), x.dtype)]


def _gather_nd_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    b = int(node.attr("batch_dims", 0))
    q = idx.shape[-1]
    inner = math.prod(x.shape[b + q:])
    nb = math.prod(x.shape[:b])
    per_batch = math.prod(idx.shape[b:-1])
    if nb * per_batch * inner == 0:
        return "(void)0;"
    return (f"for (size_t j = task; j < {nb * per_batch}; j += ntasks) {{\n"
            f"{_indent(_nd_address(node, ins, b))}\n"
            f"  at += (j / {per_batch}) * {math.prod(x.shape[b:])};\n"
            f"  memcpy({outs[0]} + j * {inner}, {ins[0]} + at, {inner} * sizeof({ctype}));\n}}")


register(OpDef("GatherND", "kernel", _gather_nd_infer, emit=_gather_nd_emit))


def _scatter_nd_infer(node: Node):
    x, idx, upd = _in(node), _in(node, 1), _in(node, 2)
    q = idx.shape[-1] if idx.shape else -1
    if not 1 <= q <= len(x.shape):
        raise AotcError(f"{_where(node)}: index tuples of length {q} for data of rank {len(x.shape)}")
    want = (*idx.shape[:-1], *x.shape[q:])
    if upd.shape != want:
        raise AotcError(f"{_where(node)}: updates shape {list(upd.shape)}, expected {list(want)}")
    return [(x.shape, x.dtype)]


def _scatter_nd_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    q = idx.shape[-1]
    inner = math.prod(x.shape[q:])
    n = math.prod(idx.shape[:-1])
    upd = _SCATTER_UPDATE[node.attr("reduction", "none")]
    code = f"if (task != 0) return;\nmemcpy({outs[0]}, {ins[0]}, {x.size} * sizeof({ctype}));"
    if n * inner == 0:
        return code
    return (code + f"\nfor (size_t j = 0; j < {n}; j++) {{\n{_indent(_nd_address(node, ins, 0))}\n"
            f"  for (size_t e = 0; e < {inner}; e++) "
            + upd.format(d=f"{outs[0]}[at + e]", u=f"{ins[2]}[j * {inner} + e]") + "\n}")


register(OpDef("ScatterND", "kernel", _scatter_nd_infer, emit=_scatter_nd_emit))


def _onehot_infer(node: Node):
    idx = _in(node)
    depth = int(np.asarray(const_input(node, 1, "depth")).reshape(-1)[0])
    rank = len(idx.shape) + 1
    axis = norm_axis(node.attr("axis", -1), rank, node)
    shape = list(idx.shape)
    shape.insert(axis, depth)
    return [(tuple(shape), _in(node, 2).dtype)]


def _onehot_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    idx = _in(node)
    out = node.outputs[0].shape
    axis = norm_axis(node.attr("axis", -1), len(out), node)
    outer, depth, inner = axis_layout(out, axis)
    h = f"(int64_t){ins[0]}[e]"
    if idx.dtype.kind == "f":  # NaN, inf and huge floats would convert with undefined behaviour
        h = f"{ins[0]}[e] > {-depth - 1} && {ins[0]}[e] < {depth} ? {h} : {depth}"
    return (f"for (size_t e = task; e < {outer * inner}; e += ntasks) {{\n"
            f"  const size_t o = {Ix.of('e') // max(inner, 1)}, k = {Ix.of('e') % max(inner, 1)};\n"
            f"  int64_t h = {h};\n"
            f"  if (h < 0) h += {depth};\n"
            f"  for (size_t j = 0; j < {depth}; j++) "
            f"{outs[0]}[(o * {depth} + j) * {inner} + k] = (int64_t)j == h ? {ins[2]}[1] : {ins[2]}[0];\n}}"
            if idx.size else "(void)0;")


register(OpDef("OneHot", "kernel", _onehot_infer, emit=_onehot_emit, const_inputs=(1,)))


# -- generators: folded when they are constants, a fill loop otherwise ----------------------------------------
def _cos_infer(node: Node):
    shape = tuple(int(d) for d in np.asarray(const_input(node, 0, "shape")).reshape(-1))
    v = node.attrs.get("value")
    dt = np.asarray(v).dtype if v is not None else np.dtype(np.float32)
    return [(shape, dt)]


def _cos_emit(node: Node, _ins: list[str], outs: list[str], ctype: str) -> str:
    v = node.attrs.get("value")
    val = np.asarray(v).reshape(-1)[0].item() if v is not None else 0
    n = node.outputs[0].size
    return f"for (size_t i = task; i < {n}; i += ntasks) {outs[0]}[i] = {c_literal(val, ctype)};"


register(OpDef("ConstantOfShape", "kernel", _cos_infer, emit=_cos_emit, const_inputs=(0,)))


# A generator folds into a constant up to this size (as aotc.passes.propagate folds); a larger one is
# a kernel, so that the compile never holds an array the size of the output.
_FOLD_BYTES = 16 << 20


def _range_length(node: Node) -> int:
    start, limit, delta = (np.asarray(const_input(node, i, "Range's operands")).reshape(()) for i in range(3))
    if delta == 0:
        raise AotcError(f"{_where(node)}: delta is 0")
    return max(int(np.ceil((limit - start) / delta)), 0)


def _range_fold(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    start, _, delta = (np.asarray(a).reshape(()) for a in args)
    n = _range_length(node)
    if n * start.itemsize > _FOLD_BYTES:
        raise ValueError("too large to fold: the kernel computes it")
    return [(start + np.arange(n) * delta).astype(start.dtype)]


def _range_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    # As the fold computes it: in double for floats (numpy's int64 * float32 is float64), else in int64.
    wide = "double" if ctype in ("float", "double", "_Float16") else "int64_t"
    return (f"for (size_t i = task; i < {node.outputs[0].size}; i += ntasks) "
            f"{outs[0]}[i] = ({ctype})(({wide}){ins[0]}[0] + ({wide})(int64_t)i * ({wide}){ins[2]}[0]);")


register(OpDef("Range", "kernel", lambda n: [((_range_length(n),), _in(n).dtype)], fold=_range_fold,
               emit=_range_emit, const_inputs=(0, 1, 2)))


def _eyelike_infer(node: Node):
    x = _in(node)
    if len(x.shape) != 2:
        raise AotcError(f"{_where(node)}: input must be 2-D, got shape {list(x.shape)}")
    return [(x.shape, dtypes.from_onnx(int(node.attrs["dtype"])) if "dtype" in node.attrs else x.dtype)]


def _eyelike_fold(node: Node, _args: list) -> list[np.ndarray]:
    (shape, dt), = _eyelike_infer(node)
    return [np.eye(shape[0], shape[1], k=int(node.attr("k", 0)), dtype=dt)]


def _eyelike_emit(node: Node, _ins: list[str], outs: list[str], ctype: str) -> str:
    rows, cols = node.outputs[0].shape
    if rows * cols == 0:
        return "(void)0;"
    return (f"for (size_t r = task; r < {rows}; r += ntasks)\n"
            f"  for (size_t c = 0; c < {cols}; c++) "
            f"{outs[0]}[r * {cols} + c] = ({ctype})((int64_t)c - (int64_t)r == {int(node.attr('k', 0))});")


# Folded when its input is a constant; otherwise a kernel (an identity the size of a run-time input).
register(OpDef("EyeLike", "kernel", _eyelike_infer, fold=_eyelike_fold, emit=_eyelike_emit))


# -- Einsum: a plain loop nest over every index letter -----------------------------------------------------
def einsum_terms(node: Node) -> tuple[list[str], str, dict[str, int]]:
    """(each operand's indices with any ellipsis spelled out, the output's, each index's size)."""
    eq = node.attr("equation").replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    ins = [_in(node, i) for i in range(len(terms))]
    letters = [c for c in string.ascii_letters]
    used = set(eq)
    spare = [c for c in letters if c not in used]
    ell: list[str] = []
    sizes: dict[str, int] = {}
    out_terms = []
    for t, v in zip(terms, ins, strict=True):
        if "..." in t:
            n_ell = len(v.shape) - (len(t) - 3)
            while len(ell) < n_ell:
                ell.insert(0, spare.pop(0))
            t = t.replace("...", "".join(ell[len(ell) - n_ell:]))
        if len(t) != len(v.shape):
            raise AotcError(f"{_where(node)}: term {t!r} does not match rank {len(v.shape)}")
        for c, d in zip(t, v.shape, strict=True):
            if sizes.get(c, d) != d and d != 1 and sizes[c] != 1:
                raise AotcError(f"{_where(node)}: dimension {c!r} differs between operands")
            sizes[c] = max(sizes.get(c, d), d)
        out_terms.append(t)
    if not _:
        counts = {c: "".join(out_terms).count(c) for c in sizes}
        rhs = "".join(ell) + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", "".join(ell))
    return out_terms, rhs, sizes


def _einsum_infer(node: Node):
    _terms, rhs, sizes = einsum_terms(node)
    return [(tuple(sizes[c] for c in rhs), _in(node).dtype)]


def _einsum_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    terms, rhs, sizes = einsum_terms(node)
    summed = [c for c in sizes if c not in rhs]
    n_out = math.prod([sizes[c] for c in rhs])
    lines = [f"for (size_t e = task; e < {n_out}; e += ntasks) {{"]
    for c, ex in zip(rhs, _unravel("e", tuple(sizes[c] for c in rhs)), strict=True):
        lines.append(f"  const size_t {c}_ = {ex};")
    lines.append(f"  {ctype} acc = 0;")
    for c in summed:
        lines.append(f"  for (size_t {c}_ = 0; {c}_ < {sizes[c]}; {c}_++)")
    factors = []
    for k, t in enumerate(terms):
        shape = _in(node, k).shape
        st = contiguous_strides(shape)
        off = " + ".join(f"{c}_ * {s}" if d != 1 else "0" for c, s, d in zip(t, st, shape, strict=True)) or "0"
        factors.append(f"{ins[k]}[{off}]")
    lines.append(f"    acc += {' * '.join(factors)};")
    lines.append(f"  {outs[0]}[e] = acc;\n}}")
    return "\n".join(lines)


register(OpDef("Einsum", "kernel", _einsum_infer, emit=_einsum_emit))


# Window generators: their only operand is a compile-time size, so they always fold (onnx.reference).
def _window_infer(node: Node):
    size = int(np.asarray(const_input(node, 0, "the window size")).reshape(-1)[0])
    return [((size,), dtypes.from_onnx(int(node.attr("output_datatype", 1))))]


for _w in ("HannWindow", "HammingWindow", "BlackmanWindow"):
    register(OpDef(_w, "kernel", _window_infer, const_inputs=(0,)))
# ScatterElements under its pre-opset-11 name.
register(OpDef("Scatter", "kernel", _elements_infer, emit=_scatter_elements_emit))


# -- CenterCropPad: a centered crop or zero pad per axis -------------------------------------------------------
def _ccp_params(node: Node) -> tuple[Shape, list[int]]:
    """(output shape, per axis the input index of output index 0; negative when padding)."""
    x = _in(node)
    rank = len(x.shape)
    shape = [int(v) for v in np.asarray(const_input(node, 1, "the shape")).reshape(-1)]
    axes = node.attr("axes")
    axes = list(range(rank)) if axes is None else [norm_axis(int(a), rank, node) for a in axes]
    out, start = list(x.shape), [0] * rank
    for a, s in zip(axes, shape, strict=True):
        out[a] = s
        d = x.shape[a]
        start[a] = (d - s) // 2 if s <= d else -((s - d) // 2)  # odd differences leave the extra at the end
    return tuple(out), start


def _ccp_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    out, start = _ccp_params(node)
    offs: list[Offsets] = []
    for n, d, s, st in zip(out, x.shape, contiguous_strides(x.shape), start, strict=True):
        if n > MAX_TABLE:
            offs.append(_pad_expr(-st, d, "constant", s))
            continue
        j = np.arange(n) + st
        offs.append(_dim_offsets(np.clip(j, 0, max(d - 1, 0)), s, (j >= 0) & (j < d)))
    return separable_gather(ins[0], outs[0], ctype, out, offs, fill=c_literal(0, ctype))


register(OpDef("CenterCropPad", "kernel", lambda n: [(_ccp_params(n)[0], _in(n).dtype)], emit=_ccp_emit,
               const_inputs=(1,)))


# -- ReverseSequence, Compress ----------------------------------------------------------------------------------
def _revseq_axes(node: Node) -> tuple[int, int]:
    x, lens = _in(node), _in(node, 1)
    ta, ba = int(node.attr("time_axis", 0)), int(node.attr("batch_axis", 1))
    if len(x.shape) < 2 or {ta, ba} != {0, 1}:
        raise AotcError(f"{_where(node)}: time_axis {ta} and batch_axis {ba} must be 0 and 1 (either order) "
                        f"of an input of rank >= 2, got rank {len(x.shape)}")
    if lens.shape != (x.shape[ba],):
        raise AotcError(f"{_where(node)}: sequence_lens has shape {list(lens.shape)}, expected [{x.shape[ba]}]")
    return ta, ba


def _revseq_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    ta, ba = _revseq_axes(node)
    if x.size == 0:
        return "(void)0;"
    st = contiguous_strides(x.shape)
    steps = x.shape[ta]
    lens = _const_indices(node)
    if lens is not None and ((lens < 0) | (lens > steps)).any():
        bad = int(lens[(lens < 0) | (lens > steps)][0])
        raise AotcError(f"{_where(node)}: sequence length {bad} is out of range 0..{steps}")
    # A length outside 0..steps is an out-of-range index too: onnxruntime refuses it.
    check = "" if lens is not None else (
        f"  if (n < 0 || n > {steps}) {{ {set_status(IndexOutOfRangeError.code)} return; }}\n")
    return (f"for (size_t e = task; e < {x.size}; e += ntasks) {{\n"
            f"  const int64_t t = (int64_t)((e / {st[ta]}) % {steps});\n"
            f"  const int64_t n = (int64_t){ins[1]}[(e / {st[ba]}) % {x.shape[ba]}];\n"
            + check +
            f"  const int64_t src = t < n ? n - 1 - t : t;\n"
            f"  {outs[0]}[e] = {ins[0]}[(int64_t)e + (src - t) * {st[ta]}];\n}}")


def _revseq_infer(node: Node):
    _revseq_axes(node)
    return _same(node)


register(OpDef("ReverseSequence", "kernel", _revseq_infer, emit=_revseq_emit))


def _compress_params(node: Node) -> tuple[int | None, np.ndarray]:
    cond = np.asarray(const_input(node, 1, "the condition")).reshape(-1).astype(bool)
    axis = node.attr("axis")
    x = _in(node)
    axis = None if axis is None else norm_axis(int(axis), len(x.shape), node)
    n = x.size if axis is None else x.shape[axis]
    return axis, np.nonzero(cond[:n])[0]


def _compress_infer(node: Node):
    x = _in(node)
    axis, sel = _compress_params(node)
    if axis is None:
        return [((len(sel),), x.dtype)]
    return [(tuple(len(sel) if d == axis else n for d, n in enumerate(x.shape)), x.dtype)]


def _compress_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    axis, sel = _compress_params(node)
    out = node.outputs[0].shape
    if axis is None:
        return separable_gather(ins[0], outs[0], ctype, out, [sel.reshape(-1, 1)])
    st = contiguous_strides(x.shape)
    # The selection is as long as the condition, a constant of the model; the other axes may be long.
    offs = [_dim_offsets(sel, st[d]) if d == axis else
            dim_offsets(n, lambda n=n, d=d: _dim_offsets(np.arange(n), st[d]), f"{{i}} * {st[d]}")
            for d, n in enumerate(out)]
    return separable_gather(ins[0], outs[0], ctype, out, offs)


register(OpDef("Compress", "kernel", _compress_infer, emit=_compress_emit, const_inputs=(1,)))


# -- AffineGrid: theta @ [x, y, (z,) 1] over a normalized base grid ---------------------------------------------
def _affine_size(node: Node) -> list[int]:
    return [int(v) for v in np.asarray(const_input(node, 1, "the size")).reshape(-1)]


def _affine_infer(node: Node):
    size = _affine_size(node)
    spatial = size[2:]
    return [((size[0], *spatial, len(spatial)), _in(node).dtype)]


def _affine_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    size = _affine_size(node)
    spatial = size[2:]
    k = len(spatial)
    align = bool(node.attr("align_corners", 0))
    npts = math.prod(spatial)
    if size[0] * npts == 0:
        return "(void)0;"
    # The output's last axis is (x, y[, z]): x follows the last spatial dim. Each base coordinate is
    # computed as numpy computes the reference's grid (linspace: i * step + start, the end exact).
    lines = [f"for (size_t e = task; e < {size[0] * npts}; e += ntasks) {{",
             f"  const size_t n = e / {npts};",
             f"  size_t q = e % {npts};",
             f"  double base[{k}];"]
    for c, m in enumerate(reversed(spatial)):
        lines.append(f"  {{ const size_t i = q % {m}; q /= {m};")
        if not align:
            value = f"(double)(2 * i + 1) / {m}.0 - 1.0"
        elif m == 1:
            value = "0.0"
        else:
            value = f"i == {m - 1} ? 1.0 : (double)i * (2.0 / {m - 1}.0) + -1.0"
        lines.append(f"    base[{c}] = {value}; }}")
    lines += ["  (void)q;",
              f"  const {ctype} *th = {ins[0]} + n * {k * (k + 1)};",
              f"  for (size_t r = 0; r < {k}; r++) {{",
              f"    double v = th[r * {k + 1} + {k}];",
              f"    for (size_t c = 0; c < {k}; c++) v += th[r * {k + 1} + c] * base[c];",
              f"    {outs[0]}[e * {k} + r] = ({ctype})v;",
              "  }", "}"]
    return "\n".join(lines)


register(OpDef("AffineGrid", "kernel", _affine_infer, emit=_affine_emit, const_inputs=(1,)))
