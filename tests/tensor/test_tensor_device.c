/* test_tensor_device.c - tensors on a device (the host backend's device
 * memory through a gpu/ caching pool):
 *   - tensor_to copies both ways, bit for bit; tensor_device names the pool;
 *   - each op a device runs gives what the same op gives on CPU tensors,
 *     element by element (the training ops: add with a bias row, sub, mul,
 *     div, the scalar ops, relu, tanh, sigmoid, exp, log, neg and the
 *     gradients of relu, tanh and sigmoid, matmul (a transposed operand
 *     too), sum over everything and over axis 0, clone, fill_, add_, sub_,
 *     mul_, the gradients' _out forms, and views of device tensors);
 *   - exact ledger counts: tensor_to onto the device makes one storage, one
 *     header and one gpu.buffer; freeing it frees the header and storage
 *     and the buffer goes back to the pool (its gpu.buffer block freed);
 *   - the training ops on a device give what the CPU ops give, within 1e-5
 *     relative to max(1, |value|) (the backend sums in its own order):
 *     conv2d (stride 1 with padding, stride 2 without) and its three
 *     gradients, max pooling (its argmax exactly) and average pooling and
 *     their gradients, softmax and its gradient, cross-entropy and its
 *     gradient, embedding
 *     and its scatter-add gradient (repeated indices), argmax (exactly),
 *     matmul_t and gemm_t_out (accumulating), sum_add_, and two steps of
 *     SGD with momentum and of Adam (parameters and state);
 *   - a host-only op given a device tensor, and inputs on two devices, are
 *     clear errors with no finding;
 *   - a leaked device tensor is gpu.leak at exit with the stack of the
 *     tensor_to that made it, and ref.leak on its buffer (a child). */
#include "harness.h"
#include "support.h"
#include "child.h"
#include "tensor_test.h"
#include "gpu.h"

static gpu_pool *P;
static ta_tag T_BUFFER;

static int dev_setup(void **state) {
  errors_setup(state);
  T_BUFFER = ta_tag_get("gpu.buffer");
  if (gpu_backend_host()->init(0) != GPU_OK) return -1;
  P = gpu_pool_new(gpu_backend_host(), NULL);
  return P ? 0 : -1;
}

static int dev_teardown(void **state) {
  gpu_pool_empty_cache(P);
  gpu_pool_destroy(P);
  return errors_teardown(state);
}

/* n values in [-1, 1), deterministic; positive: in [0.1, 1.1). */
static tensor *values(int ndim, const int64_t *shape, uint32_t seed, int positive) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  assert_non_null(t);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t->numel; i++) {
    x = x * 1664525u + 1013904223u;
    float v = (float)(x >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    tensor_f32(t)[i] = positive ? fabsf(v) + 0.1f : v;
  }
  return t;
}

/* d (a device tensor) brought back equals want (a CPU tensor) element by
 * element within tol relative to max(1, |want|); tol 0: bit for bit. */
static void expect_same(const tensor *d, const tensor *want, float tol) {
  assert_ptr_equal(tensor_device(d), P);
  tensor *h = tensor_to(d, NULL);
  assert_non_null(h);
  assert_null(tensor_device(h));
  assert_int_equal(h->ndim, want->ndim);
  for (int i = 0; i < want->ndim; i++) assert_int_equal(h->shape[i], want->shape[i]);
  for (int64_t i = 0; i < want->numel; i++) {
    float g = tensor_f32(h)[i], w = tensor_f32(want)[i];
    float lim = tol * fmaxf(1.0f, fabsf(w));
    if (!(fabsf(g - w) <= lim)) fail_msg("element %lld: device %.9g, CPU %.9g", (long long)i, g, w);
  }
  tensor_free(h);
}

static void expect_same_i32(const tensor *d, const tensor *want) {
  assert_ptr_equal(tensor_device(d), P);
  tensor *h = tensor_to(d, NULL);
  assert_non_null(h);
  assert_int_equal(h->numel, want->numel);
  for (int64_t i = 0; i < want->numel; i++)
    if (tensor_i32(h)[i] != tensor_i32(want)[i])
      fail_msg("element %lld: device %d, CPU %d", (long long)i, tensor_i32(h)[i], tensor_i32(want)[i]);
  tensor_free(h);
}

