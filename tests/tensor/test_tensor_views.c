/* test_tensor_views.c - tensors on the ledger: one "tensor.storage" and one
 * "tensor.header" block per new tensor, a hold from each header to its
 * storage, the storage refcount = the headers on it; views (reshape, slice,
 * select, transpose, permute, squeeze, unsqueeze, expand, batch) allocate no
 * data; views and parents freed in any order free the storage exactly once
 * with no ref.underflow; 10,000 reshape+slice+free leave nothing live. */
#include "harness.h"
#include "tensor_test.h"

#include <stdlib.h>

static void test_make_free(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *t = tensor_zeros(TENSOR_F32, TS(2, 3));
  assert_non_null(t);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 1);
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 1);
  TA_ASSERT_ALLOCS_SINCE(m, TA_ANY, 2);
  assert_int_equal(ta_since(m, T_STORAGE).live_bytes, 64 + 6 * 4);   /* header line + data */
  assert_int_equal(ta_block_tag(tensor_storage_block(t)), T_STORAGE);
  assert_int_equal(ta_block_tag(t), T_HEADER);
  assert_int_equal(tensor_storage_refs(t), 1);
  assert_int_equal(ta_hold_check(t), 0);
  expect_shape(t, 2, 3);
  assert_int_equal(t->strides[0], 3);
  assert_int_equal(t->strides[1], 1);
  assert_int_equal(t->numel, 6);
  assert_true(tensor_is_contiguous(t));
  assert_int_equal((uintptr_t)t->data % 64, 0);
  for (int i = 0; i < 6; i++) assert_true(tensor_f32(t)[i] == 0.0f);
  tensor_free(t);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_since(m, T_STORAGE).frees, 1);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_errors, 0);
}

static void test_from_get_set(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  float v[6] = { 1, 2, 3, 4, 5, 6 };
  int32_t l[3] = { 7, -1, 9 };
  tensor *a = tensor_from_f32(v, TS(3, 2)), *b = tensor_from_i32(l, TS(3)), *s = tensor_scalar(3.5f);
  assert_true(tensor_get(a, (int64_t[]){ 2, 1 }) == 6.0f);
  tensor_set(a, (int64_t[]){ 1, 0 }, -3.0f);
  assert_true(v[2] == 3.0f);                         /* a copy, not the caller's array */
  assert_true(tensor_f32(a)[2] == -3.0f);
  assert_int_equal(b->dtype, TENSOR_I32);
  assert_int_equal(tensor_i32(b)[1], -1);
  assert_int_equal(s->ndim, 0);
  assert_int_equal(s->numel, 1);
  assert_true(tensor_item(s) == 3.5f);
  tensor *r = tensor_randn(TS(1000), 2.0f, 7), *r2 = tensor_randn(TS(1000), 2.0f, 7);
  double mean = 0, var = 0;
  for (int i = 0; i < 1000; i++) mean += tensor_f32(r)[i] / 1000.0;
  for (int i = 0; i < 1000; i++) var += pow(tensor_f32(r)[i] - mean, 2) / 1000.0;
  assert_true(fabs(mean) < 0.2 && fabs(sqrt(var) - 2.0) < 0.2);
  assert_memory_equal(r->data, r2->data, 4000);      /* same seed, same numbers */
  tensor *ar = tensor_arange(5);
  assert_true(tensor_f32(ar)[4] == 4.0f);
  tensor_free(a);
  tensor_free(b);
  tensor_free(s);
  tensor_free(r);
  tensor_free(r2);
  tensor_free(ar);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(n_errors, 0);
}

