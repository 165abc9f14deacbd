/* test_tensor_ledger.c - the bugs the ledger exists for, committed on
 * tensors on purpose, and what it says:
 *   - a view released once too often (its destructor's extra decrement):
 *     the parent's storage dies under it; the parent's hold on it is
 *     hold.dangling, the parent's own release is ref.underflow, and tensor/
 *     frees nothing twice;
 *   - a forgotten view: at a scan, its header is leak.direct (tag
 *     tensor.header, made in tensor_reshape) and, once the parent is gone,
 *     the storage it keeps is leak.indirect (tag tensor.storage). */
#include "harness.h"
#include "support.h"
#include "tensor_test.h"

#include <stdlib.h>

static int setup(void **state) {
  errors_setup(state);
  return messages_setup(state);
}

static int teardown(void **state) {
  errors_teardown(state);
  return messages_teardown(state);
}

static void test_release_once_too_often(void **state) {
  (void)state;
  tensor *t = tensor_arange(8);
  tensor *v = tensor_reshape(t, TS(2, 4));
  const void *blk = tensor_storage_block(t);
  assert_int_equal(ta_ref_count(blk), 2);
  ta_ref_release((void *)blk);                       /* the bug: a view's extra decrement */
  tensor_free(v);                                    /* count 0: the storage is freed under t */
  assert_int_equal(ta_findings_count(NULL), 0);      /* nothing wrong can be seen yet */
  assert_int_equal(ta_hold_check(t), 1);             /* t holds a freed storage */
  assert_int_equal(ta_findings_count("hold.dangling"), 1);
  assert_true(the_finding("hold.dangling").tag == T_STORAGE);
  tensor_free(t);                                    /* releases a dead storage: underflow, no second free */
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_int_equal(ta_findings_count("free.double"), 0);
  assert_int_equal(ta_findings_count("free.invalid"), 0);
  ta_finding f = the_finding("ref.underflow");
  assert_int_equal(f.addr, (uintptr_t)blk);
  assert_int_equal(f.tag, T_STORAGE);
  assert_int_not_equal(f.free_stack, 0);             /* where the storage was freed: in tensor_free(v) */
  assert_int_equal(n_messages, 2);
}

NOIPA static void forget_a_view(tensor *t) {
  tensor *v = tensor_reshape(t, TS(4, 2));
  tensor_f32(v)[0] = 1.0f;
  v = NULL;                                          /* the bug: the only pointer is dropped */
  KEEP();
}

static void test_forgotten_view(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  tensor *t = tensor_arange(8);
  forget_a_view(t);
  tensor_free(t);                                    /* the view keeps the storage */
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.direct"), 1);
  ta_finding f = the_finding("leak.direct");
  assert_int_equal(f.tag, T_HEADER);
  assert_int_equal(f.bytes, sizeof(tensor));
  assert_int_equal(ta_findings_count("leak.indirect"), 1);
  assert_int_equal(the_finding("leak.indirect").tag, T_STORAGE);
  assert_int_equal(ta_findings_count("leak.orphan"), 0);   /* the storage is held, by the lost view */
  assert_int_equal(ta_since(m, TA_ANY).live_blocks, 2);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_release_once_too_often, setup, teardown),
    cmocka_unit_test_setup_teardown(test_forgotten_view, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
