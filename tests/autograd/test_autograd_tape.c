/* test_autograd_tape.c - the tape on the ledger: exact block counts, nothing
 * live after a reset, capacity back after a long graph, no_grad, gradient
 * accumulation, zero_grad, and errors. */
#include "ag_test.h"

#include <string.h>

/* loss = sum(relu(x @ w^T + b)) over a [4,3] batch and a 3->2 layer. */
static ag_var *small_step(ag_var *w, ag_var *b, const tensor *x) {
  return ag_sum(ag_relu(ag_linear_op(ag_input(x), w, b)), TENSOR_ALL, 0);
}

static void test_counts_and_reset(void **state) {
  (void)state;
  ag_var *w = ag_param_new(tensor_from_f32((const float[]){ 1, 0, -1, 0.5f, 0.5f, 0.5f }, TS(2, 3)));
  ag_var *b = ag_param_new(tensor_from_f32((const float[]){ 0.1f, -0.2f }, TS(2)));
  tensor *x = tensor_from_f32((const float[]){ 1, 2, 3, -1, -2, -3, 0, 1, 0, 2, 0, 1 }, TS(4, 3));
  ta_tag T = ag_tape_tag();
  ta_mark m = ta_mark_now();
  ag_var *loss = small_step(w, b, x);
  /* 3 ops (linear, relu, sum) and 4 variables (input and 3 results): 4
   * blocks, each op in one with its result */
  assert_int_equal(ag_tape_ops(tape), 3);
  assert_int_equal(ag_tape_vars(tape), 4);
  TA_ASSERT_ALLOCS_SINCE(m, T, 4);
  assert_int_equal(ag_backward(loss), 0);
  /* rows of x @ w^T + b: [-1.9, 2.8], [2.1, -3.2], [0.1, 0.3], [1.1, 1.3]: relu
   * passes output 0 for rows 2, 3, 4 of x and output 1 for rows 1, 3, 4 */
  const float want_w0[] = { -1 + 0 + 2, -2 + 1 + 0, -3 + 0 + 1 };
  for (int i = 0; i < 3; i++) assert_float_equal(tensor_f32(w->grad)[i], want_w0[i], 0);
  const float want_w1[] = { 1 + 0 + 2, 2 + 1 + 0, 3 + 0 + 1 };
  for (int i = 0; i < 3; i++) assert_float_equal(tensor_f32(w->grad)[3 + i], want_w1[i], 0);
  assert_float_equal(tensor_f32(b->grad)[0], 3, 0);
  assert_float_equal(tensor_f32(b->grad)[1], 3, 0);
  ag_tape_reset(tape);
  TA_ASSERT_LIVE_SINCE(m, T, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);   /* results, gradients, headers: all gone */
  assert_int_equal(ag_tape_ops(tape), 0);
  TA_ASSERT_FINDINGS(NULL, 0);
  tensor_free(x);
  ag_param_free(w);
  ag_param_free(b);
}

static void test_flat_over_iterations(void **state) {
  (void)state;
  ag_rng r = ag_rng_new(3);
  ag_layer *net = ag_sequential((ag_layer *[]){ ag_linear(8, 16, &r), ag_tanh_layer(), ag_linear(16, 4, &r) }, 3);
  ag_optim *opt = ag_sgd_new(net, 0.1f, 0.9f, 1e-4f);
  tensor *x = rand_tensor(TS(32, 8), -1, 1, 5);
  tensor *y = tensor_zeros(TENSOR_I32, TS(32));
  for (int i = 0; i < 32; i++) tensor_i32(y)[i] = i % 4;
  size_t cap = 0;
  float first = 0, last = 0;
  for (int it = 0; it < 300; it++) {
    ta_mark m = ta_mark_now();
    ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(x)), y);
    if (it == 0) first = tensor_item(loss->value);
    last = tensor_item(loss->value);
    ag_optim_zero_grad(opt);
    assert_int_equal(ag_backward(loss), 0);
    ag_optim_step(opt);
    ag_tape_reset(tape);
    TA_ASSERT_NO_LEAKS_SINCE(m);
    if (it == 1) cap = ag_tape_capacity(tape);
    if (it > 1) assert_int_equal(ag_tape_capacity(tape), cap);
  }
  assert_true(last < 0.5f * first);   /* it learns */
  TA_ASSERT_FINDINGS(NULL, 0);
  tensor_free(x);
  tensor_free(y);
  ag_optim_free(opt);
  ag_layer_free(net);
}

