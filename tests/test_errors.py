"""Bad input gets one clear error: malformed files, unknown ops, bad configs, bad feeds."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from models import dense_relu, make, vi
from onnx import helper, numpy_helper

import aotc
from aotc.compiler import compile_model


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)


def _assert_one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("aotc: error:"), proc.stderr
    assert pattern in proc.stderr, proc.stderr


def test_truncated_and_garbage_model_files(tmp_path):
    good = dense_relu().SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(good[: len(good) // 2])
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xffnot a model at all\x13" * 50)
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name in ("trunc", "garbage", "empty"):
        proc = _cli("compile", str(tmp_path / f"{name}.onnx"), "-o", str(tmp_path / "out"), "-n", "m")
        _assert_one_line_error(proc, "not a valid ONNX model")
    _assert_one_line_error(_cli("compile", str(tmp_path / "missing.onnx")), "model file not found")


def test_unknown_ops_are_listed_all_at_once(tmp_path):
    model = make([helper.make_node("FancyOp", ["x"], ["a"], name="first"),
                  helper.make_node("FancyOp", ["a"], ["b"], name="second"),
                  helper.make_node("Relu", ["b"], ["c"]),
                  helper.make_node("Frobnicate", ["c"], ["y"], name="third", domain="com.example")],
                 [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(aotc.AotcError) as e:
        compile_model(model, tmp_path, "m")
    msg = str(e.value)
    assert "FancyOp (nodes: first, second)" in msg and "com.example.Frobnicate (nodes: third)" in msg
    path = tmp_path / "unknown.onnx"
    path.write_bytes(model.SerializeToString())
    _assert_one_line_error(_cli("compile", str(path), "-o", str(tmp_path)), "unsupported ops")
    proc = _cli("inspect", str(path))
    assert proc.returncode == 0 and "UNSUPPORTED" in proc.stdout and "FancyOp, com.example.Frobnicate" in proc.stdout


def test_config_errors(tmp_path):
    model = dense_relu()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    cases = {
        'fetch { id { node_name: "nope" } }': "no tensor or node of that name",
        'feed { id { node_name: "ghost" } } fetch { id { node_name: "y" } }': "'ghost'",
        'feed { id { node_name: "x" } shape { dim { size: 3 } dim { size: 64 } } } fetch { id { node_name: "y" } }':
            "config shape [3, 64]",
        'feed { id { node_name: "x" } ': "unbalanced",
        'feed { id { node_name: "x" } }': "no fetch",
        'fetch { id { node_name: "y" } } bogus: 1': "unknown field",
    }
    for text, pattern in cases.items():
        cfg = tmp_path / "c.pbtxt"
        cfg.write_text(text)
        _assert_one_line_error(_cli("compile", str(path), "-o", str(tmp_path / "o"), "-c", str(cfg)), pattern)
    _assert_one_line_error(_cli("compile", str(path), "-n", "bad name!"), "must be a C identifier")
    _assert_one_line_error(_cli("compile", str(path), "--input-shape", "nothere=1,2"), "unknown input")


def test_wrong_feeds_at_run_time(tmp_path):
    m = aotc.compile(dense_relu(m=2, k=4, n=3), out_dir=tmp_path, name="m")
    x = np.ones((2, 4), np.float32)
    assert m.run({"x": x})[0].shape == (2, 3)
    with pytest.raises(ValueError, match="unknown: \\['y'\\]"):
        m.run({"y": x})
    with pytest.raises(ValueError, match="missing: \\['x'\\]"):
        m.run({})
    with pytest.raises(ValueError, match="shape \\[2, 4\\], got \\[4, 2\\]"):
        m.run({"x": x.T.copy()})
    with pytest.raises(TypeError, match="must be float32, got float64"):
        m.run({"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match="expected 1 inputs"):
        m.run([x, x])
    # Non-contiguous input: handled by copying.
    big = np.ones((2, 8), np.float32)
    np.testing.assert_array_equal(m.run({"x": big[:, ::2]})[0], m.run({"x": x})[0])
    # Caller-supplied output buffers are filled in place; wrong ones are refused before the call.
    buf = np.full((2, 3), np.nan, np.float32)
    (y,) = m.run({"x": x}, out=[buf])
    assert y is buf and np.array_equal(buf, m.run({"x": x})[0])
    for bad in ([np.empty((3, 2), np.float32)], [np.empty((2, 3), np.float64)],
                [np.empty((3, 2), np.float32).T], [buf, buf]):
        with pytest.raises(ValueError, match="out"):
            m.run({"x": x}, out=bad)
    np.save(tmp_path / "x.npy", x.astype(np.float64))
    _assert_one_line_error(_cli("run", str(tmp_path / "m"), "--input", f"x={tmp_path / 'x.npy'}"), "float32")
    _assert_one_line_error(_cli("run", str(tmp_path / "nothing")), "no compiled model")


def test_cli_run_writes_outputs(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(dense_relu(m=2, k=4, n=3).SerializeToString())
    proc = _cli("compile", str(path), "-o", str(tmp_path / "out"), "-n", "m")
    assert proc.returncode == 0 and "1 kernels" in proc.stdout, proc.stderr
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = _cli("run", str(tmp_path / "out" / "m"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                str(tmp_path / "res"))
    assert proc.returncode == 0, proc.stderr
    y = np.load(tmp_path / "res" / "y.npy")
    np.testing.assert_array_equal(y, aotc.load(tmp_path / "out" / "m").run({"x": x})[0])


def test_one_tensor_fetched_twice_is_refused(tmp_path):
    model = dense_relu()
    node = next(n for n in model.graph.node if "y" in n.output)
    node.name = "last"
    cfg = tmp_path / "c.pbtxt"
    cfg.write_text('fetch { id { node_name: "y" } name: "a" } fetch { id { node_name: "last" } name: "b" }')
    with pytest.raises(aotc.AotcError, match="fetch 'last' is the same tensor as fetch 'y'"):
        compile_model(model, tmp_path / "o", "m", config=cfg)


def test_gen_test_without_a_reference_is_one_error():
    from aotc.reference import run_reference

    model = make([helper.make_node("Frobnicate", ["in0"], ["out0"], domain="com.example")],
                 [vi("in0", [2])], [vi("out0", [2])])
    with pytest.raises(aotc.AotcError, match="no reference could run the model"):
        run_reference(model, [np.zeros(2, np.float32)])


def test_tile_repeats_must_be_one_dimensional(tmp_path):
    model = make([helper.make_node("Tile", ["x", "r"], ["y"])], [vi("x", [2, 3])], [vi("y", None)],
                 [numpy_helper.from_array(np.array([[2], [1]], np.int64), "r")])
    with pytest.raises(aotc.AotcError, match="bad repeats"):
        compile_model(model, tmp_path, "m")
