/* backend.c - the CUDA backend: gpu/gpu.h's table over the CUDA runtime
 * (linked statically: cudart_static), cuBLAS and the kernels of the .cu
 * files beside it.  Built into libtagalloc-gpu-cuda.so, which exports one
 * symbol, gpu_cuda_backend; everything else (the runtime's symbols too) is
 * local to the object (gpu/cuda/exports.map).
 *
 *   gpu_cuda_backend_fn *get = dlsym(h, GPU_CUDA_SYMBOL);
 *   const gpu_backend *b = get(&why);
 *   if (b->init(0) != GPU_OK) puts(b->last_error());  // "no usable CUDA driver (...)"
 *
 * Every CUDA and cuBLAS call is checked: a failure returns a gpu_status and
 * leaves its message in last_error(), never exits.  Streams are CUDA
 * streams (gpu_stream is the cudaStream_t; NULL the legacy default stream,
 * which orders with every stream this backend creates); events are CUDA
 * events without timing.  sgemm maps the row-major product onto cuBLAS's
 * column-major one (C^T = B^T A^T: the operands swap, the transposes stay);
 * conv2d is im2col + one sgemm per chunk of images (the chunk sized so the
 * workspace stays under CONV_WS_MAX), with the layout changes done by
 * kernels.  cuBLAS runs in its default math mode: float products, no TF32.
 *
 * cuBLAS is opened (dlopen) by init, once a device is found, not linked:
 * libcublas and libcublasLt take 0.3 to 1 s to load, which every program
 * choosing a backend with TAGALLOC_GPU=auto on a machine without a driver
 * would pay for nothing.  It is looked for where TAGALLOC_GPU_CUBLAS (a
 * path) names it, then by its soname (libcublas.so.<major> of the toolkit
 * built with: the loader's search path), then in the toolkit's lib64 named
 * at build time (GCU_CUDA_LIBDIR).
 */
#include "gpu.h"
#include "kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* The workspace of a conv2d is at most this (unless one image needs more). */
#define CONV_WS_MAX ((size_t)64 << 20)

static __thread char last_msg[512];

/* ---- errors ----------------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static gpu_status fail(gpu_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return st;
}

/* The runtime's errors that mean "no usable driver". */
static bool no_driver(cudaError_t e) {
  return e == cudaErrorInsufficientDriver || e == cudaErrorSystemDriverMismatch ||
         e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorSystemNotReady;
}

/* A failed CUDA call as a status, its message in last_error().  A non-sticky
 * error is cleared from the runtime's last error, so it is not reported
 * again by the next kernel launch. */
