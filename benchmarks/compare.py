"""aotc beside onnxruntime, numpy and PyTorch eager, all measured in one run; prints medians and ratios.

    python benchmarks/compare.py [--threads 1 2] [--quick] [--no-models] [--write-docs docs/benchmarks.md]

Cases: reduce_sum(x + y*z) over 16M floats; GELU + LayerNorm over 4M floats; fp32 GEMM 256/1024/2048
(constant B, like a layer's weights); the MLP 784-512-512-10 at batch 1 and 64; ResNet-18,
MobileNetV2 (224x224) and a BERT (4 layers, hidden 256, seq 128) at batch 1 when torch, timm and
transformers are installed (random weights, nothing downloaded). Each at every thread count asked.
Limits measured in the same run: memory bandwidth (numpy, one thread per core) and numpy's
OpenBLAS GEMM GFLOP/s.

Medians over many iterations after warm-up, the runtimes timed in alternating slices (so load from
other processes hits all of them alike); ratio > 1 means aotc is faster. Every model is run
through the same Python call path for aotc (cffi) and onnxruntime (its Python API). numpy's thread
count is set with threadpoolctl and scipy provides erf for the GELU case
(``pip install threadpoolctl scipy``); without them those numpy columns are left out.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def median_seconds(fn: Callable[[], object], min_iters: int, min_time: float, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(fns: dict[str, Callable[[], object]], min_iters: int, min_time: float,
                        rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each function, each timed for ``min_time`` in ``rounds`` alternating slices.

    On a shared machine the load changes over seconds; timing one runtime for two seconds and then
    the next hands each a different machine. Alternating short slices spreads the noise over all of
    them alike, so the ratios stay meaningful even when the absolute times are not."""
    return {k: statistics.median(v) for k, v in interleaved_times(fns, min_iters, min_time, rounds).items()}


