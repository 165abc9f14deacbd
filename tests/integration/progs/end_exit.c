/* Ends by exit(3) from a function, after the last pointer to a block died
 * deep in a call chain (see ends.h): 100 bytes definitely lost. */
#include "ends.h"

static NOINLINE void finish(int status) {
  say("exiting\n");
  exit(status);
}

int main(void) {
  keep_global();
  lose_deep();
  finish(3);
}
