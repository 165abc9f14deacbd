/* tensor_test.h - what the tensor tests share (include after harness.h):
 *
 *   T_STORAGE, T_HEADER, T_POOL    the tensor tags (tags_setup fills them)
 *   expect_close(t, want, n)      t's elements in row-major order within
 *                                 1e-5 relative (plus 1e-6 absolute) of want
 *   expect_shape(t, ndim, ...)    t's exact shape
 *   errors_setup / teardown       a handler that keeps the last tensor error
 *                                 (n_errors, last_error) instead of printing it */
#ifndef TAGALLOC_TENSOR_TEST_H
#define TAGALLOC_TENSOR_TEST_H

#include "harness.h"
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static ta_tag T_STORAGE, T_HEADER, T_POOL;

static int n_errors;
static tensor_status last_error_status;
static char last_error[256];

static inline void keep_error(tensor_status st, const char *message, void *arg) {
  (void)arg;
  n_errors++;
  last_error_status = st;
  snprintf(last_error, sizeof last_error, "%s", message);
}

static inline int errors_setup(void **state) {
  (void)state;
  T_STORAGE = ta_tag_get("tensor.storage");
  T_HEADER = ta_tag_get("tensor.header");
  T_POOL = ta_tag_get("tensor.pool");
  n_errors = 0;
  last_error[0] = '\0';
  last_error_status = TENSOR_OK;
  tensor_error_clear();
  tensor_error_handler(keep_error, NULL);
  ta_findings_clear();
  return 0;
}

static inline int errors_teardown(void **state) {
  (void)state;
  tensor_error_handler(NULL, NULL);
  return 0;
}

/* Row-major element i of t (any strides), as float. */
static inline float elem(const tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->strides[d];
    i /= t->shape[d];
  }
  return t->dtype == TENSOR_F32 ? ((const float *)t->data)[off] : (float)((const int32_t *)t->data)[off];
}

#define expect_close(t, want, n) expect_close_at(__FILE__, __LINE__, (t), (want), (n))
static inline void expect_close_at(const char *file, int line, const tensor *t, const float *want, int64_t n) {
  if (t == NULL) fail_msg("%s:%d: tensor is NULL (%s)", file, line, tensor_error());
  if (t->numel != n) fail_msg("%s:%d: %lld elements, want %lld", file, line, (long long)t->numel, (long long)n);
  for (int64_t i = 0; i < n; i++) {
    double got = elem(t, i), d = fabs(got - want[i]);
    if (!(d <= 1e-5 * fabs(want[i]) + 1e-6))
      fail_msg("%s:%d: element %lld is %.9g, want %.9g", file, line, (long long)i, got, want[i]);
  }
}

#define expect_ints(t, want, n) expect_ints_at(__FILE__, __LINE__, (t), (want), (n))
static inline void expect_ints_at(const char *file, int line, const tensor *t, const int32_t *want, int64_t n) {
  if (t == NULL) fail_msg("%s:%d: tensor is NULL (%s)", file, line, tensor_error());
  if (t->dtype != TENSOR_I32) fail_msg("%s:%d: not i32", file, line);
  if (t->numel != n) fail_msg("%s:%d: %lld elements, want %lld", file, line, (long long)t->numel, (long long)n);
  for (int64_t i = 0; i < n; i++)
    if ((int32_t)elem(t, i) != want[i])
      fail_msg("%s:%d: element %lld is %d, want %d", file, line, (long long)i, (int32_t)elem(t, i), want[i]);
}

#define expect_shape(t, ...) expect_shape_at(__FILE__, __LINE__, (t), TS(__VA_ARGS__))
#define expect_scalar_shape(t) expect_shape_at(__FILE__, __LINE__, (t), 0, NULL)
static inline void expect_shape_at(const char *file, int line, const tensor *t, int ndim, const int64_t *shape) {
  if (t == NULL) fail_msg("%s:%d: tensor is NULL (%s)", file, line, tensor_error());
  char b[96];
  if (t->ndim != ndim) fail_msg("%s:%d: shape %s, want %d dimensions", file, line, tensor_shape_str(t, b, sizeof b), ndim);
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != shape[i])
      fail_msg("%s:%d: shape %s, axis %d should be %lld", file, line, tensor_shape_str(t, b, sizeof b), i,
               (long long)shape[i]);
}

#endif
