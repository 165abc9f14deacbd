/* test_tensor_kernels.c - the fast kernels against plain references:
 *   - tensor_relu_grad, tanh_grad, sigmoid_grad against their formulas;
 *   - fills and broadcast copies, contiguous and strided;
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
#include <sys/wait.h>
#include <unistd.h>

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

/* relu, tanh and sigmoid backward from the forward's output, against the
 * formulas in double; contiguous, transposed and out= forms. */
static void test_activation_grads(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  enum { R = 37, C = 53 };
  tensor *x = tensor_randn(TS(R, C), 2.0f, 21), *dy = tensor_randn(TS(R, C), 1.0f, 22);
  tensor_f32(x)[5] = 0.0f;   /* relu'(0) = 0, as relu's backward takes it */
  tensor *ys[3] = { tensor_relu(x), tensor_tanh(x), tensor_sigmoid(x) };
  tensor *(*grad[3])(const tensor *, const tensor *) = { tensor_relu_grad, tensor_tanh_grad, tensor_sigmoid_grad };
  tensor_status (*grad_out[3])(tensor *, const tensor *, const tensor *) = {
    tensor_relu_grad_out, tensor_tanh_grad_out, tensor_sigmoid_grad_out };
  const char *names[3] = { "relu_grad", "tanh_grad", "sigmoid_grad" };
  for (int k = 0; k < 3; k++) {
    tensor *g = grad[k](dy, ys[k]);
    tensor *gt = grad[k](tensor_transpose(dy, 0, 1), tensor_transpose(ys[k], 0, 1));   /* strided */
    tensor *go = tensor_empty(TENSOR_F32, TS(R, C));
    assert_int_equal(grad_out[k](go, dy, ys[k]), TENSOR_OK);
    for (int i = 0; i < R * C; i++) {
      double d = tensor_f32(dy)[i], y = tensor_f32(ys[k])[i];
      double want = k == 0 ? (y > 0 ? d : 0.0) : k == 1 ? d * (1 - y * y) : d * y * (1 - y);
      check_close(names[k], i, y, tensor_f32(g)[i], want, 1e-6, 1e-7);
      check_close(names[k], i, y, tensor_f32(go)[i], want, 1e-6, 1e-7);
      check_close(names[k], i, y, tensor_f32(gt)[(i % C) * R + i / C], want, 1e-6, 1e-7);
    }
  }
  assert_true(tensor_f32(tensor_relu_grad(dy, ys[0]))[5] == 0.0f);
  assert_int_equal(n_errors, 0);
  assert_null(tensor_relu_grad(dy, tensor_empty(TENSOR_F32, TS(3))));   /* shapes that do not broadcast */
  assert_int_equal(n_errors, 1);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* fills and broadcast copies (the fill reads its value once) */
static void test_fill_and_broadcast_copy(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  enum { R = 37, C = 53 };
  tensor *a = tensor_randn(TS(R, C), 1.0f, 31);
  assert_int_equal(tensor_fill_(a, 1.5f), TENSOR_OK);
  for (int i = 0; i < R * C; i++) assert_true(tensor_f32(a)[i] == 1.5f);
  tensor *cols = tensor_slice(a, 1, 0, C, 2);   /* every other column */
  assert_int_equal(tensor_fill_(cols, -2.0f), TENSOR_OK);
  for (int i = 0; i < R * C; i++) assert_true(tensor_f32(a)[i] == ((i % C) % 2 == 0 ? -2.0f : 1.5f));
  tensor *row = tensor_randn(TS(C), 1.0f, 32);
  assert_int_equal(tensor_copy_(a, row), TENSOR_OK);   /* the row broadcast to every row */
  for (int i = 0; i < R * C; i++) assert_true(tensor_f32(a)[i] == tensor_f32(row)[i % C]);
  tensor *ints = tensor_empty(TENSOR_I32, TS(5, 7));
  assert_int_equal(tensor_fill_(ints, 3.0f), TENSOR_OK);
  for (int i = 0; i < 35; i++) assert_int_equal(tensor_i32(ints)[i], 3);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* ---- conv2d ------------------------------------------------------------- */

typedef struct { int N, C, H, W, O, KH, KW, S, P, threads; } conv_case;

static void check_conv_case(const conv_case *k, uint64_t seed) {
  int N = k->N, C = k->C, H = k->H, W = k->W, O = k->O, KH = k->KH, KW = k->KW, S = k->S, PD = k->P;
  int OH = (H + 2 * PD - KH) / S + 1, OW = (W + 2 * PD - KW) / S + 1;
  tensor_set_threads(k->threads);
  tensor_scope_begin();
  tensor *x = tensor_randn(TS(N, C, H, W), 1.0f, seed), *w = tensor_randn(TS(O, C, KH, KW), 0.5f, seed + 1);
  tensor *b = tensor_randn(TS(O), 1.0f, seed + 2), *dy = tensor_randn(TS(N, O, OH, OW), 1.0f, seed + 3);
  size_t ny = (size_t)N * O * OH * OW, nx = (size_t)N * C * H * W, nw = (size_t)O * C * KH * KW;
  double *y = calloc(ny, sizeof *y), *dx = calloc(nx, sizeof *dx), *dw = calloc(nw, sizeof *dw);
  double *db = calloc((size_t)O, sizeof *db);
  /* the sums of |terms|: a float sum of n terms is off by up to about
   * eps * sum |terms| (cancellation), whichever order it adds them in */
  double *ay = calloc(ny, sizeof *ay), *adx = calloc(nx, sizeof *adx), *adw = calloc(nw, sizeof *adw);
  double *adb = calloc((size_t)O, sizeof *adb);
  const float *xp = x->data, *wp = w->data, *bp = b->data, *gp = dy->data;
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          size_t yi = (((size_t)n * O + o) * OH + oh) * OW + ow;
          double acc = bp[o], g = gp[yi], aacc = fabs(bp[o]);
          db[o] += g;
          adb[o] += fabs(g);
          for (int c = 0; c < C; c++)
            for (int kh = 0; kh < KH; kh++)
              for (int kw = 0; kw < KW; kw++) {
                int ih = oh * S - PD + kh, iw = ow * S - PD + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                size_t xi = (((size_t)n * C + c) * H + ih) * W + iw, wi = (((size_t)o * C + c) * KH + kh) * KW + kw;
                acc += (double)xp[xi] * wp[wi];
                dx[xi] += (double)wp[wi] * g;
                dw[wi] += (double)xp[xi] * g;
                aacc += fabs((double)xp[xi] * wp[wi]);
                adx[xi] += fabs((double)wp[wi] * g);
                adw[wi] += fabs((double)xp[xi] * g);
              }
          y[yi] = acc;
          ay[yi] = aacc;
        }
  tensor *gy = tensor_conv2d(x, w, b, S, PD);
  tensor *gx = tensor_conv2d_grad_input(dy, w, TS(N, C, H, W), S, PD);
  tensor *gw = tensor_conv2d_grad_weight(dy, x, TS(O, C, KH, KW), S, PD);
  tensor *gb = tensor_conv2d_grad_bias(dy);
  tensor *gy0 = tensor_conv2d(x, w, NULL, S, PD);   /* no bias */
  if (!gy || !gx || !gw || !gb || !gy0) fail_msg("conv case %dx%dx%dx%d o%d k%dx%d: %s", N, C, H, W, O, KH, KW, tensor_error());
  expect_shape(gy, N, O, OH, OW);
  struct { const char *name; const tensor *t; const double *want, *abs_sum; size_t n; } cmp[] = {
    { "y", gy, y, ay, ny }, { "dx", gx, dx, adx, nx }, { "dw", gw, dw, adw, nw }, { "db", gb, db, adb, (size_t)O },
  };
  for (int q = 0; q < 4; q++)
    for (size_t i = 0; i < cmp[q].n; i++)
      if (fabs(tensor_f32(cmp[q].t)[i] - cmp[q].want[i]) > 1e-5 * fabs(cmp[q].want[i]) + 1e-7 * cmp[q].abs_sum[i] + 1e-6)
        fail_msg("case N%d C%d %dx%d O%d k%dx%d s%d p%d, %s[%zu]: %.9g, want %.9g", N, C, H, W, O, KH, KW, S, PD,
                 cmp[q].name, i, tensor_f32(cmp[q].t)[i], cmp[q].want[i]);
  for (size_t i = 0; i < ny; i++) {
    double want = y[i] - bp[(i / ((size_t)OH * OW)) % O];
    if (fabs(tensor_f32(gy0)[i] - want) > 1e-5 * fabs(want) + 1e-7 * ay[i] + 1e-6) fail_msg("no bias, y[%zu]", i);
  }
  free(y), free(dx), free(dw), free(db), free(ay), free(adx), free(adw), free(adb);
  tensor_scope_end();
  tensor_set_threads(1);
}

/* stride 1 takes the direct kernels (for dL/dx only while padding <= K-1),
 * other strides and many channels im2col + sgemm */
static const conv_case conv_cases[] = {
  { 3, 1, 28, 28, 6, 5, 5, 1, 2, 1 },    /* LeNet conv1 */
  { 3, 6, 14, 14, 16, 5, 5, 1, 0, 2 },   /* LeNet conv2, 2 threads */
  { 2, 3, 7, 9, 13, 3, 2, 1, 1, 1 },     /* 13 channels: tiles 8 + 4 + 1; rectangular kernel */
  { 2, 2, 5, 6, 3, 2, 3, 1, 2, 1 },      /* padding beyond K-1: dL/dx by col2im */
  { 1, 2, 3, 3, 9, 3, 3, 1, 1, 1 },      /* an image narrower than a vector */
  { 2, 5, 4, 4, 17, 1, 1, 1, 0, 2 },     /* 1x1 kernel, 17 channels */
  { 1, 1, 2, 2, 2, 3, 3, 1, 2, 1 },      /* padding wider than the image */
  { 3, 7, 11, 10, 5, 4, 4, 1, 3, 2 },    /* 7 input channels, even kernel */
  { 1, 70, 4, 4, 3, 3, 3, 1, 1, 1 },     /* 70 channels: im2col + sgemm */
  { 2, 3, 9, 8, 4, 3, 3, 2, 1, 1 },      /* stride 2: im2col + sgemm */
};

static void test_conv2d_kernels_vs_loops(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  for (size_t i = 0; i < sizeof conv_cases / sizeof *conv_cases; i++) check_conv_case(&conv_cases[i], 100 + 10 * i);
  assert_int_equal(n_errors, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* ---- max pooling ---------------------------------------------------------- */

static void check_max_pool(int k, int s, uint64_t seed) {
  enum { N = 2, C = 3, H = 9, W = 11 };
  tensor_scope_begin();
  tensor *x = tensor_randn(TS(N, C, H, W), 1.0f, seed);
  float *xv = tensor_f32(x);
  for (int i = 0; i < N * C * H * W; i++) xv[i] = roundf(xv[i] * 2.0f);   /* few levels: ties */
  tensor *am;
  tensor *y = tensor_max_pool2d(x, k, s, &am);
  int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  expect_shape(y, N, C, OH, OW);
  for (int pl = 0; pl < N * C; pl++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        int best = oh * s * W + ow * s;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++)
            if (xv[pl * H * W + (oh * s + i) * W + ow * s + j] > xv[pl * H * W + best]) best = (oh * s + i) * W + ow * s + j;
        int at = (pl * OH + oh) * OW + ow;
        if (tensor_i32(am)[at] != best || tensor_f32(y)[at] != xv[pl * H * W + best])
          fail_msg("max_pool k%d s%d plane %d (%d,%d): %g at %d, want %g at %d", k, s, pl, oh, ow, tensor_f32(y)[at],
                   tensor_i32(am)[at], xv[pl * H * W + best], best);
      }
  tensor *y2 = tensor_max_pool2d(x, k, s, NULL);   /* no argmax */
  for (int i = 0; i < N * C * OH * OW; i++) assert_true(tensor_f32(y2)[i] == tensor_f32(y)[i]);
  tensor_scope_end();
}

static void test_max_pool_vs_loop(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  check_max_pool(2, 2, 7);   /* the 2x2 kernel, odd sizes (the last row and column dropped) */
  check_max_pool(3, 2, 8);   /* the general loop */
  check_max_pool(2, 1, 9);
  assert_int_equal(n_errors, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

int main(int argc, char **argv) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_exp_tanh_sigmoid_vs_libm, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_softmax_rows_vs_double, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_activation_grads, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_fill_and_broadcast_copy, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_conv2d_kernels_vs_loops, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_max_pool_vs_loop, errors_setup, errors_teardown),
  };
  const struct CMUnitTest conv_only[] = {
    cmocka_unit_test_setup_teardown(test_conv2d_kernels_vs_loops, errors_setup, errors_teardown),
  };
  if (argc > 1 && strcmp(argv[1], "--conv-only") == 0) return cmocka_run_group_tests(conv_only, NULL, NULL);
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  /* the direct convolution's AVX2 and baseline kernels, in child processes
   * (the kernels are picked once per process, TENSOR_CONV_ISA forces one) */
  if (getenv("TENSOR_CONV_ISA") == NULL) {
    const char *isa[] = { "v3", "base" };
    for (int i = 0; i < 2; i++) {
      pid_t pid = fork();
      if (pid == 0) {
        setenv("TENSOR_CONV_ISA", isa[i], 1);
        execl("/proc/self/exe", argv[0], "--conv-only", (char *)NULL);
        _exit(127);
      }
      int st = 0;
      waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "conv2d kernels with TENSOR_CONV_ISA=%s failed\n", isa[i]);
        failed++;
      }
    }
  }
  return failed;
}
