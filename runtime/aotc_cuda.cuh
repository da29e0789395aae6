/* aotc_cuda.cuh: the device functions every CUDA library aotc generates includes (the GPU side of
 * aotc_math.h). Elementwise expressions name these; CUDA's own single-precision functions hold the
 * accuracy (expf, logf, tanhf, erff: at most 2 ulp, per the CUDA Programming Guide's table), so
 * results differ from the CPU library's by a few ulp. Not -use_fast_math: NaN, infinities and signed
 * zeros behave as in IEEE arithmetic.
 */
#ifndef AOTC_CUDA_CUH
#define AOTC_CUDA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define AOTC_DEV static __device__ __forceinline__
/* The element type of a bool tensor in the kernels' (C) spelling, which C++ lacks. */
#define _Bool bool

AOTC_DEV float aotc_expf(float x) { return expf(x); }
AOTC_DEV float aotc_logf(float x) { return logf(x); }
AOTC_DEV float aotc_tanhf(float x) { return tanhf(x); }
AOTC_DEV float aotc_erff(float x) { return erff(x); }
/* Both tails accurate, NaN staying NaN (as aotc_math.h's). */
AOTC_DEV float aotc_sigmoidf(float x) { return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x)); }
AOTC_DEV float aotc_geluf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
AOTC_DEV float aotc_gelu_tanhf(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
/* max(x, lo) and min(x, hi) with NaN staying NaN and -0 staying -0, as Relu and Clip ask. */
AOTC_DEV float aotc_clamp_lof(float x, float lo) { return x < lo ? lo : x; }
AOTC_DEV float aotc_clamp_hif(float x, float hi) { return x > hi ? hi : x; }
AOTC_DEV double aotc_clamp_lo(double x, double lo) { return x < lo ? lo : x; }
AOTC_DEV double aotc_clamp_hi(double x, double hi) { return x > hi ? hi : x; }
AOTC_DEV int32_t aotc_trunc_i32(double x) { return (int32_t)x; }

/* One butterfly step of a warp reduction: every lane gets lane ^ mask's value. Types narrower than a
 * register travel as int. */
template <typename T> AOTC_DEV T aotc_shfl_xor(T v, int mask) {
  if constexpr (sizeof(T) < 4) {
    return (T)__shfl_xor_sync(0xffffffffu, (int)v, mask);
  } else {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
}

#endif
