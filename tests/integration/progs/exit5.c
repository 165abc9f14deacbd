/* _exit(5) after leaking 50 bytes: no atexit handlers run, the report still
 * comes and the status is 5. */
#include <stdlib.h>
#include "common.h"

NOINLINE void leak_then_exit(void) { char *p = malloc(50); memset(p, 5, 50); escape(p); }

static void never(void) { say("atexit ran\n"); }

int main(void) {
  atexit(never);
  leak_then_exit();
  clobber_stack();
  say("calling _exit(5)\n");
  _exit(5);
}
