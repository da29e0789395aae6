"""Loop, Scan and If rewritten into static dataflow (frontends/control_flow.py), and FlexAttention's
modifier graphs expanded into primitive ops: compiled results against onnx.reference (onnxruntime
where the reference lacks a Scan feature), and the loops aotc must refuse."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import IR_VERSION, run_generated_test_under_sanitizers

import aotc
from aotc.errors import AotcError
from aotc.frontends.control_flow import inline_control_flow

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, shape, dt=F):
    return helper.make_tensor_value_info(name, dt, shape)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = IR_VERSION
    return m


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _check(model, feeds, tmp_path, name, reference="onnx", rtol=1e-5, atol=1e-6):
    """aotc's outputs against onnx.reference's (or onnxruntime's); no control flow left after inlining."""
    inlined = inline_control_flow(model, {k: v.shape for k, v in feeds.items()})
    assert not {n.op_type for n in inlined.graph.node} & {"If", "Loop", "Scan", "FlexAttention"}
    if reference == "onnx":
        want = ReferenceEvaluator(model).run(None, feeds)
    else:
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = aotc.compile(model, tmp_path / name, name=name).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _loop_body(cond_nodes=(), cond_out="cond_in"):
    """Carries acc (float[2]) += x * (i + 1); scans acc and i; cond_out from ``cond_nodes``."""
    nodes = [helper.make_node("Cast", ["i"], ["i_f"], to=F),
             _const("one", np.float32(1)),
             helper.make_node("Add", ["i_f", "one"], ["i1"]),
             helper.make_node("Mul", ["x", "i1"], ["step"]),    # x: read from the enclosing graph
             helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan_acc"]),
             helper.make_node("Identity", ["i"], ["scan_i"]),
             *cond_nodes,
             helper.make_node("Identity", [cond_out], ["cond_o"])]
    return helper.make_graph(nodes, "body", [_vi("i", [], I64), _vi("cond_in", [], B), _vi("acc_in", [2])],
                             [_vi("cond_o", [], B), _vi("acc_out", [2]), _vi("scan_acc", [2]),
                              _vi("scan_i", [], I64)])


def _loop_model(trip, cond, body, dynamic_cond=False):
    inits = [numpy_helper.from_array(np.zeros(2, np.float32), "acc0")]
    inputs = [_vi("x", [2])]
    if trip is not None:
        inits.append(numpy_helper.from_array(np.array(trip, np.int64), "trip"))
    if dynamic_cond:
        inputs.append(_vi("cond", [], B))
    else:
        inits.append(numpy_helper.from_array(np.array(cond), "cond"))
    loop = helper.make_node("Loop", ["trip" if trip is not None else "", "cond", "acc0"],
                            ["acc", "accs", "iters"], body=body)
    return _model([loop], inputs, [_vi("acc", [2]), _vi("accs", None), _vi("iters", None, I64)], inits)


def test_loop_with_static_trip_count_and_scan_outputs(tmp_path):
    x = np.array([1.5, -2.0], np.float32)
    # onnxruntime: onnx.reference stacks scalar scan values with np.vstack, into shape (4, 1).
    _check(_loop_model(4, True, _loop_body()), {"x": x}, tmp_path, "loop", reference="ort")


def test_loop_ends_when_its_condition_becomes_false(tmp_path):
    # cond_out = i < 2: three iterations of a trip count of 10; with no trip count the same.
    body = _loop_body([_const("two", np.int64(2)), helper.make_node("Less", ["i", "two"], ["lt"])], "lt")
    x = np.array([1.0, 3.0], np.float32)
    _check(_loop_model(10, True, body), {"x": x}, tmp_path, "early", reference="ort")
    inlined = inline_control_flow(_loop_model(None, True, body))
    assert sum(n.op_type == "Less" for n in inlined.graph.node) == 3
    # A false condition from the start runs no iteration: the carried values come out as they went in.
    m = aotc.compile(_model([helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=helper.make_graph(
        [helper.make_node("Neg", ["v"], ["w"]), helper.make_node("Identity", ["c"], ["c_o"])], "b",
        [_vi("i", [], I64), _vi("c", [], B), _vi("v", [2])], [_vi("c_o", [], B), _vi("w", [2])]))],
        [_vi("x", [2])], [_vi("y", [2])], [numpy_helper.from_array(np.array(5, np.int64), "trip"),
                                           numpy_helper.from_array(np.array(False), "cond")]),
        tmp_path / "none", name="none")
    np.testing.assert_array_equal(m.run({"x": x})[0], x)


