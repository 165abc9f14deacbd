/* kernels.h - the CUDA backend's kernels, as plain launch functions (C
 * linkage), for backend.c, which implements gpu/gpu.h's table with them.
 *
 *   cudaError_t e = _gcu_relu(stream, y, x, n);   // y = max(x, 0), n floats
 *
 * Every launch function enqueues its kernels on `stream` and returns
 * cudaGetLastError() after them (cudaSuccess, or why the launch failed);
 * nothing is synchronized.  A count of 0 launches nothing.  Pointers are
 * device pointers; shapes are row-major (NCHW for images), contiguous.  The
 * kernels compute what the host backend computes, in the same order where
 * the order matters for rounding (see each .cu file for what differs). */
#ifndef GPU_CUDA_KERNELS_H
#define GPU_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise.cu ------------------------------------------------------ */

typedef enum {
  GCU_EXP, GCU_LOG, GCU_TANH, GCU_RELU, GCU_SIGMOID,
  GCU_SCALE,       /* y = a * x */
  GCU_ADD_SCALAR,  /* y = x + a */
} gcu_unary;

typedef enum { GCU_ADD, GCU_SUB, GCU_MUL, GCU_DIV } gcu_binary;

typedef enum { GCU_RELU_GRAD, GCU_TANH_GRAD, GCU_SIGMOID_GRAD } gcu_act_grad;

cudaError_t _gcu_fill(cudaStream_t s, float *y, int64_t n, float v);
cudaError_t _gcu_fill_i32(cudaStream_t s, int32_t *y, int64_t n, int32_t v);
/* y = op(x); y may be x */
cudaError_t _gcu_unary(cudaStream_t s, gcu_unary op, float *y, const float *x, int64_t n, float a);
/* y = a op b, same shapes; y may be a or b */
cudaError_t _gcu_binary(cudaStream_t s, gcu_binary op, float *y, const float *a, const float *b, int64_t n);
/* y = a op b with b broadcast: a seen as [outer, nb, inner], b as [nb]
 * (a bias over channels: outer = N, nb = C, inner = H*W; over the columns
 * of a matrix: outer = rows, nb = cols, inner = 1).  y may be a. */
cudaError_t _gcu_binary_bcast(cudaStream_t s, gcu_binary op, float *y, const float *a, const float *b,
                              int64_t outer, int64_t nb, int64_t inner);
/* y = alpha * a + beta * b; y may be a or b */
cudaError_t _gcu_axpby(cudaStream_t s, float *y, float alpha, const float *a, float beta, const float *b, int64_t n);
/* dst (contiguous, shape[0..ndim)) = src read with element strides
 * stride[] (0 broadcasts), 1 <= ndim <= GCU_MAX_DIMS. */
#define GCU_MAX_DIMS 6
cudaError_t _gcu_copy_strided(cudaStream_t s, float *dst, const float *src, int ndim, const int64_t *shape,
                              const int64_t *stride);
/* dx = dy * f'(.) from the activation's output y: relu dy*(y>0), tanh
 * dy*(1-y*y), sigmoid dy*y*(1-y).  dx may be dy. */
cudaError_t _gcu_act_grad(cudaStream_t s, gcu_act_grad op, float *dx, const float *dy, const float *y, int64_t n);

/* ---- reduce.cu ----------------------------------------------------------- */

typedef enum { GCU_SUM, GCU_MAX } gcu_reduce;

/* x seen as [outer, n, inner]: y [outer, inner] = reduce over n; argmax
 * (NULL or [outer, inner] i32) gets the index of the first maximum (GCU_MAX
 * only, and then y may be NULL).  n >= 1.  Sums are kept in double, as the host's are. */
cudaError_t _gcu_reduce(cudaStream_t s, gcu_reduce op, float *y, int32_t *argmax, const float *x, int64_t outer,
                        int64_t n, int64_t inner);
/* db [C] = sum of dy [N, C, inner] over N and inner (a bias's gradient). */
cudaError_t _gcu_bias_grad(cudaStream_t s, float *db, const float *dy, int64_t N, int64_t C, int64_t inner);

/* ---- conv.cu ------------------------------------------------------------- */

/* The geometry of a 2-D convolution: x [N, C, H, W], w [O, C, KH, KW],
 * y [N, O, OH, OW], OH = (H + 2*pad - KH) / stride + 1. */
typedef struct {
  int64_t N, C, H, W, O, KH, KW, OH, OW;
  int64_t stride, pad;
} gcu_conv;

