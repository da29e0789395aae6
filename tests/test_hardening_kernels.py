"""Kernels hardened for issue 19 (aotc/ops/rnn.py, index.py, vision.py, ml.py; ir/graph.py; the header).

- Working arrays sized by a shape or an attribute (TopK's best k, the recurrences' state and gates,
  DeformConv's sampled column, TreeEnsemble's per-target sums) were stack arrays: a TopK with k = 2^20
  segfaulted. Above 4 KiB they now live in the task's scratch slot; checked against onnxruntime (or
  onnx's reference) under ASan/UBSan, on one thread and on two.
- Run-time indices that were clamped or skipped (ArrayFeatureExtractor, RoiAlign's batch indices,
  MaxUnpool, the recurrences' sequence_lens) make the run return NAME_ERR_INDEX_OUT_OF_RANGE, where
  onnxruntime raises; constant ones are compile errors.
- A float OneHot index that is NaN, infinite or huge converted to an integer with undefined behaviour.
- Value.size is exact; the header refuses a target without a 64-bit size_t and declares NAME_build_id.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import SANITIZE, require_sanitizers, run_generated_test_under_sanitizers, run_ort

import aotc
from aotc.compiler import compile_model
from aotc.errors import AotcError, IndexOutOfRangeError
from aotc.ir.graph import Value
from aotc.ops import OPS
from aotc.ops.index import STACK_ARRAY_BYTES, task_arrays

pytest.importorskip("onnxruntime")

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
ML = "ai.onnx.ml"
# float-cast-overflow is not part of "undefined" in GCC: a NaN or huge float turned integer is.
FLAGS = [*SANITIZE, "-fsanitize=float-cast-overflow", "-Wall", "-Wextra", "-Werror"]
N_TOPK = 1 << 20  # 12 MB of best values and indices: more than a thread's 8 MB stack
H_LSTM, H_GRU, H_RNN = 176, 216, 520  # just above 4 KiB of state and gates
N_TARGETS = 600
RNG = np.random.default_rng(19)


def _w(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _rnn(op: str, hid: int, d: int, x: str, lens: str, extra: dict, isz: int = 6) -> tuple[list, list]:
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    p = f"{op.lower()}{extra.get('linear_before_reset', '')}"
    inits = [(f"{p}_w", _w(d, g * hid, isz)), (f"{p}_r", _w(d, g * hid, hid, scale=0.05)),
             (f"{p}_b", _w(d, 2 * g * hid, scale=0.1))]
    outs = [f"{p}_y", f"{p}_yh"] + ([f"{p}_yc"] if op == "LSTM" else [])
    node = helper.make_node(op, [x, *(n for n, _ in inits), lens], outs, hidden_size=hid,
                            direction="bidirectional" if d == 2 else "forward", **extra)
    return [node], inits


def _tree() -> onnx.NodeProto:
    """One split on feature 1; its leaves add to targets 0 and N_TARGETS - 1."""
    return helper.make_node(
        "TreeEnsemble", ["tx"], ["ty"], domain=ML, n_targets=N_TARGETS, tree_roots=[0], nodes_featureids=[1],
        nodes_truenodeids=[0], nodes_falsenodeids=[1], nodes_trueleafs=[1], nodes_falseleafs=[1],
        leaf_targetids=[0, N_TARGETS - 1], aggregate_function=1,
        nodes_modes=numpy_helper.from_array(np.zeros(1, np.uint8)),
        nodes_splits=numpy_helper.from_array(np.array([0.25], np.float32)),
        leaf_weights=numpy_helper.from_array(np.array([1.5, -2.0], np.float32)))


def _graph() -> tuple[list, list, list, dict[str, np.ndarray]]:
    """(nodes checked by onnxruntime, nodes checked by onnx's reference, initializers, feeds)."""
    ort_nodes = [helper.make_node("TopK", ["big", "kbig"], ["big_v", "big_i"]),
                 helper.make_node("TopK", ["rows", "krows"], ["rows_v", "rows_i"], largest=0),
                 helper.make_node("ArrayFeatureExtractor", ["afx", "afi"], ["afy"], domain=ML),
                 helper.make_node("RoiAlign", ["rx", "rr", "rb"], ["ry"], output_height=2, output_width=2),
                 helper.make_node("RoiAlign", ["rx", "rr", "rb"], ["rymax"], mode="max"),  # declared an unused count
                 helper.make_node("MaxUnpool", ["ux", "ui"], ["uy"], kernel_shape=[2, 2], strides=[2, 2]),
                 helper.make_node("OneHot", ["oh", "depth", "onoff"], ["ohy"])]
    inits = [("kbig", np.array([N_TOPK], np.int64)), ("krows", np.array([700], np.int64)),
             ("depth", np.array(4.0, np.float32)), ("onoff", np.array([0.0, 1.0], np.float32))]
    for op, hid, d, extra in (("LSTM", H_LSTM, 2, {}), ("GRU", H_GRU, 1, {"linear_before_reset": 0}),
                              ("GRU", H_GRU, 2, {"linear_before_reset": 1}), ("RNN", H_RNN, 1, {})):
        n, i = _rnn(op, hid, d, "sx", "sl", extra)
        ort_nodes += n
        inits += i
    ref_nodes = [helper.make_node("DeformConv", ["dx", "dw", "doff"], ["dy"], kernel_shape=[5, 5]), _tree()]
    inits += [("dw", _w(3, 64, 5, 5, scale=0.05))]
    rois = np.array([[0, 0, 3, 3], [1, 0.5, 4, 4], [0, 0, 5, 5]], np.float32)
    feeds = {"big": -np.arange(N_TOPK, dtype=np.float32)[None],  # sorted: insertion takes one step
             "rows": RNG.standard_normal((16, 1000)).astype(np.float32),
             "afx": RNG.standard_normal((2, 5)).astype(np.float32), "afi": np.array([4, 0, 2, 4], np.int64),
             "rx": RNG.standard_normal((2, 2, 5, 5)).astype(np.float32), "rr": rois,
             "rb": np.array([1, 0, 1], np.int64),
             "ux": RNG.standard_normal((1, 1, 2, 2)).astype(np.float32),
             "ui": np.array([5, 7, 13, 15], np.int64).reshape(1, 1, 2, 2),
             # Whole numbers (onnxruntime gives all off for others, where the spec truncates); 4, -5,
             # NaN, infinities and huge values are outside -4..3: all off, with no undefined conversion.
             "oh": np.array([0, 2, -1, -4, 3, 4, -5, np.nan, np.inf, -np.inf, 3e38, -3e38], np.float32),
             "sx": RNG.standard_normal((5, 3, 6)).astype(np.float32), "sl": np.array([5, 2, 0], np.int32),
             "dx": RNG.standard_normal((1, 64, 6, 6)).astype(np.float32),
             "doff": _w(1, 50, 2, 2, scale=1.0),
             "tx": np.array([[0.0, 0.0], [0.0, 1.0], [0.0, np.nan]], np.float32)}
    return ort_nodes, ref_nodes, inits, feeds


def _model(nodes: list, inits: list, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    names = {i for n in nodes for i in n.input}
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items() if k in names]
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for n in nodes for o in n.output]
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in inits if n in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 5)])
    model.ir_version = 10  # what onnxruntime 1.31 reads
    return model