static void test_to_and_back(void **state) {
  (void)state;
  tensor *x = values(TS(3, 5), 1, 0);
  tensor *d = tensor_to(x, P);
  assert_non_null(d);
  assert_ptr_equal(tensor_device(d), P);
  assert_null(tensor_device(x));
  assert_int_equal(gpu_pool_size(P, d->data), 512);   /* 60 bytes, rounded to 512 */
  expect_same(d, x, 0);
  /* device to device: a copy of its own */
  tensor *d2 = tensor_to(d, P);
  assert_ptr_not_equal(d2->data, d->data);
  expect_same(d2, x, 0);
  /* a non-contiguous view goes over contiguous */
  tensor *xt = tensor_transpose(x, 0, 1), *dt = tensor_to(xt, P), *want = tensor_contiguous(xt);
  expect_same(dt, want, 0);
  tensor_free(dt);
  tensor_free(want);
  tensor_free(xt);
  tensor_free(d2);
  tensor_free(d);
  tensor_free(x);
  assert_int_equal(n_errors, 0);
}

static void test_ledger_counts(void **state) {
  (void)state;
  tensor *x = values(TS(64, 100), 2, 0);
  ta_mark m = ta_mark_now();
  tensor *d = tensor_to(x, P);
  ta_counts st = ta_since(m, T_STORAGE), hd = ta_since(m, T_HEADER), bu = ta_since(m, T_BUFFER);
  assert_int_equal(st.allocs, 1);
  assert_int_equal(hd.allocs, 1);
  assert_int_equal(bu.allocs, 1);
  assert_int_equal(bu.live_bytes, 25600);
  assert_int_equal(tensor_storage_refs(d), 1);
  assert_int_equal(ta_ref_count(d->data), 1);   /* the storage's reference on its buffer */
  /* a view shares the storage: one header more, no storage, no buffer */
  tensor *v = tensor_reshape(d, TS(6400));
  assert_int_equal(ta_since(m, T_HEADER).allocs, 2);
  assert_int_equal(ta_since(m, T_STORAGE).allocs, 1);
  assert_int_equal(ta_since(m, T_BUFFER).allocs, 1);
  assert_int_equal(tensor_storage_refs(d), 2);
  tensor_free(d);
  assert_int_equal(ta_since(m, T_BUFFER).frees, 0);   /* the view keeps it */
  tensor_free(v);
  st = ta_since(m, T_STORAGE);
  hd = ta_since(m, T_HEADER);
  bu = ta_since(m, T_BUFFER);
  assert_int_equal(st.frees, 1);
  assert_int_equal(hd.frees, 2);
  assert_int_equal(bu.frees, 1);
  assert_int_equal(bu.live_blocks, 0);
  /* the buffer went back to the pool's cache: the next one reuses it */
  gpu_stats s0, s1;
  gpu_pool_stats(P, &s0);
  tensor *d3 = tensor_to(x, P);
  gpu_pool_stats(P, &s1);
  assert_int_equal(s1.num_device_alloc, s0.num_device_alloc);
  assert_int_equal(s1.num_hits, s0.num_hits + 1);
  tensor_free(d3);
  ta_mark_free(m);
  tensor_free(x);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* Each op on device tensors against the same op on CPU tensors. */
static void test_ops_match_cpu(void **state) {
  (void)state;
  tensor *a = values(TS(8, 12), 3, 0), *b = values(TS(8, 12), 4, 0), *pos = values(TS(8, 12), 5, 1);
  tensor *bias = values(TS(12), 6, 0), *w = values(TS(12, 7), 7, 0);
  tensor *da = tensor_to(a, P), *db = tensor_to(b, P), *dpos = tensor_to(pos, P);
  tensor *dbias = tensor_to(bias, P), *dw = tensor_to(w, P);
  tensor *at = tensor_transpose(a, 0, 1), *dat = tensor_transpose(da, 0, 1);
  struct {
    tensor *dev, *cpu;
    float tol;
  } c[] = {
    { tensor_add(da, db), tensor_add(a, b), 0 },
    { tensor_add(da, dbias), tensor_add(a, bias), 0 },
    { tensor_sub(da, db), tensor_sub(a, b), 0 },
    { tensor_mul(da, db), tensor_mul(a, b), 0 },
    { tensor_div(da, dpos), tensor_div(a, pos), 1e-6f },
    { tensor_add_scalar(da, 0.25f), tensor_add_scalar(a, 0.25f), 0 },
    { tensor_sub_scalar(da, 0.25f), tensor_sub_scalar(a, 0.25f), 0 },
    { tensor_mul_scalar(da, -3.0f), tensor_mul_scalar(a, -3.0f), 0 },
    { tensor_neg(da), tensor_neg(a), 0 },
    { tensor_relu(da), tensor_relu(a), 0 },
    { tensor_tanh(da), tensor_tanh(a), 1e-6f },
    { tensor_sigmoid(da), tensor_sigmoid(a), 1e-6f },
    { tensor_exp(da), tensor_exp(a), 1e-6f },
    { tensor_log(dpos), tensor_log(pos), 1e-6f },
    { tensor_relu_grad(db, da), tensor_relu_grad(b, a), 0 },
    { tensor_tanh_grad(db, da), tensor_tanh_grad(b, a), 1e-6f },
    { tensor_sigmoid_grad(db, da), tensor_sigmoid_grad(b, a), 1e-6f },
    { tensor_matmul(da, dw), tensor_matmul(a, w), 1e-5f },
    { tensor_sum(da, TENSOR_ALL, 0), tensor_sum(a, TENSOR_ALL, 0), 1e-5f },
    { tensor_sum(da, 0, 0), tensor_sum(a, 0, 0), 1e-5f },
    { tensor_matmul(dat, da), tensor_matmul(at, a), 1e-5f },   /* a transposed view: sgemm's flag */
    { tensor_relu(dat), tensor_relu(at), 0 },                  /* a strided input: copied contiguous first */
    { tensor_clone(da), tensor_clone(a), 0 },
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    if (c[i].dev == NULL) fail_msg("op %zu on the device failed: %s", i, last_error);
    assert_non_null(c[i].cpu);
    expect_same(c[i].dev, c[i].cpu, c[i].tol);
    tensor_free(c[i].dev);
    tensor_free(c[i].cpu);
  }
  /* the in-place and _out forms the device runs */
  tensor *acc = tensor_clone(a), *dacc = tensor_clone(da);
  assert_int_equal(tensor_add_(acc, b), TENSOR_OK);
  assert_int_equal(tensor_add_(dacc, db), TENSOR_OK);
  assert_int_equal(tensor_mul_(acc, b), TENSOR_OK);
  assert_int_equal(tensor_mul_(dacc, db), TENSOR_OK);
  assert_int_equal(tensor_sub_(acc, a), TENSOR_OK);
  assert_int_equal(tensor_sub_(dacc, da), TENSOR_OK);
  assert_int_equal(tensor_relu_grad_out(acc, acc, a), TENSOR_OK);
  assert_int_equal(tensor_relu_grad_out(dacc, dacc, da), TENSOR_OK);
  expect_same(dacc, acc, 0);
  tensor_free(acc);
  tensor_free(dacc);
  /* fill_, and a strided view made contiguous on the device */
  assert_int_equal(tensor_fill_(db, 1.5f), TENSOR_OK);
  tensor *ones = tensor_full(TS(8, 12), 1.5f);
  expect_same(db, ones, 0);
  tensor *dt = tensor_transpose(da, 0, 1), *dc = tensor_contiguous(dt);
  tensor *ct = tensor_transpose(a, 0, 1), *cc = tensor_contiguous(ct);
  expect_same(dc, cc, 0);
  tensor *tensors[] = { ones, dt, dc, ct, cc, at, dat, da, db, dpos, dbias, dw, a, b, pos, bias, w };
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) tensor_free(tensors[i]);
  assert_int_equal(n_errors, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

#define NN_TOL 1e-5f

static void check_conv(tensor *x, tensor *w, tensor *bias, int stride, int pad, uint32_t seed) {
  tensor *dx = tensor_to(x, P), *dw = tensor_to(w, P), *db = tensor_to(bias, P);
  tensor *y = tensor_conv2d(x, w, bias, stride, pad), *yd = tensor_conv2d(dx, dw, db, stride, pad);
  assert_non_null(y);
  assert_non_null(yd);
  expect_same(yd, y, NN_TOL);
  tensor *g = values(y->ndim, y->shape, seed, 0), *gd = tensor_to(g, P);
  tensor *r[4][2] = {
    { tensor_conv2d_grad_input(g, w, 4, x->shape, stride, pad), tensor_conv2d_grad_input(gd, dw, 4, x->shape, stride, pad) },
    { tensor_conv2d_grad_weight(g, x, 4, w->shape, stride, pad), tensor_conv2d_grad_weight(gd, dx, 4, w->shape, stride, pad) },
    { tensor_conv2d_grad_bias(g), tensor_conv2d_grad_bias(gd) },
    { tensor_conv2d(x, w, NULL, stride, pad), tensor_conv2d(dx, dw, NULL, stride, pad) },
  };
  for (int i = 0; i < 4; i++) {
    assert_non_null(r[i][0]);
    assert_non_null(r[i][1]);
    expect_same(r[i][1], r[i][0], NN_TOL);
    tensor_free(r[i][0]);
    tensor_free(r[i][1]);
  }
  tensor *all[] = { dx, dw, db, y, yd, g, gd };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

static void check_pool(tensor *x, bool max, int k, int stride, uint32_t seed) {
  tensor *dx = tensor_to(x, P), *am = NULL, *amd = NULL;
  tensor *y = max ? tensor_max_pool2d(x, k, stride, &am) : tensor_avg_pool2d(x, k, stride);
  tensor *yd = max ? tensor_max_pool2d(dx, k, stride, &amd) : tensor_avg_pool2d(dx, k, stride);
  assert_non_null(y);
  assert_non_null(yd);
  expect_same(yd, y, NN_TOL);
  if (max) expect_same_i32(amd, am);
  tensor *g = values(y->ndim, y->shape, seed, 0), *gd = tensor_to(g, P);
  tensor *gx = max ? tensor_max_pool2d_grad(g, am, 4, x->shape) : tensor_avg_pool2d_grad(g, k, stride, 4, x->shape);
  tensor *gxd = max ? tensor_max_pool2d_grad_k(gd, amd, k, stride, 4, x->shape)
                    : tensor_avg_pool2d_grad(gd, k, stride, 4, x->shape);
  assert_non_null(gx);
  assert_non_null(gxd);
  expect_same(gxd, gx, NN_TOL);
  if (max) {
    /* without the window: the covering stride-1 one, where the input loses
     * as many rows as columns; else an error naming the _k form */
    tensor *gk = tensor_max_pool2d_grad_k(g, am, k, stride, 4, x->shape);
    expect_same(gxd, gk, NN_TOL);   /* the host form with the window: the same */
    tensor_free(gk);
    assert_null(tensor_max_pool2d_grad_k(g, am, k + 1, stride, 4, x->shape));   /* not the forward's window */
    assert_int_equal(last_error_status, TENSOR_ESHAPE);
    n_errors--;
    int64_t oh = y->shape[2], ow = y->shape[3];
    tensor *gn = tensor_max_pool2d_grad(gd, amd, 4, x->shape);
    if (x->shape[2] - oh == x->shape[3] - ow) {
      assert_non_null(gn);
      expect_same(gn, gx, NN_TOL);
    } else {
      assert_null(gn);
      assert_int_equal(last_error_status, TENSOR_EINVAL);
      assert_non_null(strstr(last_error, "the window is needed"));
      n_errors--;   /* expected */
    }
    tensor_free(gn);
  }
  tensor *all[] = { dx, am, amd, y, yd, g, gd, gx, gxd };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

static void test_nn_ops_match_cpu(void **state) {
  (void)state;
  tensor *x = values(TS(3, 2, 9, 8), 21, 0), *w = values(TS(4, 2, 3, 3), 22, 0), *bias = values(TS(4), 23, 0);
  check_conv(x, w, bias, 1, 1, 24);
  check_conv(x, w, bias, 2, 0, 25);
  tensor *px = values(TS(2, 3, 8, 7), 26, 0);
  check_pool(px, true, 2, 2, 27);
  check_pool(px, true, 3, 2, 28);
  check_pool(px, false, 2, 2, 29);
  check_pool(px, false, 3, 1, 30);

  /* softmax, cross-entropy, argmax */
  tensor *lg = values(TS(6, 5), 31, 0), *lgd = tensor_to(lg, P);
  tensor *lab = tensor_from_i32((const int32_t[]){ 0, 4, 2, 2, 1, 3 }, TS(6)), *labd = tensor_to(lab, P);
  tensor *sg = values(TS(6, 5), 38, 0), *sgd = tensor_to(sg, P);
  tensor *sy = tensor_softmax(lg, 1), *syd = tensor_to(sy, P);
  tensor *sdx = tensor_softmax_grad(sg, sy, 1), *sdxd = tensor_softmax_grad(sgd, syd, -1);
  assert_non_null(sdxd);
  expect_same(sdxd, sdx, NN_TOL);
  tensor *sm[] = { sg, sgd, sy, syd, sdx, sdxd };
  for (size_t i = 0; i < sizeof sm / sizeof *sm; i++) tensor_free(sm[i]);
  tensor *r[4][2] = {
    { tensor_softmax(lg, 1), tensor_softmax(lgd, -1) },
    { tensor_cross_entropy(lg, lab), tensor_cross_entropy(lgd, labd) },
    { tensor_cross_entropy_grad(lg, lab), tensor_cross_entropy_grad(lgd, labd) },
    { tensor_matmul_t(lg, 1, lg, 0), tensor_matmul_t(lgd, 1, lgd, 0) },   /* lg^T @ lg: [5, 5] */
  };
  for (int i = 0; i < 4; i++) {
    assert_non_null(r[i][1]);
    expect_same(r[i][1], r[i][0], NN_TOL);
  }
  assert_true(tensor_item(r[1][0]) > 0.5f);   /* a loss that is there */
  assert_true(fabsf(tensor_item(r[1][1]) - tensor_item(r[1][0])) <= NN_TOL * tensor_item(r[1][0]));
  /* r3 += lg^T @ lg again, in place: twice the product */
  assert_int_equal(tensor_gemm_t_out(r[3][0], lg, 1, lg, 0, 1.0f, 1.0f), TENSOR_OK);
  assert_int_equal(tensor_gemm_t_out(r[3][1], lgd, 1, lgd, 0, 1.0f, 1.0f), TENSOR_OK);
  expect_same(r[3][1], r[3][0], NN_TOL);
  tensor *am = tensor_argmax(lg, 1, 0), *amd = tensor_argmax(lgd, 1, 0);
  assert_non_null(amd);
  expect_same_i32(amd, am);
  /* a bias's gradient accumulated: acc += the column sums */
  tensor *acc = values(TS(5), 32, 0), *accd = tensor_to(acc, P);
  assert_int_equal(tensor_sum_add_(acc, lg, 0), TENSOR_OK);
  assert_int_equal(tensor_sum_add_(accd, lgd, 0), TENSOR_OK);
  expect_same(accd, acc, NN_TOL);
  for (int i = 0; i < 4; i++) {
    tensor_free(r[i][0]);
    tensor_free(r[i][1]);
  }

  /* embedding and its gradient: indices repeat */
  tensor *emb = values(TS(7, 3), 33, 0), *embd = tensor_to(emb, P);
  tensor *idx = tensor_from_i32((const int32_t[]){ 6, 0, 3, 3, 1, 6, 6, 2 }, TS(2, 4)), *idxd = tensor_to(idx, P);
  tensor *e = tensor_embedding(emb, idx), *ed = tensor_embedding(embd, idxd);
  assert_non_null(ed);
  expect_same(ed, e, NN_TOL);
  tensor *dout = values(TS(2, 4, 3), 34, 0), *doutd = tensor_to(dout, P);
  tensor *gw = values(TS(7, 3), 35, 0), *gwd = tensor_to(gw, P);   /* accumulated into */
  assert_int_equal(tensor_embedding_grad_(gw, dout, idx), TENSOR_OK);
  assert_int_equal(tensor_embedding_grad_(gwd, doutd, idxd), TENSOR_OK);
  expect_same(gwd, gw, NN_TOL);

  /* two steps of SGD (momentum, weight decay) and of Adam */
  tensor *p = values(TS(10), 36, 0), *g = values(TS(10), 37, 0), *buf = tensor_zeros(TENSOR_F32, TS(10));
  tensor *m = tensor_zeros(TENSOR_F32, TS(10)), *v = tensor_zeros(TENSOR_F32, TS(10));
  tensor *pd = tensor_to(p, P), *gd = tensor_to(g, P), *bufd = tensor_to(buf, P), *md = tensor_to(m, P),
         *vd = tensor_to(v, P);
  for (int step = 1; step <= 2; step++) {
    assert_int_equal(tensor_sgd_step_(p, g, buf, 0.1f, 0.9f, 0.01f, step == 1), TENSOR_OK);
    assert_int_equal(tensor_sgd_step_(pd, gd, bufd, 0.1f, 0.9f, 0.01f, step == 1), TENSOR_OK);
  }
  expect_same(pd, p, NN_TOL);
  expect_same(bufd, buf, NN_TOL);
  for (int step = 1; step <= 2; step++) {
    assert_int_equal(tensor_adam_step_(p, g, m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, step), TENSOR_OK);
    assert_int_equal(tensor_adam_step_(pd, gd, md, vd, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, step), TENSOR_OK);
  }
  expect_same(pd, p, NN_TOL);
  expect_same(md, m, NN_TOL);
  expect_same(vd, v, NN_TOL);
  assert_true(fabsf(tensor_f32(m)[0]) > 0);   /* a state that moved */
  /* a wrong shape is refused on both */
  assert_int_equal(tensor_sgd_step_(pd, accd, NULL, 0.1f, 0.0f, 0.0f, 1), TENSOR_ESHAPE);
  assert_string_equal(last_error, "tensor_sgd_step_: g is f32[5], want a contiguous f32 of p's shape f32[10]");
  assert_int_equal(tensor_adam_step_(p, g, m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 0), TENSOR_EINVAL);
  assert_string_equal(last_error, "tensor_adam_step_: step 0, want >= 1");

  tensor *all[] = { x, w, bias, px, lg, lgd, lab, labd, am, amd, acc, accd, emb, embd, idx, idxd, e, ed, dout,
                    doutd, gw, gwd, p, g, buf, m, v, pd, gd, bufd, md, vd };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
  assert_int_equal(n_errors, 2);   /* the two refused above */
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* A host-only op on a device tensor, two devices in one op, an op the
 * device does not run: errors, no finding, nothing made. */
static void test_errors(void **state) {
  (void)state;
  gpu_pool *q = gpu_pool_new(gpu_backend_host(), NULL);
  assert_non_null(q);
  tensor *x = values(TS(4, 4), 8, 0), *d = tensor_to(x, P), *e = tensor_to(x, q);
  ta_mark m = ta_mark_now();
  assert_null(tensor_log_softmax(d, 1));
  assert_int_equal(last_error_status, TENSOR_EINVAL);
  char want[200];
  snprintf(want, sizeof want, "tensor_log_softmax: x is f32[4,4] on device host (pool %p); this op runs on host "
           "tensors only (tensor_to(x, NULL) first)", (void *)P);
  assert_string_equal(last_error, want);
  tensor *total = tensor_sum(d, TENSOR_ALL, 0);   /* on the device: tensor_item reads it back */
  assert_non_null(total);
  tensor *htotal = tensor_sum(x, TENSOR_ALL, 0);
  assert_true(fabsf(tensor_item(total) - tensor_item(htotal)) <= 1e-5f * fmaxf(1.0f, fabsf(tensor_item(htotal))));
  assert_true(isnan(tensor_get(total, NULL)));   /* element access stays host-only */
  snprintf(want, sizeof want, "tensor_get: t is f32[] on device host (pool %p); this op runs on host tensors only "
           "(tensor_to(t, NULL) first)", (void *)P);
  assert_string_equal(last_error, want);
  tensor_free(total);
  tensor_free(htotal);
  assert_null(tensor_add(x, d));
  snprintf(want, sizeof want, "tensor_add: the inputs are on different devices (the host and device host (pool %p)): "
           "tensor_to one of them first", (void *)P);
  assert_string_equal(last_error, want);
  assert_null(tensor_sub(d, x));   /* a device tensor and a host one, either way round */
  snprintf(want, sizeof want, "tensor_sub: the inputs are on different devices (device host (pool %p) and the host): "
           "tensor_to one of them first", (void *)P);
  assert_string_equal(last_error, want);
  assert_null(tensor_matmul(d, x));
  assert_int_equal(tensor_mul_(d, x), TENSOR_EINVAL);
  assert_null(tensor_mul(d, e));
  snprintf(want, sizeof want, "tensor_mul: the inputs are on different devices (device host (pool %p) and device host "
           "(pool %p)): tensor_to one of them first", (void *)P, (void *)q);
  assert_string_equal(last_error, want);
  assert_null(tensor_sum(d, 1, 0));
  assert_string_equal(last_error, "tensor_sum: on a device, the sum of every element or over axis 0 (keepdim 0) "
                                  "only: axis 1, keepdim 0 of f32[4,4]");
  /* an _out form the device does not run */
  assert_int_equal(tensor_exp_out(d, d), TENSOR_EINVAL);
  snprintf(want, sizeof want, "tensor_exp_out: out is f32[4,4] on device host (pool %p); this op runs on host "
           "tensors only (tensor_to(out, NULL) first)", (void *)P);
  assert_string_equal(last_error, want);
  assert_int_equal(tensor_add_(x, d), TENSOR_EINVAL);
  snprintf(want, sizeof want, "tensor_add_: the inputs are on different devices (the host and device host (pool %p)): "
           "tensor_to one of them first", (void *)P);
  assert_string_equal(last_error, want);
  tensor *flat = tensor_reshape(d, TS(16));
  assert_null(tensor_add(d, flat));
  assert_int_equal(last_error_status, TENSOR_ESHAPE);
  tensor_free(flat);
  assert_int_equal(ta_since(m, T_BUFFER).live_blocks, 0);   /* the failed ops left nothing */
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_mark_free(m);
  tensor_free(e);
  tensor_free(d);
  tensor_free(x);
  gpu_pool_empty_cache(q);
  gpu_pool_destroy(q);
}

/* ---- a leaked device tensor (a child) ------------------------------------------------ */

NOIPA static tensor *weights_on_device(gpu_pool *p) {
  tensor *w = tensor_full(TS(16, 16), 0.5f);
  tensor *d = tensor_to(w, p);
  tensor_free(w);
  KEEP();
  return d;
}

static int child_leak(void) {
  gpu_backend_host()->init(0);
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), NULL);
  tensor *d = weights_on_device(p);
  printf("buffer %p\n", d->data);
  d = NULL;   /* lost */
  return 0;
}

static void test_leaked_device_tensor(void **state) {
  (void)state;
  child_result r;
  child_exec("leak", NULL, &r);
  const char *want = "GPU leak of 1,024 byte(s) in 1 object(s) allocated from:   [tag: gpu.buffer]\n";
  const char *g = strstr(r.err, want);
  if (!g) child_dump(&r);
  assert_non_null(g);
  /* gpu_pool_alloc, the device storage's making, tensor_to, then the caller */
  const char *to = strstr(g, " in tensor_to tensor/device.c:");
  const char *caller = strstr(g, " in weights_on_device tests/tensor/test_tensor_device.c:");
  assert_non_null(to);
  assert_non_null(caller);
  assert_true(to < caller);
  assert_true(caller < strstr(g, "  detail: device"));
  /* the header and storage it came with: lost host blocks; the storage's
   * reference on the buffer: ref.leak */
  assert_non_null(strstr(r.err, "Direct leak of 160 byte(s) in 1 object(s) allocated from:   [tag: tensor.header]\n"));
  void *buf = NULL;
  assert_int_equal(sscanf(r.out, "buffer %p", &buf), 1);
  char ref[128];
  snprintf(ref, sizeof ref, "ref.leak: 1 object(s) with references left at exit, such as %p, last acquired at:\n", buf);
  assert_non_null(strstr(r.err, ref));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "leak") == 0) return child_leak();
    return 2;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_to_and_back, dev_setup, dev_teardown),
    cmocka_unit_test_setup_teardown(test_ledger_counts, dev_setup, dev_teardown),
    cmocka_unit_test_setup_teardown(test_ops_match_cpu, dev_setup, dev_teardown),
    cmocka_unit_test_setup_teardown(test_nn_ops_match_cpu, dev_setup, dev_teardown),
    cmocka_unit_test_setup_teardown(test_errors, dev_setup, dev_teardown),
    cmocka_unit_test_setup_teardown(test_leaked_device_tensor, dev_setup, dev_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