static gpu_status cuda_fail(cudaError_t e, const char *what) {
  (void)cudaGetLastError();
  gpu_status st = e == cudaErrorMemoryAllocation ? GPU_ENOMEM
                  : e == cudaErrorInvalidValue || e == cudaErrorInvalidResourceHandle ||
                          e == cudaErrorInvalidDevicePointer || e == cudaErrorInvalidDevice
                      ? GPU_EINVAL
                  : no_driver(e)               ? GPU_ENODRIVER
                  : e == cudaErrorNoDevice     ? GPU_ENODEVICE
                                               : GPU_EBACKEND;
  return fail(st, "cuda: %s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CU(call, what)                                                                                     \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) return cuda_fail(e_, what);                                                     \
  } while (0)

/* A kernel launch: clears a stale non-sticky error (cudaErrorNotReady from
 * a query) so that the launch's own check sees only the launch. */
#define LAUNCH(call, what)                                                                                 \
  do {                                                                                                     \
    (void)cudaGetLastError();                                                                              \
    CU(call, what);                                                                                        \
  } while (0)

static const char *cublas_name(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_?";
}

static gpu_status cublas_fail(cublasStatus_t s, const char *what) {
  (void)cudaGetLastError();
  return fail(s == CUBLAS_STATUS_ALLOC_FAILED ? GPU_ENOMEM : s == CUBLAS_STATUS_INVALID_VALUE ? GPU_EINVAL : GPU_EBACKEND,
              "cublas: %s: %s", what, cublas_name(s));
}

/* ---- cuBLAS, opened by init -------------------------------------------------- */

#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

static struct {
  void *lib;
  __typeof__(&cublasCreate_v2) create;
  __typeof__(&cublasDestroy_v2) destroy;
  __typeof__(&cublasSetStream_v2) set_stream;
  __typeof__(&cublasSetMathMode) set_math_mode;
  __typeof__(&cublasSgemm_v2) sgemm;
  __typeof__(&cublasSetWorkspace_v2) set_workspace;   /* NULL: a cuBLAS without it */
} cb;

/* Opens cuBLAS and finds its five functions; GPU_EBACKEND naming what was
 * tried when it cannot. */
static gpu_status cublas_open(void) {
  if (cb.lib) return GPU_OK;
  const char *tried[3] = { getenv("TAGALLOC_GPU_CUBLAS"), CUBLAS_SONAME, GCU_CUDA_LIBDIR "/" CUBLAS_SONAME };
  char errs[3][160] = { "not set", "", "" };
  void *lib = NULL;
  for (int i = 0; i < 3 && lib == NULL; i++) {
    if (tried[i] == NULL || tried[i][0] == '\0') continue;
    lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) snprintf(errs[i], sizeof errs[i], "%s", dlerror());
  }
  if (lib == NULL)
    return fail(GPU_EBACKEND, "cuda: cuBLAS not found: TAGALLOC_GPU_CUBLAS (%s); %s (%s); %s (%s)", errs[0], tried[1],
                errs[1], tried[2], errs[2]);
  *(void **)&cb.create = dlsym(lib, "cublasCreate_v2");
  *(void **)&cb.destroy = dlsym(lib, "cublasDestroy_v2");
  *(void **)&cb.set_stream = dlsym(lib, "cublasSetStream_v2");
  *(void **)&cb.set_math_mode = dlsym(lib, "cublasSetMathMode");
  *(void **)&cb.sgemm = dlsym(lib, "cublasSgemm_v2");
  *(void **)&cb.set_workspace = dlsym(lib, "cublasSetWorkspace_v2");
  if (!cb.create || !cb.destroy || !cb.set_stream || !cb.set_math_mode || !cb.sgemm) {
    dlclose(lib);
    return fail(GPU_EBACKEND, "cuda: the cuBLAS found lacks cublasCreate_v2, cublasSgemm_v2 or another function");
  }
  cb.lib = lib;
  return GPU_OK;
}

/* A bad argument: GPU_EINVAL before anything is queued. */
#define ARG(ok, ...)                                                                                       \
  do {                                                                                                     \
    if (!(ok)) return fail(GPU_EINVAL, __VA_ARGS__);                                                        \
  } while (0)

/* ---- life ------------------------------------------------------------------- */

static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static int cur_device = -1;   /* >= 0 once init succeeded (atomic loads outside life_lock) */
/* The device this thread made current: CUDA's current device is per
 * thread, and a thread other than init's starts on device 0. */
static __thread int thread_device = -1;
static char dev_name[256] = "cuda (not initialised)";
/* One cuBLAS handle; blas_lock keeps its stream binding and the sgemm that
 * uses it together (a handle is not to be shared by threads unlocked). */
static cublasHandle_t blas;
static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
/* The workspace cuBLAS would allocate for itself on this device: its
 * default, 32 MiB from sm_90 (Hopper) on, 4 MiB below (init). */
static size_t blas_ws_bytes;

static gpu_status init_locked(int device) {
  if (cur_device >= 0) {
    ARG(device == cur_device, "cuda init: device %d asked, device %d already open", device, cur_device);
    return GPU_OK;
  }
  ARG(device >= 0, "cuda init: device %d: want an ordinal >= 0", device);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (no_driver(e))
      return fail(GPU_ENODRIVER, "no usable CUDA driver (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
    if (e == cudaErrorNoDevice)
      return fail(GPU_ENODEVICE, "no CUDA device (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return cuda_fail(e, "cudaGetDeviceCount");
  }
  if (count == 0) return fail(GPU_ENODEVICE, "no CUDA device (the driver counts 0)");
  ARG(device < count, "cuda init: device %d: the driver counts %d device%s", device, count, count == 1 ? "" : "s");
  CU(cudaSetDevice(device), "cudaSetDevice");
  CU(cudaFree(NULL), "creating the context (cudaFree(NULL))");
  struct cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  gpu_status st = cublas_open();
  if (st != GPU_OK) return st;
  cublasStatus_t bs = cb.create(&blas);
  if (bs != CUBLAS_STATUS_SUCCESS) return cublas_fail(bs, "cublasCreate");
  bs = cb.set_math_mode(blas, CUBLAS_DEFAULT_MATH);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    cb.destroy(blas);
    return cublas_fail(bs, "cublasSetMathMode");
  }
  snprintf(dev_name, sizeof dev_name, "%s", prop.name);
  blas_ws_bytes = cb.set_workspace == NULL ? 0 : prop.major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
  thread_device = device;
  __atomic_store_n(&cur_device, device, __ATOMIC_RELEASE);
  return GPU_OK;
}

static gpu_status cu_init(int device) {
  pthread_mutex_lock(&life_lock);
  gpu_status st = init_locked(device);
  pthread_mutex_unlock(&life_lock);
  return st;
}

static void cu_shutdown(void) {
  pthread_mutex_lock(&life_lock);
  if (cur_device >= 0) {
    /* the work still queued completes first; errors here have no caller to
     * go to but last_error() */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) cuda_fail(e, "cudaDeviceSynchronize at shutdown");
    cublasStatus_t bs = cb.destroy(blas);
    if (bs != CUBLAS_STATUS_SUCCESS) cublas_fail(bs, "cublasDestroy");
    __atomic_store_n(&cur_device, -1, __ATOMIC_RELEASE);
    snprintf(dev_name, sizeof dev_name, "cuda (not initialised)");
  }
  pthread_mutex_unlock(&life_lock);
}

static const char *cu_last_error(void) { return last_msg; }
static const char *cu_device_name(void) { return dev_name; }
static int cu_ledger_device(void) {
  int d = __atomic_load_n(&cur_device, __ATOMIC_ACQUIRE);
  return d >= 0 ? d : 0;
}

/* GPU_OK when init has run, and this thread's current device is its. */
static gpu_status need_init(const char *what) {
  int d = __atomic_load_n(&cur_device, __ATOMIC_ACQUIRE);
  if (d < 0) return fail(GPU_EINVAL, "cuda: %s before init", what);
  if (thread_device != d) {
    CU(cudaSetDevice(d), "cudaSetDevice on a new thread");
    thread_device = d;
  }
  return GPU_OK;
}

#define NEED_INIT()                                                                                        \
  do {                                                                                                     \
    gpu_status st_ = need_init(__func__ + 3);                                                              \
    if (st_ != GPU_OK) return st_;                                                                         \
  } while (0)

/* ---- memory ----------------------------------------------------------------- */

static gpu_status cu_alloc(void **ptr, size_t bytes) {
  ARG(ptr != NULL, "cuda alloc: ptr is NULL");
  *ptr = NULL;
  NEED_INIT();
  ARG(bytes > 0, "cuda alloc: 0 bytes");
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return fail(GPU_ENOMEM, "cuda alloc: %zu bytes: out of device memory (cudaMalloc: %s)", bytes,
                cudaGetErrorString(e));
  }
  CU(e, "cudaMalloc");
  *ptr = p;
  return GPU_OK;
}

static gpu_status cu_free(void *ptr) {
  if (ptr == NULL) return GPU_OK;
  NEED_INIT();
  CU(cudaFree(ptr), "cudaFree");
  return GPU_OK;
}

static gpu_status cu_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  ARG(free_bytes != NULL && total_bytes != NULL, "cuda mem_get_info: NULL output");
  NEED_INIT();
  CU(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
  return GPU_OK;
}

