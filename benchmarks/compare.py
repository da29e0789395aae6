"""aotc beside onnxruntime and numpy, measured in the same run; prints medians and ratios.

    python benchmarks/compare.py [--threads 1] [--quick]

Cases: reduce_sum(x + y*z) over 16M floats, and the MLP 784-512-512-10 at batch 1 and 64 (plus its
compile time). Medians over many iterations after warm-up; ratios > 1 mean aotc is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _median_seconds(fn, min_iters: int, min_time: float) -> float:
    for _ in range(3):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import numpy as np
    import onnxruntime as ort
    from models import mlp, reduce_sum_xyz

    import aotc
    from aotc.compiler import compile_model

    iters, secs = (5, 0.2) if args.quick else (50, 2.0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        n = 1 << 24
        rng = np.random.default_rng(0)
        xyz = {k: rng.standard_normal(n).astype(np.float32) for k in "xyz"}
        cases.append(("reduce_sum(x+y*z) 16M", reduce_sum_xyz(n), xyz,
                      lambda f: np.sum(f["x"] + f["y"] * f["z"])))
        for batch in (1, 64):
            model = mlp(batch)
            feeds = {"x": rng.standard_normal((batch, 784)).astype(np.float32)}
            ws = _weights(model)

            def np_mlp(f, ws=ws):
                h = np.maximum(f["x"] @ ws[0] + ws[1], 0)
                h = np.maximum(h @ ws[2] + ws[3], 0)
                return h @ ws[4] + ws[5]
            cases.append((f"MLP 784-512-512-10 b{batch}", model, feeds, np_mlp))
        for i, (label, model, feeds, np_fn) in enumerate(cases):
            t0 = time.perf_counter()
            # One directory and name per case: a process cannot dlopen two libraries from one path.
            res = compile_model(model, Path(tmp) / f"case{i}", f"bench{i}")
            compile_s = time.perf_counter() - t0
            m = aotc.load(res.prefix)
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            t_aotc = _median_seconds(lambda m=m, f=feeds: m.run(f), iters, secs)
            t_ort = _median_seconds(lambda s=sess, f=feeds: s.run(None, f), iters, secs)
            t_np = _median_seconds(lambda fn=np_fn, f=feeds: fn(f), iters, secs)
            err = float(np.max(np.abs(m.run(feeds)[0] - sess.run(None, feeds)[0])))
            rows.append((label, compile_s, t_aotc, t_ort, t_np, err, res.num_kernels))
    print(f"threads={args.threads}")
    print(f"{'case':28s} {'compile s':>9s} {'kernels':>7s} {'aotc us':>10s} {'ort us':>10s} {'numpy us':>10s} "
          f"{'ort/aotc':>8s} {'np/aotc':>8s} {'max err':>9s}")
    for label, c, a, o, p, err, k in rows:
        print(f"{label:28s} {c:9.2f} {k:7d} {a * 1e6:10.1f} {o * 1e6:10.1f} {p * 1e6:10.1f} {o / a:8.2f} "
              f"{p / a:8.2f} {err:9.2e}")


def _weights(model):
    from onnx import numpy_helper

    return [numpy_helper.to_array(t) for t in model.graph.initializer]


if __name__ == "__main__":
    main()
