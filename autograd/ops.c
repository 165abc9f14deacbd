/* ops.c - the differentiable ops: each forward runs the tensor op and records
 * itself; _ag_op_backward computes the inputs' gradients from dL/dout. */
#include "internal.h"

#include <math.h>
#include <string.h>

static int norm_axis(int axis, int ndim) { return axis < 0 ? axis + ndim : axis; }

static bool need(const ag_var *v) { return v && v->requires_grad; }

/* g reduced (summed) to the shape of like: numpy broadcasting undone.  Sets
 * *owned when the result is a new tensor (else it is g itself). */
static tensor *reduce_to(const tensor *g, const tensor *like, bool *owned) {
  tensor *cur = (tensor *)g;
  bool own = false;
  for (int lead = g->ndim - like->ndim; lead > 0 && cur; lead--) {
    tensor *n = tensor_sum(cur, 0, 0);
    if (own) tensor_free(cur);
    cur = n;
    own = true;
  }
  for (int i = 0; cur && i < like->ndim; i++)
    if (like->shape[i] == 1 && cur->shape[i] != 1) {
      tensor *n = tensor_sum(cur, i, 1);
      if (own) tensor_free(cur);
      cur = n;
      own = true;
    }
  *owned = own;
  return cur;
}

/* Gives g (reduced to v's shape) to v's gradient. */
static void give(ag_var *v, tensor *g, bool owned) {
  if (!need(v) || g == NULL) {
    if (owned) tensor_free(g);
    return;
  }
  bool rowned;
  tensor *r = reduce_to(g, v->value, &rowned);
  if (rowned) {
    if (owned) tensor_free(g);
    _ag_accumulate(v, r, true);
  } else {
    _ag_accumulate(v, g, owned);
  }
}

/* ---- forward ---------------------------------------------------------------- */

/* NULL: an earlier op failed (its error stands); else the ledger's check. */
#define CHECKN(name, a) do { if ((a) == NULL || !_ag_var_ok(name, (a))) return NULL; } while (0)
#define CHECK1(a) CHECKN(__func__, a)
#define CHECK2(a, b) do { CHECK1(a); CHECK1(b); } while (0)
#define CHECK_OPT(b) do { if ((b) != NULL && !_ag_var_ok(__func__, (b))) return NULL; } while (0)

static ag_var *record(const char *name, tensor *value, op_kind kind, ag_var *a, ag_var *b, ag_var *c,
                      ag_op **opp) {
  ag_var *in[AG_MAX_IN] = { a, b, c, NULL };
  int nin = c ? 3 : b ? 2 : 1;
  if (kind == OP_CONV2D || kind == OP_LINEAR) nin = 3;
  return _ag_result(name, value, kind, in, nin, opp);
}

/* record, for an op that keeps two ints (axes, stride and pad, ...). */
static ag_var *record_ia(const char *name, tensor *value, op_kind kind, ag_var *a, ag_var *b, ag_var *c,
                         int i0, int i1) {
  ag_op *op;
  ag_var *v = record(name, value, kind, a, b, c, &op);
  if (op) {
    op->ia[0] = i0;
    op->ia[1] = i1;
  }
  return v;
}

/* Every op checks for a tape before computing (no work thrown away). */
#define TAPE(name) do { if (_ag_tape_for(name) == NULL) return NULL; } while (0)

