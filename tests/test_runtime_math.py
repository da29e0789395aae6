"""Accuracy, special-value and vectorization tests for runtime/aotc_math.h.

The header is compiled into a small shared library (one batched wrapper per
function) in several flag variants and loaded with cffi in ABI mode.  Results
are compared with float64 references from numpy / the math module.  The error
bounds asserted here are the ones quoted in the header comments.
"""

import functools
import math
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

cffi = pytest.importorskip("cffi")

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
HEADER = RUNTIME_DIR / "aotc_math.h"
CC = shutil.which("cc")
IS_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) found")

# wrapper name -> header function
FUNCS = {
    "exp": "aotc_expf",
    "log": "aotc_logf",
    "tanh": "aotc_tanhf",
    "sigmoid": "aotc_sigmoidf",
    "erf": "aotc_erff",
    "gelu": "aotc_geluf",
    "gelu_tanh": "aotc_gelu_tanhf",
}

# t_get_csr / t_set_csr expose MXCSR so that the module can clear FTZ/DAZ while
# it runs: a library linked with -ffast-math that some other test loaded into
# this process would otherwise flush denormals (in numpy's references too).
C_SOURCE = """\
#include <stddef.h>
#include "aotc_math.h"
#if defined(__SSE__)
#include <xmmintrin.h>
unsigned int t_get_csr(void) { return _mm_getcsr(); }
void t_set_csr(unsigned int csr) { _mm_setcsr(csr); }
#else
unsigned int t_get_csr(void) { return 0; }
void t_set_csr(unsigned int csr) { (void)csr; }
#endif
""" + "".join(
    f"void t_{name}(const float *restrict x, float *restrict y, size_t n)\n"
    f"{{\n    for (size_t i = 0; i < n; i++)\n        y[i] = {fn}(x[i]);\n}}\n"
    for name, fn in FUNCS.items()
)
CDEF = "unsigned int t_get_csr(void);\nvoid t_set_csr(unsigned int);\n" + "".join(
    f"void t_{name}(const float *, float *, size_t);\n" for name in FUNCS
)
FTZ_DAZ = 0x8040  # MXCSR flush-to-zero (bit 15) and denormals-are-zero (bit 6)

