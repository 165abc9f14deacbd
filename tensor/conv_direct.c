/* conv_direct.c - direct convolution of stride 1 for small channel counts
 * (LeNet's layers), without im2col:
 *
 *   forward, and dL/dx as the forward of dy (padded by K-1-p) with the
 *   weights transposed and flipped: the image is copied into a zero-padded
 *   plane per channel (width Wp).  An output position q = oh*Wp + ow of the
 *   "wide" output reads xp[off[t] + q] for tap t = (c, kh, kw), with
 *   off[t] = c*Hp*Wp + kh*Wp + kw: every tap is one contiguous, shifted
 *   vector.  A kernel keeps 8 accumulators in registers (8 channels x 1
 *   vector of positions, 4 x 2, 2 x 4 or 1 x 4) over all taps, then the
 *   wide rows (Wp - OW columns of garbage each) are compacted into NCHW.
 *
 *   dL/dw: dy of the image transposed to [position][channel], so that a
 *   vector holds VL output channels; 8 taps' accumulators run over the
 *   positions (one broadcast of xp per tap and position) and stay in
 *   place across the batch's images.
 *
 * The kernels (conv_kern.h) are compiled for AVX-512 (x86-64-v4), AVX2 + FMA
 * (x86-64-v3) and the baseline, and picked once by the CPU. */
#include "internal.h"
#include "vmath.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void fwd_fn(const float *xp, const int32_t *off, int T, const float *wt, const float *bias, float *wide,
                    int64_t ldw, int64_t L);
typedef void dw_fn(const float *xp, const int32_t *off, const float *dyt, int64_t ldd, int64_t OH, int64_t OW,
                   int64_t Wp, float *acc, int64_t lda);
typedef void dws_fn(const float *xp, const int32_t *off, const float *dyw, int64_t ldw, int64_t L, float *acc);
typedef struct {
  int vl;
  fwd_fn *fwd[4];      /* 1, 2, 4, 8 channels */
  dw_fn *dw[3];        /* 1, 4, 8 taps */
  dws_fn *dws[2][4];   /* [1, 2 taps][1, 2, 4, 8 channels] */
} conv_kernels;

#define SFX base
typedef float vf4 __attribute__((vector_size(16)));
#define VT vf4
#define VL 4
#define NV8 1
#define NV4 2
#include "conv_kern.h"
#undef SFX
#undef VT
#undef VL

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CONV_X86 1
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define SFX v3
typedef float vf8 __attribute__((vector_size(32)));
#define VT vf8
#define VL 8
#include "conv_kern.h"
#undef SFX
#undef VT
#undef VL
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define SFX v4
typedef float vf16 __attribute__((vector_size(64)));
#define VT vf16
#define VL 16
#undef NV8
#undef NV4
#define NV8 2
#define NV4 4
#include "conv_kern.h"
#undef SFX
#undef VT
#undef VL
#pragma GCC pop_options
#endif

static const conv_kernels *kernels(void) {
  static const conv_kernels *k;
  const conv_kernels *got = __atomic_load_n(&k, __ATOMIC_ACQUIRE);
  if (got) return got;
#ifdef CONV_X86
  const char *force = getenv("TENSOR_CONV_ISA");   /* "base", "v3": tests run the other kernels */
  if (force && strcmp(force, "base") == 0) got = &kernels_base;
  else if ((force && strcmp(force, "v3") == 0) || !__builtin_cpu_supports("x86-64-v4"))
    got = __builtin_cpu_supports("x86-64-v3") ? &kernels_v3 : &kernels_base;
  else got = &kernels_v4;
#else
  got = &kernels_base;
#endif
  __atomic_store_n(&k, got, __ATOMIC_RELEASE);
  return got;
}

#define CHUNK 64   /* the most positions one kernel call computes at once (VL 16 x 4) */

void _tensor_dconv_plan(_tensor_dconv *d, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                        int64_t ph, int64_t pw) {
  d->C = C, d->H = H, d->W = W, d->O = O, d->KH = KH, d->KW = KW, d->ph = ph, d->pw = pw;
  d->Hp = H + 2 * ph, d->Wp = W + 2 * pw;
  d->OH = d->Hp - KH + 1, d->OW = d->Wp - KW + 1;
  d->T = C * KH * KW;
  d->L = (d->OH - 1) * d->Wp + d->OW;
  d->ldw = (d->L + CHUNK - 1) / CHUNK * CHUNK;
  d->plane = d->Hp * d->Wp;
  d->vl = kernels()->vl;
  d->Opad = (O + d->vl - 1) / d->vl * d->vl;
}

