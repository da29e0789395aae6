"""The models the CUDA target is built for in CI (tests/test_cuda_build.py) and run on a GPU
(benchmarks/cuda.py --check): a small CNN and a Transformer encoder block, written as ONNX exporters
write them (Conv + BatchNormalization + Relu, MaxPool, a depthwise conv with a residual add, a 1x1 conv,
GlobalAveragePool, Gemm; LayerNormalization, Q/K/V projections, heads split by Reshape + Transpose,
scaled QK^T with an additive mask, Softmax, the erf GELU spelled out)."""

from __future__ import annotations

import numpy as np
import onnx
from models import init, make, vi
from onnx import helper


def cnn(batch: int = 2, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "wd"], ["d1"], pads=[1, 1, 1, 1], group=16),  # depthwise
        helper.make_node("Add", ["d1", "p1"], ["res"]),
        helper.make_node("Conv", ["res", "wp"], ["pw"]),  # pointwise (1x1)
        helper.make_node("Relu", ["pw"], ["pr"]),
        helper.make_node("Conv", ["pr", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [init("w1", w(16, 3, 3, 3)), init("b1", w(16)), init("g", 1 + w(16) / 4), init("beta", w(16)),
             init("mu", w(16)), init("var", (1 + np.abs(w(16))).astype(np.float32)), init("wd", w(16, 1, 3, 3)),
             init("wp", w(16, 16, 1, 1)), init("w2", w(32, 16, 3, 3)), init("b2", w(32)), init("lo", np.float32(0)),
             init("hi", np.float32(6)), init("wf", w(10, 32)), init("bf", w(10))]
    return make(nodes, [vi("x", [batch, 3, 32, 32])], [vi("y", [batch, 10])], inits)


def transformer(batch: int = 2, seq: int = 16, hidden: int = 64, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    dh = hidden // heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    def heads_of(x: str, out: str, perm: list[int]) -> list[onnx.NodeProto]:
        return [helper.make_node("Reshape", [x, "split_shape"], [f"{out}_r"]),
                helper.make_node("Transpose", [f"{out}_r"], [out], perm=perm)]

    nodes = [helper.make_node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["h"], axis=-1, epsilon=1e-5)]
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["h", f"w{p}"], [f"{p}_mm"]),
                  helper.make_node("Add", [f"{p}_mm", f"b{p}"], [p])]
    nodes += heads_of("q", "qh", [0, 2, 1, 3]) + heads_of("k", "kh", [0, 2, 3, 1]) + heads_of("v", "vh", [0, 2, 1, 3])
    nodes += [
        helper.make_node("MatMul", ["qh", "kh"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vh"], ["ctx_h"]),
        helper.make_node("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["ctx"]),
        helper.make_node("MatMul", ["ctx", "wo"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "bo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["x1"]),
        helper.make_node("LayerNormalization", ["x1", "ln2_g", "ln2_b"], ["h2"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h2", "w1"], ["f1_mm"]),
        helper.make_node("Add", ["f1_mm", "b1"], ["f1"]),
        # GELU as exporters spell it: 0.5 * x * (1 + erf(x / sqrt(2)))
        helper.make_node("Div", ["f1", "sqrt2"], ["g_div"]),
        helper.make_node("Erf", ["g_div"], ["g_erf"]),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"]),
        helper.make_node("Mul", ["f1", "g_add"], ["g_mul"]),
        helper.make_node("Mul", ["g_mul", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["f2_mm"]),
        helper.make_node("Add", ["f2_mm", "b2"], ["f2"]),
        helper.make_node("Add", ["x1", "f2"], ["y"]),
    ]
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[-1, ..., seq // 2:] = -1e4  # the last sequence is padded: its second half is masked out
    inits = [init("ln1_g", 1 + w(hidden) / 4), init("ln1_b", w(hidden)), init("ln2_g", 1 + w(hidden) / 4),
             init("ln2_b", w(hidden)), init("wo", w(hidden, hidden)), init("bo", w(hidden)),
             init("w1", w(hidden, 4 * hidden)), init("b1", w(4 * hidden)), init("w2", w(4 * hidden, hidden)),
             init("b2", w(hidden)), init("mask", mask), init("scale", np.float32(1 / np.sqrt(dh))),
             init("split_shape", np.array([batch, seq, heads, dh], np.int64)),
             init("merge_shape", np.array([batch, seq, hidden], np.int64)),
             init("sqrt2", np.float32(np.sqrt(2))), init("one", np.float32(1)), init("half", np.float32(0.5))]
    inits += [init(f"w{p}", w(hidden, hidden)) for p in "qkv"] + [init(f"b{p}", w(hidden)) for p in "qkv"]
    return make(nodes, [vi("x", [batch, seq, hidden])], [vi("y", [batch, seq, hidden])], inits)


def data_movement(seed: int = 0) -> onnx.ModelProto:
    """Embedding lookup (Gather with run-time ids), Concat, Split, Pad (reflect), Tile, ArgMax and the fused
    Attention op (opset 23: 4-D with a boolean mask and grouped kv heads; 3-D, causal and softcapped with a past
    and the present outputs)."""
    rng = np.random.default_rng(seed)
    from onnx import TensorProto

    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),           # [2, 8, 32]
        helper.make_node("Split", ["emb", "halves"], ["e0", "e1"], axis=2),       # [2, 8, 16] twice
        helper.make_node("Concat", ["e1", "e0", "e1"], ["cat"], axis=2),          # [2, 8, 48]
        helper.make_node("Pad", ["cat", "pads"], ["pad"], mode="reflect"),        # [2, 10, 48]
        helper.make_node("Tile", ["pad", "reps"], ["tiled"]),                     # [2, 10, 96]
        helper.make_node("ArgMax", ["tiled"], ["best"], axis=2, keepdims=0),      # [2, 10]
        helper.make_node("Attention", ["q", "k", "v", "mask"], ["att"], is_causal=0),
        # 3-D, causal, softcapped, with a past and the present outputs
        helper.make_node("Attention", ["q3", "k3", "v3", "", "pk", "pv"], ["att3", "present_k", "present_v"],
                         q_num_heads=4, kv_num_heads=2, is_causal=1, softcap=30.0),
    ]
    inits = [init("table", rng.standard_normal((50, 32)).astype(np.float32)),
             init("halves", np.array([16, 16], np.int64)), init("pads", np.array([0, 1, 0, 0, 1, 0], np.int64)),
             init("reps", np.array([1, 1, 2], np.int64)), init("mask", rng.random((2, 1, 8, 8)) > 0.3)]
    return make(nodes, [vi("ids", [2, 8], TensorProto.INT64), vi("q", [2, 4, 8, 32]), vi("k", [2, 2, 8, 32]),
                        vi("v", [2, 2, 8, 32]), vi("q3", [2, 8, 64]), vi("k3", [2, 8, 32]), vi("v3", [2, 8, 32]),
                        vi("pk", [2, 2, 4, 16]), vi("pv", [2, 2, 4, 16])],
                [vi("tiled", [2, 10, 96]), vi("best", [2, 10], TensorProto.INT64), vi("att", [2, 4, 8, 32]),
                 vi("att3", [2, 8, 64]), vi("present_k", [2, 2, 12, 16]), vi("present_v", [2, 2, 12, 16])],
                inits, opset=23)
