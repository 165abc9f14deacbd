/* view.c - zero-copy views (a new header on the same storage, new shape,
 * strides and offset), and the copies: contiguous, clone, copy_.
 *
 * No function here allocates data except tensor_contiguous of a
 * non-contiguous tensor, tensor_clone, and tensor_reshape when no view can
 * express the new shape. */
#include "internal.h"
#include "vmath.h"

#include <string.h>

static tensor *make_view(const tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                         int64_t offset) {
  return _tensor_header(t->storage, false, t->dtype, ndim, shape, strides, offset, 0);
}

/* The seeded bug of reshape-dummy and slice-dummy (tensor_fault_set): the
 * view is given a 1-element buffer of its own, then pointed at its parent's
 * data like any view; the dummy loses its only holder there and is never
 * freed (leak.orphan, 4 bytes a view). */
static inline __attribute__((always_inline)) tensor *dummy_view(const tensor *t, int ndim, const int64_t *shape,
                                                                const int64_t *strides, int64_t offset) {
  tensor *v = make_view(t, ndim, shape, strides, offset);
  if (v == NULL) return NULL;
  void *dummy = ta_alloc(_tensor_tag_storage, 4);        /* the view's "own" element */
  ta_hold(v, "data", dummy);
  v->data = (char *)t->storage->data + offset * 4;       /* ... overwritten with the parent's */
  ta_hold(v, "data", v->storage);
  return v;
}

tensor *tensor_alias(const tensor *t) {
  if (!_tensor_arg_any("tensor_alias", "t", t)) return NULL;
  return make_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* ---- reshape ---------------------------------------------------------------- */

/* Resolves one -1 in shape into out; checks the element count. */
static bool resolve_shape(const char *op, const tensor *t, int ndim, const int64_t *shape, int64_t *out) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (ndim < 0 || ndim > TENSOR_MAX_DIMS || (ndim > 0 && shape == NULL)) {
    _tensor_err(TENSOR_ESHAPE, "%s: %d dimensions asked for %s (0 to %d allowed)", op, ndim,
                _tensor_desc(t, b1), TENSOR_MAX_DIMS);
    return false;
  }
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    out[i] = shape[i];
    if (shape[i] == -1 && infer < 0) {
      infer = i;
    } else if (shape[i] < 0) {
      _tensor_err(TENSOR_ESHAPE, "%s: bad shape %s for %s", op, _tensor_shape_desc(t->dtype, ndim, shape, b2),
                  _tensor_desc(t, b1));
      return false;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || t->numel % known != 0) {
      _tensor_err(TENSOR_ESHAPE, "%s: cannot reshape %s (%lld elements%s) to %s", op, _tensor_desc(t, b1),
                  (long long)t->numel, ta_poison_explain((uint64_t)t->numel, 8),
                  _tensor_shape_desc(t->dtype, ndim, shape, b2));
      return false;
    }
    out[infer] = t->numel / known;
    known *= out[infer];
  }
  if (known != t->numel) {
    _tensor_err(TENSOR_ESHAPE, "%s: cannot reshape %s (%lld elements%s) to %s (%lld elements)", op,
                _tensor_desc(t, b1), (long long)t->numel, ta_poison_explain((uint64_t)t->numel, 8),
                _tensor_shape_desc(t->dtype, ndim, out, b2), (long long)known);
    return false;
  }
  return true;
}

/* Strides that show t's elements, in row-major order, with shape ns; false
 * when t's strides make that impossible.  Walks t's axes from the innermost,
 * in chunks of axes that are contiguous with each other, and lays the new
 * axes over each chunk. */
static bool view_strides(const tensor *t, int nn, const int64_t *ns, int64_t *nst) {
  if (t->numel == 0 || t->ndim == 0) {
    _tensor_contig_strides(nn, ns, nst);
    return true;
  }
  int vd = nn - 1;
  int64_t base = t->strides[t->ndim - 1], tnum = 1, vnum = 1;
  for (int td = t->ndim - 1; td >= 0; td--) {
    tnum *= t->shape[td];
    if (td == 0 || (t->shape[td - 1] != 1 && t->strides[td - 1] != tnum * base)) {
      while (vd >= 0 && (vnum < tnum || ns[vd] == 1)) {
        nst[vd] = vnum * base;
        vnum *= ns[vd];
        vd--;
      }
      if (vnum != tnum) return false;
      if (td > 0) {
        base = t->strides[td - 1];
        tnum = vnum = 1;
      }
    }
  }
  return vd == -1;
}

