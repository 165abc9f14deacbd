/* test_meta.c - the ledger's own memory (meta.c): it comes from one
 * reserved range that the ledger counts as its own, on small pages until
 * META_HUGE_AFTER (16 MiB) of it is in use and on transparent huge pages
 * (madvise) from then on; calloc'd memory is zeros and realloc keeps the
 * contents; pages given back leave RSS and read as zeros. */
#include "harness.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The VmFlags line of the mapping that holds p, in buf; false if none. */
static bool vm_flags_of(const void *p, char *buf, size_t len) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return false;
  char line[512];
  bool in = false, found = false;
  uintptr_t a = (uintptr_t)p;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = a >= lo && a < hi;
      continue;
    }
    if (in && strncmp(line, "VmFlags:", 8) == 0) {
      snprintf(buf, len, "%s", line + 8);
      found = true;
      break;
    }
  }
  fclose(f);
  return found;
}

static bool has_flag(const char *flags, const char *flag) {
  size_t n = strlen(flag);
  for (const char *s = flags; (s = strstr(s, flag)) != NULL; s += n)
    if ((s == flags || s[-1] == ' ') && (s[n] == ' ' || s[n] == '\n' || s[n] == '\0')) return true;
  return false;
}

static bool is_own(const void *p) {
  uintptr_t lo[64], hi[64];
  size_t n = _ta_own_ranges(lo, hi, 64);
  for (size_t i = 0; i < n && i < 64; i++)
    if ((uintptr_t)p >= lo[i] && (uintptr_t)p < hi[i]) return true;
  return false;
}

static void test_small_then_huge(void **state) {
  (void)state;
  char flags[512];
  char *small = _ta_meta_calloc(1, 4096);
  assert_non_null(small);
  assert_true(is_own(small));
  for (size_t i = 0; i < 4096; i++) assert_int_equal(small[i], 0);
  assert_true(vm_flags_of(small, flags, sizeof flags));
  assert_false(has_flag(flags, "hg"));           /* small pages while little is used */

  enum { N = 12, SIZE = 2 << 20 };                /* 24 MiB: past META_HUGE_AFTER */
  char *big[N];
  for (int i = 0; i < N; i++) {
    big[i] = _ta_meta_calloc(1, SIZE);
    assert_non_null(big[i]);
    assert_true(is_own(big[i]));
    assert_int_equal(big[i][0], 0);
    assert_int_equal(big[i][SIZE - 1], 0);
    memset(big[i], i + 1, SIZE);
  }
  assert_true(vm_flags_of(big[N - 1], flags, sizeof flags));
  assert_true(has_flag(flags, "hg"));            /* huge pages from then on */
  assert_true(vm_flags_of(small, flags, sizeof flags));
  assert_true(has_flag(flags, "hg"));            /* the whole range: one mapping */

  char *r = _ta_meta_realloc(big[0], 2 * SIZE);
  assert_non_null(r);
  assert_int_equal(r[0], 1);
  assert_int_equal(r[SIZE - 1], 1);
  big[0] = r;
  for (int i = 0; i < N; i++) _ta_meta_free(big[i]);

  _ta_meta_free(small);
}

/* Pages given back (_ta_meta_give_back) leave RSS (mincore: none of the
 * 64 resident), read as zeros, and the block they were part of, freed,
 * comes back zeroed from _ta_meta_calloc: the arena zeroes the memory it
 * reuses, whatever it held.  The pages around the given-back ones keep
 * their contents. */
static void test_give_back(void **state) {
  (void)state;
  enum { SIZE = 1 << 20, OFF = 16 * 4096, LEN = 64 * 4096 };
  char *p = _ta_meta_alloc(SIZE);
  assert_non_null(p);
  memset(p, 0xAB, SIZE);
  char *lo = (char *)(((uintptr_t)p + OFF + 4095) & ~(uintptr_t)4095);
  unsigned char core[64];
  assert_int_equal(mincore(lo, LEN, core), 0);
  for (int i = 0; i < 64; i++) assert_int_equal(core[i] & 1, 1);
  _ta_meta_give_back(lo, LEN);
  assert_int_equal(mincore(lo, LEN, core), 0);
  for (int i = 0; i < 64; i++) assert_int_equal(core[i] & 1, 0);
  for (size_t i = 0; i < LEN; i += 512) assert_int_equal(lo[i], 0);
  assert_int_equal((unsigned char)lo[-1], 0xAB);
  assert_int_equal((unsigned char)lo[LEN], 0xAB);
  _ta_meta_free(p);
  char *z = _ta_meta_calloc(1, SIZE);
  assert_non_null(z);
  for (size_t i = 0; i < SIZE; i += 64) assert_int_equal(z[i], 0);
  _ta_meta_free(z);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_small_then_huge),
    cmocka_unit_test(test_give_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
