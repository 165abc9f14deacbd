// gpu_leaks.cu - a real CUDA program for tests/cuda/gpu-audit.sh: for each
// kind of device memory, a function that allocates two blocks and frees
// one, so one block of each kind leaks from a function of its own.  It
// prints "LEAK function bytes tag" for each (the pitch is the device's),
// built by nvcc with the static runtime (the default) and with
// -cudart shared.  argv[1] "reset": cudaDeviceReset() at the end (where
// compute-sanitizer's leak check looks).  The VMM functions are taken as
// PyTorch takes them: cudaGetDriverEntryPointByVersion.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noipa))

static void check(cudaError_t r, const char *what) {
  if (r != cudaSuccess) {
    printf("ERROR %s: %s\n", what, cudaGetErrorString(r));
    exit(3);
  }
}

static void check_cu(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    printf("ERROR %s: driver error %d\n", what, (int)r);
    exit(3);
  }
}

static void *driver(const char *name) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q), name);
  if (fn == NULL || q != cudaDriverEntryPointSuccess) {
    printf("ERROR no driver entry point %s\n", name);
    exit(3);
  }
  return fn;
}

NOIPA void leak_malloc(void) {
  void *a, *b;
  check(cudaMalloc(&a, 2000), "cudaMalloc");
  check(cudaMalloc(&b, 1000), "cudaMalloc");
  check(cudaFree(a), "cudaFree");
  printf("LEAK leak_malloc 1000 cuda.malloc\n");
}

NOIPA void leak_pitch(void) {
  void *a, *b;
  size_t pa, pb;
  check(cudaMallocPitch(&a, &pa, 100, 2), "cudaMallocPitch");
  check(cudaMallocPitch(&b, &pb, 700, 3), "cudaMallocPitch");
  check(cudaFree(a), "cudaFree");
  printf("LEAK leak_pitch %zu cuda.malloc\n", pb * 3);
}

NOIPA void leak_managed(void) {
  void *a, *b;
  check(cudaMallocManaged(&a, 100), "cudaMallocManaged");
  check(cudaMallocManaged(&b, 4000), "cudaMallocManaged");
  check(cudaFree(a), "cudaFree");
  printf("LEAK leak_managed 4000 cuda.managed\n");
}

NOIPA void leak_hostalloc(void) {
  void *a, *b;
  check(cudaHostAlloc(&a, 100, cudaHostAllocDefault), "cudaHostAlloc");
  check(cudaHostAlloc(&b, 5000, cudaHostAllocDefault), "cudaHostAlloc");
  check(cudaFreeHost(a), "cudaFreeHost");
  printf("LEAK leak_hostalloc 5000 cuda.host\n");
}

NOIPA void leak_allochost(void) {
  void *a, *b;
  check(cudaMallocHost(&a, 100), "cudaMallocHost");
  check(cudaMallocHost(&b, 6000), "cudaMallocHost");
  check(cudaFreeHost(a), "cudaFreeHost");
  printf("LEAK leak_allochost 6000 cuda.host\n");
}

NOIPA void leak_async(cudaStream_t s) {
  void *a, *b;
  check(cudaMallocAsync(&a, 100, s), "cudaMallocAsync");
  check(cudaMallocAsync(&b, 7000, s), "cudaMallocAsync");
  check(cudaFreeAsync(a, s), "cudaFreeAsync");
  check(cudaStreamSynchronize(s), "sync");
  printf("LEAK leak_async 7000 cuda.async\n");
}

NOIPA void leak_pool(cudaStream_t s, cudaMemPool_t pool) {
  void *a, *b;
  check(cudaMallocFromPoolAsync(&a, 100, pool, s), "cudaMallocFromPoolAsync");
  check(cudaMallocFromPoolAsync(&b, 9000, pool, s), "cudaMallocFromPoolAsync");
  check(cudaFreeAsync(a, s), "cudaFreeAsync");
  check(cudaStreamSynchronize(s), "sync");
  printf("LEAK leak_pool 9000 cuda.async\n");
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*gran_fn)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);

static CUmemAllocationProp prop0(void) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  return p;
}

static size_t granularity(void) {
  CUmemAllocationProp p = prop0();
  size_t g = 0;
  check_cu(((gran_fn)driver("cuMemGetAllocationGranularity"))(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           "granularity");
  return g;
}

NOIPA void leak_vmm(size_t g) {
  CUmemAllocationProp p = prop0();
  CUmemGenericAllocationHandle a, b;
  create_fn create = (create_fn)driver("cuMemCreate");
  check_cu(create(&a, g, &p, 0), "cuMemCreate");
  check_cu(create(&b, 2 * g, &p, 0), "cuMemCreate");
  check_cu(((release_fn)driver("cuMemRelease"))(a), "cuMemRelease");
  printf("LEAK leak_vmm %zu cuda.vmm\n", 2 * g);
}

NOIPA void leak_map(size_t g) {
  CUmemAllocationProp p = prop0();
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location = p.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check_cu(((create_fn)driver("cuMemCreate"))(&h, 2 * g, &p, 0), "cuMemCreate");
  check_cu(((reserve_fn)driver("cuMemAddressReserve"))(&va, 2 * g, 0, 0, 0), "cuMemAddressReserve");
  check_cu(((map_fn)driver("cuMemMap"))(va, 2 * g, 0, h, 0), "cuMemMap");
  check_cu(((access_fn)driver("cuMemSetAccess"))(va, 2 * g, &acc, 1), "cuMemSetAccess");
  check_cu(((release_fn)driver("cuMemRelease"))(h), "cuMemRelease");
  printf("LEAK leak_map %zu cuda.map\n", 2 * g);
}

int main(int argc, char **argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("NODEVICE\n");
    return 77;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  cudaMemPool_t pool;
  cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  size_t g = granularity();
  leak_malloc();
  leak_pitch();
  leak_managed();
  leak_hostalloc();
  leak_allochost();
  leak_async(s);
  leak_pool(s, pool);
  leak_vmm(g);
  leak_map(g);
  if (argc > 1 && strcmp(argv[1], "reset") == 0) check(cudaDeviceReset(), "cudaDeviceReset");
  printf("DONE\n");
  return 0;
}
