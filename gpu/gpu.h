/* gpu.h - device memory on the ledger: a backend table (CUDA or host), a
 * caching device pool as PyTorch's CUDA caching allocator works, and the
 * kernels training needs.
 *
 *   #include "gpu.h"                 // link build/libtagalloc-gpu.a, the ledger, -lopenblas -ldl
 *
 *   const gpu_backend *b = gpu_backend_get();     // TAGALLOC_GPU=cuda|host|auto
 *   gpu_pool *pool = gpu_pool_default();          // the caching pool over b
 *   float *x = gpu_pool_alloc(pool, n * sizeof(float), NULL);   // "gpu.buffer"
 *   b->memcpy_h2d(x, host, n * sizeof(float), NULL);
 *   b->relu(x, x, n, NULL);                       // in place, on the default stream
 *   b->memcpy_d2h(host, x, n * sizeof(float), NULL);
 *   b->stream_synchronize(NULL);
 *   gpu_pool_free(pool, x);                       // back to the pool's cache
 *   gpu_stats st; gpu_pool_stats(pool, &st);  // PyTorch's stat names
 *
 * Backends.  A gpu_backend is a table of function pointers, one per
 * operation, over device pointers: addresses in the device's own address
 * space, never host memory (the host backend's device memory is a mapping
 * of its own, reserved PROT_NONE and committed as it is allocated, so a
 * device pointer is never mistaken for a host one).  Two backends:
 *   - "host": always built; plain C and OpenBLAS.  Streams and events are
 *     synchronous (an op is complete when its call returns) but keep their
 *     meaning: an event records the completion of the work before it.  It is
 *     the reference the CUDA backend is tested against, value by value.
 *   - "cuda": the shared object libtagalloc-gpu-cuda.so, built only where
 *     the CUDA Toolkit's nvcc is found and loaded at run time (dlopen), so
 *     every binary builds and runs on a machine with no driver.  It exports
 *     one symbol, gpu_cuda_backend (gpu_cuda_backend_fn below).
 *
 * Selection (gpu_backend_get, once per process): TAGALLOC_GPU=
 *   cuda  the CUDA backend, or an error naming why it cannot run;
 *   host  the host backend;
 *   auto  (default) CUDA if its shared object loads and a device exists,
 *         else host, and one line on stderr says why ("tagalloc: gpu: no
 *         usable CUDA driver (...): using the host backend").
 * The CUDA shared object is looked for in TAGALLOC_GPU_CUDA_LIB (a path),
 * then beside the program, beside the library that holds gpu/, and last by
 * its bare name (the dynamic linker's search path).
 *
 * Conventions for every entry of the table:
 *   - returns GPU_OK or an error status; the detail of the latest failure
 *     is in b->last_error() (thread-local, "" when none);
 *   - a stream of NULL is the default stream; work on one stream runs in
 *     the order it was queued; copies to or from host memory may be
 *     asynchronous: the host buffer must stay valid and unchanged until the
 *     stream is synchronized (or an event recorded after it completes);
 *   - sizes are element counts (int64_t) unless named bytes; tensors are
 *     contiguous, row-major, float (f32) unless int32_t is named;
 *   - `out` may be the same pointer as an input of the same shape
 *     (in-place), except where an entry says otherwise;
 *   - a kernel's bad argument (a NULL pointer, a negative size) is
 *     GPU_EINVAL before anything is queued; errors found on the device
 *     during an asynchronous op are returned by a later call or synchronize.
 *
 * Ledger tags (alloc/tagalloc.h): each pool segment is a device block of tag
 * "gpu.segment" (TA_DEVICE_RESERVE: reserved memory, not a leak by itself)
 * and each block the pool hands out one of tag "gpu.buffer", keyed by
 * (tag, device, address), each with the host stack that made it.  The
 * ledger never reads device memory.  Findings at exit:
 *   gpu.leak            a live gpu.buffer (never freed), with its stack;
 *   gpu.pool-retained   a segment the pool still reserves holding no live
 *                       buffer: idle cache, with the stack that made it;
 *   gpu.purge-referenced  gpu_pool_purge found a live buffer that something
 *                       still references (ta_ref_* count > 0): it refuses to
 *                       free it and reports it at once, with the buffer's
 *                       allocation stack and the purge's.
 * ref.leak on a device buffer comes from the ledger's refcount tracking of
 * the tensors that hold it.
 */