@pytest.fixture(scope="module")
def case() -> dict:
    ort_nodes, ref_nodes, inits, feeds = _graph()
    model = _model(ort_nodes + ref_nodes, inits, feeds)
    ort_model, ref_model = _model(ort_nodes, inits, feeds), _model(ref_nodes, inits, feeds)
    ort_feeds = {i.name: feeds[i.name] for i in ort_model.graph.input}
    ref_feeds = {i.name: feeds[i.name] for i in ref_model.graph.input}
    want = [*run_ort(ort_model, ort_feeds), *ReferenceEvaluator(ref_model).run(None, ref_feeds)]
    return {"model": model, "feeds": feeds, "want": want, "outputs": [o.name for o in model.graph.output]}


def _assert_matches(got: list[np.ndarray], case: dict) -> None:
    for name, g, w in zip(case["outputs"], got, case["want"], strict=True):
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def _harness(out: Path, name: str, feeds: dict[str, np.ndarray], outputs: list[Value]) -> str:
    """A C program that runs the model on the feeds in in<i>.bin (its order) on the calling thread,
    then on a 2-thread pool, writes the outputs to out<run>_<j>.bin and prints the two statuses."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{name}.h"',
             "static void *load(const char *path, size_t n) {",
             "  void *p = malloc(n ? n : 1); FILE *f = fopen(path, \"rb\");",
             "  if (!f || fread(p, 1, n, f) != n) exit(2);", "  fclose(f); return p;", "}",
             "static void save(const char *path, const void *p, size_t n) {",
             "  FILE *f = fopen(path, \"wb\"); if (!f || fwrite(p, 1, n, f) != n) exit(2); fclose(f);", "}",
             "int main(void) {", f"  const void *in[{len(feeds)}]; void *out[{len(outputs)}]; char path[64];"]
    lines += [f'  in[{i}] = load("{out}/in{i}.bin", {v.nbytes});' for i, v in enumerate(feeds.values())]
    lines += [f"  out[{j}] = calloc(1, {max(v.nbytes, 1)});" for j, v in enumerate(outputs)]
    lines += [f"  aotc_parallel *pool = {name}_pool_create(2);",
              f"  const size_t bytes = ({name}_workspace_size_for_threads(2) + 63) / 64 * 64;",
              "  void *ws = aligned_alloc(64, bytes);",
              "  for (int run = 0; run < 2; run++) {",
              f"    const int rc = {name}_run_parallel(in, out, ws, bytes, run ? pool : NULL);",
              '    printf("%d\\n", rc);']
    lines += [f'    sprintf(path, "{out}/out%d_{j}.bin", run); save(path, out[{j}], {v.nbytes});'
              for j, v in enumerate(outputs)]
    lines += ["  }", f"  {name}_pool_destroy(pool); free(ws);",
              f"  for (int i = 0; i < {len(feeds)}; i++) free((void *)in[i]);",
              f"  for (int j = 0; j < {len(outputs)}; j++) free(out[j]);", "  return 0;", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def sanitized(case, tmp_path_factory) -> dict:
    """The model built with ASan/UBSan, and the harness program linked against it."""
    out = tmp_path_factory.mktemp("sanitized")
    cc = require_sanitizers(out)
    res = compile_model(case["model"], out, "hk", extra_cflags=FLAGS)
    (out / "app.c").write_text(_harness(out, "hk", case["feeds"], res.graph.outputs))
    subprocess.run([cc, "-std=c11", *FLAGS, f"-I{out}", str(out / "app.c"), str(out / "libhk.a"), "-lm",
                    "-pthread", "-o", str(out / "app")], check=True)
    return {"dir": out, "outputs": res.graph.outputs, "graph": res.graph}


def _run_harness(sanitized: dict, feeds: dict[str, np.ndarray]) -> tuple[list[int], list[list[np.ndarray]]]:
    out = sanitized["dir"]
    for i, v in enumerate(feeds.values()):
        (out / f"in{i}.bin").write_bytes(np.ascontiguousarray(v).tobytes())
    proc = subprocess.run([str(out / "app")], capture_output=True, text=True)
    assert "runtime error" not in proc.stderr and "Sanitizer" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [[np.fromfile(out / f"out{run}_{j}.bin", v.dtype).reshape(v.shape)
            for j, v in enumerate(sanitized["outputs"])] for run in range(2)]
    return [int(s) for s in proc.stdout.split()], got


def test_large_working_arrays_live_in_scratch_and_match_references(case, sanitized) -> None:
    """TopK with k = 2^20 (it segfaulted), several TopK rows, LSTM/GRU/RNN above 4 KiB of state,
    DeformConv's column and TreeEnsemble's 600 sums: right results on one and two threads (each task
    has its own slot), clean under ASan/UBSan. The float OneHot indices are NaN, inf and huge too."""
    meta = json.loads((sanitized["dir"] / "hk.json").read_text())
    assert meta["scratch_per_thread_bytes"] >= N_TOPK * 12
    scratch = {(n.op, n.outputs[0].name): OPS[n.op].scratch(n) for n in sanitized["graph"].nodes
               if OPS[n.op].scratch}
    assert len(scratch) == 8 and min(scratch.values()) > STACK_ARRAY_BYTES, scratch
    statuses, (one, two) = _run_harness(sanitized, case["feeds"])
    assert statuses == [0, 0]
    _assert_matches(one, case)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    oh = one[case["outputs"].index("ohy")]
    np.testing.assert_array_equal(oh.argmax(1)[:5], [0, 2, 3, 0, 3])
    assert oh[:5].sum() == 5 and not oh[5:].any()


def test_kernels_use_the_stack_only_for_small_arrays() -> None:
    small = task_arrays([("bv", np.dtype(np.float32), 16), ("bi", np.dtype(np.int64), 16)])
    assert small == (0, "float bv[16];\nint64_t bi[16];")
    size, code = task_arrays([("hs", np.dtype(np.float64), 500), ("gs", np.dtype(np.float64), 30)])
    assert size == 4032 + 256 > STACK_ARRAY_BYTES  # each array 64-byte aligned
    assert "double *restrict hs = (double *)(aotc_slot + 0);" in code
    assert "double *restrict gs = (double *)(aotc_slot + 4032);" in code
    assert "task * (size_t)4288" in code


# (input, flat element, value): just outside the valid range, one change per run.
BAD = [("afi", 0, 5), ("afi", 3, -1), ("rb", 1, 2), ("rb", 0, -1), ("ui", 3, 16), ("ui", 0, -1),
       ("sl", 0, 6), ("sl", 2, -1)]


def _with(feeds: dict[str, np.ndarray], name: str, pos: int, value: int) -> dict[str, np.ndarray]:
    feeds = dict(feeds)
    feeds[name] = feeds[name].copy()
    feeds[name].reshape(-1)[pos] = value
    return feeds


@pytest.mark.parametrize(("name", "pos", "value"), BAD[::2])
def test_out_of_range_indices_return_the_status_under_sanitizers(case, sanitized, name, pos, value) -> None:
    """onnxruntime raises for each (checked by test_out_of_range_indices_raise_like_onnxruntime); the
    run returns NAME_ERR_INDEX_OUT_OF_RANGE on one and two threads, touching nothing out of bounds."""
    statuses, _ = _run_harness(sanitized, _with(case["feeds"], name, pos, value))
    assert statuses == [IndexOutOfRangeError.code] * 2


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[onnx.ModelProto, dict[str, np.ndarray], aotc.CompiledModel]:
    """Only the ops whose indices are checked, built without sanitizers and loaded in Python."""
    ort_nodes, _, inits, feeds = _graph()
    nodes = [n for n in ort_nodes if n.op_type in ("ArrayFeatureExtractor", "RoiAlign", "MaxUnpool", "LSTM")]
    model = _model(nodes, inits, feeds)
    feeds = {i.name: feeds[i.name] for i in model.graph.input}
    return model, feeds, aotc.compile(model, tmp_path_factory.mktemp("small"), "hk", threads=2)


@pytest.mark.parametrize(("name", "pos", "value"), BAD)
def test_out_of_range_indices_raise_like_onnxruntime(small, name, pos, value) -> None:
    model, feeds, lib = small
    bad = _with(feeds, name, pos, value)
    with pytest.raises(Exception, match="out of range|out of bounds|Invalid value"):
        run_ort(model, bad)
    with pytest.raises(IndexOutOfRangeError):
        lib.run(bad)
    for got, want in zip(lib.run(feeds), run_ort(model, feeds), strict=True):  # still fine afterwards
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("node", "inputs", "const", "message"), [
    (helper.make_node("ArrayFeatureExtractor", ["x", "c"], ["y"], domain=ML), [("x", F, [2, 5])],
     np.array([1, 5], np.int64), "index 5 is out of range for an axis of length 5 (valid: 0..4)"),
    (helper.make_node("ArrayFeatureExtractor", ["x", "c"], ["y"], domain=ML), [("x", F, [2, 5])],
     np.array([-1], np.int64), "index -1 is out of range for an axis of length 5 (valid: 0..4)"),
    (helper.make_node("RoiAlign", ["x", "r", "c"], ["y"]), [("x", F, [2, 1, 4, 4]), ("r", F, [2, 4])],
     np.array([0, 2], np.int64), "batch index 2 is out of range for an axis of length 2 (valid: 0..1)"),
    (helper.make_node("MaxUnpool", ["x", "c"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
     [("x", F, [1, 1, 2, 2])], np.array([0, 1, 2, 16], np.int64).reshape(1, 1, 2, 2),
     "index 16 is out of range for an axis of length 16 (valid: 0..15)"),
    (helper.make_node("RNN", ["x", "w", "r", "", "c"], ["y"], hidden_size=2),
     [("x", F, [3, 2, 2]), ("w", F, [1, 2, 2]), ("r", F, [1, 2, 2])], np.array([1, 4], np.int32),
     "sequence length 4 is out of range 0..3"),
])
def test_constant_out_of_range_indices_are_compile_errors(tmp_path, node, inputs, const, message) -> None:
    model = _model([node], [("c", const)], {})
    model.graph.input.extend(helper.make_tensor_value_info(n, t, s) for n, t, s in inputs)
    with pytest.raises(AotcError, match=rf"{node.op_type} node '\w+': {re.escape(message)}$"):
        compile_model(model, tmp_path, "hk")


def test_value_size_is_exact() -> None:
    """numpy's int64 product wrapped: 2^32 x 2^32 elements read as 0."""
    v = Value("v", (1 << 32, 1 << 32), np.dtype(np.float32))
    assert v.size == 1 << 64 and v.nbytes == 1 << 66
    assert Value("s", (), np.dtype(np.float32)).size == 1


