/* vmath.h - exp, tanh and sigmoid for float32 written so that gcc vectorizes
 * loops over them (no libm calls, no branches: selects only).  Private to
 * tensor/.
 *
 *   _tensor_expf     within 1e-7 relative of exp on normal results;
 *                    +inf above 88.72, 0 below -103.97, subnormal results in
 *                    between (two-step scaling), NaN stays NaN
 *   _tensor_tanhf    within 2e-7 relative; an odd polynomial below 0.625
 *                    (no cancellation near 0), 1 - 2/(exp(2|x|)+1) above
 *   _tensor_sigmoidf 1/(1+exp(-x)), within 3e-7 relative (subnormal results
 *                    within their rounding)
 *
 * (Largest relative errors against double on a 2^-16 grid of [-110, 110]:
 * 7.8e-8, 1.4e-7 and 1.9e-7.)  tests/tensor/test_tensor_kernels.c checks
 * all three against libm within 1e-6 over [-110, 110] and at the special
 * values.
 *
 * TENSOR_SIMD marks a kernel that gcc compiles three times (x86-64-v4 with
 * AVX-512, x86-64-v3 with AVX2 and FMA, and the baseline); the loader picks
 * one for the CPU (ifunc).  Elsewhere it is empty. */
#ifndef TAGALLOC_TENSOR_VMATH_H
#define TAGALLOC_TENSOR_VMATH_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define TENSOR_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TENSOR_SIMD
#endif

#define TENSOR_INLINE static inline __attribute__((always_inline))

TENSOR_INLINE float _tensor_bits_f(int32_t i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}

/* exp(x) = 2^n * e^r with n = round(x / ln 2), |r| <= ln2/2; e^r by its
 * Taylor polynomial of degree 7 (truncation below 1e-8 relative); 2^n as two
 * factors 2^(n/2) and 2^(n - n/2) so that results down to 2^-150 are
 * subnormal, not zero, and 2^128 overflows to +inf. */
TENSOR_INLINE float _tensor_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  xc = x == x ? xc : 0.0f;                       /* NaN: computed as 0, returned as NaN */
  const float shifter = 12582912.0f;             /* 1.5 * 2^23: adding it rounds to an integer */
  float nf = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - nf * 0.693145751953125f;        /* ln 2, high part (exact product) */
  r = r - nf * 1.42860682030941723e-6f;          /* ln 2, low part */
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t n = (int32_t)nf, n1 = n >> 1, n2 = n - n1;   /* n in [-150, 128] */
  float y = p * _tensor_bits_f((n1 + 127) << 23) * _tensor_bits_f((n2 + 127) << 23);
  return x == x ? y : x;
}

/* tanh(x)/x as a polynomial in u = x^2 on [0, 0.625^2], fitted here for the
 * least maximum relative error (numpy, Chebyshev nodes, reweighted least
 * squares): 1.07e-7 relative in float32. */
TENSOR_INLINE float _tensor_tanhf(float x) {
  float ax = x < 0.0f ? -x : x;
  float u = x * x;
  float q = -0.00565997629f;
  q = q * u + 0.0205909759f;
  q = q * u - 0.0537210638f;
  q = q * u + 0.133311275f;
  q = q * u - 0.333332605f;
  q = q * u + 0.999999996f;
  float small = x * q;
  float e = _tensor_expf(2.0f * ax);             /* +inf for large |x|: 2/inf = 0 */
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  float y = ax < 0.625f ? small : big;
  return x == x ? y : x;
}

/* With e = exp(-|x|) <= 1: 1/(1+e) for x >= 0, e/(1+e) below, so results
 * down to the subnormals keep their relative accuracy. */
TENSOR_INLINE float _tensor_sigmoidf(float x) {
  float e = _tensor_expf(x < 0.0f ? x : -x);
  float r = 1.0f / (1.0f + e);
  return x < 0.0f ? e * r : r;
}

#endif
