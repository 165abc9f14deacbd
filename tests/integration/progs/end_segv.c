/* Ends by a fatal signal (SIGSEGV at a store through a bad pointer), after
 * the last pointer to a block died deep in a call chain (see ends.h): 100
 * bytes definitely lost.  The roots are the faulting context's. */
#include "ends.h"

static NOINLINE void finish(volatile int *where) {
  say("crashing\n");
  *where = 42;
}

int main(void) {
  keep_global();
  lose_deep();
  finish((volatile int *)16);
  return 0;
}