ag_var *ag_add(ag_var *a, ag_var *b) { CHECK2(a, b); TAPE("ag_add"); return record("ag_add", tensor_add(a->value, b->value), OP_ADD, a, b, NULL, NULL); }
ag_var *ag_sub(ag_var *a, ag_var *b) { CHECK2(a, b); TAPE("ag_sub"); return record("ag_sub", tensor_sub(a->value, b->value), OP_SUB, a, b, NULL, NULL); }
ag_var *ag_mul(ag_var *a, ag_var *b) { CHECK2(a, b); TAPE("ag_mul"); return record("ag_mul", tensor_mul(a->value, b->value), OP_MUL, a, b, NULL, NULL); }
ag_var *ag_div(ag_var *a, ag_var *b) { CHECK2(a, b); TAPE("ag_div"); return record("ag_div", tensor_div(a->value, b->value), OP_DIV, a, b, NULL, NULL); }
ag_var *ag_neg(ag_var *a) { CHECK1(a); TAPE("ag_neg"); return record("ag_neg", tensor_neg(a->value), OP_NEG, a, NULL, NULL, NULL); }
ag_var *ag_exp(ag_var *a) { CHECK1(a); TAPE("ag_exp"); return record("ag_exp", tensor_exp(a->value), OP_EXP, a, NULL, NULL, NULL); }
ag_var *ag_log(ag_var *a) { CHECK1(a); TAPE("ag_log"); return record("ag_log", tensor_log(a->value), OP_LOG, a, NULL, NULL, NULL); }
ag_var *ag_tanh(ag_var *a) { CHECK1(a); TAPE("ag_tanh"); return record("ag_tanh", tensor_tanh(a->value), OP_TANH, a, NULL, NULL, NULL); }
ag_var *ag_relu(ag_var *a) { CHECK1(a); TAPE("ag_relu"); return record("ag_relu", tensor_relu(a->value), OP_RELU, a, NULL, NULL, NULL); }
ag_var *ag_sigmoid(ag_var *a) { CHECK1(a); TAPE("ag_sigmoid"); return record("ag_sigmoid", tensor_sigmoid(a->value), OP_SIGMOID, a, NULL, NULL, NULL); }

ag_var *ag_add_scalar(ag_var *a, float s) {
  CHECK1(a);
  TAPE("ag_add_scalar");
  ag_op *op;
  ag_var *v = record("ag_add_scalar", tensor_add_scalar(a->value, s), OP_ADD_SCALAR, a, NULL, NULL, &op);
  if (op) op->fa = s;
  return v;
}

ag_var *ag_mul_scalar(ag_var *a, float s) {
  CHECK1(a);
  TAPE("ag_mul_scalar");
  ag_op *op;
  ag_var *v = record("ag_mul_scalar", tensor_mul_scalar(a->value, s), OP_MUL_SCALAR, a, NULL, NULL, &op);
  if (op) op->fa = s;
  return v;
}

static ag_var *reduce_op(const char *name, op_kind kind, ag_var *a, int axis, int keepdim) {
  CHECKN(name, a);
  if (_ag_tape_for(name) == NULL) return NULL;
  tensor *r = kind == OP_SUM ? tensor_sum(a->value, axis, keepdim) : tensor_mean(a->value, axis, keepdim);
  return record_ia(name, r, kind, a, NULL, NULL,
                   axis == TENSOR_ALL ? TENSOR_ALL : norm_axis(axis, a->value->ndim), keepdim);
}

ag_var *ag_sum(ag_var *a, int axis, int keepdim) { return reduce_op("ag_sum", OP_SUM, a, axis, keepdim); }
ag_var *ag_mean(ag_var *a, int axis, int keepdim) { return reduce_op("ag_mean", OP_MEAN, a, axis, keepdim); }

ag_var *ag_matmul(ag_var *a, ag_var *b) {
  CHECK2(a, b);
  TAPE("ag_matmul");
  if (a->value->ndim < 2 || b->value->ndim < 2)
    return _ag_err("ag_matmul: both sides need 2 or 3 dimensions (got %d%s and %d%s)", a->value->ndim,
                   ta_poison_explain((uint32_t)a->value->ndim, 4), b->value->ndim,
                   ta_poison_explain((uint32_t)b->value->ndim, 4));
  return record("ag_matmul", tensor_matmul(a->value, b->value), OP_MATMUL, a, b, NULL, NULL);
}

