"""GEMM and convolution kernels for the GPU: one tiled GEMM template (templates/cuda/gemm.cu.j2), fed by a
MatMul's row-major operands or by a convolution's implicit im2col matrix, with the kernel's elementwise
chain (bias, folded BatchNorm, activation, residual add) applied to each result before its store.

Convolution as implicit GEMM, per batch entry n and group g (``z = n * group + g``): rows ``i`` are output
positions (flat over the spatial dims), columns ``j`` the group's output channels, and the reduction index
``kk`` runs over (input channel of the group, kernel taps). A[i][kk] is the input element under tap kk of
position i (0 in the padding); B[kk][j] is weight (g * Mg + j, kk). A convolution with few output channels
per group (depthwise) would waste the tile's columns: it is a direct kernel, one thread per output.

The tile math, mirrored in Python by ``tile_origin``, ``a_slot``, ``b_slot`` and ``thread_outputs`` (tested
against numpy), is what the template computes.
"""

from __future__ import annotations

import re

import numpy as np

from aotc.codegen.cuda.common import (
    MAX_BLOCKS,
    THREADS,
    CudaKernel,
    Unsupported,
    affine,
    ceil_div,
    decompose,
    external,
    index_type,
    params,
    strides,
)
from aotc.codegen.library import env
from aotc.codegen.loops import Emitter, identity_map
from aotc.ir import dtypes
from aotc.ir.graph import Value
from aotc.ir.kernel import Kernel
from aotc.ops.conv import geometry
from aotc.ops.linalg import gemm_batch_strides

BM, BN, BK = 64, 64, 16
# The exact FP32 kernel takes 32x32 tiles when 64x64 ones would give fewer blocks than this (about two per SM
# of an A100 or H100): a batch-1 Transformer's GEMMs have 128 rows.
FEW_BLOCKS = 256
SMALL = 32
# A conv with fewer output channels per group than this is a direct kernel (see the module docstring).
MIN_GEMM_COLUMNS = 8
GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z


def tile_size(m: int, n: int, z: int, tf32: bool) -> int:
    """The (square) tile of a GEMM of m x n per batch entry, z entries: 64, or 32 for a small grid (FP32)."""
    return SMALL if not tf32 and ceil_div(m, BM) * ceil_div(n, BN) * z < FEW_BLOCKS else BM


def tile_origin(block_x: int, block_y: int, tile: int = BM) -> tuple[int, int]:
    """(row0, col0) of the C tile that block (x, y) computes."""
    return block_y * tile, block_x * tile


