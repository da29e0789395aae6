"""Integer (quantized) ops: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv,
DynamicQuantizeLinear.

Products of zero-point-shifted 8-bit values are summed in uint32 arithmetic, which wraps like the
int32 accumulators of onnxruntime instead of overflowing (undefined behaviour for signed types);
the sum is read back as int32. Requantization follows the ONNX reference: the multiplier
``a_scale * b_scale / y_scale`` is rounded to the scales' type, the product with the accumulator is
taken in double, rounded half to even (nearbyint in the default rounding mode) and saturated.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops import conv as conv_ops
from aotc.ops import int8_conv  # noqa: F401 - registers aotc.QLinearConv, what QLinearConv becomes
from aotc.ops.common import aligned_inputs, broadcast_shapes, optional_input
from aotc.ops.registry import OpDef, register

_INT8 = (np.int8, np.uint8)


def _int8(node: Node, *idx: int) -> None:
    for i in idx:
        v = optional_input(node, i)
        if v is not None and v.dtype not in _INT8:
            raise AotcError(f"{node.op} node {node.name!r}: input {i} has dtype {v.dtype}; int8/uint8 expected")


def _param(node: Node, i: int, name: str | None, along: str, n: int) -> str:
    """A C expression for a scale or zero point: absent (0), one value, or one per ``along`` (length n)."""
    v = optional_input(node, i)
    if v is None or name is None:
        return "0"
    if v.size == 1:
        return f"{name}[0]"
    if v.size == n and len([d for d in v.shape if d != 1]) == 1:
        return f"{name}[{along}]"
    raise AotcError(f"{node.op} node {node.name!r}: input {i} of shape {list(v.shape)} is neither a scalar "
                    f"nor a vector of length {n}")


def _requant(node: Node, dst: str, acc: str, scales: tuple[str, str, str], yzp: str, ctype: str) -> str:
    """A C statement storing the saturated, requantized int32 accumulator ``acc`` into ``dst``."""
    sa, sb, sy = scales
    st = dtypes.c_type(node.inputs[1].dtype)  # type: ignore[union-attr]
    lo, hi = (-128, 127) if ctype == "int8_t" else (0, 255)
    if node.attr("_relu", 0):  # a Relu before the QuantizeLinear (aotc/passes/quantized.py)
        lo = f"({ctype})({yzp})"
    return (f"{{ const double q = nearbyint((double){acc} * (double)({st})(({st})({sa} * {sb}) / {sy}) "
            f"+ (double)({yzp})); {dst} = ({ctype})(q >= {lo} ? (q <= {hi} ? q : {hi}) : {lo}); }}")


# -- MatMulInteger / QLinearMatMul ------------------------------------------------------------------
def _mm_shapes(a: tuple[int, ...], b: tuple[int, ...], node: Node):
    """(batch, M, K, N, output shape, A's batch dims, B's batch dims) with numpy matmul rules."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise AotcError(f"{node.op} node {node.name!r}: shapes {list(a)} and {list(b)} do not multiply")
    batch = broadcast_shapes(a2[:-2], b2[:-2], where=f"{node.op} node {node.name!r}")
    out = (*batch, *([a2[-2]] if len(a) > 1 else []), *([b2[-1]] if len(b) > 1 else []))
    return batch, a2[-2], a2[-1], b2[-1], out, a2[:-2], b2[:-2]


def _mm_operands(node: Node) -> tuple[Value, Value]:
    ia, ib = (0, 3) if node.op == "QLinearMatMul" else (0, 1)
    a, b = node.inputs[ia], node.inputs[ib]
    assert a is not None and b is not None
    return a, b


def _out_dtype(node: Node, x: Value) -> np.dtype:
    """Checks the 8-bit operands; the output type: the QLinear ops' output zero point's (else the
    input's), int32 for MatMulInteger and ConvInteger."""
    if node.op.startswith("QLinear"):
        _int8(node, 0, 2, 3, 5, 7)
        yzp = optional_input(node, 7)
        return yzp.dtype if yzp is not None else x.dtype
    _int8(node, 0, 1, 2, 3)
    return np.dtype(np.int32)


def _mm_infer(node: Node):
    a, b = _mm_operands(node)
    return [(_mm_shapes(a.shape, b.shape, node)[4], _out_dtype(node, a))]


def _batch_offset(var: str, batch: tuple[int, ...], shape: tuple[int, ...], per: int) -> str:
    """The element offset of batch ``var`` (flat over ``batch``) in an operand with batch dims ``shape``
    (right-aligned, broadcast where 1), ``per`` elements per matrix."""
    terms = []
    lead = len(batch) - len(shape)
    for k, extent in enumerate(shape):
        if extent == 1:
            continue
        inner = int(np.prod(batch[lead + k + 1:]))
        step = int(np.prod(shape[k + 1:])) * per
        terms.append(f"({var} / {inner} % {extent}) * {step}")
    return " + ".join(terms) or "0"


