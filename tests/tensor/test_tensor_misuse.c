/* test_tensor_misuse.c - misuse through the public API is a finding at the
 * caller's line and an error return, never a crash: the library checks each
 * tensor argument with the ledger (ta_check_block) before reading it.
 *
 * Each case commits the bug in a function of its own (the "user's line")
 * and asserts the finding's kind, that the user's function is frame #0 of
 * its headline stack, the error return, and that the program goes on.
 * Without the checks each case reads freed memory: the pool's double
 * release and the batch from an over-released storage crashed (SIGSEGV)
 * before the ledger could report. */
#include "harness.h"
#include "support.h"
#include "tensor_test.h"

static report_ctx *ctx;

/* Is fn among the first `top` frames of stack? */
static int stack_has(uint32_t stack, const char *fn, size_t top) { return stack_has_function(ctx, stack, fn, top); }

static int misuse_setup(void **state) {
  errors_setup(state);
  n_messages = 0;
  ta_error_handler(on_finding_message, NULL);
  return 0;
}

static int misuse_teardown(void **state) {
  ta_error_handler(NULL, NULL);
  return errors_teardown(state);
}

/* ---- a second tensor_pool_release of the same tensor ------------------------------ */

NOIPA static tensor_status release_again(tensor_pool *p, tensor *t) {
  tensor_status st = tensor_pool_release(p, t);
  KEEP();
  return st;
}

