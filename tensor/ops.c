/* ops.c - elementwise ops with numpy broadcasting, in-place forms, and
 * reductions along an axis.
 *
 * The strided iterator drops axes of size 1 and merges adjacent axes that
 * every operand walks contiguously, so that most calls become one long
 * inner loop; each kernel has unit-stride and broadcast-scalar fast paths
 * that gcc vectorizes. */
#include "internal.h"
#include "vmath.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- iteration ----------------------------------------------------------------- */

void _tensor_iter_init(tensor_iter *it, int ndim, const int64_t *shape, int nops,
                       const int64_t *const strides[3]) {
  it->nd = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 1) continue;
    int j = it->nd - 1;
    if (j >= 0) {
      bool merge = true;
      for (int k = 0; k < nops; k++)
        if (it->st[k][j] != strides[k][i] * shape[i]) merge = false;
      if (merge) {
        it->shape[j] *= shape[i];
        for (int k = 0; k < nops; k++) it->st[k][j] = strides[k][i];
        continue;
      }
    }
    it->shape[it->nd] = shape[i];
    for (int k = 0; k < nops; k++) it->st[k][it->nd] = strides[k][i];
    it->nd++;
  }
  if (it->nd == 0) {
    it->nd = 1;
    it->shape[0] = 1;
    for (int k = 0; k < 3; k++) it->st[k][0] = 0;
  }
  for (int k = nops; k < 3; k++)
    for (int d = 0; d < it->nd; d++) it->st[k][d] = 0;
}

bool _tensor_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int d = 0; d < n; d++) {
    int ia = d - (n - na), ib = d - (n - nb);
    int64_t x = ia >= 0 ? sa[ia] : 1, y = ib >= 0 ? sb[ib] : 1;
    if (x != y && x != 1 && y != 1) return false;
    out[d] = x == 1 ? y : x;
  }
  *nout = n;
  return true;
}

/* One row of a kernel: n elements, each operand with its stride. */
typedef void kernel_fn(float *o, const float *a, const float *b, int64_t n, int64_t so, int64_t sa,
                       int64_t sb, const float *c);

static void run(const tensor_iter *it, int64_t numel, float *o, const float *a, const float *b,
                kernel_fn *k, const float *c) {
  if (numel == 0) return;
  int nd = it->nd;
  int64_t n = it->shape[nd - 1], rows = numel / n, idx[TENSOR_MAX_DIMS] = { 0 };
  for (int64_t r = 0; r < rows; r++) {
    k(o, a, b, n, it->st[0][nd - 1], it->st[1][nd - 1], it->st[2][nd - 1], c);
    for (int d = nd - 2; d >= 0; d--) {
      o += it->st[0][d];
      a += it->st[1][d];
      b += it->st[2][d];
      if (++idx[d] < it->shape[d]) break;
      o -= it->st[0][d] * it->shape[d];
      a -= it->st[1][d] * it->shape[d];
      b -= it->st[2][d] * it->shape[d];
      idx[d] = 0;
    }
  }
}

#define BINARY_KERNEL(name, EXPR)                                                                  \
  TENSOR_SIMD static void name(float *o, const float *a, const float *b, int64_t n, int64_t so, int64_t sa,    \
                   int64_t sb, const float *c) {                                                   \
    (void)c;                                                                                       \
    if (so == 1 && sa == 1 && sb == 1 && o == a) {                                                 \
      /* in place (dy reused): as in UNARY_KERNEL */                                               \
      for (int64_t i = 0; i < n; i++) { float x = o[i], y = b[i]; o[i] = (EXPR); }                 \
    } else if (so == 1 && sa == 1 && sb == 1) {                                                    \
      for (int64_t i = 0; i < n; i++) { float x = a[i], y = b[i]; o[i] = (EXPR); }                 \
    } else if (so == 1 && sa == 1 && sb == 0) {                                                    \
      float y = b[0];                                                                              \
      for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); }                           \
    } else if (so == 1 && sa == 0 && sb == 1) {                                                    \
      float x = a[0];                                                                              \
      for (int64_t i = 0; i < n; i++) { float y = b[i]; o[i] = (EXPR); }                           \
    } else {                                                                                       \
      for (int64_t i = 0; i < n; i++) { float x = a[i * sa], y = b[i * sb]; o[i * so] = (EXPR); } \
    }                                                                                              \
  }

