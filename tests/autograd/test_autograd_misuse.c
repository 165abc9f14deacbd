/* test_autograd_misuse.c - misuse of autograd through its public API is a
 * finding at the caller's line and an error return, never a crash or a
 * silent wrong answer.
 *
 * - ag_backward after ag_tape_reset (the loss lives in the reset arena):
 *   arena.after-reset at the backward's caller, with the loss's allocation
 *   stack and the reset's stack; it crashed in ag_backward before.
 * - parameters made on the tape (ag_leaf while the tape is in use) and used
 *   after its reset: the arena handed their addresses to the next step's
 *   variables, and training diverged with a clean report.  The tape's arena
 *   alternates its memory, so the first use after the reset is
 *   arena.after-reset; without the alternation the stale pointer is a live
 *   variable of the new step and this test fails.
 * - a freed parameter, a freed optimizer: use.after-free / free.double. */
#include "ag_test.h"

static report_ctx *ctx;

/* Is fn among the first `top` frames of stack? */
static int stack_has(uint32_t stack, const char *fn, size_t top) { return stack_has_function(ctx, stack, fn, top); }

static int setup(void **state) {
  messages_setup(state);
  ag_error_clear();
  return tape_setup(state);
}

static int teardown(void **state) {
  tape_teardown(state);
  return messages_teardown(state);
}

/* ---- ag_tape_reset before ag_backward ------------------------------------------- */

NOIPA static ag_var *make_loss(ag_var *w) {
  ag_var *l = ag_sum(ag_mul(w, w), TENSOR_ALL, 0);
  KEEP();
  return l;
}

NOIPA static void reset_tape(void) {
  ag_tape_reset(tape);
  KEEP();
}

NOIPA static int backward_late(ag_var *loss) {
  int r = ag_backward(loss);
  KEEP();
  return r;
}

static void test_backward_after_reset(void **state) {
  (void)state;
  tensor *x = tensor_full(TS(3), 2.0f);
  ag_var *w = ag_param_new(tensor_clone(x));
  ag_var *loss = make_loss(w);
  assert_non_null(loss);
  reset_tape();
  assert_int_equal(backward_late(loss), -1);
  assert_int_equal(ta_findings_count("arena.after-reset"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("arena.after-reset");
  assert_string_equal(stack_frame0(ctx, f.stack), "backward_late");
  assert_true(stack_has(f.alloc_stack, "make_loss", 6));    /* where the loss was made */
  assert_true(stack_has(f.free_stack, "reset_tape", 2));    /* where the tape was reset */
  assert_int_equal(f.tag, ag_tape_tag());
  assert_non_null(strstr(ag_error(), "ag_backward"));
  /* the program goes on: the parameter's gradient is untouched, a new step works */
  assert_float_equal(tensor_item(tensor_sum(w->grad, TENSOR_ALL, 0)), 0.0f, 0);
  assert_int_equal(ag_backward(make_loss(w)), 0);
  assert_float_equal(tensor_get(w->grad, (int64_t[]){ 0 }), 4.0f, 1e-6);
  ag_tape_reset(tape);
  ag_param_free(w);
  tensor_free(x);
  assert_int_equal(ta_findings_count(NULL), 1);
}

/* ---- parameters made on the tape, used after its reset -------------------------- */

typedef struct { ag_var *w, *b; } model;

NOIPA static model make_params_on_tape(void) {
  model m;
  m.w = ag_leaf(rand_tensor(TS(4, 3), -1, 1, 5), 1);   /* the bug: tape variables, not parameters */
  m.b = ag_leaf(rand_tensor(TS(3), -1, 1, 6), 1);
  KEEP();
  return m;
}

NOIPA static ag_var *forward(const model *m, ag_var *x) {
  ag_var *y = ag_add(ag_matmul(x, m->w), m->b);
  KEEP();
  return y;
}

static void test_params_in_arena(void **state) {
  (void)state;
  /* the leaves' own tensors: ag_leaf aliases them, the caller frees its headers */
  model m = make_params_on_tape();
  tensor *xt = rand_tensor(TS(2, 4), -1, 1, 7);
  for (int step = 0; step < 3; step++) {
    ag_var *x = ag_input(xt);
    ag_var *y = forward(&m, x);
    if (step == 0) {
      assert_non_null(y);
      assert_int_equal(ag_backward(ag_sum(y, TENSOR_ALL, 0)), 0);
      assert_int_equal(ta_findings_count(NULL), 0);
    } else {
      assert_null(y);                                    /* refused, not computed on a stranger */
    }
    ag_tape_reset(tape);
  }
  /* one finding per step after the first (the first use, then the error
   * stops the chain) */
  assert_int_equal(ta_findings_count("arena.after-reset"), 2);
  assert_int_equal(ta_findings_count(NULL), 2);
  ta_finding f = the_finding("arena.after-reset");
  assert_true(stack_has(f.stack, "forward", 2));
  assert_true(stack_has(f.alloc_stack, "make_params_on_tape", 6));
  assert_int_not_equal(f.free_stack, 0);
  tensor_free(xt);
}

/* Without the mistake the same loop trains and reports nothing. */
static void test_params_outside_the_tape(void **state) {
  (void)state;
  model m = { ag_param_new(rand_tensor(TS(4, 3), -1, 1, 5)), ag_param_new(rand_tensor(TS(3), -1, 1, 6)) };
  tensor *xt = rand_tensor(TS(2, 4), -1, 1, 7);
  for (int step = 0; step < 3; step++) {
    ag_var *y = forward(&m, ag_input(xt));
    assert_non_null(y);
    assert_int_equal(ag_backward(ag_sum(y, TENSOR_ALL, 0)), 0);
    ag_tape_reset(tape);
  }
  assert_int_equal(ta_findings_count(NULL), 0);
  ag_param_free(m.w);
  ag_param_free(m.b);
  tensor_free(xt);
}

/* ---- freed parameters and optimizers -------------------------------------------- */

NOIPA static ag_var *use_param(ag_var *p) {
  ag_var *r = ag_relu(p);
  KEEP();
  return r;
}

NOIPA static void step_freed(ag_optim *o) {
  ag_optim_step(o);
  KEEP();
}

static void test_freed_param_and_optimizer(void **state) {
  (void)state;
  ag_rng rng = ag_rng_new(3);
  ag_layer *net = ag_linear(3, 2, &rng);
  ag_optim *opt = ag_sgd_new(net, 0.1f, 0.0f, 0.0f);
  ag_var *p = ag_param_new(tensor_full(TS(2), 1.0f));
  ag_param_free(p);
  assert_null(use_param(p));
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  assert_string_equal(stack_frame0(ctx, the_finding("use.after-free").stack), "use_param");
  ag_param_free(p);
  assert_int_equal(ta_findings_count("free.double"), 1);
  ag_optim_free(opt);
  step_freed(opt);
  assert_int_equal(ta_findings_count("use.after-free"), 2);
  ag_layer_free(net);
  assert_int_equal(ta_findings_count(NULL), 3);
}

int main(void) {
  ctx = report_ctx_new();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_backward_after_reset, setup, teardown),
    cmocka_unit_test_setup_teardown(test_params_in_arena, setup, teardown),
    cmocka_unit_test_setup_teardown(test_params_outside_the_tape, setup, teardown),
    cmocka_unit_test_setup_teardown(test_freed_param_and_optimizer, setup, teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  report_ctx_free(ctx);
  ta_findings_clear();
  return r;
}