tensor *tensor_view(const tensor *t, int ndim, const int64_t *shape) {
  if (!_tensor_arg_any("tensor_view", "t", t)) return NULL;
  int64_t ns[TENSOR_MAX_DIMS], nst[TENSOR_MAX_DIMS];
  if (!resolve_shape("tensor_view", t, ndim, shape, ns)) return NULL;
  if (!view_strides(t, ndim, ns, nst)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "tensor_view: the strides of %s allow no view as %s (use tensor_reshape)",
                _tensor_desc(t, b1), _tensor_shape_desc(t->dtype, ndim, ns, b2));
    return NULL;
  }
  return make_view(t, ndim, ns, nst, t->offset);
}

tensor_status tensor_view_(tensor *t, int ndim, const int64_t *shape) {
  if (!_tensor_arg_any("tensor_view_", "t", t)) return TENSOR_EINVAL;
  int64_t ns[TENSOR_MAX_DIMS], nst[TENSOR_MAX_DIMS];
  if (!resolve_shape("tensor_view_", t, ndim, shape, ns)) return tensor_last_status();
  if (!view_strides(t, ndim, ns, nst)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    return _tensor_err(TENSOR_ESHAPE, "tensor_view_: the strides of %s allow no view as %s", _tensor_desc(t, b1),
                       _tensor_shape_desc(t->dtype, ndim, ns, b2));
  }
  /* the same header, so the same storage, offset, hold and reference */
  t->ndim = ndim;
  for (int i = 0; i < TENSOR_MAX_DIMS; i++) {
    t->shape[i] = i < ndim ? ns[i] : 1;
    t->strides[i] = i < ndim ? nst[i] : 0;
  }
  return TENSOR_OK;
}

tensor *tensor_reshape(const tensor *t, int ndim, const int64_t *shape) {
  if (!_tensor_arg_any("tensor_reshape", "t", t)) return NULL;
  int64_t ns[TENSOR_MAX_DIMS], nst[TENSOR_MAX_DIMS];
  if (!resolve_shape("tensor_reshape", t, ndim, shape, ns)) return NULL;
  if (view_strides(t, ndim, ns, nst)) {
    if (_tensor_fault(TENSOR_FAULT_RESHAPE_DUMMY)) return dummy_view(t, ndim, ns, nst, t->offset);
    return make_view(t, ndim, ns, nst, t->offset);
  }
  tensor *c = tensor_clone(t);
  if (c == NULL) return NULL;
  tensor *v = tensor_view(c, ndim, ns);
  tensor_free(c);
  return v;
}

tensor *tensor_flatten(const tensor *t) {
  if (!_tensor_arg_any("tensor_flatten", "t", t)) return NULL;
  return tensor_reshape(t, 1, &t->numel);
}

/* ---- slicing ----------------------------------------------------------------- */

static bool check_axis(const char *op, const tensor *t, int *axis, int extra) {
  int a = _tensor_axis(*axis, t->ndim + extra);
  if (a < 0 || a >= t->ndim + extra) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ERANGE, "%s: axis %d out of range for %s", op, *axis, _tensor_desc(t, b));
    return false;
  }
  *axis = a;
  return true;
}

