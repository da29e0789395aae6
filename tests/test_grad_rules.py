"""Every gradient rule (aotc/ops/grads/) against PyTorch autograd and finite differences in float64: each
family's cases compile into one library (tests/grad_check.py)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from grad_check import case, check_gradients, rand
from onnx import TensorProto, helper


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def test_elementwise_gradients(tmp_path) -> None:
    pos = rand(3, 4, low=0.5)
    cond = rand(3, 4) > 0
    cases = [
        case("add_broadcast", "Add", [rand(2, 3, 4), rand(3, 1)], torch.add),
        case("sub_broadcast", "Sub", [rand(3, 4), rand(4)], torch.sub),
        case("mul_broadcast", "Mul", [rand(2, 3, 4), rand(1, 4)], torch.mul),
        case("div", "Div", [rand(3, 4), rand(4, low=1.0) * np.array([1, -1, 1, -1])], torch.div),
        case("pow_const", "Pow", [pos, "e"], torch.pow, consts={"e": np.array(3.0)}),
        case("pow_square", "Pow", [rand(3, 4), "e"], torch.pow, consts={"e": np.array(2.0)}),
        case("pow_both", "Pow", [pos, rand(4)], torch.pow),
        case("sum3", "Sum", [rand(3, 4), rand(4), rand(3, 1)], lambda a, b, c: a + b + c),
        case("mean2", "Mean", [rand(3, 4), rand(4)], lambda a, b: (a + b) / 2),
        case("where", "Where", ["c", rand(3, 4), rand(4)], torch.where, consts={"c": cond}),
        case("max", "Max", [rand(3, 4), rand(4)], torch.maximum),
        case("min", "Min", [rand(3, 4), rand(3, 4)], torch.minimum),
        case("neg", "Neg", [rand(5)], torch.neg),
        case("identity", "Identity", [rand(5)], lambda x: x),
        case("relu", "Relu", [rand(3, 4)], torch.relu),
        case("leaky_relu", "LeakyRelu", [rand(3, 4)], lambda x: F.leaky_relu(x, 0.2), alpha=0.2),
        case("sigmoid", "Sigmoid", [rand(3, 4)], torch.sigmoid),
        case("tanh", "Tanh", [rand(3, 4)], torch.tanh),
        case("exp", "Exp", [rand(3, 4)], torch.exp),
        case("log", "Log", [pos], torch.log),
        case("sqrt", "Sqrt", [pos], torch.sqrt),
        case("reciprocal", "Reciprocal", [pos], torch.reciprocal),
        case("abs", "Abs", [rand(3, 4)], torch.abs),
        case("softplus", "Softplus", [rand(3, 4)], F.softplus),
        case("gelu_tanh", "Gelu", [rand(3, 4)], lambda x: F.gelu(x, approximate="tanh"), approximate="tanh"),
        case("prelu", "PRelu", [rand(2, 3, 4), rand(3, 1)], lambda x, s: torch.where(x < 0, s * x, x)),
        case("elu", "Elu", [rand(3, 4)], lambda x: F.elu(x, 0.7), alpha=0.7),
        case("selu", "Selu", [rand(3, 4)], F.selu),
        case("celu", "Celu", [rand(3, 4)], lambda x: F.celu(x, 1.5), alpha=1.5),
        case("hard_sigmoid", "HardSigmoid", [rand(3, 4) * 3], lambda x: torch.clamp(0.2 * x + 0.5, 0, 1)),
        case("hard_swish", "HardSwish", [rand(3, 4) * 4], F.hardswish),
        case("softsign", "Softsign", [rand(3, 4)], F.softsign),
        case("sin", "Sin", [rand(3, 4)], torch.sin),
        case("cos", "Cos", [rand(3, 4)], torch.cos),
        case("mish", "Mish", [rand(3, 4)], F.mish),
        case("swish", "Swish", [rand(3, 4)], lambda x: x * torch.sigmoid(1.5 * x), alpha=1.5),
        case("floor", "Floor", [rand(3, 4)], torch.floor),
        case("hardmax", "Hardmax", [rand(3, 4)], lambda x: F.one_hot(x.argmax(-1), 4).to(x.dtype) + 0 * x),
        case("tan", "Tan", [rand(3, 4)], torch.tan),
        case("asin", "Asin", [rand(3, 4, low=-0.8) * 0.9], torch.asin),
        case("acos", "Acos", [rand(3, 4, low=-0.8) * 0.9], torch.acos),
        case("atan", "Atan", [rand(3, 4)], torch.atan),
        case("sinh", "Sinh", [rand(3, 4)], torch.sinh),
        case("cosh", "Cosh", [rand(3, 4)], torch.cosh),
        case("asinh", "Asinh", [rand(3, 4)], torch.asinh),
        case("acosh", "Acosh", [rand(3, 4, low=1.2)], torch.acosh),
        case("atanh", "Atanh", [rand(3, 4, low=-0.8) * 0.9], torch.atanh),
        case("thresholded_relu", "ThresholdedRelu", [rand(3, 4)], lambda x: torch.where(x > 0.3, x, 0), alpha=0.3),
        case("shrink", "Shrink", [rand(3, 4)], lambda x: F.softshrink(x, 0.4), lambd=0.4, bias=0.4),
        case("clip", "Clip", [rand(3, 4), "lo", "hi"], torch.clamp,
             consts={"lo": np.array(-0.5), "hi": np.array(0.7)}),
    ]
    for erf in (case("erf", "Erf", [rand(3, 4)], torch.erf), case("gelu", "Gelu", [rand(3, 4)], F.gelu)):
        erf.finite_differences = False  # onnx.reference computes erf in float32 whatever the input type
        cases.append(erf)
    cast = case("cast_round_trip", "Cast", [rand(6)], lambda x: x, to=TensorProto.DOUBLE)
    cast.nodes.append(helper.make_node("Cast", cast.outputs, [cast.outputs[0] + "_f"], to=TensorProto.FLOAT))
    cast.outputs = [cast.outputs[0] + "_f"]
    cast.finite_differences = False  # the float64 graph would cast to float32 and back
    cases.append(cast)
    check_gradients(cases, tmp_path)


def _gemm(ta=0, tb=0, alpha=1.0, beta=1.0):
    def fn(a, b, c=None):
        y = alpha * ((a.T if ta else a) @ (b.T if tb else b))
        return y if c is None else y + beta * c
    return fn


def test_matmul_and_gemm_gradients(tmp_path) -> None:
    cases = [
        case("matmul_2d", "MatMul", [rand(3, 4), rand(4, 5)], torch.matmul),
        case("matmul_shared_b", "MatMul", [rand(2, 3, 4), rand(4, 5)], torch.matmul),
        case("matmul_shared_a", "MatMul", [rand(3, 4), rand(2, 4, 5)], torch.matmul),
        case("matmul_batched", "MatMul", [rand(2, 3, 4), rand(2, 4, 5)], torch.matmul),
        case("matmul_broadcast", "MatMul", [rand(2, 1, 3, 4), rand(3, 4, 2)], torch.matmul),
        case("matmul_vec_mat", "MatMul", [rand(4), rand(4, 5)], torch.matmul),
        case("matmul_mat_vec", "MatMul", [rand(2, 3, 4), rand(4)], torch.matmul),
        case("einsum_bmm", "Einsum", [rand(2, 3, 4), rand(2, 4, 5)], lambda a, b: torch.einsum("bij,bjk->bik", a, b),
             equation="bij,bjk->bik"),
        case("einsum_attention", "Einsum", [rand(2, 2, 3, 4), rand(2, 2, 5, 4)],
             lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), equation="bhqd,bhkd->bhqk"),
        case("einsum_sum_broadcast", "Einsum", [rand(3, 4, 2), rand(1, 4)],
             lambda a, b: torch.einsum("ijk,ij->j", a, b.expand(3, 4)), equation="ijk,ij->j"),
        case("einsum_ellipsis", "Einsum", [rand(2, 3, 4), rand(4, 2)], lambda a, b: torch.einsum("...j,jk", a, b),
             equation="...j,jk"),
        case("gemm", "Gemm", [rand(3, 4), rand(4, 5), rand(5)], _gemm()),
        case("gemm_ta", "Gemm", [rand(4, 3), rand(4, 5), rand(3, 1)], _gemm(ta=1, alpha=0.5), transA=1, alpha=0.5),
        case("gemm_tb", "Gemm", [rand(3, 4), rand(5, 4), rand(3, 5)], _gemm(tb=1, beta=2.0), transB=1, beta=2.0),
        case("gemm_tab", "Gemm", [rand(4, 3), rand(5, 4)], _gemm(1, 1), transA=1, transB=1),
    ]
    check_gradients(cases, tmp_path)


def test_shape_gradients(tmp_path) -> None:
    x = rand(2, 3, 4)
    cases = [
        case("reshape", "Reshape", [x, "s"], lambda x, s: x.reshape(4, 6), consts={"s": _i64(4, -1)}),
        case("flatten", "Flatten", [rand(2, 3, 4)], lambda x: x.reshape(6, 4), axis=2),
        case("squeeze", "Squeeze", [rand(2, 1, 4), "a"], lambda x, a: x.squeeze(1), consts={"a": _i64(1)}),
        case("unsqueeze", "Unsqueeze", [rand(2, 4), "a"], lambda x, a: x[:, None, :, None],
             consts={"a": _i64(1, 3)}),
        case("transpose", "Transpose", [rand(2, 3, 4)], lambda x: x.permute(1, 2, 0), perm=[1, 2, 0]),
        case("expand", "Expand", [rand(3, 1), "s"], lambda x, s: x.expand(2, 3, 4), consts={"s": _i64(2, 3, 4)}),
        case("concat", "Concat", [rand(2, 1, 4), rand(2, 3, 4), rand(2, 2, 4)], lambda *v: torch.cat(v, 1), axis=1),
        case("split", "Split", [rand(2, 5), "s"], lambda x, s: torch.split(x, [2, 3], 1), consts={"s": _i64(2, 3)},
             n_out=2, axis=1),
        case("slice", "Slice", [rand(4, 6), "b", "e", "a"], lambda x, *_: x[1:3, 2:5],
             consts={"b": _i64(1, 2), "e": _i64(3, 5), "a": _i64(0, 1)}),
        case("slice_steps", "Slice", [rand(4, 7), "b", "e", "a", "st"], lambda x, *_: x[[3, 1]][:, 1::3],
             consts={"b": _i64(-1, 1), "e": _i64(-5, 100), "a": _i64(0, 1), "st": _i64(-2, 3)}),
        case("tile", "Tile", [rand(2, 3), "r"], lambda x, r: x.repeat(2, 3), consts={"r": _i64(2, 3)}),
        case("depth_to_space", "DepthToSpace", [rand(1, 8, 2, 3)], lambda x: F.pixel_shuffle(x, 2), blocksize=2,
             mode="CRD"),
        case("depth_to_space_dcr", "DepthToSpace", [rand(1, 8, 2, 3)],
             lambda x: x.reshape(1, 2, 2, 2, 2, 3).permute(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6), blocksize=2),
        case("space_to_depth", "SpaceToDepth", [rand(1, 2, 4, 6)],
             lambda x: x.reshape(1, 2, 2, 2, 3, 2).permute(0, 3, 5, 1, 2, 4).reshape(1, 8, 2, 3), blocksize=2),
        case("trilu", "Trilu", [rand(2, 4, 5), "k"], lambda x, k: torch.tril(x, -1), consts={"k": _i64(-1)}, upper=0),
        case("cumsum_reverse", "CumSum", [rand(3, 4), "ax"], lambda x, a: x.flip(1).cumsum(1).flip(1),
             consts={"ax": np.array(1, np.int64)}, reverse=1),
        case("cumsum_exclusive", "CumSum", [rand(3, 4), "ax"], lambda x, a: x.cumsum(0) - x,
             consts={"ax": np.array(0, np.int64)}, exclusive=1),
        case("pad", "Pad", [rand(2, 3), "p", "v"], lambda x, *_: F.pad(x, (2, 0, 1, 1)),
             consts={"p": _i64(1, 2, 1, 0), "v": np.array(0.0)}),
        case("gather_elements", "GatherElements", [rand(3, 4), "i"],
             lambda x, i: torch.gather(x, 1, i), consts={"i": np.array([[0, 3, 3], [1, 1, 0], [2, 0, 1]])}, axis=1),
        case("gather_rows", "Gather", [rand(5, 3), "i"], lambda x, i: x[i], consts={"i": _i64(0, 3, 3, 1)}),
        case("gather_axis1", "Gather", [rand(2, 4, 3), "i"], lambda x, i: x[:, [[3, 0]]],
             consts={"i": _i64(-1, 0).reshape(1, 2)}, axis=1),
    ]
    top = case("top_k", "TopK", [rand(3, 6), "k"], lambda x, k: torch.topk(x, 2, 1).values, consts={"k": _i64(2)},
               n_out=2)
    top.outputs.pop()  # the indices carry no gradient
    cases.append(top)
    check_gradients(cases, tmp_path)


def test_reduce_gradients(tmp_path) -> None:
    cases = [
        case("sum_axis", "ReduceSum", [rand(2, 3, 4), "a"], lambda x, a: x.sum(1), consts={"a": _i64(1)}, keepdims=0),
        case("sum_all", "ReduceSum", [rand(2, 3)], lambda x: x.sum().reshape(1, 1)),
        case("mean", "ReduceMean", [rand(2, 3, 4), "a"], lambda x, a: x.mean((0, 2), keepdim=True),
             consts={"a": _i64(0, -1)}),
        case("sum_square", "ReduceSumSquare", [rand(3, 4), "a"], lambda x, a: (x * x).sum(1),
             consts={"a": _i64(1)}, keepdims=0),
        case("l2", "ReduceL2", [rand(3, 4), "a"], lambda x, a: x.norm(dim=1, keepdim=True), consts={"a": _i64(1)}),
        case("logsumexp", "ReduceLogSumExp", [rand(3, 4), "a"], lambda x, a: x.logsumexp(1),
             consts={"a": _i64(1)}, keepdims=0),
        case("l1", "ReduceL1", [rand(3, 4), "a"], lambda x, a: x.abs().sum(0), consts={"a": _i64(0)}, keepdims=0),
        case("logsum", "ReduceLogSum", [rand(3, 4, low=0.5), "a"], lambda x, a: x.sum(1, keepdim=True).log(),
             consts={"a": _i64(1)}),
        case("max", "ReduceMax", [rand(3, 4), "a"], lambda x, a: x.amax(1), consts={"a": _i64(1)}, keepdims=0),
        case("min", "ReduceMin", [rand(3, 4, 2), "a"], lambda x, a: x.amin((0, 2), keepdim=True),
             consts={"a": _i64(0, 2)}),
    ]
    check_gradients(cases, tmp_path)


def _dropout_factors(shape, ratio, seed):  # how onnx.reference and aotc draw a seeded mask
    mask = np.random.RandomState(seed).uniform(0, 1, shape) >= ratio
    return torch.tensor(mask / (1 - ratio))


def test_softmax_dropout_and_loss_gradients(tmp_path) -> None:
    w = rand(5, low=0.5)
    t = _i64(0, 4, 2, 2)
    t4 = np.random.default_rng(3).integers(0, 3, (2, 2, 3))
    cases = [
        case("softmax", "Softmax", [rand(3, 5)], lambda x: x.softmax(-1)),
        case("softmax_axis1", "Softmax", [rand(2, 3, 4)], lambda x: x.softmax(1), axis=1),
        case("log_softmax", "LogSoftmax", [rand(2, 3, 4)], lambda x: x.log_softmax(1), axis=1),
        case("dropout", "Dropout", [rand(4, 5), "r", "tm"], lambda x, *_: x * _dropout_factors((4, 5), 0.3, 5),
             consts={"r": np.array(0.3, np.float32), "tm": np.array(True)}, seed=5),
        case("dropout_inference", "Dropout", [rand(4, 5)], lambda x: x),
        case("sce_mean", "SoftmaxCrossEntropyLoss", [rand(4, 5), "t"], lambda x, t: F.cross_entropy(x, t),
             consts={"t": t}),
        case("sce_weights_ignore", "SoftmaxCrossEntropyLoss", [rand(4, 5), "t", "w"],
             lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=2), consts={"t": t, "w": w}, ignore_index=2),
        case("sce_sum_4d", "SoftmaxCrossEntropyLoss", [rand(2, 3, 2, 3), "t"],
             lambda x, t: F.cross_entropy(x, t, reduction="sum"), consts={"t": t4}, reduction="sum"),
        case("sce_none", "SoftmaxCrossEntropyLoss", [rand(4, 5), "t"],
             lambda x, t: F.cross_entropy(x, t, reduction="none"), consts={"t": t}, reduction="none"),
        case("sce_log_prob", "SoftmaxCrossEntropyLoss", [rand(4, 5), "t"],
             lambda x, t: (F.cross_entropy(x, t), x.log_softmax(1)), consts={"t": t}, n_out=2),
        case("nll_mean", "NegativeLogLikelihoodLoss", [rand(4, 5), "t"], lambda x, t: F.nll_loss(x, t),
             consts={"t": t}),
        case("nll_weights", "NegativeLogLikelihoodLoss", [rand(2, 3, 2, 3), "t", "w"],
             lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=1), consts={"t": t4, "w": w[:3]},
             ignore_index=1),
    ]
    check_gradients(cases, tmp_path)


def test_normalization_gradients(tmp_path) -> None:
    mean, var = rand(3), rand(3, low=0.5)
    cases = [
        case("bn_training", "BatchNormalization", [rand(4, 3, 2, 3) * 2 + 1, rand(3), rand(3), "m", "v"],
             lambda x, s, b, m, v: F.batch_norm(x, None, None, s, b, training=True, eps=1e-3),
             consts={"m": mean, "v": var}, training_mode=1, epsilon=1e-3),
        case("bn_training_2d", "BatchNormalization", [rand(6, 3), rand(3), rand(3), "m", "v"],
             lambda x, s, b, m, v: F.batch_norm(x, None, None, s, b, training=True), consts={"m": mean, "v": var},
             training_mode=1),
        case("bn_inference", "BatchNormalization", [rand(2, 3, 4), rand(3), rand(3), "m", "v"],
             lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, training=False), consts={"m": mean, "v": var}),
        case("layernorm", "LayerNormalization", [rand(3, 6), rand(6), rand(6)],
             lambda x, s, b: F.layer_norm(x, (6,), s, b)),
        case("layernorm_mean_omitted", "LayerNormalization", [rand(3, 6), rand(6)],
             lambda x, s: F.layer_norm(x, (6,), s)),
        case("layernorm_axis1", "LayerNormalization", [rand(2, 3, 4), rand(3, 4)],
             lambda x, s: F.layer_norm(x, (3, 4), s, eps=1e-3), axis=1, epsilon=1e-3),
        case("rmsnorm", "RMSNormalization", [rand(2, 3, 6), rand(6)], lambda x, s: F.rms_norm(x, (6,), s, 1e-5)),
        case("lp_norm", "LpNormalization", [rand(3, 4, 2)], lambda x: F.normalize(x, dim=1), axis=1),
        case("l1_norm", "LpNormalization", [rand(3, 4)], lambda x: F.normalize(x, p=1.0, dim=-1), p=1),
        case("mean_variance", "MeanVarianceNormalization", [rand(2, 3, 4)],
             lambda x: (x - x.mean((0, 2), keepdim=True)) / (x.var((0, 2), keepdim=True, unbiased=False).sqrt() + 1e-9),
             axes=[0, 2]),
        case("lrn", "LRN", [rand(2, 5, 3, 2)], lambda x: F.local_response_norm(x, 3, 1e-2, 0.75, 2.0), size=3,
             alpha=1e-2, bias=2.0),
        case("instancenorm", "InstanceNormalization", [rand(2, 3, 4, 5), rand(3), rand(3)],
             lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-3), epsilon=1e-3),
        case("groupnorm", "GroupNormalization", [rand(2, 6, 5), rand(6), rand(6)],
             lambda x, s, b: F.group_norm(x, 3, s, b), num_groups=3),
    ]
    omitted = next(c for c in cases if c.id == "layernorm_mean_omitted")
    omitted.nodes[0].output.extend(["", omitted.outputs[0] + "_invstd"])  # Mean omitted, InvStdDev unread
    for c in [*cases[:2], cases[-1]]:  # onnx.reference computes these statistics in float32
        c.finite_differences = False
    # onnx.reference sums x, not |x|, for p = 1, runs MeanVarianceNormalization in float32 only, and sums
    # LRN's squares for as many channels as the batch has images
    for c in cases:
        c.finite_differences = c.finite_differences and c.id not in ("l1_norm", "mean_variance", "lrn")
    check_gradients(cases, tmp_path)


def test_pool_gradients(tmp_path) -> None:
    cases = [
        case("maxpool", "MaxPool", [rand(2, 3, 6, 6)], lambda x: F.max_pool2d(x, 2), kernel_shape=[2, 2],
             strides=[2, 2]),
        case("maxpool_pad", "MaxPool", [rand(1, 2, 5, 5)], lambda x: F.max_pool2d(x, 3, 1, 1), kernel_shape=[3, 3],
             pads=[1, 1, 1, 1]),
        case("maxpool_ceil_dilated", "MaxPool", [rand(1, 2, 7, 8)],
             lambda x: F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True), kernel_shape=[2, 2], strides=[2, 2],
             dilations=[2, 2], ceil_mode=1),
        case("maxpool_1d", "MaxPool", [rand(2, 2, 9)], lambda x: F.max_pool1d(x, 3, 2), kernel_shape=[3], strides=[2]),
        case("avgpool", "AveragePool", [rand(2, 3, 6, 6)], lambda x: F.avg_pool2d(x, 2), kernel_shape=[2, 2],
             strides=[2, 2]),
        case("avgpool_pad", "AveragePool", [rand(1, 2, 5, 5)],
             lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1]),
        case("avgpool_pad_counted", "AveragePool", [rand(1, 2, 5, 5)],
             lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True), kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1], count_include_pad=1),
        case("resize_nearest", "Resize", [rand(1, 2, 3, 4), "", "sc"], lambda x, *_: F.interpolate(x, scale_factor=2),
             consts={"sc": np.array([1, 1, 2, 2], np.float32)}, coordinate_transformation_mode="asymmetric",
             nearest_mode="floor"),
        case("resize_bilinear", "Resize", [rand(1, 2, 3, 4), "", "", "sz"],
             lambda x, *_: F.interpolate(x, size=(5, 7), mode="bilinear"), consts={"sz": _i64(1, 2, 5, 7)},
             mode="linear"),
        case("global_avg", "GlobalAveragePool", [rand(2, 3, 4, 5)], lambda x: x.mean((2, 3), keepdim=True)),
        case("global_max", "GlobalMaxPool", [rand(2, 3, 4, 5)], lambda x: x.amax((2, 3), keepdim=True)),
    ]
    check_gradients(cases, tmp_path)


def test_conv_gradients(tmp_path) -> None:
    cases = [
        case("conv3x3", "Conv", [rand(2, 3, 6, 6), rand(4, 3, 3, 3), rand(4)], lambda x, w, b: F.conv2d(x, w, b, 1, 1),
             pads=[1, 1, 1, 1]),
        case("conv_stride_dilation", "Conv", [rand(2, 2, 9, 8), rand(3, 2, 3, 2)],
             lambda x, w: F.conv2d(x, w, None, (2, 1), (1, 0), (2, 1)), strides=[2, 1], pads=[1, 0, 1, 0],
             dilations=[2, 1]),
        case("conv_groups", "Conv", [rand(2, 4, 5, 5), rand(6, 2, 3, 3), rand(6)],
             lambda x, w, b: F.conv2d(x, w, b, groups=2), group=2),
        case("conv_depthwise", "Conv", [rand(2, 3, 6, 6), rand(6, 1, 3, 3)],
             lambda x, w: F.conv2d(x, w, None, 2, 1, groups=3), group=3, strides=[2, 2], pads=[1, 1, 1, 1]),
        case("conv_depthwise_1d_dilated", "Conv", [rand(2, 3, 11), rand(3, 1, 3), rand(3)],
             lambda x, w, b: F.conv1d(F.pad(x, (2, 1)), w, b, 1, 0, 2, groups=3), group=3, dilations=[2],
             pads=[2, 1]),
        case("conv_1x1", "Conv", [rand(2, 5, 4, 4), rand(3, 5, 1, 1), rand(3)], lambda x, w, b: F.conv2d(x, w, b)),
        case("conv_transpose", "ConvTranspose", [rand(2, 4, 3, 4), rand(4, 3, 3, 3), rand(6)],
             lambda x, w, b: F.conv_transpose2d(x, w, b, 2, 1, 1, 2, 1), strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 1], group=2),
        case("conv_transpose_dilated", "ConvTranspose", [rand(1, 2, 5), rand(2, 3, 2)],
             lambda x, w: F.conv_transpose1d(x, w, None, 3, 0, 0, 1, 2), strides=[3], dilations=[2]),
        case("conv_1d", "Conv", [rand(2, 3, 10), rand(4, 3, 3)], lambda x, w: F.conv1d(x, w, None, 2, 1),
             strides=[2], pads=[1, 1]),
    ]
    next(c for c in cases if c.id == "conv_transpose").finite_differences = False  # onnx.reference fails on its groups
    check_gradients(cases, tmp_path)


def _onnx_to_torch_gates(w, order):
    """ONNX's gate blocks (rows of H) reordered as PyTorch's: ``order`` lists ONNX's block per torch block."""
    h = w.shape[0] // len(order)
    return torch.cat([w[k * h:(k + 1) * h] for k in order])


