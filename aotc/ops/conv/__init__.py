"""Convolution and pooling: Conv, ConvTranspose, MaxPool, AveragePool, LpPool and the global pools.

Every op works on NC + 1..3 spatial dims; the C generators pad the spatial dims to three (leading
1s), so one loop nest covers 1-D, 2-D and 3-D. Work is split over (batch, channel) pairs, never over
a reduction, so results do not depend on ``ntasks``.

Conv has five code paths (``dispatch.conv_path`` picks one, ``dispatch.conv_kernel`` writes it), one
module each over the shared ``common`` part; the fast ones are
float32 and split work over (batch, group, chunk of output positions, block of output channels):

- "winograd" (constant weights, 3x3 stride 1, one group, 16 to 256 channels): F(4x4, 3x3) or
  F(2x2, 3x3) in ``winograd.py``, 2 to 4 times fewer multiplies than the direct sum.

- "tiled" (constant weights, ``direct.py``): a register-tiled implicit GEMM. Weights are packed at compile time into
  blocks of CB output channels ([ci][tap][CB]); a tile of R output positions x CB channels lives in
  vector registers while every (input channel, tap) adds ``x * w``: R broadcasts of x and CB/lanes
  weight loads feed R * CB/lanes FMAs, the GEMM micro-kernel's ratio. Padding is handled by copying
  the input into a zero-padded scratch buffer, so the hot loop has no bounds checks. On AVX2, 1x1
  convs with fewer output than input channels (and small planes) take a variant of it
  (``pointwise.py``) that blocks the input channels and writes out through 8x8 transposes.
- "rows" (``rows.py``; constant weights, 1x1, stride 1, no padding): Y[co, s] = W[co, ci] X[ci, s] with the
  weights broadcast and contiguous vectors of positions, the input packed into panels like GEMM's B.
- "depthwise" (``depthwise.py``; one input channel per group): strided or small planes are copied into a zero-padded
  buffer split into stride phases, so one flat loop over "virtual" positions has contiguous loads
  for every tap; large stride-1 planes run a width loop per row with the taps unrolled.
- "generic" (``direct.py``; float64, run-time weights): a plain bounds-checked loop.

The Conv kernel applies its fused elementwise consumers (``Epilogue``) to each value before storing;
a depthwise conv may compute its expanding 1x1 input inside (``expand_depthwise.py``).
Pooling is separable (rows reduced into a padded row buffer, then along it) for MaxPool and
AveragePool (``pool.py``); LpPool, the Indices output and the global pools use a bounds-checked loop.
"""

from aotc.ops.conv.common import Epilogue, Geometry, bcast_tile_kernel, geometry, infer
from aotc.ops.conv.dispatch import (
    can_take_epilogue,
    can_take_prologue,
    conv_kernel,
    conv_path,
    conv_scratch_floats,
    pack_weights,
)
from aotc.ops.conv.pool import pool_emit
from aotc.ops.conv.transpose import conv_transpose_emit
from aotc.ops.registry import OpDef, register

# Fusion makes every Conv a conv kernel, written by conv_kernel with its epilogue (aotc/codegen/kernels.py).
register(OpDef("Conv", "conv", infer, emit=conv_kernel, pack=pack_weights, can_take_epilogue=can_take_epilogue,
               can_take_prologue=can_take_prologue))
register(OpDef("ConvTranspose", "kernel", infer, emit=conv_transpose_emit))
for _op in ("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"):
    register(OpDef(_op, "kernel", infer, emit=pool_emit))

__all__ = ["Epilogue", "Geometry", "bcast_tile_kernel", "conv_kernel", "conv_path", "conv_scratch_floats", "geometry"]
