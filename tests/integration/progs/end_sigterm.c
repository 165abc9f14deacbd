/* Ends by SIGTERM (sent to itself with kill), after the last pointer to a
 * block died deep in a call chain (see ends.h): 100 bytes definitely lost;
 * the process dies of SIGTERM. */
#include <signal.h>
#include "ends.h"

static NOINLINE void finish(void) {
  say("terminating\n");
  kill(getpid(), SIGTERM);
  say("not reached\n");
}

int main(void) {
  keep_global();
  lose_deep();
  finish();
  return 0;
}
