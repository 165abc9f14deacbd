/* ag_test.h - what the autograd tests share: a tape per test, tensors from
 * a seeded generator, and the finite-difference gradient check. */
#ifndef TAGALLOC_AG_TEST_H
#define TAGALLOC_AG_TEST_H

#include "support.h"
#include "autograd.h"

#include <math.h>

static ag_tape *tape;

static int tape_setup(void **state) {
  (void)state;
  tape = ag_tape_new(0);
  ag_tape_use(tape);
  return tape ? 0 : -1;
}

static int tape_teardown(void **state) {
  (void)state;
  ag_tape_use(NULL);
  ag_tape_free(tape);
  tape = NULL;
  return 0;
}

/* U(lo, hi) values of a seeded generator. */
static tensor *rand_tensor(int ndim, const int64_t *shape, float lo, float hi, uint64_t seed) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  assert_non_null(t);
  ag_rng r = ag_rng_new(seed);
  for (int64_t i = 0; i < t->numel; i++) tensor_f32(t)[i] = lo + (hi - lo) * ag_rng_uniform(&r);
  return t;
}

typedef ag_var *gc_fn(ag_var **in, void *arg);

/* sum(out * R) in double, R fixed weights of out's shape. */
static double weighted(const tensor *out, const tensor *w) {
  tensor *c = tensor_contiguous(out);
  double s = 0;
  for (int64_t i = 0; i < c->numel; i++) s += (double)tensor_f32(c)[i] * tensor_f32(w)[i];
  tensor_free(c);
  return s;
}

/* Checks the gradients of sum(f(inputs) * R) with respect to each input
 * (f32, contiguous) against central differences, step eps: every element
 * within atol + rtol * |numeric|.  Returns the largest error seen. */
__attribute__((unused)) static double gradcheck(gc_fn *f, void *arg, tensor **inputs, int n, double eps, double atol, double rtol) {
  ag_var *leaves[4];
  for (int i = 0; i < n; i++) leaves[i] = ag_leaf(inputs[i], 1);
  ag_var *out = f(leaves, arg);
  assert_non_null(out);
  tensor *R = rand_tensor(out->value->ndim, out->value->shape, -1.0f, 1.0f, 77);
  ag_var *loss = ag_sum(ag_mul(out, ag_input(R)), TENSOR_ALL, 0);
  assert_int_equal(ag_backward(loss), 0);
  tensor *grads[4];
  for (int i = 0; i < n; i++) {
    assert_non_null(leaves[i]->grad);
    assert_true(tensor_same_shape(leaves[i]->grad, inputs[i]));
    grads[i] = tensor_clone(leaves[i]->grad);
  }
  ag_tape_reset(tape);
  double worst = 0;
  ag_no_grad_begin();
  for (int i = 0; i < n; i++) {
    float *x = tensor_f32(inputs[i]);
    for (int64_t j = 0; j < inputs[i]->numel; j++) {
      float keep = x[j];
      double lp, lm;
      x[j] = keep + (float)eps;
      for (int k = 0; k < n; k++) leaves[k] = ag_leaf(inputs[k], 0);
      lp = weighted(f(leaves, arg)->value, R);
      ag_tape_reset(tape);
      x[j] = keep - (float)eps;
      for (int k = 0; k < n; k++) leaves[k] = ag_leaf(inputs[k], 0);
      lm = weighted(f(leaves, arg)->value, R);
      ag_tape_reset(tape);
      x[j] = keep;
      double num = (lp - lm) / ((double)(keep + (float)eps) - (double)(keep - (float)eps));
      double ana = tensor_f32(grads[i])[j];
      double err = fabs(num - ana);
      if (err > worst) worst = err;
      if (err > atol + rtol * fabs(num))
        fail_msg("input %d element %lld: analytic %.6f, numeric %.6f", i, (long long)j, ana, num);
    }
    tensor_free(grads[i]);
  }
  ag_no_grad_end();
  tensor_free(R);
  return worst;
}

#endif
