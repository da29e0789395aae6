"""Tests for the GEMM planner and generator (aotc/ops/gemm_plan.py, aotc/codegen/gemm.py + templates/gemm.c.j2).

Every case renders one GEMM with its own function name; all cases of an ISA go into a few C files that are
compiled once, concurrently, with the project's warning flags (-Wall -Wextra -Werror), so the whole file
costs a handful of compiler runs instead of one per case.  Each case is then called through cffi's ABI
mode and compared with a float64 numpy reference.  Splitting into tasks must give bit-identical results,
also when the tasks really run at once on threads (cffi releases the GIL during calls).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

try:
    from aotc.codegen.gemm import render_gemm
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aotc.codegen.gemm import render_gemm
from aotc.ops.gemm_plan import GemmSpec, pack_b, packed_b_shape, plan_gemm, scratch_bytes

cffi = pytest.importorskip("cffi")

CC = os.environ.get("CC", "cc")
BASE_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Werror"]
X86 = os.uname().machine in ("x86_64", "amd64")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


HAVE_AVX2 = X86 and {"avx2", "fma"} <= _cpu_flags()
RUN_ISAS = ["avx2", "generic"] if HAVE_AVX2 else ["generic"]
ISA_FLAGS = {"avx2": ["-march=x86-64-v3"], "generic": ["-march=x86-64"] if X86 else [], "neon": [], "avx512": []}
NATIVE = RUN_ISAS[0]

EPI = "v = v + bias[j] + 0.25f * (float)b + 0.001f * (float)i; v = (v < 0.0f ? 0.0f : v);"
EPI_PARAMS = ", const float *restrict bias"

# A stand-in for <arm_neon.h> built on GCC vector extensions, so the NEON variant (8x12 tiles, its own
# edge cases) runs on any host.  Only the intrinsics the template uses are provided.
FAKE_NEON = """
#ifndef FAKE_ARM_NEON_H
#define FAKE_ARM_NEON_H
#include <string.h>
typedef float float32x4_t __attribute__((vector_size(16)));
static inline float32x4_t vdupq_n_f32(float x) { float32x4_t v = {x, x, x, x}; return v; }
static inline float32x4_t vld1q_f32(const float *p) { float32x4_t v; memcpy(&v, p, sizeof v); return v; }
static inline float32x4_t vld1q_dup_f32(const float *p) { return vdupq_n_f32(*p); }
static inline void vst1q_f32(float *p, float32x4_t v) { memcpy(p, &v, sizeof v); }
static inline float32x4_t vaddq_f32(float32x4_t a, float32x4_t b) { return a + b; }
static inline float32x4_t vfmaq_f32(float32x4_t a, float32x4_t b, float32x4_t c) { return a + b * c; }
#endif
"""


# The same trick for AVX-512 (12x32 tiles): a stand-in <immintrin.h>, found first through -I; the test
# strips the functions' target("avx512f") attribute so no AVX-512 instruction is emitted.
FAKE_AVX512 = """
#ifndef FAKE_IMMINTRIN_H
#define FAKE_IMMINTRIN_H
#include <string.h>
typedef float __m512 __attribute__((vector_size(64)));
static inline __m512 _mm512_setzero_ps(void) { __m512 v = {0}; return v; }
static inline __m512 _mm512_set1_ps(float x) { __m512 v = {0}; return v + x; }
static inline __m512 _mm512_loadu_ps(const float *p) { __m512 v; memcpy(&v, p, sizeof v); return v; }
static inline void _mm512_storeu_ps(float *p, __m512 v) { memcpy(p, &v, sizeof v); }
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return a + b; }
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { return a * b + c; }
#endif
"""
AVX512_ATTR = '__attribute__((target("avx512f"))) '


@dataclass
class Case:
    """One generated GEMM and how to check it."""

    m: int
    n: int
    k: int
    isa: str
    batch: int = 1
    a_stride: int = 0
    b_stride: int = 0
    c_stride: int = 0
    trans_a: bool = False
    trans_b: bool = False
    b_const: bool = False
    epilogue: bool = False
    ntasks: tuple[int, ...] = (1, 3)
    threads: bool = False
    fn: str = field(init=False)
    spec: GemmSpec = field(init=False)

    def make_spec(self, fn: str) -> None:
        self.fn = fn
        self.spec = GemmSpec(self.m, self.n, self.k, batch=self.batch, a_batch_stride=self.a_stride,
                             b_batch_stride=self.b_stride, c_batch_stride=self.c_stride, trans_a=self.trans_a,
                             trans_b=self.trans_b, b_const=self.b_const, isa=self.isa)

    @property
    def id(self) -> str:
        flags = "".join(c for c, on in (("A", self.trans_a), ("B", self.trans_b), ("c", self.b_const),
                                        ("e", self.epilogue), ("t", self.threads)) if on)
        batch = f"-b{self.batch}a{self.a_stride}b{self.b_stride}" if self.batch > 1 else ""
        return f"{self.isa}-{self.m}x{self.n}x{self.k}{batch}-{flags or 'plain'}"


def _cases() -> Iterator[Case]:
    sizes = [(1, 1, 1), (1, 3, 17), (3, 17, 1), (17, 3, 64), (64, 127, 300), (127, 64, 17), (300, 17, 127),
             (6, 16, 256), (7, 33, 257), (5, 100, 520), (2, 48, 40), (13, 10, 512), (128, 128, 513)]
    for isa in RUN_ISAS:
        # The fastest ISA of this host gets the full matrix; the portable fallback every other entry (its
        # tile shape differs, so it still meets every code path), which keeps the compile time down.
        def pick(seq: list, isa: str = isa) -> list:
            return seq if isa == NATIVE else seq[::2]

        for m, n, k in sizes:
            for b_const in pick([False, True]) if isa == NATIVE else [(m + n + k) % 2 == 0]:
                yield Case(m, n, k, isa, b_const=b_const)
        for trans_a, trans_b in ((True, False), (False, True), (True, True)):
            for m, n, k, b_const in pick([(1, 17, 64, False), (5, 33, 300, True), (64, 127, 300, False),
                                          (127, 64, 17, True), (300, 40, 257, False), (3, 3, 3, True),
                                          (40, 13, 70, False)]):
                yield Case(m, n, k, isa, trans_a=trans_a, trans_b=trans_b, b_const=b_const)
        # Batches: shared A or B (stride 0) and strides with gaps, which must be honoured.
        for a_shared, b_shared in ((False, False), (True, False), (False, True)):
            for m, n, k, b_const, trans_b in pick([(3, 17, 64, False, False), (65, 40, 100, False, True),
                                                   (17, 33, 127, True, False), (1, 10, 300, True, True)]):
                yield Case(m, n, k, isa, batch=3, a_stride=0 if a_shared else m * k + 5,
                           b_stride=0 if b_shared else k * n + 3, c_stride=m * n + 7, trans_b=trans_b,
                           b_const=b_const, ntasks=(1, 2, 3, 7))
        for m, n, k, b_const in pick([(1, 512, 784, True), (64, 10, 512, True), (70, 45, 300, False),
                                      (5, 21, 33, False), (127, 300, 64, True)]):
            yield Case(m, n, k, isa, batch=2, a_stride=m * k, c_stride=m * n, b_const=b_const, epilogue=True,
                       ntasks=(1, 3, 4))
    for m, n, k, b_const in ((300, 300, 300, False), (64, 512, 784, True), (600, 40, 200, True),
                             (7, 1000, 64, False), (20, 100, 1500, True)):
        yield Case(m, n, k, NATIVE, b_const=b_const, epilogue=True, threads=True, ntasks=(1, 2, 3, 5))
    # Leftover rows re-cut into MR - 1 row panels (one M block, tasks split columns): with a partial last
    # column panel, with A^T read in place, with a run-time B.
    for m, n, k, b_const, trans_a in ((16, 40, 70, True, False), (32, 20, 50, False, True),
                                      (64, 72, 33, False, False), (28, 100, 20, True, True)):
        yield Case(m, n, k, NATIVE, b_const=b_const, trans_a=trans_a, epilogue=True, ntasks=(1, 2, 3))
    # Several blocks along every dimension (K > KC, M > MC, N > NC).
    yield Case(300, 3100, 700, NATIVE, ntasks=(1, 2))
    yield Case(257, 3100, 700, NATIVE, b_const=True, ntasks=(1, 2))
    for m, n, k, b_const, trans_a, trans_b in ((29, 45, 70, False, False, False), (8, 12, 300, True, False, True),
                                               (3, 25, 40, False, True, False), (50, 7, 130, True, True, True),
                                               (9, 24, 20, False, False, False)):
        for isa in ("neon", "avx512"):
            yield Case(m, n, k, isa, batch=2, a_stride=m * k, c_stride=m * n, b_const=b_const, trans_a=trans_a,
                       trans_b=trans_b, epilogue=True)
    yield Case(12, 64, 50, "avx512", b_const=True)
    yield Case(13, 100, 300, "avx512", trans_b=True)


CASES = list(_cases())
for _i, _c in enumerate(CASES):
    _c.make_spec(f"g{_i}")


def _aligned(n_floats: int) -> np.ndarray:
    """A float32 array whose data is 64-byte aligned, as callers of the generated code guarantee."""
    raw = np.zeros(n_floats + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n_floats]


def _entry(case: Case) -> str:
    """An exported run_<fn>() with one fixed signature, forwarding to the static generated function."""
    fn = case.fn
    sig = (f"void run_{fn}(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,"
           " const float *bias)")
    call = f"{fn}(A, B, C, scratch, task, ntasks, bias);" if case.epilogue else \
        f"(void)bias; {fn}(A, B, C, scratch, task, ntasks);"
    return f"{sig};\n{sig}\n{{\n    {call}\n}}\n"


def _source(cases: list[Case]) -> str:
    parts = []
    for c in cases:
        parts.append(render_gemm(plan_gemm(c.spec), c.fn, EPI if c.epilogue else "", EPI_PARAMS if c.epilogue else ""))
        parts.append(_entry(c))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, object]]:
    """Compile every case (per ISA, in a few chunks, all compilers running at once); fn -> (ffi, lib)."""
    root = tmp_path_factory.mktemp("gemm")
    (root / "fake_neon").mkdir()
    (root / "fake_neon" / "arm_neon.h").write_text(FAKE_NEON)
    (root / "fake_avx512").mkdir()
    (root / "fake_avx512" / "immintrin.h").write_text(FAKE_AVX512)
    jobs = []
    for isa in sorted({c.isa for c in CASES}):
        group = [c for c in CASES if c.isa == isa]
        nchunks = max(1, min(os.cpu_count() or 1, 4, len(group) // 20))
        for ch in range(nchunks):
            chunk = group[ch::nchunks]
            src = root / f"{isa}_{ch}.c"
            lib = root / f"{isa}_{ch}.so"
            text = _source(chunk)
            flags = []
            if isa in ("neon", "avx512"):
                flags = ["-I", str(root / ("fake_neon" if isa == "neon" else "fake_avx512"))]
                text = text.replace(AVX512_ATTR, "")
                flags += ["-Wno-psabi"] if isa == "avx512" else []  # the stand-in passes 64-byte vectors
            src.write_text(text)
            cmd = [CC, *BASE_FLAGS, "-shared", "-fPIC", *ISA_FLAGS[isa], *flags, str(src), "-o", str(lib)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            jobs.append((cmd, proc, lib, chunk))
    out = {}
    for cmd, proc, lib, chunk in jobs:
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{err}"
        ffi = cffi.FFI()
        ffi.cdef("\n".join(f"void run_{c.fn}(const float *A, const float *B, float *C, float *scratch,"
                           " size_t task, size_t ntasks, const float *bias);" for c in chunk))
        handle = ffi.dlopen(str(lib))
        for c in chunk:
            out[c.fn] = (ffi, handle)
    return out


def _operands(spec: GemmSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Flat A and B buffers laid out per the spec's strides (stride 0 = one shared matrix)."""
    a = rng.standard_normal((spec.batch - 1) * spec.a_batch_stride + spec.m * spec.k).astype(np.float32)
    b = rng.standard_normal((spec.batch - 1) * spec.b_batch_stride + spec.k * spec.n).astype(np.float32)
    return a, b


