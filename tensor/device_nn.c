/* device_nn.c - the training ops on a device: matrix products with
 * transposed operands and accumulation, conv2d and its three gradients, max
 * and average pooling and their gradients, softmax, cross-entropy and its
 * gradient, embedding lookup and its scatter-add gradient, argmax, the SGD
 * and Adam updates, and reading one element back (tensor_item).
 *
 * Each runs on the backend's kernel (gpu/gpu.h) over the tensors' device
 * pointers, on the default stream.  The checks are the host ops' (shapes,
 * dtypes, one device for every tensor) with the same kind of one-line
 * error; a strided input is made contiguous on the device first.  Scratch a
 * kernel needs (a convolution's workspace, softmax's probabilities) comes
 * from the tensors' pool, so the ledger sees it and a training step's
 * steady state makes no device allocation.  Two things the host ops check
 * and these do not, since the values live on the device: a label or an
 * index out of range gives NaN (the loss, the embedding row) instead of an
 * error; the callers check labels and indices on the host. */
#include "device.h"

#include <stdio.h>
#include <string.h>

static const gpu_backend *backend(gpu_pool *p) { return gpu_pool_backend(p); }

/* t on p (already checked live by the caller's dispatch, or checked here). */
static bool on(const char *op, const char *name, const tensor *t, gpu_pool *p) {
  if (!_tensor_arg_any(op, name, t)) return false;
  if (!_tensor_on_device(t->storage) || t->storage->device != p) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_EINVAL, "%s: %s is %s, not on the device of the other inputs: tensor_to(%s, device) first",
                op, name, _tensor_desc(t, b), name);
    return false;
  }
  return true;
}

/* A contiguous i32 t, or a contiguous copy (*copy). */
static const tensor *borrow_i32(const char *op, const char *name, const tensor *t, tensor **copy) {
  *copy = NULL;
  if (t->dtype != TENSOR_I32) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_EDTYPE, "%s: %s is %s, want i32", op, name, _tensor_desc(t, b));
    return NULL;
  }
  if (_tensor_contig(t)) return t;
  return *copy = _tdev_clone(op, t);
}

static bool want_4d(const char *op, const char *name, const tensor *t) {
  if (t->ndim == 4) return true;
  char b[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_ESHAPE, "%s: %s is %s, want 4-D", op, name, _tensor_desc(t, b));
  return false;
}

static bool int_sized(const char *op, const tensor *t) {
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] > INT32_MAX) {
      char b[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ESHAPE, "%s: %s has an axis too long for the device kernels", op, _tensor_desc(t, b));
      return false;
    }
  return true;
}

/* Device scratch of `bytes` from p (NULL for 0), or NULL with an error. */
static void *scratch(const char *op, gpu_pool *p, size_t bytes, bool *ok) {
  *ok = true;
  if (bytes == 0) return NULL;
  void *w = gpu_pool_alloc(p, bytes, NULL);
  if (w == NULL) {
    _tensor_err(TENSOR_ENOMEM, "%s: no device memory for %zu bytes of workspace: %s", op, bytes, gpu_pool_error());
    *ok = false;
  }
  return w;
}

/* ---- matrix products ------------------------------------------------------------ */

/* How sgemm reads a 2-D t: row-major as stored (ld: its row stride), or
 * the transpose of a row-major matrix (a transposed view: no copy). */
static bool gemm_operand(const tensor *t, gpu_trans *tr, int *ld) {
  if (t->strides[1] == 1 && t->strides[0] >= t->shape[1]) {
    *tr = GPU_NO_TRANS;
    *ld = (int)(t->shape[0] > 1 ? t->strides[0] : t->shape[1]);
    return true;
  }
  if (t->strides[0] == 1 && t->strides[1] >= t->shape[0]) {
    *tr = GPU_TRANS;
    *ld = (int)(t->shape[1] > 1 ? t->strides[1] : t->shape[0]);
    return true;
  }
  return false;
}

/* t with its two axes swapped, as a descriptor on the caller's stack (read
 * by this call only: no header on the ledger), as tensor/linalg.c does. */
static const tensor *maybe_t(const tensor *t, int trans, tensor *tmp) {
  if (!trans) return t;
  *tmp = *t;
  tmp->shape[0] = t->shape[1];
  tmp->shape[1] = t->shape[0];
  tmp->strides[0] = t->strides[1];
  tmp->strides[1] = t->strides[0];
  tmp->scope = 0;
  tmp->scope_prev = tmp->scope_next = NULL;
  return tmp;
}

