/* A crash: leak 300 bytes, keep 50 reachable, then SIGSEGV.  The leak report
 * still comes and the exit status is still SIGSEGV's. */
#include <stdlib.h>
#include "common.h"

static char *g_kept;

NOINLINE void leak_before_crash(void) { char *p = malloc(300); memset(p, 1, 300); escape(p); }
NOINLINE void keep_before_crash(void) { g_kept = malloc(50); memset(g_kept, 2, 50); }

NOINLINE void do_crash(volatile int *where) { *where = 42; }

int main(void) {
  leak_before_crash();
  keep_before_crash();
  clobber_stack();
  say("about to crash\n");
  do_crash((volatile int *)16);
  say("not reached\n");
  return 0;
}
