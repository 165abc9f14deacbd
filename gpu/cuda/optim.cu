/* optim.cu - the optimizers' updates, element by element, as torch.optim
 * and the host backend compute them: the same operations in the same
 * order, in float, the bias corrections in double on the host side.  With
 * contraction off (--fmad=false, cuda.mk) and IEEE division and square
 * root, each element's update equals the host backend's bit for bit. */
#include "common.cuh"

#include <math.h>

__global__ void k_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float mu, float wd, int first) {
  GCU_FOR(i, n) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    if (mu != 0.0f) {
      buf[i] = first ? d : mu * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}

__global__ void k_adam(float *p, const float *g, float *m, float *v, int64_t n, float step, float b1, float b2,
                       float eps, float wd, float bc2s) {
  GCU_FOR(i, n) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    float mi = b1 * m[i] + (1.0f - b1) * d;
    float vi = b2 * v[i] + (1.0f - b2) * d * d;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step * mi / (sqrtf(vi) / bc2s + eps);
  }
}

extern "C" cudaError_t _gcu_sgd(cudaStream_t s, float *p, const float *g, float *buf, int64_t n, float lr, float mu,
                                float wd, int first) {
  if (mu != 0.0f && buf == NULL) return cudaErrorInvalidValue;
  if (n > 0) k_sgd<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(p, g, buf, n, lr, mu, wd, first);
  return gcu_launched();
}

extern "C" cudaError_t _gcu_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, int64_t n, float lr,
                                 float b1, float b2, float eps, float wd, int64_t t) {
  if (t < 1) return cudaErrorInvalidValue;
  float bc1 = (float)(1.0 - pow(b1, (double)t)), bc2 = (float)(1.0 - pow(b2, (double)t));
  float step = lr / bc1, bc2s = sqrtf(bc2);
  if (n > 0) k_adam<<<gcu_blocks(n), GCU_THREADS, 0, s>>>(p, g, m, v, n, step, b1, b2, eps, wd, bc2s);
  return gcu_launched();
}
