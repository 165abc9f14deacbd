/* nn.c - random numbers, layers with PyTorch's default initialisation, and
 * the sequential container. */
#include "internal.h"

#include <stdio.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers: splitmix64 --------------------------------------------- */

ag_rng ag_rng_new(uint64_t seed) { return (ag_rng){ .s = seed }; }

uint64_t ag_rng_next(ag_rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float ag_rng_uniform(ag_rng *r) { return (float)(ag_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float ag_rng_normal(ag_rng *r) {
  /* Box-Muller; u1 in (0, 1] so the log is finite. */
  double u1 = ((double)(ag_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(ag_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t ag_rng_below(ag_rng *r, uint64_t n) {
  /* Lemire's multiply-shift with rejection: no modulo bias. */
  uint64_t x = ag_rng_next(r);
  __uint128_t m = (__uint128_t)x * n;
  uint64_t l = (uint64_t)m;
  if (l < n) {
    uint64_t t = -n % n;
    while (l < t) {
      x = ag_rng_next(r);
      m = (__uint128_t)x * n;
      l = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

/* ---- layers -------------------------------------------------------------------- */

bool _ag_fusion_off(void) {
  static int off = -1;   /* -1: not read yet; the same answer from any thread */
  int got = __atomic_load_n(&off, __ATOMIC_RELAXED);
  if (got < 0) {
    const char *e = getenv("AG_FUSE");
    got = e != NULL && strcmp(e, "off") == 0;
    __atomic_store_n(&off, got, __ATOMIC_RELAXED);
  }
  return got;
}

typedef enum { L_LINEAR, L_CONV2D, L_MAX_POOL, L_AVG_POOL, L_RELU, L_TANH, L_FLATTEN, L_EMBEDDING, L_SEQUENTIAL } layer_kind;

struct ag_layer {
  layer_kind kind;
  int stride, pad, k;
  ag_var *weight, *bias;
  ag_layer **children;   /* sequential */
  int nchildren;
};

#define tag_layer _ag_tag_layer
#define LAYER_OK(op, l) _ag_live(op, l, _ag_tag_layer, _ag_tag_layer, 0)

static ag_layer *layer_new(layer_kind kind) {
  _ag_tags_init();
  ag_layer *l = ta_calloc(tag_layer, 1, sizeof *l);
  if (l == NULL) return _ag_err("layer: out of memory");
  l->kind = kind;
  return l;
}

/* U(-bound, bound), bound = 1/sqrt(fan_in): Kaiming-uniform with a = sqrt(5)
 * (gain sqrt(2/6), bound gain*sqrt(3/fan_in)) and PyTorch's bias rule. */
static ag_var *uniform_param(int ndim, const int64_t *shape, int64_t fan_in, ag_rng *rng) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  if (t == NULL) return NULL;
  float bound = (float)(1.0 / sqrt((double)fan_in)), *d = tensor_f32(t);
  for (int64_t i = 0; i < t->numel; i++) d[i] = (2.0f * ag_rng_uniform(rng) - 1.0f) * bound;
  return ag_param_new(t);
}

/* A layer declares what it keeps: its parameters (so that a tape's reset,
 * which ends the ops' holds on them, never leaves them orphans). */
static ag_layer *with_params(ag_layer *l, bool want_bias) {
  if (l->weight == NULL || (want_bias && l->bias == NULL)) {
    ag_layer_free(l);
    return _ag_err("layer: out of memory for the parameters");
  }
  ta_hold(l, "weight", l->weight);
  if (l->bias) ta_hold(l, "bias", l->bias);
  return l;
}

ag_layer *ag_linear(int in, int out, ag_rng *rng) {
  if (in < 1 || out < 1 || rng == NULL) return _ag_err("ag_linear: sizes %d -> %d (want >= 1) or no rng", in, out);
  ag_layer *l = layer_new(L_LINEAR);
  if (l == NULL) return NULL;
  l->weight = uniform_param(2, (int64_t[]){ out, in }, in, rng);
  l->bias = uniform_param(1, (int64_t[]){ out }, in, rng);
  return with_params(l, true);
}

ag_layer *ag_conv2d_layer(int cin, int cout, int k, int stride, int pad, ag_rng *rng) {
  if (cin < 1 || cout < 1 || k < 1 || stride < 1 || pad < 0 || rng == NULL)
    return _ag_err("ag_conv2d_layer: channels %d -> %d, kernel %d, stride %d, pad %d: out of range", cin, cout, k,
                   stride, pad);
  ag_layer *l = layer_new(L_CONV2D);
  if (l == NULL) return NULL;
  int64_t fan_in = (int64_t)cin * k * k;
  l->stride = stride;
  l->pad = pad;
  l->weight = uniform_param(4, (int64_t[]){ cout, cin, k, k }, fan_in, rng);
  l->bias = uniform_param(1, (int64_t[]){ cout }, fan_in, rng);
  return with_params(l, true);
}

static ag_layer *pool_layer(layer_kind kind, const char *name, int k, int stride) {
  if (k < 1 || stride < 1) return _ag_err("%s: window %d, stride %d (want >= 1)", name, k, stride);
  ag_layer *l = layer_new(kind);
  if (l) {
    l->k = k;
    l->stride = stride;
  }
  return l;
}

ag_layer *ag_max_pool2d_layer(int k, int stride) { return pool_layer(L_MAX_POOL, "ag_max_pool2d_layer", k, stride); }
ag_layer *ag_avg_pool2d_layer(int k, int stride) { return pool_layer(L_AVG_POOL, "ag_avg_pool2d_layer", k, stride); }
ag_layer *ag_relu_layer(void) { return layer_new(L_RELU); }
ag_layer *ag_tanh_layer(void) { return layer_new(L_TANH); }
ag_layer *ag_flatten_layer(void) { return layer_new(L_FLATTEN); }

ag_layer *ag_embedding_layer(int vocab, int dim, ag_rng *rng) {
  if (vocab < 1 || dim < 1 || rng == NULL) return _ag_err("ag_embedding_layer: %d x %d (want >= 1) or no rng", vocab, dim);
  ag_layer *l = layer_new(L_EMBEDDING);
  if (l == NULL) return NULL;
  tensor *t = tensor_empty(TENSOR_F32, 2, (int64_t[]){ vocab, dim });
  if (t) {
    float *d = tensor_f32(t);
    for (int64_t i = 0; i < t->numel; i++) d[i] = ag_rng_normal(rng);
  }
  l->weight = ag_param_new(t);
  return with_params(l, false);
}

ag_layer *ag_sequential(ag_layer **layers, int n) {
  bool bad = n < 1 || layers == NULL;
  for (int i = 0; !bad && i < n; i++) bad = layers[i] == NULL;
  for (int i = 0; !bad && i < n; i++)
    if (!LAYER_OK("ag_sequential", layers[i])) return NULL;   /* not ours to free */
  ag_layer *l = bad ? NULL : layer_new(L_SEQUENTIAL);
  if (l) l->children = ta_calloc(tag_layer, (size_t)n, sizeof *l->children);
  if (l == NULL || l->children == NULL) {
    if (layers)
      for (int i = 0; i < n; i++) ag_layer_free(layers[i]);
    if (l) ta_free(l);
    return bad ? _ag_err("ag_sequential: %s", n < 1 ? "no layers" : "a layer is NULL") : NULL;
  }
  memcpy(l->children, layers, (size_t)n * sizeof *layers);
  l->nchildren = n;
  ta_hold(l, "children", l->children);
  for (int i = 0; i < n; i++) {
    char slot[24];
    snprintf(slot, sizeof slot, "child%d", i);
    ta_hold(l->children, slot, l->children[i]);
  }
  return l;
}

static ag_var *layer_forward(ag_layer *l, ag_var *x);

ag_var *ag_layer_forward(ag_layer *l, ag_var *x) {
  if (l == NULL) return _ag_err("ag_layer_forward: layer is NULL");
  if (x == NULL) return NULL;
  if (!LAYER_OK("ag_layer_forward", l) || !_ag_var_ok("ag_layer_forward", x)) return NULL;
  return layer_forward(l, x);
}

/* l and x checked (the children of a sequential are its own). */
static ag_var *layer_forward(ag_layer *l, ag_var *x) {
  switch (l->kind) {
  case L_LINEAR: return ag_linear_op(x, l->weight, l->bias);
  case L_CONV2D: return ag_conv2d(x, l->weight, l->bias, l->stride, l->pad);
  case L_MAX_POOL: return ag_max_pool2d(x, l->k, l->stride);
  case L_AVG_POOL: return ag_avg_pool2d(x, l->k, l->stride);
  case L_RELU: return ag_relu(x);
  case L_TANH: return ag_tanh(x);
  case L_FLATTEN: return ag_flatten(x);
  case L_EMBEDDING: return _ag_embedding_var(l->weight, x);
  case L_SEQUENTIAL:
    for (int i = 0; i < l->nchildren && x; i++) {
      ag_layer **c = l->children + i;
      /* embedding, flatten, linear: one op, over the distinct indices */
      if (c[0]->kind == L_EMBEDDING && i + 2 < l->nchildren && c[1]->kind == L_FLATTEN && c[2]->kind == L_LINEAR &&
          _ag_embedding_linear(c[0]->weight, x, c[2]->weight, c[2]->bias, &x)) {
        i += 2;
        continue;
      }
      x = layer_forward(c[0], x);
    }
    return x;
  }
  return NULL;
}

size_t ag_layer_params(ag_layer *l, ag_var **out, size_t max) {
  if (l == NULL || !LAYER_OK("ag_layer_params", l)) return 0;
  size_t n = 0;
  if (l->kind == L_SEQUENTIAL) {
    for (int i = 0; i < l->nchildren; i++)
      n += ag_layer_params(l->children[i], out ? out + (n < max ? n : max) : NULL, n < max ? max - n : 0);
    return n;
  }
  ag_var *mine[2] = { l->weight, l->bias };
  for (int i = 0; i < 2; i++)
    if (mine[i]) {
      if (out && n < max) out[n] = mine[i];
      n++;
    }
  return n;
}

int ag_layer_to(ag_layer *l, gpu_pool *device) {
  if (l == NULL) return _ag_err("ag_layer_to: layer is NULL"), -1;
  if (!LAYER_OK("ag_layer_to", l)) return -1;
  size_t n = ag_layer_params(l, NULL, 0);
  if (n == 0) return 0;
  ag_var **ps = ta_calloc(tag_layer, n, sizeof *ps);
  tensor **moved = ps ? ta_calloc(tag_layer, 2 * n, sizeof *moved) : NULL;
  if (moved == NULL) {
    ta_free(ps);
    return _ag_err("ag_layer_to: out of memory"), -1;
  }
  ag_layer_params(l, ps, n);
  /* every copy first, so a failure moves nothing */
  size_t i;
  for (i = 0; i < n; i++) {
    moved[2 * i] = tensor_to(ps[i]->value, device);
    moved[2 * i + 1] = moved[2 * i] ? tensor_to(ps[i]->grad, device) : NULL;
    if (moved[2 * i + 1] == NULL) break;
  }
  int rc = 0;
  if (i < n) {
    for (size_t j = 0; j <= i; j++) {
      tensor_free(moved[2 * j]);
      tensor_free(moved[2 * j + 1]);
    }
    rc = -1;
    _ag_err("ag_layer_to: parameter %zu: %s", i, tensor_error());
  } else {
    for (i = 0; i < n; i++) {
      tensor *v = ps[i]->value, *g = ps[i]->grad;
      ps[i]->value = moved[2 * i];
      ps[i]->grad = moved[2 * i + 1];
      ta_hold(ps[i], "value", ps[i]->value);   /* (replaces the hold on the old one) */
      ta_hold(ps[i], "grad", ps[i]->grad);
      tensor_free(v);
      tensor_free(g);
    }
  }
  ta_free(moved);
  ta_free(ps);
  return rc;
}

const char *ag_layer_name(const ag_layer *l) {
  static const char *names[] = { "linear", "conv2d", "max_pool2d", "avg_pool2d", "relu", "tanh", "flatten", "embedding", "sequential" };
  if (l && !LAYER_OK("ag_layer_name", l)) return "(not a live layer)";
  return l ? names[l->kind] : "NULL";
}

void ag_layer_free(ag_layer *l) {
  if (l == NULL || !_ag_live("ag_layer_free", l, _ag_tag_layer, _ag_tag_layer, TA_CHECK_FREE)) return;
  /* the holder goes first: its holds end with it, and no target it
   * held is ever freed while held */
  ag_var *w = l->weight, *b = l->bias;
  ag_layer **children = l->children;
  int n = l->nchildren;
  ta_free(l);
  if (children) {
    ag_layer *kids[n > 0 ? n : 1];
    memcpy(kids, children, (size_t)n * sizeof *kids);
    ta_free(children);
    for (int i = 0; i < n; i++) ag_layer_free(kids[i]);
  }
  ag_param_free(w);
  ag_param_free(b);
}