/* out = alpha op(a) op(b) + beta out; *outp NULL: a new result (beta 0). */
static tensor_status gemm_run(const char *op, tensor **outp, const tensor *a0, int ta, const tensor *b0, int tb,
                              float alpha, float beta) {
  gpu_pool *p = _tdev_same(op, a0, b0);
  if (p == NULL) return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (a0->dtype != TENSOR_F32 || b0->dtype != TENSOR_F32)
    return _tensor_arg_dtype(op, a0->dtype != TENSOR_F32 ? "a" : "b", a0->dtype != TENSOR_F32 ? a0 : b0),
           tensor_last_status();
  if (a0->ndim != 2 || b0->ndim != 2 || !int_sized(op, a0) || !int_sized(op, b0))
    return _tensor_err(TENSOR_ESHAPE, "%s: on a device, 2-D operands only: %s and %s", op, _tensor_desc(a0, b1),
                       _tensor_desc(b0, b2));
  tensor at, bt;
  const tensor *a = maybe_t(a0, ta, &at), *b = maybe_t(b0, tb, &bt);
  if (a->shape[1] != b->shape[0])
    return _tensor_err(TENSOR_ESHAPE, "%s: [m, k] @ [k, n] wanted: %s%s and %s%s", op, _tensor_desc(a0, b1),
                       ta ? " transposed" : "", _tensor_desc(b0, b2), tb ? " transposed" : "");
  int m = (int)a->shape[0], k = (int)a->shape[1], n = (int)b->shape[1];
  tensor *out = *outp;
  if (out) {
    if (!on(op, "out", out, p)) return tensor_last_status();
    if (out->dtype != TENSOR_F32 || out->ndim != 2 || out->shape[0] != m || out->shape[1] != n || !_tensor_contig(out))
      return _tensor_err(TENSOR_ESHAPE, "%s: out is %s, want a contiguous f32[%d,%d]", op, _tensor_desc(out, b1), m,
                         n);
  }
  const gpu_backend *B = backend(p);
  gpu_trans tra, trb;
  int lda, ldb;
  tensor *ca = NULL, *cb = NULL;
  if (!gemm_operand(a, &tra, &lda) && ((a = ca = _tdev_clone(op, a)) == NULL || !gemm_operand(a, &tra, &lda))) a = NULL;
  if (a && !gemm_operand(b, &trb, &ldb) && ((b = cb = _tdev_clone(op, b)) == NULL || !gemm_operand(b, &trb, &ldb)))
    b = NULL;
  bool made = false;
  if (a && b && out == NULL) {
    out = _tdev_out(op, p, TENSOR_F32, 2, (int64_t[]){ m, n });
    made = out != NULL;
    beta = 0.0f;
  }
  gpu_status st = GPU_OK;
  if (a && b && out) {
    if (m > 0 && n > 0 && k == 0) st = beta == 0.0f ? B->fill(tensor_f32(out), 0.0f, out->numel, NULL)
                                                    : B->scale(tensor_f32(out), tensor_f32(out), beta, out->numel, NULL);
    else if (m > 0 && n > 0)
      st = B->sgemm(tra, trb, m, n, k, alpha, tensor_f32(a), lda, tensor_f32(b), ldb, beta, tensor_f32(out), n, NULL);
  }
  tensor_free(ca);
  tensor_free(cb);
  if (a == NULL || b == NULL || out == NULL) return tensor_last_status();
  if (st != GPU_OK) {
    if (made) tensor_free(out);
    return _tdev_fail(op, B, st);
  }
  *outp = out;
  return TENSOR_OK;
}

tensor_status _tdev_gemm(const char *op, tensor *out, const tensor *a, int ta, const tensor *b, int tb, float alpha,
                         float beta) {
  if (out == NULL) return _tensor_arg_null(op, "out"), tensor_last_status();
  return gemm_run(op, &out, a, ta, b, tb, alpha, beta);
}

tensor *_tdev_matmul_t(const char *op, const tensor *a, int ta, const tensor *b, int tb) {
  tensor *out = NULL;
  return gemm_run(op, &out, a, ta, b, tb, 1.0f, 0.0f) == TENSOR_OK ? out : NULL;
}

/* ---- reductions and reading back ----------------------------------------------- */

tensor_status _tdev_sum_add(const char *op, tensor *acc, const tensor *a, int axis) {
  if (!_tensor_arg_any(op, "acc", acc) || !_tensor_arg_any(op, "a", a)) return tensor_last_status();
  /* the sum formed first and then added, as the host op does */
  tensor *s = tensor_sum(a, axis, 0);
  tensor_status st = s ? tensor_add_(acc, s) : tensor_last_status();
  tensor_free(s);
  return st;
}

tensor *_tdev_argmax(const char *op, const tensor *a0, int axis, int keepdim) {
  gpu_pool *p = _tdev_same(op, a0, NULL);
  if (p == NULL) return NULL;
  char b[TENSOR_SHAPE_STR];
  if (a0->ndim != 2 || _tensor_axis(axis, 2) != 1 || keepdim)
    return _tensor_err(TENSOR_EINVAL, "%s: on a device, the argmax of each row of a 2-D tensor only (axis 1, "
                                      "keepdim 0): axis %d, keepdim %d of %s", op, axis, keepdim, _tensor_desc(a0, b)),
           NULL;
  tensor *ca;
  const tensor *a = _tdev_borrow(op, a0, &ca);
  tensor *out = a ? _tdev_out(op, p, TENSOR_I32, 1, a->shape) : NULL;
  gpu_status st = GPU_OK;
  if (out && a->numel) st = backend(p)->argmax_rows(out->data, tensor_f32(a), a->shape[0], a->shape[1], NULL);
  tensor_free(ca);
  return out ? _tdev_finish(op, backend(p), st, out) : NULL;
}

