"""Per-layer comparison of a CNN: each aotc kernel beside the onnxruntime nodes that compute the same
ONNX nodes, with GFLOP/s against this core's measured FMA peak.

    python benchmarks/conv_layers.py efficientnet_b0 [--target-cpu x86-64-v4] [--threads 1] [--top 25]

The model is a timm architecture at 224x224, batch 1, random weights (exported and cached by the
test suite's tests/real_models.py). aotc is compiled with ``--profile`` (per-kernel timestamps) and
onnxruntime (all graph optimizations, the same thread count) runs with its profiler; both sides are
medians over the same number of runs. onnxruntime names a node after the ONNX node or value it
computes (its NCHWc convs: the output value plus ``_nchwc``; its fusions: the first node's name plus
the fusion's), which maps it to the aotc kernel holding that ONNX node. Its layout reorders have no
ONNX node and are listed apart. The peak is measured by a small C program: independent FMA chains
on the ISA's vectors, compiled with the same ``-march`` as the library.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# 12 independent accumulators (the FMA latency times the FMA ports), each a vector of LANES floats.
_PEAK_C = r"""
#include <stdio.h>
#include <time.h>
typedef float v __attribute__((vector_size(LANES * 4)));
#define ALL(f) f(0) f(1) f(2) f(3) f(4) f(5) f(6) f(7) f(8) f(9) f(10) f(11)
#define INIT(i) v a##i = x * (float)i;
#define STEP(i) a##i = a##i * x + y; __asm__("" : "+v"(a##i));
#define SUM(i) for (int j = 0; j < LANES; j++) s += a##i[j];
int main(void) {
  v x, y;
  for (int j = 0; j < LANES; j++) { x[j] = 0.999999f; y[j] = 1e-7f; }
  ALL(INIT)
  const long n = 4000000;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long k = 0; k < n; k++) { ALL(STEP) }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  float s = 0;
  ALL(SUM)
  const double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("%f %f\n", 2.0 * LANES * 12 * n / sec / 1e9, s);
  return 0;
}
"""


def fma_peak_gflops(cpu: str, lanes: int) -> float:
    """One core's float32 FMA throughput on ``lanes``-float vectors, built with ``-march=cpu``."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(_PEAK_C)
        subprocess.run(["cc", "-O3", f"-march={cpu}", f"-DLANES={lanes}", "-mfma", str(src), "-o", str(exe)],
                       check=True)
        return max(float(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()[0])
                   for _ in range(7))


def _producers(model: onnx.ModelProto) -> tuple[dict[str, onnx.NodeProto], dict[str, int]]:
    prod = {o: n for n in model.graph.node for o in n.output if o}
    return prod, {n.name: i for i, n in enumerate(model.graph.node)}


def kernel_nodes(kernels: list[dict], model: onnx.ModelProto) -> list[list[onnx.NodeProto]]:
    """The ONNX nodes of each aotc kernel: those on the way back from its writes to its reads."""
    prod, _ = _producers(model)
    consts = {i.name for i in model.graph.initializer}
    out = []
    for k in kernels:
        stop, seen, nodes = set(k["reads"]) | consts, set(), []
        todo = [w for w in k["writes"] if w in prod]
        while todo:
            n = prod[todo.pop()]
            if n.name in seen:
                continue
            seen.add(n.name)
            nodes.append(n)
            todo += [i for i in n.input if i and i not in stop and i in prod]
        out.append(nodes)
    return out