static void test_views_zero_copy(void **state) {
  (void)state;
  ta_mark m0 = ta_mark_now();
  tensor *ar = tensor_arange(24);
  tensor *t = tensor_reshape(ar, TS(2, 3, 4));
  tensor_free(ar);
  tensor *b = tensor_arange(3);
  ta_mark m = ta_mark_now();

  tensor *r = tensor_reshape(t, TS(4, -1));
  expect_shape(r, 4, 6);
  assert_true(elem(r, 13) == 13.0f);
  tensor *s = tensor_slice(t, 2, 1, 4, 2);           /* [..., 1:4:2] */
  expect_shape(s, 2, 3, 2);
  assert_true(tensor_get(s, (int64_t[]){ 1, 2, 1 }) == 23.0f);
  assert_true(tensor_get(s, (int64_t[]){ 0, 1, 0 }) == 5.0f);
  tensor *sn = tensor_slice(t, -2, -2, 3, 1);        /* axis 1, [1:3] */
  expect_shape(sn, 2, 2, 4);
  assert_true(tensor_get(sn, (int64_t[]){ 0, 0, 0 }) == 4.0f);
  tensor *tr = tensor_transpose(t, 0, 2);
  expect_shape(tr, 4, 3, 2);
  assert_true(tensor_get(tr, (int64_t[]){ 3, 1, 0 }) == 7.0f);
  assert_false(tensor_is_contiguous(tr));
  tensor *p = tensor_permute(t, (int[]){ 2, 0, 1 });
  expect_shape(p, 4, 2, 3);
  assert_true(tensor_get(p, (int64_t[]){ 1, 1, 2 }) == 12 + 2 * 4 + 1);
  tensor *u = tensor_unsqueeze(t, 1);
  expect_shape(u, 2, 1, 3, 4);
  tensor *q = tensor_squeeze(u, 1);
  expect_shape(q, 2, 3, 4);
  tensor *u2 = tensor_unsqueeze(t, 3);
  expect_shape(u2, 2, 3, 4, 1);
  tensor *qa = tensor_squeeze(u2, TENSOR_ALL);
  expect_shape(qa, 2, 3, 4);
  tensor *sel = tensor_select(t, 1, 2);
  expect_shape(sel, 2, 4);
  assert_true(tensor_get(sel, (int64_t[]){ 1, 3 }) == 23.0f);
  tensor *e = tensor_expand(b, TS(2, 3));
  expect_shape(e, 2, 3);
  assert_int_equal(e->strides[0], 0);
  assert_true(tensor_get(e, (int64_t[]){ 1, 2 }) == 2.0f);
  tensor *fl = tensor_flatten(sel);                  /* a strided select: needs a copy */
  tensor *al = tensor_alias(t);
  tensor *c = tensor_contiguous(t);                  /* contiguous already: a view */

  /* 15 headers (the flatten copy made one more, freed), one small copy */
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 1);           /* the flatten copy only */
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 15);
  assert_int_equal(ta_since(m, T_STORAGE).live_bytes, 64 + 8 * 4);
  assert_int_equal(tensor_storage_refs(t), 13);   /* t and its 12 views */
  assert_int_equal(tensor_storage_refs(e), 2);
  assert_ptr_equal(tensor_storage_block(s), tensor_storage_block(t));
  assert_ptr_equal(c->data, t->data);
  expect_close(fl, ((float[]){ 8, 9, 10, 11, 20, 21, 22, 23 }), 8);

  /* writes through a view are the parent's */
  tensor_set(tr, (int64_t[]){ 3, 1, 0 }, -7.0f);
  assert_true(tensor_get(t, (int64_t[]){ 0, 1, 3 }) == -7.0f);
  assert_true(tensor_get(r, (int64_t[]){ 1, 1 }) == -7.0f);

  /* the parent goes first: the views keep the storage */
  const void *blk = tensor_storage_block(t);
  tensor_free(t);
  assert_int_equal(ta_ref_count(blk), 12);
  assert_true(tensor_get(s, (int64_t[]){ 1, 2, 1 }) == 23.0f);
  tensor *views[] = { r, s, sn, tr, p, u, q, u2, qa, sel, al, c };
  for (size_t i = 0; i < sizeof views / sizeof *views; i++) {
    assert_int_equal(ta_hold_check(views[i]), 0);
    tensor_free(views[i]);
  }
  assert_int_equal(ta_ref_count(blk), -1);           /* the last view freed it (fl is a copy) */
  assert_int_equal(ta_since(m0, T_STORAGE).frees, 1);   /* t's; fl is a view of its copy, still live */
  tensor_free(fl);
  tensor_free(e);
  tensor_free(b);
  TA_ASSERT_NO_LEAKS_SINCE(m0);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_errors, 0);
}

