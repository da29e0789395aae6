/*
 * aotc_types.h - element types C has no type for: bfloat16, the 8- and 4-bit floats and the 4- and
 * 2-bit integers of ONNX.
 *
 * Storage (what a library's inputs, outputs and weights hold; numpy's ml_dtypes uses the same):
 *   bfloat16                    uint16_t: the upper half of the float32 bit pattern
 *   float8_e4m3fn/_e4m3fnuz,    uint8_t: the 8-bit pattern
 *   float8_e5m2/_e5m2fnuz,
 *   float8_e8m0fnu
 *   float4_e2m1fn               uint8_t: the 4-bit pattern in the low nibble, one element per byte
 *   int4/uint4, int2/uint2      uint8_t: the two's-complement (or unsigned) value in the low 4 or 2
 *                               bits, one element per byte (not packed); higher bits are ignored
 *                               when read and written as 0
 *
 * Arithmetic happens in float (int32_t for the small integers): a read converts to it, every result
 * of such a type is rounded back to it, as ONNX's reference does op by op. The conversions below are
 * exact in the widening direction; narrowing rounds to nearest, ties to even, with ONNX's rules for
 * saturation, NaN and infinities (Cast's table), which for the default (non-saturating) case are
 * also ml_dtypes'.
 */
#ifndef AOTC_TYPES_H
#define AOTC_TYPES_H

#include <stdint.h>
#include <string.h>

#define AOTC_TYPES_INLINE static inline __attribute__((always_inline))

/* A string element: a NUL-terminated UTF-8 string owned by the caller (generated headers of models
 * with string inputs declare the same typedef). */
#ifndef AOTC_STRING_DEFINED
#define AOTC_STRING_DEFINED
typedef const char *aotc_string;
#endif

AOTC_TYPES_INLINE uint32_t aotc__f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

AOTC_TYPES_INLINE float aotc__bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

AOTC_TYPES_INLINE float aotc__nan(uint32_t sign) { return aotc__bits_f32(sign | 0x7fc00000u); }

/* -- bfloat16 ------------------------------------------------------------------------------------ */
AOTC_TYPES_INLINE float aotc_bf16_to_f32(uint16_t h) { return aotc__bits_f32((uint32_t)h << 16); }

AOTC_TYPES_INLINE uint16_t aotc_f32_to_bf16(float x) {
  const uint32_t u = aotc__f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign and the top of the payload, quieted */
    return (uint16_t)((u >> 16) | 0x40u);
  /* Round to nearest even on the dropped half; a carry into the exponent is right, up to inf. */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* -- small floats: shared rounding and decoding ------------------------------------------------ */
/* |x| (float32 bits without the sign, finite) rounded to a format with `mbits` mantissa bits and
 * exponent bias `bias`, as the magnitude code (biased exponent << mbits | mantissa). Above the
 * format's largest finite value the code keeps growing; the callers decide what overflow means. */
AOTC_TYPES_INLINE uint32_t aotc__small_round(uint32_t a, int mbits, int bias) {
  int e = (int)(a >> 23);
  uint32_t m = a & 0x7fffffu;
  if (e == 0)
    e = 1; /* a float32 subnormal: exponent -126, no implicit bit */
  else
    m |= 0x800000u;
  const int emin = 128 - bias; /* the format's smallest normal exponent, in float32's bias */
  const int eff = e < emin ? emin : e;
  const int shift = 23 - mbits + (eff - e); /* >= 20 */
  if (shift > 24)
    return 0; /* below half the smallest subnormal */
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  q += rem > half || (rem == half && (q & 1u));
  /* A subnormal result has code q; a mantissa carry moves into the exponent field by itself. */
  return ((uint32_t)(eff - emin) << mbits) + q;
}

/* The value of magnitude code `c` (no specials) of a format with `mbits` mantissa bits. */
AOTC_TYPES_INLINE float aotc__small_value(uint32_t c, int mbits, int bias) {
  const uint32_t e = c >> mbits, m = c & ((1u << mbits) - 1u);
  if (e == 0) /* subnormal: m * 2^(1 - bias - mbits) */
    return (float)m * aotc__bits_f32((uint32_t)(128 - bias - mbits) << 23);
  return aotc__bits_f32(((e + 127u - (uint32_t)bias) << 23) | (m << (23 - mbits)));
}

AOTC_TYPES_INLINE float aotc__signed(float v, uint32_t negative) { return negative ? -v : v; }

/* -- the signed float8 formats (E4M3FN, E5M2): NaN encodes as s | nan; a finite value past the largest
   code maxc saturates to it or becomes s | over (E4M3FN: NaN, E5M2: infinity) ---------------------- */
AOTC_TYPES_INLINE uint8_t aotc__f32_to_signed8(float x, int saturate, int mbits, int bias, uint32_t nan,
                                               uint32_t maxc, uint32_t over) {
  const uint32_t u = aotc__f32_bits(x), a = u & 0x7fffffffu;
  const uint8_t s = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u)
    return s | (uint8_t)nan;
  const uint32_t c = a == 0x7f800000u ? 0x100u : aotc__small_round(a, mbits, bias);
  return s | (uint8_t)(c <= maxc ? c : saturate ? maxc : over);
}

