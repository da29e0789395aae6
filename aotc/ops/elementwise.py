"""Elementwise ops: each is a C expression over its (broadcast) inputs, fused into loop kernels."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node
from aotc.ops.common import FLOAT_CTYPES, broadcast_shapes, c_literal, highest, lowest
from aotc.ops.registry import OpDef, register

ExprFn = Callable[[Node, list[str], str], str]

# Vectorizable float32 versions live in runtime/aotc_math.h; double falls back to libm.
_RUNTIME_F32 = {"exp": "aotc_expf", "log": "aotc_logf", "tanh": "aotc_tanhf", "erf": "aotc_erff",
                "sigmoid": "aotc_sigmoidf"}


def math_fn(name: str, ctype: str) -> str:
    if ctype == "float":
        return _RUNTIME_F32.get(name, name + "f")
    return name


def _infer(out_dtype: Callable[[Node], np.dtype] | None = None):
    def infer(node: Node):
        ins = [v for v in node.inputs if v is not None]
        shape = broadcast_shapes(*(v.shape for v in ins), where=f"{node.op} node {node.name!r}")
        dt = out_dtype(node) if out_dtype else ins[0].dtype
        return [(shape, dt)]
    return infer


def _bool(_node: Node) -> np.dtype:
    return np.dtype(np.bool_)


def ew(name: str, expr: ExprFn, out_dtype: Callable[[Node], np.dtype] | None = None) -> None:
    register(OpDef(name, "elementwise", _infer(out_dtype), expr=expr))


def _f(template: str) -> ExprFn:
    """An expression from a format string over inputs a, b, c and the C type t."""
    def expr(_node: Node, x: list[str], t: str) -> str:
        names = dict(zip("abc", x, strict=False))
        return template.format(t=t, **names)
    return expr


def _attr_f(attr: str, default: float) -> Callable[[Node, str], str]:
    return lambda node, t: c_literal(node.attr(attr, default), t)


# -- arithmetic -------------------------------------------------------------------------------
ew("Add", _f("({a} + {b})"))
ew("Sub", _f("({a} - {b})"))
ew("Mul", _f("({a} * {b})"))
ew("Div", _f("({a} / {b})"))
ew("Neg", _f("(-{a})"))
ew("Abs", lambda n, x, t: f"fabs{'f' if t == 'float' else ''}({x[0]})" if t in ("float", "double")
   else f"({x[0]} < 0 ? ({t})-{x[0]} : {x[0]})")
ew("Reciprocal", lambda n, x, t: f"({c_literal(1, t)} / {x[0]})")
ew("Sqrt", lambda n, x, t: f"{math_fn('sqrt', t)}({x[0]})")
ew("Exp", lambda n, x, t: f"{math_fn('exp', t)}({x[0]})")
ew("Log", lambda n, x, t: f"{math_fn('log', t)}({x[0]})")
ew("Tanh", lambda n, x, t: f"{math_fn('tanh', t)}({x[0]})")


def _sigmoid(_node: Node, x: list[str], t: str) -> str:
    if t == "float":
        return f"aotc_sigmoidf({x[0]})"
    # libm has no sigmoid; the same split as aotc_sigmoidf keeps both tails accurate (NaN stays NaN).
    return f"({x[0]} >= 0 ? 1 / (1 + exp(-{x[0]})) : exp({x[0]}) / (1 + exp({x[0]})))"


ew("Sigmoid", _sigmoid)
ew("Erf", lambda n, x, t: f"{math_fn('erf', t)}({x[0]})")
ew("Sin", lambda n, x, t: f"{math_fn('sin', t)}({x[0]})")
ew("Cos", lambda n, x, t: f"{math_fn('cos', t)}({x[0]})")
ew("Floor", lambda n, x, t: f"{math_fn('floor', t)}({x[0]})")
ew("Ceil", lambda n, x, t: f"{math_fn('ceil', t)}({x[0]})")
ew("Round", lambda n, x, t: f"{math_fn('rint', t)}({x[0]})")  # ties to even, as ONNX asks
ew("Sign", lambda n, x, t: f"({x[0]} > 0 ? {c_literal(1, t)} : ({x[0]} < 0 ? {c_literal(-1, t)} : {x[0]}))")


def _pow(node: Node, x: list[str], t: str) -> str:
    e = node.inputs[1]
    if e is not None and e.is_const and e.size == 1 and t in FLOAT_CTYPES:
        k = float(e.const.reshape(-1)[0])
        special = {1.0: "{a}", 2.0: "({a} * {a})", 3.0: "({a} * {a} * {a})", 0.5: "sqrt{s}({a})",
                   -1.0: "({one} / {a})", 0.0: "{one}"}
        if k in special:
            return special[k].format(a=x[0], s="f" if t == "float" else "", one=c_literal(1, t))
    if t in FLOAT_CTYPES:
        return f"{math_fn('pow', t)}({x[0]}, ({t}){x[1]})"
    return f"({t})pow((double){x[0]}, (double){x[1]})"


ew("Pow", _pow)


def _variadic(op: str) -> ExprFn:
    def expr(node: Node, x: list[str], t: str) -> str:
        acc = x[0]
        for y in x[1:]:
            if op == "+":
                acc = f"({acc} + {y})"
            else:  # NaN propagates, as in numpy and onnxruntime (integers have none)
                nan = f"{acc} != {acc} || " if t in FLOAT_CTYPES else ""
                acc = f"(({nan}{acc} {'>' if op == 'max' else '<'} {y}) ? {acc} : {y})"
        if node.op == "Mean":
            acc = f"({acc} / {c_literal(len(x), t)})"
        return acc
    return expr


ew("Sum", _variadic("+"))
ew("Mean", _variadic("+"))
ew("Max", _variadic("max"))
ew("Min", _variadic("min"))

# -- activations --------------------------------------------------------------------------------
ew("Relu", lambda n, x, t: _clamp(x[0], c_literal(0, t), None, t))  # keeps NaN and -0
ew("LeakyRelu", lambda n, x, t: f"({x[0]} < 0 ? {_attr_f('alpha', 0.01)(n, t)} * {x[0]} : {x[0]})")
ew("PRelu", _f("({a} < 0 ? {b} * {a} : {a})"))
ew("Elu", lambda n, x, t:
   f"({x[0]} < 0 ? {_attr_f('alpha', 1.0)(n, t)} * ({math_fn('exp', t)}({x[0]}) - 1) : {x[0]})")
ew("Selu", lambda n, x, t:
   f"({_attr_f('gamma', 1.05070102214813232421875)(n, t)} * ({x[0]} <= 0 ? "
   f"{_attr_f('alpha', 1.67326319217681884765625)(n, t)} * ({math_fn('exp', t)}({x[0]}) - 1) : {x[0]}))")
ew("Celu", lambda n, x, t:
   f"({x[0]} < 0 ? {_attr_f('alpha', 1.0)(n, t)} * ({math_fn('exp', t)}({x[0]} / "
   f"{_attr_f('alpha', 1.0)(n, t)}) - 1) : {x[0]})")


# runtime/aotc_math.h: each bound of a float clamp is one max or min instruction.
_CLAMP = {"float": ("aotc_clamp_lof", "aotc_clamp_hif"), "double": ("aotc_clamp_lo", "aotc_clamp_hi")}


def _clamp(e: str, lo: str | None, hi: str | None, t: str) -> str:
    # Clamp below, then clamp that (as Clip does): both comparisons always run, which compilers turn
    # into vector selects more readily than the nested form's compare on one branch. NaN stays NaN.
    if lo is not None:
        e = f"{_CLAMP[t][0]}({e}, {lo})" if t in _CLAMP else f"({e} < {lo} ? {lo} : {e})"
    if hi is not None:
        e = f"{_CLAMP[t][1]}({e}, {hi})" if t in _CLAMP else f"({e} > {hi} ? {hi} : {e})"
    return e


def _clamp01(e: str, t: str) -> str:
    return _clamp(e, c_literal(0, t), c_literal(1, t), t)


ew("HardSigmoid", lambda n, x, t:
   _clamp01(f"({_attr_f('alpha', 0.2)(n, t)} * {x[0]} + {_attr_f('beta', 0.5)(n, t)})", t))
ew("HardSwish", lambda n, x, t:
   f"({x[0]} * {_clamp01(f'({x[0]} * {c_literal(1 / 6, t)} + {c_literal(0.5, t)})', t)})")
ew("Softplus", lambda n, x, t:
   f"({x[0]} > 20 ? {x[0]} : {math_fn('log', t)}(1 + {math_fn('exp', t)}({x[0]})))")
ew("Softsign", lambda n, x, t: f"({x[0]} / (1 + ({x[0]} < 0 ? -{x[0]} : {x[0]})))")
ew("ThresholdedRelu", lambda n, x, t: f"({x[0]} > {_attr_f('alpha', 1.0)(n, t)} ? {x[0]} : 0)")
ew("Shrink", lambda n, x, t:
   f"({x[0]} < -{_attr_f('lambd', 0.5)(n, t)} ? {x[0]} + {_attr_f('bias', 0.0)(n, t)} : "
   f"({x[0]} > {_attr_f('lambd', 0.5)(n, t)} ? {x[0]} - {_attr_f('bias', 0.0)(n, t)} : 0))")


def _gelu(node: Node, x: list[str], t: str) -> str:
    tanh = node.attr("approximate", "none") == "tanh"
    if t == "float":  # runtime/aotc_math.h: one rational (erf form) or one sigmoid (tanh form)
        return f"{'aotc_gelu_tanhf' if tanh else 'aotc_geluf'}({x[0]})"
    if tanh:
        inner = f"({c_literal(0.7978845608028654, t)} * ({x[0]} + {c_literal(0.044715, t)} * {x[0]} * {x[0]} * {x[0]}))"
        return f"({c_literal(0.5, t)} * {x[0]} * (1 + {math_fn('tanh', t)}({inner})))"
    return f"({c_literal(0.5, t)} * {x[0]} * (1 + {math_fn('erf', t)}({x[0]} * {c_literal(0.7071067811865476, t)})))"


ew("Gelu", _gelu)


def _clip(node: Node, x: list[str], t: str) -> str:
    e = x[0]
    lo = x[1] if len(x) > 1 and node.inputs[1] is not None else None
    hi = x[2] if len(x) > 2 and node.inputs[2] is not None else None
    if "min" in node.attrs:
        lo = c_literal(node.attrs["min"], t)
    if "max" in node.attrs:
        hi = c_literal(node.attrs["max"], t)
    return _clamp(e, lo, hi, t)


def _clip_infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    return [(x.shape, x.dtype)]


register(OpDef("Clip", "elementwise", _clip_infer, expr=_clip))

# -- comparisons and logic ------------------------------------------------------------------------
def _equal(node: Node, x: list[str], _t: str) -> str:
    # String elements are pointers: equal strings are equal bytes, not equal addresses.
    if dtypes.is_string(node.inputs[0].dtype):
        return f"(strcmp({x[0]}, {x[1]}) == 0)"
    return f"({x[0]} == {x[1]})"


ew("Equal", _equal, _bool)
for _name, _op in [("Less", "<"), ("Greater", ">"), ("LessOrEqual", "<="), ("GreaterOrEqual", ">=")]:
    ew(_name, _f("({a} " + _op + " {b})"), _bool)
ew("Not", _f("(!{a})"))
ew("And", _f("({a} && {b})"))
ew("Or", _f("({a} || {b})"))
ew("Xor", _f("({a} != {b})"))
ew("IsNaN", _f("({a} != {a})"), _bool)


def _isinf(node: Node, x: list[str], _t: str) -> str:
    t = dtypes.compute_type(node.inputs[0].dtype)  # ``_t`` is the (bool) output's type
    return (f"(({x[0]} == {highest(t)} && {int(node.attr('detect_positive', 1))}) || "
            f"({x[0]} == {lowest(t)} && {int(node.attr('detect_negative', 1))}))")


ew("IsInf", _isinf, _bool)
ew("Where", _f("({a} ? {b} : {c})"), lambda n: n.inputs[1].dtype)

# -- type conversion and copies ---------------------------------------------------------------------


def _cast(node: Node, x: list[str], t: str) -> str:
    dst = node.outputs[0].dtype
    if dtypes.emulated(dst) is not None:
        return dtypes.load(dst, _narrow(node, x[0], node.inputs[0].dtype, dst))
    if t == "_Bool":
        return f"({x[0]} != 0)"
    src = dtypes.compute_type(node.inputs[0].dtype)
    if src in FLOAT_CTYPES and t in _CVT_WIDTH:  # no undefined behaviour for NaN, inf, out of range
        suffix = "d" if src == "double" else "f"
        width = _CVT_WIDTH[t]
        fn = f"aotc__cvt_u64_{suffix}" if t == "uint64_t" else f"aotc_cvt_i{width}_{suffix}"
        return f"(({t}){fn}({x[0]}))"
    return f"(({t}){x[0]})"


# The integer a float converts through: narrower types keep its low bits.
_CVT_WIDTH = {"int8_t": 32, "uint8_t": 32, "int16_t": 32, "uint16_t": 32, "int32_t": 32,
              "uint32_t": 64, "int64_t": 64, "uint64_t": 64}


_E8M0_MODES = {"up": "AOTC_E8M0_UP", "down": "AOTC_E8M0_DOWN", "nearest": "AOTC_E8M0_NEAREST"}


def _narrow(node: Node, x: str, src: np.dtype, dst: np.dtype) -> str:
    """``x`` (of ``src``'s compute type) as an element of the emulated ``dst``, by Cast's rules."""
    em = dtypes.emulated(dst)
    assert em is not None
    if em.compute == "int32_t":  # small integers keep the low bits of the integer (truncated toward 0)
        if dtypes.compute_type(src) in FLOAT_CTYPES:
            x = f"aotc_trunc_i32((double){x})"
        return em.store.format(x=x)
    # Every source goes through float: exact except from double or 64-bit integers, which round twice.
    f = f"(float){x}"
    sat = 1 if node.attr("saturate", 1) else 0
    if em.suffix == "e8m0":
        mode = str(node.attr("round_mode", "up"))
        return f"aotc_f32_to_e8m0({f}, {sat}, {_E8M0_MODES[mode]})"
    if em.suffix in ("bf16", "e2m1"):  # no saturation choice: bf16 overflows to inf, e2m1 saturates
        return em.store.format(x=f)
    return f"aotc_f32_to_{em.suffix}({f}, {sat})"


ew("Cast", _cast, lambda n: dtypes.from_onnx(int(n.attr("to"))))
# An explicit copy, inserted where a graph output would otherwise share storage with another value.
ew("Copy", lambda n, x, t: x[0])
# Rewritten into Cast by propagation, once the second operand's dtype is known.
register(OpDef("CastLike", "elementwise", lambda n: [(n.inputs[0].shape, n.inputs[1].dtype)], expr=_cast))

# -- more math ------------------------------------------------------------------------------------------
for _name in ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"]:
    ew(_name[0].upper() + _name[1:], lambda n, x, t, _f=_name: f"{math_fn(_f, t)}({x[0]})")


def _softplus(x: str, t: str) -> str:
    return f"({x} > 20 ? {x} : {math_fn('log', t)}(1 + {math_fn('exp', t)}({x})))"


ew("Mish", lambda n, x, t: f"({x[0]} * {math_fn('tanh', t)}({_softplus(x[0], t)}))")
ew("Swish", lambda n, x, t:
   f"({x[0]} / (1 + {math_fn('exp', t)}(-{_attr_f('alpha', 1.0)(n, t)} * {x[0]})))")


def _mod(node: Node, x: list[str], t: str) -> str:
    a, b = x
    if t in FLOAT_CTYPES:
        # fmod=1 is C's fmod; fmod=0 is not allowed for floats by the spec, numpy's rule serves.
        f = math_fn("fmod", t)
        if node.attr("fmod", 0):
            return f"{f}({a}, {b})"
        return f"({f}({a}, {b}) != 0 && (({f}({a}, {b}) < 0) != ({b} < 0)) ? {f}({a}, {b}) + {b} : {f}({a}, {b}))"
    if node.attr("fmod", 0) or t.startswith("u") or t == "_Bool":
        return f"({b} == 0 ? 0 : {a} % {b})"
    # Integer mod takes the divisor's sign (Python's %); x % 0 is 0 rather than a trap.
    return f"({b} == 0 ? 0 : (({a} % {b}) != 0 && ((({a} % {b}) < 0) != ({b} < 0)) ? ({a} % {b}) + {b} : {a} % {b}))"


ew("Mod", _mod)


def _bitshift(node: Node, x: list[str], t: str) -> str:
    # Shifting by >= the width (or by a negative amount) is undefined in C; ONNX wants every bit
    # shifted out: 0, or -1 for a negative value shifted right.
    bits = {"uint8_t": 8, "uint16_t": 16, "uint32_t": 32, "uint64_t": 64, "int8_t": 8, "int16_t": 16,
            "int32_t": 32, "int64_t": 64}.get(t, 64)
    a, s = x
    out = "0" if node.attr("direction") == "LEFT" or t.startswith("u") else f"({a} < 0 ? ({t})-1 : 0)"
    op = "<<" if node.attr("direction") == "LEFT" else ">>"
    shifted = f"({t})((uint64_t){a} << {s})" if op == "<<" else f"({t})({a} >> {s})"
    return f"(({s}) < 0 || ({s}) >= {bits} ? ({t}){out} : {shifted})"


ew("BitShift", _bitshift)
ew("BitwiseAnd", _f("({t})({a} & {b})"))
ew("BitwiseOr", _f("({t})({a} | {b})"))
ew("BitwiseXor", _f("({t})({a} ^ {b})"))
ew("BitwiseNot", _f("({t})(~{a})"))


# -- (de)quantization: per-tensor or per-axis (propagation reshapes a per-axis scale to broadcast) ------
def _q_dtype(node: Node) -> np.dtype:
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None:
        return zp.dtype
    return dtypes.from_onnx(int(node.attr("output_dtype", 0) or 2))  # uint8 by default


def _quantize(node: Node, x: list[str], t: str) -> str:
    dst = node.outputs[0].dtype
    em = dtypes.emulated(dst)
    zp = x[2] if len(x) > 2 else "0"
    # x / scale in x's own precision, as the reference does: a double quotient can round differently.
    ft = dtypes.compute_type(node.inputs[0].dtype)
    q = f"{x[0]} / ({ft}){x[1]}"
    if em is not None and em.compute == "float":
        # float8 rounds like a saturating (by default) Cast; the reference adds a zero point only
        # for float4 (for float8 it must be 0), and float4 always saturates.
        if em.suffix == "e2m1":
            return dtypes.load(dst, em.store.format(x=f"(float)({q} + {zp})"))
        return dtypes.load(dst, f"aotc_f32_to_{em.suffix}((float)({q}), {1 if node.attr('saturate', 1) else 0})")
    if em is not None:  # int4/uint4/int2/uint2, computed in int32_t
        info = ml_dtypes.iinfo(dst)
        lo, hi = c_literal(int(info.min), t), c_literal(int(info.max), t)
    else:
        lo, hi = lowest(t), highest(t)
    v = f"((double){math_fn('rint', ft)}({q}) + (double){zp})"
    # NaN quantizes to 0: converting it to an integer type is undefined in C.
    return f"({v} != {v} ? ({t})0 : {v} < {lo} ? {lo} : ({v} > {hi} ? {hi} : ({t}){v}))"


def _dequantize(node: Node, x: list[str], t: str) -> str:
    em = dtypes.emulated(node.inputs[0].dtype)
    # float8 and float4 zero points are ignored, as by the reference (float8 requires them to be 0).
    zp = x[2] if len(x) > 2 and not (em is not None and em.compute == "float") else "0"
    return f"((({t}){x[0]} - ({t}){zp}) * {x[1]})"


register(OpDef("QuantizeLinear", "elementwise", lambda n: [(n.inputs[0].shape, _q_dtype(n))], expr=_quantize))
register(OpDef("DequantizeLinear", "elementwise",
               lambda n: [(n.inputs[0].shape, dtypes.from_onnx(int(n.attr("output_dtype", 0)))
                           if n.attr("output_dtype", 0) else n.inputs[1].dtype)], expr=_dequantize))