bool _tensor_dconv_fits(int64_t C, int64_t O, int64_t KH, int64_t KW, int64_t Hp, int64_t Wp) {
  /* tap offsets and positions are int32: the padded image must fit them */
  return C * KH * KW <= 4096 && O <= 64 && C <= 64 && C * KH * KW * (O > C ? O : C) <= (int64_t)1 << 20 &&
         Hp < (1 << 20) && Wp < (1 << 20) && C * Hp * Wp + 2 * CHUNK + Wp < INT32_MAX;
}

/* floats of the padded image (with the tail that the last chunk reads) */
static int64_t xp_size(const _tensor_dconv *d) { return d->C * d->plane + CHUNK + d->Wp; }

int64_t _tensor_dconv_fwd_scratch(const _tensor_dconv *d) {
  return xp_size(d) + 8 * d->ldw + (d->T + 15) / 16 * 16;   /* + the tap offsets (int32) */
}

static void fill_padded(const _tensor_dconv *d, const float *x, float *xp);
static void copy_rows(float *dst, int64_t lddst, const float *src, int64_t ldsrc, int64_t rows, int64_t cols);
static void tap_offsets(const _tensor_dconv *d, int32_t *off);
static int tile_of(int64_t left);
static int tile_index(int ob);

/* dL/dw over positions (few output channels, wide images) when that is
 * fewer vector FMAs than over channels */
static bool dw_spatial(const _tensor_dconv *d) {
  int64_t vl = d->vl;
  return d->O * ((d->L + vl - 1) / vl) < d->OH * d->OW * (d->Opad / vl);
}

int64_t _tensor_dconv_dw_scratch(const _tensor_dconv *d) {
  int64_t chan = d->OH * d->OW * d->Opad, spat = d->O * d->ldw + d->O * d->T * d->vl;
  return xp_size(d) + (chan > spat ? chan : spat) + (d->T + 15) / 16 * 16;
}

/* the largest channel tile of the spatial dL/dw kernels: 8 x 2 taps takes
 * 26 vector registers */
static int dws_tile_of(const _tensor_dconv *d, int64_t left) {
  int ob = tile_of(left);
  return d->vl == 16 ? ob : ob > 4 ? 4 : ob;
}

static void dconv_dw_spatial(const _tensor_dconv *d, const conv_kernels *k, const float *x, const float *dy,
                             int64_t n0, int64_t n1, float *acc, float *scratch) {
  int64_t P = d->OH * d->OW, in = d->C * d->H * d->W, vl = d->vl;
  float *xp = scratch, *dyw = xp + xp_size(d), *accs = dyw + d->O * d->ldw;
  int32_t *off = (int32_t *)(accs + d->O * d->T * vl);
  tap_offsets(d, off);
  memset(xp, 0, (size_t)xp_size(d) * 4);
  memset(dyw, 0, (size_t)(d->O * d->ldw) * 4);   /* the extra columns and the tail stay 0 */
  memset(accs, 0, (size_t)(d->O * d->T * vl) * 4);
  for (int64_t n = n0; n < n1; n++) {
    fill_padded(d, x + n * in, xp);
    for (int64_t o = 0; o < d->O; o++) copy_rows(dyw + o * d->ldw, d->Wp, dy + (n * d->O + o) * P, d->OW, d->OH, d->OW);
    float *blk = accs;
    for (int64_t o0 = 0; o0 < d->O;) {
      int ob = dws_tile_of(d, d->O - o0);
      for (int64_t t = 0; t < d->T;) {
        int tb = d->T - t >= 2 ? 2 : 1;
        k->dws[tb - 1][tile_index(ob)](xp, off + t, dyw + o0 * d->ldw, d->ldw, d->L, blk);
        blk += ob * tb * vl;
        t += tb;
      }
      o0 += ob;
    }
  }
  /* the lanes' sums, in the tiles' order, into acc [T][Opad] */
  memset(acc, 0, (size_t)(d->T * d->Opad) * 4);
  const float *blk = accs;
  for (int64_t o0 = 0; o0 < d->O;) {
    int ob = dws_tile_of(d, d->O - o0);
    for (int64_t t = 0; t < d->T;) {
      int tb = d->T - t >= 2 ? 2 : 1;
      for (int o = 0; o < ob; o++)
        for (int j = 0; j < tb; j++) {
          const float *v = blk + (o * tb + j) * vl;
          double sum = 0;
          for (int64_t l = 0; l < vl; l++) sum += v[l];
          acc[(t + j) * d->Opad + o0 + o] = (float)sum;
        }
      blk += ob * tb * vl;
      t += tb;
    }
    o0 += ob;
  }
}

static void tap_offsets(const _tensor_dconv *d, int32_t *off) {
  int64_t t = 0;
  for (int64_t c = 0; c < d->C; c++)
    for (int64_t kh = 0; kh < d->KH; kh++)
      for (int64_t kw = 0; kw < d->KW; kw++) off[t++] = (int32_t)(c * d->plane + kh * d->Wp + kw);
}

