/* host_ops.c - the host backend's kernels: plain C loops and OpenBLAS.
 *
 * The reference the CUDA backend is compared with, value by value: each
 * kernel is the arithmetic its entry in gpu.h states, in the most direct
 * form (sums accumulate in double).  Every pointer is checked to lie in
 * live device memory first (GPU_EINVAL otherwise), as a GPU would fault on
 * a host pointer. */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* ---- argument checks ------------------------------------------------------------ */

#define NEED(cond, ...) \
  do { \
    if (!(cond)) return _gpu_host_fail(GPU_EINVAL, __VA_ARGS__); \
  } while (0)

/* A device array of n elements of `size` bytes (n >= 0). */
static bool dev(const void *p, int64_t n, size_t size) {
  if (n < 0 || p == NULL) return false;
  if (n == 0) return true;
  return _gpu_host_owns(p, (size_t)n * size);
}

#define DEV_F(op, p, n) NEED(dev(p, n, 4), "%s: %s (%lld floats at %p) is not device memory", op, #p, (long long)(n), (const void *)(p))
#define DEV_I(op, p, n) NEED(dev(p, n, 4), "%s: %s (%lld int32 at %p) is not device memory", op, #p, (long long)(n), (const void *)(p))
#define SIZE(op, n) NEED((n) >= 0, "%s: %s = %lld, want >= 0", op, #n, (long long)(n))

/* ---- sgemm ------------------------------------------------------------------------- */

static gpu_status h_sgemm(gpu_trans ta, gpu_trans tb, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, float beta, float *c, int ldc, gpu_stream s) {
  (void)s;
  NEED(m >= 0 && n >= 0 && k >= 0, "sgemm: m %d n %d k %d, want >= 0", m, n, k);
  if (m == 0 || n == 0) return GPU_OK;
  int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
  NEED(lda >= (acols > 0 ? acols : 1) && ldb >= (bcols > 0 ? bcols : 1) && ldc >= n,
       "sgemm: lda %d ldb %d ldc %d too small for A [%d, %d] B [%d, %d] C [%d, %d]", lda, ldb, ldc, arows, acols,
       brows, bcols, m, n);
  DEV_F("sgemm", c, (int64_t)(m - 1) * ldc + n);
  if (k > 0) {
    DEV_F("sgemm", a, (int64_t)(arows - 1) * lda + acols);
    DEV_F("sgemm", b, (int64_t)(brows - 1) * ldb + bcols);
  }
  if (k == 0) {   /* C = beta * C; BLAS leaves it to the implementation */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) c[(int64_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(int64_t)i * ldc + j];
    return GPU_OK;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
              b, ldb, beta, c, ldc);
  return GPU_OK;
}

/* ---- fill and copy -------------------------------------------------------------------- */

static gpu_status h_fill(float *out, float v, int64_t n, gpu_stream s) {
  (void)s;
  DEV_F("fill", out, n);
  for (int64_t i = 0; i < n; i++) out[i] = v;
  return GPU_OK;
}

static gpu_status h_fill_i32(int32_t *out, int32_t v, int64_t n, gpu_stream s) {
  (void)s;
  DEV_I("fill_i32", out, n);
  for (int64_t i = 0; i < n; i++) out[i] = v;
  return GPU_OK;
}

static gpu_status h_copy_strided(float *dst, const float *src, int ndim, const int64_t *shape,
                                 const int64_t *stride, gpu_stream s) {
  (void)s;
  NEED(ndim >= 1 && ndim <= 6 && shape && stride, "copy_strided: ndim %d (want 1 .. 6) or NULL shape/strides", ndim);
  int64_t n = 1, lo = 0, hi = 0;
  for (int d = 0; d < ndim; d++) {
    NEED(shape[d] >= 0, "copy_strided: shape[%d] = %lld", d, (long long)shape[d]);
    n *= shape[d];
  }
  if (n == 0) return GPU_OK;
  for (int d = 0; d < ndim; d++) {
    if (stride[d] < 0) lo += stride[d] * (shape[d] - 1);
    else hi += stride[d] * (shape[d] - 1);
  }
  DEV_F("copy_strided", dst, n);
  NEED(dev(src + lo, hi - lo + 1, 4), "copy_strided: the source's strided extent is not device memory");
  int64_t idx[6] = { 0 }, off = 0;
  int64_t inner = shape[ndim - 1], is = stride[ndim - 1];
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; j++) dst[i + j] = src[off + j * is];
    for (int d = ndim - 2; d >= 0; d--) {   /* the next row */
      off += stride[d];
      if (++idx[d] < shape[d]) break;
      off -= stride[d] * shape[d];
      idx[d] = 0;
    }
  }
  return GPU_OK;
}

