"""ONNX Attention as one fused kernel: one warp per (batch, head, query) row, the row's scores never
written. Lanes split the head dimension: lane l holds q[l + 32u] (scaled) and the output accumulator
acc[l + 32u]; each key's dot product is a butterfly sum over the warp, then an online softmax (running
max m and sum s, the accumulator rescaled when m grows) takes the key's value row. Masked keys (a false
boolean mask, an additive -inf, is_causal beyond the query) are skipped, as the C kernel skips them; a
row with no key left is zeros.

Supported: float32 Q, K, V (3-D with q_num_heads/kv_num_heads, or 4-D), grouped kv heads, attn_mask
(bool or float, broadcast), is_causal, scale, softcap, the left/right windows, nonpad_kv_seqlen, and
past key/value with the present outputs (the past rows, then the new ones: copied by the same kernel's
threads in a grid-stride loop before the rows). Not here: the qk_matmul output (the C kernel has it).
"""

from __future__ import annotations

import numpy as np

from aotc.codegen.cuda.common import THREADS, CudaKernel, Unsupported, ceil_div, external, index_type, params
from aotc.ir.kernel import Kernel
from aotc.ops.attention import _Geom
from aotc.ops.common import c_literal, optional_input

WARPS = THREADS // 32
MAX_HEAD = 256  # head sizes up to 8 values per lane


