"""NAME_run's status codes. An out-of-range run-time index (Gather, GatherElements, GatherND,
ScatterElements, ScatterND; a ReverseSequence length) makes the run return
NAME_ERR_INDEX_OUT_OF_RANGE, and Python raise aotc.IndexOutOfRangeError, where onnxruntime raises too;
the kernels never touch memory outside their buffers (checked under ASan/UBSan). Indices in range,
negative ones included, match onnxruntime. Also: compile-time structures stay bounded however long
a dimension is (Tile with repeats [2^30])."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import SANITIZE, run_c_program_under_sanitizers, run_ort

import aotc
from aotc.codegen.programs import test_program as render_test_program
from aotc.compiler import compile_model
from aotc.errors import RUN_ERRORS, AotcError, IndexOutOfRangeError, NullArgumentError, RunError, WorkspaceError

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def _model(nodes, inputs, outputs, inits=(), opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what onnxruntime 1.31 reads
    return model


# Every op that reads a run-time index, on small inputs; the Gather on "big" is split into tasks.
INPUTS = [("x", F, [4, 5]), ("gi", I64, [3]), ("gi32", I32, [2]), ("ei", I64, [2, 5]), ("ni", I64, [3, 2]),
          ("si", I64, [2, 3]), ("su", F, [2, 3]), ("ndi", I64, [2, 1]), ("ndu", F, [2, 5]),
          ("xr", F, [3, 2, 2]), ("lens", I64, [2]), ("big", F, [64, 512]), ("bi", I64, [256])]
NODES = [
    helper.make_node("Gather", ["x", "gi"], ["gather"], axis=1),
    helper.make_node("Gather", ["x", "gi32"], ["gather32"], axis=0),
    helper.make_node("GatherElements", ["x", "ei"], ["gather_elements"], axis=0),
    helper.make_node("GatherND", ["x", "ni"], ["gather_nd"]),
    helper.make_node("ScatterElements", ["x", "si", "su"], ["scatter_elements"], axis=1, reduction="add"),
    helper.make_node("ScatterND", ["x", "ndi", "ndu"], ["scatter_nd"], reduction="add"),
    helper.make_node("ReverseSequence", ["xr", "lens"], ["reverse"], time_axis=0, batch_axis=1),
    helper.make_node("Gather", ["big", "bi"], ["gather_big"], axis=1),
]
OUTPUTS = [n.output[0] for n in NODES]
# In range, with negative indices (-n..-1) in each op.
VALID = {"gi": [0, -1, -5], "gi32": [3, -4], "ei": [[0, -4, 3, 1, 2], [-1, 0, 1, 2, 3]],
         "ni": [[0, 0], [-1, -5], [3, 4]], "si": [[0, -5, 4], [1, 2, -1]], "ndi": [[-1], [0]], "lens": [3, 0],
         "bi": [(7 * k) % 1024 - 512 for k in range(256)]}
# (input, flat element, value): one past each end of the axis the element indexes.
BAD = [("gi", 1, 5), ("gi", 2, -6), ("gi32", 0, 4), ("gi32", 1, -5), ("ei", 3, 4), ("ei", 9, -5),
       ("ni", 3, 5), ("ni", 4, -5), ("ni", 0, 4), ("si", 2, 5), ("si", 5, -6), ("ndi", 0, 4), ("ndi", 1, -5),
       ("lens", 0, 4), ("lens", 1, -1), ("bi", 200, 512), ("bi", 255, -513)]


def _feeds(**changes) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    dt = {TensorProto.FLOAT: np.float32, I64: np.int64, I32: np.int32}
    feeds = {n: np.asarray(VALID[n], dt[t]).reshape(s) if n in VALID else rng.standard_normal(s).astype(dt[t])
             for n, t, s in INPUTS}
    for name, (pos, value) in changes.items():
        feeds[name] = feeds[name].copy()
        feeds[name].reshape(-1)[pos] = value
    return feeds


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model = _model(NODES, INPUTS, OUTPUTS)
    out = tmp_path_factory.mktemp("status")
    result = compile_model(model, out, "m")
    return model, result


def test_indices_in_range_match_onnxruntime_on_one_and_two_threads(compiled):
    model, result = compiled
    feeds = _feeds()
    want = run_ort(model, feeds)
    for threads in (1, 2):
        got = aotc.load(result.prefix, threads=threads).run(feeds)
        for name, g, w in zip(OUTPUTS, got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name,pos,value", BAD, ids=[f"{n}[{p}]={v}" for n, p, v in BAD])
def test_out_of_range_index_raises_like_onnxruntime(compiled, name, pos, value):
    model, result = compiled
    feeds = _feeds(**{name: (pos, value)})
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error types
        run_ort(model, feeds)
    m = aotc.load(result.prefix, threads=2 if name == "bi" else 1)
    with pytest.raises(IndexOutOfRangeError) as e:
        m.run(feeds)
    assert str(e.value).startswith("m_run returned 3 (M_ERR_INDEX_OUT_OF_RANGE): an index input holds a value")
    assert e.value.code == 3 and e.value.model == "m"
    m.run(_feeds())  # the next run starts with a clear status


def test_cli_run_prints_the_status_on_one_line(compiled, tmp_path):
    _, result = compiled
    args = []
    for name, value in _feeds(gi=(0, 9)).items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / name}.npy"]
    proc = subprocess.run([sys.executable, "-m", "aotc", "run", str(result.prefix), *args],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("aotc: error: m_run returned 3 (M_ERR_INDEX_OUT_OF_RANGE): ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_exception_classes():
    assert issubclass(IndexOutOfRangeError, RunError) and issubclass(RunError, AotcError)
    assert issubclass(RunError, RuntimeError)  # what the bindings raised before there were classes
    assert {aotc.IndexOutOfRangeError, aotc.NullArgumentError, aotc.WorkspaceError, aotc.RunError} <= {
        getattr(aotc, n) for n in aotc.__all__}
    assert [(c.code, c.status) for c in RUN_ERRORS] == [
        (1, "ERR_NULL_ARGUMENT"), (2, "ERR_WORKSPACE"), (3, "ERR_INDEX_OUT_OF_RANGE")]
    assert isinstance(aotc.errors.run_error("m", 2), WorkspaceError)
    assert isinstance(aotc.errors.run_error("m", 1), NullArgumentError)
    unknown = aotc.errors.run_error("m", 42)
    assert type(unknown) is RunError and unknown.code == 42 and "M_ERR_UNKNOWN" in str(unknown)


def _c_array(ctype: str, name: str, a: np.ndarray) -> str:
    return f"static {ctype} {name}[] = {{{', '.join(repr(v) for v in a.reshape(-1).tolist())}}};"


def test_c_status_codes_under_sanitizers(tmp_path):
    """Through the C API, on 1 and 2 threads: each bad index gives M_ERR_INDEX_OUT_OF_RANGE, with no
    sanitizer report (the kernel stopped before it read or wrote with the index)."""
    model = _model(NODES, INPUTS, OUTPUTS)
    compile_model(model, tmp_path, "m", extra_cflags=SANITIZE)
    feeds = _feeds()
    ctype = {np.float32: "float", np.int64: "int64_t", np.int32: "int32_t"}
    arrays = "\n".join(_c_array(ctype[feeds[n].dtype.type], n, feeds[n]) for n, _, _ in INPUTS)
    outs = "\n".join(f"static float o{k}[{n}];" for k, n in enumerate(
        int(np.prod(o.shape)) for o in run_ort(model, feeds)))
    bad = "\n".join(f"  {{ {n}, {p}, {v} }}," for n, p, v in BAD)
    source = f"""
