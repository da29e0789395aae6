"""The layout pass (aotc/passes/layout.py): Transposes sink through layout-agnostic ops until inverse
pairs cancel. Each graph is checked twice against onnxruntime: the graph after the pass (written back
as ONNX) must give the original model's outputs, and one compile checks the generated C; the Keras
fixtures' kernel counts pin what the pass buys on TensorFlow's NHWC graphs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import init, make, vi
from onnx import TensorProto, helper

import aotc
from aotc.compiler import compile_model
from aotc.frontends.onnx import import_onnx
from aotc.ir.graph import Graph
from aotc.passes.pipeline import DEFAULT_PASSES, run_passes
from aotc.reference import to_onnx

TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
N, H, W, C = 2, 5, 6, 4
PASSES = {p.name: p for p in DEFAULT_PASSES}
node = helper.make_node


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed + len(shape)).standard_normal(shape) * 0.5).astype(np.float32)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime without its graph optimizations: its own transpose optimizer (1.31) mis-rewrites a
    Pad with an axes input behind a Transpose (a Gather out of range), and the reference should be the
    ops as written anyway."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def after_layout(model: onnx.ModelProto) -> Graph:
    """``model`` imported and run through the pipeline up to the layout pass; the graph then, written
    back as ONNX, gives onnxruntime's outputs for the model itself."""
    graph = import_onnx(model)
    run_passes(graph, [PASSES[p] for p in ("prune", "propagate", "patterns", "layout")])
    feeds = _feeds(model)
    want = run_ort(model, feeds)
    got = run_ort(to_onnx(graph), {f"in{i}": feeds[v.name] for i, v in enumerate(graph.inputs)})
    for g, w, o in zip(got, want, model.graph.output, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, o.name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=o.name)
    return graph


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def conv(x: str, out: str, cin: int, cout: int, group: int = 1) -> tuple[list[onnx.NodeProto], list]:
    """An NCHW Conv wrapped in Transposes, as the TensorFlow frontend and tf2onnx write one on NHWC."""
    w = init(f"{out}_w", _rand(cout, cin // group, 3, 3, seed=cout))
    return [node("Transpose", [x], [f"{out}_nchw"], perm=TO_NCHW),
            node("Conv", [f"{out}_nchw", w.name], [f"{out}_y"], pads=[1, 1, 1, 1], group=group),
            node("Transpose", [f"{out}_y"], [out], perm=TO_NHWC)], [w]


def conv_block() -> onnx.ModelProto:
    """Conv, bias, folded BatchNorm, Relu6, depthwise conv, swish with a scalar beta: Keras' CNN layers."""
    n1, w1 = conv("x", "c1", C, 8)
    n2, w2 = conv("r6", "c2", 8, 8, group=8)
    consts = [init("bias", _rand(8)), init("scale", _rand(8) + 1), init("shift", _rand(8)),
              init("lo", np.float32(0)), init("hi", np.float32(6)), init("beta", np.float32(1))]
    nodes = [*n1,
             node("Add", ["c1", "bias"], ["b"]), node("Mul", ["b", "scale"], ["s"]), node("Add", ["s", "shift"], ["t"]),
             node("Clip", ["t", "lo", "hi"], ["r6"]), *n2,
             node("Mul", ["beta", "c2"], ["bc"]), node("Sigmoid", ["bc"], ["sg"]), node("Mul", ["c2", "sg"], ["y"])]
    return make(nodes, [vi("x", [N, H, W, C])], [vi("y", [N, H, W, 8])], [*w1, *w2, *consts])


def test_a_conv_block_keeps_transposes_only_at_the_edges() -> None:
    graph = after_layout(conv_block())
    assert ops(graph) == ["Transpose", "Conv", "Add", "Mul", "Add", "Clip", "Conv", "Mul", "Sigmoid", "Mul",
                          "Transpose"]
    bias = graph.nodes[2].inputs[1]  # permuted once: per channel of NCHW, as BatchNorm folding wants it
    assert bias is not None and bias.shape == (1, 8, 1, 1)


def test_a_residual_add_of_two_transposed_values_moves_their_transpose() -> None:
    n1, w1 = conv("x", "a", C, C)
    n2, w2 = conv("a", "b", C, C)
    model = make([*n1, *n2, node("Add", ["a", "b"], ["s"]), node("Relu", ["s"], ["y"])],
                 [vi("x", [N, H, W, C])], [vi("y", [N, H, W, C])], [*w1, *w2])
    assert ops(after_layout(model)) == ["Transpose", "Conv", "Conv", "Add", "Relu", "Transpose"]


@pytest.mark.parametrize("opset", [11, 18])  # reduction axes as attributes, then as inputs
def test_reductions_and_argmax_reduce_the_permuted_axes(opset: int) -> None:
    def reduce(op: str, out: str, axes: list[int] | None, **attrs: int) -> list[onnx.NodeProto]:
        if axes is None or (opset < 18 and op != "ReduceSum") or opset < 13:
            return [node(op, ["t"], [out], **({"axes": axes} if axes is not None else {}), **attrs)]
        return [node("Constant", [], [f"{out}_axes"], value=helper.make_tensor("a", TensorProto.INT64, [len(axes)],
                                                                                axes)),
                node(op, ["t", f"{out}_axes"], [out], **attrs)]
    nodes = [node("Transpose", ["x"], ["t"], perm=TO_NHWC),
             *reduce("ReduceMean", "gap", [1, 2], keepdims=0),      # global average pooling
             *reduce("ReduceSum", "chan", [-1], keepdims=1),
             *reduce("ReduceMax", "all", None, keepdims=0),
             *reduce("ReduceL2", "hw", [-3, 2], keepdims=0),
             node("ArgMax", ["t"], ["am"], axis=3, keepdims=0),
             node("ArgMin", ["t"], ["an"], axis=1, keepdims=1)]
    outs = [vi("gap", [N, C]), vi("chan", [N, H, W, 1]), vi("all", []), vi("hw", [N, C]),
            vi("am", [N, H, W], TensorProto.INT64), vi("an", [N, 1, W, C], TensorProto.INT64)]
    graph = after_layout(make(nodes, [vi("x", [N, C, H, W])], outs, opset=opset))
    made = {o.name: v.producer.op for o, v in zip(outs, graph.outputs, strict=True) if v.producer is not None}
    # Reducing H and W (or C) of NCHW leaves the rest in order: no transpose after; ReduceSum's keepdims
    # output only moves its unit dimension.
    assert made == {"gap": "ReduceMean", "chan": "Reshape", "all": "ReduceMax", "hw": "ReduceL2",
                    "am": "ArgMax", "an": "Transpose"}
    assert ops(graph).count("Transpose") == 1


@pytest.mark.parametrize("opset", [9, 13, 18])  # Pad/Slice attributes; inputs; Pad's axes input
def test_concat_pad_and_slice_between_inverse_transposes_leave_none(opset: int) -> None:
    def const(name: str, values: list[int]) -> onnx.NodeProto:
        return node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))
    nodes = [node("Transpose", ["x"], ["tx"], perm=TO_NHWC), node("Transpose", ["z"], ["tz"], perm=TO_NHWC),
             node("Concat", ["tx", "tz"], ["cat"], axis=-1 if opset >= 11 else 3)]
    if opset < 11:
        nodes += [node("Pad", ["cat"], ["pad"], pads=[0, 1, 2, 0, 0, 2, 0, 0], mode="reflect"),
                  node("Slice", ["pad"], ["sl"], starts=[1, -6], ends=[6, 100], axes=[1, 3])]
    else:
        pads = ([0, 1, 2, 0, 0, 2, 0, 0], []) if opset < 18 else ([1, 2, 2, 0], [1, 2])
        nodes += [const("pads", pads[0]), const("starts", [1, -6]), const("ends", [6, 100]),
                  const("axes", [1, -1]), const("steps", [2, 1])]
        if pads[1]:
            nodes.append(const("pad_axes", pads[1]))
        nodes += [node("Pad", ["cat", "pads", "", *(["pad_axes"] if pads[1] else [])], ["pad"], mode="edge"),
                  node("Slice", ["pad", "starts", "ends", "axes", "steps"], ["sl"])]
    nodes += [node("Transpose", ["sl"], ["back"], perm=TO_NCHW), node("Relu", ["back"], ["y"])]
    h_out = 5 if opset < 11 else 3
    model = make(nodes, [vi("x", [N, C, H, W]), vi("z", [N, 2, H, W])], [vi("y", [N, 6, h_out, W + 2])],
                 opset=opset)
    graph = after_layout(model)
    assert "Transpose" not in ops(graph)


