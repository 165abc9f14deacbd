/* test_tensor_pool.c - the tensor pool: storages reused by dtype and shape,
 * last in first out; hits, misses, hit rate and per-key sizes exact after a
 * scripted sequence; prune (oldest first), clear, clear of one key; pooled
 * storages carry the tag "tensor.pool" and are held by the pool (no
 * leak.orphan at a scan); ops take their results from the pool in use, and
 * their workspaces from its one scratch buffer; a pool freed while tensors
 * are out goes when they come back. */
#include "harness.h"
#include "tensor_test.h"

#include <pthread.h>
#include <stdlib.h>

#define SHAPE23 TS(2, 3)

static void test_scripted_sequence(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_pool *p = tensor_pool_new();
  tensor *a = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* miss */
  tensor *b = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* miss */
  tensor *c = tensor_pool_acquire(p, TENSOR_F32, TS(4));     /* miss */
  assert_int_equal(ta_block_tag(tensor_storage_block(a)), T_POOL);
  assert_int_equal(ta_block_tag(a), T_HEADER);
  const void *sa = tensor_storage_block(a), *sb = tensor_storage_block(b), *sc = tensor_storage_block(c);
  tensor_pool_stats st = tensor_pool_stats_get(p);
  assert_int_equal(st.misses, 3);
  assert_int_equal(st.hits, 0);
  assert_int_equal(st.storages, 0);
  assert_int_equal(st.out, 3);
  assert_int_equal(tensor_pool_release(p, a), TENSOR_OK);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, SHAPE23), 1);
  tensor_free(b);                                    /* the same as release */
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, SHAPE23), 2);
  assert_int_equal(ta_ref_count(sb), 0);             /* kept at count 0 */
  tensor *d = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* hit: b's, the last in */
  tensor *e = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* hit: a's */
  tensor *f = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* miss */
  assert_ptr_equal(tensor_storage_block(d), sb);
  assert_ptr_equal(tensor_storage_block(e), sa);
  assert_int_equal(ta_ref_count(sb), 1);
  tensor *i = tensor_pool_acquire(p, TENSOR_I32, TS(4));     /* miss: another dtype */
  tensor_free(c);
  st = tensor_pool_stats_get(p);
  assert_int_equal(st.hits, 2);
  assert_int_equal(st.misses, 5);
  assert_true(st.hit_rate == 2.0 / 7.0);
  assert_int_equal(st.storages, 1);
  assert_int_equal(st.bytes, 16);
  assert_int_equal(st.keys, 1);
  assert_int_equal(st.out, 4);
  tensor_free(d);
  tensor_free(e);
  tensor_free(f);
  tensor_free(i);
  st = tensor_pool_stats_get(p);
  assert_int_equal(st.storages, 5);
  assert_int_equal(st.bytes, 3 * 24 + 16 + 16);
  assert_int_equal(st.keys, 3);
  assert_int_equal(st.out, 0);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, SHAPE23), 3);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, TS(4)), 1);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_I32, TS(4)), 1);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, TS(3, 2)), 0);
  /* what the ledger sees: 5 pooled storages live, 5 headers made and freed */
  assert_int_equal(ta_since(m, T_POOL).live_blocks, 5);
  assert_int_equal(ta_since(m, T_POOL).allocs, 5);
  assert_int_equal(ta_since(m, T_HEADER).live_blocks, 0);
  assert_int_equal(ta_since(m, T_HEADER).allocs, 7);

  /* prune: kept in the order c, d(b's), e(a's), f, i; oldest go first */
  tensor_pool_prune(p, 50);
  st = tensor_pool_stats_get(p);
  assert_int_equal(st.storages, 2);                  /* 104 -> 88 -> 64 -> 40 bytes */
  assert_int_equal(st.bytes, 40);
  assert_int_equal(ta_since(m, T_POOL).live_blocks, 2);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, TS(4)), 0);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, SHAPE23), 1);
  tensor *g = tensor_pool_acquire(p, TENSOR_F32, SHAPE23);   /* f's storage, the one left */
  assert_ptr_not_equal(tensor_storage_block(g), sa);
  assert_ptr_not_equal(tensor_storage_block(g), sb);
  tensor_free(g);
  tensor_pool_clear_key(p, TENSOR_F32, SHAPE23);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, SHAPE23), 0);
  assert_int_equal(tensor_pool_stats_get(p).storages, 1);
  tensor_pool_clear(p);
  st = tensor_pool_stats_get(p);
  assert_int_equal(st.storages, 0);
  assert_int_equal(st.bytes, 0);
  assert_int_equal(st.keys, 0);
  assert_int_equal(st.hits, 3);
  tensor_pool_reset_stats(p);
  assert_true(tensor_pool_stats_get(p).hit_rate == 0.0);
  tensor_pool_free(p);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  (void)sc;
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_errors, 0);
}

