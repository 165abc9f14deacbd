/* tensor.h - tensors on the ledger: refcounted storage, zero-copy views, ops
 * on OpenBLAS, scopes and a tensor pool.
 *
 *   #include "tensor.h"              // link build/libtagalloc-tensor.a, the ledger, -lopenblas
 *
 *   tensor_scope_begin();
 *   tensor *x = tensor_from_f32(pixels, TS(64, 1, 28, 28));   // copies pixels
 *   tensor *w = tensor_randn(TS(6, 1, 5, 5), 0.1f, 42);
 *   tensor *y = tensor_relu(tensor_conv2d(x, w, NULL, 1, 2)); // [64, 6, 28, 28]
 *   tensor *row = tensor_select(y, 0, 3);                     // a view: no data copied
 *   tensor *p = tensor_softmax(tensor_reshape(y, TS(64, -1)), -1);
 *   tensor_escape(p);                   // p outlives the scope
 *   tensor_scope_end();                 // x, w, y, row and the temporaries are freed
 *   ...
 *   tensor_free(p);
 *
 * A tensor is a header (tag "tensor.header") that views an offset into a
 * refcounted storage (tag "tensor.storage", or "tensor.pool" when it came
 * from a pool).  Every storage refcount change is a ledger transition
 * (ta_ref_*), and every header declares ta_hold(header, "storage", storage),
 * so the ledger's report names a leaked or over-released storage exactly.
 * The ledger's bookkeeping is per tensor, never per element.
 *
 * Ownership: every function that returns a tensor* returns a new header the
 * caller owns (tensor_free, or the enclosing scope frees it).  Views share
 * their parent's storage: views and parents may be freed in any order, and
 * the storage dies with its last header.  Ops never take ownership of their
 * inputs.
 *
 * Errors: a bad argument (shape mismatch, out-of-range slice, bad reshape,
 * dtype mismatch, NULL input) makes the function return NULL (or a non-zero
 * tensor_status), keeps a one-line message naming the op and the shapes
 * (tensor_error()), and passes it to the error handler (default: print
 * "tensor: <message>" on stderr).  An op given a NULL input returns NULL, so
 * a chain of calls fails at the first error, and that error stays the one
 * reported until tensor_error_clear() (a NULL input with no error pending is
 * itself an error, TENSOR_EINVAL).
 *
 * Misuse: every function checks each tensor argument with the ledger before
 * it reads it (ta_check_block: one probe of the live table per header and
 * per storage).  A tensor freed already, one whose storage was released
 * once too often, or a pointer to no live tensor is a finding at the
 * caller's line (use.after-free, ref.underflow; tensor_free and
 * tensor_pool_release of a freed tensor: free.double) and an error
 * (TENSOR_EINVAL), never a read of freed memory: the function returns NULL,
 * TENSOR_EINVAL, NAN (tensor_item, tensor_get), 0 (tensor_nbytes,
 * tensor_storage_bytes, tensor_is_contiguous, tensor_same_shape,
 * tensor_batch_count), -1 (tensor_storage_refs) or NULL
 * (tensor_storage_block), and tensor_free frees nothing. */
#ifndef TAGALLOC_TENSOR_H
#define TAGALLOC_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TENSOR_MAX_DIMS 6

typedef enum { TENSOR_F32 = 0, TENSOR_I32 = 1 } tensor_dtype;

typedef enum {
  TENSOR_OK = 0,
  TENSOR_ESHAPE,   /* shapes do not match or broadcast; a bad reshape */
  TENSOR_ERANGE,   /* an axis, index, slice or label out of range */
  TENSOR_EDTYPE,   /* a dtype the op does not take */
  TENSOR_EINVAL,   /* a NULL tensor or another bad argument */
  TENSOR_ESCOPE,   /* scope misuse (escape or end with no scope open) */
  TENSOR_ENOMEM    /* the allocation failed */
} tensor_status;

typedef struct tensor_storage tensor_storage;   /* refcounted data, see tensor_storage_* */
typedef struct gpu_pool gpu_pool;               /* a device: gpu/gpu.h's caching pool over a backend */
typedef struct tensor_pool tensor_pool;

