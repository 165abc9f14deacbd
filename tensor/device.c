/* device.c - tensors on a device: a gpu/ caching pool over a backend.
 *
 * A device storage is a "tensor.storage" block of the header alone (no data
 * part) whose data is a "gpu.buffer" of the pool: the storage holds it
 * (ta_hold(storage, "device", buffer)) and counts one reference on it
 * (ta_ref_init at the storage's making, ta_ref_release at its end, when the
 * buffer goes back to the pool).  The device is kept in the storage's pool
 * links, which a device storage never uses (internal.h), so the 64-byte
 * header stays as it was.  The ops run on the backend's kernels, on the
 * default stream; a result comes back to the host only through tensor_to.
 *
 * The ops here are the ones tensor.h lists for devices; this file is linked
 * only into programs that call tensor_to (it sets _tensor_devops, through
 * which the rest of the library reaches it), so tensor/ needs no gpu/ code
 * otherwise. */
#include "device.h"

#include <stdio.h>
#include <string.h>

static void dev_name(gpu_pool *p, char *buf, size_t len) {
  snprintf(buf, len, "device %s (pool %p)", gpu_pool_backend(p)->name, (void *)p);
}

tensor_status _tdev_fail(const char *op, const gpu_backend *b, gpu_status st) {
  return _tensor_err(TENSOR_EINVAL, "%s: the %s backend failed: %s: %s", op, b->name, gpu_status_name(st),
                     b->last_error());
}

/* A contiguous tensor of dt and shape on p, its data uninitialised. */
tensor *_tdev_out(const char *op, gpu_pool *p, tensor_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = _tensor_check_shape(op, ndim, shape);
  if (n < 0) return NULL;
  tensor_storage *s = _tensor_storage_new(_tensor_tag_storage, 0);
  if (s == NULL) return NULL;
  void *buf = gpu_pool_alloc(p, (size_t)(n > 0 ? n : 1) * 4, NULL);
  if (buf == NULL) {
    _tensor_err(TENSOR_ENOMEM, "%s: no device memory for %lld elements: %s", op, (long long)n, gpu_pool_error());
    if (ta_ref_release(s) == 0) ta_free(s);
    return NULL;
  }
  s->data = buf;
  s->nbytes = (size_t)n * 4;
  s->device = p;
  ta_ref_init(buf, 1);
  ta_hold(s, "device", buf);
  int64_t st[TENSOR_MAX_DIMS];
  _tensor_contig_strides(ndim, shape, st);
  tensor *t = _tensor_header(s, true, dt, ndim, shape, st, 0, 0);
  if (t == NULL && ta_ref_release(s) == 0) {
    ta_unhold(s, "device");
    if (ta_ref_release(buf) == 0) gpu_pool_free(p, buf);
    ta_free(s);
  }
  return t;
}

static void dev_release(tensor_storage *s) {
  void *buf = s->data;
  ta_unhold(s, "device");
  if (ta_ref_release(buf) == 0) gpu_pool_free(s->device, buf);
}

/* The device of a and b (b may be NULL): both on one device, else an error. */
gpu_pool *_tdev_same(const char *op, const tensor *a, const tensor *b) {
  gpu_pool *da = _tensor_on_device(a->storage) ? a->storage->device : NULL;
  gpu_pool *db = b == NULL ? da : _tensor_on_device(b->storage) ? b->storage->device : NULL;
  if (da == NULL || da != db) {
    _tensor_dev_mixed(op, a, b ? b : a);
    return NULL;
  }
  return da;
}

/* The kernels take contiguous f32 tensors. */
static bool dev_f32_contig(const char *op, const char *name, const tensor *t) {
  char b[TENSOR_SHAPE_STR];
  if (t->dtype != TENSOR_F32) return _tensor_arg_dtype(op, name, t);
  if (!_tensor_contig(t)) {
    _tensor_err(TENSOR_EINVAL, "%s: %s is %s, not contiguous: on a device, tensor_contiguous(%s) first", op, name,
                _tensor_desc(t, b), name);
    return false;
  }
  return true;
}


/* t itself when contiguous, else a contiguous copy on its device (*copy:
 * the caller frees it); a broadcast view (an expanded gradient) included. */
const tensor *_tdev_borrow(const char *op, const tensor *t, tensor **copy) {
  *copy = NULL;
  if (t->dtype != TENSOR_F32) return _tensor_arg_dtype(op, "a", t), NULL;
  if (_tensor_contig(t)) return t;
  return *copy = _tdev_clone(op, t);
}

tensor *_tdev_finish(const char *op, const gpu_backend *B, gpu_status st, tensor *out) {
  if (st != GPU_OK) {
    _tdev_fail(op, B, st);
    tensor_free(out);
    return NULL;
  }
  return out;
}

