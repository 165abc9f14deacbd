/* test_autograd_grad.c - every op's gradient against central finite
 * differences (float32 values, double sums), and a few exact gradients. */
#include "ag_test.h"

#define EPS 1e-2
#define ATOL 2e-3
#define RTOL 5e-3

#define GC(fn, arg, ...) do {                                                  \
    tensor *ins_[] = { __VA_ARGS__ };                                          \
    int n_ = (int)(sizeof ins_ / sizeof *ins_);                                \
    gradcheck(fn, arg, ins_, n_, EPS, ATOL, RTOL);                             \
    for (int i_ = 0; i_ < n_; i_++) tensor_free(ins_[i_]);                     \
    TA_ASSERT_FINDINGS(NULL, 0);                                               \
  } while (0)

#define R(seed, lo, hi, ...) rand_tensor(TS(__VA_ARGS__), lo, hi, seed)

static ag_var *f_add(ag_var **in, void *a) { (void)a; return ag_add(in[0], in[1]); }
static ag_var *f_sub(ag_var **in, void *a) { (void)a; return ag_sub(in[0], in[1]); }
static ag_var *f_mul(ag_var **in, void *a) { (void)a; return ag_mul(in[0], in[1]); }
static ag_var *f_div(ag_var **in, void *a) { (void)a; return ag_div(in[0], in[1]); }
static ag_var *f_scalars(ag_var **in, void *a) { (void)a; return ag_neg(ag_mul_scalar(ag_add_scalar(in[0], 0.5f), -3.0f)); }
static ag_var *f_exp(ag_var **in, void *a) { (void)a; return ag_exp(in[0]); }
static ag_var *f_log(ag_var **in, void *a) { (void)a; return ag_log(in[0]); }
static ag_var *f_tanh(ag_var **in, void *a) { (void)a; return ag_tanh(in[0]); }
static ag_var *f_relu(ag_var **in, void *a) { (void)a; return ag_relu(in[0]); }
static ag_var *f_sigmoid(ag_var **in, void *a) { (void)a; return ag_sigmoid(in[0]); }

static void test_elementwise(void **state) {
  (void)state;
  GC(f_add, NULL, R(1, -1, 1, 2, 3), R(2, -1, 1, 3));          /* broadcast over rows */
  GC(f_add, NULL, R(3, -1, 1, 2, 1, 4), R(4, -1, 1, 3, 1));    /* both sides broadcast */
  GC(f_sub, NULL, R(5, -1, 1, 2, 3), R(6, -1, 1, 2, 1));
  GC(f_mul, NULL, R(7, -1, 1, 4, 3), R(8, -1, 1, 3));
  GC(f_div, NULL, R(9, -1, 1, 3, 2), R(10, 0.5f, 2, 3, 2));
  GC(f_scalars, NULL, R(11, -1, 1, 5));
  GC(f_exp, NULL, R(12, -1, 1, 2, 3));
  GC(f_log, NULL, R(13, 0.5f, 2, 2, 3));
  GC(f_tanh, NULL, R(14, -2, 2, 2, 3));
  GC(f_sigmoid, NULL, R(15, -2, 2, 2, 3));
  GC(f_relu, NULL, R(16, -1, 1, 3, 4));
}

static ag_var *f_sum_axis(ag_var **in, void *a) { return ag_sum(in[0], *(int *)a, 0); }
static ag_var *f_sum_keep(ag_var **in, void *a) { return ag_sum(in[0], *(int *)a, 1); }
static ag_var *f_mean_axis(ag_var **in, void *a) { return ag_mean(in[0], *(int *)a, 0); }
static ag_var *f_mean_all(ag_var **in, void *a) { (void)a; return ag_mean(in[0], TENSOR_ALL, 0); }

static void test_reductions(void **state) {
  (void)state;
  int ax0 = 0, ax1 = 1, axm1 = -1;
  GC(f_sum_axis, &ax0, R(20, -1, 1, 3, 4));
  GC(f_sum_axis, &axm1, R(21, -1, 1, 2, 3, 4));
  GC(f_sum_keep, &ax1, R(22, -1, 1, 2, 3, 4));
  GC(f_mean_axis, &ax1, R(23, -1, 1, 2, 3, 4));
  GC(f_mean_all, NULL, R(24, -1, 1, 3, 5));
}

