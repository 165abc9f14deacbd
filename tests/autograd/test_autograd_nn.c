/* test_autograd_nn.c - layers (PyTorch's default initialisation, shapes,
 * parameters), the sequential container, SGD and Adam against values worked
 * out by hand, and the random generator. */
#include "ag_test.h"

#include <string.h>

static void test_rng(void **state) {
  (void)state;
  ag_rng a = ag_rng_new(42), b = ag_rng_new(42), c = ag_rng_new(43);
  uint64_t x = ag_rng_next(&a);
  assert_int_equal(x, ag_rng_next(&b));
  assert_int_not_equal(x, ag_rng_next(&c));
  /* splitmix64's first output for seed 0 */
  ag_rng z = ag_rng_new(0);
  assert_int_equal(ag_rng_next(&z), 0xE220A8397B1DCDAFull);
  double sum = 0, sq = 0;
  int counts[7] = { 0 };
  for (int i = 0; i < 70000; i++) {
    float u = ag_rng_uniform(&a), g = ag_rng_normal(&a);
    assert_true(u >= 0.0f && u < 1.0f);
    sum += g;
    sq += (double)g * g;
    counts[ag_rng_below(&a, 7)]++;
  }
  assert_true(fabs(sum / 70000) < 0.02);
  assert_true(fabs(sq / 70000 - 1.0) < 0.03);
  for (int k = 0; k < 7; k++) assert_true(counts[k] > 9500 && counts[k] < 10500);
}

