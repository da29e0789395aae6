"""aotc compile --dynamic: one library for every batch size up to a bound (aotc/dynamic_library.py), the
proof that a dimension is a batch (aotc/dynamic_batch.py), and the Python bindings (aotc/dynamic_model.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import init, make, mlp, ort_run, vi
from onnx import TensorProto, helper
from onnx_helpers import SANITIZE, run_c_program_under_sanitizers

import aotc
from aotc.cli import main
from aotc.dynamic_batch import batch_axes
from aotc.dynamic_library import DIM_OUT_OF_RANGE, compile_dynamic, core_sizes, parse_dynamic
from aotc.dynamic_model import DynamicModel
from aotc.errors import AotcError

I64 = TensorProto.INT64
RNG = np.random.default_rng(7)


def _f32(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def batch_mlp() -> onnx.ModelProto:
    m = mlp(1, sizes=(24, 40, 5), seed=5)
    for t in (m.graph.input[0], m.graph.output[0]):
        t.type.tensor_type.shape.dim[0].dim_param = "batch"
    return m


def small_cnn() -> onnx.ModelProto:
    """Conv + BatchNorm + Relu + MaxPool, flattened by a Reshape whose target is computed from Shape (as
    PyTorch exports x.view(x.size(0), -1)), then a Gemm."""
    nodes = [
        helper.make_node("Conv", ["img", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["ps"]),
        helper.make_node("Gather", ["ps", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], transB=1),
    ]
    inits = [init("w", _f32(6, 3, 3, 3)), init("g", 1 + _f32(6)), init("b", _f32(6)), init("mu", _f32(6)),
             init("var", 1 + np.abs(_f32(6))), init("zero", np.array(0, np.int64)),
             init("zero1", np.array([0], np.int64)), init("minus1", np.array([-1], np.int64)),
             init("fw", _f32(7, 6 * 4 * 4)), init("fb", _f32(7))]
    return make(nodes, [vi("img", ["N", 3, 8, 8])], [vi("logits", ["N", 7])], inits)


def gathered_mask(seq: int) -> list[onnx.NodeProto]:
    """mask[b, j] read as mask.flatten()[b * seq + j] with b from a Range over the batch size, as
    transformers' masking utilities export it: 'mask' -> 'mg' [B, 1, 1, seq]."""
    return [
        helper.make_node("Reshape", ["mask", "flat_shape"], ["mflat"]),
        helper.make_node("Shape", ["mask"], ["ms"]),
        helper.make_node("Gather", ["ms", "zero"], ["nb"], axis=0),
        helper.make_node("Range", ["zero", "nb", "one_i"], ["b"]),
        helper.make_node("Unsqueeze", ["b", "axes123"], ["b4"]),
        helper.make_node("Mul", ["b4", "seq_i"], ["bs"]),
        helper.make_node("Add", ["bs", "kv"], ["idx"]),
        helper.make_node("Gather", ["mflat", "idx"], ["g"], axis=0),
        helper.make_node("Squeeze", ["g", "last"], ["mg"]),
    ]


