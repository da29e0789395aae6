"""Row kernels on the GPU: Softmax, LogSoftmax and LayerNormalization, one warp per row (a row of n
elements spaced ``inner`` apart); the row's max and sums are combined by warp shuffles in a fixed order.
LayerNormalization takes its fused input chain (passes/fuse.py: a GELU, a bias, a residual add) as a
device function of (row, k), so the chain's output is never written. Pooling (MaxPool, AveragePool) is one
thread per output.
"""

from __future__ import annotations

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
)
from aotc.codegen.loops import Emitter, identity_map
from aotc.ir import dtypes
from aotc.ir.graph import Value
from aotc.ir.kernel import Kernel
from aotc.ops import norm as norm_ops
from aotc.ops.common import axis_layout, c_literal, norm_axis
from aotc.ops.conv import geometry
from aotc.ops.nn import softmax_layout

WARPS = THREADS // 32


def _warp_sum(v: str) -> str:
    return f"for (int d = 16; d >= 1; d /= 2) {v} += aotc_shfl_xor({v}, d);"


def _nan_max(v: str, m: str) -> str:
    """max(v, m) that keeps a NaN (an associative combine: warp shuffles may apply it in any grouping)."""
    return f"({v} > {m} || {v} != {v}) ? {v} : {m}"


def _float_input(k: Kernel) -> Value:
    """The root's first input, which these kernels take in float32 only."""
    x = k.root.inputs[0]
    if x.dtype != np.float32:
        raise Unsupported(f"{k.root.op} on {x.dtype}")
    return x


