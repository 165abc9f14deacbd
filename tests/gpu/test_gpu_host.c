/* test_gpu_host.c - the host backend against plain reference loops, op by
 * op: sgemm in its four transposes, elementwise ops and their backward
 * products, reductions, conv2d forward and both backward products (direct
 * loops, stride and padding), max and average pooling, softmax and
 * cross-entropy, embedding, SGD and Adam; its device memory (a range of its
 * own, committed on alloc, PROT_NONE after free, capacity exact); streams
 * and events; and its argument checks. */
#include "harness.h"
#include "gpu_test.h"

#include <setjmp.h>
#include <signal.h>

#define N 1000

static float ha[N], hb[N], hc[N], want[N];

static void fill_rand(float *x, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) x[i] = rnd(&seed);
}

/* ---- device memory ------------------------------------------------------------ */

static void test_memory_is_its_own_range(void **state) {
  (void)state;
  void *a = NULL, *b = NULL;
  assert_int_equal(B->alloc(&a, 1000), GPU_OK);
  assert_int_equal(B->alloc(&b, 5000), GPU_OK);
  assert_true(((uintptr_t)a & 255) == 0 && ((uintptr_t)b & 255) == 0);
  /* Never a block of the ledger's heap. */
  assert_int_equal(ta_block_size(a), 0);
  assert_int_equal(ta_usable_size(a), 0);
  size_t free0, total;
  assert_int_equal(B->mem_get_info(&free0, &total), GPU_OK);
  assert_int_equal(total, GPU_HOST_DEFAULT_MEM);
  /* 1000 bytes take a page, 5000 two. */
  void *c = NULL;
  assert_int_equal(B->alloc(&c, 4096), GPU_OK);
  size_t free1;
  assert_int_equal(B->mem_get_info(&free1, NULL), GPU_OK);
  assert_int_equal(free0 - free1, 4096);
  assert_int_equal(B->free(c), GPU_OK);
  assert_int_equal(B->mem_get_info(&free1, NULL), GPU_OK);
  assert_int_equal(free1, free0);
  /* A freed range is reused (first fit). */
  assert_int_equal(B->alloc(&c, 4096), GPU_OK);
  void *c2 = c;
  assert_int_equal(B->free(c), GPU_OK);
  assert_int_equal(B->alloc(&c, 100), GPU_OK);
  assert_ptr_equal(c, c2);
  assert_int_equal(B->free(c), GPU_OK);
  /* A double free, a host pointer, an interior pointer: GPU_EINVAL. */
  assert_int_equal(B->free(c), GPU_EINVAL);
  assert_non_null(strstr(B->last_error(), "is not a live device allocation"));
  assert_int_equal(B->free(ha), GPU_EINVAL);
  assert_int_equal(B->free((char *)b + 4096), GPU_EINVAL);
  assert_int_equal(B->free(a), GPU_OK);
  assert_int_equal(B->free(b), GPU_OK);
  assert_int_equal(B->mem_get_info(&free1, NULL), GPU_OK);
  assert_int_equal(free1, total);
}

static sigjmp_buf fault_jmp;
static void on_segv(int sig) {
  (void)sig;
  siglongjmp(fault_jmp, 1);
}

/* A freed device block is PROT_NONE again: touching it faults. */
static void test_freed_memory_faults(void **state) {
  (void)state;
  volatile char *p = NULL;
  assert_int_equal(B->alloc((void **)&p, 4096), GPU_OK);
  p[0] = 1;
  assert_int_equal(B->free((void *)p), GPU_OK);
  struct sigaction sa = { .sa_handler = on_segv }, old;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old);
  int faulted = 0;
  if (sigsetjmp(fault_jmp, 1) == 0) p[0] = 2;
  else faulted = 1;
  sigaction(SIGSEGV, &old, NULL);
  assert_int_equal(faulted, 1);
}

static void test_copies_and_checks(void **state) {
  (void)state;
  fill_rand(ha, N, 1);
  float *d = up(ha, N), *e = dnew(N);
  assert_int_equal(B->memcpy_d2d(e, d, N * 4, NULL), GPU_OK);
  assert_memory_equal(down(e, N), ha, N * 4);
  assert_int_equal(B->memset(e, 0, N * 4, NULL), GPU_OK);
  const float *z = down(e, N);
  for (int i = 0; i < N; i++) assert_true(z[i] == 0.0f);
  /* A host pointer where a device one goes, or a range past the block. */
  assert_int_equal(B->memcpy_h2d(hb, ha, 16, NULL), GPU_EINVAL);
  assert_non_null(strstr(B->last_error(), "is not device memory"));
  assert_int_equal(B->memcpy_d2h(hb, ha, 16, NULL), GPU_EINVAL);
  assert_int_equal(B->memcpy_h2d(d, ha, 4097 * 4, NULL), GPU_EINVAL);   /* past its page-rounded end */
  assert_int_equal(B->add(hc, ha, hb, 4, NULL), GPU_EINVAL);
  assert_non_null(strstr(B->last_error(), "add: out"));
  assert_int_equal(B->add(e, d, d, -1, NULL), GPU_EINVAL);
  dfree(d);
  dfree(e);
}