#define UNARY_KERNEL(name, EXPR)                                                                   \
  TENSOR_SIMD static void name(float *o, const float *a, const float *b, int64_t n, int64_t so, int64_t sa,    \
                   int64_t sb, const float *c) {                                                   \
    (void)b, (void)sb, (void)c;                                                                    \
    if (so == 1 && sa == 1 && o == a) {                                                            \
      /* in place: one pointer, or gcc's overlap check sends it to the scalar loop */              \
      for (int64_t i = 0; i < n; i++) { float x = o[i]; o[i] = (EXPR); }                           \
    } else if (so == 1 && sa == 1) {                                                               \
      for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); }                           \
    } else {                                                                                       \
      for (int64_t i = 0; i < n; i++) { float x = a[i * sa]; o[i * so] = (EXPR); }                \
    }                                                                                              \
  }

BINARY_KERNEL(k_add, x + y)
BINARY_KERNEL(k_sub, x - y)
BINARY_KERNEL(k_mul, x * y)
BINARY_KERNEL(k_div, x / y)
BINARY_KERNEL(k_axpby, x * c[0] + y * c[1])
/* x = dy, y = the forward's output */
BINARY_KERNEL(k_relu_grad, y > 0.0f ? x : 0.0f)
BINARY_KERNEL(k_tanh_grad, x * (1.0f - y * y))
BINARY_KERNEL(k_sigmoid_grad, x * y * (1.0f - y))
UNARY_KERNEL(k_neg, -x)
UNARY_KERNEL(k_exp, _tensor_expf(x))
UNARY_KERNEL(k_log, logf(x))
UNARY_KERNEL(k_tanh, _tensor_tanhf(x))
UNARY_KERNEL(k_relu, x > 0.0f ? x : 0.0f)
UNARY_KERNEL(k_sigmoid, _tensor_sigmoidf(x))
UNARY_KERNEL(k_scale, x * c[0])

/* ---- binary ----------------------------------------------------------------- */

/* The arguments checked already (b may be a scalar on the caller's stack). */
static tensor_status binary_out_run(const char *op, tensor *out, const tensor *a, const tensor *b, kernel_fn *k,
                                    const float *c) {
  int nd;
  int64_t shape[TENSOR_MAX_DIMS];
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR], b3[TENSOR_SHAPE_STR], b4[TENSOR_SHAPE_STR];
  if (!_tensor_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &nd, shape))
    return _tensor_err(TENSOR_ESHAPE, "%s: shapes %s and %s do not broadcast", op, _tensor_desc(a, b1),
                       _tensor_desc(b, b2));
  if (nd != out->ndim || memcmp(shape, out->shape, (size_t)nd * sizeof *shape) != 0)
    return _tensor_err(TENSOR_ESHAPE, "%s: out is %s, the result of %s and %s is %s", op, _tensor_desc(out, b3),
                       _tensor_desc(a, b1), _tensor_desc(b, b2), _tensor_shape_desc(TENSOR_F32, nd, shape, b4));
  int64_t sa[TENSOR_MAX_DIMS], sb[TENSOR_MAX_DIMS];
  _tensor_broadcast_strides(a, nd, shape, sa);
  _tensor_broadcast_strides(b, nd, shape, sb);
  const int64_t *st[3] = { out->strides, sa, sb };
  tensor_iter it;
  _tensor_iter_init(&it, nd, shape, 3, st);
  run(&it, out->numel, out->data, a->data, b->data, k, c);
  return TENSOR_OK;
}

static inline __attribute__((always_inline)) tensor_status binary_out_dev(const char *op, tensor *out, const tensor *a, const tensor *b,
                                                                 kernel_fn *k, const float *c, int dk);