static void test_reshape_slice_10000(void **state) {
  (void)state;
  tensor *t = tensor_randn(TS(4, 6), 1.0f, 1);
  ta_mark m = ta_mark_now();
  for (int i = 0; i < 10000; i++) {
    tensor *v = tensor_reshape(t, TS(6, 4));
    tensor *s = tensor_slice(v, 0, 1, 5, 2);
    if (s->shape[0] != 2 || s->data != (float *)t->data + 4) fail_msg("iteration %d: wrong view", i);
    tensor_free(s);
    tensor_free(v);
  }
  TA_ASSERT_NO_LEAKS_SINCE(m);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 0);
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 20000);
  assert_int_equal(ta_since(m, TA_ANY).frees, 20000);
  assert_int_equal(tensor_storage_refs(t), 1);
  tensor_free(t);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_batches_of_60000(void **state) {
  (void)state;
  tensor *images = tensor_empty(TENSOR_F32, TS(60000, 1, 28, 28));
  tensor *labels = tensor_empty(TENSOR_I32, TS(60000));
  assert_non_null(images);
  int64_t nb = tensor_batch_count(images, 64);
  assert_int_equal(nb, 938);                         /* 937 full batches and one of 32 */
  for (int64_t i = 0; i < nb; i++) {
    tensor_f32(images)[i * 64 * 784] = (float)i;       /* the first pixel of each batch */
    tensor_i32(labels)[i * 64] = (int32_t)(i % 10);
  }
  ta_mark m = ta_mark_now();
  for (int64_t i = 0; i < nb; i++) {
    tensor *x = tensor_batch(images, i, 64), *y = tensor_batch(labels, i, 64);
    int64_t n = i < nb - 1 ? 64 : 32;
    if (x->shape[0] != n || y->shape[0] != n || x->shape[3] != 28 || !tensor_is_contiguous(x))
      fail_msg("batch %lld: bad shape", (long long)i);
    if (x->data != (float *)images->data + i * 64 * 784 || tensor_f32(x)[0] != (float)i ||
        tensor_i32(y)[0] != (int32_t)(i % 10))
      fail_msg("batch %lld: not a view of its rows", (long long)i);
    tensor_free(x);
    tensor_free(y);
  }
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 0);
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 2 * 938);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_null(tensor_batch(images, 938, 64));
  assert_int_equal(tensor_last_status(), TENSOR_ERANGE);
  assert_string_equal(last_error, "tensor_batch: batch 938 out of range (938 batches of 64 in f32[60000,1,28,28])");
  tensor_free(images);
  tensor_free(labels);
}

