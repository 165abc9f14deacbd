/* linalg.c - matrix products (small ones in gemm_small.c's AVX2 kernels,
 * the rest on OpenBLAS cblas_sgemm), conv2d (im2col over the whole batch,
 * one sgemm) and its backward products, pooling.
 *
 * A 2-D operand goes to sgemm as it is when one of its axes has stride 1 (a
 * transposed view is sgemm's Trans with the same leading dimension); only a
 * view with no unit stride is copied first. */
#include "gemm_small.h"
#include "internal.h"
#include "vmath.h"

#include <cblas.h>
#include <float.h>
#include <string.h>

/* ---- matmul ------------------------------------------------------------------- */

/* How sgemm can read an R x C matrix with strides (s0, s1). */
static bool gemm_layout(int64_t R, int64_t C, int64_t s0, int64_t s1, CBLAS_TRANSPOSE *tr, int64_t *ld) {
  int64_t maxc = C > 1 ? C : 1, maxr = R > 1 ? R : 1;
  if ((C == 1 || s1 == 1) && (R == 1 || s0 >= maxc)) {
    *tr = CblasNoTrans;
    *ld = R == 1 ? maxc : s0;
    return true;
  }
  if ((R == 1 || s0 == 1) && (C == 1 || s1 >= maxr)) {
    *tr = CblasTrans;
    *ld = C == 1 ? maxr : s1;
    return true;
  }
  return false;
}

typedef struct {
  const float *p;
  int64_t bstride;      /* elements between batches (0: shared) */
  CBLAS_TRANSPOSE tr;
  int64_t ld;
} gemm_arg;

/* a operand for sgemm, copying it to contiguous when needed (*tmp). */
static bool gemm_prepare(const tensor *t, tensor **tmp, gemm_arg *g) {
  int nd = t->ndim;
  int64_t R = t->shape[nd - 2], C = t->shape[nd - 1];
  *tmp = NULL;
  if (!gemm_layout(R, C, t->strides[nd - 2], t->strides[nd - 1], &g->tr, &g->ld)) {
    *tmp = _tensor_clone(t);
    if (*tmp == NULL) return false;
    t = *tmp;
    g->tr = CblasNoTrans;
    g->ld = C > 1 ? C : 1;
  }
  g->p = t->data;
  g->bstride = nd == 3 && t->shape[0] > 1 ? t->strides[0] : 0;
  return true;
}

/* a and b checked already (they may be maybe_t's descriptors). */
static bool matmul_shapes(const char *op, const tensor *a, const tensor *b, int *nd, int64_t *shape,
                          int64_t *batch) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3) {
    _tensor_err(TENSOR_ESHAPE, "%s: want 2-D or 3-D operands, got %s and %s", op, _tensor_desc(a, b1),
                _tensor_desc(b, b2));
    return false;
  }
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
  int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
  int64_t ba = a->ndim == 3 ? a->shape[0] : 1, bb = b->ndim == 3 ? b->shape[0] : 1;
  if (K != K2 || (ba != bb && ba != 1 && bb != 1)) {
    _tensor_err(TENSOR_ESHAPE, "%s: shapes %s and %s do not multiply", op, _tensor_desc(a, b1), _tensor_desc(b, b2));
    return false;
  }
  *batch = ba > bb ? ba : bb;
  *nd = a->ndim == 3 || b->ndim == 3 ? 3 : 2;
  if (*nd == 3) shape[0] = *batch;
  shape[*nd - 2] = M;
  shape[*nd - 1] = N;
  return true;
}

static bool matmul_args(const char *op, const tensor *a, const tensor *b) {
  return _tensor_arg_f32(op, "a", a) && (b == a || _tensor_arg_f32(op, "b", b));
}