/* Each distinct argument checked once (out is often a). */
/* always inlined, as the checks in them are: a check's finding starts at
 * the public function's caller, whatever the optimisation level */
static inline __attribute__((always_inline)) tensor_status binary_out(const char *op, tensor *out, const tensor *a, const tensor *b,
                                                              kernel_fn *k, const float *c) {
  return binary_out_dev(op, out, a, b, k, c, -1);
}

/* dk: the device op (_TD_*) when out, a or b is on a device; -1: none */
static inline __attribute__((always_inline)) tensor_status binary_out_dev(const char *op, tensor *out, const tensor *a, const tensor *b,
                                                                 kernel_fn *k, const float *c, int dk) {
  bool bad;
  if (_tensor_dev_dispatch(op, out, a, &bad) || (!bad && _tensor_dev_dispatch(op, b, NULL, &bad))) {
    if (dk < 0) {
      const tensor *d = _tensor_on_device(out->storage) ? out : _tensor_on_device(a->storage) ? a : b;
      _tensor_arg_device(op, d == out ? "out" : d == a ? "a" : "b", d);
      return TENSOR_EINVAL;
    }
    return _tensor_devops->binary_out(op, dk, out, a, b);
  }
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32(op, "out", out) || (a != out && !_tensor_arg_f32(op, "a", a)) ||
      (b != a && b != out && !_tensor_arg_f32(op, "b", b)))
    return tensor_last_status();
  return binary_out_run(op, out, a, b, k, c);
}

/* b_local: b is a scalar on the caller's stack, not the ledger's. */
static tensor *binary_run(const char *op, const tensor *a, const tensor *b, kernel_fn *k, const float *c,
                          bool b_local) {
  if (!_tensor_arg_f32(op, "a", a) || (!b_local && b != a && !_tensor_arg_f32(op, "b", b))) return NULL;
  int nd;
  int64_t shape[TENSOR_MAX_DIMS];
  if (!_tensor_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &nd, shape)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "%s: shapes %s and %s do not broadcast", op, _tensor_desc(a, b1),
                _tensor_desc(b, b2));
    return NULL;
  }
  tensor *out = _tensor_out(op, TENSOR_F32, nd, shape);
  if (out && binary_out_run(op, out, a, b, k, c) != TENSOR_OK) {
    tensor_free(out);
    return NULL;
  }
  return out;
}

/* dk: the device op (_TD_*) when a or b is a device tensor */
static inline __attribute__((always_inline)) tensor *binary(const char *op, const tensor *a, const tensor *b, kernel_fn *k,
                                                     const float *c, int dk) {
  bool bad;
  if (_tensor_dev_dispatch(op, a, b, &bad)) return _tensor_devops->binary(op, dk, a, b);
  if (bad) return NULL;
  return binary_run(op, a, b, k, c, false);
}

/* a op s on a device, when a is there (*done); dk: _TD_ADD_SCALAR or _TD_MUL_SCALAR */
static inline __attribute__((always_inline)) tensor *dev_scalar(const char *op, const tensor *a, int dk, float s, bool *done) {
  bool bad;
  *done = true;
  if (_tensor_dev_dispatch(op, a, NULL, &bad)) return _tensor_devops->unary(op, dk, a, s);
  if (bad) return NULL;
  *done = false;
  return NULL;
}

/* A scalar as a 0-d tensor on the stack (no header, no storage: never
 * freed, never seen by the ledger). */
