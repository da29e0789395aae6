"""In-place updates (Graph.add_update): the run writes a new value into an input's buffer, and every
read of that input in the graph still sees the value from before the run, whatever reads it (a GEMM,
a view, another update) and on any number of threads. Graphs are written as IR text; numpy is the
reference. The IR text writes an update as ``update %input = %value`` after the return values."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from onnx_helpers import SANITIZE, require_sanitizers

import aotc
from aotc.bindings import CompiledModel
from aotc.compiler import compile_model
from aotc.ir.graph import Graph

SGD = """graph sgd opset=17 {
  input %w: float32[64,32]
  input %g: float32[64,32]
  %lr: float32[] = constant [0.1]
  %step: float32[64,32] = Mul(%g, %lr)
  %w_new: float32[64,32] = Sub(%w, %step)
  %y: float32[64,32] = Mul(%w, %w)
  return %y
  update %w = %w_new
}
"""

# Every kind of reader of an old value: a GEMM reading w twice, a view of v, a swap of a and b, and an
# output that is an updated input itself.
HAZARDS = """graph hazards opset=17 {
  input %w: float32[8,8]
  input %v: float32[8,8]
  input %a: float32[8,8]
  input %b: float32[8,8]
  %w_new: float32[8,8] = MatMul(%w, %w)
  %vt: float32[8,8] = Transpose(%v) perm=[1, 0]
  %v_new: float32[8,8] = Add(%vt, %v)
  %s: float32[8,8] = Add(%w, %v)
  return %s, %a
  update %w = %w_new
  update %v = %v_new
  update %a = %b
  update %b = %a
}
"""


def build(text: str, tmp_path, threads: int = 1, **options) -> CompiledModel:
    g = Graph.from_text(text)
    assert g.to_text() == text  # the update lines read back as they print
    return aotc.load(compile_model(g, tmp_path, g.name, target_cpu="x86-64-v3", **options).prefix, threads=threads)


def test_sgd_step_is_one_loop_that_reads_and_writes_the_weights(tmp_path):
    rng = np.random.default_rng(0)
    w0, g = rng.standard_normal((2, 64, 32), dtype=np.float32)
    m = build(SGD, tmp_path, threads=2)
    kernels = [k["ops"] for k in m.metadata["kernels"]]
    assert ["Mul", "Sub", "Copy"] in kernels and len(kernels) == 2  # y, and the fused update
    assert [t.name for t in m.inputs] == ["w", "g"] and [t.name for t in m.outputs] == ["y"]
    assert m.metadata["inputs"][0]["updated"] is True and "updated" not in m.metadata["inputs"][1]
    w = w0.copy()
    for _ in range(2):
        before = w.copy()
        (y,) = m.run({"w": w, "g": g})
        np.testing.assert_array_equal(y, before * before)  # the old weights
        np.testing.assert_allclose(w, before - g * np.float32(0.1), rtol=1e-6)
    header = (tmp_path / "sgd.h").read_text()
    assert "int sgd_run(float *w, const float *g, float *y, void *workspace);" in header
    assert "0: w  float32[64,32]  in place: read, then overwritten with its new value" in header
    assert "#define SGD_NUM_OUTPUTS 1" in header
    kernels_c = (tmp_path / ".aotc" / "sgd" / "sgd_kernels_0.c").read_text()
    update = kernels_c[kernels_c.index("/* k1_mul_sub_copy"):].split("AOTC_IVDEP")[0]
    # g is only read; w is read (in2) and written (out0) through pointers that may not be restrict
    assert "const float *restrict in0 = " in update and "const float *in2 = " in update
    assert "float *out0 = " in update


def test_every_reader_sees_the_old_values(tmp_path):
    rng = np.random.default_rng(1)
    w0, v0, a0, b0 = rng.standard_normal((4, 8, 8), dtype=np.float32)
    m = build(HAZARDS, tmp_path, threads=2)
    w, v, a, b = w0.copy(), v0.copy(), a0.copy(), b0.copy()
    s, old_a = m.run({"w": w, "v": v, "a": a, "b": b})
    np.testing.assert_allclose(s, w0 + v0, rtol=1e-6)
    np.testing.assert_array_equal(old_a, a0)
    np.testing.assert_allclose(w, w0 @ w0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(v, v0.T + v0)
    np.testing.assert_array_equal(a, b0)  # swapped
    np.testing.assert_array_equal(b, a0)


def test_an_unchanged_value_writes_nothing(tmp_path):
    text = """graph same opset=17 {
  input %x: float32[4]
  input %s: float32[4]
  %y: float32[4] = Relu(%x)
  %shape: int64[2] = constant [2, 2]
  %r: float32[2,2] = Reshape(%s, %shape)
  %flat: int64[1] = constant [4]
  %back: float32[4] = Reshape(%r, %flat)
  return %y
  update %s = %back
}
"""
    m = build(text, tmp_path)
    assert [k["ops"] for k in m.metadata["kernels"]] == [["Relu"]]
    s = np.arange(4, dtype=np.float32)
    (y,) = m.run({"x": -s, "s": s})
    np.testing.assert_array_equal(s, np.arange(4))


def test_python_refuses_what_cannot_be_updated_in_place(tmp_path):
    m = build(SGD, tmp_path)
    g = np.zeros((64, 32), np.float32)
    with pytest.raises(TypeError, match="input 'w' is updated in place: pass a numpy array"):
        m.run({"w": g.tolist(), "g": g})
    with pytest.raises(ValueError, match="input 'w' is updated in place: it must be a writable C-contiguous array"):
        m.run({"w": np.zeros((32, 64), np.float32).T, "g": g})
    frozen = np.zeros((64, 32), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous"):
        m.run({"w": frozen, "g": g})
    with pytest.raises(ValueError, match="input 'w' is updated in place and shares memory with input 'g'"):
        m.run({"w": g, "g": g})


def test_in_place_updates_are_clean_under_sanitizers(tmp_path):
    """The generated test (a fresh copy of each in-place input per run, 1 then 2 threads) under
    ASan/UBSan, for the hazards graph: GEMM, view and swap updates."""
    require_sanitizers(tmp_path)
    g = Graph.from_text(HAZARDS)
    compile_model(g, tmp_path, "m", extra_cflags=SANITIZE, gen_test=True)
    proc = subprocess.run([str(tmp_path / "m_test")], capture_output=True, text=True)
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and "m_test: PASSED" in proc.stdout, proc.stdout
    assert json.loads((tmp_path / "m.json").read_text())["inputs"][3]["updated"] is True


def test_in_place_kernels_compile_without_warnings(tmp_path):
    g = Graph.from_text(HAZARDS)
    compile_model(g, tmp_path, "m", extra_cflags=["-Wall", "-Wextra", "-Werror"], target_cpu="x86-64-v3")
