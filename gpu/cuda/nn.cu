/* nn.cu - row softmax and its gradient, cross-entropy from logits and
 * int32 labels (the mean loss, and its gradient from the probabilities),
 * embedding lookup and its gradient (atomicAdd: repeated indices).
 *
 * One warp per row: rows are short in training (10 classes, a vocabulary
 * of a hundred), and a warp needs no shared memory nor block barrier.  The
 * row maximum is subtracted before exp; sums of exponentials are kept in
 * double, as the host backend keeps them.  The loss is one block's sum over
 * its warps' rows in a fixed order (no atomics): the same value each run. */
#include "common.cuh"

#include <math.h>

#define WARPS_PER_BLOCK (GCU_THREADS / 32)

/* The row's maximum and sum of exp(x - max), every lane gets them. */
__device__ inline void row_stats(const float *row, int64_t C, float *m_out, double *s_out) {
  int lane = threadIdx.x & 31;
  float m = row[0];
  for (int64_t k = lane; k < C; k += 32) m = row[k] > m ? row[k] : m;
  m = gcu_warp_max(m);
  double s = 0;
  for (int64_t k = lane; k < C; k += 32) s += expf(row[k] - m);
  *m_out = m;
  *s_out = gcu_warp_sum(s);
}

/* The warp's row r of the grid-stride loop over rows: warp w of the grid
 * takes rows w, w + warps, ... */
#define WARP_ROWS(r, rows)                                                                                     \
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < (rows);                          \
       r += ((int64_t)gridDim.x * blockDim.x) >> 5)

__global__ void k_softmax(float *y, const float *x, int64_t rows, int64_t C) {
  int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const float *row = x + r * C;
    float *out = y + r * C;
    float m;
    double s;
    row_stats(row, C, &m, &s);
    float inv = (float)(1.0 / s);
    for (int64_t k = lane; k < C; k += 32) out[k] = expf(row[k] - m) * inv;
  }
}

/* dx = y * (dy - <dy, y>), the dot product in double. */
__global__ void k_softmax_grad(float *dx, const float *dy, const float *y, int64_t rows, int64_t C) {
  int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const float *g = dy + r * C, *p = y + r * C;
    double dot = 0;
    for (int64_t k = lane; k < C; k += 32) dot += (double)g[k] * p[k];
    float d = (float)gcu_warp_sum(dot);
    for (int64_t k = lane; k < C; k += 32) dx[r * C + k] = p[k] * (g[k] - d);
  }
}

/* One block: warp w takes rows w, w + warps, ...; lane 0 sums its rows'
 * losses (log-sum-exp minus the label's logit, never log of a
 * probability); then the block's sum over its warps. */
__global__ void __launch_bounds__(1024) k_cross_entropy(float *loss, const float *x, const int32_t *labels, int64_t rows, int64_t C) {
  __shared__ double sh[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  double total = 0;
  for (int64_t r = warp; r < rows; r += nw) {
    const float *row = x + r * C;
    float m;
    double s;
    row_stats(row, C, &m, &s);
    int32_t y = labels[r];
    if (lane == 0) total += y >= 0 && y < C ? log(s) + m - row[y] : NAN;
  }
  total = gcu_block_sum(lane == 0 ? total : 0.0, sh);
  if (threadIdx.x == 0) *loss = rows ? (float)(total / (double)rows) : 0.0f;
}

__global__ void k_cross_entropy_grad(float *dx, const float *probs, const int32_t *labels, int64_t rows, int64_t C,
                                     float scale) {
  GCU_FOR(i, rows * C) {
    int64_t r = i / C, k = i % C;
    float p = probs[i];
    if (k == labels[r]) p -= 1.0f;   /* a label out of range subtracts nothing, as on the host */
    dx[i] = p * scale;
  }
}

__global__ void k_embedding(float *y, const float *w, const int32_t *idx, int64_t n, int64_t V, int64_t D) {
  GCU_FOR(k, n * D) {
    int64_t i = k / D, d = k % D;
    int32_t v = idx[i];
    y[k] = v >= 0 && v < V ? w[(int64_t)v * D + d] : NAN;
  }
}

__global__ void k_embedding_grad(float *dw, const float *dy, const int32_t *idx, int64_t n, int64_t V, int64_t D) {
  GCU_FOR(k, n * D) {
    int64_t i = k / D, d = k % D;
    int32_t v = idx[i];
    if (v >= 0 && v < V) atomicAdd(&dw[(int64_t)v * D + d], dy[k]);
  }
}

/* Blocks for one warp per row. */
static unsigned row_blocks(int64_t rows) {
  int64_t b = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
  return (unsigned)(b < 8192 ? b : 8192);
}

extern "C" cudaError_t _gcu_softmax(cudaStream_t s, float *y, const float *x, int64_t rows, int64_t C) {
  if (rows > 0 && C > 0) k_softmax<<<row_blocks(rows), GCU_THREADS, 0, s>>>(y, x, rows, C);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_softmax_grad(cudaStream_t s, float *dx, const float *dy, const float *y, int64_t rows,
                                         int64_t C) {
  if (rows > 0 && C > 0) k_softmax_grad<<<row_blocks(rows), GCU_THREADS, 0, s>>>(dx, dy, y, rows, C);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_cross_entropy(cudaStream_t s, float *loss, const float *x, const int32_t *labels,
                                          int64_t rows, int64_t C) {
  if (C < 1) return cudaErrorInvalidValue;
  k_cross_entropy<<<1, 1024, 0, s>>>(loss, x, labels, rows, C);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_cross_entropy_grad(cudaStream_t s, float *dx, const float *probs, const int32_t *labels,
                                               int64_t rows, int64_t C, float scale) {
  if (C < 1) return cudaErrorInvalidValue;
  if (rows > 0) k_cross_entropy_grad<<<gcu_blocks(rows * C), GCU_THREADS, 0, s>>>(dx, probs, labels, rows, C, scale);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_embedding(cudaStream_t s, float *y, const float *w, const int32_t *idx, int64_t n,
                                      int64_t V, int64_t D) {
  if (n > 0 && D > 0) k_embedding<<<gcu_blocks(n * D), GCU_THREADS, 0, s>>>(y, w, idx, n, V, D);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_embedding_grad(cudaStream_t s, float *dw, const float *dy, const int32_t *idx, int64_t n,
                                           int64_t V, int64_t D) {
  if (n > 0 && D > 0) k_embedding_grad<<<gcu_blocks(n * D), GCU_THREADS, 0, s>>>(dw, dy, idx, n, V, D);
  return gcu_launched();
}