typedef struct tensor {
  void   *data;                        /* the first element: storage data + offset */
  int64_t shape[TENSOR_MAX_DIMS];      /* (ndim) */
  int64_t strides[TENSOR_MAX_DIMS];    /* (ndim), in elements; 0 on an expanded axis */
  int64_t offset;                      /* in elements, into the storage */
  int64_t numel;
  int     ndim;                        /* 0 .. TENSOR_MAX_DIMS; 0 is a scalar */
  tensor_dtype dtype;
  tensor_storage *storage;             /* held: ta_hold(this, "storage", storage) */
  /* private: the scope that owns this header (0: none) and its list */
  int scope;
  struct tensor *scope_prev, *scope_next;
} tensor;

/* TS(3, 4) expands to "2, (int64_t[]){3, 4}": the ndim and shape arguments. */
#define TS(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}

static inline float   *tensor_f32(const tensor *t) { return (float *)t->data; }
static inline int32_t *tensor_i32(const tensor *t) { return (int32_t *)t->data; }

/* ---- devices ---------------------------------------------------------------
 * A tensor lives in host memory or on a device: a gpu/ caching pool
 * (gpu_pool_new over a backend, gpu/gpu.h), whose "gpu.buffer" blocks hold
 * device tensors' data.  tensor_to copies a tensor to a device (NULL: to
 * host memory) and returns a new contiguous tensor there; ops dispatch on
 * the device of their inputs.  On a device: tensor_add,
 * _sub, _mul, _div (same shapes, or [rows, cols] + [cols] for tensor_add),
 * tensor_add_scalar, _sub_scalar, _mul_scalar and the in-place
 * add_scalar_, mul_scalar_, tensor_neg, _relu, _tanh, _sigmoid, _exp, _log,
 * the relu/tanh/sigmoid _grad ops and their _out forms, tensor_add_, _sub_,
 * _mul_, 2-D tensor_matmul, _matmul_t, _gemm_out, _gemm_t_out (a
 * transposed view read as such), tensor_sum over TENSOR_ALL or axis 0
 * (keepdim 0), tensor_sum_add_, tensor_argmax of 2-D rows, tensor_clone,
 * tensor_contiguous, tensor_fill_, tensor_copy_ (host to device, device to
 * host, or within a device: it waits), tensor_item (copied back: it waits),
 * the training ops (conv2d and its gradients, max and average pooling and
 * their gradients, softmax and tensor_softmax_grad, log-softmax and
 * tensor_log_softmax_grad over the last axis,
 * cross-entropy and its
 * gradient, embedding and tensor_embedding_grad_, tensor_sgd_step_,
 * tensor_adam_step_; a device label or index out of range gives NaN
 * instead of an error), and every function that only makes views or reads
 * shapes (tensor/README.md, Devices).  Strided inputs are copied contiguous
 * on the device first.  Autograd runs on device tensors (its gradients stay
 * on the device; ag_layer_to moves a model).  A device tensor given to any other op, or
 * inputs on two devices, is an error (TENSOR_EINVAL, naming the devices;
 * no finding).  A device storage holds its buffer (ta_hold(storage,
 * "device", buffer)) and counts references to it (ta_ref_*), so a leaked
 * device tensor is a gpu.leak with the stack of the tensor call that made
 * it.  Link build/libtagalloc-gpu.a (and -ldl) when using devices. */
tensor   *tensor_to(const tensor *t, gpu_pool *device);
gpu_pool *tensor_device(const tensor *t);   /* NULL: host memory (or t not live) */

/* ---- errors ---------------------------------------------------------------- */

tensor_status tensor_last_status(void);   /* of this thread's latest error */
const char   *tensor_error(void);         /* its message, "" when none */
void          tensor_error_clear(void);
/* Called with each error (the message must not be kept); NULL restores the
 * default, which prints "tensor: <message>" on stderr. */
typedef void tensor_error_fn(tensor_status status, const char *message, void *arg);
void tensor_error_handler(tensor_error_fn *fn, void *arg);

/* ---- making and freeing ---------------------------------------------------- */

tensor *tensor_empty(tensor_dtype dtype, int ndim, const int64_t *shape);  /* uninitialised */
tensor *tensor_zeros(tensor_dtype dtype, int ndim, const int64_t *shape);
tensor *tensor_full(int ndim, const int64_t *shape, float value);         /* f32 */
tensor *tensor_from_f32(const float *src, int ndim, const int64_t *shape);  /* copies */
tensor *tensor_from_i32(const int32_t *src, int ndim, const int64_t *shape);
tensor *tensor_arange(int64_t n);                                          /* f32 [n]: 0 .. n-1 */
tensor *tensor_scalar(float value);                                        /* f32, ndim 0 */
/* Normal(0, std) from a fixed generator seeded by seed (same on every run). */
tensor *tensor_randn(int ndim, const int64_t *shape, float std, uint64_t seed);
/* Frees the header; the storage goes when its last header goes (back to its
 * pool if it came from one).  NULL is a no-op. */
