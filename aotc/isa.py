"""The instruction sets the hand-vectorized kernels are written for: one entry per ISA, read by the
GEMM template (``templates/gemm.c.j2``), the conv micro-kernels (``aotc/ops/conv.py`` and the Winograd
and expand-depthwise paths built on them). Everything else is plain C the compiler vectorizes itself.

An entry holds the register facts the blocking is derived from, the spellings of the few vector
operations the micro-kernels use (``str.format`` templates over ``p`` (a pointer), ``v``, ``a``, ``x``
and ``y``) and the predefined macros by which a compiler's flags enable it (``aotc.target`` asks the
compiler which ISA its flags give). Adding an ISA is one entry here plus its test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The portable vector: GCC/Clang's vector extension, which compiles to SSE2 on x86-64, NEON on AArch64
# and scalar code elsewhere; memcpy keeps loads and stores alignment-agnostic. Guarded: several kernels
# share one translation unit.
_GENERIC_VECTORS = """\
#ifndef AOTC_V4F_DEFINED
#define AOTC_V4F_DEFINED
/* Portable 4-lane vectors (GCC/Clang vector extension); memcpy keeps loads and stores alignment-agnostic. */
typedef float aotc_v4f __attribute__((vector_size(16)));
static inline aotc_v4f aotc_v4f_zero(void) { aotc_v4f z = {0.0f, 0.0f, 0.0f, 0.0f}; return z; }
static inline aotc_v4f aotc_v4f_load(const float *p) { aotc_v4f v; memcpy(&v, p, sizeof v); return v; }
static inline aotc_v4f aotc_v4f_bcast(const float *p) { const float s = *p; aotc_v4f v = {s, s, s, s}; return v; }
static inline void aotc_v4f_store(float *p, aotc_v4f v) { memcpy(p, &v, sizeof v); }
#endif"""


@dataclass(frozen=True)
class Int8Dot:
    """One way to add the four-way dot products of unsigned by signed bytes into 32-bit lanes (x86's
    ``vpdpbusd``), which the int8 convolutions (``aotc/ops/int8_conv.py``) are built on.

    ``ops`` spell, over ``p`` (a pointer), ``a`` (int32 accumulators), ``u`` (bytes read as unsigned),
    ``s`` (bytes read as signed) and ``x`` (an int or float): zero, load (unaligned), bcast4 (the
    4 bytes at ``p`` in every 32-bit lane), dot (a statement adding the dot products to ``a``; never
    saturating), set1i
    and set1f (``x`` in every lane), and requant: ``a`` plus the int32s at ``c``, converted to float,
    times the floats at ``m``, clamped to the vectors ``lo`` and ``hi``, rounded to nearest even and
    plus the int32 vector ``z``: onnxruntime's requantization, instruction for instruction; optionally
    bytes16 (the 16 int32s of a block, ``a`` and on narrower ISAs ``b``, as 16 bytes, an ``__m128i``;
    ``sat`` "us" or "s" for unsigned or signed outputs), with which the tile's results are transposed
    in registers (``aotc_i8_transpose8x16``) instead of stored one byte at a time."""

    name: str
    macros: tuple[str, ...]  # predefined macros, all of which the instructions need
    lanes: int               # int32 lanes per vector
    vtype: str               # the int32 vector type
    ftype: str               # the float vector type of the same width
    # Register tile of the int8 conv: blocks of 16 output channels by output pixels, within the registers.
    tile_blocks: int
    tile_pixels: int
    ops: dict[str, str] = field(repr=False, hash=False)
    helpers: str = ""        # C definitions the spellings call
    emulated: bool = False   # built from other instructions: any native entry is preferred


# 8 pixels x 16 channels of bytes to 16 channels x 8 pixels: each channel's pixels are contiguous in an
# NCHW output, and the tile's results come one pixel (all channels) per vector.
_TRANSPOSE_8X16 = """\
#ifndef AOTC_I8_TRANSPOSE
#define AOTC_I8_TRANSPOSE
static inline void aotc_i8_transpose8x16(const __m128i q[8], uint8_t *out) {
  __m128i t[8], u[8];
  for (int k = 0; k < 4; k++) {
    t[2 * k] = _mm_unpacklo_epi8(q[2 * k], q[2 * k + 1]);
    t[2 * k + 1] = _mm_unpackhi_epi8(q[2 * k], q[2 * k + 1]);
  }
  for (int k = 0; k < 2; k++) {
    u[4 * k] = _mm_unpacklo_epi16(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm_unpackhi_epi16(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm_unpacklo_epi16(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm_unpackhi_epi16(t[4 * k + 1], t[4 * k + 3]);
  }
  for (int k = 0; k < 4; k++) {
    _mm_storeu_si128((__m128i *)(void *)(out + 32 * k), _mm_unpacklo_epi32(u[k], u[4 + k]));
    _mm_storeu_si128((__m128i *)(void *)(out + 32 * k + 16), _mm_unpackhi_epi32(u[k], u[4 + k]));
  }
}
#endif"""


