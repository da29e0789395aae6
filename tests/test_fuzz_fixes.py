"""Regression tests for failure classes found by the fuzz campaign (tools/fuzz.py)."""

from __future__ import annotations

import numpy as np
import pytest
from models import init, make, ort_run, vi
from onnx import helper

import aotc
import aotc.reference as reference
from aotc.reference import run_reference


def _layernorm_without_bias():
    # onnxruntime 1.31 segfaults on this LayerNormalization (empty bias name) when run on inputs.
    node = helper.make_node("LayerNormalization", ["in0", "in1", ""], ["out0"], axis=-1)
    return make([node], [vi("in0", [2, 4]), vi("in1", [4])], [vi("out0", [2, 4])])


def _layernorm(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * scale


def test_a_crashing_onnxruntime_does_not_kill_the_compiler():
    rng = np.random.default_rng(0)
    x, scale = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    (out,), _ = run_reference(_layernorm_without_bias(), [x, scale])
    np.testing.assert_allclose(out, _layernorm(x, scale), rtol=1e-4, atol=1e-5)


def test_a_reference_child_that_dies_falls_back_to_onnx_reference(monkeypatch):
    monkeypatch.setattr(reference, "_ORT_CHILD", "import os; os.abort()")
    model = make([helper.make_node("Relu", ["in0"], ["out0"])], [vi("in0", [3])], [vi("out0", [3])])
    (out,), name = run_reference(model, [np.array([-1, 0, 2], np.float32)])
    assert name.startswith("onnx.reference")
    np.testing.assert_array_equal(out, [0, 0, 2])


def test_both_references_failing_names_the_childs_crash(monkeypatch):
    monkeypatch.setattr(reference, "_ORT_CHILD", "import os; os.abort()")
    model = make([helper.make_node("Frobnicate", ["in0"], ["out0"], domain="com.example")],
                 [vi("in0", [2])], [vi("out0", [2])])
    with pytest.raises(reference.AotcError, match=r"onnxruntime: crashed \(signal 6\); onnx.reference: "):
        run_reference(model, [np.zeros(2, np.float32)])


def test_the_reference_child_runs_onnxruntime():
    model = make([helper.make_node("Relu", ["in0"], ["out0"])], [vi("in0", [3])], [vi("out0", [3])])
    (out,), name = run_reference(model, [np.array([-1, 0, 2], np.float32)])
    assert name.startswith("onnxruntime")
    np.testing.assert_array_equal(out, [0, 0, 2])


def test_reduce_mean_over_an_empty_axis_is_zero_as_in_onnxruntime(tmp_path):
    # ONNX leaves it undefined; aotc computed 0 / 0 = NaN where onnxruntime gives 0.
    model = make([helper.make_node("ReduceMean", ["x"], ["y"], keepdims=1),
                  helper.make_node("ReduceSum", ["x", "a"], ["z"], keepdims=0)],
                 [vi("x", [2, 0])], [vi("y", [1, 1]), vi("z", [2])], [init("a", np.array([1]))], opset=18)
    x = np.zeros((2, 0), np.float32)
    got = aotc.compile(model, out_dir=tmp_path, name="m").run({"x": x})
    want = ort_run(model, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[0], [[0]])


def _matches_onnxruntime(model, feeds: dict[str, np.ndarray], out_dir) -> None:
    got = aotc.compile(model, out_dir=out_dir, name="m").run(feeds)
    for g, w in zip(got, ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_conv_row_past_the_bound_takes_the_generic_loop(tmp_path):
    # A 2^32+3 wide depthwise input made a 16 GiB `static const float zrow[...]` (ld failed); wide
    # rows pads [.., 2^31-1] ran the compiler out of memory listing edge columns.
    from aotc.ops.conv.common import MAX_FAST_ROW

    wide = MAX_FAST_ROW + 3
    w = np.random.default_rng(1).standard_normal((2, 1, 1, 3)).astype(np.float32)
    model = make([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[0, 1, 0, 1])],
                 [vi("x", [1, 2, 1, wide])], [vi("y", [1, 2, 1, wide])], [init("w", w)])
    x = np.random.default_rng(2).standard_normal((1, 2, 1, wide)).astype(np.float32)
    _matches_onnxruntime(model, {"x": x}, tmp_path)
    assert not any("zrow" in p.read_text() for p in tmp_path.rglob("*.c"))


@pytest.mark.parametrize("op, shape, attrs", [
    # The separable path's per-column tables and stack row buffer: a 2^32+3 wide row hung the compile.
    ("MaxPool", [1, 2, (1 << 14) + 5], {"kernel_shape": [3], "pads": [1, 1]}),
    # A 2^62 kernel: a C array beyond any object size, a MemoryError unrolling the taps, and then a
    # loop over 2^62 taps of padding at run time.
    ("AveragePool", [1, 1, 3, 4], {"kernel_shape": [1 << 62, 3], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", [1, 2, 9], {"kernel_shape": [1 << 62], "auto_pad": "SAME_LOWER"}),
    ("AveragePool", [1, 2, 9], {"kernel_shape": [1 << 40], "auto_pad": "SAME_UPPER", "count_include_pad": 1}),
])
def test_pools_past_the_separable_bounds_match_onnxruntime(op, shape, attrs, tmp_path):
    model = make([helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", shape)], [vi("y", None)])
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    _matches_onnxruntime(model, {"x": x}, tmp_path)