ag_var *ag_linear_op(ag_var *x, ag_var *w, ag_var *b) {
  CHECK2(x, w);
  CHECK_OPT(b);
  TAPE("ag_linear_op");
  const tensor *xv = x->value, *wv = w->value;
  if (xv->ndim != 2 || wv->ndim != 2 || xv->shape[1] != wv->shape[1] ||
      (b && (b->value->ndim != 1 || b->value->shape[0] != wv->shape[0]))) {
    char b1[96], b2[96], b3[96];
    return _ag_err("ag_linear_op: x %s, weight %s (want [out,in]) and bias %s do not fit",
                   tensor_shape_str(xv, b1, sizeof b1), tensor_shape_str(wv, b2, sizeof b2),
                   b ? tensor_shape_str(b->value, b3, sizeof b3) : "none");
  }
  tensor *y = tensor_matmul_t(xv, 0, wv, 1);   /* x @ w^T, no view of w^T made */
  if (y && b && tensor_add_(y, b->value) != TENSOR_OK) {
    tensor_free(y);
    y = NULL;
  }
  return record("ag_linear_op", y, OP_LINEAR, x, w, b, NULL);
}

ag_var *ag_conv2d(ag_var *x, ag_var *w, ag_var *b, int stride, int pad) {
  CHECK2(x, w);
  CHECK_OPT(b);
  TAPE("ag_conv2d");
  return record_ia("ag_conv2d", tensor_conv2d(x->value, w->value, b ? b->value : NULL, stride, pad), OP_CONV2D,
                   x, w, b, stride, pad);
}

ag_var *ag_max_pool2d(ag_var *x, int k, int stride) {
  CHECK1(x);
  TAPE("ag_max_pool2d");
  tensor *argmax = NULL;
  tensor *y = tensor_max_pool2d(x->value, k, stride, need(x) && ag_grad_enabled() ? &argmax : NULL);
  ag_op *op;
  ag_var *v = record("ag_max_pool2d", y, OP_MAX_POOL, x, NULL, NULL, &op);
  if (op && argmax) {
    _ag_save(op, argmax);
    op->ia[0] = k;   /* the window: a device's backward gathers by it */
    op->ia[1] = stride;
  } else {
    tensor_free(argmax);
  }
  return v;
}

ag_var *ag_avg_pool2d(ag_var *x, int k, int stride) {
  CHECK1(x);
  TAPE("ag_avg_pool2d");
  return record_ia("ag_avg_pool2d", tensor_avg_pool2d(x->value, k, stride), OP_AVG_POOL, x, NULL, NULL, k,
                   stride);
}

static ag_var *softmax_op(const char *name, op_kind kind, ag_var *x, int axis) {
  CHECKN(name, x);
  if (_ag_tape_for(name) == NULL) return NULL;
  tensor *y = kind == OP_SOFTMAX ? tensor_softmax(x->value, axis) : tensor_log_softmax(x->value, axis);
  ag_op *op;
  ag_var *v = record(name, y, kind, x, NULL, NULL, &op);
  if (op) op->ia[0] = norm_axis(axis, x->value->ndim);
  return v;
}

ag_var *ag_softmax(ag_var *x, int axis) { return softmax_op("ag_softmax", OP_SOFTMAX, x, axis); }
ag_var *ag_log_softmax(ag_var *x, int axis) { return softmax_op("ag_log_softmax", OP_LOG_SOFTMAX, x, axis); }

ag_var *ag_cross_entropy(ag_var *logits, const tensor *labels) {
  CHECK1(logits);
  if (labels == NULL) return _ag_err("ag_cross_entropy: labels are NULL");
  TAPE("ag_cross_entropy");
  ag_op *op;
  ag_var *v = record("ag_cross_entropy", tensor_cross_entropy(logits->value, labels), OP_CROSS_ENTROPY, logits,
                     NULL, NULL, &op);
  if (op) _ag_save(op, tensor_alias(labels));
  return v;
}

ag_var *ag_embedding(ag_var *weight, const tensor *indices) {
  CHECK1(weight);
  if (indices == NULL) return _ag_err("ag_embedding: indices are NULL");
  TAPE("ag_embedding");
  ag_op *op;
  ag_var *v = record("ag_embedding", tensor_embedding(weight->value, indices), OP_EMBEDDING, weight, NULL, NULL,
                     &op);
  if (op) _ag_save(op, tensor_alias(indices));
  return v;
}

