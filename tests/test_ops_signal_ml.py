"""DFT/STFT against numpy's FFT at sizes beyond the backend suite's, the model-file checks of
TreeEnsemble (a hostile tree must fail at compile time, not loop forever in C), and If inlining."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_helpers import IR_VERSION

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
    node = helper.make_node("DFT", ["x", "len", ""], ["y"], onesided=onesided, inverse=inverse, axis=1)
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