static gpu_status copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, gpu_stream s,
                       const char *what) {
  if (bytes == 0) return GPU_OK;
  ARG(dst != NULL && src != NULL, "cuda %s: NULL pointer (dst %p, src %p) for %zu bytes", what, dst, src, bytes);
  NEED_INIT();
  CU(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)s), what);
  return GPU_OK;
}

static gpu_status cu_memcpy_h2d(void *dst, const void *src, size_t bytes, gpu_stream s) {
  return copy(dst, src, bytes, cudaMemcpyHostToDevice, s, "memcpy_h2d");
}
static gpu_status cu_memcpy_d2h(void *dst, const void *src, size_t bytes, gpu_stream s) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToHost, s, "memcpy_d2h");
}
static gpu_status cu_memcpy_d2d(void *dst, const void *src, size_t bytes, gpu_stream s) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s, "memcpy_d2d");
}

static gpu_status cu_memset(void *dst, int byte, size_t bytes, gpu_stream s) {
  if (bytes == 0) return GPU_OK;
  ARG(dst != NULL, "cuda memset: dst is NULL for %zu bytes", bytes);
  NEED_INIT();
  CU(cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)s), "cudaMemsetAsync");
  return GPU_OK;
}

/* ---- streams and events ------------------------------------------------------- */

static gpu_status cu_stream_create(gpu_stream *s) {
  ARG(s != NULL, "cuda stream_create: NULL output");
  *s = NULL;
  NEED_INIT();
  cudaStream_t cs;
  CU(cudaStreamCreate(&cs), "cudaStreamCreate");
  *s = (gpu_stream)cs;
  return GPU_OK;
}

