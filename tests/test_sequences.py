"""Sequences and optionals (aotc/frontends/sequences.py) against onnx.reference: each model is
compiled with its sequence inputs fed as ``x.0``, ``x.1``, ... and its sequence outputs read back
as ``y.0``, ``y.1``, ..., as the README's C API section describes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import run_generated_test_under_sanitizers

import aotc
from aotc.cli import main as cli_main

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(7)


def _seq_type(elem: int = F, shape: list | None = None) -> onnx.TypeProto:
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape))


def _model(nodes: list, inputs: list, outputs: list, inits: dict | None = None, opset: int = 17) -> onnx.ModelProto:
    """``inputs``/``outputs``: (name, TypeProto) pairs."""
    g = helper.make_graph(nodes, "g", [helper.make_value_info(n, t) for n, t in inputs],
                          [helper.make_value_info(n, t) for n, t in outputs],
                          [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _tensor(elem: int = F, shape: list | None = None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem, shape)


def _compile(model: onnx.ModelProto, tmp_path, shapes: dict) -> aotc.CompiledModel:
    return aotc.compile(model, out_dir=str(tmp_path), name="m", input_shapes=shapes)


def _check(model: onnx.ModelProto, feeds: dict, tmp_path, want: list | None = None, ort: bool = False) -> None:
    """aotc's outputs equal ``want`` (default: onnx.reference's, or onnxruntime's with ``ort``):
    sequences element by element, in their own dtype."""
    if want is None and ort:
        import onnxruntime

        want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    elif want is None:
        want = ReferenceEvaluator(model).run(None, feeds)
    flat, shapes = {}, {}
    for k, v in feeds.items():
        if v is None:
            shapes[k] = None
        elif isinstance(v, list):
            flat |= {f"{k}.{j}": e for j, e in enumerate(v)}
        else:
            flat[k] = v
    shapes |= {k: v.shape for k, v in flat.items()}
    m = _compile(model, tmp_path, shapes)
    got = dict(zip([t.name for t in m.outputs], m.run(flat), strict=True))
    expected = {}
    for vi, w in zip(model.graph.output, want, strict=True):
        expected |= {f"{vi.name}.{j}": e for j, e in enumerate(w)} if isinstance(w, list) else {vi.name: w}
    assert list(got) == list(expected)
    for name, w in expected.items():
        w = np.asarray(w)
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-6, err_msg=name)


def test_construct_insert_erase_at_concat(tmp_path):
    """Negative positions, defaults, a position computed from a shape, Concat with and without a new
    axis, SequenceLength, and a sequence output."""
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        helper.make_node("SequenceInsert", ["s", "c", "one"], ["s2"]),          # a c b
        helper.make_node("SequenceInsert", ["s2", "a"], ["s3"]),                # a c b a
        helper.make_node("SequenceErase", ["s3", "minus3"], ["s4"]),            # a b a
        helper.make_node("SequenceErase", ["s4"], ["s5"]),                      # a b
        helper.make_node("Shape", ["a"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),                # 2
        helper.make_node("Sub", ["rows", "three"], ["from_shape"]),             # -1
        helper.make_node("SequenceAt", ["s3", "from_shape"], ["last"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
        helper.make_node("ConcatFromSequence", ["s5"], ["stack"], axis=-1, new_axis=1),
        helper.make_node("SequenceLength", ["s3"], ["n"]),
    ]
    inits = {"one": np.array(1, np.int64), "minus3": np.array(-3, np.int64), "zero": np.array(0, np.int64),
             "three": np.array(3, np.int64)}
    model = _model(nodes, [(x, _tensor(F, [2, 3])) for x in "abc"],
                   [("last", _tensor()), ("cat", _tensor()), ("stack", _tensor()), ("n", _tensor(I64)),
                    ("s4", _seq_type())], inits)
    _check(model, {x: RNG.standard_normal((2, 3)).astype(np.float32) for x in "abc"}, tmp_path)


@pytest.mark.parametrize("opset", [11, 17])
def test_split_to_sequence(tmp_path, opset):
    """Split sizes given, a scalar chunk size (the last chunk shorter), none (keepdims on and off);
    opset 11 writes Split/Squeeze axes as attributes."""
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["by_sizes"], axis=1),
        helper.make_node("SplitToSequence", ["x", "chunk"], ["by_chunk"], axis=-1),
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
        helper.make_node("SplitToSequence", ["x"], ["rows_kept"], axis=0),
        helper.make_node("SequenceAt", ["by_chunk", "last"], ["tail"]),
    ]
    inits = {"sizes": np.array([1, 4], np.int64), "chunk": np.array(2, np.int64), "last": np.array(-1, np.int64)}
    model = _model(nodes, [("x", _tensor(F, [3, 5]))],
                   [("by_sizes", _seq_type()), ("by_chunk", _seq_type()), ("rows", _seq_type()),
                    ("rows_kept", _seq_type()), ("tail", _tensor())], inits, opset)
    _check(model, {"x": RNG.standard_normal((3, 5)).astype(np.float32)}, tmp_path)


def test_sequence_map_two_sequences(tmp_path):
    """SequenceMap over two sequence inputs and a tensor, elements of different shapes, a body with
    its own constant and a read of an outer tensor; sequence inputs and outputs at the C API.
    onnx.reference's SequenceMap takes two sequences or one sequence and tensors, so onnxruntime."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
         helper.make_node("Mul", ["u", "two"], ["u2"]),
         helper.make_node("Add", ["u2", "v"], ["sum"]),
         helper.make_node("Add", ["sum", "t"], ["out"]),
         helper.make_node("Sub", ["out", "outer"], ["out2"]),
         helper.make_node("Shape", ["u"], ["shape"])],
        "body", [helper.make_tensor_value_info(n, F, None) for n in ("u", "v", "t")],
        [helper.make_tensor_value_info("out2", F, None), helper.make_tensor_value_info("shape", I64, None)])
    nodes = [helper.make_node("Neg", ["t0"], ["outer"]),
             helper.make_node("SequenceMap", ["xs", "ys", "t0"], ["zs", "shapes"], body=body)]
    model = _model(nodes, [("xs", _seq_type()), ("ys", _seq_type()), ("t0", _tensor(F, [1]))],
                   [("zs", _seq_type()), ("shapes", _seq_type(I64))], opset=17)
    shapes = [(2, 3), (4, 1), (1, 1)]
    feeds = {"xs": [RNG.standard_normal(s).astype(np.float32) for s in shapes],
             "ys": [RNG.standard_normal(s).astype(np.float32) for s in shapes],
             "t0": np.array([0.5], np.float32)}
    _check(model, feeds, tmp_path, ort=True)