#define SCALAR(name, v) \
  float name##_v = (v); \
  tensor name = { .data = &name##_v, .ndim = 0, .numel = 1, .dtype = TENSOR_F32 }

tensor *tensor_add(const tensor *a, const tensor *b) { return binary("tensor_add", a, b, k_add, NULL, _TD_ADD); }
tensor *tensor_sub(const tensor *a, const tensor *b) { return binary("tensor_sub", a, b, k_sub, NULL, _TD_SUB); }
tensor *tensor_mul(const tensor *a, const tensor *b) { return binary("tensor_mul", a, b, k_mul, NULL, _TD_MUL); }
tensor *tensor_div(const tensor *a, const tensor *b) { return binary("tensor_div", a, b, k_div, NULL, _TD_DIV); }
tensor *tensor_add_scalar(const tensor *a, float s) {
  bool done;
  tensor *d = dev_scalar("tensor_add_scalar", a, _TD_ADD_SCALAR, s, &done);
  if (done) return d;
  SCALAR(x, s);
  return binary_run("tensor_add_scalar", a, &x, k_add, NULL, true);
}
tensor *tensor_sub_scalar(const tensor *a, float s) {
  bool done;
  tensor *d = dev_scalar("tensor_sub_scalar", a, _TD_ADD_SCALAR, -s, &done);
  if (done) return d;
  SCALAR(x, s);
  return binary_run("tensor_sub_scalar", a, &x, k_sub, NULL, true);
}
tensor *tensor_mul_scalar(const tensor *a, float s) {
  bool done;
  tensor *d = dev_scalar("tensor_mul_scalar", a, _TD_MUL_SCALAR, s, &done);
  if (done) return d;
  SCALAR(x, s);
  return binary_run("tensor_mul_scalar", a, &x, k_mul, NULL, true);
}
tensor *tensor_div_scalar(const tensor *a, float s) {
  SCALAR(x, s);
  return binary_run("tensor_div_scalar", a, &x, k_div, NULL, true);
}

tensor_status tensor_add_out(tensor *o, const tensor *a, const tensor *b) {
  return binary_out("tensor_add_out", o, a, b, k_add, NULL);
}
tensor_status tensor_sub_out(tensor *o, const tensor *a, const tensor *b) {
  return binary_out("tensor_sub_out", o, a, b, k_sub, NULL);
}
tensor_status tensor_mul_out(tensor *o, const tensor *a, const tensor *b) {
  return binary_out("tensor_mul_out", o, a, b, k_mul, NULL);
}
tensor_status tensor_div_out(tensor *o, const tensor *a, const tensor *b) {
  return binary_out("tensor_div_out", o, a, b, k_div, NULL);
}

#define GRAD_API(op, dk)                                                                        \
  tensor *tensor_##op##_grad(const tensor *dy, const tensor *y) {                              \
    return binary("tensor_" #op "_grad", dy, y, k_##op##_grad, NULL, dk);                      \
  }                                                                                             \
  tensor_status tensor_##op##_grad_out(tensor *out, const tensor *dy, const tensor *y) {        \
    return binary_out_dev("tensor_" #op "_grad_out", out, dy, y, k_##op##_grad, NULL, dk);    \
  }
GRAD_API(relu, _TD_RELU_GRAD)
GRAD_API(tanh, _TD_TANH_GRAD)
GRAD_API(sigmoid, _TD_SIGMOID_GRAD)

tensor_status tensor_axpby_out(tensor *out, const tensor *a, float s, const tensor *b, float t) {
  float c[2] = { s, t };
  if (b == NULL) return binary_out("tensor_axpby_out", out, a, a, k_axpby, (float[2]){ s, 0.0f });
  return binary_out("tensor_axpby_out", out, a, b, k_axpby, c);
}

tensor_status tensor_add_(tensor *a, const tensor *b) {
  return binary_out_dev("tensor_add_", a, a, b, k_add, NULL, _TD_ADD);
}
tensor_status tensor_sub_(tensor *a, const tensor *b) {
  return binary_out_dev("tensor_sub_", a, a, b, k_sub, NULL, _TD_SUB);
}
tensor_status tensor_mul_(tensor *a, const tensor *b) {
  return binary_out_dev("tensor_mul_", a, a, b, k_mul, NULL, _TD_MUL);
}
tensor_status tensor_div_(tensor *a, const tensor *b) { return binary_out("tensor_div_", a, a, b, k_div, NULL); }
tensor_status tensor_add_scalar_(tensor *a, float s) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_add_scalar_", a, NULL, &bad))
    return _tensor_devops->scalar_("tensor_add_scalar_", _TD_ADD_SCALAR, a, s);
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32("tensor_add_scalar_", "a", a)) return tensor_last_status();
  SCALAR(x, s);
  return binary_out_run("tensor_add_scalar_", a, a, &x, k_add, NULL);
}
tensor_status tensor_mul_scalar_(tensor *a, float s) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_mul_scalar_", a, NULL, &bad))
    return _tensor_devops->scalar_("tensor_mul_scalar_", _TD_MUL_SCALAR, a, s);
  if (bad) return tensor_last_status();
  return binary_out("tensor_mul_scalar_", a, a, a, k_scale, &s);
}

