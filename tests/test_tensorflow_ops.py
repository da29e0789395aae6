"""TensorFlow frontend on hand-made GraphDefs (no TensorFlow needed): function inlining details, the
Einsum forms that stay ONNX Einsum, and the errors of the newer op translations."""

from __future__ import annotations

import numpy as np
import pytest
from tf_graphs import dt_float, graphdef, shape

import aotc
from aotc.compiler import compile_model
from aotc.config import parse_config
from aotc.errors import AotcError
from aotc.frontends.tensorflow import import_graphdef


def _ints(*values):
    def fill(a):
        a.tensor.dtype = 3  # DT_INT32
        a.tensor.tensor_shape.dim.add(size=len(values))
        a.tensor.int_val.extend(values)
    return fill


def _set(field, value):
    return lambda a: setattr(a, field, value)


def _run(gd, outputs, feeds, tmp_path):
    graph = import_graphdef(gd, outputs=outputs)
    return aotc.load(compile_model(graph, tmp_path, "m").prefix).run(feeds)


def test_inlined_call_reads_the_second_output_argument(tmp_path):
    # Inside a function, TopKV2's indices are "top:indices:0"; in the flat graph they are output 1.
    gd = graphdef(("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(2, 5)}),
                ("call", "PartitionedCall", ["x"], {"f": lambda a: setattr(a.func, "name", "pick")}))
    f = gd.library.function.add()
    f.signature.name = "pick"
    f.signature.input_arg.add(name="x", type=1)
    f.signature.output_arg.add(name="idx", type=3)
    f.signature.output_arg.add(name="val", type=1)
    k = f.node_def.add(name="k", op="Const")
    _ints(2)(k.attr["value"])
    k.attr["dtype"].type = 3
    f.node_def.add(name="top", op="TopKV2", input=["x", "k:output:0"])
    f.ret["idx"] = "top:indices:0"
    f.ret["val"] = "top:values:0"
    x = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.float32)
    idx, val = _run(gd, ["call", "call:1"], [x], tmp_path)
    np.testing.assert_array_equal(idx, [[4, 2], [0, 2]])
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(val, [[5, 4], [9, 6]])


def test_recursive_function_is_refused():
    gd = graphdef(("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(2)}),
                ("call", "PartitionedCall", ["x"], {"f": lambda a: setattr(a.func, "name", "loop")}))
    f = gd.library.function.add()
    f.signature.name = "loop"
    f.signature.input_arg.add(name="x", type=1)
    f.signature.output_arg.add(name="y", type=1)
    f.node_def.add(name="again", op="loop", input=["x"])
    f.ret["y"] = "again:y:0"
    from aotc.frontends.tensorflow.inline import inline_functions

    with pytest.raises(AotcError, match=r"function 'loop' calls itself \(through loop\)"):
        inline_functions(gd)


@pytest.mark.parametrize(("equation", "shapes"), [("ii->i", [(3, 3)]), ("bij,bjk->bik", [(1, 2, 3), (2, 3, 4)])])
def test_einsum_outside_the_matmul_form_stays_einsum(tmp_path, equation, shapes):
    # A repeated letter (a diagonal) and a broadcast batch letter: ONNX Einsum's loop nest.
    names = [f"x{i}" for i in range(len(shapes))]
    gd = graphdef(*[(n, "Placeholder", [], {"dtype": dt_float, "shape": shape(*s)})
                  for n, s in zip(names, shapes, strict=True)],
                ("e", "Einsum", names, {"equation": _set("s", equation.encode())}))
    graph = import_graphdef(gd)
    assert [n.op for n in graph.nodes] == ["Einsum"]
    xs = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in shapes]
    (got,) = aotc.load(compile_model(graph, tmp_path, "m").prefix).run(xs)
    np.testing.assert_allclose(got, np.einsum(equation, *xs), rtol=1e-5, atol=1e-5)


def test_einsum_as_matmul_sums_letters_only_one_operand_has(tmp_path):
    gd = graphdef(("a", "Placeholder", [], {"dtype": dt_float, "shape": shape(2, 3, 4)}),
                ("b", "Placeholder", [], {"dtype": dt_float, "shape": shape(4, 5)}),
                ("e", "Einsum", ["a", "b"], {"equation": _set("s", b"xyk,kz->zy")}))
    graph = import_graphdef(gd)
    assert "MatMul" in [n.op for n in graph.nodes] and "Einsum" not in [n.op for n in graph.nodes]
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    (got,) = aotc.load(compile_model(graph, tmp_path, "m").prefix).run([a, b])
    np.testing.assert_allclose(got, np.einsum("xyk,kz->zy", a, b), rtol=1e-5, atol=1e-5)


def _paddings(*rows):
    def fill(a):
        a.tensor.dtype = 3
        a.tensor.tensor_shape.dim.add(size=len(rows))
        a.tensor.tensor_shape.dim.add(size=2)
        a.tensor.int_val.extend(v for r in rows for v in r)
    return fill