static void test_streams_and_events(void **state) {
  (void)state;
  gpu_stream s;
  gpu_event e;
  assert_int_equal(B->stream_create(&s), GPU_OK);
  assert_int_equal(B->event_create(&e), GPU_OK);
  assert_int_equal(B->event_query(e), GPU_OK);   /* never recorded: complete */
  fill_rand(ha, 64, 2);
  float *d = up(ha, 64);
  assert_int_equal(B->scale(d, d, 2.0f, 64, s), GPU_OK);
  assert_int_equal(B->event_record(e, s), GPU_OK);
  assert_int_equal(B->event_query(e), GPU_OK);   /* synchronous: done at once */
  assert_int_equal(B->event_synchronize(e), GPU_OK);
  assert_int_equal(B->stream_wait_event(NULL, e), GPU_OK);
  assert_int_equal(B->stream_synchronize(s), GPU_OK);
  assert_int_equal(B->device_synchronize(), GPU_OK);
  const float *r = down(d, 64);
  for (int i = 0; i < 64; i++) assert_true(r[i] == ha[i] * 2.0f);
  assert_int_equal(B->stream_destroy(NULL), GPU_EINVAL);
  assert_int_equal(B->event_destroy(e), GPU_OK);
  assert_int_equal(B->stream_destroy(s), GPU_OK);
  dfree(d);
}

/* ---- sgemm ---------------------------------------------------------------------- */

static void test_sgemm_transposes(void **state) {
  (void)state;
  enum { M = 7, K = 5, NN = 9 };
  float A[M * K], Bm[K * NN], C0[M * NN];
  fill_rand(A, M * K, 3);
  fill_rand(Bm, K * NN, 4);
  fill_rand(C0, M * NN, 5);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* Store A as [M, K] or [K, M], B as [K, N] or [N, K]. */
      float As[M * K], Bs[K * NN];
      for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) As[ta ? k * M + i : i * K + k] = A[i * K + k];
      for (int k = 0; k < K; k++)
        for (int j = 0; j < NN; j++) Bs[tb ? j * K + k : k * NN + j] = Bm[k * NN + j];
      float *da = up(As, M * K), *db = up(Bs, K * NN), *dc = up(C0, M * NN);
      assert_int_equal(B->sgemm(ta, tb, M, NN, K, 0.5f, da, ta ? M : K, db, tb ? K : NN, 2.0f, dc, NN, NULL), GPU_OK);
      float ref[M * NN];
      for (int i = 0; i < M; i++)
        for (int j = 0; j < NN; j++) {
          double acc = 0;
          for (int k = 0; k < K; k++) acc += (double)A[i * K + k] * Bm[k * NN + j];
          ref[i * NN + j] = (float)(0.5 * acc + 2.0 * C0[i * NN + j]);
        }
      expect_near(down(dc, M * NN), ref, M * NN, 1e-5);
      dfree(da);
      dfree(db);
      dfree(dc);
    }
}

/* ---- elementwise ------------------------------------------------------------------ */

typedef gpu_status (*binary_fn)(float *, const float *, const float *, int64_t, gpu_stream);
typedef gpu_status (*unary_fn)(float *, const float *, int64_t, gpu_stream);