#include <stdio.h>
#include <string.h>
#include "m.h"
{arrays}
{outs}
static _Alignas(64) unsigned char ws[M_WORKSPACE_BYTES_FOR_THREADS(2) + 1];
typedef struct {{ void *input; size_t at; long long value; }} bad_index;
static const bad_index bad[] = {{
{bad}
}};

static void set(const bad_index *b, long long v) {{
  if (b->input == gi32) gi32[b->at] = (int32_t)v; else ((int64_t *)b->input)[b->at] = v;
}}

int main(void) {{
  const void *in[] = {{ {", ".join(n for n, _, _ in INPUTS)} }};
  void *out[] = {{ {", ".join(f"o{k}" for k in range(len(OUTPUTS)))} }};
  aotc_parallel *pool = m_pool_create(2);
  if (!pool) return 9;
  if (m_run_v(in, out, ws) != M_OK) return 1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {{
    const bad_index *b = &bad[i];
    const long long keep = b->input == gi32 ? gi32[b->at] : ((int64_t *)b->input)[b->at];
    set(b, b->value);
    const int rc1 = m_run_v(in, out, ws);
    const int rc2 = m_run_parallel(in, out, ws, sizeof ws, pool);
    set(b, keep);
    if (rc1 != M_ERR_INDEX_OUT_OF_RANGE || rc2 != M_ERR_INDEX_OUT_OF_RANGE) {{
      printf("bad index %zu: %d %d\\n", i, rc1, rc2);
      return 2;
    }}
    if (m_run_parallel(in, out, ws, sizeof ws, pool) != M_OK) return 3;
  }}
  m_pool_destroy(pool);
  if (strcmp(m_status_name(M_ERR_INDEX_OUT_OF_RANGE), "M_ERR_INDEX_OUT_OF_RANGE") ||
      strcmp(m_status_name(M_ERR_WORKSPACE), "M_ERR_WORKSPACE") || strcmp(m_status_name(M_OK), "M_OK") ||
      strcmp(m_status_name(-7), "unknown")) return 4;
  if ((M_WORKSPACE_BYTES && m_run_v(in, out, ws + 1) != M_ERR_WORKSPACE) || m_run_v(0, out, ws) != M_ERR_NULL_ARGUMENT)
    return 5;
  printf("ok\\n");
  return 0;
}}
"""
    proc = run_c_program_under_sanitizers(tmp_path, source, "libm.a", SANITIZE)
    assert proc.stdout == "ok\n"
    header = (tmp_path / "m.h").read_text()
    assert "#define M_ERR_INDEX_OUT_OF_RANGE 3" in header
    assert " *   M_ERR_INDEX_OUT_OF_RANGE (3): an index input holds a value outside -n..n-1" in header
    assert " *   k0_gather: Gather" in header


def test_generated_programs_name_a_failed_status(tmp_path):
    """NAME_test and NAME_benchmark print a nonzero status by its macro name."""
    i = ("i", I64, [2])
    table = ("d", np.arange(15, dtype=np.float32).reshape(5, 3))
    model = _model([helper.make_node("Add", ["i", "seven"], ["j"]), helper.make_node("Gather", ["d", "j"], ["y"])],
                   [i], ["y"], [table, ("seven", np.array(7, np.int64))])
    result = compile_model(model, tmp_path, "m", gen_benchmark=True)
    # The benchmark's integer inputs are 0, which the model moves to 7, past the 5 rows.
    proc = subprocess.run([str(tmp_path / "m_benchmark"), "-n", "1", "-w", "0"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "m_run_parallel returned 3 (M_ERR_INDEX_OUT_OF_RANGE)" in proc.stderr
    # The test program, given an input that onnxruntime would refuse: rendered with that input.
    files = render_test_program(result.library, [np.array([0, 0], np.int64)], [np.zeros((2, 3), np.float32)],
                                "none", 1e-5, 1e-6, pool=True)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    cc = ["cc", "-std=c11", f"-I{tmp_path}", str(tmp_path / "m_test.c"), str(tmp_path / "m_test_data.S"),
          str(tmp_path / "libm.a"), "-lm", "-pthread", "-o", str(tmp_path / "t")]
    subprocess.run(cc, check=True, cwd=tmp_path)
    proc = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True)
    assert proc.returncode == 1 and "FAIL m_run_v returned 3 (M_ERR_INDEX_OUT_OF_RANGE)" in proc.stdout


def test_constant_out_of_range_index_fails_the_compile(tmp_path):
    model = _model([helper.make_node("Gather", ["x", "k"], ["y"], axis=1, name="pick")], [("x", F, [2, 5])], ["y"],
                   [("k", np.array([1, -6], np.int64))])
    with pytest.raises(AotcError, match=r"Gather node 'pick': index -6 is out of range for an axis of length 5 "
                                        r"\(valid: -5\.\.4\)"):
        compile_model(model, tmp_path, "m")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    proc = subprocess.run([sys.executable, "-m", "aotc", "compile", str(path), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("aotc: error: Gather node 'pick': index -6 is out of range")


def test_empty_constants(tmp_path):
    """Gather with empty constant indices, and a MatMul reading an empty constant when the model has
    no other: the constants' symbol exists (it was undeclared)."""
    model = _model([helper.make_node("Gather", ["x", "k"], ["g"], axis=1),
                    helper.make_node("MatMul", ["z", "w"], ["mm"])], [("x", F, [3, 4]), ("z", F, [2, 0])],
                   ["g", "mm"], [("k", np.zeros((0,), np.int64)), ("w", np.zeros((0, 4), np.float32))])
    feeds = {"x": np.ones((3, 4), np.float32), "z": np.ones((2, 0), np.float32)}
    got = aotc.compile(model, out_dir=tmp_path, name="m").run(feeds)
    want = run_ort(model, feeds)
    assert got[0].shape == want[0].shape == (3, 0)
    np.testing.assert_array_equal(got[1], want[1])


