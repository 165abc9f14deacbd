/* workload.c - what every driver caller of the tests does: for each kind
 * of device memory, a function that allocates two blocks and frees one, so
 * exactly one block of each kind leaks, from a function of its own (the
 * top frame the auditor must name):
 *
 *   leak_malloc 1000 B, leak_pitch 3072 B (700 wide: pitch 1024, 3 rows),
 *   leak_managed 4000, leak_hostalloc 5000, leak_allochost 6000,
 *   leak_async 7000, leak_async_ptsz 8000, leak_pool 9000,
 *   leak_pool_ptsz 10000, leak_vmm 2 MiB (a handle never released),
 *   leak_map 4 MiB (mapped, its handle released, never unmapped; its
 *   address reservation is left too, which is no leak by itself).
 *
 * Built with -DDIRECT, it calls the driver (a program linked with -lcuda);
 * else the stand-in runtime (rt.h).  argv[1] "reset": the device is reset
 * at the end (cudaDeviceReset / cuDevicePrimaryCtxReset_v2); "ctx" (direct
 * only): also one block on device 1 in a context of its own, destroyed. */
#include "standin.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noipa))

#ifdef DIRECT
#define MALLOC(p, n)         cuMemAlloc_v2(p, n)
#define PITCH(p, pi, w, h)   cuMemAllocPitch_v2(p, pi, w, h, 4)
#define MANAGED(p, n)        cuMemAllocManaged(p, n, 1)
#define HOSTALLOC(p, n)      cuMemHostAlloc(p, n, 0)
#define ALLOCHOST(p, n)      cuMemAllocHost_v2(p, n)
#define ASYNC(p, n)          cuMemAllocAsync(p, n, NULL)
#define ASYNC_PTSZ(p, n)     cuMemAllocAsync_ptsz(p, n, NULL)
#define POOL(p, n)           cuMemAllocFromPoolAsync(p, n, POOL_HANDLE, NULL)
#define POOL_PTSZ(p, n)      cuMemAllocFromPoolAsync_ptsz(p, n, POOL_HANDLE, NULL)
#define FREE(p)              cuMemFree_v2(p)
#define FREEASYNC(p)         cuMemFreeAsync(p, NULL)
#define FREEASYNC_PTSZ(p)    cuMemFreeAsync_ptsz(p, NULL)
#define FREEHOST(p)          cuMemFreeHost(p)
#define RESET()              cuDevicePrimaryCtxReset_v2(0)
#define VMM(name)            name
#else
#include "rt.h"
#define MALLOC(p, n)         cudaMalloc(p, n)
#define PITCH(p, pi, w, h)   cudaMallocPitch(p, pi, w, h)
#define MANAGED(p, n)        cudaMallocManaged(p, n)
#define HOSTALLOC(p, n)      cudaHostAlloc(p, n)
#define ALLOCHOST(p, n)      cudaMallocHost(p, n)
#define ASYNC(p, n)          cudaMallocAsync(p, n, NULL)
#define ASYNC_PTSZ(p, n)     cudaMallocAsync_ptsz(p, n, NULL)
#define POOL(p, n)           cudaMallocFromPoolAsync(p, n, POOL_HANDLE, NULL)
#define POOL_PTSZ(p, n)      cudaMallocFromPoolAsync_ptsz(p, n, POOL_HANDLE, NULL)
#define FREE(p)              cudaFree(p)
#define FREEASYNC(p)         cudaFreeAsync(p, NULL)
#define FREEASYNC_PTSZ(p)    cudaFreeAsync_ptsz(p, NULL)
#define FREEHOST(p)          cudaFreeHost(p)
#define RESET()              cudaDeviceReset()
/* the driver's VMM functions, as PyTorch takes them: cudaGetDriverEntryPoint */
static void *entry(const char *name) {
  void *fn = NULL;
  cudaGetDriverEntryPoint(name, &fn);
  return fn;
}
#define VMM(name) ((__typeof__(&name))entry(#name))
#endif

#define POOL_HANDLE ((CUmemoryPool)(uintptr_t)0x5001)

static void check(int r, const char *what) {
  if (r != 0) {
    fprintf(stderr, "workload: %s failed: %d\n", what, r);
    exit(4);
  }
}

/* Kept where the scan would see them: device memory is never scanned, so
 * these make no difference to gpu.leak (the test that says so). */
CUdeviceptr kept_device[16];
void *kept_host[4];

NOIPA void leak_malloc(void) {
  CUdeviceptr a, b;
  check(MALLOC(&a, 2000), "malloc");
  check(MALLOC(&b, 1000), "malloc");
  check(FREE(a), "free");
  kept_device[0] = b;
}

