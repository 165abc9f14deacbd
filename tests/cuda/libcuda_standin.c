/* libcuda_standin.c - a stand-in libcuda.so.1 for the tests of `tagalloc
 * run` on CUDA programs (no GPU, no driver).
 *
 * It serves cuGetProcAddress and cuGetProcAddress_v2 as the driver does
 * (the base name, the _v2 form from CUDA 3.2 on, the _ptsz form when the
 * flags ask for the per-thread default stream) and the memory functions of
 * standin.h.  Device addresses come from a reservation of its own
 * (PROT_NONE: never host memory), bump-allocated; pinned host memory is
 * mmap'd.  It keeps every live allocation, so a free of anything else fails
 * with CUDA_ERROR_INVALID_VALUE, and a context destroyed or a primary
 * context reset frees what its device held.  Built with -Bsymbolic: the
 * addresses it hands out are its own functions, never an interposer's. */
#include "standin.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define SPACE (1ull << 32)           /* device address space: 4 GiB reserved */
#define MAX_LIVE 4096

enum { K_DEVICE = 1, K_MANAGED, K_ASYNC, K_HOST, K_HANDLE, K_VA, K_MAP };

typedef struct { uintptr_t addr; size_t size; int kind, device; } live;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t space, next_addr;
static live lives[MAX_LIVE];
static unsigned long long next_handle = 0x1000;
static __thread int current = 0;          /* the current context's device */
static __thread int stack_[16], depth;    /* pushed contexts' devices */

static int device_of(CUcontext ctx) { return (int)((uintptr_t)ctx - 0x100); }
static CUcontext context_of(int device) { return (CUcontext)(uintptr_t)(0x100 + device); }

/* lock held */
static uintptr_t take(size_t size, size_t align) {
  if (space == 0) {
    void *p = mmap(NULL, SPACE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;
    space = next_addr = (uintptr_t)p;
  }
  uintptr_t a = (next_addr + align - 1) & ~(uintptr_t)(align - 1);
  if (a + size > space + SPACE) return 0;
  next_addr = a + (size ? size : 1);
  return a;
}

static int add(uintptr_t addr, size_t size, int kind, int device) {
  for (int i = 0; i < MAX_LIVE; i++)
    if (lives[i].addr == 0) {
      lives[i] = (live){ addr, size, kind, device };
      return 1;
    }
  return 0;
}

/* The live entry at addr of one of the kinds (a mask), or NULL. */
static live *find(uintptr_t addr, unsigned kinds) {
  for (int i = 0; i < MAX_LIVE; i++)
    if (lives[i].addr == addr && (kinds >> lives[i].kind & 1)) return &lives[i];
  return NULL;
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytes, int kind) {
  if (dptr == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  uintptr_t a = take(bytes, 256);
  int ok = a && add(a, bytes, kind, current);
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = a;
  return CUDA_SUCCESS;
}

static CUresult drop(uintptr_t addr, unsigned kinds) {
  pthread_mutex_lock(&lock);
  live *l = find(addr, kinds);
  live gone = l ? *l : (live){ 0 };
  if (l) memset(l, 0, sizeof *l);
  pthread_mutex_unlock(&lock);
  if (gone.addr == 0) return CUDA_ERROR_INVALID_VALUE;
  if (gone.kind == K_HOST) munmap((void *)gone.addr, gone.size);
  return CUDA_SUCCESS;
}

/* A context of device is gone: its memory too. */
static void free_device(int device) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_LIVE; i++) {
    if (lives[i].addr == 0 || lives[i].device != device) continue;
    if (lives[i].kind == K_HOST) munmap((void *)lives[i].addr, lives[i].size);
    memset(&lives[i], 0, sizeof lives[i]);
  }
  pthread_mutex_unlock(&lock);
}