def _torch_rnn(kind, x, w, r, b, h0, c0=None, bidirectional=False):
    """PyTorch's LSTM (gates i, f, g, o) or GRU (r, z, n) run on ONNX-layout weights (i, o, f, c / z, r, h)."""
    order = [0, 2, 3, 1] if kind == "LSTM" else [1, 0, 2]
    hid = r.shape[-1]
    module = getattr(torch.nn, kind)(x.shape[-1], hid, bidirectional=bidirectional).double()
    params = {}
    for d in range(w.shape[0]):
        sfx = "_l0" + ("_reverse" if d else "")
        params["weight_ih" + sfx] = _onnx_to_torch_gates(w[d], order)
        params["weight_hh" + sfx] = _onnx_to_torch_gates(r[d], order)
        params["bias_ih" + sfx] = _onnx_to_torch_gates(b[d, :len(b[d]) // 2], order)
        params["bias_hh" + sfx] = _onnx_to_torch_gates(b[d, len(b[d]) // 2:], order)
    y, state = torch.func.functional_call(module, params, (x, (h0, c0) if kind == "LSTM" else h0))
    y = y.reshape(x.shape[0], x.shape[1], w.shape[0], hid).permute(0, 2, 1, 3)  # ONNX Y: [seq, dirs, batch, H]
    return (y, *state) if kind == "LSTM" else (y, state)


def _reference_rnn(x, w, r, b, reverse):
    """The plain RNN, H = tanh(X W^T + H R^T + Wb + Rb), stepped in Python."""
    h, ys = torch.zeros(x.shape[1], r.shape[-1], dtype=x.dtype), {}
    for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
        h = torch.tanh(x[t] @ w[0].T + h @ r[0].T + b[0, :r.shape[-1]] + b[0, r.shape[-1]:])
        ys[t] = h
    return torch.stack([ys[t] for t in range(x.shape[0])])[:, None], h[None]


def _reference_gru_reset_first(x, w, r, b, h):
    """GRU with linear_before_reset = 0: the candidate multiplies (r H) by Rh."""
    hid = r.shape[-1]
    wz, wr, wh = w[0].split(hid)
    rz, rr, rh = r[0].split(hid)
    bz, br, bh, cz, cr, ch = b[0].split(hid)
    h = h[0]
    for t in range(x.shape[0]):
        z = torch.sigmoid(x[t] @ wz.T + h @ rz.T + bz + cz)
        rs = torch.sigmoid(x[t] @ wr.T + h @ rr.T + br + cr)
        h = (1 - z) * torch.tanh(x[t] @ wh.T + (rs * h) @ rh.T + ch + bh) + z * h
    return h[None]


def test_recurrent_gradients(tmp_path) -> None:
    s, n, i, h = 3, 2, 3, 4
    cases = [
        case("lstm_bidirectional", "LSTM", [rand(s, n, i), rand(2, 4 * h, i), rand(2, 4 * h, h), rand(2, 8 * h), "",
                                            rand(2, n, h), rand(2, n, h)],
             lambda x, w, r, b, _, h0, c0: _torch_rnn("LSTM", x, w, r, b, h0, c0, True), n_out=3, hidden_size=h,
             direction="bidirectional"),
        case("gru_linear_before_reset", "GRU", [rand(s, n, i), rand(1, 3 * h, i), rand(1, 3 * h, h), rand(1, 6 * h),
                                                "", rand(1, n, h)],
             lambda x, w, r, b, _, h0: _torch_rnn("GRU", x, w, r, b, h0), n_out=2, hidden_size=h,
             linear_before_reset=1),
        case("gru_reset_first", "GRU", [rand(s, n, i), rand(1, 3 * h, i), rand(1, 3 * h, h), rand(1, 6 * h), "",
                                        rand(1, n, h)],
             lambda x, w, r, b, _, h0: _reference_gru_reset_first(x, w, r, b, h0), hidden_size=h),
        case("rnn_reverse", "RNN", [rand(s, n, i), rand(1, h, i), rand(1, h, h), rand(1, 2 * h)],
             lambda x, w, r, b: _reference_rnn(x, w, r, b, True), n_out=2, hidden_size=h, direction="reverse"),
    ]
    cases[2].outputs = [cases[2].outputs[0] + "_h"]  # Y_h alone: Y omitted
    cases[2].nodes[0].output[:] = ["", cases[2].outputs[0]]
    check_gradients(cases, tmp_path)


def _sdpa(q, k, v, mask=None, causal=False, heads=None):
    """torch's scaled_dot_product_attention on ONNX's layouts: 3-D [B, S, H * D] with ``heads`` (q, kv)."""
    if heads is not None:
        hq, hkv = heads
        q, k, v = (x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2) for x, h in ((q, hq), (k, hkv), (v, hkv)))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    return y if heads is None else y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)


def test_attention_gradients(tmp_path) -> None:
    mask = np.random.default_rng(1).random((3, 5)) > 0.3
    mask[:, 0] = True  # every query sees a key
    cases = [
        case("attention_gqa_bool_mask", "Attention", [rand(2, 4, 3, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 6), "m"],
             lambda q, k, v, m: _sdpa(q, k, v, m), consts={"m": mask}),
        case("attention_3d_causal", "Attention", [rand(2, 4, 8), rand(2, 4, 8), rand(2, 4, 8)],
             lambda q, k, v: _sdpa(q, k, v, causal=True, heads=(2, 2)), is_causal=1, q_num_heads=2, kv_num_heads=2),
        case("attention_float_mask_scale", "Attention", [rand(1, 2, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4),
                                                         rand(3, 3)],
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3), scale=0.3),
    ]
    check_gradients(cases, tmp_path)
