/* test_tensor_gemm.c - the small-matrix products of tensor/gemm_small.c and
 * the in-place elementwise loops:
 *   - _tensor_sgemm_small against a double reference on every shape class
 *     it serves (A as it is or transposed with B as it is; A with B
 *     transposed), M, N, K at 1, around the tile sizes (6 and 3 rows, 16 and
 *     4 columns, 8 lanes of k) and across the 256-k blocks, alpha 1 and
 *     -0.5, beta 0 (C filled with NaN first: never read), 1 and 0.25, with
 *     leading dimensions wider than the rows (the padding must stay as it
 *     was).  Bound: |got - exact| <= (K + 2) * 2^-23 * (|alpha| *
 *     sum_k |a_ik b_kj| + |beta c_ij|) + 1e-30 (float rounding of K
 *     products and sums, and of the scaling);
 *   - which calls it serves: the six products of a train-charlm step on a
 *     CPU with AVX2 and FMA, never both operands transposed, nothing above
 *     the size limit;
 *   - tensor_matmul_t and tensor_gemm_t_out (the linear layers' calls) over
 *     the same kernels, batched too, within the same bound;
 *   - tensor_embedding_linear and its backward (embed_linear.c) against
 *     the sums of the embedding, flatten and linear ops in double, with
 *     repeated indices, within the same kind of bound; its range and shape
 *     errors;
 *   - tanh, exp and tanh_grad in place give the bits of the out-of-place
 *     forms (their loops for o == a). */
#include "harness.h"
#include "tensor_test.h"

#include "../../tensor/gemm_small.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {   /* in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* C = alpha op(A) op(B) + beta C in double, with the bound's magnitude */
static void ref_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, const float *C, int ldc, double *want, double *mag) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0, m = 0;
      for (int k = 0; k < K; k++) {
        double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
        m += fabs(a * b);
      }
      double c = beta != 0.0f ? (double)C[i * ldc + j] : 0.0;
      want[i * N + j] = alpha * s + beta * c;
      mag[i * N + j] = fabs(alpha) * m + fabs(beta * c);
    }
}

static int check_case(int ta, int tb, int M, int N, int K, float alpha, float beta) {
  int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
  int ar = ta ? K : M, br = tb ? N : K;
  float *A = malloc(sizeof(float) * ar * lda), *B = malloc(sizeof(float) * br * ldb);
  float *C = malloc(sizeof(float) * M * ldc), *C0 = malloc(sizeof(float) * M * ldc);
  double *want = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
  for (int i = 0; i < ar * lda; i++) A[i] = frand();
  for (int i = 0; i < br * ldb; i++) B[i] = frand();
  for (int i = 0; i < M * ldc; i++) C0[i] = beta == 0.0f && i % ldc < N ? NAN : frand();
  memcpy(C, C0, sizeof(float) * M * ldc);
  ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, want, mag);
  int bad = 0;
  if (!_tensor_sgemm_small(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) {
    fprintf(stderr, "not served: %c%c %dx%dx%d\n", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
    bad = 1;
  }
  for (int i = 0; i < M && !bad; i++)
    for (int j = 0; j < ldc && !bad; j++) {
      float got = C[i * ldc + j];
      if (j >= N) {   /* the padding past N: untouched, bit for bit */
        if (memcmp(&got, &C0[i * ldc + j], sizeof got) != 0) {
          fprintf(stderr, "%c%c %dx%dx%d: padding C[%d][%d] changed\n", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, i, j);
          bad = 1;
        }
        continue;
      }
      double w = want[i * N + j], tol = (K + 2) * ldexp(1.0, -23) * mag[i * N + j] + 1e-30;
      if (!(fabs(got - w) <= tol)) {
        fprintf(stderr, "%c%c %dx%dx%d alpha %g beta %g: C[%d][%d] = %.9g, want %.9g (tolerance %.3g)\n",
                ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, beta, i, j, got, w, tol);
        bad = 1;
      }
    }
  free(A), free(B), free(C), free(C0), free(want), free(mag);
  return bad;
}

static void test_gemm_small_vs_double(void **state) {
  (void)state;
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    assert_false(_tensor_sgemm_small_serves(0, 0, 8, 8, 8));   /* OpenBLAS serves every call there */
    skip();
  }
  static const int tr[3][2] = { { 0, 0 }, { 1, 0 }, { 0, 1 } };
  static const int Ms[] = { 1, 5, 6, 7, 64 }, Ns[] = { 1, 4, 5, 16, 17, 33, 114 }, Ks[] = { 1, 7, 8, 9, 114, 257 };
  static const float alphas[] = { 1.0f, -0.5f }, betas[] = { 0.0f, 1.0f, 0.25f };
  int n = 0, failed = 0;
  for (int t = 0; t < 3; t++)
    for (size_t m = 0; m < sizeof Ms / sizeof *Ms; m++)
      for (size_t nn = 0; nn < sizeof Ns / sizeof *Ns; nn++)
        for (size_t k = 0; k < sizeof Ks / sizeof *Ks; k++, n++)
          failed += check_case(tr[t][0], tr[t][1], Ms[m], Ns[nn], Ks[k], alphas[n % 2], betas[n % 3]);
  /* the charlm shapes themselves, with their betas */
  failed += check_case(0, 1, 64, 256, 512, 1.0f, 0.0f);
  failed += check_case(0, 0, 64, 512, 256, 1.0f, 0.0f);
  failed += check_case(1, 0, 256, 512, 64, 1.0f, 1.0f);
  failed += check_case(1, 0, 114, 256, 64, 1.0f, 1.0f);
  assert_int_equal(failed, 0);
}