/* ---- unary ------------------------------------------------------------------- */

static tensor_status unary_out(const char *op, tensor *out, const tensor *a, kernel_fn *k) {
  if (!_tensor_arg_f32(op, "out", out) || (a != out && !_tensor_arg_f32(op, "a", a))) return tensor_last_status();
  if (!_tensor_same_shape(out, a)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    return _tensor_err(TENSOR_ESHAPE, "%s: out is %s, a is %s", op, _tensor_desc(out, b1), _tensor_desc(a, b2));
  }
  const int64_t *st[3] = { out->strides, a->strides, a->strides };
  tensor_iter it;
  _tensor_iter_init(&it, a->ndim, a->shape, 2, st);
  run(&it, a->numel, out->data, a->data, a->data, k, NULL);
  return TENSOR_OK;
}

static inline __attribute__((always_inline)) tensor *unary(const char *op, const tensor *a, kernel_fn *k, int dk) {
  bool bad;
  if (_tensor_dev_dispatch(op, a, NULL, &bad)) return _tensor_devops->unary(op, dk, a, 0.0f);
  if (bad) return NULL;
  if (!_tensor_arg_f32(op, "a", a)) return NULL;
  tensor *out = _tensor_out(op, TENSOR_F32, a->ndim, a->shape);
  if (out) unary_out(op, out, a, k);
  return out;
}

#define UNARY_API(op, k, dk)                                                                    \
  tensor *tensor_##op(const tensor *a) { return unary("tensor_" #op, a, k, dk); }              \
  tensor_status tensor_##op##_out(tensor *out, const tensor *a) {                              \
    return unary_out("tensor_" #op "_out", out, a, k);                                         \
  }
UNARY_API(neg, k_neg, _TD_NEG)
UNARY_API(exp, k_exp, _TD_EXP)
UNARY_API(log, k_log, _TD_LOG)
UNARY_API(tanh, k_tanh, _TD_TANH)
UNARY_API(relu, k_relu, _TD_RELU)
UNARY_API(sigmoid, k_sigmoid, _TD_SIGMOID)

tensor_status tensor_relu_(tensor *a) { return unary_out("tensor_relu_", a, a, k_relu); }
tensor_status tensor_exp_(tensor *a) { return unary_out("tensor_exp_", a, a, k_exp); }
tensor_status tensor_tanh_(tensor *a) { return unary_out("tensor_tanh_", a, a, k_tanh); }
tensor_status tensor_sigmoid_(tensor *a) { return unary_out("tensor_sigmoid_", a, a, k_sigmoid); }

/* ---- reductions ------------------------------------------------------------ */

enum { R_SUM, R_MEAN, R_MAX, R_ARGMAX };