static void test_pool_double_release(void **state) {
  (void)state;
  tensor_pool *p = tensor_pool_new();
  tensor *t = tensor_pool_acquire(p, TENSOR_F32, TS(8, 8));
  assert_non_null(t);
  assert_int_equal(tensor_pool_release(p, t), TENSOR_OK);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(release_again(p, t), TENSOR_EINVAL);
  assert_int_equal(ta_findings_count("free.double"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("free.double");
  assert_string_equal(stack_frame0(ctx, f.stack), "release_again");
  assert_int_equal(f.tag, T_HEADER);
  assert_int_not_equal(f.alloc_stack, 0);
  assert_int_not_equal(f.free_stack, 0);
  assert_int_equal(n_errors, 1);
  /* the pool goes on: the storage came back once */
  assert_int_equal(tensor_pool_stats_get(p).storages, 1);
  tensor *u = tensor_pool_acquire(p, TENSOR_F32, TS(8, 8));
  assert_non_null(u);
  assert_int_equal(tensor_pool_release(p, u), TENSOR_OK);
  tensor_pool_free(p);
  assert_int_equal(ta_findings_count(NULL), 1);
}

/* ---- a pooled tensor's events: one stack walk for several, each the caller's ------- */

/* The pool's steady traffic records every event, but the events of one call
 * at one stack walk (ta_ref_acquire_at, ta_hold_at ...): the storage's
 * history still names, for each transition, the user's function that made
 * or freed the tensor, and each step makes exactly one header and no
 * storage. */
NOIPA static tensor *take_one(tensor_pool *p) {
  tensor *t = tensor_pool_acquire(p, TENSOR_F32, TS(4, 4));
  KEEP();
  return t;
}

NOIPA static void give_back(tensor *t) {
  tensor_free(t);
  KEEP();
}

NOIPA static long release_extra(tensor *t) {
  long n = ta_ref_release((void *)tensor_storage_block(t));
  KEEP();
  return n;
}

static void test_pool_events_at_callers_stacks(void **state) {
  (void)state;
  tensor_pool *p = tensor_pool_new();
  give_back(take_one(p));                   /* the storage is made: a miss */
  ta_mark m = ta_mark_now();
  for (int i = 0; i < 3; i++) give_back(take_one(p));
  TA_ASSERT_ALLOCS_SINCE(m, T_HEADER, 3);
  TA_ASSERT_ALLOCS_SINCE(m, T_POOL, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_since(m, T_HEADER).frees, 3);
  assert_int_equal(tensor_pool_stats_get(p).hits, 3);
  ta_mark_free(m);
  assert_int_equal(ta_findings_count(NULL), 0);

  tensor *t = take_one(p);
  const void *s = tensor_storage_block(t);
  assert_int_equal(release_extra(t), 0);
  assert_int_equal(release_extra(t), -1);   /* ref.underflow, with the history */
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, (uintptr_t)s);
  /* init, 4 x (-1 give_back), 4 x (+1 take_one) interleaved, 2 x release_extra */
  assert_int_equal(a.f.history_len, 11);
  assert_int_equal(a.history[0].delta, 0);
  for (size_t i = 1; i < 9; i++) {
    int acquire = i % 2 == 0;
    assert_int_equal(a.history[i].delta, acquire ? +1 : -1);
    assert_int_not_equal(a.history[i].stack, 0);
    assert_true(stack_has(a.history[i].stack, acquire ? "take_one" : "give_back", 4));
    assert_false(stack_has(a.history[i].stack, acquire ? "give_back" : "take_one", TA_MAX_DEPTH));
  }
  assert_true(stack_has(a.history[9].stack, "release_extra", 2));
  assert_true(stack_has(a.history[10].stack, "release_extra", 2));
  ta_ref_acquire((void *)s);                /* back to the header's one reference */
  give_back(t);
  assert_int_equal(tensor_pool_stats_get(p).storages, 1);
  tensor_pool_free(p);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_findings_clear();
}

/* ---- batches from a storage a view's destructor released once too often ---------- */

/* A view's destructor that gives back one reference too many. */
NOIPA static void view_destroy_twice(tensor *view) {
  ta_ref_release((void *)tensor_storage_block(view));
  tensor_free(view);
  KEEP();
}

NOIPA static tensor *next_batch(const tensor *data, int64_t i) {
  tensor *b = tensor_batch(data, i, 4);
  KEEP();
  return b;
}

static void test_batch_after_view_underflow(void **state) {
  (void)state;
  tensor *data = tensor_arange(64);
  tensor *rows = tensor_view(data, TS(16, 4));
  assert_non_null(rows);
  tensor *b = next_batch(rows, 0);
  assert_non_null(b);
  tensor_free(b);
  /* data and rows hold the storage (count 2); each view destroyed gives
   * back one reference too many: the second one frees the storage under
   * data and rows */
  for (int i = 0; i < 2; i++) {
    tensor *v = tensor_slice(rows, 1, 0, 2, 1);
    assert_non_null(v);
    view_destroy_twice(v);
  }
  assert_int_equal(tensor_storage_refs(data), -1);   /* a finding: the storage is freed */
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  ta_findings_clear();
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_null(next_batch(rows, 1));         /* the next batch: a finding, not a crash */
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("ref.underflow");
  /* the headline is the extra release (not the batch that met the freed
   * storage): the later of the two releases the view's destructor made */
  assert_true(stack_has(f.stack, "view_destroy_twice", 3));
  assert_false(stack_has(f.stack, "next_batch", TA_MAX_DEPTH));
  assert_true(f.tag == T_STORAGE);
  assert_true(f.history_len >= 4);          /* init, the views' acquires, the extra release */
  assert_int_equal(last_error_status, TENSOR_EINVAL);
  assert_null(next_batch(rows, 2));
  assert_int_equal(ta_findings_count("ref.underflow"), 2);
  tensor_free(rows);                        /* releases on the freed storage: reported too */
  tensor_free(data);
  assert_int_equal(ta_findings_count("ref.underflow"), 4);
  assert_int_equal(ta_findings_count(NULL), 4);
}

/* ---- use and free of a freed tensor ---------------------------------------------- */

NOIPA static tensor *add_them(const tensor *a, const tensor *b) {
  tensor *r = tensor_add(a, b);
  KEEP();
  return r;
}

NOIPA static void free_it(tensor *t) {
  tensor_free(t);
  KEEP();
}

static void test_use_and_free_after_free(void **state) {
  (void)state;
  tensor *a = tensor_full(TS(3), 1.0f), *b = tensor_full(TS(3), 2.0f);
  tensor_free(a);
  assert_null(add_them(a, b));
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  ta_finding f = the_finding("use.after-free");
  /* tensor_add's helper made the check: the user's function is next */
  assert_true(stack_has(f.stack, "add_them", 2));
  assert_int_equal(f.tag, T_HEADER);
  assert_null(add_them(b, a));
  assert_int_equal(ta_findings_count("use.after-free"), 2);
  assert_int_equal(n_errors, 2);
  free_it(a);
  assert_int_equal(ta_findings_count("free.double"), 1);
  assert_string_equal(stack_frame0(ctx, the_finding("free.double").stack), "free_it");
  assert_int_equal(tensor_storage_refs(a), -1);
  assert_int_equal(tensor_nbytes(a), 0);
  assert_int_equal(ta_findings_count(NULL), 5);
  /* the live one is untouched */
  assert_float_equal(tensor_item(tensor_sum(b, TENSOR_ALL, 0)), 6.0f, 0);
  tensor_free(b);
}

/* ---- the check costs nothing on good tensors --------------------------------------- */

static void test_good_tensors_no_findings(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *a = tensor_randn(TS(4, 5), 1.0f, 1), *w = tensor_randn(TS(3, 5), 1.0f, 2);
  tensor *y = tensor_matmul_t(a, 0, w, 1);   /* a transposed descriptor on the stack inside */
  tensor *z = tensor_add_scalar(y, 1.0f);    /* a scalar on the stack inside */
  assert_int_equal(tensor_mul_scalar_(z, 2.0f), TENSOR_OK);
  assert_int_equal(tensor_add_scalar_(z, 1.0f), TENSOR_OK);
  tensor_free(z);
  tensor_free(y);
  tensor_free(w);
  tensor_free(a);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_errors, 0);
}

int main(void) {
  ctx = report_ctx_new();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_pool_double_release, misuse_setup, misuse_teardown),
    cmocka_unit_test_setup_teardown(test_batch_after_view_underflow, misuse_setup, misuse_teardown),
    cmocka_unit_test_setup_teardown(test_use_and_free_after_free, misuse_setup, misuse_teardown),
    cmocka_unit_test_setup_teardown(test_good_tensors_no_findings, misuse_setup, misuse_teardown),
    cmocka_unit_test_setup_teardown(test_pool_events_at_callers_stacks, misuse_setup, misuse_teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  report_ctx_free(ctx);
  ta_findings_clear();
  return r;
}
