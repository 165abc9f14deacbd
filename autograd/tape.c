/* tape.c - the tape (a ledger arena of ops and variables), parameters,
 * leaves, gradient mode and the backward pass. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct ag_tape {
  ta_arena *arena;
  size_t capacity;
  tensor *seed;         /* held: "seed"; dL/dL = 1, kept for every backward */
  ag_op *last;          /* the newest op */
  ag_var *vars;         /* the newest variable */
  size_t nops, nvars;
  ag_op **index;        /* tape-no-shrink only: every op recorded, never rewound */
  size_t nindex, cap_index;
};

static __thread ag_tape *current;
static __thread int no_grad_depth;
static __thread char err_msg[256];

ta_tag _ag_tag_op, _ag_tag_param, _ag_tag_tape, _ag_tag_layer, _ag_tag_optim;
#define tag_op _ag_tag_op
#define tag_param _ag_tag_param
#define tag_tape _ag_tag_tape

void _ag_tags_init(void) {
  if (_ag_tag_optim == TA_ANY) {
    _ag_tag_tape = ta_tag_get("autograd.tape");
    _ag_tag_param = ta_tag_get("autograd.param");
    _ag_tag_op = ta_tag_get("tape.op");
    _ag_tag_layer = ta_tag_get("autograd.layer");
    _ag_tag_optim = ta_tag_get("autograd.optim");
  }
}
#define tags_init _ag_tags_init

ta_tag ag_tape_tag(void) {
  tags_init();
  return tag_op;
}

/* ---- errors ---------------------------------------------------------------- */

void *_ag_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "autograd: %s\n", err_msg);
  return NULL;
}

const char *ag_error(void) { return err_msg; }
void ag_error_clear(void) { err_msg[0] = '\0'; }

/* ---- the tape ---------------------------------------------------------------- */

/* The seeded bug tape-no-shrink: besides the list of ops (op->prev), the
 * tape keeps an index of them in a ledger block grown by doubling, as the
 * seed's tape did, and its reset neither rewinds nor shrinks it: the index
 * holds every op of every step, and its capacity doubles again and again
 * over a long run.  A trace with a mark per step shows it as leak.growth
 * at this function's ta_realloc. */
static void tape_index_push(ag_tape *t, ag_op *op) {
  if (t->nindex == t->cap_index) {
    size_t cap = t->cap_index ? t->cap_index * 2 : 64;
    ag_op **ix = ta_realloc_tag(tag_tape, t->index, cap * sizeof *ix);
    if (ix == NULL) return;   /* an index without the op: the list still has it */
    t->index = ix;
    t->cap_index = cap;
  }
  t->index[t->nindex++] = op;
}

/* The backward pass starts from dL/dL = 1: one scalar kept by the tape
 * (off any pool: the tape's own) instead of one made and freed per
 * backward. */
/* A tensor of v's shape on v's device, every element x (device tensors:
 * the gradients of a device loss and parameters live where they do). */
static tensor *filled_like(const tensor *v, float x) {
  tensor *t = tensor_clone(v);
  if (t && tensor_fill_(t, x) != TENSOR_OK) {
    tensor_free(t);
    return NULL;
  }
  return t;
}
static tensor *ones_like(const tensor *v) { return filled_like(v, 1.0f); }

static int seed_make(ag_tape *t) {
  tensor_pool *keep = tensor_pool_use(NULL);
  t->seed = tensor_scalar(1.0f);
  tensor_pool_use(keep);
  if (t->seed == NULL) return -1;
  ta_hold(t, "seed", t->seed);
  return 0;
}

static void seed_drop(ag_tape *t) {
  if (t->seed == NULL) return;
  ta_unhold(t, "seed");
  tensor_free(t->seed);
  t->seed = NULL;
}

