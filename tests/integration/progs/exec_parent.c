/* exec: this image leaks 111 bytes, then execs exec_child (next to it),
 * which leaks 222 bytes and exits 3.  tagalloc reports the image that calls
 * exec under its own entry (same pid), then the new image; memcheck only
 * reports the last image. */
#include <stdlib.h>
#include "common.h"

NOINLINE void before_exec(void) { char *p = malloc(111); memset(p, 1, 111); escape(p); }

int main(int argc, char **argv) {
  (void)argc;
  char path[4096];
  snprintf(path, sizeof path, "%s", argv[0]);
  char *slash = strrchr(path, '/');
  snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "exec_child");
  before_exec();
  clobber_stack();
  say("exec'ing %s\n", "exec_child");
  char *args[] = { path, "from-parent", NULL };
  execv(path, args);
  say("exec failed\n");
  return 127;
}