tensor_status _tdev_item(const char *op, const tensor *t, float *v) {
  gpu_pool *p = _tdev_same(op, t, NULL);
  if (p == NULL) return tensor_last_status();
  const gpu_backend *B = backend(p);
  union {
    float f;
    int32_t i;
  } x;
  gpu_status st = B->memcpy_d2h(&x, t->data, 4, NULL);
  if (st == GPU_OK) st = B->stream_synchronize(NULL);
  if (st != GPU_OK) return _tdev_fail(op, B, st);
  *v = t->dtype == TENSOR_F32 ? x.f : (float)x.i;
  return TENSOR_OK;
}

/* ---- convolution ---------------------------------------------------------------- */

static bool conv_geom(const char *op, gpu_conv2d *g, const int64_t *xs, const int64_t *ws, int stride, int pad) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  bool fits = xs[0] <= INT32_MAX && xs[1] <= INT32_MAX && xs[2] <= INT32_MAX && xs[3] <= INT32_MAX &&
              ws[0] <= INT32_MAX && ws[2] <= INT32_MAX && ws[3] <= INT32_MAX && ws[1] == xs[1];
  if (stride < 1 || pad < 0)
    return _tensor_err(TENSOR_EINVAL, "%s: stride %d, padding %d (want stride >= 1, padding >= 0)", op, stride, pad),
           false;
  if (!fits || gpu_conv2d_init(g, (int)xs[0], (int)xs[1], (int)xs[2], (int)xs[3], (int)ws[0], (int)ws[2], (int)ws[3],
                               stride, pad) != GPU_OK)
    return _tensor_err(TENSOR_ESHAPE, "%s: input %s and weight %s do not match (stride %d, padding %d)", op,
                       _tensor_shape_desc(TENSOR_F32, 4, xs, b1), _tensor_shape_desc(TENSOR_F32, 4, ws, b2), stride,
                       pad),
           false;
  return true;
}

static bool check_dy(const char *op, const tensor *dy, const gpu_conv2d *g) {
  int64_t want[4] = { g->n, g->o, g->oh, g->ow };
  if (dy->ndim == 4 && memcmp(dy->shape, want, sizeof want) == 0) return true;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_ESHAPE, "%s: dy is %s, the convolution's output is %s", op, _tensor_desc(dy, b1),
              _tensor_shape_desc(TENSOR_F32, 4, want, b2));
  return false;
}

