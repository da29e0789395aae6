"""int8 ResNet-18 (onnxruntime's static QDQ quantization) beside onnxruntime int8 and aotc float32.

    python benchmarks/int8.py [--threads 1 2] [--quick]

The model is timm's ResNet-18 at 224x224, batch 1, random weights, quantized by onnxruntime's
``quantize_static`` (QDQ, per-channel int8 weights, uint8 activations; tests/int8_models.py). aotc
compiles the quantized model for ``x86-64-v4`` with AVX-512 VNNI and for ``x86-64-v3`` with AVX-VNNI
(where the CPU has them; otherwise the exact emulated dot products), and the float model for both;
onnxruntime runs both models with all graph optimizations at the same thread count. All are timed in
alternating slices (benchmarks/compare.py) so machine load hits them alike. Printed: median
milliseconds, and aotc int8 / onnxruntime int8 (< 1: aotc is faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from compare import interleaved_medians, machine  # noqa: E402


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def targets() -> dict[str, tuple[str, str | None]]:
    """label -> (--target-cpu, --target-features) of the ISAs this CPU runs."""
    flags = _cpu_flags()
    out: dict[str, tuple[str, str | None]] = {}
    if "avx512f" in flags and "avx512bw" in flags:
        out["v4" + ("+vnni" if "avx512_vnni" in flags else "")] = (
            "x86-64-v4", "+avx512vnni" if "avx512_vnni" in flags else None)
    if "avx2" in flags:
        out["v3" + ("+avxvnni" if "avx_vnni" in flags else "")] = (
            "x86-64-v3", "+avxvnni" if "avx_vnni" in flags else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="shorter timing (noisier)")
    args = ap.parse_args()

    import int8_models
    import onnxruntime as ort

    import aotc
    from aotc.compiler import compile_model

    qpath, fpath, feeds = int8_models.resnet18_int8()
    iters, secs = (5, 1.0) if args.quick else (20, 4.0)
    tg = targets()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        built = {}
        for label, (cpu, feats) in tg.items():
            for kind, path in (("int8", qpath), ("fp32", fpath)):
                res = compile_model(str(path), Path(tmp) / f"{kind}_{label}", f"r_{kind}", target_cpu=cpu,
                                    target_features=feats)
                built[(kind, label)] = res.prefix
        for threads in args.threads:
            fns = {}
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sessions = {kind: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                        for kind, p in (("int8", qpath), ("fp32", fpath))}
            want = sessions["int8"].run(None, feeds)[0]
            for kind, s in sessions.items():
                fns[f"ort {kind}"] = lambda s=s: s.run(None, feeds)
            for (kind, label), prefix in built.items():
                m = aotc.load(prefix, threads=threads)
                if kind == "int8":
                    got = m.run(feeds)[0]
                    diff = float(np.abs(got - want).max())
                    print(f"{label} int8: max |aotc - onnxruntime| = {diff:g}", file=sys.stderr)
                fns[f"aotc {kind} {label}"] = lambda m=m: m.run(feeds)
            t = interleaved_medians(fns, iters, secs)
            results.append((threads, t))
            print(f"{threads} thread(s): " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items()), file=sys.stderr)
    print(f"Machine: {machine()}; batch 1; medians; onnxruntime {ort.__version__}")
    labels = list(tg)
    hdr = ["threads", "ORT int8 ms", "ORT fp32 ms"] + [f"aotc int8 {x} ms" for x in labels]
    hdr += [f"aotc fp32 {x} ms" for x in labels] + [f"int8 {x} / ORT int8" for x in labels]
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    for threads, t in results:
        cells = [str(threads), f"{t['ort int8'] * 1e3:.2f}", f"{t['ort fp32'] * 1e3:.2f}"]
        cells += [f"{t[f'aotc int8 {x}'] * 1e3:.2f}" for x in labels]
        cells += [f"{t[f'aotc fp32 {x}'] * 1e3:.2f}" for x in labels]
        cells += [f"{t[f'aotc int8 {x}'] / t['ort int8']:.2f}" for x in labels]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