# 16 int32s in the output type's range, {a} (and {b}: lanes 8-15 on AVX2), as 16 bytes: AVX-512's
# vpmovdb; AVX2 packs to 16 bits (per 128-bit lane, so the quarters are put back in order) and then
# to bytes with the output's saturation ({sat}: "us" or "s"), which changes nothing in range.
_BYTES16 = {512: "_mm512_cvtepi32_epi8({a})",
            256: "_mm_pack{sat}_epi16("
                 "_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32({a}, {b}), 0xd8)), "
                 "_mm256_extracti128_si256(_mm256_permute4x64_epi64(_mm256_packs_epi32({a}, {b}), 0xd8), 1))"}


def _int8_x86(name: str, bits: int, macros: tuple[str, ...], dot: str, tile: tuple[int, int],
              emulation: str = "") -> Int8Dot:
    mm, si = f"_mm{bits}", f"si{bits}"
    load = f"{mm}_loadu_{si}((const void *)({{p}}))"
    scaled = f"{mm}_mul_ps({mm}_cvtepi32_ps({mm}_add_epi32({{a}}, {load.format(p='{c}')})), {mm}_loadu_ps({{m}}))"
    return Int8Dot(name, macros, bits // 32, f"__m{bits}i", f"__m{bits}", *tile,
                   ops=dict(zero=f"{mm}_setzero_{si}()", load=load,
                            bcast4=f"{mm}_broadcastd_epi32(_mm_loadu_si32({{p}}))", dot=dot,
                            set1i=f"{mm}_set1_epi32({{x}})", set1f=f"{mm}_set1_ps({{x}})",
                            requant=f"{mm}_add_epi32({mm}_cvtps_epi32({mm}_min_ps({mm}_max_ps({scaled}, {{lo}}), "
                                    f"{{hi}})), {{z}})",
                            bytes16=_BYTES16[bits]),
                   helpers="\n".join(h for h in (emulation, _TRANSPOSE_8X16) if h),
                   emulated=bool(emulation))


# Without VNNI: the same sums, exact, from vpmaddwd on bytes widened to 16 bits (even and odd bytes
# apart): vpmaddubsw, which onnxruntime's AVX2 path uses, saturates pairs of u8*s8 products at 16 bits.
# vpdpbusd as inline assembly: GCC 12 copies the accumulator of its intrinsic to another register and
# back to the stack at every use (a tile of 24 ran at a tenth of the speed); clang compiles either
# well. The AVX-VNNI form is VEX-encoded ("%{vex%}": braces are dialect marks in GCC asm), so its
# registers are the first 16 ("x").
def _asm(instruction: str, reg: str) -> str:
    return f'__asm__("{instruction} %2, %1, %0" : "+{reg}"({{a}}) : "{reg}"({{u}}), "{reg}"({{s}}));'


# A macro, as the kernels that use it are single functions (arguments are plain variables).
def _dot_emulated(bits: int) -> str:
    mm = f"_mm{bits}"
    return (f"#define aotc_i8_dot{bits}(a, u, s) {mm}_add_epi32((a), {mm}_add_epi32("
            f"{mm}_madd_epi16({mm}_and_si{bits}((u), {mm}_set1_epi16(0xff)), "
            f"{mm}_srai_epi16({mm}_slli_epi16((s), 8), 8)), "
            f"{mm}_madd_epi16({mm}_srli_epi16((u), 8), {mm}_srai_epi16((s), 8))))")


@dataclass(frozen=True)
class Isa:
    """One instruction set as the micro-kernels see it."""

    name: str
    lanes: int          # float32 lanes per vector register
    registers: int      # vector registers
    # Accumulator registers a register tile may use without spilling: what is left beside the operand
    # vectors and a broadcast (avx2: 12 of 16; generic: 8, as 16-byte vectors fit anywhere).
    acc_budget: int
    fma: bool           # hardware fused multiply-add (without it, fmaf is a slow libm call)
    # 256-bit AVX2 shuffles: the 8x8 transpose and the 8-column stride-2 deinterleave of the conv paths.
    shuffles256: bool
    gemm_mr: int        # GEMM register tile: rows ...
    gemm_nv: int        # ... by vectors (NR = gemm_nv * lanes), within acc_budget
    vtype: str          # the C vector type
    attribute: str      # function attribute enabling the ISA ('' where the compiler flags do)
    include: str        # C lines declaring what the spellings use
    ops: dict[str, str] = field(repr=False, hash=False)  # zero, load, store, bcast, fma, add
    # Macros the compiler predefines when its flags enable this ISA (all of them must be defined).
    macros: tuple[str, ...] = ()
    # The int8 dot products, in order of preference (the compiler's macros choose; none: portable C).
    int8_dot: tuple[Int8Dot, ...] = ()

    @property
    def gemm_nr(self) -> int:
        return self.gemm_nv * self.lanes

    def vzero(self) -> str:
        return self.ops["zero"]

    def vload(self, p: str) -> str:
        return self.ops["load"].format(p=p)

    def vstore(self, p: str, v: str) -> str:
        return self.ops["store"].format(p=p, v=v)

    def vbcast(self, p: str) -> str:
        """A vector of ``*p`` in every lane."""
        return self.ops["bcast"].format(p=p)

    def vfma(self, a: str, x: str, y: str) -> str:
        """``a + x * y`` (one rounding where the ISA has FMA)."""
        return self.ops["fma"].format(a=a, x=x, y=y)

    def vadd(self, x: str, y: str) -> str:
        return self.ops["add"].format(x=x, y=y)