static void count_key(tensor_dtype dt, int ndim, const int64_t *shape, size_t count, size_t bytes, void *arg) {
  size_t *v = arg;
  (void)dt, (void)ndim, (void)shape;
  v[0] += count;
  v[1] += bytes;
  v[2]++;
}

static void test_views_ops_and_scan(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_pool *p = tensor_pool_new();
  /* a view keeps a pooled storage out of the pool */
  tensor *a = tensor_pool_acquire(p, TENSOR_F32, TS(8));
  tensor *v = tensor_reshape(a, TS(2, 4));
  tensor_free(a);
  assert_int_equal(tensor_pool_stats_get(p).storages, 0);
  tensor_free(v);
  assert_int_equal(tensor_pool_stats_get(p).storages, 1);

  /* ops take their results from the pool in use: after the first step,
   * every result is a hit and no storage is allocated */
  tensor *x = tensor_randn(TS(16, 16), 1.0f, 4);
  assert_null(tensor_pool_use(p));
  tensor_pool_reset_stats(p);
  ta_mark m2 = ta_mark_now();
  for (int step = 0; step < 50; step++) {
    tensor *h = tensor_matmul(x, x);
    tensor *r = tensor_relu(h);
    tensor *s = tensor_sum(r, 0, 0);
    tensor_free(h);
    tensor_free(r);
    tensor_free(s);
  }
  assert_ptr_equal(tensor_pool_use(NULL), p);
  tensor_pool_stats st = tensor_pool_stats_get(p);
  assert_int_equal(st.misses, 3);                    /* step 0: [16,16] twice and [16] */
  assert_int_equal(st.hits, 150 - 3);
  TA_ASSERT_ALLOCS_SINCE(m2, T_POOL, 3);
  TA_ASSERT_ALLOCS_SINCE(m2, T_STORAGE, 0);
  size_t v3[3] = { 0 };
  tensor_pool_visit(p, count_key, v3);
  assert_int_equal(v3[0], 4);                        /* [8], [16,16] x2, [16] */
  assert_int_equal(v3[1], 32 + 2 * 1024 + 64);
  assert_int_equal(v3[2], 3);

  /* scalars (ndim 0, shape NULL) from the pool: a loss and a full sum,
   * three times: two misses, then hits on the one key */
  tensor *labels = tensor_zeros(TENSOR_I32, TS(16));
  tensor_pool_use(p);
  tensor_pool_reset_stats(p);
  for (int step = 0; step < 3; step++) {
    tensor *ce = tensor_cross_entropy(x, labels), *s = tensor_sum(x, TENSOR_ALL, 0);
    assert_int_equal(ce->ndim, 0);
    assert_int_equal(ta_block_tag(tensor_storage_block(s)), T_POOL);
    tensor_free(ce);
    tensor_free(s);
  }
  tensor_pool_use(NULL);
  st = tensor_pool_stats_get(p);
  assert_int_equal(st.misses, 2);
  assert_int_equal(st.hits, 4);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, 0, NULL), 2);
  tensor_pool_clear_key(p, TENSOR_F32, 0, NULL);
  assert_int_equal(tensor_pool_key_size(p, TENSOR_F32, 0, NULL), 0);
  tensor_free(labels);

  /* kept storages are held by the pool: a scan finds no orphan, no leak */
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 0);
  assert_int_equal(ta_findings_count("ref.underflow"), 0);

  /* freed with a tensor out: the pool goes when the tensor does */
  tensor *out = tensor_pool_acquire(p, TENSOR_F32, TS(16));
  tensor_pool_free(p);
  assert_int_equal(ta_since(m, T_POOL).live_blocks, 1);
  tensor_f32(out)[15] = 1.0f;
  tensor_free(out);
  tensor_free(x);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(n_errors, 0);
}

