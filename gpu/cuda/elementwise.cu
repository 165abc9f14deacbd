/* elementwise.cu - fill, unary and binary maps (one with a broadcast
 * operand: bias adds), axpby, and the activations' gradients.
 *
 * copy_strided gathers a strided (or broadcast) source into a contiguous
 * destination: what makes views contiguous on the device.
 *
 * Flat grid-stride kernels, one element per thread per step.  expf, logf,
 * tanhf are CUDA's IEEE-mode functions (no --use_fast_math): within 2 ulp
 * of the exact value, the host backend's glibc ones within 1, so the two
 * agree to a few ulp, not bit for bit.  The sigmoid is 1/(1+exp(-|x|))
 * folded for the sign, where the host backend computes 1/(1+exp(-x)): the
 * same to an ulp or two, and here no exp overflows (far below -88 the host
 * gives 0 and this the exact, subnormal value). */
#include "common.cuh"

__global__ void k_fill(float *y, int64_t n, float v) {
  GCU_FOR(i, n) y[i] = v;
}

__global__ void k_fill_i32(int32_t *y, int64_t n, int32_t v) {
  GCU_FOR(i, n) y[i] = v;
}

__device__ inline float sigmoidf_dev(float x) {
  float e = expf(x < 0.0f ? x : -x);   /* exp(-|x|), never overflows */
  float r = 1.0f / (1.0f + e);
  return x < 0.0f ? e * r : r;
}

__global__ void k_unary(gcu_unary op, float *y, const float *x, int64_t n, float a) {
  GCU_FOR(i, n) {
    float v = x[i], r;
    switch (op) {
    case GCU_EXP: r = expf(v); break;
    case GCU_LOG: r = logf(v); break;
    case GCU_TANH: r = tanhf(v); break;
    case GCU_RELU: r = v > 0.0f ? v : 0.0f; break;
    case GCU_SIGMOID: r = sigmoidf_dev(v); break;
    case GCU_SCALE: r = a * v; break;
    default: r = v + a; break;   /* GCU_ADD_SCALAR */
    }
    y[i] = r;
  }
}

__device__ inline float binary_op(gcu_binary op, float a, float b) {
  switch (op) {
  case GCU_ADD: return a + b;
  case GCU_SUB: return a - b;
  case GCU_MUL: return a * b;
  default: return a / b;   /* GCU_DIV */
  }
}

__global__ void k_binary(gcu_binary op, float *y, const float *a, const float *b, int64_t n) {
  GCU_FOR(i, n) y[i] = binary_op(op, a[i], b[i]);
}

/* a [outer, nb, inner], b [nb]: element i uses b[(i / inner) % nb] */
__global__ void k_binary_bcast(gcu_binary op, float *y, const float *a, const float *b, int64_t n, int64_t nb,
                               int64_t inner) {
  GCU_FOR(i, n) y[i] = binary_op(op, a[i], b[(i / inner) % nb]);
}

__global__ void k_axpby(float *y, float alpha, const float *a, float beta, const float *b, int64_t n) {
  GCU_FOR(i, n) y[i] = alpha * a[i] + beta * b[i];
}

/* The source's shape and strides, passed by value (kernel parameters). */
typedef struct {
  int ndim;
  int64_t shape[GCU_MAX_DIMS], stride[GCU_MAX_DIMS];
} strided;

/* dst[i] = src at the strided offset of i's multi-index (row-major). */
__global__ void k_copy_strided(float *dst, const float *src, strided g, int64_t n) {
  GCU_FOR(i, n) {
    int64_t rest = i, off = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
      off += (rest % g.shape[d]) * g.stride[d];
      rest /= g.shape[d];
    }
    dst[i] = src[off];
  }
}

__global__ void k_act_grad(gcu_act_grad op, float *dx, const float *dy, const float *y, int64_t n) {
  GCU_FOR(i, n) {
    float g = dy[i], v = y[i];
    dx[i] = op == GCU_RELU_GRAD ? (v > 0.0f ? g : 0.0f) : op == GCU_TANH_GRAD ? g * (1.0f - v * v)
                                                                              : g * v * (1.0f - v);
  }
}

extern "C" cudaError_t _gcu_fill(cudaStream_t s, float *y, int64_t n, float v) {
  if (n > 0) k_fill<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(y, n, v);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_fill_i32(cudaStream_t s, int32_t *y, int64_t n, int32_t v) {
  if (n > 0) k_fill_i32<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(y, n, v);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_unary(cudaStream_t s, gcu_unary op, float *y, const float *x, int64_t n, float a) {
  if (n > 0) k_unary<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(op, y, x, n, a);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_binary(cudaStream_t s, gcu_binary op, float *y, const float *a, const float *b,
                                   int64_t n) {
  if (n > 0) k_binary<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(op, y, a, b, n);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_binary_bcast(cudaStream_t s, gcu_binary op, float *y, const float *a, const float *b,
                                         int64_t outer, int64_t nb, int64_t inner) {
  int64_t n = outer * nb * inner;
  if (n > 0) k_binary_bcast<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(op, y, a, b, n, nb, inner);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_axpby(cudaStream_t s, float *y, float alpha, const float *a, float beta, const float *b,
                                  int64_t n) {
  if (n > 0) k_axpby<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(y, alpha, a, beta, b, n);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_copy_strided(cudaStream_t s, float *dst, const float *src, int ndim, const int64_t *shape,
                                         const int64_t *stride) {
  if (ndim < 1 || ndim > GCU_MAX_DIMS) return cudaErrorInvalidValue;
  strided g;
  g.ndim = ndim;
  int64_t n = 1;
  for (int d = 0; d < GCU_MAX_DIMS; d++) {
    g.shape[d] = d < ndim ? shape[d] : 1;
    g.stride[d] = d < ndim ? stride[d] : 0;
    if (d < ndim) {
      if (shape[d] < 0) return cudaErrorInvalidValue;
      n *= shape[d];
    }
  }
  if (n > 0) k_copy_strided<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(dst, src, g, n);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_act_grad(cudaStream_t s, gcu_act_grad op, float *dx, const float *dy, const float *y,
                                     int64_t n) {
  if (n > 0) k_act_grad<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(op, dx, dy, y, n);
  return gcu_launched();
}
