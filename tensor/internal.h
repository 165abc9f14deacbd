/* internal.h - what the files of tensor/ share; not part of the API. */
#ifndef TAGALLOC_TENSOR_INTERNAL_H
#define TAGALLOC_TENSOR_INTERNAL_H

#include "tensor.h"
#include "tagalloc.h"

#include <stdbool.h>

/* A storage is one ledger block: this header, padded to STORAGE_HDR bytes,
 * then the data (64-byte aligned).  Its ledger refcount is the number of
 * tensor headers on it (0 while kept by a pool).
 *
 *   block: [ tensor_storage | pad ][ data: nbytes ............ ]
 *          ^ ta_hold target, ta_ref object    ^ s->data            */
struct tensor_storage {
  void   *data;
  size_t  nbytes;
  tensor_pool *pool;               /* where it goes back to, or NULL (the heap, or a device) */
  struct pool_key *key;            /* its pool key */
  /* A storage on a device is never kept by a tensor pool (pool is NULL), so
   * its pool links are free: they hold the device instead.  A heap storage
   * has them zeroed (_tensor_storage_new), so "no pool and a device" tells a
   * device storage with no flag and no byte more. */
  union {
    struct {
      tensor_storage *kprev, *knext;   /* the key's stack while kept (knext: below; kprev: above, held "pool.above") */
      tensor_storage *aprev, *anext;   /* the pool's keep order while kept (aprev: older) */
    };
    struct {
      gpu_pool *device;                /* its device: data is a "gpu.buffer" of this pool, held "device" */
      void *dev_unused[3];
    };
  };
};
#define STORAGE_HDR 64
_Static_assert(sizeof(struct tensor_storage) <= STORAGE_HDR, "storage header fits");

/* Is s device memory?  (s live, checked.) */
static inline bool _tensor_on_device(const tensor_storage *s) { return s->pool == NULL && s->device != NULL; }

/* ---- devices (device.c) ----
 * The device ops, set by the first tensor_to onto a device: the tensor
 * library itself needs no gpu/ code until a program makes a device tensor.
 * kind: one of _TD_*.  s: the scalar of the scalar ops. */
enum {
  _TD_ADD, _TD_SUB, _TD_MUL, _TD_DIV,                          /* binary */
  _TD_RELU_GRAD, _TD_TANH_GRAD, _TD_SIGMOID_GRAD,              /* binary: (dy, y) */
  _TD_ADD_SCALAR, _TD_MUL_SCALAR,                              /* a op s */
  _TD_NEG, _TD_EXP, _TD_LOG, _TD_TANH, _TD_RELU, _TD_SIGMOID,  /* unary */
};
struct _tensor_devops {
  tensor *(*binary)(const char *op, int kind, const tensor *a, const tensor *b);
  tensor_status (*binary_out)(const char *op, int kind, tensor *out, const tensor *a, const tensor *b);
  tensor *(*unary)(const char *op, int kind, const tensor *a, float s);
  /* a op= s in place (_TD_ADD_SCALAR, _TD_MUL_SCALAR); a contiguous */
  tensor_status (*scalar_)(const char *op, int kind, tensor *a, float s);
  tensor *(*matmul)(const char *op, const tensor *a, const tensor *b);
  tensor *(*sum)(const char *op, const tensor *a, int axis, int keepdim);
  tensor *(*clone)(const char *op, const tensor *a);
  tensor_status (*fill)(const char *op, tensor *a, float v);
  /* dst = src, same dtype and shape, one or both on a device (the same
   * device when both); dst contiguous */
  tensor_status (*copy)(const char *op, tensor *dst, const tensor *src);
  void (*release)(tensor_storage *s);   /* the storage's last reference went: its buffer back to the pool */
  void (*name)(gpu_pool *device, char *buf, size_t len);   /* "host#0x55..": the backend and the pool */
  /* the ops of linalg.c, nn.c and optim.c (device_nn.c; device.h says what each takes) */
  tensor_status (*gemm)(const char *op, tensor *out, const tensor *a, int ta, const tensor *b, int tb, float alpha,
                        float beta);
  tensor *(*matmul_t)(const char *op, const tensor *a, int ta, const tensor *b, int tb);
  tensor_status (*sum_add)(const char *op, tensor *acc, const tensor *a, int axis);
  tensor *(*argmax)(const char *op, const tensor *a, int axis, int keepdim);
  tensor_status (*item)(const char *op, const tensor *t, float *v);
  tensor *(*conv2d)(const char *op, const tensor *x, const tensor *w, const tensor *bias, int stride, int pad);
  /* which: 0 dL/dx (other: w, shape: x's), 1 dL/dw (other: x, shape: w's), 2 dL/dbias */
  tensor *(*conv2d_grad)(const char *op, int which, const tensor *dy, const tensor *other, int ndim,
                         const int64_t *shape, int stride, int pad);
  tensor *(*pool)(const char *op, bool max, const tensor *x, int k, int stride, tensor **argmax);
  /* argmax NULL: average pooling's */
  tensor *(*pool_grad)(const char *op, const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                       const int64_t *x_shape);
  tensor *(*softmax)(const char *op, const tensor *x, int axis);
  tensor *(*softmax_grad)(const char *op, const tensor *dy, const tensor *y, int axis);
  tensor *(*log_softmax)(const char *op, const tensor *x, int axis);
  tensor *(*log_softmax_grad)(const char *op, const tensor *dy, const tensor *y, int axis);
  tensor *(*xent)(const char *op, const tensor *logits, const tensor *labels, bool grad);
  tensor *(*embedding)(const char *op, const tensor *weight, const tensor *indices);
  tensor_status (*embedding_grad)(const char *op, tensor *dweight, const tensor *dout, const tensor *indices);
  tensor_status (*sgd)(const char *op, tensor *p, const tensor *g, tensor *buf, float lr, float momentum,
                       float weight_decay, int first);
  tensor_status (*adam)(const char *op, tensor *p, const tensor *g, tensor *m, tensor *v, float lr, float beta1,
                        float beta2, float eps, float weight_decay, int64_t t);
};
extern const struct _tensor_devops *_tensor_devops;
/* The error for a device tensor given to an op that runs on host tensors
 * only, or for inputs on different devices (no finding: a plain error). */
