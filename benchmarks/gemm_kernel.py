"""Benchmark the generated GEMM kernels against numpy's (OpenBLAS) single-threaded sgemm.

Usage: python benchmarks/gemm_kernel.py [--isa avx2] [--cflags "-O3 -march=native"] [--quick]

Both sides run in this process on the same data; each number is the median of many timed batches after
warm-up.  The kernel is timed by a C loop (no Python call overhead per iteration); numpy by a Python loop
over ``np.matmul(a, b, out=c)`` (about a microsecond of overhead per call, visible only at M=1).
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # must precede the numpy import
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cffi  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aotc.codegen.gemm import ISAS, GemmSpec, pack_b, plan_gemm, render_gemm, scratch_bytes  # noqa: E402

# (label, M, N, K, b_const)
CASES = [
    ("square 256", 256, 256, 256, False),
    ("square 1024", 1024, 1024, 1024, False),
    ("square 2048", 2048, 2048, 2048, False),
    ("square 1024 (B const)", 1024, 1024, 1024, True),
    ("mlp M=1 784->512", 1, 512, 784, True),
    ("mlp M=1 512->512", 1, 512, 512, True),
    ("mlp M=1 512->10", 1, 10, 512, True),
    ("mlp M=64 784->512", 64, 512, 784, True),
    ("mlp M=64 512->512", 64, 512, 512, True),
    ("mlp M=64 512->10", 64, 10, 512, True),
]


def _aligned(n: int) -> np.ndarray:
    raw = np.zeros(n + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n]


def _build(specs: list[GemmSpec], cflags: list[str], workdir: Path) -> tuple[cffi.FFI, object]:
    parts, decls = [], []
    for s in specs:
        parts.append(render_gemm(s))
        proto = (f"void bench_{s.fn}(const float *A, const float *B, float *C, float *scratch, size_t iters)")
        decls.append(proto + ";")
        parts.append(f"{proto};\n{proto}\n{{\n    for (size_t it = 0; it < iters; ++it)\n"
                     f"        {s.fn}(A, B, C, scratch, 0, 1);\n}}\n")
    src = workdir / "bench_gemm.c"
    lib = workdir / "bench_gemm.so"
    src.write_text("\n".join(parts))
    cmd = ["cc", *cflags, "-std=c11", "-Wall", "-Wextra", "-shared", "-fPIC", str(src), "-o", str(lib)]
    subprocess.run(cmd, check=True)
    ffi = cffi.FFI()
    ffi.cdef("\n".join(decls))
    return ffi, ffi.dlopen(str(lib))


def _calibrate(fn, min_batch_s: float) -> int:
    """Calls per timed batch so one batch lasts about ``min_batch_s`` (after one warm-up call)."""
    fn(1)
    t = time.perf_counter()
    fn(1)
    one = max(time.perf_counter() - t, 1e-7)
    reps = max(1, int(min_batch_s / one))
    fn(reps)  # warm-up: caches, page faults, frequency
    return reps


def _time_pair(fa, fb, min_batch_s: float, batches: int) -> tuple[list[float], list[float]]:
    """Seconds per call of fa and fb, timed in alternating batches so that noise from other processes on
    the machine hits both sides alike."""
    ra, rb = _calibrate(fa, min_batch_s), _calibrate(fb, min_batch_s)
    ta, tb = [], []
    for _ in range(batches):
        t = time.perf_counter()
        fa(ra)
        ta.append((time.perf_counter() - t) / ra)
        t = time.perf_counter()
        fb(rb)
        tb.append((time.perf_counter() - t) / rb)
    return ta, tb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--cflags", default="-O3 -march=native")
    ap.add_argument("--quick", action="store_true", help="shorter timing batches")
    ap.add_argument("--only", default="", help="substring filter on case labels")
    ap.add_argument("--kc", type=int, help="override the ISA's K block cap (tuning)")
    ap.add_argument("--mc", type=int, help="override the ISA's M block cap (tuning)")
    ap.add_argument("--nc", type=int, help="override the ISA's N block cap (tuning)")
    args = ap.parse_args()
    overrides = {k: v for k, v in (("kc", args.kc), ("mc", args.mc), ("nc", args.nc)) if v}
    if overrides:
        ISAS[args.isa] = dataclasses.replace(ISAS[args.isa], **overrides)
    cases = [c for c in CASES if args.only in c[0]]
    min_batch = 0.02 if args.quick else 0.1
    batches = 7 if args.quick else 15
    specs = [GemmSpec(f"g{i}", m, n, k, b_const=bc, isa=args.isa) for i, (_, m, n, k, bc) in enumerate(cases)]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        ffi, lib = _build(specs, shlex.split(args.cflags), Path(tmp))
        print(f"isa={args.isa} cflags='{args.cflags}' numpy={np.__version__} (OPENBLAS_NUM_THREADS=1)")
        print("GFLOP/s, median and best of the timed batches")
        print(f"{'case':24s} {'KC':>4s} {'MC':>4s} {'NC':>5s} {'aotc':>8s} {'numpy':>8s} {'ratio':>6s}"
              f" {'aotc*':>8s} {'numpy*':>8s} {'ratio*':>6s}")
        for (label, m, n, k, bc), spec in zip(cases, specs, strict=True):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            c = np.empty((m, n), dtype=np.float32)
            c_np = np.empty((m, n), dtype=np.float32)
            if bc:
                packed = pack_b(b, spec).reshape(-1)
                b_buf = _aligned(packed.size)
                b_buf[:] = packed
            else:
                b_buf = b
            scratch = _aligned(max(16, scratch_bytes(spec, 1) // 4))
            kern = getattr(lib, f"bench_{spec.fn}")
            pa, pb, pc, ps = (ffi.from_buffer("float[]", x) for x in (a, b_buf, c, scratch))

            def run_kernel(reps: int, kern=kern, pa=pa, pb=pb, pc=pc, ps=ps) -> None:
                kern(pa, pb, pc, ps, reps)

            def run_numpy(reps: int, a=a, b=b, c_np=c_np) -> None:
                for _ in range(reps):
                    np.matmul(a, b, out=c_np)

            flops = 2.0 * m * n * k
            t_k, t_n = _time_pair(run_kernel, run_numpy, min_batch, batches)
            err = np.abs(c - c_np).max() / (np.abs(c_np).max() + 1e-30)
            assert err < 1e-4, f"{label}: wrong result (rel err {err})"
            plan = plan_gemm(spec)
            gk, gn = flops / np.median(t_k) / 1e9, flops / np.median(t_n) / 1e9
            bk, bn = flops / min(t_k) / 1e9, flops / min(t_n) / 1e9
            print(f"{label:24s} {plan.kc:4d} {plan.mc:4d} {plan.nc:5d} {gk:8.1f} {gn:8.1f} {gk / gn:6.2f}"
                  f" {bk:8.1f} {bn:8.1f} {bk / bn:6.2f}", flush=True)


if __name__ == "__main__":
    main()
