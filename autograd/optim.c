/* optim.c - SGD with momentum and weight decay, and Adam, as torch.optim
 * computes them (float32, same order of operations). */
#include "internal.h"

#include <math.h>
#include <string.h>

static ta_tag tag_optim;

static ag_optim *optim_new(optim_kind kind, ag_layer *model) {
  if (tag_optim == TA_ANY) tag_optim = ta_tag_get("autograd.optim");
  size_t n = ag_layer_params(model, NULL, 0);
  if (model == NULL || n == 0) return _ag_err("optimizer: the model has no parameters");
  ag_optim *o = ta_calloc(tag_optim, 1, sizeof *o);
  if (o) {
    o->params = ta_calloc(tag_optim, n, sizeof *o->params);
    o->m = ta_calloc(tag_optim, n, sizeof *o->m);
    o->v = ta_calloc(tag_optim, n, sizeof *o->v);
  }
  if (o == NULL || o->params == NULL || o->m == NULL || o->v == NULL) {
    ag_optim_free(o);
    return _ag_err("optimizer: out of memory");
  }
  o->kind = kind;
  o->n = n;
  ag_layer_params(model, o->params, n);
  for (size_t i = 0; i < n; i++) {
    const tensor *p = o->params[i]->value;
    bool two = kind == O_ADAM;
    o->m[i] = tensor_zeros(TENSOR_F32, p->ndim, p->shape);
    o->v[i] = two ? tensor_zeros(TENSOR_F32, p->ndim, p->shape) : NULL;
    if (o->m[i] == NULL || (two && o->v[i] == NULL)) {
      ag_optim_free(o);
      return _ag_err("optimizer: out of memory for its state");
    }
  }
  return o;
}

ag_optim *ag_sgd_new(ag_layer *model, float lr, float momentum, float weight_decay) {
  if (!(lr > 0) || momentum < 0 || momentum >= 1 || weight_decay < 0)
    return _ag_err("ag_sgd_new: lr %g (want > 0), momentum %g (want [0, 1)), weight decay %g (want >= 0)", lr,
                   momentum, weight_decay);
  ag_optim *o = optim_new(O_SGD, model);
  if (o) {
    o->lr = lr;
    o->momentum = momentum;
    o->weight_decay = weight_decay;
  }
  return o;
}

ag_optim *ag_adam_new(ag_layer *model, float lr, float beta1, float beta2, float eps, float weight_decay) {
  if (!(lr > 0) || beta1 < 0 || beta1 >= 1 || beta2 < 0 || beta2 >= 1 || !(eps > 0) || weight_decay < 0)
    return _ag_err("ag_adam_new: lr %g, betas (%g, %g), eps %g, weight decay %g: out of range", lr, beta1, beta2,
                   eps, weight_decay);
  ag_optim *o = optim_new(O_ADAM, model);
  if (o) {
    o->lr = lr;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
  }
  return o;
}

/* restrict, the scalars in locals and no errno from sqrtf (-fno-math-errno,
 * part.mk): the loops vectorize; each element's arithmetic is unchanged. */
static void sgd_one(const ag_optim *o, float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                    bool first) {
  float lr = o->lr, mu = o->momentum, wd = o->weight_decay;
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
static void adam_one(const ag_optim *o, float *restrict p, const float *restrict g, float *restrict m,
                     float *restrict v, int64_t n) {
  float b1 = o->beta1, b2 = o->beta2, wd = o->weight_decay, eps = o->eps;
  double t = (double)o->steps;
  float bc1 = (float)(1.0 - pow(b1, t)), bc2 = (float)(1.0 - pow(b2, t));
  float step = o->lr / bc1, bc2s = sqrtf(bc2);
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (wd != 0.0f) d += wd * p[i];
    m[i] = b1 * m[i] + (1.0f - b1) * d;
    v[i] = b2 * v[i] + (1.0f - b2) * d * d;
    p[i] -= step * m[i] / (sqrtf(v[i]) / bc2s + eps);
  }
}

void ag_optim_step(ag_optim *o) {
  if (o == NULL) return;
  o->steps++;
  for (size_t i = 0; i < o->n; i++) {
    ag_var *p = o->params[i];
    int64_t n = p->value->numel;
    if (o->kind == O_SGD)
      sgd_one(o, tensor_f32(p->value), tensor_f32(p->grad), tensor_f32(o->m[i]), n, o->steps == 1);
    else
      adam_one(o, tensor_f32(p->value), tensor_f32(p->grad), tensor_f32(o->m[i]), tensor_f32(o->v[i]), n);
  }
}

void ag_optim_zero_grad(ag_optim *o) {
  if (o) ag_zero_grad(o->params, o->n);
}

void ag_optim_set_lr(ag_optim *o, float lr) {
  if (o && lr > 0) o->lr = lr;
}

uint64_t ag_optim_steps(const ag_optim *o) { return o ? o->steps : 0; }

void ag_optim_free(ag_optim *o) {
  if (o == NULL) return;
  for (size_t i = 0; i < o->n; i++) {
    if (o->m) tensor_free(o->m[i]);
    if (o->v) tensor_free(o->v[i]);
  }
  ta_free(o->params);
  ta_free(o->m);
  ta_free(o->v);
  ta_free(o);
}