ag_tape *ag_tape_new(size_t capacity) {
  tags_init();
  if (capacity == 0) capacity = 64 * 1024;
  ag_tape *t = ta_calloc(tag_tape, 1, sizeof *t);
  if (t == NULL) return _ag_err("ag_tape_new: out of memory");
  t->capacity = capacity;
  /* alternating: a variable kept across a reset is caught at its next use */
  t->arena = ta_arena_new_flags(tag_op, capacity, TA_ARENA_ALTERNATE);
  if (t->arena == NULL) {
    ta_free(t);
    return _ag_err("ag_tape_new: no arena of %zu bytes", capacity);
  }
  /* (inside a tensor scope the scope would own it: made at the first
   * backward instead, where no scope can be open) */
  if (tensor_scope_depth() == 0 && seed_make(t) != 0) {
    ta_arena_free(t->arena);
    ta_free(t);
    return _ag_err("ag_tape_new: out of memory");
  }
  return t;
}

void ag_tape_reset(ag_tape *t) {
  if (t == NULL || !_ag_live("ag_tape_reset", t, tag_tape, tag_tape, 0)) return;
  /* Every variable's value and gradient, then the arena (ops and
   * variables) in one reset, which ends the ops' holds; then what the ops
   * saved, no longer held (up to SAVED_AFTER of them taken out first: the
   * arena's memory goes with the reset), so no "saved" hold is dropped one
   * by one.  Beyond those, a saved tensor is let go and freed before. */
  enum { SAVED_AFTER = 32 };
  tensor *saved[SAVED_AFTER];
  int nsaved = 0;
  for (ag_op *op = t->last; op; op = op->prev)
    if (op->saved) {
      if (nsaved < SAVED_AFTER) {
        saved[nsaved++] = op->saved;
      } else {
        ta_unhold(_ag_op_holder(op), "saved");
        tensor_free(op->saved);
      }
      op->saved = NULL;
    }
  for (ag_var *v = t->vars; v; v = v->next) {
    tensor_free(v->value);
    tensor_free(v->grad);
  }
  t->last = NULL;
  t->vars = NULL;
  t->nops = t->nvars = 0;
  ta_arena_reset(t->arena);
  for (int i = 0; i < nsaved; i++) tensor_free(saved[i]);
}

void ag_tape_free(ag_tape *t) {
  if (t == NULL || !_ag_live("ag_tape_free", t, tag_tape, tag_tape, TA_CHECK_FREE)) return;
  ag_tape_reset(t);
  if (current == t) current = NULL;
  ta_arena_free(t->arena);
  seed_drop(t);
  ta_free(t->index);
  ta_free(t);
}

ag_tape *ag_tape_use(ag_tape *t) {
  ag_tape *old = current;
  current = t;
  return old;
}

ag_tape *ag_tape_current(void) { return current; }
size_t ag_tape_ops(const ag_tape *t) { return t && _ag_live("ag_tape_ops", t, tag_tape, tag_tape, 0) ? t->nops : 0; }
size_t ag_tape_vars(const ag_tape *t) { return t && _ag_live("ag_tape_vars", t, tag_tape, tag_tape, 0) ? t->nvars : 0; }
size_t ag_tape_capacity(const ag_tape *t) {
  return t && _ag_live("ag_tape_capacity", t, tag_tape, tag_tape, 0) ? ta_arena_capacity(t->arena) : 0;
}

ag_tape *_ag_tape_for(const char *op) {
  if (current == NULL) return _ag_err("%s: no tape in use on this thread (ag_tape_use)", op);
  if (tensor_scope_depth() > 0)
    return _ag_err("%s: called inside a tensor scope; the tape owns what autograd ops make", op);
  return current;
}

/* ---- gradient mode ------------------------------------------------------------- */

void ag_no_grad_begin(void) { no_grad_depth++; }
void ag_no_grad_end(void) {
  if (no_grad_depth > 0) no_grad_depth--;
  else _ag_err("ag_no_grad_end: no ag_no_grad_begin to end");
}
int ag_grad_enabled(void) { return no_grad_depth == 0; }

/* ---- variables ------------------------------------------------------------------- */

/* A variable in v (arena memory of the tape), or in a block of its own
 * when v is NULL. */
static ag_var *var_new(ag_tape *t, tensor *value, ag_var *v) {
  if (v == NULL) v = ta_arena_alloc(t->arena, sizeof *v);
  if (v == NULL) {
    tensor_free(value);
    return _ag_err("tape: out of arena memory");
  }
  memset(v, 0, sizeof *v);
  v->value = value;
  v->next = t->vars;
  t->vars = v;
  t->nvars++;
  return v;
}