/* Every value within +-1/sqrt(fan_in), spread over the range, seed-determined. */
static void check_uniform(const tensor *t, int64_t fan_in) {
  float bound = 1.0f / sqrtf((float)fan_in), lo = 1, hi = -1;
  for (int64_t i = 0; i < t->numel; i++) {
    float v = tensor_f32(t)[i];
    assert_true(v >= -bound && v <= bound);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  if (t->numel >= 100) {
    assert_true(lo < -0.9f * bound);
    assert_true(hi > 0.9f * bound);
  }
}

static void test_layers_init(void **state) {
  (void)state;
  ag_rng r = ag_rng_new(7);
  ag_layer *lin = ag_linear(400, 120, &r), *conv = ag_conv2d_layer(6, 16, 5, 1, 0, &r);
  ag_var *p[4];
  assert_int_equal(ag_layer_params(lin, p, 4), 2);
  assert_int_equal(p[0]->value->shape[0], 120);
  assert_int_equal(p[0]->value->shape[1], 400);
  check_uniform(p[0]->value, 400);
  check_uniform(p[1]->value, 400);
  assert_int_equal(ag_layer_params(conv, p, 4), 2);
  assert_int_equal(p[0]->value->ndim, 4);
  check_uniform(p[0]->value, 6 * 25);
  check_uniform(p[1]->value, 6 * 25);
  assert_string_equal(ag_layer_name(conv), "conv2d");
  /* the same seed gives the same weights */
  ag_rng r2 = ag_rng_new(7);
  ag_layer *lin2 = ag_linear(400, 120, &r2);
  ag_var *q[2];
  ag_layer_params(lin2, q, 2);
  ag_layer_params(lin, p, 2);
  assert_memory_equal(tensor_f32(p[0]->value), tensor_f32(q[0]->value), 400 * 120 * 4);
  ag_layer *emb = ag_embedding_layer(50, 8, &r);
  assert_int_equal(ag_layer_params(emb, p, 4), 1);
  assert_int_equal(p[0]->value->shape[0], 50);
  ag_layer_free(lin);
  ag_layer_free(lin2);
  ag_layer_free(conv);
  ag_layer_free(emb);
}

/* The embedding layer holds its input variable as the op's input (no alias
 * of the indices saved): the same gradient as ag_embedding on the tensor. */
static void test_embedding_layer(void **state) {
  (void)state;
  ag_rng r = ag_rng_new(5);
  ag_layer *emb = ag_embedding_layer(10, 4, &r);
  ag_var *w;
  assert_int_equal(ag_layer_params(emb, &w, 1), 1);
  tensor *idx = tensor_from_i32((const int32_t[]){ 3, 1, 3, 9, 0, 3 }, TS(2, 3));
  tensor *R = rand_tensor(TS(2, 3, 4), -1, 1, 9);
  ta_mark m = ta_mark_now();
  assert_int_equal(ag_backward(ag_sum(ag_mul(ag_embedding(w, idx), ag_input(R)), TENSOR_ALL, 0)), 0);
  tensor *g1 = tensor_clone(w->grad);
  ag_tape_reset(tape);
  ag_zero_grad(&w, 1);
  assert_int_equal(ag_backward(ag_sum(ag_mul(ag_layer_forward(emb, ag_input(idx)), ag_input(R)), TENSOR_ALL, 0)), 0);
  assert_memory_equal(tensor_f32(w->grad), tensor_f32(g1), 40 * sizeof(float));
  assert_true(tensor_f32(w->grad)[3 * 4] != 0);   /* row 3, used three times */
  ag_tape_reset(tape);
  tensor_free(g1);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  tensor_free(idx);
  tensor_free(R);
  ag_layer_free(emb);
  TA_ASSERT_FINDINGS(NULL, 0);
}

/* Embedding, flatten, linear in a sequential run as one op (the layers'
 * sums regrouped over each position's distinct indices): one op on the
 * tape where the three separate ops make three, the same output and
 * gradients as the separate ops (ag_embedding, ag_flatten, ag_linear_op on
 * the same parameters) within float rounding, and the gradient of the
 * rows used at several positions. */
static void test_embedding_linear_fused(void **state) {
  (void)state;
  ag_rng r = ag_rng_new(3);
  ag_layer *net = ag_sequential((ag_layer *[]){ ag_embedding_layer(20, 6, &r), ag_flatten_layer(),
                                                ag_linear(3 * 6, 9, &r), ag_tanh_layer() },
                                4);
  ag_var *p[3];
  assert_int_equal(ag_layer_params(net, p, 3), 3);   /* table, weight, bias */
  tensor *idx = tensor_from_i32((const int32_t[]){ 3, 1, 3, 9, 0, 3, 3, 1, 19, 3, 7, 3, 0, 0, 0 }, TS(5, 3));
  tensor *R = rand_tensor(TS(5, 9), -1, 1, 4);
  ta_mark m = ta_mark_now();
  ag_var *y = ag_layer_forward(net, ag_input(idx));
  assert_non_null(y);
  assert_int_equal(ag_tape_ops(tape), 2);   /* the fused op and tanh */
  tensor *y1 = tensor_clone(y->value);
  assert_int_equal(ag_backward(ag_sum(ag_mul(y, ag_input(R)), TENSOR_ALL, 0)), 0);
  tensor *g1[3];
  for (int i = 0; i < 3; i++) g1[i] = tensor_clone(p[i]->grad);
  ag_tape_reset(tape);
  ag_zero_grad(p, 3);
  ag_var *h = ag_tanh(ag_linear_op(ag_flatten(ag_embedding(p[0], idx)), p[1], p[2]));
  assert_int_equal(ag_tape_ops(tape), 4);   /* embedding, reshape, linear, tanh */
  assert_int_equal(ag_backward(ag_sum(ag_mul(h, ag_input(R)), TENSOR_ALL, 0)), 0);
  for (int64_t i = 0; i < 45; i++) assert_float_equal(tensor_f32(y1)[i], tensor_f32(h->value)[i], 2e-6);
  for (int i = 0; i < 3; i++)
    for (int64_t k = 0; k < g1[i]->numel; k++)
      assert_float_equal(tensor_f32(g1[i])[k], tensor_f32(p[i]->grad)[k], 1e-5);
  assert_true(tensor_f32(g1[0])[3 * 6] != 0);   /* row 3: seven uses, at all three positions */
  assert_true(tensor_f32(g1[0])[2 * 6] == 0);   /* row 2: none */
  ag_tape_reset(tape);
  for (int i = 0; i < 3; i++) tensor_free(g1[i]);
  tensor_free(y1);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  /* an index out of range: the embedding op's error, from the separate ops */
  tensor *bad = tensor_from_i32((const int32_t[]){ 3, 20, 0 }, TS(1, 3));
  assert_null(ag_layer_forward(net, ag_input(bad)));
  assert_non_null(strstr(tensor_error(), "tensor_embedding: index 20 at 1 out of range"));
  ag_tape_reset(tape);
  tensor_free(bad);
  tensor_free(idx);
  tensor_free(R);
  ag_layer_free(net);
  TA_ASSERT_FINDINGS(NULL, 0);
}

/* LeNet-5's shapes through a sequential, and its parameter count (61706). */
static void test_sequential(void **state) {
  (void)state;
  ag_rng r = ag_rng_new(1);
  ag_layer *net = ag_sequential(
      (ag_layer *[]){ ag_conv2d_layer(1, 6, 5, 1, 2, &r), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_conv2d_layer(6, 16, 5, 1, 0, &r), ag_tanh_layer(), ag_avg_pool2d_layer(2, 2),
                      ag_flatten_layer(), ag_linear(400, 120, &r), ag_relu_layer(), ag_linear(120, 84, &r),
                      ag_relu_layer(), ag_linear(84, 10, &r) },
      12);
  assert_non_null(net);
  ag_var *p[16];
  size_t n = ag_layer_params(net, p, 16), total = 0;
  assert_int_equal(n, 10);
  for (size_t i = 0; i < n; i++) total += (size_t)p[i]->value->numel;
  assert_int_equal(total, 61706);
  tensor *x = rand_tensor(TS(3, 1, 28, 28), 0, 1, 2);
  ta_mark m = ta_mark_now();
  ag_var *y = ag_layer_forward(net, ag_input(x));
  assert_non_null(y);
  assert_int_equal(y->value->ndim, 2);
  assert_int_equal(y->value->shape[0], 3);
  assert_int_equal(y->value->shape[1], 10);
  assert_int_equal(ag_tape_ops(tape), 12);
  assert_int_equal(ag_backward(ag_sum(y, TENSOR_ALL, 0)), 0);
  ag_tape_reset(tape);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  /* a NULL among the layers: everything freed, NULL back */
  assert_null(ag_sequential((ag_layer *[]){ ag_relu_layer(), NULL }, 2));
  tensor_free(x);
  ag_layer_free(net);
  TA_ASSERT_FINDINGS(NULL, 0);
}

/* A 1->1 linear layer: weight and bias, with hand-set values and gradients. */
static ag_layer *one_param_pair(ag_var **w, ag_var **b) {
  ag_rng r = ag_rng_new(1);
  ag_layer *l = ag_linear(1, 1, &r);
  ag_var *p[2];
  ag_layer_params(l, p, 2);
  *w = p[0];
  *b = p[1];
  tensor_f32((*w)->value)[0] = 1.0f;
  tensor_f32((*b)->value)[0] = -2.0f;
  return l;
}

static void set_grads(ag_var *w, ag_var *b, float gw, float gb) {
  tensor_f32(w->grad)[0] = gw;
  tensor_f32(b->grad)[0] = gb;
}

static void test_sgd(void **state) {
  (void)state;
  ag_var *w, *b;
  ag_layer *l = one_param_pair(&w, &b);
  ag_optim *o = ag_sgd_new(l, 0.1f, 0.9f, 0.1f);
  /* step 1: d = 0.5 + 0.1*1 = 0.6, buf = 0.6, w = 1 - 0.06 = 0.94 */
  set_grads(w, b, 0.5f, 0.0f);
  ag_optim_step(o);
  assert_float_equal(tensor_f32(w->value)[0], 0.94f, 1e-7);
  /* b: d = 0 + 0.1*(-2) = -0.2, b = -2 + 0.02 = -1.98 */
  assert_float_equal(tensor_f32(b->value)[0], -1.98f, 1e-7);
  /* step 2: d = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134, w = 0.94 - 0.1134 */
  set_grads(w, b, 0.5f, 0.0f);
  ag_optim_step(o);
  assert_float_equal(tensor_f32(w->value)[0], 0.8266f, 1e-6);
  assert_int_equal(ag_optim_steps(o), 2);
  ag_optim_zero_grad(o);
  assert_float_equal(tensor_f32(w->grad)[0], 0.0f, 0);
  /* plain SGD (no momentum, no decay): w -= lr * g */
  ag_optim_free(o);
  o = ag_sgd_new(l, 0.5f, 0.0f, 0.0f);
  set_grads(w, b, 0.25f, -1.0f);
  float w0 = tensor_f32(w->value)[0], b0 = tensor_f32(b->value)[0];
  ag_optim_step(o);
  assert_float_equal(tensor_f32(w->value)[0], w0 - 0.125f, 0);
  assert_float_equal(tensor_f32(b->value)[0], b0 + 0.5f, 0);
  ag_optim_free(o);
  ag_layer_free(l);
}

static void test_adam(void **state) {
  (void)state;
  ag_var *w, *b;
  ag_layer *l = one_param_pair(&w, &b);
  ag_optim *o = ag_adam_new(l, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f);
  /* step 1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25: w -= 0.1 * 0.5 / 0.5 */
  set_grads(w, b, 0.5f, -3.0f);
  ag_optim_step(o);
  assert_float_equal(tensor_f32(w->value)[0], 0.9f, 1e-6);
  assert_float_equal(tensor_f32(b->value)[0], -1.9f, 1e-6);   /* the sign of g, times lr */
  /* step 2, same gradient: m^ = 0.5, v^ = 0.25 again: another 0.1 */
  set_grads(w, b, 0.5f, -3.0f);
  ag_optim_step(o);
  assert_float_equal(tensor_f32(w->value)[0], 0.8f, 1e-6);
  assert_float_equal(tensor_f32(b->value)[0], -1.8f, 1e-6);
  ag_optim_free(o);
  ag_layer_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_rng),
    cmocka_unit_test(test_layers_init),
    cmocka_unit_test_setup_teardown(test_sequential, tape_setup, tape_teardown),

    cmocka_unit_test_setup_teardown(test_embedding_layer, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_embedding_linear_fused, tape_setup, tape_teardown),
    cmocka_unit_test(test_sgd),
    cmocka_unit_test(test_adam),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
