"""Time per training step: aotc's compiled NAME_train_step beside PyTorch eager and torch.compile, all in
one run; prints medians and ratios.

    python benchmarks/training.py [--threads 1 2] [--quick] [--target-cpu CPU]
        [--write-docs docs/benchmarks_training.md]

Cases (random data, fixed seeds, nothing downloaded): the MLP 784-512-512-10 at batch 64 and a small CNN
on 28x28 images at batch 64 (Conv 3x3 16 -> Relu -> MaxPool 2 -> Conv 3x3 32 -> Relu -> MaxPool 2 ->
Flatten -> 1568x10), softmax cross-entropy, SGD (lr 0.01) and Adam (lr 0.001). One step is the forward
pass, the loss, the gradients and the optimizer's update of the parameters in place; PyTorch runs the
same model (from the same initial weights) with ``torch.optim`` (``foreach`` updates), eager and with
the model under ``torch.compile`` (inductor; its backward compiled by AOTAutograd), at the same thread
count (``torch.set_num_threads``). Each step is timed through Python (aotc: ``CompiledModel.train_step``).
Medians and 10th percentiles over many steps after warm-up, the runtimes timed in alternating slices
(``compare.interleaved_times``); ``eager/aotc`` > 1 means aotc is faster.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare import interleaved_times, machine  # noqa: E402

import aotc  # noqa: E402
from aotc.target import resolve  # noqa: E402

BATCH = 64


def _he(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:]))).astype(np.float32)


def mlp_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[onnx.NodeProto]]:
    rng = np.random.default_rng(0)
    params = {"w1": _he(rng, 512, 784).T.copy(), "b1": np.zeros(512, np.float32),
              "w2": _he(rng, 512, 512).T.copy(), "b2": np.zeros(512, np.float32),
              "w3": _he(rng, 10, 512).T.copy(), "b3": np.zeros(10, np.float32)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["a1"]), n("Add", ["a1", "b1"], ["z1"]), n("Relu", ["z1"], ["h1"]),
             n("MatMul", ["h1", "w2"], ["a2"]), n("Add", ["a2", "b2"], ["z2"]), n("Relu", ["z2"], ["h2"]),
             n("MatMul", ["h2", "w3"], ["a3"]), n("Add", ["a3", "b3"], ["logits"])]
    return _onnx(nodes, params, [BATCH, 784]), params, nodes


def cnn_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[onnx.NodeProto]]:
    rng = np.random.default_rng(0)
    params = {"c1w": _he(rng, 16, 1, 3, 3), "c1b": np.zeros(16, np.float32),
              "c2w": _he(rng, 32, 16, 3, 3), "c2b": np.zeros(32, np.float32),
              "fw": _he(rng, 10, 1568).T.copy(), "fb": np.zeros(10, np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]), n("Flatten", ["p2"], ["f"]),
             n("MatMul", ["f", "fw"], ["fm"]), n("Add", ["fm", "fb"], ["logits"])]
    return _onnx(nodes, params, [BATCH, 1, 28, 28]), params, nodes


def _onnx(nodes: list, params: dict[str, np.ndarray], shape: list[int]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, 10])],
                          [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def torch_module(kind: str, params: dict[str, np.ndarray]):  # noqa: ANN201 - a torch.nn.Module
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()})

        def forward(self, x):  # noqa: ANN001, ANN202
            p = self.p
            h = torch.relu(x @ p["w1"] + p["b1"])
            h = torch.relu(h @ p["w2"] + p["b2"])
            return h @ p["w3"] + p["b3"]

    class Cnn(Mlp):
        def forward(self, x):  # noqa: ANN001, ANN202
            p, F = self.p, torch.nn.functional
            h = F.max_pool2d(torch.relu(F.conv2d(x, p["c1w"], p["c1b"], padding=1)), 2)
            h = F.max_pool2d(torch.relu(F.conv2d(h, p["c2w"], p["c2b"], padding=1)), 2)
            return h.flatten(1) @ p["fw"] + p["fb"]

    return (Mlp if kind == "mlp" else Cnn)()


def torch_step(module, opt_spec: str, x: np.ndarray, y: np.ndarray):  # noqa: ANN001, ANN201
    import torch

    opt = (torch.optim.SGD(module.parameters(), lr=0.01, foreach=True) if opt_spec.startswith("sgd")
           else torch.optim.Adam(module.parameters(), lr=0.001, foreach=True))
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(module(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()
    return step


CASES = [("MLP 784-512-512-10 b64", "mlp", mlp_model), ("small CNN 28x28 b64", "cnn", cnn_model)]
OPTIMIZERS = ["sgd:lr=0.01", "adam:lr=0.001"]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="shorter timing (a smoke run)")
    ap.add_argument("--target-cpu", default=None, help="aotc's --target-cpu (default: native)")
    ap.add_argument("--write-docs", help="write the markdown table to this file")
    args = ap.parse_args()
    min_time = 0.5 if args.quick else 3.0
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, build in CASES:
            model, params, _ = build()
            rng = np.random.default_rng(1)
            shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
            x = rng.standard_normal(shape).astype(np.float32)
            y = rng.integers(0, 10, BATCH).astype(np.int64)
            for opt in OPTIMIZERS:
                t0 = time.perf_counter()
                name = f"{kind}_{opt.split(':')[0]}"
                aotc.compile(model, tmp, name=name, target_cpu=args.target_cpu,
                             train=aotc.Train("softmax_ce:labels", opt))
                compile_s = time.perf_counter() - t0
                eager = torch_module(kind, params)
                compiled = torch.compile(torch_module(kind, params))
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    m = aotc.load(Path(tmp) / name, threads=threads)
                    feeds = {"x": x, "labels": y}
                    fns = {"aotc": lambda m=m, feeds=feeds: m.train_step(feeds), "eager": torch_step(eager, opt, x, y),
                           "compile": torch_step(compiled, opt, x, y)}
                    times = interleaved_times(fns, min_iters=20, min_time=min_time)
                    med = {k: float(np.median(v)) for k, v in times.items()}
                    p10 = {k: float(np.quantile(v, 0.1)) for k, v in times.items()}
                    rows.append((label, opt.split(":")[0], threads, compile_s, med, p10))
                    print(f"{label} {opt} {threads}t: aotc {med['aotc'] * 1e3:.2f} ms, "
                          f"eager {med['eager'] * 1e3:.2f} ms, torch.compile {med['compile'] * 1e3:.2f} ms", flush=True)
    text = table(rows)
    print(text)
    if args.write_docs:
        Path(args.write_docs).write_text(DOC.format(cmd=" ".join(["python benchmarks/training.py", *sys.argv[1:]]),
                                                    machine=machine(), aotc=aotc.__version__, torch=torch.__version__,
                                                    cpu=args.target_cpu or "native",
                                                    isa=resolve(None, args.target_cpu, None, None, None).isa.name,
                                                    table=text, load=f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
                                                    cores=os.cpu_count()))


def table(rows: list) -> str:
    """Medians, and in parentheses the 10th percentiles (the steps the other processes hardly touched)."""
    out = ["| case | optimizer | threads | aotc compile | aotc | PyTorch eager | torch.compile | eager/aotc | "
           "compile/aotc |", "|---|---|---|---|---|---|---|---|---|"]

    def ms(d: dict, k: str) -> str:
        return f"{d[k] * 1e3:.2f}"
    for label, opt, threads, compile_s, med, p10 in rows:
        cells = [f"{ms(med, k)} ({ms(p10, k)}) ms" for k in ("aotc", "eager", "compile")]
        ratios = [f"**{med[k] / med['aotc']:.2f}** ({p10[k] / p10['aotc']:.2f})" for k in ("eager", "compile")]
        out.append(f"| {label} | {opt} | {threads} | {compile_s:.1f} s | {' | '.join(cells)} | {' | '.join(ratios)} |")
    return "\n".join(out)


DOC = """# Training step benchmarks

Generated by `{cmd}`; do not edit by hand. Time per training step (forward, loss,
gradients, optimizer update) of aotc's compiled `NAME_train_step` beside PyTorch eager and `torch.compile`,
measured in the same process in alternating slices; medians over many steps after warm-up, and in
parentheses the 10th percentiles (the steps other processes disturbed least). A ratio > 1 means aotc
is faster. The machine is shared with other work and noisy: compare ratios within a run, not
absolute times across runs. See the docstring of `benchmarks/training.py` for the models.

Machine: {machine}. aotc {aotc} (`--target-cpu {cpu}`: {isa} kernels), torch {torch}. Load average (1 minute) at the
start / end of the run: {load}, on {cores} cores: where it is well above the thread count, the other
processes take cores from the runtimes' threads, and PyTorch's OpenMP threads, which wait for each other
at every op, suffer most at 2 threads.

{table}
"""


if __name__ == "__main__":
    main()