def emit_attention(k: Kernel, fn: str) -> CudaKernel:
    node = k.root
    g = _Geom(node)
    q, kk, v = node.inputs[0], node.inputs[1], node.inputs[2]
    mask = optional_input(node, 3)
    if q.dtype != np.float32 or (mask is not None and mask.dtype not in (np.float32, np.bool_)):
        raise Unsupported("Attention on other dtypes than float32")
    if len(node.outputs) > 3 and node.outputs[3].name:
        raise Unsupported("Attention with its qk_matmul output")
    if max(g.d, g.dv) > MAX_HEAD or g.past < 0:
        raise Unsupported(f"Attention with a head size above {MAX_HEAD} or an empty past")
    args, names, ptrs = external(k)
    idx = index_type(k)
    pq, pk, pv, py = ptrs[id(q)], ptrs[id(kk)], ptrs[id(v)], ptrs[id(node.outputs[0])]
    past_k, past_v, nonpad = optional_input(node, 4), optional_input(node, 5), optional_input(node, 6)
    p = g.past
    rows = g.b * g.hq * g.sq
    uq, uv = ceil_div(g.d, 32), ceil_div(g.dv, 32)
    scale = node.attr("scale")
    scale = 1 / np.sqrt(g.d) if scale is None else float(scale)
    ss = c_literal(float(np.float32(np.sqrt(scale))), "float")  # Q and K each scaled by sqrt(scale), as the C kernel

    def row(h: str, s: str, heads: int, seq: int, width: int) -> str:
        if g.rank3:
            return f"(b * {seq} + {s}) * {heads * width} + {h} * {width}"
        return f"((b * {heads} + {h}) * {seq} + {s}) * {width}"

    kstride, vstride = (g.hkv * g.d, g.hkv * g.dv) if g.rank3 else (g.d, g.dv)
    krow, vrow = f"kb + j * {kstride}", f"vb + j * {vstride}"
    if p:  # key j < p comes from the past
        krow = f"j < {p} ? {ptrs[id(past_k)]} + ((b * {g.hkv} + gk) * {p} + j) * {g.d} : kb + (j - {p}) * {kstride}"
        vrow = f"j < {p} ? {ptrs[id(past_v)]} + ((b * {g.hkv} + gk) * {p} + j) * {g.dv} : vb + (j - {p}) * {vstride}"
    softcap = float(node.attr("softcap", 0.0))
    cap = c_literal(softcap, "float")
    lines = [f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))}) {{"]
    # present_key / present_value: the past rows, then the new ones.
    for i, (src, past, width) in enumerate(((kk, past_k, g.d), (v, past_v, g.dv)), start=1):
        if i >= len(node.outputs) or not node.outputs[i].name:
            continue
        total = g.b * g.hkv * g.t * width
        new = ptrs[id(src)] + "[" + row("gg", f"(j - {p})" if p else "j", g.hkv, g.skv, width) + " + c]"
        lines += [f"  for ({idx} e = ({idx})blockIdx.x * {THREADS} + threadIdx.x; e < {total}; "
                  f"e += ({idx})gridDim.x * {THREADS}) {{",
                  f"    const {idx} c = e % {width}, j = (e / {width}) % {g.t}, gg = (e / {width * g.t}) % {g.hkv}, "
                  f"b = e / {width * g.t * g.hkv};",
                  f"    {ptrs[id(node.outputs[i])]}[e] = "
                  + (f"j < {p} ? {ptrs[id(past)]}[((b * {g.hkv} + gg) * {p} + j) * {width} + c] : " if p else "")
                  + f"{new};", "  }"]
    lines += [f"  const {idx} r = ({idx})blockIdx.x * {WARPS} + threadIdx.x / 32;",
             "  const unsigned lane = threadIdx.x % 32;",
             f"  if (r >= {rows}) return; /* whole warps leave */",
             f"  const {idx} b = r / {g.hq * g.sq}, h = (r / {g.sq}) % {g.hq}, i = r % {g.sq};",
             f"  const {idx} gk = h / {g.hq // g.hkv}; /* the kv head of query head h */",
             f"  float qv[{uq}], acc[{uv}];",
             f"  for (int u = 0; u < {uq}; u++) {{ const unsigned c = lane + 32 * u; "
             f"qv[u] = c < {g.d} ? {pq}[{row('h', 'i', g.hq, g.sq, g.d)} + c] * {ss} : 0.0f; }}",
             f"  for (int u = 0; u < {uv}; u++) acc[u] = 0.0f;",
             "  float m = -INFINITY, s = 0.0f;",
             f"  const float *kb = {pk} + {row('gk', '0', g.hkv, g.skv, g.d)};",
             f"  const float *vb = {pv} + {row('gk', '0', g.hkv, g.skv, g.dv)};"]
    # The absolute position of query i: keys after it are causal-masked, the windows are relative to it.
    left, right = int(node.attr("left_window_size", -1)), int(node.attr("right_window_size", -1))
    causal = bool(node.attr("is_causal", 0))
    if nonpad is not None:
        clamp = "4611686018427387904LL"  # +-2^62, as the C kernel: window differences never overflow
        lines += [f"  long long len = (long long){ptrs[id(nonpad)]}[b];",
                  f"  len = len < -{clamp} ? -{clamp} : len > {clamp} ? {clamp} : len;"]
    off = str(p) if p else ("len - " + str(g.sq) if nonpad is not None else "0")
    if causal or left >= 0 or right >= 0 or nonpad is not None:
        lines.append(f"  const long long pos = (long long)i + {off}; (void)pos;")
    lines.append(f"  for ({idx} j = 0; j < {g.t}; j++) {{")
    conds = []
    if causal:
        conds.append("(long long)j > pos")
    if left >= 0:
        conds.append(f"pos - (long long)j > {left}LL")
    if right >= 0:
        conds.append(f"(long long)j - pos > {right}LL")
    if nonpad is not None:
        conds.append("(long long)j >= len")
    if conds:
        lines.append(f"    if ({' || '.join(conds)}) continue; /* masked by position */")
    if mask is not None:
        ms = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
        tm = ms[3]
        st = [ms[1] * ms[2] * tm if ms[0] > 1 else 0, ms[2] * tm if ms[1] > 1 else 0, tm if ms[2] > 1 else 0]
        at = " + ".join([f"{n} * {ix}" for n, ix in zip(st, ("b", "h", "i"), strict=True) if n] + ["j"])
        if tm < g.t:
            lines.append(f"    if (j >= {tm}) break; /* keys past the mask's length are masked */")
        pm = ptrs[id(mask)]
        value = f"{pm}[{at}] ? 0.0f : -INFINITY" if mask.dtype == np.bool_ else f"{pm}[{at}]"
        lines.append(f"    const float bias = {value};")
    else:
        lines.append("    const float bias = 0.0f;")
    lines += ["    if (bias == -INFINITY) continue;",
              "    float dot = 0.0f;",
              f"    const float *kr = {krow};",
              f"    for (int u = 0; u < {uq}; u++) {{ const unsigned c = lane + 32 * u; "
              f"if (c < {g.d}) dot += qv[u] * (kr[c] * {ss}); }}",
              "    for (int d = 16; d >= 1; d /= 2) dot += aotc_shfl_xor(dot, d);",
              *([f"    dot = {cap} * tanhf(dot / {cap});"] if softcap > 0 else []),
              "    const float x = dot + bias;",
              "    if (x == -INFINITY) continue;",
              "    const float mn = (x > m || x != x) ? x : m;",
              "    const float keep = m == mn ? 1.0f : expf(m - mn), p = expf(x - mn);",
              "    s = s * keep + p;",
              f"    const float *vr = {vrow};",
              f"    for (int u = 0; u < {uv}; u++) {{ const unsigned c = lane + 32 * u; "
              f"acc[u] = acc[u] * keep + (c < {g.dv} ? p * vr[c] : 0.0f); }}",
              "    m = mn;",
              "  }",
              "  const float den = s == 0.0f ? 1.0f : s;",
              f"  for (int u = 0; u < {uv}; u++) {{ const unsigned c = lane + 32 * u; "
              f"if (c < {g.dv}) {py}[{row('h', 'i', g.hq, g.sq, g.dv)} + c] = acc[u] / den; }}",
              "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(ceil_div(rows, WARPS)))
