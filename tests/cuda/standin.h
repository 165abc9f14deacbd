/* standin.h - the driver API as the stand-in libcuda.so.1 serves it
 * (tests/cuda/libcuda_standin.c): cuda.h's types and signatures, by ABI, for
 * machines without the CUDA Toolkit. */
#ifndef TAGALLOC_TESTS_CUDA_STANDIN_H
#define TAGALLOC_TESTS_CUDA_STANDIN_H

#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef int CUdevice;
typedef struct standin_ctx *CUcontext;
typedef struct standin_stream *CUstream;
typedef struct standin_pool *CUmemoryPool;
typedef struct {
  int type;                       /* CU_MEM_ALLOCATION_TYPE_PINNED: 1 */
  int requestedHandleTypes;
  struct { int type; int id; } location;   /* type CU_MEM_LOCATION_TYPE_DEVICE: 1 */
  void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
           unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ALLOCATION_TYPE_PINNED 1

/* The stand-in's pitch: the width rounded up to this. */
#define STANDIN_PITCH 512

CUresult cuInit(unsigned flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice device);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice device);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytes);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status);

#endif