def test_long_dimensions_compute_offsets_in_c(tmp_path):
    """Dimensions past the 65536-entry tables: Tile, every Pad mode, DepthToSpace/SpaceToDepth, Split,
    Resize, CenterCropPad and Compress compute their offsets in C; large Ranges and EyeLike of a
    run-time input are kernels. Everything matches onnxruntime."""
    n = 70000
    inputs = [("t", F, [3]), ("p", F, [n]), ("d", F, [1, 8, 1, 33000]), ("s", F, [1, 1, 2, 2 * n]),
              ("r", F, [1, 1, 2, n]), ("e", F, [3, 4])]
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [helper.make_node("Tile", ["t", "reps"], ["tile"])]
    for mode in ("constant", "edge", "reflect", "wrap"):
        nodes.append(helper.make_node("Pad", ["p", "pads"], [f"pad_{mode}"], mode=mode))
    nodes += [helper.make_node("DepthToSpace", ["d"], ["d2s_dcr"], blocksize=2),
              helper.make_node("DepthToSpace", ["d"], ["d2s_crd"], blocksize=2, mode="CRD"),
              helper.make_node("SpaceToDepth", ["s"], ["s2d"], blocksize=2),
              helper.make_node("Split", ["s"], ["split0", "split1"], axis=3, num_outputs=2),
              helper.make_node("Resize", ["r", "", "scales"], ["resize"], mode="nearest"),
              helper.make_node("CenterCropPad", ["p", "grow"], ["ccp_pad"]),
              helper.make_node("CenterCropPad", ["p", "shrink"], ["ccp_crop"]),
              helper.make_node("Compress", ["r", "cond"], ["compress"], axis=2),
              helper.make_node("Range", ["zero", "limit", "half"], ["range_f"]),
              helper.make_node("Range", ["zero_i", "limit_i", "one_i"], ["range_i"]),
              helper.make_node("EyeLike", ["e"], ["eye"], k=1)]
    inits = [("reps", i64(30000)), ("pads", i64(3, 5)), ("scales", np.array([1, 1, 2, 1], np.float32)),
             ("grow", i64(n + 11)), ("shrink", i64(66001)), ("cond", np.array([False, True])),
             ("zero", np.array(0, np.float32)), ("limit", np.array(3e6, np.float32)),
             ("half", np.array(0.5, np.float32)), ("zero_i", np.array(0, np.int64)),
             ("limit_i", np.array(2_500_000, np.int64)), ("one_i", np.array(1, np.int64))]
    outputs = [o for nd in nodes for o in nd.output]
    model = _model(nodes, inputs, outputs, inits, opset=19)
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, _, shape in inputs}
    result = compile_model(model, tmp_path, "m")
    got = aotc.load(result.prefix).run(feeds)
    for name, g, w in zip(outputs, got, run_ort(model, feeds), strict=True):
        np.testing.assert_array_equal(g, w, err_msg=name)
    sources = {k: len(v) for k, v in result.library.files.items() if k.endswith(".c")}
    assert max(sources.values()) < 1_000_000, sources


def test_tile_to_2_pow_33_elements_compiles_without_a_table(tmp_path):
    model = _model([helper.make_node("Tile", ["x", "reps"], ["y"])], [("x", F, [8])], ["y"],
                   [("reps", np.array([2 ** 30], np.int64))])
    result = compile_model(model, tmp_path, "m")
    code = result.library.files["m_kernels_0.c"].decode()
    assert "% 8) * 1" in code and len(code) < 5000


def test_resize_refuses_a_table_past_its_bound(tmp_path):
    model = _model([helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", name="up")],
                   [("x", F, [1, 1, 1, 2])], ["y"], [("sizes", np.array([1, 1, 1, 2 ** 21], np.int64))])
    with pytest.raises(AotcError, match=r"Resize node 'up': output axis 3 of 2097152 elements needs a table"):
        compile_model(model, tmp_path, "m")