ag_var *_ag_result(const char *name, tensor *value, op_kind kind, ag_var **in, int nin, ag_op **opp) {
  if (opp) *opp = NULL;
  if (value == NULL) return NULL;
  ag_tape *t = _ag_tape_for(name);
  if (t == NULL) {
    tensor_free(value);
    return NULL;
  }
  bool needs = false;
  for (int i = 0; i < nin; i++)
    if (in[i] && in[i]->requires_grad) needs = true;
  if (!needs || no_grad_depth > 0) return var_new(t, value, NULL);
  /* A recorded op and its result are one arena block (ag_op_block): one
   * ledger event, not two.  The variable lives and dies with its op.  The
   * block and the op's holds on its inputs are recorded at one stack. */
  uint32_t here = ta_stack_here();
  ag_op_block *ob = ta_arena_alloc_at(t->arena, sizeof *ob, here);
  if (ob == NULL) {
    tensor_free(value);
    return _ag_err("%s: out of arena memory for the op", name);
  }
  ag_var *v = var_new(t, value, &ob->var);
  ag_op *op = &ob->op;
  memset(op, 0, sizeof *op);
  op->kind = kind;
  op->nin = nin;
  static const char *slots[AG_MAX_IN] = { "input0", "input1", "input2", "input3" };
  for (int i = 0; i < nin; i++) {
    op->in[i] = in[i];
    if (in[i]) ta_hold_at(ob, slots[i], in[i], here);
  }
  /* the seeded bug tape-stack-inputs: the op keeps the caller's array of
   * inputs (record()'s, on its stack) as the seed's op->inputs = inputs did */
  if (tensor_fault_get() == TENSOR_FAULT_TAPE_STACK_INPUTS) ta_hold(ob, "inputs", in);
  op->out = v;
  op->prev = t->last;
  t->last = op;
  t->nops++;
  if (tensor_fault_get() == TENSOR_FAULT_TAPE_NO_SHRINK) tape_index_push(t, op);
  v->op = op;
  v->requires_grad = 1;
  if (opp) *opp = op;
  return v;
}

void _ag_save(ag_op *op, tensor *t) {
  op->saved = t;
  ta_hold(_ag_op_holder(op), "saved", t);
}

ag_var *ag_leaf(const tensor *x, int requires_grad) {
  if (x == NULL) return NULL;
  ag_tape *t = _ag_tape_for("ag_leaf");
  if (t == NULL) return NULL;
  tensor *a = tensor_alias(x);          /* checks x with the ledger */
  if (a == NULL) return NULL;
  if (requires_grad && a->dtype != TENSOR_F32) {
    tensor_free(a);
    return _ag_err("ag_leaf: a gradient needs an f32 tensor");
  }
  ag_var *v = var_new(t, a, NULL);
  if (v) v->requires_grad = requires_grad != 0;
  return v;
}

ag_var *ag_input(const tensor *x) { return ag_leaf(x, 0); }

ag_var *ag_param_new(tensor *value) {
  tags_init();
  if (value == NULL) return NULL;
  if (tensor_storage_block(value) == NULL) return NULL;   /* not a live tensor: the ledger said so */
  if (value->dtype != TENSOR_F32 || !tensor_is_contiguous(value)) {
    tensor_free(value);
    return _ag_err("ag_param_new: a parameter is a contiguous f32 tensor");
  }
  ag_var *p;
  if (tensor_fault_get() == TENSOR_FAULT_PARAMS_IN_ARENA && current && tensor_scope_depth() == 0) {
    /* the seeded bug params-in-arena: made while a tape is in use, the
     * parameter lives in its arena and dies at its next reset */
    p = ta_arena_alloc(current->arena, sizeof *p);
    if (p) memset(p, 0, sizeof *p);
  } else {
    p = ta_calloc(tag_param, 1, sizeof *p);
  }
  tensor *g = !p ? NULL : tensor_device(value) ? filled_like(value, 0.0f) : tensor_zeros(TENSOR_F32, value->ndim, value->shape);
  if (g == NULL) {
    ta_free(p);
    tensor_free(value);
    return _ag_err("ag_param_new: out of memory");
  }
  p->value = value;
  p->grad = g;
  p->requires_grad = 1;
  p->is_param = 1;
  ta_hold(p, "value", value);
  ta_hold(p, "grad", g);
  return p;
}

