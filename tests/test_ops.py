"""Differential tests: every supported op (and a few fused chains) compiled by aotc and compared with
onnxruntime on random inputs.

Each case is one test id. To keep C compile time down, the cases of a group are compiled together,
as independent subgraphs of one model with many outputs; when a group fails to compile, its cases
are compiled one by one so that only the faulty case fails. Cases marked xfail compile alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper
from onnx_helpers import Case, GroupRunner, Inp, add_cases, chunk_groups, f32, i64, single

pytest.importorskip("onnxruntime")

F, I64, B = "float32", "int64", "bool"
EXACT = {"rtol": 1e-5, "atol": 1e-6}
TRANS = {"rtol": 1e-4, "atol": 1e-5}
GROUP_SIZE = 48  # cases per compiled model


def mm_tol(k: int) -> dict:
    return {"rtol": 1e-4, "atol": 1e-5 + 2e-6 * k}


def node(op: str, ins: list[str], outs: list[str], **attrs) -> object:
    return helper.make_node(op, ins, outs, **attrs)


CASES: list[Case] = []


def add(section: str, *cases: Case) -> None:
    add_cases(CASES, section, *cases)


# -- MatMul ------------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ("2d", (5, 7), (7, 3)),
    ("2d_1x1", (1, 1), (1, 1)),
    ("2d_odd", (33, 65), (65, 17)),
    ("2d_square", (64, 128), (128, 64)),
    ("2d_wide", (3, 300), (300, 40)),
    ("3d", (2, 5, 7), (2, 7, 3)),
    ("4d", (2, 3, 4, 5), (2, 3, 5, 6)),
    ("bcast_4d_3d", (2, 1, 4, 5), (3, 5, 6)),
    ("bcast_2d_3d", (4, 5), (2, 5, 3)),
    ("bcast_3d_2d", (2, 4, 5), (5, 3)),
    ("bcast_batch1", (1, 4, 5), (3, 5, 6)),
    ("1d_2d", (7,), (7, 3)),
    ("2d_1d", (5, 7), (7,)),
    ("1d_1d", (7,), (7,)),
    ("1d_3d", (7,), (2, 7, 3)),
    ("3d_1d", (2, 5, 7), (7,)),
]
for _id, _a, _b in MATMUL_SHAPES:
    add("matmul", single(_id, "MatMul", [Inp(_a), Inp(_b)], **mm_tol(_a[-1])))
_rng = np.random.default_rng(1)
add("matmul",
    single("const_weight", "MatMul", [Inp((8, 16)), _rng.standard_normal((16, 10)).astype(np.float32)],
           **mm_tol(16)),
    Case("transposed_a", [node("Transpose", ["a"], ["at"]), node("MatMul", ["at", "b"], ["y"])],
         {"a": Inp((9, 6)), "b": Inp((9, 5))}, ["y"], **mm_tol(9)),
    Case("transposed_b_3d", [node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]), node("MatMul", ["a", "bt"], ["y"])],
         {"a": Inp((2, 6, 9)), "b": Inp((2, 5, 9))}, ["y"], **mm_tol(9)),
    Case("epilogue_bias_relu", [node("MatMul", ["a", "w"], ["m"]), node("Add", ["m", "bias"], ["s"]),
                                node("Relu", ["s"], ["y"])],
         {"a": Inp((6, 20))}, ["y"],
         {"w": _rng.standard_normal((20, 12)).astype(np.float32),
          "bias": _rng.standard_normal(12).astype(np.float32)}, **mm_tol(20)),
    Case("epilogue_add_mn", [node("MatMul", ["a", "b"], ["m"]), node("Add", ["m", "c"], ["y"])],
         {"a": Inp((6, 20)), "b": Inp((20, 12)), "c": Inp((6, 12))}, ["y"], **mm_tol(20)),
    Case("epilogue_3d_bias_relu", [node("MatMul", ["a", "b"], ["m"]), node("Add", ["c", "m"], ["s"]),
                                   node("Relu", ["s"], ["y"])],
         {"a": Inp((3, 6, 20)), "b": Inp((20, 12)), "c": Inp((12,))}, ["y"], **mm_tol(20)),
    Case("epilogue_sigmoid_mul", [node("MatMul", ["a", "b"], ["m"]), node("Sigmoid", ["m"], ["s"]),
                                  node("Mul", ["m", "s"], ["y"])],
         {"a": Inp((7, 9)), "b": Inp((9, 11))}, ["y"], **mm_tol(9)),
    Case("two_outputs", [node("MatMul", ["a", "b"], ["m"]), node("Relu", ["m"], ["y"])],
         {"a": Inp((4, 8)), "b": Inp((8, 6))}, ["m", "y"], **mm_tol(8)),
    single("int64", "MatMul", [Inp((3, 4), I64), Inp((4, 5), I64)]),
    single("int64_batched", "MatMul", [Inp((2, 3, 4), I64), Inp((4, 5), I64)]),
)

# -- Gemm --------------------------------------------------------------------------------------------
M, K, N = 5, 7, 3
_gemm_variants = [
    ("plain", {}, None),
    ("transA", {"transA": 1}, None),
    ("transB", {"transB": 1}, None),
    ("transAB", {"transA": 1, "transB": 1}, None),
    ("alpha", {"alpha": 0.5}, None),
    ("c_n", {}, (N,)),
    ("c_mn", {}, (M, N)),
    ("c_scalar", {}, ()),
    ("c_1", {}, (1,)),
    ("c_m1", {}, (M, 1)),
    ("c_n_alpha_beta", {"alpha": 0.5, "beta": 2.0}, (N,)),
    ("c_mn_beta", {"beta": -1.5}, (M, N)),
    ("c_scalar_all", {"alpha": 2.0, "beta": 0.25, "transA": 1, "transB": 1}, ()),
]
for _id, _attrs, _c in _gemm_variants:
    _a = (K, M) if _attrs.get("transA") else (M, K)
    _b = (N, K) if _attrs.get("transB") else (K, N)
    _args = [Inp(_a), Inp(_b)] + ([Inp(_c)] if _c is not None else [])
    add("gemm", single(_id, "Gemm", _args, _attrs, **mm_tol(K)))
add("gemm",
    single("linear_const", "Gemm", [Inp((4, 24)), _rng.standard_normal((10, 24)).astype(np.float32),
                                    _rng.standard_normal(10).astype(np.float32)], {"transB": 1}, **mm_tol(24)),
    single("const_c_beta", "Gemm", [Inp((4, 24)), _rng.standard_normal((24, 10)).astype(np.float32),
                                    _rng.standard_normal((4, 10)).astype(np.float32)], {"beta": 0.5},
           **mm_tol(24)),
    Case("linear_relu", [node("Gemm", ["a", "w", "bias"], ["g"], transB=1), node("Relu", ["g"], ["y"])],
         {"a": Inp((6, 16))}, ["y"], {"w": _rng.standard_normal((8, 16)).astype(np.float32),
                                      "bias": _rng.standard_normal(8).astype(np.float32)}, **mm_tol(16)),
)

# -- binary arithmetic -------------------------------------------------------------------------------
BIN_SHAPES = [
    ("same", (3, 4, 5), (3, 4, 5)),
    ("scalar_r", (3, 4), ()),
    ("scalar_l", (), (2, 3)),
    ("one", (2, 3), (1,)),
    ("rank_mismatch", (3, 1, 5), (4, 5)),
    ("outer", (4, 1), (1, 5)),
    ("vec_tail", (2, 3, 17), (17,)),
    ("mid_bcast", (2, 1, 4), (2, 3, 1)),
    ("large", (64, 33), (64, 33)),
]
_rand = np.random.default_rng(2024)
for _k in range(6):  # random broadcast-compatible shapes (fixed seed, so ids are stable)
    _rank = int(_rand.integers(1, 5))
    _full = tuple(int(d) for d in _rand.integers(1, 9, size=_rank))
    _other = tuple(1 if _rand.random() < 0.4 else d for d in _full[int(_rand.integers(0, _rank)):])
    BIN_SHAPES.append((f"random{_k}_{'x'.join(map(str, _full))}_{'x'.join(map(str, _other)) or 's'}",
                       _full, _other))

for _op in ["Add", "Sub", "Mul", "Div"]:
    for _id, _a, _b in BIN_SHAPES:
        add("binary", single(f"{_op}_{_id}", _op, [Inp(_a), Inp(_b, gen="wide" if _op == "Div" else "normal")],
                             **EXACT))
    for _id, _a, _b in [BIN_SHAPES[0], BIN_SHAPES[1], BIN_SHAPES[4]]:
        add("binary", single(f"{_op}_int64_{_id}", _op, [Inp(_a, I64), Inp(_b, I64, "nz" if _op == "Div" else "int")]))
    add("binary", Case(f"{_op}_transposed", [node("Transpose", ["a"], ["at"]), node(_op, ["at", "b"], ["y"])],
                       {"a": Inp((5, 4)), "b": Inp((4, 5), gen="wide")}, ["y"], **EXACT))
    add("binary", Case(f"{_op}_transposed_3d",
                       [node("Transpose", ["a"], ["at"], perm=[2, 0, 1]), node(_op, ["b", "at"], ["y"])],
                       {"a": Inp((3, 4, 5), gen="wide"), "b": Inp((3, 4))}, ["y"], **EXACT))

# Pow: constant exponents take special paths in the C expression.
for _e in [2.0, 0.5, 3.0, -1.0, 0.0, 1.0, 1.5, -2.5]:
    _gen = "pos" if _e not in (2.0, 3.0, 1.0, 0.0, -1.0) else "wide"
    add("binary", single(f"Pow_const_{_e:g}", "Pow", [Inp((3, 17), gen=_gen), f32(_e)], **TRANS))
add("binary",
    single("Pow_const_int64_exp_2", "Pow", [Inp((3, 17)), i64(2)], **TRANS),
    single("Pow_const_exp_shape1", "Pow", [Inp((3, 17)), np.array([3.0], np.float32)], **TRANS),
    single("Pow_tensor", "Pow", [Inp((3, 4, 5), gen="pos"), Inp((3, 4, 5), gen="unit")], **TRANS),
    single("Pow_tensor_bcast", "Pow", [Inp((3, 1, 5), gen="pos"), Inp((4, 5), gen="unit")], **TRANS),
    single("Pow_tensor_scalar_input", "Pow", [Inp((3, 5), gen="pos"), Inp((), gen="unit")], **TRANS),
    single("Pow_int64_exp_tensor", "Pow", [Inp((3, 5), gen="unit"), Inp((3, 5), I64, "small")], **TRANS),
    single("Pow_int64_int64", "Pow", [Inp((3, 5), I64, "small"), Inp((3, 5), I64, "nz")]),
)
add("binary",
    single("PRelu_slope_c", "PRelu", [Inp((2, 3, 4)), f32(0.1, -0.2, 0.3, 2.0)], **EXACT),
    single("PRelu_slope_chan", "PRelu", [Inp((2, 3, 4)), Inp((3, 1))], **EXACT),
    single("PRelu_slope_scalar", "PRelu", [Inp((2, 3, 4)), f32(0.25)], **EXACT),
    single("PRelu_slope_same", "PRelu", [Inp((4, 5)), Inp((4, 5))], **EXACT),
)

# -- unary ---------------------------------------------------------------------------------------------
UNARY_F = [
    ("Neg", "normal", EXACT), ("Abs", "normal", EXACT), ("Exp", "wide", TRANS), ("Log", "pos", TRANS),
    ("Sqrt", "pos", TRANS), ("Relu", "normal", EXACT), ("Sigmoid", "wide", TRANS), ("Tanh", "wide", TRANS),
    ("Reciprocal", "wide", EXACT), ("Floor", "wide", EXACT), ("Ceil", "wide", EXACT),
    ("Round", "wide", EXACT), ("Round", "half", EXACT), ("Sign", "small", EXACT), ("Sign", "normal", EXACT),
    ("Sin", "wide", TRANS), ("Cos", "wide", TRANS), ("Erf", "wide", TRANS), ("Softplus", "wide", TRANS),
    ("Softsign", "wide", EXACT), ("IsNaN", "special", EXACT), ("IsInf", "special", EXACT),
    ("HardSwish", "wide", EXACT),
]
for _op, _gen, _tol in UNARY_F:
    _opset = 14 if _op == "HardSwish" else 17
    add("unary", single(f"{_op}_{_gen}", _op, [Inp((3, 17), gen=_gen)], opset=_opset, **_tol))
for _op in ["Neg", "Exp", "Relu", "Abs"]:
    add("unary", single(f"{_op}_scalar", _op, [Inp(())], **TRANS))
    add("unary", single(f"{_op}_shape1", _op, [Inp((1,))], **TRANS))
add("unary", single("Exp_large", "Exp", [Inp((37, 41), gen="wide")], **TRANS))
for _op in ["Neg", "Abs", "Sign"]:
    add("unary", single(f"{_op}_int64", _op, [Inp((3, 17), I64)]))
add("unary",
    single("Not", "Not", [Inp((3, 17), B)]),
    single("IsInf_pos_only", "IsInf", [Inp((3, 8), gen="special")], {"detect_negative": 0}),
    single("IsInf_neg_only", "IsInf", [Inp((3, 8), gen="special")], {"detect_positive": 0}),
)

# -- activations with attributes ---------------------------------------------------------------------
ACT = [
    ("LeakyRelu", {}, 17), ("LeakyRelu", {"alpha": 0.2}, 17), ("Elu", {}, 17), ("Elu", {"alpha": 0.5}, 17),
    ("Selu", {}, 17), ("Selu", {"alpha": 1.5, "gamma": 2.0}, 17), ("Celu", {}, 17), ("Celu", {"alpha": 2.0}, 17),
    ("HardSigmoid", {}, 17), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17),
    ("ThresholdedRelu", {}, 17), ("ThresholdedRelu", {"alpha": 0.5}, 17),
    ("Shrink", {}, 17), ("Shrink", {"lambd": 1.0, "bias": 0.5}, 17),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
]
for _op, _attrs, _opset in ACT:
    _id = _op + "".join(f"_{k}{v}" for k, v in _attrs.items())
    add("act", single(_id, _op, [Inp((4, 17), gen="wide")], _attrs, opset=_opset, **TRANS))

# Clip: bounds as inputs (opset 11+) or attributes (opset < 11).
add("act",
    single("Clip_both", "Clip", [Inp((4, 17), gen="wide"), f32(-1.0)[0], f32(2.0)[0]], **EXACT),
    single("Clip_min_only", "Clip", [Inp((4, 17), gen="wide"), np.float32(0.5)], **EXACT),
    single("Clip_max_only", "Clip", [Inp((4, 17), gen="wide"), None, np.float32(0.5)], **EXACT),
    single("Clip_none", "Clip", [Inp((4, 17), gen="wide")], **EXACT),
    single("Clip_runtime_bounds", "Clip", [Inp((4, 17), gen="wide"), Inp((), gen="unit"), Inp((), gen="pos")],
           **EXACT),
    single("Clip_int64", "Clip", [Inp((4, 17), I64), np.int64(-3), np.int64(4)]),
    single("Clip_opset10_attrs", "Clip", [Inp((4, 17), gen="wide")], {"min": -0.5, "max": 1.5}, opset=10,
           group="act10", **EXACT),
    single("Clip_opset10_min_attr", "Clip", [Inp((4, 17), gen="wide")], {"min": 0.0}, opset=10, group="act10",
           **EXACT),
)

# -- variadic ------------------------------------------------------------------------------------------
for _op in ["Max", "Min", "Sum", "Mean"]:
    add("variadic",
        single(f"{_op}_1", _op, [Inp((3, 5))], **EXACT),
        single(f"{_op}_2_same", _op, [Inp((3, 4, 5)), Inp((3, 4, 5))], **EXACT),
        single(f"{_op}_2_bcast", _op, [Inp((3, 1, 5)), Inp((4, 5))], **EXACT),
        single(f"{_op}_3_bcast", _op, [Inp((2, 3)), Inp((3,)), Inp(())], **EXACT),
        single(f"{_op}_4", _op, [Inp((2, 3)), Inp((2, 3)), Inp((2, 1)), Inp((1, 3))], **EXACT))
    if _op in ("Max", "Min"):  # Sum and Mean are float-only
        add("variadic", single(f"{_op}_int64", _op, [Inp((3, 1, 5), I64), Inp((4, 5), I64)]))

# -- comparisons, logic, Where -------------------------------------------------------------------------
for _op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
    add("compare",
        single(f"{_op}_same", _op, [Inp((3, 4, 5), gen="small"), Inp((3, 4, 5), gen="small")]),
        single(f"{_op}_bcast", _op, [Inp((3, 1, 5), gen="small"), Inp((4, 5), gen="small")]),
        single(f"{_op}_scalar", _op, [Inp((3, 5), gen="small"), np.float32(1.0)]),
        single(f"{_op}_int64", _op, [Inp((3, 1, 5), I64, "small"), Inp((4, 5), I64, "small")]))
add("compare", single("Equal_bool", "Equal", [Inp((3, 1, 5), B), Inp((4, 5), B)]))
for _op in ["And", "Or", "Xor"]:
    add("compare",
        single(f"{_op}_same", _op, [Inp((3, 17), B), Inp((3, 17), B)]),
        single(f"{_op}_bcast", _op, [Inp((3, 1, 5), B), Inp((4, 5), B)]))
add("compare",
    single("Where_same", "Where", [Inp((3, 4), B), Inp((3, 4)), Inp((3, 4))]),
    single("Where_bcast", "Where", [Inp((3, 1, 5), B), Inp((4, 5)), Inp(())]),
    single("Where_bcast_cond", "Where", [Inp((5,), B), Inp((4, 1)), Inp((3, 1, 1))]),
    single("Where_int64", "Where", [Inp((3, 1, 5), B), Inp((4, 5), I64), np.int64(-7)]),
    Case("Where_from_compare", [node("Greater", ["a", "b"], ["m"]), node("Where", ["m", "a", "b"], ["y"])],
         {"a": Inp((3, 1, 5)), "b": Inp((4, 5))}, ["y"], **EXACT),
    Case("Not_of_Less", [node("Less", ["a", "b"], ["m"]), node("Not", ["m"], ["y"])],
         {"a": Inp((3, 5), gen="small"), "b": Inp((5,), gen="small")}, ["y"]),
)

# -- NaN / Inf propagation and edge inputs ----------------------------------------------------------------
SPECIAL_SHAPE = (4, 6)
for _op, _tol in [("Relu", EXACT), ("Neg", EXACT), ("Abs", EXACT), ("Exp", TRANS), ("Log", TRANS),
                  ("Tanh", TRANS), ("Sigmoid", TRANS), ("Sqrt", TRANS), ("Erf", TRANS), ("Softplus", TRANS),
                  ("Sign", EXACT), ("Floor", EXACT), ("Ceil", EXACT), ("Round", EXACT), ("Reciprocal", EXACT),
                  ("LeakyRelu", EXACT), ("Elu", TRANS), ("Softsign", EXACT), ("HardSigmoid", EXACT)]:
    add("special", single(_op, _op, [Inp(SPECIAL_SHAPE, gen="special")], **_tol))
for _op in ["Max", "Min"]:
    add("special",
        single(f"{_op}_nan_first", _op, [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE)], **EXACT),
        single(f"{_op}_nan_second", _op, [Inp(SPECIAL_SHAPE), Inp(SPECIAL_SHAPE, gen="special")], **EXACT),
        single(f"{_op}_nan_both", _op, [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")],
               **EXACT))


def _np_reduce(fn, axis, keepdims):
    return lambda feeds: [fn(feeds["x0"], axis=axis, keepdims=keepdims)]


# onnxruntime's ReduceMax/Min drop a NaN or not depending on where it sits; aotc propagates NaN like
# numpy and the ONNX reference implementation, so numpy is the reference here.
for _op, _fn in [("ReduceMax", np.max), ("ReduceMin", np.min)]:
    add("special",
        single(f"{_op}_rows", _op, [Inp((6, 4), gen="special"), i64(1)], opset=18,
               reference=_np_reduce(_fn, 1, True), **EXACT),
        single(f"{_op}_cols", _op, [Inp((6, 4), gen="special"), i64(0)], opset=18,
               reference=_np_reduce(_fn, 0, True), **EXACT),
        single(f"{_op}_all", _op, [Inp((6, 4), gen="special")], {"keepdims": 0}, opset=18,
               reference=_np_reduce(_fn, None, False), **EXACT),
        single(f"{_op}_long_rows", _op, [Inp((3, 50), gen="special"), i64(1)], {"keepdims": 0}, opset=18,
               reference=_np_reduce(_fn, 1, False), **EXACT))
add("special",
    single("ReduceSum", "ReduceSum", [Inp((6, 4), gen="special"), i64(1)], **EXACT),
    single("Mul_inf_zero", "Mul", [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")], **EXACT),
    single("Div_special", "Div", [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")], **EXACT),
    single("Add_special", "Add", [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")], **EXACT),
    single("Relu_nan", "Relu", [Inp(SPECIAL_SHAPE, gen="special")], **EXACT),
    single("Relu_nan_f64", "Relu", [Inp(SPECIAL_SHAPE, "float64", gen="special")], **EXACT),
    single("Clip_nan", "Clip", [Inp(SPECIAL_SHAPE, gen="special"), np.float32(-1), np.float32(1)], **EXACT),
    single("Clip_nan_f64", "Clip", [Inp(SPECIAL_SHAPE, "float64", gen="special"), np.float64(-1), np.float64(1)],
           **EXACT),
    single("Softmax", "Softmax", [Inp((3, 4), gen="special")], {"axis": 1}, **TRANS),
    single("Equal_nan", "Equal", [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")]),
    single("Less_nan", "Less", [Inp(SPECIAL_SHAPE, gen="special"), Inp(SPECIAL_SHAPE, gen="special")]),
    single("Cast_bool", "Cast", [Inp(SPECIAL_SHAPE, gen="special")], {"to": helper.np_dtype_to_tensor_dtype(
        np.dtype(np.bool_))}),
)

# -- Softmax / LogSoftmax ----------------------------------------------------------------------------------
for _op in ["Softmax", "LogSoftmax"]:
    for _axis in [-1, 0, 1, 2]:
        add("softmax", single(f"{_op}_axis{_axis}", _op, [Inp((3, 4, 5), gen="wide")], {"axis": _axis}, **TRANS))
    add("softmax",
        single(f"{_op}_default", _op, [Inp((3, 4, 5), gen="wide")], **TRANS),
        single(f"{_op}_rank1", _op, [Inp((17,), gen="wide")], **TRANS),
        single(f"{_op}_long_rows", _op, [Inp((4, 300), gen="wide")], **TRANS),
        Case(f"{_op}_masked_neg_inf", [node("Add", ["x", "mask"], ["xm"]), node(_op, ["xm"], ["y"], axis=-1)],
             {"x": Inp((5, 7), gen="wide")}, ["y"], {"mask": np.triu(np.full((5, 7), -np.inf, np.float32), 1)},
             **TRANS),
        Case(f"{_op}_large_values", [node("Mul", ["x", "s"], ["xs"]), node(_op, ["xs"], ["y"], axis=-1)],
             {"x": Inp((4, 9), gen="wide")}, ["y"], {"s": f32(40.0)}, **TRANS))
    for _axis in [1, 0, 2, -1]:
        add("softmax", single(f"{_op}_opset11_axis{_axis}", _op, [Inp((2, 3, 4), gen="wide")], {"axis": _axis},
                              opset=11, **TRANS))
    add("softmax", single(f"{_op}_opset11_default", _op, [Inp((2, 3, 4), gen="wide")], opset=11, **TRANS))

# -- reductions --------------------------------------------------------------------------------------------
REDUCE_GEN = {"ReduceLogSum": "pos", "ReduceProd": "pos", "ReduceL1": "normal", "ReduceLogSumExp": "normal"}
REDUCE_VARIANTS = [  # id, axes (None: all), keepdims, shape, noop_with_empty_axes
    ("ax1_keep", [1], 1, (3, 5, 4), 0),
    ("ax1_drop", [1], 0, (3, 5, 4), 0),
    ("ax02_keep", [0, 2], 1, (3, 5, 4), 0),
    ("ax02_drop", [0, 2], 0, (3, 5, 4), 0),
    ("axneg1_drop", [-1], 0, (3, 5, 4), 0),
    ("ax0_drop", [0], 0, (3, 5, 4), 0),
    ("all_keep", None, 1, (3, 5, 4), 0),
    ("all_drop", None, 0, (3, 5, 4), 0),
    ("last_long", [-1], 0, (5, 300), 0),
    ("mid_long", [1], 1, (3, 40, 9), 0),
    ("all_long", None, 0, (7, 33, 9), 0),
]
for _op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]:
    _gen = REDUCE_GEN.get(_op, "normal")
    _tol = TRANS if _op not in ("ReduceMax", "ReduceMin") else EXACT
    for _id, _axes, _keep, _shape, _noop in REDUCE_VARIANTS:
        if _op == "ReduceProd" and _shape != (3, 5, 4):
            continue
        _args = [Inp(_shape, gen=_gen)] + ([i64(*_axes)] if _axes is not None else [])
        add("reduce", single(f"{_op}_{_id}", _op, _args, {"keepdims": _keep}, opset=18, **_tol))
    add("reduce", single(f"{_op}_noop_empty_axes", _op, [Inp((3, 4), gen=_gen)], {"noop_with_empty_axes": 1},
                         opset=18, **_tol))
    if _op != "ReduceSum":  # axes as an attribute before opset 18 (ReduceSum: before 13)
        add("reduce",
            single(f"{_op}_opset13_attr_ax1", _op, [Inp((3, 5, 4), gen=_gen)], {"axes": [1], "keepdims": 0},
                   opset=13, group="reduce13", **_tol),
            single(f"{_op}_opset13_attr_ax02_keep", _op, [Inp((3, 5, 4), gen=_gen)], {"axes": [0, -1]},
                   opset=13, group="reduce13", **_tol),
            single(f"{_op}_opset13_all", _op, [Inp((3, 5, 4), gen=_gen)], {"keepdims": 0}, opset=13,
                   group="reduce13", **_tol))
add("reduce",
    single("ReduceSum_opset13_axes_input", "ReduceSum", [Inp((3, 5, 4)), i64(1)], {"keepdims": 0}, opset=13,
           group="reduce13", **TRANS),
    single("ReduceSum_opset13_all", "ReduceSum", [Inp((3, 5, 4))], opset=13, group="reduce13", **TRANS),
    single("ReduceSum_opset11_attr", "ReduceSum", [Inp((3, 5, 4))], {"axes": [2, 0]}, opset=11,
           group="reduce11", **TRANS),
    single("ReduceSum_scalar_input", "ReduceSum", [Inp(())], opset=18, **TRANS),
)
for _op in ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"]:
    add("reduce", single(f"{_op}_int64", _op, [Inp((3, 5, 4), I64, "small"), i64(1)], {"keepdims": 0}, opset=18))
add("reduce",
    Case("ReduceLogSumExp_large_values", [node("Add", ["x", "s"], ["xs"]),
                                          node("ReduceLogSumExp", ["xs", "ax"], ["y"], keepdims=0)],
         {"x": Inp((4, 9))}, ["y"], {"s": f32(100.0), "ax": i64(1)}, opset=18, **TRANS))

# -- shape ops --------------------------------------------------------------------------------------------
add("shape",
    single("Reshape_minus1", "Reshape", [Inp((2, 3, 4)), i64(-1, 4)]),
    single("Reshape_zero_minus1", "Reshape", [Inp((2, 3, 4)), i64(0, -1)]),
    single("Reshape_zero_mid", "Reshape", [Inp((2, 3, 4)), i64(0, 2, -1)]),
    single("Reshape_flat", "Reshape", [Inp((2, 3, 4)), i64(24)]),
    single("Reshape_to_scalar", "Reshape", [Inp((1, 1)), np.zeros(0, np.int64)]),
    single("Reshape_from_scalar", "Reshape", [Inp(()), i64(1, 1, 1)]),
    single("Reshape_int64", "Reshape", [Inp((4, 3), I64), i64(2, 0, -1)]),
    single("Reshape_bool", "Reshape", [Inp((2, 6), B), i64(4, 3)]),
    Case("Reshape_of_transpose", [node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                                  node("Reshape", ["t", "s"], ["y"])], {"x": Inp((2, 3, 4))}, ["y"], {"s": i64(3, 8)}),
    Case("Reshape_chain_add", [node("Reshape", ["x", "s1"], ["r1"]), node("Reshape", ["r1", "s2"], ["r2"]),
                               node("Add", ["r2", "b"], ["y"])],
         {"x": Inp((2, 3, 4)), "b": Inp((4, 6))}, ["y"], {"s1": i64(6, 4), "s2": i64(4, 6)}, **EXACT),
)
for _axis in [0, 1, 2, 3, -1]:
    add("shape", single(f"Flatten_axis{_axis}", "Flatten", [Inp((2, 3, 4))], {"axis": _axis}))
add("shape", single("Flatten_default_4d", "Flatten", [Inp((2, 3, 4, 5))]))
for _id, _shape, _perm in [("2d", (3, 7), None), ("3d_default", (2, 3, 4), None), ("3d_021", (2, 3, 4), [0, 2, 1]),
                           ("3d_120", (2, 3, 4), [1, 2, 0]), ("4d_0231", (2, 3, 4, 5), [0, 2, 3, 1]),
                           ("4d_3102", (2, 3, 4, 5), [3, 1, 0, 2]), ("with_ones", (1, 5, 1, 3), [3, 2, 1, 0]),
                           ("large", (37, 65), [1, 0])]:
    add("shape", single(f"Transpose_{_id}", "Transpose", [Inp(_shape)], {"perm": _perm} if _perm else {}))
add("shape",
    single("Transpose_int64", "Transpose", [Inp((3, 4), I64)]),
    single("Transpose_bool", "Transpose", [Inp((3, 4, 2), B)], {"perm": [2, 0, 1]}),
    single("Squeeze_axes", "Squeeze", [Inp((1, 3, 1, 4)), i64(0, 2)]),
    single("Squeeze_neg_axis", "Squeeze", [Inp((3, 4, 1)), i64(-1)]),
    single("Squeeze_all", "Squeeze", [Inp((1, 3, 1, 4, 1))]),
    single("Squeeze_to_scalar", "Squeeze", [Inp((1, 1))]),
    single("Squeeze_opset11_attr", "Squeeze", [Inp((1, 3, 1, 4))], {"axes": [2]}, opset=11, group="shape11"),
    single("Unsqueeze_0", "Unsqueeze", [Inp((3, 4)), i64(0)]),
    single("Unsqueeze_neg", "Unsqueeze", [Inp((3, 4)), i64(-1)]),
    single("Unsqueeze_multi", "Unsqueeze", [Inp((3, 4)), i64(1, 3)]),
    single("Unsqueeze_scalar", "Unsqueeze", [Inp(()), i64(0)]),
    single("Unsqueeze_int64", "Unsqueeze", [Inp((3,), I64), i64(0, 2)]),
    single("Unsqueeze_opset11_attr", "Unsqueeze", [Inp((3, 4))], {"axes": [0, 3]}, opset=11, group="shape11"),
    Case("Unsqueeze_then_add", [node("Unsqueeze", ["x", "ax"], ["u"]), node("Add", ["u", "b"], ["y"])],
         {"x": Inp((3, 4)), "b": Inp((3, 2, 4))}, ["y"], {"ax": i64(1)}, **EXACT),
)
add("shape",
    single("Concat_axis0", "Concat", [Inp((2, 3)), Inp((4, 3))], {"axis": 0}),
    single("Concat_axis1_three", "Concat", [Inp((2, 3, 4)), Inp((2, 1, 4)), Inp((2, 5, 4))], {"axis": 1}),
    single("Concat_axis_neg1", "Concat", [Inp((2, 3, 4)), Inp((2, 3, 7))], {"axis": -1}),
    single("Concat_axis2_four", "Concat", [Inp((2, 3, 1)), Inp((2, 3, 2)), Inp((2, 3, 3)), Inp((2, 3, 4))],
           {"axis": 2}),
    single("Concat_single", "Concat", [Inp((2, 3))], {"axis": 1}),
    single("Concat_1d", "Concat", [Inp((3,)), Inp((5,))], {"axis": 0}),
    single("Concat_int64", "Concat", [Inp((2, 3), I64), Inp((2, 2), I64)], {"axis": 1}),
    single("Concat_bool", "Concat", [Inp((1, 3), B), Inp((2, 3), B)], {"axis": 0}),
    single("Concat_with_const", "Concat", [Inp((2, 3)), np.arange(6, dtype=np.float32).reshape(2, 3)], {"axis": 1}),
    single("Concat_same_input_twice", "Concat", [Inp((2, 3)), Inp((2, 3))], {"axis": 0}),
    Case("Concat_computed_inputs", [node("Relu", ["a"], ["ra"]), node("Transpose", ["b"], ["tb"]),
                                    node("Concat", ["ra", "tb", "a"], ["y"], axis=1)],
         {"a": Inp((3, 4)), "b": Inp((2, 3))}, ["y"]),
    Case("Concat_then_reduce", [node("Concat", ["a", "b"], ["c"], axis=0),
                                node("ReduceSum", ["c", "ax"], ["y"], keepdims=0)],
         {"a": Inp((2, 5)), "b": Inp((3, 5))}, ["y"], {"ax": i64(0)}, **TRANS),
    Case("Concat_input_twice", [node("Concat", ["a", "a"], ["y"], axis=1)], {"a": Inp((2, 3))}, ["y"]),
)
add("shape",
    single("Identity", "Identity", [Inp((3, 4))]),
    single("Identity_int64", "Identity", [Inp((3, 4), I64)]),
    Case("Identity_two_outputs", [node("Identity", ["x"], ["a"]), node("Identity", ["x"], ["b"])],
         {"x": Inp((3, 4))}, ["a", "b"]),
    Case("Identity_of_computed", [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"])],
         {"x": Inp((3, 4))}, ["r", "y"]),
    Case("Constant_output", [node("Constant", [], ["y"], value=helper.make_tensor(
        "v", 1, [2, 3], [1.0, -2.0, 3.5, 0.0, 5.0, -6.25]))], {}, ["y"]),
    Case("Constant_add", [node("Constant", [], ["c"], value=helper.make_tensor("v", 1, [3], [1.0, 2.0, 3.0])),
                          node("Add", ["x", "c"], ["y"])], {"x": Inp((2, 3))}, ["y"], **EXACT),
    Case("Constant_value_float", [node("Constant", [], ["c"], value_float=2.5), node("Mul", ["x", "c"], ["y"])],
         {"x": Inp((2, 3))}, ["y"], **EXACT),
    Case("Constant_value_ints", [node("Constant", [], ["c"], value_ints=[3, -1]), node("Reshape", ["x", "c"], ["y"])],
         {"x": Inp((2, 3, 2))}, ["y"]),
    Case("Constant_int64_output", [node("Constant", [], ["y"], value=helper.make_tensor("v", 7, [3], [4, 5, -6]))],
         {}, ["y"]),
)
_T = helper.np_dtype_to_tensor_dtype
for _id, _src, _dst, _gen in [("f32_i64", F, I64, "wide"), ("i64_f32", I64, F, "int"), ("f32_bool", F, B, "small"),
                              ("bool_f32", B, F, "bool"), ("i64_bool", I64, B, "small"), ("bool_i64", B, I64, "bool"),
                              ("f32_f64", F, "float64", "normal"), ("f32_f32", F, F, "normal"),
                              ("i64_i32", I64, "int32", "int"), ("f32_i32", F, "int32", "wide"),
                              ("f32_u8", F, "uint8", "pos")]:
    add("shape", single(f"Cast_{_id}", "Cast", [Inp((3, 7), _src, _gen)], {"to": _T(np.dtype(_dst))}, **EXACT))
add("shape",
    Case("Cast_in_chain", [node("Cast", ["x"], ["i"], to=_T(np.dtype(I64))), node("Mul", ["i", "k"], ["m"]),
                           node("Cast", ["m"], ["y"], to=_T(np.dtype(F)))],
         {"x": Inp((3, 5), gen="wide")}, ["y"], {"k": i64(3)}, **EXACT),
    single("Dropout_opset13", "Dropout", [Inp((3, 4))]),
    single("Dropout_ratio_input", "Dropout", [Inp((3, 4)), np.float32(0.3)]),
    single("Dropout_mask", "Dropout", [Inp((3, 4))], n_out=2),
    Case("Dropout_mask_consumed", [node("Dropout", ["x"], ["d", "m"]), node("Cast", ["m"], ["mf"], to=1),
                                   node("Mul", ["d", "mf"], ["y"])], {"x": Inp((3, 4))}, ["y"]),
    single("Dropout_opset10_ratio_attr", "Dropout", [Inp((3, 4))], {"ratio": 0.3}, opset=10, group="shape10"),
    Case("Dropout_then_relu", [node("Dropout", ["x"], ["d"]), node("Relu", ["d"], ["y"])], {"x": Inp((3, 4))},
         ["y"]),
)
# Slice: inputs starts, ends, axes, steps.
_SLICES = [
    ("basic", (10, 8), [i64(1), i64(8), i64(0)]),
    ("no_axes", (10, 8), [i64(1, 2), i64(9, 7)]),
    ("two_axes", (10, 8), [i64(2, 1), i64(-1, 7), i64(1, 0)]),
    ("neg_axis", (4, 6, 5), [i64(1), i64(4), i64(-1)]),
    ("step2", (10, 8), [i64(1), i64(10), i64(0), i64(2)]),
    ("step3_end_big", (10, 8), [i64(0), i64(2**62), i64(1), i64(3)]),
    ("reverse", (10, 8), [i64(-1), i64(-(2**62)), i64(0), i64(-1)]),
    ("reverse_step2", (10, 8), [i64(8), i64(0), i64(1), i64(-2)]),
    ("reverse_both_axes", (4, 6), [i64(-1, -2), i64(-100, 0), i64(0, 1), i64(-1, -3)]),
    ("neg_start_end", (10, 8), [i64(-4), i64(-1), i64(0)]),
    ("clamped_start", (10, 8), [i64(-100), i64(3), i64(0)]),
    ("3d_mixed", (5, 6, 7), [i64(4, 1, 0), i64(0, 6, 7), i64(0, 1, 2), i64(-2, 2, 3)]),
]
for _id, _shape, _p in _SLICES:
    add("shape", single(f"Slice_{_id}", "Slice", [Inp(_shape)] + list(_p)))
add("shape",
    single("Slice_int64", "Slice", [Inp((6, 5), I64), i64(5), i64(0), i64(0), i64(-2)]),
    single("Slice_empty", "Slice", [Inp((6, 5)), i64(3), i64(3), i64(0)]),
    Case("Slice_then_mul", [node("Slice", ["x", "s", "e", "a", "st"], ["sl"]), node("Mul", ["sl", "b"], ["y"])],
         {"x": Inp((6, 8)), "b": Inp((6, 4))}, ["y"], {"s": i64(7), "e": i64(-100), "a": i64(1), "st": i64(-2)},
         **EXACT),
    single("Slice_opset9_attrs", "Slice", [Inp((6, 8))], {"starts": [1, 2], "ends": [5, 100], "axes": [0, 1]},
           opset=9, group="shape9"),
)
add("shape",
    single("Expand_rank_up", "Expand", [Inp((3, 1)), i64(2, 3, 4)]),
    single("Expand_scalar", "Expand", [Inp(()), i64(5)]),
    single("Expand_shape_1", "Expand", [Inp((1,)), i64(2, 3)]),
    single("Expand_smaller_shape", "Expand", [Inp((2, 3, 4)), i64(4)]),
    single("Expand_ones", "Expand", [Inp((3, 1)), i64(1, 5)]),
    single("Expand_int64", "Expand", [Inp((1, 4), I64), i64(3, 1)]),
    single("Expand_bool", "Expand", [Inp((3, 1), B), i64(3, 4)]),
    Case("Expand_then_add", [node("Expand", ["x", "s"], ["e"]), node("Add", ["e", "b"], ["y"])],
         {"x": Inp((3, 1)), "b": Inp((3, 4))}, ["y"], {"s": i64(3, 4)}, **EXACT),
    Case("Shape_into_Reshape", [node("Shape", ["ref"], ["s"]), node("Reshape", ["x", "s"], ["y"])],
         {"x": Inp((24,)), "ref": Inp((2, 3, 4))}, ["y"]),
    Case("Shape_slice_into_Reshape", [node("Shape", ["ref"], ["s"], start=1),
                                      node("Concat", ["m1", "s"], ["t"], axis=0),
                                      node("Reshape", ["x", "t"], ["y"])],
         {"x": Inp((2, 12)), "ref": Inp((5, 3, 4))}, ["y"], {"m1": i64(-1)}),
    Case("Size_into_Reshape", [node("Size", ["ref"], ["n"]), node("Unsqueeze", ["n", "z"], ["u"]),
                               node("Div", ["u", "two"], ["h"]), node("Concat", ["two", "h"], ["t"], axis=0),
                               node("Reshape", ["x", "t"], ["y"])],
         {"x": Inp((3, 4)), "ref": Inp((2, 6))}, ["y"], {"z": i64(0), "two": i64(2)}),
    Case("Shape_output", [node("Shape", ["x"], ["y"])], {"x": Inp((2, 3, 4))}, ["y"]),
    Case("Size_output", [node("Size", ["x"], ["y"])], {"x": Inp((2, 3, 4))}, ["y"]),
)

# -- BatchNormalization (inference) ------------------------------------------------------------------------
_bn = [np.abs(_rng.standard_normal(3)).astype(np.float32) + 0.5 for _ in range(4)]
add("nn",
    single("BatchNorm_4d", "BatchNormalization", [Inp((2, 3, 4, 5)), *_bn], {"epsilon": 1e-3}, **TRANS),
    single("BatchNorm_2d", "BatchNormalization", [Inp((4, 3)), *_bn], **TRANS),
    Case("Gemm_BatchNorm", [node("Gemm", ["x", "w", "b"], ["g"], transB=1),
                            node("BatchNormalization", ["g", "s", "o", "m", "v"], ["y"])],
         {"x": Inp((4, 6))}, ["y"],
         {"w": _rng.standard_normal((3, 6)).astype(np.float32), "b": _rng.standard_normal(3).astype(np.float32),
          "s": _bn[0], "o": _bn[1], "m": _bn[2], "v": _bn[3]}, **mm_tol(6)),
)

# -- fused chains ----------------------------------------------------------------------------------------
_ln_gamma = _rng.standard_normal(32).astype(np.float32)
_ln_beta = _rng.standard_normal(32).astype(np.float32)
add("chain",
    Case("swish", [node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["y"])], {"x": Inp((4, 33), gen="wide")},
         ["y"], **TRANS),
    Case("layernorm", [node("ReduceMean", ["x", "ax"], ["mu"]), node("Sub", ["x", "mu"], ["d"]),
                       node("Mul", ["d", "d"], ["d2"]), node("ReduceMean", ["d2", "ax"], ["var"]),
                       node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]),
                       node("Div", ["d", "sd"], ["n"]), node("Mul", ["n", "g"], ["ng"]),
                       node("Add", ["ng", "b"], ["y"])],
         {"x": Inp((4, 7, 32))}, ["y"],
         {"ax": i64(-1), "eps": f32(1e-5), "g": _ln_gamma, "b": _ln_beta}, opset=18, **TRANS),
    Case("layernorm_pow", [node("ReduceMean", ["x"], ["mu"], axes=[-1]), node("Sub", ["x", "mu"], ["d"]),
                           node("Pow", ["d", "two"], ["d2"]), node("ReduceMean", ["d2"], ["var"], axes=[-1]),
                           node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]),
                           node("Div", ["d", "sd"], ["y"])],
         {"x": Inp((6, 20))}, ["y"], {"two": f32(2.0), "eps": f32(1e-5)}, opset=13, group="chain13", **TRANS),
    Case("transpose_add", [node("Transpose", ["a"], ["at"], perm=[1, 0]), node("Add", ["at", "b"], ["y"])],
         {"a": Inp((5, 7)), "b": Inp((7, 5))}, ["y"], **EXACT),
    Case("transpose_add_relu_3d", [node("Transpose", ["a"], ["at"], perm=[0, 2, 1]), node("Add", ["at", "b"], ["s"]),
                                   node("Relu", ["s"], ["y"])],
         {"a": Inp((2, 5, 7)), "b": Inp((7, 1))}, ["y"], **EXACT),
    Case("gelu_erf", [node("Div", ["x", "sq2"], ["a"]), node("Erf", ["a"], ["e"]), node("Add", ["e", "one"], ["e1"]),
                      node("Mul", ["x", "e1"], ["m"]), node("Mul", ["m", "half"], ["y"])],
         {"x": Inp((3, 40), gen="wide")}, ["y"], {"sq2": f32(np.sqrt(2)), "one": f32(1), "half": f32(0.5)}, **TRANS),
    Case("manual_softmax", [node("ReduceMax", ["x", "ax"], ["mx"]), node("Sub", ["x", "mx"], ["d"]),
                            node("Exp", ["d"], ["e"]), node("ReduceSum", ["e", "ax"], ["s"]),
                            node("Div", ["e", "s"], ["y"])],
         {"x": Inp((5, 21), gen="wide")}, ["y"], {"ax": i64(1)}, opset=18, **TRANS),
    Case("mlp_softmax", [node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), node("Relu", ["h"], ["r"]),
                         node("Gemm", ["r", "w2", "b2"], ["o"], transB=1), node("Softmax", ["o"], ["y"], axis=1)],
         {"x": Inp((3, 12))}, ["y"],
         {"w1": _rng.standard_normal((16, 12)).astype(np.float32), "b1": _rng.standard_normal(16).astype(np.float32),
          "w2": _rng.standard_normal((5, 16)).astype(np.float32), "b2": _rng.standard_normal(5).astype(np.float32)},
         **mm_tol(16)),
    Case("attention", [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
                       node("Mul", ["s", "scale"], ["ss"]), node("Add", ["ss", "mask"], ["sm"]),
                       node("Softmax", ["sm"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["y"])],
         {"q": Inp((2, 6, 8)), "k": Inp((2, 6, 8)), "v": Inp((2, 6, 8))}, ["y"],
         {"scale": f32(8 ** -0.5), "mask": np.triu(np.full((6, 6), -1e9, np.float32), 1)}, **mm_tol(8)),
    Case("reduce_of_product", [node("Mul", ["a", "b"], ["m"]), node("ReduceSum", ["m", "ax"], ["s"], keepdims=0),
                               node("Add", ["s", "c"], ["y"])],
         {"a": Inp((4, 30)), "b": Inp((30,)), "c": Inp((4,))}, ["y"], {"ax": i64(1)}, **TRANS),
    Case("reduce_epilogue", [node("ReduceSum", ["x", "ax"], ["s"], keepdims=1), node("Mul", ["s", "two"], ["m"]),
                             node("Add", ["m", "x"], ["y"])],
         {"x": Inp((3, 4, 5))}, ["y"], {"ax": i64(1), "two": f32(2)}, **TRANS),
    Case("slice_mul_reduce", [node("Slice", ["x", "s", "e"], ["sl"]), node("Mul", ["sl", "sl"], ["m"]),
                              node("ReduceMean", ["m", "ax"], ["y"], keepdims=0)],
         {"x": Inp((6, 10))}, ["y"], {"s": i64(1, 2), "e": i64(5, 9), "ax": i64(1)}, opset=18, **TRANS),
    Case("pixel_shuffle", [node("Reshape", ["x", "s1"], ["r"]),
                           node("Transpose", ["r"], ["t"], perm=[0, 1, 4, 2, 5, 3]),
                           node("Reshape", ["t", "s2"], ["u"]), node("Add", ["u", "b"], ["y"])],
         {"x": Inp((1, 8, 3, 3)), "b": Inp((1, 2, 6, 6))}, ["y"],
         {"s1": i64(1, 2, 2, 2, 3, 3), "s2": i64(1, 2, 6, 6)}, **EXACT),
    Case("concat_then_reduce", [node("Relu", ["a"], ["ra"]), node("Sigmoid", ["b"], ["sb"]),
                                node("Concat", ["ra", "sb"], ["c"], axis=1),
                                node("ReduceSum", ["c", "ax"], ["y"], keepdims=0)],
         {"a": Inp((4, 3)), "b": Inp((4, 5))}, ["y"], {"ax": i64(1)}, **TRANS),
    Case("shared_producer", [node("Exp", ["x"], ["e"]), node("Add", ["e", "one"], ["y1"]),
                             node("Mul", ["e", "two"], ["y2"])],
         {"x": Inp((3, 9))}, ["y1", "y2"], {"one": f32(1), "two": f32(2)}, **TRANS),
    Case("intermediate_output", [node("Relu", ["x"], ["r"]), node("Mul", ["r", "two"], ["y"])],
         {"x": Inp((3, 9))}, ["r", "y"], {"two": f32(2)}, **EXACT),
    Case("expand_where", [node("Expand", ["x", "s"], ["e"]), node("Greater", ["e", "zero"], ["g"]),
                          node("Where", ["g", "e", "b"], ["y"])],
         {"x": Inp((3, 1)), "b": Inp((3, 4))}, ["y"], {"s": i64(3, 4), "zero": f32(0)}, **EXACT),
    Case("reduce_two_consumers", [node("ReduceMean", ["x", "ax"], ["m"]), node("Sub", ["x", "m"], ["y1"]),
                                  node("Add", ["x", "m"], ["y2"])],
         {"x": Inp((4, 10))}, ["y1", "y2"], {"ax": i64(1)}, opset=18, **TRANS),
    Case("mse_loss", [node("Sub", ["a", "b"], ["d"]), node("Mul", ["d", "d"], ["d2"]),
                      node("ReduceMean", ["d2"], ["y"], keepdims=0)],
         {"a": Inp((5, 7)), "b": Inp((5, 7))}, ["y"], opset=18, **TRANS),
    Case("int_pipeline", [node("Add", ["a", "b"], ["s"]), node("Mul", ["s", "s"], ["m"]),
                          node("ReduceSum", ["m", "ax"], ["y"], keepdims=0)],
         {"a": Inp((3, 6), I64), "b": Inp((6,), I64)}, ["y"], {"ax": i64(1)}),
)

# -- views feeding other kernels, zero-size tensors, more fusion shapes -------------------------------------
_w = _rng.standard_normal((12, 7)).astype(np.float32)
add("views",
    Case("reduce_of_transpose", [node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
                                 node("ReduceSum", ["t", "ax"], ["y"], keepdims=0)],
         {"x": Inp((3, 4, 5))}, ["y"], {"ax": i64(1)}, **TRANS),
    Case("reduce_of_expand", [node("Expand", ["x", "s"], ["e"]), node("ReduceMax", ["e", "ax"], ["y"])],
         {"x": Inp((3, 1))}, ["y"], {"s": i64(3, 6), "ax": i64(0)}, opset=18, **EXACT),
    Case("reduce_of_reversed_slice", [node("Slice", ["x", "s", "e", "a", "st"], ["sl"]),
                                      node("ReduceSum", ["sl", "ax"], ["y"])],
         {"x": Inp((6, 40))}, ["y"], {"s": i64(-1), "e": i64(-100), "a": i64(1), "st": i64(-3), "ax": i64(1)},
         **TRANS),
    Case("reduce_then_reduce", [node("ReduceMax", ["x", "a1"], ["m"], keepdims=0),
                                node("ReduceSum", ["m", "a0"], ["y"], keepdims=0)],
         {"x": Inp((4, 5, 6))}, ["y"], {"a1": i64(2), "a0": i64(0)}, opset=18, **TRANS),
    Case("softmax_of_transpose", [node("Transpose", ["x"], ["t"], perm=[1, 0]), node("Softmax", ["t"], ["y"])],
         {"x": Inp((5, 3))}, ["y"], **TRANS),
    Case("softmax_of_expand", [node("Expand", ["x", "s"], ["e"]), node("Softmax", ["e"], ["y"], axis=0)],
         {"x": Inp((1, 4))}, ["y"], {"s": i64(3, 4)}, **TRANS),
    Case("concat_of_expand_and_slice", [node("Expand", ["a", "s"], ["e"]), node("Slice", ["b", "st", "en"], ["sl"]),
                                        node("Concat", ["e", "sl"], ["y"], axis=0)],
         {"a": Inp((1, 4)), "b": Inp((5, 4))}, ["y"], {"s": i64(2, 4), "st": i64(1), "en": i64(4)}),
    Case("matmul_of_transposed_slice", [node("Slice", ["a", "st", "en", "ax", "sp"], ["sl"]),
                                        node("Transpose", ["sl"], ["t"]), node("MatMul", ["t", "b"], ["y"])],
         {"a": Inp((9, 6)), "b": Inp((5, 3))}, ["y"], {"st": i64(8), "en": i64(-100), "ax": i64(0), "sp": i64(-2)},
         **mm_tol(5)),
    Case("matmul_of_expand", [node("Expand", ["a", "s"], ["e"]), node("MatMul", ["e", "b"], ["y"])],
         {"a": Inp((1, 4, 5)), "b": Inp((3, 5, 2))}, ["y"], {"s": i64(3, 4, 5)}, **mm_tol(5)),
    Case("view_of_view", [node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                          node("Slice", ["t", "st", "en", "ax", "sp"], ["sl"]),
                          node("Expand", ["sl", "s"], ["e"]), node("Add", ["e", "b"], ["y"])],
         {"x": Inp((3, 5, 1)), "b": Inp((2, 1, 3, 4))}, ["y"],
         {"st": i64(4), "en": i64(-100), "ax": i64(0), "sp": i64(-2), "s": i64(2, 1, 3, 4)}, **EXACT),
    Case("two_matmuls_added", [node("MatMul", ["a", "b"], ["m1"]), node("MatMul", ["c", "d"], ["m2"]),
                               node("Add", ["m1", "m2"], ["y"])],
         {"a": Inp((4, 6)), "b": Inp((6, 5)), "c": Inp((4, 3)), "d": Inp((3, 5))}, ["y"], **mm_tol(6)),
    Case("matmul_plus_transpose", [node("MatMul", ["a", "b"], ["m"]), node("Transpose", ["c"], ["ct"]),
                                   node("Add", ["m", "ct"], ["y"])],
         {"a": Inp((4, 6)), "b": Inp((6, 5)), "c": Inp((5, 4))}, ["y"], **mm_tol(6)),
    Case("matmul_then_reduce", [node("MatMul", ["a", "b"], ["m"]), node("ReduceSum", ["m", "ax"], ["y"])],
         {"a": Inp((4, 6)), "b": Inp((6, 5))}, ["y"], {"ax": i64(1)}, **mm_tol(30)),
    Case("reduce_then_matmul", [node("ReduceMean", ["a", "ax"], ["r"], keepdims=0), node("MatMul", ["r", "b"], ["y"])],
         {"a": Inp((4, 3, 6)), "b": Inp((6, 5))}, ["y"], {"ax": i64(1)}, opset=18, **mm_tol(6)),
    Case("matmul_scale_cols", [node("MatMul", ["x", "w"], ["m"]), node("Mul", ["m", "s"], ["y"])],
         {"x": Inp((5, 12))}, ["y"], {"w": _w, "s": _rng.standard_normal(7).astype(np.float32)}, **mm_tol(12)),
    Case("matmul_scale_rows", [node("MatMul", ["x", "w"], ["m"]), node("Mul", ["m", "s"], ["y"])],
         {"x": Inp((5, 12))}, ["y"], {"w": _w, "s": _rng.standard_normal((5, 1)).astype(np.float32)},
         **mm_tol(12)),
    Case("matmul_scale_scalar_first", [node("MatMul", ["x", "w"], ["m"]), node("Mul", ["s", "m"], ["y"])],
         {"x": Inp((5, 12))}, ["y"], {"w": _w, "s": f32(-0.75)}, **mm_tol(12)),
    Case("matmul_bias_scale", [node("MatMul", ["x", "w"], ["m"]), node("Add", ["m", "c"], ["a"]),
                               node("Mul", ["a", "s"], ["y"])],
         {"x": Inp((5, 12))}, ["y"], {"w": _w, "c": _rng.standard_normal(7).astype(np.float32),
                                      "s": _rng.standard_normal(7).astype(np.float32)}, **mm_tol(12)),
    Case("matmul_rowbias_scale", [node("MatMul", ["x", "w"], ["m"]), node("Add", ["c", "m"], ["a"]),
                                  node("Mul", ["s", "a"], ["y"])],
         {"x": Inp((5, 12))}, ["y"], {"w": _w, "c": _rng.standard_normal((5, 1)).astype(np.float32),
                                      "s": _rng.standard_normal((1, 7)).astype(np.float32)}, **mm_tol(12)),
    Case("matmul_scale_used_twice", [node("MatMul", ["x", "w"], ["m"]), node("Mul", ["m", "s"], ["y1"]),
                                     node("Relu", ["m"], ["y2"])],
         {"x": Inp((5, 12))}, ["y1", "y2"], {"w": _w, "s": _rng.standard_normal(7).astype(np.float32)},
         **mm_tol(12)),
    Case("matmul_3d_const_scale", [node("MatMul", ["x", "w"], ["m"]), node("Mul", ["m", "s"], ["y"])],
         {"x": Inp((2, 5, 12))}, ["y"], {"w": _w, "s": _rng.standard_normal(7).astype(np.float32)},
         **mm_tol(12)),
    Case("count_true", [node("Greater", ["x", "z"], ["g"]), node("Cast", ["g"], ["f"], to=1),
                        node("ReduceSum", ["f", "ax"], ["y"], keepdims=0)],
         {"x": Inp((4, 9))}, ["y"], {"z": f32(0), "ax": i64(1)}, **EXACT),
    Case("logic_chain", [node("Greater", ["a", "b"], ["g"]), node("Less", ["a", "c"], ["l"]),
                         node("And", ["g", "l"], ["n"]), node("Not", ["n"], ["y"])],
         {"a": Inp((3, 5), gen="small"), "b": Inp((5,), gen="small"), "c": Inp((3, 1), gen="small")}, ["y"]),
    single("Clip_min_gt_max", "Clip", [Inp((3, 5), gen="wide"), np.float32(1.0), np.float32(-1.0)], **EXACT),
)
add("graphs",
    Case("deep_chain", [node("Softmax", ["x"], ["a"]), node("Transpose", ["a"], ["at"]),
                        node("MatMul", ["at", "x"], ["b"]), node("Concat", ["b", "w"], ["c"], axis=0),
                        node("Softmax", ["c"], ["d"], axis=0), node("ReduceSum", ["d", "ax"], ["e"], keepdims=1),
                        node("MatMul", ["d", "x"], ["f"]), node("Sub", ["f", "e"], ["g"]),
                        node("LogSoftmax", ["g"], ["h"]), node("Concat", ["h", "g", "c"], ["y"], axis=1)],
         {"x": Inp((6, 6)), "w": Inp((3, 6))}, ["y"], {"ax": i64(0)}, **mm_tol(9)),
    Case("many_live_values", [node("Exp", ["x"], ["e1"]), node("Softmax", ["x"], ["s1"]), node("Relu", ["x"], ["r1"]),
                              node("Concat", ["e1", "s1", "r1"], ["c1"], axis=0),
                              node("Softmax", ["c1"], ["s2"], axis=0), node("Concat", ["s2", "c1"], ["c2"], axis=1),
                              node("ReduceMean", ["c2", "ax"], ["m"]), node("Sub", ["c2", "m"], ["y1"]),
                              node("Softmax", ["e1"], ["y2"], axis=0)],
         {"x": Inp((4, 5))}, ["y1", "y2"], {"ax": i64(1)}, opset=18, **TRANS),
    Case("output_and_its_reshape", [node("Relu", ["x"], ["r"]), node("Reshape", ["r", "s"], ["y"])],
         {"x": Inp((3, 4))}, ["r", "y"], {"s": i64(2, 6)}),
    Case("input_reshaped_to_output", [node("Reshape", ["x", "s"], ["y"]), node("Exp", ["x"], ["e"])],
         {"x": Inp((3, 4))}, ["y", "e"], {"s": i64(-1)}, **TRANS),
    Case("squeeze_unsqueeze_chain", [node("Unsqueeze", ["x", "a0"], ["u"]), node("Squeeze", ["u", "a0"], ["q"]),
                                     node("Flatten", ["q"], ["f"], axis=2), node("Softmax", ["f"], ["y"])],
         {"x": Inp((2, 3, 4))}, ["y"], {"a0": i64(1)}, **TRANS),
    Case("const_folding", [node("Add", ["c1", "c2"], ["c"]), node("Exp", ["c"], ["ce"]),
                           node("Mul", ["x", "ce"], ["y"])],
         {"x": Inp((2, 3))}, ["y"], {"c1": f32(0.5, 1.0, -1.0), "c2": f32(0.25, 0.0, 2.0)}, **TRANS),
    Case("const_only_output", [node("Add", ["c1", "c2"], ["y"]), node("Neg", ["x"], ["z"])],
         {"x": Inp((2,))}, ["y", "z"], {"c1": f32(0.5, 1.0, -1.0), "c2": f32(0.25, 0.0, 2.0)}),
    Case("expand_of_const_output", [node("Expand", ["c", "s"], ["y"]), node("Neg", ["x"], ["z"])],
         {"x": Inp((2,))}, ["y", "z"], {"c": f32(1.0, 2.0), "s": i64(3, 2)}),
    Case("same_value_in_two_subgraphs", [node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["y1"]),
                                         node("ReduceMax", ["s", "ax"], ["y2"], keepdims=0),
                                         node("Softmax", ["s"], ["y3"])],
         {"x": Inp((5, 8))}, ["y1", "y2", "y3"], {"ax": i64(1)}, opset=18, **TRANS),
    single("Softmax_long_strided", "Softmax", [Inp((300, 3), gen="wide")], {"axis": 0}, **TRANS),
    single("Pow_neg_base_frac_exp", "Pow", [Inp((3, 5)), np.float32(0.5)], **TRANS),
    single("Pow_neg_base_generic_exp", "Pow", [Inp((3, 5)), np.float32(1.5)], **TRANS),
    single("ReduceL1_int64", "ReduceL1", [Inp((3, 5), I64), i64(1)], opset=18),
    single("ReduceSumSquare_int64", "ReduceSumSquare", [Inp((3, 5), I64), i64(0)], opset=18),
    single("Reshape_allowzero_no_zero", "Reshape", [Inp((2, 3)), i64(3, 2)], {"allowzero": 1}),
    single("Reshape_allowzero_empty", "Reshape", [Inp((0, 3)), i64(3, 0)], {"allowzero": 1}),
    single("Slice_reverse_start_big", "Slice", [Inp((5, 4)), i64(100), i64(-100), i64(0), i64(-1)]),
    Case("Constant_scalar_output", [node("Constant", [], ["y"], value_float=1.5), node("Neg", ["x"], ["z"])],
         {"x": Inp((2,))}, ["y", "z"]),
    single("Gemm_beta0", "Gemm", [Inp((3, 4)), Inp((4, 5)), Inp((3, 5))], {"beta": 0.0}, **mm_tol(4)),
    single("Gemm_alpha0", "Gemm", [Inp((3, 4)), Inp((4, 5)), Inp((5,))], {"alpha": 0.0}, **mm_tol(4)),
    single("Unsqueeze_neg_multi", "Unsqueeze", [Inp((3, 4)), i64(-1, 0)]),
    single("Squeeze_unsorted_axes", "Squeeze", [Inp((1, 3, 1, 4)), i64(2, 0)]),
    single("Clip_opset10_max_attr", "Clip", [Inp((4, 17), gen="wide")], {"max": 0.25}, opset=10, group="graphs10",
           **EXACT),
)
add("zero_size",
    single("Add", "Add", [Inp((0, 3)), Inp((3,))]),
    single("Relu", "Relu", [Inp((2, 0, 3))]),
    single("ReduceSum_empty_axis", "ReduceSum", [Inp((3, 0)), i64(1)], {"keepdims": 0}),
    single("ReduceSum_empty_kept", "ReduceSum", [Inp((0, 3)), i64(1)], {"keepdims": 0}),
    single("Concat_empty_input", "Concat", [Inp((2, 0)), Inp((2, 3))], {"axis": 1}),
    single("MatMul_k0", "MatMul", [Inp((3, 0)), Inp((0, 4))]),
    single("MatMul_m0", "MatMul", [Inp((0, 5)), Inp((5, 4))]),
    single("Transpose", "Transpose", [Inp((0, 3))]),
    single("Softmax", "Softmax", [Inp((0, 3))]),
)

# -- float64 and int32 (aotc's other element types) --------------------------------------------------------
F64 = "float64"
_erf = np.vectorize(math.erf, otypes=[np.float64])
for _op, _gen, _tol in [("Add", "normal", EXACT), ("Exp", "wide", TRANS), ("Log", "pos", TRANS),
                        ("Tanh", "wide", TRANS), ("Sigmoid", "wide", TRANS), ("Sigmoid", "special", TRANS),
                        ("Sqrt", "pos", TRANS), ("Relu", "normal", EXACT), ("Abs", "normal", EXACT)]:
    _args = [Inp((3, 17), F64, _gen)] + ([Inp((17,), F64)] if _op == "Add" else [])
    add("f64", single(f"{_op}_{_gen}", _op, _args, **_tol))
add("f64",
    single("Pow_const2", "Pow", [Inp((3, 5), F64), np.float64(2.0)], **EXACT),
    single("Pow_tensor", "Pow", [Inp((3, 5), F64, "pos"), Inp((3, 5), F64, "unit")], **TRANS),
    single("ReduceSum", "ReduceSum", [Inp((3, 40), F64), i64(1)], **TRANS),
    single("ReduceMax", "ReduceMax", [Inp((3, 40), F64), i64(1)], opset=18, **EXACT),
    single("ReduceL2", "ReduceL2", [Inp((3, 40), F64), i64(1)], opset=18, **TRANS),
    single("Softmax", "Softmax", [Inp((3, 7), F64)], **TRANS),
    single("LogSoftmax", "LogSoftmax", [Inp((3, 7), F64)], **TRANS),
    single("MatMul", "MatMul", [Inp((4, 6), F64), Inp((6, 3), F64)], **mm_tol(6)),
    single("Gemm", "Gemm", [Inp((4, 6), F64), Inp((3, 6), F64), Inp((3,), F64)], {"transB": 1}, **mm_tol(6)),
    single("Concat", "Concat", [Inp((2, 3), F64), Inp((2, 2), F64)], {"axis": 1}),
    # onnxruntime has no double Erf or Gelu: math.erf is the reference.
    single("Erf", "Erf", [Inp((3, 17), F64, "wide")], reference=lambda f: [_erf(f["x0"])], **TRANS),
    single("Gelu", "Gelu", [Inp((3, 17), F64, "wide")], opset=20,
           reference=lambda f: [0.5 * f["x0"] * (1 + _erf(f["x0"] / np.sqrt(2)))], **TRANS),
    single("Softmax_axis0", "Softmax", [Inp((3, 4, 5), F64, "wide")], {"axis": 0}, **TRANS),
    Case("LogSoftmax_masked", [node("Add", ["x", "mask"], ["xm"]), node("LogSoftmax", ["xm"], ["y"])],
         {"x": Inp((3, 6), F64)}, ["y"], {"mask": np.triu(np.full((3, 6), -np.inf), 2)}, **TRANS),
    single("Clip", "Clip", [Inp((3, 5), F64), np.float64(-0.5), np.float64(0.5)], **EXACT),
    single("IsInf", "IsInf", [Inp((4, 6), F64, "special")]),
    single("Cast_to_f32", "Cast", [Inp((3, 5), F64)], {"to": 1}),
    single("Where", "Where", [Inp((3, 5), B), Inp((3, 5), F64), Inp((), F64)]),
)
for _op in ["Add", "Mul", "Sub", "Div", "Max", "Abs", "Neg"]:
    _args = [Inp((3, 5), "int32", "nz")] + ([Inp((5,), "int32", "nz")] if _op not in ("Abs", "Neg") else [])
    add("i32", single(_op, _op, _args))
add("i32",
    single("ReduceSum", "ReduceSum", [Inp((3, 5), "int32"), i64(1)]),
    single("MatMul", "MatMul", [Inp((3, 4), "int32"), Inp((4, 5), "int32")]),
    single("Less", "Less", [Inp((3, 5), "int32", "small"), Inp((5,), "int32", "small")]),
)

# -- expected failures: aotc bugs outside aotc/ops (see the reasons) ---------------------------------------
XFAIL: dict[str, tuple[str, type[BaseException]]] = {}


def _params() -> list:
    res = []
    for c in CASES:
        marks = list(c.marks)
        if c.id in XFAIL:
            reason, raises = XFAIL[c.id]
            marks.append(pytest.mark.xfail(reason=reason, raises=raises, strict=True))
            c.group = c.id  # alone, so that the bug cannot take its neighbours down
        c.group = f"{c.group}@{c.opset}"
        res.append(pytest.param(c, id=c.id, marks=marks))
    return res


PARAMS = _params()
_ids = [c.id for c in CASES]
assert len(_ids) == len(set(_ids)), "duplicate case ids"


GROUPS = chunk_groups(CASES, GROUP_SIZE)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> GroupRunner:
    return GroupRunner(tmp_path_factory, GROUPS)


@pytest.mark.parametrize("case", PARAMS)
def test_op(case: Case, runner: GroupRunner) -> None:
    runner.check(case)