static ag_var *f_matmul(ag_var **in, void *a) { (void)a; return ag_matmul(in[0], in[1]); }
static ag_var *f_linear(ag_var **in, void *a) { (void)a; return ag_linear_op(in[0], in[1], in[2]); }
static ag_var *f_linear_nobias(ag_var **in, void *a) { (void)a; return ag_linear_op(in[0], in[1], NULL); }

static void test_matmul(void **state) {
  (void)state;
  GC(f_matmul, NULL, R(30, -1, 1, 3, 4), R(31, -1, 1, 4, 2));
  GC(f_matmul, NULL, R(32, -1, 1, 2, 3, 4), R(33, -1, 1, 4, 5));      /* batch @ shared */
  GC(f_matmul, NULL, R(34, -1, 1, 3, 4), R(35, -1, 1, 2, 4, 2));      /* shared @ batch */
  GC(f_matmul, NULL, R(36, -1, 1, 2, 3, 4), R(37, -1, 1, 2, 4, 3));   /* batch @ batch */
  GC(f_linear, NULL, R(38, -1, 1, 5, 4), R(39, -1, 1, 3, 4), R(40, -1, 1, 3));
  GC(f_linear_nobias, NULL, R(41, -1, 1, 2, 6), R(42, -1, 1, 4, 6));
}

typedef struct { int stride, pad; } conv_arg;
static ag_var *f_conv(ag_var **in, void *a) {
  conv_arg *c = a;
  return ag_conv2d(in[0], in[1], in[2], c->stride, c->pad);
}
static ag_var *f_conv_nobias(ag_var **in, void *a) {
  conv_arg *c = a;
  return ag_conv2d(in[0], in[1], NULL, c->stride, c->pad);
}

static void test_conv2d(void **state) {
  (void)state;
  conv_arg c1 = { 1, 0 }, c2 = { 2, 1 }, c3 = { 1, 2 };
  GC(f_conv, &c1, R(50, -1, 1, 2, 2, 5, 5), R(51, -1, 1, 3, 2, 3, 3), R(52, -1, 1, 3));
  GC(f_conv, &c2, R(53, -1, 1, 1, 3, 6, 6), R(54, -1, 1, 2, 3, 3, 3), R(55, -1, 1, 2));
  GC(f_conv_nobias, &c3, R(56, -1, 1, 2, 1, 4, 4), R(57, -1, 1, 2, 1, 5, 5));
}

typedef struct { int k, stride; } pool_arg;
static ag_var *f_maxpool(ag_var **in, void *a) {
  pool_arg *p = a;
  return ag_max_pool2d(in[0], p->k, p->stride);
}
static ag_var *f_avgpool(ag_var **in, void *a) {
  pool_arg *p = a;
  return ag_avg_pool2d(in[0], p->k, p->stride);
}

/* Distinct values at least 0.05 apart (a shuffled ramp): no tie in a window
 * moves under the finite-difference step. */
static tensor *ramp(int ndim, const int64_t *shape, uint64_t seed) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  float *d = tensor_f32(t);
  for (int64_t i = 0; i < t->numel; i++) d[i] = 0.05f * (float)i - 1.0f;
  ag_rng r = ag_rng_new(seed);
  for (int64_t i = t->numel - 1; i > 0; i--) {
    int64_t j = (int64_t)ag_rng_below(&r, (uint64_t)i + 1);
    float x = d[i];
    d[i] = d[j];
    d[j] = x;
  }
  return t;
}

static void test_pooling(void **state) {
  (void)state;
  pool_arg p22 = { 2, 2 }, p31 = { 3, 1 };
  GC(f_maxpool, &p22, ramp(TS(2, 2, 4, 4), 60));
  GC(f_maxpool, &p31, ramp(TS(1, 2, 5, 5), 61));
  GC(f_avgpool, &p22, R(62, -1, 1, 2, 2, 4, 4));
  GC(f_avgpool, &p31, R(63, -1, 1, 1, 2, 5, 5));
}

static ag_var *f_softmax(ag_var **in, void *a) { return ag_softmax(in[0], *(int *)a); }
static ag_var *f_log_softmax(ag_var **in, void *a) { return ag_log_softmax(in[0], *(int *)a); }
static ag_var *f_ce(ag_var **in, void *a) { return ag_cross_entropy(in[0], a); }
static ag_var *f_embedding(ag_var **in, void *a) { return ag_embedding(in[0], a); }

