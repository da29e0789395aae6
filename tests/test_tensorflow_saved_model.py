"""SavedModel directories: signatures, variables from the tensor-bundle checkpoint, inlined function
calls, variables fed as inputs, and the errors for what is not supported (fixtures from
tests/tf_fixtures.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_tensorflow import check_against_tf, compile_graph, fixture
from tf_fixtures import fixtures_dir

from aotc.errors import AotcError
from aotc.frontends.tensorflow import import_saved_model, is_saved_model, is_tensorflow_model
from aotc.frontends.tensorflow.bundle import Bundle, read_table


@pytest.fixture(scope="module")
def fx():
    return fixtures_dir()


def test_checkpoint_reader_reads_what_tensorflow_reads(fx):
    # resnet50's index has hundreds of entries: several data blocks, prefix-compressed keys.
    for name in ("resnet50", "variables"):
        meta, _, _ = fixture(fx, name)
        bundle = Bundle(fx / f"{name}_saved_model" / "variables" / "variables")
        assert {k: [d.size for d in e.shape.dim] for k, e in bundle.entries.items()} == meta["checkpoint"]
    data = np.load(fx / "variables.npz")
    for key in meta["checkpoint"]:
        if "ATTRIBUTES" in key:
            np.testing.assert_array_equal(bundle.read(key), data[f"ckpt_{key}"])
    index = (fx / "resnet50_saved_model" / "variables" / "variables.index").read_bytes()
    assert len(read_table(index)) == len(fixture(fx, "resnet50")[0]["checkpoint"]) + 1  # + the header's empty key


def test_variables_resource_gather_and_nested_calls(fx, tmp_path):
    # An embedding lookup on a variable (ResourceGather), a tf.function calling another (a nested
    # PartitionedCall), a constant output the signature keeps; outputs sorted by key.
    graph, _, _ = check_against_tf(fx, "variables", tmp_path, "saved_model")
    assert [v.name for v in graph.inputs] == ["ids"]
    assert [v.name for v in graph.outputs] == ["fixed", "proj", "rows"]
    check_against_tf(fx, "variables", tmp_path / "pb")


def test_variables_to_feed_become_inputs(fx, tmp_path):
    _, feeds, expected = fixture(fx, "variables", saved_model=True)
    data = np.load(fx / "variables.npz")
    w = data["ckpt_w/.ATTRIBUTES/VARIABLE_VALUE"]
    graph = import_saved_model(fx / "variables_saved_model", name="fed", variables_to_feed=["w"])
    assert [(v.name, v.shape) for v in graph.inputs] == [("ids", (5,)), ("w", (4, 3))]
    model = compile_graph(graph, tmp_path)
    fixed, proj, rows = model.run([feeds["ids"], w * 2])
    np.testing.assert_allclose(proj, expected["proj"] * 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rows, expected["rows"])
    every = import_saved_model(fx / "variables_saved_model", name="all", variables_to_feed=["all"])
    assert [v.name for v in every.inputs] == ["ids", "scale", "table", "w"]
    with pytest.raises(AotcError, match=r"--variables-to-feed: the signature reads no variable 'step' \(it reads: "
                                        r"scale, table, w\)"):
        import_saved_model(fx / "variables_saved_model", variables_to_feed=["step"])


def test_signature_and_tag_set_choices(fx):
    path = fx / "variables_saved_model"
    with pytest.raises(AotcError, match=r"no signature 'nope' in MetaGraph 'serve' \(it has: bump, serving_default\); "
                                        "choose one with --signature"):
        import_saved_model(path, signature="nope")
    with pytest.raises(AotcError, match=r"no MetaGraph with tag set 'train' \(it has: serve\); choose one with "
                                        "--tag-set"):
        import_saved_model(path, tag_set="train")


def test_a_signature_that_updates_a_variable_needs_it_fed(fx, tmp_path):
    path = fx / "variables_saved_model"
    with pytest.raises(AotcError, match=r"^AssignAddVariableOp node '.*AssignAddVariableOp' assigns variable "
                                        r"'.*', which is frozen into a constant: make it an in-place argument "
                                        r"\(a config `variable` entry, or --variables-to-feed for a SavedModel\)$"):
        import_saved_model(path, signature="bump")
    graph = import_saved_model(path, signature="bump", variables_to_feed=["step"])
    assert [v.name for v in graph.inputs] == ["by", "step"] and graph.updates == [graph.inputs[1]]
    model = compile_graph(graph, tmp_path)
    step = np.zeros((), np.float32)  # its checkpoint value
    for want in (3.0, 6.0):
        (doubled,) = model.run({"by": np.float32(1.5), "step": step})
        assert float(doubled) == want and float(step) == want / 2


def test_saved_model_detection_and_bad_directories(tmp_path, fx):
    assert is_saved_model(fx / "mlp_saved_model") and is_tensorflow_model(fx / "mlp_saved_model")
    assert not is_saved_model(fx / "mlp.pb") and not is_saved_model(tmp_path)
    (tmp_path / "saved_model.pb").write_bytes(b"\xff\xff garbage")
    with pytest.raises(AotcError, match=r"saved_model\.pb: not a valid SavedModel") as e:
        import_saved_model(tmp_path)
    assert "\n" not in str(e.value)
    bad = tmp_path / "ckpt"
    bad.mkdir()
    (bad / "variables.index").write_bytes(b"short")
    with pytest.raises(AotcError, match=r"variables\.index: not a TensorFlow checkpoint index \(5 bytes is shorter "
                                        "than a table footer\\)"):
        Bundle(bad / "variables")


def test_command_line_compiles_a_saved_model(fx, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)

    sm = str(fx / "variables_saved_model")
    proc = cli("inspect", sm)
    assert proc.returncode == 0, proc.stderr
    assert "signatures: bump, serving_default" in proc.stdout and "'ids': int32 [5]" in proc.stdout
    assert "ResourceGather" in proc.stdout and "unsupported: none" in proc.stdout
    proc = cli("compile", sm, "-o", str(tmp_path), "-n", "v", "--signature", "serving_default",
               "--variables-to-feed", "scale", "--gen-test")
    assert proc.returncode == 0, proc.stderr
    test = subprocess.run([str(tmp_path / "v_test")], capture_output=True, text=True)
    assert test.returncode == 0 and "PASSED" in test.stdout, test.stdout + test.stderr
    header = (tmp_path / "v.h").read_text()
    assert "scale" in header and "proj" in header
    proc = cli("compile", sm, "-o", str(tmp_path), "--signature", "bump")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "frozen into a constant" in proc.stderr
    proc = cli("compile", str(fx / "mlp.pb"), "-o", str(tmp_path), "--tag-set", "serve")
    assert proc.returncode == 1 and "--tag-set: only for SavedModel directories" in proc.stderr, proc.stderr
