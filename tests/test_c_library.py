"""The generated C library as a C programmer sees it: clean under -Wall -Wextra -Werror and the
sanitizers, safe against hostile names, re-entrant, linkable next to another model."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading

import numpy as np
import pytest
from models import dense_relu, make, mlp, random_feeds, vi
from onnx import helper

import aotc
from aotc.compiler import compile_model

WERROR = ["-Wall", "-Wextra", "-Werror"]
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

HOSTILE = ['x*/ system("rm -rf /"); /*', 'line\nbreak "quoted" \\ #include <stdio.h>', "ünïcödé ☃",
           "x*/ system(\"rm -rf /\"); /*", "123", "int", "workspace"]


def _hostile_model():
    a, b, c, d, e, f, g = HOSTILE
    return make([helper.make_node("Add", [a, b], [c], name='n"ode*/'),
                 helper.make_node("Mul", [c, c], [d + "_2"], name="#define x"),
                 helper.make_node("Sub", [d + "_2", f], [e]),
                 helper.make_node("Neg", [e], [g])],
                [vi(a, [3]), vi(b, [3]), vi(f, [3])], [vi(g, [3]), vi(c, [3])])


def test_hostile_names_give_valid_harmless_c(tmp_path):
    res = compile_model(_hostile_model(), tmp_path, "hostile", extra_cflags=WERROR)
    for path in res.build_dir.glob("*.[ch]"):
        text = path.read_text()
        assert text.isascii()
        # Outside comments and string literals, nothing of the names survives.
        code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', re.sub(r"/\*.*?\*/", " ", text, flags=re.S))
        assert "system(" not in code and "rm -rf" not in code and "<stdio.h>" not in code, path.name
        assert "*/" not in code and "/*" not in code, path.name
    m = aotc.load(tmp_path / "hostile")
    assert [t.name for t in m.inputs] == [HOSTILE[0], HOSTILE[1], HOSTILE[5]]
    assert [t.name for t in m.outputs] == [HOSTILE[6], HOSTILE[2]]
    x, y, z = (np.arange(3, dtype=np.float32) + k for k in range(3))
    out, s = m.run([x, y, z])
    np.testing.assert_array_equal(s, x + y)
    np.testing.assert_array_equal(out, -((x + y) * (x + y) - z))
    header = (tmp_path / "hostile.h").read_text()
    assert "int hostile_run(" in header
    # Mangled parameter names are stable across compiles.
    compile_model(_hostile_model(), tmp_path / "again", "hostile")
    assert (tmp_path / "again" / "hostile.h").read_text() == header
    assert res.library.inputs[2].param != "workspace"


APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mlp.h"
#include "dense.h"

int main(void) {
  void *ws1 = aligned_alloc(64, (MLP_WORKSPACE_BYTES + 63) / 64 * 64 + 64);
  void *ws2 = aligned_alloc(64, (DENSE_WORKSPACE_BYTES + 63) / 64 * 64 + 64);
  static float x[MLP_INPUT0_SIZE], y[MLP_OUTPUT0_SIZE], dx[DENSE_INPUT0_SIZE], dy[DENSE_OUTPUT0_SIZE];
  for (size_t i = 0; i < MLP_INPUT0_SIZE; i++) x[i] = (float)(i % 7) * 0.25f;
  for (size_t i = 0; i < DENSE_INPUT0_SIZE; i++) dx[i] = (float)(i % 5) - 2.0f;
  if (mlp_run(x, y, ws1) != MLP_OK) return 2;
  if (dense_run(dx, dy, ws2) != 0) return 3;
  if (mlp_workspace_size() != MLP_WORKSPACE_BYTES || mlp_num_inputs() != 1) return 4;
  if (strcmp(mlp_input_name(0), "x") != 0 || mlp_input_dtype(0) != AOTC_DTYPE_FLOAT32) return 5;
  if (mlp_input_rank(0) != 2 || mlp_input_shape(0)[1] != 784 || mlp_input_name(7) != NULL) return 6;
  if (MLP_WORKSPACE_BYTES && mlp_run(x, y, NULL) != MLP_ERR_WORKSPACE) return 7;
  if (mlp_run(NULL, y, ws1) != MLP_ERR_NULL_ARGUMENT) return 8;
  { /* one pool runs both models on 2 threads, bit-identical to 1 thread */
    static float y2[MLP_OUTPUT0_SIZE], dy2[DENSE_OUTPUT0_SIZE];
    const size_t n1 = MLP_WORKSPACE_BYTES_FOR_THREADS(2), n2 = DENSE_WORKSPACE_BYTES_FOR_THREADS(2);
    void *w1 = aligned_alloc(64, (n1 + 63) / 64 * 64 + 64), *w2 = aligned_alloc(64, (n2 + 63) / 64 * 64 + 64);
    const void *in1[] = { x }, *in2[] = { dx };
    void *out1[] = { y2 }, *out2[] = { dy2 };
    aotc_parallel *pool = mlp_pool_create(2);
    if (!pool || pool->num_threads != 2) return 9;
    for (int rep = 0; rep < 20; rep++) {
      if (mlp_run_parallel(in1, out1, w1, n1, pool) != MLP_OK) return 10;
      if (dense_run_parallel(in2, out2, w2, n2, pool) != DENSE_OK) return 11;
      if (memcmp(y, y2, sizeof y) || memcmp(dy, dy2, sizeof dy)) return 12;
    }
    if (MLP_WORKSPACE_BYTES && mlp_run_parallel(in1, out1, w1, MLP_WORKSPACE_BYTES - 1, pool) != MLP_ERR_WORKSPACE)
      return 13;
    /* a workspace with room for one thread only: runs on one thread, same result */
    if (mlp_run_parallel(in1, out1, w1, MLP_WORKSPACE_BYTES, pool) != MLP_OK || memcmp(y, y2, sizeof y)) return 14;
    if (mlp_workspace_size_for_threads(2) != n1) return 15;
    mlp_pool_destroy(pool);
    free(w1);
    free(w2);
  }
  for (size_t i = 0; i < MLP_OUTPUT0_SIZE; i++) printf("%.9g\n", y[i]);
  for (size_t i = 0; i < DENSE_OUTPUT0_SIZE; i++) printf("%.9g\n", dy[i]);
  free(ws1);
  free(ws2);
  return 0;
}
"""