NOIPA void leak_pitch(void) {
  CUdeviceptr a, b;
  size_t pa, pb;
  check(PITCH(&a, &pa, 100, 2), "pitch");
  check(PITCH(&b, &pb, 700, 3), "pitch");
  check(FREE(a), "free");
  kept_device[1] = b;
}

NOIPA void leak_managed(void) {
  CUdeviceptr a, b;
  check(MANAGED(&a, 100), "managed");
  check(MANAGED(&b, 4000), "managed");
  check(FREE(a), "free");
}

NOIPA void leak_hostalloc(void) {
  void *a, *b;
  check(HOSTALLOC(&a, 100), "hostalloc");
  check(HOSTALLOC(&b, 5000), "hostalloc");
  memset(b, 1, 5000);
  check(FREEHOST(a), "freehost");
  kept_host[0] = b;
}

NOIPA void leak_allochost(void) {
  void *a, *b;
  check(ALLOCHOST(&a, 100), "allochost");
  check(ALLOCHOST(&b, 6000), "allochost");
  check(FREEHOST(a), "freehost");
}

NOIPA void leak_async(void) {
  CUdeviceptr a, b;
  check(ASYNC(&a, 100), "async");
  check(ASYNC(&b, 7000), "async");
  check(FREEASYNC(a), "freeasync");
}

NOIPA void leak_async_ptsz(void) {
  CUdeviceptr a, b;
  check(ASYNC_PTSZ(&a, 100), "async_ptsz");
  check(ASYNC_PTSZ(&b, 8000), "async_ptsz");
  check(FREEASYNC_PTSZ(a), "freeasync_ptsz");
}

NOIPA void leak_pool(void) {
  CUdeviceptr a, b;
  check(POOL(&a, 100), "pool");
  check(POOL(&b, 9000), "pool");
  check(FREE(a), "free");                  /* cudaFree of an async block */
}

NOIPA void leak_pool_ptsz(void) {
  CUdeviceptr a, b;
  check(POOL_PTSZ(&a, 100), "pool_ptsz");
  check(POOL_PTSZ(&b, 10000), "pool_ptsz");
  check(FREEASYNC_PTSZ(a), "freeasync_ptsz");
}

static CUmemAllocationProp prop_on(int device) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

NOIPA void leak_vmm(void) {
  CUmemAllocationProp p = prop_on(0);
  CUmemGenericAllocationHandle a, b;
  check(VMM(cuMemCreate)(&a, 1 << 20, &p, 0), "create");
  check(VMM(cuMemCreate)(&b, 2 << 20, &p, 0), "create");
  check(VMM(cuMemRelease)(a), "release");
}

/* One whole cycle (nothing left), then a mapping whose handle is released
 * and which is never unmapped. */
NOIPA void leak_map(void) {
  CUmemAllocationProp p = prop_on(0);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  check(VMM(cuMemCreate)(&h, 1 << 20, &p, 0), "create");
  check(VMM(cuMemAddressReserve)(&va, 1 << 20, 0, 0, 0), "reserve");
  check(VMM(cuMemMap)(va, 1 << 20, 0, h, 0), "map");
  check(VMM(cuMemUnmap)(va, 1 << 20), "unmap");
  check(VMM(cuMemRelease)(h), "release");
  check(VMM(cuMemAddressFree)(va, 1 << 20), "addressfree");

  check(VMM(cuMemCreate)(&h, 4 << 20, &p, 0), "create");
  check(VMM(cuMemAddressReserve)(&va, 4 << 20, 0, 0, 0), "reserve");
  check(VMM(cuMemMap)(va, 4 << 20, 0, h, 0), "map");
  check(VMM(cuMemRelease)(h), "release");
  kept_device[2] = va;
}

#ifdef DIRECT
NOIPA void leak_in_context(void) {
  CUcontext ctx;
  CUdeviceptr a;
  check(cuCtxCreate_v2(&ctx, 0, 1), "ctxcreate");
  check(cuMemAlloc_v2(&a, 1234), "malloc");
  check(cuCtxDestroy_v2(ctx), "ctxdestroy");
}
#endif

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
#ifdef DIRECT
  check(cuInit(0), "init");
  if (strcmp(mode, "ctx") == 0) leak_in_context();
#endif
  leak_malloc();
  leak_pitch();
  leak_managed();
  leak_hostalloc();
  leak_allochost();
  leak_async();
  leak_async_ptsz();
  leak_pool();
  leak_pool_ptsz();
  leak_vmm();
  leak_map();
  if (strcmp(mode, "reset") == 0) check(RESET(), "reset");
  printf("workload done\n");
  return 0;
}
