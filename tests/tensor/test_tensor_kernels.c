/* test_tensor_kernels.c - the fast kernels against plain references:
 *   - tensor_exp, tensor_tanh, tensor_sigmoid (vectorized polynomials, not
 *     libm) against libm in double over [-110, 110] and at 0, -0, +-inf and
 *     NaN, contiguous and strided; softmax and cross-entropy rows likewise;
 *   - conv2d forward and backward (the direct kernels of stride 1 and the
 *     im2col path of other strides) against direct loops in double, over
 *     geometries that cover LeNet-5's layers, odd channel counts, padding
 *     wider than the kernel's reach and images narrower than a vector;
 *   - max pooling (the 2x2 stride-2 kernel and the general one) against a
 *     direct loop, ties included (the first maximum wins). */
#include "harness.h"
#include "tensor_test.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

/* |got - want| within rel of |want|, or within abs_tol where want is tiny. */
static void check_close(const char *what, int64_t i, double x, double got, double want, double rel, double abs_tol) {
  if (isnan(want)) {
    if (!isnan(got)) fail_msg("%s(%.9g) [%lld] is %.9g, want NaN", what, x, (long long)i, got);
    return;
  }
  if (isinf(want)) {
    if (got != want) fail_msg("%s(%.9g) [%lld] is %.9g, want %g", what, x, (long long)i, got, want);
    return;
  }
  if (!(fabs(got - want) <= rel * fabs(want) + abs_tol))
    fail_msg("%s(%.9g) [%lld] is %.9g, want %.9g (relative error %.3g)", what, x, (long long)i, got, want,
             fabs(got - want) / fabs(want));
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Every float in [-110, 110] on a grid of 1/4096 (with a few ulps of jitter),
 * plus the special values. */
static void test_exp_tanh_sigmoid_vs_libm(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  const int64_t n = 2 * 110 * 4096 + 1 + 8;
  tensor *x = tensor_empty(TENSOR_F32, TS(n));
  float *xv = tensor_f32(x);
  for (int64_t i = 0; i < n - 8; i++) xv[i] = (float)(-110.0 + (double)i / 4096.0) * (1.0f + (float)(i % 7) * FLT_EPSILON);
  float special[8] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, FLT_MIN };
  memcpy(xv + n - 8, special, sizeof special);
  struct { const char *name; tensor *(*f)(const tensor *); double (*ref)(double); } fns[] = {
    { "exp", tensor_exp, exp }, { "tanh", tensor_tanh, tanh }, { "sigmoid", tensor_sigmoid, ref_sigmoid },
  };
  for (int k = 0; k < 3; k++) {
    tensor *y = fns[k].f(x);
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++) {
      double want = (float)fns[k].ref(xv[i]);   /* what float holds: exp(88.72...) is +inf */
      /* float has no value under 2^-149: below FLT_MIN an absolute bound */
      check_close(fns[k].name, i, xv[i], tensor_f32(y)[i], want, 1e-6, 2e-45 + 1e-6 * FLT_MIN);
    }
    /* small arguments keep their relative accuracy (no cancellation) */
    if (k == 1) assert_true(tensor_f32(y)[n - 2] == -1e-30f);
  }
  /* a strided view (every third element) takes the other loop of the kernel */
  tensor *xs = tensor_slice(x, 0, 0, n, 3);
  for (int k = 0; k < 3; k++) {
    tensor *y = fns[k].f(xs);
    for (int64_t i = 0; i < xs->numel; i++)
      check_close(fns[k].name, i, xv[3 * i], tensor_f32(y)[i], (float)fns[k].ref(xv[3 * i]), 1e-6, 2e-45 + 1e-6 * FLT_MIN);
  }
  /* the in-place forms run the same kernels */
  tensor *c = tensor_clone(x);
  assert_int_equal(tensor_tanh_(c), TENSOR_OK);
  for (int64_t i = 0; i < n; i++) check_close("tanh_", i, xv[i], tensor_f32(c)[i], tanh(xv[i]), 1e-6, 1e-45);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* softmax, log-softmax and cross-entropy of wide rows (exponentials over
 * a range of 60) against double. */
static void test_softmax_rows_vs_double(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  enum { R = 7, C = 133 };
  tensor *l = tensor_randn(TS(R, C), 10.0f, 5), *y = tensor_zeros(TENSOR_I32, TS(R));
  for (int r = 0; r < R; r++) tensor_i32(y)[r] = (r * 37) % C;
  tensor *sm = tensor_softmax(l, 1), *lsm = tensor_log_softmax(l, 1), *ce = tensor_cross_entropy(l, y);
  tensor *smt = tensor_softmax(tensor_transpose(l, 0, 1), 0);   /* strided rows */
  const float *lv = tensor_f32(l);
  double total = 0;
  for (int r = 0; r < R; r++) {
    double mx = -INFINITY, s = 0;
    for (int k = 0; k < C; k++) mx = fmax(mx, lv[r * C + k]);
    for (int k = 0; k < C; k++) s += exp(lv[r * C + k] - mx);
    for (int k = 0; k < C; k++) {
      double p = exp(lv[r * C + k] - mx) / s, lp = lv[r * C + k] - mx - log(s);
      check_close("softmax", r * C + k, lv[r * C + k], tensor_f32(sm)[r * C + k], p, 1e-5, 1e-12);
      check_close("softmax^T", r * C + k, lv[r * C + k], tensor_f32(smt)[k * R + r], p, 1e-5, 1e-12);
      check_close("log_softmax", r * C + k, lv[r * C + k], tensor_f32(lsm)[r * C + k], lp, 1e-5, 1e-6);
    }
    total += log(s) + mx - lv[r * C + tensor_i32(y)[r]];
  }
  check_close("cross_entropy", 0, 0, tensor_item(ce), total / R, 1e-5, 1e-6);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_exp_tanh_sigmoid_vs_libm, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_softmax_rows_vs_double, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