void    tensor_free(tensor *t);

/* ---- facts ----------------------------------------------------------------- */

int     tensor_is_contiguous(const tensor *t);   /* row-major, no gaps */
int     tensor_same_shape(const tensor *a, const tensor *b);
size_t  tensor_nbytes(const tensor *t);          /* numel * 4 */
float   tensor_item(const tensor *t);            /* the one element (numel 1), as float */
float   tensor_get(const tensor *t, const int64_t *index);   /* index: ndim entries */
void    tensor_set(tensor *t, const int64_t *index, float v);
/* "f32[2,3]" into buf; returns buf. */
char   *tensor_shape_str(const tensor *t, char *buf, size_t size);
/* The storage's refcount (the number of headers on it); -1 for NULL. */
long    tensor_storage_refs(const tensor *t);
/* The storage's data block (the address the ledger knows), and its bytes. */
const void *tensor_storage_block(const tensor *t);
size_t  tensor_storage_bytes(const tensor *t);

/* ---- views: zero-copy, a new header on the same storage --------------------- */

/* A shape entry -1 is inferred.  reshape copies when the strides make a view
 * impossible (a transposed tensor); view never copies and fails instead. */
tensor *tensor_reshape(const tensor *t, int ndim, const int64_t *shape);
tensor *tensor_view(const tensor *t, int ndim, const int64_t *shape);
tensor *tensor_flatten(const tensor *t);              /* [numel] */
/* t's own header takes the shape, where tensor_view would make a view
 * (else an error, t unchanged): a reshape that costs the ledger nothing,
 * for a tensor the caller owns alone. */
tensor_status tensor_view_(tensor *t, int ndim, const int64_t *shape);
/* Elements start, start+step, ... < stop of axis; negative start/stop count
 * from the end; 0 <= start <= stop <= size after that, step >= 1. */
tensor *tensor_slice(const tensor *t, int axis, int64_t start, int64_t stop, int64_t step);
tensor *tensor_select(const tensor *t, int axis, int64_t index);   /* drops the axis */
/* Batch i of a dataset tensor: rows [i*batch, min((i+1)*batch, n)) of axis 0. */
tensor *tensor_batch(const tensor *t, int64_t i, int64_t batch);
int64_t tensor_batch_count(const tensor *t, int64_t batch);        /* ceil(n / batch) */
tensor *tensor_transpose(const tensor *t, int axis0, int axis1);
tensor *tensor_permute(const tensor *t, const int *perm);         /* perm: ndim entries */
tensor *tensor_squeeze(const tensor *t, int axis);    /* axis of size 1; TENSOR_ALL: every such axis */
tensor *tensor_unsqueeze(const tensor *t, int axis);  /* 0 .. ndim */
/* Broadcast to shape (numpy rules): size-1 axes get stride 0, no copy. */
tensor *tensor_expand(const tensor *t, int ndim, const int64_t *shape);
/* A view of t itself (a second header on its storage). */
tensor *tensor_alias(const tensor *t);
/* t itself as a view when contiguous, else a contiguous copy. */
tensor *tensor_contiguous(const tensor *t);
tensor *tensor_clone(const tensor *t);                /* always a contiguous copy */

#define TENSOR_ALL (-1000)   /* "every axis" for reductions and squeeze */

/* ---- elementwise, with numpy broadcasting (f32) ----------------------------- */

tensor *tensor_add(const tensor *a, const tensor *b);
tensor *tensor_sub(const tensor *a, const tensor *b);
tensor *tensor_mul(const tensor *a, const tensor *b);
tensor *tensor_div(const tensor *a, const tensor *b);
tensor *tensor_add_scalar(const tensor *a, float s);
tensor *tensor_sub_scalar(const tensor *a, float s);
tensor *tensor_mul_scalar(const tensor *a, float s);
tensor *tensor_div_scalar(const tensor *a, float s);
tensor *tensor_neg(const tensor *a);
tensor *tensor_exp(const tensor *a);
tensor *tensor_log(const tensor *a);
tensor *tensor_tanh(const tensor *a);
tensor *tensor_relu(const tensor *a);
tensor *tensor_sigmoid(const tensor *a);

