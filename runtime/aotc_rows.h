/* Row kernels shared by generated libraries: numerically stable softmax and log-softmax.
 * A "row" is n elements spaced `stride` apart; stride 1 (the common last-axis case) takes loops the
 * compiler vectorizes, with max and sum accumulated in independent lanes (no -ffast-math needed). */
#ifndef AOTC_ROWS_H
#define AOTC_ROWS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "aotc_math.h"

#define AOTC_ROW_LANES 16

/* GCC/Clang vector extensions for the max: without -ffast-math neither compiler vectorizes a float
 * max reduction written as scalar C (measured 7x slower). One vector register of the target's ISA wide:
 * the library's NAME_internal.h defines AOTC_ROW_VEC from aotc/isa.py before including this header. */
#ifndef AOTC_ROW_VEC
#error "define AOTC_ROW_VEC (the float lanes of the target's vector registers) before including aotc_rows.h"
#endif
typedef float aotc__rowvf __attribute__((vector_size(4 * AOTC_ROW_VEC)));
typedef int32_t aotc__rowvi __attribute__((vector_size(4 * AOTC_ROW_VEC)));

/* The max of a row; NaN if any element is NaN (as onnxruntime's softmax propagates it). */
static inline float aotc_row_max(const float *restrict x, size_t n, size_t stride) {
  float r = -INFINITY;
  int nan = 0;
  size_t i = 0;
  if (stride == 1 && n >= AOTC_ROW_VEC) {
    aotc__rowvf m, v;
    memcpy(&m, x, sizeof m);
    aotc__rowvi isnan = m != m;
    for (i = AOTC_ROW_VEC; i + AOTC_ROW_VEC <= n; i += AOTC_ROW_VEC) {
      memcpy(&v, x + i, sizeof v);
      const aotc__rowvi gt = v > m;
      m = (aotc__rowvf)((gt & (aotc__rowvi)v) | (~gt & (aotc__rowvi)m));
      isnan |= v != v;
    }
    for (int l = 0; l < AOTC_ROW_VEC; l++) {
      r = m[l] > r ? m[l] : r;
      nan |= isnan[l];
    }
  }
  for (; i < n; i++) {
    const float v = x[i * stride];
    r = v > r ? v : r;
    nan |= v != v;
  }
  return nan ? NAN : r;
}

/* y = exp(x - max) and returns the sum of y. */
static inline float aotc_row_exp_sum(const float *restrict x, float *restrict y, size_t n, size_t stride,
                                     float max) {
  float s[AOTC_ROW_LANES] = {0};
  size_t i = 0;
  if (stride == 1)
    for (; i + AOTC_ROW_LANES <= n; i += AOTC_ROW_LANES)
      for (size_t l = 0; l < AOTC_ROW_LANES; l++) {
        float e = aotc_expf(x[i + l] - max);
        y[i + l] = e;
        s[l] += e;
      }
  for (; i < n; i++) {
    float e = aotc_expf(x[i * stride] - max);
    y[i * stride] = e;
    s[0] += e;
  }
  for (size_t w = AOTC_ROW_LANES / 2; w > 0; w /= 2)
    for (size_t l = 0; l < w; l++) s[l] += s[l + w];
  return s[0];
}

static inline void aotc_softmax_row(const float *restrict x, float *restrict y, size_t n, size_t stride) {
  const float max = aotc_row_max(x, n, stride);
  const float inv = 1.0f / aotc_row_exp_sum(x, y, n, stride, max);
  for (size_t i = 0; i < n; i++) y[i * stride] *= inv;
}

/* (x - max) - log(sum): x - (max + log(sum)) rounds max + log(sum) at max's magnitude first, which
 * loses the whole result for large rows (a row of 1e8 gave -8 instead of -4.16). */
static inline void aotc_log_softmax_row(const float *restrict x, float *restrict y, size_t n,
                                        size_t stride) {
  const float max = aotc_row_max(x, n, stride);
  const float log_sum = aotc_logf(aotc_row_exp_sum(x, y, n, stride, max));
  for (size_t i = 0; i < n; i++) y[i * stride] = (x[i * stride] - max) - log_sum;
}

#endif
