"""One layer per kernel family, built for AVX2 and for AVX-512 in one run, beside onnxruntime.

    python benchmarks/conv_isa.py [--threads 1] [--quick] [--only stem] [--models [resnet18 ...]]

Each case is a single-layer ONNX model (batch 1, random weights, the layer's usual activation
fused): direct 3x3 convs, the 3 -> 32 3x3 stems of MobileNet/EfficientNet (224x224, stride 2) and
of a small net (64x64, stride 1), 1x1 convs, depthwise 3x3, Winograd 3x3, pools and a GEMM; with
``--models``, whole timm CNNs too (ResNet-18/50, MobileNetV2, EfficientNet-B0, 224x224). aotc
compiles each twice, ``--target-cpu x86-64-v3`` (AVX2 + FMA) and ``x86-64-v4`` (AVX-512); the two
libraries and onnxruntime (all graph optimizations, the same thread count) are timed in alternating
slices (benchmarks/compare.py), so machine load hits all three alike. Printed: the fastest call's
microseconds (on a loaded machine a call of a few milliseconds is often preempted, which the
median then counts: the fastest call is the least disturbed), aotc/onnxruntime per ISA (< 1: aotc
is faster; onnxruntime picks its own kernels for this CPU whatever aotc's target), AVX-512/AVX2,
aotc's GFLOP/s, and the medians' aotc/onnxruntime ratios.
An x86-64-v4 library needs an AVX-512 CPU; on another machine only the AVX2 column is measured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import interleaved_medians, machine  # noqa: E402

ISAS = {"avx2": "x86-64-v3", "avx512": "x86-64-v4"}


@dataclass
class Layer:
    family: str
    label: str
    model: onnx.ModelProto
    x: np.ndarray | None    # the input "x" of a single layer
    flops: float
    feeds: dict | None = None  # a whole model's inputs

    def inputs(self) -> dict:
        return self.feeds if self.feeds is not None else {"x": self.x}


MODELS = ["resnet18", "resnet50", "mobilenetv2_100", "efficientnet_b0"]


def timm_models(names: list[str]) -> list[Layer]:
    """timm CNNs at 224x224, batch 1, random weights, exported and cached by tests/real_models.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import real_models as rm

    out = []
    for name in names:
        arch = rm.Arch(f"bench_{name}", rm._timm(name, image=224), "timm")
        rm.ARCHS[arch.name] = arch
        path, feeds = rm.exported(arch.name, 17, False)
        out.append(Layer("model", f"{name} 224 b1", onnx.load(str(path)), None, 0.0, feeds))
    return out