@pytest.mark.parametrize(("model", "message"), [
    (_loop_model(3, True, _loop_body(), dynamic_cond=True), "condition .* only known at run time"),
    (_loop_model(10**9, True, _loop_body()), "exceeds"),
    (_loop_model(None, True, _loop_body()), "never ends"),
    # The body's condition reads a run-time value.
    (_loop_model(5, True, _loop_body([_const("z", np.float32(0)),
                                      helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
                                      helper.make_node("Greater", ["s", "z"], ["gt"])], "gt")),
     "condition after an iteration .* only known at run time"),
])
def test_loops_aotc_cannot_unroll_are_refused(model, message):
    t0 = time.perf_counter()
    with pytest.raises(AotcError, match=message):
        inline_control_flow(model)
    assert time.perf_counter() - t0 < 5  # refused up front, not after unrolling for a while


def test_loop_without_trip_count_is_capped():
    # cond_out = i < 10**9: the condition is static but would take 10**9 iterations.
    body = _loop_body([_const("big", np.int64(10**9)), helper.make_node("Less", ["i", "big"], ["lt"])], "lt")
    with pytest.raises(AotcError, match="exceeds"):
        inline_control_flow(_loop_model(None, True, body))


def _scan_model(opset=16, in_axes=(0, 1), in_dirs=(0, 1), out_axes=(0, -1), out_dirs=(0, 1)):
    """A running sum over rows of a (scanned along axis 0) and columns of b (axis 1, reversed)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a_t"], ["s1"]),
         helper.make_node("Mul", ["s1", "b_t"], ["s_out"]),
         helper.make_node("Sub", ["s_out", "bias"], ["y1"]),  # bias: read from the enclosing graph
         helper.make_node("Identity", ["a_t"], ["y2"])],
        "body", [_vi("s_in", [3]), _vi("a_t", [3]), _vi("b_t", [3])],
        [_vi("s_out", [3]), _vi("y1", [3]), _vi("y2", [3])])
    scan = helper.make_node("Scan", ["s0", "a", "b"], ["s", "y1s", "y2s"], body=body, num_scan_inputs=2,
                            scan_input_axes=list(in_axes), scan_input_directions=list(in_dirs),
                            scan_output_axes=list(out_axes), scan_output_directions=list(out_dirs))
    return _model([_const("bias", np.float32([0.5, 0, -1])), scan],
                  [_vi("s0", [3]), _vi("a", [4, 3]), _vi("b", [3, 4])],
                  [_vi("s", [3]), _vi("y1s", None), _vi("y2s", None)], opsets=(("", opset),))


@pytest.mark.parametrize(("opset", "in_axes", "in_dirs", "out_axes", "out_dirs"), [
    (16, (0, 1), (0, 1), (0, -1), (0, 1)),
    (9, (0, -1), (1, 0), (1, 0), (1, 0)),  # opset 9: Unsqueeze takes its axes as an attribute
])
def test_scan_with_axes_and_directions(tmp_path, opset, in_axes, in_dirs, out_axes, out_dirs):
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32), "a": rng.standard_normal((4, 3)).astype(np.float32),
             "b": rng.standard_normal((3, 4)).astype(np.float32)}
    _check(_scan_model(opset, in_axes, in_dirs, out_axes, out_dirs), feeds, tmp_path, f"scan{opset}",
           reference="ort")


def test_scan8_batched_with_directions(tmp_path):
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y"])],
                             "body", [_vi("s_in", [2]), _vi("x_t", [2])], [_vi("s_out", [2]), _vi("y", [2])])
    scan = helper.make_node("Scan", ["", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])
    model = _model([scan], [_vi("s0", [3, 2]), _vi("x", [3, 4, 2])], [_vi("s", [3, 2]), _vi("ys", [3, 4, 2])],
                   opsets=(("", 8),))
    rng = np.random.default_rng(1)
    feeds = {"s0": rng.standard_normal((3, 2)).astype(np.float32),
             "x": rng.standard_normal((3, 4, 2)).astype(np.float32)}
    _check(model, feeds, tmp_path, "scan8", reference="ort")


def test_nested_loop_inside_if_decided_by_shapes(tmp_path):
    """The If's condition is Size(x) == 6, known once shapes are: only the taken branch is built (the
    other's Reshape target depends on x's values). The branch holds a Loop whose body holds another
    Loop reading the outer loop's iteration number and a value of the branch."""
    inner = helper.make_graph(
        [helper.make_node("Cast", ["j"], ["j_f"], to=F), helper.make_node("Cast", ["oi"], ["oi_f"], to=F),
         helper.make_node("Mul", ["j_f", "oi_f"], ["p"]), helper.make_node("Add", ["v", "p"], ["v1"]),
         helper.make_node("Add", ["v1", "t"], ["v_out"]),  # t: defined in the If branch
         helper.make_node("Identity", ["c"], ["c_out"])],
        "inner", [_vi("j", [], I64), _vi("c", [], B), _vi("v", [6])], [_vi("c_out", [], B), _vi("v_out", [6])])
    outer = helper.make_graph(
        [_const("two", np.int64(2)),
         helper.make_node("Loop", ["two", "", "w"], ["w1"], body=inner),
         helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["w1"], ["w_scan"])],
        "outer", [_vi("oi", [], I64), _vi("c", [], B), _vi("w", [6])],
        [_vi("c_out", [], B), _vi("w1", [6]), _vi("w_scan", [6])])
    then = helper.make_graph(
        [helper.make_node("Reshape", ["x", "flat"], ["t"]), _const("three", np.int64(3)),
         helper.make_node("Loop", ["three", "", "t"], ["r", "rs"], body=outer),
         helper.make_node("ReduceSum", ["rs", "axes0"], ["y_then"], keepdims=0)],
        "then", [], [_vi("y_then", [6])])
    other = helper.make_graph(
        [helper.make_node("Reshape", ["x", "flat"], ["xf"]), helper.make_node("Cast", ["xf"], ["xi"], to=I64),
         helper.make_node("Slice", ["xi", "axes0", "one"], ["first"]), helper.make_node("Abs", ["first"], ["shape"]),
         helper.make_node("Reshape", ["x", "shape"], ["y_else"])],
        "else", [], [_vi("y_else", [6])])
    nodes = [helper.make_node("Size", ["x"], ["n"]), _const("six", np.int64(6)),
             helper.make_node("Equal", ["n", "six"], ["is6"]),
             _const("flat", np.array([6], np.int64)), _const("axes0", np.array([0], np.int64)),
             _const("one", np.array([1], np.int64)),
             helper.make_node("If", ["is6"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [6])])
    _check(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, tmp_path, "nested", reference="ort")
    assert "Abs" not in {n.op_type for n in inline_control_flow(model).graph.node}


