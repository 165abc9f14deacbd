/* autograd.h - reverse-mode autograd on a tape, layers and optimizers, on the
 * tensors of tensor/ and the ledger.
 *
 *   #include "autograd.h"     // link build/libtagalloc-autograd.a, the tensor library, the ledger
 *
 *   ag_tape *tape = ag_tape_new(0);
 *   ag_tape_use(tape);                          // this thread's ops record here
 *   ag_rng rng = ag_rng_new(1);
 *   ag_layer *net = ag_sequential((ag_layer *[]){ ag_linear(784, 10, &rng) }, 1);
 *   ag_optim *opt = ag_sgd_new(net, 0.01f, 0.9f, 0.0f);
 *   for (...) {
 *     ag_var *x = ag_input(batch_images);      // no copy: an alias of the tensor
 *     ag_var *loss = ag_cross_entropy(ag_layer_forward(net, x), batch_labels);
 *     ag_optim_zero_grad(opt);
 *     ag_backward(loss);
 *     ag_optim_step(opt);
 *     ag_tape_reset(tape);                      // every op, result and gradient of the step dies
 *   }
 *
 * The tape.  Every op run while a tape is in use on the thread makes a result
 * variable in the tape's ledger arena (tag "tape.op") and, when gradients are
 * on and an input requires one, records an op there too (the op and its
 * result in one arena block, the result at its start).  An op keeps its
 * inputs inline (never a pointer to the caller's array) and its block
 * declares each with ta_hold(block, "input0", in0), ...; tensors an op
 * saves for its backward (pooling argmax, labels, indices) are held as
 * "saved".  Result values,
 * saved tensors and gradients of non-parameters belong to the tape and are
 * freed by ag_tape_reset, which then resets the arena: no tape block is live
 * after it.  The arena keeps a steady graph's chunks and gives back what an
 * exceptionally long graph grew (at the reset after the next one).
 *
 * Variables.  A parameter (ag_param_new) lives outside the tape: its value and
 * its gradient (zeros at first) are owned by it; backward adds into its grad
 * (gradient accumulation) until ag_zero_grad.  A leaf (ag_input, ag_leaf)
 * wraps a tensor for one step: an alias of it (the storage is shared, never
 * copied), so the caller may free its own header at once.  A leaf made with
 * ag_leaf(t, 1) gets a gradient (kept until the reset).  Gradients of
 * intermediate results are freed as soon as backward has passed them.
 *
 * Errors: an op given a NULL variable returns NULL (the first error stays the
 * one reported), a bad argument returns NULL with a one-line message (tensor
 * errors come from tensor/, the others are "autograd: ..." on stderr through
 * the tensor library's error handler conventions: ag_error()).
 *
 * Misuse: every function checks its variable, tape, layer and optimizer
 * arguments with the ledger before it reads them.  A variable of a tape
 * reset since (the tape's arena alternates its memory between generations,
 * so a variable kept across ag_tape_reset never lands in a live one) is
 * arena.after-reset at the caller's line, with the variable's allocation
 * stack and the reset's stack; a freed parameter, layer, optimizer or tape
 * is use.after-free (free.double when freed again).  The function then
 * returns its error: NULL for ops and ag_layer_forward, -1 for ag_backward
 * and the checkpoint functions, 0 for the counts, and does nothing for
 * ag_tape_reset, ag_optim_step, ag_optim_zero_grad and the frees.
 *
 * Holds: a layer declares its parameters (ta_hold "weight", "bias"), a
 * sequential its children, an optimizer its parameters and state, so a
 * program that keeps its model to exit gets no finding, and a parameter is
 * never an orphan when a reset ends the ops' holds on it.
 *
 * Thread use: a tape belongs to one thread at a time; parameters may be read
 * by several threads' tapes but backward into them from several threads at
 * once is not synchronized.  Ops must not run inside a tensor scope
 * (tensor_scope_begin): the tape, not the scope, owns what they make. */
#ifndef TAGALLOC_AUTOGRAD_H
#define TAGALLOC_AUTOGRAD_H

#include "tensor.h"
#include "tagalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_op ag_op;
typedef struct ag_tape ag_tape;

typedef struct ag_var {
  tensor *value;          /* owned by the parameter, or by the tape */
  tensor *grad;           /* parameter: always there; leaf: after backward; result: NULL after backward */
  int requires_grad;
  int is_param;
  /* private */
  ag_op *op;              /* the op that made it, when recorded */
  struct ag_var *next;    /* the tape's list of its variables */
} ag_var;

/* ---- errors -------------------------------------------------------------- */