/* ---- elementwise ------------------------------------------------------------------------- */

#define BINARY(name, expr) \
  static gpu_status h_##name(float *out, const float *a, const float *b, int64_t n, gpu_stream s) { \
    (void)s; \
    DEV_F(#name, out, n); \
    DEV_F(#name, a, n); \
    DEV_F(#name, b, n); \
    for (int64_t i = 0; i < n; i++) out[i] = (expr); \
    return GPU_OK; \
  }
BINARY(add, a[i] + b[i])
BINARY(sub, a[i] - b[i])
BINARY(mul, a[i] * b[i])
BINARY(div, a[i] / b[i])

static gpu_status h_axpby(float *out, float alpha, const float *a, float beta, const float *b, int64_t n,
                          gpu_stream s) {
  (void)s;
  DEV_F("axpby", out, n);
  DEV_F("axpby", a, n);
  DEV_F("axpby", b, n);
  for (int64_t i = 0; i < n; i++) out[i] = alpha * a[i] + beta * b[i];
  return GPU_OK;
}

#define UNARY(name, expr) \
  static gpu_status h_##name(float *out, const float *x, int64_t n, gpu_stream s) { \
    (void)s; \
    DEV_F(#name, out, n); \
    DEV_F(#name, x, n); \
    for (int64_t i = 0; i < n; i++) out[i] = (expr); \
    return GPU_OK; \
  }
UNARY(relu, x[i] > 0.0f ? x[i] : 0.0f)
UNARY(tanh, tanhf(x[i]))
UNARY(sigmoid, 1.0f / (1.0f + expf(-x[i])))
UNARY(exp, expf(x[i]))
UNARY(log, logf(x[i]))

#define SCALAR(name, expr) \
  static gpu_status h_##name(float *out, const float *a, float v, int64_t n, gpu_stream s) { \
    (void)s; \
    DEV_F(#name, out, n); \
    DEV_F(#name, a, n); \
    for (int64_t i = 0; i < n; i++) out[i] = (expr); \
    return GPU_OK; \
  }
SCALAR(scale, a[i] * v)
SCALAR(add_scalar, a[i] + v)

#define BACKWARD(name, expr) \
  static gpu_status h_##name(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s) { \
    (void)s; \
    DEV_F(#name, dx, n); \
    DEV_F(#name, dy, n); \
    DEV_F(#name, y, n); \
    for (int64_t i = 0; i < n; i++) dx[i] = (expr); \
    return GPU_OK; \
  }
BACKWARD(relu_bwd, y[i] > 0.0f ? dy[i] : 0.0f)
BACKWARD(tanh_bwd, dy[i] * (1.0f - y[i] * y[i]))
BACKWARD(sigmoid_bwd, dy[i] * y[i] * (1.0f - y[i]))

static gpu_status h_bias_add_rows(float *out, const float *x, const float *bias, int64_t rows, int64_t cols,
                                  gpu_stream s) {
  (void)s;
  SIZE("bias_add_rows", rows);
  SIZE("bias_add_rows", cols);
  DEV_F("bias_add_rows", out, rows * cols);
  DEV_F("bias_add_rows", x, rows * cols);
  DEV_F("bias_add_rows", bias, cols);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[r * cols + c] = x[r * cols + c] + bias[c];
  return GPU_OK;
}

static gpu_status h_bias_add_channels(float *out, const float *x, const float *bias, int64_t n, int64_t c,
                                      int64_t hw, gpu_stream s) {
  (void)s;
  SIZE("bias_add_channels", n);
  SIZE("bias_add_channels", c);
  SIZE("bias_add_channels", hw);
  DEV_F("bias_add_channels", out, n * c * hw);
  DEV_F("bias_add_channels", x, n * c * hw);
  DEV_F("bias_add_channels", bias, c);
  for (int64_t i = 0; i < n * c; i++) {
    float b = bias[i % c];
    for (int64_t j = 0; j < hw; j++) out[i * hw + j] = x[i * hw + j] + b;
  }
  return GPU_OK;
}

/* ---- reductions ------------------------------------------------------------------------------ */

static gpu_status h_sum_all(float *out1, const float *x, int64_t n, gpu_stream s) {
  (void)s;
  DEV_F("sum_all", out1, 1);
  DEV_F("sum_all", x, n);
  double acc = 0.0;
  for (int64_t i = 0; i < n; i++) acc += x[i];
  out1[0] = (float)acc;
  return GPU_OK;
}

static gpu_status h_sum_rows(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  SIZE("sum_rows", rows);
  SIZE("sum_rows", cols);
  DEV_F("sum_rows", out, cols);
  DEV_F("sum_rows", x, rows * cols);
  for (int64_t c = 0; c < cols; c++) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; r++) acc += x[r * cols + c];
    out[c] = (float)acc;
  }
  return GPU_OK;
}

static gpu_status h_sum_cols(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  SIZE("sum_cols", rows);
  SIZE("sum_cols", cols);
  DEV_F("sum_cols", out, rows);
  DEV_F("sum_cols", x, rows * cols);
  for (int64_t r = 0; r < rows; r++) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols; c++) acc += x[r * cols + c];
    out[r] = (float)acc;
  }
  return GPU_OK;
}

static gpu_status h_sum_channels(float *out, const float *x, int64_t n, int64_t c, int64_t hw, gpu_stream s) {
  (void)s;
  SIZE("sum_channels", n);
  SIZE("sum_channels", c);
  SIZE("sum_channels", hw);
  DEV_F("sum_channels", out, c);
  DEV_F("sum_channels", x, n * c * hw);
  for (int64_t ch = 0; ch < c; ch++) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < hw; j++) acc += x[(i * c + ch) * hw + j];
    out[ch] = (float)acc;
  }
  return GPU_OK;
}

