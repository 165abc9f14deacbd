/* conv_kern.h - the inner kernels of the direct convolution (conv_direct.c),
 * included once per instruction set with SFX (a name suffix), VT (a gcc
 * vector of VL floats) and the target pragma in force.
 *
 * NV8 and NV4: the vectors of positions per call of the 8- and 4-channel
 * forward kernels (16 accumulators where there are 32 vector registers).
 * With OB, NV and TB constants, the loops unroll and the branches fold. */

#define KN_CAT2(a, b) a##b
#define KN_CAT(a, b) KN_CAT2(a, b)

static inline __attribute__((always_inline)) VT KN_CAT(kload_, SFX)(const float *p) {
  VT v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline __attribute__((always_inline)) void KN_CAT(kstore_, SFX)(float *p, VT v) { memcpy(p, &v, sizeof v); }

/* wide[o][q] = bias[o] + sum_t wt[t][o] * xp[off[t] + q] for o < OB and
 * q < L rounded up to VL*NV; accumulator k holds channel k / NV, vector
 * k % NV of the chunk; the vectors that do not fill a chunk go one at a
 * time.  OB * NV <= 16: the unrolled loops over constant counts leave the
 * accumulators in registers. */
static inline __attribute__((always_inline)) void KN_CAT(fwd_body_, SFX)(const float *xp, const int32_t *off, int T,
                                                                        const float *wt, const float *bias, float *wide,
                                                                        int64_t ldw, int64_t L, const int OB,
                                                                        const int NV) {
  int64_t Lv = (L + VL - 1) / VL * VL, q = 0;
  for (; q + VL * NV <= Lv; q += VL * NV) {
    VT acc[16], z = { 0 };
#pragma GCC unroll 16
    for (int k = 0; k < OB * NV; k++) acc[k] = z + bias[k / NV];
    const float *src = xp + q;
    for (int t = 0; t < T; t++) {
      const float *s = src + off[t], *wr = wt + (int64_t)t * OB;
      VT x[4];
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) x[v] = KN_CAT(kload_, SFX)(s + v * VL);
#pragma GCC unroll 16
      for (int k = 0; k < OB * NV; k++) acc[k] += wr[k / NV] * x[k % NV];
    }
#pragma GCC unroll 16
    for (int k = 0; k < OB * NV; k++) KN_CAT(kstore_, SFX)(wide + (int64_t)(k / NV) * ldw + q + (k % NV) * VL, acc[k]);
  }
  /* the last vectors one at a time: conv2's 136 positions are 4 x 32 + 16,
   * not 5 x 32 */
  for (; q < Lv; q += VL) {
    VT acc[8], z = { 0 };
#pragma GCC unroll 8
    for (int o = 0; o < OB; o++) acc[o] = z + bias[o];
    for (int t = 0; t < T; t++) {
      VT x = KN_CAT(kload_, SFX)(xp + q + off[t]);
      const float *wr = wt + (int64_t)t * OB;
#pragma GCC unroll 8
      for (int o = 0; o < OB; o++) acc[o] += wr[o] * x;
    }
#pragma GCC unroll 8
    for (int o = 0; o < OB; o++) KN_CAT(kstore_, SFX)(wide + (int64_t)o * ldw + q, acc[o]);
  }
}

static void KN_CAT(fwd8_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 8, NV8);
}
static void KN_CAT(fwd4_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 4, NV4);
}
static void KN_CAT(fwd2_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 2, 4);
}
static void KN_CAT(fwd1_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 1, 4);
}

/* acc[k][0..VL) += sum over positions (oh, ow) of xp[off[k] + oh*Wp + ow] *
 * dyt[(oh*OW + ow) * ldd + 0..VL) for k < TB (<= 8): the taps' weight
 * gradients for VL output channels.  One image's sum starts from zero in
 * registers and is then added to acc (as sgemm with beta = 1 does), so
 * rounding grows with the positions of one image, not the batch's. */
static inline __attribute__((always_inline)) void KN_CAT(dw_body_, SFX)(const float *xp, const int32_t *off,
                                                                       const float *dyt, int64_t ldd, int64_t OH,
                                                                       int64_t OW, int64_t Wp, float *acc,
                                                                       int64_t lda, const int TB) {
  VT z = { 0 }, a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
  const float *x0 = xp + off[0], *x1 = xp + off[TB > 1 ? 1 : 0], *x2 = xp + off[TB > 2 ? 2 : 0];
  const float *x3 = xp + off[TB > 3 ? 3 : 0], *x4 = xp + off[TB > 4 ? 4 : 0], *x5 = xp + off[TB > 5 ? 5 : 0];
  const float *x6 = xp + off[TB > 6 ? 6 : 0], *x7 = xp + off[TB > 7 ? 7 : 0];
  for (int64_t oh = 0; oh < OH; oh++) {
    const float *d = dyt + oh * OW * ldd;
    int64_t r = oh * Wp;
    for (int64_t ow = 0; ow < OW; ow++) {
      VT g = KN_CAT(kload_, SFX)(d + ow * ldd);
      int64_t i = r + ow;
      a0 += x0[i] * g;
      if (TB > 1) a1 += x1[i] * g;
      if (TB > 2) a2 += x2[i] * g, a3 += x3[i] * g;
      if (TB > 4) a4 += x4[i] * g, a5 += x5[i] * g, a6 += x6[i] * g, a7 += x7[i] * g;
    }
  }
#define KADD(k, a) KN_CAT(kstore_, SFX)(acc + (k) * lda, KN_CAT(kload_, SFX)(acc + (k) * lda) + a)
  KADD(0, a0);
  if (TB > 1) KADD(1, a1);
  if (TB > 2) KADD(2, a2), KADD(3, a3);
  if (TB > 4) KADD(4, a4), KADD(5, a5), KADD(6, a6), KADD(7, a7);
#undef KADD
}