/* The arguments checked already. */
static tensor_status gemm_run(const char *op, tensor *out, const tensor *a, const tensor *b, float alpha,
                              float beta) {
  int nd;
  int64_t shape[3], batch;
  if (!matmul_shapes(op, a, b, &nd, shape, &batch)) return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR], b3[TENSOR_SHAPE_STR], b4[TENSOR_SHAPE_STR];
  if (out->ndim != nd || memcmp(out->shape, shape, (size_t)nd * sizeof *shape) != 0)
    return _tensor_err(TENSOR_ESHAPE, "%s: out is %s, %s @ %s is %s", op, _tensor_desc(out, b3), _tensor_desc(a, b1),
                       _tensor_desc(b, b2), _tensor_shape_desc(TENSOR_F32, nd, shape, b4));
  int64_t M = shape[nd - 2], N = shape[nd - 1], K = a->shape[a->ndim - 1];
  int64_t ldc = M == 1 ? (N > 1 ? N : 1) : out->strides[nd - 2];
  if ((N > 1 && out->strides[nd - 1] != 1) || ldc < N)
    return _tensor_err(TENSOR_ESHAPE, "%s: out %s must have rows of stride 1", op, _tensor_desc(out, b3));
  if (out->numel == 0) return TENSOR_OK;
  tensor *ta, *tb;
  gemm_arg ga, gb;
  if (!gemm_prepare(a, &ta, &ga)) return tensor_last_status();
  if (!gemm_prepare(b, &tb, &gb)) {
    tensor_free(ta);
    return tensor_last_status();
  }
  int64_t cb = nd == 3 ? out->strides[0] : 0;
  float *c = out->data;
  /* Small products: the project's own kernels (gemm_small.c), one per batch. */
  if (_tensor_sgemm_small_serves(ga.tr == CblasTrans, gb.tr == CblasTrans, M, N, K)) {
    for (int64_t i = 0; i < batch; i++)
      _tensor_sgemm_small(ga.tr == CblasTrans, gb.tr == CblasTrans, M, N, K, alpha, ga.p + i * ga.bstride, ga.ld,
                          gb.p + i * gb.bstride, gb.ld, beta, c + i * cb, ldc);
    tensor_free(ta);
    tensor_free(tb);
    return TENSOR_OK;
  }
  /* A batch of row-major a's over one shared b is a single taller product. */
  if (batch > 1 && gb.bstride == 0 && ga.tr == CblasNoTrans && ga.bstride == M * ga.ld && cb == M * ldc) {
    cblas_sgemm(CblasRowMajor, ga.tr, gb.tr, (int)(batch * M), (int)N, (int)K, alpha, ga.p, (int)ga.ld, gb.p,
                (int)gb.ld, beta, c, (int)ldc);
  } else {
    for (int64_t i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, ga.tr, gb.tr, (int)M, (int)N, (int)K, alpha, ga.p + i * ga.bstride, (int)ga.ld,
                  gb.p + i * gb.bstride, (int)gb.ld, beta, c + i * cb, (int)ldc);
  }
  tensor_free(ta);
  tensor_free(tb);
  return TENSOR_OK;
}

tensor_status tensor_gemm_out(tensor *out, const tensor *a, const tensor *b, float alpha, float beta) {
  const char *op = "tensor_gemm_out";
  bool bad;
  if (_tensor_dev_dispatch(op, a, b, &bad)) return _tensor_devops->gemm(op, out, a, 0, b, 0, alpha, beta);
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32(op, "out", out) || !matmul_args(op, a, b)) return tensor_last_status();
  return gemm_run(op, out, a, b, alpha, beta);
}

static tensor *matmul_run(const char *op, const tensor *a, const tensor *b) {
  int nd;
  int64_t shape[3], batch;
  if (!matmul_shapes(op, a, b, &nd, shape, &batch)) return NULL;
  tensor *out = _tensor_out(op, TENSOR_F32, nd, shape);
  if (out && gemm_run(op, out, a, b, 1.0f, 0.0f) != TENSOR_OK) {
    tensor_free(out);
    return NULL;
  }
  return out;
}

tensor *tensor_matmul(const tensor *a, const tensor *b) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_matmul", a, b, &bad)) return _tensor_devops->matmul("tensor_matmul", a, b);
  if (bad) return NULL;
  if (!matmul_args("tensor_matmul", a, b)) return NULL;
  return matmul_run("tensor_matmul", a, b);
}

/* t, or t with its last two axes swapped, as a descriptor on the caller's
 * stack: read by this call only, never a tensor of its own (no header, no
 * hold, no reference), so sgemm gets its Trans flag without a view made and
 * freed on the ledger.  The same strides as tensor_transpose's view, so the
 * same sgemm call and the same bits. */
static const tensor *maybe_t(const tensor *t, int trans, tensor *tmp) {
  if (!trans || t == NULL || t->ndim < 2) return t;
  *tmp = *t;
  int i = t->ndim - 2, j = t->ndim - 1;
  tmp->shape[i] = t->shape[j];
  tmp->shape[j] = t->shape[i];
  tmp->strides[i] = t->strides[j];
  tmp->strides[j] = t->strides[i];
  tmp->scope = 0;
  tmp->scope_prev = tmp->scope_next = NULL;
  return tmp;
}

tensor_status tensor_gemm_t_out(tensor *out, const tensor *a, int ta, const tensor *b, int tb, float alpha,
                                float beta) {
  const char *op = "tensor_gemm_t_out";
  bool bad;
  if (_tensor_dev_dispatch(op, a, b, &bad)) return _tensor_devops->gemm(op, out, a, ta, b, tb, alpha, beta);
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32(op, "out", out) || !matmul_args(op, a, b)) return tensor_last_status();
  tensor at, bt;
  return gemm_run("tensor_gemm_out", out, maybe_t(a, ta, &at), maybe_t(b, tb, &bt), alpha, beta);
}

tensor *tensor_matmul_t(const tensor *a, int ta, const tensor *b, int tb) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_matmul_t", a, b, &bad)) return _tensor_devops->matmul_t("tensor_matmul_t", a, ta, b, tb);
  if (bad) return NULL;
  if (!matmul_args("tensor_matmul_t", a, b)) return NULL;
  tensor at, bt;
  return matmul_run("tensor_matmul", maybe_t(a, ta, &at), maybe_t(b, tb, &bt));
}

/* ---- conv2d ------------------------------------------------------------------------ */