tensor *_tdev_conv2d(const char *op, const tensor *x0, const tensor *w0, const tensor *bias0, int stride, int pad) {
  gpu_pool *p = _tdev_same(op, x0, w0);
  if (p == NULL || (bias0 && !on(op, "bias", bias0, p))) return NULL;
  if (!want_4d(op, "x", x0) || !want_4d(op, "w", w0)) return NULL;
  gpu_conv2d g;
  if (!conv_geom(op, &g, x0->shape, w0->shape, stride, pad)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (bias0 && (bias0->ndim != 1 || bias0->shape[0] != g.o))
    return _tensor_err(TENSOR_ESHAPE, "%s: bias is %s, want f32[%d] for weight %s", op, _tensor_desc(bias0, b1), g.o,
                       _tensor_desc(w0, b2)),
           NULL;
  const gpu_backend *B = backend(p);
  tensor *cx = NULL, *cw = NULL, *cb = NULL, *out = NULL;
  const tensor *x = _tdev_borrow(op, x0, &cx), *w = x ? _tdev_borrow(op, w0, &cw) : NULL;
  const tensor *b = w && bias0 ? _tdev_borrow(op, bias0, &cb) : NULL;
  bool ok = w && (!bias0 || b);
  void *ws = ok ? scratch(op, p, B->conv2d_workspace(&g), &ok) : NULL;
  if (ok) out = _tdev_out(op, p, TENSOR_F32, 4, (int64_t[]){ g.n, g.o, g.oh, g.ow });
  gpu_status st = GPU_OK;
  if (out && out->numel) st = B->conv2d_fwd(&g, tensor_f32(out), tensor_f32(x), tensor_f32(w), b ? tensor_f32(b) : NULL, ws, NULL);
  gpu_pool_free(p, ws);
  tensor_free(cx);
  tensor_free(cw);
  tensor_free(cb);
  return out ? _tdev_finish(op, B, st, out) : NULL;
}

tensor *_tdev_conv2d_grad(const char *op, int which, const tensor *dy0, const tensor *other0, int ndim,
                          const int64_t *shape, int stride, int pad) {
  gpu_pool *p = _tdev_same(op, dy0, other0);
  if (p == NULL || !want_4d(op, "dy", dy0)) return NULL;
  const gpu_backend *B = backend(p);
  gpu_conv2d g;
  if (which == 2) {
    tensor *c;
    const tensor *dy = _tdev_borrow(op, dy0, &c);
    tensor *out = dy ? _tdev_out(op, p, TENSOR_F32, 1, &dy->shape[1]) : NULL;
    gpu_status st = GPU_OK;
    if (out && out->numel)
      st = B->sum_channels(tensor_f32(out), tensor_f32(dy), dy->shape[0], dy->shape[1], dy->shape[2] * dy->shape[3],
                           NULL);
    tensor_free(c);
    return out ? _tdev_finish(op, B, st, out) : NULL;
  }
  if (!want_4d(op, which == 0 ? "w" : "x", other0)) return NULL;
  if (ndim != 4 || _tensor_check_shape(op, ndim, shape) < 0) {
    if (ndim != 4)
      _tensor_err(TENSOR_ESHAPE, "%s: the %s shape has %d dimensions, want 4", op, which == 0 ? "input" : "weight",
                  ndim);
    return NULL;
  }
  const int64_t *xs = which == 0 ? shape : other0->shape, *wsh = which == 0 ? other0->shape : shape;
  if (!conv_geom(op, &g, xs, wsh, stride, pad) || !check_dy(op, dy0, &g)) return NULL;
  tensor *cd = NULL, *co = NULL, *out = NULL;
  const tensor *dy = _tdev_borrow(op, dy0, &cd), *o = dy ? _tdev_borrow(op, other0, &co) : NULL;
  bool ok = o != NULL;
  void *ws = ok ? scratch(op, p, B->conv2d_workspace(&g), &ok) : NULL;
  if (ok) out = _tdev_out(op, p, TENSOR_F32, 4, shape);
  gpu_status st = GPU_OK;
  if (out && out->numel) {
    if (dy->numel == 0) st = B->fill(tensor_f32(out), 0.0f, out->numel, NULL);
    else if (which == 0) st = B->conv2d_bwd_data(&g, tensor_f32(out), tensor_f32(dy), tensor_f32(o), ws, NULL);
    else st = B->conv2d_bwd_weight(&g, tensor_f32(out), tensor_f32(dy), tensor_f32(o), ws, NULL);
  }
  gpu_pool_free(p, ws);
  tensor_free(cd);
  tensor_free(co);
  return out ? _tdev_finish(op, B, st, out) : NULL;
}

/* ---- pooling ------------------------------------------------------------------------ */

static bool pool_geom(const char *op, gpu_pool2d *g, const int64_t *xs, int k, int stride) {
  bool fits = xs[0] <= INT32_MAX && xs[1] <= INT32_MAX && xs[2] <= INT32_MAX && xs[3] <= INT32_MAX;
  if (fits && gpu_pool2d_init(g, (int)xs[0], (int)xs[1], (int)xs[2], (int)xs[3], k, stride) == GPU_OK) return true;
  char b[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_ESHAPE, "%s: window %d, stride %d do not fit %s", op, k, stride,
              _tensor_shape_desc(TENSOR_F32, 4, xs, b));
  return false;
}

tensor *_tdev_pool(const char *op, bool max, const tensor *x0, int k, int stride, tensor **argmax) {
  gpu_pool *p = _tdev_same(op, x0, NULL);
  if (p == NULL || !want_4d(op, "x", x0)) return NULL;
  gpu_pool2d g;
  if (!pool_geom(op, &g, x0->shape, k, stride)) return NULL;
  const gpu_backend *B = backend(p);
  int64_t shape[4] = { g.n, g.c, g.oh, g.ow };
  tensor *cx, *am = NULL;
  const tensor *x = _tdev_borrow(op, x0, &cx);
  tensor *out = x ? _tdev_out(op, p, TENSOR_F32, 4, shape) : NULL;
  if (out && max && (am = _tdev_out(op, p, TENSOR_I32, 4, shape)) == NULL) {
    tensor_free(out);
    out = NULL;
  }
  gpu_status st = GPU_OK;
  if (out && out->numel)
    st = max ? B->max_pool_fwd(&g, tensor_f32(out), tensor_i32(am), tensor_f32(x), NULL)
             : B->avg_pool_fwd(&g, tensor_f32(out), tensor_f32(x), NULL);
  tensor_free(cx);
  if (out == NULL || st != GPU_OK) tensor_free(am), am = NULL;
  if (argmax) *argmax = am;
  else tensor_free(am);
  return out ? _tdev_finish(op, B, st, out) : NULL;
}

/* For max pooling's gradient without the forward's window (a backend may
 * gather each pixel's gradient from the windows that cover it): the
 * stride-1 window k = H - OH + 1, whose windows covering row ih are
 * oh in [ih - (H - OH), ih].  The forward's window oh (rows oh*s .. oh*s +
 * k' - 1, with (OH - 1)*s + k' <= H) that holds ih is in that range:
 * oh <= oh*s <= ih, and ih - oh <= oh*(s - 1) + k' - 1 <= (OH - 1)*(s - 1)
 * + k' - 1 <= H - OH.  So the gather is exact.  One k for both axes: it
 * exists only when H - OH == W - OW. */
static bool covering_window(const int64_t *xs, const int64_t *ys, int *k, int *s) {
  if (ys[2] < 1 || ys[3] < 1 || xs[2] - ys[2] != xs[3] - ys[3] || xs[2] - ys[2] + 1 > INT32_MAX) return false;
  *k = (int)(xs[2] - ys[2] + 1);
  *s = 1;
  return true;
}

tensor *_tdev_pool_grad(const char *op, const tensor *dy0, const tensor *argmax0, int k, int stride, int ndim,
                        const int64_t *x_shape) {
  gpu_pool *p = _tdev_same(op, dy0, argmax0);
  if (p == NULL || !want_4d(op, "dy", dy0)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (ndim != 4 || _tensor_check_shape(op, ndim, x_shape) < 0) {
    if (ndim != 4) _tensor_err(TENSOR_ESHAPE, "%s: the input shape has %d dimensions, want 4", op, ndim);
    return NULL;
  }
  gpu_pool2d g;
  /* max pooling's gradient: the forward's window, or one that covers it */
  if (argmax0 && k == 0 && !covering_window(x_shape, dy0->shape, &k, &stride))
    return _tensor_err(TENSOR_EINVAL, "%s: on a device, the window is needed when the input does not lose as "
                                      "many rows as columns (dy %s, input %s): tensor_max_pool2d_grad_k", op, _tensor_desc(dy0, b1),
                       _tensor_shape_desc(TENSOR_F32, 4, x_shape, b2)),
           NULL;
  if (!pool_geom(op, &g, x_shape, k, stride)) return NULL;
  int64_t want[4] = { g.n, g.c, g.oh, g.ow };
  if (memcmp(dy0->shape, want, sizeof want) != 0 || (argmax0 && !_tensor_same_shape(dy0, argmax0)))
    return _tensor_err(TENSOR_ESHAPE, "%s: dy %s%s%s does not match the input %s", op, _tensor_desc(dy0, b1),
                       argmax0 ? " and argmax " : "", argmax0 ? _tensor_desc(argmax0, b2) : "",
                       _tensor_shape_desc(TENSOR_F32, 4, x_shape, b2)),
           NULL;
  const gpu_backend *B = backend(p);
  tensor *cd, *ca = NULL;
  const tensor *dy = _tdev_borrow(op, dy0, &cd), *am = dy && argmax0 ? borrow_i32(op, "argmax", argmax0, &ca) : NULL;
  tensor *dx = dy && (!argmax0 || am) ? _tdev_out(op, p, TENSOR_F32, 4, x_shape) : NULL;
  gpu_status st = GPU_OK;
  if (dx && dx->numel) {
    if (dy->numel == 0) st = B->fill(tensor_f32(dx), 0.0f, dx->numel, NULL);
    else if (argmax0) st = B->max_pool_bwd(&g, tensor_f32(dx), tensor_f32(dy), tensor_i32(am), NULL);
    else st = B->avg_pool_bwd(&g, tensor_f32(dx), tensor_f32(dy), NULL);
  }
  tensor_free(cd);
  tensor_free(ca);
  return dx ? _tdev_finish(op, B, st, dx) : NULL;
}

/* ---- softmax, cross-entropy, embedding ------------------------------------------- */

static bool last_axis(const char *op, const tensor *x, int axis);

tensor *_tdev_softmax(const char *op, const tensor *x0, int axis) {
  gpu_pool *p = _tdev_same(op, x0, NULL);
  if (p == NULL) return NULL;
  if (!last_axis(op, x0, axis)) return NULL;
  const gpu_backend *B = backend(p);
  tensor *cx;
  const tensor *x = _tdev_borrow(op, x0, &cx);
  tensor *y = x ? _tdev_out(op, p, TENSOR_F32, x->ndim, x->shape) : NULL;
  int64_t cols = x0->shape[x0->ndim - 1];
  gpu_status st = GPU_OK;
  if (y && y->numel) st = B->softmax_rows(tensor_f32(y), tensor_f32(x), y->numel / cols, cols, NULL);
  tensor_free(cx);
  return y ? _tdev_finish(op, B, st, y) : NULL;
}

tensor *_tdev_softmax_grad(const char *op, const tensor *dy0, const tensor *y0, int axis) {
  gpu_pool *p = _tdev_same(op, dy0, y0);
  if (p == NULL) return NULL;
  if (!_tensor_grad_shapes(op, dy0, y0) || !last_axis(op, y0, axis)) return NULL;
  const gpu_backend *B = backend(p);
  tensor *cd, *cy = NULL;
  const tensor *dy = _tdev_borrow(op, dy0, &cd), *y = dy ? _tdev_borrow(op, y0, &cy) : NULL;
  tensor *dx = y ? _tdev_out(op, p, TENSOR_F32, y->ndim, y->shape) : NULL;
  int64_t cols = y0->shape[y0->ndim - 1];
  gpu_status st = GPU_OK;
  if (dx && dx->numel) st = B->softmax_bwd(tensor_f32(dx), tensor_f32(dy), tensor_f32(y), dx->numel / cols, cols, NULL);
  tensor_free(cd);
  tensor_free(cy);
  return dx ? _tdev_finish(op, B, st, dx) : NULL;
}

/* out[rows, cols] = alpha * v[r] (each row's value across its columns) +
 * beta * out: sgemm of v [rows, 1] and ones [1, cols]; beta 0: out is not
 * read.  (k 1: one product and one add per element, rounded as the host's
 * x - v or v * ... would be.) */
static gpu_status row_broadcast(const char *op, gpu_pool *p, float *out, float alpha, const tensor *v, float beta,
                                int64_t rows, int64_t cols) {
  const gpu_backend *B = backend(p);
  tensor *ones = _tdev_out(op, p, TENSOR_F32, 1, (int64_t[]){ cols });
  if (ones == NULL) return GPU_ENOMEM;
  gpu_status st = B->fill(tensor_f32(ones), 1.0f, cols, NULL);
  if (st == GPU_OK)
    st = B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, (int)rows, (int)cols, 1, alpha, tensor_f32(v), 1, tensor_f32(ones),
                  (int)cols, beta, out, (int)cols, NULL);
  tensor_free(ones);
  return st;
}

/* The last axis's checks of the log-softmax ops: x [.., cols], at most
 * INT_MAX rows and columns (sgemm's sizes). */
static bool last_axis(const char *op, const tensor *x, int axis) {
  char b[TENSOR_SHAPE_STR];
  if (x->ndim < 1 || _tensor_axis(axis, x->ndim) != x->ndim - 1) {
    _tensor_err(TENSOR_EINVAL, "%s: on a device, over the last axis only: axis %d of %s", op, axis,
                _tensor_desc(x, b));
    return false;
  }
  int64_t cols = x->shape[x->ndim - 1];
  if (cols > INT32_MAX || (cols && x->numel / cols > INT32_MAX)) {
    _tensor_err(TENSOR_EINVAL, "%s: on a device, at most %d rows and columns: %s", op, INT32_MAX, _tensor_desc(x, b));
    return false;
  }
  return true;
}

/* log_softmax over the last axis: y = x - lse, lse each row's log-sum-exp.
 * From the backend's softmax s, lse = sum_j s_j * (x_j - log(s_j + 1e-30)):
 * each x_j - log(s_j) is lse itself, and the weights s_j sum to 1, so the
 * average is lse to rounding; an exponential that underflowed (s_j 0)
 * weighs nothing rather than making log(0).  Then y = x - lse, row by row.
 * So y is finite wherever the host's is (log(softmax) would be -inf where
 * softmax underflows). */
tensor *_tdev_log_softmax(const char *op, const tensor *x0, int axis) {
  gpu_pool *p = _tdev_same(op, x0, NULL);
  if (p == NULL) return NULL;
  if (!last_axis(op, x0, axis)) return NULL;
  const gpu_backend *B = backend(p);
  tensor *cx;
  const tensor *x = _tdev_borrow(op, x0, &cx);
  tensor *y = x ? _tdev_out(op, p, TENSOR_F32, x->ndim, x->shape) : NULL;
  int64_t cols = x0->shape[x0->ndim - 1], rows = cols ? x0->numel / cols : 0, n = x0->numel;
  tensor *s = y && n ? _tdev_out(op, p, TENSOR_F32, x->ndim, x->shape) : NULL;
  tensor *t = s ? _tdev_out(op, p, TENSOR_F32, x->ndim, x->shape) : NULL;
  tensor *lse = t ? _tdev_out(op, p, TENSOR_F32, 1, (int64_t[]){ rows }) : NULL;
  gpu_status st = GPU_OK;
  if (y && n && lse == NULL) {   /* (_tdev_out said why) */
    tensor_free(y);
    y = NULL;
  }
  if (lse) {
    float *xs = tensor_f32(x), *sv = tensor_f32(s), *tv = tensor_f32(t), *yv = tensor_f32(y);
    st = B->softmax_rows(sv, xs, rows, cols, NULL);
    if (st == GPU_OK) st = B->add_scalar(tv, sv, 1e-30f, n, NULL);
    if (st == GPU_OK) st = B->log(tv, tv, n, NULL);
    if (st == GPU_OK) st = B->sub(tv, xs, tv, n, NULL);
    if (st == GPU_OK) st = B->mul(tv, tv, sv, n, NULL);
    if (st == GPU_OK) st = B->sum_cols(tensor_f32(lse), tv, rows, cols, NULL);
    if (st == GPU_OK) st = B->memcpy_d2d(yv, xs, (size_t)n * 4, NULL);
    if (st == GPU_OK) st = row_broadcast(op, p, yv, -1.0f, lse, 1.0f, rows, cols);
  }
  tensor_free(lse);
  tensor_free(t);
  tensor_free(s);
  tensor_free(cx);
  return y ? _tdev_finish(op, B, st, y) : NULL;
}

/* log_softmax's gradient over the last axis: dx = dy - exp(y) * sum(dy),
 * the sum each row's, as the host op. */
tensor *_tdev_log_softmax_grad(const char *op, const tensor *dy0, const tensor *y0, int axis) {
  gpu_pool *p = _tdev_same(op, dy0, y0);
  if (p == NULL) return NULL;
  if (!_tensor_grad_shapes(op, dy0, y0)) return NULL;
  if (!last_axis(op, y0, axis)) return NULL;
  const gpu_backend *B = backend(p);
  tensor *cd, *cy = NULL;
  const tensor *dy = _tdev_borrow(op, dy0, &cd), *y = dy ? _tdev_borrow(op, y0, &cy) : NULL;
  tensor *dx = y ? _tdev_out(op, p, TENSOR_F32, y->ndim, y->shape) : NULL;
  int64_t cols = y0->shape[y0->ndim - 1], rows = cols ? y0->numel / cols : 0, n = y0->numel;
  tensor *e = dx && n ? _tdev_out(op, p, TENSOR_F32, y->ndim, y->shape) : NULL;
  tensor *sum = e ? _tdev_out(op, p, TENSOR_F32, 1, (int64_t[]){ rows }) : NULL;
  gpu_status st = GPU_OK;
  if (dx && n && sum == NULL) {   /* (_tdev_out said why) */
    tensor_free(dx);
    dx = NULL;
  }
  if (sum) {
    float *ev = tensor_f32(e), *dxv = tensor_f32(dx);
    st = B->sum_cols(tensor_f32(sum), tensor_f32(dy), rows, cols, NULL);
    if (st == GPU_OK) st = B->exp(ev, tensor_f32(y), n, NULL);
    if (st == GPU_OK) st = row_broadcast(op, p, dxv, 1.0f, sum, 0.0f, rows, cols);
    if (st == GPU_OK) st = B->mul(dxv, ev, dxv, n, NULL);
    if (st == GPU_OK) st = B->sub(dxv, tensor_f32(dy), dxv, n, NULL);
  }
  tensor_free(sum);
  tensor_free(e);
  tensor_free(cd);
  tensor_free(cy);
  return dx ? _tdev_finish(op, B, st, dx) : NULL;
}

tensor *_tdev_xent(const char *op, const tensor *logits0, const tensor *labels0, bool grad) {
  gpu_pool *p = _tdev_same(op, logits0, labels0);
  if (p == NULL) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (labels0->dtype != TENSOR_I32)
    return _tensor_err(TENSOR_EDTYPE, "%s: labels are %s, want i32", op, _tensor_desc(labels0, b2)), NULL;
  if (logits0->ndim != 2 || labels0->ndim != 1 || labels0->shape[0] != logits0->shape[0] || logits0->shape[1] < 1)
    return _tensor_err(TENSOR_ESHAPE, "%s: logits %s and labels %s do not match (want [N,C] and [N])", op,
                       _tensor_desc(logits0, b1), _tensor_desc(labels0, b2)),
           NULL;
  const gpu_backend *B = backend(p);
  int64_t N = logits0->shape[0], C = logits0->shape[1];
  tensor *cl, *cy = NULL;
  const tensor *l = _tdev_borrow(op, logits0, &cl), *y = l ? borrow_i32(op, "labels", labels0, &cy) : NULL;
  tensor *probs = y ? _tdev_out(op, p, TENSOR_F32, 2, logits0->shape) : NULL;
  /* the loss: a scalar result, or (grad) scratch the probabilities come with */
  tensor *loss = probs ? _tdev_out(op, p, TENSOR_F32, 0, NULL) : NULL;
  tensor *out = loss && grad ? _tdev_out(op, p, TENSOR_F32, 2, logits0->shape) : NULL;
  gpu_status st = GPU_OK;
  if (loss && (out || !grad)) {
    if (N == 0) st = B->fill(tensor_f32(loss), 0.0f, 1, NULL);
    else st = B->softmax_xent_fwd(tensor_f32(probs), tensor_f32(loss), tensor_f32(l), tensor_i32(y), N, C, NULL);
    if (st == GPU_OK && grad && N)
      st = B->softmax_xent_bwd(tensor_f32(out), tensor_f32(probs), tensor_i32(y), 1.0f, N, C, NULL);
  }
  tensor_free(cl);
  tensor_free(cy);
  tensor_free(probs);
  if (grad) {
    tensor_free(loss);
    return out ? _tdev_finish(op, B, st, out) : NULL;
  }
  return loss ? _tdev_finish(op, B, st, loss) : NULL;
}

tensor *_tdev_embedding(const char *op, const tensor *w0, const tensor *idx0) {
  gpu_pool *p = _tdev_same(op, w0, idx0);
  if (p == NULL) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (w0->dtype != TENSOR_F32) return _tensor_arg_dtype(op, "weight", w0), NULL;
  if (w0->ndim != 2 || idx0->ndim >= TENSOR_MAX_DIMS)
    return _tensor_err(TENSOR_ESHAPE, "%s: weight %s (want [V,D]) and indices %s (up to %d dimensions)", op,
                       _tensor_desc(w0, b1), _tensor_desc(idx0, b2), TENSOR_MAX_DIMS - 1),
           NULL;
  const gpu_backend *B = backend(p);
  int64_t V = w0->shape[0], D = w0->shape[1], shape[TENSOR_MAX_DIMS];
  memcpy(shape, idx0->shape, (size_t)idx0->ndim * sizeof *shape);
  shape[idx0->ndim] = D;
  tensor *cw, *ci = NULL;
  const tensor *w = _tdev_borrow(op, w0, &cw), *idx = w ? borrow_i32(op, "indices", idx0, &ci) : NULL;
  tensor *out = idx ? _tdev_out(op, p, TENSOR_F32, idx0->ndim + 1, shape) : NULL;
  gpu_status st = GPU_OK;
  if (out && out->numel) st = B->embedding_fwd(tensor_f32(out), tensor_f32(w), tensor_i32(idx), idx->numel, D, V, NULL);
  tensor_free(cw);
  tensor_free(ci);
  return out ? _tdev_finish(op, B, st, out) : NULL;
}

tensor_status _tdev_embedding_grad(const char *op, tensor *dw, const tensor *dout0, const tensor *idx0) {
  gpu_pool *p = _tdev_same(op, dw, dout0);
  if (p == NULL || !on(op, "indices", idx0, p)) return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR], b3[TENSOR_SHAPE_STR];
  if (dw->dtype != TENSOR_F32 || dout0->dtype != TENSOR_F32)
    return _tensor_arg_dtype(op, dw->dtype != TENSOR_F32 ? "dweight" : "dout", dw->dtype != TENSOR_F32 ? dw : dout0),
           tensor_last_status();
  if (dw->ndim != 2 || !_tensor_contig(dw) || dout0->numel != idx0->numel * dw->shape[1] ||
      (dout0->ndim >= 1 && dout0->shape[dout0->ndim - 1] != dw->shape[1]))
    return _tensor_err(TENSOR_ESHAPE, "%s: dweight %s (contiguous [V,D]), dout %s and indices %s do not match", op,
                       _tensor_desc(dw, b1), _tensor_desc(dout0, b2), _tensor_desc(idx0, b3));
  const gpu_backend *B = backend(p);
  tensor *cd, *ci = NULL;
  const tensor *d = _tdev_borrow(op, dout0, &cd), *idx = d ? borrow_i32(op, "indices", idx0, &ci) : NULL;
  gpu_status st = GPU_OK;
  if (idx && idx->numel)
    st = B->embedding_bwd(tensor_f32(dw), tensor_f32(d), tensor_i32(idx), idx->numel, dw->shape[1], dw->shape[0], NULL);
  tensor_free(cd);
  tensor_free(ci);
  if (idx == NULL) return tensor_last_status();
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

/* ---- optimizer updates ---------------------------------------------------------------- */

/* The update's tensors: one device, contiguous f32, p's shape. */
static bool update_args(const char *op, gpu_pool *p, tensor *const *t, const char *const *names, int n) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  for (int i = 0; i < n; i++) {
    if (i > 0 && !on(op, names[i], t[i], p)) return false;
    if (t[i]->dtype != TENSOR_F32 || !_tensor_contig(t[i]) || !_tensor_same_shape(t[i], t[0])) {
      _tensor_err(TENSOR_ESHAPE, "%s: %s is %s, want a contiguous f32 of p's shape %s", op, names[i],
                  _tensor_desc(t[i], b1), _tensor_desc(t[0], b2));
      return false;
    }
  }
  return true;
}