@pytest.mark.parametrize("present", [True, False])
def test_optionals(tmp_path, present):
    """An optional input present (a tensor input) or absent (its shape given as None), Optional,
    OptionalHasElement and OptionalGetElement, and an Identity of an optional. Expected values from
    numpy: onnx.reference's Optional wraps a tensor in a list, which OptionalGetElement keeps."""
    nodes = [
        helper.make_node("OptionalHasElement", ["opt"], ["has_input"]),
        helper.make_node("Optional", ["x"], ["wrapped"]),
        helper.make_node("Identity", ["wrapped"], ["same"]),
        helper.make_node("OptionalGetElement", ["same"], ["got"]),
        helper.make_node("Optional", [], ["empty"], type=_tensor(F, [2])),
        helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
        helper.make_node("OptionalHasElement", ["wrapped"], ["has_wrapped"]),
    ]
    outputs = [("has_input", _tensor(TensorProto.BOOL, [])), ("got", _tensor(F, [2])),
               ("has_empty", _tensor(TensorProto.BOOL, [])), ("has_wrapped", _tensor(TensorProto.BOOL, []))]
    if present:
        nodes.append(helper.make_node("OptionalGetElement", ["opt"], ["opt_value"]))
        nodes.append(helper.make_node("Relu", ["opt_value"], ["relu"]))
        outputs.append(("relu", _tensor(F, [2])))
    model = _model(nodes, [("opt", helper.make_optional_type_proto(_tensor(F, [2]))), ("x", _tensor(F, [2]))],
                   outputs, opset=18)
    opt, x = np.array([-1.0, 2.0], np.float32), np.array([3.0, -4.0], np.float32)
    want = [np.array(present), x, np.array(False), np.array(True)] + ([np.maximum(opt, 0)] if present else [])
    _check(model, {"opt": opt if present else None, "x": x}, tmp_path, want)