typedef struct {
  int64_t N, C, H, W, O, KH, KW, OH, OW, s, p;
} conv_geom;

static bool conv_geometry(const char *op, const int64_t *xs, const int64_t *ws, int stride, int pad, conv_geom *g) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  g->N = xs[0], g->C = xs[1], g->H = xs[2], g->W = xs[3];
  g->O = ws[0], g->KH = ws[2], g->KW = ws[3];
  g->s = stride, g->p = pad;
  if (stride < 1 || pad < 0) {
    _tensor_err(TENSOR_EINVAL, "%s: stride %d, padding %d (want stride >= 1, padding >= 0)", op, stride, pad);
    return false;
  }
  if (ws[1] != g->C || g->KH < 1 || g->KW < 1 || g->H + 2 * pad < g->KH || g->W + 2 * pad < g->KW) {
    _tensor_err(TENSOR_ESHAPE, "%s: input %s and weight %s do not match (stride %d, padding %d)", op,
                _tensor_shape_desc(TENSOR_F32, 4, xs, b1), _tensor_shape_desc(TENSOR_F32, 4, ws, b2), stride, pad);
    return false;
  }
  g->OH = (g->H + 2 * pad - g->KH) / stride + 1;
  g->OW = (g->W + 2 * pad - g->KW) / stride + 1;
  return true;
}

/* The output columns ow whose input column ow*s - p + kw is inside [0, W). */
static void col_range(const conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi) {
  int64_t a = g->p - kw;   /* ow*s >= a */
  *lo = a <= 0 ? 0 : (a + g->s - 1) / g->s;
  int64_t b = g->W - 1 + g->p - kw;   /* ow*s <= b */
  *hi = b < 0 ? 0 : b / g->s + 1;
  if (*hi > g->OW) *hi = g->OW;
  if (*lo > *hi) *lo = *hi;
}

/* col [C*KH*KW, OH*OW] from one image x [C,H,W].  Rows are short (OW
 * floats): plain loops, not memcpy calls (gcc would make the loops calls). */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void im2col(const conv_geom *g, const float *x, float *col) {
  int64_t P = g->OH * g->OW;
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        float *row = col + ((c * g->KH + kh) * g->KW + kw) * P;
        const float *plane = x + c * g->H * g->W;
        int64_t lo, hi;
        col_range(g, kw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          float *o = row + oh * g->OW;
          int64_t ih = oh * g->s - g->p + kh;
          if (ih < 0 || ih >= g->H) {
            for (int64_t ow = 0; ow < g->OW; ow++) o[ow] = 0.0f;
            continue;
          }
          const float *in = plane + ih * g->W - g->p + kw;
          for (int64_t ow = 0; ow < lo; ow++) o[ow] = 0.0f;
          if (g->s == 1) for (int64_t ow = lo; ow < hi; ow++) o[ow] = in[ow];
          else for (int64_t ow = lo; ow < hi; ow++) o[ow] = in[ow * g->s];
          for (int64_t ow = hi; ow < g->OW; ow++) o[ow] = 0.0f;
        }
      }
}

/* One image dx [C,H,W] = col [C*KH*KW, OH*OW] scattered back. */
static void col2im(const conv_geom *g, const float *col, float *dx) {
  int64_t P = g->OH * g->OW;
  memset(dx, 0, (size_t)(g->C * g->H * g->W) * 4);
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++)
      for (int64_t kw = 0; kw < g->KW; kw++) {
        const float *row = col + ((c * g->KH + kh) * g->KW + kw) * P;
        float *plane = dx + c * g->H * g->W;
        int64_t lo, hi;
        col_range(g, kw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          int64_t ih = oh * g->s - g->p + kh;
          if (ih < 0 || ih >= g->H) continue;
          const float *o = row + oh * g->OW;
          float *in = plane + ih * g->W - g->p + kw;
          if (g->s == 1) for (int64_t ow = lo; ow < hi; ow++) in[ow] += o[ow];
          else for (int64_t ow = lo; ow < hi; ow++) in[ow * g->s] += o[ow];
        }
      }
}

static tensor *contig_4d(const char *op, const char *name, const tensor *t) {
  if (!_tensor_arg_f32(op, name, t)) return NULL;
  if (t->ndim != 4) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "%s: %s is %s, want 4-D", op, name, _tensor_desc(t, b));
    return NULL;
  }
  return _tensor_borrow(t);
}

/* What the image loops of conv2d share; each part (thread) has its own
 * scratch matrix at scratch + part * scratch_size. */
typedef struct {
  const conv_geom *g;
  const float *x, *w, *dy, *bias;
  int64_t bias_stride, CKK, P;
  float *out, *scratch;
  int64_t scratch_size;
} conv_job;