def _flex_model(score_mod=None, prob_mod=None, hq=4, hkv=2, scale=None):
    attrs = {k: v for k, v in (("score_mod", score_mod), ("prob_mod", prob_mod), ("scale", scale)) if v is not None}
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", **attrs)
    return _model([node], [_vi("q", [2, hq, 5, 8]), _vi("k", [2, hkv, 6, 8]), _vi("v", [2, hkv, 6, 3])],
                  [_vi("y", [2, hq, 5, 3])], opsets=(("", 26), ("ai.onnx.preview", 1)))


def _causal_mod():
    """Scores where the key index exceeds the query index (+1) set to -inf, positions built from the
    scores' shape."""
    nodes = [helper.make_node("Shape", ["s"], ["shp"]),
             _const("i2", np.int64(2)), _const("i3", np.int64(3)), _const("z", np.int64(0)), _const("o", np.int64(1)),
             helper.make_node("Gather", ["shp", "i2"], ["L"], axis=0),
             helper.make_node("Gather", ["shp", "i3"], ["S"], axis=0),
             helper.make_node("Range", ["z", "L", "o"], ["qr"]), helper.make_node("Range", ["z", "S", "o"], ["kr"]),
             _const("col", np.array([-1, 1], np.int64)),
             helper.make_node("Reshape", ["qr", "col"], ["qi"]), helper.make_node("Add", ["qi", "o"], ["qi1"]),
             helper.make_node("Greater", ["kr", "qi1"], ["masked"]),
             _const("ninf", np.float32(-np.inf)),
             helper.make_node("Where", ["masked", "ninf", "s"], ["s_out"])]
    return helper.make_graph(nodes, "causal", [_vi("s", ["B", "H", "L", "S"])], [_vi("s_out", ["B", "H", "L", "S"])])


def test_flex_attention_with_modifier_graphs(tmp_path):
    prob = helper.make_graph([_const("half", np.float32(0.5)), helper.make_node("Pow", ["p", "half"], ["p_out"])],
                             "sqrt_probs", [_vi("p", ["B", "H", "L", "S"])], [_vi("p_out", ["B", "H", "L", "S"])])
    rng = np.random.default_rng(2)
    feeds = {"q": rng.standard_normal((2, 4, 5, 8)).astype(np.float32),
             "k": rng.standard_normal((2, 2, 6, 8)).astype(np.float32),
             "v": rng.standard_normal((2, 2, 6, 3)).astype(np.float32)}
    _check(_flex_model(_causal_mod(), prob, scale=0.3), feeds, tmp_path, "flex_both")
    _check(_flex_model(_causal_mod()), feeds, tmp_path, "flex_score")
    # Without modifier graphs the native kernel runs it: nothing to expand.
    plain = _flex_model()
    assert inline_control_flow(plain) is plain


def test_sanitizers_run_clean(tmp_path):
    """An unrolled Scan (slices at constant indices, stacked outputs) next to a FlexAttention with a
    causal score_mod (-inf scores), run by the generated test program under ASan and UBSan."""
    scan, flex = _scan_model(), _flex_model(_causal_mod())
    g = helper.make_graph([*scan.graph.node, *flex.graph.node], "both", [*scan.graph.input, *flex.graph.input],
                          [*scan.graph.output, *flex.graph.output])
    model = helper.make_model(g, opset_imports=list(flex.opset_import))
    model.ir_version = IR_VERSION
    run_generated_test_under_sanitizers(model, tmp_path)
