"""Tests for the GEMM generator (aotc/codegen/gemm.py + templates/gemm.c.j2).

Each case renders one GEMM, wraps it in a tiny exported C function, compiles it with the warnings the
project builds with (-Wall -Wextra -Werror), loads it through cffi's ABI mode and compares against a
float64 numpy reference.  Task splitting is checked for bit-identical results, also with the tasks
running on real threads at once (cffi releases the GIL during calls).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

try:
    from aotc.codegen.gemm import GemmSpec, pack_b, packed_b_shape, plan_gemm, render_gemm, scratch_bytes
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aotc.codegen.gemm import GemmSpec, pack_b, packed_b_shape, plan_gemm, render_gemm, scratch_bytes

cffi = pytest.importorskip("cffi")

CC = os.environ.get("CC", "cc")
BASE_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


HAVE_AVX2 = {"avx2", "fma"} <= _cpu_flags()
ISAS = ["avx2", "generic"] if HAVE_AVX2 else ["generic"]
ISA_FLAGS = {"avx2": ["-march=x86-64-v3"], "generic": ["-march=x86-64"] if os.uname().machine == "x86_64" else []}

EPI = "v = v + bias[j] + 0.25f * (float)b + 0.001f * (float)i; v = (v < 0.0f ? 0.0f : v);"
EPI_PARAMS = ", const float *restrict bias"


def _aligned(n_floats: int) -> np.ndarray:
    """A float32 array whose data is 64-byte aligned, as the generated code's callers guarantee."""
    raw = np.zeros(n_floats + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n_floats]