/* Every order of freeing a parent and 3 views of its storage. */
static void test_free_orders(void **state) {
  (void)state;
  int perm[4] = { 0, 1, 2, 3 };
  int orders = 0;
  for (;;) {
    ta_mark m = ta_mark_now();
    tensor *h[4];
    h[0] = tensor_arange(12);
    h[1] = tensor_reshape(h[0], TS(3, 4));
    h[2] = tensor_transpose(h[1], 0, 1);
    h[3] = tensor_slice(h[0], 0, 2, 10, 3);
    const void *blk = tensor_storage_block(h[0]);
    assert_int_equal(ta_ref_count(blk), 4);
    for (int k = 0; k < 4; k++) {
      tensor_free(h[perm[k]]);
      if (k < 3) {
        assert_int_equal(ta_ref_count(blk), 3 - k);
        assert_int_equal(ta_since(m, T_STORAGE).frees, 0);
        assert_int_equal(ta_since(m, T_STORAGE).live_blocks, 1);
        /* a survivor still reads the data */
        tensor *alive = h[perm[3]];
        assert_true(elem(alive, 0) == (perm[3] == 3 ? 2.0f : 0.0f));
      }
    }
    assert_int_equal(ta_since(m, T_STORAGE).frees, 1);   /* freed exactly once */
    assert_int_equal(ta_ref_count(blk), -1);
    TA_ASSERT_NO_LEAKS_SINCE(m);
    assert_int_equal(ta_findings_count("ref.underflow"), 0);
    orders++;
    /* next permutation */
    int i = 2;
    while (i >= 0 && perm[i] > perm[i + 1]) i--;
    if (i < 0) break;
    int j = 3;
    while (perm[j] < perm[i]) j--;
    int x = perm[i]; perm[i] = perm[j]; perm[j] = x;
    for (int a = i + 1, b = 3; a < b; a++, b--) x = perm[a], perm[a] = perm[b], perm[b] = x;
  }
  assert_int_equal(orders, 24);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_contiguous_copies_only_when_needed(void **state) {
  (void)state;
  tensor *a = tensor_arange(6);
  tensor *t = tensor_reshape(a, TS(2, 3));
  tensor_free(a);
  ta_mark m = ta_mark_now();
  tensor *c1 = tensor_contiguous(t);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 0);
  tensor *tr = tensor_transpose(t, 0, 1);
  tensor *c2 = tensor_contiguous(tr);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 1);
  expect_shape(c2, 3, 2);
  assert_true(tensor_is_contiguous(c2));
  expect_close(c2, ((float[]){ 0, 3, 1, 4, 2, 5 }), 6);
  tensor *c3 = tensor_clone(t);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 2);
  assert_ptr_not_equal(c3->data, t->data);
  /* view refuses what reshape copies */
  assert_null(tensor_view(tr, TS(6)));
  assert_int_equal(tensor_last_status(), TENSOR_ESHAPE);
  assert_string_equal(last_error,
                      "tensor_view: the strides of f32[3,2] allow no view as f32[6] (use tensor_reshape)");
  tensor *r = tensor_reshape(tr, TS(6));
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 3);
  expect_close(r, ((float[]){ 0, 3, 1, 4, 2, 5 }), 6);
  /* a view of a transposed tensor that merges no crossed axes is fine */
  tensor *v = tensor_view(tr, TS(3, 1, 2));
  assert_non_null(v);
  assert_true(tensor_get(v, (int64_t[]){ 2, 0, 1 }) == 5.0f);
  TA_ASSERT_ALLOCS_SINCE(m, T_STORAGE, 3);
  tensor *parts[] = { c1, tr, c2, c3, r, v, t };
  for (size_t i = 0; i < 7; i++) tensor_free(parts[i]);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_view_keeps_storage(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *t = tensor_full(TS(100), 2.5f);
  tensor *s = tensor_slice(t, 0, 90, 100, 1);
  tensor_free(t);
  assert_int_equal(ta_since(m, T_STORAGE).live_blocks, 1);
  assert_int_equal(ta_since(m, T_HEADER).live_blocks, 1);
  assert_int_equal(tensor_storage_refs(s), 1);
  assert_true(tensor_f32(s)[9] == 2.5f);
  assert_int_equal(ta_check(tensor_f32(s) + 9), 1);
  tensor_free(s);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* tensor_view_: the header itself takes the shape; no block, no reference. */
static void test_view_in_place(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *t = tensor_arange(12);
  ta_mark m2 = ta_mark_now();
  assert_int_equal(tensor_view_(t, TS(3, -1)), TENSOR_OK);
  TA_ASSERT_ALLOCS_SINCE(m2, TA_ANY, 0);
  expect_shape(t, 3, 4);
  assert_int_equal(tensor_storage_refs(t), 1);
  assert_true(tensor_get(t, (int64_t[]){ 2, 1 }) == 9.0f);
  assert_int_equal(tensor_view_(t, TS(12)), TENSOR_OK);
  expect_shape(t, 12);
  assert_true(tensor_is_contiguous(t));
  tensor *r = tensor_reshape(t, TS(3, 4)), *tt = tensor_transpose(r, 0, 1);   /* [4,3], strides 1,4 */
  tensor_free(r);
  assert_int_equal(tensor_view_(tt, TS(12)), TENSOR_ESHAPE);
  assert_string_equal(last_error, "tensor_view_: the strides of f32[4,3] allow no view as f32[12]");
  n_errors--;
  expect_shape(tt, 4, 3);                                  /* unchanged */
  assert_int_equal(tensor_view_(tt, TS(2, 2, 3)), TENSOR_OK);   /* the first axis split */
  assert_true(tensor_get(tt, (int64_t[]){ 1, 0, 2 }) == 10.0f);   /* tt[2][2] = t[2*4 + 2] */
  assert_int_equal(tensor_view_(t, TS(5, -1)), TENSOR_ESHAPE);
  n_errors--;
  tensor_free(tt);
  tensor_free(t);
  assert_int_equal(n_errors, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_make_free, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_from_get_set, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_views_zero_copy, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_reshape_slice_10000, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_batches_of_60000, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_free_orders, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_contiguous_copies_only_when_needed, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_view_keeps_storage, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_view_in_place, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