/* out = a op b on out's device, out contiguous (it may be a or b). */
static tensor_status dev_binary_run(const char *op, int kind, tensor *out, const tensor *a0, const tensor *b0) {
  const gpu_backend *B = gpu_pool_backend(out->storage->device);
  tensor *ca, *cb;
  const tensor *a = _tdev_borrow(op, a0, &ca), *b = a ? _tdev_borrow(op, b0, &cb) : NULL;
  if (b == NULL) {
    tensor_free(ca);
    return tensor_last_status();
  }
  float *o = tensor_f32(out);
  const float *x = tensor_f32(a), *y = tensor_f32(b);
  int64_t n = a->numel;
  bool bias = !_tensor_same_shape(a, b);
  gpu_status st;
  if (bias) st = B->bias_add_rows(o, x, y, n / b->shape[0], b->shape[0], NULL);
  else switch (kind) {
    case _TD_ADD: st = B->add(o, x, y, n, NULL); break;
    case _TD_SUB: st = B->sub(o, x, y, n, NULL); break;
    case _TD_MUL: st = B->mul(o, x, y, n, NULL); break;
    case _TD_DIV: st = B->div(o, x, y, n, NULL); break;
    case _TD_RELU_GRAD: st = B->relu_bwd(o, x, y, n, NULL); break;
    case _TD_TANH_GRAD: st = B->tanh_bwd(o, x, y, n, NULL); break;
    case _TD_SIGMOID_GRAD: st = B->sigmoid_bwd(o, x, y, n, NULL); break;
    default: st = GPU_EINVAL; break;
  }
  tensor_free(ca);
  tensor_free(cb);
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

/* The shapes a device runs: equal, or [.., cols] + [cols] for an add. */
static bool dev_shapes(const char *op, int kind, const tensor *a, const tensor *b) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (_tensor_same_shape(a, b) ||
      (kind == _TD_ADD && a->ndim >= 1 && b->ndim == 1 && b->shape[0] == a->shape[a->ndim - 1]))
    return true;
  _tensor_err(TENSOR_ESHAPE, "%s: on a device the shapes must be equal (or [rows, cols] + [cols] for tensor_add): "
                             "%s and %s", op, _tensor_desc(a, b1), _tensor_desc(b, b2));
  return false;
}

static tensor *dev_binary(const char *op, int kind, const tensor *a, const tensor *b) {
  gpu_pool *p = _tdev_same(op, a, b);
  if (p == NULL || !dev_shapes(op, kind, a, b)) return NULL;
  tensor *out = _tdev_out(op, p, TENSOR_F32, a->ndim, a->shape);
  if (out && dev_binary_run(op, kind, out, a, b) != TENSOR_OK) {
    tensor_free(out);
    return NULL;
  }
  return out;
}

/* The _out and in-place forms: out contiguous f32, a's shape. */
static tensor_status dev_binary_out(const char *op, int kind, tensor *out, const tensor *a, const tensor *b) {
  /* one device for the three: name the first two that differ */
  const tensor *t3[3] = { out, a, b };
  int first = 0;
  while (first < 2 && !_tensor_on_device(t3[first]->storage)) first++;
  gpu_pool *p = t3[first]->storage->device;
  for (int i = 0; i < 3; i++)
    if (!_tensor_on_device(t3[i]->storage) || t3[i]->storage->device != p)
      return _tensor_dev_mixed(op, t3[i < first ? i : first], t3[i < first ? first : i]);
  if (!dev_f32_contig(op, "out", out)) return tensor_last_status();
  if (!_tensor_same_shape(out, a)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    return _tensor_err(TENSOR_ESHAPE, "%s: out is %s, a is %s", op, _tensor_desc(out, b1), _tensor_desc(a, b2));
  }
  if (!dev_shapes(op, kind, a, b)) return tensor_last_status();
  return dev_binary_run(op, kind, out, a, b);
}