/* The input as [outer, n, inner] (contiguous), reduced over n. */
TENSOR_SIMD static void reduce_rows(int kind, const float *a, int64_t outer, int64_t n, int64_t inner, void *outp) {
  float *o = outp;
  int32_t *oi = outp;
  for (int64_t p = 0; p < outer; p++) {
    const float *base = a + p * n * inner;
    if (inner == 1) {
      if (kind == R_SUM || kind == R_MEAN) {
        double s = 0;
        for (int64_t k = 0; k < n; k++) s += base[k];
        o[p] = (float)(kind == R_MEAN ? s / (double)n : s);
      } else {
        float m = base[0];
        int32_t mi = 0;
        for (int64_t k = 1; k < n; k++)
          if (base[k] > m) m = base[k], mi = (int32_t)k;
        if (kind == R_MAX) o[p] = m;
        else oi[p] = mi;
      }
      continue;
    }
    float *op = o + p * inner;
    int32_t *oip = oi + p * inner;
    if (kind == R_SUM || kind == R_MEAN) {
      memcpy(op, base, (size_t)inner * 4);
      for (int64_t k = 1; k < n; k++) {
        const float *row = base + k * inner;
        for (int64_t j = 0; j < inner; j++) op[j] += row[j];
      }
      if (kind == R_MEAN) {
        float s = 1.0f / (float)n;
        for (int64_t j = 0; j < inner; j++) op[j] *= s;
      }
    } else if (kind == R_MAX) {
      memcpy(op, base, (size_t)inner * 4);
      for (int64_t k = 1; k < n; k++) {
        const float *row = base + k * inner;
        for (int64_t j = 0; j < inner; j++) op[j] = row[j] > op[j] ? row[j] : op[j];
      }
    } else {
      for (int64_t j = 0; j < inner; j++) {
        float m = base[j];
        int32_t mi = 0;
        for (int64_t k = 1; k < n; k++)
          if (base[k * inner + j] > m) m = base[k * inner + j], mi = (int32_t)k;
        oip[j] = mi;
      }
    }
  }
}

static tensor *reduce(const char *op, int kind, const tensor *a, int axis, int keepdim) {
  if (!_tensor_arg_f32(op, "a", a)) return NULL;
  char b[TENSOR_SHAPE_STR];
  int ax = axis == TENSOR_ALL ? TENSOR_ALL : _tensor_axis(axis, a->ndim);
  if (ax != TENSOR_ALL && (ax < 0 || ax >= a->ndim)) {
    _tensor_err(TENSOR_ERANGE, "%s: axis %d out of range for %s", op, axis, _tensor_desc(a, b));
    return NULL;
  }
  int64_t n = ax == TENSOR_ALL ? a->numel : a->shape[ax];
  if (n == 0 && (kind == R_MAX || kind == R_ARGMAX)) {
    _tensor_err(TENSOR_ESHAPE, "%s: an empty axis of %s has no maximum", op, _tensor_desc(a, b));
    return NULL;
  }
  int64_t shape[TENSOR_MAX_DIMS], outer = 1, inner = 1;
  int nd = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (ax == TENSOR_ALL || d == ax) {
      if (keepdim) shape[nd++] = 1;
    } else {
      shape[nd++] = a->shape[d];
      if (d < ax) outer *= a->shape[d];
      else inner *= a->shape[d];
    }
  }
  if (ax == TENSOR_ALL) outer = inner = 1;
  tensor *out = _tensor_out(op, kind == R_ARGMAX ? TENSOR_I32 : TENSOR_F32, nd, shape);
  if (out == NULL) return NULL;
  if (n == 0) {
    memset(out->data, 0, (size_t)out->numel * 4);
    if (kind == R_MEAN) tensor_fill_(out, NAN);
    return out;
  }
  tensor *c = _tensor_borrow(a);
  if (c == NULL) {
    tensor_free(out);
    return NULL;
  }
  reduce_rows(kind, c->data, outer, n, inner, out->data);
  _tensor_unborrow(a, c);
  return out;
}

tensor *tensor_sum(const tensor *a, int axis, int keepdim) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_sum", a, NULL, &bad)) return _tensor_devops->sum("tensor_sum", a, axis, keepdim);
  if (bad) return NULL;
  return reduce("tensor_sum", R_SUM, a, axis, keepdim);
}

/* Sums of up to SUM_ADD_STACK floats are formed on the stack; larger ones
 * in a tensor, as tensor_sum + tensor_add_ would. */
#define SUM_ADD_STACK 2048

