"""The generated C compiles cleanly under -Wall -Wextra -Werror with gcc and clang.

The models cover every kernel family: GEMM and batched MatMul, Softmax, LayerNorm and the other norms,
reductions, index ops, the RNNs, the conv paths and pools, plus a sample of ONNX backend node cases.
Only the C is generated (no build); each file is compiled alone with the flags of a build."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_cross_targets import small_cnn, transformer_block

from aotc.build import BASE_CFLAGS
from aotc.codegen.library import generate
from aotc.frontends.onnx import import_onnx
from aotc.passes.pipeline import run_passes
from aotc.target import resolve

F = TensorProto.FLOAT
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-O1"]  # -O1: the warnings that need data flow, at little cost
COMPILERS = [cc for cc in ("gcc", "clang") if shutil.which(cc)]


def _model(nodes: list, inputs: list, outputs: list[str], inits: dict[str, np.ndarray], opset: int = 17,
           ) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def index_and_reduce() -> onnx.ModelProto:
    """Gather (two axes), Transpose, Slice, Concat, Pad, Expand, reductions over inner, outer and all axes,
    ArgMax, TopK, CumSum."""
    n = helper.make_node
    i64 = np.int64
    inits = {"gi": np.array([0, 2, 1], i64), "st": np.array([1, 0], i64), "en": np.array([3, 4], i64),
             "ax": np.array([1, 2], i64), "pads": np.array([0, 1, 1, 0, 0, 2, 0, 1], i64),
             "eshape": np.array([2, 1, 4, 5], i64), "k": np.array([2], i64), "cax": np.array(3, i64)}
    nodes = [n("Gather", ["x", "gi"], ["g"], axis=1), n("Gather", ["x", "gi"], ["g0"], axis=0),
             n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("Slice", ["x", "st", "en", "ax"], ["s"]),
             n("Concat", ["x", "x2"], ["c"], axis=1), n("Pad", ["x", "pads"], ["p"]),
             n("Expand", ["e", "eshape"], ["ex"]),
             n("ReduceSum", ["x", "cax"], ["rs"], keepdims=0), n("ReduceMax", ["x"], ["rm"], axes=[0, 2]),
             n("ReduceMean", ["x"], ["ra"], keepdims=0), n("ArgMax", ["x"], ["am"], axis=1),
             n("TopK", ["x", "k"], ["tv", "ti"], axis=-1), n("CumSum", ["x", "cax"], ["cs"])]
    inputs = [helper.make_tensor_value_info("x", F, [3, 4, 4, 5]), helper.make_tensor_value_info("x2", F, [3, 2, 4, 5]),
              helper.make_tensor_value_info("e", F, [1, 1, 4, 1])]
    outs = ["g", "g0", "t", "s", "c", "p", "ex", "rs", "rm", "ra", "tv", "cs"]
    m = _model(nodes, inputs, outs, inits, opset=13)
    m.graph.output.extend([helper.make_tensor_value_info("am", TensorProto.INT64, None),
                           helper.make_tensor_value_info("ti", TensorProto.INT64, None)])
    return m


def rnns() -> onnx.ModelProto:
    """LSTM (bidirectional), GRU and RNN over a short sequence."""
    rng = np.random.default_rng(3)
    s, b, i, h = 3, 2, 4, 5

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    inits = {"lw": w(2, 4 * h, i), "lr": w(2, 4 * h, h), "gw": w(1, 3 * h, i), "gr": w(1, 3 * h, h),
             "rw": w(1, h, i), "rr": w(1, h, h)}
    n = helper.make_node
    nodes = [n("LSTM", ["x", "lw", "lr"], ["ly"], hidden_size=h, direction="bidirectional"),
             n("GRU", ["x", "gw", "gr"], ["gy"], hidden_size=h, linear_before_reset=1),
             n("RNN", ["x", "rw", "rr"], ["ry"], hidden_size=h)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [s, b, i])], ["ly", "gy", "ry"], inits)


def norms_and_pools() -> onnx.ModelProto:
    """BatchNormalization, InstanceNormalization, LRN, MeanVarianceNormalization, LpNormalization, and
    MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool."""
    rng = np.random.default_rng(4)
    c = 3
    inits = {"sc": rng.random(c).astype(np.float32) + 0.5, "bi": rng.random(c).astype(np.float32),
             "mu": rng.random(c).astype(np.float32), "va": rng.random(c).astype(np.float32) + 0.5}
    n = helper.make_node
    nodes = [n("BatchNormalization", ["x", "sc", "bi", "mu", "va"], ["bn"]),
             n("InstanceNormalization", ["x", "sc", "bi"], ["inn"]), n("LRN", ["x"], ["lrn"], size=3),
             n("MeanVarianceNormalization", ["x"], ["mvn"]), n("LpNormalization", ["x"], ["lp"], axis=1),
             n("MaxPool", ["x"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             n("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("GlobalAveragePool", ["x"], ["gap"]), n("GlobalMaxPool", ["x"], ["gmp"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, c, 6, 6])],
                  ["bn", "inn", "lrn", "mvn", "lp", "mp", "ap", "gap", "gmp"], inits)


def edge_cases() -> onnx.ModelProto:
    """What once drew warnings: Max and Min of integers (a NaN test x != x), a reduction over an empty
    axis and an empty Slice (loops of no trips, a kernel that reads nothing), a summed
    NegativeLogLikelihoodLoss (its weight sum unused) without spatial axes (a loop of one trip)."""
    n = helper.make_node
    i64 = np.int64
    inits = {"st": np.array([2], i64), "en": np.array([2], i64), "ax": np.array([1], i64)}
    nodes = [n("Max", ["a", "b"], ["mx"]), n("Min", ["a", "b"], ["mn"]),
             n("ReduceMax", ["z"], ["rs"], keepdims=0, axes=[0]), n("Slice", ["x", "st", "en", "ax"], ["sl"]),
             n("NegativeLogLikelihoodLoss", ["x", "t"], ["nll"], reduction="sum")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.INT32, [4]),
              helper.make_tensor_value_info("b", TensorProto.INT32, [4]),
              helper.make_tensor_value_info("z", F, [0, 3]), helper.make_tensor_value_info("x", F, [3, 5]),
              helper.make_tensor_value_info("t", TensorProto.INT64, [3])]
    m = _model(nodes, inputs, ["rs", "sl", "nll"], inits, opset=13)
    m.graph.output.extend([helper.make_tensor_value_info(o, TensorProto.INT32, None) for o in ("mx", "mn")])
    return m


def backend_sample() -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
    """40 ONNX backend node cases of the opset with the most, evenly spaced by name, in one model."""
    from backend_expected_failures import EXPECTED_FAILURES
    from backend_suite import is_collected, load_node_cases, merge

    cases = [c for c in load_node_cases() if is_collected(c) and c.id not in EXPECTED_FAILURES
             and all(isinstance(v, np.ndarray) and v.dtype != object for v in c.inputs + c.outputs)]
    counts: dict[int, int] = {}
    for c in cases:
        counts[c.opset] = counts.get(c.opset, 0) + 1
    opset = max(counts, key=lambda o: (counts[o], -o))
    group = sorted((c for c in cases if c.opset == opset), key=lambda c: c.id)
    model, feeds, _ = merge([group[i * len(group) // 40] for i in range(40)])
    return model, {k: tuple(v.shape) for k, v in feeds.items() if v is not None}


MODELS = {
    "block": transformer_block,
    "index_and_reduce": index_and_reduce,
    "rnns": rnns,
    "edge_cases": edge_cases,
    "norms_and_pools": norms_and_pools,
    "cnn": small_cnn,
    "backend_sample": backend_sample,
}


def _generate(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], out: Path) -> list[Path]:
    tgt = resolve(None, None, None, None, None)
    g = import_onnx(model, shapes, "m", None)
    run_passes(g, target=tgt)
    lib = generate(g, "m", [v.name for v in g.inputs], [v.name for v in g.outputs], "m", target=tgt)
    for name, data in lib.files.items():
        (out / name).write_bytes(data)
    return sorted(out / name for name in lib.files if name.endswith(".c"))


@pytest.mark.skipif(not COMPILERS, reason="no C compiler")
@pytest.mark.parametrize("case", list(MODELS.values()), ids=list(MODELS))
def test_generated_c_is_warning_free(tmp_path: Path, case) -> None:
    made = case()
    model, shapes = made if isinstance(made, tuple) else (made, {})
    sources = _generate(model, shapes, tmp_path)
    flags = [*BASE_CFLAGS, *resolve(None, None, None, None, None).flags, *WARNINGS]
    failures = []
    for cc in COMPILERS:
        procs = [subprocess.Popen([cc, *flags, "-c", str(src), "-o", "/dev/null"], stderr=subprocess.PIPE,
                                  text=True, cwd=tmp_path) for src in sources]
        for src, proc in zip(sources, procs, strict=True):
            err = proc.communicate()[1]
            if proc.returncode:
                failures.append(f"{cc} {src.name}:\n{err[:3000]}")
    assert not failures, "\n".join(failures)
