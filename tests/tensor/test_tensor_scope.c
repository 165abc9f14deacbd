/* test_tensor_scope.c - scopes: what a scope made and did not escape dies
 * at its end; tensor_escape moves a tensor one scope out; nested scopes; a
 * function that returns early from inside its scopes (TENSOR_SCOPE_AUTO,
 * tensor_scope_end_to) frees what they own; escape or end with no scope open
 * is a clear error.  Exact live counts of headers and storages after each
 * step. */
#include "harness.h"
#include "tensor_test.h"

#include <stdbool.h>
#include <stdlib.h>

#define LIVE(m, tag) ta_since((m), (tag)).live_blocks

static void test_nested_and_escaped(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  assert_int_equal(tensor_scope_depth(), 0);
  assert_int_equal(tensor_scope_count(), 0);
  assert_int_equal(tensor_scope_begin(), 1);
  tensor *a = tensor_full(TS(4), 1.0f);
  tensor *b = tensor_add(a, a);
  tensor *av = tensor_reshape(a, TS(2, 2));          /* a view: a header, no storage */
  assert_int_equal(tensor_scope_count(), 3);
  assert_int_equal(tensor_scope_begin(), 2);
  assert_int_equal(tensor_scope_depth(), 2);
  assert_int_equal(tensor_scope_count(), 0);
  tensor *c = tensor_mul(b, b);
  tensor *d = tensor_exp(c);
  tensor *e = tensor_slice(d, 0, 0, 2, 1);
  assert_int_equal(tensor_scope_count(), 3);
  assert_int_equal(e->scope, 2);
  assert_ptr_equal(tensor_escape(d), d);             /* d goes to scope 1 */
  assert_int_equal(tensor_scope_count(), 2);
  assert_int_equal(LIVE(m, T_HEADER), 6);
  assert_int_equal(LIVE(m, T_STORAGE), 4);
  assert_int_equal(tensor_scope_end(), TENSOR_OK);   /* c, e die; c's storage too */
  assert_int_equal(tensor_scope_depth(), 1);
  assert_int_equal(tensor_scope_count(), 4);         /* a, b, av, d */
  assert_int_equal(LIVE(m, T_HEADER), 4);
  assert_int_equal(LIVE(m, T_STORAGE), 3);
  assert_true(fabsf(tensor_f32(d)[3] - expf(4.0f)) <= 1e-6f * expf(4.0f));   /* not libm: within 1e-7 relative */
  /* freeing a scoped tensor by hand takes it out of its scope */
  tensor_free(av);
  assert_int_equal(tensor_scope_count(), 3);
  assert_ptr_equal(tensor_escape(b), b);             /* out of every scope */
  assert_int_equal(tensor_scope_count(), 2);
  assert_int_equal(tensor_scope_end(), TENSOR_OK);
  assert_int_equal(tensor_scope_depth(), 0);
  assert_int_equal(LIVE(m, T_HEADER), 1);            /* b only */
  assert_int_equal(LIVE(m, T_STORAGE), 1);
  assert_true(tensor_f32(b)[0] == 2.0f);
  tensor_free(b);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_errors, 0);
}

/* A function with an error path from inside a scope. */
static tensor *forward(const tensor *x, int fail_at) {
  TENSOR_SCOPE_AUTO;
  tensor *h = tensor_relu(x);
  tensor *h2 = tensor_mul_scalar(h, 2.0f);
  if (fail_at == 1) return NULL;                     /* h, h2 freed by the cleanup */
  if (fail_at == 2) {
    tensor *bad = tensor_add(h2, tensor_zeros(TENSOR_F32, TS(3)));   /* [4] + [3]: an error */
    if (bad == NULL) return NULL;
  }
  tensor *y = tensor_sum(h2, TENSOR_ALL, 0);
  return tensor_escape(y);
}

/* Two scopes deep, an early return through tensor_scope_end_to. */
static tensor *two_deep(const tensor *x, bool fail) {
  int base = tensor_scope_depth();
  tensor_scope_begin();
  tensor *a = tensor_exp(x);
  tensor_scope_begin();
  tensor *b = tensor_add(a, a);
  if (fail) {
    tensor_scope_end_to(base);
    return NULL;
  }
  tensor_escape(tensor_escape(b));
  tensor_scope_end_to(base);
  return b;
}

static void test_early_exit(void **state) {
  (void)state;
  tensor *x = tensor_from_f32((float[]){ -1, 2, -3, 4 }, TS(4));
  ta_mark m = ta_mark_now();
  assert_null(forward(x, 1));
  assert_int_equal(tensor_scope_depth(), 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_null(forward(x, 2));
  assert_int_equal(n_errors, 1);
  assert_int_equal(last_error_status, TENSOR_ESHAPE);
  assert_string_equal(last_error, "tensor_add: shapes f32[4] and f32[3] do not broadcast");
  assert_int_equal(tensor_scope_depth(), 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  tensor_error_clear();
  tensor *y = forward(x, 0);
  assert_non_null(y);
  assert_true(tensor_item(y) == 12.0f);
  assert_int_equal(LIVE(m, T_HEADER), 1);
  assert_int_equal(LIVE(m, T_STORAGE), 1);
  tensor_free(y);
  TA_ASSERT_NO_LEAKS_SINCE(m);

  /* inside an outer scope of the caller's */
  tensor_scope_begin();
  tensor *keep = tensor_neg(x);
  assert_null(two_deep(x, true));
  assert_int_equal(tensor_scope_depth(), 1);
  assert_int_equal(tensor_scope_count(), 1);
  assert_int_equal(LIVE(m, T_HEADER), 1);
  tensor *b = two_deep(x, false);
  assert_non_null(b);
  assert_int_equal(tensor_scope_count(), 2);         /* keep, and b escaped into this scope */
  assert_int_equal(LIVE(m, T_STORAGE), 2);
  assert_true(tensor_f32(keep)[0] == 1.0f);
  tensor_scope_end();
  TA_ASSERT_NO_LEAKS_SINCE(m);
  tensor_free(x);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_misuse(void **state) {
  (void)state;
  tensor *t = tensor_zeros(TENSOR_F32, TS(2));
  assert_null(tensor_escape(t));
  assert_int_equal(tensor_last_status(), TENSOR_ESCOPE);
  assert_string_equal(last_error, "tensor_escape: no scope is open (escaping f32[2])");
  assert_int_equal(tensor_scope_end(), TENSOR_ESCOPE);
  assert_string_equal(last_error, "tensor_scope_end: no scope is open");
  tensor_scope_begin();
  assert_null(tensor_escape(t));                     /* made outside any scope */
  assert_string_equal(last_error, "tensor_escape: f32[2] belongs to no scope");
  tensor_scope_end();
  assert_int_equal(n_errors, 3);
  assert_true(tensor_f32(t)[1] == 0.0f);             /* untouched by the scope */
  tensor_free(t);
}

static void test_many_in_scope(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *w = tensor_randn(TS(8, 8), 1.0f, 9);
  for (int step = 0; step < 100; step++) {
    tensor_scope_begin();
    tensor *h = w;
    for (int l = 0; l < 5; l++) h = tensor_tanh(tensor_matmul(h, w));
    if (tensor_scope_count() != 10) fail_msg("step %d: %zu in scope", step, tensor_scope_count());
    tensor_scope_end();
    if (LIVE(m, TA_ANY) != 2) fail_msg("step %d: %llu live", step, (unsigned long long)LIVE(m, TA_ANY));
  }
  tensor_free(w);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_nested_and_escaped, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_early_exit, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_misuse, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(test_many_in_scope, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
