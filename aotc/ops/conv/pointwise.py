"""1x1 convs with fewer output than input channels, or on small planes (AVX2, AVX-512): the tiled
path blocked over input channels, written out through 8x8 transposes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotc.ops.affine import Ix, offset
from aotc.ops.conv.common import (
    Epilogue,
    Geometry,
    TilePlan,
    bcast_fma,
    block_count,
    epi_block,
    lanes_of_8x8,
    needs_pad,
    split_unit,
    task_bounds,
    task_loop,
    transpose8,
)

if TYPE_CHECKING:
    from aotc.target import Target


# 1x1 convs with output channels in the vector lanes (AVX2): positions of the micro-kernel's tile per
# number of 8-channel vectors, so that 12 accumulators, the weight vectors and one broadcast fit the
# 16 ymm registers. 4 vectors take 2 positions: 3 leave one weight vector in memory, which measured
# 8-15% slower (MobileNetV2's 960 -> 160 and 960 -> 320 convs).
_PW_TILES = {1: 12, 2: 6, 3: 4, 4: 2}
# AVX-512: the same within 32 zmm registers (24 accumulators at most, as the GEMM tile).
_PW_TILES_512 = {1: 16, 2: 12, 3: 8, 4: 6}


_PW_SPEED = {1: 0.8, 2: 1.0, 3: 0.98, 4: 0.95}   # relative speed per tile shape, see pointwise_plan


def _pw_block_floats(target: Target) -> int:
    """Weights per block of input channels of the 1x1 kernel: a quarter of L1 (8 KB), 10-30% faster than
    16 KB on 7x7 planes with 576 or 960 input channels (their input slice then stays in L1 too), the
    same elsewhere."""
    return target.l1d_bytes // 16


def strided(g: Geometry) -> bool:
    """A strided 1x1 conv reads every s-th input position. Taken on output planes of 64 positions or
    fewer (ResNet-50's last 1024 -> 2048 downsample, 14x14 -> 7x7: in the model the tiled path
    reread its 800 KB input per block of output channels and took 2 to 10 ms, onnxruntime 1.2 ms);
    on larger planes the tiled path measured faster. Each unit first gathers its chunk's positions
    of every input channel into scratch (200 KB there), which its blocks of output channels reuse."""
    return g.s[1] > 1 or g.s[2] > 1


def pointwise_scratch_floats(g: Geometry, target: Target) -> int:
    """Per task: the two accumulator buffers, and a strided conv's gathered input."""
    plan = pointwise_plan(g, target)
    assert plan is not None
    q, q8 = pointwise_chunk(g, plan, target)
    return 2 * plan.cb * q8 + (g.c // g.group * q if strided(g) else 0)


def _tiles(target: Target) -> dict[int, int] | None:
    """Positions per tile by vectors of channels, for the ISAs this kernel is written for."""
    if lanes_of_8x8(target):
        return _PW_TILES
    return _PW_TILES_512 if target.isa.lanes == 16 and target.isa.registers == 32 else None


def pointwise_plan(g: Geometry, target: Target) -> TilePlan | None:
    """The plan of ``pointwise_conv`` (a "tiled" conv specialized for 1x1), or None where it is not
    used: ISAs other than AVX2 and AVX-512, and shapes the rows path does better."""
    tiles = _tiles(target)
    if tiles is None or g.taps != 1 or g.inp[0] != 1 or needs_pad(g) or g.out_size < 8:
        return None
    if strided(g) and g.out_size > 64:
        return None
    mg, cg = g.m // g.group, g.c // g.group
    # MobileNetV2's 1x1 convs, 1 thread, this kernel against the rows path: those with fewer output
    # than input channels ("project") 1.06-1.4x faster; expanding ones 6-30% slower on planes of
    # 14x14 and more, 7-12% faster on 7x7 (where vectors of positions overlap the most).
    if mg > cg and g.out_size > 64 and not strided(g):
        return None

    # Fewest padded channels per unit of speed. Measured on MobileNetV2's project convs (160, 32 and
    # 24 output channels): tiles of 2, 3 or 4 vectors within a few percent of each other where none
    # pads, 2 the fastest; 1 vector (12 positions, more loads than FMAs) about 20% slower.
    lanes = target.isa.lanes

    def cost(nv: int) -> float:
        return -(-mg // (lanes * nv)) * lanes * nv / _PW_SPEED[nv]
    nv = min(tiles, key=cost)
    return TilePlan(lanes * nv, nv, tiles[nv], lanes)


def pointwise_chunk(g: Geometry, plan: TilePlan, target: Target) -> tuple[int, int]:
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


def pointwise_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
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
    cb, nv, R, L = plan.cb, plan.nv, plan.r, plan.lanes
    nb = -(-mg // cb)
    OS = g.out_size
    Q, Q8 = pointwise_chunk(g, plan, target)
    nch = -(-OS // Q)
    xs_row = Q if strided(g) else OS  # floats between input channels of what the micro-kernels read
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
        An empty asm statement keeps the weight vectors that fit in registers (all of them minus
        the accumulators minus the broadcast) there. Not inlined: inlined into the task loop, the
        epilogue's Clip constants (vectorized since -fno-trapping-math) took a register and GCC kept
        one accumulator on the stack, 1.7x slower on MobileNetV2's 160 -> 960 convs on 7x7."""
        pin = max(0, min(nv, vec.registers - 1 - r_ * nv))
        mk = [f"{vec.attribute}static __attribute__((noinline)) void {fn}_r{r_}(const float *restrict x, size_t kn, "
              "const float *restrict w, const float *init, size_t is, float *out) {"]
        mk += [f"  {vt} a{r}_{j} = {vec.vload(offset('init', Ix.of('is') * r + j * L))};"
               for r in range(r_) for j in range(nv)]
        mk += ["  for (size_t ci = 0; ci < kn; ci++) {",
               f"    const float *restrict xr = x + ci * {xs_row};",
               f"    const float *restrict wr = w + ci * {cb};"]
        mk += [f"    {'' if j < pin else 'const '}{vt} w{j} = {vec.vload(offset('wr', j * L))};" for j in range(nv)]
        if pin:  # "x": xmm0-15 (the AVX2 registers), "v": any of AVX-512's 32
            mk.append('    __asm__("" : ' + ", ".join(f'"+{"x" if L == 8 else "v"}"(w{j})' for j in range(pin)) + ");")
        for r in range(r_):
            mk += bcast_fma(vec, r, nv, offset("xr", r), "xb", "w", "    ")
        mk.append("  }")
        mk += [f"  {vec.vstore(offset('out', r * cb + j * L), f'a{r}_{j}')};" for r in range(r_) for j in range(nv)]
        mk.append("}")
        return mk

    helpers = [vec.include, *micro(R), *(ln for r_ in sorted(set(tail)) for ln in micro(r_)), transpose8(fn)]
    tail_calls = [f"    {fn}_r{r_}(xk + p, kn, wk, init + p * is, is, acc + p * {cb}); p += {r_};" for r_ in tail]
    units = g.n * g.group * nch * nb
    decl, u = split_unit("t", [("blk", nb), ("ch", nch), ("grp", g.group), ("n", g.n)], keep=bool(epi))
    blk, ch, grp, n = u["blk"], u["ch"], u["grp"], u["n"]
    if strided(g):  # gathered once per (image, group, chunk): blocks (the fastest part) reuse it
        sp = Ix.of("sp")
        src = (sp // g.out[2]) * (g.s[1] * g.inp[2]) + sp % g.out[2] * g.s[2]
        gather = ["const float *xg = xs;",
                  "{" if nb == 1 else "if (t == t0 || blk == 0) {",
                  f"  const float *xc = {offset(x, (n * g.c + grp * cg) * g.in_size)};",
                  f"  for (size_t ci = 0; ci < {cg}; ci++)",
                  "    for (size_t j = 0, sp = s0; j < len; j++, sp++)",
                  f"      xs[ci * {Q} + j] = xc[{Ix.of('ci') * g.in_size + src}];",
                  "}"]
    else:
        gather = [f"const float *xg = {offset(x, (n * g.c + grp * cg) * OS + 's0')};"]
    kb = Ix.of("kb") if nk > 1 else Ix()
    pf = f"ch + 1 < {nch} ? {Q} : {full * R}" if nch > 1 else full * R  # the full tiles of this chunk
    body = [*([decl] if decl else []),
            f"const size_t s0 = {ch * Q}, len = {f'ch + 1 < {nch} ? {Q} : {last}' if nch > 1 else last};",
            *gather,
            f"const float *wp = {offset(packed, (grp * nb + blk) * (cg * cb))};",
            f"const float *bias = {offset(packed, (grp * nb + blk) * cb + bias_off)};",
            f"const size_t c0 = {grp * mg + blk * cb}, cn = {block_count(mg, cb)};",
            "{" if nk == 1 else f"for (size_t kb = 0; kb < {nk}; kb++) {{",
            f"  const size_t kn = {f'kb + 1 < {nk} ? {kc} : {cg - (nk - 1) * kc}' if nk > 1 else cg};",
            f"  const float *xk = {offset('xg', kb * (kc * xs_row))}, *wk = {offset('wp', kb * (kc * cb))};",
            (f"  const float *init = kb ? acc : bias; const size_t is = kb ? {cb} : 0;" if nk > 1
             else "  const float *init = bias; const size_t is = 0;"),
            "  size_t p = 0;",
            f"  for (const size_t pf = {pf}; p < pf; p += {R})",
            f"    {fn}_r{R}(xk + p, kn, wk, init + p * is, is, acc + p * {cb});",
            *([("  {" if nch == 1 else f"  if (ch + 1 == {nch}) {{"), *tail_calls, "  }"] if tail else []),
            "}",
            # Rows of acc past len (the last block of 8) hold stale values; they land in tb past len,
            # which nothing reads.
            "for (size_t p = 0; p < len; p += 8)",
            f"  for (size_t j = 0; j < {cb // 8}; j++) "
            f"{fn}_tr8(acc + p * {cb} + j * 8, {cb}, tb + j * {8 * Q8} + p, {Q8});",
            "for (size_t i = 0; i < cn; i++) {",
            "  const size_t c = c0 + i;",
            f"  float *restrict yr = {offset(y, (n * g.m + 'c') * OS + 's0')};",
            f"  const float *restrict tr = tb + i * {Q8};",
            "  for (size_t j = 0; j < len; j++) {",
            *(["    const size_t s = s0 + j; (void)s;"] if epi else []),
            "    float v = tr[j];",
            *epi_block(epi, g, "s", "    "),
            "    yr[j] = v;",
            "  }",
            "}"]
    head = (f"float *restrict acc = scratch + task * (size_t){pointwise_scratch_floats(g, target)};\n"
            f"float *restrict tb = acc + {cb * Q8};\n")
    if strided(g):
        head += f"float *restrict xs = tb + {cb * Q8};\n{task_bounds(units, hi=None)}\n"
    return "\n".join(helpers) + "\n", head + task_loop(units, "\n".join("  " + ln for ln in body))