static gpu_status h_argmax_rows(int32_t *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  SIZE("argmax_rows", rows);
  NEED(cols >= 1 && cols <= INT32_MAX, "argmax_rows: cols = %lld, want 1 .. 2^31-1", (long long)cols);
  DEV_I("argmax_rows", out, rows);
  DEV_F("argmax_rows", x, rows * cols);
  for (int64_t r = 0; r < rows; r++) {
    const float *row = x + r * cols;
    int64_t best = 0;
    for (int64_t c = 1; c < cols; c++)
      if (row[c] > row[best]) best = c;
    out[r] = (int32_t)best;
  }
  return GPU_OK;
}

/* ---- convolution ---------------------------------------------------------------------------------- */

/* The output columns ox whose input column ox*stride - pad + j lies inside
 * [0, w): [*lo, *hi). */
static void col_range(const gpu_conv2d *p, int j, int *lo, int *hi) {
  int a = p->pad - j;                     /* ox*stride >= a */
  *lo = a <= 0 ? 0 : (a + p->stride - 1) / p->stride;
  int b = p->w - 1 + p->pad - j;          /* ox*stride <= b */
  *hi = b < 0 ? 0 : b / p->stride + 1;
  if (*hi > p->ow) *hi = p->ow;
  if (*lo > *hi) *lo = *hi;
}

/* col [c*kh*kw, oh*ow] (rows ld floats apart) from one image x [c, h, w],
 * zero outside.  Rows are short: plain loops over the valid range, no test
 * per element. */
static void im2col(const gpu_conv2d *p, const float *x, float *col, int64_t ld) {
  for (int c = 0; c < p->c; c++)
    for (int i = 0; i < p->kh; i++)
      for (int j = 0; j < p->kw; j++) {
        float *row = col + (((int64_t)c * p->kh + i) * p->kw + j) * ld;
        const float *plane = x + (int64_t)c * p->h * p->w;
        int lo, hi;
        col_range(p, j, &lo, &hi);
        for (int oy = 0; oy < p->oh; oy++) {
          int iy = oy * p->stride - p->pad + i;
          float *o = row + (int64_t)oy * p->ow;
          if (iy < 0 || iy >= p->h) {
            for (int ox = 0; ox < p->ow; ox++) o[ox] = 0.0f;
            continue;
          }
          const float *in = plane + (int64_t)iy * p->w - p->pad + j;
          for (int ox = 0; ox < lo; ox++) o[ox] = 0.0f;
          if (p->stride == 1)
            for (int ox = lo; ox < hi; ox++) o[ox] = in[ox];
          else
            for (int ox = lo; ox < hi; ox++) o[ox] = in[(int64_t)ox * p->stride];
          for (int ox = hi; ox < p->ow; ox++) o[ox] = 0.0f;
        }
      }
}

