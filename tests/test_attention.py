"""Differential tests of the transformer ops (aotc/ops/attention.py) against onnx.reference: odd sizes,
GQA, masks that broadcast and are shorter than the keys, KV caches, softcap, the qk_matmul_output
modes, padded keys, float16; the same bits on 2 threads; and a sanitizer run of the generated C."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import run_generated_test_under_sanitizers

import aotc
from aotc.compiler import compile_model

OPSET = 28
F32, F16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, tuple[int, ...]]],
           outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("ai.onnx.preview", 1)])


def _feeds(inputs: dict[str, tuple[int, tuple[int, ...]]], ints: dict[str, list[int]],
           seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (t, shape) in inputs.items():
        if t == I64:
            feeds[name] = np.array(ints[name], np.int64)
        elif t == BOOL:
            feeds[name] = rng.random(shape) < 0.7
        else:
            feeds[name] = rng.uniform(-1.5, 1.5, shape).astype(helper.tensor_dtype_to_np_dtype(t))
    return feeds


def _att(outs: list[str], ins: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node("Attention", ins, outs, **attrs)


# name -> (type, shape) of every graph input; one model holds every case so it compiles once.
INPUTS: dict[str, tuple[int, tuple[int, ...]]] = {
    # 1: GQA (6 query heads on 2 kv heads), causal, a bool mask (q, kv) one key short (padded as masked)
    "q1": (F32, (2, 6, 5, 7)), "k1": (F32, (2, 2, 9, 7)), "v1": (F32, (2, 2, 9, 3)), "m1": (BOOL, (5, 8)),
    # 2: 3-D inputs with a KV cache, a float (heads, 1, kv) mask, softcap, qk output after softcap
    "q2": (F32, (1, 4, 15)), "k2": (F32, (1, 2, 15)), "v2": (F32, (1, 2, 12)), "m2": (F32, (3, 1, 8)),
    "pk2": (F32, (1, 3, 6, 5)), "pv2": (F32, (1, 3, 6, 4)),
    # 3: padded keys (per-batch lengths, one below the query count: its first row sees nothing),
    #    causal with a left window, the probabilities as qk output
    "q3": (F32, (2, 2, 3, 4)), "k3": (F32, (2, 2, 6, 4)), "v3": (F32, (2, 2, 6, 4)), "n3": (I64, (2,)),
    # 4: a float (batch, 1, q, kv) mask, explicit scale, qk output with the bias
    "q4": (F32, (2, 3, 4, 5)), "k4": (F32, (2, 3, 7, 5)), "v4": (F32, (2, 3, 7, 5)), "m4": (F32, (2, 1, 4, 7)),
    # 5: float16, with the raw scores as qk output
    "q5": (F16, (1, 2, 3, 8)), "k5": (F16, (1, 2, 5, 8)), "v5": (F16, (1, 2, 5, 8)),
    # 6: FlexAttention with GQA
    "q6": (F32, (1, 4, 3, 6)), "k6": (F32, (1, 2, 5, 6)), "v6": (F32, (1, 2, 5, 7)),
    # SwiGLU, TensorScatter (linear, circular with a negative index), CausalConvWithState, LinearAttention
    "sa": (F32, (3, 5, 7)), "sb": (F32, (3, 5, 7)),
    "cache": (F32, (2, 3, 4, 2)), "upd": (F32, (2, 3, 3, 2)), "wl": (I64, (2,)), "wc": (I64, (2,)),
    "cx": (F32, (2, 3, 5)), "cw": (F32, (3, 1, 3)), "cb": (F32, (3,)), "cp": (F32, (2, 3, 2)),
    "lq": (F32, (2, 3, 4 * 3)), "lk": (F32, (2, 3, 2 * 3)), "lv": (F32, (2, 3, 2 * 5)),
    "lp": (F32, (2, 2, 3, 5)), "ld": (F32, (2, 3, 2 * 3)), "lb": (F32, (2, 3, 2)),
}
INTS = {"n3": [6, 2], "wl": [1, 0], "wc": [3, -2]}
NODES = [
    _att(["y1"], ["q1", "k1", "v1", "m1"], is_causal=1),
    _att(["y2", "pko2", "pvo2", "qk2"], ["q2", "k2", "v2", "m2", "pk2", "pv2"], q_num_heads=3,
         kv_num_heads=3, softcap=1.5, qk_matmul_output_mode=1),
    _att(["y3", "", "", "qk3"], ["q3", "k3", "v3", "", "", "", "n3"], is_causal=1, left_window_size=1,
         qk_matmul_output_mode=3),
    _att(["y4", "", "", "qk4"], ["q4", "k4", "v4", "m4"], scale=0.3, qk_matmul_output_mode=2),
    _att(["y5", "", "", "qk5"], ["q5", "k5", "v5"]),
    helper.make_node("FlexAttention", ["q6", "k6", "v6"], ["y6"], domain="ai.onnx.preview"),
    helper.make_node("SwiGLU", ["sa", "sb"], ["sy"], alpha=1.7),
    helper.make_node("TensorScatter", ["cache", "upd", "wl"], ["tl"]),
    helper.make_node("TensorScatter", ["cache", "upd", "wc"], ["tc"], mode="circular"),
    helper.make_node("CausalConvWithState", ["cx", "cw", "cb", "cp"], ["cy", "cs"], activation="silu"),
    helper.make_node("LinearAttention", ["lq", "lk", "lv", "lp", "ld", "lb"], ["ly", "ls"], q_num_heads=4,
                     kv_num_heads=2),
]
OUTPUTS = ["y1", "y2", "pko2", "pvo2", "qk2", "y3", "qk3", "y4", "qk4", "y5", "qk5", "y6", "sy", "tl", "tc",
           "cy", "cs", "ly", "ls"]


def test_ops_match_reference(tmp_path) -> None:
    model = _model(NODES, INPUTS, OUTPUTS)
    feeds = _feeds(INPUTS, INTS)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = aotc.compile(model, out_dir=tmp_path, name="att").run(feeds)
    for name, g, w in zip(OUTPUTS, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        tol = 2e-3 if g.dtype == np.float16 else 2e-5
        # atol scales with the output: LinearAttention's state sums cancel
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * float(np.abs(w).max()), err_msg=name)
    # The first query row of batch 1 in case 3 sees no key: a zero row in Y and in the probabilities.
    y3, qk3 = got[OUTPUTS.index("y3")], got[OUTPUTS.index("qk3")]
    assert not y3[1, :, 0].any() and not qk3[1, :, 0].any()


def test_threads_give_identical_bits(tmp_path) -> None:
    """Big enough to be split into tasks: 2 threads must give the bits of 1."""
    inputs = {"q": (F32, (2, 4, 67, 33)), "k": (F32, (2, 2, 67, 33)), "v": (F32, (2, 2, 67, 31)),
              "lq": (F32, (3, 40, 4 * 16)), "lk": (F32, (3, 40, 2 * 16)), "lv": (F32, (3, 40, 2 * 16)),
              "ld": (F32, (3, 40, 2)), "lb": (F32, (3, 40, 2))}
    nodes = [_att(["y", "", "", "qk"], ["q", "k", "v"], is_causal=1, softcap=4.0, qk_matmul_output_mode=3),
             helper.make_node("LinearAttention", ["lq", "lk", "lv", "", "ld", "lb"], ["ly", "ls"],
                              q_num_heads=4, kv_num_heads=2)]
    res = compile_model(_model(nodes, inputs, ["y", "qk", "ly", "ls"]), tmp_path, "m")
    feeds = _feeds(inputs, {}, seed=1)
    one = aotc.load(res.prefix, threads=1).run(feeds)
    two = aotc.load(res.prefix, threads=2).run(feeds)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sanitizers_run_clean(tmp_path) -> None:
    """The generated test program (reference outputs, then a 2-thread rerun) under ASan and UBSan."""
    run_generated_test_under_sanitizers(_model(NODES, INPUTS, OUTPUTS), tmp_path)


BF16 = TensorProto.BFLOAT16
# bfloat16 cases: causal GQA with a float mask and softcap; a KV cache with the raw scores; padded keys
# with a window and the probabilities; the scores with the bias. Each is compared bit for bit.
BF16_INPUTS: dict[str, tuple[int, tuple[int, ...]]] = {
    "q1": (BF16, (2, 4, 5, 16)), "k1": (BF16, (2, 2, 9, 16)), "v1": (BF16, (2, 2, 9, 6)),
    "m1": (BF16, (2, 1, 5, 9)),
    "q2": (BF16, (1, 3, 8)), "k2": (BF16, (1, 2, 8)), "v2": (BF16, (1, 2, 10)),
    "pk2": (BF16, (1, 2, 4, 4)), "pv2": (BF16, (1, 2, 4, 5)),
    "q3": (BF16, (2, 2, 3, 4)), "k3": (BF16, (2, 2, 6, 4)), "v3": (BF16, (2, 2, 6, 4)), "n3": (I64, (2,)),
}
BF16_NODES = [  # onnx.reference stores empty output names as a value "": read "" before any node writes it
    _att(["y2", "pko2", "pvo2", "qk2"], ["q2", "k2", "v2", "", "pk2", "pv2"], q_num_heads=2, kv_num_heads=2),
    _att(["y3", "", "", "qk3"], ["q3", "k3", "v3", "", "", "", "n3"], is_causal=1, right_window_size=1,
         left_window_size=2, qk_matmul_output_mode=3),
    _att(["y1", "", "", "qk1"], ["q1", "k1", "v1", "m1"], is_causal=1, softcap=2.0, qk_matmul_output_mode=2),
]
BF16_OUTPUTS = ["y1", "qk1", "y2", "pko2", "pvo2", "qk2", "y3", "qk3"]


def test_bfloat16_attention_rounds_like_the_reference(tmp_path) -> None:
    """bfloat16 Attention rounds every step the reference rounds (Q and K scaled, the scores, softcap,
    bias, x - max, exp, each addition of the softmax sum, the quotient), so it matches bit for bit."""
    model = _model(BF16_NODES, BF16_INPUTS, BF16_OUTPUTS)
    feeds = _feeds(BF16_INPUTS, {"n3": [5, 2]}, seed=3)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = aotc.compile(model, out_dir=tmp_path, name="attbf").run(feeds)
    for name, g, w in zip(BF16_OUTPUTS, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        same = (g.view(np.uint16) == w.view(np.uint16)) | (np.isnan(g.astype(np.float32))
                                                            & np.isnan(w.astype(np.float32)))
        assert same.all(), f"{name}: {np.count_nonzero(~same)} of {g.size} differ"
