/* train_charlm_device.h - train-charlm --device host|cuda|auto: the same
 * character model, initial weights (the autograd model's, copied), windows
 * and optimizer, run on a gpu/ backend with every buffer from a caching
 * pool: embedding, linear, tanh, linear, cross-entropy, and their backward
 * products written out on the backend's kernels.  Included by
 * train_charlm.c after its helpers. */
#ifndef TRAIN_CHARLM_DEVICE_H
#define TRAIN_CHARLM_DEVICE_H

#include "train_device.h"

enum { CP_EMB, CP_W1, CP_B1, CP_W2, CP_B2, CP_N };

static const char *const cp_names[CP_N] = { "embedding.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" };

/* The device model (tag "gpu.model"): parameters, gradients, moments. */
typedef struct {
  const gpu_backend *b;
  gpu_pool *pool;
  int vocab;
  int64_t numel[CP_N];
  float *w[CP_N], *g[CP_N], *m[CP_N], *v[CP_N];
  int64_t steps;
} cdev_model;

static cdev_model *cdev_model_new(const gpu_backend *b, gpu_pool *pool, ag_layer *net, int vocab, int adam) {
  ag_var *params[CP_N + 1];
  if (ag_layer_params(net, params, CP_N + 1) != CP_N) tc_die("device: the model has not the 5 parameters it should");
  cdev_model *d = ta_calloc(ta_tag_get("gpu.model"), 1, sizeof *d);
  if (d == NULL) tc_die("device: out of memory");
  d->b = b;
  d->pool = pool;
  d->vocab = vocab;
  const int64_t want[CP_N] = { (int64_t)vocab * EMBED, (int64_t)HIDDEN * CTX * EMBED, HIDDEN, (int64_t)vocab * HIDDEN,
                               vocab };
  char slot[64];
  for (int i = 0; i < CP_N; i++) {
    const tensor *t = params[i]->value;
    if (t->numel != want[i] || !tensor_is_contiguous(t))
      tc_die("device: parameter %s has %lld elements, want %lld", cp_names[i], (long long)t->numel,
             (long long)want[i]);
    d->numel[i] = want[i];
    d->w[i] = dev_held(d, pool, cp_names[i], want[i]);
    dev_check(b->memcpy_h2d(d->w[i], tensor_f32(t), (size_t)want[i] * 4, NULL), "uploading the weights", b);
    snprintf(slot, sizeof slot, "%s.grad", cp_names[i]);
    d->g[i] = dev_held(d, pool, slot, want[i]);
    snprintf(slot, sizeof slot, "%s.m", cp_names[i]);
    d->m[i] = dev_held(d, pool, slot, want[i]);
    dev_check(b->fill(d->m[i], 0.0f, want[i], NULL), "zeroing the optimizer state", b);
    if (adam) {
      snprintf(slot, sizeof slot, "%s.v", cp_names[i]);
      d->v[i] = dev_held(d, pool, slot, want[i]);
      dev_check(b->fill(d->v[i], 0.0f, want[i], NULL), "zeroing the optimizer state", b);
    }
  }
  return d;
}

static void cdev_model_free(cdev_model *d) {
  char slot[64];
  for (int i = 0; i < CP_N; i++) {
    dev_drop(d, d->pool, cp_names[i], d->w[i]);
    snprintf(slot, sizeof slot, "%s.grad", cp_names[i]);
    dev_drop(d, d->pool, slot, d->g[i]);
    snprintf(slot, sizeof slot, "%s.m", cp_names[i]);
    dev_drop(d, d->pool, slot, d->m[i]);
    snprintf(slot, sizeof slot, "%s.v", cp_names[i]);
    dev_drop(d, d->pool, slot, d->v[i]);
  }
  ta_free(d);
}

/* One batch of b windows (x [b, CTX] and y [b] on the host): the mean
 * cross-entropy; with train, the gradients and the optimizer's step too. */