static void test_capacity_shrinks(void **state) {
  (void)state;
  ag_tape *small = ag_tape_new(4096);
  ag_tape_use(small);
  tensor *x = tensor_full(TS(4), 1.0f);
  ag_var *v = ag_leaf(x, 1);
  ag_backward(ag_sum(ag_mul_scalar(v, 2), TENSOR_ALL, 0));
  ag_tape_reset(small);
  size_t base = ag_tape_capacity(small);
  assert_int_equal(base, 2 * 4096);   /* two sets of chunks: generations alternate */
  /* a long graph: 3000 ops */
  v = ag_leaf(x, 1);
  for (int i = 0; i < 3000; i++) v = ag_add_scalar(v, 1e-3f);
  assert_int_equal(ag_tape_ops(small), 3000);
  assert_int_equal(ag_backward(ag_sum(v, TENSOR_ALL, 0)), 0);
  size_t grown = ag_tape_capacity(small);
  assert_true(grown >= 40 * base);   /* about 128 bytes an op and its result */
  ag_tape_reset(small);
  /* a steady step again: the growth goes back at its reset */
  v = ag_leaf(x, 1);
  ag_backward(ag_sum(ag_mul_scalar(v, 2), TENSOR_ALL, 0));
  ag_tape_reset(small);
  assert_int_equal(ag_tape_capacity(small), base);
  ag_tape_use(tape);
  ag_tape_free(small);
  tensor_free(x);
  TA_ASSERT_FINDINGS(NULL, 0);
}

static void test_no_grad(void **state) {
  (void)state;
  ag_var *w = ag_param_new(tensor_full(TS(3), 2.0f));
  ag_no_grad_begin();
  assert_false(ag_grad_enabled());
  ag_var *y = ag_sum(ag_mul(w, w), TENSOR_ALL, 0);
  ag_no_grad_end();
  assert_true(ag_grad_enabled());
  assert_float_equal(tensor_item(y->value), 12, 0);
  assert_int_equal(ag_tape_ops(tape), 0);
  assert_int_equal(y->requires_grad, 0);
  assert_int_equal(ag_backward(y), -1);
  assert_non_null(strstr(ag_error(), "does not require a gradient"));
  ag_tape_reset(tape);
  ag_param_free(w);
}

static void test_accumulation(void **state) {
  (void)state;
  ag_var *w = ag_param_new(tensor_from_f32((const float[]){ 1, -2, 3 }, TS(3)));
  ag_var *p = w;
  for (int round = 1; round <= 3; round++) {
    /* d(sum(w*w))/dw = 2w, added each round */
    assert_int_equal(ag_backward(ag_sum(ag_mul(w, w), TENSOR_ALL, 0)), 0);
    ag_tape_reset(tape);
    assert_float_equal(tensor_f32(w->grad)[0], 2.0f * round, 0);
    assert_float_equal(tensor_f32(w->grad)[1], -4.0f * round, 0);
    assert_float_equal(tensor_f32(w->grad)[2], 6.0f * round, 0);
  }
  /* two losses on one tape add up too */
  ag_zero_grad(&p, 1);
  for (int i = 0; i < 3; i++) assert_float_equal(tensor_f32(w->grad)[i], 0, 0);
  ag_backward(ag_sum(w, TENSOR_ALL, 0));
  ag_backward(ag_sum(ag_mul_scalar(w, 3), TENSOR_ALL, 0));
  ag_tape_reset(tape);
  for (int i = 0; i < 3; i++) assert_float_equal(tensor_f32(w->grad)[i], 4, 0);
  ag_param_free(w);
}

