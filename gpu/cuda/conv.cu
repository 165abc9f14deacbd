/* conv.cu - the data movement of a convolution done as matrix products
 * (im2col, col2im, and the layout changes around the product), and
 * pooling.  backend.c runs the products on cuBLAS.
 *
 * Images n0 .. n0+nb-1 of a batch are done at once: the column matrix is
 * [C*KH*KW, nb*OH*OW], so one product covers the chunk.  col2im and the
 * pooling gradients gather (each input element sums what reads it, in the
 * host backend's order) instead of scattering with atomics: no races, the
 * same result every run, and the pooling gradients equal the host's bit for
 * bit. */
#include "common.cuh"

__global__ void k_im2col(gcu_conv g, const float *x, int64_t n0, int64_t nb, float *col) {
  int64_t P = g.OH * g.OW, Q = nb * P, KK = g.KH * g.KW;
  GCU_FOR(i, g.C * KK * Q) {
    int64_t r = i / Q, q = i % Q;
    int64_t n = q / P, p = q % P, oh = p / g.OW, ow = p % g.OW;
    int64_t c = r / KK, kk = r % KK, kh = kk / g.KW, kw = kk % g.KW;
    int64_t ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
    float v = 0.0f;
    if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) v = x[(((n0 + n) * g.C + c) * g.H + ih) * g.W + iw];
    col[i] = v;
  }
}

/* The outputs (oh) whose window starting at oh*stride - pad covers input
 * row ih through tap kh: oh*stride = ih + pad - kh. */
__global__ void k_col2im(gcu_conv g, const float *dcol, int64_t n0, int64_t nb, float *dx) {
  int64_t P = g.OH * g.OW, Q = nb * P, HW = g.H * g.W;
  GCU_FOR(i, nb * g.C * HW) {
    int64_t n = i / (g.C * HW), c = (i / HW) % g.C, ih = (i % HW) / g.W, iw = i % g.W;
    float acc = 0.0f;
    for (int64_t kh = 0; kh < g.KH; kh++) {
      int64_t th = ih + g.pad - kh;
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.OH) continue;
      int64_t oh = th / g.stride;
      for (int64_t kw = 0; kw < g.KW; kw++) {
        int64_t tw = iw + g.pad - kw;
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.OW) continue;
        int64_t r = (c * g.KH + kh) * g.KW + kw;
        acc += dcol[r * Q + n * P + oh * g.OW + tw / g.stride];
      }
    }
    dx[(n0 + n) * g.C * HW + c * HW + ih * g.W + iw] = acc;
  }
}

/* y [n0+i, o, p] = t [o, i*P + p] (+ bias[o]) */
__global__ void k_conv_unpack(gcu_conv g, const float *t, const float *bias, int64_t n0, int64_t nb, float *y) {
  int64_t P = g.OH * g.OW;
  GCU_FOR(k, nb * g.O * P) {
    int64_t i = k / (g.O * P), o = (k / P) % g.O, p = k % P;
    float v = t[o * nb * P + i * P + p];
    y[n0 * g.O * P + k] = bias ? v + bias[o] : v;
  }
}

/* t [o, i*P + p] = dy [n0+i, o, p] */
__global__ void k_conv_pack(gcu_conv g, const float *dy, int64_t n0, int64_t nb, float *t) {
  int64_t P = g.OH * g.OW;
  GCU_FOR(k, g.O * nb * P) {
    int64_t o = k / (nb * P), i = (k / P) % nb, p = k % P;
    t[k] = dy[((n0 + i) * g.O + o) * P + p];
  }
}

__global__ void k_max_pool(float *y, int32_t *argmax, const float *x, int64_t planes, int64_t H, int64_t W,
                           int64_t OH, int64_t OW, int k, int stride) {
  GCU_FOR(i, planes * OH * OW) {
    int64_t pl = i / (OH * OW), oh = (i / OW) % OH, ow = i % OW;
    const float *p = x + pl * H * W;
    int64_t base = oh * stride * W + ow * stride, best = base;
    float m = p[base];
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++) {
        int64_t at = base + a * W + b;
        if (p[at] > m) m = p[at], best = at;
      }
    y[i] = m;
    if (argmax) argmax[i] = (int32_t)best;
  }
}

__global__ void k_avg_pool(float *y, const float *x, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                           int k, int stride) {
  float scale = 1.0f / (float)(k * k);
  GCU_FOR(i, planes * OH * OW) {
    int64_t pl = i / (OH * OW), oh = (i / OW) % OH, ow = i % OW;
    const float *w0 = x + pl * H * W + oh * stride * W + ow * stride;
    float s = 0.0f;
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++) s += w0[a * W + b];
    y[i] = s * scale;
  }
}

/* The window rows (or columns) o with o*stride <= ih < o*stride + k, o < OH. */
__device__ inline void covering(int64_t ih, int k, int stride, int64_t OH, int64_t *lo, int64_t *hi) {
  int64_t a = ih - k + 1;
  *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  int64_t b = ih / stride;
  *hi = b < OH - 1 ? b : OH - 1;   /* inclusive; empty when hi < lo */
}

