"""The direct conv paths: "tiled", a register-tiled implicit GEMM over packed weights, and "generic",
a plain bounds-checked loop (float64, run-time weights)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from aotc.ops.affine import Ix, offset
from aotc.ops.conv.common import (
    Epilogue,
    Geometry,
    TilePlan,
    bcast_fma,
    block_count,
    cmin,
    epi_block,
    first_of,
    needs_pad,
    pad_copy,
    pad_rows,
    padded_dims,
    plane_unit,
    signed_start,
    split_unit,
    task_bounds,
    task_loop,
    transpose8,
)
from aotc.ops.conv.pointwise import pointwise_plan

if TYPE_CHECKING:
    from aotc.target import Target


def generic_conv(g: Geometry, x: str, w: str, b: str | None, y: str, ct: str, epi: Epilogue | None) -> str:
    """Any dtype, any weights: bounds-checked direct convolution, one (n, m) plane per work unit."""
    cg, mg = g.c // g.group, g.m // g.group
    ID, IH, IW = g.inp
    acc, cast = ("float", "(float)") if ct == "_Float16" else (ct, "")
    s_ = Ix.of("s")
    lines = [plane_unit(g),
             f"const {ct} *xg = {offset(x, (Ix.of('n') * g.c + Ix.of('c') // mg * cg) * g.in_size)};",
             f"const {ct} *wm = {offset(w, Ix.of('c') * (cg * g.taps))};",
             f"{ct} *yo = {offset(y, Ix.of('t') * g.out_size)};",
             f"for (size_t s = 0; s < {g.out_size}; s++) {{",
             f"  const ptrdiff_t d0 = {signed_start(s_ // (g.out[1] * g.out[2]), g.s[0], g.pb[0])};",
             f"  const ptrdiff_t h0 = {signed_start(s_ // g.out[2] % g.out[1], g.s[1], g.pb[1])};",
             f"  const ptrdiff_t w0 = {signed_start(s_ % g.out[2], g.s[2], g.pb[2])};",
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
             *epi_block(epi, g, "s", "  "),
             "  yo[s] = v;", "}"]
    return task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


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


def tiled_scratch_floats(g: Geometry, target: Target) -> int:
    """Scratch floats per task of the tiled path (not its pointwise variant): the zero-padded input
    planes, the partial sums of input-channel blocks, the vector write-out's buffers."""
    plan = tile_plan(g, target)
    sums = tiled_chunks(g, plan.r, target)[0] * plan.cb if ci_block(g, plan, target) < g.c // g.group else 0
    pad = (math.prod(padded_dims(g)) + 15) // 16 * 16 * (g.c // g.group) if needs_pad(g) else 0
    if tiled_vector_out(g, plan, target):
        q = tiled_out_chunk(plan, target)
        sums += (q + plan.r) * plan.cb + plan.cb * q
    return pad + sums


def tiled_vector_out(g: Geometry, plan: TilePlan, target: Target) -> bool:
    """Whether the tiled path collects its tiles position-major and writes each channel's row out
    contiguously through 8x8 transposes (AVX2 and AVX-512, whose zmm tiles transpose as two ymm
    halves) rather than one scalar store per output, strided by the plane. The scalar write-out took
    about as long as the sums on MobileNetV2's stem (27 MACs per output) on AVX2; on AVX-512 that
    stem ran 1.4x faster by rows, ResNet's 7x7 stem 1.09x, and a 3 -> 32 conv on 64x64 (16 KB
    planes: every channel's strided store in one L1 set) 10x."""
    return target.isa.shuffles256 and ci_block(g, plan, target) == g.c // g.group