/* the tiles of channels: 8 while 8 are left, then 4, 2, 1 */
static int tile_of(int64_t left) { return left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1; }
static int tile_index(int ob) { return ob == 8 ? 3 : ob == 4 ? 2 : ob == 2 ? 1 : 0; }

void _tensor_dconv_pack(const _tensor_dconv *d, const float *w, bool grad_input, float *wt) {
  /* forward: w is [O][C][KH][KW].  grad_input: w is the forward's weight
   * [C][O][KH][KW] (here C is the forward's O), taken transposed and flipped. */
  int64_t T = d->T, KK = d->KH * d->KW;
  for (int64_t o0 = 0; o0 < d->O;) {
    int ob = tile_of(d->O - o0);
    float *dst = wt + o0 * T;
    for (int64_t t = 0; t < T; t++) {
      int64_t c = t / KK, k = t % KK;
      for (int o = 0; o < ob; o++)
        dst[t * ob + o] = grad_input ? w[((c * d->O) + o0 + o) * KK + (KK - 1 - k)] : w[((o0 + o) * d->C + c) * KK + k];
    }
    o0 += ob;
  }
}

/* Rows are short (10 to 30 floats): loops, not memcpy calls (gcc would make
 * the loops calls). */
TENSOR_SIMD __attribute__((optimize("no-tree-loop-distribute-patterns"))) static void copy_rows(float *dst, int64_t lddst,
                                                                                      const float *src, int64_t ldsrc,
                                                                                      int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < cols; i++) dst[r * lddst + i] = src[r * ldsrc + i];
}

/* The image x [C][H][W] into the padded planes (borders zero). */
static void fill_padded(const _tensor_dconv *d, const float *x, float *xp) {
  for (int64_t c = 0; c < d->C; c++)
    copy_rows(xp + c * d->plane + d->ph * d->Wp + d->pw, d->Wp, x + c * d->H * d->W, d->W, d->H, d->W);
}

void _tensor_dconv_fwd(const _tensor_dconv *d, const float *x, int64_t n0, int64_t n1, const float *wt,
                       const float *bias, float *out, float *scratch) {
  const conv_kernels *k = kernels();
  float *xp = scratch, *wide = xp + xp_size(d);
  int32_t *off = (int32_t *)(wide + 8 * d->ldw);
  tap_offsets(d, off);
  memset(xp, 0, (size_t)xp_size(d) * 4);
  int64_t P = d->OH * d->OW, in = d->C * d->H * d->W;
  float zeros[8] = { 0 };
  for (int64_t n = n0; n < n1; n++) {
    fill_padded(d, x + n * in, xp);
    float *on = out + n * d->O * P;
    for (int64_t o0 = 0; o0 < d->O;) {
      int ob = tile_of(d->O - o0);
      k->fwd[tile_index(ob)](xp, off, (int)d->T, wt + o0 * d->T, bias ? bias + o0 : zeros, wide, d->ldw, d->L);
      for (int o = 0; o < ob; o++) copy_rows(on + (o0 + o) * P, d->OW, wide + o * d->ldw, d->Wp, d->OH, d->OW);
      o0 += ob;
    }
  }
}

void _tensor_dconv_dw(const _tensor_dconv *d, const float *x, const float *dy, int64_t n0, int64_t n1, float *acc,
                      float *scratch) {
  const conv_kernels *k = kernels();
  if (dw_spatial(d)) {
    dconv_dw_spatial(d, k, x, dy, n0, n1, acc, scratch);
    return;
  }
  int64_t P = d->OH * d->OW, in = d->C * d->H * d->W, Opad = d->Opad;
  float *xp = scratch, *dyt = xp + xp_size(d);
  int32_t *off = (int32_t *)(dyt + P * Opad);
  tap_offsets(d, off);
  memset(xp, 0, (size_t)xp_size(d) * 4);
  memset(dyt, 0, (size_t)(P * Opad) * 4);   /* channels O..Opad stay 0 */
  memset(acc, 0, (size_t)(d->T * Opad) * 4);
  for (int64_t n = n0; n < n1; n++) {
    fill_padded(d, x + n * in, xp);
    const float *g = dy + n * d->O * P;
    for (int64_t p = 0; p < P; p++)
      for (int64_t o = 0; o < d->O; o++) dyt[p * Opad + o] = g[o * P + p];
    for (int64_t ov = 0; ov < Opad; ov += d->vl)
      for (int64_t t = 0; t < d->T;) {
        int tb = d->T - t >= 8 ? 8 : d->T - t >= 4 ? 4 : 1;
        k->dw[tb == 8 ? 2 : tb == 4 ? 1 : 0](xp, off + t, dyt + ov, Opad, d->OH, d->OW, d->Wp, acc + t * Opad + ov,
                                             Opad);
        t += tb;
      }
  }
}