__global__ void k_max_pool_grad(float *dx, const float *dy, const int32_t *argmax, int64_t planes, int64_t H,
                                int64_t W, int64_t OH, int64_t OW, int k, int stride) {
  GCU_FOR(i, planes * H * W) {
    int64_t pl = i / (H * W), f = i % (H * W), ih = f / W, iw = f % W;
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, k, stride, OH, &oh0, &oh1);
    covering(iw, k, stride, OW, &ow0, &ow1);
    const float *g = dy + pl * OH * OW;
    const int32_t *am = argmax + pl * OH * OW;
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++)
        if (am[oh * OW + ow] == f) acc += g[oh * OW + ow];
    dx[i] = acc;
  }
}

__global__ void k_avg_pool_grad(float *dx, const float *dy, int64_t planes, int64_t H, int64_t W, int64_t OH,
                                int64_t OW, int k, int stride) {
  float scale = 1.0f / (float)(k * k);
  GCU_FOR(i, planes * H * W) {
    int64_t pl = i / (H * W), ih = (i % (H * W)) / W, iw = i % W;
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, k, stride, OH, &oh0, &oh1);
    covering(iw, k, stride, OW, &ow0, &ow1);
    const float *g = dy + pl * OH * OW;
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) acc += g[oh * OW + ow] * scale;
    dx[i] = acc;
  }
}

extern "C" cudaError_t _gcu_im2col(cudaStream_t s, const gcu_conv *g, const float *x, int64_t n0, int64_t nb,
                                   float *col) {
  int64_t n = g->C * g->KH * g->KW * nb * g->OH * g->OW;
  if (n > 0) k_im2col<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(*g, x, n0, nb, col);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_col2im(cudaStream_t s, const gcu_conv *g, const float *dcol, int64_t n0, int64_t nb,
                                   float *dx) {
  int64_t n = nb * g->C * g->H * g->W;
  if (n > 0) k_col2im<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(*g, dcol, n0, nb, dx);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_conv_unpack(cudaStream_t s, const gcu_conv *g, const float *t, const float *bias,
                                        int64_t n0, int64_t nb, float *y) {
  int64_t n = nb * g->O * g->OH * g->OW;
  if (n > 0) k_conv_unpack<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(*g, t, bias, n0, nb, y);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_conv_pack(cudaStream_t s, const gcu_conv *g, const float *dy, int64_t n0, int64_t nb,
                                      float *t) {
  int64_t n = nb * g->O * g->OH * g->OW;
  if (n > 0) k_conv_pack<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(*g, dy, n0, nb, t);
  return gcu_launched();
}

/* The pooled size, or -1 when the window does not fit. */
static int64_t pooled(int64_t H, int k, int stride) { return k < 1 || stride < 1 || H < k ? -1 : (H - k) / stride + 1; }

extern "C" cudaError_t _gcu_max_pool(cudaStream_t s, float *y, int32_t *argmax, const float *x, int64_t planes,
                                     int64_t H, int64_t W, int k, int stride) {
  int64_t OH = pooled(H, k, stride), OW = pooled(W, k, stride);
  if (OH < 0 || OW < 0) return cudaErrorInvalidValue;
  if (planes > 0) k_max_pool<<<gcu_blocks(planes * OH * OW), GCU_THREADS, 0, s>>>(y, argmax, x, planes, H, W, OH, OW, k, stride);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_avg_pool(cudaStream_t s, float *y, const float *x, int64_t planes, int64_t H, int64_t W,
                                     int k, int stride) {
  int64_t OH = pooled(H, k, stride), OW = pooled(W, k, stride);
  if (OH < 0 || OW < 0) return cudaErrorInvalidValue;
  if (planes > 0) k_avg_pool<<<gcu_blocks(planes * OH * OW), GCU_THREADS, 0, s>>>(y, x, planes, H, W, OH, OW, k, stride);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_max_pool_grad(cudaStream_t s, float *dx, const float *dy, const int32_t *argmax,
                                          int64_t planes, int64_t H, int64_t W, int k, int stride) {
  int64_t OH = pooled(H, k, stride), OW = pooled(W, k, stride);
  if (OH < 0 || OW < 0) return cudaErrorInvalidValue;
  if (planes > 0)
    k_max_pool_grad<<<gcu_blocks(planes * H * W), GCU_THREADS, 0, s>>>(dx, dy, argmax, planes, H, W, OH, OW, k, stride);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_avg_pool_grad(cudaStream_t s, float *dx, const float *dy, int64_t planes, int64_t H,
                                          int64_t W, int k, int stride) {
  int64_t OH = pooled(H, k, stride), OW = pooled(W, k, stride);
  if (OH < 0 || OW < 0) return cudaErrorInvalidValue;
  if (planes > 0)
    k_avg_pool_grad<<<gcu_blocks(planes * H * W), GCU_THREADS, 0, s>>>(dx, dy, planes, H, W, OH, OW, k, stride);
  return gcu_launched();
}
