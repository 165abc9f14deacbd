/* train_lenet_device.h - train-lenet --device host|cuda|auto: the same
 * LeNet-5, the same initial weights (the autograd model's, copied), the same
 * data order and the same SGD or Adam, run on a gpu/ backend: every buffer
 * is device memory from a caching pool (gpu.segment, gpu.buffer on the
 * ledger), forward and backward are written out layer by layer on the
 * backend's kernels (llm.c's shape), and the loss comes back once a step.
 * Included by train_lenet.c after its data helpers.
 *
 * The model holds each parameter's device buffer (ta_hold) and counts its
 * references (ta_ref_*), as device tensors do: a reference left over at exit
 * is ref.leak on the buffer, and the pool's purge will not free it.
 * --fault gpu-clone-retain reproduces seed 003: the weights are "cloned"
 * into a layer collection that takes a reference and never drops it; at the
 * end the model lets go, the buffers stay referenced, and a purge frees only
 * what nothing references (the refused buffers are gpu.purge-referenced;
 * at exit ref.leak and gpu.leak name the clone's line). */
#ifndef TRAIN_LENET_DEVICE_H
#define TRAIN_LENET_DEVICE_H

#include "train_device.h"

enum { DP_C1W, DP_C1B, DP_C2W, DP_C2B, DP_F1W, DP_F1B, DP_F2W, DP_F2B, DP_F3W, DP_F3B, DP_N };

static const char *const dp_names[DP_N] = { "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                            "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias",
                                            "fc3.weight",   "fc3.bias" };
static const int64_t dp_numel[DP_N] = { 6 * 25, 6, 16 * 6 * 25, 16, 120 * 400, 120, 84 * 120, 84, 10 * 84, 10 };

/* The device model: a ledger block (tag "gpu.model") that holds its
 * parameter, gradient and optimizer buffers. */
typedef struct {
  const gpu_backend *b;
  gpu_pool *pool;
  float *w[DP_N];       /* parameters */
  float *g[DP_N];       /* their gradients */
  float *m[DP_N], *v[DP_N];   /* momentum / Adam moments (v: Adam only) */
  int64_t steps;        /* optimizer steps taken */
} dev_model;

/* A layer collection the seed-003 fault clones the weights into. */
typedef struct {
  float *w[DP_N];
} dev_clones;

static float *dev_param(dev_model *d, const char *slot, int64_t n) { return dev_held(d, d->pool, slot, n); }
static void dev_unparam(dev_model *d, const char *slot, float *x) { dev_drop(d, d->pool, slot, x); }

static dev_model *dev_model_new(const gpu_backend *b, gpu_pool *pool, ag_layer *net, int adam) {
  ag_var *params[DP_N + 1];
  if (ag_layer_params(net, params, DP_N + 1) != DP_N) tc_die("device: the model has not LeNet-5's 10 parameters");
  dev_model *d = ta_calloc(ta_tag_get("gpu.model"), 1, sizeof *d);
  if (d == NULL) tc_die("device: out of memory");
  d->b = b;
  d->pool = pool;
  char slot[64];
  for (int i = 0; i < DP_N; i++) {
    const tensor *t = params[i]->value;
    if (t->numel != dp_numel[i] || !tensor_is_contiguous(t))
      tc_die("device: parameter %s has %lld elements, LeNet-5's has %lld", dp_names[i], (long long)t->numel,
             (long long)dp_numel[i]);
    d->w[i] = dev_param(d, dp_names[i], dp_numel[i]);
    dev_check(b->memcpy_h2d(d->w[i], tensor_f32(t), (size_t)dp_numel[i] * 4, NULL), "uploading the weights", b);
    snprintf(slot, sizeof slot, "%s.grad", dp_names[i]);
    d->g[i] = dev_param(d, slot, dp_numel[i]);
    snprintf(slot, sizeof slot, "%s.m", dp_names[i]);
    d->m[i] = dev_param(d, slot, dp_numel[i]);
    dev_check(b->fill(d->m[i], 0.0f, dp_numel[i], NULL), "zeroing the optimizer state", b);
    if (adam) {
      snprintf(slot, sizeof slot, "%s.v", dp_names[i]);
      d->v[i] = dev_param(d, slot, dp_numel[i]);
      dev_check(b->fill(d->v[i], 0.0f, dp_numel[i], NULL), "zeroing the optimizer state", b);
    }
  }
  return d;
}