#ifndef TAGALLOC_GPU_H
#define TAGALLOC_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the table's layout: a backend built for another version is
 * refused by the loader (the shared object is built separately). */
#define GPU_BACKEND_ABI 2   /* 2: the sgemm library's workspace entries */

typedef enum {
  GPU_OK = 0,
  GPU_ENOMEM,       /* device memory exhausted (the pool frees its cache and retries first) */
  GPU_EINVAL,       /* a bad argument: NULL pointer, negative size, unknown stream or event */
  GPU_ENOTREADY,    /* event_query: the work before the event has not completed */
  GPU_ENODRIVER,    /* no usable driver (cudaErrorInsufficientDriver, a missing libcuda) */
  GPU_ENODEVICE,    /* a driver but no device (cudaErrorNoDevice) */
  GPU_EBACKEND      /* any other failure of the backend; see last_error() */
} gpu_status;

const char *gpu_status_name(gpu_status s);   /* "GPU_ENOMEM", ...; "?" for an unknown value */

typedef struct gpu_stream_s *gpu_stream;   /* NULL: the default stream */
typedef struct gpu_event_s  *gpu_event;

/* The device number the ledger keys host-backend memory by (CUDA devices
 * are their ordinals, 0 ..). */
#define GPU_HOST_DEVICE 100
/* The host backend's device memory when TAGALLOC_GPU_HOST_MEM does not set
 * it (a size, K/M/G/T suffixes, from 1M): address space reserved at the
 * first allocation, pages committed only as they are allocated. */
#define GPU_HOST_DEFAULT_MEM ((size_t)8 << 30)

/* conv2d over NCHW: x [n, c, h, w], w [o, c, kh, kw], y [n, o, oh, ow] with
 * oh = (h + 2*pad - kh) / stride + 1 (ow likewise); zero padding.
 * gpu_conv2d_init fills oh and ow and checks the rest (GPU_EINVAL). */
typedef struct {
  int n, c, h, w;        /* input */
  int o, kh, kw;         /* weights */
  int stride, pad;
  int oh, ow;            /* output (gpu_conv2d_init) */
} gpu_conv2d;
gpu_status gpu_conv2d_init(gpu_conv2d *p, int n, int c, int h, int w, int o, int kh, int kw, int stride, int pad);

/* Pooling over NCHW, window k x k moved by stride, no padding:
 * x [n, c, h, w] -> y [n, c, oh, ow], oh = (h - k) / stride + 1. */
typedef struct {
  int n, c, h, w;
  int k, stride;
  int oh, ow;            /* gpu_pool2d_init */
} gpu_pool2d;
gpu_status gpu_pool2d_init(gpu_pool2d *p, int n, int c, int h, int w, int k, int stride);

typedef enum { GPU_NO_TRANS = 0, GPU_TRANS = 1 } gpu_trans;