def a_slot(e: int, rows_fastest: bool, tile: int = BM) -> tuple[int, int]:
    """(i, kk) in the A slab that staging element e (thread + 256 * q) loads."""
    return (e % tile, e // tile) if rows_fastest else (e // BK, e % BK)


def b_slot(e: int, k_fastest: bool, tile: int = BN) -> tuple[int, int]:
    """(kk, j) in the B slab that staging element e loads."""
    return (e % BK, e // BK) if k_fastest else (e // tile, e % tile)


def thread_outputs(t: int, tile: int = BM) -> list[tuple[int, int]]:
    """The (i, j) of the tile that thread t accumulates in the exact FP32 kernel."""
    tx, ty = t % 16, t // 16
    return [(ty + 16 * ii, tx + 16 * jj) for ii in range(tile // 16) for jj in range(tile // 16)]


def epilogue(k: Kernel, ptrs: dict[int, str], head: Value, out: Value, index: list[str]) -> list[str]:
    """Statements taking ``v`` (``head``'s value at the output position whose per-dim indices are the C
    expressions ``index``) through ``k``'s elementwise chain to ``out``'s value, in ``v``."""
    if out is head:
        return []
    rank = len(out.shape)
    em = Emitter(k, ptrs, rank)
    em.memo[(id(head), identity_map(rank), "epilogue")] = "v"
    root = em.value(out, identity_map(rank), "epilogue")
    return [*em.render("epilogue", lambda a: affine(a, dict(enumerate(index)))), f"v = {root};"]


def _render(fn: str, args, names, helpers: str, m: int, n: int, kk: int, z: int, idx: str, tf32: bool,
            a_rows_fastest: bool, b_k_fastest: bool) -> CudaKernel:
    tile = tile_size(m, n, z, tf32)
    if ceil_div(m, tile) > GRID_YZ or z > GRID_YZ:
        raise Unsupported(f"a GEMM of {m} rows and {z} batch entries exceeds the launch grid")
    names_all = ", ".join(names) + ", "
    code = env().get_template("cuda/gemm.cu.j2").render(
        fn=fn, params=", ".join(params(args, names)), helpers=helpers, m=m, n=n, k=kk, idx=idx, tf32=tf32,
        bm=tile, bn=tile, bk=BK, a_rows_fastest=a_rows_fastest, b_k_fastest=b_k_fastest,
        a_args=names_all, b_args=names_all, c_args=names_all)
    return CudaKernel(fn, code, args, f"dim3({ceil_div(n, tile)}, {ceil_div(m, tile)}, {z})")


def _device_fn(name: str, args, names, sig: str, body: list[str], ret: str = "void") -> str:
    """A device helper taking every pointer of the kernel (the ones it does not read cost nothing once
    inlined)."""
    text = "\n".join(body)
    unused = [f"(void){n};" for n in names if not re.search(rf"\b{n}\b", text)]
    ps = ", ".join(params(args, names))
    return (f"static __device__ __forceinline__ {ret} {name}({ps}, {sig}) {{\n"
            + "".join(f"  {s}\n" for s in unused + body) + "}\n")


def emit_matmul(k: Kernel, fn: str, tf32: bool) -> CudaKernel:
    mm = k.gemm
    assert mm is not None
    bs = gemm_batch_strides(mm)
    if bs is None:
        return _naive_matmul(k, fn)
    a, b = mm.inputs[0], mm.inputs[1]
    out = k.outputs[0]
    m, kk = a.shape[-2:]
    n = b.shape[-1]
    batch = list(out.shape[:-2])
    nb = int(np.prod(batch))
    args, names, ptrs = external(k)
    idx = index_type(k)
    pa, pb, po = ptrs[id(a)], ptrs[id(b)], ptrs[id(out)]
    za = f"z * {bs[0]} + " if bs[0] else ""
    zb = f"z * {bs[1]} + " if bs[1] else ""
    body_a = ["(void)z;", f"return {pa}[{za}i * {kk} + kk];"]
    body_b = ["(void)z;", f"return {pb}[{zb}kk * {n} + j];"]
    index = [f"((z / {s}) % {e})" if s > 1 else f"(z % {e})" for s, e in zip(strides(batch), batch, strict=True)]
    epi = epilogue(k, ptrs, mm.outputs[0], out, [*index, "i", "j"])
    body_c = ["(void)z;", *epi, f"{po}[{f'z * {m * n} + ' if nb > 1 else ''}i * {n} + j] = v;"]
    helpers = (_device_fn(f"{fn}_a", args, names, f"{idx} z, {idx} i, {idx} kk", body_a, "float")
               + _device_fn(f"{fn}_b", args, names, f"{idx} z, {idx} kk, {idx} j", body_b, "float")
               + _device_fn(f"{fn}_c", args, names, f"{idx} z, {idx} i, {idx} j, float v", body_c))
    return _render(fn, args, names, helpers, m, n, kk, nb, idx, tf32, a_rows_fastest=False, b_k_fastest=False)


def emit_conv(k: Kernel, fn: str, tf32: bool) -> CudaKernel:
    node = k.conv
    assert node is not None
    if k.expand is not None:
        raise Unsupported("a depthwise conv with its expanding 1x1 conv fused in")
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if x.dtype != np.float32:
        raise Unsupported(f"Conv on {x.dtype}")
    g = geometry(node)
    out = k.outputs[0]
    args, names, ptrs = external(k)
    idx = index_type(k)
    cg, mg = g.c // g.group, g.m // g.group
    osp, isp = g.out_size, g.in_size
    taps = g.taps
    kdim = cg * taps
    px, pw, py = ptrs[id(x)], ptrs[id(w)], ptrs[id(out)]
    pbias = ptrs[id(b)] if b is not None else None
    nsp = len(out.shape) - 2

    def tap_input(pos: str, tap: str) -> list[str]:
        """Declarations of the input offset of output position ``pos`` under kernel tap ``tap`` (flat over
        the taps), and ``inside`` (not in the padding)."""
        lines = decompose(pos, list(g.out), ["o0", "o1", "o2"], "long long")
        lines += decompose(tap, list(g.k), ["t0", "t1", "t2"], "long long")
        for d in range(3):
            lines.append(f"const long long x{d} = o{d} * {g.s[d]} - {g.pb[d]} + t{d} * {g.d[d]};")
        lines.append("const bool inside = " + " && ".join(f"x{d} >= 0 && x{d} < {g.inp[d]}" for d in range(3)) + ";")
        lines.append(f"const long long at = (x0 * {g.inp[1]} + x1) * {g.inp[2]} + x2;")
        return lines

    spatial = [f"o{d}" for d in range(3 - nsp, 3)]
    if mg < MIN_GEMM_COLUMNS:
        # Direct: one thread per output (n, m, position), summing over the group's channels and the taps.
        total = g.n * g.m * osp
        epi = epilogue(k, ptrs, node.outputs[0], out, ["nn", "mm", *spatial])
        lines = [f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))}) {{",
                 f"  for ({idx} e = ({idx})blockIdx.x * {THREADS} + threadIdx.x; e < {total}; "
                 f"e += ({idx})gridDim.x * {THREADS}) {{",
                 f"    const {idx} pos = e % {osp}, mm = (e / {osp}) % {g.m}, nn = e / {osp * g.m}; (void)pos;",
                 f"    const {idx} gg = mm / {mg};",
                 f"    float v = {f'{pbias}[mm]' if pbias else '0.0f'};",
                 f"    for ({idx} c = 0; c < {cg}; c++)",
                 f"      for ({idx} tap = 0; tap < {taps}; tap++) {{",
                 *("        " + s for s in tap_input("pos", "tap")),
                 f"        if (inside) v = fmaf({px}[(nn * {g.c} + gg * {cg} + c) * {isp} + at], "
                 f"{pw}[(mm * {cg} + c) * {taps} + tap], v);",
                 "      }",
                 *("    " + s for s in decompose("pos", list(g.out), ["o0", "o1", "o2"], idx) + epi),
                 f"    {py}[e] = v;",
                 "  }", "}"]
        return CudaKernel(fn, "\n".join(lines) + "\n", args, str(min(ceil_div(total, THREADS), MAX_BLOCKS)))

    sig = f"{idx} z, {idx} i, {idx} kk"
    body_a = [f"const {idx} nn = z / {g.group}, gg = z % {g.group};",
              f"const {idx} c = kk / {taps}, tap = kk % {taps}; (void)tap; /* unused by a 1x1 conv */",
              *tap_input("i", "tap"),
              f"return inside ? {px}[(nn * {g.c} + gg * {cg} + c) * {isp} + at] : 0.0f;"]
    body_b = [f"return {pw}[((z % {g.group}) * {mg} + j) * {kdim} + kk];"]
    epi = epilogue(k, ptrs, node.outputs[0], out, ["nn", "mm", *spatial])
    body_c = [f"const {idx} nn = z / {g.group}, mm = (z % {g.group}) * {mg} + j;",
              *decompose("i", list(g.out), ["o0", "o1", "o2"], idx),
              *([f"v += {pbias}[mm];"] if pbias else []), *epi,
              f"{py}[(nn * {g.m} + mm) * {osp} + i] = v;"]
    helpers = (_device_fn(f"{fn}_a", args, names, sig, body_a, "float")
               + _device_fn(f"{fn}_b", args, names, f"{idx} z, {idx} kk, {idx} j", body_b, "float")
               + _device_fn(f"{fn}_c", args, names, f"{idx} z, {idx} i, {idx} j, float v", body_c))
    return _render(fn, args, names, helpers, osp, mg, kdim, g.n * g.group, idx, tf32,
                   a_rows_fastest=True, b_k_fastest=True)


def _naive_matmul(k: Kernel, fn: str) -> CudaKernel:
    """MatMul outside the template (other dtypes, 1-D operands, batch dims broadcast on both sides): one
    thread per output element, a plain dot product. Never with an epilogue (fusion asks the template)."""
    mm = k.gemm
    assert mm is not None and len(k.nodes) == 1
    a, b, out = mm.inputs[0], mm.inputs[1], mm.outputs[0]
    t = dtypes.c_type(out.dtype)
    if t not in ("float", "double", "int32_t", "int64_t", "uint32_t", "uint64_t"):
        raise Unsupported(f"MatMul on {out.dtype}")
    args, names, ptrs = external(k)
    idx = index_type(k)
    a2 = (1, *a.shape) if len(a.shape) == 1 else tuple(a.shape)
    b2 = (*b.shape, 1) if len(b.shape) == 1 else tuple(b.shape)
    m, kk, n = a2[-2], a2[-1], b2[-1]
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    total = int(np.prod(batch)) * m * n

    def offset(shape: tuple[int, ...], per: int) -> str:
        """The offset of batch entry bi in an operand with batch dims ``shape``, broadcast to ``batch``."""
        s = (1,) * (len(batch) - len(shape)) + tuple(shape)
        terms = [f"((bi / {int(np.prod(batch[d + 1:]))}) % {batch[d]}) * {int(np.prod(s[d + 1:])) * per}"
                 for d in range(len(batch)) if s[d] != 1 and batch[d] != 1]
        return " + ".join(terms) or "0"

    acc = "double" if t == "double" else t if t != "float" else "float"
    dot = ([f"for ({idx} p = 0; p < {kk}; p++) s += ({acc}){ptrs[id(a)]}[ao + i * {kk} + p] * "
            f"({acc}){ptrs[id(b)]}[bo + p * {n} + j];"] if kk else [])
    lines = [f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))}) {{",
             f"  for ({idx} e = ({idx})blockIdx.x * {THREADS} + threadIdx.x; e < {total}; "
             f"e += ({idx})gridDim.x * {THREADS}) {{",
             f"    const {idx} bi = e / {m * n}, i = (e / {n}) % {m}, j = e % {n}; (void)bi;",
             f"    const {idx} ao = {offset(a2[:-2], m * kk)}, bo = {offset(b2[:-2], kk * n)}; (void)ao; (void)bo;",
             f"    {acc} s = 0;", *("    " + ln for ln in dot),
             f"    {ptrs[id(out)]}[e] = ({t})s;", "  }", "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(min(ceil_div(max(total, 1), THREADS), MAX_BLOCKS)))