/* dx [c, h, w] += col (rows ld floats apart) scattered back (dx zeroed by
 * the caller). */
static void col2im(const gpu_conv2d *p, const float *col, int64_t ld, float *dx) {
  for (int c = 0; c < p->c; c++)
    for (int i = 0; i < p->kh; i++)
      for (int j = 0; j < p->kw; j++) {
        const float *row = col + (((int64_t)c * p->kh + i) * p->kw + j) * ld;
        float *plane = dx + (int64_t)c * p->h * p->w;
        int lo, hi;
        col_range(p, j, &lo, &hi);
        for (int oy = 0; oy < p->oh; oy++) {
          int iy = oy * p->stride - p->pad + i;
          if (iy < 0 || iy >= p->h) continue;
          const float *o = row + (int64_t)oy * p->ow;
          float *in = plane + (int64_t)iy * p->w - p->pad + j;
          if (p->stride == 1)
            for (int ox = lo; ox < hi; ox++) in[ox] += o[ox];
          else
            for (int ox = lo; ox < hi; ox++) in[(int64_t)ox * p->stride] += o[ox];
        }
      }
}

/* Images go through the conv entries in chunks of g: their column matrix
 * [c*kh*kw, g*oh*ow] and one [o, g*oh*ow] matrix of outputs (or output
 * gradients), so one sgemm covers the chunk.  g keeps the workspace near
 * CHUNK_FLOATS (at least one image). */
#define CHUNK_FLOATS ((int64_t)4 << 20)

static int64_t conv_chunk(const gpu_conv2d *p) {
  int64_t per = ((int64_t)p->c * p->kh * p->kw + p->o) * p->oh * p->ow;
  int64_t g = per > 0 ? CHUNK_FLOATS / per : 1;
  if (g < 1) g = 1;
  if (g > p->n) g = p->n > 0 ? p->n : 1;
  return g;
}

static size_t h_conv2d_workspace(const gpu_conv2d *p) {
  if (p == NULL) return 0;
  return (size_t)conv_chunk(p) * ((size_t)p->c * p->kh * p->kw + (size_t)p->o) * p->oh * p->ow * sizeof(float);
}

static gpu_status conv_check(const char *op, const gpu_conv2d *p, const void *ws) {
  gpu_conv2d q;
  NEED(p != NULL, "%s: NULL geometry", op);
  NEED(gpu_conv2d_init(&q, p->n, p->c, p->h, p->w, p->o, p->kh, p->kw, p->stride, p->pad) == GPU_OK &&
           q.oh == p->oh && q.ow == p->ow,
       "%s: geometry not from gpu_conv2d_init (n %d c %d h %d w %d o %d k %dx%d stride %d pad %d)", op, p->n, p->c,
       p->h, p->w, p->o, p->kh, p->kw, p->stride, p->pad);
  size_t need = h_conv2d_workspace(p);
  NEED(need == 0 || _gpu_host_owns(ws, need), "%s: workspace %p is not %zu bytes of device memory", op, ws, need);
  return GPU_OK;
}

/* y [n, o, P] of chunk images from out [o, g*P]; or the reverse (gather). */
static void chunk_scatter(float *y, const float *out, int64_t g, int64_t o, int64_t P, const float *bias) {
  for (int64_t k = 0; k < g; k++)
    for (int64_t c = 0; c < o; c++) {
      const float *src = out + c * g * P + k * P;
      float *dst = y + (k * o + c) * P, b = bias ? bias[c] : 0.0f;
      for (int64_t i = 0; i < P; i++) dst[i] = src[i] + b;
    }
}

static void chunk_gather(float *out, const float *dy, int64_t g, int64_t o, int64_t P) {
  for (int64_t k = 0; k < g; k++)
    for (int64_t c = 0; c < o; c++) memcpy(out + c * g * P + k * P, dy + (k * o + c) * P, (size_t)P * sizeof(float));
}

