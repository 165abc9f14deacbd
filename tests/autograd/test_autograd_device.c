/* test_autograd_device.c - autograd on device tensors (the host backend's
 * device memory through a gpu/ pool): the same graph run on CPU tensors and
 * on device tensors gives the same loss and the same gradients, element by
 * element; the gradients live on the device; a step's tape reset leaves no
 * device buffer but the inputs' and parameters' (exact counts).
 *
 * The graph: a two-layer perceptron as a training step has it,
 *   loss = sum(tanh(relu(x @ w1 + b1) @ w2 + b2) * t) * 0.5
 * with x [16, 12], w1 [12, 9], b1 [9], w2 [9, 5], b2 [5], t [16, 5]:
 * matmul (and its transposed operands in backward), a bias row added and
 * summed back, relu, tanh and their gradients, mul, the scalar op, sum.
 *
 * softmax's backward runs on the device too (a softmax of a product,
 * weighted and summed).  Then whole models as the training programs have them, built twice from
 * one seed, one copy moved to the device (ag_layer_to), trained three steps
 * side by side: a LeNet-shaped net (conv with padding, relu, max pooling,
 * conv, relu, average pooling, flatten, linear, cross-entropy) with SGD and
 * momentum, and the character model's shape (embedding of a window,
 * reshape, linear, tanh, linear, cross-entropy) with Adam.  Each step's loss
 * agrees within 1e-5 (relative), every parameter and gradient after the
 * steps within 1e-4 of max(1, |value|); the device run's pool makes no
 * device allocation after its first step, and nothing is left at the end. */
#include "harness.h"
#include "support.h"
#include "autograd.h"
#include "gpu.h"

#include <math.h>
#include <string.h>

