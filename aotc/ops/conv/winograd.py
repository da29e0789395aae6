"""Winograd convolution F(m x m, 3 x 3) for 3x3 stride-1 float32 convs with many channels.

A tile of m x m outputs needs an a x a input tile (a = m + 2). With the transforms of Lavin and Gray
("Fast Algorithms for Convolutional Neural Networks", 2015),

    Y = AT [ (G g GT) * (BT d B) ] A          (* is elementwise)

the 9 m^2 multiplies of a tile become a^2: 36 instead of 144 for F(4x4, 3x3), 16 instead of 36 for
F(2x2, 3x3). Over channels, the elementwise products become a^2 independent GEMMs, one per point xi
of the a x a transformed tile: M[xi][oc][tile] = sum_ic U[xi][oc][ic] V[xi][ic][tile], where
U = G g GT is computed here at compile time and V = BT d B at run time.

Layout. A work unit is a block of RT tile rows of one image and one part of the output channels,
computed start to end by one task in its own scratch. Its tiles sit in TP slots, each tile row SEG =
TW + (a - 1) // m slots after the one before (the extra slots hold junk tiles, computed and dropped),
so tile rows narrower than a vector share one: F(2x2) on 14x14 or F(4x4) on 28x28 (7 tiles a row)
put two rows in 16 AVX-512 lanes, where a vector per row left 9 of 16 lanes idle.

1. input transform: the a input rows of each tile row are copied, zero-padded, into lines split by
   column phase (column % m), each tile row SEG columns after the last, so each of the a x a tile
   inputs is a contiguous run over the slots; the transform is one loop over the slots that GCC
   vectorizes, writing V[xi][ic][slot];
2. per block of MB output channels: the GEMMs of every point xi, a register tile of MB channels
   (U broadcast) x NV vectors of slots (V loaded) summed over the input channels, into M[xi][MB]
   [slot], then the output transform of those channels, vectorized over the slots, into m rows;
   then bias and the fused epilogue on contiguous output positions. Only one block's M is held, so
   more tile rows fit in L2; where all of M fits beside V, the GEMMs run point by point over every
   block instead (V[xi] stays in L1 while they pass) and the output transforms follow.

Accuracy: F(2x2) transforms hold only 0, +-1 and 1/2, so its result is as accurate as the direct sum.
F(4x4)'s coefficients reach 8 and 1/24; its error is a few times float32 rounding (tests check it
against onnxruntime at the model tolerances). Its weights take a^2 / 9 times the direct weights'
memory (4x for F(4x4), 1.8x for F(2x2)), so only layers where it pays are transformed: enough tiles
that the transformed weights streamed per unit are reused, and channels few enough that U[xi] stays
in L2 (see ``winograd_plan``).

Non-finite inputs: the transforms mix the values of a tile, so a NaN in the input can make NaN any
output of each m x m output tile whose a x a input tile holds it (which ones follows the zero pattern
of BT and AT) -- up to (2m)^2 outputs per channel where the direct sum makes 9 -- and an infinity
mostly comes out as NaN (the transforms subtract it from itself), not as the direct sum's +-inf.
Every output the direct sum makes NaN or infinite is NaN or infinite here too; outputs outside those
tiles are as on the direct path, so no non-finite input ever yields a finite output it should not.
We accept that: such an input already spoils its own 3 x 3 neighbourhood, and keeping the direct
path's exact extent would cost a scan of every tile on finite inputs too (tests/test_checked_sizes.py
pins the extent).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as F
from typing import TYPE_CHECKING

import numpy as np

from aotc.ops.affine import Ix, offset
from aotc.ops.conv.common import Epilogue, Geometry, bcast_tile_kernel, epi_block, split_unit, task_bounds, task_loop

if TYPE_CHECKING:
    from aotc.target import Target


# (BT, G, AT) per m: interpolation points 0, 1, -1 (m = 2) and 0, 1, -1, 2, -2 (m = 4), plus infinity.
_MATRICES: dict[int, tuple[list[list[F]], list[list[F]], list[list[F]]]] = {
    2: ([[F(1), F(0), F(-1), F(0)], [F(0), F(1), F(1), F(0)], [F(0), F(-1), F(1), F(0)], [F(0), F(1), F(0), F(-1)]],
        [[F(1), F(0), F(0)], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)], [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(0)], [F(0), F(1), F(-1), F(-1)]]),
    4: ([[F(4), F(0), F(-5), F(0), F(1), F(0)],
         [F(0), F(-4), F(-4), F(1), F(1), F(0)],
         [F(0), F(4), F(-4), F(-1), F(1), F(0)],
         [F(0), F(-2), F(-1), F(2), F(1), F(0)],
         [F(0), F(2), F(-1), F(-2), F(1), F(0)],
         [F(0), F(4), F(0), F(-5), F(0), F(1)]],
        [[F(1, 4), F(0), F(0)],
         [F(-1, 6), F(-1, 6), F(-1, 6)],
         [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)],
         [F(1, 24), F(-1, 12), F(1, 6)],
         [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(1), F(1), F(0)],
         [F(0), F(1), F(-1), F(2), F(-2), F(0)],
         [F(0), F(1), F(1), F(4), F(4), F(0)],
         [F(0), F(1), F(-1), F(8), F(-8), F(1)]]),
}


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(BT, G, AT) of F(m x m, 3 x 3) as float64 arrays."""
    return tuple(np.array(mat, dtype=np.float64) for mat in _MATRICES[m])  # type: ignore[return-value]