static void dev_model_free(dev_model *d) {
  char slot[64];
  for (int i = 0; i < DP_N; i++) {
    dev_unparam(d, dp_names[i], d->w[i]);
    snprintf(slot, sizeof slot, "%s.grad", dp_names[i]);
    dev_unparam(d, slot, d->g[i]);
    snprintf(slot, sizeof slot, "%s.m", dp_names[i]);
    dev_unparam(d, slot, d->m[i]);
    snprintf(slot, sizeof slot, "%s.v", dp_names[i]);
    dev_unparam(d, slot, d->v[i]);
  }
  ta_free(d);
}

/* Seed 003: the weights cloned into a layer collection that takes a
 * reference to each buffer and never gives it back. */
__attribute__((noinline)) static dev_clones *dev_clone_retain(dev_model *d) {
  dev_clones *c = ta_calloc(ta_tag_get("gpu.clones"), 1, sizeof *c);
  if (c == NULL) tc_die("device: out of memory");
  for (int i = 0; i < DP_N; i++) {
    c->w[i] = d->w[i];
    ta_hold(c, dp_names[i], c->w[i]);
    ta_ref_acquire(c->w[i]);   /* the bug: a reference the collection never releases */
  }
  return c;
}

/* The activations and gradients of one step for a batch of b images. */
typedef struct {
  gpu_conv2d cv1, cv2;
  gpu_pool2d pl1, pl2;
  float *x, *c1, *p1, *c2, *p2, *f1, *f2, *f3, *probs, *loss, *ws;
  int32_t *y, *am1, *am2;
} dev_acts;

static void dev_forward(dev_model *d, dev_acts *a, int b, int train) {
  const gpu_backend *B = d->b;
  gpu_pool *P = d->pool;
  dev_check(gpu_conv2d_init(&a->cv1, b, 1, 28, 28, 6, 5, 5, 1, 2), "conv1 geometry", B);
  dev_check(gpu_pool2d_init(&a->pl1, b, 6, 28, 28, 2, 2), "pool1 geometry", B);
  dev_check(gpu_conv2d_init(&a->cv2, b, 6, 14, 14, 16, 5, 5, 1, 0), "conv2 geometry", B);
  dev_check(gpu_pool2d_init(&a->pl2, b, 16, 10, 10, 2, 2), "pool2 geometry", B);
  size_t ws1 = B->conv2d_workspace(&a->cv1), ws2 = B->conv2d_workspace(&a->cv2);
  size_t ws = ws1 > ws2 ? ws1 : ws2;
  a->ws = ws ? gpu_pool_alloc(P, ws, NULL) : NULL;
  if (ws && a->ws == NULL) tc_die("device: %s", gpu_pool_error());
  a->c1 = dev_alloc(P, (int64_t)b * 6 * 784);
  a->p1 = dev_alloc(P, (int64_t)b * 6 * 196);
  a->am1 = (int32_t *)dev_alloc(P, (int64_t)b * 6 * 196);
  a->c2 = dev_alloc(P, (int64_t)b * 16 * 100);
  a->p2 = dev_alloc(P, (int64_t)b * 400);
  a->am2 = (int32_t *)dev_alloc(P, (int64_t)b * 400);
  a->f1 = dev_alloc(P, (int64_t)b * 120);
  a->f2 = dev_alloc(P, (int64_t)b * 84);
  a->f3 = dev_alloc(P, (int64_t)b * 10);
  dev_check(B->conv2d_fwd(&a->cv1, a->c1, a->x, d->w[DP_C1W], d->w[DP_C1B], a->ws, NULL), "conv1", B);
  dev_check(B->relu(a->c1, a->c1, (int64_t)b * 6 * 784, NULL), "relu1", B);
  dev_check(B->max_pool_fwd(&a->pl1, a->p1, a->am1, a->c1, NULL), "pool1", B);
  dev_check(B->conv2d_fwd(&a->cv2, a->c2, a->p1, d->w[DP_C2W], d->w[DP_C2B], a->ws, NULL), "conv2", B);
  dev_check(B->relu(a->c2, a->c2, (int64_t)b * 1600, NULL), "relu2", B);
  dev_check(B->max_pool_fwd(&a->pl2, a->p2, a->am2, a->c2, NULL), "pool2", B);
  /* fc: y = x @ W^T + bias, W [out, in] */
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_TRANS, b, 120, 400, 1.0f, a->p2, 400, d->w[DP_F1W], 400, 0.0f, a->f1, 120, NULL),
            "fc1", B);
  dev_check(B->bias_add_rows(a->f1, a->f1, d->w[DP_F1B], b, 120, NULL), "fc1 bias", B);
  dev_check(B->relu(a->f1, a->f1, (int64_t)b * 120, NULL), "relu3", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_TRANS, b, 84, 120, 1.0f, a->f1, 120, d->w[DP_F2W], 120, 0.0f, a->f2, 84, NULL),
            "fc2", B);
  dev_check(B->bias_add_rows(a->f2, a->f2, d->w[DP_F2B], b, 84, NULL), "fc2 bias", B);
  dev_check(B->relu(a->f2, a->f2, (int64_t)b * 84, NULL), "relu4", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_TRANS, b, 10, 84, 1.0f, a->f2, 84, d->w[DP_F3W], 84, 0.0f, a->f3, 10, NULL),
            "fc3", B);
  dev_check(B->bias_add_rows(a->f3, a->f3, d->w[DP_F3B], b, 10, NULL), "fc3 bias", B);
  if (train) {
    a->probs = dev_alloc(P, (int64_t)b * 10);
    a->loss = dev_alloc(P, 1);
    dev_check(B->softmax_xent_fwd(a->probs, a->loss, a->f3, a->y, b, 10, NULL), "cross-entropy", B);
  }
}