static void KN_CAT(dw8_, SFX)(const float *xp, const int32_t *off, const float *dyt, int64_t ldd, int64_t OH,
                              int64_t OW, int64_t Wp, float *acc, int64_t lda) {
  KN_CAT(dw_body_, SFX)(xp, off, dyt, ldd, OH, OW, Wp, acc, lda, 8);
}
static void KN_CAT(dw4_, SFX)(const float *xp, const int32_t *off, const float *dyt, int64_t ldd, int64_t OH,
                              int64_t OW, int64_t Wp, float *acc, int64_t lda) {
  KN_CAT(dw_body_, SFX)(xp, off, dyt, ldd, OH, OW, Wp, acc, lda, 4);
}
static void KN_CAT(dw1_, SFX)(const float *xp, const int32_t *off, const float *dyt, int64_t ldd, int64_t OH,
                              int64_t OW, int64_t Wp, float *acc, int64_t lda) {
  KN_CAT(dw_body_, SFX)(xp, off, dyt, ldd, OH, OW, Wp, acc, lda, 1);
}

/* The spatial form of dL/dw for few output channels: for o < OB and taps
 * k < TB, acc[(o*TB + k) * VL ...] += the lane-wise sums over wide
 * positions q < L (in VL-chunks) of dyw[o][q] * xp[off[k] + q] (dyw is dy on
 * the wide grid, zero in the Wp - OW extra columns and past L).  One image's
 * sums start from zero in registers. */
static inline __attribute__((always_inline)) void KN_CAT(dws_body_, SFX)(const float *xp, const int32_t *off,
                                                                        const float *dyw, int64_t ldw, int64_t L,
                                                                        float *acc, const int OB, const int TB) {
  VT a[16], z = { 0 };
#pragma GCC unroll 16
  for (int k = 0; k < OB * TB; k++) a[k] = z;
  for (int64_t q = 0; q < L; q += VL) {
    VT g[8], x[2];
#pragma GCC unroll 8
    for (int o = 0; o < OB; o++) g[o] = KN_CAT(kload_, SFX)(dyw + o * ldw + q);
#pragma GCC unroll 2
    for (int k = 0; k < TB; k++) x[k] = KN_CAT(kload_, SFX)(xp + off[k] + q);
#pragma GCC unroll 16
    for (int i = 0; i < OB * TB; i++) a[i] += g[i / TB] * x[i % TB];
  }
#pragma GCC unroll 16
  for (int i = 0; i < OB * TB; i++) KN_CAT(kstore_, SFX)(acc + i * VL, KN_CAT(kload_, SFX)(acc + i * VL) + a[i]);
}

#define KN_DWS(OB, TB)                                                                                     \
  static void KN_CAT(KN_CAT(dws##OB##_, TB), SFX)(const float *xp, const int32_t *off, const float *dyw, \
                                                  int64_t ldw, int64_t L, float *acc) {                 \
    KN_CAT(dws_body_, SFX)(xp, off, dyw, ldw, L, acc, OB, TB);                                           \
  }
KN_DWS(1, 1)
KN_DWS(2, 1)
KN_DWS(4, 1)
KN_DWS(8, 1)
KN_DWS(1, 2)
KN_DWS(2, 2)
KN_DWS(4, 2)
KN_DWS(8, 2)
#undef KN_DWS

static const conv_kernels KN_CAT(kernels_, SFX) = {
  VL, { KN_CAT(fwd1_, SFX), KN_CAT(fwd2_, SFX), KN_CAT(fwd4_, SFX), KN_CAT(fwd8_, SFX) },
  { KN_CAT(dw1_, SFX), KN_CAT(dw4_, SFX), KN_CAT(dw8_, SFX) },
  { { KN_CAT(dws1_1, SFX), KN_CAT(dws2_1, SFX), KN_CAT(dws4_1, SFX), KN_CAT(dws8_1, SFX) },
    { KN_CAT(dws1_2, SFX), KN_CAT(dws2_2, SFX), KN_CAT(dws4_2, SFX), KN_CAT(dws8_2, SFX) } },
};

#undef KN_CAT
#undef KN_CAT2