def interleaved_times(fns: dict[str, Callable[[], object]], min_iters: int, min_time: float,
                      rounds: int = 5) -> dict[str, list[float]]:
    """Every call's seconds, timed as ``interleaved_medians`` times them."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(3):
            fn()
    per_slice = -(-min_iters // rounds)
    for _ in range(rounds):
        for k, fn in fns.items():
            start, n = time.perf_counter(), 0
            while n < per_slice or time.perf_counter() - start < min_time / rounds:
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
                n += 1
            # Let the thread pools that spin after their work (OpenBLAS for ~0.1 s) go to sleep, so
            # they do not take a core from the next runtime's slice.
            time.sleep(0.2)
    return times


@dataclass
class Case:
    label: str
    model: object                      # onnx.ModelProto
    feeds: dict
    numpy: Callable | None = None      # the same computation in numpy (None: not meaningful)
    torch: Callable | None = None      # PyTorch eager, for the real architectures
    flops: float = 0.0                 # for GFLOP/s
    bytes: float = 0.0                 # compulsory memory traffic, for the bandwidth bound
    kind: str = "graph"


@dataclass
class Row:
    case: Case
    threads: int
    compile_s: float
    kernels: int
    aotc: float
    ort: float
    numpy: float | None
    torch: float | None
    max_err: float
    extra: dict = field(default_factory=dict)


def synthetic_cases(np) -> list[Case]:
    from models import make, mlp, reduce_sum_xyz, vi
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    cases = []
    n = 1 << 24
    xyz = {k: rng.standard_normal(n).astype(np.float32) for k in "xyz"}
    cases.append(Case("reduce_sum(x+y*z) 16M", reduce_sum_xyz(n), xyz,
                      numpy=lambda f: np.sum(f["x"] + f["y"] * f["z"]), bytes=3 * 4 * n, kind="fused"))

    rows, cols = 4096, 1024
    g = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["xs"]), helper.make_node("Erf", ["xs"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["gelu"]),
             helper.make_node("LayerNormalization", ["gelu", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    inits = [numpy_helper.from_array(np.array(v, np.float32), k)
             for k, v in (("sqrt2", np.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    inits += [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
    model = make(nodes, [vi("x", [rows, cols])], [vi("y", [rows, cols])], inits)
    from math import sqrt

    try:
        from scipy.special import erf
    except ImportError:  # numpy has no erf
        erf = None

    def np_gelu_ln(f):
        x = f["x"]
        h = 0.5 * x * (1 + erf(x / np.float32(sqrt(2))))
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(var + 1e-5) * g + b
    np_fn = np_gelu_ln if erf is not None else None
    cases.append(Case("GELU+LayerNorm 4096x1024", model,
                      {"x": rng.standard_normal((rows, cols)).astype(np.float32)}, numpy=np_fn,
                      bytes=2 * 4 * rows * cols, kind="fused"))

    for size in (256, 1024, 2048):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        model = make([helper.make_node("MatMul", ["a", "w"], ["c"])], [vi("a", [size, size])],
                     [vi("c", [size, size])], [numpy_helper.from_array(w, "w")])
        cases.append(Case(f"GEMM {size}", model,
                          {"a": rng.standard_normal((size, size)).astype(np.float32)},
                          numpy=lambda f, w=w: f["a"] @ w, flops=2.0 * size ** 3, kind="gemm"))

    for batch in (1, 64):
        model = mlp(batch)
        ws = [numpy_helper.to_array(t) for t in model.graph.initializer]

        def np_mlp(f, ws=ws):
            h = np.maximum(f["x"] @ ws[0] + ws[1], 0)
            h = np.maximum(h @ ws[2] + ws[3], 0)
            return h @ ws[4] + ws[5]
        cases.append(Case(f"MLP 784-512-512-10 b{batch}", model,
                          {"x": rng.standard_normal((batch, 784)).astype(np.float32)}, numpy=np_mlp,
                          flops=2.0 * batch * (784 * 512 + 512 * 512 + 512 * 10), kind="model"))
    _add_torch_eager(cases)
    return cases


def _add_torch_eager(cases: list[Case]) -> None:
    """The same computations in PyTorch eager, where torch is installed."""
    torch = _torch()
    if torch is None:
        return
    import torch.nn.functional as F  # noqa: N812
    from onnx import numpy_helper

    for c in cases:
        f = {k: torch.from_numpy(v) for k, v in c.feeds.items()}
        w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in c.model.graph.initializer}
        if c.label.startswith("reduce_sum"):
            c.torch = lambda f=f: torch.sum(f["x"] + f["y"] * f["z"])
        elif c.label.startswith("GELU"):
            c.torch = lambda f=f, w=w: F.layer_norm(F.gelu(f["x"]), (f["x"].shape[-1],), w["g"], w["b"], 1e-5)
        elif c.label.startswith("GEMM"):
            c.torch = lambda f=f, w=w: f["a"] @ w["w"]
        elif c.label.startswith("MLP"):
            def mlp(f=f, w=w):
                h = torch.relu(f["x"] @ w["W0"] + w["b0"])
                h = torch.relu(h @ w["W1"] + w["b1"])
                return h @ w["W2"] + w["b2"]
            c.torch = mlp
        if c.torch is not None:
            inner = c.torch

            def no_grad(inner=inner):
                with torch.no_grad():
                    return inner()
            c.torch = no_grad


def memory_bandwidth(np, threads: int) -> float:
    """Bytes/s of ``c = a + b`` over 3 x 128 MiB arrays (2 reads, 1 write), ``threads`` slices at once."""
    n = 32 << 20
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]

    def once() -> None:
        if threads == 1:
            np.add(a, b, out=c)
            return
        ts = [threading.Thread(target=lambda lo=lo, hi=hi: np.add(a[lo:hi], b[lo:hi], out=c[lo:hi]))
              for lo, hi in bounds]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return 3 * 4 * n / min(median_seconds(once, 5, 1.0, warmup=1) for _ in range(3))


def numpy_gemm_gflops(np, size: int = 2048) -> float:
    a = np.random.default_rng(1).standard_normal((size, size)).astype(np.float32)
    b = a.T.copy()
    c = np.empty_like(a)
    return 2.0 * size ** 3 / median_seconds(lambda: np.matmul(a, b, out=c), 5, 2.0) / 1e9


def run(cases: list[Case], thread_counts: list[int], quick: bool, tmp: Path) -> tuple[list[Row], dict]:
    import numpy as np
    import onnxruntime as ort

    import aotc
    from aotc.compiler import compile_model

    iters, secs = (5, 0.3) if quick else (30, 2.0)
    rows: list[Row] = []
    limits = {}
    compiled: dict[int, tuple[float, dict]] = {}
    for threads in thread_counts:
        numpy_ok = _set_blas_threads(threads)
        if not numpy_ok:
            print("threadpoolctl is not installed: numpy's GEMM columns are left out", file=sys.stderr)
        limits[threads] = {"bandwidth_gbs": memory_bandwidth(np, threads) / 1e9,
                           "numpy_gemm_gflops": numpy_gemm_gflops(np) if numpy_ok else float("nan")}
        torch = _torch()
        if torch is not None:
            torch.set_num_threads(threads)
        for i, case in enumerate(cases):
            # One directory and name per case: a process cannot dlopen two libraries from one path.
            # The first thread count compiles; later ones find the library up to date.
            t0 = time.perf_counter()
            res = compile_model(case.model, tmp / f"case{i}", f"bench{i}")
            compile_s = compiled.setdefault(i, (time.perf_counter() - t0, res.seconds))
            m = aotc.load(res.prefix, threads=threads)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            use_np = case.numpy is not None and (numpy_ok or case.kind == "fused")
            fns = {"aotc": lambda m=m, f=case.feeds: m.run(f), "ort": lambda s=sess, f=case.feeds: s.run(None, f)}
            if use_np:
                fns["numpy"] = lambda fn=case.numpy, f=case.feeds: fn(f)
            if case.torch:
                fns["torch"] = case.torch
            t = interleaved_medians(fns, iters, secs)
            t_aotc, t_ort, t_np, t_torch = t["aotc"], t["ort"], t.get("numpy"), t.get("torch")
            got, want = m.run(case.feeds)[0], sess.run(None, case.feeds)[0]
            scale = float(np.max(np.abs(want))) if want.size else 0.0
            err = float(np.max(np.abs(got.astype(np.float64) - want))) / (scale or 1.0) if got.size else 0.0
            total_s, parts = compile_s
            rows.append(Row(case, threads, total_s, res.num_kernels, t_aotc, t_ort, t_np, t_torch, err,
                            {"c_compile_s": parts.get("c_compile", 0.0)}))
            print(f"  [{threads} thread(s)] {case.label}: aotc {t_aotc * 1e3:.3f} ms, "
                  f"onnxruntime {t_ort * 1e3:.3f} ms", file=sys.stderr)
    return rows, limits


def _set_blas_threads(n: int) -> bool:
    """Limit OpenBLAS to ``n`` threads; False if that cannot be done here."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(n)
    return True


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def table(rows: list[Row], limits: dict) -> str:
    out = ["| case | threads | compile | kernels | aotc | onnxruntime | numpy | torch | ort/aotc | "
           "numpy/aotc | vs limit | max err / max |out| |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lim = limits[r.threads]
        if r.case.kind == "fused" and r.case.bytes:
            bound = r.case.bytes / (lim["bandwidth_gbs"] * 1e9)
            vs = f"{r.aotc / bound:.2f}× bandwidth bound"
        elif r.case.kind == "gemm" and r.case.flops:
            gflops = r.case.flops / r.aotc / 1e9
            vs = f"{gflops:.0f} GFLOP/s, {gflops / lim['numpy_gemm_gflops']:.0%} of numpy 2048"
        else:
            vs = ""
        out.append(f"| {r.case.label} | {r.threads} | {r.compile_s:.1f} s ({r.extra['c_compile_s']:.1f} s C) | "
                   f"{r.kernels} | {_fmt_t(r.aotc)} | "
                   f"{_fmt_t(r.ort)} | {_fmt_t(r.numpy)} | {_fmt_t(r.torch)} | **{r.ort / r.aotc:.2f}** | "
                   + (f"{r.numpy / r.aotc:.2f}" if r.numpy else "-") + f" | {vs} | {r.max_err:.1e} |")
    return "\n".join(out)


def limits_text(limits: dict) -> str:
    return "\n".join(f"- {t} thread(s): memory bandwidth {v['bandwidth_gbs']:.1f} GB/s (numpy `c = a + b`), "
                     f"numpy OpenBLAS sgemm 2048: {v['numpy_gemm_gflops']:.0f} GFLOP/s" for t, v in limits.items())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {isa()} (aotc builds for this CPU), Python {platform.python_version()}"


def isa() -> str:
    """The widest x86 vector ISA the CPU has, which aotc's default ``--target-cpu native`` picks."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return "ISA unknown"
    words = set(flags.split())
    return "AVX-512" if "avx512f" in words else "AVX2" if "avx2" in words else platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--no-models", action="store_true", help="skip ResNet-18, MobileNetV2 and BERT")
    ap.add_argument("--only", help="only cases whose label contains this text")
    ap.add_argument("--write-docs", metavar="FILE", help="also write the results as Markdown to FILE")
    args = ap.parse_args()
    import numpy as np
    import onnxruntime as ort

    import aotc

    cases = synthetic_cases(np)
    if not args.no_models:
        from bench_models import real_cases

        cases += [Case(label, model, feeds, torch=eager, kind="model")
                  for label, model, feeds, eager in real_cases()]
    if args.only:
        cases = [c for c in cases if args.only in c.label]
    with tempfile.TemporaryDirectory() as tmp:
        rows, limits = run(cases, args.threads, args.quick, Path(tmp))
    text = table(rows, limits)
    head = (f"Machine: {machine()}. aotc {aotc.__version__}, onnxruntime {ort.__version__}, "
            f"numpy {np.__version__}" + (f", torch {_torch().__version__}" if _torch() else "") + ".")
    print(head)
    print(limits_text(limits))
    print(text)
    if args.write_docs:
        doc = Path(args.write_docs)
        old = doc.read_text() if doc.exists() else ""
        kept = old[old.index(KEEP):] if KEEP in old else KEEP + "\n"  # the other scripts' summaries
        doc.write_text(DOC.format(head=head, limits=limits_text(limits), table=text,
                                  command=" ".join(["python", "benchmarks/compare.py", *sys.argv[1:]])) + "\n" + kept)


# Below this line docs/benchmarks.md holds the latest runs of the other benchmark scripts, summed up by
# hand; --write-docs rewrites only what is above it.
KEEP = "<!-- The rest of this page is kept when compare.py rewrites the part above. -->"


DOC = """# Benchmarks

The table is generated by `{command}`; do not edit it by hand. Every number in it comes from one run of
that script, with aotc, onnxruntime (all graph optimizations, the same thread count), numpy and PyTorch
eager measured in the same process, in alternating slices of a few hundred milliseconds. Times are
medians over many iterations after warm-up. `ort/aotc` > 1 means aotc is faster. The machine is
shared and noisy: compare ratios within a run, not absolute times across runs.

{head}

Limits measured in the same run:

{limits}

{table}

Notes:

- `vs limit` for fused elementwise/reduction graphs is aotc's time divided by the time to move
  the graph's compulsory bytes at the measured bandwidth; 1.0 is the hardware limit.
- For GEMM it is aotc's GFLOP/s as a fraction of numpy's (OpenBLAS) sgemm at 2048 with the same
  thread count.
- `compile` is the whole `aotc compile`; in parentheses the C compiler's part of it (the rest is the
  passes and code generation).