def _reference(spec: GemmSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    out = np.zeros((spec.batch, spec.m, spec.n))
    for i in range(spec.batch):
        am = a[i * spec.a_batch_stride:][:spec.m * spec.k].astype(np.float64)
        bm = b[i * spec.b_batch_stride:][:spec.k * spec.n].astype(np.float64)
        am = am.reshape(spec.k, spec.m).T if spec.trans_a else am.reshape(spec.m, spec.k)
        bm = bm.reshape(spec.n, spec.k).T if spec.trans_b else bm.reshape(spec.k, spec.n)
        r = am @ bm
        if bias is not None:  # must match EPI
            r = np.maximum(r + bias[None, :] + 0.25 * i + 0.001 * np.arange(spec.m)[:, None], 0.0)
        out[i] = r
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gemm(case: Case, libs: dict[str, tuple[object, object]]) -> None:
    spec = case.spec
    ffi, lib = libs[case.fn]
    run = getattr(lib, f"run_{case.fn}")
    rng = np.random.default_rng(spec.m * 7919 + spec.n * 31 + spec.k)
    a, b = _operands(spec, rng)
    bias = rng.standard_normal(spec.n).astype(np.float32) if case.epilogue else None
    if spec.b_const:
        packed = pack_b(b, spec)
        assert packed.shape == packed_b_shape(spec) and packed.dtype == np.float32
        b_buf = _aligned(packed.size)
        b_buf[:] = packed.reshape(-1)
    else:
        b_buf = b
    c_len = (spec.batch - 1) * spec.c_batch_stride + spec.m * spec.n
    fb = ffi.from_buffer
    bias_ptr = fb("float[]", bias) if bias is not None else ffi.NULL
    results = []
    for ntasks in case.ntasks:
        # Poison C and scratch: the kernel must overwrite all of C and never read stale scratch.
        scratch = _aligned(max(1, scratch_bytes(spec, ntasks) // 4))
        scratch[:] = np.nan
        c = np.full(c_len, np.nan, dtype=np.float32)
        args = (fb("float[]", a), fb("float[]", b_buf), fb("float[]", c), fb("float[]", scratch))
        if case.threads and ntasks > 1:
            with ThreadPoolExecutor(ntasks) as pool:
                list(pool.map(lambda t, n=ntasks, args=args: run(*args, t, n, bias_ptr), range(ntasks)))
        else:
            for t in range(ntasks):
                run(*args, t, ntasks, bias_ptr)
        results.append(c)
    ref = _reference(spec, a, b, bias)
    got = np.stack([results[0][i * spec.c_batch_stride:][:spec.m * spec.n].reshape(spec.m, spec.n)
                    for i in range(spec.batch)])
    tol = 2e-6 * np.sqrt(spec.k) * (np.abs(ref).max() + 1.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    if spec.c_batch_stride > spec.m * spec.n:  # gaps between batch entries stay untouched
        assert np.isnan(results[0][spec.m * spec.n:spec.c_batch_stride]).all()
    for other in results[1:]:
        assert np.array_equal(other.view(np.uint32), results[0].view(np.uint32)), "results depend on ntasks"


def test_plan_blocks_every_dimension() -> None:
    # The big cases above only test multi-block loops if the plan really splits each dimension.
    plan = plan_gemm(GemmSpec(300, 3100, 700, isa=NATIVE))
    assert plan.kc < 700 and plan.mc < 300 and plan.nc < 3100
    plan = plan_gemm(GemmSpec(257, 3100, 700, isa=NATIVE, b_const=True))
    assert plan.kc < 700 and plan.mc < 257


def test_plan_reads_small_a_in_place_when_tasks_split_columns() -> None:
    # The threaded cases above (64x512x784 with B constant, 64x127x300) cover this path; make sure they take it.
    # Tasks that split columns would each pack the same A: one M block that fits in half of L2 is read in
    # place instead.  A bigger A, or a row split, is still packed.
    for m, n, k, b_const in ((64, 512, 784, True), (64, 127, 300, False)):
        plan = plan_gemm(GemmSpec(m, n, k, isa="avx2", b_const=b_const))
        assert not plan.split_m and not plan.pack_a and plan.a_floats == 0
    assert plan_gemm(GemmSpec(100, 1000, 2048, isa="avx2", b_const=True)).pack_a  # A of 800 KB
    assert plan_gemm(GemmSpec(256, 256, 512, isa="avx2", b_const=True)).pack_a  # rows split, 2 K blocks
    assert not plan_gemm(GemmSpec(256, 256, 256, isa="avx2", b_const=True)).pack_a  # one K block


def test_plan_takes_whole_k_with_shared_a_and_constant_b() -> None:
    # The 64x784x512 case above runs as one K block, 20x100x1500 (also threaded above) as two of 750:
    # the B micro-panel is capped at 64 KB (K = 1024 on AVX2). A run-time B or a packed A keeps the ISA's
    # K block.
    assert plan_gemm(GemmSpec(64, 512, 784, isa="avx2", b_const=True)).kc == 784
    assert plan_gemm(GemmSpec(20, 100, 1500, isa="avx2", b_const=True)).kc == 750
    assert plan_gemm(GemmSpec(64, 127, 300, isa="avx2")).kc == 150
    assert plan_gemm(GemmSpec(256, 256, 512, isa="avx2", b_const=True)).kc == 256


def test_spec_validation() -> None:
    for bad in (dict(m=0), dict(isa="sse9"), dict(batch=2, c_batch_stride=3)):
        args = dict(m=2, n=2, k=2) | bad
        with pytest.raises(ValueError):
            GemmSpec(**args)
    with pytest.raises(ValueError):
        render_gemm(plan_gemm(GemmSpec(2, 2, 2)), "not an identifier")
    with pytest.raises(ValueError):
        scratch_bytes(GemmSpec(1, 1, 1), 0)
    with pytest.raises(ValueError):
        pack_b(np.zeros(5, np.float32), GemmSpec(2, 2, 3, b_const=True))


def test_pack_b_layout() -> None:
    spec = GemmSpec(4, 20, 3, b_const=True, isa="avx2")
    b = np.arange(60, dtype=np.float32).reshape(3, 20)
    p = pack_b(b, spec)
    assert p.shape == (1, 2, 3, 16) and p.dtype == np.float32 and p.flags.c_contiguous
    assert np.array_equal(p[0, 0], b[:, :16])
    assert np.array_equal(p[0, 1, :, :4], b[:, 16:]) and not p[0, 1, :, 4:].any()
    assert np.array_equal(pack_b(b.T.copy(), GemmSpec(4, 20, 3, b_const=True, trans_b=True)), p)
    batched = np.stack([b, b + 100])
    pb = pack_b(batched, GemmSpec(4, 20, 3, batch=2, b_batch_stride=60, c_batch_stride=80, b_const=True))
    assert pb.shape == (2, 2, 3, 16) and np.array_equal(pb[1, 0], b[:, :16] + 100)


def test_scratch_slices_are_aligned() -> None:
    for spec in (GemmSpec(37, 29, 300), GemmSpec(5, 21, 70, trans_a=True), GemmSpec(1, 19, 9)):
        one = scratch_bytes(spec, 1)
        assert one % 64 == 0 and scratch_bytes(spec, 3) == 3 * one


@pytest.mark.skipif(not X86, reason="x86 compile check")
def test_avx512_compiles(tmp_path: Path) -> None:
    # No AVX-512 to run it on here: check it renders to warning-free C for -march=x86-64-v4.
    specs = {"g_z": GemmSpec(29, 45, 70, isa="avx512"), "g_zc": GemmSpec(3, 100, 70, b_const=True, trans_a=True,
                                                                          isa="avx512"),
             "g_zd": GemmSpec(13, 33, 70, batch=2, b_batch_stride=70 * 33, c_batch_stride=13 * 33, isa="avx512")}
    src = tmp_path / "z.c"
    src.write_text("".join(render_gemm(plan_gemm(s), fn, EPI, EPI_PARAMS) + f"void *keep_{fn} = (void *){fn};\n"
                           for fn, s in specs.items()))
    for march in ("-march=x86-64-v4", "-march=x86-64"):  # target attributes make either work
        proc = subprocess.run([CC, *BASE_FLAGS, march, "-c", str(src), "-o", str(tmp_path / "z.o")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


SAN_MAIN = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

typedef void (*gemm_fn)(const float *, const float *, float *, float *, size_t, size_t, const float *);

/* Run fn split in nt tasks on exact-size heap buffers and compare with a naive double loop. */
static int check(const char *name, gemm_fn fn, size_t M, size_t N, size_t K, int ta, int tb, size_t nt,
                 size_t scratch_bytes)
{
    unsigned seed = 12345u;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * N), *bias = malloc(sizeof(float) * N);
    float *scratch = aligned_alloc(64, scratch_bytes + 64);
    for (size_t x = 0; x < M * K; ++x) A[x] = frand(&seed);
    for (size_t x = 0; x < K * N; ++x) B[x] = frand(&seed);
    for (size_t x = 0; x < N; ++x) bias[x] = frand(&seed);
    for (size_t t = 0; t < nt; ++t) fn(A, B, C, scratch, t, nt, bias);
    int bad = 0;
    for (size_t i = 0; i < M; ++i)
        for (size_t j = 0; j < N; ++j) {
            double s = 0.0;
            for (size_t p = 0; p < K; ++p)
                s += (double)A[ta ? p * M + i : i * K + p] * (double)B[tb ? j * K + p : p * N + j];
            s += bias[j];
            if (s < 0.0) s = 0.0;
            if (fabs(s - (double)C[i * N + j]) > 1e-4 * (1.0 + fabs(s))) bad = 1;
        }
    free(A); free(B); free(C); free(bias); free(scratch);
    if (bad) printf("MISMATCH %s\n", name);
    return bad;
}
"""


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")
def test_sanitizers(tmp_path: Path) -> None:
    # Run-time B packing, transposes, direct (unpacked) A/B and every edge path under ASan + UBSan, in a
    # standalone program (no Python in the process, so no LD_PRELOAD games).  The avx2 functions carry
    # target attributes, so one baseline-flags build holds both ISAs.
    specs = {}
    for isa in RUN_ISAS:
        specs |= {f"san_a_{isa}": GemmSpec(37, 29, 300, isa=isa),
                  f"san_b_{isa}": GemmSpec(5, 21, 70, trans_a=True, isa=isa),
                  f"san_c_{isa}": GemmSpec(20, 45, 33, trans_b=True, isa=isa),
                  f"san_d_{isa}": GemmSpec(1, 19, 9, isa=isa),
                  f"san_e_{isa}": GemmSpec(13, 40, 520, trans_a=True, trans_b=True, isa=isa),
                  f"san_f_{isa}": GemmSpec(20, 13, 40, trans_a=True, isa=isa),
                  f"san_g_{isa}": GemmSpec(16, 40, 70, isa=isa)}  # short (MR - 1 row) panels
    src = "".join(render_gemm(plan_gemm(s), fn, "v = v + bias[j]; v = (v < 0.0f ? 0.0f : v);",
                              ", const float *restrict bias") for fn, s in specs.items()) + SAN_MAIN
    calls = "".join(f'    bad |= check("{fn}", {fn}, {s.m}, {s.n}, {s.k}, {int(s.trans_a)}, {int(s.trans_b)},'
                    f" 2, {scratch_bytes(s, 2)});\n" for fn, s in specs.items())
    src += f"int main(void)\n{{\n    int bad = 0;\n{calls}    if (!bad) puts(\"OK\");\n    return bad;\n}}\n"
    (tmp_path / "san.c").write_text(src)
    exe = tmp_path / "san"
    cmd = [CC, "-O1", "-g", "-std=c11", "-Wall", "-Wextra", "-Werror", *ISA_FLAGS["generic"],
           "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
           str(tmp_path / "san.c"), "-o", str(exe), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and "cannot find" in proc.stderr and "san" in proc.stderr:
        pytest.skip("sanitizer runtime libraries not installed")
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr


def test_two_isas_one_translation_unit(tmp_path: Path) -> None:
    # Helpers are prefixed per function, so several GEMMs, even of different ISAs, can share one C file.
    src = render_gemm(plan_gemm(GemmSpec(9, 20, 30, isa=NATIVE)), "first") + render_gemm(
        plan_gemm(GemmSpec(9, 20, 30, isa="generic", b_const=True)), "second")
    src += "void *keep[2] = {(void *)first, (void *)second};\n"
    (tmp_path / "two.c").write_text(src)
    proc = subprocess.run([CC, *BASE_FLAGS, *ISA_FLAGS["generic"], "-c", str(tmp_path / "two.c"), "-o",
                           str(tmp_path / "two.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_render_is_plain_c_function() -> None:
    plan = plan_gemm(GemmSpec(10, 20, 30))
    src = render_gemm(plan, "my_gemm", "v = v * scale;", ", float scale")
    assert ("static void my_gemm(const float *restrict A, const float *restrict B, float *restrict C,\n"
            "    float *restrict scratch, size_t task, size_t ntasks, float scale)") in src
    assert "v = v * scale;" in src
    assert "v = v" not in render_gemm(plan, "my_gemm")  # no epilogue -> no extra pass