static gpu_status h_conv2d_fwd(const gpu_conv2d *p, float *y, const float *x, const float *w, const float *bias,
                               void *ws, gpu_stream s) {
  (void)s;
  gpu_status st = conv_check("conv2d_fwd", p, ws);
  if (st) return st;
  int64_t CKK = (int64_t)p->c * p->kh * p->kw, P = (int64_t)p->oh * p->ow;
  int64_t xs = (int64_t)p->c * p->h * p->w, ys = (int64_t)p->o * P, G = conv_chunk(p);
  DEV_F("conv2d_fwd", y, p->n * ys);
  DEV_F("conv2d_fwd", x, p->n * xs);
  DEV_F("conv2d_fwd", w, p->o * CKK);
  if (bias) DEV_F("conv2d_fwd", bias, p->o);
  float *col = ws, *out = col + CKK * G * P;
  for (int64_t n0 = 0; n0 < p->n; n0 += G) {
    int64_t g = p->n - n0 < G ? p->n - n0 : G;
    for (int64_t k = 0; k < g; k++) im2col(p, x + (n0 + k) * xs, col + k * P, g * P);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->o, (int)(g * P), (int)CKK, 1.0f, w, (int)CKK, col,
                (int)(g * P), 0.0f, out, (int)(g * P));
    chunk_scatter(y + n0 * ys, out, g, p->o, P, bias);
  }
  return GPU_OK;
}

static gpu_status h_conv2d_bwd_data(const gpu_conv2d *p, float *dx, const float *dy, const float *w, void *ws,
                                    gpu_stream s) {
  (void)s;
  gpu_status st = conv_check("conv2d_bwd_data", p, ws);
  if (st) return st;
  int64_t CKK = (int64_t)p->c * p->kh * p->kw, P = (int64_t)p->oh * p->ow;
  int64_t xs = (int64_t)p->c * p->h * p->w, ys = (int64_t)p->o * P, G = conv_chunk(p);
  DEV_F("conv2d_bwd_data", dx, p->n * xs);
  DEV_F("conv2d_bwd_data", dy, p->n * ys);
  DEV_F("conv2d_bwd_data", w, p->o * CKK);
  float *col = ws, *out = col + CKK * G * P;
  memset(dx, 0, (size_t)(p->n * xs) * sizeof(float));
  for (int64_t n0 = 0; n0 < p->n; n0 += G) {
    int64_t g = p->n - n0 < G ? p->n - n0 : G;
    chunk_gather(out, dy + n0 * ys, g, p->o, P);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)CKK, (int)(g * P), p->o, 1.0f, w, (int)CKK, out,
                (int)(g * P), 0.0f, col, (int)(g * P));
    for (int64_t k = 0; k < g; k++) col2im(p, col + k * P, g * P, dx + (n0 + k) * xs);
  }
  return GPU_OK;
}

static gpu_status h_conv2d_bwd_weight(const gpu_conv2d *p, float *dw, const float *dy, const float *x, void *ws,
                                      gpu_stream s) {
  (void)s;
  gpu_status st = conv_check("conv2d_bwd_weight", p, ws);
  if (st) return st;
  int64_t CKK = (int64_t)p->c * p->kh * p->kw, P = (int64_t)p->oh * p->ow;
  int64_t xs = (int64_t)p->c * p->h * p->w, ys = (int64_t)p->o * P, G = conv_chunk(p);
  DEV_F("conv2d_bwd_weight", dw, p->o * CKK);
  DEV_F("conv2d_bwd_weight", dy, p->n * ys);
  DEV_F("conv2d_bwd_weight", x, p->n * xs);
  float *col = ws, *out = col + CKK * G * P;
  if (p->n == 0) memset(dw, 0, (size_t)(p->o * CKK) * sizeof(float));
  for (int64_t n0 = 0; n0 < p->n; n0 += G) {
    int64_t g = p->n - n0 < G ? p->n - n0 : G;
    for (int64_t k = 0; k < g; k++) im2col(p, x + (n0 + k) * xs, col + k * P, g * P);
    chunk_gather(out, dy + n0 * ys, g, p->o, P);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->o, (int)CKK, (int)(g * P), 1.0f, out, (int)(g * P), col,
                (int)(g * P), n0 == 0 ? 0.0f : 1.0f, dw, (int)CKK);
  }
  return GPU_OK;
}

/* ---- pooling ------------------------------------------------------------------------------------ */

static gpu_status pool_check(const char *op, const gpu_pool2d *p) {
  gpu_pool2d q;
  NEED(p != NULL, "%s: NULL geometry", op);
  NEED(gpu_pool2d_init(&q, p->n, p->c, p->h, p->w, p->k, p->stride) == GPU_OK && q.oh == p->oh && q.ow == p->ow,
       "%s: geometry not from gpu_pool2d_init (n %d c %d h %d w %d k %d stride %d)", op, p->n, p->c, p->h, p->w,
       p->k, p->stride);
  return GPU_OK;
}