- TensorFlow models (Keras MobileNetV2 and a BERT-like block from their frozen GraphDefs, beside
  TensorFlow itself and the tf2onnx path) are in [benchmarks_tensorflow.md](benchmarks_tensorflow.md),
  written by `benchmarks/tensorflow.py`.
- Training steps (`aotc compile --train`: the MLP 784-512-512-10 and a small CNN at batch 64, SGD and
  Adam, 1 and 2 threads, beside PyTorch eager and `torch.compile`) are in
  [benchmarks_training.md](benchmarks_training.md), written by `benchmarks/training.py`.
- int8: ResNet-18 quantized by onnxruntime's `quantize_static` (QDQ), beside onnxruntime int8 and the
  float32 runs, per ISA, and each of its convs alone, are in [benchmarks_int8.md](benchmarks_int8.md),
  written by `benchmarks/int8.py`.
- Convolutions per instruction set (one layer per kernel family and whole timm CNNs built for
  `x86-64-v3` and `x86-64-v4` beside onnxruntime; each conv beside onnxruntime's profiler) are in
  [benchmarks_conv.md](benchmarks_conv.md), from `benchmarks/conv_isa.py` and `benchmarks/conv_layers.py`.
- `--dynamic` libraries against libraries compiled for exactly each size (`benchmarks/dynamic_dims.py`)
  are in [dynamic_shapes.md](dynamic_shapes.md). The CUDA target's runs (`benchmarks/cuda.py`) need a
  GPU and have not been made yet ([cuda.md](cuda.md)).
"""


if __name__ == "__main__":
    main()
