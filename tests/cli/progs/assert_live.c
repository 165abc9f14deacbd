/* assert_live.c - TA_ASSERT_NO_LEAKS_SINCE fails on a block made in
 * forgotten_block(): the assertion must print that function's name and
 * file:line, not bare return addresses (tests/cli/run.sh). */
#include "tagalloc.h"

static ta_tag tag;

__attribute__((noinline)) static void *forgotten_block(void) { return ta_alloc(tag, 48); }

int main(void) {
  tag = ta_tag_get("cli.test");
  ta_mark m = ta_mark_now();
  void *volatile p = forgotten_block();
  (void)p;
  TA_ASSERT_NO_LEAKS_SINCE(m);
  return 0;
}