static void test_global_and_errors(void **state) {
  (void)state;
  tensor_pool *g = tensor_pool_global();
  assert_ptr_equal(tensor_pool_global(), g);
  tensor_pool *p = tensor_pool_new();
  tensor *t = tensor_pool_acquire(g, TENSOR_F32, TS(5));
  assert_int_equal(tensor_pool_release(p, t), TENSOR_EINVAL);
  assert_string_equal(last_error, "tensor_pool_release: f32[5] does not come from this pool");
  assert_int_equal(tensor_pool_release(g, t), TENSOR_OK);
  assert_int_equal(tensor_pool_key_size(g, TENSOR_F32, TS(5)), 1);
  assert_null(tensor_pool_acquire(p, TENSOR_F32, TS(2, -1)));
  assert_string_equal(last_error, "tensor_pool_acquire: bad shape f32[2,-1]");
  assert_null(tensor_pool_acquire(NULL, TENSOR_F32, TS(2)));
  assert_string_equal(last_error, "tensor_pool_acquire: pool is NULL");
  tensor_pool_free(g);                               /* the global pool is emptied, not freed */
  assert_int_equal(tensor_pool_stats_get(g).storages, 0);
  tensor *t2 = tensor_pool_acquire(g, TENSOR_F32, TS(5));
  assert_non_null(t2);
  tensor_free(t2);
  tensor_pool_clear(g);
  tensor_pool_free(p);
  assert_int_equal(n_errors, 3);
}

/* Two threads share one pool: every acquire is a hit or a miss, and the
 * storages made are at most the ones out at a time. */
static void *churn(void *arg) {
  tensor_pool *p = arg;
  for (int i = 0; i < 2000; i++) {
    tensor *a = tensor_pool_acquire(p, TENSOR_F32, TS(32));
    tensor *b = tensor_pool_acquire(p, TENSOR_F32, TS(32));
    tensor_f32(a)[31] = tensor_f32(b)[0] = (float)i;
    tensor_free(b);
    tensor_free(a);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor_pool *p = tensor_pool_new();
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, churn, p);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  tensor_pool_stats st = tensor_pool_stats_get(p);
  assert_int_equal(st.hits + st.misses, 8000);
  assert_int_equal(st.out, 0);
  assert_true(st.misses >= 2 && st.misses <= 4);
  assert_int_equal(st.storages, st.misses);
  assert_int_equal(ta_since(m, T_POOL).allocs, st.misses);
  tensor_pool_free(p);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* The ops' workspaces (im2col, packed weights) come from the pool's one
 * scratch buffer: after the first step of a conv2d and its backward
 * products, no block at all beyond the results, the same values as with no
 * pool, and the buffer goes with the pool. */
static void test_scratch(void **state) {
  (void)state;
  ta_tag T_SCRATCH = ta_tag_get("tensor.scratch");
  ta_mark m = ta_mark_now();
  tensor *x = tensor_randn(TS(4, 3, 12, 12), 1.0f, 1), *w = tensor_randn(TS(5, 3, 3, 3), 0.5f, 2);
  tensor *w2 = tensor_randn(TS(5, 3, 3, 3), 0.5f, 3);
  tensor *want = tensor_conv2d(x, w, NULL, 1, 1), *want2 = tensor_conv2d(x, w2, NULL, 2, 0);
  tensor *dx_want = tensor_conv2d_grad_input(want, w, 4, x->shape, 1, 1);
  tensor *dw_want = tensor_conv2d_grad_weight(want, x, 4, w->shape, 1, 1);
  TA_ASSERT_ALLOCS_SINCE(m, T_SCRATCH, 0);           /* no pool: a tensor each */
  tensor_pool *p = tensor_pool_new();
  tensor_pool_use(p);
  ta_mark m2 = 0;
  for (int step = 0; step < 3; step++) {
    if (step == 1) m2 = ta_mark_now();
    tensor *y = tensor_conv2d(x, w, NULL, 1, 1), *y2 = tensor_conv2d(x, w2, NULL, 2, 0);   /* direct, im2col */
    tensor *dx = tensor_conv2d_grad_input(y, w, 4, x->shape, 1, 1);
    tensor *dw = tensor_conv2d_grad_weight(y, x, 4, w->shape, 1, 1);
    assert_memory_equal(y->data, want->data, (size_t)want->numel * 4);
    assert_memory_equal(y2->data, want2->data, (size_t)want2->numel * 4);
    assert_memory_equal(dx->data, dx_want->data, (size_t)dx_want->numel * 4);
    assert_memory_equal(dw->data, dw_want->data, (size_t)dw_want->numel * 4);
    tensor_free(y);
    tensor_free(y2);
    tensor_free(dx);
    tensor_free(dw);
  }
  TA_ASSERT_ALLOCS_SINCE(m2, TA_ANY, 4 * 2);         /* the results' headers, and no more */
  assert_int_equal(ta_since(m, T_SCRATCH).live_blocks, 1);
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);      /* held by the pool: no orphan, no leak */
  tensor_pool_use(NULL);
  tensor_pool_free(p);
  tensor_free(x), tensor_free(w), tensor_free(w2), tensor_free(want), tensor_free(want2);
  tensor_free(dx_want), tensor_free(dw_want);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_scripted_sequence, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_views_ops_and_scan, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_global_and_errors, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_threads, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_scratch, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