/* The op keeps an alias of the labels: the caller may free its tensor at once. */
static void test_inputs_kept(void **state) {
  (void)state;
  ag_var *w = ag_param_new(tensor_from_f32((const float[]){ 0, 0, 0, 0, 0, 0 }, TS(2, 3)));
  tensor *labels = tensor_from_i32((const int32_t[]){ 2, 0 }, TS(2));
  ag_var *loss = ag_cross_entropy(w, labels);
  tensor_free(labels);
  assert_int_equal(ag_backward(loss), 0);
  /* softmax of zeros is 1/3; minus 1 at the label; mean over 2 rows */
  const float want[] = { 1.0f / 6, 1.0f / 6, -1.0f / 3, -1.0f / 3, 1.0f / 6, 1.0f / 6 };
  for (int i = 0; i < 6; i++) assert_float_equal(tensor_f32(w->grad)[i], want[i], 1e-7);
  ag_tape_reset(tape);
  TA_ASSERT_FINDINGS(NULL, 0);
  ag_param_free(w);
}

/* dL/dL is one scalar the tape keeps: a loss that is a reshape of a
 * one-element leaf hands the leaf a view of it as its gradient; the tape
 * then lets that one go, and every later backward still starts from 1. */
static void test_seed(void **state) {
  (void)state;
  tensor *x = tensor_full(TS(1), 3.0f);
  for (int round = 0; round < 3; round++) {
    ag_var *v = ag_leaf(x, 1);
    assert_int_equal(ag_backward(ag_reshape(v, 0, NULL)), 0);
    assert_float_equal(tensor_f32(v->grad)[0], 1, 0);
    tensor_fill_(v->grad, 5.0f);                    /* the leaf's gradient is its own */
    ag_var *w = ag_leaf(x, 1), *u = ag_tanh(w);
    ag_var *loss = ag_add(ag_sum(ag_mul_scalar(w, 2), TENSOR_ALL, 1), ag_sum(ag_mul(u, u), TENSOR_ALL, 1));
    assert_int_equal(ag_backward(loss), 0);         /* a loss of shape [1] */
    float t = tanhf(3.0f), want = 2 + 2 * t * (1 - t * t);
    assert_float_equal(tensor_f32(w->grad)[0], want, 1e-6);
    assert_null(loss->grad);
    ag_tape_reset(tape);
  }
  TA_ASSERT_FINDINGS(NULL, 0);
  tensor_free(x);
}

static void test_errors(void **state) {
  (void)state;
  tensor *x = tensor_full(TS(2, 3), 1.0f);
  ag_var *v = ag_leaf(x, 1);
  /* not one element */
  assert_int_equal(ag_backward(v), -1);
  assert_non_null(strstr(ag_error(), "is not one element"));
  /* a failed op returns NULL and the chain goes on failing */
  tensor_error_handler(NULL, NULL);
  ag_var *bad = ag_matmul(v, v);   /* [2,3] @ [2,3] */
  assert_null(bad);
  assert_null(ag_relu(bad));
  assert_int_equal(ag_backward(bad), -1);
  tensor_error_clear();
  /* no tape */
  ag_tape_use(NULL);
  assert_null(ag_leaf(x, 0));
  assert_non_null(strstr(ag_error(), "no tape in use"));
  ag_tape_use(tape);
  /* inside a tensor scope */
  tensor_scope_begin();
  assert_null(ag_relu(v));
  assert_non_null(strstr(ag_error(), "inside a tensor scope"));
  tensor_scope_end();
  assert_null(ag_sgd_new(NULL, 0.1f, 0.9f, 0));
  ag_rng r = ag_rng_new(1);
  assert_null(ag_linear(0, 3, &r));
  assert_null(ag_sgd_new(NULL, -1, 0.9f, 0));
  assert_non_null(strstr(ag_error(), "lr -1"));
  ag_tape_reset(tape);
  tensor_free(x);
  TA_ASSERT_FINDINGS(NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_counts_and_reset, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_flat_over_iterations, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_capacity_shrinks, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_no_grad, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_accumulation, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_inputs_kept, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_seed, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_errors, tape_setup, tape_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
