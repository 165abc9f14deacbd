/* gpu_test.h - what the gpu tests share (include after harness.h):
 *
 *   B                    the host backend, initialised (host_setup)
 *   up(host, n)          a new device array of n floats holding host[0..n)
 *   up_i(host, n)        the same for int32
 *   down(dev, n)         a static host copy of n floats of a device array
 *   dfree(p)             frees a device array of up/up_i
 *   expect_near(got, want, n, tol)  each element within tol relative to
 *                        max(1, |want|), failing with the first index that is not
 *   rnd(state)           a deterministic float in [-1, 1) */
#ifndef TAGALLOC_GPU_TEST_H
#define TAGALLOC_GPU_TEST_H

#include "harness.h"
#include "gpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const gpu_backend *B;

static inline int host_setup(void **state) {
  (void)state;
  B = gpu_backend_host();
  return B->init(0) == GPU_OK ? 0 : -1;
}

static inline void *up_bytes(const void *host, size_t bytes) {
  void *d = NULL;
  assert_int_equal(B->alloc(&d, bytes ? bytes : 4), GPU_OK);
  if (bytes) assert_int_equal(B->memcpy_h2d(d, host, bytes, NULL), GPU_OK);
  return d;
}
static inline float *up(const float *host, int64_t n) { return up_bytes(host, (size_t)n * 4); }
static inline int32_t *up_i(const int32_t *host, int64_t n) { return up_bytes(host, (size_t)n * 4); }
static inline float *dnew(int64_t n) {   /* uninitialised device floats */
  void *d = NULL;
  assert_int_equal(B->alloc(&d, n ? (size_t)n * 4 : 4), GPU_OK);
  return d;
}

static float down_buf[1 << 20];
static inline const float *down(const float *dev, int64_t n) {
  assert_true(n <= (int64_t)(sizeof down_buf / 4));
  assert_int_equal(B->memcpy_d2h(down_buf, dev, (size_t)n * 4, NULL), GPU_OK);
  assert_int_equal(B->stream_synchronize(NULL), GPU_OK);
  return down_buf;
}

static inline void dfree(const void *p) { assert_int_equal(B->free((void *)p), GPU_OK); }

static inline void expect_near(const float *got, const float *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++) {
    double scale = fabs(want[i]) > 1.0 ? fabs(want[i]) : 1.0;
    if (!(fabs((double)got[i] - want[i]) <= tol * scale)) {
      fprintf(stderr, "element %lld: got %.9g, want %.9g\n", (long long)i, got[i], want[i]);
      fail();
    }
  }
}

static inline float rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((*s >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

#endif