@pytest.mark.parametrize("cond", [True, False])
def test_if_over_sequences_at_run_time(tmp_path, cond):
    """An If whose condition is an input and whose branches give sequences of one length: it selects
    element by element."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["a"], [f"{name}_a"]),
                                  helper.make_node("SequenceConstruct", [f"{name}_a", "b"], [f"{name}_s"])],
                                 name, [], [helper.make_value_info(f"{name}_s", _seq_type())])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=branch("then", "Neg"), else_branch=branch("else", "Abs")),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [("c", _tensor(TensorProto.BOOL, [])), ("a", _tensor(F, [2])), ("b", _tensor(F, [2]))],
                   [("y", _tensor()), ("s", _seq_type())])
    feeds = {"c": np.array(cond), "a": np.array([1.5, -2.0], np.float32), "b": np.array([3.0, 4.0], np.float32)}
    _check(model, feeds, tmp_path)


def test_non_constant_position_is_refused(tmp_path):
    nodes = [helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
             helper.make_node("SequenceAt", ["s", "pos"], ["y"], name="pick")]
    model = _model(nodes, [("a", _tensor(F, [2])), ("pos", _tensor(I64, []))], [("y", _tensor(F, [2]))])
    with pytest.raises(aotc.AotcError, match=r"SequenceAt node 'pick': the position \('pos'\) must be a "
                                             r"compile-time constant"):
        _compile(model, tmp_path, {})


def test_edge_errors(tmp_path):
    """A sequence input without element shapes, an out-of-range position, an empty optional output,
    a run-time If between sequences of different lengths, a plain input declared absent."""
    ident = _model([helper.make_node("Identity", ["xs"], ["ys"])], [("xs", _seq_type())], [("ys", _seq_type())])
    with pytest.raises(aotc.AotcError, match=r"sequence input 'xs'.*xs\.0, xs\.1"):
        _compile(ident, tmp_path, {})
    at = _model([helper.make_node("SequenceAt", ["xs", "five"], ["y"], name="far")], [("xs", _seq_type())],
                [("y", _tensor())], {"five": np.array(5, np.int64)})
    with pytest.raises(aotc.AotcError, match="'far': position 5 is out of range for a sequence of 2"):
        _compile(at, tmp_path, {"xs.0": (2,), "xs.1": (2,)})
    empty = _model([helper.make_node("Optional", [], ["o"], type=_tensor(F, [2]))], [],
                   [("o", helper.make_optional_type_proto(_tensor(F, [2])))])
    with pytest.raises(aotc.AotcError, match="graph output 'o' is an empty optional"):
        _compile(empty, tmp_path, {})
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["a"], ["t"])], "then", [],
                             [helper.make_value_info("t", _seq_type())])
    other = helper.make_graph([helper.make_node("SequenceConstruct", ["a", "a"], ["e"])], "else", [],
                              [helper.make_value_info("e", _seq_type())])
    branches = _model([helper.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other)],
                      [("c", _tensor(TensorProto.BOOL, [])), ("a", _tensor(F, [2]))], [("s", _seq_type())])
    with pytest.raises(aotc.AotcError, match="sequence of 1 and a sequence of 2"):
        _compile(branches, tmp_path, {})
    relu = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", _tensor(F, [2]))], [("y", _tensor(F, [2]))])
    with pytest.raises(aotc.AotcError, match="input 'x' is not optional"):
        _compile(relu, tmp_path, {"x": None})


def test_inspect_counts_sequence_ops_as_supported(tmp_path, capsys):
    u, r = helper.make_tensor_value_info("u", F, None), helper.make_tensor_value_info("r", F, None)
    body = helper.make_graph([helper.make_node("Relu", ["u"], ["r"])], "body", [u], [r])
    nodes = [helper.make_node("SequenceMap", ["xs"], ["ys"], body=body),
             helper.make_node("SequenceAt", ["ys", "zero"], ["y"])]
    model = _model(nodes, [("xs", _seq_type(F, [3]))], [("y", _tensor(F, [3]))], {"zero": np.array(0, np.int64)})
    path = tmp_path / "seq.onnx"
    onnx.save(model, path)
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SequenceMap" in out and "SequenceAt" in out and "Relu" in out
    assert "unsupported: none" in out


def test_sanitizers_run_clean(tmp_path) -> None:
    """A model with sequence inputs and outputs, its generated test program under ASan and UBSan."""
    nodes = [helper.make_node("SequenceInsert", ["xs", "t", "zero"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=1, new_axis=1),
             helper.make_node("SplitToSequence", ["cat"], ["parts"], axis=0, keepdims=0)]
    model = _model(nodes, [("xs", _seq_type(F, [3, 2])), ("t", _tensor(F, [3, 2]))],
                   [("cat", _tensor()), ("parts", _seq_type())], {"zero": np.array(0, np.int64)})
    run_generated_test_under_sanitizers(model, tmp_path, input_shapes={"xs.0": (3, 2), "xs.1": (3, 2)})