/* col [C*KH*KW, nb*OH*OW] from images n0 .. n0+nb-1 of x: column
 * (n - n0) * OH*OW + oh*OW + ow of row (c*KH + kh)*KW + kw holds
 * x[n, c, oh*stride - pad + kh, ow*stride - pad + kw], 0 outside. */
cudaError_t _gcu_im2col(cudaStream_t s, const gcu_conv *g, const float *x, int64_t n0, int64_t nb, float *col);
/* dx for images n0 .. n0+nb-1 from dcol laid out as im2col's col:
 * each element of dx gathers the columns that read it (no atomics). */
cudaError_t _gcu_col2im(cudaStream_t s, const gcu_conv *g, const float *dcol, int64_t n0, int64_t nb, float *dx);
/* y [n0+i, o, p] = t [o, i*P + p] (+ bias[o] when bias is not NULL), for
 * i < nb, P = OH*OW: the product's [O, nb*P] layout back to NCHW. */
cudaError_t _gcu_conv_unpack(cudaStream_t s, const gcu_conv *g, const float *t, const float *bias, int64_t n0,
                             int64_t nb, float *y);
/* t [o, i*P + p] = dy [n0+i, o, p]: dy in the product's layout. */
cudaError_t _gcu_conv_pack(cudaStream_t s, const gcu_conv *g, const float *dy, int64_t n0, int64_t nb, float *t);

/* Pooling over planes: x [planes, H, W], window k x k moved by stride, no
 * padding, y [planes, OH, OW] with OH = (H - k) / stride + 1.  argmax
 * (NULL or as y) gets each maximum's flat index in its plane, the first in
 * row-major order of equal maxima. */
cudaError_t _gcu_max_pool(cudaStream_t s, float *y, int32_t *argmax, const float *x, int64_t planes, int64_t H,
                          int64_t W, int k, int stride);
cudaError_t _gcu_avg_pool(cudaStream_t s, float *y, const float *x, int64_t planes, int64_t H, int64_t W, int k,
                          int stride);
/* dx [planes, H, W] from dy [planes, OH, OW]: every element gathers the
 * outputs whose window holds it (overlapping windows need no atomics). */
cudaError_t _gcu_max_pool_grad(cudaStream_t s, float *dx, const float *dy, const int32_t *argmax, int64_t planes,
                               int64_t H, int64_t W, int k, int stride);
cudaError_t _gcu_avg_pool_grad(cudaStream_t s, float *dx, const float *dy, int64_t planes, int64_t H, int64_t W,
                               int k, int stride);

/* ---- nn.cu --------------------------------------------------------------- */

/* y [rows, C] = softmax of each row of x; y may be x. */
cudaError_t _gcu_softmax(cudaStream_t s, float *y, const float *x, int64_t rows, int64_t C);
/* dx = y * (dy - sum over the row of dy * y), row by row. */
cudaError_t _gcu_softmax_grad(cudaStream_t s, float *dx, const float *dy, const float *y, int64_t rows, int64_t C);
/* loss (one float) = the mean over rows of log-sum-exp(x) - x[label]; a
 * label outside [0, C) makes it NaN. */
cudaError_t _gcu_cross_entropy(cudaStream_t s, float *loss, const float *x, const int32_t *labels, int64_t rows,
                               int64_t C);
/* dx [rows, C] = (probs - onehot(label)) * scale (a label out of range:
 * probs * scale). */
cudaError_t _gcu_cross_entropy_grad(cudaStream_t s, float *dx, const float *probs, const int32_t *labels,
                                    int64_t rows, int64_t C, float scale);
/* y [n, D] = w [idx[i], :]; an index outside [0, V) gives a row of NaN. */
cudaError_t _gcu_embedding(cudaStream_t s, float *y, const float *w, const int32_t *idx, int64_t n, int64_t V,
                           int64_t D);
/* dw [V, D] += dy [n, D] scattered by idx (atomicAdd: repeated indices;
 * out-of-range ones are skipped). */
cudaError_t _gcu_embedding_grad(cudaStream_t s, float *dw, const float *dy, const int32_t *idx, int64_t n,
                                int64_t V, int64_t D);

/* ---- optim.cu ------------------------------------------------------------ */

/* SGD as torch.optim.SGD: d = g + wd*p; buf = first ? d : mu*buf + d (when
 * mu != 0); p -= lr * d (buf when mu != 0).  buf may be NULL when mu == 0. */
cudaError_t _gcu_sgd(cudaStream_t s, float *p, const float *g, float *buf, int64_t n, float lr, float mu, float wd,
                     int first);
/* Adam as torch.optim.Adam at step t >= 1 (bias corrections from t). */
cudaError_t _gcu_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                      float b2, float eps, float wd, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