/* out= forms: out must have the broadcast shape already (any strides, it may
 * be a or b).  Return TENSOR_OK or an error status. */
tensor_status tensor_add_out(tensor *out, const tensor *a, const tensor *b);
tensor_status tensor_sub_out(tensor *out, const tensor *a, const tensor *b);
tensor_status tensor_mul_out(tensor *out, const tensor *a, const tensor *b);
tensor_status tensor_div_out(tensor *out, const tensor *a, const tensor *b);
tensor_status tensor_neg_out(tensor *out, const tensor *a);
tensor_status tensor_exp_out(tensor *out, const tensor *a);
tensor_status tensor_log_out(tensor *out, const tensor *a);
tensor_status tensor_tanh_out(tensor *out, const tensor *a);
tensor_status tensor_relu_out(tensor *out, const tensor *a);
tensor_status tensor_sigmoid_out(tensor *out, const tensor *a);
/* out = a * s + b * t (b may be NULL): the axpy of optimizers. */
tensor_status tensor_axpby_out(tensor *out, const tensor *a, float s, const tensor *b, float t);

/* The backward of relu, tanh and sigmoid from dy and the forward's OUTPUT
 * y (same shape, or broadcasting): dy * (y > 0), dy * (1 - y*y),
 * dy * y * (1 - y).  Vectorized, no branches; out= forms as above. */
tensor *tensor_relu_grad(const tensor *dy, const tensor *y);
tensor *tensor_tanh_grad(const tensor *dy, const tensor *y);
tensor *tensor_sigmoid_grad(const tensor *dy, const tensor *y);
tensor_status tensor_relu_grad_out(tensor *out, const tensor *dy, const tensor *y);
tensor_status tensor_tanh_grad_out(tensor *out, const tensor *dy, const tensor *y);
tensor_status tensor_sigmoid_grad_out(tensor *out, const tensor *dy, const tensor *y);

/* In place: a op= b (b broadcast to a's shape); a op= s.  Return status. */
tensor_status tensor_add_(tensor *a, const tensor *b);
tensor_status tensor_sub_(tensor *a, const tensor *b);
tensor_status tensor_mul_(tensor *a, const tensor *b);
tensor_status tensor_div_(tensor *a, const tensor *b);
tensor_status tensor_add_scalar_(tensor *a, float s);
tensor_status tensor_mul_scalar_(tensor *a, float s);
tensor_status tensor_relu_(tensor *a);
tensor_status tensor_exp_(tensor *a);
tensor_status tensor_tanh_(tensor *a);
tensor_status tensor_sigmoid_(tensor *a);
tensor_status tensor_fill_(tensor *a, float v);          /* f32 or i32 (v converted) */
/* src broadcast to dst; same dtype.  With a device tensor on either side
 * (host to device, device to host, or within one device): the same shape,
 * dst contiguous; it waits for the copy. */
tensor_status tensor_copy_(tensor *dst, const tensor *src);

/* ---- reductions ------------------------------------------------------------ */

/* axis: 0 .. ndim-1, negative from the end, or TENSOR_ALL (a scalar result).
 * keepdim keeps the reduced axis with size 1. */
tensor *tensor_sum(const tensor *a, int axis, int keepdim);
tensor *tensor_mean(const tensor *a, int axis, int keepdim);
tensor *tensor_max(const tensor *a, int axis, int keepdim);
tensor *tensor_argmax(const tensor *a, int axis, int keepdim);   /* i32; first of equal maxima */
/* acc += tensor_sum(a, axis, 0), the sum formed first and then added (the
 * same bits as tensor_add_ of the sum) with no result tensor made: a bias
 * gradient accumulated in place.  acc: f32, contiguous, the sum's shape. */
tensor_status tensor_sum_add_(tensor *acc, const tensor *a, int axis);
/* Sums a down to shape, which must broadcast to a's shape: the gradient of
 * a broadcast operand (a bias [C] added to [N,C] gets sum_to(dy, [C])). */
tensor *tensor_sum_to(const tensor *a, int ndim, const int64_t *shape);

/* ---- matrix products (OpenBLAS cblas_sgemm) --------------------------------- */

/* [M,K] @ [K,N] -> [M,N]; [B,M,K] @ [B,K,N] -> [B,M,N] (either side may be
 * 2-D and is then shared by every batch).  Transposed views go to sgemm as
 * they are (no copy); only a view with no unit stride is copied. */
