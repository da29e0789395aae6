"""Benchmark the generated GEMM kernels against numpy's (OpenBLAS) sgemm.

Usage: python benchmarks/gemm_kernel.py [--isa avx2] [--cflags "-O3 -march=native"] [--quick] [--threads N]

Both sides run in this process on the same data; each number is the median of many timed batches after
warm-up.  The kernel is timed by a C loop (no Python call overhead per iteration); numpy by a Python loop
over ``np.matmul(a, b, out=c)`` (about a microsecond of overhead per call, visible only at M=1).  With
``--threads N`` the kernel runs as N tasks on the pool that compiled models bundle (templates/pool.c.j2),
as a model's run does, and OpenBLAS gets N threads.
"""

from __future__ import annotations

import os
import sys


def _threads_arg(argv: list[str]) -> int:
    """--threads from the command line, read before numpy is imported (OpenBLAS reads its thread count then)."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return 1


os.environ["OPENBLAS_NUM_THREADS"] = str(_threads_arg(sys.argv))  # must precede the numpy import
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cffi  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aotc.codegen.gemm import render_gemm  # noqa: E402
from aotc.codegen.library import env  # noqa: E402
from aotc.ops.gemm_plan import GemmSpec, gemm_params, pack_b, plan_gemm, scratch_bytes  # noqa: E402
from aotc.target import L1D_BYTES, L2_BYTES  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    m: int
    n: int
    k: int
    b_const: bool = False
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    b_shared: bool = False  # batch > 1: one B for all batch entries (weights) instead of one per entry


# The sizes the project tracks: square GEMMs and the MLP 784-512-512-10 at batch 1 and 64 (weights const).
CASES = [
    Case("square 256", 256, 256, 256),
    Case("square 1024", 1024, 1024, 1024),
    Case("square 2048", 2048, 2048, 2048),
    Case("square 1024 (B const)", 1024, 1024, 1024, b_const=True),
    Case("mlp M=1 784->512", 1, 512, 784, b_const=True),
    Case("mlp M=1 512->512", 1, 512, 512, b_const=True),
    Case("mlp M=1 512->10", 1, 10, 512, b_const=True),
    Case("mlp M=64 784->512", 64, 512, 784, b_const=True),
    Case("mlp M=64 512->512", 64, 512, 512, b_const=True),
    Case("mlp M=64 512->10", 64, 10, 512, b_const=True),
]
# --all adds other shapes that real models produce: im2col convolutions, transposed weights, attention.
EXTRA_CASES = [
    Case("odd 1000x1000x1000", 1000, 1000, 1000),
    Case("conv 3136x64x576 const", 3136, 64, 576, b_const=True),
    Case("conv 196x256x2304 const", 196, 256, 2304, b_const=True),
    Case("fc 50x4096x1024 constT", 50, 4096, 1024, b_const=True, trans_b=True),
    Case("fc 1x1000x2048 const", 1, 1000, 2048, b_const=True),
    Case("gemv 1x512x512 run-time", 1, 512, 512),
    Case("qk^T 512x512x64 transB", 512, 512, 64, trans_b=True),
    Case("A^T 512x512x512", 512, 512, 512, trans_a=True),
    Case("attn 12x128x128x64", 128, 128, 64, batch=12),
    Case("batch 8x64x512x512 Wshr", 64, 512, 512, b_const=True, batch=8, b_shared=True),
    Case("small M=4 784->512", 4, 512, 784, b_const=True),
    Case("small M=8 784->512", 8, 512, 784, b_const=True),
    Case("small M=16 784->512", 16, 512, 784, b_const=True),
    Case("small M=32 784->512", 32, 512, 784, b_const=True),
]


def _aligned(n: int) -> np.ndarray:
    raw = np.zeros(n + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n]


def _build(specs: list[GemmSpec], cflags: list[str], workdir: Path) -> tuple[cffi.FFI, object]:
    """One library: every kernel (``g0``, ``g1``, ... in ``specs``' order), a C timing loop per kernel
    (ntasks tasks per call, on the pool when ntasks > 1), and the bundled pool rendered as bench_pool_create."""
    parts = ['#include "bench.h"', "typedef struct { const float *A, *B; float *C, *S; size_t nt; } bench_job;"]
    decls = ["typedef struct aotc_parallel aotc_parallel;", "aotc_parallel *bench_pool_create(size_t num_threads);",
             "void bench_pool_destroy(aotc_parallel *pool);"]
    for i, s in enumerate(specs):
        fn = f"g{i}"
        parts.append(render_gemm(plan_gemm(s), fn))
        parts.append(f"static void task_{fn}(void *p, size_t t) {{\n    const bench_job *j = (const bench_job *)p;\n"
                     f"    {fn}(j->A, j->B, j->C, j->S, t, j->nt);\n}}")
        proto = (f"void bench_{fn}(const float *A, const float *B, float *C, float *scratch, size_t iters, "
                 "aotc_parallel *par, size_t ntasks)")
        decls.append(proto + ";")
        parts.append(f"{proto};\n{proto}\n{{\n    bench_job j = {{A, B, C, scratch, ntasks}};\n"
                     f"    for (size_t it = 0; it < iters; ++it) {{\n"
                     f"        if (ntasks > 1) par->run(par->ctx, ntasks, task_{fn}, &j);\n"
                     f"        else task_{fn}(&j, 0);\n    }}\n}}\n")
    # The pool needs from a model header only the aotc_parallel interface, which has one template.
    (workdir / "bench.h").write_text("#include <stddef.h>\n" + env().get_template("parallel.h.j2").render())
    (workdir / "bench_pool.c").write_text(env().get_template("pool.c.j2").render(name="bench", version="benchmark",
                                                                               api=""))
    src = workdir / "bench_gemm.c"
    lib = workdir / "bench_gemm.so"
    src.write_text("\n".join(parts))
    cmd = ["cc", *cflags, "-std=c11", "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread", "-I", str(workdir),
           str(src), str(workdir / "bench_pool.c"), "-o", str(lib)]
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


def _time_pair(fa, fb, min_batch_s: float, batches: int, settle_s: float = 0.0) -> tuple[list[float], list[float]]:
    """Seconds per call of fa and fb, timed in alternating batches so that noise from other processes on
    the machine hits both sides alike.  ``settle_s``: a pause after each batch, so that threads which spin
    after their work (OpenBLAS's, the pool's) are asleep before the other side's batch."""
    ra, rb = _calibrate(fa, min_batch_s), _calibrate(fb, min_batch_s)
    ta, tb = [], []
    for _ in range(batches):
        time.sleep(settle_s)
        t = time.perf_counter()
        fa(ra)
        ta.append((time.perf_counter() - t) / ra)
        time.sleep(settle_s)
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
    ap.add_argument("--all", action="store_true", help="also run the extra shapes")
    ap.add_argument("--batches", type=int, help="timed batches per side (default 15, 7 with --quick)")
    ap.add_argument("--kc", type=int, help="override the ISA's K block cap (tuning)")
    ap.add_argument("--mc", type=int, help="override the ISA's M block cap (tuning)")
    ap.add_argument("--nc", type=int, help="override the ISA's N block cap (tuning)")
    ap.add_argument("--threads", type=int, default=1, help="tasks per call on the bundled pool (and OpenBLAS threads)")
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    default = gemm_params(args.isa, L1D_BYTES, L2_BYTES)
    blocking = ((args.kc or default.kc, args.mc or default.mc, args.nc or default.nc)
                if args.kc or args.mc or args.nc else None)
    cases = [c for c in CASES + (EXTRA_CASES if args.all else []) if args.only in c.label]
    min_batch = 0.02 if args.quick else 0.1
    batches = args.batches or (7 if args.quick else 15)
    specs = [GemmSpec(c.m, c.n, c.k, batch=c.batch, a_batch_stride=c.m * c.k,
                      b_batch_stride=0 if c.b_shared else c.k * c.n, c_batch_stride=c.m * c.n,
                      trans_a=c.trans_a, trans_b=c.trans_b, b_const=c.b_const, isa=args.isa,
                      blocking=blocking)
             for c in cases]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        ffi, lib = _build(specs, shlex.split(args.cflags), Path(tmp))
        pool = lib.bench_pool_create(args.threads) if args.threads > 1 else ffi.NULL
        if pool == ffi.NULL and args.threads > 1:
            raise SystemExit(f"cannot start {args.threads} threads")
        print(f"isa={args.isa} cflags='{args.cflags}' numpy={np.__version__} "
              f"(OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}), {args.threads} task(s) per call")
        print("GFLOP/s, median and best of the timed batches")
        print(f"{'case':24s} {'KC':>4s} {'MC':>4s} {'NC':>5s} {'aotc':>8s} {'numpy':>8s} {'ratio':>6s}"
              f" {'aotc*':>8s} {'numpy*':>8s} {'ratio*':>6s}")
        for i, (case, spec) in enumerate(zip(cases, specs, strict=True)):
            m, n, k, nb = case.m, case.n, case.k, case.batch
            a = rng.standard_normal((nb, k, m) if case.trans_a else (nb, m, k)).astype(np.float32)
            b = rng.standard_normal((1 if case.b_shared else nb,) + ((n, k) if case.trans_b else (k, n)))
            b = b.astype(np.float32)
            # numpy gets the same storage, as transposed views where the spec says so (BLAS handles those).
            a_op = a.transpose(0, 2, 1) if case.trans_a else a
            b_op = b.transpose(0, 2, 1) if case.trans_b else b
            if nb == 1:
                a_op, b_op = a_op[0], b_op[0]
            c = np.empty((nb, m, n), dtype=np.float32)
            c_np = np.empty((nb, m, n) if nb > 1 else (m, n), dtype=np.float32)
            if case.b_const:
                packed = pack_b(b, spec).reshape(-1)
                b_buf = _aligned(packed.size)
                b_buf[:] = packed
            else:
                b_buf = b
            scratch = _aligned(max(16, scratch_bytes(spec, args.threads) // 4))
            kern = getattr(lib, f"bench_g{i}")
            pa, pb, pc, ps = (ffi.from_buffer("float[]", x) for x in (a, b_buf, c, scratch))

            def run_kernel(reps: int, kern=kern, pa=pa, pb=pb, pc=pc, ps=ps) -> None:
                kern(pa, pb, pc, ps, reps, pool, args.threads)

            def run_numpy(reps: int, a=a_op, b=b_op, c_np=c_np) -> None:
                for _ in range(reps):
                    np.matmul(a, b, out=c_np)

            flops = 2.0 * m * n * k * nb
            t_k, t_n = _time_pair(run_kernel, run_numpy, min_batch, batches, 0.2 if args.threads > 1 else 0.0)
            err = np.abs(c.reshape(c_np.shape) - c_np).max() / (np.abs(c_np).max() + 1e-30)
            assert err < 1e-4, f"{case.label}: wrong result (rel err {err})"
            plan = plan_gemm(spec)
            gk, gn = flops / np.median(t_k) / 1e9, flops / np.median(t_n) / 1e9
            bk, bn = flops / min(t_k) / 1e9, flops / min(t_n) / 1e9
            print(f"{case.label:24s} {plan.kc:4d} {plan.mc:4d} {plan.nc:5d} {gk:8.1f} {gn:8.1f} {gk / gn:6.2f}"
                  f" {bk:8.1f} {bn:8.1f} {bk / bn:6.2f}", flush=True)
        if pool != ffi.NULL:
            lib.bench_pool_destroy(pool)


if __name__ == "__main__":
    main()