bool _tensor_arg_device(const char *op, const char *name, const tensor *t);
tensor_status _tensor_dev_mixed(const char *op, const tensor *a, const tensor *b);

extern ta_tag _tensor_tag_storage, _tensor_tag_header, _tensor_tag_pool, _tensor_tag_meta, _tensor_tag_scratch;
void _tensor_init(void);

/* ---- errors (core.c) ---- */
tensor_status _tensor_err(tensor_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "f32[2,3]" of t (or "NULL"); buf of at least TENSOR_SHAPE_STR bytes */
#define TENSOR_SHAPE_STR 96
const char *_tensor_desc(const tensor *t, char *buf);
const char *_tensor_shape_desc(tensor_dtype dt, int ndim, const int64_t *shape, char *buf);
/* An error for a NULL input (returns false): the chain of calls failing,
 * unless no error is pending. */
bool _tensor_arg_null(const char *op, const char *name);
/* A tensor the ledger says is not live: the finding is made, this is the
 * error (TENSOR_EINVAL).  Returns false. */
bool _tensor_arg_dead(const char *op, const char *name, const tensor *t);
bool _tensor_arg_dtype(const char *op, const char *name, const tensor *t);

/* Every public entry checks its tensor arguments with the ledger before it
 * reads them: the header a live "tensor.header" block, its storage a live
 * "tensor.storage" or "tensor.pool" block.  Two probes of the ledger's live
 * table, no stack taken, when they are good; a freed header, a storage
 * released once too often (ref.underflow) or a pointer to nothing live is a
 * finding at the caller's line (inlined here, so the check's caller is the
 * public function and the finding starts one frame out) and an error. */
/* TAGALLOC_NO_ARG_CHECKS builds the library without these checks: only
 * the baseline of the benchmark of their cost (bench/autograd/checks.py). */
#ifdef TAGALLOC_NO_ARG_CHECKS
#define _tensor_check_block(p, tag, alt, flags, what) ((void)(p), 1)
#else
#define _tensor_check_block ta_check_block
#endif
static inline __attribute__((always_inline)) bool _tensor_live_any(const char *op, const char *name,
                                                                   const tensor *t) {
  if (!_tensor_check_block(t, _tensor_tag_header, _tensor_tag_header, TA_CHECK_CALLER, op) ||
      !_tensor_check_block(t->storage, _tensor_tag_storage, _tensor_tag_pool, TA_CHECK_CALLER | TA_CHECK_REF, op))
    return _tensor_arg_dead(op, name, t);
  return true;
}
/* _tensor_live_any, and host memory: the ops that read or write elements on
 * the CPU take their tensors through this. */
#define _tensor_live _tensor_live_host
static inline __attribute__((always_inline)) bool _tensor_live_host(const char *op, const char *name,
                                                                    const tensor *t) {
  if (!_tensor_live_any(op, name, t)) return false;
  return __builtin_expect(!_tensor_on_device(t->storage), 1) || _tensor_arg_device(op, name, t);
}
/* NULL (an error unless one is pending), then the ledger's check. */
static inline __attribute__((always_inline)) bool _tensor_arg(const char *op, const char *name,
                                                              const tensor *t) {
  if (t == NULL) return _tensor_arg_null(op, name);
  return _tensor_live(op, name, t);
}
/* The same for the functions that never read elements on the CPU (views,
 * shapes, counts) and the ops that dispatch on the device: any device. */
static inline __attribute__((always_inline)) bool _tensor_arg_any(const char *op, const char *name,
                                                                  const tensor *t) {
  if (t == NULL) return _tensor_arg_null(op, name);
  return _tensor_live_any(op, name, t);
}
static inline __attribute__((always_inline)) bool _tensor_arg_any_f32(const char *op, const char *name,
                                                                      const tensor *t) {
  if (!_tensor_arg_any(op, name, t)) return false;
  return t->dtype == TENSOR_F32 || _tensor_arg_dtype(op, name, t);
}
/* Does an op on a and b (b may be NULL or a) run on a device?  Only asked
 * once a device tensor exists (_tensor_devops set): no cost otherwise.
 * Checks a and b as _tensor_arg_any does; false with an error pending when
 * one is bad, so *bad says which. */
static inline __attribute__((always_inline)) bool _tensor_dev_dispatch(const char *op, const tensor *a,
                                                                       const tensor *b, bool *bad) {
  *bad = false;
  if (__builtin_expect(_tensor_devops == NULL, 1) || a == NULL) return false;
  if (!_tensor_arg_any(op, "a", a) || (b && b != a && !_tensor_arg_any(op, "b", b))) {
    *bad = true;
    return false;
  }
  return _tensor_on_device(a->storage) || (b && _tensor_on_device(b->storage));
}

static inline __attribute__((always_inline)) bool _tensor_arg_f32(const char *op, const char *name,
                                                                  const tensor *t) {
  if (!_tensor_arg(op, name, t)) return false;
  return t->dtype == TENSOR_F32 || _tensor_arg_dtype(op, name, t);
}
/* Validates ndim and shape, returns numel or -1 (error set). */
int64_t _tensor_check_shape(const char *op, int ndim, const int64_t *shape);

/* ---- seeded bugs (core.c): is fault f on?  One load and a compare. ---- */
extern int _tensor_fault_id;
static inline bool _tensor_fault(tensor_fault f) {
  if (__builtin_expect(_tensor_fault_id < 0, 0)) tensor_fault_get();
  return __builtin_expect(_tensor_fault_id == (int)f, 0);
}

/* ---- making (core.c) ---- */
tensor_storage *_tensor_storage_new(ta_tag tag, size_t nbytes);
/* A new header on s.  adopt: the caller's reference becomes the header's
 * (a fresh storage); else the header acquires one.  stack: where the
 * acquisition and the header's hold on s are recorded (ta_stack_here of a
 * caller that records more events of the same call with it); 0: one stack
 * taken here for both. */
tensor *_tensor_header(tensor_storage *s, bool adopt, tensor_dtype dt, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t offset, uint32_t stack);
/* A contiguous result: from the pool in use on this thread, or the heap. */
tensor *_tensor_out(const char *op, tensor_dtype dt, int ndim, const int64_t *shape);
void _tensor_contig_strides(int ndim, const int64_t *shape, int64_t *strides);

/* ---- pool (pool.c) ---- */
/* Keeps s (count 0) in its pool; returns false when the pool is closed (the
 * caller frees s).  stack: where the pool's new hold on s is recorded (the
 * caller's, taken for its release of s). */
bool _tensor_pool_put(tensor_storage *s, uint32_t stack);
extern __thread tensor_pool *_tensor_pool_current;

/* An op's workspace of n floats (im2col columns, packed weights): the pool
 * in use on this thread keeps one buffer for that, a "tensor.scratch" block
 * it holds ("scratch") and lends to one op at a time, grown when an op needs
 * more; so a training step's convolutions make no block for it.  With no
 * pool in use, or while its buffer is lent, a tensor from _tensor_out.  The
 * contents are left as they were.  Give back on the thread that took it. */
typedef struct {
  float *data;
  tensor *tmp;          /* the tensor made instead, or NULL */
  tensor_pool *pool;    /* the pool that lent its buffer, or NULL */
} _tensor_scratch;
bool _tensor_scratch_take(_tensor_scratch *s, const char *op, int64_t n);
void _tensor_scratch_give(_tensor_scratch *s);   /* a zeroed s: nothing */

/* ---- scopes (scope.c) ---- */
void _tensor_scope_adopt(tensor *t);
void _tensor_scope_forget(tensor *t);

/* ---- copying (view.c) ---- */
/* t itself when contiguous (borrowed, never freed), else a contiguous copy;
 * _tensor_unborrow(t, c) frees c only when it is a copy.  Ops read their
 * inputs through these, so a contiguous input costs the ledger nothing. */
tensor *_tensor_borrow(const tensor *t);
/* tensor_clone of a checked t, or of a descriptor on the caller's stack. */
tensor *_tensor_clone(const tensor *t);
/* tensor_is_contiguous, tensor_same_shape, tensor_free: unchecked. */
int _tensor_contig(const tensor *t);
int _tensor_same_shape(const tensor *a, const tensor *b);
bool _tensor_grad_shapes(const char *op, const tensor *dy, const tensor *y);   /* same shape, or ESHAPE naming both */
void _tensor_free(tensor *t);
static inline void _tensor_unborrow(const tensor *t, tensor *c) {
  if (c != t) tensor_free(c);
}
/* dst = src, elementwise, same shape (strides free), 4-byte elements. */
void _tensor_copy_strided(tensor *dst, const tensor *src);

/* ---- threads (core.c) ---- */
#define TENSOR_MAX_THREADS 16
int _tensor_threads(void);   /* tensor_set_threads, 1 by default */
/* Runs fn over [0, n) split into up to parts contiguous ranges, one per
 * thread (the caller's included); returns the number of parts used.  fn
 * must not make or free tensors (scopes are per thread). */
int _tensor_parallel(int64_t n, int parts, void (*fn)(void *ctx, int64_t lo, int64_t hi, int part), void *ctx);

/* ---- strided iteration (ops.c) ----
 * Up to 3 operands over one shape: dims of size 1 dropped, adjacent dims
 * merged where every operand allows, innermost last. */
typedef struct {
  int nd;
  int64_t shape[TENSOR_MAX_DIMS];
  int64_t st[3][TENSOR_MAX_DIMS];
} tensor_iter;
void _tensor_iter_init(tensor_iter *it, int ndim, const int64_t *shape, int nops,
                       const int64_t *const strides[3]);
/* Broadcast shapes of a and b into out; false if they do not broadcast. */
bool _tensor_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout,
                             int64_t *out);