static void test_gemm_small_serves(void **state) {
  (void)state;
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) skip();
  assert_true(_tensor_sgemm_small_serves(0, 1, 64, 256, 512));    /* x @ W1^T */
  assert_true(_tensor_sgemm_small_serves(0, 1, 64, 114, 256));    /* h @ W2^T */
  assert_true(_tensor_sgemm_small_serves(0, 0, 64, 256, 114));    /* dy @ W2 */
  assert_true(_tensor_sgemm_small_serves(1, 0, 114, 256, 64));    /* dy^T @ h */
  assert_true(_tensor_sgemm_small_serves(0, 0, 64, 512, 256));    /* dh @ W1 */
  assert_true(_tensor_sgemm_small_serves(1, 0, 256, 512, 64));    /* dh^T @ x */
  assert_false(_tensor_sgemm_small_serves(1, 1, 8, 8, 8));        /* both transposed: OpenBLAS */
  assert_false(_tensor_sgemm_small_serves(0, 0, 512, 512, 512));  /* above the limit */
  assert_false(_tensor_sgemm_small_serves(0, 0, 8, 8, 0));
  float a = 1, b = 1, c = 7;
  assert_false(_tensor_sgemm_small(1, 1, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1));
  assert_true(c == 7.0f);   /* not served: not touched */
}

/* max over elements of |got - exact| / bound, for t = alpha a@b (+ beta c0) */
static void check_product(const tensor *got, const tensor *a, int ta, const tensor *b, int tb, float beta,
                          const float *c0) {
  int64_t M = got->shape[got->ndim - 2], N = got->shape[got->ndim - 1], K = ta ? a->shape[0] : a->shape[1];
  const float *A = tensor_f32((tensor *)a), *B = tensor_f32((tensor *)b);
  int64_t lda = a->shape[1], ldb = b->shape[1];
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < K; k++) {
        double x = ta ? A[k * lda + i] : A[i * lda + k], y = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += x * y;
        m += fabs(x * y);
      }
      if (c0) s += beta * c0[i * N + j], m += fabs(beta * c0[i * N + j]);
      double g = elem(got, i * N + j), tol = (K + 2) * ldexp(1.0, -23) * m + 1e-30;
      if (!(fabs(g - s) <= tol)) fail_msg("[%lld][%lld] = %.9g, want %.9g", (long long)i, (long long)j, g, s);
    }
}

static void test_linear_layer_calls(void **state) {
  (void)state;
  ta_mark mk = ta_mark_now();
  tensor_scope_begin();
  tensor *x = tensor_randn(TS(64, 512), 1.0f, 1), *w = tensor_randn(TS(256, 512), 0.05f, 2);
  tensor *dh = tensor_randn(TS(64, 256), 1.0f, 3);
  check_product(tensor_matmul_t(x, 0, w, 1), x, 0, w, 1, 0.0f, NULL);      /* forward */
  check_product(tensor_matmul(dh, w), dh, 0, w, 0, 0.0f, NULL);            /* dx */
  tensor *g = tensor_randn(TS(256, 512), 1.0f, 4);
  float *g0 = malloc(sizeof(float) * 256 * 512);
  memcpy(g0, tensor_f32(g), sizeof(float) * 256 * 512);
  assert_int_equal(tensor_gemm_t_out(g, dh, 1, x, 0, 1.0f, 1.0f), TENSOR_OK);   /* dW += dh^T x */
  check_product(g, dh, 1, x, 0, 1.0f, g0);
  free(g0);
  /* a batch over one shared b: one product per batch */
  tensor *ba = tensor_randn(TS(3, 7, 9), 1.0f, 5), *bb = tensor_randn(TS(9, 20), 1.0f, 6);
  tensor *by = tensor_matmul(ba, bb);
  for (int64_t i = 0; i < 3; i++)
    for (int64_t r = 0; r < 7; r++)
      for (int64_t c = 0; c < 20; c++) {
        double s = 0, m = 0;
        for (int64_t k = 0; k < 9; k++) {
          double p = (double)tensor_f32(ba)[(i * 7 + r) * 9 + k] * tensor_f32(bb)[k * 20 + c];
          s += p, m += fabs(p);
        }
        double got = tensor_f32(by)[(i * 7 + r) * 20 + c];
        if (!(fabs(got - s) <= 11 * ldexp(1.0, -23) * m + 1e-30)) fail_msg("batch %lld [%lld][%lld]", (long long)i,
                                                                           (long long)r, (long long)c);
      }
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(mk);
}