def conv_flops(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> float:
    """2 x multiply-adds of a Conv (or Gemm/MatMul) node from the inferred shapes, 0 for other ops."""
    if node.op_type == "Conv":
        w, y = shapes.get(node.input[1]), shapes.get(node.output[0])
        return 2.0 * float(np.prod(y)) * float(np.prod(w[1:])) if w and y else 0.0
    if node.op_type in ("Gemm", "MatMul"):
        a, y = shapes.get(node.input[0]), shapes.get(node.output[0])
        return 2.0 * float(np.prod(y)) * a[-1] if a and y else 0.0
    return 0.0


def ort_node_times(path: Path, feeds: dict, threads: int, runs: int) -> dict[str, float]:
    """Median microseconds per onnxruntime node name over ``runs`` profiled runs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for _ in range(3 + runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["name"][: -len("_kernel_time")]].append(float(e["dur"]))
    return {k: statistics.median(v[-runs:]) for k, v in per.items()}


def ort_owner(name: str, value_kernel: dict[str, int], node_kernel: dict[str, int]) -> int | None:
    """The aotc kernel holding the ONNX node that onnxruntime's node ``name`` computes."""
    base = name.removesuffix("_nchwc")
    if base in value_kernel:
        return value_kernel[base]
    parts = base.rstrip("/").split("/")
    for i in range(len(parts), 0, -1):  # fusions append their own name to the first node's
        cand = "/".join(parts[:i])
        if cand in node_kernel:
            return node_kernel[cand]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a timm model name: resnet18, resnet50, mobilenetv2_100, efficientnet_b0, ...")
    ap.add_argument("--target-cpu", default="x86-64-v4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25, help="kernels listed, slowest first")
    args = ap.parse_args()

    import real_models as rm

    import aotc
    from aotc.compiler import compile_model

    arch = rm.Arch(f"bench_{args.model}", rm._timm(args.model, image=224), "timm")
    rm.ARCHS[arch.name] = arch
    path, feeds = rm.exported(arch.name, 17, False)
    model = onnx.load(str(path))
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    shapes.update({i.name: list(i.dims) for i in model.graph.initializer})

    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
    lanes = 16 if args.target_cpu in ("x86-64-v4", "native") and avx512 else 8
    peak0 = fma_peak_gflops(args.target_cpu, lanes)
    with tempfile.TemporaryDirectory() as tmp:
        res = compile_model(model, tmp, "layers", target_cpu=args.target_cpu, profile=True)
        m = aotc.load(res.prefix, threads=args.threads)
        meta = m.metadata
        runs = [m.profile(feeds, iterations=1, warmup=3 if i == 0 else 0) for i in range(args.runs)]
    kernels = meta["kernels"]
    aotc_us = [statistics.median(r.kernels[i].total_ns / 1e3 for r in runs) for i in range(len(kernels))]
    nodes = kernel_nodes(kernels, model)
    value_kernel = {o: i for i, ns in enumerate(nodes) for n in ns for o in n.output}
    node_kernel = {n.name: i for i, ns in enumerate(nodes) for n in ns}
    ort_us = ort_node_times(path, feeds, args.threads, args.runs)
    ort_by_kernel: dict[int, float] = defaultdict(float)
    ort_apart: dict[str, float] = defaultdict(float)
    for name, us in ort_us.items():
        k = ort_owner(name, value_kernel, node_kernel)
        if k is None:
            ort_apart[name.split("_token")[0].rstrip("_")] += us
        else:
            ort_by_kernel[k] += us
    peak = max(peak0, fma_peak_gflops(args.target_cpu, lanes))  # the better of two, on a shared machine

    print(f"{args.model}, 224x224 batch 1, {args.threads} thread(s), aotc --target-cpu {args.target_cpu}; "
          f"measured FMA peak {peak:.0f} GFLOP/s ({lanes}-float vectors, 1 core); medians of {args.runs} runs")
    hdr = ["kernel", "ops", "aotc us", "ORT us", "aotc/ORT", "GFLOP/s", "% peak"]
    print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    order = sorted(range(len(kernels)), key=lambda i: -aotc_us[i])
    for i in order[: args.top]:
        flops = sum(conv_flops(n, shapes) for n in nodes[i])
        gf = flops / aotc_us[i] / 1e3 if aotc_us[i] else 0.0
        o = ort_by_kernel.get(i, 0.0)
        ops = "+".join(kernels[i]["ops"])
        ops = ops if len(ops) <= 40 else ops[:37] + "..."
        print(f"| {kernels[i]['name']} | {ops} | {aotc_us[i]:.1f} | {o:.1f} | "
              f"{aotc_us[i] / o if o else float('nan'):.2f} | {gf:.1f} | {100 * gf / peak:.0f} |")
    total_a, total_o = sum(aotc_us), sum(ort_us.values())
    print(f"\nkernels: aotc {total_a:.0f} us, onnxruntime {total_o:.0f} us (aotc/ORT {total_a / total_o:.2f}); "
          "onnxruntime nodes with no ONNX node (layout reorders): "
          + ", ".join(f"{k} {v:.0f} us" for k, v in sorted(ort_apart.items(), key=lambda kv: -kv[1])))
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for i, k in enumerate(kernels):
        fam = "Conv" if "Conv" in k["ops"] else k["ops"][0] if k["ops"] else k["kind"]
        by_op[fam][0] += aotc_us[i]
        by_op[fam][1] += ort_by_kernel.get(i, 0.0)
    print("by kernel family (a kernel with a Conv counts as Conv): "
          + ", ".join(f"{f} {a:.0f}/{o:.0f} us" for f, (a, o) in sorted(by_op.items(), key=lambda kv: -kv[1][0])))


if __name__ == "__main__":
    main()