tensor *tensor_slice(const tensor *t, int axis, int64_t start, int64_t stop, int64_t step) {
  if (!_tensor_arg_any("tensor_slice", "t", t) || !check_axis("tensor_slice", t, &axis, 0)) return NULL;
  int64_t n = t->shape[axis];
  int64_t s0 = start < 0 ? start + n : start, s1 = stop < 0 ? stop + n : stop;
  if (step < 1 || s0 < 0 || s1 > n || s0 > s1) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ERANGE, "tensor_slice: [%lld:%lld:%lld] out of range for axis %d (size %lld%s) of %s",
                (long long)start, (long long)stop, (long long)step, axis, (long long)n,
                ta_poison_explain((uint64_t)n, 8), _tensor_desc(t, b));
    return NULL;
  }
  int64_t shape[TENSOR_MAX_DIMS], strides[TENSOR_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[axis] = (s1 - s0 + step - 1) / step;
  strides[axis] = t->strides[axis] * step;
  if (_tensor_fault(TENSOR_FAULT_SLICE_DUMMY))
    return dummy_view(t, t->ndim, shape, strides, t->offset + s0 * t->strides[axis]);
  return make_view(t, t->ndim, shape, strides, t->offset + s0 * t->strides[axis]);
}

tensor *tensor_select(const tensor *t, int axis, int64_t index) {
  if (!_tensor_arg_any("tensor_select", "t", t) || !check_axis("tensor_select", t, &axis, 0)) return NULL;
  int64_t n = t->shape[axis], i = index < 0 ? index + n : index;
  if (i < 0 || i >= n) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ERANGE, "tensor_select: index %lld out of range for axis %d (size %lld%s) of %s",
                (long long)index, axis, (long long)n, ta_poison_explain((uint64_t)n, 8), _tensor_desc(t, b));
    return NULL;
  }
  int64_t shape[TENSOR_MAX_DIMS], strides[TENSOR_MAX_DIMS];
  for (int d = 0, k = 0; d < t->ndim; d++) {
    if (d == axis) continue;
    shape[k] = t->shape[d];
    strides[k++] = t->strides[d];
  }
  return make_view(t, t->ndim - 1, shape, strides, t->offset + i * t->strides[axis]);
}

int64_t tensor_batch_count(const tensor *t, int64_t batch) {
  if (t == NULL || !_tensor_live("tensor_batch_count", "t", t) || t->ndim == 0 || batch < 1) return 0;
  return (t->shape[0] + batch - 1) / batch;
}

tensor *tensor_batch(const tensor *t, int64_t i, int64_t batch) {
  if (!_tensor_arg_any("tensor_batch", "t", t)) return NULL;
  char b[TENSOR_SHAPE_STR];
  if (t->ndim == 0 || batch < 1) {
    _tensor_err(TENSOR_EINVAL, "tensor_batch: batch size %lld of %s", (long long)batch, _tensor_desc(t, b));
    return NULL;
  }
  int64_t n = t->shape[0], nb = (n + batch - 1) / batch;
  if (i < 0 || i >= nb) {
    _tensor_err(TENSOR_ERANGE, "tensor_batch: batch %lld out of range (%lld batches of %lld in %s)",
                (long long)i, (long long)nb, (long long)batch, _tensor_desc(t, b));
    return NULL;
  }
  int64_t stop = (i + 1) * batch < n ? (i + 1) * batch : n;
  return tensor_slice(t, 0, i * batch, stop, 1);
}

/* ---- axes ---------------------------------------------------------------------- */

tensor *tensor_permute(const tensor *t, const int *perm) {
  if (!_tensor_arg_any("tensor_permute", "t", t)) return NULL;
  int64_t shape[TENSOR_MAX_DIMS], strides[TENSOR_MAX_DIMS];
  int seen = 0;
  for (int d = 0; d < t->ndim; d++) {
    int p = perm ? _tensor_axis(perm[d], t->ndim) : -1;
    if (p < 0 || p >= t->ndim || (seen & (1 << p))) {
      char b[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ERANGE, "tensor_permute: entry %d (%d) of the permutation is bad for %s", d,
                  perm ? perm[d] : -1, _tensor_desc(t, b));
      return NULL;
    }
    seen |= 1 << p;
    shape[d] = t->shape[p];
    strides[d] = t->strides[p];
  }
  return make_view(t, t->ndim, shape, strides, t->offset);
}

tensor *tensor_transpose(const tensor *t, int a0, int a1) {
  if (!_tensor_arg_any("tensor_transpose", "t", t) || !check_axis("tensor_transpose", t, &a0, 0) ||
      !check_axis("tensor_transpose", t, &a1, 0))
    return NULL;
  int perm[TENSOR_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) perm[d] = d;
  perm[a0] = a1;
  perm[a1] = a0;
  return tensor_permute(t, perm);
}