static float cdev_step(cdev_model *d, const int32_t *x, const int32_t *y, int64_t b, const options *o, int train) {
  const gpu_backend *B = d->b;
  gpu_pool *P = d->pool;
  int64_t V = d->vocab, K = CTX * EMBED;
  int32_t *ix = (int32_t *)dev_alloc(P, b * CTX), *iy = (int32_t *)dev_alloc(P, b);
  dev_check(B->memcpy_h2d(ix, x, (size_t)(b * CTX) * 4, NULL), "uploading a batch", B);
  dev_check(B->memcpy_h2d(iy, y, (size_t)b * 4, NULL), "uploading a batch", B);
  float *e = dev_alloc(P, b * K), *h = dev_alloc(P, b * HIDDEN), *z = dev_alloc(P, b * V);
  float *probs = dev_alloc(P, b * V), *loss = dev_alloc(P, 1);
  /* forward: e [b, CTX*EMBED] (the flattened embeddings), h = tanh(e W1^T + b1), z = h W2^T + b2 */
  dev_check(B->embedding_fwd(e, d->w[CP_EMB], ix, b * CTX, EMBED, V, NULL), "embedding", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_TRANS, (int)b, HIDDEN, (int)K, 1.0f, e, (int)K, d->w[CP_W1], (int)K, 0.0f, h,
                     HIDDEN, NULL), "fc1", B);
  dev_check(B->bias_add_rows(h, h, d->w[CP_B1], b, HIDDEN, NULL), "fc1 bias", B);
  dev_check(B->tanh(h, h, b * HIDDEN, NULL), "tanh", B);
  dev_check(B->sgemm(GPU_NO_TRANS, GPU_TRANS, (int)b, (int)V, HIDDEN, 1.0f, h, HIDDEN, d->w[CP_W2], HIDDEN, 0.0f, z,
                     (int)V, NULL), "fc2", B);
  dev_check(B->bias_add_rows(z, z, d->w[CP_B2], b, V, NULL), "fc2 bias", B);
  dev_check(B->softmax_xent_fwd(probs, loss, z, iy, b, V, NULL), "cross-entropy", B);
  if (train) {
    float *dz = dev_alloc(P, b * V), *dh = dev_alloc(P, b * HIDDEN), *de = dev_alloc(P, b * K);
    dev_check(B->softmax_xent_bwd(dz, probs, iy, 1.0f, b, V, NULL), "cross-entropy backward", B);
    dev_check(B->sgemm(GPU_TRANS, GPU_NO_TRANS, (int)V, HIDDEN, (int)b, 1.0f, dz, (int)V, h, HIDDEN, 0.0f, d->g[CP_W2],
                       HIDDEN, NULL), "fc2 dW", B);
    dev_check(B->sum_rows(d->g[CP_B2], dz, b, V, NULL), "fc2 db", B);
    dev_check(B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, (int)b, HIDDEN, (int)V, 1.0f, dz, (int)V, d->w[CP_W2], HIDDEN, 0.0f,
                       dh, HIDDEN, NULL), "fc2 dx", B);
    dev_check(B->tanh_bwd(dh, dh, h, b * HIDDEN, NULL), "tanh backward", B);
    dev_check(B->sgemm(GPU_TRANS, GPU_NO_TRANS, HIDDEN, (int)K, (int)b, 1.0f, dh, HIDDEN, e, (int)K, 0.0f, d->g[CP_W1],
                       (int)K, NULL), "fc1 dW", B);
    dev_check(B->sum_rows(d->g[CP_B1], dh, b, HIDDEN, NULL), "fc1 db", B);
    dev_check(B->sgemm(GPU_NO_TRANS, GPU_NO_TRANS, (int)b, (int)K, HIDDEN, 1.0f, dh, HIDDEN, d->w[CP_W1], (int)K, 0.0f,
                       de, (int)K, NULL), "fc1 dx", B);
    dev_check(B->fill(d->g[CP_EMB], 0.0f, d->numel[CP_EMB], NULL), "zeroing the embedding's gradient", B);
    dev_check(B->embedding_bwd(d->g[CP_EMB], de, ix, b * CTX, EMBED, V, NULL), "embedding backward", B);
    d->steps++;
    for (int i = 0; i < CP_N; i++) {
      if (o->c.adam)
        dev_check(B->adam_step(d->w[i], d->g[i], d->m[i], d->v[i], d->numel[i], o->c.lr, 0.9f, 0.999f, 1e-8f, 0.0f,
                               d->steps, NULL), "adam", B);
      else
        dev_check(B->sgd_step(d->w[i], d->g[i], d->m[i], d->numel[i], o->c.lr, 0.9f, 0.0f, d->steps == 1, NULL), "sgd",
                  B);
    }
    gpu_pool_free(P, dz);
    gpu_pool_free(P, dh);
    gpu_pool_free(P, de);
  }
  float l;
  dev_check(B->memcpy_d2h(&l, loss, 4, NULL), "downloading the loss", B);
  dev_check(B->stream_synchronize(NULL), "synchronize", B);
  void *all[] = { ix, iy, e, h, z, probs, loss };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) gpu_pool_free(P, all[i]);
  return l;
}