# As generated libraries are built (aotc/build.py): the clamps vectorize with -fno-trapping-math.
BASE_FLAGS = ["-O3", "-std=c11", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wextra", "-Werror"]

FLT_MAX = (2.0 - 2.0**-23) * 2.0**127
# Smallest float64 value that rounds to +Inf in float32.
FLT_OVERFLOW = 2.0**128 * (1.0 - 2.0**-25)


def _cpu_flags():
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


V3_OK = IS_X86_64 and {"avx2", "fma", "bmi2", "f16c"} <= _cpu_flags()
_BASELINE = ["-march=x86-64"] if IS_X86_64 else []
# Shared libraries the accuracy tests run against, and the vector width (bytes)
# GCC must report for every loop in them.  "scalar" is the same code never
# vectorized: scalar and vector paths must meet the same bounds.
LIB_VARIANTS = {
    "x86-64-v3": (["-march=x86-64-v3"], 32),
    "baseline": (_BASELINE, 16),
    "scalar": (_BASELINE + ["-fno-tree-vectorize"], None),
}


def _is_gcc():
    if CC is None:
        return False
    res = subprocess.run([CC, "--version"], capture_output=True, text=True)
    return "Free Software Foundation" in res.stdout


IS_GCC = _is_gcc()


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Compile all library variants concurrently; id -> (rc, stderr, path, cmd).

    The x86-64-v3 library is built even on CPUs that cannot run it, for the
    vectorization check; GCC's -fopt-info report goes to stderr.
    """
    d = tmp_path_factory.mktemp("aotc_math")
    src = d / "t_math.c"
    src.write_text(C_SOURCE)
    opt_info = ["-fopt-info-vec-optimized"] if IS_GCC else []
    jobs = {}
    for vid, (flags, _) in LIB_VARIANTS.items():
        if vid == "x86-64-v3" and not IS_X86_64:
            continue
        out = d / f"lib_{vid}.so"
        jobs[vid] = (out, [CC, *BASE_FLAGS, *flags, *opt_info, "-shared", "-fPIC",
                           f"-I{RUNTIME_DIR}", src.name, "-o", str(out)])
    procs = {vid: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=d)
             for vid, (_, cmd) in jobs.items()}
    results = {}
    for vid, proc in procs.items():
        _, err = proc.communicate()
        out, cmd = jobs[vid]
        results[vid] = (proc.returncode, err, out, " ".join(cmd))
    return results


class MathLib:
    def __init__(self, path):
        self.ffi = cffi.FFI()
        self.ffi.cdef(CDEF)
        self.lib = self.ffi.dlopen(str(path))

    def __call__(self, name, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        getattr(self.lib, "t_" + name)(
            self.ffi.from_buffer("float[]", x),
            self.ffi.from_buffer("float[]", y, require_writable=True),
            x.size,
        )
        return y


@pytest.fixture(scope="module", autouse=True)
def ieee_denormals(builds):
    """Clear FTZ/DAZ for this module's tests; restore the caller's MXCSR after."""
    rc, _, so, _ = builds["baseline"]
    if rc != 0:
        yield
        return
    lib = MathLib(so).lib
    saved = lib.t_get_csr()
    lib.t_set_csr(saved & ~FTZ_DAZ)
    yield
    lib.t_set_csr(saved)


@pytest.fixture(scope="module", params=[
    pytest.param(vid, id=vid, marks=pytest.mark.skipif(
        vid == "x86-64-v3" and not V3_OK, reason="CPU lacks x86-64-v3 (AVX2/FMA)"))
    for vid in LIB_VARIANTS
])
def mlib(request, builds):
    rc, err, so, cmd = builds[request.param]
    assert rc == 0, f"{cmd}\n{err}"
    return MathLib(so)


# ---------------------------------------------------------------- helpers ----

def f32(values):
    return np.asarray(values, dtype=np.float32)


def bits_to_f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def ulp_error(y, ref):
    """|y - ref| in units of the float32 ulp of ref (2^-149 for denormals)."""
    ref = np.asarray(ref, dtype=np.float64)
    _, e = np.frexp(np.abs(ref))
    e = np.where(ref == 0, -1000, e)
    ulp = np.ldexp(1.0, np.maximum(e - 24, -149))
    return np.abs(y.astype(np.float64) - ref) / ulp


def check_ulp(y, ref, bound):
    """Assert ulp error <= bound; results that must overflow must be +-Inf."""
    ref = np.asarray(ref, dtype=np.float64)
    over = np.abs(ref) >= FLT_OVERFLOW
    assert np.array_equal(y[over], np.copysign(np.inf, ref[over]).astype(np.float32))
    err = ulp_error(y[~over], ref[~over])
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (
        f"max error {err[worst]:.3f} ulp > {bound} at x-index {worst}: "
        f"got {y[~over][worst]!r}, want {ref[~over][worst]!r}"
    )
    return float(err[worst])


def check_abs(y, ref, bound):
    err = np.abs(y.astype(np.float64) - ref)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (
        f"max abs error {err[worst]:.3g} > {bound}: got {y[worst]!r}, want {ref[worst]!r}"
    )
    return float(err[worst])


def same_bits(y, expected):
    """Exact comparison that treats all NaNs as equal and distinguishes -0."""
    y = np.asarray(y, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    nan = np.isnan(expected)
    return bool(
        np.array_equal(np.isnan(y), nan)
        and np.array_equal(y[~nan].view(np.uint32), expected[~nan].view(np.uint32))
    )


def random_bits(rng, lo, hi, n, negative=False):
    """Floats with bit patterns uniform in [bits(lo), bits(hi)] (lo, hi >= 0)."""
    b = rng.integers(f32(lo).view(np.uint32), f32(hi).view(np.uint32), n,
                     dtype=np.uint32, endpoint=True)
    x = bits_to_f32(b)
    if negative:
        x = np.concatenate([x, -x])
    return x


_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def erf_ref(x):
    return _erf(x.astype(np.float64)).astype(np.float64)


def gelu_ref(x):
    xd = x.astype(np.float64)
    u = xd / math.sqrt(2.0)
    pos = 0.5 * xd * (1.0 + _erf(u).astype(np.float64))
    neg = 0.5 * xd * _erfc(-u).astype(np.float64)
    return np.where(xd >= 0, pos, neg)


def sigmoid_ref(xd):
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(xd))
    return np.where(xd >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gelu_tanh_ref(x):
    xd = x.astype(np.float64)
    v = 2.0 * math.sqrt(2.0 / math.pi) * (xd + 0.044715 * xd**3)
    return xd * sigmoid_ref(v)


RNG_SEED = 20240611
TINY = 2.0**-149  # smallest float32 denormal
FLT_MIN = 2.0**-126
INF, NAN = np.inf, np.nan


# ------------------------------------------------------------------ exp ----

@functools.cache
def exp_data():
    rng = np.random.default_rng(RNG_SEED)
    x = np.concatenate([
        np.linspace(-104.0, 89.0, 1_500_000, dtype=np.float32),
        rng.uniform(-104.0, 89.0, 300_000).astype(np.float32),
        random_bits(rng, 2.0**-40, 1.0, 100_000, negative=True),
        random_bits(rng, 80.0, 89.0, 50_000),     # overflow edge
        -random_bits(rng, 80.0, 110.0, 100_000),  # denormal results / underflow
    ])
    with np.errstate(over="ignore"):
        return x, np.exp(x.astype(np.float64))


def test_exp_accuracy(mlib):
    x, ref = exp_data()
    check_ulp(mlib("exp", x), ref, 1.5)


def test_exp_special(mlib):
    x = f32([0.0, -0.0, INF, -INF, NAN, 88.7228393554688, 89.0, 1e30, -1e30, -104.0,
             -150.0, TINY, -TINY, FLT_MIN])
    want = f32([1.0, 1.0, INF, 0.0, NAN, INF, INF, INF, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    y = mlib("exp", x)
    assert same_bits(y, want), list(zip(x, y, want, strict=True))
    # Edges: largest finite result, FLT_MIN, smallest denormal, rounding to 0.
    edges = f32([88.72283172607421875, -87.33654475, -87.3365, -103.2789, -103.9720764,
                 -103.97208, -103.9721, -103.98])
    y = mlib("exp", edges)
    assert y[0] < INF
    check_ulp(y, np.exp(edges.astype(np.float64)), 1.0)


# ------------------------------------------------------------------ log ----

@functools.cache
def log_data():
    rng = np.random.default_rng(RNG_SEED + 1)
    one = f32(1.0).view(np.uint32)
    near_one = bits_to_f32(np.arange(one - 20000, one + 20000, dtype=np.uint32))
    x = np.concatenate([
        bits_to_f32(rng.integers(1, 0x7F7FFFFF, 1_500_000, dtype=np.uint32, endpoint=True)),
        np.linspace(0.5, 2.0, 600_000, dtype=np.float32),
        near_one,
        random_bits(rng, TINY, FLT_MIN, 100_000),  # denormals
    ])
    return x, np.log(x.astype(np.float64))


def test_log_accuracy(mlib):
    x, ref = log_data()
    check_ulp(mlib("log", x), ref, 1.5)


def test_log_special(mlib):
    x = f32([1.0, 0.0, -0.0, -1.0, -TINY, -INF, INF, NAN, -NAN])
    want = f32([0.0, -INF, -INF, NAN, NAN, NAN, INF, NAN, NAN])
    y = mlib("log", x)
    assert same_bits(y, want), list(zip(x, y, want, strict=True))
    edges = f32([TINY, 2 * TINY, FLT_MIN, FLT_MIN * (1 - 2.0**-23), FLT_MAX, 2.0, 0.5,
                 np.nextafter(f32(1.0), f32(0.0)), np.nextafter(f32(1.0), f32(2.0))])
    check_ulp(mlib("log", edges), np.log(edges.astype(np.float64)), 1.0)


# ----------------------------------------------------------------- tanh ----

@functools.cache
def tanh_data():
    rng = np.random.default_rng(RNG_SEED + 2)
    x = np.concatenate([
        np.linspace(-12.0, 12.0, 1_500_000, dtype=np.float32),
        random_bits(rng, TINY, 1.0, 200_000, negative=True),
        random_bits(rng, 0.5, 0.75, 100_000, negative=True),  # branch switch
        random_bits(rng, 8.0, 1e30, 50_000, negative=True),
    ])
    return x, np.tanh(x.astype(np.float64))


def test_tanh_accuracy(mlib):
    x, ref = tanh_data()
    y = mlib("tanh", x)
    check_abs(y, ref, 1e-7)
    check_ulp(y, ref, 2.0)


def test_tanh_special(mlib):
    x = f32([0.0, -0.0, INF, -INF, NAN, 1e30, -1e30, 9.1, -9.1, TINY, -TINY, FLT_MIN, 1e-20])
    want = f32([0.0, -0.0, 1.0, -1.0, NAN, 1.0, -1.0, 1.0, -1.0, TINY, -TINY, FLT_MIN, 1e-20])
    y = mlib("tanh", x)
    assert same_bits(y, want), list(zip(x, y, want, strict=True))


# -------------------------------------------------------------- sigmoid ----

@functools.cache
def sigmoid_data():
    rng = np.random.default_rng(RNG_SEED + 3)
    x = np.concatenate([
        np.linspace(-110.0, 90.0, 1_500_000, dtype=np.float32),
        rng.uniform(-20.0, 20.0, 300_000).astype(np.float32),
        random_bits(rng, 2.0**-40, 1.0, 100_000, negative=True),
    ])
    return x, sigmoid_ref(x.astype(np.float64))


def test_sigmoid_accuracy(mlib):
    x, ref = sigmoid_data()
    check_ulp(mlib("sigmoid", x), ref, 2.5)


def test_sigmoid_special(mlib):
    x = f32([0.0, -0.0, INF, -INF, NAN, 1e30, -1e30, 17.0, 100.0, -200.0])
    want = f32([0.5, 0.5, 1.0, 0.0, NAN, 1.0, 0.0, 1.0, 1.0, 0.0])
    y = mlib("sigmoid", x)
    assert same_bits(y, want), list(zip(x, y, want, strict=True))
    edges = f32([-87.0, -88.0, -100.0, -103.0, -103.9, -16.0, 16.0])
    y = mlib("sigmoid", edges)
    assert np.all(y[:5] > 0)  # denormal results are not flushed
    check_ulp(y, sigmoid_ref(edges.astype(np.float64)), 2.5)


# ------------------------------------------------------------------ erf ----

@functools.cache
def erf_data():
    rng = np.random.default_rng(RNG_SEED + 4)
    x = np.concatenate([
        np.linspace(-5.0, 5.0, 250_000, dtype=np.float32),
        random_bits(rng, TINY, 1.0, 50_000, negative=True),
        random_bits(rng, 0.9, 1.1, 25_000, negative=True),  # branch switch
        random_bits(rng, 1.0, 4.0, 100_000, negative=True),  # the erfc polynomial, up to saturation
    ])
    return x, erf_ref(x)


def test_erf_accuracy(mlib):
    x, ref = erf_data()
    y = mlib("erf", x)
    check_abs(y, ref, 1e-7)
    check_ulp(y, ref, 2.0)


def test_erf_special(mlib):
    x = f32([0.0, -0.0, INF, -INF, NAN, 4.0, -4.0, 10.0, 1e30, -1e30, TINY, -TINY])
    y = mlib("erf", x)
    tiny_erf = float(f32(TINY * 2.0 / math.sqrt(math.pi)))
    want = f32([0.0, -0.0, 1.0, -1.0, NAN, 1.0, -1.0, 1.0, 1.0, -1.0, tiny_erf, -tiny_erf])
    assert same_bits(y, want), list(zip(x, y, want, strict=True))


# ----------------------------------------------------------------- gelu ----

@functools.cache
def gelu_data():
    rng = np.random.default_rng(RNG_SEED + 5)
    x = np.concatenate([
        np.linspace(-16.0, 10.0, 250_000, dtype=np.float32),
        random_bits(rng, 2.0**-60, 1.0, 40_000, negative=True),
        random_bits(rng, 1.3, 1.5, 25_000, negative=True),  # branch switch
        random_bits(rng, 8.0, 1e30, 10_000),
    ])
    return x, gelu_ref(x)


def test_gelu_accuracy(mlib):
    x, ref = gelu_data()
    y = mlib("gelu", x)
    pos = x >= 0
    check_ulp(y[pos], ref[pos], 4.0)
    # Below 0 the 1 + erf of the formula cancels: the error is absolute, as in onnxruntime's GELU.
    check_abs(y, ref, 1.5e-6)
    small = np.abs(x) <= 4.0
    check_abs(y[small], ref[small], 1e-6)


def test_gelu_special(mlib):
    x = f32([0.0, INF, NAN, 20.0, 1e30, -0.0, -INF, -6.0, -20.0, -1e30])
    y = mlib("gelu", x)
    assert same_bits(y[:5], x[:5]), list(zip(x, y, strict=True))
    assert np.all(y[5:] == 0.0), list(zip(x, y, strict=True))  # -0 and the far tail give +-0


@functools.cache
def gelu_tanh_data():
    rng = np.random.default_rng(RNG_SEED + 6)
    x = np.concatenate([
        np.linspace(-20.0, 20.0, 400_000, dtype=np.float32),
        random_bits(rng, 2.0**-60, 1.0, 50_000, negative=True),
    ])
    return x, gelu_tanh_ref(x)


def test_gelu_tanh_accuracy(mlib):
    x, ref = gelu_tanh_data()
    y = mlib("gelu_tanh", x)
    small = np.abs(x) <= 4.0
    check_abs(y[small], ref[small], 5e-7)
    # In the negative tail the result is ~x*e^v, so the float rounding of the
    # cubic argument v (relative 2^-24 per operation) is amplified by |v|:
    # allow 3 ulp plus 3 ulp per unit of |v|.
    xd = x.astype(np.float64)
    v = 2.0 * math.sqrt(2.0 / math.pi) * (xd + 0.044715 * xd**3)
    err = ulp_error(y, ref) - 3.0 * np.abs(v)
    worst = int(np.argmax(err))
    assert err[worst] <= 3.0, (x[worst], y[worst], ref[worst])
    check_ulp(y[x >= -1.0], ref[x >= -1.0], 3.0)


def test_gelu_tanh_special(mlib):
    x = f32([0.0, -0.0, INF, -INF, NAN, 30.0, -30.0, 1e30, -1e30])
    y = mlib("gelu_tanh", x)
    assert same_bits(y[:5], f32([0.0, -0.0, INF, -0.0, NAN])), list(zip(x, y, strict=True))
    assert y[5] == 30.0 and y[7] == f32(1e30)
    assert y[6] == 0.0 and y[8] == 0.0


# -------------------------------------------------------- vectorization ----

@pytest.mark.skipif(not IS_X86_64, reason="vectorization check targets x86_64")
@pytest.mark.skipif(not IS_GCC, reason="cc is not GCC (-fopt-info is GCC-specific)")
@pytest.mark.parametrize("vid", ["x86-64-v3", "baseline"])
def test_loops_vectorize(builds, vid):
    """Every wrapper loop is vectorized at full width, with no external calls."""
    rc, err, so, cmd = builds[vid]
    assert rc == 0, f"{cmd}\n{err}"
    width = LIB_VARIANTS[vid][1]
    lines = C_SOURCE.splitlines()
    for fn in FUNCS.values():
        # 1-based number of the `for` line = 0-based index of the body line
        loop_line = next(i for i, ln in enumerate(lines) if f"{fn}(x[i])" in ln)
        tag = f"t_math.c:{loop_line}:"
        hits = [ln for ln in err.splitlines() if tag in ln and "loop vectorized" in ln]
        assert any(f"using {width} byte vectors" in ln for ln in hits), (
            f"{fn} loop not vectorized with {width}-byte vectors ({cmd}):\n{err}"
        )
    nm = shutil.which("nm")
    if nm:
        # A libm call (expf, ...) would appear as a strong undefined symbol.
        res = subprocess.run([nm, "-D", "--undefined-only", str(so)],
                             capture_output=True, text=True)
        calls = [ln.split()[-1] for ln in res.stdout.splitlines() if ln.split()[:1] == ["U"]]
        assert calls == [], f"unexpected external calls: {calls}"


def test_header_self_contained(tmp_path):
    """The header compiles alone, as strict C11, without warnings."""
    src = tmp_path / "only.c"
    src.write_text('#include "aotc_math.h"\n'
                   "float f(float x) { return aotc_geluf(x) + (float)AOTC_ALIGN; }\n")
    cmd = [CC, "-O2", "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror",
           f"-I{RUNTIME_DIR}", "-c", str(src), "-o", str(tmp_path / "only.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert HEADER.is_file()