tensor *tensor_squeeze(const tensor *t, int axis) {
  if (!_tensor_arg_any("tensor_squeeze", "t", t)) return NULL;
  if (axis != TENSOR_ALL) {
    if (!check_axis("tensor_squeeze", t, &axis, 0)) return NULL;
    if (t->shape[axis] != 1) {
      char b[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ESHAPE, "tensor_squeeze: axis %d of %s has size %lld%s, not 1", axis,
                  _tensor_desc(t, b), (long long)t->shape[axis], ta_poison_explain((uint64_t)t->shape[axis], 8));
      return NULL;
    }
  }
  int64_t shape[TENSOR_MAX_DIMS], strides[TENSOR_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1 && (axis == TENSOR_ALL || d == axis)) continue;
    shape[k] = t->shape[d];
    strides[k++] = t->strides[d];
  }
  return make_view(t, k, shape, strides, t->offset);
}

tensor *tensor_unsqueeze(const tensor *t, int axis) {
  if (!_tensor_arg_any("tensor_unsqueeze", "t", t) || !check_axis("tensor_unsqueeze", t, &axis, 1)) return NULL;
  if (t->ndim == TENSOR_MAX_DIMS) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "tensor_unsqueeze: %s has %d dimensions already", _tensor_desc(t, b),
                TENSOR_MAX_DIMS);
    return NULL;
  }
  int64_t shape[TENSOR_MAX_DIMS], strides[TENSOR_MAX_DIMS];
  for (int d = 0, k = 0; d <= t->ndim; d++) {
    if (d == axis) {
      shape[d] = 1;
      strides[d] = d < t->ndim ? t->strides[k] * t->shape[k] : 1;
      continue;
    }
    shape[d] = t->shape[k];
    strides[d] = t->strides[k++];
  }
  return make_view(t, t->ndim + 1, shape, strides, t->offset);
}

void _tensor_broadcast_strides(const tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  int off = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int s = d - off;
    strides[d] = (s < 0 || (t->shape[s] == 1 && shape[d] != 1)) ? 0 : t->strides[s];
  }
}

tensor *tensor_expand(const tensor *t, int ndim, const int64_t *shape) {
  if (!_tensor_arg_any("tensor_expand", "t", t)) return NULL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (ndim < t->ndim || ndim > TENSOR_MAX_DIMS || _tensor_check_shape("tensor_expand", ndim, shape) < 0) {
    if (ndim < t->ndim)
      _tensor_err(TENSOR_ESHAPE, "tensor_expand: %s has more dimensions than %d", _tensor_desc(t, b1), ndim);
    return NULL;
  }
  for (int d = 0; d < t->ndim; d++) {
    int64_t have = t->shape[d], want = shape[ndim - t->ndim + d];
    if (have != want && have != 1) {
      _tensor_err(TENSOR_ESHAPE, "tensor_expand: cannot expand %s to %s", _tensor_desc(t, b1),
                  _tensor_shape_desc(t->dtype, ndim, shape, b2));
      return NULL;
    }
  }
  int64_t strides[TENSOR_MAX_DIMS];
  _tensor_broadcast_strides(t, ndim, shape, strides);
  return make_view(t, ndim, shape, strides, t->offset);
}

/* ---- copies ------------------------------------------------------------------ */

/* A fill (sa == 0) reads a[0] once: o may alias it, and a reload per
 * element kept gcc from vectorizing (zero_grad's fills). */
TENSOR_SIMD static void copy_row(uint32_t *o, const uint32_t *a, int64_t n, int64_t so, int64_t sa) {
  if (so == 1 && sa == 1) memcpy(o, a, (size_t)n * 4);
  else if (so == 1 && sa == 0) {
    uint32_t v = a[0];
    for (int64_t i = 0; i < n; i++) o[i] = v;
  }
  else if (so == 1) for (int64_t i = 0; i < n; i++) o[i] = a[i * sa];
  else for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa];
}

