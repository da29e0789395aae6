"""The cost of a dynamic batch: ``aotc compile --dynamic batch<=B`` against libraries compiled for exactly
each size, timed from C in one program (alternating rounds; medians, and minimums, which other jobs
on a shared machine disturb less), so Python's call overhead is not in the numbers.

    python benchmarks/dynamic_dims.py --model mlp --bound 32 --sizes 1 8 13 32
    python benchmarks/dynamic_dims.py --model resnet18 --bound 8 --sizes 1 3 7 8
    python benchmarks/dynamic_dims.py --model bert-seq --sizes 16 32 64 128   # --dynamic seq=16,32,64,128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

HARNESS = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "dyn.h"
{includes}

static double now(void) {{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}}
static int cmp(const void *a, const void *b) {{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}}

int main(void) {{
  size_t ws_bytes = DYN_WORKSPACE_BYTES;
{ws_sizes}
  void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
  void *in[DYN_NUM_INPUTS], *out[DYN_NUM_OUTPUTS];
  for (int i = 0; i < DYN_NUM_INPUTS; i++) in[i] = calloc({max_in}, 1);
  for (int i = 0; i < DYN_NUM_OUTPUTS; i++) out[i] = calloc({max_out}, 1);
  enum {{ ROUNDS = {rounds} }};
  static double te[ROUNDS], td[ROUNDS];
{runs}
  return 0;
}}
"""

RUN = r"""
  {{
    int64_t n = {n};
    for (int r = 0; r < ROUNDS; r++) {{
      double t0 = now();
      if (ex{n}_run_v((const void *const *)in, out, ws)) return 1;
      double t1 = now();
      if (dyn_run_dims_parallel(&n, (const void *const *)in, out, ws, ws_bytes, 0)) return 2;
      td[r] = now() - t1;
      te[r] = t1 - t0;
    }}
    qsort(te, ROUNDS, sizeof(double), cmp);
    qsort(td, ROUNDS, sizeof(double), cmp);
    printf("%d %.9f %.9f %.9f %.9f\n", {n}, te[ROUNDS / 2], td[ROUNDS / 2], te[0], td[0]);
  }}
"""


def model(kind: str) -> tuple[onnx.ModelProto, str, int]:
    """The model with a symbolic dimension, that dimension's name and its axis in the inputs."""
    if kind == "mlp":
        from models import mlp

        m = mlp(1, sizes=(784, 512, 512, 10))
        for t in (m.graph.input[0], m.graph.output[0]):
            t.type.tensor_type.shape.dim[0].dim_param = "batch"
        return m, "batch", 0
    import warnings

    import real_models as rm
    import torch

    arch = {"resnet18": "bench_resnet18", "bert": "bench_bert", "bert-seq": "bench_bert"}[kind]
    if kind == "resnet18":
        rm.ARCHS[arch] = rm.Arch(arch, rm._timm("resnet18", image=224), "timm")
    else:
        from bench_models import _bert_4l_256

        rm.ARCHS[arch] = rm.Arch(arch, _bert_4l_256, "transformers")
    module, feeds = rm.ARCHS[arch].build()
    dim, axis = ("seq", 1) if kind == "bert-seq" else ("batch", 0)
    with tempfile.TemporaryDirectory() as d, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feeds.values()), f"{d}/m.onnx",
                          opset_version=17, dynamo=False, input_names=list(feeds), output_names=["y"],
                          dynamic_axes={k: {axis: dim} for k in [*feeds, "y"]})
        m = onnx.load(f"{d}/m.onnx")
    m.ir_version = min(m.ir_version, 9)
    return m, dim, axis


def main() -> None:
    from aotc.compiler import compile_model
    from aotc.dynamic_library import compile_dynamic

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "resnet18", "bert", "bert-seq"], default="mlp",
                    help="bert-seq: BERT with a dynamic sequence length, compiled for the sizes listed")
    ap.add_argument("--bound", type=int, default=32)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--target-cpu", default=None, help="e.g. x86-64-v3 (AVX2) or x86-64-v4 (AVX-512)")
    ap.add_argument("--out", default=None, help="build directory (default: a temporary one)")
    args = ap.parse_args()
    m, dim, axis = model(args.model)
    out = Path(args.out or tempfile.mkdtemp(prefix="aotc-dyn-bench-"))
    spec = f"{dim}={','.join(map(str, args.sizes))}" if axis else f"{dim}<={args.bound}"
    res = compile_dynamic(m, out, "dyn", [spec], target_cpu=args.target_cpu)
    for n in args.sizes:
        shapes = {vi.name: tuple(n if i == axis else d.dim_value for i, d in enumerate(vi.type.tensor_type.shape.dim))
                  for vi in m.graph.input if vi.name not in {t.name for t in m.graph.initializer}}
        compile_model(m, out, f"ex{n}", input_shapes=shapes, target_cpu=args.target_cpu)
    meta = json.loads((out / "dyn.json").read_text())
    nbytes = {t["name"]: np.dtype(t["dtype"]).itemsize * int(np.prod(t["shape"]))
              for t in meta["inputs"] + meta["outputs"]}
    harness = HARNESS.format(
        includes="\n".join(f'#include "ex{n}.h"' for n in args.sizes),
        ws_sizes="\n".join(f"  if (EX{n}_WORKSPACE_BYTES > ws_bytes) ws_bytes = EX{n}_WORKSPACE_BYTES;"
                           for n in args.sizes),
        max_in=max(nbytes[t["name"]] for t in meta["inputs"]), max_out=max(nbytes[t["name"]] for t in meta["outputs"]),
        rounds=args.rounds, runs="".join(RUN.format(n=n) for n in args.sizes))
    (out / "bench.c").write_text(harness)
    libs = [str(out / "libdyn.a"), *(str(out / f"libex{n}.a") for n in args.sizes)]
    subprocess.run(["cc", "-O2", "-std=c11", f"-I{out}", str(out / "bench.c"), *libs, "-lm", "-pthread", "-o",
                    str(out / "bench")], check=True)
    lines = subprocess.run([str(out / "bench")], capture_output=True, text=True, check=True).stdout.split("\n")
    isa = meta["isa"]
    print(f"{args.model}, --dynamic {spec} (cores {res.cores}), {isa} kernels, "
          f"--target-cpu {meta['target_cpu']}, 1 thread, {args.rounds} alternating rounds")
    print(f"| {dim} | exact library (median) | dynamic library (median) | dynamic / exact (median) | "
          "dynamic / exact (minimum) |")
    print("|---|---|---|---|---|")
    for line in filter(None, lines):
        n, te, td, me, md = line.split()
        print(f"| {n} | {float(te) * 1e3:.3f} ms | {float(td) * 1e3:.3f} ms | {float(td) / float(te):.3f} | "
              f"{float(md) / float(me):.3f} |")


if __name__ == "__main__":
    main()