CUresult cuInit(unsigned flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuDriverGetVersion(int *version) {
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  *device = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice device) {
  (void)flags;
  if (ctx == NULL || device < 0 || device > 7) return CUDA_ERROR_INVALID_VALUE;
  *ctx = context_of(device);
  current = device;
  return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  int d = device_of(ctx);
  if (d < 0 || d > 7) return CUDA_ERROR_INVALID_VALUE;
  free_device(d);
  if (current == d) current = 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  int d = device_of(ctx);
  if (d < 0 || d > 7 || depth == 16) return CUDA_ERROR_INVALID_VALUE;
  stack_[depth++] = current;
  current = d;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  if (depth == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ctx) *ctx = context_of(current);
  current = stack_[--depth];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  if (device < 0 || device > 7) return CUDA_ERROR_INVALID_VALUE;
  free_device(device);
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) { return dev_alloc(dptr, bytes, K_DEVICE); }

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
  if (pitch == NULL || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
  size_t p = (width + STANDIN_PITCH - 1) / STANDIN_PITCH * STANDIN_PITCH;
  CUresult r = dev_alloc(dptr, p * height, K_DEVICE);
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags) {
  (void)flags;
  return dev_alloc(dptr, bytes, K_MANAGED);
}

static CUresult host_alloc(void **pp, size_t bytes) {
  if (pp == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  int ok = add((uintptr_t)p, bytes, K_HOST, current);
  pthread_mutex_unlock(&lock);
  if (!ok) {
    munmap(p, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pp = p;
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags) {
  (void)flags;
  return host_alloc(pp, bytes);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytes) { return host_alloc(pp, bytes); }
CUresult cuMemFreeHost(void *p) { return drop((uintptr_t)p, 1u << K_HOST); }

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  (void)stream;
  return dev_alloc(dptr, bytes, K_ASYNC);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  return cuMemAllocAsync(dptr, bytes, stream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  (void)stream;
  if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
  return dev_alloc(dptr, bytes, K_ASYNC);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}

#define FREEABLE ((1u << K_DEVICE) | (1u << K_MANAGED) | (1u << K_ASYNC))
CUresult cuMemFree_v2(CUdeviceptr dptr) { return drop((uintptr_t)dptr, FREEABLE); }

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  (void)stream;
  return drop((uintptr_t)dptr, FREEABLE);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return cuMemFreeAsync(dptr, stream); }

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  if (handle == NULL || prop == NULL || flags != 0 || size == 0 ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  unsigned long long h = next_handle++;
  int ok = add((uintptr_t)h, size, K_HANDLE, prop->location.id);
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return drop((uintptr_t)handle, 1u << K_HANDLE); }

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  (void)addr;
  if (ptr == NULL || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  uintptr_t a = take(size, alignment > 65536 ? alignment : 65536);
  int ok = a && add(a, size, K_VA, current);
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = a;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  (void)size;
  return drop((uintptr_t)ptr, 1u << K_VA);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  if (offset != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  live *h = find((uintptr_t)handle, 1u << K_HANDLE);
  int ok = h && h->size >= size && add((uintptr_t)ptr, size, K_MAP, h->device);
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  (void)size;
  return drop((uintptr_t)ptr, 1u << K_MAP);
}

/* ---- cuGetProcAddress --------------------------------------------------------- */

typedef struct { const char *name; void *fn; } entry;

#define E(f) { #f, (void *)f }
static const entry entries[] = {
  E(cuInit), E(cuDriverGetVersion), E(cuCtxGetDevice), E(cuCtxCreate_v2), E(cuCtxDestroy_v2),
  E(cuCtxPushCurrent_v2), E(cuCtxPopCurrent_v2), E(cuDevicePrimaryCtxReset_v2), E(cuMemAlloc_v2),
  E(cuMemAllocPitch_v2), E(cuMemAllocManaged), E(cuMemHostAlloc), E(cuMemAllocHost_v2), E(cuMemFreeHost),
  E(cuMemAllocAsync), E(cuMemAllocAsync_ptsz), E(cuMemAllocFromPoolAsync), E(cuMemAllocFromPoolAsync_ptsz),
  E(cuMemFree_v2), E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemCreate), E(cuMemRelease),
  E(cuMemAddressReserve), E(cuMemAddressFree), E(cuMemMap), E(cuMemUnmap), E(cuGetProcAddress),
  E(cuGetProcAddress_v2),
};

/* Base names whose modern form is _v2, and those with a per-thread form. */
static const char *const v2_names[] = { "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocHost", "cuMemFree",
                                        "cuCtxCreate", "cuCtxDestroy", "cuCtxPushCurrent", "cuCtxPopCurrent",
                                        "cuDevicePrimaryCtxReset", "cuGetProcAddress" };
static const char *const ptsz_names[] = { "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync" };

static int listed(const char *s, const char *const *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s, v[i]) == 0) return 1;
  return 0;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  char name[128];
  size_t n = strlen(symbol);
  if (n + 6 > sizeof name) return CUDA_ERROR_INVALID_VALUE;
  memcpy(name, symbol, n + 1);
  if (version >= 3020 && listed(symbol, v2_names, sizeof v2_names / sizeof *v2_names))
    memcpy(name + n, "_v2", 4);
  else if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
           listed(symbol, ptsz_names, sizeof ptsz_names / sizeof *ptsz_names))
    memcpy(name + n, "_ptsz", 6);
  for (size_t i = 0; i < sizeof entries / sizeof *entries; i++)
    if (strcmp(entries[i].name, name) == 0) {
      *pfn = entries[i].fn;
      if (status) *status = 0;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status) *status = 1;                   /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