static gpu_status h_max_pool_fwd(const gpu_pool2d *p, float *y, int32_t *argmax, const float *x, gpu_stream s) {
  (void)s;
  gpu_status st = pool_check("max_pool_fwd", p);
  if (st) return st;
  int64_t planes = (int64_t)p->n * p->c, hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  DEV_F("max_pool_fwd", y, planes * ohw);
  DEV_I("max_pool_fwd", argmax, planes * ohw);
  DEV_F("max_pool_fwd", x, planes * hw);
  for (int64_t q = 0; q < planes; q++) {
    const float *in = x + q * hw;
    for (int oy = 0; oy < p->oh; oy++)
      for (int ox = 0; ox < p->ow; ox++) {
        int64_t best = (int64_t)oy * p->stride * p->w + (int64_t)ox * p->stride;
        for (int i = 0; i < p->k; i++)
          for (int j = 0; j < p->k; j++) {
            int64_t at = (int64_t)(oy * p->stride + i) * p->w + ox * p->stride + j;
            if (in[at] > in[best]) best = at;
          }
        int64_t o = q * ohw + (int64_t)oy * p->ow + ox;
        y[o] = in[best];
        argmax[o] = (int32_t)best;
      }
  }
  return GPU_OK;
}

static gpu_status h_max_pool_bwd(const gpu_pool2d *p, float *dx, const float *dy, const int32_t *argmax,
                                 gpu_stream s) {
  (void)s;
  gpu_status st = pool_check("max_pool_bwd", p);
  if (st) return st;
  int64_t planes = (int64_t)p->n * p->c, hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  DEV_F("max_pool_bwd", dx, planes * hw);
  DEV_F("max_pool_bwd", dy, planes * ohw);
  DEV_I("max_pool_bwd", argmax, planes * ohw);
  memset(dx, 0, (size_t)(planes * hw) * sizeof(float));
  for (int64_t q = 0; q < planes; q++)
    for (int64_t i = 0; i < ohw; i++) {
      int32_t at = argmax[q * ohw + i];
      if (at >= 0 && at < hw) dx[q * hw + at] += dy[q * ohw + i];
    }
  return GPU_OK;
}

static gpu_status h_avg_pool_fwd(const gpu_pool2d *p, float *y, const float *x, gpu_stream s) {
  (void)s;
  gpu_status st = pool_check("avg_pool_fwd", p);
  if (st) return st;
  int64_t planes = (int64_t)p->n * p->c, hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  DEV_F("avg_pool_fwd", y, planes * ohw);
  DEV_F("avg_pool_fwd", x, planes * hw);
  float inv = 1.0f / (float)(p->k * p->k);
  for (int64_t q = 0; q < planes; q++)
    for (int oy = 0; oy < p->oh; oy++)
      for (int ox = 0; ox < p->ow; ox++) {
        float acc = 0.0f;
        for (int i = 0; i < p->k; i++)
          for (int j = 0; j < p->k; j++) acc += x[q * hw + (int64_t)(oy * p->stride + i) * p->w + ox * p->stride + j];
        y[q * ohw + (int64_t)oy * p->ow + ox] = acc * inv;
      }
  return GPU_OK;
}

static gpu_status h_avg_pool_bwd(const gpu_pool2d *p, float *dx, const float *dy, gpu_stream s) {
  (void)s;
  gpu_status st = pool_check("avg_pool_bwd", p);
  if (st) return st;
  int64_t planes = (int64_t)p->n * p->c, hw = (int64_t)p->h * p->w, ohw = (int64_t)p->oh * p->ow;
  DEV_F("avg_pool_bwd", dx, planes * hw);
  DEV_F("avg_pool_bwd", dy, planes * ohw);
  float inv = 1.0f / (float)(p->k * p->k);
  memset(dx, 0, (size_t)(planes * hw) * sizeof(float));
  for (int64_t q = 0; q < planes; q++)
    for (int oy = 0; oy < p->oh; oy++)
      for (int ox = 0; ox < p->ow; ox++) {
        float g = dy[q * ohw + (int64_t)oy * p->ow + ox] * inv;
        for (int i = 0; i < p->k; i++)
          for (int j = 0; j < p->k; j++) dx[q * hw + (int64_t)(oy * p->stride + i) * p->w + ox * p->stride + j] += g;
      }
  return GPU_OK;
}

