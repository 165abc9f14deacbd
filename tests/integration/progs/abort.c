/* abort() after leaking 60 bytes: the report comes, the status is SIGABRT's. */
#include <stdlib.h>
#include "common.h"

NOINLINE void leak_before_abort(void) { char *p = malloc(60); memset(p, 6, 60); escape(p); }

int main(void) {
  leak_before_abort();
  clobber_stack();
  say("aborting\n");
  abort();
}