static gpu_status cu_stream_destroy(gpu_stream s) {
  ARG(s != NULL, "cuda stream_destroy: the default stream is not destroyed");
  NEED_INIT();
  CU(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize before destroying the stream");
  CU(cudaStreamDestroy((cudaStream_t)s), "cudaStreamDestroy");
  return GPU_OK;
}

static gpu_status cu_stream_synchronize(gpu_stream s) {
  NEED_INIT();
  CU(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
  return GPU_OK;
}

static gpu_status cu_stream_wait_event(gpu_stream s, gpu_event e) {
  ARG(e != NULL, "cuda stream_wait_event: NULL event");
  NEED_INIT();
  CU(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
  return GPU_OK;
}

static gpu_status cu_event_create(gpu_event *e) {
  ARG(e != NULL, "cuda event_create: NULL output");
  *e = NULL;
  NEED_INIT();
  cudaEvent_t ce;
  CU(cudaEventCreateWithFlags(&ce, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  *e = (gpu_event)ce;
  return GPU_OK;
}

static gpu_status cu_event_record(gpu_event e, gpu_stream s) {
  ARG(e != NULL, "cuda event_record: NULL event");
  NEED_INIT();
  CU(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "cudaEventRecord");
  return GPU_OK;
}

static gpu_status cu_event_query(gpu_event e) {
  ARG(e != NULL, "cuda event_query: NULL event");
  NEED_INIT();
  cudaError_t r = cudaEventQuery((cudaEvent_t)e);
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();   /* not an error: no launch may see it later */
    return GPU_ENOTREADY;
  }
  CU(r, "cudaEventQuery");
  return GPU_OK;
}

static gpu_status cu_event_synchronize(gpu_event e) {
  ARG(e != NULL, "cuda event_synchronize: NULL event");
  NEED_INIT();
  CU(cudaEventSynchronize((cudaEvent_t)e), "cudaEventSynchronize");
  return GPU_OK;
}

static gpu_status cu_event_destroy(gpu_event e) {
  ARG(e != NULL, "cuda event_destroy: NULL event");
  NEED_INIT();
  CU(cudaEventDestroy((cudaEvent_t)e), "cudaEventDestroy");
  return GPU_OK;
}

static gpu_status cu_device_synchronize(void) {
  NEED_INIT();
  CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return GPU_OK;
}

/* ---- sgemm -------------------------------------------------------------------- */

/* Row-major C = alpha op(A) op(B) + beta C is column-major
 * C^T = alpha op(B)^T op(A)^T + beta C^T, and a row-major matrix read
 * column-major is its transpose: so cuBLAS gets B before A, n before m, and
 * the same transpose flags and leading dimensions. */
static gpu_status gemm(gpu_trans ta, gpu_trans tb, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc, gpu_stream s) {
  pthread_mutex_lock(&blas_lock);
  cublasStatus_t st = cb.set_stream(blas, (cudaStream_t)s);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cb.sgemm(blas, tb == GPU_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N, ta == GPU_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N,
                     n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
  pthread_mutex_unlock(&blas_lock);
  if (st != CUBLAS_STATUS_SUCCESS) return cublas_fail(st, "cublasSgemm");
  return GPU_OK;
}

static int imax1(int a) { return a > 1 ? a : 1; }

static gpu_status cu_sgemm(gpu_trans ta, gpu_trans tb, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc, gpu_stream s) {
  ARG(m >= 0 && n >= 0 && k >= 0, "cuda sgemm: m %d, n %d, k %d: want >= 0", m, n, k);
  ARG((ta == GPU_NO_TRANS || ta == GPU_TRANS) && (tb == GPU_NO_TRANS || tb == GPU_TRANS),
      "cuda sgemm: transpose flags %d, %d: want GPU_NO_TRANS or GPU_TRANS", (int)ta, (int)tb);
  ARG(lda >= imax1(ta ? m : k) && ldb >= imax1(tb ? k : n) && ldc >= imax1(n),
      "cuda sgemm: row strides lda %d, ldb %d, ldc %d too small for m %d, n %d, k %d", lda, ldb, ldc, m, n, k);
  if (m == 0 || n == 0) return GPU_OK;
  ARG(c != NULL && (k == 0 || (a != NULL && b != NULL)), "cuda sgemm: NULL matrix");
  NEED_INIT();
  return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, s);
}

/* ---- fill, copy, elementwise ----------------------------------------------------- */

/* The checks every n-element kernel entry makes. */
#define ELEMS(n, ...)                                                                                      \
  do {                                                                                                     \
    ARG((n) >= 0, "cuda %s: n %lld: want >= 0", __func__ + 3, (long long)(n));                             \
    if ((n) == 0) return GPU_OK;                                                                           \
    ARG(__VA_ARGS__, "cuda %s: NULL pointer for %lld elements", __func__ + 3, (long long)(n));              \
    NEED_INIT();                                                                                           \
  } while (0)

static gpu_status cu_fill(float *out, float value, int64_t n, gpu_stream s) {
  ELEMS(n, out != NULL);
  LAUNCH(_gcu_fill((cudaStream_t)s, out, n, value), "fill kernel");
  return GPU_OK;
}

static gpu_status cu_fill_i32(int32_t *out, int32_t value, int64_t n, gpu_stream s) {
  ELEMS(n, out != NULL);
  LAUNCH(_gcu_fill_i32((cudaStream_t)s, out, n, value), "fill_i32 kernel");
  return GPU_OK;
}

static gpu_status cu_copy_strided(float *dst, const float *src, int ndim, const int64_t *shape,
                                  const int64_t *src_stride, gpu_stream s) {
  ARG(ndim >= 1 && ndim <= GCU_MAX_DIMS, "cuda copy_strided: ndim %d: want 1 .. %d", ndim, GCU_MAX_DIMS);
  ARG(shape != NULL && src_stride != NULL, "cuda copy_strided: NULL shape or strides");
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    ARG(shape[d] >= 0, "cuda copy_strided: shape[%d] = %lld: want >= 0", d, (long long)shape[d]);
    n *= shape[d];
  }
  ELEMS(n, dst != NULL && src != NULL);
  LAUNCH(_gcu_copy_strided((cudaStream_t)s, dst, src, ndim, shape, src_stride), "copy_strided kernel");
  return GPU_OK;
}

static gpu_status binary(gcu_binary op, float *out, const float *a, const float *b, int64_t n, gpu_stream s,
                         const char *what) {
  ARG(n >= 0, "cuda %s: n %lld: want >= 0", what, (long long)n);
  if (n == 0) return GPU_OK;
  ARG(out != NULL && a != NULL && b != NULL, "cuda %s: NULL pointer for %lld elements", what, (long long)n);
  NEED_INIT();
  LAUNCH(_gcu_binary((cudaStream_t)s, op, out, a, b, n), what);
  return GPU_OK;
}

static gpu_status cu_add(float *out, const float *a, const float *b, int64_t n, gpu_stream s) {
  return binary(GCU_ADD, out, a, b, n, s, "add");
}
static gpu_status cu_sub(float *out, const float *a, const float *b, int64_t n, gpu_stream s) {
  return binary(GCU_SUB, out, a, b, n, s, "sub");
}
static gpu_status cu_mul(float *out, const float *a, const float *b, int64_t n, gpu_stream s) {
  return binary(GCU_MUL, out, a, b, n, s, "mul");
}
static gpu_status cu_div(float *out, const float *a, const float *b, int64_t n, gpu_stream s) {
  return binary(GCU_DIV, out, a, b, n, s, "div");
}

static gpu_status cu_axpby(float *out, float alpha, const float *a, float beta, const float *b, int64_t n,
                           gpu_stream s) {
  ELEMS(n, out != NULL && a != NULL && b != NULL);
  LAUNCH(_gcu_axpby((cudaStream_t)s, out, alpha, a, beta, b, n), "axpby kernel");
  return GPU_OK;
}

static gpu_status unary(gcu_unary op, float *out, const float *x, float arg, int64_t n, gpu_stream s,
                        const char *what) {
  ARG(n >= 0, "cuda %s: n %lld: want >= 0", what, (long long)n);
  if (n == 0) return GPU_OK;
  ARG(out != NULL && x != NULL, "cuda %s: NULL pointer for %lld elements", what, (long long)n);
  NEED_INIT();
  LAUNCH(_gcu_unary((cudaStream_t)s, op, out, x, n, arg), what);
  return GPU_OK;
}

static gpu_status cu_scale(float *out, const float *a, float s_, int64_t n, gpu_stream s) {
  return unary(GCU_SCALE, out, a, s_, n, s, "scale");
}
static gpu_status cu_add_scalar(float *out, const float *a, float s_, int64_t n, gpu_stream s) {
  return unary(GCU_ADD_SCALAR, out, a, s_, n, s, "add_scalar");
}
static gpu_status cu_relu(float *out, const float *x, int64_t n, gpu_stream s) {
  return unary(GCU_RELU, out, x, 0, n, s, "relu");
}
static gpu_status cu_tanh(float *out, const float *x, int64_t n, gpu_stream s) {
  return unary(GCU_TANH, out, x, 0, n, s, "tanh");
}
static gpu_status cu_sigmoid(float *out, const float *x, int64_t n, gpu_stream s) {
  return unary(GCU_SIGMOID, out, x, 0, n, s, "sigmoid");
}
static gpu_status cu_exp(float *out, const float *x, int64_t n, gpu_stream s) {
  return unary(GCU_EXP, out, x, 0, n, s, "exp");
}
static gpu_status cu_log(float *out, const float *x, int64_t n, gpu_stream s) {
  return unary(GCU_LOG, out, x, 0, n, s, "log");
}

static gpu_status act_grad(gcu_act_grad op, float *dx, const float *dy, const float *y, int64_t n, gpu_stream s,
                           const char *what) {
  ARG(n >= 0, "cuda %s: n %lld: want >= 0", what, (long long)n);
  if (n == 0) return GPU_OK;
  ARG(dx != NULL && dy != NULL && y != NULL, "cuda %s: NULL pointer for %lld elements", what, (long long)n);
  NEED_INIT();
  LAUNCH(_gcu_act_grad((cudaStream_t)s, op, dx, dy, y, n), what);
  return GPU_OK;
}

static gpu_status cu_relu_bwd(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s) {
  return act_grad(GCU_RELU_GRAD, dx, dy, y, n, s, "relu_bwd");
}
static gpu_status cu_tanh_bwd(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s) {
  return act_grad(GCU_TANH_GRAD, dx, dy, y, n, s, "tanh_bwd");
}
static gpu_status cu_sigmoid_bwd(float *dx, const float *dy, const float *y, int64_t n, gpu_stream s) {
  return act_grad(GCU_SIGMOID_GRAD, dx, dy, y, n, s, "sigmoid_bwd");
}

/* The checks of an entry over [a, b, c] sizes: each >= 0; nothing to do
 * when their product is 0. */
#define DIMS3(a, b, c, ...)                                                                                \
  do {                                                                                                     \
    ARG((a) >= 0 && (b) >= 0 && (c) >= 0, "cuda %s: sizes %lld, %lld, %lld: want >= 0", __func__ + 3,     \
        (long long)(a), (long long)(b), (long long)(c));                                                   \
    if ((a) == 0 || (b) == 0 || (c) == 0) return GPU_OK;                                                   \
    ARG(__VA_ARGS__, "cuda %s: NULL pointer", __func__ + 3);                                                \
    NEED_INIT();                                                                                           \
  } while (0)

static gpu_status cu_bias_add_rows(float *out, const float *x, const float *bias, int64_t rows, int64_t cols,
                                   gpu_stream s) {
  DIMS3(rows, cols, 1, out != NULL && x != NULL && bias != NULL);
  LAUNCH(_gcu_binary_bcast((cudaStream_t)s, GCU_ADD, out, x, bias, rows, cols, 1), "bias_add_rows kernel");
  return GPU_OK;
}

static gpu_status cu_bias_add_channels(float *out, const float *x, const float *bias, int64_t n, int64_t c,
                                       int64_t hw, gpu_stream s) {
  DIMS3(n, c, hw, out != NULL && x != NULL && bias != NULL);
  LAUNCH(_gcu_binary_bcast((cudaStream_t)s, GCU_ADD, out, x, bias, n, c, hw), "bias_add_channels kernel");
  return GPU_OK;
}

/* ---- reductions ---------------------------------------------------------------------- */

/* out [count] = 0: the sum over an empty axis. */
static gpu_status zeros(float *out, int64_t count, gpu_stream s, const char *what) {
  if (count == 0) return GPU_OK;
  ARG(out != NULL, "cuda %s: NULL output", what);
  NEED_INIT();
  LAUNCH(_gcu_fill((cudaStream_t)s, out, count, 0.0f), what);
  return GPU_OK;
}

static gpu_status cu_sum_all(float *out1, const float *x, int64_t n, gpu_stream s) {
  ARG(n >= 0 && out1 != NULL, "cuda sum_all: n %lld (want >= 0), out %p", (long long)n, (void *)out1);
  if (n == 0) return zeros(out1, 1, s, "sum_all");
  ARG(x != NULL, "cuda sum_all: x is NULL");
  NEED_INIT();
  LAUNCH(_gcu_reduce((cudaStream_t)s, GCU_SUM, out1, NULL, x, 1, n, 1), "sum_all kernel");
  return GPU_OK;
}

static gpu_status cu_sum_rows(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  ARG(rows >= 0 && cols >= 0, "cuda sum_rows: rows %lld, cols %lld: want >= 0", (long long)rows, (long long)cols);
  if (rows == 0) return zeros(out, cols, s, "sum_rows");
  DIMS3(rows, cols, 1, out != NULL && x != NULL);
  LAUNCH(_gcu_reduce((cudaStream_t)s, GCU_SUM, out, NULL, x, 1, rows, cols), "sum_rows kernel");
  return GPU_OK;
}

static gpu_status cu_sum_cols(float *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  ARG(rows >= 0 && cols >= 0, "cuda sum_cols: rows %lld, cols %lld: want >= 0", (long long)rows, (long long)cols);
  if (cols == 0) return zeros(out, rows, s, "sum_cols");
  DIMS3(rows, cols, 1, out != NULL && x != NULL);
  LAUNCH(_gcu_reduce((cudaStream_t)s, GCU_SUM, out, NULL, x, rows, cols, 1), "sum_cols kernel");
  return GPU_OK;
}

static gpu_status cu_sum_channels(float *out, const float *x, int64_t n, int64_t c, int64_t hw, gpu_stream s) {
  ARG(n >= 0 && c >= 0 && hw >= 0, "cuda sum_channels: sizes %lld, %lld, %lld: want >= 0", (long long)n,
      (long long)c, (long long)hw);
  if (n == 0 || hw == 0) return zeros(out, c, s, "sum_channels");
  DIMS3(n, c, hw, out != NULL && x != NULL);
  LAUNCH(_gcu_bias_grad((cudaStream_t)s, out, x, n, c, hw), "sum_channels kernel");
  return GPU_OK;
}

static gpu_status cu_argmax_rows(int32_t *out, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  ARG(rows >= 0 && cols >= 1 && cols <= INT32_MAX, "cuda argmax_rows: rows %lld, cols %lld: want >= 0 and 1 .. 2^31-1",
      (long long)rows, (long long)cols);
  DIMS3(rows, cols, 1, out != NULL && x != NULL);
  LAUNCH(_gcu_reduce((cudaStream_t)s, GCU_MAX, NULL, out, x, rows, cols, 1), "argmax_rows kernel");
  return GPU_OK;
}

/* ---- convolution --------------------------------------------------------------------- */

/* p as the kernels' geometry, with the chunk of images one product covers
 * (the workspace holds col [C*KH*KW, nb*P] and t [O, nb*P]); false when p
 * is not a valid geometry. */
static bool conv_geom(const gpu_conv2d *p, gcu_conv *g, int64_t *nb) {
  if (p == NULL || p->n < 0 || p->c < 1 || p->h < 1 || p->w < 1 || p->o < 1 || p->kh < 1 || p->kw < 1 ||
      p->stride < 1 || p->pad < 0 || p->oh < 1 || p->ow < 1 || p->oh != (p->h + 2 * p->pad - p->kh) / p->stride + 1 ||
      p->ow != (p->w + 2 * p->pad - p->kw) / p->stride + 1)
    return false;
  *g = (gcu_conv){ .N = p->n, .C = p->c, .H = p->h, .W = p->w, .O = p->o, .KH = p->kh, .KW = p->kw,
                   .OH = p->oh, .OW = p->ow, .stride = p->stride, .pad = p->pad };
  int64_t P = g->OH * g->OW, per_image = (g->C * g->KH * g->KW + g->O) * P * (int64_t)sizeof(float);
  int64_t fit = (int64_t)CONV_WS_MAX / per_image;
  *nb = fit < 1 ? 1 : fit < g->N ? fit : g->N;
  /* cuBLAS takes int sizes: the chunk's columns, and C*KH*KW */
  while (*nb > 1 && *nb * P > INT_MAX) (*nb)--;
  return *nb * P <= INT_MAX && g->C * g->KH * g->KW <= INT_MAX;
}

static size_t cu_conv2d_workspace(const gpu_conv2d *p) {
  gcu_conv g;
  int64_t nb;
  if (!conv_geom(p, &g, &nb) || g.N == 0) return 0;
  return (size_t)((g.C * g.KH * g.KW + g.O) * nb * g.OH * g.OW) * sizeof(float);
}

#define CONV_ARGS(p, g, nb, ...)                                                                           \
  do {                                                                                                     \
    ARG(conv_geom(p, &g, &nb), "cuda %s: not a conv2d geometry (gpu_conv2d_init makes one)", __func__ + 3); \
    if (g.N == 0) return GPU_OK;                                                                           \
    ARG(__VA_ARGS__, "cuda %s: NULL pointer (the workspace: %zu bytes)", __func__ + 3, cu_conv2d_workspace(p)); \
    NEED_INIT();                                                                                           \
  } while (0)

static gpu_status cu_conv2d_fwd(const gpu_conv2d *p, float *y, const float *x, const float *w, const float *bias,
                                void *ws, gpu_stream s) {
  gcu_conv g;
  int64_t nb;
  CONV_ARGS(p, g, nb, y != NULL && x != NULL && w != NULL && ws != NULL);
  cudaStream_t cs = (cudaStream_t)s;
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW;
  float *col = ws, *t = col + CKK * nb * P;
  for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
    int64_t k = g.N - n0 < nb ? g.N - n0 : nb, cols = k * P;
    LAUNCH(_gcu_im2col(cs, &g, x, n0, k, col), "conv2d_fwd im2col kernel");
    /* t [O, cols] = w [O, CKK] @ col [CKK, cols] */
    gpu_status st = gemm(GPU_NO_TRANS, GPU_NO_TRANS, (int)g.O, (int)cols, (int)CKK, 1.0f, w, (int)CKK, col,
                         (int)cols, 0.0f, t, (int)cols, s);
    if (st != GPU_OK) return st;
    LAUNCH(_gcu_conv_unpack(cs, &g, t, bias, n0, k, y), "conv2d_fwd unpack kernel");
  }
  return GPU_OK;
}

static gpu_status cu_conv2d_bwd_data(const gpu_conv2d *p, float *dx, const float *dy, const float *w, void *ws,
                                     gpu_stream s) {
  gcu_conv g;
  int64_t nb;
  CONV_ARGS(p, g, nb, dx != NULL && dy != NULL && w != NULL && ws != NULL);
  cudaStream_t cs = (cudaStream_t)s;
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW;
  float *dcol = ws, *t = dcol + CKK * nb * P;
  for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
    int64_t k = g.N - n0 < nb ? g.N - n0 : nb, cols = k * P;
    LAUNCH(_gcu_conv_pack(cs, &g, dy, n0, k, t), "conv2d_bwd_data pack kernel");
    /* dcol [CKK, cols] = w^T [CKK, O] @ t [O, cols] */
    gpu_status st = gemm(GPU_TRANS, GPU_NO_TRANS, (int)CKK, (int)cols, (int)g.O, 1.0f, w, (int)CKK, t, (int)cols,
                         0.0f, dcol, (int)cols, s);
    if (st != GPU_OK) return st;
    LAUNCH(_gcu_col2im(cs, &g, dcol, n0, k, dx), "conv2d_bwd_data col2im kernel");
  }
  return GPU_OK;
}

static gpu_status cu_conv2d_bwd_weight(const gpu_conv2d *p, float *dw, const float *dy, const float *x, void *ws,
                                       gpu_stream s) {
  gcu_conv g;
  int64_t nb;
  ARG(conv_geom(p, &g, &nb), "cuda conv2d_bwd_weight: not a conv2d geometry (gpu_conv2d_init makes one)");
  if (g.N == 0) return zeros(dw, g.O * g.C * g.KH * g.KW, s, "conv2d_bwd_weight");
  CONV_ARGS(p, g, nb, dw != NULL && dy != NULL && x != NULL && ws != NULL);
  cudaStream_t cs = (cudaStream_t)s;
  int64_t CKK = g.C * g.KH * g.KW, P = g.OH * g.OW;
  float *col = ws, *t = col + CKK * nb * P;
  for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
    int64_t k = g.N - n0 < nb ? g.N - n0 : nb, cols = k * P;
    LAUNCH(_gcu_im2col(cs, &g, x, n0, k, col), "conv2d_bwd_weight im2col kernel");
    LAUNCH(_gcu_conv_pack(cs, &g, dy, n0, k, t), "conv2d_bwd_weight pack kernel");
    /* dw [O, CKK] (+)= t [O, cols] @ col^T [cols, CKK] */
    gpu_status st = gemm(GPU_NO_TRANS, GPU_TRANS, (int)g.O, (int)CKK, (int)cols, 1.0f, t, (int)cols, col,
                         (int)cols, n0 == 0 ? 0.0f : 1.0f, dw, (int)CKK, s);
    if (st != GPU_OK) return st;
  }
  return GPU_OK;
}

