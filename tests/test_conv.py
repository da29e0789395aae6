"""Differential tests of convolution and pooling against onnxruntime.

Cases of a section compile together as one model (independent subgraphs) to keep C compile time low;
a failing group is recompiled case by case so only the faulty case fails. Fusion tests check the
kernel count of the compiled library too.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import (
    Case,
    GroupRunner,
    Inp,
    add_cases,
    assert_close,
    build_model,
    build_model_and_feeds,
    chunk_groups,
    run_generated_test_under_sanitizers,
    run_ort,
    single,
)

import aotc
from aotc.compiler import compile_model

pytest.importorskip("onnxruntime")

F, D = "float32", "float64"
GROUP_SIZE = 40
CASES: list[Case] = []
_rng = np.random.default_rng(7)


def w(*shape: int, dtype: str = F) -> np.ndarray:
    return _rng.standard_normal(shape).astype(dtype)


def tol(k: int) -> dict:
    """Tolerances for sums of k products (summation order differs from onnxruntime's)."""
    return {"rtol": 1e-4, "atol": 1e-5 * max(1.0, k ** 0.5)}


def add(section: str, *cases: Case) -> None:
    add_cases(CASES, section, *cases)


# -- Conv ------------------------------------------------------------------------------------------
# (id, x shape, w shape, attrs); weights are constants (the fast paths) unless the id says "rt".
CONV = [
    ("1d", (1, 3, 11), (4, 3, 3), {}),
    ("1d_pad_stride", (2, 3, 12), (5, 3, 4), {"pads": [2, 1], "strides": [2]}),
    ("1d_dil", (1, 2, 13), (3, 2, 3), {"dilations": [3], "pads": [1, 2]}),
    ("2d", (1, 3, 7, 9), (4, 3, 3, 3), {}),
    ("2d_pad1", (1, 8, 9, 10), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("2d_pad_asym", (1, 5, 8, 7), (6, 5, 3, 2), {"pads": [0, 1, 2, 0]}),
    ("2d_stride2", (1, 4, 11, 10), (7, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    # Weight blocks over 64 KB: the sum runs over blocks of 64 input channels (the last one partial).
    ("2d_ci_blocks", (1, 150, 7, 7), (40, 150, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("2d_ci_blocks_nopad_batch2", (2, 130, 6, 6), (16, 130, 3, 3), {}),
    ("2d_ci_blocks_5x5_s2", (1, 100, 9, 8), (20, 100, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ("2d_stride_mixed", (1, 4, 10, 13), (3, 4, 2, 3), {"strides": [3, 2]}),
    ("2d_dil", (1, 3, 12, 12), (5, 3, 3, 3), {"dilations": [2, 3], "pads": [2, 2, 1, 3]}),
    ("2d_1x1", (1, 16, 7, 7), (24, 16, 1, 1), {}),
    ("2d_1x1_stride2", (1, 8, 9, 9), (12, 8, 1, 1), {"strides": [2, 2]}),
    ("2d_1x1_batch_odd", (2, 5, 5, 7), (13, 5, 1, 1), {}),
    ("2d_1x1_group", (1, 8, 6, 6), (10, 4, 1, 1), {"group": 2}),
    ("2d_1x1_big_ci", (1, 70, 5, 5), (9, 70, 1, 1), {}),
    ("2d_1x1_pad", (1, 4, 5, 5), (6, 4, 1, 1), {"pads": [1, 0, 0, 1]}),
    # 1x1 with channels in the lanes (AVX2, fewer outputs than inputs or small planes): chunks with a
    # partial last tile, blocks of input channels, a partial last channel block, batch 2.
    ("2d_1x1_project", (1, 40, 13, 11), (24, 40, 1, 1), {}),
    ("2d_1x1_project_ci_blocks", (1, 130, 9, 11), (17, 130, 1, 1), {}),
    ("2d_1x1_project_wide", (2, 300, 5, 7), (70, 300, 1, 1), {}),
    ("2d_1x1_project_group", (1, 24, 7, 9), (6, 12, 1, 1), {"group": 2}),
    # Expanding 1x1 on a larger plane: the rows path.
    ("2d_1x1_expand", (1, 8, 9, 10), (24, 8, 1, 1), {}),
    ("1d_1x1", (1, 6, 40), (7, 6, 1), {}),
    ("3d_1x1", (1, 4, 3, 4, 5), (5, 4, 1, 1, 1), {}),
    ("2d_7x7_s2", (1, 3, 20, 20), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("2d_batch3", (3, 4, 6, 6), (5, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("2d_many_out", (1, 6, 5, 5), (37, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("2d_tiny_out", (1, 4, 3, 3), (9, 4, 3, 3), {}),
    ("2d_group2", (1, 6, 7, 7), (8, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ("2d_group3_batch2", (2, 9, 6, 5), (6, 3, 2, 2), {"group": 3}),
    ("2d_depthwise", (1, 8, 10, 9), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ("2d_depthwise_s2", (2, 5, 11, 11), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("2d_depthwise_mult2", (1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "pads": [0, 1, 1, 0]}),
    ("2d_depthwise_large", (1, 2, 66, 65), (2, 1, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    # Rows outside the input read a shared zero row; edge columns are unrolled or (many taps) looped.
    ("2d_depthwise_large_dil", (1, 2, 66, 65), (2, 1, 3, 3), {"group": 2, "pads": [2, 1, 2, 3],
                                                              "dilations": [2, 2]}),
    ("2d_depthwise_large_s2_asym", (1, 2, 67, 70), (2, 1, 3, 3), {"group": 2, "pads": [1, 0, 0, 1],
                                                                  "strides": [2, 2]}),
    ("2d_depthwise_s32_dil", (1, 3, 13, 12), (6, 1, 3, 2), {"group": 3, "pads": [2, 1, 1, 0],
                                                            "strides": [3, 2], "dilations": [2, 3]}),
    # Phase path: rows too narrow to split in place go through a padded row copy; small planes are
    # double-buffered (the next channel copied before this one is computed); wide rows are computed
    # straight into the output.
    ("2d_depthwise_s2_narrow", (2, 6, 14, 14), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("2d_depthwise_s2_narrow_mult2", (1, 4, 13, 15), (8, 1, 3, 3), {"group": 4, "pads": [0, 0, 1, 1],
                                                                    "strides": [2, 2]}),
    ("2d_depthwise_s2_wide", (1, 3, 12, 100), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("1d_depthwise_s2", (2, 3, 17), (3, 1, 5), {"group": 3, "pads": [2, 1], "strides": [2]}),
    ("1d_depthwise_large", (1, 2, 5000), (2, 1, 3), {"group": 2, "pads": [1, 1]}),
    ("2d_depthwise_5x5_dil", (1, 3, 12, 12), (3, 1, 5, 5), {"group": 3, "pads": [4, 4, 4, 4], "dilations": [2, 2]}),
    ("2d_same_upper", (1, 3, 8, 7), (4, 3, 3, 4), {"auto_pad": "SAME_UPPER"}),
    ("2d_same_lower", (1, 3, 8, 7), (4, 3, 4, 3), {"auto_pad": "SAME_LOWER"}),
    ("2d_same_upper_s2", (1, 3, 9, 8), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("2d_same_lower_s2", (1, 3, 9, 8), (4, 3, 2, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ("2d_valid", (1, 3, 8, 7), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 1]}),
    ("2d_notset", (1, 3, 6, 6), (2, 3, 3, 3), {"auto_pad": "NOTSET", "pads": [1, 0, 1, 0]}),
    ("2d_kernel_shape_attr", (1, 2, 6, 6), (3, 2, 3, 3), {"kernel_shape": [3, 3]}),
    ("3d", (1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ("3d_stride_dil", (2, 2, 7, 6, 8), (4, 2, 2, 3, 2), {"strides": [2, 1, 2], "dilations": [1, 2, 1]}),
    ("3d_group", (1, 4, 5, 5, 5), (4, 2, 3, 1, 3), {"group": 2, "auto_pad": "SAME_UPPER"}),
    ("3d_depthwise", (1, 3, 5, 6, 4), (3, 1, 3, 3, 3), {"group": 3, "pads": [1, 1, 1, 1, 1, 1]}),
    ("3d_depthwise_5x5x5", (1, 2, 4, 5, 6), (2, 1, 5, 5, 5), {"group": 2, "pads": [2] * 6}),
]
for _id, _x, _w, _a in CONV:
    k = _w[1] * int(np.prod(_w[2:]))
    add("conv", single(_id, "Conv", [Inp(_x), w(*_w)], _a, **tol(k)))
    add("conv", single(_id + "_bias", "Conv", [Inp(_x), w(*_w), w(_w[0])], _a, **tol(k)))
add("conv",
    single("rt_weights", "Conv", [Inp((1, 4, 7, 7)), Inp((6, 4, 3, 3)), Inp((6,))], {"pads": [1, 1, 1, 1]}, **tol(36)),
    single("rt_weights_group", "Conv", [Inp((2, 4, 6, 5)), Inp((6, 2, 2, 3))], {"group": 2, "strides": [2, 1]},
           **tol(12)),
    single("rt_depthwise", "Conv", [Inp((1, 3, 6, 6)), Inp((3, 1, 3, 3))], {"group": 3, "pads": [1, 1, 1, 1]},
           **tol(9)),
    single("f64", "Conv", [Inp((1, 3, 7, 6), D), w(4, 3, 3, 3, dtype=D), w(4, dtype=D)], {"pads": [1, 1, 1, 1]}),
    single("f64_depthwise", "Conv", [Inp((1, 3, 7, 6), D), w(3, 1, 3, 3, dtype=D)], {"group": 3}),
    single("f64_1d", "Conv", [Inp((2, 2, 9), D), Inp((3, 2, 3), D)], {"strides": [2]}),
)

# -- ConvTranspose ---------------------------------------------------------------------------------
CONVT = [
    ("1d", (1, 3, 6), (3, 2, 3), {}),
    ("1d_stride_pads", (2, 2, 5), (2, 3, 4), {"strides": [2], "pads": [1, 2]}),
    ("2d", (1, 3, 4, 5), (3, 4, 3, 3), {}),
    ("2d_stride2", (1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2]}),
    ("2d_stride_pads_outpad", (1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 1],
                                                          "output_padding": [1, 2]}),
    ("2d_dil", (1, 2, 4, 4), (2, 2, 3, 2), {"dilations": [2, 3]}),
    ("2d_group", (2, 4, 3, 4), (4, 3, 2, 2), {"group": 2, "strides": [2, 2]}),
    ("2d_output_shape", (1, 2, 4, 4), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ("2d_output_shape_upper", (1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 9],
                                                          "auto_pad": "SAME_UPPER"}),
    ("2d_same_upper", (1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("2d_same_lower", (1, 2, 3, 4), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("2d_valid", (1, 2, 3, 4), (2, 2, 3, 2), {"auto_pad": "VALID"}),
    ("3d", (1, 2, 3, 4, 3), (2, 2, 3, 2, 2), {"strides": [1, 2, 2], "pads": [1, 0, 0, 1, 1, 0]}),
]
for _id, _x, _w, _a in CONVT:
    add("convt", single(_id, "ConvTranspose", [Inp(_x), w(*_w)], _a, **tol(27)))
    add("convt", single(_id + "_bias", "ConvTranspose", [Inp(_x), Inp(_w), w(_w[1] * _a.get("group", 1))],
                        _a, **tol(27)))
add("convt", single("f64", "ConvTranspose", [Inp((1, 2, 4, 3), D), w(2, 3, 3, 3, dtype=D)], {"strides": [2, 2]}))

# -- pooling ---------------------------------------------------------------------------------------
POOL = [
    ("1d", (1, 2, 11), {"kernel_shape": [3]}),
    ("1d_stride_pad", (2, 3, 10), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ("2d", (1, 3, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("2d_pads", (1, 2, 7, 8), {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}),
    ("2d_resnet", (1, 4, 16, 16), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("2d_ceil", (1, 2, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("2d_ceil_pads", (1, 2, 7, 7), {"kernel_shape": [2, 3], "strides": [2, 3], "pads": [1, 1, 0, 1],
                                    "ceil_mode": 1}),
    ("2d_same_upper", (1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("2d_same_lower", (1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ("2d_valid", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 1], "auto_pad": "VALID"}),
    ("3d", (1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),
]
for _id, _x, _a in POOL:
    add("pool", single("max_" + _id, "MaxPool", [Inp(_x)], _a))
    add("pool", single("avg_" + _id, "AveragePool", [Inp(_x)], _a))
    add("pool", single("avg_incl_" + _id, "AveragePool", [Inp(_x)], {**_a, "count_include_pad": 1}))
    if "ceil_mode" not in _a:
        add("pool", single("lp_" + _id, "LpPool", [Inp(_x)], _a, opset=18))
add("pool",
    single("max_dil", "MaxPool", [Inp((1, 2, 9, 10))], {"kernel_shape": [2, 3], "dilations": [2, 2],
                                                      "pads": [1, 1, 1, 1]}),
    single("max_dil_ceil", "MaxPool", [Inp((1, 2, 10, 9))], {"kernel_shape": [3, 2], "dilations": [2, 3],
                                                            "strides": [2, 2], "ceil_mode": 1}),
    single("max_storage_order", "MaxPool", [Inp((1, 2, 6, 6))], {"kernel_shape": [2, 2], "storage_order": 1}),
    single("max_indices", "MaxPool", [Inp((2, 3, 6, 7))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                           "pads": [1, 1, 1, 1]}, n_out=2),
    single("max_indices_storage_order", "MaxPool", [Inp((1, 2, 5, 6))],
           {"kernel_shape": [2, 3], "storage_order": 1}, n_out=2),
    single("max_indices_3d", "MaxPool", [Inp((1, 2, 4, 5, 4))], {"kernel_shape": [2, 2, 2]}, n_out=2),
    single("avg_dil_opset19", "AveragePool", [Inp((1, 2, 9, 10))], {"kernel_shape": [2, 3], "dilations": [2, 2],
                                                                   "pads": [1, 1, 1, 1]}, opset=19),
    single("avg_dil_incl_opset19", "AveragePool", [Inp((1, 2, 9, 10))],
           {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, opset=19),
    single("avg_ceil_incl", "AveragePool", [Inp((1, 2, 8, 8))],
           {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
            "count_include_pad": 1}),
    single("lp_p1", "LpPool", [Inp((1, 2, 6, 7))], {"kernel_shape": [2, 2], "p": 1}),
    single("lp_p3", "LpPool", [Inp((1, 2, 6, 7))], {"kernel_shape": [3, 2], "p": 3, "strides": [2, 1]}, rtol=1e-4),
    single("gap_2d", "GlobalAveragePool", [Inp((2, 5, 7, 6))]),
    single("gap_1d", "GlobalAveragePool", [Inp((1, 3, 9))]),
    single("gap_3d", "GlobalAveragePool", [Inp((1, 2, 3, 4, 5))]),
    single("gmp_2d", "GlobalMaxPool", [Inp((2, 5, 7, 6))]),
    single("gmp_3d", "GlobalMaxPool", [Inp((1, 2, 3, 4, 5))]),
    single("max_f64", "MaxPool", [Inp((1, 2, 6, 6), D)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    single("avg_f64", "AveragePool", [Inp((1, 2, 6, 6), D)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    single("gap_f64", "GlobalAveragePool", [Inp((1, 2, 6, 6), D)]),
)


# -- fusion ----------------------------------------------------------------------------------------
def node(op: str, ins: list[str], outs: list[str], **attrs) -> object:
    return helper.make_node(op, ins, outs, **attrs)


def bn_consts(c: int) -> dict[str, np.ndarray]:
    return {"s": _rng.uniform(0.5, 2, c).astype(np.float32), "b": w(c),
            "mu": w(c), "var": _rng.uniform(0.5, 2, c).astype(np.float32)}


# (id, case, expected number of kernels)
FUSED: list[tuple[Case, int]] = [
    (Case("conv_bn_relu", [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
                           node("Relu", ["bn"], ["y"])],
          {"x": Inp((1, 8, 9, 9))}, ["y"], {"w": w(16, 8, 3, 3), **bn_consts(16)}, **tol(72)), 1),
    (Case("conv_bias_bn_relu_dw", [node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], group=8),
                                   node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
                                   node("Clip", ["bn", "lo", "hi"], ["y"])],
          {"x": Inp((1, 8, 9, 9))}, ["y"],
          {"w": w(8, 1, 3, 3), "cb": w(8), "lo": np.float32(0), "hi": np.float32(6), **bn_consts(8)},
          **tol(9)), 1),
    (Case("conv_bn_residual_relu", [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                    node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
                                    node("Add", ["bn", "x"], ["r"]), node("Relu", ["r"], ["y"])],
          {"x": Inp((2, 8, 6, 7))}, ["y"], {"w": w(8, 8, 3, 3), **bn_consts(8)}, **tol(72)), 1),
    (Case("conv_ci_blocks_silu", [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                  node("Sigmoid", ["c"], ["sg"]), node("Mul", ["c", "sg"], ["y"])],
          {"x": Inp((1, 130, 6, 6))}, ["y"], {"w": w(24, 130, 3, 3)}, **tol(1170)), 1),
    (Case("conv_hardswish", [node("Conv", ["x", "w", "cb"], ["c"], strides=[2, 2]),
                             node("HardSwish", ["c"], ["y"])],
          {"x": Inp((1, 4, 9, 9))}, ["y"], {"w": w(6, 4, 3, 3), "cb": w(6)}, **tol(36)), 1),
    (Case("conv_1d_bias_bcast_relu", [node("Conv", ["x", "w"], ["c"]), node("Add", ["c", "t"], ["a"]),
                                      node("Relu", ["a"], ["y"])],
          {"x": Inp((1, 4, 9))}, ["y"], {"w": w(5, 4, 3), "t": w(5, 1)}, **tol(12)), 1),
    (Case("conv_3d_bn", [node("Conv", ["x", "w"], ["c"]),
                         node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["y"])],
          {"x": Inp((1, 2, 4, 5, 4))}, ["y"], {"w": w(3, 2, 2, 2, 2), **bn_consts(3)}, **tol(16)), 1),
    (Case("conv_rt_weights_relu", [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["y"])],
          {"x": Inp((1, 3, 6, 6)), "w": Inp((4, 3, 3, 3))}, ["y"], **tol(27)), 1),
    (Case("conv_mul_residual_spatial", [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                        node("Mul", ["c", "m"], ["p"]), node("Add", ["p", "r"], ["y"])],
          {"x": Inp((1, 3, 5, 6)), "m": Inp((1, 1, 5, 6)), "r": Inp((4, 1, 1))}, ["y"],
          {"w": w(4, 3, 3, 3)}, **tol(27)), 1),
    (Case("conv1x1_bn_residual_relu", [node("Conv", ["x", "w"], ["c"]),
                                       node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
                                       node("Add", ["r", "bn"], ["a"]), node("Relu", ["a"], ["y"])],
          {"x": Inp((2, 12, 5, 6)), "r": Inp((2, 7, 5, 6))}, ["y"], {"w": w(7, 12, 1, 1), **bn_consts(7)},
          **tol(12)), 1),
    (Case("dw_residual_spatial", [node("Conv", ["x", "w"], ["c"], group=4, pads=[1, 1, 1, 1]),
                                  node("Mul", ["c", "m"], ["p"]), node("Add", ["p", "x"], ["y"])],
          {"x": Inp((1, 4, 6, 7)), "m": Inp((1, 6, 1))}, ["y"], {"w": w(4, 1, 3, 3)}, **tol(9)), 1),
    (Case("dw_large_residual_relu", [node("Conv", ["x", "w", "cb"], ["c"], group=2, pads=[1, 1, 1, 1]),
                                     node("Add", ["c", "x"], ["a"]), node("Relu", ["a"], ["y"])],
          {"x": Inp((1, 2, 66, 66))}, ["y"], {"w": w(2, 1, 3, 3), "cb": w(2)}, **tol(9)), 1),
    # The tiled path's transposed write-out (AVX2): a stride-2 stem-like conv with a Clip, and a
    # residual Add over several write-out steps, a partial last tile and a partial channel block.
    (Case("conv_stem_s2_clip", [node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                                node("Clip", ["c", "lo", "hi"], ["y"])],
          {"x": Inp((1, 3, 45, 37))}, ["y"], {"w": w(21, 3, 3, 3), "cb": w(21), "lo": np.float32(0),
                                              "hi": np.float32(1.5)}, **tol(27)), 1),
    (Case("conv_tiled_residual_relu", [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                       node("Add", ["c", "r"], ["a"]), node("Relu", ["a"], ["y"])],
          {"x": Inp((2, 5, 23, 19)), "r": Inp((2, 13, 23, 19))}, ["y"], {"w": w(13, 5, 3, 3)}, **tol(45)), 1),
    # Depthwise row path: interiors of exactly one vector and of a vector and a few columns (the
    # last block overlaps the one before), with a residual Add.
    (Case("dw_rows_overlap_residual", [node("Conv", ["x", "w", "cb"], ["c"], group=3, pads=[1, 1, 1, 1]),
                                       node("Add", ["c", "x"], ["y"])],
          {"x": Inp((1, 3, 70, 67))}, ["y"], {"w": w(3, 1, 3, 3), "cb": w(3)}, **tol(9)), 1),
    (Case("dw_rows_one_vector", [node("Conv", ["x", "w"], ["c"], group=2, pads=[0, 1, 0, 1]),
                                 node("Clip", ["c", "lo", "hi"], ["y"])],
          {"x": Inp((1, 2, 500, 10))}, ["y"], {"w": w(2, 1, 3, 3), "lo": np.float32(-0.5),
                                               "hi": np.float32(0.5)}, **tol(9)), 1),
    # MobileNet's project conv: 1x1, fewer outputs than inputs, residual Add (then a Clip to cover
    # both epilogue kinds); odd plane sizes and channel counts, input channels in blocks.
    (Case("conv1x1_project_residual_clip", [node("Conv", ["x", "w", "cb"], ["c"]),
                                            node("Add", ["c", "r"], ["a"]), node("Clip", ["a", "lo", "hi"], ["y"])],
          {"x": Inp((1, 150, 11, 13)), "r": Inp((1, 19, 11, 13))}, ["y"],
          {"w": w(19, 150, 1, 1), "cb": w(19), "lo": np.float32(-1), "hi": np.float32(1.5)}, **tol(150)), 1),
    (Case("conv1x1_project_bn_clip", [node("Conv", ["x", "w"], ["c"]),
                                      node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
                                      node("Clip", ["bn", "lo", "hi"], ["y"])],
          {"x": Inp((2, 33, 5, 3))}, ["y"], {"w": w(10, 33, 1, 1), "lo": np.float32(0), "hi": np.float32(6),
                                              **bn_consts(10)}, **tol(33)), 1),
    # The conv output is also fetched: no fusion, two kernels.
    (Case("conv_two_outputs", [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["y"])],
          {"x": Inp((1, 3, 6, 6))}, ["c", "y"], {"w": w(4, 3, 3, 3)}, **tol(27)), 2),
    # The conv output is fetched, so the BatchNorm must not fold into its weights.
    (Case("conv_bn_conv_fetched", [node("Conv", ["x", "w"], ["c"]),
                                   node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["y"])],
          {"x": Inp((1, 3, 6, 6))}, ["c", "y"], {"w": w(4, 3, 3, 3), **bn_consts(4)}, **tol(27)), 2),
    # Two convs on one input then Add: the second conv absorbs the Add (residual) and Relu.
    (Case("two_convs_add", [node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                            node("Conv", ["x", "w2"], ["b"], strides=[1, 1]),
                            node("Add", ["a", "b"], ["s"]), node("Relu", ["s"], ["y"])],
          {"x": Inp((1, 4, 6, 6))}, ["y"], {"w1": w(5, 4, 3, 3), "w2": w(5, 4, 1, 1)}, **tol(36)), 2),
]
for _c, _ in FUSED:
    add("fused", _c)
KERNELS = {c.id: n for c, n in FUSED}
# BatchNorm folded into the weights and bias: nothing of it is left in the kernel.
KERNEL_OPS = {"fused-conv_bn_relu": [["Conv", "Relu"]], "fused-conv_3d_bn": [["Conv"]],
              "fused-conv_bias_bn_relu_dw": [["Conv", "Clip"]],
              "fused-conv_bn_residual_relu": [["Conv", "Add", "Relu"]],
              "fused-conv_1d_bias_bcast_relu": [["Conv", "Relu"]]}


def _f64(c: Case) -> bool:
    return any(i.dtype == D for i in c.inputs.values())


for _c in CASES:
    if _f64(_c):  # onnxruntime has no float64 Conv/pooling: onnx's reference implementation
        _c.reference = (lambda c: lambda feeds: ReferenceEvaluator(build_model([c])[0]).run(None, feeds))(_c)
    if _c.group == "fused":  # compiled one by one: the kernel count is per case
        _c.group = _c.id
GROUPS = chunk_groups(CASES, GROUP_SIZE)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> GroupRunner:
    return GroupRunner(tmp_path_factory, GROUPS)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_conv_op(case: Case, runner: GroupRunner) -> None:
    kernels = runner.check(case).kernels
    if case.id in KERNELS:
        assert len(kernels) == KERNELS[case.id], f"{case.id}: kernels {kernels}"
    if case.id in KERNEL_OPS:
        assert kernels == KERNEL_OPS[case.id]


def test_conv_threads_bit_identical(tmp_path) -> None:
    """Every path splits work over (batch, channel) units, never a sum: results do not depend on the
    number of tasks."""
    cases = [single("tiled", "Conv", [Inp((2, 16, 12, 12)), w(24, 16, 3, 3)], {"pads": [1, 1, 1, 1]}),
             single("tiled_ci_blocks", "Conv", [Inp((1, 136, 9, 9)), w(32, 136, 3, 3)], {"pads": [1, 1, 1, 1]}),
             single("tiled_s2", "Conv", [Inp((1, 64, 41, 39)), w(8, 64, 3, 3)],
                    {"pads": [1, 2, 1, 0], "strides": [2, 2]}),
             single("rows", "Conv", [Inp((1, 32, 12, 12)), w(40, 32, 1, 1), w(40)]),
             single("pointwise", "Conv", [Inp((1, 160, 17, 15)), w(40, 160, 1, 1), w(40)]),
             single("pointwise_7x7", "Conv", [Inp((1, 96, 7, 7)), w(32, 96, 1, 1), w(32)]),
             single("dw", "Conv", [Inp((1, 32, 20, 20)), w(32, 1, 3, 3)], {"group": 32, "pads": [1, 1, 1, 1]}),
             single("dw_rows", "Conv", [Inp((1, 8, 70, 66)), w(8, 1, 3, 3)], {"group": 8, "pads": [1, 1, 1, 1]}),
             # Double-buffered phase planes: a task's last unit prefetches nothing past its range.
             single("dw_s2_narrow", "Conv", [Inp((1, 7, 14, 14)), w(7, 1, 3, 3)],
                    {"group": 7, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
             single("stem", "Conv", [Inp((1, 3, 61, 57)), w(32, 3, 3, 3), w(32)], {"pads": [1, 1, 1, 1],
                                                                                   "strides": [2, 2]}),
             single("generic", "Conv", [Inp((1, 8, 12, 12)), Inp((16, 8, 3, 3))]),
             single("convt", "ConvTranspose", [Inp((1, 8, 10, 10)), w(8, 8, 3, 3)], {"strides": [2, 2]}),
             single("pool", "MaxPool", [Inp((1, 64, 24, 24))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})]
    model, feeds = build_model_and_feeds(cases)
    result = compile_model(model, tmp_path, "t")
    one = aotc.load(result.prefix).run(feeds)
    three = aotc.load(result.prefix, threads=3).run(feeds)
    for a, b in zip(one, three, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("target", ["generic"])
def test_conv_portable_target(tmp_path, target: str) -> None:
    """The vector code of the fast paths also builds for targets without AVX (4-lane vectors)."""
    cases = [single("tiled", "Conv", [Inp((1, 4, 9, 9)), w(20, 4, 3, 3), w(20)], {"pads": [1, 1, 1, 1]}, **tol(36)),
             single("rows", "Conv", [Inp((1, 8, 6, 6)), w(10, 8, 1, 1)], **tol(8)),
             # The AVX2 channel-lane 1x1 kernel's shape: the rows path on other targets.
             single("project", "Conv", [Inp((1, 40, 7, 7)), w(16, 40, 1, 1), w(16)], **tol(40)),
             single("dw", "Conv", [Inp((1, 3, 9, 9)), w(3, 1, 3, 3)], {"group": 3, "strides": [2, 2]}, **tol(9)),
             single("dw_rows", "Conv", [Inp((1, 2, 66, 65)), w(2, 1, 3, 3)], {"group": 2, "pads": [1, 1, 1, 1]},
                    **tol(9)),
             single("pool", "AveragePool", [Inp((1, 2, 7, 7))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})]
    model, feeds = build_model_and_feeds(cases)
    want = run_ort(model, feeds)
    got = aotc.load(compile_model(model, tmp_path, "t", target_cpu=target).prefix).run(feeds)
    for c, g, wv in zip(cases, got, want, strict=True):
        assert_close(g, wv, c.rtol, c.atol, c.id)


def test_conv_paths_sanitizers_run_clean(tmp_path) -> None:
    """Every conv path's generated C under ASan and UBSan, through the generated test program (stored
    outputs, then a 2-thread rerun): the padded copies (whole, and the rows of a task's chunks), the
    stride-2 column split (widths with and without a left pad, a row length that is not a multiple
    of the vector), the phase loop's positions past the plane, the 1x1 panels, the 1x1 channel-lane
    kernel's accumulator buffers, the tiled path's write-out buffers, the overlapping column blocks
    of the depthwise rows."""
    cases = [single("tiled", "Conv", [Inp((1, 8, 12, 11)), w(24, 8, 3, 3)], {"pads": [1, 1, 1, 1]}),
             single("tiled_ci_blocks", "Conv", [Inp((1, 136, 9, 9)), w(32, 136, 3, 3)], {"pads": [1, 1, 1, 1]}),
             # Two chunks of output rows: each task pads only the input rows its chunk reads.
             single("tiled_s2", "Conv", [Inp((1, 64, 41, 39)), w(8, 64, 3, 3)],
                    {"pads": [2, 1, 0, 1], "strides": [2, 2]}),
             single("dw_small", "Conv", [Inp((1, 5, 7, 7)), w(5, 1, 3, 3)], {"group": 5, "pads": [1, 1, 1, 1]}),
             single("rows", "Conv", [Inp((1, 32, 12, 12)), w(40, 32, 1, 1), w(40)]),
             # Channels in the lanes: input-channel blocks, a partial last tile and 8x8 block.
             single("pointwise", "Conv", [Inp((1, 150, 9, 11)), w(19, 150, 1, 1), w(19)]),
             # Tails of one and two positions, run as two shorter tiles (7x7: 7 x 6 + 4 + 3; 2x4: 4 + 4).
             single("pointwise_7x7", "Conv", [Inp((2, 40, 7, 7)), w(16, 40, 1, 1), w(16)]),
             single("pointwise_8", "Conv", [Inp((1, 48, 2, 4)), w(16, 48, 1, 1)]),
             # Strided, small output plane: the gathered input (two channel blocks reuse it).
             single("pointwise_s2", "Conv", [Inp((1, 24, 11, 12)), w(20, 24, 1, 1)], {"strides": [2, 2]}),
             single("dw_s2", "Conv", [Inp((1, 3, 41, 37)), w(3, 1, 3, 3)],
                    {"group": 3, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
             single("dw_s2_nopad", "Conv", [Inp((1, 2, 40, 35)), w(2, 1, 3, 3)], {"group": 2, "strides": [2, 2]}),
             # The padded row copy (14 columns) with double-buffered planes; rows computed in place.
             single("dw_s2_narrow", "Conv", [Inp((1, 5, 14, 14)), w(5, 1, 3, 3)],
                    {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
             single("dw_s2_wide", "Conv", [Inp((1, 2, 12, 100)), w(2, 1, 3, 3)],
                    {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
             single("dw_rows", "Conv", [Inp((1, 2, 70, 66)), w(2, 1, 3, 3)], {"group": 2, "pads": [1, 1, 1, 1]}),
             single("dw_rows_one_vector", "Conv", [Inp((1, 2, 500, 10)), w(2, 1, 3, 3)],
                    {"group": 2, "pads": [0, 1, 0, 1]}),
             # The tiled write-out: the last tile of the plane overlaps, a partial channel block.
             single("stem", "Conv", [Inp((1, 3, 61, 57)), w(21, 3, 3, 3), w(21)], {"pads": [1, 1, 1, 1],
                                                                                   "strides": [2, 2]}),
             # 4 KB planes (see test_conv_avx512_paths).
             single("stem_4k_planes", "Conv", [Inp((1, 3, 32, 32)), w(20, 3, 3, 3), w(20)], {"pads": [1, 1, 1, 1]})]
    model, _ = build_model(cases)
    run_generated_test_under_sanitizers(model, tmp_path)


def _has_avx512() -> bool:
    try:
        return " avx512f" in open("/proc/cpuinfo").read()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx512(), reason="needs a CPU with AVX-512")
def test_conv_avx512_paths(tmp_path) -> None:
    """AVX-512's tiled convs collect their tiles position-major and write rows through 8x8 transposes
    (with a store per output, strided by the plane, 3 -> 32 on 64x64 ran 10x slower than on AVX2:
    4 KB planes put every channel's store in one L1 set); its 1x1 convs with channels in the lanes
    (projections, small planes): input channel blocks, tails, partial channel blocks. Against
    onnxruntime, with an epilogue, a batch of 2, a partial channel block and the last tile
    overlapping, on 1 and 3 threads (bit-identical)."""
    cases = [single("stem_4k", "Conv", [Inp((2, 3, 32, 32)), w(32, 3, 3, 3), w(32)], {"pads": [1, 1, 1, 1]},
                    **tol(27)),
             single("partial_block", "Conv", [Inp((1, 5, 16, 64)), w(20, 5, 3, 3)], {"pads": [1, 1, 1, 1]},
                    **tol(45)),
             # 1023 positions (4092-byte planes, nearly 4 KB apart: the same L1 set still)
             single("odd_tail", "Conv", [Inp((1, 4, 33, 31)), w(16, 4, 3, 3)], {"pads": [1, 1, 1, 1]}, **tol(36)),
             single("pw_project", "Conv", [Inp((2, 600, 9, 11)), w(40, 600, 1, 1), w(40)], **tol(600)),
             single("pw_expand_7x7", "Conv", [Inp((1, 24, 7, 7)), w(72, 24, 1, 1), w(72)], **tol(24)),
             single("pw_tail", "Conv", [Inp((1, 48, 2, 7)), w(16, 48, 1, 1)], **tol(48)),
             single("pw_stride2", "Conv", [Inp((2, 72, 14, 13)), w(40, 72, 1, 1), w(40)], {"strides": [2, 2]},
                    **tol(72))]
    model, feeds = build_model_and_feeds(cases)
    first = model.graph.output[0]  # through a Relu, which the conv applies before its stores
    model.graph.node.append(helper.make_node("Relu", [first.name], ["relu"]))
    first.name = "relu"
    want = run_ort(model, feeds)
    prefix = compile_model(model, tmp_path, "t", target_cpu="x86-64-v4").prefix
    got = aotc.load(prefix).run(feeds)
    for c, g, wv in zip(cases, got, want, strict=True):
        assert_close(g, wv, c.rtol, c.atol, c.id)
    for a, b in zip(got, aotc.load(prefix, threads=3).run(feeds), strict=True):
        np.testing.assert_array_equal(a, b)