/* ---- softmax and cross-entropy ---------------------------------------------------------------------- */

/* y = softmax(row); returns log(sum exp(row - max)) + max. */
static double softmax_row(float *y, const float *x, int64_t cols) {
  float mx = x[0];
  for (int64_t c = 1; c < cols; c++)
    if (x[c] > mx) mx = x[c];
  double sum = 0.0;
  for (int64_t c = 0; c < cols; c++) {
    float e = expf(x[c] - mx);
    y[c] = e;
    sum += e;
  }
  float inv = (float)(1.0 / sum);
  for (int64_t c = 0; c < cols; c++) y[c] *= inv;
  return log(sum) + mx;
}

static gpu_status h_softmax_rows(float *y, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  SIZE("softmax_rows", rows);
  NEED(cols >= 1, "softmax_rows: cols = %lld, want >= 1", (long long)cols);
  DEV_F("softmax_rows", y, rows * cols);
  DEV_F("softmax_rows", x, rows * cols);
  for (int64_t r = 0; r < rows; r++) softmax_row(y + r * cols, x + r * cols, cols);
  return GPU_OK;
}

static gpu_status h_softmax_bwd(float *dx, const float *dy, const float *y, int64_t rows, int64_t cols,
                                gpu_stream s) {
  (void)s;
  SIZE("softmax_bwd", rows);
  SIZE("softmax_bwd", cols);
  DEV_F("softmax_bwd", dx, rows * cols);
  DEV_F("softmax_bwd", dy, rows * cols);
  DEV_F("softmax_bwd", y, rows * cols);
  NEED(dx != dy && dx != y, "softmax_bwd: dx may not be dy or y");
  for (int64_t r = 0; r < rows; r++) {
    const float *g = dy + r * cols, *p = y + r * cols;
    double dot = 0.0;
    for (int64_t c = 0; c < cols; c++) dot += (double)g[c] * p[c];
    for (int64_t c = 0; c < cols; c++) dx[r * cols + c] = p[c] * (g[c] - (float)dot);
  }
  return GPU_OK;
}

static gpu_status h_softmax_xent_fwd(float *probs, float *loss1, const float *logits, const int32_t *labels,
                                     int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  NEED(rows >= 1 && cols >= 1, "softmax_xent_fwd: rows %lld cols %lld, want >= 1", (long long)rows, (long long)cols);
  DEV_F("softmax_xent_fwd", probs, rows * cols);
  DEV_F("softmax_xent_fwd", loss1, 1);
  DEV_F("softmax_xent_fwd", logits, rows * cols);
  DEV_I("softmax_xent_fwd", labels, rows);
  double total = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const float *x = logits + r * cols;
    double lse = softmax_row(probs + r * cols, x, cols);
    int32_t l = labels[r];
    total += l >= 0 && l < cols ? lse - x[l] : NAN;
  }
  loss1[0] = (float)(total / (double)rows);
  return GPU_OK;
}

static gpu_status h_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, float dloss,
                                     int64_t rows, int64_t cols, gpu_stream s) {
  (void)s;
  NEED(rows >= 1 && cols >= 1, "softmax_xent_bwd: rows %lld cols %lld, want >= 1", (long long)rows, (long long)cols);
  DEV_F("softmax_xent_bwd", dlogits, rows * cols);
  DEV_F("softmax_xent_bwd", probs, rows * cols);
  DEV_I("softmax_xent_bwd", labels, rows);
  float g = dloss / (float)rows;
  for (int64_t r = 0; r < rows; r++) {
    int32_t l = labels[r];
    for (int64_t c = 0; c < cols; c++) dlogits[r * cols + c] = (probs[r * cols + c] - (c == l ? 1.0f : 0.0f)) * g;
  }
  return GPU_OK;
}

/* ---- embedding ---------------------------------------------------------------------------------------- */

static gpu_status h_embedding_fwd(float *out, const float *weight, const int32_t *idx, int64_t n, int64_t dim,
                                  int64_t vocab, gpu_stream s) {
  (void)s;
  SIZE("embedding_fwd", n);
  SIZE("embedding_fwd", dim);
  SIZE("embedding_fwd", vocab);
  DEV_F("embedding_fwd", out, n * dim);
  DEV_F("embedding_fwd", weight, vocab * dim);
  DEV_I("embedding_fwd", idx, n);
  for (int64_t i = 0; i < n; i++) {
    int32_t v = idx[i];
    for (int64_t d = 0; d < dim; d++) out[i * dim + d] = v >= 0 && v < vocab ? weight[v * dim + d] : NAN;
  }
  return GPU_OK;
}