tensor *tensor_matmul(const tensor *a, const tensor *b);
/* out = alpha * a @ b + beta * out (2-D or batched); out's last axis must
 * have stride 1.  beta = 1 accumulates (gradients). */
tensor_status tensor_gemm_out(tensor *out, const tensor *a, const tensor *b, float alpha, float beta);
/* The same with a and/or b transposed (ta, tb non-zero: the last two axes
 * swapped), as tensor_transpose would view them but with no view made: a
 * linear layer's x @ w^T and dy^T @ x cost the ledger nothing beyond the
 * result. */
tensor *tensor_matmul_t(const tensor *a, int ta, const tensor *b, int tb);
tensor_status tensor_gemm_t_out(tensor *out, const tensor *a, int ta, const tensor *b, int tb, float alpha,
                                float beta);

/* ---- convolution and pooling (NCHW) ---------------------------------------- */

/* x [N,C,H,W], w [O,C,KH,KW], bias [O] or NULL -> [N,O,OH,OW],
 * OH = (H + 2*pad - KH) / stride + 1.  im2col over the whole batch, one sgemm. */
tensor *tensor_conv2d(const tensor *x, const tensor *w, const tensor *bias, int stride, int pad);
/* The backward products of conv2d: dL/dx from dL/dy [N,O,OH,OW] and w;
 * dL/dw from dL/dy and x; dL/dbias = sum of dL/dy over N, OH, OW. */
tensor *tensor_conv2d_grad_input(const tensor *dy, const tensor *w, int ndim, const int64_t *x_shape,
                                 int stride, int pad);
tensor *tensor_conv2d_grad_weight(const tensor *dy, const tensor *x, int ndim, const int64_t *w_shape,
                                  int stride, int pad);
tensor *tensor_conv2d_grad_bias(const tensor *dy);
/* Max pooling, window k x k moved by stride, no padding.  argmax, when not
 * NULL, receives a new i32 tensor of the flat input index (per image and
 * channel) of each maximum, for the backward pass. */
tensor *tensor_max_pool2d(const tensor *x, int k, int stride, tensor **argmax);
tensor *tensor_avg_pool2d(const tensor *x, int k, int stride);
/* Their backward products: dL/dx (x_shape) from dL/dy. */
tensor *tensor_max_pool2d_grad(const tensor *dy, const tensor *argmax, int ndim, const int64_t *x_shape);
/* The same, told the forward's window and stride (they must give dy's
 * size).  A device gathers each input's gradient from the windows that
 * cover it, so it needs them: without them it takes the stride-1 window
 * that covers every window of any stride (exact, slower), which exists
 * only when H - OH == W - OW, and is an error otherwise. */
tensor *tensor_max_pool2d_grad_k(const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                                 const int64_t *x_shape);
tensor *tensor_avg_pool2d_grad(const tensor *dy, int k, int stride, int ndim, const int64_t *x_shape);

/* ---- neural-net ops ---------------------------------------------------------- */

tensor *tensor_softmax(const tensor *x, int axis);
/* Its backward from dy and the forward's output y (same shape):
 * dx = y * (dy - sum(dy * y, axis)). */
tensor *tensor_softmax_grad(const tensor *dy, const tensor *y, int axis);
tensor *tensor_log_softmax(const tensor *x, int axis);
/* Its backward from dy and the forward's output y (same shape):
 * dx = dy - exp(y) * sum(dy, axis). */
tensor *tensor_log_softmax_grad(const tensor *dy, const tensor *y, int axis);
/* logits [N,C] (f32), labels [N] (i32, 0 <= label < C) -> the mean of the
 * per-row losses, a scalar.  The grad form gives dL/dlogits [N,C]. */
tensor *tensor_cross_entropy(const tensor *logits, const tensor *labels);
tensor *tensor_cross_entropy_grad(const tensor *logits, const tensor *labels);
/* weight [V,D] (f32), indices (i32, any shape up to 5 dims) -> shape + [D]. */
tensor *tensor_embedding(const tensor *weight, const tensor *indices);
/* Its backward: dweight [V,D] (contiguous) += each row of dout (indices'
 * shape + [D]) at its index, a scatter-add (repeated indices sum; an index
 * outside [0, V) is skipped: the forward refused it). */
