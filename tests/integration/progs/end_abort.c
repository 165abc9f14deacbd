/* Ends by abort(), after the last pointer to a block died deep in a call
 * chain (see ends.h): 100 bytes definitely lost.  abort's own frame is
 * mostly unwritten (a sigset_t of which the kernel reads 8 bytes). */
#include "ends.h"

static NOINLINE void finish(void) {
  say("aborting\n");
  abort();
}

int main(void) {
  keep_global();
  lose_deep();
  finish();
}