static tensor *dev_unary(const char *op, int kind, const tensor *a0, float s) {
  gpu_pool *p = _tdev_same(op, a0, NULL);
  if (p == NULL) return NULL;
  const gpu_backend *B = gpu_pool_backend(p);
  tensor *ca;
  const tensor *a = _tdev_borrow(op, a0, &ca);
  tensor *out = a ? _tdev_out(op, p, TENSOR_F32, a->ndim, a->shape) : NULL;
  if (out == NULL) {
    tensor_free(ca);
    return NULL;
  }
  float *o = tensor_f32(out);
  const float *x = tensor_f32(a);
  int64_t n = a->numel;
  gpu_status st;
  switch (kind) {
    case _TD_ADD_SCALAR: st = B->add_scalar(o, x, s, n, NULL); break;
    case _TD_MUL_SCALAR: st = B->scale(o, x, s, n, NULL); break;
    case _TD_NEG: st = B->scale(o, x, -1.0f, n, NULL); break;
    case _TD_EXP: st = B->exp(o, x, n, NULL); break;
    case _TD_LOG: st = B->log(o, x, n, NULL); break;
    case _TD_TANH: st = B->tanh(o, x, n, NULL); break;
    case _TD_RELU: st = B->relu(o, x, n, NULL); break;
    case _TD_SIGMOID: st = B->sigmoid(o, x, n, NULL); break;
    default: st = GPU_EINVAL; break;
  }
  tensor_free(ca);
  return _tdev_finish(op, B, st, out);
}