def test_a_zero_pad_before_a_conv_becomes_its_padding() -> None:
    """Keras' ZeroPadding2D before a strided conv, on the NHWC input and between two convs: the Pad
    moves past the Transpose (or the Transpose past it) and joins the Conv's pads. A reflecting Pad, a
    Pad of ones and a Pad before a MaxPool (which pads with -inf) stay Pads."""
    def padded_conv(x: str, out: str, mode: str = "constant", value: float = 0.0,
                    pool: bool = False) -> tuple[list[onnx.NodeProto], list]:
        w = init(f"{out}_w", _rand(C, C, 3, 3, seed=len(out)))
        fill = init(f"{out}_v", np.float32(value))
        last = (node("MaxPool", [f"{out}_nchw"], [f"{out}_y"], kernel_shape=[3, 3], strides=[2, 2]) if pool
                else node("Conv", [f"{out}_nchw", w.name], [f"{out}_y"], strides=[2, 2], pads=[1, 0, 1, 0]))
        return [node("Pad", [x, f"{out}_pads", fill.name], [f"{out}_p"], mode=mode),
                node("Transpose", [f"{out}_p"], [f"{out}_nchw"], perm=TO_NCHW), last,
                node("Transpose", [f"{out}_y"], [out], perm=TO_NHWC)], \
            [w, fill, init(f"{out}_pads", np.array([0, 0, 1, 0, 0, 1, 1, 0], np.int64))]
    parts = [padded_conv("x", "a"), padded_conv("a", "b"), padded_conv("x", "r", mode="reflect"),
             padded_conv("x", "o", value=1.0), padded_conv("x", "m", pool=True)]
    def out(shape: list[int], conv_pads: tuple[int, int]) -> list[int]:  # the Pad adds 1 to H, 2 to W
        return [N, (shape[1] + 1 + conv_pads[0] - 3) // 2 + 1, (shape[2] + 2 + conv_pads[1] - 3) // 2 + 1, C]
    shape = out([N, H, W, C], (2, 0))
    shape2, pooled = out(shape, (2, 0)), out([N, H, W, C], (0, 0))
    model = make([n for nodes, _ in parts for n in nodes], [vi("x", [N, H, W, C])],
                 [vi("b", shape2), vi("r", shape), vi("o", shape), vi("m", pooled)],
                 [i for _, inits in parts for i in inits], opset=11)
    graph = after_layout(model)
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert [c.attrs["pads"] for c in convs] == [[1, 1, 2, 1], [1, 1, 2, 1], [1, 0, 1, 0], [1, 0, 1, 0]]
    assert [n.inputs[0].producer.op for n in convs + [graph.nodes[-2]]] == ["Transpose", "Conv", "Pad", "Pad", "Pad"]
    assert ops(graph).count("Pad") == 3 and ops(graph).count("Transpose") == 5


def test_a_transpose_that_would_need_another_stays() -> None:
    """Add(T(x), y) with y a full-size tensor: moving T would transpose y instead; nothing changes."""
    model = make([node("Transpose", ["x"], ["t"], perm=TO_NHWC), node("Add", ["t", "y"], ["s"]),
                  node("Transpose", ["s"], ["out"], perm=TO_NCHW)],
                 [vi("x", [N, C, H, W]), vi("y", [N, H, W, C])], [vi("out", [N, C, H, W])])
    assert ops(after_layout(model)) == ["Transpose", "Add", "Transpose"]


def test_a_broadcast_operand_whose_unit_dims_move_is_reshaped() -> None:
    """Squeeze-and-excite: the per-channel gate [N,1,1,C] becomes [N,C,1,1] by a Reshape (no copy)."""
    model = make([node("Transpose", ["x"], ["t"], perm=TO_NHWC), node("Mul", ["t", "gate"], ["m"]),
                  node("Transpose", ["m"], ["out"], perm=TO_NCHW)],
                 [vi("x", [N, C, H, W]), vi("gate", [N, 1, 1, C])], [vi("out", [N, C, H, W])])
    assert ops(after_layout(model)) == ["Reshape", "Mul"]


def test_a_transpose_read_by_an_op_that_needs_it_is_not_copied() -> None:
    """T(x) feeds a MatMul too: moving it past the Relu would leave two transposes where one was."""
    model = make([node("Transpose", ["x"], ["t"], perm=[1, 0]), node("Relu", ["t"], ["r"]),
                  node("MatMul", ["t", "w"], ["m"])],
                 [vi("x", [3, 4])], [vi("r", [4, 3]), vi("m", [4, 5])], [init("w", _rand(3, 5))])
    assert ops(after_layout(model)) == ["Transpose", "Relu", "MatMul"]


def test_transposes_compose_and_unit_moves_become_reshapes() -> None:
    """T(T(x)) is one Transpose (an identity pair none), a Transpose of unit dimensions a Reshape, an
    identity Transpose nothing; outputs keep their names."""
    model = make([node("Transpose", ["x"], ["a"], perm=[1, 0, 2]), node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
                  node("Transpose", ["u"], ["v"], perm=[0, 3, 1, 2]),
                  node("Transpose", ["u"], ["w"], perm=[0, 1, 2, 3]), node("Transpose", ["b"], ["c"], perm=[2, 0, 1])],
                 [vi("x", [2, 3, 4]), vi("u", [2, 1, 1, 5])],
                 [vi("b", [3, 4, 2]), vi("v", [2, 5, 1, 1]), vi("w", [2, 1, 1, 5]), vi("c", [2, 3, 4])])
    graph = after_layout(model)
    assert ops(graph) == ["Transpose", "Reshape"]
    assert [v.name for v in graph.outputs] == ["b", "v", "u", "x"] and graph.outputs[3] is graph.inputs[0]


def test_elementwise_ops_of_several_operands_and_dtypes_move_it() -> None:
    """Sum of three transposed tensors and a per-channel constant, a comparison, Where on bool, Cast."""
    model = make([*(node("Transpose", [i], [f"t{i}"], perm=TO_NHWC) for i in "abc"),
                  node("Sum", ["ta", "tb", "tc", "k"], ["s"]), node("Greater", ["s", "zero"], ["pos"]),
                  node("Where", ["pos", "s", "ta"], ["wh"]), node("Cast", ["wh"], ["d"], to=TensorProto.DOUBLE),
                  node("Transpose", ["d"], ["y"], perm=TO_NCHW)],
                 [vi(i, [N, C, H, W]) for i in "abc"], [vi("y", [N, C, H, W], TensorProto.DOUBLE)],
                 [init("k", _rand(C)), init("zero", np.float32(0))])
    assert "Transpose" not in ops(after_layout(model))


def test_compiled_graphs_match_onnxruntime(tmp_path: Path) -> None:
    """The rewritten graphs through code generation: the conv block compiles to its two conv kernels
    (BatchNorm folded, activations as epilogues) and the input's transpose; swish and the output's
    transpose are one loop."""
    model = conv_block()
    graph = import_onnx(model)
    lib = aotc.load(compile_model(graph, tmp_path, "layout").prefix)
    feeds = _feeds(model)
    np.testing.assert_allclose(lib.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-5)
    assert [k.ops for k in graph.kernels] == [["Transpose"], ["Conv", "Clip"], ["Conv"],
                                              ["Mul", "Sigmoid", "Mul", "Transpose"]]


# Kernels and Transpose nodes after the passes, before/after the layout pass (tests/tf_fixtures.py):
# cnn 9 (its dilated conv, SpaceToBatchND -> Conv2D -> BatchToSpaceND in the graph, is one conv),
# mobilenet_v2 124 -> 49, efficientnet_b0 215 -> 113 (ZeroPadding2D folded into the convs too); each
# keeps only the input's transpose.
@pytest.mark.parametrize(("name", "kernels", "transposes"), [("cnn", 9, 1), ("mobilenet_v2", 49, 1),
                                                             ("efficientnet_b0", 113, 1)])
def test_keras_models_keep_transposes_only_where_needed(name: str, kernels: int, transposes: int) -> None:
    from tf_fixtures import fixtures_dir

    from aotc.frontends.tensorflow import import_graphdef

    fx = fixtures_dir()
    meta = json.loads((fx / f"{name}.json").read_text())
    shapes = {"image": (2, 12, 12, 3)} if name == "cnn" else None
    graph = import_graphdef(fx / f"{name}.pb", shapes, name, outputs=meta["outputs"])
    run_passes(graph)
    assert sum(n.op == "Transpose" for n in graph.nodes) == transposes
    assert len(graph.kernels) == kernels