/* out_n [O, P] = bias + w [O, CKK] @ im2col(x_n) [CKK, P] */
static void conv_fwd_part(void *ctx, int64_t lo, int64_t hi, int part) {
  const conv_job *j = ctx;
  const conv_geom *g = j->g;
  float *col = j->scratch + part * j->scratch_size;
  for (int64_t n = lo; n < hi; n++) {
    float *on = j->out + n * g->O * j->P;
    for (int64_t o = 0; o < g->O; o++) {
      float bv = j->bias ? j->bias[o * j->bias_stride] : 0.0f;
      for (int64_t i = 0; i < j->P; i++) on[o * j->P + i] = bv;
    }
    im2col(g, j->x + n * g->C * g->H * g->W, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->O, (int)j->P, (int)j->CKK, 1.0f, j->w,
                (int)j->CKK, col, (int)j->P, 1.0f, on, (int)j->P);
  }
}

/* dcol [CKK, P] = w^T @ dy_n [O, P]; dx_n = col2im(dcol) */
static void conv_dx_part(void *ctx, int64_t lo, int64_t hi, int part) {
  const conv_job *j = ctx;
  const conv_geom *g = j->g;
  float *dcol = j->scratch + part * j->scratch_size;
  for (int64_t n = lo; n < hi; n++) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)j->CKK, (int)j->P, (int)g->O, 1.0f, j->w, (int)j->CKK,
                j->dy + n * g->O * j->P, (int)j->P, 0.0f, dcol, (int)j->P);
    col2im(g, dcol, j->out + n * g->C * g->H * g->W);
  }
}

/* partial dw [O, CKK] += dy_n [O, P] @ im2col(x_n)^T; scratch per part:
 * [CKK * P] column matrix, then [O * CKK] partial sum */
static void conv_dw_part(void *ctx, int64_t lo, int64_t hi, int part) {
  const conv_job *j = ctx;
  const conv_geom *g = j->g;
  float *col = j->scratch + part * j->scratch_size, *dw = col + j->CKK * j->P;
  memset(dw, 0, (size_t)(g->O * j->CKK) * 4);
  for (int64_t n = lo; n < hi; n++) {
    im2col(g, j->x + n * g->C * g->H * g->W, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->O, (int)j->CKK, (int)j->P, 1.0f,
                j->dy + n * g->O * j->P, (int)j->P, col, (int)j->P, 1.0f, dw, (int)j->CKK);
  }
}

/* The direct kernels' job (conv_direct.c): one plan, scratch per part. */
typedef struct {
  _tensor_dconv d;
  const float *x, *dy, *wt, *bias;
  float *out, *scratch;
  int64_t scratch_size;
} dconv_job;

static void dconv_fwd_part(void *ctx, int64_t lo, int64_t hi, int part) {
  const dconv_job *j = ctx;
  _tensor_dconv_fwd(&j->d, j->x, lo, hi, j->wt, j->bias, j->out, j->scratch + part * j->scratch_size);
}

/* scratch per part: the tap-major partial dL/dw [T][Opad], then the kernel's */
static void dconv_dw_part(void *ctx, int64_t lo, int64_t hi, int part) {
  const dconv_job *j = ctx;
  float *acc = j->scratch + part * j->scratch_size;
  _tensor_dconv_dw(&j->d, j->x, j->dy, lo, hi, acc, acc + j->d.T * j->d.Opad);
}

static int conv_parts(const conv_geom *g) {
  int t = _tensor_threads();
  return t > g->N ? (int)(g->N > 0 ? g->N : 1) : t;
}

/* Image by image, the batch split over tensor_set_threads threads: the
 * column matrix of one image stays in cache, and each output image is
 * written in place in NCHW order. */
