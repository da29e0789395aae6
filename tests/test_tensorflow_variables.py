"""TensorFlow variables as arguments (tfcompile's config ``variable`` entries, a SavedModel's
``--variables-to-feed``): read-only ones are inputs, assigned ones in-place arguments that hold
TensorFlow's values after each of two runs (fixtures from TensorFlow: tests/tf_small_fixtures.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx_helpers import SANITIZE, require_sanitizers
from tf_small_fixtures import small_fixtures_dir

import aotc
from aotc.compiler import compile_model
from aotc.errors import AotcError

CONFIG = """
feed { id { node_name: "x" } shape { dim { size: 2 } dim { size: 3 } } }
fetch { id { node_name: "y" } }
variable { node_name: "w" shape { dim { size: 3 } dim { size: 4 } } type: DT_FLOAT }
variable { node_name: "b" shape { dim { size: 4 } } }
variable { node_name: "c" readonly: true name: "cee" }
"""


@pytest.fixture(scope="module")
def fx() -> Path:
    return small_fixtures_dir()


def config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "graph.config.pbtxt"
    path.write_text(text)
    return path


def test_config_variables_are_updated_as_tensorflow_updates_them(fx, tmp_path):
    data = np.load(fx / "graph.npz")
    result = compile_model(fx / "graph.pb", tmp_path, "g", config=config(tmp_path))
    model = aotc.load(result.prefix)
    assert [(t.name, t.updated) for t in model.inputs] == [("x", False), ("w", True), ("b", True), ("cee", False)]
    w, b, c = (data[f"init_{k}"].copy() for k in "wbc")
    for i in range(2):  # the same buffers twice, as a program calling NAME_run in a loop
        (y,) = model.run({"x": data[f"x_{i}"], "w": w, "b": b, "cee": c})
        np.testing.assert_allclose(y, data[f"y_{i}"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(w, data[f"w_{i}"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b, data[f"b_{i}"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(c, data["init_c"])
    header = (tmp_path / "g.h").read_text()
    assert "int g_run(const float *x, float *w, float *b, const float *cee, float *y, void *workspace);" in header


def test_tf1_reference_variables_are_updated_in_place(fx, tmp_path):
    data = np.load(fx / "ref.npz")
    cfg = config(tmp_path, 'fetch { id { node_name: "y" } } variable { node_name: "v" }')
    model = aotc.load(compile_model(fx / "ref.pb", tmp_path, "ref", config=cfg).prefix)
    v = np.arange(3, dtype=np.float32)  # the initializer's value
    for i in range(2):
        (y,) = model.run({"x": data[f"x_{i}"], "v": v})
        np.testing.assert_array_equal(y, data[f"y_{i}"])
        np.testing.assert_array_equal(v, data[f"v_{i}"])


def test_saved_model_variables_to_feed_are_updated_in_place(fx, tmp_path):
    data = np.load(fx / "module.npz")
    result = compile_model(fx / "module_saved_model", tmp_path, "mod", variables_to_feed=["all"])
    model = aotc.load(result.prefix)
    assert [(t.name, t.updated) for t in model.inputs] == [
        ("x", False), ("acc", True), ("count", True), ("last", True), ("scale", False)]
    state = {k: np.array(data[f"init_{k}"]) for k in ("acc", "count", "last", "scale")}
    for i in range(2):
        n, out = model.run({"x": data[f"x_{i}"], **state})
        assert float(n) == float(data[f"n_{i}"])
        np.testing.assert_allclose(out, data[f"out_{i}"], rtol=1e-5, atol=1e-6)
        for k in ("acc", "count", "last", "scale"):
            np.testing.assert_allclose(state[k], data[f"{k}_{i}"], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_gradient_tape_training_step_matches_tensorflow(fx, tmp_path):
    """tf.GradientTape through the sparse and dense softmax cross-entropy ops (their gradient is their
    second output) and assign_sub: three steps as TensorFlow takes them."""
    data = np.load(fx / "train.npz")
    model = aotc.load(compile_model(fx / "train_saved_model", tmp_path, "step", variables_to_feed=["all"]).prefix)
    w, b = data["init_w"].copy(), data["init_b"].copy()
    for i in range(3):
        (loss,) = model.run({"x": data[f"x_{i}"], "y": data[f"y_{i}"], "w": w, "b": b})
        np.testing.assert_allclose(loss, data[f"loss_{i}"], rtol=1e-5)
    np.testing.assert_allclose(w, data["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, data["b"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("entry", "error"), [
    ('variable { node_name: "nope" }', r"config variable 'nope' \(line 6\): no node of that name in the graph"),
    ('variable { node_name: "y" }', r"config variable 'y' \(line 6\): Identity node 'y' is not a variable "
                                    r"\(VarHandleOp, Variable, VariableV2\)"),
    ('variable { node_name: "x" }', r"config .*graph.config.pbtxt, line 6: feed of 'x' output 0 given twice "
                                    r"\(first on line 2\)"),
    ('variable { node_name: "c" shape { dim { size: 4 } dim { size: 2 } } }',
     r"config variable 'c' \(line 6\): shape \[4, 2\] but VarHandleOp node 'c' has \[2, 4\]"),
    ('variable { node_name: "c" type: DT_INT32 }', r"config variable 'c' \(line 6\): type int32 but VarHandleOp "
                                                   r"node 'c' holds float32"),
])
def test_config_variable_errors_are_one_line(fx, tmp_path, entry, error):
    text = CONFIG.replace('variable { node_name: "c" readonly: true name: "cee" }', entry)
    with pytest.raises(AotcError, match=f"^{error}$"):
        compile_model(fx / "graph.pb", tmp_path, "g", config=config(tmp_path, text))


def test_a_read_only_variable_the_graph_assigns_is_refused(fx, tmp_path):
    text = CONFIG.replace('variable { node_name: "b" shape { dim { size: 4 } } }',
                          'variable { node_name: "b" readonly: true }')
    with pytest.raises(AotcError, match=r"^AssignSubVariableOp node 'AssignSubVariableOp' assigns variable 'b', "
                                        r"which is a read-only argument \(readonly: true in the config\)$"):
        compile_model(fx / "graph.pb", tmp_path, "g", config=config(tmp_path, text))


def test_command_line_reports_a_missing_variable_entry_in_one_line(fx, tmp_path):
    text = "\n".join(line for line in CONFIG.splitlines() if 'node_name: "w"' not in line)
    proc = subprocess.run([sys.executable, "-m", "aotc", "compile", str(fx / "graph.pb"), "-c",
                           str(config(tmp_path, text)), "-o", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "VarHandleOp node 'w' is a variable, and the graph holds no value for it" in proc.stderr


def test_variables_updated_in_place_are_clean_under_sanitizers(fx, tmp_path):
    require_sanitizers(tmp_path)
    compile_model(fx / "graph.pb", tmp_path, "g", config=config(tmp_path), gen_test=True, extra_cflags=SANITIZE)
    proc = subprocess.run([str(tmp_path / "g_test")], capture_output=True, text=True)
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and "g_test: PASSED" in proc.stdout, proc.stdout


def test_aotc_run_saves_the_updated_variables(fx, tmp_path):
    data = np.load(fx / "graph.npz")
    compile_model(fx / "graph.pb", tmp_path, "g", config=config(tmp_path))
    args = []
    for name, key in (("x", "x_0"), ("w", "init_w"), ("b", "init_b"), ("cee", "init_c")):
        np.save(tmp_path / f"{name}.npy", data[key])
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    proc = subprocess.run([sys.executable, "-m", "aotc", "run", str(tmp_path / "g"), *args, "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b.npy", "w.npy", "y.npy"]
    for name, key in (("y", "y_0"), ("w", "w_0"), ("b", "b_0")):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{name}.npy"), data[key], rtol=1e-5, atol=1e-5)
