/* rt.c - a stand-in CUDA runtime: built into a test program (the shape of
 * nvcc's default, the static runtime) and as libcudart.so.13 (the shared
 * runtime).  As the real ones do, it dlopens libcuda.so.1, takes
 * cuGetProcAddress_v2 from that handle with dlsym, and gets every driver
 * function through it (the async ones in their per-thread form for the
 * _ptsz entry points).  Its functions are named as the runtime's are
 * (cudaXxx, __cudart...), which is how the auditor hides them. */
#include "rt.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define NOIPA __attribute__((noipa))
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t, int *);

static proc_v2_fn get_proc;

NOIPA static void *__cudart_driver(const char *name, int per_thread) {
  if (get_proc == NULL) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      fprintf(stderr, "rt: %s\n", dlerror());
      exit(3);
    }
    *(void **)&get_proc = dlsym(h, "cuGetProcAddress_v2");
    if (get_proc == NULL) {
      fprintf(stderr, "rt: no cuGetProcAddress_v2\n");
      exit(3);
    }
  }
  void *fn = NULL;
  int status = -1;
  if (get_proc(name, &fn, 13000, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &status) != 0 ||
      fn == NULL || status != 0) {
    fprintf(stderr, "rt: no driver function %s\n", name);
    exit(3);
  }
  return fn;
}

/* The driver function name, fetched once, of type T. */
#define DRIVER(T, name, per_thread) \
  static __typeof__(T) fn_; \
  if (fn_ == NULL) *(void **)&fn_ = __cudart_driver(name, per_thread)

/* The static runtime's internal functions are named libcudart_static_<hash>. */
NOIPA int libcudart_static_4d2a(CUresult (*fn)(CUdeviceptr *, size_t), CUdeviceptr *p, size_t n) {
  return fn(p, n);
}

NOIPA int cudaMalloc(CUdeviceptr *p, size_t n) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t), "cuMemAlloc", 0);
  return libcudart_static_4d2a(fn_, p, n);
}

NOIPA int cudaMallocPitch(CUdeviceptr *p, size_t *pitch, size_t width, size_t height) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned), "cuMemAllocPitch", 0);
  return fn_(p, pitch, width, height, 4);
}

NOIPA int cudaMallocManaged(CUdeviceptr *p, size_t n) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged", 0);
  return fn_(p, n, 1);
}

NOIPA int cudaHostAlloc(void **p, size_t n) {
  DRIVER(CUresult (*)(void **, size_t, unsigned), "cuMemHostAlloc", 0);
  return fn_(p, n, 0);
}

NOIPA int cudaMallocHost(void **p, size_t n) {
  DRIVER(CUresult (*)(void **, size_t), "cuMemAllocHost", 0);
  return fn_(p, n);
}

NOIPA int cudaMallocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync", 0);
  return fn_(p, n, s);
}

NOIPA int cudaMallocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync", 1);
  return fn_(p, n, s);
}

NOIPA int cudaMallocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), "cuMemAllocFromPoolAsync", 0);
  return fn_(p, n, pool, s);
}

NOIPA int cudaMallocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), "cuMemAllocFromPoolAsync", 1);
  return fn_(p, n, pool, s);
}

NOIPA int cudaFree(CUdeviceptr p) {
  DRIVER(CUresult (*)(CUdeviceptr), "cuMemFree", 0);
  return fn_(p);
}

NOIPA int cudaFreeAsync(CUdeviceptr p, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync", 0);
  return fn_(p, s);
}

NOIPA int cudaFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  DRIVER(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync", 1);
  return fn_(p, s);
}

NOIPA int cudaFreeHost(void *p) {
  DRIVER(CUresult (*)(void *), "cuMemFreeHost", 0);
  return fn_(p);
}

NOIPA int cudaDeviceReset(void) {
  DRIVER(CUresult (*)(CUdevice), "cuDevicePrimaryCtxReset", 0);
  return fn_(0);
}

NOIPA int cudaGetDriverEntryPoint(const char *symbol, void **fn) {
  *fn = __cudart_driver(symbol, 0);
  return 0;
}