void _tensor_copy_strided(tensor *dst, const tensor *src) {
  if (dst->numel == 0) return;
  int64_t sst[TENSOR_MAX_DIMS];
  _tensor_broadcast_strides(src, dst->ndim, dst->shape, sst);
  const int64_t *st[3] = { dst->strides, sst, sst };
  tensor_iter it;
  _tensor_iter_init(&it, dst->ndim, dst->shape, 2, st);
  int nd = it.nd;
  int64_t n = it.shape[nd - 1], rows = dst->numel / n, idx[TENSOR_MAX_DIMS] = { 0 };
  uint32_t *o = dst->data;
  const uint32_t *a = src->data;
  for (int64_t r = 0; r < rows; r++) {
    copy_row(o, a, n, it.st[0][nd - 1], it.st[1][nd - 1]);
    for (int d = nd - 2; d >= 0; d--) {
      o += it.st[0][d];
      a += it.st[1][d];
      if (++idx[d] < it.shape[d]) break;
      o -= it.st[0][d] * it.shape[d];
      a -= it.st[1][d] * it.shape[d];
      idx[d] = 0;
    }
  }
}

tensor *_tensor_clone(const tensor *t) {
  tensor *c = _tensor_out("tensor_clone", t->dtype, t->ndim, t->shape);
  if (c) _tensor_copy_strided(c, t);
  return c;
}

tensor *tensor_clone(const tensor *t) {
  if (!_tensor_arg_any("tensor_clone", "t", t)) return NULL;
  if (_tensor_on_device(t->storage)) return _tensor_devops->clone("tensor_clone", t);
  return _tensor_clone(t);
}

tensor *tensor_contiguous(const tensor *t) {
  if (!_tensor_arg_any("tensor_contiguous", "t", t)) return NULL;
  if (_tensor_contig(t)) return tensor_alias(t);
  if (_tensor_on_device(t->storage)) return _tensor_devops->clone("tensor_contiguous", t);
  return _tensor_clone(t);
}

tensor *_tensor_borrow(const tensor *t) {
  return _tensor_contig(t) ? (tensor *)t : _tensor_clone(t);
}

tensor_status tensor_copy_(tensor *dst, const tensor *src) {
  if (!_tensor_arg_any("tensor_copy_", "dst", dst) || !_tensor_arg_any("tensor_copy_", "src", src))
    return TENSOR_EINVAL;
  if (_tensor_on_device(dst->storage) || _tensor_on_device(src->storage))
    return _tensor_devops->copy("tensor_copy_", dst, src);
  if (!_tensor_arg("tensor_copy_", "dst", dst) || !_tensor_arg("tensor_copy_", "src", src))
    return TENSOR_EINVAL;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (dst->dtype != src->dtype)
    return _tensor_err(TENSOR_EDTYPE, "tensor_copy_: dtype mismatch: dst %s, src %s", _tensor_desc(dst, b1),
                       _tensor_desc(src, b2));
  int nd;
  int64_t shape[TENSOR_MAX_DIMS];
  if (!_tensor_broadcast_shape(dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape) ||
      nd != dst->ndim || memcmp(shape, dst->shape, (size_t)nd * sizeof *shape) != 0)
    return _tensor_err(TENSOR_ESHAPE, "tensor_copy_: src %s does not broadcast to dst %s",
                       _tensor_desc(src, b2), _tensor_desc(dst, b1));
  _tensor_copy_strided(dst, src);
  return TENSOR_OK;
}

tensor_status tensor_fill_(tensor *a, float v) {
  if (!_tensor_arg_any("tensor_fill_", "a", a)) return TENSOR_EINVAL;
  if (_tensor_on_device(a->storage)) return _tensor_devops->fill("tensor_fill_", a, v);
  union { float f; int32_t i; uint32_t u; } x;
  if (a->dtype == TENSOR_F32) x.f = v;
  else x.i = (int32_t)v;
  tensor src = { .data = &x.u, .ndim = 0, .numel = 1, .dtype = a->dtype };
  _tensor_copy_strided(a, &src);
  return TENSOR_OK;
}