/* tensor_embedding_linear and its backward against the three ops' sums in
 * double: y[b][o] = bias[o] + sum_{j,d} table[idx[b][j]][d] w[o][j*D + d],
 * and the gradients accumulated into nonzero buffers.  Indices drawn from a
 * few values so that positions repeat them (the rows computed once), with
 * train-charlm's sizes and an odd small case (U_j of 1 to B). */
static void check_embedding_linear(int64_t V, int64_t D, int64_t B, int64_t C, int64_t O, int vals, uint64_t seed) {
  tensor *table = tensor_randn(TS(V, D), 1.0f, seed), *w = tensor_randn(TS(O, C * D), 0.05f, seed + 1);
  tensor *bias = tensor_randn(TS(O), 0.5f, seed + 2), *dy = tensor_randn(TS(B, O), 1.0f, seed + 3);
  tensor *dt = tensor_randn(TS(V, D), 1.0f, seed + 4), *dw = tensor_randn(TS(O, C * D), 1.0f, seed + 5);
  tensor *db = tensor_randn(TS(O), 1.0f, seed + 6);
  int32_t *ix = malloc(sizeof(int32_t) * B * C);
  for (int64_t i = 0; i < B * C; i++) ix[i] = (int32_t)((frand() * 0.5f + 0.5f) * (float)vals) % (int32_t)V;
  ix[0] = 0;
  ix[B * C - 1] = (int32_t)V - 1;   /* both ends of the table */
  tensor *idx = tensor_from_i32(ix, TS(B, C));
  const float *T = tensor_f32(table), *W = tensor_f32(w), *bs = tensor_f32(bias), *g = tensor_f32(dy);
  tensor *y = tensor_embedding_linear(table, idx, w, bias);
  assert_non_null(y);
  expect_shape(y, B, O);
  for (int64_t b = 0; b < B; b++)
    for (int64_t o = 0; o < O; o++) {
      double s = bs[o], m = fabs(bs[o]);
      for (int64_t j = 0; j < C; j++)
        for (int64_t d = 0; d < D; d++) {
          double p = (double)T[ix[b * C + j] * D + d] * W[o * C * D + j * D + d];
          s += p, m += fabs(p);
        }
      double got = tensor_f32(y)[b * O + o], tol = (C * D + C + 2) * ldexp(1.0, -23) * m + 1e-30;
      if (!(fabs(got - s) <= tol)) fail_msg("y[%lld][%lld] = %.9g, want %.9g", (long long)b, (long long)o, got, s);
    }
  /* the backward, into gradients that hold something already */
  double *wt = calloc((size_t)(V * D), sizeof(double)), *mt = calloc((size_t)(V * D), sizeof(double));
  double *ww = calloc((size_t)(O * C * D), sizeof(double)), *mw = calloc((size_t)(O * C * D), sizeof(double));
  for (int64_t i = 0; i < V * D; i++) wt[i] = tensor_f32(dt)[i], mt[i] = fabs(wt[i]);
  for (int64_t i = 0; i < O * C * D; i++) ww[i] = tensor_f32(dw)[i], mw[i] = fabs(ww[i]);
  double wb[O], mb[O];
  for (int64_t o = 0; o < O; o++) wb[o] = tensor_f32(db)[o], mb[o] = fabs(wb[o]);
  for (int64_t b = 0; b < B; b++)
    for (int64_t o = 0; o < O; o++) {
      wb[o] += g[b * O + o], mb[o] += fabs(g[b * O + o]);
      for (int64_t j = 0; j < C; j++)
        for (int64_t d = 0; d < D; d++) {
          int64_t v = ix[b * C + j];
          double pt = (double)g[b * O + o] * W[o * C * D + j * D + d], pw = (double)g[b * O + o] * T[v * D + d];
          wt[v * D + d] += pt, mt[v * D + d] += fabs(pt);
          ww[o * C * D + j * D + d] += pw, mw[o * C * D + j * D + d] += fabs(pw);
        }
    }
  assert_int_equal(tensor_embedding_linear_grad_(dt, dw, db, dy, table, idx, w), TENSOR_OK);
  double ulp = ldexp(1.0, -23);
  for (int64_t i = 0; i < V * D; i++)   /* a row's sum: up to B*C*O terms, grouped */
    if (!(fabs(tensor_f32(dt)[i] - wt[i]) <= (B * C + O + 3) * ulp * mt[i] + 1e-30))
      fail_msg("dtable[%lld] = %.9g, want %.9g", (long long)i, tensor_f32(dt)[i], wt[i]);
  for (int64_t i = 0; i < O * C * D; i++)
    if (!(fabs(tensor_f32(dw)[i] - ww[i]) <= (B + 3) * ulp * mw[i] + 1e-30))
      fail_msg("dweight[%lld] = %.9g, want %.9g", (long long)i, tensor_f32(dw)[i], ww[i]);
  for (int64_t o = 0; o < O; o++)
    if (!(fabs(tensor_f32(db)[o] - wb[o]) <= (B + 2) * ulp * mb[o] + 1e-30))
      fail_msg("dbias[%lld] = %.9g, want %.9g", (long long)o, tensor_f32(db)[o], wb[o]);
  /* NULL gradients are not wanted: dbias alone changes only dbias */
  float before = tensor_f32(dt)[0];
  assert_int_equal(tensor_embedding_linear_grad_(NULL, NULL, db, dy, table, idx, w), TENSOR_OK);
  assert_true(tensor_f32(dt)[0] == before);
  free(wt), free(mt), free(ww), free(mw), free(ix);
  tensor_free(y);
  tensor *all[] = { table, w, bias, dy, dt, dw, db, idx };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

static void test_embedding_linear_vs_double(void **state) {
  (void)state;
  ta_mark mk = ta_mark_now();
  check_embedding_linear(114, 64, 64, 8, 256, 40, 11);   /* train-charlm's layer */
  check_embedding_linear(9, 5, 13, 3, 7, 9, 21);         /* odd sizes, every index may repeat */
  check_embedding_linear(300, 3, 5, 2, 20, 300, 31);     /* mostly distinct */
  check_embedding_linear(4, 2, 1, 1, 1, 4, 41);          /* one row */
  assert_int_equal(n_errors, 0);
  /* the same bad arguments as the separate ops refuse */
  tensor *table = tensor_randn(TS(4, 2), 1.0f, 1), *w = tensor_randn(TS(3, 6), 1.0f, 2);
  tensor *idx = tensor_from_i32((int32_t[]){ 0, 1, 4, 2, 3, 0 }, TS(2, 3));
  assert_null(tensor_embedding_linear(table, idx, w, NULL));
  assert_int_equal(last_error_status, TENSOR_ERANGE);
  assert_non_null(strstr(last_error, "index 4 at 2 out of range [0, 4)"));
  tensor *w2 = tensor_randn(TS(3, 5), 1.0f, 3);
  assert_null(tensor_embedding_linear(table, idx, w2, NULL));
  assert_int_equal(last_error_status, TENSOR_ESHAPE);
  assert_int_equal(n_errors, 2);
  tensor_free(table), tensor_free(w), tensor_free(idx), tensor_free(w2);
  TA_ASSERT_NO_LEAKS_SINCE(mk);
}

static void test_in_place_loops_same_bits(void **state) {
  (void)state;
  ta_mark mk = ta_mark_now();
  tensor_scope_begin();
  enum { R = 64, C = 257 };
  tensor *x = tensor_randn(TS(R, C), 2.0f, 11), *dy = tensor_randn(TS(R, C), 1.0f, 12);
  tensor *t = tensor_tanh(x), *e = tensor_exp(x), *tg = tensor_tanh_grad(dy, t);
  tensor *ti = tensor_clone(x), *ei = tensor_clone(x), *gi = tensor_clone(dy);
  assert_int_equal(tensor_tanh_(ti), TENSOR_OK);
  assert_int_equal(tensor_exp_(ei), TENSOR_OK);
  assert_int_equal(tensor_tanh_grad_out(gi, gi, t), TENSOR_OK);   /* out is dy: in place */
  assert_memory_equal(tensor_f32(ti), tensor_f32(t), sizeof(float) * R * C);
  assert_memory_equal(tensor_f32(ei), tensor_f32(e), sizeof(float) * R * C);
  assert_memory_equal(tensor_f32(gi), tensor_f32(tg), sizeof(float) * R * C);
  /* and they are the functions: tanh within 2e-7 relative of libm's double */
  for (int i = 0; i < R * C; i++) {
    double want = tanh((double)tensor_f32(x)[i]);
    if (!(fabs(tensor_f32(ti)[i] - want) <= 4e-7 * fabs(want) + 1e-30)) fail_msg("tanh_ [%d]", i);
  }
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(mk);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_gemm_small_vs_double, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_gemm_small_serves, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_linear_layer_calls, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_embedding_linear_vs_double, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_in_place_loops_same_bits, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
