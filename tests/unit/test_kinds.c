/* test_kinds.c - the table of finding kinds (kinds.c): each name maps to
 * its kind and back, the classes and the severity order the reports sort
 * by, the text report's titles, and what a kind the table does not know
 * (a name given to ta_finding_add, a newer trace's) gets. */
#include "harness.h"
#include "kinds.h"

#include <string.h>

static void test_names_round_trip(void **state) {
  (void)state;
  for (int k = 0; k < TA_KIND_COUNT; k++) {
    assert_non_null(ta_kinds[k].name);
    assert_int_equal(ta_kind_of(ta_kind_name((ta_kind)k)), k);
    assert_int_equal(ta_kind_rank(ta_kinds[k].name), k);
  }
  assert_string_equal(ta_kind_name(TA_KIND_FREE_DOUBLE), "free.double");
  assert_string_equal(ta_kind_name(TA_KIND_GPU_POOL_RETAINED), "gpu.pool-retained");
  assert_string_equal(ta_kind_name(TA_KIND_UNCLASSIFIED), "unclassified");
  assert_int_equal(ta_kind_of("leak.direct"), TA_KIND_LEAK_DIRECT);
  assert_int_equal(ta_kind_of("leak.nosuch"), TA_KIND_UNKNOWN);
  assert_int_equal(ta_kind_of(NULL), TA_KIND_UNKNOWN);
  assert_string_equal(ta_kind_name(TA_KIND_UNKNOWN), "unknown");
}

static void test_classes(void **state) {
  (void)state;
  /* errors */
  const char *errors[] = { "use.after-free", "heap.overflow", "free.double", "free.invalid", "arena.after-reset",
                           "ref.underflow", "hold.dangling", "hold.stack", "gpu.purge-referenced" };
  for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
    assert_true(ta_kind_is_error(errors[i]));
    assert_false(ta_kind_is_leak(errors[i]));
    assert_false(ta_kind_is_held(errors[i]));
  }
  const char *leaks[] = { "leak.direct", "leak.orphan", "gpu.leak", "leak.indirect", "ref.leak",
                          "gpu.pool-retained", "leak.possible" };
  for (size_t i = 0; i < sizeof leaks / sizeof *leaks; i++) {
    assert_true(ta_kind_is_leak(leaks[i]));
    assert_false(ta_kind_is_error(leaks[i]));
  }
  /* still-held memory is neither a leak nor an error */
  assert_true(ta_kind_is_held("leak.growth"));
  assert_false(ta_kind_is_leak("leak.growth"));
  assert_true(ta_kind_is_held("unclassified"));
  assert_false(ta_kind_is_error("unclassified"));
  assert_int_equal(ta_kind_class_of("leak.growth"), TA_CLASS_HELD);
}

static void test_severity(void **state) {
  (void)state;
  /* errors before leaks, leaks before held memory */
  assert_int_equal(ta_kind_rank("use.after-free"), 0);
  assert_true(ta_kind_rank("gpu.purge-referenced") < ta_kind_rank("leak.direct"));
  assert_true(ta_kind_rank("leak.direct") < ta_kind_rank("leak.indirect"));
  assert_true(ta_kind_rank("leak.possible") < ta_kind_rank("leak.growth"));
  assert_int_equal(ta_kind_rank("unclassified"), TA_KIND_COUNT - 1);
  for (int k = 1; k < TA_KIND_COUNT; k++) assert_true(ta_kinds[k - 1].kclass <= ta_kinds[k].kclass);
}

static void test_titles(void **state) {
  (void)state;
  assert_string_equal(ta_kind_title("leak.direct"), "Direct leak");
  assert_string_equal(ta_kind_title("leak.orphan"), "Orphaned leak");
  assert_string_equal(ta_kind_title("gpu.pool-retained"), "GPU memory retained by the pool");
  assert_null(ta_kind_title("ref.leak"));
  assert_null(ta_kind_title("free.double"));
  assert_null(ta_kind_title("leak.nosuch"));
}

/* A name the table does not know: a leak by its name ("leak.*", "*.leak"),
 * otherwise an error, ranked with the last kind of its class. */
static void test_unknown(void **state) {
  (void)state;
  assert_true(ta_kind_is_leak("leak.custom"));
  assert_true(ta_kind_is_leak("cache.leak"));
  assert_int_equal(ta_kind_rank("cache.leak"), TA_KIND_LEAK_POSSIBLE);
  assert_true(ta_kind_is_error("my.misuse"));
  assert_int_equal(ta_kind_rank("my.misuse"), TA_KIND_GPU_PURGE_REFERENCED);
  assert_false(ta_kind_is_leak("leakage"));
  assert_true(ta_kind_is_error(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_names_round_trip),
    cmocka_unit_test(test_classes),
    cmocka_unit_test(test_severity),
    cmocka_unit_test(test_titles),
    cmocka_unit_test(test_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
