"""Small ONNX models built in code for the tests (fixed seeds, no files committed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def make(nodes, inputs, outputs, inits=(), opset: int = 17, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9,
                              functions=list(functions))
    return model


def vi(name: str, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name: str, arr: np.ndarray):
    return numpy_helper.from_array(np.asarray(arr), name)


def reduce_sum_xyz(n: int) -> onnx.ModelProto:
    """The XLA overview's example: reduce_sum(x + y * z)."""
    return make([helper.make_node("Mul", ["y", "z"], ["yz"]),
                 helper.make_node("Add", ["x", "yz"], ["s"]),
                 helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0)],
                [vi("x", [n]), vi("y", [n]), vi("z", [n])], [vi("r", [])])


def dense_relu(m: int = 8, k: int = 64, n: int = 32, seed: int = 0) -> onnx.ModelProto:
    """relu(x @ W + b)."""
    rng = np.random.default_rng(seed)
    return make([helper.make_node("MatMul", ["x", "W"], ["xw"]),
                 helper.make_node("Add", ["xw", "b"], ["a"]),
                 helper.make_node("Relu", ["a"], ["y"])],
                [vi("x", [m, k])], [vi("y", [m, n])],
                [init("W", rng.standard_normal((k, n)).astype(np.float32)),
                 init("b", rng.standard_normal(n).astype(np.float32))])


def mnist_softmax(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    return make([helper.make_node("MatMul", ["x", "W"], ["xw"]),
                 helper.make_node("Add", ["xw", "b"], ["logits"]),
                 helper.make_node("Softmax", ["logits"], ["y"], axis=-1)],
                [vi("x", [batch, 784])], [vi("y", [batch, 10])],
                [init("W", (rng.standard_normal((784, 10)) * 0.05).astype(np.float32)),
                 init("b", (rng.standard_normal(10) * 0.1).astype(np.float32))])


def mlp(batch: int = 1, sizes=(784, 512, 512, 10), seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = "x"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        inits += [init(f"W{i}", (rng.standard_normal((a, b)) * np.sqrt(2 / a)).astype(np.float32)),
                  init(f"b{i}", (rng.standard_normal(b) * 0.01).astype(np.float32))]
        nodes += [helper.make_node("MatMul", [h, f"W{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"])]
        h = f"z{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [h], [f"h{i}"]))
            h = f"h{i}"
    nodes.append(helper.make_node("Identity", [h], ["logits"]))
    return make(nodes, [vi("x", [batch, sizes[0]])], [vi("logits", [batch, sizes[-1]])], inits)


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def random_feeds(m, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in m.inputs}