ag_var *_ag_embedding_var(ag_var *weight, ag_var *indices) {
  CHECK2(weight, indices);
  TAPE("ag_embedding");
  /* the indices' variable is the op's second input (held "input1"): it
   * keeps its value to the reset, so no alias is saved */
  return record("ag_embedding", tensor_embedding(weight->value, indices->value), OP_EMBEDDING, weight, indices,
                NULL, NULL);
}

bool _ag_embedding_linear(ag_var *table, ag_var *indices, ag_var *weight, ag_var *bias, ag_var **out) {
  const tensor *t = table->value, *ix = indices->value, *w = weight->value, *b = bias ? bias->value : NULL;
  /* (the seeded bug reshape-dummy lives in the flatten's reshape: the three ops run, with it) */
  bool fits = !_ag_fusion_off() && tensor_fault_get() != TENSOR_FAULT_RESHAPE_DUMMY && t->dtype == TENSOR_F32 &&
              ix->dtype == TENSOR_I32 && w->dtype == TENSOR_F32 && t->ndim == 2 && ix->ndim == 2 && w->ndim == 2 &&
              w->shape[1] == ix->shape[1] * t->shape[1] && (b == NULL || (b->ndim == 1 && b->shape[0] == w->shape[0])) &&
              !tensor_device(t) && !tensor_device(ix) && !tensor_device(w) && (b == NULL || !tensor_device(b)) &&
              tensor_is_contiguous(ix) && ag_tape_current() != NULL && tensor_scope_depth() == 0;
  /* no tape, or an index out of range: the three ops run, and their error is the one said */
  const int32_t *p = fits ? tensor_i32((tensor *)ix) : NULL;
  for (int64_t i = 0; fits && i < ix->numel; i++) fits = p[i] >= 0 && p[i] < t->shape[0];
  if (!fits) return false;
  ag_var *in[AG_MAX_IN] = { table, indices, weight, bias };
  *out = _ag_result("ag_embedding_linear", tensor_embedding_linear(t, ix, w, b), OP_EMBEDDING_LINEAR, in, AG_MAX_IN,
                    NULL);
  return true;
}

ag_var *ag_reshape(ag_var *a, int ndim, const int64_t *shape) {
  CHECK1(a);
  TAPE("ag_reshape");
  return record("ag_reshape", tensor_reshape(a->value, ndim, shape), OP_RESHAPE, a, NULL, NULL, NULL);
}

ag_var *ag_flatten(ag_var *a) {
  CHECK1(a);
  if (a->value->ndim < 1) return _ag_err("ag_flatten: a scalar has no axis 0 to keep");
  return ag_reshape(a, 2, (int64_t[]){ a->value->shape[0], -1 });
}

ag_var *ag_transpose(ag_var *a, int axis0, int axis1) {
  CHECK1(a);
  TAPE("ag_transpose");
  return record_ia("ag_transpose", tensor_transpose(a->value, axis0, axis1), OP_TRANSPOSE, a, NULL, NULL, axis0,
                   axis1);
}

/* ---- backward ------------------------------------------------------------------ */

/* dL/dx of tanh, relu, sigmoid from dy and the op's output y: tensor/'s
 * vectorized kernels (a branchy scalar loop here was 12% of train-lenet). */
static tensor *pointwise_grad(op_kind k, const tensor *dy, const tensor *y) {
  switch (k) {
  case OP_TANH: return tensor_tanh_grad(dy, y);
  case OP_RELU: return tensor_relu_grad(dy, y);
  default:      return tensor_sigmoid_grad(dy, y);   /* OP_SIGMOID */
  }
}

static tensor *last2_transposed(const tensor *t) { return tensor_transpose(t, t->ndim - 2, t->ndim - 1); }

/* dy of a reduction spread back over x's shape (a view). */
static tensor *spread(const tensor *dy, const tensor *x, int axis, int keepdim) {
  tensor *k = axis != TENSOR_ALL && !keepdim ? tensor_unsqueeze(dy, axis) : tensor_alias(dy);
  tensor *e = k ? tensor_expand(k, x->ndim, x->shape) : NULL;
  tensor_free(k);
  return e;
}