/* ---- pooling -------------------------------------------------------------------------- */

static bool pool_ok(const gpu_pool2d *p) {
  return p != NULL && p->n >= 0 && p->c >= 0 && p->k >= 1 && p->stride >= 1 && p->h >= p->k && p->w >= p->k &&
         p->oh == (p->h - p->k) / p->stride + 1 && p->ow == (p->w - p->k) / p->stride + 1;
}

#define POOL_ARGS(p, ...)                                                                                  \
  do {                                                                                                     \
    ARG(pool_ok(p), "cuda %s: not a pooling geometry (gpu_pool2d_init makes one)", __func__ + 3);          \
    if (p->n == 0 || p->c == 0) return GPU_OK;                                                             \
    ARG(__VA_ARGS__, "cuda %s: NULL pointer", __func__ + 3);                                                \
    NEED_INIT();                                                                                           \
  } while (0)

static gpu_status cu_max_pool_fwd(const gpu_pool2d *p, float *y, int32_t *argmax, const float *x, gpu_stream s) {
  POOL_ARGS(p, y != NULL && argmax != NULL && x != NULL);
  LAUNCH(_gcu_max_pool((cudaStream_t)s, y, argmax, x, (int64_t)p->n * p->c, p->h, p->w, p->k, p->stride),
         "max_pool_fwd kernel");
  return GPU_OK;
}

