// audit_load.cu - a small CUDA program for the audit's cost (make bench-gpu,
// bench/gpu/audit_cost.sh): many device allocations and kernel launches, and
// nothing left allocated at exit (so `tagalloc run` finds nothing).
//
//   audit-load [--iters N]
//
// Each of N iterations (default 20000): cudaMalloc of three buffers (1 KiB to
// 1 MiB, cycling through 8 sizes), two kernel launches (fill, then
// y = a*x + y), cudaFree of the three; every 256 iterations a
// cudaDeviceSynchronize, and at the end one more and a check of a value.
// Exit status: 0 ran; 1 a CUDA call failed or the value is wrong;
// 2 bad arguments; 77 SKIP (no CUDA device: the reason printed).
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "audit-load: %s: %s\n", #call, cudaGetErrorString(e_));           \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

__global__ void fill(float *p, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

__global__ void axpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main(int argc, char **argv) {
  long iters = 20000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = atol(argv[++i]);
    else {
      fprintf(stderr, "audit-load: %s: unknown argument (want --iters N)\n", argv[i]);
      return 2;
    }
  }
  if (iters < 1) {
    fprintf(stderr, "audit-load: --iters %ld (want >= 1)\n", iters);
    return 2;
  }
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("SKIP audit-load: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  float *keep;   // y of the last iteration's check
  CK(cudaMalloc(&keep, sizeof(float)));
  for (long it = 0; it < iters; it++) {
    int n = 256 << (it % 8);   // 256 .. 32768 floats: 1 KiB .. 128 KiB
    float *x, *y, *z;
    CK(cudaMalloc(&x, n * sizeof(float)));
    CK(cudaMalloc(&y, n * sizeof(float)));
    CK(cudaMalloc(&z, 8 * n * sizeof(float)));   // up to 1 MiB
    int grid = (n + 255) / 256;
    fill<<<grid, 256>>>(x, 1.0f, n);
    fill<<<grid, 256>>>(y, 2.0f, n);
    axpy<<<grid, 256>>>(y, x, 3.0f, n);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(keep, y + n - 1, sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(z));
    if (it % 256 == 255) CK(cudaDeviceSynchronize());
  }
  float v = 0;
  CK(cudaMemcpy(&v, keep, sizeof v, cudaMemcpyDeviceToHost));
  CK(cudaFree(keep));
  if (v != 5.0f) {
    fprintf(stderr, "audit-load: the last y is %g, want 5\n", v);
    return 1;
  }
  printf("audit-load: %ld iterations, %ld cudaMalloc/cudaFree pairs, %ld kernel launches\n", iters, 3 * iters + 1,
         3 * iters);
  return 0;
}
