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
 * summed back, relu, tanh and their gradients, mul, the scalar op, sum. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_gradients_match_cpu),
    cmocka_unit_test(test_param_on_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
