/* optim.c - SGD with momentum and weight decay, and Adam, as torch.optim
 * computes them (float32, same order of operations): tensor/'s updates
 * (tensor_sgd_step_, tensor_adam_step_), so that parameters on a device
 * are stepped there, their state beside them. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define tag_optim _ag_tag_optim
/* array[i] = p, declared as the array's hold "<what><i>". */
void _ag_optim_hold(ag_optim *o, const char *what, void *array, size_t i, const void *p) {
  (void)o;
  char slot[32];
  snprintf(slot, sizeof slot, "%s%zu", what, i);
  ta_hold(array, slot, p);
}

#define OPTIM_OK(op, o) _ag_live(op, o, _ag_tag_optim, _ag_tag_optim, 0)

/* Zeros of p's shape on p's device. */
static tensor *device_zeros(const tensor *p) {
  tensor *t = tensor_clone(p);
  if (t && tensor_fill_(t, 0.0f) != TENSOR_OK) {
    tensor_free(t);
    return NULL;
  }
  return t;
}

static ag_optim *optim_new(optim_kind kind, ag_layer *model) {
  _ag_tags_init();
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
  /* what it keeps, declared: the parameters it steps and its state */
  ta_hold(o, "params", o->params);
  ta_hold(o, "m", o->m);
  ta_hold(o, "v", o->v);
  for (size_t i = 0; i < n; i++) _ag_optim_hold(o, "param", o->params, i, o->params[i]);
  for (size_t i = 0; i < n; i++) {
    const tensor *p = o->params[i]->value;
    bool two = kind == O_ADAM;
    bool dev = tensor_device(p) != NULL;
    o->m[i] = dev ? device_zeros(p) : tensor_zeros(TENSOR_F32, p->ndim, p->shape);
    o->v[i] = !two ? NULL : dev ? device_zeros(p) : tensor_zeros(TENSOR_F32, p->ndim, p->shape);
    if (o->m[i] == NULL || (two && o->v[i] == NULL)) {
      ag_optim_free(o);
      return _ag_err("optimizer: out of memory for its state");
    }
    _ag_optim_hold(o, "m", o->m, i, o->m[i]);
    if (two) _ag_optim_hold(o, "v", o->v, i, o->v[i]);
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

void ag_optim_step(ag_optim *o) {
  if (o == NULL || !OPTIM_OK("ag_optim_step", o)) return;
  o->steps++;
  /* tensor/'s updates: on the parameters' device, or host memory */
  for (size_t i = 0; i < o->n; i++) {
    ag_var *p = o->params[i];
    tensor_status st;
    if (o->kind == O_SGD)
      st = tensor_sgd_step_(p->value, p->grad, o->m[i], o->lr, o->momentum, o->weight_decay, o->steps == 1);
    else
      st = tensor_adam_step_(p->value, p->grad, o->m[i], o->v[i], o->lr, o->beta1, o->beta2, o->eps,
                             o->weight_decay, (int64_t)o->steps);
    if (st != TENSOR_OK) {
      _ag_err("ag_optim_step: parameter %zu: %s", i, tensor_error());
      return;
    }
  }
}

void ag_optim_zero_grad(ag_optim *o) {
  if (o && OPTIM_OK("ag_optim_zero_grad", o)) ag_zero_grad(o->params, o->n);
}

void ag_optim_set_lr(ag_optim *o, float lr) {
  if (o && OPTIM_OK("ag_optim_set_lr", o) && lr > 0) o->lr = lr;
}

uint64_t ag_optim_steps(const ag_optim *o) { return o && OPTIM_OK("ag_optim_steps", o) ? o->steps : 0; }

void ag_optim_free(ag_optim *o) {
  if (o == NULL || !_ag_live("ag_optim_free", o, _ag_tag_optim, _ag_tag_optim, TA_CHECK_FREE)) return;
  /* the arrays (the holders) go before what they hold */
  tensor **m = o->m, **v = o->v;
  size_t n = o->n;
  ta_free(o->params);
  ta_free(o);
  if (m) {
    tensor *keep[n ? n : 1];
    memcpy(keep, m, n * sizeof *keep);
    ta_free(m);
    for (size_t i = 0; i < n; i++) tensor_free(keep[i]);
  }
  if (v) {
    tensor *keep[n ? n : 1];
    memcpy(keep, v, n * sizeof *keep);
    ta_free(v);
    for (size_t i = 0; i < n; i++) tensor_free(keep[i]);
  }
}