typedef struct gpu_backend {
  int         abi;       /* GPU_BACKEND_ABI */
  const char *name;      /* "host", "cuda" */

  /* ---- life ---------------------------------------------------------------- */
  /* Opens device `device` (an ordinal; the host backend has device 0 only).
   * GPU_ENODRIVER / GPU_ENODEVICE when there is none, with last_error()
   * saying why.  Calling init again after success is GPU_OK and does nothing. */
  gpu_status (*init)(int device);
  /* Frees what init made (streams, events and memory still out are the
   * caller's leak; the backend just returns them to the system). */
  void (*shutdown)(void);
  const char *(*last_error)(void);          /* this thread's latest failure, "" if none */
  const char *(*device_name)(void);         /* "NVIDIA H100 80GB HBM3", "host" */
  int (*ledger_device)(void);               /* the device number the ledger keys its memory by */

  /* ---- raw device memory: what the pool carves its segments from -------- */
  /* *ptr receives `bytes` of device memory, aligned to 256 bytes at least;
   * GPU_ENOMEM when the device has no room (never a partial result). */
  gpu_status (*alloc)(void **ptr, size_t bytes);
  gpu_status (*free)(void *ptr);            /* a pointer alloc returned; NULL: GPU_OK */
  /* Free and total device memory in bytes (the host backend: its capacity). */
  gpu_status (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);

  /* ---- copies and memset (asynchronous on `s`) ----------------------------- */
  gpu_status (*memcpy_h2d)(void *dst, const void *src, size_t bytes, gpu_stream s);
  gpu_status (*memcpy_d2h)(void *dst, const void *src, size_t bytes, gpu_stream s);
  gpu_status (*memcpy_d2d)(void *dst, const void *src, size_t bytes, gpu_stream s);
  gpu_status (*memset)(void *dst, int byte, size_t bytes, gpu_stream s);

  /* ---- streams and events ---------------------------------------------------- */
  gpu_status (*stream_create)(gpu_stream *s);
  gpu_status (*stream_destroy)(gpu_stream s);      /* waits for its work first */
  gpu_status (*stream_synchronize)(gpu_stream s);  /* NULL: the default stream */
  /* Work queued on s after this call waits for e's work to complete. */
  gpu_status (*stream_wait_event)(gpu_stream s, gpu_event e);
  gpu_status (*event_create)(gpu_event *e);
  gpu_status (*event_record)(gpu_event e, gpu_stream s);  /* marks the end of s's work so far */
  /* GPU_OK: the recorded work is complete (or e was never recorded);
   * GPU_ENOTREADY: not yet. */
  gpu_status (*event_query)(gpu_event e);
  gpu_status (*event_synchronize)(gpu_event e);    /* waits for the recorded work */
  gpu_status (*event_destroy)(gpu_event e);
  gpu_status (*device_synchronize)(void);          /* every stream */

  /* ---- dense algebra ----------------------------------------------------------- */
  /* Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(A) [m, k] and
   * op(B) [k, n]; lda, ldb, ldc are the row strides (in elements) of A, B, C
   * as stored (A is [k, m] when ta is GPU_TRANS).  beta 0: C is not read. */
  gpu_status (*sgemm)(gpu_trans ta, gpu_trans tb, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc, gpu_stream s);

  /* ---- fill and copy ------------------------------------------------------------- */
  gpu_status (*fill)(float *out, float value, int64_t n, gpu_stream s);
  gpu_status (*fill_i32)(int32_t *out, int32_t value, int64_t n, gpu_stream s);
  /* dst (contiguous, shape[0..ndim)) = src read with element strides
   * src_stride[] (0 broadcasts; ndim 1 .. 6); shape and strides are host
   * arrays, read during the call.  dst must not overlap src. */
  gpu_status (*copy_strided)(float *dst, const float *src, int ndim, const int64_t *shape,
                             const int64_t *src_stride, gpu_stream s);

  /* ---- elementwise, n elements ---------------------------------------------------- */
  gpu_status (*add)(float *out, const float *a, const float *b, int64_t n, gpu_stream s);
  gpu_status (*sub)(float *out, const float *a, const float *b, int64_t n, gpu_stream s);
  gpu_status (*mul)(float *out, const float *a, const float *b, int64_t n, gpu_stream s);
  gpu_status (*div)(float *out, const float *a, const float *b, int64_t n, gpu_stream s);
  /* out = alpha * a + beta * b (gradient accumulation: out == a, alpha 1). */
  gpu_status (*axpby)(float *out, float alpha, const float *a, float beta, const float *b, int64_t n,
                      gpu_stream s);
  gpu_status (*scale)(float *out, const float *a, float s_, int64_t n, gpu_stream s);       /* a * s_ */
  gpu_status (*add_scalar)(float *out, const float *a, float s_, int64_t n, gpu_stream s);  /* a + s_ */
  gpu_status (*relu)(float *out, const float *x, int64_t n, gpu_stream s);
  gpu_status (*tanh)(float *out, const float *x, int64_t n, gpu_stream s);
  gpu_status (*sigmoid)(float *out, const float *x, int64_t n, gpu_stream s);
  gpu_status (*exp)(float *out, const float *x, int64_t n, gpu_stream s);
  gpu_status (*log)(float *out, const float *x, int64_t n, gpu_stream s);
  /* Backward of the activations from their output y: dx = dy * f'(y):
   * relu: dy where y > 0, else 0; tanh: dy * (1 - y*y); sigmoid: dy * y * (1 - y). */
  gpu_status (*relu_bwd)(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s);
  gpu_status (*tanh_bwd)(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s);
  gpu_status (*sigmoid_bwd)(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s);
  /* out[r, c] = x[r, c] + bias[c] over x [rows, cols] (linear layers). */
  gpu_status (*bias_add_rows)(float *out, const float *x, const float *bias, int64_t rows, int64_t cols,
                              gpu_stream s);
  /* out[i, ch, j] = x[i, ch, j] + bias[ch] over x [n, c, hw] (conv layers). */
  gpu_status (*bias_add_channels)(float *out, const float *x, const float *bias, int64_t n, int64_t c,
                                  int64_t hw, gpu_stream s);

  /* ---- reductions (out is overwritten, never accumulated into) ----------------------- */
  gpu_status (*sum_all)(float *out1, const float *x, int64_t n, gpu_stream s);   /* out1[0] = sum */
  /* x [rows, cols]: out[cols] = the sum over rows (a column's sum: a linear
   * bias's gradient); sum_cols: out[rows] = the sum over cols (a row's sum). */
  gpu_status (*sum_rows)(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s);
  gpu_status (*sum_cols)(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s);
  /* x [n, c, hw]: out[c] = the sum over n and hw (a conv bias's gradient). */
  gpu_status (*sum_channels)(float *out, const float *x, int64_t n, int64_t c, int64_t hw, gpu_stream s);
  /* x [rows, cols]: out[r] = the first index of row r's maximum (accuracy). */
  gpu_status (*argmax_rows)(int32_t *out, const float *x, int64_t rows, int64_t cols, gpu_stream s);

  /* ---- convolution and pooling (NCHW; p from gpu_conv2d_init / gpu_pool2d_init) ---- */
  /* Device scratch bytes the three conv2d entries need for p (0: none); the
   * caller passes a buffer at least that big as ws (from the pool, so the
   * ledger sees it). */
  size_t (*conv2d_workspace)(const gpu_conv2d *p);
  /* y = conv(x, w) + bias (bias [o] or NULL). */
  gpu_status (*conv2d_fwd)(const gpu_conv2d *p, float *y, const float *x, const float *w, const float *bias,
                           void *ws, gpu_stream s);
  /* dx [n, c, h, w] = dL/dx from dy [n, o, oh, ow] and w (overwritten). */
  gpu_status (*conv2d_bwd_data)(const gpu_conv2d *p, float *dx, const float *dy, const float *w, void *ws,
                                gpu_stream s);
  /* dw [o, c, kh, kw] = dL/dw from dy and x (overwritten).  The bias's
   * gradient is sum_channels(dy, n, o, oh*ow). */
  gpu_status (*conv2d_bwd_weight)(const gpu_conv2d *p, float *dw, const float *dy, const float *x, void *ws,
                                  gpu_stream s);
  /* y = the window maxima; argmax[i] = the flat index (h*w + x within its
   * image and channel) of y[i]'s maximum, the first one on ties. */
  gpu_status (*max_pool_fwd)(const gpu_pool2d *p, float *y, int32_t *argmax, const float *x, gpu_stream s);
  /* dx (overwritten, zero where no window took its maximum) += dy at argmax. */
  gpu_status (*max_pool_bwd)(const gpu_pool2d *p, float *dx, const float *dy, const int32_t *argmax,
                             gpu_stream s);
  gpu_status (*avg_pool_fwd)(const gpu_pool2d *p, float *y, const float *x, gpu_stream s);
  gpu_status (*avg_pool_bwd)(const gpu_pool2d *p, float *dx, const float *dy, gpu_stream s);   /* overwritten */

  /* ---- softmax and cross-entropy, row-wise over x [rows, cols] ---------------------- */
  gpu_status (*softmax_rows)(float *y, const float *x, int64_t rows, int64_t cols, gpu_stream s);
  /* dx = y * (dy - sum_c(dy * y)) per row; dx must not be dy or y. */
  gpu_status (*softmax_bwd)(float *dx, const float *dy, const float *y, int64_t rows, int64_t cols,
                            gpu_stream s);
  /* probs = softmax(logits); loss1[0] = mean over rows of -log probs[r,
   * labels[r]] (computed as log-sum-exp minus the logit, never log(0)).  A
   * label outside [0, cols) makes loss1 NaN (callers check labels on the host). */
  gpu_status (*softmax_xent_fwd)(float *probs, float *loss1, const float *logits, const int32_t *labels,
                                 int64_t rows, int64_t cols, gpu_stream s);
  /* dlogits = (probs - onehot(labels)) * dloss / rows; dloss is the
   * upstream gradient of the mean loss (1 for a plain loss.backward()). */
  gpu_status (*softmax_xent_bwd)(float *dlogits, const float *probs, const int32_t *labels, float dloss,
                                 int64_t rows, int64_t cols, gpu_stream s);

  /* ---- embedding: weight [vocab, dim], idx int32 [n] ------------------------------- */
  /* out[i, :] = weight[idx[i], :]; an index outside [0, vocab) gives a row of NaN. */
  gpu_status (*embedding_fwd)(float *out, const float *weight, const int32_t *idx, int64_t n, int64_t dim,
                              int64_t vocab, gpu_stream s);
  /* dweight[idx[i], :] += dout[i, :] (scatter-add: repeated indices sum;
   * dweight is accumulated into, zero it first); indices outside range skipped. */
  gpu_status (*embedding_bwd)(float *dweight, const float *dout, const int32_t *idx, int64_t n, int64_t dim,
                              int64_t vocab, gpu_stream s);

  /* ---- optimizer updates, n parameters (torch.optim's arithmetic) -------------------- */
  /* d = g + wd * p; with momentum: buf = first ? d : momentum * buf + d, d = buf;
   * p -= lr * d.  buf is unused (may be NULL) when momentum is 0. */
  gpu_status (*sgd_step)(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                         float weight_decay, int first, gpu_stream s);
  /* Adam at step t (1 ..): d = g + wd * p; m = b1 m + (1 - b1) d;
   * v = b2 v + (1 - b2) d d; p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
  gpu_status (*adam_step)(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                          float beta2, float eps, float weight_decay, int64_t t, gpu_stream s);

  /* ---- the sgemm library's workspace --------------------------------------------------- */
  /* Device bytes the sgemm library would otherwise allocate for itself, out
   * of the ledger's sight (cuBLAS: 32 MiB on sm_90 and up, 4 MiB below, its
   * own defaults); 0 when it needs none or cannot take one (the host
   * backend, a cuBLAS without cublasSetWorkspace). */
  size_t (*blas_workspace_size)(void);
  /* Use ws (bytes of device memory, at least blas_workspace_size()) as that
   * workspace; NULL and 0: none (sgemm then runs without one).  The caller
   * keeps ws until it sets another.  gpu_pool_new does this for the first
   * pool over a backend (a "gpu.blas-workspace" block on the ledger). */
  gpu_status (*set_blas_workspace)(void *ws, size_t bytes);
} gpu_backend;