static void embedding_backward(ag_op *op, const tensor *dy) {
  ag_var *w = op->in[0];
  if (!need(w)) return;
  /* scatter-added into the gradient, on the weight's device */
  tensor *acc = w->grad || !tensor_device(w->value) ? NULL : tensor_clone(w->value);
  if (acc && tensor_fill_(acc, 0.0f) != TENSOR_OK) {
    tensor_free(acc);
    return;
  }
  if (!w->grad && !acc) acc = tensor_zeros(TENSOR_F32, 2, w->value->shape);
  tensor *dst = w->grad ? w->grad : acc;
  const tensor *idx = op->saved ? op->saved : op->in[1]->value;   /* ag_embedding, or _ag_embedding_var */
  if (dst) tensor_embedding_grad_(dst, dy, idx);
  if (acc) _ag_accumulate(w, acc, true);
}

/* The fused embedding -> flatten -> linear: the parameters' gradients
 * accumulated in place (the parameters always have one; any other, a
 * gradient made first). */
static void embedding_linear_backward(ag_op *op, const tensor *dy) {
  ag_var *t = op->in[0], *w = op->in[2], *b = op->in[3];
  tensor *g[3] = { NULL, NULL, NULL };
  ag_var *v[3] = { t, w, b };
  for (int i = 0; i < 3; i++)
    if (need(v[i])) {
      if (v[i]->grad == NULL) v[i]->grad = tensor_zeros(TENSOR_F32, v[i]->value->ndim, v[i]->value->shape);
      g[i] = v[i]->grad;
    }
  tensor_embedding_linear_grad_(g[0], g[1], g[2], dy, t->value, op->in[1]->value, w->value);
}

/* dy may be taken over as a's gradient (computed in place, or reshaped):
 * the caller gives it (may_take), a wants a gradient, dy is contiguous and
 * its storage has no other header (nothing else sees it change). */
static bool can_take(const tensor *dy, bool may_take, const ag_var *a) {
  return may_take && need(a) && tensor_is_contiguous(dy) && tensor_storage_refs(dy) == 1;
}

static tensor_status pointwise_grad_out(op_kind k, tensor *out, const tensor *dy, const tensor *y) {
  switch (k) {
  case OP_TANH: return tensor_tanh_grad_out(out, dy, y);
  case OP_RELU: return tensor_relu_grad_out(out, dy, y);
  default:      return tensor_sigmoid_grad_out(out, dy, y);   /* OP_SIGMOID */
  }
}