static gpu_status cu_max_pool_bwd(const gpu_pool2d *p, float *dx, const float *dy, const int32_t *argmax,
                                  gpu_stream s) {
  POOL_ARGS(p, dx != NULL && dy != NULL && argmax != NULL);
  LAUNCH(_gcu_max_pool_grad((cudaStream_t)s, dx, dy, argmax, (int64_t)p->n * p->c, p->h, p->w, p->k, p->stride),
         "max_pool_bwd kernel");
  return GPU_OK;
}

static gpu_status cu_avg_pool_fwd(const gpu_pool2d *p, float *y, const float *x, gpu_stream s) {
  POOL_ARGS(p, y != NULL && x != NULL);
  LAUNCH(_gcu_avg_pool((cudaStream_t)s, y, x, (int64_t)p->n * p->c, p->h, p->w, p->k, p->stride),
         "avg_pool_fwd kernel");
  return GPU_OK;
}

static gpu_status cu_avg_pool_bwd(const gpu_pool2d *p, float *dx, const float *dy, gpu_stream s) {
  POOL_ARGS(p, dx != NULL && dy != NULL);
  LAUNCH(_gcu_avg_pool_grad((cudaStream_t)s, dx, dy, (int64_t)p->n * p->c, p->h, p->w, p->k, p->stride),
         "avg_pool_bwd kernel");
  return GPU_OK;
}