def attention_block(seq: int = 6, hidden: int = 8, heads: int = 2, causal: bool = False,
                    varying_seq: bool = False) -> onnx.ModelProto:
    """A BERT-like layer (or GPT-2-like with ``causal``): token embeddings, one attention with the
    padding mask input, a residual and LayerNorm; head reshapes with 0 and Shape-computed targets.
    The GPT-2-like one reads its mask through ``gathered_mask`` and gives positions to an Expand.
    ``varying_seq``: a symbolic sequence length S too, positions looked up by Range(S)."""
    hd = hidden // heads
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"])]
    if varying_seq:
        nodes += [helper.make_node("Shape", ["ids"], ["ids_s"]),
                  helper.make_node("Gather", ["ids_s", "one_i"], ["s_len"], axis=0),
                  helper.make_node("Range", ["zero", "s_len", "one_i"], ["positions"]),
                  helper.make_node("Gather", ["pos_table", "positions"], ["pos_s"]),
                  helper.make_node("Add", ["h", "pos_s"], ["h0"])]
    elif causal:  # positions expanded to [B, seq, hidden] by a shape holding the batch size
        nodes += [helper.make_node("Shape", ["ids"], ["ids_b"], end=1),
                  helper.make_node("Concat", ["ids_b", "seq_hidden"], ["pos_shape"], axis=0),
                  helper.make_node("Expand", ["pos1", "pos_shape"], ["pos_e"]),
                  helper.make_node("Add", ["h", "pos_e"], ["h0"])]
    else:
        nodes.append(helper.make_node("Add", ["h", "pos"], ["h0"]))
    nodes += [
        helper.make_node("MatMul", ["h0", "wq"], ["q"]), helper.make_node("MatMul", ["h0", "wk"], ["k"]),
        helper.make_node("MatMul", ["h0", "wv"], ["v"]),
        helper.make_node("Reshape", ["q", "heads_shape"], ["q4"]),
        helper.make_node("Reshape", ["k", "heads_shape"], ["k4"]),
        helper.make_node("Reshape", ["v", "heads_shape"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
    ]
    if causal:
        nodes += [*gathered_mask(seq), helper.make_node("Cast", ["mg"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inv"]), helper.make_node("Mul", ["inv", "neg"], ["bias4"])]
    else:
        nodes += [helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inv"]),
                  helper.make_node("Mul", ["inv", "neg"], ["bias"]),
                  helper.make_node("Unsqueeze", ["bias", "axes12"], ["bias4"])]
    nodes.append(helper.make_node("Add", ["ss", "bias4"], ["sm"]))
    if causal:
        nodes.append(helper.make_node("Add", ["sm", "causal"], ["sc"]))
    nodes += [
        helper.make_node("Softmax", ["sc" if causal else "sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Concat", ["ids_shape", "hidden_dim"], ["merge_shape"], axis=0),
        helper.make_node("Reshape", ["ctxt", "merge_shape"], ["merged"]),
        helper.make_node("MatMul", ["merged", "wo"], ["o"]),
        helper.make_node("Add", ["o", "h0"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "ln_g", "ln_b"], ["y"], axis=-1),
    ]
    causal_bias = np.triu(np.full((seq, seq), -1e4, np.float32), 1)[None, None]
    inits = [init("emb", _f32(20, hidden, scale=1)), init("pos", _f32(seq, hidden)),
             *(init(w, _f32(hidden, hidden)) for w in ("wq", "wk", "wv", "wo")),
             init("heads_shape", np.array([0, 0, heads, hd], np.int64)), init("scale", np.float32(hd ** -0.5)),
             init("one", np.float32(1)), init("neg", np.float32(-1e4)), init("axes12", np.array([1, 2], np.int64)),
             init("hidden_dim", np.array([hidden], np.int64)), init("ln_g", 1 + _f32(hidden)),
             init("ln_b", _f32(hidden)), init("causal", causal_bias), init("flat_shape", np.array([-1, 1], np.int64)),
             init("zero", np.array(0, np.int64)), init("one_i", np.array(1, np.int64)),
             init("axes123", np.array([1, 2, 3], np.int64)), init("seq_i", np.array(seq, np.int64)),
             init("kv", np.arange(seq, dtype=np.int64).reshape(1, 1, 1, seq)), init("last", np.array([-1], np.int64)),
             init("seq_hidden", np.array([seq, hidden], np.int64)), init("pos1", _f32(1, seq, hidden)),
             init("pos_table", _f32(16, hidden))]
    b, s = ("B", "S") if varying_seq else ("B", seq)
    return make(nodes, [vi("ids", [b, s], I64), vi("mask", [b, s], I64)], [vi("y", [b, s, hidden])], inits, opset=17)


def attention_feeds(n: int, seq: int = 6) -> dict[str, np.ndarray]:
    mask = np.ones((n, seq), np.int64)
    for i in range(n):
        mask[i, seq - i % seq:] = 0  # sample i pads its last i % seq positions
    return {"ids": RNG.integers(0, 20, (n, seq)).astype(np.int64), "mask": mask}


def test_core_sizes() -> None:
    assert core_sizes(parse_dynamic("b<=1")) == [1]
    assert core_sizes(parse_dynamic("b<=32")) == [1, 2, 4, 8, 16, 32]
    assert core_sizes(parse_dynamic("x:0 <= 6")) == [1, 2, 4, 6]
    assert core_sizes(parse_dynamic("seq = 8, 4,4")) == [4, 8]
    for bad in ("seq=8", "b<=0", "b<32", "seq=0,4"):
        with pytest.raises(AotcError, match="--dynamic"):
            parse_dynamic(bad)


@pytest.mark.parametrize(("model", "spec", "inputs"), [
    (batch_mlp, "batch<=6", {"x": (24,)}),
    (small_cnn, "N<=4", {"img": (3, 8, 8)}),
    (attention_block, "ids:0<=3", None),
], ids=["mlp", "cnn", "bert_like"])  # the GPT-2-like layer: under the sanitizers below
def test_dynamic_batch_matches_onnxruntime_at_every_size(tmp_path: Path, model, spec: str, inputs) -> None:
    m = model()
    res = compile_dynamic(m, tmp_path, "dyn", [spec])
    lib = aotc.load(tmp_path / "dyn")
    assert isinstance(lib, DynamicModel)
    bound = res.dims[0].max
    assert lib.dims == [(spec.split("<=")[0], bound)]
    for n in sorted({1, 2, bound - 1, bound} - {0}):
        feeds = attention_feeds(n) if inputs is None else {k: _f32(n, *s, scale=1) for k, s in inputs.items()}
        got = lib.run(feeds)
        want = ort_run(m, feeds)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match=f"outside 1..{bound}"):
        lib.run(attention_feeds(bound + 1) if inputs is None else
                {k: _f32(bound + 1, *s) for k, s in inputs.items()})


def test_listed_sizes_of_a_sequence_length(tmp_path: Path) -> None:
    """A sequence length under attention is no batch: one core per listed size, each exact."""
    m = attention_block(varying_seq=True)
    with pytest.raises(AotcError, match="axis 1 of input 'ids'.*list the sizes"):
        compile_dynamic(m, tmp_path, "seq", ["S<=8"])
    res = compile_dynamic(m, tmp_path, "seq", ["S=4,6"], input_shapes={"ids": (2, 0), "mask": (2, 0)},
                          extra_cflags=["-Wall", "-Wextra", "-Werror"])
    assert res.cores == [4, 6]
    lib = aotc.load(tmp_path / "seq")
    assert lib.sizes == [[4, 6]] and lib.dims == [("S", 6)]
    for n in (4, 6):
        feeds = attention_feeds(2, seq=n)
        np.testing.assert_allclose(lib.run(feeds)[0], ort_run(m, feeds)[0], rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match="not one of the sizes compiled"):
        lib.run(attention_feeds(2, seq=5))
    ffi = lib._ffi  # the C entry point refuses a size it has no core for
    assert lib._run_dims(ffi.new("int64_t[]", [5]), ffi.NULL, ffi.NULL, ffi.NULL, 0, ffi.NULL) == DIM_OUT_OF_RANGE
    header = (tmp_path / "seq.h").read_text()
    assert "dimension 0: S, one of 4, 6" in header and "int64_t seq_dim_size(int d, int i);" in header


def test_a_batch_and_listed_sequence_lengths(tmp_path: Path) -> None:
    """BERT-like with both: the batch split over cores compiled at each listed sequence length."""
    m = attention_block(varying_seq=True)
    res = compile_dynamic(m, tmp_path, "bs", ["B<=2", "S=4,6"], extra_cflags=["-Wall", "-Wextra", "-Werror"])
    assert res.cores == [(1, 4), (2, 4), (1, 6), (2, 6)]
    lib = aotc.load(tmp_path / "bs")
    assert lib.dims == [("B", 2), ("S", 6)] and lib.sizes == [None, [4, 6]]
    for n, seq in ((1, 6), (2, 4), (2, 6)):
        feeds = attention_feeds(n, seq=seq)
        np.testing.assert_allclose(lib.run(feeds)[0], ort_run(m, feeds)[0], rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match="'S' is 5, not one of the sizes compiled"):
        lib.run(attention_feeds(2, seq=5))
    with pytest.raises(AotcError, match="one batch .* and one dimension of listed sizes"):
        compile_dynamic(m, tmp_path, "bs", ["B<=3", "B<=2"])


# The C API at size 1, at the bound, and refused sizes, under ASan/UBSan: inputs are heap blocks of
# exactly n samples, so a read past them is reported.
C_APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dyn.h"

int main(void) {
  if (DYN_NUM_DIMS != 1 || dyn_dim_max(0) != 6 || strcmp(dyn_dim_name(0), "batch") != 0) return 10;
  if (dyn_input_dim(0, 0) != 0 || dyn_input_dim(0, 1) != -1 || dyn_output_dim(0, 0) != 0) return 11;
  if (dyn_input_shape(0)[0] != 6 || dyn_input_shape(0)[1] != 24) return 12;
  void *ws = aligned_alloc(64, DYN_WORKSPACE_BYTES + 64);
  FILE *f = fopen("x.bin", "rb");
  float all[6 * 24];
  if (!f || fread(all, sizeof all, 1, f) != 1) return 13;
  fclose(f);
  const int64_t sizes[] = {1, 6, 5};
  for (int k = 0; k < 3; k++) {
    int64_t n = sizes[k];
    float *x = malloc((size_t)n * 24 * sizeof(float)), *y = malloc((size_t)n * 5 * sizeof(float));
    memcpy(x, all, (size_t)n * 24 * sizeof(float));
    int rc = dyn_run_dims(&n, x, y, ws);
    if (rc != DYN_OK) { printf("status %s\n", dyn_status_name(rc)); return 14; }
    for (int i = 0; i < n * 5; i++) printf("%.9g\n", y[i]);
    free(x);
    free(y);
  }
  float x0[24] = {0}, y0[5] = {0};
  const int64_t bad[] = {0, 7, -1};
  for (int k = 0; k < 3; k++)
    if (dyn_run_dims(&bad[k], x0, y0, ws) != DYN_ERR_DIM_OUT_OF_RANGE) return 15;
  if (dyn_run_dims(NULL, x0, y0, ws) != DYN_ERR_DIM_OUT_OF_RANGE) return 16;
  if (dyn_run_dims(&sizes[0], NULL, y0, ws) != DYN_ERR_NULL_ARGUMENT) return 17;
  if (strcmp(dyn_status_name(DYN_ERR_DIM_OUT_OF_RANGE), "DYN_ERR_DIM_OUT_OF_RANGE") != 0) return 18;
  free(ws);
  return 0;
}
"""


@pytest.mark.slow
def test_c_api_under_sanitizers_at_one_and_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = batch_mlp()
    compile_dynamic(m, tmp_path, "dyn", ["batch<=6"], extra_cflags=[*SANITIZE, "-Wall", "-Wextra", "-Werror"])
    x = _f32(6, 24, scale=1)
    x.tofile(tmp_path / "x.bin")
    monkeypatch.chdir(tmp_path)
    proc = run_c_program_under_sanitizers(tmp_path, C_APP, "libdyn.a", SANITIZE)
    got = np.array(proc.stdout.split(), np.float32)
    want = np.concatenate([ort_run(m, {"x": x[:n]})[0].reshape(-1) for n in (1, 6, 5)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert DIM_OUT_OF_RANGE == 16


# Any model's library under ASan/UBSan at the sizes RUNS (size 1 and the bounds): inputs read from
# files into heap blocks of exactly their size, outputs written back for the comparison.
C_FILES = r"""
#include <stdio.h>
#include <stdlib.h>
#include "dyn.h"

#define NUM_RUNS NUM_RUNS_HERE
static const int64_t run_dims[NUM_RUNS][DYN_NUM_DIMS] = { RUN_DIMS };
static const size_t in_bytes[NUM_RUNS][DYN_NUM_INPUTS] = { IN_BYTES };
static const size_t out_bytes[NUM_RUNS][DYN_NUM_OUTPUTS] = { OUT_BYTES };

int main(void) {
  void *ws = aligned_alloc(64, (DYN_WORKSPACE_BYTES + 63) / 64 * 64);
  char path[64];
  for (int k = 0; k < NUM_RUNS; k++) {
    const void *in[DYN_NUM_INPUTS];
    void *out[DYN_NUM_OUTPUTS];
    for (int i = 0; i < DYN_NUM_INPUTS; i++) {
      void *p = malloc(in_bytes[k][i]);
      snprintf(path, sizeof path, "in%d_%d.bin", i, k);
      FILE *f = fopen(path, "rb");
      if (!f || fread(p, in_bytes[k][i], 1, f) != 1) return 20;
      fclose(f);
      in[i] = p;
    }
    for (int i = 0; i < DYN_NUM_OUTPUTS; i++) out[i] = malloc(out_bytes[k][i]);
    int rc = dyn_run_dims_parallel(run_dims[k], in, out, ws, DYN_WORKSPACE_BYTES, 0);
    if (rc != DYN_OK) { puts(dyn_status_name(rc)); return 21; }
    for (int i = 0; i < DYN_NUM_OUTPUTS; i++) {
      snprintf(path, sizeof path, "out%d_%d.bin", i, k);
      FILE *f = fopen(path, "wb");
      if (!f || fwrite(out[i], out_bytes[k][i], 1, f) != 1) return 22;
      fclose(f);
      free(out[i]);
    }
    for (int i = 0; i < DYN_NUM_INPUTS; i++) free((void *)in[i]);
  }
  free(ws);
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.parametrize(("causal", "dynamic", "runs"), [
    (True, ["B<=3"], [(1,), (3,)]),
    (False, ["B<=2", "S=4,6"], [(1, 4), (2, 6)]),
], ids=["gpt2_like_batch", "bert_like_batch_and_seq"])
def test_an_attention_layer_under_sanitizers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, causal: bool,
                                             dynamic: list[str], runs: list[tuple[int, ...]]) -> None:
    m = attention_block(causal=causal, varying_seq=len(dynamic) > 1)
    compile_dynamic(m, tmp_path, "dyn", dynamic, extra_cflags=[*SANITIZE, "-Wall", "-Wextra", "-Werror"])
    names = [i.name for i in m.graph.input]
    feeds = [attention_feeds(*r) for r in runs]
    want = [ort_run(m, f) for f in feeds]
    for k, f in enumerate(feeds):
        for i, name in enumerate(names):
            f[name].tofile(tmp_path / f"in{i}_{k}.bin")
    rows = [(list(r), [f[n].nbytes for n in names], [w.nbytes for w in ws])
            for r, f, ws in zip(runs, feeds, want, strict=True)]
    source = C_FILES.replace("NUM_RUNS_HERE", str(len(runs)))
    for key, part in (("RUN_DIMS", 0), ("IN_BYTES", 1), ("OUT_BYTES", 2)):
        source = source.replace(key, ", ".join("{" + ", ".join(map(str, row[part])) + "}" for row in rows))
    monkeypatch.chdir(tmp_path)
    run_c_program_under_sanitizers(tmp_path, source, "libdyn.a", SANITIZE)
    for k, outs in enumerate(want):
        for i, w in enumerate(outs):
            got = np.fromfile(tmp_path / f"out{i}_{k}.bin", w.dtype).reshape(w.shape)
            np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-4)


def test_cli_compiles_a_dynamic_library(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = batch_mlp()
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--dynamic", "batch<=3"]) == 0
    assert "cores at 1, 2, 3" in capsys.readouterr().out
    header = (tmp_path / "out" / "m.h").read_text()
    assert "int m_run_dims(const int64_t *dims, const float *x, float *logits, void *workspace);" in header
    assert "#define M_DIM0_MAX ((int64_t)3)" in header
    x = _f32(2, 24, scale=1)
    lib = aotc.load(tmp_path / "out" / "m", threads=2)
    np.testing.assert_allclose(lib.run({"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    out = np.empty((1, 5), np.float32)
    assert lib.run([x[1:]], out=[out])[0] is out
    np.testing.assert_array_equal(out, lib.run({"x": x})[0][1:])  # per sample: the same at any size
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(tmp_path / "out" / "m"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                 str(tmp_path / "y")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y" / "logits.npy"), ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert main(["profile", str(tmp_path / "out" / "m"), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--dynamic", "batch<32"]) == 1
    err = capsys.readouterr().err
    assert "has no profiling build" in err and "expected DIM<=MAX" in err


# -- what the analysis refuses (no C compile) ------------------------------------------------------------

def _one_input(nodes, out_shape, inits=(), in_shape=("B", 6)) -> onnx.ModelProto:
    return make(nodes, [vi("x", list(in_shape))], [vi("y", list(out_shape))], list(inits))


@pytest.mark.parametrize(("model", "message"), [
    (_one_input([helper.make_node("ReduceMean", ["x"], ["y"], axes=[0])], [1, 6]),
     "'ReduceMean'.*reduces over the batch axis"),
    (_one_input([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
                 helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
                 helper.make_node("Div", ["x", "nf"], ["y"])], ["B", 6], [init("zero", np.array(0, np.int64))]),
     "'Div'.*uses the batch size as data"),
    (_one_input([helper.make_node("Reshape", ["x", "t"], ["y"])], [6, "B"], [init("t", np.array([6, -1], np.int64))]),
     "reshapes .* which mixes samples"),
    (_one_input([helper.make_node("Transpose", ["x"], ["xt"]), helper.make_node("MatMul", ["x", "xt"], ["y"])],
                ["B", "B"]), "'MatMul'.*different axes"),
    (_one_input([helper.make_node("Softmax", ["x"], ["y"], axis=0)], ["B", 6]), "normalizes along the batch axis"),
    (_one_input([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
                 helper.make_node("Range", ["zero", "n", "one"], ["r"]),
                 helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                 helper.make_node("Unsqueeze", ["rf", "one1"], ["r2"]), helper.make_node("Add", ["x", "r2"], ["y"])],
                ["B", 6], [init("zero", np.array(0, np.int64)), init("one", np.array(1, np.int64)),
                           init("one1", np.array([1], np.int64))]),
     "'Add'.*uses sample indices"),
    (_one_input([helper.make_node("Transpose", ["x"], ["y"])], [6, "B"]), "output 'y' has the batch on axis 1"),
])
def test_the_analysis_refuses_what_mixes_samples(model: onnx.ModelProto, message: str) -> None:
    with pytest.raises(AotcError, match=message):
        batch_axes(model, {"x": 0})


def test_dimension_names_and_axes(tmp_path: Path) -> None:
    m = attention_block()
    with pytest.raises(AotcError, match="no dimension 'seq'.*symbolic dimensions: B"):
        compile_dynamic(m, tmp_path, "d", ["seq<=8"])
    with pytest.raises(AotcError, match="fixed at 6 by the model"):
        compile_dynamic(m, tmp_path, "d", ["ids:1<=8"])
    seq_model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, "S"])], [vi("y", [2, "S"])])
    with pytest.raises(AotcError, match="axis 1 of input 'x'; aotc splits a batch on axis 0 only"):
        compile_dynamic(seq_model, tmp_path, "d", ["S<=8"])
    with pytest.raises(AotcError, match="one batch .* at most, each named once"):
        compile_dynamic(m, tmp_path, "d", ["B<=2", "ids:0<=2"])
    assert batch_axes(m, {"ids": 0, "mask": 0}) == {"y": 0}


@pytest.mark.slow
def test_a_transformers_bert_export_with_dynamic_batch(tmp_path: Path) -> None:
    """PyTorch's export of transformers' BERT with a dynamic batch axis (its masking utilities gather
    the padding mask through a Range over the batch size), padding masks differing per sample."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import real_models as rm

    module, feeds = rm.ARCHS["bert"].build()
    path = tmp_path / "bert.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer warnings
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), opset_version=17,
                          dynamo=False, input_names=list(feeds), output_names=["y"],
                          dynamic_axes={k: {0: "batch"} for k in [*feeds, "y"]})
    m = onnx.load(str(path))
    m.ir_version = min(m.ir_version, 9)
    compile_dynamic(m, tmp_path, "bert", ["batch<=2"])
    lib = aotc.load(tmp_path / "bert")
    seq = feeds["input_ids"].shape[1]
    for n in (1, 2):
        mask = np.ones((n, seq), np.int64)
        for i in range(n):
            mask[i, seq - 5 * i:] = 0
        f = {"input_ids": RNG.integers(0, rm.VOCAB, (n, seq)).astype(np.int64), "attention_mask": mask}
        np.testing.assert_allclose(lib.run(f)[0], ort_run(m, f)[0], rtol=1e-4, atol=1e-4)
