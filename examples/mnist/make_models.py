#!/usr/bin/env python3
"""Build the MNIST example models as ONNX files (no downloads, fixed seeds).

Two models are written to OUTDIR:

* ``softmax.onnx`` -- softmax regression, the "hello world" of MNIST:
  ``y = Softmax(x @ W + b)`` with ``x: float[1, 784]`` and ``y: float[1, 10]``.
* ``mlp.onnx`` -- a 784-512-512-10 multi-layer perceptron with ReLU
  activations, producing raw logits: ``x: float[batch, 784]`` ->
  ``logits: float[batch, 10]``. ``batch`` is a fixed dimension (``--batch``).

The weights are random (He initialisation, seeded), so the models do not
recognise digits; they exist to exercise the compiler with realistic shapes.

Usage::

    python examples/mnist/make_models.py OUTDIR [--batch N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR version 8 is the one that goes with opset 17; pinning it keeps the
# files loadable by older onnxruntime releases too.
IR_VERSION = 8

IMAGE_SIZE = 28 * 28
NUM_CLASSES = 10
HIDDEN = (512, 512)
DEFAULT_SEED = 20240101


def he_normal(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    """He (Kaiming) normal initialisation for a ``[fan_in, fan_out]`` matrix."""
    std = np.sqrt(2.0 / fan_in)
    return (rng.standard_normal((fan_in, fan_out)) * std).astype(np.float32)


def small_bias(rng: np.random.Generator, size: int) -> np.ndarray:
    """Small random bias vector, so that the Add nodes are not no-ops."""
    return rng.uniform(-0.05, 0.05, size=size).astype(np.float32)


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="aotc-examples",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def build_softmax(seed: int = DEFAULT_SEED) -> onnx.ModelProto:
    """Softmax regression: ``y = Softmax(x @ W + b)``, x is ``[1, 784]``."""
    rng = np.random.default_rng(seed)
    w = he_normal(rng, IMAGE_SIZE, NUM_CLASSES)
    b = small_bias(rng, NUM_CLASSES)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xW"], name="matmul"),
        helper.make_node("Add", ["xW", "b"], ["logits"], name="add"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mnist_softmax",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, IMAGE_SIZE])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, NUM_CLASSES])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    return _finish(graph, "MNIST softmax regression with random weights")


def build_mlp(batch: int = 1, seed: int = DEFAULT_SEED + 1) -> onnx.ModelProto:
    """784-512-512-10 MLP (MatMul+Add+Relu twice, then MatMul+Add -> logits)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    rng = np.random.default_rng(seed)
    sizes = (IMAGE_SIZE, *HIDDEN, NUM_CLASSES)
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = "x"
    n_layers = len(sizes) - 1
    for i in range(n_layers):
        w = he_normal(rng, sizes[i], sizes[i + 1])
        b = small_bias(rng, sizes[i + 1])
        w_name, b_name = f"fc{i + 1}.W", f"fc{i + 1}.b"
        initializers += [numpy_helper.from_array(w, w_name), numpy_helper.from_array(b, b_name)]
        last = i == n_layers - 1
        mm, pre = f"fc{i + 1}.mm", ("logits" if last else f"fc{i + 1}.pre")
        nodes.append(helper.make_node("MatMul", [current, w_name], [mm], name=f"fc{i + 1}_matmul"))
        nodes.append(helper.make_node("Add", [mm, b_name], [pre], name=f"fc{i + 1}_add"))
        if last:
            current = pre
        else:
            act = f"fc{i + 1}.relu"
            nodes.append(helper.make_node("Relu", [pre], [act], name=f"fc{i + 1}_relu"))
            current = act
    graph = helper.make_graph(
        nodes,
        "mnist_mlp",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, IMAGE_SIZE])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, NUM_CLASSES])],
        initializer=initializers,
    )
    return _finish(graph, f"MNIST 784-512-512-10 MLP with random weights, batch {batch}")


def write_models(out_dir: str | Path, batch: int = 1) -> dict[str, Path]:
    """Write ``softmax.onnx`` and ``mlp.onnx`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, model in (("softmax", build_softmax()), ("mlp", build_mlp(batch))):
        path = out / f"{name}.onnx"
        onnx.save_model(model, str(path))
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", metavar="OUTDIR", help="directory to write the .onnx files to")
    parser.add_argument("--batch", type=int, default=1, help="fixed batch size of mlp.onnx (default 1)")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    for name, path in write_models(args.out_dir, args.batch).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