bool _ag_op_backward(ag_op *op, tensor *dy, bool may_take) {
  ag_var *a = op->in[0], *b = op->nin > 1 ? op->in[1] : NULL, *c = op->nin > 2 ? op->in[2] : NULL;
  const tensor *y = op->out->value;
  switch (op->kind) {
  case OP_ADD:
    give(a, (tensor *)dy, false);
    give(b, (tensor *)dy, false);
    break;
  case OP_SUB:
    give(a, (tensor *)dy, false);
    if (need(b)) give(b, tensor_neg(dy), true);
    break;
  case OP_MUL:
    if (need(a)) give(a, tensor_mul(dy, b->value), true);
    if (need(b)) give(b, tensor_mul(dy, a->value), true);
    break;
  case OP_DIV:
    if (need(a)) give(a, tensor_div(dy, b->value), true);
    if (need(b)) {
      tensor *t = tensor_mul(dy, y), *u = t ? tensor_div(t, b->value) : NULL;
      tensor_free(t);
      if (u) tensor_mul_scalar_(u, -1.0f);
      give(b, u, true);
    }
    break;
  case OP_ADD_SCALAR:
    give(a, (tensor *)dy, false);
    break;
  case OP_MUL_SCALAR:
    give(a, tensor_mul_scalar(dy, op->fa), true);
    break;
  case OP_NEG:
    give(a, tensor_neg(dy), true);
    break;
  case OP_EXP:
    give(a, tensor_mul(dy, y), true);
    break;
  case OP_LOG:
    give(a, tensor_div(dy, a->value), true);
    break;
  case OP_TANH:
  case OP_RELU:
  case OP_SIGMOID:
    /* the same kernel in place: dy becomes a's gradient, no new tensor */
    if (can_take(dy, may_take, a) && tensor_same_shape(dy, y) && tensor_same_shape(dy, a->value) &&
        pointwise_grad_out(op->kind, dy, dy, y) == TENSOR_OK) {
      give(a, dy, true);
      return true;
    }
    give(a, pointwise_grad(op->kind, dy, y), true);
    break;
  case OP_SUM:
  case OP_MEAN: {
    tensor *e = spread(dy, a->value, op->ia[0], op->ia[1]);
    if (op->kind == OP_MEAN && e) {
      tensor *s = tensor_mul_scalar(e, (float)((double)y->numel / (double)a->value->numel));
      tensor_free(e);
      e = s;
    }
    give(a, e, true);
    break;
  }
  case OP_MATMUL:
    if (need(a)) {
      tensor *bt = last2_transposed(b->value);
      give(a, bt ? tensor_matmul(dy, bt) : NULL, true);
      tensor_free(bt);
    }
    if (need(b)) {
      tensor *at = last2_transposed(a->value);
      give(b, at ? tensor_matmul(at, dy) : NULL, true);
      tensor_free(at);
    }
    break;
  case OP_LINEAR:
    /* dy^T @ x and the bias's row sums go straight into the parameters'
     * gradients when they have one (accumulated in place: no result, no
     * view of dy^T) */
    if (need(a)) give(a, tensor_matmul(dy, b->value), true);
    if (need(b)) {
      if (b->grad) tensor_gemm_t_out(b->grad, dy, 1, a->value, 0, 1.0f, 1.0f);
      else give(b, tensor_matmul_t(dy, 1, a->value, 0), true);
    }
    if (need(c)) {
      if (c->grad && tensor_is_contiguous(c->grad)) tensor_sum_add_(c->grad, dy, 0);
      else give(c, tensor_sum(dy, 0, 0), true);
    }
    break;
  case OP_CONV2D:
    if (need(a)) give(a, tensor_conv2d_grad_input(dy, b->value, 4, a->value->shape, op->ia[0], op->ia[1]), true);
    if (need(b)) give(b, tensor_conv2d_grad_weight(dy, a->value, 4, b->value->shape, op->ia[0], op->ia[1]), true);
    if (need(c)) give(c, tensor_conv2d_grad_bias(dy), true);
    break;
  case OP_MAX_POOL:
    give(a, tensor_max_pool2d_grad_k(dy, op->saved, op->ia[0], op->ia[1], 4, a->value->shape), true);
    break;
  case OP_AVG_POOL:
    give(a, tensor_avg_pool2d_grad(dy, op->ia[0], op->ia[1], 4, a->value->shape), true);
    break;
  case OP_SOFTMAX:
    give(a, tensor_softmax_grad(dy, y, op->ia[0]), true);   /* y * (dy - sum(dy * y)) */
    break;
  case OP_LOG_SOFTMAX:
    give(a, tensor_log_softmax_grad(dy, y, op->ia[0]), true);   /* dy - exp(y) * sum(dy) */
    break;
  case OP_CROSS_ENTROPY: {
    tensor *g = tensor_cross_entropy_grad(a->value, op->saved);
    if (g) tensor_mul_scalar_(g, tensor_item(dy));
    give(a, g, true);
    break;
  }
  case OP_EMBEDDING:
    embedding_backward(op, dy);
    break;
  case OP_RESHAPE:
    /* dy's own header takes a's shape when it can: no view made and freed */
    if (can_take(dy, may_take, a) && tensor_view_(dy, a->value->ndim, a->value->shape) == TENSOR_OK) {
      give(a, dy, true);
      return true;
    }
    give(a, tensor_reshape(dy, a->value->ndim, a->value->shape), true);
    break;
  case OP_TRANSPOSE:
    give(a, tensor_transpose(dy, op->ia[0], op->ia[1]), true);
    break;
  case OP_EMBEDDING_LINEAR:
    embedding_linear_backward(op, dy);
    break;
  }
  return false;
}