def _mm_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    a, b = _mm_operands(node)
    batch, m, k, n, _, abatch, bbatch = _mm_shapes(a.shape, b.shape, node)
    nb = int(np.prod(batch))
    if nb * m * n == 0:
        return "/* empty */"
    names = aligned_inputs(node, ins)
    q = node.op == "QLinearMatMul"
    ia, ib, iazp, ibzp = (0, 3, 2, 5) if q else (0, 1, 2, 3)
    pa, pb = names[ia], names[ib]
    azp = _param(node, iazp, names[iazp] if len(names) > iazp else None, "i", m)
    bzp = _param(node, ibzp, names[ibzp] if len(names) > ibzp else None, "j", n)
    if q:
        scales = (_param(node, 1, names[1], "i", m), _param(node, 4, names[4], "j", n),
                  _param(node, 6, names[6], "0", 1))
        yzp = _param(node, 7, names[7] if len(names) > 7 else None, "0", 1)
        acc = f"(int32_t)(acc[j] + (uint32_t){names[8]}[j])" if len(names) > 8 else "(int32_t)acc[j]"
        store = _requant(node, f"{outs[0]}[t * {n} + j]", acc, scales, yzp, ctype)
    else:
        store = f"{outs[0]}[t * {n} + j] = (int32_t)acc[j];"
    return "\n".join([
        f"for (size_t t = task; t < {nb * m}; t += ntasks) {{",
        f"  const size_t bi = t / {m}, i = t % {m}; (void)bi; (void)i;",
        f"  const {dtypes.c_type(a.dtype)} *ar = {pa} + {_batch_offset('bi', batch, abatch, m * k)} + i * {k};",
        f"  const {dtypes.c_type(b.dtype)} *bm = {pb} + {_batch_offset('bi', batch, bbatch, k * n)};",
        f"  uint32_t acc[{n}];",
        f"  for (size_t j = 0; j < {n}; j++) acc[j] = 0;",
        f"  for (size_t p = 0; p < {k}; p++) {{",
        f"    const int32_t av = (int32_t)ar[p] - (int32_t){azp};",
        f"    for (size_t j = 0; j < {n}; j++) acc[j] += (uint32_t)(av * ((int32_t)bm[p * {n} + j] - (int32_t){bzp}));",
        "  }",
        f"  for (size_t j = 0; j < {n}; j++) {store}",
        "}"])


# A QLinearMatMul that aotc/passes/quantized.py made from a QDQ Gemm has the Gemm's int32 bias as a
# 9th input, and ``_relu`` where a Relu came before the QuantizeLinear.
register(OpDef("MatMulInteger", "kernel", _mm_infer, emit=_mm_emit))
register(OpDef("QLinearMatMul", "kernel", _mm_infer, emit=_mm_emit))


# -- ConvInteger / QLinearConv: a direct loop ------------------------------------------------------------
def qconv_geometry(node: Node) -> conv_ops.Geometry:
    x, w = node.inputs[0], node.inputs[3 if node.op == "QLinearConv" else 1]
    assert x is not None and w is not None
    # The geometry rules are Conv's: ask conv.py about the same data and weights.
    return conv_ops.geometry(Node("Conv", [x, w], [], node.attrs, node.name))


def _conv_infer(node: Node):
    x = node.inputs[0]
    assert x is not None
    dt = _out_dtype(node, x)
    g = qconv_geometry(node)
    nd = len(x.shape) - 2
    return [((g.n, g.m, *g.out[3 - nd:]), dt)]


