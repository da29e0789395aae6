"""The "rows" path: 1x1 stride-1 unpadded convs as Y[co, s] = W[co, ci] X[ci, s], the weights
broadcast, contiguous vectors of positions, the input packed into panels like GEMM's B."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aotc.ops.affine import offset
from aotc.ops.conv.common import (
    WRITE_OUT,
    Epilogue,
    Geometry,
    bcast_tile_kernel,
    block_count,
    cmin,
    epi_block,
    needs_pad,
    split_unit,
    task_bounds,
    task_loop,
)

if TYPE_CHECKING:
    from aotc.target import Target


def rows_plan(g: Geometry, target: Target) -> tuple[int, int, int] | None:
    """(MB, NV, lanes) of the 1x1 path -- MB output channels x NV vectors of positions per register
    tile -- or None when the conv is not a stride-1 unpadded 1x1 conv with enough positions."""
    vec = target.isa
    lanes, os_ = vec.lanes, g.out_size
    if g.taps != 1 or any(v != 1 for v in g.s) or needs_pad(g) or os_ < lanes:
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


def rows_pack(g: Geometry, plan: tuple[int, int, int]) -> bool:
    """Whether the 1x1 path packs its input into panels: that pays off once several channel blocks
    reuse them and there are enough input channels for strided reads to strain the prefetchers."""
    return -(-(g.m // g.group) // plan[0]) >= 3 and g.c // g.group >= 32


def rows_chunk(g: Geometry, cg: int, pv: int, target: Target) -> int:
    """Output positions per chunk: a multiple of the tile width whose input (cg rows) fits in a quarter
    of L2,
    the chunks of (nearly) equal size. Chunks of the largest size and a short last one (12544
    positions as 6 x 2048 + 256) left one of two threads a quarter more work (MobileNetV2's
    16 -> 96 conv on 112x112 ran 1.7x faster on 2 threads instead of 1.9x)."""
    cap = max(pv, min(-(-g.out_size // pv) * pv, target.l2_bytes // 16 // max(1, cg) // pv * pv))
    per = -(-g.out_size // -(-g.out_size // cap))
    return -(-per // pv) * pv


def rows_conv(g: Geometry, x: str, packed: str, y: str, target: Target, epi: Epilogue | None,
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
    pack = rows_pack(g, plan)
    xstride = pv if pack else g.in_size

    helpers = vec.include + "\n" + bcast_tile_kernel(target, fn, mb, nv, xstride, pv, str(cg)) + "\n"

    chunk = rows_chunk(g, cg, pv, target)
    nch = -(-OS // chunk)
    units = g.n * g.group * nch * nb
    wsize = g.group * nb * cg * mb
    # Work units as in the tiled path; with packing, the chunk's input is first copied into per-tile
    # panels [tile][ci][positions], so the micro-kernel streams it sequentially (GEMM's packed B).
    decl, u = split_unit("t", [("blk", nb), ("ch", nch), ("grp", g.group), ("n", g.n)], keep=bool(epi))
    blk, ch, grp, n = u["blk"], u["ch"], u["grp"], u["n"]
    body = [*([decl] if decl else []),
            f"const float *xg = {offset(x, (n * g.c + grp * cg) * g.in_size)};",
            f"const size_t send = {cmin(ch * chunk + chunk, OS)};"]
    if pack:
        body += ["if (t == t0 || blk == 0) {",
                 f"  for (size_t s0 = {ch * chunk}, k = 0; s0 < send; s0 += {pv}, k++) {{",
                 f"    const size_t sb = s0 + {pv} <= {OS} ? s0 : {OS - pv};",
                 f"    for (size_t ci = 0; ci < {cg}; ci++)",
                 f"      for (size_t j = 0; j < {pv}; j++)",
                 f"        panel[(k * {cg} + ci) * {pv} + j] = xg[ci * {g.in_size} + sb + j];",
                 "  }",
                 "}"]
    body += [f"const float *wp = {offset(packed, (grp * nb + blk) * (cg * mb))};",
             f"const float *bias = {offset(packed, (grp * nb + blk) * mb + wsize)};",
             f"const size_t c0 = {grp * mg + blk * mb}, cn = {block_count(mg, mb)};",
             f"for (size_t s0 = {ch * chunk}, k = 0; s0 < send; s0 += {pv}, k++) {{",
             f"  const size_t sb = s0 + {pv} <= {OS} ? s0 : {OS - pv};  /* the last tile overlaps */",
             f"  float tile[{mb * pv}] __attribute__((aligned(64)));",
             f"  {fn}({f'panel + k * {cg * pv}' if pack else 'xg + sb'}, wp, bias, tile, {cg});",
             "  for (size_t i = 0; i < cn; i++) {",
             "    const size_t c = c0 + i;",
             f"    float *restrict yr = {offset(y, (n * g.m + 'c') * OS + 'sb')};",
             f"    {WRITE_OUT}",
             f"    for (size_t j = 0; j < {pv}; j++) {{",
             *(["      const size_t s = sb + j; (void)s;"] if epi else []),
             f"      float v = tile[i * {pv} + j];",
             *epi_block(epi, g, "s", "      "),
             "      yr[j] = v;",
             "    }", "  }"]
    body.append("}")
    head = ""
    if pack:
        head = (f"float *restrict panel = scratch + task * (size_t){chunk * cg};\n"
                f"{task_bounds(units, hi=None)}\n")
    return helpers, head + task_loop(units, "\n".join("  " + ln for ln in body))
