/* train_device.h - what the training programs' --device runs share
 * (train_lenet_device.h, train_charlm_device.h): the backend chosen by
 * word, a caching pool over it, checked calls, and parameter-like buffers
 * that a model holds (ta_hold) and counts references to (ta_ref_*), as
 * device tensors do, so an extra reference is ref.leak and the pool's purge
 * will not free it.  Include after train_common.h. */
#ifndef TRAIN_DEVICE_H
#define TRAIN_DEVICE_H

#include "gpu.h"

/* The backend for --device WORD (host, cuda, auto), initialised; dies with
 * one line when it cannot run.  auto's note, if any, goes to stderr. */
static const gpu_backend *dev_backend(const char *word) {
  char why[640], note[640];
  const gpu_backend *b = gpu_backend_select(word, why, sizeof why, note, sizeof note);
  if (note[0]) fprintf(stderr, "%s\n", note);
  if (b == NULL) tc_die("--device %s: %s", word, why);
  return b;
}

static void dev_check(gpu_status st, const char *what, const gpu_backend *b) {
  if (st != GPU_OK) tc_die("device: %s: %s: %s", what, gpu_status_name(st), b->last_error());
}

/* n floats (or int32) of device memory from the pool. */
static float *dev_alloc(gpu_pool *p, int64_t n) {
  float *x = gpu_pool_alloc(p, (size_t)(n > 0 ? n : 1) * sizeof(float), NULL);
  if (x == NULL) tc_die("device: %s", gpu_pool_error());
  return x;
}

/* A buffer holder keeps in slot, with its one reference. */
static float *dev_held(void *holder, gpu_pool *p, const char *slot, int64_t n) {
  float *x = dev_alloc(p, n);
  ta_ref_init(x, 1);
  ta_hold(holder, slot, x);
  return x;
}

/* Holder lets go of x: the buffer goes back to the pool with its last reference. */
static void dev_drop(void *holder, gpu_pool *p, const char *slot, float *x) {
  if (x == NULL) return;
  ta_unhold(holder, slot);
  if (ta_ref_release(x) == 0) gpu_pool_free(p, x);
}

/* The one-line summary of the pool after a point of the run. */
static void dev_pool_line(gpu_pool *p, char *buf, size_t len) {
  gpu_stats st;
  gpu_pool_stats(p, &st);
  snprintf(buf, len, "device: %.1f MiB reserved, %lld of %lld requests from the cache, %lld device allocations",
           (double)st.reserved_bytes[GPU_STAT_ALL].current / 1048576.0, (long long)st.num_hits,
           (long long)st.num_requests, (long long)st.num_device_alloc);
}

#endif
