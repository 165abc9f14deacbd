/* common.cuh - what the backend's .cu files share: launch shapes and the
 * block-wide reductions. */
#ifndef GPU_CUDA_COMMON_CUH
#define GPU_CUDA_COMMON_CUH

#include "kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* Threads per block of the flat (grid-stride) kernels. */
#define GCU_THREADS 256

/* Blocks for n elements at GCU_THREADS each, capped: the kernels loop
 * (grid-stride), so the cap only bounds the grid, never the work.  n > 0. */
static inline unsigned gcu_blocks(int64_t n) {
  int64_t b = (n + GCU_THREADS - 1) / GCU_THREADS;
  return (unsigned)(b < 8192 ? b : 8192);
}

/* The grid-stride loop over [0, n), 64-bit indices. */
#define GCU_FOR(i, n)                                                                                    \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

/* The error of the launches just made (and clears a non-sticky one). */
static inline cudaError_t gcu_launched(void) { return cudaGetLastError(); }

/* A warp's sum and maximum, every lane gets the result. */
__device__ inline double gcu_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float gcu_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

/* The block's sum and maximum (blockDim.x a multiple of 32, at most 1024),
 * every thread gets the result; `sh` holds 32 values of the type.  Every
 * thread of the block must call it (it synchronizes). */
__device__ inline double gcu_block_sum(double v, double *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = gcu_warp_sum(v);
  __syncthreads();   /* sh may still be read from a previous call */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0;
  return gcu_warp_sum(v);
}
__device__ inline float gcu_block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = gcu_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : sh[0];
  return gcu_warp_max(v);
}

#endif
