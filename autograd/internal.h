/* internal.h - what the files of autograd/ share; not part of the API. */
#ifndef TAGALLOC_AUTOGRAD_INTERNAL_H
#define TAGALLOC_AUTOGRAD_INTERNAL_H

#include "autograd.h"
#include "tagalloc.h"

#include <stdbool.h>
#include <stddef.h>

#define AG_MAX_IN 4

typedef enum {
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_ADD_SCALAR, OP_MUL_SCALAR, OP_NEG,
  OP_EXP, OP_LOG, OP_TANH, OP_RELU, OP_SIGMOID,
  OP_SUM, OP_MEAN, OP_MATMUL, OP_LINEAR, OP_CONV2D, OP_MAX_POOL, OP_AVG_POOL,
  OP_SOFTMAX, OP_LOG_SOFTMAX, OP_CROSS_ENTROPY, OP_EMBEDDING,
  OP_RESHAPE, OP_TRANSPOSE, OP_EMBEDDING_LINEAR
} op_kind;

/* One recorded op: a block of the tape's arena.  Inputs are kept inline. */
struct ag_op {
  op_kind kind;
  int nin;
  ag_var *in[AG_MAX_IN];      /* held: "input0" .. "input3" */
  ag_var *out;
  tensor *saved;              /* held: "saved"; owned by the tape */
  int ia[4];                  /* integer arguments (axis, keepdim, stride, pad, k) */
  float fa;                   /* a float argument (the scalar) */
  struct ag_op *prev;         /* the op recorded before (the tape runs backwards) */
};

/* A recorded op and its result: one block of the tape's arena, the result
 * variable at its start.  So every variable is a block's start (the target
 * of other ops' input holds: found at once by the ledger, where an interior
 * pointer takes a slow search), and the op's holds are declared by the
 * block (_ag_op_holder), which the tape's reset ends as a whole. */
typedef struct {
  ag_var var;
  ag_op op;
} ag_op_block;

static inline void *_ag_op_holder(ag_op *op) {
  return (char *)op - offsetof(ag_op_block, op);
}

/* An optimizer (optim.c; checkpoint.c saves and loads its state). */
typedef enum { O_SGD, O_ADAM } optim_kind;

struct ag_optim {
  optim_kind kind;
  float lr, momentum, weight_decay, beta1, beta2, eps;
  uint64_t steps;
  size_t n;
  ag_var **params;
  tensor **m, **v;       /* SGD: m is the momentum buffer; Adam: first and second moments */
};

/* tape.c */
void *_ag_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* returns NULL */

/* ---- argument checks ----
 * Every public entry checks its variable (and tape, layer, optimizer)
 * arguments with the ledger before it reads them (ta_check_block): a
 * variable is a live "tape.op" block of the tape's current generation, or a
 * live "autograd.param" block.  A variable kept across ag_tape_reset is
 * arena.after-reset at its first use (the tape's arena alternates its
 * memory between generations, so the address is not yet anyone else's); a
 * freed parameter is use.after-free.  Inlined, so that the finding's stack
 * starts at the public function's caller. */
extern ta_tag _ag_tag_op, _ag_tag_param, _ag_tag_tape, _ag_tag_layer, _ag_tag_optim;
void _ag_tags_init(void);
static inline __attribute__((always_inline)) bool _ag_live(const char *op, const void *p, ta_tag tag, ta_tag alt,
                                                           unsigned flags) {
#ifdef TAGALLOC_NO_ARG_CHECKS   /* the benchmark's baseline only (bench/autograd/checks.py) */
  (void)p, (void)tag, (void)alt, (void)flags;
  return true;
#endif
  if (__builtin_expect(ta_check_block(p, tag, alt, TA_CHECK_CALLER | flags, op), 1)) return true;
  _ag_err("%s: an argument that is not live (freed, or made on a tape reset since): see the ledger's finding", op);
  return false;
}
static inline __attribute__((always_inline)) bool _ag_var_ok(const char *op, const ag_var *v) {
  return _ag_live(op, v, _ag_tag_op, _ag_tag_param, 0);
}

/* ---- tape.c ---- */
/* The tape in use, or NULL with an error naming op. */
ag_tape *_ag_tape_for(const char *op);
/* A result variable of value on the current tape (value becomes the tape's),
 * and the op when one is recorded (*opp, NULL otherwise).  value NULL: NULL. */
ag_var *_ag_result(const char *op, tensor *value, op_kind kind, ag_var **in, int nin, ag_op **opp);
/* The op keeps t (the tape frees it at reset). */
void _ag_save(ag_op *op, tensor *t);
/* Adds g into v's gradient.  owned: g is the caller's to give (it becomes
 * the gradient or is freed); else it is only read. */
void _ag_accumulate(ag_var *v, tensor *g, bool owned);

/* ---- optim.c ---- */
/* array[i] = p declared: array's hold "<what><i>" (the optimizer's
 * parameters and state; checkpoint.c re-declares the state it loads). */
void _ag_optim_hold(ag_optim *o, const char *what, void *array, size_t i, const void *p);

/* ---- ops.c ---- */
/* ag_embedding with the indices as a variable of the tape (the embedding
 * layer's input): held as the op's input, instead of an alias saved. */
ag_var *_ag_embedding_var(ag_var *weight, ag_var *indices);
/* An embedding layer's lookup of indices [B,C] (a variable of i32
 * indices), flattened, into a linear layer (weight [O,C*D], bias or NULL):
 * the three layers' result as one op (tensor_embedding_linear) in *out
 * (NULL: it failed, its error set).  false, nothing done, where it does
 * not apply (a device tensor, shapes or indices the three would refuse,
 * AG_FUSE=off): the caller runs the three. */
bool _ag_embedding_linear(ag_var *table, ag_var *indices, ag_var *weight, ag_var *bias, ag_var **out);
/* AG_FUSE=off in the environment: the layers run as separate ops (benchmarks
 * and tests compare both). */
bool _ag_fusion_off(void);
/* The backward of one op: from dy = dL/dout, accumulates into the inputs.
 * may_take: dy is the caller's to free after, and the op may instead take
 * it over (computing in place into it, or giving it on as an input's
 * gradient); returns whether it did (the caller then leaves dy alone). */
bool _ag_op_backward(ag_op *op, tensor *dy, bool may_take);

#endif
