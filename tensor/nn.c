/* nn.c - softmax, log-softmax, cross-entropy from logits and labels,
 * embedding lookup.  Row maxima are subtracted before exp (no overflow);
 * sums of exponentials are kept in double. */
#include "internal.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

/* The input (contiguous) seen as [outer, n, inner], along axis. */
static bool split_axis(const char *op, const tensor *x, int *axis, int64_t *outer, int64_t *n, int64_t *inner) {
  int a = _tensor_axis(*axis, x->ndim);
  if (a < 0 || a >= x->ndim) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ERANGE, "%s: axis %d out of range for %s", op, *axis, _tensor_desc(x, b));
    return false;
  }
  *axis = a;
  *outer = *inner = 1;
  for (int d = 0; d < a; d++) *outer *= x->shape[d];
  for (int d = a + 1; d < x->ndim; d++) *inner *= x->shape[d];
  *n = x->shape[a];
  return true;
}

/* A contiguous row's maximum in 16 interleaved partial maxima (the same
 * value as a scan: a NaN counts only in x[0]). */
TENSOR_SIMD static float row_max(const float *x, int64_t n) {
  float pm[16];
  for (int k = 0; k < 16; k++) pm[k] = x[0];
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) pm[k] = x[i + k] > pm[k] ? x[i + k] : pm[k];
  float m = x[0];
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  for (int k = 0; k < 16; k++) m = pm[k] > m ? pm[k] : m;
  return m;
}

/* y[k] = exp(x[k] - m); returns their sum, in 8 interleaved double partial
 * sums. */
TENSOR_SIMD static double exp_shifted(const float *x, float m, float *y, int64_t n) {
  if (x == y) /* in place: one pointer, or gcc's overlap check picks its scalar loop */
    for (int64_t k = 0; k < n; k++) y[k] = _tensor_expf(y[k] - m);
  else
    for (int64_t k = 0; k < n; k++) y[k] = _tensor_expf(x[k] - m);
  double ps[8] = { 0 };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) ps[k] += y[i + k];
  double s = 0;
  for (; i < n; i++) s += y[i];
  for (int k = 0; k < 8; k++) s += ps[k];
  return s;
}

/* y = x * s or y = x - s, contiguous */
TENSOR_SIMD static void scale_row(float *y, int64_t n, float s) {
  for (int64_t k = 0; k < n; k++) y[k] *= s;
}
TENSOR_SIMD static void shift_row(const float *x, float *y, int64_t n, float s) {
  for (int64_t k = 0; k < n; k++) y[k] = x[k] - s;
}

/* One strided row: y = softmax(x) or log_softmax(x).  A contiguous row
 * runs vectorized loops; sums of exponentials are kept in double. */
static void softmax_row(const float *x, float *y, int64_t n, int64_t st, bool log_form) {
  if (st == 1) {
    float m = row_max(x, n);
    double s = exp_shifted(x, m, y, n);
    if (log_form) shift_row(x, y, n, (float)log(s) + m);
    else scale_row(y, n, (float)(1.0 / s));
    return;
  }
  float m = x[0];
  for (int64_t k = 1; k < n; k++) m = x[k * st] > m ? x[k * st] : m;
  double s = 0;
  for (int64_t k = 0; k < n; k++) {
    float e = _tensor_expf(x[k * st] - m);
    y[k * st] = e;
    s += e;
  }
  if (log_form) {
    float ls = (float)log(s) + m;
    for (int64_t k = 0; k < n; k++) y[k * st] = x[k * st] - ls;
  } else {
    float inv = (float)(1.0 / s);
    for (int64_t k = 0; k < n; k++) y[k * st] *= inv;
  }
}

static tensor *softmax_any(const char *op, const tensor *x, int axis, bool log_form) {
  if (!_tensor_arg_f32(op, "x", x)) return NULL;
  int64_t outer, n, inner;
  if (!split_axis(op, x, &axis, &outer, &n, &inner)) return NULL;
  tensor *xc = _tensor_borrow(x);
  tensor *y = xc ? _tensor_out(op, TENSOR_F32, x->ndim, x->shape) : NULL;
  if (y && n > 0) {
    const float *in = xc->data;
    float *out = y->data;
    for (int64_t p = 0; p < outer; p++)
      for (int64_t j = 0; j < inner; j++)
        softmax_row(in + p * n * inner + j, out + p * n * inner + j, n, inner, log_form);
  }
  _tensor_unborrow(x, xc);
  return y;
}

bool _tensor_grad_shapes(const char *op, const tensor *dy, const tensor *y) {
  if (_tensor_same_shape(dy, y)) return true;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_ESHAPE, "%s: dy %s and y %s differ", op, _tensor_desc(dy, b1), _tensor_desc(y, b2));
  return false;
}

/* The softmax gradients' arguments: float tensors of one shape. */
static bool grad_args(const char *op, const tensor *dy, const tensor *y) {
  return _tensor_arg_f32(op, "dy", dy) && _tensor_arg_f32(op, "y", y) && _tensor_grad_shapes(op, dy, y);
}