@functools.lru_cache(maxsize=None)
def _build(source: str, isa: str, tmp_root: str, extra_flags: tuple[str, ...] = ()) -> tuple:
    """Compile ``source`` into a shared library (cached by content) and dlopen it."""
    digest = hashlib.sha1((source + isa + repr(extra_flags)).encode()).hexdigest()[:16]
    src = Path(tmp_root) / f"g_{digest}.c"
    lib = Path(tmp_root) / f"g_{digest}.so"
    src.write_text(source)
    cmd = [CC, *BASE_FLAGS, *ISA_FLAGS[isa], *extra_flags, str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    ffi = cffi.FFI()
    ffi.cdef("void run(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,"
             " const float *bias);")
    return ffi, ffi.dlopen(str(lib))


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gemm"))


def _wrapper(spec: GemmSpec, epilogue: bool) -> str:
    body = render_gemm(spec, EPI if epilogue else "", EPI_PARAMS if epilogue else "")
    call_extra = ", bias" if epilogue else ""
    unused = "" if epilogue else "(void)bias;"
    return body + textwrap.dedent(f"""
        void run(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,
                 const float *bias);
        void run(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,
                 const float *bias)
        {{
            {unused}
            {spec.fn}(A, B, C, scratch, task, ntasks{call_extra});
        }}
        """)


def _operands(spec: GemmSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Flat A and B buffers laid out per the spec's strides (stride 0 = one shared matrix)."""
    a_len = (spec.batch - 1) * spec.a_batch_stride + spec.m * spec.k
    b_len = (spec.batch - 1) * spec.b_batch_stride + spec.k * spec.n
    a = rng.standard_normal(a_len).astype(np.float32)
    b = rng.standard_normal(b_len).astype(np.float32)
    return a, b


def _reference(spec: GemmSpec, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    out = np.zeros((spec.batch, spec.m, spec.n))
    for i in range(spec.batch):
        am = a[i * spec.a_batch_stride:][:spec.m * spec.k].astype(np.float64)
        bm = b[i * spec.b_batch_stride:][:spec.k * spec.n].astype(np.float64)
        am = am.reshape(spec.k, spec.m).T if spec.trans_a else am.reshape(spec.m, spec.k)
        bm = bm.reshape(spec.n, spec.k).T if spec.trans_b else bm.reshape(spec.k, spec.n)
        r = am @ bm
        if bias is not None:
            r = r + bias[None, :] + 0.25 * i + 0.001 * np.arange(spec.m)[:, None]
            r = np.maximum(r, 0.0)
        out[i] = r
    return out


def _run(spec: GemmSpec, tmp_root: str, ntasks_list=(1, 3), epilogue: bool = False, threads: bool = False,
         seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    ffi, lib = _build(_wrapper(spec, epilogue), spec.isa, tmp_root)
    a, b = _operands(spec, rng)
    bias = rng.standard_normal(spec.n).astype(np.float32) if epilogue else None
    if spec.b_const:
        packed = pack_b(b, spec)
        assert packed.shape == packed_b_shape(spec)
        b_buf = _aligned(packed.size)
        b_buf[:] = packed.reshape(-1)
    else:
        b_buf = b
    c_len = (spec.batch - 1) * spec.c_batch_stride + spec.m * spec.n
    bias_ptr = ffi.from_buffer("float[]", bias) if bias is not None else ffi.NULL
    results = []
    for ntasks in ntasks_list:
        scratch = _aligned(max(1, scratch_bytes(spec, ntasks) // 4))
        # Poison C and scratch: the kernel must fully overwrite C and never read stale scratch.
        c = np.full(c_len, np.nan, dtype=np.float32)
        scratch[:] = np.nan
        args = (ffi.from_buffer("float[]", a), ffi.from_buffer("float[]", b_buf), ffi.from_buffer("float[]", c),
                ffi.from_buffer("float[]", scratch))
        if threads and ntasks > 1:
            with ThreadPoolExecutor(ntasks) as pool:
                list(pool.map(lambda t: lib.run(*args, t, ntasks, bias_ptr), range(ntasks)))
        else:
            for t in range(ntasks):
                lib.run(*args, t, ntasks, bias_ptr)
        results.append(c.copy())
    ref = _reference(spec, a, b, bias)
    got = np.stack([results[0][i * spec.c_batch_stride:][:spec.m * spec.n].reshape(spec.m, spec.n)
                    for i in range(spec.batch)])
    tol = 1e-5 * np.sqrt(spec.k) * (np.abs(ref).max() + 1.0) + 1e-6
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    for other in results[1:]:
        assert np.array_equal(other.view(np.uint32), results[0].view(np.uint32)), "results depend on ntasks"


SIZES = [
    (1, 1, 1), (1, 3, 17), (3, 17, 1), (17, 3, 64), (64, 127, 300), (127, 64, 17), (300, 17, 127),
    (6, 16, 256), (7, 33, 257), (5, 100, 520), (2, 48, 40), (13, 10, 512), (128, 128, 513),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("b_const", [False, True])
def test_sizes(isa: str, m: int, n: int, k: int, b_const: bool, tmp_root: str) -> None:
    _run(GemmSpec(f"g_{m}_{n}_{k}", m, n, k, b_const=b_const, isa=isa), tmp_root)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("trans_a,trans_b", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n,k,b_const", [(1, 17, 64, False), (5, 33, 300, True), (64, 127, 300, False),
                                           (127, 64, 17, True), (300, 40, 257, False), (3, 3, 3, True)])
def test_transposes(isa: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int, b_const: bool,
                    tmp_root: str) -> None:
    spec = GemmSpec("g_t", m, n, k, trans_a=trans_a, trans_b=trans_b, b_const=b_const, isa=isa)
    _run(spec, tmp_root, seed=m + n + k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("a_shared,b_shared", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("m,n,k,b_const,trans_b", [(3, 17, 64, False, False), (65, 40, 100, False, True),
                                                   (17, 33, 127, True, False), (1, 10, 300, True, True)])
def test_batch(isa: str, a_shared: bool, b_shared: bool, m: int, n: int, k: int, b_const: bool, trans_b: bool,
               tmp_root: str) -> None:
    # Strides larger than one matrix (gaps) and a C stride with a gap check that strides are honoured.
    spec = GemmSpec("g_b", m, n, k, batch=3, a_batch_stride=0 if a_shared else m * k + 5,
                    b_batch_stride=0 if b_shared else k * n + 3, c_batch_stride=m * n + 7,
                    trans_b=trans_b, b_const=b_const, isa=isa)
    _run(spec, tmp_root, ntasks_list=(1, 2, 3, 7), seed=k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k,b_const", [(1, 512, 784, True), (64, 10, 512, True), (70, 45, 300, False),
                                           (5, 21, 33, False), (127, 300, 64, True)])
def test_epilogue_bias_relu(isa: str, m: int, n: int, k: int, b_const: bool, tmp_root: str) -> None:
    spec = GemmSpec("g_e", m, n, k, batch=2, a_batch_stride=m * k, c_batch_stride=m * n, b_const=b_const,
                    isa=isa)
    _run(spec, tmp_root, ntasks_list=(1, 3, 4), epilogue=True, seed=n)


@pytest.mark.parametrize("m,n,k,b_const", [(300, 300, 300, False), (64, 512, 784, True), (600, 40, 200, True),
                                           (7, 1000, 64, False)])
def test_threads_bit_identical(m: int, n: int, k: int, b_const: bool, tmp_root: str) -> None:
    spec = GemmSpec("g_th", m, n, k, b_const=b_const, isa=ISAS[0])
    _run(spec, tmp_root, ntasks_list=(1, 2, 3, 5), threads=True, epilogue=True)


def test_multi_block_k_and_m(tmp_root: str) -> None:
    # K and M larger than one block, N larger than one NC block: every blocking loop runs several times.
    plan = plan_gemm(GemmSpec("x", 300, 3100, 700, isa=ISAS[0]))
    assert plan.kc < 700 and plan.mc < 300 and plan.nc < 3100
    _run(GemmSpec("g_big", 300, 3100, 700, isa=ISAS[0]), tmp_root, ntasks_list=(1, 2))
    _run(GemmSpec("g_bigc", 257, 3100, 700, b_const=True, isa=ISAS[0]), tmp_root, ntasks_list=(1, 2))


def test_two_gemms_one_translation_unit(tmp_root: str) -> None:
    # Helpers are prefixed per function, so several GEMMs (and ISAs) can share one C file.
    s1 = GemmSpec("first_gemm", 9, 20, 30, isa=ISAS[0])
    s2 = GemmSpec("second_gemm", 9, 20, 30, isa="generic", b_const=True)
    src = render_gemm(s1) + render_gemm(s2) + textwrap.dedent("""
        void run(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,
                 const float *bias);
        void run(const float *A, const float *B, float *C, float *scratch, size_t task, size_t ntasks,
                 const float *bias)
        {
            if (bias) second_gemm(A, B, C, scratch, task, ntasks); else first_gemm(A, B, C, scratch, task, ntasks);
        }
        """)
    ffi, lib = _build(src, ISAS[0], tmp_root)
    rng = np.random.default_rng(1)
    a, b = _operands(s1, rng)
    c1 = np.zeros(9 * 20, dtype=np.float32)
    c2 = np.zeros(9 * 20, dtype=np.float32)
    scratch = _aligned(max(scratch_bytes(s1, 1), scratch_bytes(s2, 1)) // 4 + 1)
    packed = _aligned(int(np.prod(packed_b_shape(s2))))
    packed[:] = pack_b(b, s2).reshape(-1)
    fb = ffi.from_buffer
    lib.run(fb("float[]", a), fb("float[]", b), fb("float[]", c1), fb("float[]", scratch), 0, 1, ffi.NULL)
    lib.run(fb("float[]", a), fb("float[]", packed), fb("float[]", c2), fb("float[]", scratch), 0, 1,
            fb("float[]", np.zeros(1, np.float32)))
    ref = (a.reshape(9, 30).astype(np.float64) @ b.reshape(30, 20)).reshape(-1)
    np.testing.assert_allclose(c1, ref, atol=1e-4)
    np.testing.assert_allclose(c2, ref, atol=1e-4)


def test_render_validates_spec() -> None:
    with pytest.raises(ValueError):
        GemmSpec("not an identifier", 1, 1, 1)
    with pytest.raises(ValueError):
        GemmSpec("g", 0, 1, 1)
    with pytest.raises(ValueError):
        GemmSpec("g", 1, 1, 1, isa="sse9")
    with pytest.raises(ValueError):
        scratch_bytes(GemmSpec("g", 1, 1, 1), 0)


def test_pack_b_layout() -> None:
    spec = GemmSpec("g", 4, 20, 3, b_const=True, isa="avx2")
    b = np.arange(60, dtype=np.float32).reshape(3, 20)
    p = pack_b(b, spec)
    assert p.shape == (1, 2, 3, 16) and p.dtype == np.float32 and p.flags.c_contiguous
    assert np.array_equal(p[0, 0], b[:, :16])
    assert np.array_equal(p[0, 1, :, :4], b[:, 16:]) and not p[0, 1, :, 4:].any()
    spec_t = GemmSpec("g", 4, 20, 3, b_const=True, trans_b=True, isa="avx2")
    assert np.array_equal(pack_b(b.T.copy(), spec_t), p)


@pytest.mark.parametrize("isa", ["avx512", "neon"])
def test_other_isas_render(isa: str) -> None:
    # These cannot run here; check they render with the right vector types (compiled where possible).
    src = render_gemm(GemmSpec("g_o", 29, 45, 70, isa=isa), EPI, EPI_PARAMS)
    assert ("__m512" if isa == "avx512" else "float32x4_t") in src


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86 compile check")
def test_avx512_compiles(tmp_path: Path) -> None:
    for spec in (GemmSpec("g_z", 29, 45, 70, isa="avx512"), GemmSpec("g_zc", 3, 100, 70, b_const=True,
                                                                      trans_a=True, isa="avx512")):
        src = tmp_path / f"{spec.fn}.c"
        src.write_text(render_gemm(spec, EPI, EPI_PARAMS) + f"void *keep_{spec.fn} = (void *){spec.fn};\n")
        proc = subprocess.run([CC, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-c", str(src), "-o",
                               str(tmp_path / f"{spec.fn}.o")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


# A stand-in for <arm_neon.h> built on GCC vector extensions, so the NEON code path (8x12 tiles, its own
# edge cases) can be executed on any host.  Only the intrinsics the template uses are provided.
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


@pytest.mark.parametrize("m,n,k,b_const,trans_a,trans_b", [(29, 45, 70, False, False, False),
                                                           (8, 12, 300, True, False, True),
                                                           (3, 25, 40, False, True, False),
                                                           (50, 7, 130, True, True, True)])
def test_neon_logic_with_fake_header(m: int, n: int, k: int, b_const: bool, trans_a: bool, trans_b: bool,
                                     tmp_root: str) -> None:
    inc = Path(tmp_root) / "fake_neon"
    inc.mkdir(exist_ok=True)
    (inc / "arm_neon.h").write_text(FAKE_NEON)
    spec = GemmSpec("g_n", m, n, k, batch=2, a_batch_stride=m * k, b_batch_stride=0, c_batch_stride=m * n,
                    b_const=b_const, trans_a=trans_a, trans_b=trans_b, isa="neon")
    src = _wrapper(spec, True)
    ffi, lib = _build(src, "generic", tmp_root, ("-I", str(inc)))
    rng = np.random.default_rng(5)
    a, b = _operands(spec, rng)
    bias = rng.standard_normal(n).astype(np.float32)
    b_buf = pack_b(b, spec).reshape(-1) if b_const else b
    outs = []
    for ntasks in (1, 3):
        c = np.full(2 * m * n, np.nan, dtype=np.float32)
        scratch = _aligned(max(1, scratch_bytes(spec, ntasks) // 4))
        fb = ffi.from_buffer
        for t in range(ntasks):
            lib.run(fb("float[]", a), fb("float[]", b_buf), fb("float[]", c), fb("float[]", scratch), t, ntasks,
                    fb("float[]", bias))
        outs.append(c)
    ref = _reference(spec, a, b, bias).reshape(-1)
    np.testing.assert_allclose(outs[0], ref, atol=1e-4 * np.sqrt(k) * (np.abs(ref).max() + 1))
    assert np.array_equal(outs[0], outs[1])


SAN_MAIN = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float frand(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f; }

int main(void)
{
    unsigned seed = 12345u;
    const size_t M = %(m)d, N = %(n)d, K = %(k)d, NT = %(ntasks)d;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * N), *bias = malloc(sizeof(float) * N);
    float *scratch = aligned_alloc(64, %(scratch)d + 64);
    for (size_t x = 0; x < M * K; ++x) A[x] = frand(&seed);
    for (size_t x = 0; x < K * N; ++x) B[x] = frand(&seed);
    for (size_t x = 0; x < N; ++x) bias[x] = frand(&seed);
    for (size_t t = 0; t < NT; ++t) %(fn)s(A, B, C, scratch, t, NT, bias);
    int bad = 0;
    for (size_t i = 0; i < M; ++i)
        for (size_t j = 0; j < N; ++j) {
            double s = 0.0;
            for (size_t p = 0; p < K; ++p) s += (double)A[%(aidx)s] * (double)B[%(bidx)s];
            s += bias[j];
            if (s < 0.0) s = 0.0;
            if (fabs(s - (double)C[i * N + j]) > 1e-4 * (1.0 + fabs(s))) bad = 1;
        }
    free(A); free(B); free(C); free(bias); free(scratch);
    if (bad) { puts("MISMATCH"); return 1; }
    puts("OK");
    return 0;
}
"""


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")
@pytest.mark.parametrize("isa", ISAS)
def test_sanitizers(isa: str, tmp_path: Path) -> None:
    # Run-time B packing, transposes and every edge path under ASan/UBSan in a standalone program.
    cases = [GemmSpec("san_a", 37, 29, 300, isa=isa), GemmSpec("san_b", 5, 21, 70, trans_a=True, isa=isa),
             GemmSpec("san_c", 20, 45, 33, trans_b=True, isa=isa), GemmSpec("san_d", 1, 19, 9, isa=isa)]
    for spec in cases:
        aidx = "p * M + i" if spec.trans_a else "i * K + p"
        bidx = "j * K + p" if spec.trans_b else "p * N + j"
        main = SAN_MAIN % dict(m=spec.m, n=spec.n, k=spec.k, ntasks=2, fn=spec.fn, aidx=aidx, bidx=bidx,
                               scratch=(scratch_bytes(spec, 2) + 63) // 64 * 64)
        src = tmp_path / f"{spec.fn}.c"
        exe = tmp_path / spec.fn
        src.write_text(render_gemm(spec, "v = v + bias[j]; v = (v < 0.0f ? 0.0f : v);",
                                   ", const float *restrict bias") + main)
        cmd = [CC, "-O1", "-g", "-std=c11", "-Wall", "-Wextra", "-Werror", *ISA_FLAGS[isa],
               "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
               str(src), "-o", str(exe), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 and "sanitizer" in proc.stderr.lower() and "cannot find" in proc.stderr.lower():
            pytest.skip("sanitizer runtime not installed")
        assert proc.returncode == 0, proc.stderr
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
