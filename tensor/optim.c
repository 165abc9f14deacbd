/* optim.c - the SGD and Adam updates of one parameter tensor, as
 * torch.optim computes them (float32, the same order of operations), on
 * host tensors here and on a device through device_nn.c.  Built with
 * -fno-math-errno (part.mk): sqrtf sets no errno, so the loops vectorize;
 * each element's arithmetic is unchanged. */
#include "internal.h"

#include <math.h>

static void sgd_one(float *restrict p, const float *restrict g, float *restrict buf, int64_t n, float lr, float mu,
                    float wd, bool first) {
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    if (mu != 0.0f) {
      buf[i] = first ? d : mu * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}

/* AVX2 without FMA where the CPU has it: twice the lanes of the baseline's
 * divisions and square roots, and no contraction, so the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
__attribute__((target_clones("avx2", "default")))
#endif
static void adam_one(float *restrict p, const float *restrict g, float *restrict m, float *restrict v, int64_t n,
                     float lr, float b1, float b2, float eps, float wd, int64_t t) {
  float bc1 = (float)(1.0 - pow(b1, (double)t)), bc2 = (float)(1.0 - pow(b2, (double)t));
  float step = lr / bc1, bc2s = sqrtf(bc2);
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * d;
    v[i] = b2 * v[i] + (1.0f - b2) * d * d;
    p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + eps);
  }
}

/* t[0..n) live host f32, contiguous, of t[0]'s shape. */
static bool update_args(const char *op, tensor *const *t, const char *const *names, int n) {
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  for (int i = 0; i < n; i++) {
    if (!_tensor_arg_f32(op, names[i], t[i])) return false;
    if (!_tensor_contig(t[i]) || !_tensor_same_shape(t[i], t[0])) {
      _tensor_err(TENSOR_ESHAPE, "%s: %s is %s, want a contiguous f32 of p's shape %s", op, names[i],
                  _tensor_desc(t[i], b1), _tensor_desc(t[0], b2));
      return false;
    }
  }
  return true;
}

tensor_status tensor_sgd_step_(tensor *p, const tensor *g, tensor *buf, float lr, float momentum, float weight_decay,
                               int first) {
  const char *op = "tensor_sgd_step_";
  bool bad;
  if (momentum != 0.0f && buf == NULL) return _tensor_err(TENSOR_EINVAL, "%s: momentum %g needs buf", op, momentum);
  if (_tensor_dev_dispatch(op, p, g, &bad))
    return _tensor_devops->sgd(op, p, g, momentum != 0.0f ? buf : NULL, lr, momentum, weight_decay, first);
  if (bad) return tensor_last_status();
  tensor *t[3] = { p, (tensor *)g, buf };
  if (!update_args(op, t, (const char *const[]){ "p", "g", "buf" }, momentum != 0.0f ? 3 : 2))
    return tensor_last_status();
  sgd_one(p->data, g->data, buf ? buf->data : NULL, p->numel, lr, momentum, weight_decay, first != 0);
  return TENSOR_OK;
}

tensor_status tensor_adam_step_(tensor *p, const tensor *g, tensor *m, tensor *v, float lr, float beta1, float beta2,
                                float eps, float weight_decay, int64_t t) {
  const char *op = "tensor_adam_step_";
  bool bad;
  if (t < 1) return _tensor_err(TENSOR_EINVAL, "%s: step %lld, want >= 1", op, (long long)t);
  if (_tensor_dev_dispatch(op, p, g, &bad))
    return _tensor_devops->adam(op, p, g, m, v, lr, beta1, beta2, eps, weight_decay, t);
  if (bad) return tensor_last_status();
  tensor *ts[4] = { p, (tensor *)g, m, v };
  if (!update_args(op, ts, (const char *const[]){ "p", "g", "m", "v" }, 4)) return tensor_last_status();
  adam_one(p->data, g->data, m->data, v->data, p->numel, lr, beta1, beta2, eps, weight_decay, t);
  return TENSOR_OK;
}
