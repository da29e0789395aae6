#!/usr/bin/env python3
"""Compile the MNIST example models with aotc and check them against a reference.

Steps: write ``softmax.onnx`` and ``mlp.onnx`` (see ``make_models.py``),
compile each with ``aotc.compile``, run the generated code on a few random
"images", and compare with onnxruntime (or, when onnxruntime is not
installed, a small numpy evaluation of the graph). Prints the outputs and the
maximum absolute error; exits with status 1 if it exceeds ``--tolerance``.

Usage::

    python examples/mnist/run.py [--out-dir DIR] [--batch N] [--images N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_models  # noqa: E402

import aotc  # noqa: E402

Reference = Callable[[np.ndarray], np.ndarray]


def numpy_reference(model_path: Path) -> Reference:
    """Evaluate the (MatMul/Add/Relu/Softmax only) graph of ``model_path`` with numpy."""
    model = onnx.load(str(model_path))
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
    in_name, out_name = graph.input[0].name, graph.output[0].name

    def run(x: np.ndarray) -> np.ndarray:
        env: dict[str, np.ndarray] = dict(consts)
        env[in_name] = x.astype(np.float32)
        for node in graph.node:
            args = [env[name] for name in node.input]
            if node.op_type == "MatMul":
                result = args[0] @ args[1]
            elif node.op_type == "Add":
                result = args[0] + args[1]
            elif node.op_type == "Relu":
                result = np.maximum(args[0], 0.0)
            elif node.op_type == "Softmax":
                shifted = args[0] - args[0].max(axis=-1, keepdims=True)
                e = np.exp(shifted)
                result = e / e.sum(axis=-1, keepdims=True)
            else:
                raise NotImplementedError(f"numpy reference: unsupported op {node.op_type}")
            env[node.output[0]] = result.astype(np.float32)
        return env[out_name]

    return run


def make_reference(model_path: Path) -> tuple[str, Reference]:
    """Return (name, function) of the best available reference implementation."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "numpy", numpy_reference(model_path)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    in_name = session.get_inputs()[0].name

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(None, {in_name: x})[0])

    return "onnxruntime", run


def first_output(result: object) -> np.ndarray:
    """The first output of a compiled model's ``run`` (a sequence of arrays)."""
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, np.ndarray):
        return result
    assert isinstance(result, Sequence) and len(result) > 0, f"unexpected run() result {result!r}"
    return np.asarray(result[0])


def check_model(model_path: Path, out_dir: Path, name: str, images: np.ndarray, batch: int) -> float:
    """Compile one model, run it on ``images`` in chunks of ``batch``; return the max abs error."""
    compiled = aotc.compile(str(model_path), out_dir=str(out_dir), name=name)
    ref_name, reference = make_reference(model_path)
    max_err = 0.0
    print(f"== {name} ({model_path.name}, batch {batch}, reference: {ref_name})")
    for start in range(0, len(images), batch):
        x = np.ascontiguousarray(images[start : start + batch], dtype=np.float32)
        got = first_output(compiled.run({"x": x}))
        want = reference(x)
        if got.shape != want.shape:
            raise SystemExit(f"{name}: output shape {got.shape} != reference shape {want.shape}")
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        if not np.isfinite(err):  # NaN would slip through max() below
            err = float("inf")
        max_err = max(max_err, err)
        for row, values in enumerate(got):
            formatted = " ".join(f"{v:+.5f}" for v in values)
            print(f"  image {start + row}: argmax={int(np.argmax(values))}  [{formatted}]")
    print(f"  max abs error vs {ref_name}: {max_err:.3g}")
    return max_err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile and check the MNIST example models.")
    parser.add_argument("--out-dir", type=Path, default=None, help="build directory (default: a temporary one)")
    parser.add_argument("--batch", type=int, default=1, help="fixed batch size of the MLP (default 1)")
    parser.add_argument("--images", type=int, default=3, help="number of random images (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random images")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max allowed abs error")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.images < 1:
        parser.error("--batch and --images must be >= 1")

    with tempfile.TemporaryDirectory(prefix="aotc-mnist-") as tmp:
        out_dir = args.out_dir if args.out_dir is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        models = make_models.write_models(out_dir, batch=args.batch)

        rng = np.random.default_rng(args.seed)
        # Round the image count up to a whole number of MLP batches.
        n_images = -(-args.images // args.batch) * args.batch
        images = rng.random((n_images, make_models.IMAGE_SIZE), dtype=np.float32)

        errors = {
            "softmax": check_model(models["softmax"], out_dir, "softmax", images[: args.images], 1),
            "mlp": check_model(models["mlp"], out_dir, "mlp", images, args.batch),
        }

    worst = max(errors.values())
    print(f"max abs error over all models: {worst:.3g} (tolerance {args.tolerance:g})")
    if not np.isfinite(worst) or worst > args.tolerance:
        print("FAILED: error above tolerance", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