/* Gradients of the mean loss into d->g, then the optimizer's step. */
static void dev_backward_update(dev_model *d, dev_acts *a, int b, const options *o) {
  const gpu_backend *B = d->b;
  gpu_pool *P = d->pool;
  float *d3 = dev_alloc(P, (int64_t)b * 10), *d2 = dev_alloc(P, (int64_t)b * 84), *d1 = dev_alloc(P, (int64_t)b * 120);
  float *dp2 = dev_alloc(P, (int64_t)b * 400), *dc2 = dev_alloc(P, (int64_t)b * 1600);
  float *dp1 = dev_alloc(P, (int64_t)b * 6 * 196), *dc1 = dev_alloc(P, (int64_t)b * 6 * 784);
  dev_check(B->softmax_xent_bwd(d3, a->probs, a->y, 1.0f, b, 10, NULL), "cross-entropy backward", B);
  /* fc3: dW = d3^T @ f2, db = column sums, dx = d3 @ W */
  dev_check(B->sgemm(GPU_TRANS, GPU_NO_TRANS, 10, 84, b, 1.0f, d3, 10, a->f2, 84, 0.0f, d->g[DP_F3W], 84, NULL), "fc3 dW", B);
  dev_check(B->sum_rows(d->g[DP_F3B], d3, b, 10, NULL), "fc3 db", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, b, 84, 10, 1.0f, d3, 10, d->w[DP_F3W], 84, 0.0f, d2, 84, NULL), "fc3 dx", B);
  dev_check(B->relu_bwd(d2, d2, a->f2, (int64_t)b * 84, NULL), "relu4 backward", B);
  dev_check(B->sgemm(GPU_TRANS, GPU_NO_TRANS, 84, 120, b, 1.0f, d2, 84, a->f1, 120, 0.0f, d->g[DP_F2W], 120, NULL), "fc2 dW", B);
  dev_check(B->sum_rows(d->g[DP_F2B], d2, b, 84, NULL), "fc2 db", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, b, 120, 84, 1.0f, d2, 84, d->w[DP_F2W], 120, 0.0f, d1, 120, NULL), "fc2 dx", B);
  dev_check(B->relu_bwd(d1, d1, a->f1, (int64_t)b * 120, NULL), "relu3 backward", B);
  dev_check(B->sgemm(GPU_TRANS, GPU_NO_TRANS, 120, 400, b, 1.0f, d1, 120, a->p2, 400, 0.0f, d->g[DP_F1W], 400, NULL), "fc1 dW", B);
  dev_check(B->sum_rows(d->g[DP_F1B], d1, b, 120, NULL), "fc1 db", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, b, 400, 120, 1.0f, d1, 120, d->w[DP_F1W], 400, 0.0f, dp2, 400, NULL), "fc1 dx", B);
  dev_check(B->max_pool_bwd(&a->pl2, dc2, dp2, a->am2, NULL), "pool2 backward", B);
  dev_check(B->relu_bwd(dc2, dc2, a->c2, (int64_t)b * 1600, NULL), "relu2 backward", B);
  dev_check(B->conv2d_bwd_weight(&a->cv2, d->g[DP_C2W], dc2, a->p1, a->ws, NULL), "conv2 dW", B);
  dev_check(B->sum_channels(d->g[DP_C2B], dc2, b, 16, 100, NULL), "conv2 db", B);
  dev_check(B->conv2d_bwd_data(&a->cv2, dp1, dc2, d->w[DP_C2W], a->ws, NULL), "conv2 dx", B);
  dev_check(B->max_pool_bwd(&a->pl1, dc1, dp1, a->am1, NULL), "pool1 backward", B);
  dev_check(B->relu_bwd(dc1, dc1, a->c1, (int64_t)b * 6 * 784, NULL), "relu1 backward", B);
  dev_check(B->conv2d_bwd_weight(&a->cv1, d->g[DP_C1W], dc1, a->x, a->ws, NULL), "conv1 dW", B);
  dev_check(B->sum_channels(d->g[DP_C1B], dc1, b, 6, 784, NULL), "conv1 db", B);
  d->steps++;
  for (int i = 0; i < DP_N; i++) {
    if (o->c.adam)
      dev_check(B->adam_step(d->w[i], d->g[i], d->m[i], d->v[i], dp_numel[i], o->c.lr, 0.9f, 0.999f, 1e-8f, 0.0f,
                             d->steps, NULL), "adam", B);
    else
      dev_check(B->sgd_step(d->w[i], d->g[i], d->m[i], dp_numel[i], o->c.lr, o->momentum, 0.0f, d->steps == 1, NULL),
                "sgd", B);
  }
  float *tmp[] = { d3, d2, d1, dp2, dc2, dp1, dc1 };
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) gpu_pool_free(P, tmp[i]);
}

