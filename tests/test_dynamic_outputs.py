"""Ops whose output size depends on the data (NonZero, Unique, NonMaxSuppression): the C library
returns them at their upper bound plus an int64 count output each; the bindings trim them to
ONNX's shapes. Compared with onnx.reference, including the empty and degenerate results."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import run_generated_test_under_sanitizers

from aotc.cli import main as cli_main
from aotc.compiler import compile_model
from aotc.errors import AotcError

OPSET = 19
F, I64, I32, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1"]

INPUTS = {"x": (F, (2, 3, 4)), "b": (B, (5,)), "k": (I32, (3, 2)), "u": (F, (10,)), "v": (I64, (3, 4, 2)),
          "boxes": (F, (2, 6, 4)), "scores": (F, (2, 2, 6)), "iou": (F, (1,)), "smin": (F, (1,)),
          "cboxes": (F, (1, 5, 4)), "cscores": (F, (1, 1, 5))}
MAX_BOXES = helper.make_tensor("max_boxes", I64, [1], [3])
NODES = [
    helper.make_node("NonZero", ["x"], ["nz_x"]),
    helper.make_node("NonZero", ["b"], ["nz_b"]),
    helper.make_node("NonZero", ["k"], ["nz_k"]),
    helper.make_node("Unique", ["u"], ["uy", "ui", "uinv", "uc"]),
    helper.make_node("Unique", ["u"], ["fy", "fi", "finv", "fc"], sorted=0),
    helper.make_node("Unique", ["v"], ["ay", "ai", "ainv", "ac"], axis=1),
    helper.make_node("Unique", ["v"], ["ny", "ni", "ninv", "nc"], axis=-1),
    helper.make_node("Unique", ["v"], ["zy", "zi", "zinv", "zc"], axis=0, sorted=0),
    helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "smin"], ["sel"]),
    helper.make_node("NonMaxSuppression", ["cboxes", "cscores", "max_boxes", "iou"], ["csel"],
                     center_point_box=1),
]
OUTPUTS = ["nz_x", "nz_b", "nz_k", "uy", "ui", "uinv", "uc", "fy", "fi", "finv", "fc", "ay", "ai", "ainv", "ac",
           "ny", "ni", "ninv", "nc", "zy", "zi", "zinv", "zc", "sel", "csel"]


def _model(nodes=NODES, inputs=INPUTS, outputs=OUTPUTS, inits=(MAX_BOXES,)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 8, (2, 6, 2)).astype(np.float32)
    size = rng.uniform(0.5, 4, (2, 6, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + size], axis=2)
    boxes[..., [0, 2]] = boxes[..., [2, 0]] if seed % 2 else boxes[..., [0, 2]]  # either corner first
    return {"x": (rng.integers(0, 3, (2, 3, 4)) * (rng.random((2, 3, 4)) < 0.4)).astype(np.float32),
            "b": rng.random(5) < 0.5, "k": rng.integers(-1, 2, (3, 2)).astype(np.int32),
            "u": rng.integers(-3, 3, 10).astype(np.float32), "v": rng.integers(0, 2, (3, 4, 2)),
            "boxes": boxes, "scores": rng.choice([0.1, 0.5, 0.7, 0.9], (2, 2, 6)).astype(np.float32),
            "iou": np.array([rng.choice([0.0, 0.3, 0.6])], np.float32),
            "smin": np.array([rng.choice([0.0, 0.4, 0.8])], np.float32),
            "cboxes": np.concatenate([rng.uniform(0, 5, (1, 5, 2)), rng.uniform(1, 3, (1, 5, 2))],
                                     axis=2).astype(np.float32),
            "cscores": rng.random((1, 1, 5)).astype(np.float32)}


def _edge_feeds() -> dict[str, np.ndarray]:
    """Nothing non-zero, one value repeated, no box above the score threshold."""
    feeds = _feeds(1)
    feeds.update(x=np.zeros((2, 3, 4), np.float32), b=np.zeros(5, bool), k=np.zeros((3, 2), np.int32),
                 u=np.full(10, 2.5, np.float32), v=np.ones((3, 4, 2), np.int64), smin=np.array([2.0], np.float32))
    return feeds


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic")
    res = compile_model(_model(), out, "dyn", extra_cflags=["-Wall", "-Wextra", "-Werror"])
    from aotc.bindings import load

    return res, load(res.prefix)


@pytest.mark.parametrize("feeds", [_feeds(0), _feeds(1), _feeds(2), _edge_feeds()],
                         ids=["seed0", "seed1", "seed2", "edge"])
def test_matches_reference(compiled, feeds) -> None:
    _, m = compiled
    assert [t.name for t in m.outputs] == OUTPUTS
    want = ReferenceEvaluator(_model()).run(None, feeds)
    for name, g, w in zip(OUTPUTS, m.run(feeds), want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_edge_results_are_empty(compiled) -> None:
    _, m = compiled
    got = dict(zip(OUTPUTS, m.run(_edge_feeds()), strict=True))
    assert got["nz_x"].shape == (3, 0) and got["nz_b"].shape == (1, 0)
    assert got["uy"].tolist() == [2.5] and got["uc"].tolist() == [10] and got["ay"].shape == (3, 1, 2)
    assert got["sel"].shape == (0, 3)


def test_count_outputs_in_the_c_api(compiled, tmp_path) -> None:
    """The raw C outputs: each bounded output at its bound, zeros past the count, the count after it."""
    res, m = compiled
    raw_names = [t.name for t in m.raw_outputs]
    assert raw_names[:2] == ["nz_x", "nz_x_count"] and raw_names[raw_names.index("uy") + 1] == "uy_count"
    assert "ui_count" not in raw_names and "uc_count" not in raw_names  # Unique's Y, indices, counts share one
    feeds = _feeds(0)
    raw = dict(zip(raw_names, m.run(feeds, raw=True), strict=True))
    want = dict(zip(OUTPUTS, ReferenceEvaluator(_model()).run(None, feeds), strict=True))
    n = int(raw["nz_x_count"])
    assert raw["nz_x"].shape == (3, 24) and n == want["nz_x"].shape[1]
    np.testing.assert_array_equal(raw["nz_x"][:, :n], want["nz_x"])
    assert not raw["nz_x"][:, n:].any()
    n = int(raw["uy_count"])
    assert n == len(want["uy"]) and not raw["uy"][n:].any() and not raw["uc"][n:].any()
    n = int(raw["sel_count"])
    assert raw["sel"].shape == (2 * 2 * 3, 3) and n == len(want["sel"]) and not raw["sel"][n:].any()

    meta = json.loads((res.out_dir / "dyn.json").read_text())
    entry = {o["name"]: o for o in meta["outputs"]}
    assert entry["nz_x"]["bounded"] == {"axis": 1, "count": "nz_x_count"}
    assert entry["ny"]["bounded"] == {"axis": 2, "count": "ny_count"}  # axis -1 of a rank-3 input
    assert entry["uy_count"]["count_for"] == ["uy", "ui", "uc"]
    header = (res.out_dir / "dyn.h").read_text()
    assert "valid extent along axis 1 in output 1" in header and "y[d * B + j]" in header

    # Caller-supplied buffers have the bound shapes; the results are views of their valid parts.
    bufs = [np.empty(t.shape, t.dtype) for t in m.outputs]
    got = m.run(feeds, out=bufs)
    assert got[0].base is bufs[0] and got[0].shape == want["nz_x"].shape
    np.testing.assert_array_equal(got[OUTPUTS.index("sel")], want["sel"])

    # `aotc run` writes the trimmed outputs.
    for k, x in feeds.items():
        np.save(tmp_path / f"{k}.npy", x)
    args = ["run", str(res.prefix), "--output-dir", str(tmp_path / "out")]
    args += [a for k in feeds for a in ("--input", f"{k}={tmp_path / k}.npy")]
    assert cli_main(args) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "sel.npy"), want["sel"])
    assert not (tmp_path / "out" / "sel_count.npy").exists()


def test_unsorted_unique_along_an_inner_axis(tmp_path) -> None:
    """sorted=0 with an axis other than 0, against numpy (onnx.reference takes the items along axis
    0 there), and a count name that the model already uses."""
    x = np.array([[3, 1, 3, 2, 1], [0, 5, 0, 4, 5]], np.float32)
    nodes = [helper.make_node("Unique", ["x"], ["y", "i", "inv", "c"], axis=1, sorted=0),
             helper.make_node("Identity", ["x"], ["y_count"])]
    model = _model(nodes, {"x": (F, (2, 5))}, ["y", "i", "inv", "c", "y_count"], ())
    res = compile_model(model, tmp_path, "u")
    from aotc.bindings import load

    m = load(res.prefix)
    assert [t.name for t in m.raw_outputs] == ["y", "y_count_2", "i", "inv", "c", "y_count"]
    y, i, inv, c, same = m.run({"x": x})
    np.testing.assert_array_equal(y, x[:, [0, 1, 3]])
    assert i.tolist() == [0, 1, 3] and inv.tolist() == [0, 1, 0, 2, 1] and c.tolist() == [2, 2, 1]
    np.testing.assert_array_equal(same, x)


def test_consumer_of_a_bounded_output_is_refused(tmp_path) -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="find"),
             helper.make_node("Transpose", ["nz"], ["t"], name="flip")]
    with pytest.raises(AotcError, match=r"NonZero node 'find'.*node 'flip' \(Transpose\) reads it"):
        compile_model(_model(nodes, {"x": (F, (3,))}, ["t"], ()), tmp_path, "m")
    # Unique's counts shares Y's length: it cannot be consumed either, while inverse_indices can.
    nodes = [helper.make_node("Unique", ["x"], ["y", "", "inv", "c"], name="uniq"),
             helper.make_node("Neg", ["c"], ["n"], name="neg")]
    with pytest.raises(AotcError, match="node 'neg'"):
        compile_model(_model(nodes, {"x": (F, (3,))}, ["y", "n"], ()), tmp_path, "m")


def test_nms_output_limit_must_be_constant(tmp_path) -> None:
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit"], ["sel"], name="nms")]
    inputs = {"boxes": (F, (1, 4, 4)), "scores": (F, (1, 1, 4)), "limit": (I64, (1,))}
    with pytest.raises(AotcError, match="'nms': max_output_boxes_per_class .* must be a compile-time constant"):
        compile_model(_model(nodes, inputs, ["sel"], ()), tmp_path, "m")


def test_sanitizers_run_clean(tmp_path) -> None:
    """The generated test program (reference outputs padded to the bounds) under ASan and UBSan."""
    run_generated_test_under_sanitizers(_model(), tmp_path)