tensor_status _tdev_sgd(const char *op, tensor *p, const tensor *g, tensor *buf, float lr, float momentum,
                        float weight_decay, int first) {
  gpu_pool *d = _tdev_same(op, p, g);
  tensor *t[3] = { p, (tensor *)g, buf };
  if (d == NULL || !update_args(op, d, t, (const char *const[]){ "p", "g", "buf" }, buf ? 3 : 2))
    return tensor_last_status();
  const gpu_backend *B = backend(d);
  gpu_status st = p->numel ? B->sgd_step(tensor_f32(p), tensor_f32(g), buf ? tensor_f32(buf) : NULL, p->numel, lr,
                                         momentum, weight_decay, first, NULL)
                           : GPU_OK;
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

tensor_status _tdev_adam(const char *op, tensor *p, const tensor *g, tensor *m, tensor *v, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int64_t t) {
  gpu_pool *d = _tdev_same(op, p, g);
  tensor *ts[4] = { p, (tensor *)g, m, v };
  if (d == NULL || !update_args(op, d, ts, (const char *const[]){ "p", "g", "m", "v" }, 4)) return tensor_last_status();
  const gpu_backend *B = backend(d);
  gpu_status st = p->numel ? B->adam_step(tensor_f32(p), tensor_f32(g), tensor_f32(m), tensor_f32(v), p->numel, lr,
                                          beta1, beta2, eps, weight_decay, t, NULL)
                           : GPU_OK;
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}