const char *ag_error(void);      /* this thread's latest autograd message, "" when none */
void        ag_error_clear(void);

/* ---- the tape ------------------------------------------------------------- */

/* capacity: bytes of arena the tape keeps between steps (0: 64 KiB). */
ag_tape *ag_tape_new(size_t capacity);
void     ag_tape_free(ag_tape *t);          /* resets it first */
ag_tape *ag_tape_use(ag_tape *t);           /* this thread's tape; returns the previous one */
ag_tape *ag_tape_current(void);
/* Frees every result, saved tensor and non-parameter gradient of the step,
 * then resets the arena (a new generation). */
void     ag_tape_reset(ag_tape *t);
size_t   ag_tape_ops(const ag_tape *t);     /* ops recorded since the reset */
size_t   ag_tape_vars(const ag_tape *t);    /* variables made since the reset */
size_t   ag_tape_capacity(const ag_tape *t);/* arena bytes held now */
ta_tag   ag_tape_tag(void);                 /* "tape.op" */

/* ---- gradient mode ------------------------------------------------------ */

/* No op is recorded between begin and end (nestable, per thread). */
void ag_no_grad_begin(void);
void ag_no_grad_end(void);
int  ag_grad_enabled(void);

/* ---- variables ------------------------------------------------------------ */

/* A parameter: takes ownership of value (f32, contiguous); grad = zeros. */
ag_var *ag_param_new(tensor *value);
void    ag_param_free(ag_var *p);
/* A leaf of the current tape: an alias of t (t is not taken over). */
ag_var *ag_input(const tensor *t);
ag_var *ag_leaf(const tensor *t, int requires_grad);
/* Fills the gradient of each parameter with zeros. */
void    ag_zero_grad(ag_var **params, size_t n);

/* Backpropagates from loss (one element): the gradient of every variable it
 * depends on, added to parameters' gradients.  Returns 0, or -1 with a
 * message (no tape, loss NULL, not one element, nothing requires a grad). */
int ag_backward(ag_var *loss);

/* ---- ops (each records on the current tape) ------------------------------- */

/* Elementwise with numpy broadcasting. */
ag_var *ag_add(ag_var *a, ag_var *b);
ag_var *ag_sub(ag_var *a, ag_var *b);
ag_var *ag_mul(ag_var *a, ag_var *b);
ag_var *ag_div(ag_var *a, ag_var *b);
ag_var *ag_add_scalar(ag_var *a, float s);
ag_var *ag_mul_scalar(ag_var *a, float s);
ag_var *ag_neg(ag_var *a);
ag_var *ag_exp(ag_var *a);
ag_var *ag_log(ag_var *a);
ag_var *ag_tanh(ag_var *a);
ag_var *ag_relu(ag_var *a);
ag_var *ag_sigmoid(ag_var *a);
/* Reductions: axis or TENSOR_ALL. */
ag_var *ag_sum(ag_var *a, int axis, int keepdim);
ag_var *ag_mean(ag_var *a, int axis, int keepdim);
/* [M,K]@[K,N], [B,M,K]@[K,N], [B,M,K]@[B,K,N]. */
ag_var *ag_matmul(ag_var *a, ag_var *b);
/* x [N,in] @ w[out,in]^T + b[out] (b may be NULL). */
ag_var *ag_linear_op(ag_var *x, ag_var *w, ag_var *b);
ag_var *ag_conv2d(ag_var *x, ag_var *w, ag_var *b, int stride, int pad);   /* b may be NULL */
ag_var *ag_max_pool2d(ag_var *x, int k, int stride);
ag_var *ag_avg_pool2d(ag_var *x, int k, int stride);
ag_var *ag_softmax(ag_var *x, int axis);
ag_var *ag_log_softmax(ag_var *x, int axis);
/* logits [N,C], labels i32 [N] (a tensor, not differentiated): the mean loss. */
ag_var *ag_cross_entropy(ag_var *logits, const tensor *labels);
/* weight [V,D], indices i32 (a tensor): shape indices + [D]. */
ag_var *ag_embedding(ag_var *weight, const tensor *indices);
/* Views (the gradient flows back through them). */
ag_var *ag_reshape(ag_var *a, int ndim, const int64_t *shape);
ag_var *ag_flatten(ag_var *a);              /* [N, rest]: keeps axis 0 */
ag_var *ag_transpose(ag_var *a, int axis0, int axis1);

/* ---- random numbers (for initialisation and shuffling) ------------------- */