/* ---- softmax, cross-entropy, embedding ------------------------------------------------------ */

static gpu_status cu_softmax_rows(float *y, const float *x, int64_t rows, int64_t cols, gpu_stream s) {
  DIMS3(rows, cols, 1, y != NULL && x != NULL);
  LAUNCH(_gcu_softmax((cudaStream_t)s, y, x, rows, cols), "softmax_rows kernel");
  return GPU_OK;
}

static gpu_status cu_softmax_bwd(float *dx, const float *dy, const float *y, int64_t rows, int64_t cols,
                                 gpu_stream s) {
  DIMS3(rows, cols, 1, dx != NULL && dy != NULL && y != NULL);
  ARG(dx != dy && dx != y, "cuda softmax_bwd: dx must not be dy or y");
  LAUNCH(_gcu_softmax_grad((cudaStream_t)s, dx, dy, y, rows, cols), "softmax_bwd kernel");
  return GPU_OK;
}

static gpu_status cu_softmax_xent_fwd(float *probs, float *loss1, const float *logits, const int32_t *labels,
                                      int64_t rows, int64_t cols, gpu_stream s) {
  ARG(rows >= 0 && cols >= 1, "cuda softmax_xent_fwd: rows %lld, cols %lld: want >= 0 and >= 1", (long long)rows,
      (long long)cols);
  ARG(loss1 != NULL && (rows == 0 || (probs != NULL && logits != NULL && labels != NULL)),
      "cuda softmax_xent_fwd: NULL pointer");
  NEED_INIT();
  cudaStream_t cs = (cudaStream_t)s;
  /* the loss first: probs may be logits (in place) */
  LAUNCH(_gcu_cross_entropy(cs, loss1, logits, labels, rows, cols), "softmax_xent_fwd loss kernel");
  if (rows > 0) LAUNCH(_gcu_softmax(cs, probs, logits, rows, cols), "softmax_xent_fwd softmax kernel");
  return GPU_OK;
}

static gpu_status cu_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, float dloss,
                                      int64_t rows, int64_t cols, gpu_stream s) {
  DIMS3(rows, cols, 1, dlogits != NULL && probs != NULL && labels != NULL);
  LAUNCH(_gcu_cross_entropy_grad((cudaStream_t)s, dlogits, probs, labels, rows, cols, dloss / (float)rows),
         "softmax_xent_bwd kernel");
  return GPU_OK;
}

static gpu_status cu_embedding_fwd(float *out, const float *weight, const int32_t *idx, int64_t n, int64_t dim,
                                   int64_t vocab, gpu_stream s) {
  ARG(vocab >= 0, "cuda embedding_fwd: vocab %lld: want >= 0", (long long)vocab);
  DIMS3(n, dim, 1, out != NULL && idx != NULL && (weight != NULL || vocab == 0));
  LAUNCH(_gcu_embedding((cudaStream_t)s, out, weight, idx, n, vocab, dim), "embedding_fwd kernel");
  return GPU_OK;
}

