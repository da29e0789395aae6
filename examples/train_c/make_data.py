"""Writes what the training example needs into a directory (default: build/):

- digits.onnx: softmax regression over scikit-learn's 8x8 handwritten digits, x[100, 64] -> probs[100, 10],
  its weights and bias zero (the training starts from zeros);
- train_x.bin, train_y.bin, test_x.bin, test_y.bin: the digits, shuffled with a fixed seed, as raw
  little-endian float32 pixels in [0, 1] and int64 classes: 1500 to train on, 200 held out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

BATCH, PIXELS, CLASSES, TRAIN, TEST = 100, 64, 10, 1500, 200


def softmax_regression(batch: int = BATCH) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
        "digits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, PIXELS])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, CLASSES])],
        [numpy_helper.from_array(np.zeros((PIXELS, CLASSES), np.float32), "W"),
         numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits, shuffled with seed 0: pixels scaled to [0, 1], classes as int64."""
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    return (d.data[order] / 16).astype(np.float32), d.target[order].astype(np.int64)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(softmax_regression(), out / "digits.onnx")
    x, y = digits()
    x[:TRAIN].tofile(out / "train_x.bin")
    y[:TRAIN].tofile(out / "train_y.bin")
    x[-TEST:].tofile(out / "test_x.bin")
    y[-TEST:].tofile(out / "test_y.bin")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build"))