tensor_status tensor_sum_add_(tensor *acc, const tensor *a, int axis) {
  const char *op = "tensor_sum_add_";
  bool bad;
  if (_tensor_dev_dispatch(op, acc, a, &bad)) return _tensor_devops->sum_add(op, acc, a, axis);
  if (bad) return tensor_last_status();
  if (!_tensor_arg_f32(op, "acc", acc) || !_tensor_arg_f32(op, "a", a)) return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  int ax = _tensor_axis(axis, a->ndim);
  if (axis == TENSOR_ALL || ax < 0 || ax >= a->ndim)
    return _tensor_err(TENSOR_ERANGE, "%s: axis %d out of range for %s", op, axis, _tensor_desc(a, b1));
  int64_t outer = 1, inner = 1, n = a->shape[ax];
  bool fits = acc->ndim == a->ndim - 1;
  for (int d = 0, k = 0; d < a->ndim; d++) {
    if (d == ax) continue;
    if (d < ax) outer *= a->shape[d];
    else inner *= a->shape[d];
    fits = fits && acc->shape[k++] == a->shape[d];
  }
  if (!fits || !_tensor_contig(acc))
    return _tensor_err(TENSOR_ESHAPE, "%s: acc %s is not a contiguous sum of %s over axis %d", op,
                       _tensor_desc(acc, b1), _tensor_desc(a, b2), axis);
  if (acc->numel > SUM_ADD_STACK || n == 0) {
    tensor *s = tensor_sum(a, ax, 0);
    tensor_status st = s ? tensor_add_(acc, s) : tensor_last_status();
    tensor_free(s);
    return st;
  }
  tensor *c = _tensor_borrow(a);
  if (c == NULL) return tensor_last_status();
  float sum[SUM_ADD_STACK], *o = acc->data;
  reduce_rows(R_SUM, c->data, outer, n, inner, sum);
  _tensor_unborrow(a, c);
  for (int64_t i = 0; i < acc->numel; i++) o[i] += sum[i];
  return TENSOR_OK;
}
tensor *tensor_mean(const tensor *a, int axis, int keepdim) { return reduce("tensor_mean", R_MEAN, a, axis, keepdim); }
tensor *tensor_max(const tensor *a, int axis, int keepdim) { return reduce("tensor_max", R_MAX, a, axis, keepdim); }
tensor *tensor_argmax(const tensor *a, int axis, int keepdim) {
  bool bad;
  if (_tensor_dev_dispatch("tensor_argmax", a, NULL, &bad)) return _tensor_devops->argmax("tensor_argmax", a, axis, keepdim);
  if (bad) return NULL;
  return reduce("tensor_argmax", R_ARGMAX, a, axis, keepdim);
}

tensor *tensor_sum_to(const tensor *a, int ndim, const int64_t *shape) {
  const char *op = "tensor_sum_to";
  if (!_tensor_arg_f32(op, "a", a) || _tensor_check_shape(op, ndim, shape) < 0) return NULL;
  int nd;
  int64_t bs[TENSOR_MAX_DIMS];
  if (ndim > a->ndim || !_tensor_broadcast_shape(a->ndim, a->shape, ndim, shape, &nd, bs) ||
      memcmp(bs, a->shape, (size_t)nd * sizeof *bs) != 0) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "%s: %s does not broadcast from %s", op, _tensor_desc(a, b1),
                _tensor_shape_desc(TENSOR_F32, ndim, shape, b2));
    return NULL;
  }
  /* sum the axes a has beyond shape (leading) and those shape has as 1,
   * innermost first so that the axis numbers stay valid */
  tensor *cur = (tensor *)a;
  int lead = a->ndim - ndim;
  for (int d = a->ndim - 1; d >= 0; d--) {
    bool leading = d < lead;
    if (!leading && !(shape[d - lead] == 1 && a->shape[d] != 1)) continue;
    tensor *next = tensor_sum(cur, d, !leading);
    if (cur != a) tensor_free(cur);
    if (next == NULL) return NULL;
    cur = next;
  }
  if (cur == a) return tensor_clone(a);
  tensor *v = tensor_view(cur, ndim, shape);   /* the leading axes summed away, keepdims as in shape */
  tensor_free(cur);
  return v;
}