/* The one symbol libtagalloc-gpu-cuda.so exports: its table, or NULL with
 * *why set to a static string saying why not (no driver, no device, ...).
 * It does not call init; the loader does. */
typedef const gpu_backend *gpu_cuda_backend_fn(const char **why);
#define GPU_CUDA_LIB    "libtagalloc-gpu-cuda.so"
#define GPU_CUDA_SYMBOL "gpu_cuda_backend"

/* ---- selection ------------------------------------------------------------------------- */

/* The backend TAGALLOC_GPU selects (above), initialised on device 0; made on
 * first call, the same for the life of the process.  NULL only when
 * TAGALLOC_GPU=cuda and CUDA cannot run (the message is printed once).
 * Another word in TAGALLOC_GPU is named in a one-line message, and auto
 * runs. */
const gpu_backend *gpu_backend_get(void);
/* The host backend's table (not initialised: call init). */
const gpu_backend *gpu_backend_host(void);
/* Loads the CUDA backend's shared object and initialises it on device 0:
 * its table, or NULL with why[] saying why and *status: GPU_EBACKEND when
 * the shared object cannot be loaded (or is of another table version),
 * GPU_ENODRIVER / GPU_ENODEVICE when it loads but finds no usable driver or
 * device (auto's "no usable CUDA driver or device" line). */