@dataclass(frozen=True)
class WinogradPlan:
    m: int       # outputs per tile side
    a: int       # input tile side, m + 2
    th: int      # tile rows of the output plane
    tw: int      # tiles per tile row
    rt: int      # tile rows per work unit
    tp: int      # tile slots per unit: rt rows of seg slots, rounded up to whole vectors
    mb: int      # output channels per register tile
    nv: int      # vectors of tiles per register tile
    lanes: int
    nb: int      # blocks of mb output channels
    whole_m: bool  # M of every channel held (GEMMs point by point), else one block's at a time

    @property
    def points(self) -> int:
        return self.a * self.a

    @property
    def units_per_image(self) -> int:
        return -(-self.th // self.rt)

    @property
    def seg(self) -> int:
        """Slots per tile row: its tw tiles and (a - 1) // m more, which the last tile's input reaches
        into; they hold junk tiles (computed, never written out)."""
        return self.tw + (self.a - 1) // self.m


def winograd_plan(g: Geometry, target: Target) -> WinogradPlan | None:
    """The plan of a conv that takes the Winograd path, or None.

    Taken for 2-D 3x3 convs with stride and dilation 1, one group, at least 16 input and output
    channels and output planes of at least 8 x 8, so that tiles are mostly full. F(4x4) up to 128
    channels on planes of 16 and more, F(2x2) up to 256 channels; wider layers (ResNet's 7x7 stage)
    keep the direct path: there each unit would stream megabytes of transformed weights for a few
    tiles. Units of whole planes do not rescue them: F(2x2) over all 16 tiles of a 7x7 plane at 512
    channels measured no faster than the direct path (it streams 16 MB of transformed weights)."""
    if g.group != 1 or g.k != (1, 3, 3) or g.s != (1, 1, 1) or g.d != (1, 1, 1):
        return None
    if g.inp[0] != 1 or g.c < 16 or g.m < 16 or min(g.out[1:]) < 8:
        return None
    oh, ow = g.out[1], g.out[2]
    if g.c * g.m <= 128 * 128 and min(oh, ow) >= 16:
        m = 4
    elif g.c * g.m <= 256 * 256:
        m = 2
    else:
        return None
    lanes = target.isa.lanes
    budget = target.isa.acc_budget
    a = m + 2
    th, tw = -(-oh // m), -(-ow // m)
    seg = tw + (a - 1) // m
    # The transformed inputs of one unit take at most three quarters of L2. Tile rows are packed
    # seg slots apart, so rows narrower than a vector share one (F(2x2) on 14x14, F(4x4) on 28x28:
    # 7 tiles a row, two rows per 16-float vector instead of one); among the rows per unit that fit,
    # the fewest vectors of slots over the plane, then the most units.
    fit = max(1, min(th, target.l2_bytes * 3 // 4 // (a * a * g.c * seg * 4)))
    rt = min(range(1, fit + 1), key=lambda r: (-(-th // r) * -(-r * seg // lanes), r))
    tp = -(-rt * seg // lanes) * lanes
    nvec = tp // lanes
    nv = max(v for v in (1, 2, 3) if nvec % v == 0 and v * 4 <= budget)
    # Channels per register tile: the fewest padded channels per unit of FMA throughput.
    mbs = range(max(1, budget // nv - 2), budget // nv + 1)
    mb = min(mbs, key=lambda mb: (-(-g.m // mb) * mb / min(1.0, mb * nv / budget), -mb))
    nb = -(-g.m // mb)
    # Where the GEMM results of every channel fit beside V, the GEMMs run point by point over all
    # channel blocks (V[xi] stays in L1 while they pass); else block by block, holding one block's
    # M (V reread from L2 per block): 64 -> 64 on 56x56 measured 6% slower that way.
    whole_m = a * a * (g.c + nb * mb) * tp * 4 <= target.l2_bytes * 3 // 4
    return WinogradPlan(m, a, th, tw, rt, tp, mb, nv, lanes, nb, whole_m)


def pack_winograd_weights(w: np.ndarray, b: np.ndarray | None, g: Geometry, plan: WinogradPlan) -> np.ndarray:
    """U = G g GT as [point][channel block][ic][MB] (channels past M zero), then the bias [M]."""
    _, gm, _ = matrices(plan.m)
    u = np.einsum("ik,ockl,jl->ijoc", gm, w.reshape(g.m, g.c, 3, 3).astype(np.float64), gm)
    u = u.reshape(plan.points, g.m, g.c)
    up = np.zeros((plan.points, plan.nb * plan.mb, g.c), np.float64)
    up[:, :g.m] = u
    packed = up.reshape(plan.points, plan.nb, plan.mb, g.c).transpose(0, 1, 3, 2)
    bias = np.zeros(g.m) if b is None else b.reshape(g.m)
    return np.concatenate([packed.reshape(-1), bias]).astype(np.float32)


def _kw(plan: WinogradPlan) -> int:
    """Columns per phase line of the phase-split input rows: the transform reads every slot and
    (a - 1) // m columns past it."""
    return plan.tp + plan.lanes


def _parts(plan: WinogradPlan) -> int:
    """Parts the output channels of a unit are split into (see ``winograd_conv``)."""
    return 2 if plan.nb >= 4 else 1


def _out_row(plan: WinogradPlan) -> int:
    """Floats per output row buffer: m outputs of every slot."""
    return plan.m * plan.tp


def _scratch_parts(g: Geometry, plan: WinogradPlan) -> list[int]:
    """Floats per task: padded input row, phase-split rows, V [point][ic][slot], M [point][channel of
    a block][slot], output rows; each 64-byte aligned."""
    parts = [plan.m * plan.seg, plan.a * plan.m * _kw(plan), plan.points * g.c * plan.tp,
             plan.points * _m_channels(plan) * plan.tp, plan.m * _out_row(plan)]
    return [(p + 15) // 16 * 16 for p in parts]


def _m_channels(plan: WinogradPlan) -> int:
    """Channels held in M: all of them, or one block."""
    return plan.nb * plan.mb if plan.whole_m else plan.mb


def winograd_scratch_floats(g: Geometry, plan: WinogradPlan) -> int:
    return sum(_scratch_parts(g, plan))


def _vector_loop(n: int, lanes: int, body: list[str]) -> list[str]:
    """``body`` for every slot j < n (a multiple of ``lanes``), a vector of slots per step."""
    return [f"for (size_t j0 = 0; j0 < {n}; j0 += {lanes}) {{",
            "  AOTC_IVDEP", f"  for (size_t k = 0; k < {lanes}; k++) {{", "    const size_t j = j0 + k;",
            *("    " + ln for ln in body), "  }", "}"]


def _combo(coeffs: np.ndarray, terms: list[str]) -> str:
    """C expression sum(coeffs[i] * terms[i]) with the zero terms left out and +-1 as adds."""
    parts = []
    for c, t in zip(coeffs, terms, strict=True):
        if c == 0:
            continue
        if c == 1:
            parts.append(f"+ {t}")
        elif c == -1:
            parts.append(f"- {t}")
        else:
            parts.append(f"{'-' if c < 0 else '+'} {abs(float(c))!r}f * {t}")
    if not parts:
        return "0.0f"
    s = " ".join(parts)
    return s[2:] if s.startswith("+ ") else "-" + s[2:]


def winograd_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
                  fn: str, plan: WinogradPlan) -> tuple[str, str]:
    """(helpers, body) of the Winograd conv; see the module docstring."""
    m, a, rt, tp, mb, nv, L = plan.m, plan.a, plan.rt, plan.tp, plan.mb, plan.nv, plan.lanes
    n_pts, nb = plan.points, plan.nb
    bt, _, at = matrices(m)
    C, M = g.c, g.m
    IH, IW = g.inp[1], g.inp[2]
    OH, OW = g.out[1], g.out[2]
    OS, IS = g.out_size, g.in_size
    PH, PW = g.pb[1], g.pb[2]
    kw, orw = _kw(plan), _out_row(plan)
    # GEMM micro-kernels: MB channels x NV vectors of tile slots over the input channels (and one
    # with fewer vectors for the slots left over, if any).
    helpers = [target.isa.include, f"static const float {fn}_zeros[{mb}];"]
    helpers += [bcast_tile_kernel(target, f"{fn}_mk{k}", mb, k, tp, tp, "nk", inline=False)
                for k in sorted({nv, (tp // L) % nv} - {0})]

    # Input transform of every slot: d[r][c] = phase-split row r, phase c % m, column j + c / m.
    j = Ix.of("j")
    d = [[f"ph[{j + (r * m + c % m) * kw + c // m}]" for c in range(a)] for r in range(a)]
    tin = []
    for r in range(a):  # along each row: t[r][c'] = sum_c BT[c'][c] d[r][c]
        tin += [f"const float t{r}_{c2} = {_combo(bt[c2], d[r])};" for c2 in range(a)]
    for r2 in range(a):  # down the columns: V[r'][c'] = sum_r BT[r'][r] t[r][c']
        for c2 in range(a):
            tin.append(f"vr[{(r2 * a + c2) * C * tp} + j] = {_combo(bt[r2], [f't{r}_{c2}' for r in range(a)])};")

    # Output transform of one channel, every slot: o[r''][c''] = AT M A into m output rows.
    mv = [[f"mr[{(r * a + c) * _m_channels(plan) * tp} + j]" for c in range(a)] for r in range(a)]
    tout = []
    for r in range(a):
        tout += [f"const float s{r}_{c2} = {_combo(at[c2], mv[r])};" for c2 in range(m)]
    for r2 in range(m):
        for c2 in range(m):
            tout.append(f"orow[{j * m + r2 * orw + c2}] = {_combo(at[r2], [f's{r}_{c2}' for r in range(a)])};")

    nu = plan.units_per_image
    uoff = n_pts * nb * C * mb
    rem = (tp // L) % nv
    groups = [(pg * nv * L, nv) for pg in range((tp // L) // nv)] + ([((tp // L) // nv * nv * L, rem)] if rem else [])
    # Units are (image, block of tile rows, part of the output channels), parts fastest: with two
    # parts, 7 tile rows still split evenly over 2 threads, and a task that goes on to the next part
    # of the same tile rows reuses their input transform.
    parts = _parts(plan)
    decl, u = split_unit("t", [("part", parts), ("tr", nu), ("n", g.n)], keep=bool(epi))
    part, tr0, n = u["part"], u["tr"] * rt, u["n"]
    seg = plan.seg
    ti = Ix.of("ti") if rt > 1 else Ix()

    def gemms(mo: str, ind: str) -> list[str]:
        """The GEMMs of point xi, channel block blk, into ``mo``."""
        return [f"{ind}const float *restrict u = {offset(packed, (Ix.of('xi') * nb + 'blk') * (C * mb))};",
                f"{ind}float *restrict mo = {mo};",
                *(f"{ind}{fn}_mk{k}({offset('vv', Ix.of('xi') * (C * tp) + p0)}, u, {fn}_zeros, "
                  f"{offset('mo', p0)}, {C});" for p0, k in groups)]

    def outputs(mr: str, ind: str) -> list[str]:
        """Output transform of channel c (its M at ``mr``), bias, epilogue, store."""
        return [ind + ln for ln in [
            f"const float bc = {packed}[{uoff} + c];",
            f"const float *restrict mr = {mr};",
            "float *restrict orow = ob;",
            *_vector_loop(tp, L, tout),
            f"for (size_t r = 0; r < {rt * m} && tr0 * {m} + r < {OH}; r++) {{",
            f"  const size_t s0 = (tr0 * {m} + r) * {OW};",
            f"  const float *restrict orow = ob + r % {m} * {orw} + r / {m} * {seg * m};",
            f"  float *restrict yr = {offset(y, (n * M + 'c') * OS + 's0')};",
            f"  for (size_t q = 0; q < {OW}; q++) {{",
            *(["    const size_t s = s0 + q; (void)s;"] if epi else []),
            "    float v = orow[q] + bc;",
            *epi_block(epi, g, "s", "    "),
            "    yr[q] = v;",
            "  }", "}"]]

    if plan.whole_m:
        gemms_and_outputs = [
            f"for (size_t xi = 0; xi < {n_pts}; xi++)",
            "  for (size_t blk = b0; blk < b1; blk++) {",
            *gemms(f"mm + (xi * {nb * mb} + blk * {mb}) * {tp}", "    "),
            "  }",
            f"const size_t c1 = b1 * {mb} < {M} ? b1 * {mb} : {M};",
            f"for (size_t c = b0 * {mb}; c < c1; c++) {{",
            *outputs(f"mm + c * {tp}", "  "),
            "}"]
    else:  # per block of output channels: its GEMMs over every point, then their output transform
        gemms_and_outputs = [
            "for (size_t blk = b0; blk < b1; blk++) {",
            f"  for (size_t xi = 0; xi < {n_pts}; xi++) {{",
            *gemms(f"mm + xi * {mb * tp}", "    "),
            "  }",
            f"  const size_t c1 = (blk + 1) * {mb} < {M} ? (blk + 1) * {mb} : {M};",
            f"  for (size_t c = blk * {mb}; c < c1; c++) {{",
            *outputs(f"mm + (c - blk * {mb}) * {tp}", "    "),
            "  }",
            "}"]
    body = [*([decl] if decl else []),
            f"const size_t tr0 = {tr0};",
            f"const size_t b0 = {part * nb // parts}, b1 = {(part + 1) * nb // parts};",
            f"const float *restrict xn = {offset(x, n * (C * IS))};",
            # The padded row's borders and the phase lines' tails past the unit's rows (read by junk
            # slots only) are zeroed once per task.
            "if (t == t0) {",
            f"  for (size_t i = 0; i < {m * seg}; i++) prow[i] = 0;",
            f"  for (size_t i = 0; i < {a * m * kw}; i++) ph[i] = 0;",
            "}",
            f"{'' if parts == 1 else 'if (t == t0 || part == 0) '}for (size_t ic = 0; ic < {C}; ic++) {{",
            *([f"  for (size_t ti = 0; ti < {rt}; ti++)"] if rt > 1 else []),
            f"    for (size_t r = 0; r < {a}; r++) {{",
            f"      const ptrdiff_t ih = (ptrdiff_t)({(Ix.of('tr0') + ti) * m + 'r'}) - {PH};",
            f"      float *restrict pr = {offset('ph', Ix.of('r') * (m * kw) + ti * seg)};",
            f"      if (ih >= 0 && ih < {IH}) {{",
            f"        const float *restrict xr = xn + ic * {IS} + ih * {IW};",
            f"        for (size_t i = 0; i < {IW}; i++) prow[{PW} + i] = xr[i];",
            f"        for (size_t k = 0; k < {seg}; k++) {{",
            *(f"          pr[{Ix.of('k') + c * kw}] = prow[{Ix.of('k') * m + c}];" for c in range(m)),
            "        }",
            "      } else {",
            f"        for (size_t k = 0; k < {seg}; k++) {{",
            *(f"          pr[{Ix.of('k') + c * kw}] = 0;" for c in range(m)),
            "        }",
            "      }",
            "    }",
            f"  float *restrict vr = vv + ic * {tp};",
            *("  " + ln for ln in _vector_loop(tp, L, tin)),
            "}",
            *gemms_and_outputs]
    sizes = _scratch_parts(g, plan)
    offs = [sum(sizes[:i]) for i in range(len(sizes))]
    head = (f"float *restrict prow = scratch + task * (size_t){sum(sizes)};\n"
            + "".join(f"float *restrict {nm} = prow + {o};\n" for nm, o in zip(("ph", "vv", "mm", "ob"), offs[1:],
                                                                                 strict=True))
            + f"{task_bounds(g.n * nu * parts, hi=None)}\n")
    return "\n".join(helpers) + "\n", head + task_loop(g.n * nu * parts, "\n".join("  " + ln for ln in body))
