/* reduce.cu - sum and max (with argmax) along one axis, and a bias's
 * gradient (the sum over every axis but the channel's).
 *
 * Each output is reduced by one block (contiguous rows) or one thread
 * (strided columns), never by atomics: the result does not depend on
 * scheduling, run to run.  Sums are kept in double, as the host backend
 * keeps them, so the two agree to float rounding of the final value. */
#include "common.cuh"

#include <math.h>

/* Contiguous rows (inner == 1): block b reduces rows b, b + gridDim.x, ... */
__global__ void k_reduce_rows(gcu_reduce op, float *y, int32_t *argmax, const float *x, int64_t rows, int64_t n) {
  __shared__ double shd[32];
  __shared__ float shf[32];
  __shared__ int64_t shi[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *row = x + r * n;
    if (op != GCU_MAX) {
      double acc = 0;
      for (int64_t k = threadIdx.x; k < n; k += blockDim.x) acc += row[k];
      acc = gcu_block_sum(acc, shd);
      if (threadIdx.x == 0) y[r] = (float)acc;
      continue;
    }
    /* max: each thread's first maximum of its strided elements, then the
     * largest of those, the lowest index among equal ones */
    float m = -INFINITY;
    int64_t at = n;   /* none yet */
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      if (at == n || row[k] > m) m = row[k], at = k;
    float bm = gcu_block_max(m, shf);
    int64_t cand = (at < n && m == bm) ? at : INT64_MAX;
    /* the lowest candidate index: a min over the block through shared memory */
    for (int o = 16; o > 0; o >>= 1) {
      int64_t u = __shfl_xor_sync(0xffffffffu, cand, o);
      cand = u < cand ? u : cand;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) shi[warp] = cand;
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t best = shi[0];
      for (int w = 1; w < nw; w++) best = shi[w] < best ? shi[w] : best;
      if (best == INT64_MAX) best = 0;   /* no candidate: NaNs compared unequal */
      if (y) y[r] = row[best];
      if (argmax) argmax[r] = (int32_t)best;
    }
  }
}

/* Strided columns (inner > 1): one thread per output (o, j), n steps of
 * inner; neighbouring threads read neighbouring addresses. */
__global__ void k_reduce_cols(gcu_reduce op, float *y, int32_t *argmax, const float *x, int64_t outer, int64_t n,
                              int64_t inner) {
  GCU_FOR(i, outer * inner) {
    int64_t o = i / inner, j = i % inner;
    const float *p = x + o * n * inner + j;
    if (op != GCU_MAX) {
      double acc = 0;
      for (int64_t k = 0; k < n; k++) acc += p[k * inner];
      y[i] = (float)acc;
    } else {
      float m = p[0];
      int64_t at = 0;
      for (int64_t k = 1; k < n; k++)
        if (p[k * inner] > m) m = p[k * inner], at = k;
      if (y) y[i] = m;
      if (argmax) argmax[i] = (int32_t)at;
    }
  }
}

/* One block per channel c: the sum of dy[n, c, :] over n. */
__global__ void k_bias_grad(float *db, const float *dy, int64_t N, int64_t C, int64_t inner) {
  __shared__ double sh[32];
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double acc = 0;
    for (int64_t k = threadIdx.x; k < N * inner; k += blockDim.x) {
      int64_t n = k / inner, j = k % inner;
      acc += dy[(n * C + c) * inner + j];
    }
    acc = gcu_block_sum(acc, sh);
    if (threadIdx.x == 0) db[c] = (float)acc;
  }
}

extern "C" cudaError_t _gcu_reduce(cudaStream_t s, gcu_reduce op, float *y, int32_t *argmax, const float *x,
                                   int64_t outer, int64_t n, int64_t inner) {
  if (outer <= 0 || inner <= 0 || n <= 0) return cudaSuccess;
  if (inner == 1) {
    unsigned blocks = (unsigned)(outer < 65535 ? outer : 65535);
    k_reduce_rows<<<blocks, GCU_THREADS, 0, s>>>(op, y, argmax, x, outer, n);
  } else {
    k_reduce_cols<<<gcu_blocks(outer * inner), GCU_THREADS, 0, s>>>(op, y, argmax, x, outer, n, inner);
  }
  return gcu_launched();
}

extern "C" cudaError_t _gcu_bias_grad(cudaStream_t s, float *db, const float *dy, int64_t N, int64_t C,
                                      int64_t inner) {
  if (C <= 0) return cudaSuccess;
  if (N <= 0 || inner <= 0) return _gcu_fill(s, db, C, 0.0f);
  unsigned blocks = (unsigned)(C < 65535 ? C : 65535);
  k_bias_grad<<<blocks, GCU_THREADS, 0, s>>>(db, dy, N, C, inner);
  return gcu_launched();
}