const gpu_backend *gpu_backend_cuda(gpu_status *status, char *why, size_t why_len);
/* Selection by word ("cuda", "host", "auto"), as gpu_backend_get does with
 * TAGALLOC_GPU, without caching; NULL with why[] set on failure.  With
 * "auto" and no CUDA, note[] (when not NULL) receives the one line saying so. */
const gpu_backend *gpu_backend_select(const char *word, char *why, size_t why_len, char *note,
                                      size_t note_len);

/* ---- the caching pool ------------------------------------------------------------------ */
/*
 * As PyTorch's CUDA caching allocator works:
 *   - every request is rounded up to 512 bytes (GPU_POOL_ROUND); a request
 *     of up to 1 MiB comes from the small pool, whose segments are 2 MiB;
 *     a larger one from the large pool, whose segments are 20 MiB for
 *     requests under 10 MiB, and the request rounded up to 2 MiB above;
 *   - a request takes the smallest cached block of its pool and stream that
 *     fits (best fit by (stream, size)); a block larger than the request is
 *     split, and the remainder stays cached (small pool: when at least 512 B
 *     remain; large pool: when more than 1 MiB remains); a block above
 *     max_split_size is never split, and serves only requests it fits
 *     within 20 MiB of (kept for large requests);
 *   - a freed block merges with its free neighbours in the same segment;
 *   - each stream has its own free blocks; a block used on other streams
 *     (gpu_pool_record_stream) goes back to the cache only when an event
 *     recorded on each of those streams at its free has completed;
 *   - when the device has no room for a new segment, the pool frees its
 *     cached whole segments (those with no block in use) and retries once
 *     (num_alloc_retries); if that fails too, num_ooms counts it and
 *     gpu_pool_alloc returns NULL with a one-line message (gpu_pool_error)
 *     naming the request, what is allocated and what is reserved.
 * The first pool made over a backend whose sgemm library takes a workspace
 * (blas_workspace_size() > 0: cuBLAS) gives it one, allocated from the
 * backend beside the segments: a device block of tag "gpu.blas-workspace"
 * (reserved: not a leak by itself), with the stack that made the pool,
 * until gpu_pool_destroy; so cuBLAS's scratch is on the ledger too.
 * Thread-safe: every call takes the pool's lock.
 */