/* strides of t aligned to (ndim, shape) with 0 on broadcast axes. */
void _tensor_broadcast_strides(const tensor *t, int ndim, const int64_t *shape, int64_t *strides);

static inline int _tensor_axis(int axis, int ndim) { return axis < 0 ? axis + ndim : axis; }

/* ---- direct convolution of stride 1 (conv_direct.c) ----
 * A plan for images [C][H][W] padded by (ph, pw), O output channels,
 * [KH][KW] taps; out [O][OH][OW]. */
typedef struct {
  int64_t C, H, W, O, KH, KW, ph, pw, Hp, Wp, OH, OW, T, L, ldw, plane, Opad;
  int vl;
} _tensor_dconv;
/* whether the direct kernels serve this size (else im2col + sgemm); Hp, Wp:
 * the padded input of the plan */
bool _tensor_dconv_fits(int64_t C, int64_t O, int64_t KH, int64_t KW, int64_t Hp, int64_t Wp);
void _tensor_dconv_plan(_tensor_dconv *d, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
                        int64_t ph, int64_t pw);
/* floats of scratch per thread */
int64_t _tensor_dconv_fwd_scratch(const _tensor_dconv *d);
int64_t _tensor_dconv_dw_scratch(const _tensor_dconv *d);
/* The weights in the kernels' order (O * T floats).  grad_input: w is the
 * forward weight [C_fwd = d->O][O_fwd = d->C][KH][KW], transposed and flipped. */
void _tensor_dconv_pack(const _tensor_dconv *d, const float *w, bool grad_input, float *wt);
/* out[n] = bias + conv(x[n]) for images [n0, n1); bias may be NULL */
void _tensor_dconv_fwd(const _tensor_dconv *d, const float *x, int64_t n0, int64_t n1, const float *wt,
                       const float *bias, float *out, float *scratch);
/* acc [T][Opad] = sum over images [n0, n1) of dL/dw, tap-major */
void _tensor_dconv_dw(const _tensor_dconv *d, const float *x, const float *dy, int64_t n0, int64_t n1, float *acc,
                      float *scratch);

#endif