static tensor_status dev_scalar_(const char *op, int kind, tensor *a, float s) {
  gpu_pool *p = _tdev_same(op, a, NULL);
  if (p == NULL || !dev_f32_contig(op, "a", a)) return tensor_last_status();
  const gpu_backend *B = gpu_pool_backend(p);
  float *x = tensor_f32(a);
  gpu_status st = kind == _TD_ADD_SCALAR ? B->add_scalar(x, x, s, a->numel, NULL) : B->scale(x, x, s, a->numel, NULL);
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

static tensor *dev_matmul(const char *op, const tensor *a, const tensor *b) { return _tdev_matmul_t(op, a, 0, b, 0); }

static tensor *dev_sum(const char *op, const tensor *a0, int axis, int keepdim) {
  gpu_pool *p = _tdev_same(op, a0, NULL);
  if (p == NULL) return NULL;
  char b[TENSOR_SHAPE_STR];
  bool all = axis == TENSOR_ALL || (a0->ndim == 1 && axis == 0);
  if (keepdim || !(all || (axis == 0 && a0->ndim >= 1)))
    return _tensor_err(TENSOR_EINVAL, "%s: on a device, the sum of every element or over axis 0 (keepdim 0) only: "
                                      "axis %d, keepdim %d of %s", op, axis, keepdim, _tensor_desc(a0, b)),
           NULL;
  const gpu_backend *B = gpu_pool_backend(p);
  tensor *ca;
  const tensor *a = _tdev_borrow(op, a0, &ca);
  tensor *out = a ? _tdev_out(op, p, TENSOR_F32, all ? 0 : a->ndim - 1, a->shape + 1) : NULL;
  gpu_status st = GPU_OK;
  if (out && all) st = B->sum_all(tensor_f32(out), tensor_f32(a), a->numel, NULL);
  else if (out) st = B->sum_rows(tensor_f32(out), tensor_f32(a), a->shape[0], out->numel, NULL);
  tensor_free(ca);
  return out ? _tdev_finish(op, B, st, out) : NULL;
}

tensor *_tdev_clone(const char *op, const tensor *a) {
  gpu_pool *p = _tdev_same(op, a, NULL);
  if (p == NULL) return NULL;
  const gpu_backend *B = gpu_pool_backend(p);
  tensor *out = _tdev_out(op, p, a->dtype, a->ndim, a->shape);
  if (out == NULL) return NULL;
  gpu_status st;
  if (_tensor_contig(a)) st = B->memcpy_d2d(out->data, a->data, (size_t)a->numel * 4, NULL);
  else if (a->ndim == 0) st = B->memcpy_d2d(out->data, a->data, 4, NULL);
  else st = B->copy_strided(out->data, a->data, a->ndim, a->shape, a->strides, NULL);   /* 4-byte elements */
  return _tdev_finish(op, B, st, out);
}

static tensor_status dev_fill(const char *op, tensor *a, float v) {
  gpu_pool *p = _tdev_same(op, a, NULL);
  if (p == NULL) return tensor_last_status();
  if (!_tensor_contig(a)) {
    char b[TENSOR_SHAPE_STR];
    return _tensor_err(TENSOR_EINVAL, "%s: a is %s, not contiguous: on a device, fill a contiguous tensor", op,
                       _tensor_desc(a, b));
  }
  const gpu_backend *B = gpu_pool_backend(p);
  gpu_status st = a->dtype == TENSOR_F32 ? B->fill(a->data, v, a->numel, NULL)
                                         : B->fill_i32(a->data, (int32_t)v, a->numel, NULL);
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

/* dst = src in place, one or both on a device: host to device, device to
 * host, or within one device; same dtype and shape (no broadcast), dst
 * contiguous, src copied contiguous where it lives first.  Waits for the
 * copy. */
static tensor_status dev_copy(const char *op, tensor *dst, const tensor *src) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  gpu_pool *to = _tensor_on_device(dst->storage) ? dst->storage->device : NULL;
  gpu_pool *from = _tensor_on_device(src->storage) ? src->storage->device : NULL;
  if (to && from && to != from) return _tensor_dev_mixed(op, dst, src);
  if (dst->dtype != src->dtype)
    return _tensor_err(TENSOR_EDTYPE, "%s: dtype mismatch: dst %s, src %s", op, _tensor_desc(dst, b1),
                       _tensor_desc(src, b2));
  if (!_tensor_same_shape(dst, src))
    return _tensor_err(TENSOR_ESHAPE, "%s: src %s is not dst's shape %s (between host and device: the same shape)",
                       op, _tensor_desc(src, b2), _tensor_desc(dst, b1));
  if (!_tensor_contig(dst))
    return _tensor_err(TENSOR_EINVAL, "%s: dst is %s, not contiguous: on a device, copy into a contiguous tensor", op,
                       _tensor_desc(dst, b1));
  const tensor *s = _tensor_contig(src) ? src : tensor_contiguous(src);
  if (s == NULL) return tensor_last_status();
  const gpu_backend *B = gpu_pool_backend(to ? to : from);
  size_t bytes = (size_t)dst->numel * 4;
  gpu_status st = GPU_OK;
  if (bytes) {
    if (to && from) st = B->memcpy_d2d(dst->data, s->data, bytes, NULL);
    else if (to) st = B->memcpy_h2d(dst->data, s->data, bytes, NULL);
    else st = B->memcpy_d2h(dst->data, s->data, bytes, NULL);
    if (st == GPU_OK) st = B->stream_synchronize(NULL);
  }
  if (s != src) tensor_free((tensor *)s);
  return st == GPU_OK ? TENSOR_OK : _tdev_fail(op, B, st);
}

static const struct _tensor_devops devops = {
  .binary = dev_binary, .binary_out = dev_binary_out, .unary = dev_unary, .scalar_ = dev_scalar_, .matmul = dev_matmul, .sum = dev_sum,
  .clone = _tdev_clone,   .fill = dev_fill, .copy = dev_copy, .release = dev_release, .name = dev_name,
  .gemm = _tdev_gemm, .matmul_t = _tdev_matmul_t, .sum_add = _tdev_sum_add, .argmax = _tdev_argmax,
  .item = _tdev_item, .conv2d = _tdev_conv2d, .conv2d_grad = _tdev_conv2d_grad, .pool = _tdev_pool,
  .pool_grad = _tdev_pool_grad, .softmax = _tdev_softmax,
  .softmax_grad = _tdev_softmax_grad, .log_softmax = _tdev_log_softmax,
  .log_softmax_grad = _tdev_log_softmax_grad, .xent = _tdev_xent, .embedding = _tdev_embedding,
  .embedding_grad = _tdev_embedding_grad, .sgd = _tdev_sgd, .adam = _tdev_adam,
};

tensor *tensor_to(const tensor *t, gpu_pool *device) {
  if (!_tensor_arg_any("tensor_to", "t", t)) return NULL;
  _tensor_devops = &devops;
  gpu_pool *from = _tensor_on_device(t->storage) ? t->storage->device : NULL;
  /* the source as contiguous elements where it lives */
  tensor *src = _tensor_contig(t) ? (tensor *)t : tensor_contiguous(t);
  if (src == NULL) return NULL;
  size_t bytes = (size_t)src->numel * 4;
  tensor *out = device ? _tdev_out("tensor_to", device, t->dtype, t->ndim, t->shape)
                       : _tensor_out("tensor_to", t->dtype, t->ndim, t->shape);
  if (out == NULL) {
    if (src != t) tensor_free(src);
    return NULL;
  }
  const gpu_backend *B = device ? gpu_pool_backend(device) : from ? gpu_pool_backend(from) : NULL;
  gpu_status st = GPU_OK;
  if (bytes == 0) st = GPU_OK;
  else if (!from && !device) memcpy(out->data, src->data, bytes);
  else if (!from) st = B->memcpy_h2d(out->data, src->data, bytes, NULL);
  else if (!device) st = B->memcpy_d2h(out->data, src->data, bytes, NULL);
  else if (gpu_pool_backend(from) == B) st = B->memcpy_d2d(out->data, src->data, bytes, NULL);
  else {
    /* two backends: through host memory */
    tensor *h = tensor_to(src, NULL);
    if (h == NULL) st = GPU_EINVAL;
    else st = B->memcpy_h2d(out->data, h->data, bytes, NULL);
    tensor_free(h);
  }
  if (st == GPU_OK && B) st = B->stream_synchronize(NULL);
  if (src != t) tensor_free(src);
  return _tdev_finish("tensor_to", B, st, out);
}