typedef struct { uint64_t s; } ag_rng;
ag_rng   ag_rng_new(uint64_t seed);
uint64_t ag_rng_next(ag_rng *r);
float    ag_rng_uniform(ag_rng *r);         /* [0, 1) */
float    ag_rng_normal(ag_rng *r);          /* N(0, 1) */
uint64_t ag_rng_below(ag_rng *r, uint64_t n);  /* [0, n), n > 0 */

/* ---- layers --------------------------------------------------------------- */

/* Initialised as PyTorch does by default: weights Kaiming-uniform with
 * a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases the same
 * bound; embeddings N(0, 1). */
typedef struct ag_layer ag_layer;
ag_layer *ag_linear(int in, int out, ag_rng *rng);
ag_layer *ag_conv2d_layer(int cin, int cout, int k, int stride, int pad, ag_rng *rng);
ag_layer *ag_max_pool2d_layer(int k, int stride);
ag_layer *ag_avg_pool2d_layer(int k, int stride);
ag_layer *ag_relu_layer(void);
ag_layer *ag_tanh_layer(void);
ag_layer *ag_flatten_layer(void);
ag_layer *ag_embedding_layer(int vocab, int dim, ag_rng *rng);   /* forward takes an i32 input leaf */
/* Takes ownership of the n layers (a NULL among them: everything is freed,
 * NULL returned); runs them in order.  An embedding, a flatten and a linear layer
 * in a row run as one op (tensor_embedding_linear: each position's repeated
 * indices computed once) on host tensors with indices in range; AG_FUSE=off
 * in the environment runs them as three ops (the same values within float
 * rounding). */
ag_layer *ag_sequential(ag_layer **layers, int n);
ag_var   *ag_layer_forward(ag_layer *l, ag_var *x);
/* Parameters in order (weight, bias of each layer): the count; fills up to max. */
size_t    ag_layer_params(ag_layer *l, ag_var **out, size_t max);
const char *ag_layer_name(const ag_layer *l);
/* Moves every parameter of l (value and gradient) to device, a gpu/ pool
 * (NULL: host memory), as PyTorch's module.to(device): each tensor is
 * copied there and the old one freed; the parameters (ag_var) stay the same
 * variables, so layers and optimizers keep them.  Make the optimizer after
 * (its state is made where the parameters are).  Returns 0, or -1 with a
 * message (ag_error) and nothing moved. */
int       ag_layer_to(ag_layer *l, gpu_pool *device);
void      ag_layer_free(ag_layer *l);

/* ---- optimizers -------------------------------------------------------------- */

typedef struct ag_optim ag_optim;
/* PyTorch's torch.optim.SGD: g = grad + wd*p; buf = momentum*buf + g (buf = g
 * at the first step); p -= lr*buf. */
ag_optim *ag_sgd_new(ag_layer *model, float lr, float momentum, float weight_decay);
/* torch.optim.Adam: m, v with bias correction, eps added after the sqrt. */
ag_optim *ag_adam_new(ag_layer *model, float lr, float beta1, float beta2, float eps, float weight_decay);
void      ag_optim_step(ag_optim *o);
void      ag_optim_zero_grad(ag_optim *o);
void      ag_optim_set_lr(ag_optim *o, float lr);
uint64_t  ag_optim_steps(const ag_optim *o);
void      ag_optim_free(ag_optim *o);

/* ---- checkpoints ------------------------------------------------------------- */

/* Where training stands: saved with the model and the optimizer. */
typedef struct {
  uint64_t epoch, step;
  ag_rng rng;
} ag_ckpt_state;

/* One file: a versioned header with a CRC-32 of the payload; the model's
 * parameters, the optimizer's state (opt may be NULL), st, and extra bytes
 * of the caller's (the data order).  Written to PATH.tmp, fsynced, renamed
 * over PATH: a crash during a save leaves the previous file whole.  Device
 * tensors (ag_layer_to) are copied to host memory first: the file is the
 * same as a host model's.  Returns 0, or -1 with a message (ag_error). */
int ag_checkpoint_save(const char *path, ag_layer *model, const ag_optim *opt, const ag_ckpt_state *st,
                       const void *extra, size_t extra_len);
/* Loads into a model of the same architecture and an optimizer of the same
 * kind.  A damaged, truncated or foreign file, or one whose shapes do not
 * fit, is refused with a one-line message and nothing is changed.  A
 * device model's values are copied into its device tensors in place (only a
 * device's failing copy, after the file checked out, leaves it partly
 * loaded, and says so).  *extra
 * (when extra is not NULL) receives a malloc'd copy of the extra bytes. */
int ag_checkpoint_load(const char *path, ag_layer *model, ag_optim *opt, ag_ckpt_state *st, void **extra,
                       size_t *extra_len);

#ifdef __cplusplus
}
#endif
#endif