void ag_param_free(ag_var *p) {
  if (p == NULL || !_ag_live("ag_param_free", p, tag_param, tag_param, TA_CHECK_FREE)) return;
  ta_unhold(p, "value");
  ta_unhold(p, "grad");
  tensor_free(p->value);
  tensor_free(p->grad);
  ta_free(p);
}

void ag_zero_grad(ag_var **params, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (params[i] && _ag_var_ok("ag_zero_grad", params[i]) && params[i]->grad) tensor_fill_(params[i]->grad, 0.0f);
}

/* ---- backward --------------------------------------------------------------------- */

void _ag_accumulate(ag_var *v, tensor *g, bool owned) {
  if (v == NULL || g == NULL || !v->requires_grad) {
    if (owned) tensor_free(g);
    return;
  }
  if (v->grad) {
    tensor_add_(v->grad, g);
    if (owned) tensor_free(g);
  } else if (owned && tensor_is_contiguous(g)) {
    v->grad = g;
  } else {
    v->grad = tensor_clone(g);
    if (owned) tensor_free(g);
  }
}

int ag_backward(ag_var *loss) {
  ag_tape *t = _ag_tape_for("ag_backward");
  if (t == NULL) return -1;
  if (loss == NULL) {
    _ag_err("ag_backward: loss is NULL (an earlier op failed)");
    return -1;
  }
  if (!_ag_var_ok("ag_backward", loss)) return -1;
  if (loss->value->numel != 1) {
    char b[96];
    _ag_err("ag_backward: loss %s is not one element", tensor_shape_str(loss->value, b, sizeof b));
    return -1;
  }
  if (!loss->requires_grad) {
    _ag_err("ag_backward: the loss does not require a gradient (no parameter or leaf with one behind it)");
    return -1;
  }
  /* dL/dL: the tape's seed, viewed in the loss's shape (every axis 1), when
   * the loss has an op and no gradient yet; else a new tensor of ones added
   * to the loss's gradient, as any gradient is. */
  const tensor *seed = NULL;
  bool on_device = tensor_device(loss->value) != NULL;   /* the tape's seed is host memory */
  if (loss->op && loss->grad == NULL && !on_device && (t->seed || seed_make(t) == 0) &&
      tensor_view_(t->seed, loss->value->ndim, loss->value->shape) == TENSOR_OK)
    seed = t->seed;
  if (seed == NULL) {
    tensor *one = on_device ? ones_like(loss->value) : tensor_full(loss->value->ndim, loss->value->shape, 1.0f);
    if (one == NULL) return -1;
    _ag_accumulate(loss, one, true);
  }
  if (loss->op == NULL) return 0;
  for (ag_op *op = loss->op; op; op = op->prev) {
    ag_var *out = op->out;
    if (out->grad == NULL) {
      if (out == loss && seed) {
        _ag_op_backward(op, (tensor *)seed, false);
        /* an input's gradient that is a view of the seed (a reshape of a
         * one-element tensor) keeps its storage: the tape lets it go and
         * makes a new seed at the next backward */
        if (tensor_storage_refs(t->seed) > 1) seed_drop(t);
        seed = NULL;
      }
      continue;
    }
    /* an intermediate's gradient is spent once its op has run: the op may
     * take it over as its input's gradient, else it is freed */
    if (!_ag_op_backward(op, out->grad, true)) {
      tensor_free(out->grad);
      /* the seeded bug pool-double-release: the spent gradient given back
       * to the pool in use a second time */
      if (tensor_fault_get() == TENSOR_FAULT_POOL_DOUBLE_RELEASE) {
        tensor_pool *pool = tensor_pool_use(NULL);
        tensor_pool_use(pool);
        if (pool) tensor_pool_release(pool, out->grad);
      }
    }
    out->grad = NULL;
  }
  return 0;
}
