/* test_tensor_ops.c - op values against references computed with numpy and
 * torch (refs.h, made by make_refs.py), within 1e-5 relative: elementwise
 * with broadcasting, scalar, out= and in-place forms, reductions, matmul
 * (transposed views with no copy, batched), conv2d and its backward
 * products, pooling, softmax, cross-entropy, embedding; 1,000 cross-entropy
 * evaluations leave nothing live and keep live bytes flat. */
#include "harness.h"
#include "tensor_test.h"
#include "refs.h"

#include <stdlib.h>

#define F32(arr, ...) tensor_from_f32(arr, TS(__VA_ARGS__))

static void test_elementwise(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *a = F32(A_2x3, 2, 3), *b = F32(B_3, 3), *c = F32(C_2x1, 2, 1), *d = F32(D_1x3, 1, 3),
         *p = F32(P_2x3, 2, 3);
  expect_close(tensor_add(a, b), add_A_B3, 6);
  tensor *s = tensor_sub(c, d);                      /* [2,1] - [1,3] -> [2,3] */
  expect_shape(s, 2, 3);
  expect_close(s, sub_C21_D13, 6);
  expect_close(tensor_mul(a, b), mul_A_B3, 6);
  expect_close(tensor_div(a, p), div_A_P, 6);
  expect_close(tensor_neg(a), neg_A, 6);
  expect_close(tensor_exp(a), exp_A, 6);
  expect_close(tensor_log(p), log_P, 6);
  expect_close(tensor_tanh(a), tanh_A, 6);
  expect_close(tensor_relu(a), relu_A, 6);
  expect_close(tensor_sigmoid(a), sigmoid_A, 6);
  expect_close(tensor_add_scalar(a, 0.25f), add_scalar_A, 6);
  expect_close(tensor_sub_scalar(a, 1.5f), sub_scalar_A, 6);
  expect_close(tensor_mul_scalar(a, -2.0f), mul_scalar_A, 6);
  expect_close(tensor_div_scalar(a, 4.0f), div_scalar_A, 6);
  /* on strided views: b broadcast down a transposed a */
  tensor *at = tensor_transpose(tensor_transpose(a, 0, 1), 0, 1);
  expect_close(tensor_add(at, b), add_A_B3, 6);
  tensor *bt = tensor_transpose(tensor_unsqueeze(b, 1), 0, 1);   /* [1,3] with odd strides */
  expect_close(tensor_mul(a, bt), mul_A_B3, 6);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_out_and_in_place(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *a = F32(A_2x3, 2, 3), *b = F32(B_3, 3), *p = F32(P_2x3, 2, 3);
  tensor *out = tensor_empty(TENSOR_F32, TS(2, 3));
  ta_mark m2 = ta_mark_now();
  assert_int_equal(tensor_add_out(out, a, b), TENSOR_OK);
  expect_close(out, add_A_B3, 6);
  assert_int_equal(tensor_axpby_out(out, a, 0.9f, p, -0.1f), TENSOR_OK);
  expect_close(out, axpby_A_P, 6);
  assert_int_equal(tensor_sigmoid_out(out, a), TENSOR_OK);
  expect_close(out, sigmoid_A, 6);
  /* into a transposed view of a [3,2] buffer */
  tensor *buf = tensor_zeros(TENSOR_F32, TS(3, 2)), *bv = tensor_transpose(buf, 0, 1);
  ta_mark m3 = ta_mark_now();
  assert_int_equal(tensor_mul_out(bv, a, b), TENSOR_OK);
  expect_close(bv, mul_A_B3, 6);
  TA_ASSERT_ALLOCS_SINCE(m3, TA_ANY, 0);             /* out= forms allocate nothing */
  tensor *x = tensor_clone(a);
  m3 = ta_mark_now();
  assert_int_equal(tensor_add_(x, b), TENSOR_OK);
  expect_close(x, add_A_B3, 6);
  assert_int_equal(tensor_sub_(x, b), TENSOR_OK);
  assert_int_equal(tensor_mul_(x, b), TENSOR_OK);
  expect_close(x, mul_A_B3, 6);
  assert_int_equal(tensor_div_(x, b), TENSOR_OK);
  assert_int_equal(tensor_add_scalar_(x, 0.25f), TENSOR_OK);
  expect_close(x, add_scalar_A, 6);
  assert_int_equal(tensor_copy_(x, a), TENSOR_OK);
  assert_int_equal(tensor_mul_scalar_(x, -2.0f), TENSOR_OK);
  expect_close(x, mul_scalar_A, 6);
  assert_int_equal(tensor_copy_(x, a), TENSOR_OK);
  assert_int_equal(tensor_relu_(x), TENSOR_OK);
  expect_close(x, relu_A, 6);
  assert_int_equal(tensor_copy_(x, a), TENSOR_OK);
  assert_int_equal(tensor_tanh_(x), TENSOR_OK);
  expect_close(x, tanh_A, 6);
  assert_int_equal(tensor_copy_(x, a), TENSOR_OK);
  assert_int_equal(tensor_exp_(x), TENSOR_OK);
  expect_close(x, exp_A, 6);
  assert_int_equal(tensor_copy_(x, a), TENSOR_OK);
  assert_int_equal(tensor_sigmoid_(x), TENSOR_OK);
  expect_close(x, sigmoid_A, 6);
  assert_int_equal(tensor_copy_(x, b), TENSOR_OK);   /* broadcast copy */
  expect_close(tensor_select(x, 0, 1), B_3, 3);
  assert_int_equal(tensor_fill_(x, 1.5f), TENSOR_OK);
  for (int i = 0; i < 6; i++) assert_true(tensor_f32(x)[i] == 1.5f);
  TA_ASSERT_ALLOCS_SINCE(m3, T_STORAGE, 0);
  (void)m2;
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_reductions(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *r = F32(R_2x3x4, 2, 3, 4);
  tensor *s = tensor_sum(r, TENSOR_ALL, 0);
  expect_scalar_shape(s);
  expect_close(s, sum_R_all, 1);
  expect_close(tensor_sum(r, 0, 0), sum_R_ax0, 12);
  tensor *s1 = tensor_sum(r, 1, 1);
  expect_shape(s1, 2, 1, 4);
  expect_close(s1, sum_R_ax1, 8);
  expect_close(tensor_sum(r, -1, 0), sum_R_ax2, 6);
  expect_close(tensor_mean(r, 1, 0), mean_R_ax1, 8);
  expect_close(tensor_max(r, 2, 0), max_R_ax2, 6);
  expect_close(tensor_max(r, 0, 0), max_R_ax0, 12);
  expect_ints(tensor_argmax(r, 1, 0), argmax_R_ax1, 8);
  expect_ints(tensor_argmax(r, 2, 0), argmax_R_ax2, 6);
  /* sum_to: the gradient of broadcast operands */
  tensor *st = tensor_sum_to(r, TS(3, 4));
  expect_shape(st, 3, 4);
  expect_close(st, sum_R_ax0, 12);
  tensor *st2 = tensor_sum_to(r, TS(2, 1, 4));
  expect_shape(st2, 2, 1, 4);
  expect_close(st2, sum_R_ax1, 8);
  tensor *st3 = tensor_sum_to(r, TS(1));
  expect_close(st3, sum_R_all, 1);
  expect_close(tensor_sum_to(r, TS(2, 3, 4)), R_2x3x4, 24);
  assert_null(tensor_sum_to(r, TS(3, 2)));
  assert_string_equal(last_error, "tensor_sum_to: f32[2,3,4] does not broadcast from f32[3,2]");
  n_errors--;
  /* on a permuted view: sum over axis 0 of r^T(2,0,1) is sum_R_ax2 */
  tensor *rp = tensor_permute(r, (int[]){ 2, 0, 1 });
  expect_close(tensor_sum(rp, 0, 0), sum_R_ax2, 6);
  /* sum_add_: acc += the sum, the same bits as tensor_add_ of tensor_sum,
   * and nothing allocated */
  tensor *acc = tensor_clone(tensor_sum(r, 1, 0)), *want = tensor_clone(acc);
  assert_int_equal(tensor_add_(want, tensor_sum(r, 1, 0)), TENSOR_OK);
  ta_mark ms = ta_mark_now();
  assert_int_equal(tensor_sum_add_(acc, r, 1), TENSOR_OK);
  TA_ASSERT_ALLOCS_SINCE(ms, TA_ANY, 0);
  assert_memory_equal(acc->data, want->data, 8 * sizeof(float));
  float twice[6];
  for (int i = 0; i < 6; i++) twice[i] = 2 * sum_R_ax2[i];
  tensor *acc0 = tensor_zeros(TENSOR_F32, TS(2, 3));
  assert_int_equal(tensor_sum_add_(acc0, rp, 0), TENSOR_OK);   /* a permuted view: summed through a copy */
  assert_int_equal(tensor_sum_add_(acc0, rp, 0), TENSOR_OK);
  expect_close(acc0, twice, 6);
  tensor *acc2 = tensor_zeros(TENSOR_F32, TS(2, 3));
  assert_int_equal(tensor_sum_add_(acc2, r, 2), TENSOR_OK);
  assert_int_equal(tensor_sum_add_(acc2, r, -1), TENSOR_OK);
  expect_close(acc2, twice, 6);
  assert_int_equal(tensor_sum_add_(acc2, r, 0), TENSOR_ESHAPE);   /* [3,4] is not [2,3] */
  assert_string_equal(last_error, "tensor_sum_add_: acc f32[2,3] is not a contiguous sum of f32[2,3,4] over axis 0");
  n_errors--;
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_matmul(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *m1 = F32(M1_3x4, 3, 4), *m2 = F32(M2_4x2, 4, 2), *mt = F32(MT_4x3, 4, 3), *nt = F32(NT_2x4, 2, 4);
  tensor *y = tensor_matmul(m1, m2);
  expect_shape(y, 3, 2);
  expect_close(y, mm_M1_M2, 6);
  /* transposed views go to sgemm as they are: only the result is allocated */
  tensor *mtt = tensor_transpose(mt, 0, 1), *ntt = tensor_transpose(nt, 0, 1);
  ta_mark m2k = ta_mark_now();
  expect_close(tensor_matmul(mtt, m2), mm_MTt_M2, 6);
  expect_close(tensor_matmul(m1, ntt), mm_M1_NTt, 6);
  TA_ASSERT_ALLOCS_SINCE(m2k, T_STORAGE, 2);
  /* a view with no unit stride is copied */
  tensor *every2 = tensor_slice(tensor_reshape(tensor_arange(16), TS(4, 4)), 1, 0, 4, 2);   /* [4,2], strides 4,2 */
  m2k = ta_mark_now();
  tensor *y2 = tensor_matmul(m1, every2);
  TA_ASSERT_ALLOCS_SINCE(m2k, T_STORAGE, 2);         /* the copy and the result */
  assert_true(tensor_get(y2, (int64_t[]){ 0, 1 }) ==
              M1_3x4[0] * 2 + M1_3x4[1] * 6 + M1_3x4[2] * 10 + M1_3x4[3] * 14);
  /* batched, and batched over a shared right side */
  tensor *ba = F32(BA_2x3x4, 2, 3, 4), *bb = F32(BB_2x4x2, 2, 4, 2);
  tensor *by = tensor_matmul(ba, bb);
  expect_shape(by, 2, 3, 2);
  expect_close(by, bmm_BA_BB, 12);
  expect_close(tensor_matmul(ba, m2), bmm_BA_M2, 12);
  /* a batch of transposed views */
  tensor *bat = tensor_contiguous(tensor_transpose(ba, 1, 2));   /* [2,4,3] contiguous */
  expect_close(tensor_matmul(tensor_transpose(bat, 1, 2), bb), bmm_BA_BB, 12);
  /* matmul_t: the transposes as flags, the same bits as the transposed
   * views, only the result allocated */
  tensor *y3 = tensor_matmul(mtt, m2), *y4 = tensor_matmul(m1, ntt);
  m2k = ta_mark_now();
  tensor *y3t = tensor_matmul_t(mt, 1, m2, 0), *y4t = tensor_matmul_t(m1, 0, nt, 1);
  TA_ASSERT_ALLOCS_SINCE(m2k, T_STORAGE, 2);
  TA_ASSERT_ALLOCS_SINCE(m2k, T_HEADER, 2);
  expect_shape(y3t, 3, 2);
  assert_memory_equal(y3t->data, y3->data, 6 * sizeof(float));
  assert_memory_equal(y4t->data, y4->data, 6 * sizeof(float));
  tensor *ntcv = tensor_transpose(tensor_contiguous(ntt), 0, 1);   /* [2,4], strides 1,2 */
  expect_close(tensor_matmul_t(m1, 0, ntcv, 1), mm_M1_NTt, 6);      /* a view transposed back */
  tensor *g = tensor_zeros(TENSOR_F32, TS(4, 2));          /* [4,3] @ [3,2] */
  m2k = ta_mark_now();
  assert_int_equal(tensor_gemm_t_out(g, m1, 1, y, 0, 1.0f, 1.0f), TENSOR_OK);   /* m1^T @ y */
  TA_ASSERT_ALLOCS_SINCE(m2k, TA_ANY, 0);
  tensor *gv = tensor_matmul(tensor_transpose(m1, 0, 1), y);
  assert_memory_equal(g->data, gv->data, 8 * sizeof(float));
  assert_null(tensor_matmul_t(m1, 1, m2, 0));                 /* [4,3] @ [4,2] */
  assert_string_equal(last_error, "tensor_matmul: shapes f32[4,3] and f32[4,2] do not multiply");
  n_errors--;
  /* gemm_out accumulates: out = 1*a@b + 1*out */
  tensor *acc = tensor_matmul(m1, m2);
  assert_int_equal(tensor_gemm_out(acc, m1, m2, 1.0f, 1.0f), TENSOR_OK);
  float twice[6];
  for (int i = 0; i < 6; i++) twice[i] = 2 * mm_M1_M2[i];
  expect_close(acc, twice, 6);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* The batch of 2 images is split over the threads: once on one, once on two. */
static void test_conv2d(void **state) {
  (void)state;
  for (int threads = 1; threads <= 2; threads++) {
  tensor_set_threads(threads);
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *x = F32(X_2x2x5x5, 2, 2, 5, 5), *w = F32(W_3x2x3x3, 3, 2, 3, 3), *b = F32(Bc_3, 3);
  tensor *y = tensor_conv2d(x, w, b, 1, 0);
  expect_shape(y, 2, 3, 3, 3);
  expect_close(y, conv_s1p0, 54);
  tensor *y2 = tensor_conv2d(x, w, b, 2, 1);
  expect_shape(y2, 2, 3, 3, 3);
  expect_close(y2, conv_s2p1, 54);
  /* backward products */
  tensor *dy = F32(dy_s1p0, 2, 3, 3, 3), *dy2 = F32(dy_s2p1, 2, 3, 3, 3);
  expect_close(tensor_conv2d_grad_input(dy, w, TS(2, 2, 5, 5), 1, 0), dx_s1p0, 100);
  expect_close(tensor_conv2d_grad_weight(dy, x, TS(3, 2, 3, 3), 1, 0), dw_s1p0, 54);
  expect_close(tensor_conv2d_grad_bias(dy), db_s1p0, 3);
  expect_close(tensor_conv2d_grad_input(dy2, w, TS(2, 2, 5, 5), 2, 1), dx_s2p1, 100);
  expect_close(tensor_conv2d_grad_weight(dy2, x, TS(3, 2, 3, 3), 2, 1), dw_s2p1, 54);
  expect_close(tensor_conv2d_grad_bias(dy2), db_s2p1, 3);
  /* no bias: the same less the bias */
  tensor *y0 = tensor_conv2d(x, w, NULL, 1, 0);
  float want[54];
  for (int i = 0; i < 54; i++) want[i] = conv_s1p0[i] - Bc_3[(i / 9) % 3];
  expect_close(y0, want, 54);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
  }
  tensor_set_threads(1);
}

/* Odd geometry (rectangular kernel and image, stride 2, padding 2, 3 images
 * on 2 threads) against direct loops in double. */
static void test_conv2d_direct_loops(void **state) {
  (void)state;
  enum { N = 3, C = 2, H = 9, W = 7, O = 4, KH = 3, KW = 2, S = 2, PD = 2 };
  enum { OH = (H + 2 * PD - KH) / S + 1, OW = (W + 2 * PD - KW) / S + 1 };
  ta_mark m = ta_mark_now();
  tensor_set_threads(2);
  tensor_scope_begin();
  tensor *x = tensor_randn(TS(N, C, H, W), 1.0f, 11), *w = tensor_randn(TS(O, C, KH, KW), 0.5f, 12);
  tensor *b = tensor_randn(TS(O), 1.0f, 13), *dy = tensor_randn(TS(N, O, OH, OW), 1.0f, 14);
  static double y[N][O][OH][OW], dx[N][C][H][W], dw[O][C][KH][KW], db[O];
  memset(dx, 0, sizeof dx);
  memset(dw, 0, sizeof dw);
  memset(db, 0, sizeof db);
  const float *xp = x->data, *wp = w->data, *bp = b->data, *gp = dy->data;
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double acc = bp[o], g = gp[((n * O + o) * OH + oh) * OW + ow];
          db[o] += g;
          for (int c = 0; c < C; c++)
            for (int kh = 0; kh < KH; kh++)
              for (int kw = 0; kw < KW; kw++) {
                int ih = oh * S - PD + kh, iw = ow * S - PD + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                double xv = xp[((n * C + c) * H + ih) * W + iw], wv = wp[((o * C + c) * KH + kh) * KW + kw];
                acc += xv * wv;
                dx[n][c][ih][iw] += wv * g;
                dw[o][c][kh][kw] += xv * g;
              }
          y[n][o][oh][ow] = acc;
        }
  tensor *gy = tensor_conv2d(x, w, b, S, PD);
  tensor *gx = tensor_conv2d_grad_input(dy, w, TS(N, C, H, W), S, PD);
  tensor *gw = tensor_conv2d_grad_weight(dy, x, TS(O, C, KH, KW), S, PD);
  tensor *gb = tensor_conv2d_grad_bias(dy);
  expect_shape(gy, N, O, OH, OW);
  struct { const tensor *t; const double *want; int n; } cmp[] = {
    { gy, &y[0][0][0][0], N * O * OH * OW }, { gx, &dx[0][0][0][0], N * C * H * W },
    { gw, &dw[0][0][0][0], O * C * KH * KW }, { gb, db, O },
  };
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < cmp[k].n; i++)
      if (fabs(tensor_f32(cmp[k].t)[i] - cmp[k].want[i]) > 1e-5 * (fabs(cmp[k].want[i]) + 1))
        fail_msg("output %d, element %d: %.9g, want %.9g", k, i, tensor_f32(cmp[k].t)[i], cmp[k].want[i]);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  tensor_set_threads(1);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_pooling(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *q = F32(Q_1x2x4x5, 1, 2, 4, 5), *idx;
  tensor *mp = tensor_max_pool2d(q, 2, 2, &idx);
  expect_shape(mp, 1, 2, 2, 2);
  expect_close(mp, maxpool_Q, 8);
  expect_ints(idx, maxpool_Q_idx, 8);
  tensor *ap = tensor_avg_pool2d(q, 2, 1);
  expect_shape(ap, 1, 2, 3, 4);
  expect_close(ap, avgpool_Q, 24);
  /* max pool backward: the gradient lands on the maxima */
  tensor *g = tensor_max_pool2d_grad(tensor_full(TS(1, 2, 2, 2), 1.0f), idx, TS(1, 2, 4, 5));
  float total = 0;
  for (int i = 0; i < 40; i++) total += tensor_f32(g)[i];
  assert_true(total == 8.0f);
  for (int i = 0; i < 8; i++) assert_true(tensor_f32(g)[(i / 4) * 20 + maxpool_Q_idx[i]] == 1.0f);
  tensor *ga = tensor_avg_pool2d_grad(tensor_full(TS(1, 2, 3, 4), 1.0f), 2, 1, TS(1, 2, 4, 5));
  assert_true(tensor_get(ga, (int64_t[]){ 0, 0, 0, 0 }) == 0.25f);
  assert_true(tensor_get(ga, (int64_t[]){ 0, 1, 1, 1 }) == 1.0f);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_softmax_ce_embedding(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_scope_begin();
  tensor *l = F32(L_3x4, 3, 4), *y = tensor_from_i32(L_labels, TS(3));
  expect_close(tensor_softmax(l, -1), softmax_L, 12);
  expect_close(tensor_log_softmax(l, 1), log_softmax_L, 12);
  expect_close(tensor_softmax(l, 0), softmax_L_ax0, 12);
  expect_close(tensor_softmax(tensor_transpose(tensor_transpose(l, 0, 1), 0, 1), 1), softmax_L, 12);
  tensor *ce = tensor_cross_entropy(l, y);
  expect_scalar_shape(ce);
  expect_close(ce, ce_L, 1);
  expect_close(tensor_cross_entropy_grad(l, y), ce_grad_L, 12);
  tensor *e = F32(E_5x3, 5, 3), *ei = tensor_from_i32(E_idx, TS(2, 2));
  tensor *emb = tensor_embedding(e, ei);
  expect_shape(emb, 2, 2, 3);
  expect_close(emb, emb_E, 12);
  assert_int_equal(n_errors, 0);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void test_cross_entropy_1000(void **state) {
  (void)state;
  tensor *logits = tensor_randn(TS(64, 10), 1.0f, 3);
  tensor *labels = tensor_zeros(TENSOR_I32, TS(64));
  for (int i = 0; i < 64; i++) tensor_i32(labels)[i] = (i * 7) % 10;
  tensor *first = tensor_cross_entropy(logits, labels);
  float want = tensor_item(first);
  tensor_free(first);
  ta_mark m = ta_mark_now();
  uint64_t live_after_first = 0;
  for (int i = 0; i < 1000; i++) {
    tensor *ce = tensor_cross_entropy(logits, labels);
    if (tensor_item(ce) != want) fail_msg("evaluation %d differs", i);
    ta_counts c = ta_since(m, TA_ANY);
    if (i == 0) live_after_first = c.live_bytes;
    else if (c.live_bytes != live_after_first) fail_msg("evaluation %d: live bytes %llu, first %llu", i,
                                                        (unsigned long long)c.live_bytes,
                                                        (unsigned long long)live_after_first);
    tensor_free(ce);
  }
  assert_int_equal(live_after_first, (64 + 4) + sizeof(tensor));   /* one scalar: storage and header */
  TA_ASSERT_NO_LEAKS_SINCE(m);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 1000);
  /* contiguous inputs are read in place: no copy, not even a view header */
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 1000);
  TA_ASSERT_ALLOCS_SINCE(m, TA_ANY, 2000);
  tensor_free(logits);
  tensor_free(labels);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_elementwise, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_out_and_in_place, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_reductions, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_matmul, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_conv2d, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_conv2d_direct_loops, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_pooling, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_softmax_ce_embedding, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_cross_entropy_1000, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
