"""DFT/STFT against numpy's FFT at sizes beyond the backend suite's, the model-file checks of
TreeEnsemble (a hostile tree must fail at compile time, not loop forever in C), and If inlining."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_helpers import IR_VERSION, run_generated_test_under_sanitizers

import aotc
from aotc.errors import AotcError
from aotc.frontends.control_flow import inline_control_flow


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 20),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = IR_VERSION
    return m


def _vi(name, shape, dt=onnx.TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


@pytest.mark.parametrize(("n", "length", "onesided", "inverse"),
                         [(64, 64, 1, 0), (48, 40, 0, 0), (30, 30, 0, 1), (64, 33, 1, 1)])
def test_dft_matches_numpy(tmp_path, n, length, onesided, inverse):
    rng = np.random.default_rng(n + length)
    comps = 2 if inverse else 1
    x = rng.standard_normal((2, length, 3, comps)).astype(np.float32)
    out_len = n if inverse else (n // 2 + 1 if onesided else n)
    out_comps = 1 if inverse and onesided else 2
    node = helper.make_node("DFT", ["x", "len"], ["y"], onesided=onesided, inverse=inverse, axis=1)
    model = _model([node], [_vi("x", list(x.shape))], [_vi("y", [2, out_len, 3, out_comps])],
                   [numpy_helper.from_array(np.array(n, np.int64), "len")], opsets=(("", 19),))
    m = aotc.compile(model, tmp_path, name="dft", threads=2)
    got = m.run({"x": x})[0]
    z = x[..., 0] + 1j * x[..., 1] if comps == 2 else x[..., 0]
    if inverse and onesided:
        want = np.fft.irfft(z, n=n, axis=1)[..., None]
    elif inverse:
        w = np.fft.ifft(z, n=n, axis=1)
        want = np.stack([w.real, w.imag], -1)
    else:
        w = np.fft.fft(z.astype(np.float64), n=n, axis=1)[:, :out_len]
        want = np.stack([w.real, w.imag], -1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_stft_matches_numpy(tmp_path):
    rng = np.random.default_rng(3)
    sig = rng.standard_normal((2, 200, 1)).astype(np.float32)
    win = np.hanning(32).astype(np.float32)
    node = helper.make_node("STFT", ["s", "step", "w", ""], ["y"])
    model = _model([node], [_vi("s", [2, 200, 1]), _vi("w", [32])], [_vi("y", [2, 22, 17, 2])],
                   [numpy_helper.from_array(np.array(8, np.int64), "step")], opsets=(("", 17),))
    got = aotc.compile(model, tmp_path, name="stft").run({"s": sig, "w": win})[0]
    frames = np.stack([sig[:, f * 8:f * 8 + 32, 0] * win for f in range(22)], 1)
    spec = np.fft.rfft(frames.astype(np.float64), axis=-1)
    np.testing.assert_allclose(got, np.stack([spec.real, spec.imag], -1), rtol=1e-4, atol=1e-5)


def _tree_model(truenodeids, falsenodeids, trueleafs, falseleafs, featureids=(0, 0)):
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1, tree_roots=[0],
        nodes_featureids=list(featureids), nodes_truenodeids=truenodeids, nodes_falsenodeids=falsenodeids,
        nodes_trueleafs=trueleafs, nodes_falseleafs=falseleafs, leaf_targetids=[0, 0], aggregate_function=1,
        nodes_modes=numpy_helper.from_array(np.zeros(2, np.uint8)),
        nodes_splits=numpy_helper.from_array(np.array([0.5, 1.5], np.float32)),
        leaf_weights=numpy_helper.from_array(np.array([1.0, 2.0], np.float32)))
    return _model([node], [_vi("x", [4, 2])], [_vi("y", [4, 1])], opsets=(("", 20), ("ai.onnx.ml", 5)))


def test_tree_ensemble_walks_and_matches_reference(tmp_path):
    from onnx.reference import ReferenceEvaluator

    model = _tree_model([1, 0], [0, 1], [0, 1], [1, 1], featureids=(0, 1))
    x = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0], [np.nan, 3.0]], np.float32)
    got = aotc.compile(model, tmp_path, name="tree").run({"x": x})[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize(("args", "message"), [
    (([1, 0], [0, 1], [0, 0], [1, 1]), "cycle"),          # node 1 -> node 0 -> node 1
    (([1, 7], [0, 1], [0, 1], [1, 1]), "out of range"),  # leaf 7 does not exist
])
def test_hostile_tree_ensemble_is_rejected(tmp_path, args, message):
    with pytest.raises(AotcError, match=message):
        aotc.compile(_tree_model(*args), tmp_path, name="tree")


def _if_model(cond_const: bool | None):
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [_vi("t", [3])])
    inner = helper.make_graph([helper.make_node("Neg", ["t2"], ["n"])], "inner", [], [_vi("n", [3])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t2"]),  # t2 read by the nested If
                               helper.make_node("If", ["c"], ["e"], then_branch=inner, else_branch=inner)],
                              "else", [], [_vi("e", [3])])
    inputs = [_vi("x", [3])]
    inits = []
    if cond_const is None:
        inputs.append(_vi("c", [1], onnx.TensorProto.BOOL))
    else:
        inits.append(numpy_helper.from_array(np.array([cond_const]), "c"))
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _model([node], inputs, [_vi("y", [3])], inits, opsets=(("", 17),))


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_runtime_and_constant_condition(tmp_path, cond):
    x = np.array([1.0, -2.0, 3.0], np.float32)
    want = x + x if cond else -(x * x)
    m = aotc.compile(_if_model(None), tmp_path / "rt", name="if_rt")
    np.testing.assert_array_equal(m.run({"x": x, "c": np.array([cond])})[0], want)
    m = aotc.compile(_if_model(cond), tmp_path / "const", name="if_const")
    np.testing.assert_array_equal(m.run({"x": x})[0], want)
    # A constant condition keeps only the taken branch; a run-time one computes both and selects.
    ops = {n.op_type for n in inline_control_flow(_if_model(cond)).graph.node}
    assert ("Add" in ops) == cond and ("Mul" in ops) != cond and "If" not in ops
    ops = {n.op_type for n in inline_control_flow(_if_model(None)).graph.node}
    assert {"Add", "Mul", "Neg", "Where"} <= ops and "If" not in ops


# -- TfIdfVectorizer and LabelEncoder: several configurations in one model, against onnx.reference ---------
_POOL = [3, 1, 5, 3,                # unigrams (3 twice: the later column wins)
         1, 2, 3, 3, 0, 4, 1, 2,    # bigrams (1 2 twice)
         2, 3, 1, 0, 0, 0]          # trigrams
_TFIDF = [  # (input shape, input type, attributes)
    ((3, 24), onnx.TensorProto.INT64, dict(min_gram_length=1, max_gram_length=3, max_skip_count=2, mode="TFIDF",
                                           weights=[0.5 * i + 0.25 for i in range(12)])),
    ((30,), onnx.TensorProto.INT32, dict(min_gram_length=1, max_gram_length=2, max_skip_count=1, mode="IDF")),
    ((2, 16), onnx.TensorProto.INT32, dict(min_gram_length=2, max_gram_length=3, max_skip_count=0, mode="TF")),
    ((4, 10), onnx.TensorProto.INT64, dict(min_gram_length=2, max_gram_length=2, max_skip_count=3, mode="IDF",
                                           weights=[float(i) for i in range(12)])),
]


def _tfidf_node(name, **attrs):
    attrs = dict(ngram_counts=[0, 4, 12], ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 7],
                 pool_int64s=_POOL) | attrs
    return helper.make_node("TfIdfVectorizer", [f"x{name}"], [f"y{name}"], **attrs)


def test_tfidf_vectorizer_matches_reference(tmp_path):
    from onnx.reference import ReferenceEvaluator

    nodes, ins, outs, feeds = [], [], [], {}
    rng = np.random.default_rng(5)
    for i, (shape, dt, attrs) in enumerate(_TFIDF):
        nodes.append(_tfidf_node(str(i), **attrs))
        ins.append(_vi(f"x{i}", list(shape), dt))
        outs.append(_vi(f"y{i}", [*shape[:-1], 12]))
        feeds[f"x{i}"] = rng.integers(0, 6, shape).astype(onnx.helper.tensor_dtype_to_np_dtype(dt))
    model = _model(nodes, ins, outs, opsets=(("", 9),))
    got = aotc.compile(model, tmp_path, name="tfidf", threads=2).run(feeds)
    # onnx.reference fails on IDF without weights (the spec's weights of 1): count with TF instead.
    idf_ones = [i for i, (_, _, a) in enumerate(_TFIDF) if a["mode"] == "IDF" and "weights" not in a]
    for i in idf_ones:
        nodes[i] = _tfidf_node(str(i), **(_TFIDF[i][2] | {"mode": "TF"}))
    want = ReferenceEvaluator(_model(nodes, ins, outs, opsets=(("", 9),))).run(None, feeds)
    want = [(w > 0).astype(np.float32) if i in idf_ones else w for i, w in enumerate(want)]
    assert any(w.max() > 1 for w in want)  # the inputs do hit n-grams more than once
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(("attrs", "message"), [
    (dict(ngram_indexes=[0, 1, 2]), "more n-grams than ngram_indexes"),
    (dict(ngram_counts=[0, 40]), "ngram_counts"),
    (dict(ngram_indexes=[0, -1] * 6), "non-negative"),
    (dict(mode="TFIDF", weights=[1.0, 2.0]), "weights"),
])
def test_hostile_tfidf_vectorizer_is_rejected(tmp_path, attrs, message):
    required = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0)  # so only attrs is wrong
    model = _model([_tfidf_node("", **(required | attrs))], [_vi("x", [8], onnx.TensorProto.INT64)], [_vi("y", [12])],
                   opsets=(("", 9),))
    with pytest.raises(AotcError, match=message):
        aotc.compile(model, tmp_path, name="tfidf")


def test_label_encoder_matches_reference(tmp_path):
    from onnx.reference import ReferenceEvaluator

    i64, f32 = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("LabelEncoder", ["a"], ["ya"], domain="ai.onnx.ml", keys_int64s=[7, -3, 2**40, 7, 0],
                         values_floats=[1.5, -2.0, 3.25, 4.0, 0.5], default_float=-9.0),
        helper.make_node("LabelEncoder", ["b"], ["yb"], domain="ai.onnx.ml", keys_floats=[0.5, -1.25, 3.0],
                         values_int64s=[10, -2**63, 30]),
        helper.make_node("LabelEncoder", ["c"], ["yc"], domain="ai.onnx.ml",
                         keys_tensor=numpy_helper.from_array(np.array([4, 1, 9], np.int32)),
                         values_tensor=numpy_helper.from_array(np.array([40, 10, 90], np.int16)),
                         default_tensor=numpy_helper.from_array(np.array([-5], np.int16))),
    ]
    ins = [_vi("a", [3, 5], i64), _vi("b", [6], f32), _vi("c", [2, 4], onnx.TensorProto.INT32)]
    outs = [_vi("ya", [3, 5], f32), _vi("yb", [6], i64), _vi("yc", [2, 4], onnx.TensorProto.INT16)]
    model = _model(nodes, ins, outs, opsets=(("", 20), ("ai.onnx.ml", 4)))
    rng = np.random.default_rng(1)
    feeds = {"a": rng.choice([7, -3, 2**40, 0, 5, -1], (3, 5)).astype(np.int64),
             "b": np.array([0.5, -1.25, 3.0, 2.0, np.inf, 0.25], np.float32),
             "c": rng.integers(0, 10, (2, 4)).astype(np.int32)}
    got = aotc.compile(model, tmp_path, name="le", threads=2).run(feeds)
    for g, w in zip(got, ReferenceEvaluator(model).run(None, feeds), strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_label_encoder_float_keys_compare_bitwise(tmp_path):
    """The spec compares keys bit for bit, so a NaN key maps NaN (onnx.reference's dict never does)."""
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_floats=[float("nan"), 0.0],
                            values_int64s=[1, 2], default_int64=0)
    model = _model([node], [_vi("x", [3])], [_vi("y", [3], onnx.TensorProto.INT64)],
                   opsets=(("", 20), ("ai.onnx.ml", 2)))
    got = aotc.compile(model, tmp_path, name="le").run({"x": np.array([np.nan, 0.0, -0.0], np.float32)})[0]
    np.testing.assert_array_equal(got, [1, 2, 0])


