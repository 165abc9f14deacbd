/* rt.h - the runtime API of the stand-in runtime (rt.c): the shape of the
 * CUDA runtime's, reduced to what the tests call.  Every function returns 0
 * or the driver's error. */
#ifndef TAGALLOC_TESTS_CUDA_RT_H
#define TAGALLOC_TESTS_CUDA_RT_H

#include "standin.h"

int cudaMalloc(CUdeviceptr *p, size_t n);
int cudaMallocPitch(CUdeviceptr *p, size_t *pitch, size_t width, size_t height);
int cudaMallocManaged(CUdeviceptr *p, size_t n);
int cudaHostAlloc(void **p, size_t n);
int cudaMallocHost(void **p, size_t n);
int cudaMallocAsync(CUdeviceptr *p, size_t n, CUstream s);
int cudaMallocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s);
int cudaMallocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s);
int cudaMallocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s);
int cudaFree(CUdeviceptr p);
int cudaFreeAsync(CUdeviceptr p, CUstream s);
int cudaFreeAsync_ptsz(CUdeviceptr p, CUstream s);
int cudaFreeHost(void *p);
int cudaDeviceReset(void);
/* A driver function, as cudaGetDriverEntryPoint gives it (through cuGetProcAddress). */
int cudaGetDriverEntryPoint(const char *symbol, void **fn);

#endif