@pytest.mark.parametrize(("node", "message"), [
    (("p", "MirrorPad", ["x", "pads"], {"mode": _set("s", b"REFLECT")}),
     r"^MirrorPad node 'p': paddings \[\[0, 0\], \[4, 0\]\] must be \(2, 2\) values from 0 to each dimension's "
     r"size - 1 for an input of shape \[2, 4\]$"),
    (("p", "MirrorPad", ["x", "pads"], {"mode": _set("s", b"EDGE")}),
     r"^MirrorPad node 'p': mode 'EDGE' is not supported \(REFLECT or SYMMETRIC\)$"),
    (("r", "ResizeBilinear", ["img", "size"], {"align_corners": _set("b", True),
                                               "half_pixel_centers": _set("b", True)}),
     r"^ResizeBilinear node 'r': align_corners and half_pixel_centers cannot both be true$"),
    (("t", "TopKV2", ["x", "k9"], {}), r"^TopKV2 node 't': k=9 is out of range for an input of shape \[2, 4\]$"),
])
def test_op_errors_name_the_node_and_value(node, message):
    gd = graphdef(("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(2, 4)}),
                ("img", "Placeholder", [], {"dtype": dt_float, "shape": shape(1, 2, 2, 1)}),
                ("pads", "Const", [], {"value": _paddings((0, 0), (4, 0)), "dtype": _set("type", 3)}),
                ("size", "Const", [], {"value": _ints(3, 3), "dtype": _set("type", 3)}),
                ("k9", "Const", [], {"value": _ints(9), "dtype": _set("type", 3)}), node)
    with pytest.raises(AotcError, match=message):
        import_graphdef(gd, outputs=[node[0]])


def test_conv2d_backprop_input_with_sizes_the_input_cannot_give():
    def ints_attr(*v):
        return lambda a: a.list.i.extend(v)

    gd = graphdef(("dy", "Placeholder", [], {"dtype": dt_float, "shape": shape(1, 2, 2, 3)}),
                ("w", "Const", [], {"value": lambda a: (setattr(a.tensor, "dtype", 1),
                                                        [a.tensor.tensor_shape.dim.add(size=d) for d in (3, 3, 4, 3)]),
                                    "dtype": dt_float}),
                ("sizes", "Const", [], {"value": _ints(1, 9, 9, 4), "dtype": _set("type", 3)}),
                ("t", "Conv2DBackpropInput", ["sizes", "w", "dy"], {"strides": ints_attr(1, 2, 2, 1),
                                                                     "padding": _set("s", b"SAME")}))
    with pytest.raises(AotcError, match=r"^Conv2DBackpropInput node 't': input_sizes \[1, 9, 9, 4\] do not fit an "
                                        r"input of shape \[1, 2, 2, 3\] with strides \[2, 2\] and padding SAME$"):
        import_graphdef(gd, outputs=["t"])


def test_variable_updates_dropped_unless_a_fetch_depends_on_them():
    from aotc.frontends.tensorflow import summarize

    var = {"dtype": dt_float, "shape": shape(2), "shared_name": _set("s", b"v")}
    nodes = [("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(2)}),
             ("v", "VarHandleOp", [], var), ("set", "AssignVariableOp", ["v", "x"], {}),
             ("y", "Relu", ["x"], {})]
    graph = import_graphdef(graphdef(*nodes), outputs=["y"])  # the update is dropped
    assert [n.op for n in graph.nodes] == ["Relu"] and not graph.updates
    assert summarize(graphdef(*nodes)).ops["AssignVariableOp"] == (1, True)
    ordered = [*nodes[:3], ("y", "Relu", ["x", "^set"], {})]
    with pytest.raises(AotcError, match=r"^VarHandleOp node 'v' is a variable, and the graph holds no value for "
                                        r"it: compile the SavedModel, freeze the graph, or make it an argument "
                                        r"\(a config `variable` entry\)$"):
        import_graphdef(graphdef(*ordered), outputs=["y"])
    config = parse_config('fetch { id { node_name: "y" } } variable { node_name: "v" }')
    graph = import_graphdef(graphdef(*ordered), config=config)  # now an in-place argument
    assert [v.name for v in graph.inputs] == ["x", "v"] and graph.updates == [graph.inputs[1]]
    assert graph.outputs[-1] is graph.inputs[0]  # v's new value is x
    read = [*nodes[:2], ("r", "ReadVariableOp", ["v"], {}), ("y", "Relu", ["r"], {})]
    with pytest.raises(AotcError, match=r"^VarHandleOp node 'v' is a variable, and the graph holds no value for "
                                        r"it: compile the SavedModel, freeze the graph, or make it an argument "
                                        r"\(a config `variable` entry\)$"):
        import_graphdef(graphdef(*read), outputs=["y"])