def _head(fn: str, args, names) -> str:
    return f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))}) {{"


def _row_start(rows: int, idx: str) -> list[str]:
    return [f"  const {idx} row = ({idx})blockIdx.x * {WARPS} + threadIdx.x / 32;",
            "  const unsigned lane = threadIdx.x % 32;",
            f"  if (row >= {rows}) return; /* whole warps leave */"]


def emit_softmax(k: Kernel, fn: str) -> CudaKernel:
    node = k.root
    if node.outputs[0].dtype != np.float32:
        raise Unsupported(f"{node.op} on {node.outputs[0].dtype}")
    outer, n, inner = softmax_layout(node)
    args, names, _ = external(k)
    idx = index_type(k)
    rows = outer * inner
    log = node.op == "LogSoftmax"
    at = f"base + i * {inner}"
    lines = [_head(fn, args, names), *_row_start(rows, idx),
             f"  const {idx} base = (row / {inner}) * {n * inner} + row % {inner};",
             "  float m = -INFINITY, s = 0.0f;",
             f"  for ({idx} i = lane; i < {n}; i += 32) {{ const float v = in0[{at}]; m = {_nan_max('v', 'm')}; }}",
             f"  for (int d = 16; d >= 1; d /= 2) {{ const float o = aotc_shfl_xor(m, d); m = {_nan_max('o', 'm')}; }}",
             f"  for ({idx} i = lane; i < {n}; i += 32) s += expf(in0[{at}] - m);",
             "  " + _warp_sum("s"),
             (f"  const float log_sum = logf(s);\n  for ({idx} i = lane; i < {n}; i += 32) "
              f"out0[{at}] = (in0[{at}] - m) - log_sum;" if log else
              f"  for ({idx} i = lane; i < {n}; i += 32) out0[{at}] = expf(in0[{at}] - m) / s;"),
             "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))


def _normalize(n: int, idx: str, x: str, y: str, term: str, eps: str) -> list[str]:
    """A warp's row of ``n`` elements: the mean, the variance as the mean of squared deviations (two passes,
    as the C kernels), then ``y = term`` (of v, mean, inv) for each element ``i``; ``x`` reads element i."""
    count = c_literal(float(n), "float")
    return ["  float sum = 0.0f;",
            f"  for ({idx} i = lane; i < {n}; i += 32) sum += {x};",
            "  " + _warp_sum("sum"),
            f"  const float mean = sum / {count};",
            "  float sq = 0.0f;",
            f"  for ({idx} i = lane; i < {n}; i += 32) {{ const float d = {x} - mean; sq += d * d; }}",
            "  " + _warp_sum("sq"),
            f"  const float inv = 1.0f / sqrtf(sq / {count} + {eps});",
            f"  for ({idx} i = lane; i < {n}; i += 32) {{ const float v = {x}; {y} = {term}; }}"]


def emit_channel_norm(k: Kernel, fn: str) -> CudaKernel:
    """InstanceNormalization (a row per (n, c) plane) and GroupNormalization (a row per (n, group))."""
    node = k.root
    x = node.inputs[0]
    if x.dtype != np.float32 or 0 in x.shape or len(x.shape) < 3:
        raise Unsupported(f"{node.op} on {x.dtype}{list(x.shape)}")
    args, names, ptrs = external(k)
    idx = index_type(k)
    c, spatial = x.shape[1], int(np.prod(x.shape[2:]))
    ps, pb = ptrs[id(node.inputs[1])], ptrs[id(node.inputs[2])]
    if node.op == "InstanceNormalization":
        rows, n, ch = x.shape[0] * c, spatial, f"row % {c}"
    else:
        g = int(node.attr("num_groups"))
        per = c // g
        rows, n = x.shape[0] * g, per * spatial
        # Opset 18 gave one scale/bias per group (the ambiguity opset 21 removed).
        ch = f"row % {g}" if node.attr("_opset", 21) < 21 and node.inputs[1].shape[0] == g else \
            f"(row % {g}) * {per} + i / {spatial}"
    eps = c_literal(float(node.attr("epsilon", 1e-5)), "float")
    pin, pout = ptrs[id(x)], ptrs[id(node.outputs[0])]
    lines = [_head(fn, args, names), *_row_start(rows, idx),
             *_normalize(n, idx, f"{pin}[row * {n} + i]", f"{pout}[row * {n} + i]",
                         f"(v - mean) * inv * {ps}[{ch}] + {pb}[{ch}]", eps), "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))


def emit_layernorm(k: Kernel, fn: str) -> CudaKernel:
    """Mean, then the variance as the mean of squared deviations (two passes, as the CPU kernel), then the
    normalized row times scale plus bias; Mean and InvStdDev outputs when the node has them."""
    node, x = k.root, _float_input(k)
    args, names, ptrs = external(k)
    idx = index_type(k)
    rank, axis = len(x.shape), norm_ops.ln_axis(node)
    n = int(np.prod(x.shape[axis:]))
    rows = int(np.prod(x.shape[:axis]))
    if n == 0 or rows == 0:
        raise Unsupported("LayerNormalization of an empty tensor")
    # The input at (row, k): read from memory, or computed by the fused chain from the row and in-row
    # indices of each dimension.
    em = Emitter(k, ptrs, rank)
    val = em.value(x, identity_map(rank), "body")
    dims = decompose("row", list(x.shape[:axis]), [f"d{d}" for d in range(axis)], idx) + \
        decompose("k", list(x.shape[axis:]), [f"d{d}" for d in range(axis, rank)], idx)
    body = em.render("body", lambda a: affine(a, {d: f"d{d}" for d in range(rank)}))
    ps = ", ".join(params(args, names))
    helper = (f"static __device__ __forceinline__ float {fn}_x({ps}, {idx} row, {idx} k) {{\n"
              + "".join(f"  (void){nm};\n" for nm in names)
              + "".join(f"  {s}\n" for s in dims + body) + f"  return {val};\n}}\n")
    call = f"{fn}_x({', '.join(names)}, row, i)"
    scale, bias = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    sname = ptrs[id(scale)]
    bname = ptrs[id(bias)] if bias is not None else None
    term = f"(v - mean) * inv * {sname}[i % {scale.size}]" + (f" + {bname}[i % {bias.size}]" if bname else "")
    eps = c_literal(float(node.attr("epsilon", 1e-5)), "float")
    outs = [ptrs[id(v)] if v.name else None for v in node.outputs]
    extra = []
    if len(outs) > 1 and outs[1]:
        extra.append(f"{outs[1]}[row] = mean;")
    if len(outs) > 2 and outs[2]:
        extra.append(f"{outs[2]}[row] = inv;")
    lines = [helper + _head(fn, args, names), *_row_start(rows, idx),
             *_normalize(n, idx, call, f"{outs[0]}[row * {n} + i]", term, eps),
             *(f"  if (lane == 0) {{ {e} }}" for e in extra), "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))


def emit_pool(k: Kernel, fn: str) -> CudaKernel:
    """MaxPool (one output, no indices) and AveragePool: one thread per output over its window."""
    node = k.root
    if len(node.outputs) > 1 and node.outputs[1].name:
        raise Unsupported(f"{node.op} with an Indices output")
    _float_input(k)
    if node.attr("ceil_mode", 0) and node.op == "AveragePool":
        raise Unsupported("AveragePool with ceil_mode")
    g = geometry(node)
    args, names, _ = external(k)
    idx = index_type(k)
    total = g.n * g.c * g.out_size
    mx = node.op == "MaxPool"
    count_pad = bool(node.attr("count_include_pad", 0))
    lines = [_head(fn, args, names),
             f"  for ({idx} e = ({idx})blockIdx.x * {THREADS} + threadIdx.x; e < {total}; "
             f"e += ({idx})gridDim.x * {THREADS}) {{",
             f"    const {idx} plane = e / {g.out_size}, pos = e % {g.out_size}; (void)pos;",
             *("    " + s for s in decompose("pos", list(g.out), ["o0", "o1", "o2"], "long long")),
             f"    float acc = {'-INFINITY' if mx else '0.0f'}; int cnt = 0;",
             f"    for (int tap = 0; tap < {g.taps}; tap++) {{",
             *("      " + s for s in decompose("tap", list(g.k), ["t0", "t1", "t2"], "int")),
             *(f"      const long long x{d} = o{d} * {g.s[d]} - {g.pb[d]} + t{d} * {g.d[d]};" for d in range(3)),
             "      if (" + " && ".join(f"x{d} >= 0 && x{d} < {g.inp[d]}" for d in range(3)) + ") {",
             f"        const float v = in0[plane * {g.in_size} + (x0 * {g.inp[1]} + x1) * {g.inp[2]} + x2];",
             "        " + (f"acc = {_nan_max('v', 'acc')};" if mx else "acc += v;"), "        cnt++;",
             "      }",
             "    }",
             "    (void)cnt;",
             f"    out0[e] = {'acc' if mx else f'acc / {float(g.taps)}f' if count_pad else 'acc / (float)cnt'};",
             "  }", "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(min(ceil_div(total, THREADS), MAX_BLOCKS)))


def emit_global_pool(k: Kernel, fn: str) -> CudaKernel:
    """GlobalAveragePool and GlobalMaxPool: one warp per (n, c) plane."""
    node, x = k.root, _float_input(k)
    args, names, _ = external(k)
    idx = index_type(k)
    plane = int(np.prod(x.shape[2:]))
    rows = int(np.prod(x.shape[:2]))
    mx = node.op == "GlobalMaxPool"
    if plane == 0:
        raise Unsupported(f"{node.op} of an empty plane")
    step = (f"acc = {_nan_max('v', 'acc')};" if mx else "acc += v;")
    combine = (f"{{ const float o = aotc_shfl_xor(acc, d); acc = {_nan_max('o', 'acc')}; }}" if mx
               else "acc += aotc_shfl_xor(acc, d);")
    lines = [_head(fn, args, names), *_row_start(rows, idx),
             f"  float acc = {'-INFINITY' if mx else '0.0f'};",
             f"  for ({idx} i = lane; i < {plane}; i += 32) {{ const float v = in0[row * {plane} + i]; {step} }}",
             f"  for (int d = 16; d >= 1; d /= 2) {combine}",
             f"  if (lane == 0) out0[row] = {'acc' if mx else f'acc / {float(plane)}f'};",
             "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))


def emit_arg(k: Kernel, fn: str) -> CudaKernel:
    """ArgMax / ArgMin: one warp per row. Each lane scans its elements in index order, then the lanes'
    (value, index) pairs combine by a total order (a NaN first, then the larger (smaller) value, then the
    lower index, or the higher with select_last_index), so the result is the C kernel's sequential one."""
    node = k.root
    x = node.inputs[0]
    if x.dtype not in (np.float32, np.float64, np.int32, np.int64):
        raise Unsupported(f"{node.op} on {x.dtype}")
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    outer, n, inner = axis_layout(x.shape, axis)
    if n == 0:
        raise Unsupported(f"{node.op} over an empty axis")
    args, names, _ = external(k)
    idx = index_type(k)
    t = dtypes.c_type(x.dtype)
    better = ">" if node.op == "ArgMax" else "<"
    tie = ">" if node.attr("select_last_index", 0) else "<"
    rows = outer * inner
    wins = (f"(vb != vb) ? (va != va ? ib {tie} ia : true) : (va != va) ? false : "
            f"vb {better} va ? true : vb == va && ib {tie} ia")
    lines = [_head(fn, args, names), *_row_start(rows, idx),
             f"  const {idx} base = (row / {inner}) * {n * inner} + row % {inner};",
             f"  {t} va = in0[base]; long long ia = -1;",
             f"  for ({idx} i = lane; i < {n}; i += 32) {{",
             f"    const {t} vb = in0[base + i * {inner}]; const long long ib = (long long)i;",
             f"    if (ia < 0 || {wins}) {{ va = vb; ia = ib; }}",
             "  }",
             "  for (int d = 16; d >= 1; d /= 2) {",
             f"    const {t} vb = aotc_shfl_xor(va, d); const long long ib = aotc_shfl_xor(ia, d);",
             f"    if (ib >= 0 && (ia < 0 || {wins})) {{ va = vb; ia = ib; }}",
             "  }",
             "  if (lane == 0) out0[row] = (int64_t)ia;",
             "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))