tensor *tensor_conv2d(const tensor *x, const tensor *w, const tensor *bias, int stride, int pad) {
  const char *op = "tensor_conv2d";
  bool bad;
  if (_tensor_dev_dispatch(op, x, w, &bad)) return _tensor_devops->conv2d(op, x, w, bias, stride, pad);
  if (bad) return NULL;
  tensor *xc = NULL, *wc = NULL, *out = NULL;
  _tensor_scratch col = { 0 };
  conv_geom g;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (!(xc = contig_4d(op, "x", x)) || !(wc = contig_4d(op, "w", w))) goto fail;
  if (!conv_geometry(op, x->shape, w->shape, stride, pad, &g)) goto fail;
  if (bias && !_tensor_arg_f32(op, "bias", bias)) goto fail;
  if (bias && (bias->ndim != 1 || bias->shape[0] != g.O)) {
    _tensor_err(TENSOR_ESHAPE, "%s: bias is %s, want f32[%lld%s] for weight %s", op, _tensor_desc(bias, b1),
                (long long)g.O, ta_poison_explain((uint64_t)g.O, 8), _tensor_desc(w, b2));
    goto fail;
  }
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW;
  int parts = conv_parts(&g);
  if (g.s == 1 && _tensor_dconv_fits(g.C, g.O, g.KH, g.KW, g.H + 2 * g.p, g.W + 2 * g.p)) {
    /* direct: scratch per thread, then the packed weights and the bias */
    dconv_job dj;
    _tensor_dconv_plan(&dj.d, g.C, g.H, g.W, g.O, g.KH, g.KW, g.p, g.p);
    dj.scratch_size = _tensor_dconv_fwd_scratch(&dj.d);
    if (!_tensor_scratch_take(&col, op, parts * dj.scratch_size + CKK * g.O + g.O)) goto fail;
    if (!(out = _tensor_out(op, TENSOR_F32, 4, (int64_t[]){ g.N, g.O, g.OH, g.OW }))) goto fail;
    float *wt = col.data + parts * dj.scratch_size, *bv = wt + CKK * g.O;
    _tensor_dconv_pack(&dj.d, wc->data, false, wt);
    for (int64_t o = 0; bias && o < g.O; o++) bv[o] = ((const float *)bias->data)[o * bias->strides[0]];
    dj.x = xc->data, dj.dy = NULL, dj.wt = wt, dj.bias = bias ? bv : NULL, dj.out = out->data;
    dj.scratch = col.data;
    if (P && g.O) _tensor_parallel(g.N, parts, dconv_fwd_part, &dj);
    goto done;
  }
  if (!_tensor_scratch_take(&col, op, parts * CKK * P)) goto fail;
  if (!(out = _tensor_out(op, TENSOR_F32, 4, (int64_t[]){ g.N, g.O, g.OH, g.OW }))) goto fail;
  if (P && g.O) {
    conv_job j = { &g, xc->data, wc->data, NULL, bias ? bias->data : NULL, bias ? bias->strides[0] : 0,
                   CKK, P, out->data, col.data, CKK * P };
    _tensor_parallel(g.N, parts, conv_fwd_part, &j);
  }
done:
  _tensor_unborrow(x, xc);
  _tensor_unborrow(w, wc);
  _tensor_scratch_give(&col);
  return out;
fail:
  _tensor_unborrow(x, xc);
  _tensor_unborrow(w, wc);
  _tensor_scratch_give(&col);
  tensor_free(out);
  return NULL;
}

static bool check_dy(const char *op, const tensor *dy, const conv_geom *g) {
  int64_t want[4] = { g->N, g->O, g->OH, g->OW };
  if (memcmp(dy->shape, want, sizeof want) == 0) return true;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_ESHAPE, "%s: dy is %s, the convolution's output is %s", op, _tensor_desc(dy, b1),
              _tensor_shape_desc(TENSOR_F32, 4, want, b2));
  return false;
}

tensor *tensor_conv2d_grad_input(const tensor *dy, const tensor *w, int ndim, const int64_t *x_shape, int stride,
                                 int pad) {
  const char *op = "tensor_conv2d_grad_input";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, w, &bad)) return _tensor_devops->conv2d_grad(op, 0, dy, w, ndim, x_shape, stride, pad);
  if (bad) return NULL;
  tensor *dyc = NULL, *wc = NULL, *dx = NULL;
  _tensor_scratch dcol = { 0 };
  conv_geom g;
  if (!(dyc = contig_4d(op, "dy", dy)) || !(wc = contig_4d(op, "w", w))) goto fail;
  if (ndim != 4 || _tensor_check_shape(op, ndim, x_shape) < 0) {
    if (ndim != 4) _tensor_err(TENSOR_ESHAPE, "%s: the input shape has %d dimensions, want 4", op, ndim);
    goto fail;
  }
  if (!conv_geometry(op, x_shape, w->shape, stride, pad, &g) || !check_dy(op, dy, &g)) goto fail;
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW;
  int parts = conv_parts(&g);
  if (g.s == 1 && g.p <= g.KH - 1 && g.p <= g.KW - 1 &&
      _tensor_dconv_fits(g.O, g.C, g.KH, g.KW, g.OH + 2 * (g.KH - 1 - g.p), g.OW + 2 * (g.KW - 1 - g.p))) {
    /* the forward of dy padded by K-1-p, with w transposed and flipped */
    dconv_job dj;
    _tensor_dconv_plan(&dj.d, g.O, g.OH, g.OW, g.C, g.KH, g.KW, g.KH - 1 - g.p, g.KW - 1 - g.p);
    dj.scratch_size = _tensor_dconv_fwd_scratch(&dj.d);
    if (!_tensor_scratch_take(&dcol, op, parts * dj.scratch_size + CKK * g.O)) goto fail;
    if (!(dx = _tensor_out(op, TENSOR_F32, 4, x_shape))) goto fail;
    float *wt = dcol.data + parts * dj.scratch_size;
    _tensor_dconv_pack(&dj.d, wc->data, true, wt);
    dj.x = dyc->data, dj.dy = NULL, dj.wt = wt, dj.bias = NULL, dj.out = dx->data, dj.scratch = dcol.data;
    if (dx->numel) _tensor_parallel(g.N, parts, dconv_fwd_part, &dj);
    goto done;
  }
  if (!_tensor_scratch_take(&dcol, op, parts * CKK * P)) goto fail;
  if (!(dx = _tensor_out(op, TENSOR_F32, 4, x_shape))) goto fail;
  if (P && CKK && g.O) {
    conv_job j = { &g, NULL, wc->data, dyc->data, NULL, 0, CKK, P, dx->data, dcol.data, CKK * P };
    _tensor_parallel(g.N, parts, conv_dx_part, &j);
  } else {
    memset(dx->data, 0, (size_t)dx->numel * 4);
  }