static gpu_status cu_embedding_bwd(float *dweight, const float *dout, const int32_t *idx, int64_t n, int64_t dim,
                                   int64_t vocab, gpu_stream s) {
  ARG(vocab >= 0, "cuda embedding_bwd: vocab %lld: want >= 0", (long long)vocab);
  DIMS3(n, dim, vocab, dweight != NULL && dout != NULL && idx != NULL);
  LAUNCH(_gcu_embedding_grad((cudaStream_t)s, dweight, dout, idx, n, vocab, dim), "embedding_bwd kernel");
  return GPU_OK;
}

/* ---- optimizers ------------------------------------------------------------------------------ */

static gpu_status cu_sgd_step(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                              float weight_decay, int first, gpu_stream s) {
  ELEMS(n, p != NULL && g != NULL && (momentum == 0.0f || buf != NULL));
  LAUNCH(_gcu_sgd((cudaStream_t)s, p, g, buf, n, lr, momentum, weight_decay, first), "sgd_step kernel");
  return GPU_OK;
}

static gpu_status cu_adam_step(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, int64_t t, gpu_stream s) {
  ARG(t >= 1, "cuda adam_step: step %lld: want >= 1", (long long)t);
  ELEMS(n, p != NULL && g != NULL && m != NULL && v != NULL);
  LAUNCH(_gcu_adam((cudaStream_t)s, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t), "adam_step kernel");
  return GPU_OK;
}

/* ---- cuBLAS's workspace from the caller (its pool: on the ledger) -------------------------------- */

static size_t cu_blas_workspace_size(void) {
  return __atomic_load_n(&cur_device, __ATOMIC_ACQUIRE) >= 0 ? blas_ws_bytes : 0;
}

static gpu_status cu_set_blas_workspace(void *ws, size_t bytes) {
  NEED_INIT();
  ARG(cb.set_workspace != NULL, "cuda set_blas_workspace: this cuBLAS has no cublasSetWorkspace");
  ARG((ws == NULL) == (bytes == 0), "cuda set_blas_workspace: %p and %zu bytes: both or neither", ws, bytes);
  ARG(((uintptr_t)ws & 255) == 0, "cuda set_blas_workspace: %p is not 256-byte aligned", ws);
  pthread_mutex_lock(&blas_lock);
  cublasStatus_t st = cb.set_workspace(blas, ws, bytes);
  pthread_mutex_unlock(&blas_lock);
  return st == CUBLAS_STATUS_SUCCESS ? GPU_OK : cublas_fail(st, "cublasSetWorkspace");
}

/* ---- the table ----------------------------------------------------------------------------------- */

static const gpu_backend table = {
  .abi = GPU_BACKEND_ABI,
  .name = "cuda",
  .init = cu_init,
  .shutdown = cu_shutdown,
  .last_error = cu_last_error,
  .device_name = cu_device_name,
  .ledger_device = cu_ledger_device,
  .alloc = cu_alloc,
  .free = cu_free,
  .mem_get_info = cu_mem_get_info,
  .memcpy_h2d = cu_memcpy_h2d,
  .memcpy_d2h = cu_memcpy_d2h,
  .memcpy_d2d = cu_memcpy_d2d,
  .memset = cu_memset,
  .stream_create = cu_stream_create,
  .stream_destroy = cu_stream_destroy,
  .stream_synchronize = cu_stream_synchronize,
  .stream_wait_event = cu_stream_wait_event,
  .event_create = cu_event_create,
  .event_record = cu_event_record,
  .event_query = cu_event_query,
  .event_synchronize = cu_event_synchronize,
  .event_destroy = cu_event_destroy,
  .device_synchronize = cu_device_synchronize,
  .sgemm = cu_sgemm,
  .fill = cu_fill,
  .fill_i32 = cu_fill_i32,
  .copy_strided = cu_copy_strided,
  .add = cu_add,
  .sub = cu_sub,
  .mul = cu_mul,
  .div = cu_div,
  .axpby = cu_axpby,
  .scale = cu_scale,
  .add_scalar = cu_add_scalar,
  .relu = cu_relu,
  .tanh = cu_tanh,
  .sigmoid = cu_sigmoid,
  .exp = cu_exp,
  .log = cu_log,
  .relu_bwd = cu_relu_bwd,
  .tanh_bwd = cu_tanh_bwd,
  .sigmoid_bwd = cu_sigmoid_bwd,
  .bias_add_rows = cu_bias_add_rows,
  .bias_add_channels = cu_bias_add_channels,
  .sum_all = cu_sum_all,
  .sum_rows = cu_sum_rows,
  .sum_cols = cu_sum_cols,
  .sum_channels = cu_sum_channels,
  .argmax_rows = cu_argmax_rows,
  .conv2d_workspace = cu_conv2d_workspace,
  .conv2d_fwd = cu_conv2d_fwd,
  .conv2d_bwd_data = cu_conv2d_bwd_data,
  .conv2d_bwd_weight = cu_conv2d_bwd_weight,
  .max_pool_fwd = cu_max_pool_fwd,
  .max_pool_bwd = cu_max_pool_bwd,
  .avg_pool_fwd = cu_avg_pool_fwd,
  .avg_pool_bwd = cu_avg_pool_bwd,
  .softmax_rows = cu_softmax_rows,
  .softmax_bwd = cu_softmax_bwd,
  .softmax_xent_fwd = cu_softmax_xent_fwd,
  .softmax_xent_bwd = cu_softmax_xent_bwd,
  .embedding_fwd = cu_embedding_fwd,
  .embedding_bwd = cu_embedding_bwd,
  .sgd_step = cu_sgd_step,
  .adam_step = cu_adam_step,
  .blas_workspace_size = cu_blas_workspace_size,
  .set_blas_workspace = cu_set_blas_workspace,
};

/* The table; the loader calls init.  Never NULL: whether a driver and a
 * device are there is init's answer (GPU_ENODRIVER, GPU_ENODEVICE). */
EXPORT const gpu_backend *gpu_cuda_backend(const char **why) {
  if (why) *why = NULL;
  return &table;
}