/* -- float8 E4M3FN: bias 7, no infinities, NaN = S.1111.111, max 448 ---------------------------- */
AOTC_TYPES_INLINE float aotc_e4m3fn_to_f32(uint8_t c) {
  const uint32_t s = (uint32_t)(c & 0x80u) << 24;
  if ((c & 0x7fu) == 0x7fu)
    return aotc__nan(s);
  return aotc__signed(aotc__small_value(c & 0x7fu, 3, 7), s);
}

AOTC_TYPES_INLINE uint8_t aotc_f32_to_e4m3fn(float x, int saturate) {
  return aotc__f32_to_signed8(x, saturate, 3, 7, 0x7fu, 0x7eu, 0x7fu);
}

/* -- the FNUZ float8 formats: no infinities, no -0, NaN = 0x80 (the only NaN) ------------------ */
AOTC_TYPES_INLINE float aotc__fnuz_to_f32(uint8_t c, int mbits, int bias) {
  if (c == 0x80u)
    return aotc__nan(0);
  return aotc__signed(aotc__small_value(c & 0x7fu, mbits, bias), c & 0x80u);
}

AOTC_TYPES_INLINE uint8_t aotc__f32_to_fnuz(float x, int saturate, int mbits, int bias) {
  const uint32_t u = aotc__f32_bits(x), a = u & 0x7fffffffu;
  const uint8_t s = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u)
    return 0x80u;
  const uint32_t c = a == 0x7f800000u ? 0x100u : aotc__small_round(a, mbits, bias);
  if (c > 0x7fu)
    return saturate ? s | 0x7fu : 0x80u;
  return c ? s | (uint8_t)c : 0; /* -0 has no encoding (0x80 is NaN) */
}

/* -- float8 E4M3FNUZ: bias 8, max 240 ------------------------------------------------------------ */
AOTC_TYPES_INLINE float aotc_e4m3fnuz_to_f32(uint8_t c) { return aotc__fnuz_to_f32(c, 3, 8); }
AOTC_TYPES_INLINE uint8_t aotc_f32_to_e4m3fnuz(float x, int saturate) { return aotc__f32_to_fnuz(x, saturate, 3, 8); }

/* -- float8 E5M2: IEEE-like, bias 15, infinities, max 57344 ------------------------------------- */
AOTC_TYPES_INLINE float aotc_e5m2_to_f32(uint8_t c) {
  const uint32_t s = (uint32_t)(c & 0x80u) << 24, mag = c & 0x7fu;
  if (mag >= 0x7cu)
    return mag == 0x7cu ? aotc__bits_f32(s | 0x7f800000u) : aotc__nan(s);
  return aotc__signed(aotc__small_value(mag, 2, 15), s);
}

AOTC_TYPES_INLINE uint8_t aotc_f32_to_e5m2(float x, int saturate) {
  return aotc__f32_to_signed8(x, saturate, 2, 15, 0x7eu, 0x7bu, 0x7cu);
}

/* -- float8 E5M2FNUZ: bias 16, max 57344 --------------------------------------------------------- */
AOTC_TYPES_INLINE float aotc_e5m2fnuz_to_f32(uint8_t c) { return aotc__fnuz_to_f32(c, 2, 16); }
AOTC_TYPES_INLINE uint8_t aotc_f32_to_e5m2fnuz(float x, int saturate) { return aotc__f32_to_fnuz(x, saturate, 2, 16); }

/* -- float4 E2M1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinities or NaN ---------------- */
AOTC_TYPES_INLINE float aotc_e2m1_to_f32(uint8_t c) {
  return aotc__signed(aotc__small_value(c & 7u, 1, 1), c & 8u);
}

/* Always saturates (there is nothing else to overflow to). NaN has no encoding: like ml_dtypes,
 * which the reference uses, it becomes a zero whose sign bit is the NaN's flipped. */
AOTC_TYPES_INLINE uint8_t aotc_f32_to_e2m1(float x) {
  const uint32_t u = aotc__f32_bits(x), a = u & 0x7fffffffu;
  const uint8_t s = (uint8_t)((u >> 28) & 8u);
  if (a > 0x7f800000u)
    return s ^ 8u;
  const uint32_t c = a == 0x7f800000u ? 8u : aotc__small_round(a, 1, 1);
  return s | (uint8_t)(c <= 7u ? c : 7u);
}

