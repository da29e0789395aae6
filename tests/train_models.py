"""Models and data for the training tests: scikit-learn's 8x8 handwritten digits (real data that
installs with the library), softmax regression (examples/train_c), an MLP and a small CNN."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_c"
_spec = importlib.util.spec_from_file_location("train_c_make_data", EXAMPLE / "make_data.py")
assert _spec is not None and _spec.loader is not None
make_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_data)

BATCH = make_data.BATCH


def digits() -> tuple[np.ndarray, np.ndarray]:
    return make_data.digits()


def batches(x: np.ndarray, y: np.ndarray, steps: int, batch: int = BATCH, train: int = 1500):
    """``steps`` consecutive batches of the first ``train`` samples, cycling."""
    for step in range(steps):
        i = (step * batch) % train
        yield x[i:i + batch], y[i:i + batch]


def held_out_accuracy(model, x: np.ndarray, y: np.ndarray, n: int = 200, batch: int = BATCH) -> float:
    """Accuracy of ``model.run`` on the last ``n`` samples (never trained on)."""
    xs, ys = x[-n:], y[-n:]
    preds = np.concatenate([model.run({"x": xs[i:i + batch]})[0] for i in range(0, n, batch)])
    return float((preds.argmax(1) == ys).mean())


def _model(nodes: list, inits: dict[str, np.ndarray], batch: int, out: str = "logits",
           extra_inputs: list | None = None, outputs: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64]),
                                       *(extra_inputs or [])],
                          outputs or [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, 10])],
                          [numpy_helper.from_array(a, k) for k, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def mlp_params(seed: int = 1, hidden: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, hidden)) * 0.25).astype(np.float32),
            "b1": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
            "w2": (rng.standard_normal((hidden, 10)) * 0.25).astype(np.float32),
            "b2": (rng.standard_normal(10) * 0.1).astype(np.float32)}


def mlp(params: dict[str, np.ndarray], batch: int = BATCH, loss_node: bool = False,
        dropout: float | None = None) -> onnx.ModelProto:
    """x @ w1 + b1 -> Relu [-> Dropout(ratio dropout)] -> @ w2 + b2 = logits; ``loss_node``: the graph also
    computes its mean SoftmaxCrossEntropyLoss against an int64 input ``labels`` as output ``loss``."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h0"]), n("Add", ["h0", "b1"], ["h1"]), n("Relu", ["h1"], ["h"]),
             n("MatMul", ["h", "w2"], ["o0"]), n("Add", ["o0", "b2"], ["logits"])]
    if dropout is not None:
        params = {**params, "ratio": np.array(dropout, np.float32)}
        nodes.insert(3, n("Dropout", ["h", "ratio"], ["hd"], seed=5))
        nodes[4].input[0] = "hd"
    if not loss_node:
        return _model(nodes, params, batch)
    nodes.append(n("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]))
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, [batch])
    return _model(nodes, params, batch, extra_inputs=[labels],
                  outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10]),
                           helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])


def small_cnn(batch: int = BATCH, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 (8) -> BatchNorm -> Relu -> MaxPool -> Conv 3x3 (16) -> Relu -> MaxPool -> Flatten -> 64x10,
    He-initialised."""
    rng = np.random.default_rng(seed)

    def he(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)
    f32 = np.float32
    inits = {"c1w": he(8, 1, 3, 3), "c1b": np.zeros(8, f32), "g1": np.ones(8, f32), "be1": np.zeros(8, f32),
             "m1": np.zeros(8, f32), "v1": np.ones(8, f32), "c2w": he(16, 8, 3, 3), "c2b": np.zeros(16, f32),
             "fw": he(10, 64).T.copy(), "fb": np.zeros(10, f32), "shape": np.array([batch, 1, 8, 8], np.int64)}
    n = helper.make_node
    nodes = [n("Reshape", ["x", "shape"], ["img"]), n("Conv", ["img", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["bn1"]), n("Relu", ["bn1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]), n("Flatten", ["p2"], ["f"]),
             n("MatMul", ["f", "fw"], ["fm"]), n("Add", ["fm", "fb"], ["logits"])]
    return _model(nodes, inits, batch)


def transformer_block():  # noqa: ANN201 - a torch.nn.Module
    """A pre-norm Transformer encoder block on 8 tokens of 16 features (embedding 32, 4 heads, GELU MLP),
    mean-pooled into 10 logits, in PyTorch."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, d: int = 32, heads: int = 4) -> None:
            super().__init__()
            nn = torch.nn
            self.emb, self.ln1, self.ln2 = nn.Linear(16, d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff1, self.ff2, self.head = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, 10)
            self.heads = heads

        def forward(self, x):  # noqa: ANN001, ANN202
            b, s, _ = x.shape
            x = self.emb(x)

            def split(t):  # noqa: ANN001, ANN202
                return t.reshape(b, s, self.heads, -1).transpose(1, 2)
            q, k, v = (split(t) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
            a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
            x = x + self.ff2(torch.nn.functional.gelu(self.ff1(self.ln2(x))))
            return self.head(x.mean(1))

    torch.manual_seed(0)
    return Block()
