"""A 1x1 conv that expands channels, computed inside the depthwise conv that reads it.

MobileNet-style blocks expand C channels to M = 4..6 C with a 1x1 conv (+ Clip), then run a 3x3
depthwise conv over those M channels. As two kernels the expanded tensor -- the block's largest,
4.8 MB at 112x112 -- is written to memory and read back, and those streams, not the arithmetic,
bound both kernels once two cores share the memory bus. Depthwise channel c reads expanded channel
c only, so one work unit can take a block of MB expanded channels, compute their whole planes into
per-task scratch (the 1x1 path's register tile, its epilogue applied there), and run the depthwise
conv on each plane while it is in L2: the expanded tensor never reaches memory.

The fusion pass (``passes/fuse.py``) merges the two conv kernels when ``fusable`` holds; the
depthwise part is the phase path of ``depthwise.py`` with its input plane taken from scratch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.affine import offset
from aotc.ops.conv.common import (
    WRITE_OUT,
    Epilogue,
    Geometry,
    bcast_tile_kernel,
    block_count,
    epi_block,
    geometry,
    split_unit,
    task_bounds,
)
from aotc.ops.conv.depthwise import phase_areas, phase_rowbuf, phase_unit, use_phase
from aotc.ops.conv.rows import pack_rows_weights, rows_plan

if TYPE_CHECKING:
    from aotc.target import Target


def fusable(expand: Node, dw: Node, target: Target) -> bool:
    """Whether ``expand`` (producing ``dw``'s input) and the depthwise ``dw`` run as one kernel: a
    float32 1x1, stride-1, unpadded, one-group conv with constant weights that widens the channels
    on planes of more than 64 positions, from an input that fits in L2, then a 2-D depthwise conv
    (one channel per group, multiplier 1) that takes the phase path.

    Every unit reads the whole input of the 1x1 conv, so it must stay in L2 between units: at most three
    quarters of it. MobileNetV2, 2 threads, 512 KB of L2: 24 -> 144 channels on 56x56 (300 KB of input)
    8-20% faster fused, 16 -> 96 on 112x112 (800 KB, streamed again by each of 16 units) no faster or
    slower."""
    x, w = expand.inputs[0], expand.inputs[1]
    b = expand.inputs[2] if len(expand.inputs) > 2 else None
    if x is None or w is None or x.dtype != np.float32 or not w.is_const or (b is not None and not b.is_const):
        return False
    if x.shape is None or len(x.shape) != 4 or dw.inputs[0] is None or dw.inputs[0].dtype != np.float32:
        return False
    ge, gd = geometry(expand), geometry(dw)
    return (ge.group == 1 and ge.taps == 1 and all(v == 1 for v in ge.s) and not any(ge.pb) and not any(ge.pe)
            and ge.m > ge.c and ge.out_size > 64 and ge.c * ge.in_size * 4 <= target.l2_bytes * 3 // 4
            and gd.group == gd.c == gd.m == ge.m and use_phase(gd))


def _plan(ge: Geometry, target: Target) -> tuple[int, int, int]:
    plan = rows_plan(ge, target)
    assert plan is not None, "fusable() admits only convs the 1x1 path takes"
    return plan


def pack_weights(expand: Node, target: Target) -> np.ndarray:
    """The 1x1 conv's weights and bias in the layout ``kernel``'s register tile reads."""
    ge, b = geometry(expand), expand.inputs[2] if len(expand.inputs) > 2 else None
    return pack_rows_weights(expand.inputs[1].const, None if b is None else b.const, ge, _plan(ge, target)[0])


def _expanded_floats(ge: Geometry, target: Target) -> int:
    """Scratch floats of one unit's expanded planes (MB of them), a multiple of 16."""
    return (_plan(ge, target)[0] * ge.out_size + 15) // 16 * 16


def scratch_floats(ge: Geometry, gd: Geometry, target: Target) -> int:
    """Per task: the expanded planes, then one set of the phase path's planes, row copy and flat output."""
    area, nqv = phase_areas(gd)
    return _expanded_floats(ge, target) + area + phase_rowbuf(gd) + nqv


def kernel(ge: Geometry, gd: Geometry, x: str, packed: str, wd: str, bd: str | None, y: str, target: Target,
           epi_e: Epilogue | None, epi_d: Epilogue | None, fn: str) -> tuple[str, str]:
    """(helpers, body): units are (image, block of MB expanded channels). ``packed`` is
    ``pack_weights`` of the expand conv; ``wd``/``bd`` the depthwise weights and bias;
    ``epi_e``/``epi_d`` the two convs' epilogues (both see the channel as ``c``).

    Tasks split channel blocks, not bands of rows, although the 1x1 convs around the block split
    positions: a band split (each task expanding the rows its band reads, the rows at a band edge
    twice) was bit-identical but measured 1.3-1.5x slower on 2 threads, alone and in MobileNetV2,
    on its 56x56, 28x28 and 14x14 blocks (1.2x with both bands on one thread: not only the extra rows)."""
    mb, nv, lanes = _plan(ge, target)
    pv = nv * lanes
    C, M, IS = ge.c, ge.m, ge.out_size
    nb = -(-M // mb)
    units = ge.n * nb
    wsize = nb * C * mb
    area = phase_areas(gd)[0]
    helpers = target.isa.include + "\n"
    helpers += bcast_tile_kernel(target, f"{fn}_rows", mb, nv, IS, pv, str(C)) + "\n"
    dw_helper, dw_lines, flat = phase_unit(gd, "", wd, bd, y, target, epi_d, f"{fn}_dw", double=False,
                                           src=f"E + i * {IS}", first="u == u0 && i == 0")
    head = [f"float *restrict E = scratch + task * (size_t){scratch_floats(ge, gd, target)};",
            f"float *restrict ph = E + {_expanded_floats(ge, target)};",
            f"float *restrict rb = ph + {area}; (void)rb;",
            *([f"float *restrict vo = {offset('rb', phase_rowbuf(gd))};"] if flat else []),
            task_bounds(units, "u0", "u1")]
    decl, ix = split_unit("u", [("blk", nb), ("n", ge.n)], keep=True)
    blk, n = ix["blk"], ix["n"]
    body = ["for (size_t u = u0; u < u1; u++) {",
            f"  {decl}",
            f"  const float *xg = {offset(x, n * (C * IS))};",
            f"  const float *wp = {offset(packed, blk * (C * mb))}, *bias = {offset(packed, blk * mb + wsize)};",
            f"  const size_t c0 = {blk * mb}, cn = {block_count(M, mb)};",
            # The expanded planes: tiles of MB channels x PV positions (the last tile overlaps).
            f"  for (size_t s0 = 0; s0 < {IS}; s0 += {pv}) {{",
            f"    const size_t sb = s0 + {pv} <= {IS} ? s0 : {IS - pv};",
            f"    float tile[{mb * pv}] __attribute__((aligned(64)));",
            f"    {fn}_rows(xg + sb, wp, bias, tile, {C});",
            "    for (size_t i = 0; i < cn; i++) {",
            "      const size_t c = c0 + i; (void)c;",
            f"      float *restrict er = E + i * {IS} + sb;",
            f"      {WRITE_OUT}",
            f"      for (size_t j = 0; j < {pv}; j++) {{",
            *(["        const size_t s = sb + j; (void)s;"] if epi_e else []),
            f"        float v = tile[i * {pv} + j];",
            *epi_block(epi_e, ge, "s", "        "),
            "        er[j] = v;",
            "      }", "    }", "  }",
            # Then the depthwise conv of each, from scratch.
            "  for (size_t i = 0; i < cn; i++) {",
            f"    const size_t t = {n * M + 'c0' + 'i'};",
            *("    " + ln for ln in dw_lines),
            "  }",
            "}"]
    return helpers + dw_helper, "\n".join(head + body)