done:
  _tensor_unborrow(dy, dyc);
  _tensor_unborrow(w, wc);
  _tensor_scratch_give(&dcol);
  return dx;
fail:
  _tensor_unborrow(dy, dyc);
  _tensor_unborrow(w, wc);
  _tensor_scratch_give(&dcol);
  tensor_free(dx);
  return NULL;
}

tensor *tensor_conv2d_grad_weight(const tensor *dy, const tensor *x, int ndim, const int64_t *w_shape, int stride,
                                  int pad) {
  const char *op = "tensor_conv2d_grad_weight";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, x, &bad)) return _tensor_devops->conv2d_grad(op, 1, dy, x, ndim, w_shape, stride, pad);
  if (bad) return NULL;
  tensor *dyc = NULL, *xc = NULL, *dw = NULL;
  _tensor_scratch scratch = { 0 };
  conv_geom g;
  if (!(dyc = contig_4d(op, "dy", dy)) || !(xc = contig_4d(op, "x", x))) goto fail;
  if (ndim != 4 || _tensor_check_shape(op, ndim, w_shape) < 0) {
    if (ndim != 4) _tensor_err(TENSOR_ESHAPE, "%s: the weight shape has %d dimensions, want 4", op, ndim);
    goto fail;
  }
  if (!conv_geometry(op, x->shape, w_shape, stride, pad, &g) || !check_dy(op, dy, &g)) goto fail;
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW, per = CKK * P + g.O * CKK;
  int parts = conv_parts(&g);
  if (g.s == 1 && _tensor_dconv_fits(g.C, g.O, g.KH, g.KW, g.H + 2 * g.p, g.W + 2 * g.p)) {
    dconv_job dj;
    _tensor_dconv_plan(&dj.d, g.C, g.H, g.W, g.O, g.KH, g.KW, g.p, g.p);
    int64_t Opad = dj.d.Opad;
    dj.scratch_size = CKK * Opad + _tensor_dconv_dw_scratch(&dj.d);
    if (!_tensor_scratch_take(&scratch, op, parts * dj.scratch_size)) goto fail;
    if (!(dw = _tensor_out(op, TENSOR_F32, 4, w_shape))) goto fail;
    memset(dw->data, 0, (size_t)dw->numel * 4);
    if (P && CKK && g.O) {
      dj.x = xc->data, dj.dy = dyc->data, dj.wt = NULL, dj.bias = NULL, dj.out = NULL, dj.scratch = scratch.data;
      parts = _tensor_parallel(g.N, parts, dconv_dw_part, &dj);
      float *d = dw->data;
      for (int p = 0; p < parts; p++) {
        const float *acc = scratch.data + p * dj.scratch_size;
        for (int64_t o = 0; o < g.O; o++)
          for (int64_t t = 0; t < CKK; t++) d[o * CKK + t] += acc[t * Opad + o];
      }
    }
    goto done;
  }
  if (!_tensor_scratch_take(&scratch, op, parts * per)) goto fail;
  if (!(dw = _tensor_out(op, TENSOR_F32, 4, w_shape))) goto fail;
  memset(dw->data, 0, (size_t)dw->numel * 4);
  if (P && CKK && g.O) {
    conv_job j = { &g, xc->data, NULL, dyc->data, NULL, 0, CKK, P, NULL, scratch.data, per };
    parts = _tensor_parallel(g.N, parts, conv_dw_part, &j);
    float *d = dw->data;
    for (int p = 0; p < parts; p++) {
      const float *part = scratch.data + p * per + CKK * P;
      for (int64_t i = 0; i < g.O * CKK; i++) d[i] += part[i];
    }
  }
done:
  _tensor_unborrow(dy, dyc);
  _tensor_unborrow(x, xc);
  _tensor_scratch_give(&scratch);
  return dw;
fail:
  _tensor_unborrow(dy, dyc);
  _tensor_unborrow(x, xc);
  _tensor_scratch_give(&scratch);
  tensor_free(dw);
  return NULL;
}

/* A plane's sum in 16 interleaved float partial sums (vectorized), added
 * in double. */
TENSOR_SIMD static double plane_sum(const float *p, int64_t n) {
  float part[16] = { 0 };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) part[k] += p[i + k];
  double s = 0;
  for (; i < n; i++) s += p[i];
  for (int k = 0; k < 16; k++) s += part[k];
  return s;
}

tensor *tensor_conv2d_grad_bias(const tensor *dy) {
  const char *op = "tensor_conv2d_grad_bias";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, NULL, &bad)) return _tensor_devops->conv2d_grad(op, 2, dy, NULL, 0, NULL, 1, 0);
  if (bad) return NULL;
  tensor *dyc = contig_4d(op, "dy", dy);
  if (dyc == NULL) return NULL;
  int64_t N = dy->shape[0], O = dy->shape[1], P = dy->shape[2] * dy->shape[3];
  tensor *db = _tensor_out(op, TENSOR_F32, 1, &O);
  if (db) {
    const float *src = dyc->data;
    float *d = db->data;
    for (int64_t o = 0; o < O; o++) {
      double s = 0;
      for (int64_t n = 0; n < N; n++) s += plane_sum(src + (n * O + o) * P, P);
      d[o] = (float)s;
    }
  }
  _tensor_unborrow(dy, dyc);
  return db;
}

