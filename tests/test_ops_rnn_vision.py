"""Differential tests of the recurrent, vision and integer ops (aotc/ops/rnn.py, vision.py, integer.py,
MeanVarianceNormalization) against onnxruntime: recurrences shaped like exported models (batch > 1,
bidirectional, initializer weights, per-row sequence lengths) and GridSample on random grids with
coordinates outside [-1, 1]. DeformConv is checked against onnx's reference (onnxruntime has no CPU
kernel for it in every version)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import (
    SPECIAL_F32,
    Case,
    GroupRunner,
    Inp,
    add_cases,
    chunk_groups,
    f32,
    i64,
    require_sanitizers,
    rng_for,
    run_c_program_under_sanitizers,
    single,
)

pytest.importorskip("onnxruntime")

F, U8, I8 = "float32", "uint8", "int8"

CASES: list[Case] = []


def add(section: str, *cases: Case) -> None:
    add_cases(CASES, section, *cases)


def _w(key: str, *shape: int, scale: float = 0.5) -> np.ndarray:
    """Initializer weights, as an exported model carries them."""
    return (rng_for(key).standard_normal(shape) * scale).astype(np.float32)


def rnn(case_id: str, op: str, seq: int, batch: int, isz: int, hid: int, attrs: dict,
        state: bool = True, seq_lens: list[int] | None = None) -> Case:
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    d = 2 if attrs.get("direction") == "bidirectional" else 1
    args: list = [Inp((seq, batch, isz)), _w(case_id + "W", d, g * hid, isz), _w(case_id + "R", d, g * hid, hid),
                  _w(case_id + "B", d, 2 * g * hid, scale=0.1),
                  None if seq_lens is None else np.array(seq_lens, np.int32)]
    if state:
        args.append(Inp((d, batch, hid)))
        if op == "LSTM":
            args.append(Inp((d, batch, hid)))
    n_out = 3 if op == "LSTM" else 2
    return single(case_id, op, args, {"hidden_size": hid, **attrs}, n_out=n_out, opset=14, rtol=1e-4,
                  atol=1e-5)


add("rnn",
    rnn("LSTM_bidirectional", "LSTM", 5, 3, 4, 6, {"direction": "bidirectional"}),
    rnn("LSTM_wide", "LSTM", 4, 2, 20, 16, {}),
    rnn("LSTM_seq_lens", "LSTM", 5, 3, 4, 6, {"direction": "bidirectional"}, seq_lens=[5, 3, 1]),
    rnn("LSTM_no_state", "LSTM", 3, 2, 5, 4, {"direction": "reverse"}, state=False),
    rnn("GRU_bidirectional_lbr", "GRU", 5, 3, 4, 6, {"direction": "bidirectional", "linear_before_reset": 1}),
    rnn("GRU_forward", "GRU", 4, 2, 9, 10, {}),
    rnn("GRU_seq_lens", "GRU", 4, 2, 3, 5, {"linear_before_reset": 1}, seq_lens=[2, 4]),
    rnn("RNN_bidirectional", "RNN", 5, 3, 4, 6, {"direction": "bidirectional"}),
    rnn("RNN_relu", "RNN", 4, 2, 3, 5, {"activations": ["Relu"]}),
)


def gridsample(mode: str, pad: str, align: int) -> Case:
    # Standard-normal grid coordinates: about a third fall outside [-1, 1].
    return single(f"GridSample_{mode}_{pad}_{align}", "GridSample", [Inp((2, 3, 5, 7)), Inp((2, 4, 6, 2))],
                  {"mode": mode, "padding_mode": pad, "align_corners": align}, opset=16, rtol=1e-4,
                  atol=1e-5)


add("gridsample", *[gridsample(m, p, a) for m in ("bilinear", "nearest", "bicubic")
                    for p in ("zeros", "border", "reflection") for a in (0, 1)])

_ROIS = f32(0, 0, 5, 5, 1.5, 2.2, 7.9, 6.1, -2, 3, 4, 12, 6, 6, 6.5, 6.2).reshape(4, 4)


def _pool_unpool(case_id: str, attrs: dict, x: tuple[int, ...]) -> Case:
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs),
             helper.make_node("MaxUnpool", ["p", "i"], ["y"], **attrs)]
    return Case(case_id, nodes, {"x": Inp(x)}, ["y"], opset=12)


def _deform_reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    node = helper.make_node("DeformConv", ["x0", "c1", "x2", "c3", "x4"], ["y0"], group=2, offset_group=2,
                            pads=[1, 0, 1, 1], strides=[2, 1])
    out = helper.make_tensor_value_info("y0", 1, None)
    model = helper.make_model(helper.make_graph([node], "g", [], [out]),
                              opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {**feeds, "c1": _DEFORM_W, "c3": f32(0.5, -1, 2, 0.25)})


_DEFORM_W = _w("deformW", 4, 2, 3, 2)

add("vision",
    *[single(f"RoiAlign_{ctm}", "RoiAlign", [Inp((2, 3, 10, 9)), _ROIS, i64(0, 1, 1, 0)],
             {"coordinate_transformation_mode": ctm, "output_height": 3, "output_width": 2,
              "spatial_scale": 0.9}, opset=16, rtol=1e-4, atol=1e-5)
      for ctm in ("half_pixel", "output_half_pixel")],
    single("RoiAlign_sampling_ratio", "RoiAlign", [Inp((1, 2, 8, 8)), _ROIS, i64(0, 0, 0, 0)],
           {"sampling_ratio": 2, "output_height": 2, "output_width": 3}, opset=16, rtol=1e-4, atol=1e-5),
    _pool_unpool("MaxUnpool_2d", {"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 3, 6, 8)),
    _pool_unpool("MaxUnpool_pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (1, 2, 7, 7)),
    single("Col2Im", "Col2Im", [Inp((2, 12, 12)), i64(5, 6), i64(2, 3)],
           {"strides": [1, 2], "pads": [1, 0, 0, 1], "dilations": [2, 1]}, opset=18, rtol=1e-5),
    single("MVN", "MeanVarianceNormalization", [Inp((2, 3, 4, 5))], {"axes": [0, 2, 3]}, opset=13,
           rtol=1e-4, atol=1e-5),
    single("MVN_axes", "MeanVarianceNormalization", [Inp((2, 3, 4, 5))], {"axes": [1, 3]}, opset=13,
           rtol=1e-4, atol=1e-5),
    single("DeformConv", "DeformConv", [Inp((1, 4, 6, 5)), _DEFORM_W, Inp((1, 24, 3, 5)), f32(0.5, -1, 2, 0.25),
                                        Inp((1, 12, 3, 5), F, "unit")],
           {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 1], "strides": [2, 1]}, opset=19, rtol=1e-4,
           atol=1e-5, reference=_deform_reference),
)

add("integer",
    single("MatMulInteger", "MatMulInteger", [Inp((2, 3, 5), U8), Inp((5, 4), U8), np.array(7, np.uint8),
                                               np.array([1, 2, 250, 4], np.uint8)], opset=10),
    single("MatMulInteger_int8", "MatMulInteger", [Inp((4, 6), I8), Inp((6, 3), I8)], opset=10),
    single("QLinearMatMul", "QLinearMatMul",
           [Inp((3, 5), U8), f32(0.05), np.array(100, np.uint8), Inp((5, 4), U8), f32(0.02),
            np.array(120, np.uint8), f32(0.3), np.array(128, np.uint8)], opset=10),
    single("ConvInteger", "ConvInteger", [Inp((1, 4, 6, 6), U8), Inp((6, 2, 3, 3), U8), np.array(3, np.uint8),
                                           np.array(5, np.uint8)],
           {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]}, opset=10),
    single("QLinearConv", "QLinearConv",
           [Inp((1, 3, 5, 5), U8), f32(0.05), np.array(10, np.uint8), Inp((4, 3, 2, 2), U8), f32(0.03),
            np.array(128, np.uint8), f32(0.7), np.array(100, np.uint8), np.array([5, -400, 0, 90], np.int32)],
           {"pads": [0, 1, 1, 0]}, opset=10),
    single("DynamicQuantizeLinear", "DynamicQuantizeLinear", [Inp((3, 7), F, "wide")], n_out=3, opset=11),
)

GROUPS = chunk_groups(CASES, 64, by_opset=True)


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> GroupRunner:
    return GroupRunner(tmp_path_factory, GROUPS)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_op(case: Case, runner: GroupRunner) -> None:
    runner.check(case)


# -- hostile run-time data under ASan/UBSan: NaN/huge coordinates, repeated indices ----------------------
def _special(shape: tuple[int, ...], seed: int) -> np.ndarray:
    vals = np.resize(np.random.default_rng(seed).permutation(SPECIAL_F32), int(np.prod(shape)))
    return vals.reshape(shape).astype(np.float32)


def _hostile() -> tuple[list, dict[str, np.ndarray]]:
    nodes, feeds = [], {}
    for k, (mode, pad) in enumerate((m, p) for m in ("bilinear", "nearest", "bicubic")
                                    for p in ("zeros", "border", "reflection")):
        feeds[f"gx{k}"] = np.arange(2 * 3 * (k % 2 + 1) * 4, dtype=np.float32).reshape(2, 3, k % 2 + 1, 4)
        feeds[f"gg{k}"] = _special((2, 5, 3, 2), k)
        nodes.append(helper.make_node("GridSample", [f"gx{k}", f"gg{k}"], [f"gy{k}"], mode=mode, padding_mode=pad,
                                      align_corners=k % 2))
    feeds["rx"] = np.ones((2, 3, 6, 5), np.float32)
    feeds["rr"] = _special((6, 4), 1)
    feeds["rb"] = i64(1, 0, 1, 1, 0, 0)  # out of range: tests/test_hardening_kernels.py
    for k, mode in enumerate(("avg", "max")):
        nodes.append(helper.make_node("RoiAlign", ["rx", "rr", "rb"], [f"ry{k}"], mode=mode, output_height=2,
                                      output_width=3))
    feeds["ux"] = np.ones((1, 2, 3, 3), np.float32)
    feeds["ui"] = np.array([0, 0, 5, 71, 70, 35, 3, 3, 3] * 2, np.int64).reshape(1, 2, 3, 3)
    nodes.append(helper.make_node("MaxUnpool", ["ux", "ui"], ["uy"], kernel_shape=[2, 2], strides=[2, 2]))
    for k, op in enumerate(("RNN", "GRU", "LSTM")):
        g = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
        feeds[f"sx{k}"] = _special((4, 3, 9), k)
        feeds[f"sw{k}"] = _w(f"sw{k}", 2, g * 10, 9)
        feeds[f"sr{k}"] = _w(f"sr{k}", 2, g * 10, 10)
        feeds[f"sl{k}"] = np.array([0, 2, 4], np.int32)
        nodes.append(helper.make_node(op, [f"sx{k}", f"sw{k}", f"sr{k}", "", f"sl{k}"],
                                      [f"sy{k}", f"sh{k}"], hidden_size=10, direction="bidirectional", clip=3.0))
    feeds["dx"] = np.ones((1, 2, 4, 4), np.float32)
    feeds["dw"] = np.ones((2, 2, 2, 2), np.float32)
    feeds["do"] = _special((1, 8, 3, 3), 3)
    nodes.append(helper.make_node("DeformConv", ["dx", "dw", "do"], ["dy"]))
    feeds["qx"] = _special((4, 6), 4)
    nodes.append(helper.make_node("DynamicQuantizeLinear", ["qx"], ["qy", "qs", "qz"]))
    feeds["ma"] = np.full((2, 3), 255, np.uint8)
    feeds["mb"] = np.full((3, 2), 255, np.uint8)
    feeds["ms"] = f32(0.0)
    nodes.append(helper.make_node("QLinearMatMul", ["ma", "ms", "mz", "mb", "ms", "mz", "ms", "mz"], ["my"]))
    feeds["mz"] = np.array(3, np.uint8)
    return nodes, feeds


def test_hostile_inputs_run_clean_under_sanitizers(tmp_path) -> None:
    """NaN/inf/huge grid, roi and offset coordinates, repeated unpool indices, empty and full sequence
    lengths, zero scales: no out-of-bounds access and no undefined behaviour. (Out-of-range indices and
    lengths are errors: tests/test_hardening_kernels.py.)"""
    from aotc.compiler import compile_model

    require_sanitizers(tmp_path)
    nodes, feeds = _hostile()
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outs = [o for n in nodes for o in n.output]
    graph = helper.make_graph(nodes, "h", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    # float-cast-overflow is not part of "undefined": a NaN or huge coordinate turned integer is.
    flags = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer", "-O1"]
    res = compile_model(model, tmp_path, "m", extra_cflags=flags)
    loads = []
    for i, (name, v) in enumerate(feeds.items()):
        (tmp_path / f"in{i}.bin").write_bytes(np.ascontiguousarray(v).tobytes())
        loads.append(f'  in[{i}] = load("{tmp_path / f"in{i}.bin"}", {v.nbytes}); (void)"{name}";')
    allocs = [f"  out[{j}] = malloc({max(v.nbytes, 1)});" for j, v in enumerate(res.graph.outputs)]
    app = "\n".join([
        "#include <stdio.h>", "#include <stdlib.h>", '#include "m.h"',
        "static void *load(const char *path, size_t n) {",
        "  void *p = malloc(n ? n : 1); FILE *f = fopen(path, \"rb\");",
        "  if (!f || fread(p, 1, n, f) != n) exit(2);",
        "  fclose(f); return p;", "}",
        "int main(void) {",
        f"  const void *in[{len(feeds)}]; void *out[{len(allocs)}];", *loads, *allocs,
        "  void *ws = aligned_alloc(64, (m_workspace_size() + 63) / 64 * 64 + 64);",
        "  const int rc = m_run_v((const void *const *)in, (void *const *)out, ws);",
        f"  for (size_t i = 0; i < {len(feeds)}; i++) free((void *)in[i]);",
        f"  for (size_t i = 0; i < {len(allocs)}; i++) free(out[i]);",
        "  free(ws);", "  return rc;", "}"])
    run_c_program_under_sanitizers(tmp_path, app, "libm.a", flags)
