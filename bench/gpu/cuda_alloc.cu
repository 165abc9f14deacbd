// cuda_alloc.cu - the CUDA runtime's own allocators, for comparison with the
// caching pool's cached allocation (make bench-gpu; bench/gpu/README.md):
//
//   build/bench-gpu-cuda-alloc [--reps N]
//
// For each size of build/bench-gpu's latency table (4 KiB, 256 KiB, 4 MiB,
// 32 MiB), nanoseconds per alloc+free pair, the median of N timed loops
// (default 7):
//   cudaMalloc       cudaMalloc + cudaFree (each pair goes to the driver)
//   cudaMallocAsync  cudaMallocAsync + cudaFreeAsync on one stream, from the
//                    device's default memory pool with its release threshold
//                    raised to UINT64_MAX (the pool keeps what is freed, so a
//                    pair in steady state is a cached one, as the project's
//                    pool's is); the loop's closing cudaStreamSynchronize is
//                    counted in it
// Exit status: 0 measured; 1 a CUDA call failed; 2 bad arguments; 77 SKIP (no
// CUDA device: the reason printed).
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "bench-gpu-cuda-alloc: %s: %s\n", #call, cudaGetErrorString(e_));       \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double sync_pair(size_t size, int iters) {
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    void *p;
    CK(cudaMalloc(&p, size));
    CK(cudaFree(p));
  }
  return (now_ns() - t0) / iters;
}

static double async_pair(size_t size, int iters, cudaStream_t s) {
  CK(cudaStreamSynchronize(s));
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    void *p;
    CK(cudaMallocAsync(&p, size, s));
    CK(cudaFreeAsync(p, s));
  }
  CK(cudaStreamSynchronize(s));
  return (now_ns() - t0) / iters;
}

int main(int argc, char **argv) {
  int reps = 7;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "bench-gpu-cuda-alloc: %s: unknown argument (want --reps N)\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1 || reps > 101) {
    fprintf(stderr, "bench-gpu-cuda-alloc: --reps %d (want 1 .. 101)\n", reps);
    return 2;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIP bench-gpu-cuda-alloc: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  int pools = 0;
  CK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
  if (!pools) {
    printf("SKIP bench-gpu-cuda-alloc: device 0 has no stream-ordered allocator (cudaMallocAsync)\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int rt = 0, drv = 0;
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  printf("device: %s (runtime %d, driver %d)\n", prop.name, rt, drv);
  cudaMemPool_t mp;
  CK(cudaDeviceGetDefaultMemPool(&mp, 0));
  uint64_t keep = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  static const size_t sizes[] = { 4096, 256 << 10, 4 << 20, 32 << 20 };
  printf("\nalloc+free pair, ns (median of %d):\n", reps);
  printf("%12s %12s %16s\n", "bytes", "cudaMalloc", "cudaMallocAsync");
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    double sv[101], av[101];
    async_pair(sizes[k], 100, s);   // the pool's first segment, not timed
    for (int r = 0; r < reps; r++) {
      sv[r] = sync_pair(sizes[k], 200);
      av[r] = async_pair(sizes[k], 20000, s);
    }
    printf("%12zu %12.0f %16.0f\n", sizes[k], median(sv, reps), median(av, reps));
  }
  CK(cudaStreamDestroy(s));
  CK(cudaMemPoolTrimTo(mp, 0));
  return 0;
}
