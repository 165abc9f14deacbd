/* uses_ledger.c - a program built against the installed library with
 * `pkg-config --cflags --libs tagalloc` (tests/install/run.sh): it counts
 * its own allocations through the ledger. */
#include <stdio.h>
#include <tagalloc.h>

int main(void) {
  ta_tag t = ta_tag_get("install.test");
  ta_mark m = ta_mark_now();
  void *a = ta_alloc(t, 100), *b = ta_alloc(t, 200);
  ta_free(a);
  ta_counts c = ta_since(m, t);
  printf("allocs %llu live %llu bytes %llu\n", (unsigned long long)c.allocs, (unsigned long long)c.live_blocks,
         (unsigned long long)c.live_bytes);
  ta_free(b);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  return 0;
}
