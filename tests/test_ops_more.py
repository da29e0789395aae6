"""Differential tests of the newer ops (indexing, movement, generators, extra elementwise math)
against onnxruntime, in the style of test_ops.py: each case is one test id, and the cases of a
section compile together as independent subgraphs of one model."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_helpers import Case, GroupRunner, Inp, add_cases, chunk_groups, f32, i64, single

pytest.importorskip("onnxruntime")

F, I64, I32, B = "float32", "int64", "int32", "bool"


CASES: list[Case] = []


def add(section: str, *cases: Case) -> None:
    add_cases(CASES, section, *cases)


add("elementwise",
    *[single(op, op, [Inp((3, 7), F, gen)]) for op, gen in [
        ("Tan", "unit"), ("Asin", "unit"), ("Acos", "unit"), ("Atan", "wide"), ("Sinh", "unit"),
        ("Cosh", "unit"), ("Asinh", "wide"), ("Atanh", "unit")]],
    single("Mish", "Mish", [Inp((3, 7), F, "wide")], opset=18),
    single("Acosh", "Acosh", [Inp((3, 7), F, "pos")], {}, rtol=1e-4, atol=1e-4),
    single("Mod_int", "Mod", [Inp((4, 5), I64), Inp((5,), I64, "nz")]),
    single("Mod_int32_fmod", "Mod", [Inp((4, 5), I32), Inp((5,), I32, "nz")], {"fmod": 1}),
    single("Mod_float_fmod", "Mod", [Inp((4, 5), F, "wide"), Inp((5,), F, "pos")], {"fmod": 1}),
    single("BitShift_left", "BitShift", [Inp((6,), "uint32", "nz"), np.array([1, 2, 3, 0, 4, 5], np.uint32)],
           {"direction": "LEFT"}),
    single("BitShift_right", "BitShift", [Inp((6,), "uint8", "nz"), np.array([1, 2, 3, 0, 1, 2], np.uint8)],
           {"direction": "RIGHT"}),
    single("BitwiseAnd", "BitwiseAnd", [Inp((4, 5), I32), Inp((5,), I32)], opset=18),
    single("BitwiseXor", "BitwiseXor", [Inp((4, 5), I64), Inp((4, 5), I64)], opset=18),
    single("BitwiseNot", "BitwiseNot", [Inp((4, 5), I32)], opset=18),
    single("CastLike", "CastLike", [Inp((3, 4), F, "wide"), np.zeros(1, np.int32)]),
)

add("movement",
    single("Tile", "Tile", [Inp((2, 3, 4)), i64(2, 1, 3)]),
    single("Pad_constant", "Pad", [Inp((2, 3, 4)), i64(0, 1, 2, 0, 2, 1), f32(1.5)]),
    single("Pad_negative", "Pad", [Inp((2, 5, 4)), i64(0, -1, 2, 0, -2, 1)]),
    single("Pad_reflect", "Pad", [Inp((3, 5)), i64(2, 3, 1, 4)], {"mode": "reflect"}),
    single("Pad_edge", "Pad", [Inp((3, 5)), i64(2, 3, 1, 4)], {"mode": "edge"}),
    single("Pad_wrap", "Pad", [Inp((3, 5)), i64(2, 3, 1, 4)], {"mode": "wrap"}, opset=19),
    single("Pad_axes", "Pad", [Inp((2, 3, 4)), i64(1, 2), None, i64(-1)], opset=18),
    single("DepthToSpace_DCR", "DepthToSpace", [Inp((2, 8, 3, 2))], {"blocksize": 2}),
    single("DepthToSpace_CRD", "DepthToSpace", [Inp((2, 8, 3, 2))], {"blocksize": 2, "mode": "CRD"}),
    single("SpaceToDepth", "SpaceToDepth", [Inp((2, 3, 4, 6))], {"blocksize": 2}),
    single("Split_sizes", "Split", [Inp((5, 7)), i64(2, 4, 1)], {"axis": 1}, n_out=3),
    single("Split_equal", "Split", [Inp((6, 3))], {}, n_out=3),
    single("Split_uneven", "Split", [Inp((7, 3))], {"num_outputs": 3}, n_out=3, opset=18),
    single("Trilu_upper", "Trilu", [Inp((2, 4, 5))], {}, opset=14),
    single("Trilu_lower_k", "Trilu", [Inp((4, 5)), i64(-1)], {"upper": 0}, opset=14),
    single("Einsum_matmul", "Einsum", [Inp((3, 4)), Inp((4, 5))], {"equation": "ij,jk->ik"}, rtol=1e-4),
    single("Einsum_batch", "Einsum", [Inp((2, 3, 4)), Inp((2, 4, 5))], {"equation": "bij,bjk->bik"}, rtol=1e-4),
    single("Einsum_transpose", "Einsum", [Inp((2, 3, 4))], {"equation": "abc->cba"}),
    single("Einsum_sum", "Einsum", [Inp((3, 4))], {"equation": "ij->"}, rtol=1e-4),
    single("Einsum_ellipsis", "Einsum", [Inp((2, 3, 4)), Inp((4,))], {"equation": "...j,j->..."}, rtol=1e-4),
)
for _mode, _ctm in [("nearest", "asymmetric"), ("nearest", "half_pixel"), ("linear", "half_pixel"),
                    ("linear", "align_corners"), ("linear", "pytorch_half_pixel"), ("linear", "asymmetric"),
                    ("cubic", "half_pixel")]:
    add("resize", single(f"{_mode}_{_ctm}_up", "Resize", [Inp((1, 2, 3, 4)), None, f32(1, 1, 2.0, 1.5)],
                         {"mode": _mode, "coordinate_transformation_mode": _ctm}, rtol=1e-4, atol=1e-5),
        single(f"{_mode}_{_ctm}_down", "Resize", [Inp((1, 2, 6, 8)), None, None, i64(1, 2, 3, 5)],
               {"mode": _mode, "coordinate_transformation_mode": _ctm}, rtol=1e-4, atol=1e-5))

def _lse(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = np.max(x, axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        safe = np.where(np.isfinite(m), m, 0)
        r = safe + np.log(np.exp(x - safe).sum(1, keepdims=True))
    return r.astype(np.float32)


add("axis",
    single("ArgMax", "ArgMax", [Inp((3, 4, 5), F, "small")], {"axis": 1}),
    single("ArgMax_last", "ArgMax", [Inp((3, 4, 5), F, "small")], {"axis": -1, "keepdims": 0,
                                                                     "select_last_index": 1}),
    single("ArgMin", "ArgMin", [Inp((3, 4, 5), I64)], {"axis": 0}),
    single("CumSum", "CumSum", [Inp((3, 4)), i64(1)], rtol=1e-5),
    single("CumSum_rev_excl", "CumSum", [Inp((3, 4)), i64(0)], {"reverse": 1, "exclusive": 1}),
    single("TopK", "TopK", [Inp((3, 6), F, "small"), i64(3)], {"axis": 1}, n_out=2),
    single("TopK_smallest", "TopK", [Inp((5, 4)), i64(2)], {"axis": 0, "largest": 0}, n_out=2),
    single("Hardmax", "Hardmax", [Inp((3, 5))]),
    single("ReduceLogSumExp_large", "ReduceLogSumExp", [Inp((3, 5), F, "special"), i64(1)], opset=18,
           reference=lambda f: [_lse(f["x0"])]),
)


add("gather",
    single("GatherElements", "GatherElements", [Inp((3, 4)), np.array([[0, 2, 1, -1], [1, 0, 0, 2]])],
           {"axis": 0}),
    single("GatherND", "GatherND", [Inp((2, 3, 4)), np.array([[0, 1], [1, 2]])]),
    single("ScatterElements_add", "ScatterElements", [Inp((3, 4)), np.array([[0, 2], [1, 0]]), Inp((2, 2))],
           {"axis": 1, "reduction": "add"}, opset=18),
    single("ScatterND", "ScatterND", [Inp((4, 3)), np.array([[1], [3]]), Inp((2, 3))]),
    single("OneHot", "OneHot", [Inp((2, 3), I64, "small"), i64(4), f32(0, 2)], {"axis": 1}),
    single("OneHot_folded", "OneHot", [np.array([1, 0, 3, -1]), i64(4), f32(0, 2)], {"axis": 0}),
)
add("generators",
    Case("Range", [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])],
         {"x": Inp((5,))}, ["y"], {"s": np.float32(1), "l": np.float32(6), "d": np.float32(1)}),
    Case("ConstantOfShape", [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                              value=helper.make_tensor("v", 1, [1], [2.5])),
                             helper.make_node("Mul", ["c", "x"], ["y"])],
         {"x": Inp((2, 3))}, ["y"], {"shape": i64(2, 3)}),
    Case("EyeLike", [helper.make_node("EyeLike", ["x"], ["e"], k=1), helper.make_node("Add", ["e", "x"], ["y"])],
         {"x": Inp((3, 4))}, ["y"]),
)


add("nn",
    single("Det", "Det", [Inp((2, 4, 4))], rtol=1e-4, atol=1e-5),
    single("LpNormalization_l2", "LpNormalization", [Inp((3, 5))], {"axis": 1}),
    single("LpNormalization_l1", "LpNormalization", [Inp((3, 5))], {"axis": 0, "p": 1}),
    single("LRN", "LRN", [Inp((2, 5, 3, 3))], {"size": 3, "alpha": 0.01}, rtol=1e-4),
    single("Compress", "Compress", [Inp((4, 3)), np.array([True, False, True, True])], {"axis": 0}),
    single("Compress_flat", "Compress", [Inp((2, 3)), np.array([False, True, True, False, True])]),
    single("ReverseSequence", "ReverseSequence", [Inp((4, 3, 2)), i64(4, 1, 3)],
           {"time_axis": 0, "batch_axis": 1}),
    single("CenterCropPad", "CenterCropPad", [Inp((5, 4, 3)), i64(3, 7)], {"axes": [0, 1]}, opset=18),
    single("NLL_mean_weight", "NegativeLogLikelihoodLoss",
           [Inp((3, 4, 2)), np.array([[0, 3], [1, 2], [2, 0]]), f32(0.5, 1, 2, 1)], opset=13),
    single("NLL_none_ignore", "NegativeLogLikelihoodLoss", [Inp((3, 4)), np.array([0, 3, 1])],
           {"reduction": "none", "ignore_index": 3}, opset=13),
    single("SCE_sum_logprob", "SoftmaxCrossEntropyLoss", [Inp((3, 4)), np.array([0, 3, 1])],
           {"reduction": "sum"}, n_out=2, opset=13),
    single("AffineGrid", "AffineGrid", [Inp((2, 2, 3)), i64(2, 3, 4, 5)], {"align_corners": 1}, opset=20),
    single("DequantizeLinear_axis", "DequantizeLinear",
           [Inp((2, 3, 4), "uint8"), f32(0.5, 0.25, 2), np.array([1, 2, 3], np.uint8)], {"axis": 1}),
    single("QuantizeLinear", "QuantizeLinear", [Inp((3, 4), F, "wide"), np.float32(0.05), np.int8(-3)]),
)


# float16 goes through C's _Float16; numpy is the reference (onnxruntime's CPU kernels lack most
# half-precision ops).
H = "float16"


def _to_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # 3.4e38 -> inf is the point
        return x.astype(np.float16)


add("f16",
    single("Add", "Add", [Inp((3, 5), H), Inp((5,), H)], reference=lambda f: [f["x0"] + f["x1"]]),
    single("Cast_from_f32", "Cast", [Inp((4, 6), F, "special")], {"to": 10},
           reference=lambda f: [_to_f16(f["x0"])]),
    single("Cast_to_f32", "Cast", [Inp((3, 5), H)], {"to": 1}, reference=lambda f: [f["x0"].astype(np.float32)]),
    single("Exp", "Exp", [Inp((3, 5), H, "unit")], rtol=1e-3, atol=1e-3,
           reference=lambda f: [np.exp(f["x0"].astype(np.float32)).astype(np.float16)]),
    single("ReduceMax", "ReduceMax", [Inp((3, 5), H)], {"axes": [1]},
           reference=lambda f: [f["x0"].max(1, keepdims=True)]),
    single("Where", "Where", [Inp((3, 5), B), Inp((3, 5), H), Inp((), H)],
           reference=lambda f: [np.where(f["x0"], f["x1"], f["x2"])]),
)


GROUPS = chunk_groups(CASES, 64, by_opset=True)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> GroupRunner:
    return GroupRunner(tmp_path_factory, GROUPS)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_op(case: Case, runner: GroupRunner) -> None:
    runner.check(case)