def _build_two(tmp_path, extra: list[str]) -> tuple[list[str], list[str]]:
    flags = [*WERROR, *extra]
    compile_model(mlp(2), tmp_path / "mlp", "mlp", extra_cflags=flags)
    compile_model(dense_relu(m=3, k=5, n=4), tmp_path / "dense", "dense", extra_cflags=flags)
    (tmp_path / "app.c").write_text(APP)
    exe = tmp_path / "app"
    subprocess.run([CC, "-std=c11", *flags, f"-I{tmp_path / 'mlp'}", f"-I{tmp_path / 'dense'}",
                    str(tmp_path / "app.c"), str(tmp_path / "mlp" / "libmlp.a"),
                    str(tmp_path / "dense" / "libdense.a"), "-lm", "-pthread", "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split(), proc.stderr


def _expected(tmp_path) -> np.ndarray:
    x = (np.arange(2 * 784) % 7 * 0.25).astype(np.float32).reshape(2, 784)
    dx = (np.arange(15) % 5 - 2).astype(np.float32).reshape(3, 5)
    y = aotc.load(tmp_path / "mlp" / "mlp").run({"x": x})[0]
    dy = aotc.load(tmp_path / "dense" / "dense").run({"x": dx})[0]
    return np.concatenate([y.ravel(), dy.ravel()])


def test_two_models_link_into_one_c_program(tmp_path):
    out, _ = _build_two(tmp_path, [])
    np.testing.assert_array_equal(np.array(out, np.float32), _expected(tmp_path))
    # Only NAME_-prefixed symbols are exported from the shared library.
    nm = shutil.which("nm")
    if nm:
        syms = subprocess.run([nm, "-D", "--defined-only", str(tmp_path / "mlp" / "libmlp.so")],
                              capture_output=True, text=True, check=True).stdout.split("\n")
        names = [line.split()[-1] for line in syms if line.strip() and line.split()[1] in "TDRB"]
        assert names and all(n.startswith("mlp_") for n in names), names
        static = subprocess.run([nm, "--defined-only", "-g", str(tmp_path / "mlp" / "libmlp.a")],
                                capture_output=True, text=True, check=True).stdout
        globals_ = re.findall(r" [TDRB] (\S+)", static)
        assert globals_ and all(n.startswith("mlp_") for n in globals_), globals_


def test_sanitizers_run_clean(tmp_path):
    probe = subprocess.run([CC, "-fsanitize=address,undefined", "-x", "c", "-", "-o", str(tmp_path / "p")],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("sanitizer runtime not available")
    out, err = _build_two(tmp_path, ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                                     "-fno-omit-frame-pointer", "-O1"])
    assert "runtime error" not in err and "AddressSanitizer" not in err
    assert len(out) == 2 * 10 + 3 * 4


def test_thread_sanitizer_runs_clean(tmp_path):
    """The pool's handshakes (atomics, mutex, condition variable) have no data race."""
    probe = subprocess.run([CC, "-fsanitize=thread", "-x", "c", "-", "-o", str(tmp_path / "p")],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0 or subprocess.run([str(tmp_path / "p")], capture_output=True).returncode != 0:
        pytest.skip("thread sanitizer runtime not available")
    out, err = _build_two(tmp_path, ["-fsanitize=thread", "-O1"])
    assert "ThreadSanitizer" not in err
    assert len(out) == 2 * 10 + 3 * 4


def test_concurrent_calls_are_exact(tmp_path):
    m = aotc.compile(mlp(4), out_dir=tmp_path, name="mlp")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 784)).astype(np.float32) for _ in range(8)]
    expected = [m.run({"x": x})[0] for x in xs]
    failures: list[str] = []

    def worker(i: int) -> None:
        for _ in range(50):
            y = m.run({"x": xs[i]})[0]
            if not np.array_equal(y, expected[i]):
                failures.append(f"thread {i}")
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_depfile_names_model_config_and_aotc(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(dense_relu().SerializeToString())
    cfg = tmp_path / "c.pbtxt"
    cfg.write_text('fetch { id { node_name: "y" } }')
    compile_model(path, tmp_path / "out", "dense", config=cfg, depfile=tmp_path / "out" / "dense.d")
    text = (tmp_path / "out" / "dense.d").read_text()
    target, deps = text.split(": \\\n", 1)
    assert "libdense.a" in target and "dense.h" in target
    assert str(path.resolve()) in deps and str(cfg.resolve()) in deps
    assert "compiler.py" in deps and "header.h.j2" in deps and "aotc_math.h" in deps


def test_generic_target_and_scalar_model(tmp_path):
    model = make([helper.make_node("Mul", ["a", "b"], ["c"]), helper.make_node("Sqrt", ["c"], ["y"])],
                 [vi("a", []), vi("b", [])], [vi("y", [])])
    m = aotc.compile(model, out_dir=tmp_path, name="scalar", target_cpu="generic", extra_cflags=WERROR)
    assert float(m.run({"a": np.float32(2), "b": np.float32(8)})[0]) == 4.0
    feeds = random_feeds(m)
    assert m(**feeds)[0].shape == ()


def test_bool_header_compiles_as_c_and_cpp(tmp_path):
    from onnx import TensorProto

    model = make([helper.make_node("Not", ["x"], ["y"])],
                 [vi("x", [4], TensorProto.BOOL)], [vi("y", [4], TensorProto.BOOL)])
    compile_model(model, tmp_path, "m")
    src = tmp_path / "use.c"
    src.write_text('#include "m.h"\nint f(const bool *x, bool *y, void *ws) { return m_run(x, y, ws); }\n')
    for compiler, lang in (("cc", "c"), ("g++", "c++")):
        proc = subprocess.run([compiler, "-x", lang, "-fsyntax-only", "-Wall", "-Werror", "-I", str(tmp_path),
                               str(src)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
