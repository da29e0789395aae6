"""aotc.jit: compile on first use per feed shape, and the on-disk library cache behind it (aotc/cache.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import mlp, ort_run

import aotc
from aotc.cache import MANIFEST, LibraryCache

# A child process that calls the jit on a batch of 3 and prints what it compiled and computed. With a
# "go" file it first says it is ready and waits for that file, so that two children call at once.
CHILD = """
import json, os, sys, time
import numpy as np
import aotc
model, cache, go = sys.argv[1:4]
f = aotc.jit(model, cache_dir=cache)
x = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)
if go != "-":
    open(go + "." + str(os.getpid()), "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
y, = f(x=x)
print(json.dumps({"compiles": f.compiles, "disk_hits": f.disk_hits, "y": y.tolist()}))
"""


def symbolic_mlp() -> onnx.ModelProto:
    """16 -> 32 -> 4 with a symbolic batch dimension, as exporters write it."""
    m = mlp(1, sizes=(16, 32, 4), seed=3)
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    return m


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(symbolic_mlp(), path)
    return path


def child_x() -> np.ndarray:
    return np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)


def run_child(model: Path, cache: Path, go: str = "-") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(model), str(cache), go],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_symbolic_dims_compile_once_per_shape_and_match_onnxruntime(model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    f = aotc.jit(model_file, cache_dir=cache)
    rng = np.random.default_rng(0)
    for batch, compiles in ((2, 1), (7, 2), (2, 2)):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        y, = f(x=x)
        assert y.shape == (batch, 4)
        np.testing.assert_allclose(y, ort_run(symbolic_mlp(), {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert f.compiles == compiles
    assert len(LibraryCache(cache).entries()) == 2
    # A fresh object (a new process would be the same) loads both from disk; positional feeds work.
    g = aotc.jit(model_file, cache_dir=cache)
    x = rng.standard_normal((7, 16)).astype(np.float32)
    np.testing.assert_array_equal(g(x)[0], f.run({"x": x})[0])
    assert (g.compiles, g.disk_hits) == (0, 1)


def test_a_second_process_compiles_nothing(model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = child_result(run_child(model_file, cache))
    second = child_result(run_child(model_file, cache))
    assert (first["compiles"], second["compiles"], second["disk_hits"]) == (1, 0, 1)
    np.testing.assert_allclose(second["y"], ort_run(symbolic_mlp(), {"x": child_x()})[0], rtol=1e-5, atol=1e-5)


def test_two_processes_compiling_one_key_at_once_build_one_library(model_file: Path, tmp_path: Path) -> None:
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = [run_child(model_file, cache, str(go)) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*"))) < 2 and all(p.poll() is None for p in procs):
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.01)
    go.touch()
    results = [child_result(p) for p in procs]
    assert sorted(r["compiles"] for r in results) == [0, 1]
    expected = ort_run(symbolic_mlp(), {"x": child_x()})[0]
    for r in results:
        np.testing.assert_allclose(r["y"], expected, rtol=1e-5, atol=1e-5)
    entries = LibraryCache(cache).entries()
    assert len(entries) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary left behind


def _truncate_library(entry: Path) -> None:
    lib = next(entry.glob("lib*.so"))
    data = lib.read_bytes()
    lib.unlink()  # a new file: this process has the old one mapped
    lib.write_bytes(data[: len(data) // 2])


def _drop_manifest(entry: Path) -> None:
    (entry / MANIFEST).unlink()


def _foreign_description(entry: Path) -> None:
    """A NAME.json from another build whose hash the manifest agrees with: only the load finds it."""
    meta_path = next(p for p in entry.glob("*.json") if p.name != MANIFEST)
    meta = json.loads(meta_path.read_text())
    meta["build_id"] = "0" * 16
    meta_path.unlink()
    meta_path.write_text(json.dumps(meta))
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"][meta_path.name] = hashlib.sha256(meta_path.read_bytes()).hexdigest()
    (entry / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [_truncate_library, _drop_manifest, _foreign_description])
def test_a_damaged_entry_is_rebuilt(model_file: Path, tmp_path: Path, damage) -> None:
    cache = tmp_path / "cache"
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    f = aotc.jit(model_file, cache_dir=cache)
    y, = f(x=x)
    entry, = LibraryCache(cache).entries()
    good = {p.name: p.read_bytes() for p in entry.path.iterdir()}
    damage(entry.path)
    g = aotc.jit(model_file, cache_dir=cache)
    np.testing.assert_array_equal(g(x=x)[0], y)
    assert (g.compiles, g.disk_hits) == (1, 0)
    rebuilt = {p.name: p.read_bytes() for p in entry.path.iterdir()}
    assert rebuilt == good  # the build is deterministic: the entry is whole again
    h = aotc.jit(model_file, cache_dir=cache)
    h(x=x)
    assert (h.compiles, h.disk_hits) == (0, 1)


def test_least_recently_used_entries_are_evicted(model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    f = aotc.jit(model_file, cache_dir=cache, max_cache_bytes=None)
    keys = {}
    for batch in (1, 2, 3):
        f(x=np.zeros((batch, 16), np.float32))
        keys[batch] = f.key({"x": (batch, 16)})
    aotc.jit(model_file, cache_dir=cache)(x=np.zeros((1, 16), np.float32))  # batch 1 used last now
    store = LibraryCache(cache, max_bytes=None)
    assert [e.key for e in store.entries()] == [keys[2], keys[3], keys[1]]
    store.max_bytes = store.total_bytes() - 1
    assert store.evict() == [keys[2]]
    assert {e.key for e in store.entries()} == {keys[1], keys[3]}
    # The limit holds after every compile: with room for one entry, each new shape evicts the last.
    one = max(e.size for e in store.entries())
    small = aotc.jit(model_file, cache_dir=cache, max_cache_bytes=one + one // 2)
    small(x=np.zeros((4, 16), np.float32))
    assert [e.key for e in store.entries()] == [f.key({"x": (4, 16)})]
    small(x=np.zeros((1, 16), np.float32))  # evicted above: compiled again, and batch 4 goes
    assert [e.key for e in store.entries()] == [keys[1]]
    small(x=np.zeros((4, 16), np.float32))  # still loaded in memory: no compile
    assert small.compiles == 2


def test_dynamic_compiles_one_library_for_every_batch_size(model_file: Path, tmp_path: Path) -> None:
    f = aotc.jit(model_file, cache_dir=tmp_path / "cache", dynamic="batch<=4")
    rng = np.random.default_rng(2)
    for batch in (2, 4, 1, 3):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(f(x=x)[0], ort_run(symbolic_mlp(), {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert f.compiles == 1
    with pytest.raises(ValueError, match=r"is \[5\], which dynamic=batch<=4 does not allow"):
        f(x=np.zeros((5, 16), np.float32))
    g = aotc.jit(model_file, cache_dir=tmp_path / "cache", dynamic="batch<=4")
    g(x=np.zeros((3, 16), np.float32))
    assert (g.compiles, g.disk_hits) == (0, 1)
    with pytest.raises(TypeError, match="unknown option.*config.*with dynamic"):
        aotc.jit(model_file, dynamic="batch<=4", config="c.pbtxt")
    # Listed sizes of a dimension: one library for them all, other sizes refused before any compile.
    h = aotc.jit(model_file, cache_dir=tmp_path / "cache", dynamic="batch=2,3")
    for batch in (3, 2):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(h(x=x)[0], ort_run(symbolic_mlp(), {"x": x})[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="is \\[4\\], which dynamic=batch=2,3 does not allow"):
        h(x=np.zeros((4, 16), np.float32))
    assert h.compiles == 1


def test_the_key_follows_model_shapes_and_options(model_file: Path, tmp_path: Path) -> None:
    base = aotc.jit(model_file, cache_dir=tmp_path)
    key = base.key({"x": (2, 16)})
    assert key == aotc.jit(model_file, cache_dir=tmp_path / "elsewhere").key({"x": (2, 16)})
    assert key != base.key({"x": (3, 16)})
    assert key != aotc.jit(model_file, cache_dir=tmp_path, target_cpu="x86-64-v3").key({"x": (2, 16)})
    other = symbolic_mlp()
    other.graph.initializer[0].raw_data = np.zeros((16, 32), np.float32).tobytes()  # other weights
    (tmp_path / "other").mkdir()
    onnx.save(other, tmp_path / "other" / model_file.name)
    assert aotc.jit(tmp_path / "other" / model_file.name, cache_dir=tmp_path).key({"x": (2, 16)}) != key


def test_jit_errors(model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown option.*out_dir"):
        aotc.jit(model_file, out_dir="x")
    with pytest.raises(aotc.AotcError, match="model file not found"):
        aotc.jit(tmp_path / "missing.onnx")
    f = aotc.jit(model_file, cache_dir=tmp_path / "cache")
    with pytest.raises(aotc.AotcError, match="does not match the model's"):
        f(x=np.zeros((2, 15), np.float32))
    with pytest.raises(ValueError, match="expected 1 inputs"):
        f(np.zeros((2, 16), np.float32), np.zeros((2, 16), np.float32))
    assert f.compiles == 0