# Tiles: avx2 6x16 = 12 ymm accumulators + 2 for B + 1 broadcast of the 16 registers; avx512 12x32 = 24
# of 32 zmm; neon 8x12 = 24 of 32 q registers; generic 4x8 with 16-byte vectors, which every target
# handles (SSE2, NEON, or a scalar fallback). avx2 values were checked on Zen 3
# (benchmarks/gemm_kernel.py); the others follow the same rules but are untuned. In order of preference;
# generic, which needs no macro, last.
def _x86(name: str, bits: int, registers: int, acc_budget: int, gemm_mr: int, features: str, bcast: str,
         macros: tuple[str, ...], int8_dot: tuple[Int8Dot, ...]) -> Isa:
    """An x86 entry: its intrinsics differ only in the register width they name (``_mm256_``, ``__m256``)."""
    mm = f"_mm{bits}"
    return Isa(
        name, lanes=bits // 32, registers=registers, acc_budget=acc_budget, fma=True, shuffles256=True,
        gemm_mr=gemm_mr, gemm_nv=2, vtype=f"__m{bits}", attribute=f'__attribute__((target("{features}"))) ',
        include="#include <immintrin.h>",
        ops=dict(zero=f"{mm}_setzero_ps()", load=f"{mm}_loadu_ps({{p}})", store=f"{mm}_storeu_ps({{p}}, {{v}})",
                 bcast=bcast, fma=f"{mm}_fmadd_ps({{x}}, {{y}}, {{a}})", add=f"{mm}_add_ps({{x}}, {{y}})"),
        macros=macros, int8_dot=int8_dot)


ISAS: dict[str, Isa] = {
    "avx512": _x86("avx512", 512, registers=32, acc_budget=24, gemm_mr=12, features="avx512f",
                   bcast="_mm512_set1_ps(*({p}))", macros=("__AVX512F__",),
                   # 4 x 6 = 24 accumulators, 4 weight vectors, a broadcast: 29 of 32 zmm.
                   int8_dot=(_int8_x86("avx512_vnni", 512, ("__AVX512F__", "__AVX512VNNI__"),
                                       _asm("vpdpbusd", "v"), (4, 6)),
                             _int8_x86("avx512bw", 512, ("__AVX512BW__",), "{a} = aotc_i8_dot512({a}, {u}, {s});",
                                       (2, 4), _dot_emulated(512)))),
    "avx2": _x86("avx2", 256, registers=16, acc_budget=12, gemm_mr=6, features="avx2,fma",
                 bcast="_mm256_broadcast_ss({p})", macros=("__AVX2__", "__FMA__"),
                 # A block of 16 channels is 2 ymm: 1 x 6 = 12 accumulators, 2 weight vectors, a broadcast.
                 int8_dot=(_int8_x86("avx_vnni", 256, ("__AVX2__", "__AVXVNNI__"), _asm("%{{vex%}} vpdpbusd", "x"),
                                     (1, 6)),
                           _int8_x86("avx2", 256, ("__AVX2__",), "{a} = aotc_i8_dot256({a}, {u}, {s});", (1, 3),
                                     _dot_emulated(256)))),
    "neon": Isa(
        "neon", lanes=4, registers=32, acc_budget=24, fma=True, shuffles256=False, gemm_mr=8, gemm_nv=3,
        vtype="float32x4_t", attribute="", include="#include <arm_neon.h>",
        ops=dict(zero="vdupq_n_f32(0.0f)", load="vld1q_f32({p})", store="vst1q_f32({p}, {v})",
                 bcast="vld1q_dup_f32({p})", fma="vfmaq_f32({a}, {x}, {y})", add="vaddq_f32({x}, {y})"),
        macros=("__aarch64__", "__ARM_NEON")),
    "generic": Isa(
        "generic", lanes=4, registers=16, acc_budget=8, fma=False, shuffles256=False, gemm_mr=4, gemm_nv=2,
        vtype="aotc_v4f", attribute="", include=_GENERIC_VECTORS,
        ops=dict(zero="aotc_v4f_zero()", load="aotc_v4f_load({p})", store="aotc_v4f_store({p}, {v})",
                 bcast="aotc_v4f_bcast({p})", fma="({a} + {x} * {y})", add="({x} + {y})")),
}


def isa_for_macros(macros: set[str]) -> Isa:
    """The ISA whose kernels a compiler with these predefined macros builds: the first entry of the table
    (in order of preference: an AVX-512 build also has AVX2 and FMA) whose macros are all defined."""
    return next(e for e in ISAS.values() if set(e.macros) <= macros)