static void test_nn_ops(void **state) {
  (void)state;
  int axm1 = -1, ax0 = 0;
  GC(f_softmax, &axm1, R(70, -2, 2, 3, 5));
  GC(f_softmax, &ax0, R(71, -2, 2, 3, 5));
  GC(f_log_softmax, &axm1, R(72, -2, 2, 4, 6));
  GC(f_log_softmax, &ax0, R(73, -2, 2, 2, 3, 2));
  tensor *labels = tensor_from_i32((const int32_t[]){ 2, 0, 4, 1 }, TS(4));
  GC(f_ce, labels, R(74, -2, 2, 4, 5));
  tensor_free(labels);
  /* Index 1 twice: its rows of the gradient add up. */
  tensor *idx = tensor_from_i32((const int32_t[]){ 1, 3, 1, 0, 4, 1 }, TS(2, 3));
  GC(f_embedding, idx, R(75, -1, 1, 5, 4));
  tensor_free(idx);
}

static ag_var *f_reshape(ag_var **in, void *a) { (void)a; return ag_reshape(in[0], TS(4, -1)); }
static ag_var *f_flatten_mul(ag_var **in, void *a) { (void)a; return ag_mul(ag_flatten(in[0]), in[1]); }
static ag_var *f_transpose(ag_var **in, void *a) { (void)a; return ag_matmul(ag_transpose(in[0], 0, 1), in[1]); }
/* A variable used twice, through a view and directly. */
static ag_var *f_reuse(ag_var **in, void *a) {
  (void)a;
  ag_var *t = ag_tanh(in[0]);
  return ag_add(ag_mul(t, t), ag_reshape(ag_sum(ag_reshape(t, TS(6)), TENSOR_ALL, 0), TS(1, 1)));
}

static void test_views(void **state) {
  (void)state;
  GC(f_reshape, NULL, R(80, -1, 1, 2, 3, 2));
  GC(f_flatten_mul, NULL, R(81, -1, 1, 2, 2, 3), R(82, -1, 1, 6));
  GC(f_transpose, NULL, R(83, -1, 1, 4, 3), R(84, -1, 1, 4, 2));
  GC(f_reuse, NULL, R(85, -1, 1, 2, 3));
}

/* Exact gradients: d(sum(a*b))/da = b, d(sum(x))/dx = 1, broadcasting sums. */
static void test_exact(void **state) {
  (void)state;
  tensor *a = tensor_from_f32((const float[]){ 1, 2, 3, 4, 5, 6 }, TS(2, 3));
  tensor *b = tensor_from_f32((const float[]){ 10, 20, 30 }, TS(3));
  ag_var *va = ag_leaf(a, 1), *vb = ag_leaf(b, 1);
  assert_int_equal(ag_backward(ag_sum(ag_mul(va, vb), TENSOR_ALL, 0)), 0);
  const float want_a[] = { 10, 20, 30, 10, 20, 30 }, want_b[] = { 5, 7, 9 };
  for (int i = 0; i < 6; i++) assert_float_equal(tensor_f32(va->grad)[i], want_a[i], 0);
  for (int i = 0; i < 3; i++) assert_float_equal(tensor_f32(vb->grad)[i], want_b[i], 0);
  ag_tape_reset(tape);
  /* mean over all 6: 1/6 each; relu passes where positive */
  tensor *c = tensor_from_f32((const float[]){ -1, 2, -3, 4, 0.5f, -6 }, TS(6));
  ag_var *vc = ag_leaf(c, 1);
  assert_int_equal(ag_backward(ag_mean(ag_relu(vc), TENSOR_ALL, 0)), 0);
  const float want_c[] = { 0, 1.0f / 6, 0, 1.0f / 6, 1.0f / 6, 0 };
  for (int i = 0; i < 6; i++) assert_float_equal(tensor_f32(vc->grad)[i], want_c[i], 1e-7);
  ag_tape_reset(tape);
  tensor_free(a);
  tensor_free(b);
  tensor_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_elementwise, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_reductions, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_matmul, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_conv2d, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_pooling, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_nn_ops, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_views, tape_setup, tape_teardown),
    cmocka_unit_test_setup_teardown(test_exact, tape_setup, tape_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
