/* Ends its image by exec (of /bin/true), after the last pointer to a block
 * died deep in a call chain (see ends.h): 100 bytes definitely lost in the
 * image that calls exec. */
#include "ends.h"

static NOINLINE void finish(void) {
  say("exec\n");
  char *argv[] = { "true", NULL };
  execv("/bin/true", argv);
  say("exec failed\n");
  _exit(127);
}

int main(void) {
  keep_global();
  lose_deep();
  finish();
}