tensor *tensor_softmax(const tensor *x, int axis) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_softmax", x, NULL, &bad)) return _tensor_devops->softmax("tensor_softmax", x, axis);
  if (bad) return NULL;
  return softmax_any("tensor_softmax", x, axis, false);
}
tensor *tensor_softmax_grad(const tensor *dy, const tensor *y, int axis) {
  const char *op = "tensor_softmax_grad";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, y, &bad)) return _tensor_devops->softmax_grad(op, dy, y, axis);
  if (bad) return NULL;
  if (!grad_args(op, dy, y)) return NULL;
  tensor *p = tensor_mul(dy, y), *s = p ? tensor_sum(p, axis, 1) : NULL;
  tensor *d = s ? tensor_sub(dy, s) : NULL;
  if (d && tensor_mul_(d, y) != TENSOR_OK) {
    tensor_free(d);
    d = NULL;
  }
  tensor_free(p);
  tensor_free(s);
  return d;
}

tensor *tensor_log_softmax(const tensor *x, int axis) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_log_softmax", x, NULL, &bad))
    return _tensor_devops->log_softmax("tensor_log_softmax", x, axis);
  if (bad) return NULL;
  return softmax_any("tensor_log_softmax", x, axis, true);
}
tensor *tensor_log_softmax_grad(const tensor *dy, const tensor *y, int axis) {
  const char *op = "tensor_log_softmax_grad";
  bool bad;
  if (_tensor_dev_dispatch(op, dy, y, &bad)) return _tensor_devops->log_softmax_grad(op, dy, y, axis);
  if (bad) return NULL;
  if (!grad_args(op, dy, y)) return NULL;
  /* dx = dy - exp(y) * sum(dy) */
  tensor *s = tensor_sum(dy, axis, 1), *e = s ? tensor_exp(y) : NULL;
  tensor *d = e && tensor_mul_(e, s) == TENSOR_OK ? tensor_sub(dy, e) : NULL;
  tensor_free(s);
  tensor_free(e);
  return d;
}

/* Checks logits [N,C] f32 and labels [N] i32 with 0 <= label < C; returns
 * contiguous copies or aliases. */
static bool ce_prepare(const char *op, const tensor *logits, const tensor *labels, tensor **lc, tensor **yc) {
  *lc = *yc = NULL;
  if (!_tensor_arg_f32(op, "logits", logits) || !_tensor_arg(op, "labels", labels)) return false;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (labels->dtype != TENSOR_I32) {
    _tensor_err(TENSOR_EDTYPE, "%s: labels are %s, want i32", op, _tensor_desc(labels, b2));
    return false;
  }
  if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0] || logits->shape[1] < 1) {
    _tensor_err(TENSOR_ESHAPE, "%s: logits %s and labels %s do not match (want [N,C] and [N])", op,
                _tensor_desc(logits, b1), _tensor_desc(labels, b2));
    return false;
  }
  *lc = _tensor_borrow(logits);
  *yc = _tensor_borrow(labels);
  if (*lc == NULL || *yc == NULL) return false;
  const int32_t *y = (*yc)->data;
  int64_t C = logits->shape[1];
  for (int64_t i = 0; i < labels->shape[0]; i++)
    if (y[i] < 0 || y[i] >= C) {
      _tensor_err(TENSOR_ERANGE, "%s: label %d of row %lld out of range [0, %lld%s) for logits %s", op, y[i],
                  (long long)i, (long long)C, ta_poison_explain((uint64_t)C, 8), _tensor_desc(logits, b1));
      return false;
    }
  return true;
}

tensor *tensor_cross_entropy(const tensor *logits, const tensor *labels) {
  const char *op = "tensor_cross_entropy";
  bool bad;
  if (_tensor_dev_dispatch(op, logits, labels, &bad)) return _tensor_devops->xent(op, logits, labels, false);
  if (bad) return NULL;
  tensor *lc, *yc, *out = NULL;
  if (ce_prepare(op, logits, labels, &lc, &yc) && (out = _tensor_out(op, TENSOR_F32, 0, NULL))) {
    int64_t N = logits->shape[0], C = logits->shape[1];
    const float *x = lc->data;
    const int32_t *y = yc->data;
    double total = 0;
    for (int64_t i = 0; i < N; i++) {
      const float *row = x + i * C;
      float m = row_max(row, C);
      double s = 0;
      float e[256];   /* the exponentials in vectorized chunks */
      for (int64_t k0 = 0; k0 < C; k0 += 256) s += exp_shifted(row + k0, m, e, C - k0 < 256 ? C - k0 : 256);
      total += log(s) + m - row[y[i]];
    }
    *(float *)out->data = N ? (float)(total / (double)N) : 0.0f;
  }
  _tensor_unborrow(logits, lc);
  _tensor_unborrow(labels, yc);
  return out;
}