/* ---- pooling ----------------------------------------------------------------- */

static tensor *pool_prepare(const char *op, const tensor *x, int k, int stride, int64_t *shape) {
  tensor *xc = contig_4d(op, "x", x);
  if (xc == NULL) return NULL;
  if (k < 1 || stride < 1 || x->shape[2] < k || x->shape[3] < k) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "%s: window %d, stride %d do not fit %s", op, k, stride, _tensor_desc(x, b));
    _tensor_unborrow(x, xc);
    return NULL;
  }
  shape[0] = x->shape[0];
  shape[1] = x->shape[1];
  shape[2] = (x->shape[2] - k) / stride + 1;
  shape[3] = (x->shape[3] - k) / stride + 1;
  return xc;
}

/* The 2x2, stride-2 window over one plane: the same scan order as the
 * general loop (row by row, the first of equal maxima), as selects that
 * gcc vectorizes. */
TENSOR_SIMD static void max_pool_2x2(const float *p, int64_t W, int64_t OH, int64_t OW, float *o, int32_t *ai) {
  for (int64_t oh = 0; oh < OH; oh++) {
    const float *r0 = p + 2 * oh * W, *r1 = r0 + W;
    float *orow = o + oh * OW;
    int32_t base = (int32_t)(2 * oh * W), w = (int32_t)W;
    for (int64_t ow = 0; ow < OW; ow++) {
      float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      /* masks, not branches: random data mispredicts them */
      float m = a;
      int32_t at = 0, gt = -(int32_t)(b > m);
      at = (at & ~gt) | (1 & gt);
      m = b > m ? b : m;
      gt = -(int32_t)(c > m);
      at = (at & ~gt) | (w & gt);
      m = c > m ? c : m;
      gt = -(int32_t)(d > m);
      at = (at & ~gt) | ((w + 1) & gt);
      m = d > m ? d : m;
      orow[ow] = m;
      if (ai) ai[oh * OW + ow] = base + 2 * (int32_t)ow + at;
    }
  }
}

tensor *tensor_max_pool2d(const tensor *x, int k, int stride, tensor **argmax) {
  const char *op = "tensor_max_pool2d";
  int64_t shape[4];
  if (argmax) *argmax = NULL;
  bool bad;
  if (_tensor_dev_dispatch(op, x, NULL, &bad)) return _tensor_devops->pool(op, true, x, k, stride, argmax);
  if (bad) return NULL;
  tensor *xc = pool_prepare(op, x, k, stride, shape);
  if (xc == NULL) return NULL;
  tensor *out = _tensor_out(op, TENSOR_F32, 4, shape);
  tensor *am = argmax && out ? _tensor_out(op, TENSOR_I32, 4, shape) : NULL;
  if (out == NULL || (argmax && am == NULL)) {
    tensor_free(out);
    _tensor_unborrow(x, xc);
    return NULL;
  }
  int64_t H = x->shape[2], W = x->shape[3], OH = shape[2], OW = shape[3];
  const float *in = xc->data;
  float *o = out->data;
  int32_t *ai = am ? am->data : NULL;
  if (k == 2 && stride == 2) {
    for (int64_t pl = 0; pl < shape[0] * shape[1]; pl++)
      max_pool_2x2(in + pl * H * W, W, OH, OW, o + pl * OH * OW, ai ? ai + pl * OH * OW : NULL);
    goto done;
  }
  for (int64_t pl = 0; pl < shape[0] * shape[1]; pl++) {
    const float *p = in + pl * H * W;
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t base = oh * stride * W + ow * stride, best = base;
        float m = p[base];
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) {
            int64_t at = base + i * W + j;
            if (p[at] > m) m = p[at], best = at;
          }
        *o++ = m;
        if (ai) *ai++ = (int32_t)best;
      }
  }
done:
  _tensor_unborrow(x, xc);
  if (argmax) *argmax = am;
  return out;
}

tensor *tensor_avg_pool2d(const tensor *x, int k, int stride) {
  const char *op = "tensor_avg_pool2d";
  bool bad;
  if (_tensor_dev_dispatch(op, x, NULL, &bad)) return _tensor_devops->pool(op, false, x, k, stride, NULL);
  if (bad) return NULL;
  int64_t shape[4];
  tensor *xc = pool_prepare(op, x, k, stride, shape);
  if (xc == NULL) return NULL;
  tensor *out = _tensor_out(op, TENSOR_F32, 4, shape);
  if (out) {
    int64_t H = x->shape[2], W = x->shape[3], OH = shape[2], OW = shape[3];
    const float *in = xc->data;
    float *o = out->data, scale = 1.0f / (float)(k * k);
    for (int64_t pl = 0; pl < shape[0] * shape[1]; pl++) {
      const float *p = in + pl * H * W;
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          const float *w0 = p + oh * stride * W + ow * stride;
          float s = 0;
          for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++) s += w0[i * W + j];
          *o++ = s * scale;
        }
    }
  }
  _tensor_unborrow(x, xc);
  return out;
}

