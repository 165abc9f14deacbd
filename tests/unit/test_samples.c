/* test_samples.c - the ledger's samples at marks (samples.h, marks.c), the
 * timeline of a page rendered in the process: each mark's time and live
 * bytes by tag, the peak between marks as the high, and a bounded series
 * that merges neighbours when full and keeps every mark counted. */
#include "harness.h"
#include "internal.h"
#include "samples.h"

#include <stdlib.h>
#include <string.h>

static ta_sample got[TA_SAMPLES + 1];

/* A block freed between two marks shows as the second sample's high, not
 * its low; a block kept shows in both. */
static void test_samples_at_marks(void **state) {
  (void)state;
  ta_tag a = ta_tag_get("samples.kept"), b = ta_tag_get("samples.brief");
  assert_true(a < TA_SAMPLE_TAGS && b < TA_SAMPLE_TAGS);
  assert_true(_ta_samples_start_ns() > 0);
  void *kept = ta_alloc(a, 1000);
  ta_mark m1 = ta_mark_now();
  void *brief = ta_alloc(b, 500);
  ta_free(brief);
  ta_mark m2 = ta_mark_now();
  bool other = true;
  size_t n = _ta_samples_read(got, TA_SAMPLES, &other);
  assert_int_equal(n, 2);
  assert_false(other);
  assert_int_equal(got[0].mark, m1);
  assert_int_equal(got[1].mark, m2);
  assert_int_equal(got[0].marks, 1);
  assert_true(got[0].ns >= _ta_samples_start_ns() && got[1].ns >= got[0].ns);
  assert_int_equal(got[0].hi[a], 1000);
  assert_int_equal(got[0].lo[a], 1000);
  assert_int_equal(got[1].lo[a], 1000);
  assert_int_equal(got[0].hi[b], 0);
  assert_int_equal(got[1].hi[b], 500);      /* the peak between the marks */
  assert_int_equal(got[1].lo[b], 0);
  assert_true(got[1].hi[0] >= 1500 && got[1].lo[0] >= 1000);
  ta_sample now;
  _ta_samples_now(&now);
  assert_int_equal(now.hi[a], 1000);
  assert_int_equal(now.lo[b], 0);
  assert_int_equal(now.mark, 0);
  ta_free(kept);
  ta_mark_free(m1);
  ta_mark_free(m2);
}

/* 1000 marks more: between TA_SAMPLES / 2 and TA_SAMPLES samples, every
 * mark counted once, in order; the one brief block shows in exactly one
 * sample's high. */
static void test_samples_bounded(void **state) {
  (void)state;
  enum { MARKS = 1000, BRIEF_AT = 700 };
  ta_tag c = ta_tag_get("samples.spike");
  assert_true(c < TA_SAMPLE_TAGS);
  ta_mark last = 0;
  for (int i = 0; i < MARKS; i++) {
    if (i == BRIEF_AT) ta_free(ta_alloc(c, 4096));
    ta_mark m = ta_mark_now();
    if (last) ta_mark_free(last);
    last = m;
  }
  size_t n = _ta_samples_read(got, TA_SAMPLES + 1, NULL);
  assert_true(n >= TA_SAMPLES / 2 && n <= TA_SAMPLES + 1);
  uint64_t marks = 0, spikes = 0;
  for (size_t i = 0; i < n; i++) {
    marks += got[i].marks;
    if (i) {
      assert_true(got[i].mark > got[i - 1].mark);
      assert_true(got[i].ns >= got[i - 1].ns);
    }
    if (got[i].hi[c]) {
      assert_int_equal(got[i].hi[c], 4096);
      spikes++;
    }
    assert_int_equal(got[i].lo[c], 0);
  }
  assert_int_equal(marks, 2 + MARKS);        /* test_samples_at_marks's two */
  assert_int_equal(spikes, 1);
  assert_int_equal(got[n - 1].mark, last);
  ta_mark_free(last);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_samples_at_marks),
    cmocka_unit_test(test_samples_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