tensor *tensor_cross_entropy_grad(const tensor *logits, const tensor *labels) {
  const char *op = "tensor_cross_entropy_grad";
  bool bad;
  if (_tensor_dev_dispatch(op, logits, labels, &bad)) return _tensor_devops->xent(op, logits, labels, true);
  if (bad) return NULL;
  tensor *lc, *yc, *out = NULL;
  if (ce_prepare(op, logits, labels, &lc, &yc) && (out = _tensor_out(op, TENSOR_F32, 2, logits->shape))) {
    int64_t N = logits->shape[0], C = logits->shape[1];
    const int32_t *y = yc->data;
    float *g = out->data, inv = 1.0f / (float)N;
    for (int64_t i = 0; i < N; i++) {
      softmax_row((const float *)lc->data + i * C, g + i * C, C, 1, false);
      g[i * C + y[i]] -= 1.0f;
      scale_row(g + i * C, C, inv);
    }
  }
  _tensor_unborrow(logits, lc);
  _tensor_unborrow(labels, yc);
  return out;
}

tensor *tensor_embedding(const tensor *weight, const tensor *indices) {
  const char *op = "tensor_embedding";
  bool bad;
  if (_tensor_dev_dispatch(op, weight, indices, &bad)) return _tensor_devops->embedding(op, weight, indices);
  if (bad) return NULL;
  if (!_tensor_arg_f32(op, "weight", weight) || !_tensor_arg(op, "indices", indices)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (indices->dtype != TENSOR_I32) {
    _tensor_err(TENSOR_EDTYPE, "%s: indices are %s, want i32", op, _tensor_desc(indices, b2));
    return NULL;
  }
  if (weight->ndim != 2 || indices->ndim >= TENSOR_MAX_DIMS) {
    _tensor_err(TENSOR_ESHAPE, "%s: weight %s (want [V,D]) and indices %s (up to %d dimensions)", op,
                _tensor_desc(weight, b1), _tensor_desc(indices, b2), TENSOR_MAX_DIMS - 1);
    return NULL;
  }
  int64_t V = weight->shape[0], D = weight->shape[1], shape[TENSOR_MAX_DIMS];
  memcpy(shape, indices->shape, (size_t)indices->ndim * sizeof *shape);
  shape[indices->ndim] = D;
  tensor *ic = _tensor_borrow(indices), *wc = ic ? _tensor_borrow(weight) : NULL;
  tensor *out = NULL;
  if (wc) {
    const int32_t *idx = ic->data;
    int64_t n = indices->numel, i;
    for (i = 0; i < n; i++)
      if (idx[i] < 0 || idx[i] >= V) break;
    if (i < n)
      _tensor_err(TENSOR_ERANGE, "%s: index %d at %lld out of range [0, %lld%s) for weight %s", op, idx[i],
                  (long long)i, (long long)V, ta_poison_explain((uint64_t)V, 8), _tensor_desc(weight, b1));
    else if ((out = _tensor_out(op, TENSOR_F32, indices->ndim + 1, shape)))
      for (i = 0; i < n; i++)
        memcpy((float *)out->data + i * D, (const float *)wc->data + idx[i] * D, (size_t)D * 4);
  }
  _tensor_unborrow(indices, ic);
  _tensor_unborrow(weight, wc);
  return out;
}

tensor_status tensor_embedding_grad_(tensor *dweight, const tensor *dout, const tensor *indices) {
  const char *op = "tensor_embedding_grad_";
  bool bad;
  if (_tensor_dev_dispatch(op, dweight, dout, &bad)) return _tensor_devops->embedding_grad(op, dweight, dout, indices);
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32(op, "dweight", dweight) || !_tensor_arg_f32(op, "dout", dout) ||
      !_tensor_arg(op, "indices", indices))
    return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR], b3[TENSOR_SHAPE_STR];
  if (indices->dtype != TENSOR_I32)
    return _tensor_err(TENSOR_EDTYPE, "%s: indices are %s, want i32", op, _tensor_desc(indices, b3));
  if (dweight->ndim != 2 || !_tensor_contig(dweight) || dout->numel != indices->numel * dweight->shape[1] ||
      (dout->ndim >= 1 && dout->shape[dout->ndim - 1] != dweight->shape[1]))
    return _tensor_err(TENSOR_ESHAPE, "%s: dweight %s (contiguous [V,D]), dout %s and indices %s do not match", op,
                       _tensor_desc(dweight, b1), _tensor_desc(dout, b2), _tensor_desc(indices, b3));
  int64_t V = dweight->shape[0], D = dweight->shape[1];
  tensor *dc = _tensor_borrow(dout), *ic = dc ? _tensor_borrow(indices) : NULL;
  if (ic) {
    const int32_t *idx = ic->data;
    const float *d = dc->data;
    float *gw = dweight->data;
    for (int64_t i = 0; i < ic->numel; i++) {
      if (idx[i] < 0 || idx[i] >= V) continue;   /* the forward refused them */
      float *row = gw + (int64_t)idx[i] * D;
      const float *src = d + i * D;
      for (int64_t j = 0; j < D; j++) row[j] += src[j];
    }
  }
  _tensor_unborrow(dout, dc);
  _tensor_unborrow(indices, ic);
  return ic ? TENSOR_OK : tensor_last_status();
}