def test_header_declares_the_build_id_and_refuses_a_narrow_size_t(small, tmp_path) -> None:
    lib = small[2]
    out = lib.library_path.parent
    cc = require_sanitizers(tmp_path)
    (tmp_path / "app.c").write_text('#include <stdio.h>\n#include "hk.h"\n'
                                    'int main(void) { puts(hk_build_id()); return 0; }\n')
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{out}", str(tmp_path / "app.c"), str(out / "libhk.a"),
                    "-lm", "-pthread", "-o", str(tmp_path / "app")], check=True)
    got = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, check=True).stdout.strip()
    assert got == json.loads((out / "hk.json").read_text())["build_id"]
    # A 32-bit target's <stdint.h>, as far as the guard can tell.
    (tmp_path / "narrow").mkdir()
    (tmp_path / "narrow" / "stdint.h").write_text("#include_next <stdint.h>\n#undef SIZE_MAX\n"
                                                  "#define SIZE_MAX 4294967295u\n")
    proc = subprocess.run([cc, "-std=c11", "-fsyntax-only", f"-I{tmp_path / 'narrow'}", f"-I{out}",
                           str(tmp_path / "app.c")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "hk.h: the code aotc generates needs a 64-bit size_t and ptrdiff_t" in proc.stderr


@pytest.mark.parametrize("src", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_float_to_integer_casts_have_no_undefined_behaviour(tmp_path, src):
    """NaN, infinities and out-of-range values convert to the minimum (x86's integer indefinite, what
    onnxruntime gives) or its low bits, never through C's undefined conversion; in range they truncate.
    The generated test compares with onnxruntime under UBSan's float-cast-overflow check."""
    targets = [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
               TensorProto.INT64]
    np_src = helper.tensor_dtype_to_np_dtype(src)
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 2.7, -2.7, 300, -1, 3e9, -3e9, 1e19, -2e9], np_src)
    nodes = [helper.make_node("Add", ["x", "specials"], ["s"])]
    nodes += [helper.make_node("Cast", ["s"], [f"y{t}"], to=t) for t in targets]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", src, [13])],
        [helper.make_tensor_value_info(f"y{t}", t, [13]) for t in targets],
        [numpy_helper.from_array(specials, "specials")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    run_generated_test_under_sanitizers(model, tmp_path, FLAGS)
    kernels = "".join(p.read_text() for p in (tmp_path / ".aotc" / "m").glob("m_kernels*.c"))
    assert "aotc_cvt_i32_" in kernels and "aotc_cvt_i64_" in kernels