def _conv(family: str, label: str, c: int, m: int, hw: int, k: int, stride: int = 1, group: int = 1,
          act: str = "Relu") -> Layer:
    rng = np.random.default_rng(0)
    pad = k // 2
    w = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4, group=group),
             helper.make_node(act, ["c"], ["y"])]
    out = (hw + 2 * pad - k) // stride + 1
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    return Layer(family, label, _model(graph), x, 2.0 * m * out * out * (c // group) * k * k)


def _single(family: str, label: str, op: str, shape: tuple[int, ...], flops: float, **attrs) -> Layer:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "layer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return Layer(family, label, _model(graph), x, flops)


def _gemm(m: int, k: int, n: int) -> Layer:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "layer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return Layer("GEMM", f"MatMul {m}x{k} @ {k}x{n}", _model(graph),
                 rng.standard_normal((m, k)).astype(np.float32), 2.0 * m * k * n)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def layers() -> list[Layer]:
    return [
        _conv("stem 3x3", "3->32 s2 224x224 (MobileNetV2)", 3, 32, 224, 3, stride=2, act="Relu"),
        _conv("stem 3x3", "3->32 s1 64x64 (small net)", 3, 32, 64, 3),
        _conv("direct 3x3", "64->128 s2 56x56 (ResNet)", 64, 128, 56, 3, stride=2),
        _conv("direct 3x3", "256->256 s1 14x14 (ResNet)", 256, 256, 14, 3),
        _conv("stem 7x7", "3->64 s2 224x224 (ResNet)", 3, 64, 224, 7, stride=2),
        _conv("Winograd 3x3", "64->64 s1 56x56 (ResNet-18)", 64, 64, 56, 3),
        _conv("Winograd 3x3", "128->128 s1 28x28 (ResNet-18)", 128, 128, 28, 3),
        _conv("pointwise 1x1", "64->256 56x56 (ResNet-50)", 64, 256, 56, 1),
        _conv("pointwise 1x1", "256->64 56x56 (ResNet-50)", 256, 64, 56, 1),
        _conv("pointwise 1x1", "960->160 7x7 (MobileNetV2)", 960, 160, 7, 1),
        _conv("depthwise 3x3", "144ch s1 56x56 (MobileNetV2)", 144, 144, 56, 3, group=144),
        _conv("depthwise 3x3", "96ch s2 112x112 (MobileNetV2)", 96, 96, 112, 3, stride=2, group=96),
        _single("pools", "MaxPool 3x3 s2 64x112x112", "MaxPool", (1, 64, 112, 112), 9.0 * 64 * 56 * 56,
                kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        _single("pools", "GlobalAveragePool 1280x7x7", "GlobalAveragePool", (1, 1280, 7, 7), 1280 * 49.0),
        _gemm(64, 512, 512),
    ]


def timed(fns: dict[str, Callable[[], object]], iters: int, secs: float) -> tuple[dict[str, float], dict[str, float]]:
    """(medians, fastest call) in seconds of each function, timed in alternating slices."""
    calls: dict[str, list[float]] = {k: [] for k in fns}

    def recording(k: str, fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            t0 = time.perf_counter()
            r = fn()
            calls[k].append(time.perf_counter() - t0)
            return r
        return call
    med = interleaved_medians({k: recording(k, fn) for k, fn in fns.items()}, iters, secs)
    return med, {k: min(v) for k, v in calls.items()}


def _cpu_has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="shorter timing (noisier)")
    ap.add_argument("--only", default="", help="cases whose family or label contains this text")
    ap.add_argument("--models", nargs="*", metavar="TIMM_NAME",
                    help=f"also whole timm CNNs (default {' '.join(MODELS)}; needs torch and timm)")
    args = ap.parse_args()

    import onnxruntime as ort

    import aotc
    from aotc.compiler import compile_model

    isas = {k: v for k, v in ISAS.items() if k == "avx2" or _cpu_has_avx512()}
    iters, secs = (5, 0.3) if args.quick else (20, 1.5)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = layers() + (timm_models(args.models or MODELS) if args.models is not None else [])
        for i, layer in enumerate(cases):
            if args.only and args.only not in layer.family + " " + layer.label:
                continue
            fns, libs, feeds = {}, {}, layer.inputs()
            for isa, cpu in isas.items():
                res = compile_model(layer.model, Path(tmp) / f"{isa}{i}", f"l{i}_{isa}", target_cpu=cpu)
                libs[isa] = aotc.load(res.prefix, threads=args.threads)
                fns[isa] = lambda m=libs[isa], f=feeds: m.run(f)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(layer.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            fns["ort"] = lambda s=sess, f=feeds: s.run(None, f)
            want = sess.run(None, feeds)[0]
            for isa, m in libs.items():
                got = m.run(feeds)[0]
                err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0))
                if err > 1e-3:
                    print(f"{layer.label} ({isa}): relative error {err:.2e} against onnxruntime", file=sys.stderr)
            med, t = timed(fns, iters, secs)
            rows.append((layer, t, med))
            print(f"  {layer.family}: {layer.label}: medians " + ", ".join(f"{k} {v * 1e6:.0f} us"
                                                                      for k, v in med.items()), file=sys.stderr)
    print(f"Machine: {machine()}; {args.threads} thread(s); batch 1; fastest calls; onnxruntime {ort.__version__}")
    hdr = ["family", "layer", "ORT us"] + [f"{k} us" for k in isas] + [f"{k}/ORT" for k in isas]
    hdr += ["avx512/avx2", "GFLOP/s (best)"] if len(isas) == 2 else ["GFLOP/s"]
    hdr += [f"{k}/ORT (medians)" for k in isas]
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for layer, t, med in rows:
        cells = [layer.family, layer.label, f"{t['ort'] * 1e6:.1f}"]
        cells += [f"{t[k] * 1e6:.1f}" for k in isas] + [f"{t[k] / t['ort']:.2f}" for k in isas]
        if len(isas) == 2:
            cells.append(f"{t['avx512'] / t['avx2']:.2f}")
        cells.append(f"{layer.flops / min(t[k] for k in isas) / 1e9:.1f}" if layer.flops else "")
        cells += [f"{med[k] / med['ort']:.2f}" for k in isas]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