tensor_status tensor_embedding_grad_(tensor *dweight, const tensor *dout, const tensor *indices);
/* An embedding, flattened, into a linear layer, as one op (embed_linear.c):
 * table [V,D], indices [B,C] (i32), weight [O,C*D], bias [O] or NULL ->
 * [B,O] = flatten(tensor_embedding(table, indices)) @ weight^T + bias, with
 * each position's repeated indices computed once.  Host tensors only.  Its
 * backward accumulates (+=) into dtable [V,D], dweight [O,C*D] and dbias
 * [O] (each contiguous, or NULL: not wanted) from dy [B,O].  Both agree
 * with the three separate ops within float rounding. */
tensor *tensor_embedding_linear(const tensor *table, const tensor *indices, const tensor *weight, const tensor *bias);
tensor_status tensor_embedding_linear_grad_(tensor *dtable, tensor *dweight, tensor *dbias, const tensor *dy,
                                            const tensor *table, const tensor *indices, const tensor *weight);

/* ---- optimizer updates (in place, torch.optim's arithmetic) ------------------ */

/* One parameter p by its gradient g (contiguous f32, one shape):
 * d = g + weight_decay * p; with momentum: buf = first ? d : momentum * buf + d,
 * d = buf (buf may be NULL when momentum is 0); p -= lr * d. */
tensor_status tensor_sgd_step_(tensor *p, const tensor *g, tensor *buf, float lr, float momentum, float weight_decay,
                               int first);
/* Adam at step t (1 ..): d = g + weight_decay * p; m = beta1 m + (1 - beta1) d;
 * v = beta2 v + (1 - beta2) d d; p -= (lr / (1 - beta1^t)) m / (sqrt(v) / sqrt(1 - beta2^t) + eps). */
tensor_status tensor_adam_step_(tensor *p, const tensor *g, tensor *m, tensor *v, float lr, float beta1, float beta2,
                                float eps, float weight_decay, int64_t t);

/* ---- scopes ---------------------------------------------------------------- */

/* Every tensor made on this thread while a scope is open belongs to the
 * innermost one; tensor_scope_end frees those not escaped.  tensor_escape
 * moves a tensor to the enclosing scope (out of all scopes at depth 1) and
 * returns it; with no scope open it is an error (TENSOR_ESCOPE, NULL).
 * Scopes are per thread, nest up to 64 deep, and a scoped tensor is freed on
 * the thread that made it. */
int  tensor_scope_begin(void);          /* returns the new depth */
tensor_status tensor_scope_end(void);
/* Ends every scope deeper than depth (the error path of a function that
 * opened several). */
void tensor_scope_end_to(int depth);
int  tensor_scope_depth(void);
size_t tensor_scope_count(void);        /* tensors the innermost scope owns */
tensor *tensor_escape(tensor *t);

/* A scope that ends when the enclosing block is left, by any return:
 *   { TENSOR_SCOPE_AUTO; ... if (bad) return NULL; ... return tensor_escape(r); } */
void tensor__scope_cleanup(int *depth);
#define TENSOR_SCOPE_AUTO \
  int tensor__scope __attribute__((cleanup(tensor__scope_cleanup), unused)) = tensor_scope_begin()

/* ---- the tensor pool ----------------------------------------------------- */

/* Storages are kept by dtype and shape and reused last in, first out.  A
 * tensor from tensor_pool_acquire has a storage of tag "tensor.pool" (its
 * contents are left as they were); when the last header on it is freed the
 * storage goes back to its pool instead of the heap.  The pool holds each
 * storage it keeps (declared holds), so the ledger never sees them as lost. */
tensor_pool *tensor_pool_new(void);
tensor_pool *tensor_pool_global(void);   /* made on first use, lives to exit */
/* Frees what the pool keeps; storages out in tensors are freed when they come back. */
void    tensor_pool_free(tensor_pool *p);
tensor *tensor_pool_acquire(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape);
/* tensor_free(t), after checking that t's storage belongs to p. */
tensor_status tensor_pool_release(tensor_pool *p, tensor *t);

typedef struct {
  size_t   storages;   /* kept now */
  size_t   bytes;      /* their data bytes */
  size_t   keys;       /* distinct dtype+shape keys with at least one kept */
  size_t   out;        /* storages of this pool now in tensors */
  uint64_t hits, misses;
  double   hit_rate;   /* hits / (hits + misses); 0 before any acquire */
} tensor_pool_stats;
tensor_pool_stats tensor_pool_stats_get(tensor_pool *p);
/* Storages kept for one key. */
size_t tensor_pool_key_size(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape);
/* Calls fn for each key with storages kept: dtype, shape, count, bytes. */
void   tensor_pool_visit(tensor_pool *p,
                         void (*fn)(tensor_dtype dtype, int ndim, const int64_t *shape,
                                    size_t count, size_t bytes, void *arg), void *arg);