#define GPU_POOL_ROUND      512u
#define GPU_POOL_SMALL_SIZE (1u << 20)       /* requests up to this: the small pool */
#define GPU_POOL_SMALL_SEG  (2u << 20)       /* its segments */
#define GPU_POOL_LARGE_SEG  (20u << 20)      /* large segments for requests under GPU_POOL_MIN_LARGE */
#define GPU_POOL_MIN_LARGE  (10u << 20)
#define GPU_POOL_LARGE_ROUND (2u << 20)      /* requests from GPU_POOL_MIN_LARGE up: rounded to this */

typedef struct gpu_pool gpu_pool;

typedef struct {
  size_t max_split_size;    /* blocks above this are never split; 0: no limit (the default) */
} gpu_pool_config;

/* A pool over backend b (initialised); cfg NULL: the defaults. */
gpu_pool *gpu_pool_new(const gpu_backend *b, const gpu_pool_config *cfg);
/* Returns every segment to the backend (blocks still out are gpu.leak). */
void      gpu_pool_destroy(gpu_pool *p);
/* The pool over gpu_backend_get(), made on first use, reported at exit. */
gpu_pool *gpu_pool_default(void);
const gpu_backend *gpu_pool_backend(const gpu_pool *p);

/* `bytes` of device memory for use on stream s (NULL: default stream), or
 * NULL when the device is out of memory (after the retry) or bytes is 0. */
