"""Convolution and pooling: Conv, ConvTranspose, MaxPool, AveragePool, LpPool and the global pools.

Every op works on NC + 1..3 spatial dims; the C generators pad the spatial dims to three (leading
1s), so one loop nest covers 1-D, 2-D and 3-D. Work is split over (batch, channel) pairs, never over
a reduction, so results do not depend on ``ntasks``.

Conv has five code paths (``conv_path`` picks one, ``conv_kernel`` writes it); the fast ones are
float32 and split work over (batch, group, chunk of output positions, block of output channels):

- "winograd" (constant weights, 3x3 stride 1, one group, 16 to 256 channels): F(4x4, 3x3) or
  F(2x2, 3x3) in ``aotc/ops/winograd.py``, 2 to 4 times fewer multiplies than the direct sum.

- "tiled" (constant weights): a register-tiled implicit GEMM. Weights are packed at compile time into
  blocks of CB output channels ([ci][tap][CB]); a tile of R output positions x CB channels lives in
  vector registers while every (input channel, tap) adds ``x * w``: R broadcasts of x and CB/lanes
  weight loads feed R * CB/lanes FMAs, the GEMM micro-kernel's ratio. Padding is handled by copying
  the input into a zero-padded scratch buffer, so the hot loop has no bounds checks. On AVX2, 1x1
  convs with fewer output than input channels (and small planes) take a variant of it
  (``_pointwise_conv``) that blocks the input channels and writes out through 8x8 transposes.
- "rows" (constant weights, 1x1, stride 1, no padding): Y[co, s] = W[co, ci] X[ci, s] with the
  weights broadcast and contiguous vectors of positions, the input packed into panels like GEMM's B.
- "depthwise" (one input channel per group): strided or small planes are copied into a zero-padded
  buffer split into stride phases, so one flat loop over "virtual" positions has contiguous loads
  for every tap; large stride-1 planes run a width loop per row with the taps unrolled.
- "generic" (float64, run-time weights): a plain bounds-checked loop.

The Conv kernel applies its fused elementwise consumers (``Epilogue``) to each value before storing.
Pooling is separable (rows reduced into a padded row buffer, then along it) for MaxPool and
AveragePool; LpPool, the Indices output and the global pools use a bounds-checked loop.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.common import lowest
from aotc.ops.registry import OpDef, register

if TYPE_CHECKING:
    from aotc.target import Target


@dataclass(frozen=True)
class Geometry:
    """Sizes of one conv/pool with the spatial dims padded to three (leading 1s)."""

    n: int                      # batch
    c: int                      # input channels
    m: int                      # output channels
    group: int
    inp: tuple[int, int, int]   # input spatial dims
    out: tuple[int, int, int]   # output spatial dims
    k: tuple[int, int, int]     # kernel
    s: tuple[int, int, int]     # strides
    d: tuple[int, int, int]     # dilations
    pb: tuple[int, int, int]    # pads at the beginning
    pe: tuple[int, int, int]    # pads at the end

    @property
    def in_size(self) -> int:
        return math.prod(self.inp)

    @property
    def out_size(self) -> int:
        return math.prod(self.out)

    @property
    def taps(self) -> int:
        return math.prod(self.k)


def _pad3(v: list[int] | tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return tuple([fill] * (3 - len(v)) + [int(x) for x in v])  # type: ignore[return-value]


def _spatial(node: Node, in_sp: tuple[int, ...], k_sp: tuple[int, ...], ceil_mode: bool = False):
    """(out, pads_begin, pads_end) per ONNX's rules for auto_pad, pads, strides, dilations, ceil_mode."""
    nd = len(in_sp)
    if nd < 1 or nd > 3:
        raise AotcError(f"{node.op} node {node.name!r}: {nd} spatial dims (1 to 3 supported)")
    s, d = _per_axis(node, "strides", nd, 1), _per_axis(node, "dilations", nd, 1)
    pads = _per_axis(node, "pads", 2 * nd, 0)
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    ek = [(k - 1) * dd + 1 for k, dd in zip(k_sp, d, strict=True)]  # extent of a dilated kernel
    out, pb, pe = [], [], []
    for i in range(nd):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-in_sp[i] // s[i])
            total = max(0, (o - 1) * s[i] + ek[i] - in_sp[i])
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            out.append(o), pb.append(lo), pe.append(total - lo)
            continue
        b, e = (0, 0) if auto == "VALID" else (pads[i], pads[i + nd])
        span = in_sp[i] + b + e - ek[i]
        o = (-(-span // s[i]) if ceil_mode else span // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= in_sp[i] + b:  # the last window must start inside
            o -= 1
        out.append(o), pb.append(b), pe.append(e)
    if min(out) < 1:
        raise AotcError(f"{node.op} node {node.name!r}: empty output for input {in_sp}")
    return out, pb, pe, s, d


def _per_axis(node: Node, name: str, n: int, default: int) -> list[int]:
    """Attribute ``name`` as ``n`` ints (``default`` when absent); the frontend checked its values'
    signs (aotc/frontends/validate.py), its length needs the input's rank."""
    values = [int(x) for x in node.attr(name, [default] * n)]
    if len(values) != n:
        raise AotcError(f"{node.op} node {node.name!r}: attribute {name} {values} has {len(values)} values, "
                        f"the input's {n // 2 if name == 'pads' else n} spatial axes need {n}")
    return values


def geometry(node: Node) -> Geometry:
    """The geometry of a Conv, ConvTranspose or pooling node (inputs must have shapes)."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 3:
        raise AotcError(f"{node.op} node {node.name!r}: input rank {len(x.shape)} < 3")
    n, c, in_sp = x.shape[0], x.shape[1], tuple(x.shape[2:])
    nd = len(in_sp)
    group = int(node.attr("group", 1))
    if node.op in ("Conv", "ConvTranspose"):
        w = node.inputs[1]
        assert w is not None and w.shape is not None
        k_sp = tuple(w.shape[2:])
        if len(w.shape) != len(x.shape):
            raise AotcError(f"{node.op} node {node.name!r}: weight shape {list(w.shape)} does not have the "
                            f"rank of input shape {list(x.shape)}")
        if c % group:
            raise AotcError(f"{node.op} node {node.name!r}: attribute group {group} does not divide the "
                            f"input's {c} channels")
        if "kernel_shape" in node.attrs and tuple(node.attrs["kernel_shape"]) != k_sp:
            raise AotcError(f"{node.op} node {node.name!r}: attribute kernel_shape {list(node.attrs['kernel_shape'])} "
                            f"does not match weight shape {list(w.shape)}")
    elif node.op.startswith("Global"):
        k_sp = in_sp
    else:
        k_sp = tuple(_per_axis(node, "kernel_shape", nd, 0))
    if node.op == "Conv":
        m = w.shape[0]
        if w.shape[1] * group != c:
            raise AotcError(f"Conv node {node.name!r}: weight shape {list(w.shape)} has {w.shape[1]} input "
                            f"channels per group, input shape {list(x.shape)} with group {group} has {c // group}")
        if m % group:
            raise AotcError(f"Conv node {node.name!r}: attribute group {group} does not divide the weight's "
                            f"{m} output channels")
        out, pb, pe, s, d = _spatial(node, in_sp, k_sp)
    elif node.op == "ConvTranspose":
        if w.shape[0] != c:
            raise AotcError(f"ConvTranspose node {node.name!r}: weight shape {list(w.shape)} has {w.shape[0]} "
                            f"input channels, input shape {list(x.shape)} has {c}")
        m = w.shape[1] * group
        out, pb, pe, s, d = _transpose_spatial(node, in_sp, k_sp)
    elif node.op.startswith("Global"):
        m, out, pb, pe, s, d = c, [1] * nd, [0] * nd, [0] * nd, [1] * nd, [1] * nd
    else:
        m = c
        out, pb, pe, s, d = _spatial(node, in_sp, k_sp, bool(node.attr("ceil_mode", 0)))
    return Geometry(n, c, m, group, _pad3(in_sp, 1), _pad3(out, 1), _pad3(k_sp, 1), _pad3(s, 1),
                    _pad3(d, 1), _pad3(pb, 0), _pad3(pe, 0))


def _transpose_spatial(node: Node, in_sp: tuple[int, ...], k_sp: tuple[int, ...]):
    nd = len(in_sp)
    s, d = _per_axis(node, "strides", nd, 1), _per_axis(node, "dilations", nd, 1)
    op = _per_axis(node, "output_padding", nd, 0)
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    full = [s[i] * (in_sp[i] - 1) + op[i] + (k_sp[i] - 1) * d[i] + 1 for i in range(nd)]
    shape = node.attr("output_shape")
    if shape is not None and len(shape) not in (nd, nd + 2):
        raise AotcError(f"ConvTranspose node {node.name!r}: attribute output_shape {list(shape)} has "
                        f"{len(shape)} values, the input's {nd} spatial axes need {nd}")
    if "pads" in node.attrs and auto not in ("SAME_UPPER", "SAME_LOWER"):
        pads = _per_axis(node, "pads", 2 * nd, 0)
        pb, pe = pads[:nd], pads[nd:]
        out = [full[i] - pb[i] - pe[i] for i in range(nd)]
    elif shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [int(x) for x in shape][-nd:] if shape is not None else [in_sp[i] * s[i] for i in range(nd)]
        total = [full[i] - out[i] for i in range(nd)]
        if any(total[i] <= -s[i] for i in range(nd)):  # onnxruntime's limit: no input would reach the rest
            raise AotcError(f"ConvTranspose node {node.name!r}: attribute output_shape {list(shape)} exceeds the "
                            f"full output {full} of input shape {list(in_sp)} by a stride {s} or more")
        # onnxruntime: SAME_UPPER puts the odd pad at the end, anything else at the beginning. An
        # output_shape past the full output (by less than a stride) gets its extra rows at the end
        # (onnxruntime and onnx.reference agree); SAME with a kernel shorter than the stride splits its
        # negative total as onnx.reference does (onnxruntime gives another shape).
        split = [max(t, 0) for t in total] if shape is not None else total
        pb = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in split]
        pe = [t - b for t, b in zip(total, pb, strict=True)]
    else:
        pb, pe, out = [0] * nd, [0] * nd, full
    if min(out) < 1:
        raise AotcError(f"ConvTranspose node {node.name!r}: empty output")
    return out, pb, pe, s, d


def _infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    g = geometry(node)
    b = node.inputs[2] if node.op in ("Conv", "ConvTranspose") and len(node.inputs) > 2 else None
    if b is not None and b.shape != (g.m,):
        raise AotcError(f"{node.op} node {node.name!r}: bias shape {list(b.shape or ())} does not match "
                        f"the {g.m} output channels")
    nd = len(x.shape) - 2
    shape = (g.n, g.m, *g.out[3 - nd:])
    res = [(shape, x.dtype)]
    if node.op == "MaxPool" and len(node.outputs) > 1:
        res.append((shape, np.dtype(np.int64)))
    return res


# -- C generation ------------------------------------------------------------------------------------
# Epilogue: C statements that update ``v`` (the finished output value) and may read n, c, od, oh, ow.
Epilogue = list[str]


def _epi_block(epi: Epilogue | None, g: Geometry, s: str, indent: str = "") -> list[str]:
    """Statements defining od/oh/ow from the flat output position ``s`` if the epilogue uses them
    (most epilogues read per-channel values or same-shaped tensors, addressed by c and s only)."""
    if not epi:
        return []
    oh_, ow_ = g.out[1], g.out[2]
    lines = list(epi)
    if any(re.search(r"\b(od|oh|ow)\b", ln) for ln in epi):
        lines.insert(0, f"const size_t od = ({s}) / {oh_ * ow_}, oh = ({s}) / {ow_} % {oh_}, ow = ({s}) % {ow_};"
                        " (void)od; (void)oh; (void)ow;")
    return [indent + x for x in lines]


# Each output is one chain of dependent FMAs (one per tap): unrolling lets the vectorized loop
# overlap several chains. GCC unrolls the plain loop by itself but not once an epilogue (Clip) is in
# it, which made a depthwise conv + Clip 1.6x slower.
UNROLL = "#pragma GCC unroll 4"
# A register tile's write-out has a constant trip count: GCC unrolls such a loop whole before its
# vectorizer runs, then leaves the unrolled scalar code (a clamp to IEEE max/min is cheap in scalar
# cost) unvectorized. Kept a loop, it is vectorized.
WRITE_OUT = "#pragma GCC unroll 1"


def _task_loop(total: int, inner: str) -> str:
    """Tasks take contiguous ranges of work units (every unit is computed the same way)."""
    return (f"for (size_t t = (size_t){total} * task / ntasks; t < (size_t){total} * (task + 1) / ntasks; t++) {{\n"
            f"{inner}\n}}")


def _generic_conv(g: Geometry, x: str, w: str, b: str | None, y: str, ct: str, epi: Epilogue | None) -> str:
    """Any dtype, any weights: bounds-checked direct convolution, one (n, m) plane per work unit."""
    cg, mg = g.c // g.group, g.m // g.group
    ID, IH, IW = g.inp
    acc, cast = ("float", "(float)") if ct == "_Float16" else (ct, "")
    lines = [f"const size_t n = t / {g.m}, c = t % {g.m}, grp = c / {mg}; (void)n;",
             f"const {ct} *xg = {x} + (n * {g.c} + grp * {cg}) * {g.in_size};",
             f"const {ct} *wm = {w} + c * {cg * g.taps};",
             f"{ct} *yo = {y} + t * {g.out_size};",
             f"for (size_t s = 0; s < {g.out_size}; s++) {{",
             f"  const ptrdiff_t d0 = (ptrdiff_t)(s / {g.out[1] * g.out[2]}) * {g.s[0]} - {g.pb[0]};",
             f"  const ptrdiff_t h0 = (ptrdiff_t)(s / {g.out[2]} % {g.out[1]}) * {g.s[1]} - {g.pb[1]};",
             f"  const ptrdiff_t w0 = (ptrdiff_t)(s % {g.out[2]}) * {g.s[2]} - {g.pb[2]};",
             # float16 accumulates in float, rounds, then adds the bias, as numpy's reference does.
             f"  {acc} v = {f'{b}[c]' if b and acc == ct else '0'};",
             f"  for (size_t ci = 0; ci < {cg}; ci++)",
             f"    for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++) {{",
             f"      const ptrdiff_t id = d0 + kd * {g.d[0]}; if (id < 0 || id >= {ID}) continue;",
             f"      for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++) {{",
             f"        const ptrdiff_t ih = h0 + kh * {g.d[1]}; if (ih < 0 || ih >= {IH}) continue;",
             f"        for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
             f"          const ptrdiff_t iw = w0 + kw * {g.d[2]}; if (iw < 0 || iw >= {IW}) continue;",
             f"          v += {cast}wm[((ci * {g.k[0]} + kd) * {g.k[1]} + kh) * {g.k[2]} + kw] * "
             f"{cast}xg[ci * {g.in_size} + (id * {IH} + ih) * {IW} + iw];",
             "        }", "      }", "    }",
             *([] if acc == ct else [f"  {{ {ct} h = ({ct})v; {f'h = ({ct})(h + {b}[c]); ' if b else ''}"
                                     f"v = h; }}"]),
             *_epi_block(epi, g, "s", "  "),
             "  yo[s] = v;", "}"]
    return _task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


def _padded_dims(g: Geometry) -> tuple[int, int, int]:
    return tuple(g.inp[i] + g.pb[i] + g.pe[i] for i in range(3))  # type: ignore[return-value]


def _pad_copy(g: Geometry, src: str, dst: str, planes: int) -> list[str]:
    """Copy ``planes`` input planes into a zero-padded buffer (so the hot loops need no bounds checks)."""
    PD, PH, PW = _padded_dims(g)
    ID, IH, IW = g.inp
    # The padding is zeroed on a task's first unit only: later copies overwrite the same interior.
    return [f"if (t == t0) for (size_t i = 0; i < {planes * PD * PH * PW}; i++) {dst}[i] = 0;",
            f"for (size_t p = 0; p < {planes * ID * IH}; p++) {{",
            f"  const size_t pl = p / {ID * IH}, r = p % {ID * IH};",
            f"  float *restrict drow = {dst} + pl * {PD * PH * PW} + ((r / {IH} + {g.pb[0]}) * {PH} "
            f"+ r % {IH} + {g.pb[1]}) * {PW} + {g.pb[2]};",
            f"  const float *restrict srow = {src} + p * {IW};",
            f"  for (size_t i = 0; i < {IW}; i++) drow[i] = srow[i];",
            "}"]


def _pad_rows(g: Geometry, src: str, dst: str, planes: int, slo: str, shi: str) -> list[str]:
    """2-D/1-D padded copy of only the padded rows that output positions [slo, shi) read (zeroed, then
    the input rows among them copied in): what one task of the tiled path needs."""
    _, PH, PW = _padded_dims(g)
    _, IH, IW = g.inp
    OW = g.out[2]
    last = (g.k[1] - 1) * g.d[1]
    pb = g.pb[1]
    return [f"const size_t r0 = {slo} / {OW} * {g.s[1]}, r1 = ({shi} - 1) / {OW} * {g.s[1]} + {last + 1};",
            f"const size_t i0 = r0 > {pb} ? r0 - {pb} : 0, i1 = r1 > {pb + IH} ? {IH} : r1 > {pb} ? r1 - {pb} : 0;",
            f"for (size_t pl = 0; pl < {planes}; pl++) {{",
            f"  for (size_t i = r0 * {PW}; i < r1 * {PW}; i++) {dst}[pl * {PH * PW} + i] = 0;",
            "  for (size_t ih = i0; ih < i1; ih++)",
            f"    for (size_t i = 0; i < {IW}; i++)",
            f"      {dst}[pl * {PH * PW} + (ih + {pb}) * {PW} + {g.pb[2]} + i] = {src}[(pl * {IH} + ih) * {IW} + i];",
            "}"]


def _block_count(mg: int, cb: int) -> str:
    """C expression: the channels of block ``blk`` that exist; a literal when every block is full, so
    the compiler unrolls the loops that write a tile out."""
    return str(cb) if mg % cb == 0 else f"{mg} - blk * {cb} < {cb} ? {mg} - blk * {cb} : {cb}"


def _needs_pad(g: Geometry) -> bool:
    return any(g.pb) or any(g.pe)


@dataclass(frozen=True)
class TilePlan:
    cb: int      # output channels per block (nv vectors)
    nv: int
    r: int       # output positions per register tile
    lanes: int


def tile_plan(g: Geometry, target: Target) -> TilePlan:
    pw = pointwise_plan(g, target)
    if pw is not None:
        return pw
    vec = target.isa
    lanes = vec.lanes
    mg = g.m // g.group
    # Two vectors at most: 3 positions x 4 vectors (MobileNetV2's 32-channel stem read once instead
    # of twice) measured 18% slower than 2 blocks of 5 x 2 (the layer alone, 1 thread).
    nv = 1 if mg <= lanes else 2
    rmax = min(vec.acc_budget // nv, 8, g.out_size)
    if vec.registers == 16 and nv == 2:
        # 6 x 2 accumulators leave the 2 weight vectors and the broadcast 3 of the 16 registers, and
        # GCC then reloads weights into FMAs and spills; 5 x 2 measured 5-7% faster on ResNet-18's
        # 3x3 convs (64 channels, 56x56) and 7x7 stem as single layers, 1-3% in the model.
        rmax = min(rmax, 5)
    # The last tile overlaps the one before: take the tile height that computes the fewest positions,
    # counting half a position of overhead per tile (7x7 = 49 positions: 10 tiles of 5, not 9 of 6).
    r = min(range(max(1, rmax - 2), rmax + 1), key=lambda r: (-(-g.out_size // r) * (2 * r + 1), -r))
    return TilePlan(nv * lanes, nv, r, lanes)


def pack_conv_weights(w: np.ndarray, b: np.ndarray | None, g: Geometry, plan: TilePlan) -> np.ndarray:
    """[group][block][ci][tap][CB] weights, then [group][block][CB] bias; channels past Mg are zero."""
    cg, mg = g.c // g.group, g.m // g.group
    nb = -(-mg // plan.cb)
    wr = np.zeros((g.group, nb * plan.cb, cg, g.taps), np.float32)
    wr[:, :mg] = w.reshape(g.group, mg, cg, g.taps)
    packed = wr.reshape(g.group, nb, plan.cb, cg, g.taps).transpose(0, 1, 3, 4, 2)
    bias = np.zeros((g.group, nb * plan.cb), np.float32)
    if b is not None:
        bias[:, :mg] = b.reshape(g.group, mg)
    return np.concatenate([packed.reshape(-1), bias.reshape(-1)])


def conv_scratch_floats(g: Geometry, path: str, target: Target) -> int:
    """Scratch floats per task: the zero-padded input planes of the tiled path, the input panels of
    the 1x1 path."""
    if path == "rows":
        plan = rows_plan(g, target)
        assert plan is not None
        pv = plan[1] * plan[2]
        if not _rows_pack(g, plan):
            return 0
        return _rows_chunk(g, g.c // g.group, pv, target) * (g.c // g.group)
    if path == "depthwise":
        return _phase_scratch(g) if _use_phase(g) else 0
    if path == "winograd":
        wg = _winograd()
        return wg.winograd_scratch_floats(g, wg.winograd_plan(g, target))
    if path == "tiled" and (pw := pointwise_plan(g, target)) is not None:
        return 2 * pw.cb * _pointwise_chunk(g, pw, target)[1]
    if path != "tiled":
        return 0
    plan = tile_plan(g, target)
    sums = _tiled_chunks(g, plan.r, target)[0] * plan.cb if _ci_block(g, plan, target) < g.c // g.group else 0
    pad = (math.prod(_padded_dims(g)) + 15) // 16 * 16 * (g.c // g.group) if _needs_pad(g) else 0
    if _tiled_vector_out(g, plan, target):
        q = _tiled_out_chunk(plan, target)
        sums += (q + plan.r) * plan.cb + plan.cb * q
    return pad + sums


def _tiled_vector_out(g: Geometry, plan: TilePlan, target: Target) -> bool:
    """Whether the tiled path writes its tiles out through 8x8 transposes (AVX2) rather than one
    scalar store per output, strided by the plane: on MobileNetV2's stem (27 MACs per output) the
    scalar write-out took about as long as the sums."""
    return _lanes_of_8x8(target) and _ci_block(g, plan, target) == g.c // g.group


def _tiled_out_chunk(plan: TilePlan, target: Target) -> int:
    """Positions per write-out step of the tiled path: whole tiles and whole 8x8 transposes, the
    position-major sums and their transpose within half of L1 (16 KB)."""
    step = plan.r * 8
    return max(step, target.l1d_bytes // 16 // plan.cb // step * step)


def _tiled_chunks(g: Geometry, r: int, target: Target) -> tuple[int, int]:
    """(positions per chunk, chunks) of the tiled path: chunks of (nearly) equal size, multiples of the
    tile height, whose input fits in half of L2 (a short last chunk would leave one task almost idle)."""
    os_ = g.out_size
    cap = max(r, min(os_, target.l2_bytes // 8 // max(1, (g.c // g.group) * g.s[1] * g.s[2])) // r * r)
    nch = -(-os_ // cap)
    per_chunk = -(-os_ // nch)
    chunk = -(-per_chunk // r) * r
    return chunk, -(-os_ // chunk)


def _ci_block(g: Geometry, plan: TilePlan, target: Target) -> int:
    """Input channels per pass of the tiled path. A channel block's weights beyond an eighth of L2, 64 KB
    (ResNet's 512-channel 3x3 convs: 295 KB), do not stay in L2 beside the input while every tile of the chunk
    rereads them, so the sum runs over blocks of 64 input channels (36 KB of 3x3 weights), each swept
    over all tiles, the partial sums kept in scratch. Stored and reloaded floats are exact, so the
    result is the same bits as one pass."""
    cg = g.c // g.group
    return cg if cg * g.taps * plan.cb * 4 <= target.l2_bytes // 8 else 64


def _tiled_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
                fn: str) -> tuple[str, str]:
    """(helpers, body) of the register-tiled float32 conv; see the module docstring."""
    vec = target.isa
    plan = tile_plan(g, target)
    cg, mg = g.c // g.group, g.m // g.group
    nb = -(-mg // plan.cb)
    cb, nv, R, L = plan.cb, plan.nv, plan.r, plan.lanes
    PD, PH, PW = _padded_dims(g) if _needs_pad(g) else g.inp
    ps = PD * PH * PW
    taps = [(kd * g.d[0] * PH + kh * g.d[1]) * PW + kw * g.d[2]
            for kd in range(g.k[0]) for kh in range(g.k[1]) for kw in range(g.k[2])]
    OS, OH, OW = g.out_size, g.out[1], g.out[2]
    bias_off = g.group * nb * cg * g.taps * cb

    # Micro-kernel: R positions (window starts xo[r]) x CB channels, summed over ci and taps.
    # ``init`` holds the starting sums: the bias (istride 0, the same for every position) or the
    # partial sums of earlier input-channel blocks (istride CB). ``tile`` may alias ``init``.
    # Not inlined (nor the 1x1 kernel's): its registers are then allocated apart from the write-out
    # loop's constants (see _pointwise_conv).
    mk = [f"{vec.attribute}static __attribute__((noinline)) void {fn}(const float *xp, const size_t *xo, "
          f"const float *wp, const float *init, size_t istride, float *tile, size_t nci) {{"]
    mk += [f"  {vec.vtype} a{r}_{j} = {vec.vload(f'init + {r} * istride + {j * L}')};"
           for r in range(R) for j in range(nv)]
    mk += [f"  const float *restrict x{r} = xp + xo[{r}];" for r in range(R)]
    # Up to 16 taps are unrolled (constant address offsets); larger kernels loop over kernel rows
    # with the taps of a row unrolled: a fully unrolled 7x7 body overflows the decoded-op cache.
    kw = g.k[2]
    if len(taps) <= 16:
        mk += ["  for (size_t ci = 0; ci < nci; ci++) {",
               f"    const float *restrict wc = wp + ci * {len(taps) * cb};",
               f"    const size_t o = ci * {ps};"]
        steps = [(f"wc + {t * cb}", f"o + {off}") for t, off in enumerate(taps)]
    else:
        rows = taps[::kw]
        mk += [f"  static const size_t rows[{len(rows)}] = {{{', '.join(map(str, rows))}}};",
               "  for (size_t ci = 0; ci < nci; ci++) {",
               f"    for (size_t tr = 0; tr < {len(rows)}; tr++) {{",
               f"      const float *restrict wc = wp + (ci * {len(rows)} + tr) * {kw * cb};",
               f"      const size_t o = ci * {ps} + rows[tr];"]
        steps = [(f"wc + {t * cb}", f"o + {t * g.d[2]}") for t in range(kw)]
    for wv, xo in steps:
        mk.append("    {")
        mk += [f"      const {vec.vtype} w{j} = {vec.vload(f'{wv} + {j * L}')};" for j in range(nv)]
        for r in range(R):
            mk.append(f"      {{ const {vec.vtype} xb = {vec.vbcast(f'x{r} + {xo}')};")
            mk += [f"        a{r}_{j} = {vec.vfma(f'a{r}_{j}', 'xb', f'w{j}')};" for j in range(nv)]
            mk.append("      }")
        mk.append("    }")
    if len(taps) > 16:
        mk.append("    }")
    mk.append("  }")
    mk += [f"  {vec.vstore(f'tile + {(r * nv + j) * L}', f'a{r}_{j}')};" for r in range(R) for j in range(nv)]
    mk.append("}")
    helpers = vec.include + "\n" + "\n".join(mk) + "\n"

    pad = _needs_pad(g)
    per_task = conv_scratch_floats(g, "tiled", target)
    # Work units are (batch, group, spatial chunk, channel block), block fastest: a task sweeps every
    # channel block over one chunk of output positions while that chunk's input stays in L2.
    chunk, nch = _tiled_chunks(g, R, target)
    cib = _ci_block(g, plan, target)
    units = g.n * g.group * nch * nb
    body = [f"const size_t blk = t % {nb}, ch = t / {nb} % {nch}, grp = t / {nb * nch} % {g.group}, "
            f"n = t / {nb * nch * g.group};",
            f"const float *xg = {x} + (n * {g.c} + grp * {cg}) * {g.in_size};"]
    if pad and PD == 1:
        # Re-pad when the (batch, group) changes, only the padded rows that this task's chunks of it
        # read: with several tasks, each one zeroing and copying every plane whole repeated the copy.
        per_grp = nb * nch
        body += [f"if (t == t0 || t % {per_grp} == 0) {{",
                 f"  const size_t tl = (t / {per_grp} + 1) * {per_grp} < t1 ? (t / {per_grp} + 1) * {per_grp} : t1;",
                 f"  const size_t slo = ch * {chunk} < {OS - R} ? ch * {chunk} : {OS - R};",
                 f"  const size_t shi = (tl - 1) / {nb} % {nch} * {chunk} + {chunk} < {OS} ? "
                 f"(tl - 1) / {nb} % {nch} * {chunk} + {chunk} : {OS};",
                 *("  " + ln for ln in _pad_rows(g, "xg", "xpad", cg, "slo", "shi")),
                 "}", "const float *xp = xpad;"]
    elif pad:  # re-pad only when the (batch, group) changes
        body += [f"if (t == t0 || t % {nb * nch} == 0) {{", *("  " + ln for ln in _pad_copy(g, "xg", "xpad", cg)),
                 "}", "const float *xp = xpad;"]
    else:
        body.append("const float *xp = xg;")
    offsets = [f"  for (size_t r = 0; r < {R}; r++) {{",
               "    const size_t s = sb + r;",
               f"    xo[r] = ((s / {OH * OW}) * {g.s[0]} * {PH} + (s / {OW} % {OH}) * {g.s[1]}) * {PW} "
               f"+ (s % {OW}) * {g.s[2]};",
               "  }"]
    tiles = [f"for (size_t s0 = ch * {chunk}, k = 0; s0 < send; s0 += {R}, k++) {{",
             f"  const size_t sb = s0 + {R} <= {OS} ? s0 : {OS - R};  /* the last tile overlaps */"]
    body += [f"const float *wp = {packed} + (grp * {nb} + blk) * {cg * g.taps * cb};",
             f"const float *bias = {packed} + {bias_off} + (grp * {nb} + blk) * {cb};",
             f"const size_t c0 = grp * {mg} + blk * {cb}, cn = {_block_count(mg, cb)};",
             f"size_t xo[{R}];",
             f"const size_t send = ch * {chunk} + {chunk} < {OS} ? ch * {chunk} + {chunk} : {OS};"]
    if cib < cg:  # input-channel blocks over every tile of the chunk, sums kept in scratch
        body += [f"for (size_t cl = 0; cl < {cg}; cl += {cib}) {{",
                 *("  " + ln for ln in tiles),
                 *("  " + ln for ln in offsets),
                 f"    float *tile = sums + k * {R * cb};",
                 f"    {fn}(xp + cl * {ps}, xo, wp + cl * {g.taps * cb}, cl ? tile : bias, cl ? {cb} : 0, tile, "
                 f"cl + {cib} < {cg} ? {cib} : {cg} - cl);",
                 "  }", "}",
                 *tiles,
                 f"  const float *tile = sums + k * {R * cb};"]
    elif _tiled_vector_out(g, plan, target):
        # Steps of Q positions: the tiles go to a position-major buffer (R rows of headroom in front
        # for the last tile, moved back to overlap), 8x8 transposes turn it into one row per channel,
        # and the epilogue runs over contiguous positions, which GCC vectorizes.
        Q = _tiled_out_chunk(plan, target)
        body += [f"for (size_t q0 = ch * {chunk}; q0 < send; q0 += {Q}) {{",
                 f"  const size_t len = send - q0 < {Q} ? send - q0 : {Q};",
                 f"  for (size_t p = 0; p < len; p += {R}) {{",
                 f"    const size_t sb = q0 + p + {R} <= {OS} ? q0 + p : {OS - R};  /* the last tile overlaps */",
                 *("  " + ln for ln in offsets),
                 f"    {fn}(xp, xo, wp, bias, 0, acc + ((ptrdiff_t)sb - (ptrdiff_t)q0) * {cb}, {cg});",
                 "  }",
                 # Rows of acc past len hold stale sums; they land in tb past len, which nothing reads.
                 "  for (size_t p = 0; p < len; p += 8)",
                 f"    for (size_t j = 0; j < {nv * L // 8}; j++) "
                 f"{fn}_tr8(acc + p * {cb} + j * 8, {cb}, tb + j * {8 * Q} + p, {Q});",
                 "  for (size_t i = 0; i < cn; i++) {",
                 "    const size_t c = c0 + i;",
                 f"    float *restrict yr = {y} + (n * {g.m} + c) * {OS} + q0;",
                 f"    const float *restrict tr = tb + i * {Q};",
                 "    for (size_t j = 0; j < len; j++) {",
                 *(["      const size_t s = q0 + j; (void)s;"] if epi else []),
                 "      float v = tr[j];",
                 *_epi_block(epi, g, "s", "      "),
                 "      yr[j] = v;",
                 "    }", "  }", "}"]
        helpers += _transpose8(fn)
    else:
        body += [f"float tile[{R * cb}] __attribute__((aligned(64)));",
                 *tiles, *offsets,
                 f"  {fn}(xp, xo, wp, bias, 0, tile, {cg});"]
    if not _tiled_vector_out(g, plan, target):
        body += [f"  for (size_t r = 0; r < {R}; r++) {{",
                 "    const size_t s = sb + r;",
                 "    for (size_t j = 0; j < cn; j++) {",
                 f"      const size_t c = c0 + j; float v = tile[r * {cb} + j];",
                 *_epi_block(epi, g, "s", "      "),
                 f"      {y}[(n * {g.m} + c) * {OS} + s] = v;",
                 "    }", "  }", "}"]
    head = ""
    if pad:
        head = (f"float *restrict xpad = scratch + task * (size_t){per_task};\n"
                f"const size_t t0 = (size_t){units} * task / ntasks, t1 = (size_t){units} * (task + 1) / ntasks;"
                " (void)t1;\n")
    if cib < cg:
        head += f"float *restrict sums = scratch + task * (size_t){per_task} + {per_task - chunk * cb};\n"
    if _tiled_vector_out(g, plan, target):  # the last (Q + R + Q) * CB floats of the task's scratch
        Q = _tiled_out_chunk(plan, target)
        head += (f"float *restrict acc = scratch + task * (size_t){per_task} + {per_task - Q * cb - Q * cb};\n"
                 f"float *restrict tb = acc + {Q * cb};\n")
    return helpers, head + _task_loop(units, "\n".join("  " + ln for ln in body))


def rows_plan(g: Geometry, target: Target) -> tuple[int, int, int] | None:
    """(MB, NV, lanes) of the 1x1 path -- MB output channels x NV vectors of positions per register
    tile -- or None when the conv is not a stride-1 unpadded 1x1 conv with enough positions."""
    vec = target.isa
    lanes, os_ = vec.lanes, g.out_size
    if g.taps != 1 or any(v != 1 for v in g.s) or _needs_pad(g) or os_ < lanes:
        return None
    # Tile shape (MB channels x NV vectors of positions): the least work -- padded channels times
    # padded positions (the last tile overlaps) -- per unit of throughput, which drops when the tile
    # has too few accumulators to hide the FMA latency or too many loads per FMA.
    mg, budget = g.m // g.group, vec.acc_budget

    def cost(t: tuple[int, int]) -> float:
        mb, nv = t
        work = -(-mg // mb) * (mb + 0.5) * -(-os_ // (nv * lanes)) * nv * lanes
        return work / min(1.0, mb * nv / budget) * (1 + 0.25 * (mb + nv) / (mb * nv))
    tiles = [(mb, nv) for nv in (1, 2, 3) for mb in range(1, budget // nv + 1) if nv * lanes <= os_]
    mb, nv = min(tiles, key=cost)
    return mb, nv, lanes


def pack_rows_weights(w: np.ndarray, b: np.ndarray | None, g: Geometry, mb: int) -> np.ndarray:
    """[group][block][ci][MB] weights, then [group][block][MB] bias (channels past Mg are zero)."""
    cg, mg = g.c // g.group, g.m // g.group
    nb = -(-mg // mb)
    wr = np.zeros((g.group, nb * mb, cg), np.float32)
    wr[:, :mg] = w.reshape(g.group, mg, cg)
    bias = np.zeros((g.group, nb * mb), np.float32)
    if b is not None:
        bias[:, :mg] = b.reshape(g.group, mg)
    packed = wr.reshape(g.group, nb, mb, cg).transpose(0, 1, 3, 2)
    return np.concatenate([packed.reshape(-1), bias.reshape(-1)])


def bcast_tile_kernel(target: Target, fn: str, mb: int, nv: int, xstride: int, ystride: int, k: str,
                      inline: bool = True) -> str:
    """C function ``fn(x, w, init, y, nk)``: a register tile of MB rows (weights broadcast) x NV
    vectors, y[i][v] = init[i] + sum over k < ``k`` (a C expression, may use nk) of w[k][i] * x[k][v],
    with x rows ``xstride`` and y rows ``ystride`` floats apart and w packed [k][MB]."""
    vec = target.isa
    vt, L = vec.vtype, vec.lanes

    # Not inlined (the Winograd GEMMs): registers are then allocated apart from the caller's loops.
    mk = [f"{vec.attribute}static {'inline' if inline else '__attribute__((noinline))'} void {fn}("
          "const float *restrict x, const float *restrict w, const float *restrict init, float *restrict y, "
          "size_t nk) {", "  (void)nk;"]
    mk += [f"  {vt} a{i}_{j} = {vec.vbcast(f'init + {i}')};" for i in range(mb) for j in range(nv)]
    mk += [f"  for (size_t ci = 0; ci < {k}; ci++) {{",
           f"    const float *restrict xr = x + ci * {xstride};",
           f"    const float *restrict wr = w + ci * {mb};"]
    mk += [f"    const {vt} x{j} = {vec.vload(f'xr + {j * L}')};" for j in range(nv)]
    for i in range(mb):
        mk.append(f"    {{ const {vt} wb = {vec.vbcast(f'wr + {i}')};")
        mk += [f"      a{i}_{j} = {vec.vfma(f'a{i}_{j}', 'wb', f'x{j}')};" for j in range(nv)]
        mk.append("    }")
    mk.append("  }")
    mk += [f"  {vec.vstore(f'y + {i * ystride + j * L}', f'a{i}_{j}')};" for i in range(mb) for j in range(nv)]
    mk.append("}")
    return "\n".join(mk)


def _rows_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
               fn: str) -> tuple[str, str]:
    """1x1 stride-1 conv as Y[co, s] = W[co, ci] X[ci, s]: a register tile of MB channels (weights
    broadcast) x NV vectors of consecutive positions, stored to a local tile and copied into the
    output rows through the epilogue (measured faster than storing to the rows and re-reading)."""
    vec = target.isa
    plan = rows_plan(g, target)
    assert plan is not None
    mb, nv, L = plan
    pv = nv * L
    cg, mg = g.c // g.group, g.m // g.group
    nb = -(-mg // mb)
    OS = g.out_size
    pack = _rows_pack(g, plan)
    xstride = pv if pack else g.in_size

    helpers = vec.include + "\n" + bcast_tile_kernel(target, fn, mb, nv, xstride, pv, str(cg)) + "\n"

    chunk = _rows_chunk(g, cg, pv, target)
    nch = -(-OS // chunk)
    units = g.n * g.group * nch * nb
    wsize = g.group * nb * cg * mb
    # Work units as in the tiled path; with packing, the chunk's input is first copied into per-tile
    # panels [tile][ci][positions], so the micro-kernel streams it sequentially (GEMM's packed B).
    body = [f"const size_t blk = t % {nb}, ch = t / {nb} % {nch}, grp = t / {nb * nch} % {g.group}, "
            f"n = t / {nb * nch * g.group};",
            f"const float *xg = {x} + (n * {g.c} + grp * {cg}) * {g.in_size};",
            f"const size_t send = ch * {chunk} + {chunk} < {OS} ? ch * {chunk} + {chunk} : {OS};"]
    if pack:
        body += ["if (t == t0 || blk == 0) {",
                 f"  for (size_t s0 = ch * {chunk}, k = 0; s0 < send; s0 += {pv}, k++) {{",
                 f"    const size_t sb = s0 + {pv} <= {OS} ? s0 : {OS - pv};",
                 f"    for (size_t ci = 0; ci < {cg}; ci++)",
                 f"      for (size_t j = 0; j < {pv}; j++)",
                 f"        panel[(k * {cg} + ci) * {pv} + j] = xg[ci * {g.in_size} + sb + j];",
                 "  }",
                 "}"]
    body += [f"const float *wp = {packed} + (grp * {nb} + blk) * {cg * mb};",
             f"const float *bias = {packed} + {wsize} + (grp * {nb} + blk) * {mb};",
             f"const size_t c0 = grp * {mg} + blk * {mb}, cn = {_block_count(mg, mb)};",
             f"for (size_t s0 = ch * {chunk}, k = 0; s0 < send; s0 += {pv}, k++) {{",
             f"  const size_t sb = s0 + {pv} <= {OS} ? s0 : {OS - pv};  /* the last tile overlaps */",
             f"  float tile[{mb * pv}] __attribute__((aligned(64)));",
             f"  {fn}({f'panel + k * {cg * pv}' if pack else 'xg + sb'}, wp, bias, tile, {cg});",
             "  for (size_t i = 0; i < cn; i++) {",
             "    const size_t c = c0 + i;",
             f"    float *restrict yr = {y} + (n * {g.m} + c) * {OS} + sb;",
             f"    {WRITE_OUT}",
             f"    for (size_t j = 0; j < {pv}; j++) {{",
             *(["      const size_t s = sb + j; (void)s;"] if epi else []),
             f"      float v = tile[i * {pv} + j];",
             *_epi_block(epi, g, "s", "      "),
             "      yr[j] = v;",
             "    }", "  }"]
    body.append("}")
    head = ""
    if pack:
        head = (f"float *restrict panel = scratch + task * (size_t){chunk * cg};\n"
                f"const size_t t0 = (size_t){units} * task / ntasks;\n")
    return helpers, head + _task_loop(units, "\n".join("  " + ln for ln in body))


# 1x1 convs with output channels in the vector lanes (AVX2): positions of the micro-kernel's tile per
# number of 8-channel vectors, so that 12 accumulators, the weight vectors and one broadcast fit the
# 16 ymm registers. 4 vectors take 2 positions: 3 leave one weight vector in memory, which measured
# 8-15% slower (MobileNetV2's 960 -> 160 and 960 -> 320 convs).
_PW_TILES = {1: 12, 2: 6, 3: 4, 4: 2}
_PW_SPEED = {1: 0.8, 2: 1.0, 3: 0.98, 4: 0.95}   # relative speed per tile shape, see pointwise_plan


def _lanes_of_8x8(target: Target) -> bool:
    """Whether the ISA's vectors are the 8 lanes that AVX2's 8x8 transposes work on: the 1x1 kernel with
    channels in the lanes and the tiled path's vector write-out are written (and measured) for them."""
    return target.isa.shuffles256 and target.isa.lanes == 8


def _pw_block_floats(target: Target) -> int:
    """Weights per block of input channels of the 1x1 kernel: a quarter of L1 (8 KB), 10-30% faster than
    16 KB on 7x7 planes with 576 or 960 input channels (their input slice then stays in L1 too), the
    same elsewhere."""
    return target.l1d_bytes // 16


def pointwise_plan(g: Geometry, target: Target) -> TilePlan | None:
    """The plan of ``_pointwise_conv`` (a "tiled" conv specialized for 1x1), or None where it is not
    used: other ISAs (it needs AVX2's 8x8 transposes) and shapes the rows path does better."""
    if not _lanes_of_8x8(target) or g.taps != 1 or any(v != 1 for v in g.s) or _needs_pad(g) or g.out_size < 8:
        return None
    mg, cg = g.m // g.group, g.c // g.group
    # MobileNetV2's 1x1 convs, 1 thread, this kernel against the rows path: those with fewer output
    # than input channels ("project") 1.06-1.4x faster; expanding ones 6-30% slower on planes of
    # 14x14 and more, 7-12% faster on 7x7 (where vectors of positions overlap the most).
    if mg > cg and g.out_size > 64:
        return None

    # Fewest padded channels per unit of speed. Measured on MobileNetV2's project convs (160, 32 and
    # 24 output channels): tiles of 2, 3 or 4 vectors within a few percent of each other where none
    # pads, 2 the fastest; 1 vector (12 positions, more loads than FMAs) about 20% slower.
    def cost(nv: int) -> float:
        return -(-mg // (8 * nv)) * 8 * nv / _PW_SPEED[nv]
    nv = min(_PW_TILES, key=cost)
    return TilePlan(8 * nv, nv, _PW_TILES[nv], 8)


def _pointwise_chunk(g: Geometry, plan: TilePlan, target: Target) -> tuple[int, int]:
    """(Q, Q8): output positions per work unit -- a multiple of R, chunks of nearly equal size -- and
    Q rounded up to whole 8x8 transposes. The unit's two accumulator buffers (Q8 x CB floats each)
    take at most half of L1 (16 KB), so they stay there beside the weights of a block of input channels."""
    qmax = max(plan.r, target.l1d_bytes // 16 // plan.cb // plan.r * plan.r)
    per = -(-g.out_size // -(-g.out_size // qmax))
    q = -(-per // plan.r) * plan.r
    return q, -(-q // 8) * 8


def _pointwise_tail(n: int, r: int) -> tuple[int, list[int]]:
    """(full tiles, tail tile heights) covering ``n`` positions with tiles of ``r``. A tail of one or
    two positions takes the last full tile with it, as two tiles of about equal height: a one-position
    tile has two accumulator chains, latency-bound at a quarter of the FMA rate, so 49 positions
    (7x7) ran as 8 x 6 + 1 about 4% slower than as 7 x 6 + 4 + 3."""
    full, rem = divmod(n, r)
    if rem and 3 * rem <= r and full:
        return full - 1, [(r + rem + 1) // 2, (r + rem) // 2]
    return full, [rem] if rem else []


def _transpose8(fn: str) -> str:
    """``{fn}_tr8(src, ss, dst, ds)``: dst[j * ds + i] = src[i * ss + j] for an 8x8 block (pairs of rows
    interleaved, then pairs of pairs, then the 128-bit halves exchanged)."""
    ld = "\n".join(f"  const __m256 r{i} = _mm256_loadu_ps(src + {i} * ss);" for i in range(8))
    t = "\n".join(f"  const __m256 t{2 * i} = _mm256_unpacklo_ps(r{2 * i}, r{2 * i + 1}), "
                  f"t{2 * i + 1} = _mm256_unpackhi_ps(r{2 * i}, r{2 * i + 1});" for i in range(4))
    u = "\n".join(f"  const __m256 u{4 * h + 2 * k} = _mm256_shuffle_ps(t{4 * h + k}, t{4 * h + k + 2}, 0x44), "
                  f"u{4 * h + 2 * k + 1} = _mm256_shuffle_ps(t{4 * h + k}, t{4 * h + k + 2}, 0xEE);"
                  for h in range(2) for k in range(2))
    st = "\n".join(f"  _mm256_storeu_ps(dst + {j + 4 * hi} * ds, _mm256_permute2f128_ps(u{j}, u{j + 4}, "
                   f"{'0x31' if hi else '0x20'}));" for hi in range(2) for j in range(4))
    return (f'__attribute__((target("avx2"))) static inline void {fn}_tr8(const float *restrict src, size_t ss, '
            f"float *restrict dst, size_t ds) {{\n{ld}\n{t}\n{u}\n{st}\n}}\n")


def _pointwise_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
                    fn: str) -> tuple[str, str]:
    """1x1 stride-1 conv with output channels in the lanes: a register tile of R consecutive positions
    (broadcast from the NCHW input) x CB channels (weight vectors, packed [ci][CB] as the tiled path
    packs them) -- onnxruntime's NCHWc kernel shape, which suits convs with many input and few output
    channels. Accumulators go to a position-major buffer; input channels are split into blocks whose
    weights fit L1 (the buffer carries the sums between blocks). The buffer is then transposed 8x8 in
    registers into channel-major rows, which the epilogue loop writes out as contiguous vectors."""
    vec = target.isa
    plan = pointwise_plan(g, target)
    assert plan is not None
    cg, mg = g.c // g.group, g.m // g.group
    cb, nv, R = plan.cb, plan.nv, plan.r
    nb = -(-mg // cb)
    OS = g.out_size
    Q, Q8 = _pointwise_chunk(g, plan, target)
    nch = -(-OS // Q)
    last = OS - (nch - 1) * Q          # positions of the last chunk; only it can end in a partial tile
    full, tail = _pointwise_tail(last, R)
    kcmax = max(1, _pw_block_floats(target) // cb)  # input channels per block
    nk = -(-cg // kcmax)
    kc = -(-cg // nk)
    bias_off = g.group * nb * cg * cb
    vt = vec.vtype

    def micro(r_: int) -> list[str]:
        """R positions x CB channels over kn input channels, starting from ``init`` (the bias, stride 0,
        or the sums so far, stride CB); init and out may be the same buffer, so neither is restrict.
        GCC folds the weight loads into the FMAs, one load per FMA: with the broadcasts that is more
        loads than Zen 3's two 256-bit loads a cycle can feed (k8 of MobileNetV2 ran at 60% of peak).
        An empty asm statement keeps the weight vectors that fit in registers (16 minus the
        accumulators minus the broadcast) there. Not inlined: inlined into the task loop, the
        epilogue's Clip constants (vectorized since -fno-trapping-math) took a register and GCC kept
        one accumulator on the stack, 1.7x slower on MobileNetV2's 160 -> 960 convs on 7x7."""
        pin = max(0, min(nv, 15 - r_ * nv))
        mk = [f"{vec.attribute}static __attribute__((noinline)) void {fn}_r{r_}(const float *restrict x, size_t kn, "
              "const float *restrict w, const float *init, size_t is, float *out) {"]
        mk += [f"  {vt} a{r}_{j} = {vec.vload(f'init + {r} * is + {j * 8}')};" for r in range(r_) for j in range(nv)]
        mk += ["  for (size_t ci = 0; ci < kn; ci++) {",
               f"    const float *restrict xr = x + ci * {OS};",
               f"    const float *restrict wr = w + ci * {cb};"]
        mk += [f"    {'' if j < pin else 'const '}{vt} w{j} = {vec.vload(f'wr + {j * 8}')};" for j in range(nv)]
        if pin:
            mk.append('    __asm__("" : ' + ", ".join(f'"+x"(w{j})' for j in range(pin)) + ");")
        for r in range(r_):
            mk.append(f"    {{ const {vt} xb = {vec.vbcast(f'xr + {r}')};")
            mk += [f"      a{r}_{j} = {vec.vfma(f'a{r}_{j}', 'xb', f'w{j}')};" for j in range(nv)]
            mk.append("    }")
        mk.append("  }")
        mk += [f"  {vec.vstore(f'out + {r * cb + j * 8}', f'a{r}_{j}')};" for r in range(r_) for j in range(nv)]
        mk.append("}")
        return mk

    helpers = [vec.include, *micro(R), *(ln for r_ in sorted(set(tail)) for ln in micro(r_)), _transpose8(fn)]
    tail_calls = [f"    {fn}_r{r_}(xk + p, kn, wk, init + p * is, is, acc + p * {cb}); p += {r_};" for r_ in tail]
    units = g.n * g.group * nch * nb
    body = [f"const size_t blk = t % {nb}, ch = t / {nb} % {nch}, grp = t / {nb * nch} % {g.group}, "
            f"n = t / {nb * nch * g.group};",
            f"const size_t s0 = ch * {Q}, len = ch + 1 < {nch} ? {Q} : {last};",
            f"const float *xg = {x} + (n * {g.c} + grp * {cg}) * {OS} + s0;",
            f"const float *wp = {packed} + (grp * {nb} + blk) * {cg * cb};",
            f"const float *bias = {packed} + {bias_off} + (grp * {nb} + blk) * {cb};",
            f"const size_t c0 = grp * {mg} + blk * {cb}, cn = {_block_count(mg, cb)};",
            f"for (size_t kb = 0; kb < {nk}; kb++) {{",
            f"  const size_t kn = kb + 1 < {nk} ? {kc} : {cg - (nk - 1) * kc};",
            f"  const float *xk = xg + kb * {kc * OS}, *wk = wp + kb * {kc * cb};",
            f"  const float *init = kb ? acc : bias; const size_t is = kb ? {cb} : 0;",
            "  size_t p = 0;",
            f"  for (const size_t pf = ch + 1 < {nch} ? {Q} : {full * R}; p < pf; p += {R})",
            f"    {fn}_r{R}(xk + p, kn, wk, init + p * is, is, acc + p * {cb});",
            *([f"  if (ch + 1 == {nch}) {{", *tail_calls, "  }"] if tail else []),
            "}",
            # Rows of acc past len (the last block of 8) hold stale values; they land in tb past len,
            # which nothing reads.
            "for (size_t p = 0; p < len; p += 8)",
            f"  for (size_t j = 0; j < {nv}; j++) {fn}_tr8(acc + p * {cb} + j * 8, {cb}, tb + j * {8 * Q8} + p, {Q8});",
            "for (size_t i = 0; i < cn; i++) {",
            "  const size_t c = c0 + i;",
            f"  float *restrict yr = {y} + (n * {g.m} + c) * {OS} + s0;",
            f"  const float *restrict tr = tb + i * {Q8};",
            "  for (size_t j = 0; j < len; j++) {",
            *(["    const size_t s = s0 + j; (void)s;"] if epi else []),
            "    float v = tr[j];",
            *_epi_block(epi, g, "s", "    "),
            "    yr[j] = v;",
            "  }",
            "}"]
    head = (f"float *restrict acc = scratch + task * (size_t){2 * cb * Q8};\n"
            f"float *restrict tb = acc + {cb * Q8};\n")
    return "\n".join(helpers) + "\n", head + _task_loop(units, "\n".join("  " + ln for ln in body))


def _rows_pack(g: Geometry, plan: tuple[int, int, int]) -> bool:
    """Whether the 1x1 path packs its input into panels: that pays off once several channel blocks
    reuse them and there are enough input channels for strided reads to strain the prefetchers."""
    return -(-(g.m // g.group) // plan[0]) >= 3 and g.c // g.group >= 32


def _rows_chunk(g: Geometry, cg: int, pv: int, target: Target) -> int:
    """Output positions per chunk: a multiple of the tile width whose input (cg rows) fits in a quarter
    of L2,
    the chunks of (nearly) equal size. Chunks of the largest size and a short last one (12544
    positions as 6 x 2048 + 256) left one of two threads a quarter more work (MobileNetV2's
    16 -> 96 conv on 112x112 ran 1.7x faster on 2 threads instead of 1.9x)."""
    cap = max(pv, min(-(-g.out_size // pv) * pv, target.l2_bytes // 16 // max(1, cg) // pv * pv))
    per = -(-g.out_size // -(-g.out_size // cap))
    return -(-per // pv) * pv


def _phase_dims(g: Geometry) -> tuple[int, int, int, int, int]:
    """(sH, sW, PH2, PW2, nq) of the phase path: stride phases, phase plane dims, virtual positions."""
    PH, PW = g.inp[1] + g.pb[1] + g.pe[1], g.inp[2] + g.pb[2] + g.pe[2]
    sh, sw = g.s[1], g.s[2]
    ph2, pw2 = -(-PH // sh), -(-PW // sw)
    return sh, sw, ph2, pw2, (g.out[1] - 1) * pw2 + g.out[2]


def _use_phase(g: Geometry) -> bool:
    """1-D/2-D depthwise convs that are strided or have small planes (mostly border) take the phase
    path; large stride-1 planes are faster read in place, row by row (measured at 112x112). A stride
    past the padded plane (one output along it) stays row by row: the phase path's tables and
    scratch grow with the stride."""
    _, ph, pw = _padded_dims(g)
    return g.inp[0] == 1 and g.k[0] == 1 and g.s[1] <= ph and g.s[2] <= pw and \
        (max(g.s[1:]) > 1 or math.prod(_padded_dims(g)) <= 4096)


def _phase_areas(g: Geometry) -> tuple[int, int]:
    """(phase floats, virtual positions computed) of the phase path. The flat loop runs to a multiple
    of 16 positions so it has no scalar remainder (on a 14x14 plane that remainder took a third of
    the time); the phase area grows by the positions added, which read zeros and are dropped."""
    sh, sw, ph2, pw2, nq = _phase_dims(g)
    nqv = (nq + 15) // 16 * 16
    return (sh * sw * ph2 * pw2 + nqv - nq + 15) // 16 * 16, nqv


def _phase_cols(g: Geometry) -> tuple[list[tuple[int, int]], int, int]:
    """Phase column pj holds padded columns j = pj + sW * m (input column j - pbw): the range of m
    inside the input per phase, and the range [lo, hi) that every phase has."""
    sw, pw2, pbw, IW = g.s[2], _phase_dims(g)[3], g.pb[2], g.inp[2]
    rng = [(max(0, -(-(pbw - pj) // sw)), min(pw2, (IW - 1 + pbw - pj) // sw + 1)) for pj in range(sw)]
    return rng, max(r[0] for r in rng), min(r[1] for r in rng)


def _phase_rowbuf(g: Geometry) -> int:
    """Floats of the phase path's zero-padded copy of the input rows: stride 2 along rows too
    narrow to split in place (AVX2 steps of 8 columns), at least 8 phase columns wide."""
    _, lo, hi = _phase_cols(g)
    pw2 = _phase_dims(g)[3]
    return (pw2 * 2 * g.inp[1] + 15) // 16 * 16 if g.s[2] == 2 and hi - lo < 8 <= pw2 else 0


def _phase_buffers(g: Geometry) -> int:
    """Sets of phase planes per task. Small planes take two: each unit copies the next input
    channel's planes before computing its own, so the taps' loads do not wait on stores just made
    (the copy's stores and the flat loop's unaligned loads cannot forward). Measured 1.06-1.22x on
    14x14 and 7x7 planes; 0.92x on 28x28 (30x30 padded), which keep one."""
    return 2 if _phase_areas(g)[0] <= 512 else 1


def _phase_scratch(g: Geometry) -> int:
    """The phase planes, the row copy and the flat loop's output."""
    area, nqv = _phase_areas(g)
    return _phase_buffers(g) * area + _phase_rowbuf(g) + nqv


def _phase_head(g: Geometry, area: int) -> str:
    """Per-task pointers of the phase path: the phase planes and the row copy, the unit range."""
    units, nbuf = g.n * g.m, _phase_buffers(g)
    ph = "phb" if nbuf == 2 else "ph"
    return (f"float *restrict {ph} = scratch + task * (size_t){_phase_scratch(g)};\n"
            f"float *restrict rb = {ph} + {nbuf * area}; (void)rb;\n"
            f"const size_t t0 = (size_t){units} * task / ntasks, t1 = (size_t){units} * (task + 1) / ntasks;"
            " (void)t1;\n")


def _deinterleave2(fn: str, off: int) -> str:
    """``{fn}_deint2(s, d0, d1, lo, hi)``: d0[m] = s[2m - off], d1[m] = s[2m + 1 - off] for lo <= m < hi, eight
    columns per step through AVX2 shuffles (the even/odd lanes of two loads, then their 128-bit
    halves put in order); needs hi - lo >= 8."""
    return (f'#include <immintrin.h>\n__attribute__((target("avx2"))) static void {fn}_deint2('
            "const float *restrict s, float *restrict d0, float *restrict d1, size_t lo, size_t hi) {\n"
            "  for (size_t i = lo; i < hi; i += 8) {\n"
            "    const size_t m = i + 8 <= hi ? i : hi - 8; /* the last step overlaps the one before */\n"
            f"    const float *p = s + (2 * m - {off});\n"
            "    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);\n"
            "    const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));\n"
            "    const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));\n"
            "    _mm256_storeu_ps(d0 + m, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xD8)));\n"
            "    _mm256_storeu_ps(d1 + m, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xD8)));\n"
            "  }\n}\n")


def _depthwise_phase(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target,
                     epi: Epilogue | None, fn: str) -> tuple[str, str]:
    """Depthwise conv (1-D/2-D) via a zero-padded copy split into stride phases: padded element
    (i, j) goes to phase (i % sH, j % sW) at (i / sH, j / sW). Output (oh, ow) then reads tap (kh, kw)
    from one phase at (oh + kh*dh / sH, ow + kw*dw / sW): with "virtual" positions q = oh * PW2 + ow,
    one flat loop over q has contiguous loads for every tap, whatever the stride, and is long enough to
    vectorize even for 7x7 maps; columns ow >= OW are computed and dropped."""
    helper, lines, flat = phase_unit(g, x, w, b, y, target, epi, fn, _phase_buffers(g) == 2)
    head = _phase_head(g, _phase_areas(g)[0])
    if flat:
        head += f"float *restrict vo = rb + {_phase_rowbuf(g)};\n"
    return helper, head + _task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


def phase_unit(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target, epi: Epilogue | None,
               fn: str, double: bool, src: str | None = None, first: str = "t == t0") -> tuple[str, list[str], bool]:
    """(helpers, statements, flat) of the phase path for work unit ``t`` (plane n * M + c): they
    read ``ph`` (phase planes, ``double``: two sets ``phb``), ``rb`` (the row copy) and, when
    ``flat``, ``vo`` (the flat loop's output). The input plane is ``src`` (a C expression; default
    the plane of ``x``), whose padding is zeroed when ``first`` holds (a task's first unit)."""
    mg = g.m // g.group
    _, IH, IW = g.inp
    _, OH, OW = g.out
    sh, sw, ph2, pw2, nq = _phase_dims(g)
    pp = ph2 * pw2
    pbh, pbw = g.pb[1], g.pb[2]
    fma = target.isa.fma
    # The padding is zeroed on a task's first unit only: later copies overwrite the same interior.
    area, nqv = _phase_areas(g)
    copy = [f"for (size_t ih = 0; ih < {IH}; ih++) {{",
            f"  const size_t i = ih + {pbh};",
            f"  const float *restrict sr = xs + ih * {IW};",
            f"  float *restrict dr = ph + (i % {sh}) * {sw * pp} + (i / {sh}) * {pw2};"]
    # One loop over the m that every phase has deinterleaves the row in a single pass; the few others
    # go one by one.
    rng_, lo, hi = _phase_cols(g)
    helper = ""
    rowbuf = target.isa.shuffles256 and _phase_rowbuf(g) > 0
    if hi - lo >= 8 and sw == 2 and target.isa.shuffles256:
        # Scalar stride-2 reads cost more than the whole conv: split 16 columns at a time in registers.
        helper = _deinterleave2(fn, pbw)
        copy.append(f"  {fn}_deint2(sr, dr, dr + {pp}, {lo}, {hi});")
    elif rowbuf:
        # Rows too narrow for the in-place split (14 columns): copy the row into a zero-padded row
        # buffer (its padding zeroed once per task) and split all 2 * PW2 columns of it, which fill
        # the phases' padding columns too. Per-element copies took 70% of a 14x14 stride-2 conv.
        helper = _deinterleave2(fn, 0)
        copy[0:0] = [f"for (size_t ih = 0; ih < {IH}; ih++)",
                     f"  for (size_t i = 0; i < {IW}; i++) rb[ih * {2 * pw2} + {pbw} + i] = xs[ih * {IW} + i];"]
        copy.append(f"  {fn}_deint2(rb + ih * {2 * pw2}, dr, dr + {pp}, 0, {pw2});")
        lo = hi = 0
        rng_ = []
    elif hi > lo:
        copy.append(f"  for (size_t m = {lo}; m < {hi}; m++) {{ "
                    + " ".join(f"dr[{pj * pp} + m] = sr[m * {sw} + {pj - pbw}];" for pj in range(sw)) + " }")
    for pj, (a, b_) in enumerate(rng_):
        extra = [m for m in range(a, b_) if not lo <= m < hi]
        copy += [f"  dr[{pj * pp + m}] = sr[{m * sw + pj - pbw}];" for m in extra]
    copy.append("}")
    rbn = _phase_rowbuf(g)
    lines = [f"const size_t n = t / {g.m}, c = t % {g.m}, grp = c / {mg}; (void)n; (void)grp;"]
    if double:  # the copy as a helper called twice, see _phase_buffers
        assert src is None
        helper += (f"static void {fn}_phcopy(const float *restrict xs, float *restrict ph, float *restrict rb) {{\n"
                   "  (void)rb;\n" + "\n".join("  " + ln for ln in copy) + "\n}\n")
        lines += [f"if (t == t0) {{ for (size_t i = 0; i < {2 * area + rbn}; i++) phb[i] = 0; "
                  f"{fn}_phcopy({x} + t / {mg} * {g.in_size}, phb + t / {mg} % 2 * {area}, rb); }}",
                  f"if (t + 1 < t1 && (t + 1) % {mg} == 0) "
                  f"{fn}_phcopy({x} + (t + 1) / {mg} * {g.in_size}, phb + (t + 1) / {mg} % 2 * {area}, rb);",
                  f"const float *ph = phb + t / {mg} % 2 * {area};"]
    else:  # inline, into the task's one set of planes (a helper measured 7% slower on 28x28)
        lines += [f"const float *xs = {src or f'{x} + t / {mg} * {g.in_size}'};",
                  f"if ({first} || t % {mg} == 0) {{",
                  f"  if ({first}) for (size_t i = 0; i < {area + rbn}; i++) ph[i] = 0;",
                  *("  " + ln for ln in copy), "}"]
    lines += [f"const float *wc = {w} + c * {g.taps};",
             *[f"const float w{i} = wc[{i}];" for i in range(g.taps)],
             f"const float bias_c = {f'{b}[c]' if b else '0.0f'};",
             f"float *restrict yo = {y} + t * {g.out_size};"]
    taps = []
    for kh in range(g.k[1]):
        for kw in range(g.k[2]):
            hh, ww = kh * g.d[1], kw * g.d[2]
            off = ((hh % sh) * sw + ww % sw) * pp + (hh // sh) * pw2 + ww // sw
            wv = f"w{len(taps)}"
            taps.append(f"v = fmaf({wv}, ph[q + {off}], v);" if fma else f"v += {wv} * ph[q + {off}];")
    lanes = target.isa.lanes
    if OW >= 6 * lanes:
        # Wide rows: each output row is computed straight into the output (blocks of one vector, the
        # last moved back to overlap), with no flat buffer to copy out of: those row copies were
        # memcpy calls, 10% of a 112x112 stride-2 conv; 1.12x faster there. Narrower rows (28
        # columns: 4 vectors for 28 outputs) are no faster than the flat loop.
        lines += [f"for (size_t oh = 0; oh < {OH}; oh++) {{",
                  f"  float *restrict yr = yo + oh * {OW};",
                  "  " + UNROLL,
                  f"  for (size_t ob = 0; ob < {OW}; ob += {lanes}) {{",
                  f"    const size_t o0 = ob + {lanes} <= {OW} ? ob : {OW - lanes};",
                  "    #pragma GCC ivdep",
                  f"    for (size_t k = 0; k < {lanes}; k++) {{",
                  f"      const size_t ow = o0 + k, q = oh * {pw2} + ow;",
                  *([f"      const size_t od = 0, s = oh * {OW} + ow; (void)od; (void)s;"] if epi else []),
                  "      float v = bias_c;",
                  *("      " + tp for tp in taps),
                  *("      " + e for e in (epi or [])),
                  "      yr[ow] = v;",
                  "    }", "  }", "}"]
        return helper, lines, False
    lines += [UNROLL, f"for (size_t q = 0; q < {nqv}; q++) {{", "  float v = bias_c;", *("  " + tp for tp in taps)]
    # An epilogue that reads no memory (Relu, Clip) runs in the vectorized loop; the valid columns
    # are then plain row copies. One that reads tensors runs per real output position.
    pure = not any("[" in e for e in epi or [])
    lines += [*("  " + e for e in (epi or []) if pure), "  vo[q] = v;", "}"]
    if pure:
        lines.append(f"for (size_t oh = 0; oh < {OH}; oh++) "
                     f"memcpy(yo + oh * {OW}, vo + oh * {pw2}, {OW} * sizeof(float));")
    else:
        lines += [f"for (size_t oh = 0; oh < {OH}; oh++)",
                  f"for (size_t ow = 0; ow < {OW}; ow++) {{",
                  f"  const size_t od = 0, s = oh * {OW} + ow; float v = vo[oh * {pw2} + ow]; (void)od;",
                  *("  " + e for e in (epi or [])),
                  "  yo[s] = v;", "}"]
    return helper, lines, True


# Edge columns are unrolled up to this many taps per row (more: a loop with column checks).
_EDGE_UNROLL = 256


def _depthwise_conv(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target,
                    epi: Epilogue | None, fn: str) -> tuple[str, str]:
    """One input channel per group, (n, c) planes as work units. Each output row reads its input
    rows through one pointer per (kd, kh), a shared zero row standing in for rows outside the input,
    so no row needs bounds checks: the interior columns run a width loop with the taps unrolled
    (vectorized over the width, accumulator in a register) and the few edge columns have their
    in-range taps unrolled at compile time (a bounds-checked call per border position cost as much
    as the whole interior of a 112x112 plane)."""
    mg = g.m // g.group
    if _use_phase(g):
        return _depthwise_phase(g, x, w, b, y, target, epi, fn)
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    fma = target.isa.fma  # fmaf is a slow libm call without hardware FMA
    kr = g.k[0] * g.k[1]

    def acc(wv: str, xv: str) -> str:
        return f"v = fmaf({wv}, {xv}, v);" if fma else f"v += {wv} * {xv};"

    def cols(ow: int) -> list[tuple[int, int]]:  # (kw, input column) of the taps inside the row
        return [(kw, ow * g.s[2] + kw * g.d[2] - g.pb[2]) for kw in range(g.k[2])
                if 0 <= ow * g.s[2] + kw * g.d[2] - g.pb[2] < IW]

    def store(ind: str) -> list[str]:
        return [*([f"{ind}const size_t s = rs + ow; (void)s;"] if epi else []),
                *(ind + e for e in (epi or [])), f"{ind}yr[ow] = v;"]

    # Interior columns: every tap inside the row.
    owa = min(OW, -(-g.pb[2] // g.s[2]))
    owb = max(owa, min(OW, (IW - 1 - (g.k[2] - 1) * g.d[2] + g.pb[2]) // g.s[2] + 1))
    edges = [*range(owa), *range(owb, OW)]
    lines = [f"const size_t n = t / {g.m}, c = t % {g.m}, grp = c / {mg};",
             f"const float *xc = {x} + (n * {g.c} + grp) * {g.in_size};",
             f"const float *wc = {w} + c * {g.taps};",
             *[f"const float w{i} = wc[{i}];" for i in range(g.taps)],
             # Read once into a local: inside the row loop GCC cannot tell the bias from the output row.
             f"const float bias_c = {f'{b}[c]' if b else '0.0f'};",
             f"float *yo = {y} + t * {g.out_size};",
             f"for (size_t od = 0; od < {OD}; od++)",
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             f"  const ptrdiff_t d0 = (ptrdiff_t)od * {g.s[0]} - {g.pb[0]}, h0 = (ptrdiff_t)oh * {g.s[1]} - {g.pb[1]};",
             f"  const size_t rs = (od * {OH} + oh) * {OW}; (void)rs;",
             "  float *restrict yr = yo + rs;"]
    for kd in range(g.k[0]):
        for kh in range(g.k[1]):
            dd, hh = f"d0 + {kd * g.d[0]}", f"h0 + {kh * g.d[1]}"
            lines.append(f"  const float *restrict r{kd * g.k[1] + kh} = {dd} >= 0 && {dd} < {ID} && {hh} >= 0 "
                         f"&& {hh} < {IH} ? xc + ((size_t)({dd}) * {IH} + (size_t)({hh})) * {IW} : {fn}_zrow;")
    if len(edges) * g.taps <= _EDGE_UNROLL:
        for ow in edges:
            lines += [f"  {{ const size_t ow = {ow}; float v = bias_c;",
                      *(f"    {acc(f'w{j * g.k[2] + kw}', f'r{j}[{col}]')}" for j in range(kr) for kw, col in cols(ow)),
                      *store("    "), "  }"]
    else:
        lines += ["  const float *restrict rp[] = {" + ", ".join(f"r{j}" for j in range(kr)) + "};",
                  f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
                  f"    if (ow == {owa}) ow = {owb};",
                  f"    if (ow >= {OW}) break;",
                  "    float v = bias_c;",
                  f"    for (size_t j = 0; j < {kr}; j++)",
                  f"      for (size_t kw = 0; kw < {g.k[2]}; kw++) {{",
                  f"        const ptrdiff_t iw = (ptrdiff_t)(ow * {g.s[2]} + kw * {g.d[2]}) - {g.pb[2]};",
                  f"        if (iw >= 0 && iw < {IW}) {acc(f'wc[j * {g.k[2]} + kw]', 'rp[j][iw]')}",
                  "      }",
                  *store("    "), "  }"]
    taps = [f"    {acc(f'w{j * g.k[2] + kw}', f'r{j}[ow * {g.s[2]} + ({kw * g.d[2] - g.pb[2]})]')}"
            for j in range(kr) for kw in range(g.k[2])]
    lanes = target.isa.lanes
    if owb - owa >= lanes:
        # Blocks of one vector of columns, the last one moved back to overlap the one before: a plain
        # loop over 110 or 54 columns left the vectorizer a scalar remainder of 6 columns per row.
        # Columns computed twice get the same value (the inputs never alias the output).
        lines += ["  " + UNROLL,
                  f"  for (size_t ob = {owa}; ob < {owb}; ob += {lanes}) {{",
                  f"    const size_t o0 = ob + {lanes} <= {owb} ? ob : {owb - lanes};",
                  "    #pragma GCC ivdep",
                  f"    for (size_t k = 0; k < {lanes}; k++) {{",
                  "    const size_t ow = o0 + k;",
                  "    float v = bias_c;", *taps, *store("    "), "  }", "  }", "}"]
    else:
        lines += ["  " + UNROLL, f"  for (size_t ow = {owa}; ow < {owb}; ow++) {{",
                  "    float v = bias_c;", *taps, *store("    "), "  }", "}"]
    zrow = f"static const float {fn}_zrow[{IW}] = {{0}};\n"
    return zrow, _task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


def _winograd():
    """aotc.ops.winograd, imported late: it builds on this module's geometry and vector tables."""
    from aotc.ops import winograd
    return winograd


def conv_path(node: Node, target: Target) -> str:
    """Which code path ``conv_kernel`` takes: "winograd", "rows", "tiled", "depthwise" or "generic"."""
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype != np.float32:
        return "generic"
    g = geometry(node)
    if g.c // g.group == 1:
        return "depthwise"
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (b is not None and not b.is_const):
        return "generic"
    if _winograd().winograd_plan(g, target) is not None:
        return "winograd"
    if pointwise_plan(g, target) is not None:
        return "tiled"
    return "rows" if rows_plan(g, target) is not None else "tiled"


def conv_kernel(node: Node, x: str, w: str, b: str | None, y: str, target: Target, fn: str,
                epi: Epilogue | None = None, packed: str | None = None) -> tuple[str, str]:
    """(helpers, body) of a Conv kernel; helpers are named after ``fn``. ``packed`` names
    ``pack_conv_weights``'s output (tiled path)."""
    g = geometry(node)
    path = conv_path(node, target)
    if path == "winograd":
        assert packed is not None
        wg = _winograd()
        return wg.winograd_conv(g, x, packed, y, target, epi, f"{fn}_wg", wg.winograd_plan(g, target))
    if path == "rows":
        assert packed is not None
        return _rows_conv(g, x, packed, y, target, epi, f"{fn}_rows")
    if path == "tiled" and pointwise_plan(g, target) is not None:
        assert packed is not None
        return _pointwise_conv(g, x, packed, y, target, epi, f"{fn}_pw")
    if path == "tiled":
        assert packed is not None
        return _tiled_conv(g, x, packed, y, target, epi, f"{fn}_tile")
    if path == "depthwise":
        return _depthwise_conv(g, x, w, b, y, target, epi, fn)
    from aotc.ir import dtypes
    return "", _generic_conv(g, x, w, b, y, dtypes.c_type(node.outputs[0].dtype), epi)


def _conv_transpose_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Scatter form: every input element adds ``x * w`` to the outputs its taps reach."""
    g = geometry(node)
    cg, mg = g.c // g.group, g.m // g.group
    x, w, y = ins[0], ins[1], outs[0]
    b = ins[2] if len(ins) > 2 else None
    OD, OH, OW = g.out
    lines = [f"const size_t n = t / {g.m}, c = t % {g.m}, grp = c / {mg}, cl = c % {mg};",
             f"{ctype} *yo = {y} + t * {g.out_size};",
             f"for (size_t s = 0; s < {g.out_size}; s++) yo[s] = {f'{b}[c]' if b else '0'};",
             f"for (size_t ci = 0; ci < {cg}; ci++) {{",
             f"  const size_t cin = grp * {cg} + ci;",
             f"  const {ctype} *xc = {x} + (n * {g.c} + cin) * {g.in_size};",
             f"  const {ctype} *wc = {w} + (cin * {mg} + cl) * {g.taps};",
             f"  for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++)",
             f"  for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++)",
             f"  for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
             f"    const {ctype} wv = wc[(kd * {g.k[1]} + kh) * {g.k[2]} + kw];",
             f"    for (ptrdiff_t id = 0; id < {g.inp[0]}; id++) {{",
             f"      const ptrdiff_t od = id * {g.s[0]} - {g.pb[0]} + kd * {g.d[0]};",
             f"      if (od < 0 || od >= {OD}) continue;",
             f"      for (ptrdiff_t ih = 0; ih < {g.inp[1]}; ih++) {{",
             f"        const ptrdiff_t oh = ih * {g.s[1]} - {g.pb[1]} + kh * {g.d[1]};",
             f"        if (oh < 0 || oh >= {OH}) continue;",
             f"        for (ptrdiff_t iw = 0; iw < {g.inp[2]}; iw++) {{",
             f"          const ptrdiff_t ow = iw * {g.s[2]} - {g.pb[2]} + kw * {g.d[2]};",
             f"          if (ow >= 0 && ow < {OW}) yo[(od * {OH} + oh) * {OW} + ow] += wv * "
             f"xc[(id * {g.inp[1]} + ih) * {g.inp[2]} + iw];",
             "        }", "      }", "    }", "  }", "}"]
    return _task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


def _pool_separable(node: Node, g: Geometry, x: str, y: str, ctype: str) -> str:
    """MaxPool/AveragePool as two vectorizable passes per output row: the window's valid input rows
    are reduced into a row buffer whose padding holds the identity (-inf or 0), then each output
    reduces its taps along that buffer -- no bounds checks in either loop. Average divisors are the
    products of per-row and per-column tap counts (inside the input, or the padded input with
    count_include_pad, as onnxruntime counts them)."""
    is_max = node.op == "MaxPool"
    include_pad = bool(node.attr("count_include_pad", 0))
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    pb = g.pb[2]
    blen = max(pb + IW, (OW - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1)
    ident = lowest(ctype) if is_max else "0"

    def red(a: str, b: str) -> str:  # the max form compilers turn into vmaxps (NaN order aside)
        return f"{a} = {b} > {a} ? {b} : {a};" if is_max else f"{a} += {b};"

    lines = [f"const {ctype} *xc = {x} + t * {g.in_size};",
             f"{ctype} vb[{blen}];",
             f"for (size_t i = 0; i < {pb}; i++) vb[i] = {ident};",
             f"for (size_t i = {pb + IW}; i < {blen}; i++) vb[i] = {ident};",
             f"for (size_t od = 0; od < {OD}; od++)",
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             f"  const ptrdiff_t d0 = (ptrdiff_t)od * {g.s[0]} - {g.pb[0]}, h0 = (ptrdiff_t)oh * {g.s[1]} - {g.pb[1]};",
             f"  const {ctype} *rows[{g.k[0] * g.k[1]}];",
             "  size_t nr = 0, nrp = 0;",
             f"  for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++)",
             f"    for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++) {{",
             f"      const ptrdiff_t id = d0 + kd * {g.d[0]}, ih = h0 + kh * {g.d[1]};",
             f"      nrp += id < {ID + g.pe[0]} && ih < {IH + g.pe[1]};",
             f"      if (id >= 0 && id < {ID} && ih >= 0 && ih < {IH}) rows[nr++] = xc + (id * {IH} + ih) * {IW};",
             "    }",
             f"  {ctype} *restrict yr = {y} + t * {g.out_size} + (od * {OH} + oh) * {OW};",
             f"  if (nr == 0) {{ for (size_t ow = 0; ow < {OW}; ow++) yr[ow] = "
             f"{ident if is_max else '(' + ctype + ')NAN'}; continue; }}",
             "  { const " + ctype + " *restrict r0 = rows[0];",
             f"    for (size_t i = 0; i < {IW}; i++) vb[{pb} + i] = r0[i]; }}",
             "  for (size_t r = 1; r < nr; r++) {",
             f"    const {ctype} *restrict rr = rows[r];",
             f"    for (size_t i = 0; i < {IW}; i++) {{ const {ctype} xv = rr[i]; {red(f'vb[{pb} + i]', 'xv')} }}",
             "  }"]
    if not is_max:  # per-column tap counts, as a table of compile-time constants
        cols = []
        for ow in range(OW):
            start = ow * g.s[2] - pb
            lim = IW + g.pe[2] if include_pad else IW
            cols.append(sum(1 for kw in range(g.k[2]) if 0 <= start + kw * g.d[2] < lim)
                        if not include_pad else sum(1 for kw in range(g.k[2]) if start + kw * g.d[2] < lim))
        lines += [f"  static const {ctype} hc[{OW}] = {{{', '.join(str(c) for c in cols)}}};",
                  f"  const {ctype} vc = ({ctype}){'nrp' if include_pad else 'nr'};"]
    lines += [f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
              f"    const {ctype} *restrict w = vb + ow * {g.s[2]};",
              f"    {ctype} v = w[0];"]
    lines += [f"    {{ const {ctype} xv = w[{kw * g.d[2]}]; {red('v', 'xv')} }}" for kw in range(1, g.k[2])]
    if not is_max:
        lines.append("    v = v / (vc * hc[ow]);")
    lines += ["    yr[ow] = v;", "  }", "}"]
    return _task_loop(g.n * g.c, "\n".join("  " + ln for ln in lines))


def _pool_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Max/average/Lp pooling over each window, bounds-checked; one (n, c) plane per work unit."""
    g = geometry(node)
    op = node.op
    x, y = ins[0], outs[0]
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    is_max = op in ("MaxPool", "GlobalMaxPool")
    p = int(node.attr("p", 2))
    include_pad = bool(node.attr("count_include_pad", 0))
    if op in ("MaxPool", "AveragePool") and len(outs) == 1:
        return _pool_separable(node, g, x, y, ctype)
    lines = [f"const {ctype} *xc = {x} + t * {g.in_size};",
             f"for (size_t od = 0; od < {OD}; od++)",
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             f"  const ptrdiff_t d0 = (ptrdiff_t)od * {g.s[0]} - {g.pb[0]}, h0 = (ptrdiff_t)oh * {g.s[1]} - {g.pb[1]};",
             f"  {ctype} *restrict yr = {y} + t * {g.out_size} + (od * {OH} + oh) * {OW};",
             f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
             f"  const size_t s = (od * {OH} + oh) * {OW} + ow;",
             f"  const ptrdiff_t w0 = (ptrdiff_t)ow * {g.s[2]} - {g.pb[2]};",
             f"  {ctype} acc = {lowest(ctype) if is_max else '0'};",
             "  size_t cnt = 0, arg = 0; (void)arg; (void)cnt;"]
    if op == "AveragePool" and include_pad:
        # The window counts taps inside the padded input (onnxruntime's divisor).
        lim = [g.inp[i] + g.pe[i] for i in range(3)]
        lines.append("  size_t cntp = 1;")
        for i, (v, k) in enumerate((("d0", g.k[0]), ("h0", g.k[1]), ("w0", g.k[2]))):
            lines.append(f"  {{ size_t m = 0; for (ptrdiff_t q = 0; q < {k}; q++) "
                         f"m += {v} + q * {g.d[i]} < {lim[i]}; cntp *= m; }}")
    lines += [f"  for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++) {{",
              f"    const ptrdiff_t id = d0 + kd * {g.d[0]}; if (id < 0 || id >= {ID}) continue;",
              f"    for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++) {{",
              f"      const ptrdiff_t ih = h0 + kh * {g.d[1]}; if (ih < 0 || ih >= {IH}) continue;",
              f"      for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
              f"        const ptrdiff_t iw = w0 + kw * {g.d[2]}; if (iw < 0 || iw >= {IW}) continue;",
              f"        const size_t i = (id * {IH} + ih) * {IW} + iw;",
              f"        const {ctype} xv = xc[i];"]
    if is_max:  # NaN propagates; the first maximum's index wins
        lines.append("        if (xv > acc || (xv != xv && acc == acc)) { acc = xv; arg = i; }"
                     if ctype in ("float", "double") else "        if (xv > acc) { acc = xv; arg = i; }")
    elif op == "LpPool":
        lines.append("        acc += fabs(xv) * fabs(xv);" if p == 2 else
                     f"        acc += pow(fabs(xv), {p});")
    else:
        lines.append("        acc += xv; cnt++;")
    lines += ["      }", "    }", "  }"]
    if op in ("AveragePool", "GlobalAveragePool"):
        div = "cntp" if op == "AveragePool" and include_pad else ("cnt" if op == "AveragePool" else
                                                                   str(g.in_size))
        lines.append(f"  acc = acc / ({ctype}){div};")
    elif op == "LpPool":
        lines.append("  acc = sqrt(acc);" if p == 2 else f"  acc = pow(acc, 1.0 / {p});")
    lines.append("  yr[ow] = acc;")
    if len(outs) > 1:  # Indices: flat over (n, c, spatial); storage_order 1 numbers columns first
        if node.attr("storage_order", 0):
            lines.append(f"  const size_t ad = arg / {IH * IW}, ah = arg / {IW} % {IH}, aw = arg % {IW};")
            lines.append(f"  arg = (aw * {IH} + ah) * {ID} + ad;")
        lines.append(f"  {outs[1]}[t * {g.out_size} + s] = (int64_t)(t * {g.in_size} + arg);")
    lines.append("  }")
    lines.append("}")
    return _task_loop(g.n * g.c, "\n".join("  " + ln for ln in lines))


def pack_weights(node: Node, target: Target) -> np.ndarray | None:
    """Conv ``node``'s weights (and bias) packed at compile time into its path's layout, or None for
    the paths that read them as they are (depthwise, generic)."""
    path = conv_path(node, target)
    if path not in ("tiled", "rows", "winograd"):
        return None
    g = geometry(node)
    w, b = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    bc = None if b is None else b.const
    if path == "winograd":
        wg = _winograd()
        return wg.pack_winograd_weights(w.const, bc, g, wg.winograd_plan(g, target))
    rows = rows_plan(g, target) if path == "rows" else None
    if rows is not None:
        return pack_rows_weights(w.const, bc, g, rows[0])
    return pack_conv_weights(w.const, bc, g, tile_plan(g, target))


def can_take_epilogue(node: Node, out: Value, target: Target) -> bool:
    """Every conv path applies an elementwise chain to each output value before its store, in the
    Conv's own dtype."""
    y = node.outputs[0]
    return out.shape == y.shape and out.dtype == y.dtype


def can_take_prologue(node: Node, producer: Node, target: Target) -> bool:
    """A depthwise conv computes its input inside when that is an expanding 1x1 Conv
    (aotc.ops.expand_depthwise)."""
    from aotc.ops.expand_depthwise import fusable
    return producer.op == "Conv" and fusable(producer, node, target)


# Fusion makes every Conv a conv kernel, written by conv_kernel with its epilogue (aotc/codegen/kernels.py).
register(OpDef("Conv", "conv", _infer, emit=conv_kernel, pack=pack_weights, can_take_epilogue=can_take_epilogue,
               can_take_prologue=can_take_prologue))
register(OpDef("ConvTranspose", "kernel", _infer, emit=_conv_transpose_emit))
for _op in ("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"):
    register(OpDef(_op, "kernel", _infer, emit=_pool_emit))

__all__ = ["Geometry", "geometry", "conv_kernel", "conv_path", "pack_conv_weights", "pack_rows_weights",
           "rows_plan", "tile_plan", "conv_scratch_floats"]