def _conv_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    g = qconv_geometry(node)
    names = aligned_inputs(node, ins)
    q = node.op == "QLinearConv"
    ix, iw, ixzp, iwzp = (0, 3, 2, 5) if q else (0, 1, 2, 3)
    xv, wv = node.inputs[ix], node.inputs[iw]
    assert xv is not None and wv is not None
    xzp = _param(node, ixzp, names[ixzp] if len(names) > ixzp else None, "0", 1)
    wzp = _param(node, iwzp, names[iwzp] if len(names) > iwzp else None, "c", g.m)
    if g.n * g.m * g.out_size == 0:
        return "/* empty */"
    cg, mg = g.c // g.group, g.m // g.group
    idim, ih_, iw_ = g.inp
    if q:
        bias = names[8] if len(names) > 8 else None
        scales = (_param(node, 1, names[1], "0", 1), _param(node, 4, names[4], "c", g.m),
                  _param(node, 6, names[6], "0", 1))
        yzp = _param(node, 7, names[7] if len(names) > 7 else None, "0", 1)
        acc = f"((int32_t)v + {bias}[c])" if bias else "(int32_t)v"
        store = _requant(node, "yo[s]", acc, scales, yzp, ctype)
    else:
        store = "yo[s] = (int32_t)v;"
    xt, wt = dtypes.c_type(xv.dtype), dtypes.c_type(wv.dtype)
    return "\n".join([
        f"for (size_t t = task; t < {g.n * g.m}; t += ntasks) {{",
        f"  const size_t n = t / {g.m}, c = t % {g.m}, grp = c / {mg};",
        f"  const {xt} *xg = {names[ix]} + (n * {g.c} + grp * {cg}) * {g.in_size};",
        f"  const {wt} *wm = {names[iw]} + c * {cg * g.taps};",
        f"  const int32_t xz = (int32_t){xzp}, wz = (int32_t){wzp};",
        f"  {ctype} *yo = {outs[0]} + t * {g.out_size};",
        f"  for (size_t s = 0; s < {g.out_size}; s++) {{",
        f"    const ptrdiff_t d0 = (ptrdiff_t)(s / {g.out[1] * g.out[2]}) * {g.s[0]} - {g.pb[0]};",
        f"    const ptrdiff_t h0 = (ptrdiff_t)(s / {g.out[2]} % {g.out[1]}) * {g.s[1]} - {g.pb[1]};",
        f"    const ptrdiff_t w0 = (ptrdiff_t)(s % {g.out[2]}) * {g.s[2]} - {g.pb[2]};",
        "    uint32_t v = 0;",
        f"    for (size_t ci = 0; ci < {cg}; ci++)",
        f"      for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++) {{",
        f"        const ptrdiff_t id = d0 + kd * {g.d[0]}; if (id < 0 || id >= {idim}) continue;",
        f"        for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++) {{",
        f"          const ptrdiff_t ih = h0 + kh * {g.d[1]}; if (ih < 0 || ih >= {ih_}) continue;",
        f"          for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
        f"            const ptrdiff_t iw = w0 + kw * {g.d[2]}; if (iw < 0 || iw >= {iw_}) continue;",
        f"            const int32_t xv = (int32_t)xg[ci * {g.in_size} + (id * {ih_} + ih) * {iw_} + iw] - xz;",
        f"            const int32_t wv = (int32_t)wm[((ci * {g.k[0]} + kd) * {g.k[1]} + kh) * {g.k[2]} + kw] - wz;",
        "            v += (uint32_t)(xv * wv);",
        "          }", "        }", "      }",
        f"    {store}",
        "  }", "}"])


register(OpDef("ConvInteger", "kernel", _conv_infer, emit=_conv_emit))
register(OpDef("QLinearConv", "kernel", _conv_infer, emit=_conv_emit))


# -- DynamicQuantizeLinear: scale and zero point from the data's range, then uint8 ---------------------
def _dql_infer(node: Node):
    x = node.inputs[0]
    assert x is not None
    if x.dtype != np.float32:
        raise AotcError(f"DynamicQuantizeLinear node {node.name!r}: dtype {x.dtype} not supported")
    u8 = np.dtype(np.uint8)
    return [(x.shape, u8), ((), np.dtype(np.float32)), ((), u8)][:len(node.outputs)]


def _dql_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None
    n = x.size
    scale = outs[1] if len(outs) > 1 else None
    zp = outs[2] if len(outs) > 2 else None
    # One task: every output depends on the whole input's range.
    return "\n".join([
        "if (task != 0) return;",
        "float mx = 0, mn = 0;",
        f"for (size_t i = 0; i < {n}; i++) {{ const float v = {ins[0]}[i]; mx = v > mx ? v : mx; "
        "mn = v < mn ? v : mn; }",
        "const float sc = (mx == mn ? 1.0f : mx - mn) / 255.0f;",
        "float z = 0 - mn / sc;",
        "z = nearbyintf(z >= 0 ? (z <= 255 ? z : 255) : 0);",
        f"for (size_t i = 0; i < {n}; i++) {{",
        f"  const float q = nearbyintf({ins[0]}[i] / sc) + z;",
        f"  {outs[0]}[i] = (uint8_t)(q >= 0 ? (q <= 255 ? q : 255) : 0);",
        "}",
        f"{scale}[0] = sc;" if scale else "",
        f"{zp}[0] = (uint8_t)z;" if zp else ""])


register(OpDef("DynamicQuantizeLinear", "kernel", _dql_infer, emit=_dql_emit))
