/* The image exec_parent execs: leaks 222 bytes, exits 3. */
#include <stdlib.h>
#include "common.h"

NOINLINE void after_exec(void) { char *p = malloc(222); memset(p, 2, 222); escape(p); }

int main(int argc, char **argv) {
  after_exec();
  clobber_stack();
  say("exec_child running (%s)\n", argc > 1 ? argv[1] : "-");
  return 3;
}