static tensor *values(int ndim, const int64_t *shape, uint32_t seed) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  assert_non_null(t);
  uint32_t x = seed * 2654435761u + 7;
  for (int64_t i = 0; i < t->numel; i++) {
    x = x * 1664525u + 1013904223u;
    tensor_f32(t)[i] = ((float)(x >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * 0.5f;
  }
  return t;
}

enum { X, W1, B1, W2, B2, T, N };

/* The loss and the gradients of w1, b1, w2, b2 and x, as host tensors:
 * on host tensors (dev NULL), or with every input moved to dev first. */
static void run(gpu_pool *dev, tensor *const in[N], float *loss, tensor *grads[5]) {
  ag_tape *tape = ag_tape_new(0);
  ag_tape_use(tape);
  tensor *moved[N];
  ag_var *v[N];
  for (int i = 0; i < N; i++) {
    moved[i] = dev ? tensor_to(in[i], dev) : tensor_alias(in[i]);
    assert_non_null(moved[i]);
    v[i] = ag_leaf(moved[i], i != T);
  }
  ag_var *h = ag_relu(ag_add(ag_matmul(v[X], v[W1]), v[B1]));
  ag_var *y = ag_tanh(ag_add(ag_matmul(h, v[W2]), v[B2]));
  ag_var *l = ag_mul_scalar(ag_sum(ag_mul(y, v[T]), TENSOR_ALL, 0), 0.5f);
  if (l == NULL) fail_msg("forward: %s / %s", ag_error(), tensor_error());
  assert_ptr_equal(tensor_device(l->value), dev);
  if (ag_backward(l) != 0) fail_msg("backward: %s / %s", ag_error(), tensor_error());
  tensor *lh = tensor_to(l->value, NULL);
  *loss = tensor_f32(lh)[0];
  tensor_free(lh);
  const int which[5] = { W1, B1, W2, B2, X };
  for (int i = 0; i < 5; i++) {
    tensor *g = v[which[i]]->grad;
    assert_non_null(g);
    assert_ptr_equal(tensor_device(g), dev);
    grads[i] = tensor_to(g, NULL);
  }
  ag_tape_use(NULL);
  ag_tape_free(tape);
  for (int i = 0; i < N; i++) tensor_free(moved[i]);
}

static void test_gradients_match_cpu(void **state) {
  (void)state;
  assert_int_equal(gpu_backend_host()->init(0), GPU_OK);
  gpu_pool *dev = gpu_pool_new(gpu_backend_host(), NULL);
  assert_non_null(dev);
  tensor *in[N] = { values(TS(16, 12), 1), values(TS(12, 9), 2), values(TS(9), 3),
                    values(TS(9, 5), 4),   values(TS(5), 5),      values(TS(16, 5), 6) };
  float lc, ld;
  tensor *gc[5], *gd[5];
  run(NULL, in, &lc, gc);
  ta_tag buffer = ta_tag_get("gpu.buffer");
  ta_mark m = ta_mark_now();
  run(dev, in, &ld, gd);
  /* every device buffer of the step went back: the tape's results and
   * gradients, the inputs moved over */
  ta_counts c = ta_since(m, buffer);
  assert_int_equal(c.live_blocks, 0);
  assert_true(c.allocs > 20);
  assert_int_equal(c.frees, c.allocs);
  ta_mark_free(m);
  if (!(fabsf(lc - ld) <= 1e-5f * fmaxf(1.0f, fabsf(lc)))) fail_msg("loss: CPU %.9g, device %.9g", lc, ld);
  assert_true(lc != 0.0f);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(gc[i]->numel, gd[i]->numel);
    double norm = 0;
    for (int64_t j = 0; j < gc[i]->numel; j++) {
      float a = tensor_f32(gc[i])[j], b = tensor_f32(gd[i])[j];
      norm += fabs(a);
      if (!(fabsf(a - b) <= 1e-5f * fmaxf(1.0f, fabsf(a))))
        fail_msg("gradient %d element %lld: CPU %.9g, device %.9g", i, (long long)j, a, b);
    }
    assert_true(norm > 0);   /* a gradient that is there */
    tensor_free(gc[i]);
    tensor_free(gd[i]);
  }
  for (int i = 0; i < N; i++) tensor_free(in[i]);
  gpu_pool_empty_cache(dev);
  gpu_pool_destroy(dev);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* A device parameter's gradient is made on its device (zeros). */
static void test_param_on_device(void **state) {
  (void)state;
  assert_int_equal(gpu_backend_host()->init(0), GPU_OK);
  gpu_pool *dev = gpu_pool_new(gpu_backend_host(), NULL);
  tensor *w = values(TS(4, 3), 9), *wd = tensor_to(w, dev);
  ag_var *p = ag_param_new(wd);
  assert_non_null(p);
  assert_ptr_equal(tensor_device(p->grad), dev);
  tensor *g = tensor_to(p->grad, NULL);
  for (int i = 0; i < 12; i++) assert_true(tensor_f32(g)[i] == 0.0f);
  tensor_free(g);
  ag_param_free(p);
  tensor_free(w);
  gpu_pool_empty_cache(dev);
  gpu_pool_destroy(dev);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* ag_layer_to moves every parameter there and back, bit for bit; the
 * variables stay the same; NULL is an error that moves nothing. */
static void test_layer_to_and_back(void **state) {
  (void)state;
  assert_int_equal(gpu_backend_host()->init(0), GPU_OK);
  gpu_pool *dev = gpu_pool_new(gpu_backend_host(), NULL);
  ag_rng rng = ag_rng_new(3);
  ag_layer *l = ag_sequential((ag_layer *[]){ ag_conv2d_layer(2, 3, 3, 1, 1, &rng), ag_linear(4, 5, &rng) }, 2);
  ag_var *ps[4];
  assert_int_equal(ag_layer_params(l, ps, 4), 4);
  tensor *before[4];
  for (int i = 0; i < 4; i++) before[i] = tensor_clone(ps[i]->value);
  assert_int_equal(ag_layer_to(l, dev), 0);
  ag_var *again[4];
  ag_layer_params(l, again, 4);
  for (int i = 0; i < 4; i++) {
    assert_ptr_equal(again[i], ps[i]);
    assert_ptr_equal(tensor_device(ps[i]->value), dev);
    assert_ptr_equal(tensor_device(ps[i]->grad), dev);
  }
  assert_int_equal(ag_layer_to(l, NULL), 0);
  for (int i = 0; i < 4; i++) {
    assert_null(tensor_device(ps[i]->value));
    assert_int_equal(memcmp(tensor_f32(ps[i]->value), tensor_f32(before[i]), (size_t)before[i]->numel * 4), 0);
    for (int64_t j = 0; j < ps[i]->grad->numel; j++) assert_true(tensor_f32(ps[i]->grad)[j] == 0.0f);
    tensor_free(before[i]);
  }
  assert_int_equal(ag_layer_to(NULL, dev), -1);
  assert_string_equal(ag_error(), "ag_layer_to: layer is NULL");
  ag_error_clear();
  ag_layer_free(l);
  gpu_stats st;
  gpu_pool_stats(dev, &st);
  assert_int_equal(st.allocated_bytes[GPU_STAT_ALL].current, 0);
  gpu_pool_empty_cache(dev);
  gpu_pool_destroy(dev);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* softmax's backward on a device: loss = sum(softmax(x @ w) * t); the
 * gradients of x and w as the CPU's, to 1e-5. */
static void softmax_grads(gpu_pool *dev, tensor *const in[3], tensor *out[2]) {
  ag_tape *tape = ag_tape_new(0);
  ag_tape_use(tape);
  tensor *m[3];
  ag_var *v[3];
  for (int i = 0; i < 3; i++) {
    m[i] = dev ? tensor_to(in[i], dev) : tensor_alias(in[i]);
    v[i] = ag_leaf(m[i], i < 2);
  }
  ag_var *l = ag_sum(ag_mul(ag_softmax(ag_matmul(v[0], v[1]), 1), v[2]), TENSOR_ALL, 0);
  if (l == NULL || ag_backward(l) != 0) fail_msg("softmax graph: %s / %s", ag_error(), tensor_error());
  for (int i = 0; i < 2; i++) {
    assert_ptr_equal(tensor_device(v[i]->grad), dev);
    out[i] = tensor_to(v[i]->grad, NULL);
  }
  ag_tape_use(NULL);
  ag_tape_free(tape);
  for (int i = 0; i < 3; i++) tensor_free(m[i]);
}

static void test_softmax_backward_on_device(void **state) {
  (void)state;
  assert_int_equal(gpu_backend_host()->init(0), GPU_OK);
  gpu_pool *dev = gpu_pool_new(gpu_backend_host(), NULL);
  tensor *in[3] = { values(TS(6, 4), 41), values(TS(4, 7), 42), values(TS(6, 7), 43) };
  tensor *gc[2], *gd[2];
  softmax_grads(NULL, in, gc);
  softmax_grads(dev, in, gd);
  for (int i = 0; i < 2; i++) {
    double norm = 0;
    for (int64_t j = 0; j < gc[i]->numel; j++) {
      float a = tensor_f32(gc[i])[j], b = tensor_f32(gd[i])[j];
      norm += fabs(a);
      if (!(fabsf(a - b) <= 1e-5f * fmaxf(1.0f, fabsf(a))))
        fail_msg("gradient %d element %lld: CPU %.9g, device %.9g", i, (long long)j, a, b);
    }
    assert_true(norm > 0);
    tensor_free(gc[i]);
    tensor_free(gd[i]);
  }
  for (int i = 0; i < 3; i++) tensor_free(in[i]);
  gpu_pool_empty_cache(dev);
  gpu_pool_destroy(dev);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* The data of the model tests: images or windows, labels. */
typedef struct {
  tensor *x, *y;
} batch;

static ag_layer *lenet_like(uint64_t seed) {
  ag_rng rng = ag_rng_new(seed);
  return ag_sequential(
      (ag_layer *[]){ ag_conv2d_layer(1, 3, 3, 1, 1, &rng), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_conv2d_layer(3, 4, 3, 1, 0, &rng), ag_relu_layer(), ag_avg_pool2d_layer(2, 2),
                      ag_flatten_layer(), ag_linear(16, 5, &rng) },
      8);
}

static ag_layer *charlm_like(uint64_t seed) {
  ag_rng rng = ag_rng_new(seed);
  return ag_sequential((ag_layer *[]){ ag_embedding_layer(6, 3, &rng) }, 1);
}

/* The rest of the character model: reshape the window's embeddings, two
 * linear layers with tanh between (made from their own seed). */
static ag_layer *charlm_head(uint64_t seed) {
  ag_rng rng = ag_rng_new(seed);
  return ag_sequential((ag_layer *[]){ ag_linear(6, 5, &rng), ag_tanh_layer(), ag_linear(5, 6, &rng) }, 3);
}

/* Three steps; losses[3]; the parameters and gradients after, as host
 * tensors (params: value then grad, per parameter). */
static size_t train3(gpu_pool *dev, bool lm, const batch *b, float losses[3], tensor **out, size_t max) {
  ag_tape *tape = ag_tape_new(0);
  ag_tape_use(tape);
  ag_layer *net = lm ? charlm_like(5) : lenet_like(5), *head = lm ? charlm_head(6) : NULL;
  assert_non_null(net);
  ag_layer *all = lm ? ag_sequential((ag_layer *[]){ net, head }, 2) : net;   /* one model, for the optimizer */
  assert_non_null(all);
  if (dev) assert_int_equal(ag_layer_to(all, dev), 0);
  ag_optim *opt = lm ? ag_adam_new(all, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f) : ag_sgd_new(all, 0.05f, 0.9f, 0.0f);
  assert_non_null(opt);
  tensor *x = dev ? tensor_to(b->x, dev) : tensor_alias(b->x), *y = dev ? tensor_to(b->y, dev) : tensor_alias(b->y);
  gpu_stats st;
  int64_t device_allocs = 0;
  for (int s = 0; s < 3; s++) {
    ag_var *h;
    if (lm) {
      h = ag_layer_forward(net, ag_input(x));
      h = ag_layer_forward(head, ag_reshape(h, 2, (int64_t[]){ x->shape[0], -1 }));
    } else {
      h = ag_layer_forward(net, ag_input(x));
    }
    ag_var *loss = ag_cross_entropy(h, y);
    if (loss == NULL) fail_msg("step %d: %s / %s", s, ag_error(), tensor_error());
    assert_ptr_equal(tensor_device(loss->value), dev);
    tensor_error_clear();
    losses[s] = tensor_item(loss->value);
    ag_optim_zero_grad(opt);
    if (ag_backward(loss) != 0) fail_msg("backward: %s / %s", ag_error(), tensor_error());
    ag_optim_step(opt);
    ag_tape_reset(tape);
    if (tensor_error()[0] || ag_error()[0]) fail_msg("step %d: %s / %s", s + 1, tensor_error(), ag_error());
    if (dev) {
      gpu_pool_stats(dev, &st);
      if (s == 0) device_allocs = st.num_device_alloc;
      else assert_int_equal(st.num_device_alloc, device_allocs);   /* steady state: the cache serves */
    }
  }
  ag_var *ps[16];
  size_t n = ag_layer_params(all, ps, 16), k = 0;
  for (size_t i = 0; i < n && k + 2 <= max; i++) {
    assert_ptr_equal(tensor_device(ps[i]->value), dev);
    assert_ptr_equal(tensor_device(ps[i]->grad), dev);
    out[k++] = tensor_to(ps[i]->value, NULL);
    out[k++] = tensor_to(ps[i]->grad, NULL);
  }
  tensor_free(x);
  tensor_free(y);
  ag_optim_free(opt);
  ag_layer_free(all);
  ag_tape_use(NULL);
  ag_tape_free(tape);
  return k;
}

static void compare_models(bool lm, const batch *b) {
  assert_int_equal(gpu_backend_host()->init(0), GPU_OK);
  gpu_pool *dev = gpu_pool_new(gpu_backend_host(), NULL);
  assert_non_null(dev);
  float lc[3], ld[3];
  tensor *pc[32], *pd[32];
  size_t nc = train3(NULL, lm, b, lc, pc, 32), nd = train3(dev, lm, b, ld, pd, 32);
  assert_int_equal(nc, nd);
  assert_int_equal(nc, lm ? 10 : 12);
  for (int s = 0; s < 3; s++)
    if (!(fabsf(lc[s] - ld[s]) <= 1e-5f * fabsf(lc[s])))
      fail_msg("step %d loss: CPU %.9g, device %.9g", s + 1, lc[s], ld[s]);
  assert_true(lc[2] < lc[0]);   /* it learns */
  for (size_t i = 0; i < nc; i++) {
    assert_int_equal(pc[i]->numel, pd[i]->numel);
    for (int64_t j = 0; j < pc[i]->numel; j++) {
      float a = tensor_f32(pc[i])[j], d = tensor_f32(pd[i])[j];
      if (!(fabsf(a - d) <= 1e-4f * fmaxf(1.0f, fabsf(a))))
        fail_msg("%s %zu element %lld: CPU %.9g, device %.9g", i % 2 ? "gradient" : "parameter", i / 2,
                 (long long)j, a, d);
    }
    tensor_free(pc[i]);
    tensor_free(pd[i]);
  }
  gpu_pool_empty_cache(dev);
  gpu_stats st;
  gpu_pool_stats(dev, &st);
  assert_int_equal(st.allocated_bytes[GPU_STAT_ALL].current, 0);   /* every device buffer went back */
  gpu_pool_destroy(dev);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_lenet_shape_matches_cpu(void **state) {
  (void)state;
  batch b = { values(TS(4, 1, 12, 12), 11),
              tensor_from_i32((const int32_t[]){ 3, 0, 4, 1 }, TS(4)) };
  compare_models(false, &b);
  tensor_free(b.x);
  tensor_free(b.y);
}

static void test_charlm_shape_matches_cpu(void **state) {
  (void)state;
  batch b = { tensor_from_i32((const int32_t[]){ 0, 5, 2, 2, 4, 1, 3, 3 }, TS(4, 2)),
              tensor_from_i32((const int32_t[]){ 1, 2, 5, 0 }, TS(4)) };
  compare_models(true, &b);
  tensor_free(b.x);
  tensor_free(b.y);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_gradients_match_cpu),
    cmocka_unit_test(test_param_on_device),
    cmocka_unit_test(test_layer_to_and_back),
    cmocka_unit_test(test_softmax_backward_on_device),
    cmocka_unit_test(test_lenet_shape_matches_cpu),
    cmocka_unit_test(test_charlm_shape_matches_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
