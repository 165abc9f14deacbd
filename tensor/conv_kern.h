/* conv_kern.h - the inner kernels of the direct convolution (conv_direct.c),
 * included once per instruction set with SFX (a name suffix), VT (a gcc
 * vector of VL floats) and the target pragma in force.
 *
 * Accumulators are named variables a0..a7, never an array: gcc keeps them
 * in registers.  With OB, NV and TB constants, the branches on them fold. */

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
 * k % NV of the chunk.  OB * NV <= 8. */
static inline __attribute__((always_inline)) void KN_CAT(fwd_body_, SFX)(const float *xp, const int32_t *off, int T,
                                                                        const float *wt, const float *bias, float *wide,
                                                                        int64_t ldw, int64_t L, const int OB,
                                                                        const int NV) {
  const int K = OB * NV;
  for (int64_t q = 0; q < L; q += VL * NV) {
    VT z = { 0 };
    VT a0 = z + bias[0 / NV], a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
    if (K > 1) a1 = z + bias[1 / NV];
    if (K > 2) a2 = z + bias[2 / NV], a3 = z + bias[3 / NV];
    if (K > 4) a4 = z + bias[4 / NV], a5 = z + bias[5 / NV], a6 = z + bias[6 / NV], a7 = z + bias[7 / NV];
    const float *src = xp + q;
    for (int t = 0; t < T; t++) {
      const float *s = src + off[t], *wr = wt + (int64_t)t * OB;
      VT x0 = KN_CAT(kload_, SFX)(s), x1 = z, x2 = z, x3 = z;
      if (NV > 1) x1 = KN_CAT(kload_, SFX)(s + VL);
      if (NV > 2) x2 = KN_CAT(kload_, SFX)(s + 2 * VL), x3 = KN_CAT(kload_, SFX)(s + 3 * VL);
#define KX(i) ((i) == 0 ? x0 : (i) == 1 ? x1 : (i) == 2 ? x2 : x3)
      a0 += wr[0 / NV] * KX(0 % NV);
      if (K > 1) a1 += wr[1 / NV] * KX(1 % NV);
      if (K > 2) a2 += wr[2 / NV] * KX(2 % NV), a3 += wr[3 / NV] * KX(3 % NV);
      if (K > 4) {
        a4 += wr[4 / NV] * KX(4 % NV);
        a5 += wr[5 / NV] * KX(5 % NV);
        a6 += wr[6 / NV] * KX(6 % NV);
        a7 += wr[7 / NV] * KX(7 % NV);
      }
#undef KX
    }
#define KST(k, a) KN_CAT(kstore_, SFX)(wide + (int64_t)((k) / NV) * ldw + q + ((k) % NV) * VL, a)
    KST(0, a0);
    if (K > 1) KST(1, a1);
    if (K > 2) KST(2, a2), KST(3, a3);
    if (K > 4) KST(4, a4), KST(5, a5), KST(6, a6), KST(7, a7);
#undef KST
  }
}

static void KN_CAT(fwd8_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 8, 1);
}
static void KN_CAT(fwd4_, SFX)(const float *xp, const int32_t *off, int T, const float *wt, const float *bias,
                               float *wide, int64_t ldw, int64_t L) {
  KN_CAT(fwd_body_, SFX)(xp, off, T, wt, bias, wide, ldw, L, 4, 2);
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

static const conv_kernels KN_CAT(kernels_, SFX) = {
  VL, { KN_CAT(fwd1_, SFX), KN_CAT(fwd2_, SFX), KN_CAT(fwd4_, SFX), KN_CAT(fwd8_, SFX) },
  { KN_CAT(dw1_, SFX), KN_CAT(dw4_, SFX), KN_CAT(dw8_, SFX) },
};

#undef KN_CAT
#undef KN_CAT2