static void dev_acts_free(gpu_pool *P, dev_acts *a) {
  void *all[] = { a->x, a->y, a->c1, a->p1, a->am1, a->c2, a->p2, a->am2, a->f1, a->f2, a->f3, a->probs, a->loss, a->ws };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) gpu_pool_free(P, all[i]);
  memset(a, 0, sizeof *a);
}

/* Uploads rows [i*B, i*B + b) of the data set. */
static void dev_upload(dev_model *d, dev_acts *a, const dataset *ds, int64_t i, int64_t B, int *b) {
  int64_t lo = i * B, hi = lo + B < ds->n ? lo + B : ds->n;
  *b = (int)(hi - lo);
  a->x = dev_alloc(d->pool, (int64_t)*b * 784);
  a->y = (int32_t *)dev_alloc(d->pool, *b);
  const float *x = tensor_f32(ds->x);
  const int32_t *y = tensor_i32(ds->y);
  int64_t xs = ds->x->strides[0], ys = ds->y->strides[0];
  if (xs != 784 || ys != 1) tc_die("device: the data set is not contiguous");
  dev_check(d->b->memcpy_h2d(a->x, x + lo * 784, (size_t)*b * 784 * 4, NULL), "uploading a batch", d->b);
  dev_check(d->b->memcpy_h2d(a->y, y + lo, (size_t)*b * 4, NULL), "uploading a batch", d->b);
}