static gpu_status h_embedding_bwd(float *dweight, const float *dout, const int32_t *idx, int64_t n, int64_t dim,
                                  int64_t vocab, gpu_stream s) {
  (void)s;
  SIZE("embedding_bwd", n);
  SIZE("embedding_bwd", dim);
  SIZE("embedding_bwd", vocab);
  DEV_F("embedding_bwd", dweight, vocab * dim);
  DEV_F("embedding_bwd", dout, n * dim);
  DEV_I("embedding_bwd", idx, n);
  for (int64_t i = 0; i < n; i++) {
    int32_t v = idx[i];
    if (v < 0 || v >= vocab) continue;
    for (int64_t d = 0; d < dim; d++) dweight[v * dim + d] += dout[i * dim + d];
  }
  return GPU_OK;
}

/* ---- optimizers ----------------------------------------------------------------------------------------- */

static gpu_status h_sgd_step(float *p, const float *g, float *buf, int64_t n, float lr, float momentum, float wd,
                             int first, gpu_stream s) {
  (void)s;
  DEV_F("sgd_step", p, n);
  DEV_F("sgd_step", g, n);
  if (momentum != 0.0f) DEV_F("sgd_step", buf, n);
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    if (momentum != 0.0f) {
      buf[i] = first ? d : momentum * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
  return GPU_OK;
}

static gpu_status h_adam_step(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                              float eps, float wd, int64_t t, gpu_stream s) {
  (void)s;
  NEED(t >= 1, "adam_step: step %lld, want >= 1", (long long)t);
  DEV_F("adam_step", p, n);
  DEV_F("adam_step", g, n);
  DEV_F("adam_step", m, n);
  DEV_F("adam_step", v, n);
  float bc1 = (float)(1.0 - pow(b1, (double)t)), bc2 = (float)(1.0 - pow(b2, (double)t));
  float step = lr / bc1, bc2s = sqrtf(bc2);
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * d;
    v[i] = b2 * v[i] + (1.0f - b2) * d * d;
    p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + eps);
  }
  return GPU_OK;
}

void _gpu_host_ops_fill(gpu_backend *b) {
  b->sgemm = h_sgemm;
  b->fill = h_fill;
  b->fill_i32 = h_fill_i32;
  b->copy_strided = h_copy_strided;
  b->add = h_add;
  b->sub = h_sub;
  b->mul = h_mul;
  b->div = h_div;
  b->axpby = h_axpby;
  b->scale = h_scale;
  b->add_scalar = h_add_scalar;
  b->relu = h_relu;
  b->tanh = h_tanh;
  b->sigmoid = h_sigmoid;
  b->exp = h_exp;
  b->log = h_log;
  b->relu_bwd = h_relu_bwd;
  b->tanh_bwd = h_tanh_bwd;
  b->sigmoid_bwd = h_sigmoid_bwd;
  b->bias_add_rows = h_bias_add_rows;
  b->bias_add_channels = h_bias_add_channels;
  b->sum_all = h_sum_all;
  b->sum_rows = h_sum_rows;
  b->sum_cols = h_sum_cols;
  b->sum_channels = h_sum_channels;
  b->argmax_rows = h_argmax_rows;
  b->conv2d_workspace = h_conv2d_workspace;
  b->conv2d_fwd = h_conv2d_fwd;
  b->conv2d_bwd_data = h_conv2d_bwd_data;
  b->conv2d_bwd_weight = h_conv2d_bwd_weight;
  b->max_pool_fwd = h_max_pool_fwd;
  b->max_pool_bwd = h_max_pool_bwd;
  b->avg_pool_fwd = h_avg_pool_fwd;
  b->avg_pool_bwd = h_avg_pool_bwd;
  b->softmax_rows = h_softmax_rows;
  b->softmax_bwd = h_softmax_bwd;
  b->softmax_xent_fwd = h_softmax_xent_fwd;
  b->softmax_xent_bwd = h_softmax_xent_bwd;
  b->embedding_fwd = h_embedding_fwd;
  b->embedding_bwd = h_embedding_bwd;
  b->sgd_step = h_sgd_step;
  b->adam_step = h_adam_step;
}