static double cdev_validate(cdev_model *d, const tensor *vx, const tensor *vy, int64_t B, const options *o) {
  double sum = 0;
  int64_t nb = (vy->numel + B - 1) / B;
  for (int64_t i = 0; i < nb; i++) {
    int64_t lo = i * B, b = vy->numel - lo < B ? vy->numel - lo : B;
    sum += cdev_step(d, tensor_i32(vx) + lo * CTX, tensor_i32(vy) + lo, b, o, 0);
  }
  return sum / (double)nb;
}

/* The whole run on the device, as the CPU loop of train_charlm.c: the same
 * windows (the same generator), points every --every iterations. */
static void charlm_device_main(const options *o, ag_layer *net, int vocab, const int32_t *ids, size_t ntrain,
                               const tensor *vx, const tensor *vy, tensor *xb, tensor *yb, int64_t *pos, ag_rng *rng,
                               size_t text_bytes) {
  const gpu_backend *Bk = dev_backend(o->device);
  gpu_pool *P = gpu_pool_new(Bk, NULL);
  if (P == NULL) tc_die("device: cannot make the pool");
  cdev_model *d = cdev_model_new(Bk, P, net, vocab, o->c.adam);
  printf("train-charlm: on device %s (%s)\n", Bk->name, Bk->device_name());
  const int64_t B = o->c.batch;
  int maxpoints = o->iters / o->every + 2, npoints = 0;
  point *pts = calloc((size_t)maxpoints, sizeof *pts);
  if (pts == NULL) tc_die("out of memory");
  double loss_sum = 0, start = tc_now();
  int64_t since = 0;
  for (int64_t it = 0; it < o->iters; it++) {
    for (int64_t b = 0; b < B; b++) pos[b] = (int64_t)ag_rng_below(rng, ntrain - CTX);
    fill(xb, yb, ids, pos, B);
    float l = cdev_step(d, tensor_i32(xb), tensor_i32(yb), B, o, 1);
    if (!(l == l)) tc_die("device: iteration %lld: the loss is NaN", (long long)it + 1);
    loss_sum += l;
    since++;
    int64_t done = it + 1;
    if (done % o->every == 0 || done == o->iters) {
      double seconds = tc_now() - start;
      point *p = &pts[npoints++];
      *p = (point){ .iter = done, .train_loss = loss_sum / (double)since, .iters_per_s = (double)since / seconds };
      p->val_loss = cdev_validate(d, vx, vy, B, o);
      p->rss = tc_rss_bytes();
      tc_tag_live_now(&p->by_tag);
      p->ledger_live = tc_tag_live_total(&p->by_tag);
      char line[256];
      dev_pool_line(P, line, sizeof line);
      printf("iter %lld: train loss %.4f, val loss %.4f, %.0f iters/s, %s\n", (long long)done, p->train_loss,
             p->val_loss, p->iters_per_s, line);
      fflush(stdout);
      if (o->c.json) write_json(o->c.json, pts, npoints, o, vocab, text_bytes);
      loss_sum = 0;
      since = 0;
      start = tc_now();
    }
  }
  cdev_model_free(d);
  gpu_pool_empty_cache(P);
  gpu_pool_destroy(P);
  free(pts);
}

#endif