static tensor *max_pool_grad(const char *op, const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                             const int64_t *x_shape);

tensor *tensor_max_pool2d_grad(const tensor *dy, const tensor *argmax, int ndim, const int64_t *x_shape) {
  return max_pool_grad("tensor_max_pool2d_grad", dy, argmax, 0, 0, ndim, x_shape);
}

tensor *tensor_max_pool2d_grad_k(const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                                 const int64_t *x_shape) {
  const char *op = "tensor_max_pool2d_grad_k";
  if (k < 1 || stride < 1) {
    _tensor_err(TENSOR_EINVAL, "%s: window %d, stride %d (want >= 1)", op, k, stride);
    return NULL;
  }
  return max_pool_grad(op, dy, argmax, k, stride, ndim, x_shape);
}

/* k, stride: the forward's (0: not given; the host op needs only argmax). */
static tensor *max_pool_grad(const char *op, const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                             const int64_t *x_shape) {
  bool bad;
  if (_tensor_dev_dispatch(op, dy, argmax, &bad))
    return _tensor_devops->pool_grad(op, dy, argmax, k, stride, ndim, x_shape);
  if (bad) return NULL;
  if (!_tensor_arg_f32(op, "dy", dy) || !_tensor_arg(op, "argmax", argmax)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (argmax->dtype != TENSOR_I32 || !_tensor_same_shape(dy, argmax) || dy->ndim != 4 || ndim != 4 ||
      _tensor_check_shape(op, ndim, x_shape) < 0 || x_shape[0] != dy->shape[0] || x_shape[1] != dy->shape[1] ||
      (k > 0 && (x_shape[2] < k || x_shape[3] < k || (x_shape[2] - k) / stride + 1 != dy->shape[2] ||
                 (x_shape[3] - k) / stride + 1 != dy->shape[3]))) {
    _tensor_err(TENSOR_ESHAPE, "%s: dy %s, argmax %s and the input shape do not match", op, _tensor_desc(dy, b1),
                _tensor_desc(argmax, b2));
    return NULL;
  }
  tensor *dyc = _tensor_borrow(dy), *amc = _tensor_borrow(argmax);
  tensor *dx = dyc && amc ? tensor_zeros(TENSOR_F32, 4, x_shape) : NULL;
  if (dx) {
    int64_t HW = x_shape[2] * x_shape[3], P = dy->shape[2] * dy->shape[3];
    const float *g = dyc->data;
    const int32_t *a = amc->data;
    float *d = dx->data;
    for (int64_t pl = 0; pl < dy->shape[0] * dy->shape[1]; pl++)
      for (int64_t i = 0; i < P; i++) {
        int32_t at = a[pl * P + i];
        if (at >= 0 && at < HW) d[pl * HW + at] += g[pl * P + i];
      }
  }
  _tensor_unborrow(dy, dyc);
  _tensor_unborrow(argmax, amc);
  return dx;
}

tensor *tensor_avg_pool2d_grad(const tensor *dy, int k, int stride, int ndim, const int64_t *x_shape) {
  const char *op = "tensor_avg_pool2d_grad";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, NULL, &bad)) return _tensor_devops->pool_grad(op, dy, NULL, k, stride, ndim, x_shape);
  if (bad) return NULL;
  if (!_tensor_arg_f32(op, "dy", dy)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (dy->ndim != 4 || ndim != 4 || k < 1 || stride < 1 || _tensor_check_shape(op, ndim, x_shape) < 0 ||
      x_shape[0] != dy->shape[0] || x_shape[1] != dy->shape[1] || x_shape[2] < k || x_shape[3] < k ||
      (x_shape[2] - k) / stride + 1 != dy->shape[2] || (x_shape[3] - k) / stride + 1 != dy->shape[3]) {
    _tensor_err(TENSOR_ESHAPE, "%s: dy %s does not match the input %s (window %d, stride %d)", op,
                _tensor_desc(dy, b1), _tensor_shape_desc(TENSOR_F32, ndim, x_shape, b2), k, stride);
    return NULL;
  }
  tensor *dyc = _tensor_borrow(dy);
  tensor *dx = dyc ? tensor_zeros(TENSOR_F32, 4, x_shape) : NULL;
  if (dx) {
    int64_t H = x_shape[2], W = x_shape[3], OH = dy->shape[2], OW = dy->shape[3];
    const float *g = dyc->data;
    float *d = dx->data, scale = 1.0f / (float)(k * k);
    for (int64_t pl = 0; pl < dy->shape[0] * dy->shape[1]; pl++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          float v = g[(pl * OH + oh) * OW + ow] * scale;
          float *w0 = d + pl * H * W + oh * stride * W + ow * stride;
          for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++) w0[i * W + j] += v;
        }
  }
  _tensor_unborrow(dy, dyc);
  return dx;
}