void   tensor_pool_clear(tensor_pool *p);
void   tensor_pool_clear_key(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape);
/* Frees kept storages, those kept longest first, until bytes <= target. */
void   tensor_pool_prune(tensor_pool *p, size_t target_bytes);
void   tensor_pool_reset_stats(tensor_pool *p);
/* Ops on this thread take their results' storages from p (NULL: the heap).
 * Returns the previous one. */
tensor_pool *tensor_pool_use(tensor_pool *p);

/* ---- seeded bugs -------------------------------------------------------------- */

/* The memory bugs tagalloc exists for, each reintroduced in the real code
 * path of tensor/, autograd/ or the training programs when switched on
 * (one at a time), so that tests and demos show what the ledger reports:
 *   reshape-dummy, slice-dummy  a reshape / slice allocates a 1-element
 *       dummy buffer for the new header and then points it at the parent's
 *       data: the dummy is leak.orphan, allocated in tensor_reshape /
 *       tensor_slice (tensor/view.c);
 *   view-underflow  a view's free releases the storage once too often
 *       (_tensor_free, tensor/core.c): ref.underflow;
 *   tape-stack-inputs  a recorded op keeps a pointer to its caller's stack
 *       array of inputs (_ag_result, autograd/tape.c): hold.stack;
 *   params-in-arena  parameters made while a tape is in use live in its
 *       arena (ag_param_new, autograd/tape.c) and are used after its reset:
 *       arena.after-reset;
 *   pool-double-release  backward gives a spent gradient back to the pool a
 *       second time (ag_backward, autograd/tape.c): free.double;
 *   optimizer-state-leak  a checkpoint load makes the optimizer's state anew
 *       without freeing the old (ag_checkpoint_load, autograd/checkpoint.c):
 *       leak.orphan, orphaned there;
 *   tape-no-shrink  the tape also keeps its ops in an index (a ledger
 *       block grown by doubling) that its reset never rewinds nor shrinks
 *       (tape_index_push, autograd/tape.c): leak.growth in a trace with a
 *       mark per step;
 *   arena-early-reset, scope-escape  the training programs' loop resets the
 *       tape before backward (arena.after-reset); takes its batch from a
 *       scope that does not escape it (use.after-free).
 * TAGALLOC_FAULT=NAME in the environment, read at the first
 * tensor_fault_get, sets it too. */
typedef enum {
  TENSOR_FAULT_NONE = 0,
  TENSOR_FAULT_RESHAPE_DUMMY,
  TENSOR_FAULT_SLICE_DUMMY,
  TENSOR_FAULT_VIEW_UNDERFLOW,
  TENSOR_FAULT_TAPE_STACK_INPUTS,
  TENSOR_FAULT_ARENA_EARLY_RESET,
  TENSOR_FAULT_PARAMS_IN_ARENA,
  TENSOR_FAULT_SCOPE_ESCAPE,
  TENSOR_FAULT_POOL_DOUBLE_RELEASE,
  TENSOR_FAULT_OPTIMIZER_STATE_LEAK,
  TENSOR_FAULT_TAPE_NO_SHRINK,
  TENSOR_FAULT_GPU_CLONE_RETAIN,   /* train-lenet --device: seed 003, weights cloned into a collection keep a reference */
  TENSOR_FAULT_COUNT
} tensor_fault;
/* By name ("reshape-dummy", ...; NULL or "none": off).  Returns
 * TENSOR_EINVAL, with a message listing the names, for an unknown one. */
tensor_status tensor_fault_set(const char *name);
tensor_fault  tensor_fault_get(void);
const char   *tensor_fault_name(tensor_fault f);   /* "none" for TENSOR_FAULT_NONE, NULL past the last */

/* ---- threads ------------------------------------------------------------- */

/* Threads for OpenBLAS (sgemm) and for conv2d's batch loops (up to 16);
 * 1 by default for tensor/'s own loops; n < 1 changes nothing. */
void tensor_set_threads(int n);

#ifdef __cplusplus
}
#endif
#endif