static void test_elementwise(void **state) {
  (void)state;
  fill_rand(ha, N, 6);
  fill_rand(hb, N, 7);
  for (int i = 0; i < N; i++) hb[i] += hb[i] >= 0 ? 0.5f : -0.5f;   /* no division by ~0 */
  float *a = up(ha, N), *b = up(hb, N), *o = dnew(N);
  struct { binary_fn fn; int op; } bins[] = { { B->add, 0 }, { B->sub, 1 }, { B->mul, 2 }, { B->div, 3 } };
  for (size_t k = 0; k < 4; k++) {
    assert_int_equal(bins[k].fn(o, a, b, N, NULL), GPU_OK);
    for (int i = 0; i < N; i++)
      want[i] = bins[k].op == 0 ? ha[i] + hb[i] : bins[k].op == 1 ? ha[i] - hb[i] : bins[k].op == 2 ? ha[i] * hb[i] : ha[i] / hb[i];
    expect_near(down(o, N), want, N, 0);
  }
  assert_int_equal(B->axpby(o, 2.0f, a, -3.0f, b, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = 2.0f * ha[i] + -3.0f * hb[i];
  expect_near(down(o, N), want, N, 0);
  assert_int_equal(B->scale(o, a, 1.5f, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = ha[i] * 1.5f;
  expect_near(down(o, N), want, N, 0);
  assert_int_equal(B->add_scalar(o, a, -0.25f, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = ha[i] - 0.25f;
  expect_near(down(o, N), want, N, 0);
  unary_fn un[] = { B->relu, B->tanh, B->sigmoid, B->exp };
  for (int k = 0; k < 4; k++) {
    assert_int_equal(un[k](o, a, N, NULL), GPU_OK);
    for (int i = 0; i < N; i++) {
      double x = ha[i];
      want[i] = (float)(k == 0 ? (x > 0 ? x : 0) : k == 1 ? tanh(x) : k == 2 ? 1 / (1 + exp(-x)) : exp(x));
    }
    expect_near(down(o, N), want, N, 1e-6);
  }
  float hab[N];
  for (int i = 0; i < N; i++) hab[i] = fabsf(hb[i]);
  float *ab = up(hab, N);
  assert_int_equal(B->log(o, ab, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = (float)log(hab[i]);
  expect_near(down(o, N), want, N, 1e-6);
  /* In place. */
  assert_int_equal(B->relu(a, a, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = ha[i] > 0 ? ha[i] : 0;
  expect_near(down(a, N), want, N, 0);
  dfree(a);
  dfree(b);
  dfree(o);
  dfree(ab);
}

static void test_activation_backward(void **state) {
  (void)state;
  fill_rand(ha, N, 8);   /* dy */
  fill_rand(hb, N, 9);   /* y */
  for (int i = 0; i < 10; i++) hb[i] = 0.0f;   /* relu's boundary: y == 0 passes nothing */
  float *dy = up(ha, N), *y = up(hb, N), *dx = dnew(N);
  assert_int_equal(B->relu_bwd(dx, dy, y, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = hb[i] > 0 ? ha[i] : 0;
  expect_near(down(dx, N), want, N, 0);
  assert_int_equal(B->tanh_bwd(dx, dy, y, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = ha[i] * (1 - hb[i] * hb[i]);
  expect_near(down(dx, N), want, N, 1e-6);
  assert_int_equal(B->sigmoid_bwd(dx, dy, y, N, NULL), GPU_OK);
  for (int i = 0; i < N; i++) want[i] = ha[i] * hb[i] * (1 - hb[i]);
  expect_near(down(dx, N), want, N, 1e-6);
  dfree(dy);
  dfree(y);
  dfree(dx);
}

static void test_bias_and_reductions(void **state) {
  (void)state;
  enum { R = 20, C = 30, NB = 4, CH = 5, HW = 6 };
  fill_rand(ha, R * C, 10);
  fill_rand(hb, C, 11);
  float *x = up(ha, R * C), *bias = up(hb, C), *o = dnew(R * C);
  assert_int_equal(B->bias_add_rows(o, x, bias, R, C, NULL), GPU_OK);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) want[r * C + c] = ha[r * C + c] + hb[c];
  expect_near(down(o, R * C), want, R * C, 0);
  assert_int_equal(B->bias_add_channels(o, x, bias, NB, CH, HW, NULL), GPU_OK);
  for (int i = 0; i < NB * CH * HW; i++) want[i] = ha[i] + hb[(i / HW) % CH];
  expect_near(down(o, NB * CH * HW), want, NB * CH * HW, 0);
  assert_int_equal(B->sum_all(o, x, R * C, NULL), GPU_OK);
  double t = 0;
  for (int i = 0; i < R * C; i++) t += ha[i];
  want[0] = (float)t;
  expect_near(down(o, 1), want, 1, 1e-6);
  assert_int_equal(B->sum_rows(o, x, R, C, NULL), GPU_OK);
  for (int c = 0; c < C; c++) {
    double acc = 0;
    for (int r = 0; r < R; r++) acc += ha[r * C + c];
    want[c] = (float)acc;
  }
  expect_near(down(o, C), want, C, 1e-6);
  assert_int_equal(B->sum_cols(o, x, R, C, NULL), GPU_OK);
  for (int r = 0; r < R; r++) {
    double acc = 0;
    for (int c = 0; c < C; c++) acc += ha[r * C + c];
    want[r] = (float)acc;
  }
  expect_near(down(o, R), want, R, 1e-6);
  assert_int_equal(B->sum_channels(o, x, NB, CH, HW, NULL), GPU_OK);
  for (int c = 0; c < CH; c++) {
    double acc = 0;
    for (int n = 0; n < NB; n++)
      for (int j = 0; j < HW; j++) acc += ha[(n * CH + c) * HW + j];
    want[c] = (float)acc;
  }
  expect_near(down(o, CH), want, CH, 1e-6);
  /* argmax: the first maximum on ties. */
  float row[8] = { 1, 3, 3, -1, 0, 0, 0, 0 };
  int32_t *am = (int32_t *)dnew(2);
  float *dr = up(row, 8);
  assert_int_equal(B->argmax_rows(am, dr, 2, 4, NULL), GPU_OK);
  const int32_t *ai = (const int32_t *)down((float *)am, 2);
  assert_int_equal(ai[0], 1);
  assert_int_equal(ai[1], 0);
  dfree(x);
  dfree(bias);
  dfree(o);
  dfree(am);
  dfree(dr);
}

static void test_fill_and_copy_strided(void **state) {
  (void)state;
  float *o = dnew(24);
  assert_int_equal(B->fill(o, 7.5f, 24, NULL), GPU_OK);
  for (int i = 0; i < 24; i++) want[i] = 7.5f;
  expect_near(down(o, 24), want, 24, 0);
  int32_t *oi = (int32_t *)dnew(3);
  assert_int_equal(B->fill_i32(oi, -4, 3, NULL), GPU_OK);
  const int32_t *gi = (const int32_t *)down((float *)oi, 3);
  assert_int_equal(gi[0], -4);
  assert_int_equal(gi[2], -4);
  /* The transpose of a [4, 6] matrix, then a row broadcast (stride 0). */
  for (int i = 0; i < 24; i++) ha[i] = (float)i;
  float *src = up(ha, 24);
  int64_t shape[2] = { 6, 4 }, stride[2] = { 1, 6 };
  assert_int_equal(B->copy_strided(o, src, 2, shape, stride, NULL), GPU_OK);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 4; j++) want[i * 4 + j] = ha[j * 6 + i];
  expect_near(down(o, 24), want, 24, 0);
  int64_t bshape[3] = { 2, 3, 4 }, bstride[3] = { 0, 4, 1 };
  assert_int_equal(B->copy_strided(o, src, 3, bshape, bstride, NULL), GPU_OK);
  for (int i = 0; i < 24; i++) want[i] = ha[i % 12];
  expect_near(down(o, 24), want, 24, 0);
  dfree(o);
  dfree(oi);
  dfree(src);
}

/* ---- conv2d, pooling ------------------------------------------------------------------ */

static float xin[2 * 3 * 9 * 8], wgt[4 * 3 * 3 * 3], bias4[4], yref[2 * 4 * 9 * 8], dy[2 * 4 * 9 * 8];

static void conv_case(int stride, int pad) {
  gpu_conv2d p;
  assert_int_equal(gpu_conv2d_init(&p, 2, 3, 9, 8, 4, 3, 3, stride, pad), GPU_OK);
  int64_t xn = 2 * 3 * 9 * 8, wn = 4 * 3 * 3 * 3, yn = (int64_t)2 * 4 * p.oh * p.ow;
  fill_rand(xin, xn, 20 + stride);
  fill_rand(wgt, wn, 30 + pad);
  fill_rand(bias4, 4, 40);
  fill_rand(dy, yn, 50);
  /* Direct loops. */
  for (int n = 0; n < 2; n++)
    for (int o = 0; o < 4; o++)
      for (int oy = 0; oy < p.oh; oy++)
        for (int ox = 0; ox < p.ow; ox++) {
          double acc = bias4[o];
          for (int c = 0; c < 3; c++)
            for (int i = 0; i < 3; i++)
              for (int j = 0; j < 3; j++) {
                int iy = oy * stride - pad + i, ix = ox * stride - pad + j;
                if (iy >= 0 && iy < 9 && ix >= 0 && ix < 8)
                  acc += (double)xin[((n * 3 + c) * 9 + iy) * 8 + ix] * wgt[((o * 3 + c) * 3 + i) * 3 + j];
              }
          yref[((n * 4 + o) * p.oh + oy) * p.ow + ox] = (float)acc;
        }
  float *dx_ = up(xin, xn), *dw_ = up(wgt, wn), *db_ = up(bias4, 4), *dyd = up(dy, yn), *y = dnew(yn);
  void *ws = dnew((int64_t)B->conv2d_workspace(&p) / 4);
  assert_int_equal(B->conv2d_fwd(&p, y, dx_, dw_, db_, ws, NULL), GPU_OK);
  expect_near(down(y, yn), yref, yn, 1e-5);
  /* dL/dx and dL/dw for L = sum(y * dy), by the same loops. */
  static double gx[2 * 3 * 9 * 8], gw[4 * 3 * 3 * 3];
  memset(gx, 0, sizeof gx);
  memset(gw, 0, sizeof gw);
  for (int n = 0; n < 2; n++)
    for (int o = 0; o < 4; o++)
      for (int oy = 0; oy < p.oh; oy++)
        for (int ox = 0; ox < p.ow; ox++) {
          double g = dy[((n * 4 + o) * p.oh + oy) * p.ow + ox];
          for (int c = 0; c < 3; c++)
            for (int i = 0; i < 3; i++)
              for (int j = 0; j < 3; j++) {
                int iy = oy * stride - pad + i, ix = ox * stride - pad + j;
                if (iy < 0 || iy >= 9 || ix < 0 || ix >= 8) continue;
                gx[((n * 3 + c) * 9 + iy) * 8 + ix] += g * wgt[((o * 3 + c) * 3 + i) * 3 + j];
                gw[((o * 3 + c) * 3 + i) * 3 + j] += g * xin[((n * 3 + c) * 9 + iy) * 8 + ix];
              }
        }
  float *gxd = dnew(xn), *gwd = dnew(wn);
  assert_int_equal(B->conv2d_bwd_data(&p, gxd, dyd, dw_, ws, NULL), GPU_OK);
  for (int64_t i = 0; i < xn; i++) want[i] = (float)gx[i];
  expect_near(down(gxd, xn), want, xn, 1e-5);
  assert_int_equal(B->conv2d_bwd_weight(&p, gwd, dyd, dx_, ws, NULL), GPU_OK);
  for (int64_t i = 0; i < wn; i++) want[i] = (float)gw[i];
  expect_near(down(gwd, wn), want, wn, 1e-5);
  /* A geometry that is not gpu_conv2d_init's. */
  gpu_conv2d bad = p;
  bad.oh++;
  assert_int_equal(B->conv2d_fwd(&bad, y, dx_, dw_, db_, ws, NULL), GPU_EINVAL);
  dfree(dx_);
  dfree(dw_);
  dfree(db_);
  dfree(dyd);
  dfree(y);
  dfree(ws);
  dfree(gxd);
  dfree(gwd);
}

static void test_conv2d(void **state) {
  (void)state;
  conv_case(1, 0);
  conv_case(1, 1);
  conv_case(2, 1);
  gpu_conv2d p;
  assert_int_equal(gpu_conv2d_init(&p, 64, 1, 28, 28, 6, 5, 5, 1, 2), GPU_OK);
  assert_int_equal(p.oh, 28);
  assert_int_equal(p.ow, 28);
  assert_int_equal(gpu_conv2d_init(&p, 1, 1, 2, 2, 1, 5, 5, 1, 0), GPU_EINVAL);
}

/* Images big enough that the backend goes through them in several chunks
 * (its workspace holds 8 of these at a time): the chunk edges are right. */
static void test_conv2d_chunks(void **state) {
  (void)state;
  enum { NI = 10, H = 200, W = 200, O = 4 };
  gpu_conv2d p;
  assert_int_equal(gpu_conv2d_init(&p, NI, 1, H, W, O, 3, 3, 1, 1), GPU_OK);
  size_t ws_bytes = B->conv2d_workspace(&p);
  assert_true(ws_bytes < (size_t)NI * (9 + O) * H * W * 4);   /* less than all images at once */
  static float x[NI * H * W], w[O * 9], y[NI * O * H * W], ref[NI * O * H * W], gw[O * 9];
  fill_rand(x, NI * H * W, 100);
  fill_rand(w, O * 9, 101);
  double acc_w[O * 9] = { 0 };
  for (int n = 0; n < NI; n++)
    for (int o = 0; o < O; o++)
      for (int oy = 0; oy < H; oy++)
        for (int ox = 0; ox < W; ox++) {
          double acc = 0;
          for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
              int iy = oy - 1 + i, ix = ox - 1 + j;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
              acc += (double)x[(n * H + iy) * W + ix] * w[(o * 3 + i) * 3 + j];
              acc_w[(o * 3 + i) * 3 + j] += x[(n * H + iy) * W + ix];   /* dL/dw for dy = 1 */
            }
          ref[((n * O + o) * H + oy) * W + ox] = (float)acc;
        }
  float *dx = up(x, NI * H * W), *dw = up(w, O * 9), *dy = dnew(NI * O * H * W), *dgw = dnew(O * 9);
  void *ws = dnew((int64_t)ws_bytes / 4);
  assert_int_equal(B->conv2d_fwd(&p, dy, dx, dw, NULL, ws, NULL), GPU_OK);
  assert_int_equal(B->memcpy_d2h(y, dy, sizeof y, NULL), GPU_OK);
  expect_near(y, ref, NI * O * H * W, 1e-5);
  assert_int_equal(B->fill(dy, 1.0f, NI * O * H * W, NULL), GPU_OK);
  assert_int_equal(B->conv2d_bwd_weight(&p, dgw, dy, dx, ws, NULL), GPU_OK);
  for (int i = 0; i < O * 9; i++) gw[i] = (float)acc_w[i];
  expect_near(down(dgw, O * 9), gw, O * 9, 1e-5);
  /* dL/dx for dy = 1: each input gets the weights of the windows over it. */
  float *gx = dnew(NI * H * W);
  assert_int_equal(B->conv2d_bwd_data(&p, gx, dy, dw, ws, NULL), GPU_OK);
  assert_int_equal(B->memcpy_d2h(y, gx, (size_t)NI * H * W * 4, NULL), GPU_OK);
  for (int n = 0; n < NI; n++)
    for (int iy = 0; iy < H; iy++)
      for (int ix = 0; ix < W; ix++) {
        double acc = 0;
        for (int o = 0; o < O; o++)
          for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
              int oy = iy + 1 - i, ox = ix + 1 - j;
              if (oy >= 0 && oy < H && ox >= 0 && ox < W) acc += w[(o * 3 + i) * 3 + j];
            }
        ref[(n * H + iy) * W + ix] = (float)acc;
      }
  expect_near(y, ref, NI * H * W, 1e-5);
  dfree(gx);
  dfree(dx);
  dfree(dw);
  dfree(dy);
  dfree(dgw);
  dfree(ws);
}

static void test_pooling(void **state) {
  (void)state;
  gpu_pool2d p;
  assert_int_equal(gpu_pool2d_init(&p, 2, 3, 6, 5, 2, 2), GPU_OK);
  assert_int_equal(p.oh, 3);
  assert_int_equal(p.ow, 2);
  enum { XN = 2 * 3 * 6 * 5, YN = 2 * 3 * 3 * 2 };
  fill_rand(ha, XN, 60);
  ha[0] = ha[1] = 5.0f;   /* a tie: the first index wins */
  float *x = up(ha, XN), *y = dnew(YN), *dx = dnew(XN);
  int32_t *am = (int32_t *)dnew(YN);
  assert_int_equal(B->max_pool_fwd(&p, y, am, x, NULL), GPU_OK);
  int32_t amref[YN];
  for (int q = 0; q < 6; q++)
    for (int oy = 0; oy < 3; oy++)
      for (int ox = 0; ox < 2; ox++) {
        int best = -1;
        float bv = -INFINITY;
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) {
            int at = (oy * 2 + i) * 5 + ox * 2 + j;
            if (ha[q * 30 + at] > bv) {
              bv = ha[q * 30 + at];
              best = at;
            }
          }
        want[(q * 3 + oy) * 2 + ox] = bv;
        amref[(q * 3 + oy) * 2 + ox] = best;
      }
  expect_near(down(y, YN), want, YN, 0);
  assert_memory_equal(down((float *)am, YN), amref, sizeof amref);
  assert_int_equal(amref[0], 0);
  fill_rand(hb, YN, 61);
  float *g = up(hb, YN);
  assert_int_equal(B->max_pool_bwd(&p, dx, g, am, NULL), GPU_OK);
  memset(want, 0, XN * 4);
  for (int q = 0; q < 6; q++)
    for (int i = 0; i < 6; i++) want[q * 30 + amref[q * 6 + i]] += hb[q * 6 + i];
  expect_near(down(dx, XN), want, XN, 0);
  assert_int_equal(B->avg_pool_fwd(&p, y, x, NULL), GPU_OK);
  for (int q = 0; q < 6; q++)
    for (int oy = 0; oy < 3; oy++)
      for (int ox = 0; ox < 2; ox++) {
        float acc = 0;
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) acc += ha[q * 30 + (oy * 2 + i) * 5 + ox * 2 + j];
        want[(q * 3 + oy) * 2 + ox] = acc / 4;
      }
  expect_near(down(y, YN), want, YN, 1e-6);
  assert_int_equal(B->avg_pool_bwd(&p, dx, g, NULL), GPU_OK);
  memset(want, 0, XN * 4);
  for (int q = 0; q < 6; q++)
    for (int oy = 0; oy < 3; oy++)
      for (int ox = 0; ox < 2; ox++)
        for (int i = 0; i < 2; i++)
          for (int j = 0; j < 2; j++) want[q * 30 + (oy * 2 + i) * 5 + ox * 2 + j] += hb[(q * 3 + oy) * 2 + ox] / 4;
  expect_near(down(dx, XN), want, XN, 1e-6);
  dfree(x);
  dfree(y);
  dfree(dx);
  dfree(am);
  dfree(g);
}

/* ---- softmax, cross-entropy, embedding ----------------------------------------------------- */

static void test_softmax_and_cross_entropy(void **state) {
  (void)state;
  enum { R = 8, C = 10 };
  fill_rand(ha, R * C, 70);
  for (int i = 0; i < R * C; i++) ha[i] *= 20.0f;   /* large logits: no overflow */
  int32_t lab[R] = { 0, 9, 3, 3, 5, 7, 1, 2 };
  float *x = up(ha, R * C), *pr = dnew(R * C), *loss = dnew(1), *dl = dnew(R * C);
  int32_t *dlab = up_i(lab, R);
  double probs[R * C], total = 0;
  for (int r = 0; r < R; r++) {
    double mx = -INFINITY, sum = 0;
    for (int c = 0; c < C; c++) mx = fmax(mx, ha[r * C + c]);
    for (int c = 0; c < C; c++) sum += exp(ha[r * C + c] - mx);
    for (int c = 0; c < C; c++) probs[r * C + c] = exp(ha[r * C + c] - mx) / sum;
    total += log(sum) + mx - ha[r * C + lab[r]];
  }
  assert_int_equal(B->softmax_rows(pr, x, R, C, NULL), GPU_OK);
  for (int i = 0; i < R * C; i++) want[i] = (float)probs[i];
  expect_near(down(pr, R * C), want, R * C, 1e-5);
  assert_int_equal(B->softmax_xent_fwd(pr, loss, x, dlab, R, C, NULL), GPU_OK);
  expect_near(down(pr, R * C), want, R * C, 1e-5);
  want[0] = (float)(total / R);
  expect_near(down(loss, 1), want, 1, 1e-5);
  assert_int_equal(B->softmax_xent_bwd(dl, pr, dlab, 2.0f, R, C, NULL), GPU_OK);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) want[r * C + c] = (float)((probs[r * C + c] - (c == lab[r])) * 2.0 / R);
  expect_near(down(dl, R * C), want, R * C, 1e-5);
  /* softmax_bwd: dx = y (dy - <dy, y>). */
  fill_rand(hb, R * C, 71);
  float *g = up(hb, R * C);
  assert_int_equal(B->softmax_bwd(dl, g, pr, R, C, NULL), GPU_OK);
  for (int r = 0; r < R; r++) {
    double dot = 0;
    for (int c = 0; c < C; c++) dot += hb[r * C + c] * probs[r * C + c];
    for (int c = 0; c < C; c++) want[r * C + c] = (float)(probs[r * C + c] * (hb[r * C + c] - dot));
  }
  expect_near(down(dl, R * C), want, R * C, 1e-5);
  assert_int_equal(B->softmax_bwd(g, g, pr, R, C, NULL), GPU_EINVAL);
  /* A label out of range: the loss is NaN. */
  lab[2] = 10;
  int32_t *bad = up_i(lab, R);
  assert_int_equal(B->softmax_xent_fwd(pr, loss, x, bad, R, C, NULL), GPU_OK);
  assert_true(isnan(down(loss, 1)[0]));
  dfree(x);
  dfree(pr);
  dfree(loss);
  dfree(dl);
  dfree(dlab);
  dfree(g);
  dfree(bad);
}

static void test_embedding(void **state) {
  (void)state;
  enum { V = 6, D = 4, NI = 5 };
  fill_rand(ha, V * D, 80);
  fill_rand(hb, NI * D, 81);
  int32_t idx[NI] = { 2, 0, 2, 5, -1 };
  float *w = up(ha, V * D), *o = dnew(NI * D), *dout = up(hb, NI * D), *dw = dnew(V * D);
  int32_t *di = up_i(idx, NI);
  assert_int_equal(B->embedding_fwd(o, w, di, NI, D, V, NULL), GPU_OK);
  const float *got = down(o, NI * D);
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < D; d++) assert_true(got[i * D + d] == ha[idx[i] * D + d]);
  for (int d = 0; d < D; d++) assert_true(isnan(got[4 * D + d]));
  assert_int_equal(B->fill(dw, 1.0f, V * D, NULL), GPU_OK);
  assert_int_equal(B->embedding_bwd(dw, dout, di, NI, D, V, NULL), GPU_OK);
  for (int i = 0; i < V * D; i++) want[i] = 1.0f;
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < D; d++) want[idx[i] * D + d] += hb[i * D + d];   /* row 2 twice: summed */
  expect_near(down(dw, V * D), want, V * D, 1e-6);
  dfree(w);
  dfree(o);
  dfree(dout);
  dfree(dw);
  dfree(di);
}

/* ---- optimizers ---------------------------------------------------------------------------------- */

static void test_sgd_and_adam(void **state) {
  (void)state;
  enum { P = 100 };
  float p0[P], g0[P], pr[P], buf[P], m[P], v[P];
  fill_rand(p0, P, 90);
  fill_rand(g0, P, 91);
  float *p = up(p0, P), *g = up(g0, P), *db = dnew(P), *dm = dnew(P), *dv = dnew(P);
  /* Two SGD steps with momentum 0.9 and weight decay 0.01. */
  memcpy(pr, p0, sizeof pr);
  for (int step = 0; step < 2; step++) {
    assert_int_equal(B->sgd_step(p, g, db, P, 0.1f, 0.9f, 0.01f, step == 0, NULL), GPU_OK);
    for (int i = 0; i < P; i++) {
      float d = g0[i] + 0.01f * pr[i];
      buf[i] = step == 0 ? d : 0.9f * buf[i] + d;
      pr[i] -= 0.1f * buf[i];
    }
  }
  expect_near(down(p, P), pr, P, 1e-6);
  /* Plain SGD: no buffer needed. */
  assert_int_equal(B->sgd_step(p, g, NULL, P, 0.5f, 0.0f, 0.0f, 1, NULL), GPU_OK);
  for (int i = 0; i < P; i++) pr[i] -= 0.5f * g0[i];
  expect_near(down(p, P), pr, P, 1e-6);
  /* Three Adam steps. */
  assert_int_equal(B->memcpy_h2d(p, p0, sizeof p0, NULL), GPU_OK);
  assert_int_equal(B->fill(dm, 0, P, NULL), GPU_OK);
  assert_int_equal(B->fill(dv, 0, P, NULL), GPU_OK);
  memcpy(pr, p0, sizeof pr);
  memset(m, 0, sizeof m);
  memset(v, 0, sizeof v);
  for (int t = 1; t <= 3; t++) {
    assert_int_equal(B->adam_step(p, g, dm, dv, P, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, t, NULL), GPU_OK);
    for (int i = 0; i < P; i++) {
      double d = g0[i];
      m[i] = (float)(0.9 * m[i] + 0.1 * d);
      v[i] = (float)(0.999 * v[i] + 0.001 * d * d);
      double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
      pr[i] = (float)(pr[i] - 1e-3 * mh / (sqrt(vh) + 1e-8));
    }
  }
  expect_near(down(p, P), pr, P, 1e-5);
  assert_int_equal(B->adam_step(p, g, dm, dv, P, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, NULL), GPU_EINVAL);
  dfree(p);
  dfree(g);
  dfree(db);
  dfree(dm);
  dfree(dv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_memory_is_its_own_range),
    cmocka_unit_test(test_freed_memory_faults),
    cmocka_unit_test(test_copies_and_checks),
    cmocka_unit_test(test_streams_and_events),
    cmocka_unit_test(test_sgemm_transposes),
    cmocka_unit_test(test_elementwise),
    cmocka_unit_test(test_activation_backward),
    cmocka_unit_test(test_bias_and_reductions),
    cmocka_unit_test(test_fill_and_copy_strided),
    cmocka_unit_test(test_conv2d),
    cmocka_unit_test(test_conv2d_chunks),
    cmocka_unit_test(test_pooling),
    cmocka_unit_test(test_softmax_and_cross_entropy),
    cmocka_unit_test(test_embedding),
    cmocka_unit_test(test_sgd_and_adam),
  };
  return cmocka_run_group_tests(tests, host_setup, NULL);
}
