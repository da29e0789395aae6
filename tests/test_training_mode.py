"""Training-mode ops against onnx.reference: BatchNormalization (batch statistics, running-mean outputs;
never folded into a preceding Conv as inference-mode BatchNorm is) and Dropout (its mask drawn at
compile time from the node's seed, as the reference draws it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import IR_VERSION

import aotc


def _vi(name, shape, dt=onnx.TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def _bn_model(x_shape, n_out, conv=False, **attrs):
    c = x_shape[1]
    rng = np.random.default_rng(len(x_shape) + n_out)
    inits = [numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "m"),
             numpy_helper.from_array(rng.random(c).astype(np.float32) + 0.5, "v")]
    nodes, src = [], "x"
    if conv:  # constant weights: inference-mode BN after this would fold into them
        inits.append(numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["cx"]))
        src = "cx"
    outs = ["y", "rm", "rv"][:n_out]
    nodes.append(helper.make_node("BatchNormalization", [src, "s", "b", "m", "v"], outs, training_mode=1,
                                  **attrs))
    out_vi = [_vi("y", list(x_shape))] + [_vi(o, [c]) for o in outs[1:]]
    g = helper.make_graph(nodes, "g", [_vi("x", list(x_shape))], out_vi, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = IR_VERSION
    return m


@pytest.mark.parametrize(("shape", "n_out", "conv", "attrs"), [
    ((2, 3, 4, 5), 3, False, {}),
    ((4, 5), 3, False, {"epsilon": 1e-2, "momentum": 0.7}),
    ((2, 3, 2, 3, 4), 2, False, {}),
    ((3, 4, 6, 6), 1, True, {"momentum": 0.5}),
])
def test_batchnorm_training_matches_reference(tmp_path, shape, n_out, conv, attrs):
    model = _bn_model(shape, n_out, conv, **attrs)
    x = (np.random.default_rng(7).standard_normal(shape) * 3 + 1).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    m = aotc.compile(model, tmp_path, name="bn", threads=2)
    got = m.run({"x": x})
    assert len(got) == n_out
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _dropout_model(shape, ratio, dtype=onnx.TensorProto.FLOAT, seed=None, mask=True):
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(np.array(ratio, np_dt), "r"),
             numpy_helper.from_array(np.array(True), "t")]
    outs = ["y", "z"] if mask else ["y"]
    attrs = {} if seed is None else {"seed": seed}
    node = helper.make_node("Dropout", ["x", "r", "t"], outs, **attrs)
    out_vi = [_vi("y", list(shape), dtype)] + ([_vi("z", list(shape), onnx.TensorProto.BOOL)] if mask else [])
    g = helper.make_graph([node], "g", [_vi("x", list(shape), dtype)], out_vi, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = IR_VERSION
    return m


@pytest.mark.parametrize("shape,ratio,dtype,seed", [
    ((3, 4, 5), 0.75, onnx.TensorProto.FLOAT, 0),
    ((2, 50), 0.3, onnx.TensorProto.FLOAT, 7),
    ((17,), 0.5, onnx.TensorProto.DOUBLE, 123),
])
def test_training_dropout_matches_reference(shape, ratio, dtype, seed, tmp_path) -> None:
    model = _dropout_model(shape, ratio, dtype, seed)
    x = np.random.default_rng(0).standard_normal(shape).astype(helper.tensor_dtype_to_np_dtype(dtype))
    want = ReferenceEvaluator(model).run(None, {"x": x})
    compiled = aotc.compile(model, tmp_path)
    got = compiled.run({"x": x})
    np.testing.assert_array_equal(got[1], want[1])  # the same mask
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert 0 < got[1].sum() < got[1].size
    np.testing.assert_array_equal(compiled.run({"x": x})[0], got[0])  # the same mask on every run


def test_training_dropout_ratio_out_of_range_is_refused(tmp_path) -> None:
    with pytest.raises(aotc.AotcError, match="ratio 1.0 is not in"):
        aotc.compile(_dropout_model((4,), 1.0, mask=False), tmp_path)