/* -- float8 E8M0FNU: 2^(c - 127), no sign, no zero, NaN = 0xff ------------------------------------ */
AOTC_TYPES_INLINE float aotc_e8m0_to_f32(uint8_t c) {
  if (c == 0xffu)
    return aotc__nan(0);
  return aotc__bits_f32(c ? (uint32_t)c << 23 : 0x00400000u); /* code 0 is 2^-127, a subnormal */
}

#define AOTC_E8M0_UP 0
#define AOTC_E8M0_DOWN 1
#define AOTC_E8M0_NEAREST 2

/* Cast's rules: the sign is ignored; NaN and infinities become NaN; `round_mode` up rounds any
 * fraction up, down drops it, nearest rounds half up; saturation stops rounding at the largest
 * value (2^127) instead of going to NaN. */
AOTC_TYPES_INLINE uint8_t aotc_f32_to_e8m0(float x, int saturate, int round_mode) {
  const uint32_t u = aotc__f32_bits(x), e = (u >> 23) & 0xffu;
  if (e == 0xffu)
    return 0xffu;
  uint32_t up = 0;
  if (round_mode == AOTC_E8M0_UP)
    up = (u & 0x7fffffu) != 0;
  else if (round_mode == AOTC_E8M0_NEAREST) /* guard bit, and round, sticky or a nonzero exponent */
    up = (u & 0x400000u) && ((u & 0x3fffffu) || e > 0);
  if (saturate && e == 0xfeu)
    up = 0;
  return (uint8_t)(e + up);
}

/* -- 4- and 2-bit integers ------------------------------------------------------------------------ */
AOTC_TYPES_INLINE int32_t aotc_i4_to_i32(uint8_t c) { return (int32_t)((c ^ 8u) & 15u) - 8; }
AOTC_TYPES_INLINE int32_t aotc_u4_to_i32(uint8_t c) { return (int32_t)(c & 15u); }
AOTC_TYPES_INLINE int32_t aotc_i2_to_i32(uint8_t c) { return (int32_t)((c ^ 2u) & 3u) - 2; }
AOTC_TYPES_INLINE int32_t aotc_u2_to_i32(uint8_t c) { return (int32_t)(c & 3u); }

/* Integers narrow by keeping the low bits (two's complement), as ONNX casts between integers do. */
AOTC_TYPES_INLINE uint8_t aotc_to_4bit(int64_t v) { return (uint8_t)((uint64_t)v & 15u); }
AOTC_TYPES_INLINE uint8_t aotc_to_2bit(int64_t v) { return (uint8_t)((uint64_t)v & 3u); }

/* A float truncated toward zero as an int32_t, 0 when out of range or NaN: what a float-to-int4
 * conversion gives in ml_dtypes (x86's out-of-range integer has low bits 0), without C's undefined
 * behaviour. */
AOTC_TYPES_INLINE int32_t aotc_trunc_i32(double x) {
  return x > -2147483649.0 && x < 2147483648.0 ? (int32_t)x : 0;
}


/* Float to integer conversions (Cast) without C's undefined behaviour: NaN, infinities and values out
 * of range give the type's minimum, the "integer indefinite" x86's conversion instructions return and
 * so what onnxruntime gives there. Types narrower than 32 bits keep the low bits of the int32 result,
 * uint32 those of the int64 result, as x86 compilers convert them. */
#define AOTC__CVT(name, src, dst, lo, hi, bad)                                                           \
  AOTC_TYPES_INLINE dst name(src x) { return x >= (lo) && x < (hi) ? (dst)x : (bad); }
AOTC__CVT(aotc_cvt_i32_f, float, int32_t, -2147483648.0f, 2147483648.0f, INT32_MIN)
AOTC__CVT(aotc_cvt_i32_d, double, int32_t, -2147483648.0, 2147483648.0, INT32_MIN)
AOTC__CVT(aotc_cvt_i64_f, float, int64_t, -9223372036854775808.0f, 9223372036854775808.0f, INT64_MIN)
AOTC__CVT(aotc_cvt_i64_d, double, int64_t, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN)
AOTC__CVT(aotc__cvt_u64_f, float, uint64_t, 0.0f, 18446744073709551616.0f, (uint64_t)aotc_cvt_i64_f(x))
AOTC__CVT(aotc__cvt_u64_d, double, uint64_t, 0.0, 18446744073709551616.0, (uint64_t)aotc_cvt_i64_d(x))
#undef AOTC__CVT

#endif