static double dev_evaluate(dev_model *d, const dataset *test) {
  int64_t correct = 0, B = 1000;
  int32_t pred[1000];
  for (int64_t i = 0; i * B < test->n; i++) {
    dev_acts a = { 0 };
    int b;
    dev_upload(d, &a, test, i, B, &b);
    dev_forward(d, &a, b, 0);
    int32_t *p = (int32_t *)dev_alloc(d->pool, b);
    dev_check(d->b->argmax_rows(p, a.f3, b, 10, NULL), "argmax", d->b);
    dev_check(d->b->memcpy_d2h(pred, p, (size_t)b * 4, NULL), "downloading predictions", d->b);
    dev_check(d->b->stream_synchronize(NULL), "synchronize", d->b);
    for (int k = 0; k < b; k++) correct += pred[k] == tensor_i32(test->y)[i * B + k];
    gpu_pool_free(d->pool, p);
    dev_acts_free(d->pool, &a);
  }
  return (double)correct / (double)test->n;
}

/* The whole run on the device; returns the exit status. */
static void lenet_device_main(const options *o, ag_layer *net, dataset *train, dataset *test, int32_t *order,
                              ag_rng *rng) {
  const gpu_backend *B = dev_backend(o->device);
  gpu_pool *P = gpu_pool_new(B, NULL);
  if (P == NULL) tc_die("device: cannot make the pool");
  dev_model *d = dev_model_new(B, P, net, o->c.adam);
  dev_clones *clones = tensor_fault_get() == TENSOR_FAULT_GPU_CLONE_RETAIN ? dev_clone_retain(d) : NULL;
  printf("train-lenet: on device %s (%s)\n", B->name, B->device_name());
  int64_t nb = (train->n + o->c.batch - 1) / o->c.batch;
  int64_t steps = o->c.steps > 0 && o->c.steps < nb ? o->c.steps : nb;
  int tty = isatty(STDOUT_FILENO);
  epoch_stats *stats = calloc((size_t)o->epochs, sizeof *stats);
  if (stats == NULL) tc_die("out of memory");
  for (int e = 1; e <= o->epochs; e++) {
    shuffle(train, order, rng);
    double start = tc_now(), loss_sum = 0;
    int64_t images = 0;
    for (int64_t i = 0; i < steps; i++) {
      dev_acts a = { 0 };
      int b;
      dev_upload(d, &a, train, i, o->c.batch, &b);
      dev_forward(d, &a, b, 1);
      dev_backward_update(d, &a, b, o);
      float l;
      dev_check(B->memcpy_d2h(&l, a.loss, 4, NULL), "downloading the loss", B);
      dev_check(B->stream_synchronize(NULL), "synchronize", B);
      dev_acts_free(P, &a);
      loss_sum += l;
      images += b;
      if (!(l == l)) tc_die("device: step %lld: the loss is NaN", (long long)i + 1);
      if ((i + 1) % 100 == 0 || i + 1 == steps) {
        double rate = (double)images / (tc_now() - start);
        printf("%sepoch %d step %lld/%lld loss %.4f (mean %.4f) %.0f img/s%s", tty ? "\r" : "", e, (long long)(i + 1),
               (long long)steps, l, loss_sum / (double)(i + 1), rate, tty ? "   " : "\n");
        fflush(stdout);
      }
    }
    double seconds = tc_now() - start, acc = dev_evaluate(d, test);
    char line[256];
    dev_pool_line(P, line, sizeof line);
    epoch_stats *s = &stats[e - 1];
    *s = (epoch_stats){ .epoch = e, .train_loss = loss_sum / (double)steps, .accuracy = acc,
                        .images_per_s = (double)images / seconds, .seconds = seconds, .rss = tc_rss_bytes() };
    tc_tag_live_now(&s->by_tag);
    s->ledger_live = tc_tag_live_total(&s->by_tag);
    printf("%sepoch %d: train loss %.4f, test accuracy %.2f%%, %.0f images/s, %.1f s, %s\n", tty ? "\r" : "", e,
           s->train_loss, 100 * acc, s->images_per_s, seconds, line);
    fflush(stdout);
    if (o->c.json) write_json(o->c.json, stats, e, o);
  }
  dev_model_free(d);
  if (clones) {
    /* The "fix" of seed 003: purge the pool.  The clones' buffers are still
     * referenced: the purge refuses them and reports each. */
    size_t back = gpu_pool_purge(P);
    printf("train-lenet: the purge returned %zu bytes to the device and refused the buffers still referenced\n",
           back);
  } else {
    gpu_pool_empty_cache(P);
  }
  free(stats);
}

#endif