def tiled_out_chunk(plan: TilePlan, target: Target) -> int:
    """Positions per write-out step of the tiled path: whole tiles and whole 8x8 transposes, the
    position-major sums and their transpose within half of L1 (16 KB)."""
    step = plan.r * 8
    return max(step, target.l1d_bytes // 16 // plan.cb // step * step)


def tiled_chunks(g: Geometry, r: int, target: Target) -> tuple[int, int]:
    """(positions per chunk, chunks) of the tiled path: chunks of (nearly) equal size, multiples of the
    tile height, whose input fits in half of L2 (a short last chunk would leave one task almost idle)."""
    os_ = g.out_size
    cap = max(r, min(os_, target.l2_bytes // 8 // max(1, (g.c // g.group) * g.s[1] * g.s[2])) // r * r)
    nch = -(-os_ // cap)
    per_chunk = -(-os_ // nch)
    chunk = -(-per_chunk // r) * r
    return chunk, -(-os_ // chunk)


def ci_block(g: Geometry, plan: TilePlan, target: Target) -> int:
    """Input channels per pass of the tiled path. A channel block's weights beyond an eighth of L2, 64 KB
    (ResNet's 512-channel 3x3 convs: 295 KB), do not stay in L2 beside the input while every tile of the chunk
    rereads them, so the sum runs over blocks of 64 input channels (36 KB of 3x3 weights), each swept
    over all tiles, the partial sums kept in scratch. Stored and reloaded floats are exact, so the
    result is the same bits as one pass."""
    cg = g.c // g.group
    return cg if cg * g.taps * plan.cb * 4 <= target.l2_bytes // 8 else 64


def tiled_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
                fn: str) -> tuple[str, str]:
    """(helpers, body) of the register-tiled float32 conv; see the module docstring."""
    vec = target.isa
    plan = tile_plan(g, target)
    cg, mg = g.c // g.group, g.m // g.group
    nb = -(-mg // plan.cb)
    cb, nv, R, L = plan.cb, plan.nv, plan.r, plan.lanes
    PD, PH, PW = padded_dims(g) if needs_pad(g) else g.inp
    ps = PD * PH * PW
    taps = [(kd * g.d[0] * PH + kh * g.d[1]) * PW + kw * g.d[2]
            for kd in range(g.k[0]) for kh in range(g.k[1]) for kw in range(g.k[2])]
    OS, OH, OW = g.out_size, g.out[1], g.out[2]
    bias_off = g.group * nb * cg * g.taps * cb

    # Micro-kernel: R positions (window starts xo[r]) x CB channels, summed over ci and taps.
    # ``init`` holds the starting sums: the bias (istride 0, the same for every position) or the
    # partial sums of earlier input-channel blocks (istride CB). ``tile`` may alias ``init``.
    # Not inlined (nor the 1x1 kernel's): its registers are then allocated apart from the write-out
    # loop's constants (see pointwise_conv).
    mk = [f"{vec.attribute}static __attribute__((noinline)) void {fn}(const float *xp, const size_t *xo, "
          f"const float *wp, const float *init, size_t istride, float *tile, size_t nci) {{"]
    mk += [f"  {vec.vtype} a{r}_{j} = {vec.vload(offset('init', Ix.of('istride') * r + j * L))};"
           for r in range(R) for j in range(nv)]
    mk += [f"  const float *restrict x{r} = xp + xo[{r}];" for r in range(R)]
    # Up to 16 taps are unrolled (constant address offsets); larger kernels loop over kernel rows
    # with the taps of a row unrolled: a fully unrolled 7x7 body overflows the decoded-op cache.
    kw = g.k[2]
    if len(taps) <= 16:
        mk += ["  for (size_t ci = 0; ci < nci; ci++) {",
               f"    const float *restrict wc = wp + ci * {len(taps) * cb};",
               f"    const size_t o = ci * {ps};"]
        steps = [(Ix.of("wc") + t * cb, Ix.of("o") + off) for t, off in enumerate(taps)]
    else:
        rows = taps[::kw]
        mk += [f"  static const size_t rows[{len(rows)}] = {{{', '.join(map(str, rows))}}};",
               "  for (size_t ci = 0; ci < nci; ci++) {",
               f"    for (size_t tr = 0; tr < {len(rows)}; tr++) {{",
               f"      const float *restrict wc = wp + (ci * {len(rows)} + tr) * {kw * cb};",
               f"      const size_t o = ci * {ps} + rows[tr];"]
        steps = [(Ix.of("wc") + t * cb, Ix.of("o") + t * g.d[2]) for t in range(kw)]
    for wv, xo in steps:
        mk.append("    {")
        mk += [f"      const {vec.vtype} w{j} = {vec.vload(str(wv + j * L))};" for j in range(nv)]
        for r in range(R):
            mk += bcast_fma(vec, r, nv, f"x{r} + {xo}", "xb", "w", "      ")
        mk.append("    }")
    if len(taps) > 16:
        mk.append("    }")
    mk.append("  }")
    mk += [f"  {vec.vstore(offset('tile', (r * nv + j) * L), f'a{r}_{j}')};" for r in range(R) for j in range(nv)]
    mk.append("}")
    helpers = vec.include + "\n" + "\n".join(mk) + "\n"

    pad = needs_pad(g)
    per_task = tiled_scratch_floats(g, target)
    # Work units are (batch, group, spatial chunk, channel block), block fastest: a task sweeps every
    # channel block over one chunk of output positions while that chunk's input stays in L2.
    chunk, nch = tiled_chunks(g, R, target)
    cib = ci_block(g, plan, target)
    units = g.n * g.group * nch * nb
    decl, u = split_unit("t", [("blk", nb), ("ch", nch), ("grp", g.group), ("n", g.n)], keep=bool(epi))
    blk, ch, grp, n = u["blk"], u["ch"], u["grp"], u["n"]
    body = [*([decl] if decl else []), f"const float *xg = {offset(x, (n * g.c + grp * cg) * g.in_size)};"]
    if pad and PD == 1:
        # Re-pad when the (batch, group) changes, only the padded rows that this task's chunks of it
        # read: with several tasks, each one zeroing and copying every plane whole repeated the copy.
        per_grp = nb * nch
        body += [first_of(per_grp),
                 *([f"  const size_t tl = {cmin((Ix.of('t') // per_grp + 1) * per_grp, 't1')};"] if nch > 1 else []),
                 f"  const size_t slo = {cmin(ch * chunk, OS - R)};",
                 f"  const size_t shi = {cmin(Ix.of('(tl - 1)') // nb % nch * chunk + chunk, OS)};",
                 *("  " + ln for ln in pad_rows(g, "xg", "xpad", cg, "slo", "shi")),
                 "}", "const float *xp = xpad;"]
    elif pad:  # re-pad only when the (batch, group) changes
        body += [first_of(nb * nch), *("  " + ln for ln in pad_copy(g, "xg", "xpad", cg)),
                 "}", "const float *xp = xpad;"]
    else:
        body.append("const float *xp = xg;")
    s_ = Ix.of("s")
    # Window starts; with one output depth s < OH * OW, so s / OW needs no remainder.
    start = (s_ // OW if g.out[0] == 1 else s_ // OW % OH) * (g.s[1] * PW) + s_ % OW * g.s[2]
    if g.out[0] > 1:
        start += s_ // (OH * OW) * (g.s[0] * PH * PW)
    offsets = [f"  for (size_t r = 0; r < {R}; r++) {{",
               "    const size_t s = sb + r;",
               f"    xo[r] = {start};",
               "  }"]
    tiles = [f"for (size_t s0 = {ch * chunk}, k = 0; s0 < send; s0 += {R}, k++) {{",
             f"  const size_t sb = s0 + {R} <= {OS} ? s0 : {OS - R};  /* the last tile overlaps */"]
    body += [f"const float *wp = {offset(packed, (grp * nb + blk) * (cg * g.taps * cb))};",
             f"const float *bias = {offset(packed, (grp * nb + blk) * cb + bias_off)};",
             f"const size_t c0 = {grp * mg + blk * cb}, cn = {block_count(mg, cb)};",
             f"size_t xo[{R}];",
             f"const size_t send = {cmin(ch * chunk + chunk, OS)};"]
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
    elif tiled_vector_out(g, plan, target):
        # Steps of Q positions: the tiles go to a position-major buffer (R rows of headroom in front
        # for the last tile, moved back to overlap), 8x8 transposes turn it into one row per
        # channel, and the epilogue runs over contiguous positions, which GCC vectorizes.
        Q = tiled_out_chunk(plan, target)
        body += [f"for (size_t q0 = {ch * chunk}; q0 < send; q0 += {Q}) {{",
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
                 f"    float *restrict yr = {offset(y, (n * g.m + 'c') * OS + 'q0')};",
                 f"    const float *restrict tr = tb + i * {Q};",
                 "    for (size_t j = 0; j < len; j++) {",
                 *(["      const size_t s = q0 + j; (void)s;"] if epi else []),
                 "      float v = tr[j];",
                 *epi_block(epi, g, "s", "      "),
                 "      yr[j] = v;",
                 "    }", "  }", "}"]
        helpers += transpose8(fn)
    else:
        body += [f"float tile[{R * cb}] __attribute__((aligned(64)));",
                 *tiles, *offsets,
                 f"  {fn}(xp, xo, wp, bias, 0, tile, {cg});"]
    if not tiled_vector_out(g, plan, target):
        body += [f"  for (size_t r = 0; r < {R}; r++) {{",
                 "    const size_t s = sb + r;",
                 "    for (size_t j = 0; j < cn; j++) {",
                 f"      const size_t c = c0 + j; float v = tile[r * {cb} + j];",
                 *epi_block(epi, g, "s", "      "),
                 f"      {y}[{(n * g.m + 'c') * OS + 's'}] = v;",
                 "    }", "  }", "}"]
    head = ""
    if pad:
        head = f"float *restrict xpad = scratch + task * (size_t){per_task};\n{task_bounds(units)}\n"
    if cib < cg:
        head += f"float *restrict sums = scratch + task * (size_t){per_task} + {per_task - chunk * cb};\n"
    if tiled_vector_out(g, plan, target):  # the last (Q + R + Q) * CB floats of the task's scratch
        Q = tiled_out_chunk(plan, target)
        head += (f"float *restrict acc = scratch + task * (size_t){per_task} + {per_task - Q * cb - Q * cb};\n"
                 f"float *restrict tb = acc + {Q * cb};\n")
    return helpers, head + task_loop(units, "\n".join("  " + ln for ln in body))