void *gpu_pool_alloc(gpu_pool *p, size_t bytes, gpu_stream s);
/* Back to the cache (deferred while streams it was used on still run).  A
 * pointer the pool did not hand out, or freed twice, is a ledger finding
 * (free.invalid, free.double) and is otherwise ignored. */
void  gpu_pool_free(gpu_pool *p, void *ptr);
/* Marks ptr as used on stream s too (PyTorch's recordStream). */
void  gpu_pool_record_stream(gpu_pool *p, void *ptr, gpu_stream s);
size_t gpu_pool_size(gpu_pool *p, const void *ptr);   /* the block's rounded size; 0: not live */
/* Frees every cached segment holding no block in use (PyTorch's empty_cache). */
void  gpu_pool_empty_cache(gpu_pool *p);
/* A purge: empty_cache, and the live buffers judged by their references
 * (ta_ref_* on the buffer's address, as device tensors count them):
 *   - count 0: every owner released it but nobody gave it back: freed;
 *   - count > 0: something still references it: refused, and reported as
 *     gpu.purge-referenced (the buffer's allocation stack, the purge's
 *     stack, the count) -- freeing it would pull memory from under a tensor;
 *   - no refcount: a raw buffer the pool cannot judge: left alone.
 * Then every whole free segment goes back.  Returns the bytes returned to
 * the device. */
size_t gpu_pool_purge(gpu_pool *p);
const char *gpu_pool_error(void);   /* this thread's latest pool message, "" if none */

/* One statistic, as PyTorch's: current value, peak, total increases and
 * total decreases. */
typedef struct {
  int64_t current, peak, allocated, freed;
} gpu_stat;
enum { GPU_STAT_ALL = 0, GPU_STAT_SMALL = 1, GPU_STAT_LARGE = 2, GPU_STAT_KINDS = 3 };
typedef struct {
  /* [GPU_STAT_ALL], [GPU_STAT_SMALL] (small pool), [GPU_STAT_LARGE] */
  gpu_stat allocation[GPU_STAT_KINDS];            /* blocks handed out, not yet freed */
  gpu_stat segment[GPU_STAT_KINDS];               /* segments reserved from the device */
  gpu_stat active[GPU_STAT_KINDS];                /* allocation + blocks freed but waiting for streams */
  gpu_stat inactive_split[GPU_STAT_KINDS];        /* free blocks inside segments with a block in use */
  gpu_stat allocated_bytes[GPU_STAT_KINDS];       /* bytes of allocation (rounded sizes) */
  gpu_stat reserved_bytes[GPU_STAT_KINDS];        /* bytes of segment */
  gpu_stat active_bytes[GPU_STAT_KINDS];
  gpu_stat inactive_split_bytes[GPU_STAT_KINDS];
  gpu_stat requested_bytes[GPU_STAT_KINDS];       /* bytes asked for, before rounding */
  int64_t num_alloc_retries;   /* device allocations that failed, then were retried after freeing the cache */
  int64_t num_ooms;            /* requests that failed after the retry */
  int64_t num_device_alloc;    /* segments obtained from the backend */
  int64_t num_device_free;     /* segments returned to it */
  int64_t num_hits;            /* requests served from the cache, no device allocation */
  int64_t num_requests;        /* gpu_pool_alloc calls that returned memory */
} gpu_stats;
void gpu_pool_stats(gpu_pool *p, gpu_stats *out);
/* Resets peaks to current values, and allocated/freed and the counters to 0. */
void gpu_pool_stats_reset(gpu_pool *p);

#ifdef __cplusplus
}
#endif
#endif