def test_string_label_encoder_is_rejected(tmp_path):
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_strings=["a"],
                            values_int64s=[1])
    model = _model([node], [_vi("x", [3], onnx.TensorProto.INT64)], [_vi("y", [3], onnx.TensorProto.INT64)],
                   opsets=(("", 20), ("ai.onnx.ml", 2)))
    with pytest.raises(AotcError, match="string"):
        aotc.compile(model, tmp_path, name="le")


def test_new_kernels_run_clean_under_sanitizers(tmp_path):
    """TfIdfVectorizer, LabelEncoder, training-mode BatchNormalization and the float16/bfloat16
    Softmax rows: the generated test program (random inputs against onnx.reference) under ASan and
    UBSan."""
    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    c = 3
    inits = [numpy_helper.from_array(np.full(c, v, np.float32), n)
             for n, v in (("s", 1.5), ("b", 0.25), ("m", 0.1), ("v", 2.0))]
    nodes = [_tfidf_node("", **_TFIDF[0][2]),
             helper.make_node("LabelEncoder", ["li"], ["lo"], domain="ai.onnx.ml", keys_int64s=[-1, 0, 1, 5],
                              values_floats=[1.0, 2.0, 3.0, 4.0]),
             helper.make_node("BatchNormalization", ["bx", "s", "b", "m", "v"], ["by", "rm", "rv"], training_mode=1),
             helper.make_node("Softmax", ["h"], ["hy"], axis=1),
             helper.make_node("Softmax", ["bh"], ["bhy"])]
    model = _model(nodes, [_vi("x", [3, 24], onnx.TensorProto.INT64), _vi("li", [7], onnx.TensorProto.INT64),
                           _vi("bx", [2, c, 5]), _vi("h", [2, 9, 3], f16), _vi("bh", [4, 11], bf16)],
                   [_vi("y", [3, 12]), _vi("lo", [7]), _vi("by", [2, c, 5]), _vi("rm", [c]), _vi("rv", [c]),
                    _vi("hy", [2, 9, 3], f16), _vi("bhy", [4, 11], bf16)],
                   inits, opsets=(("", 20), ("ai.onnx.ml", 4)))
    run_generated_test_under_sanitizers(model, tmp_path)
