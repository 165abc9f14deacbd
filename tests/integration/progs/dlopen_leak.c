/* dlopen a library, leak from inside it, dlclose it, exit: the leaks'
 * allocating functions live in an unloaded library and must still be named. */
#include <dlfcn.h>
#include <stdlib.h>
#include "common.h"
#include "dlleak.h"

int main(int argc, char **argv) {
  (void)argc;
  char path[4096];
  snprintf(path, sizeof path, "%s", argv[0]);
  char *slash = strrchr(path, '/');
  snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "libdlleak.so");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) { say("dlopen failed\n"); return 2; }
  int c = dlleak_run(h);
  if (c < 0) { say("dlsym failed\n"); return 2; }
  if (dlclose(h) != 0) { say("dlclose failed\n"); return 2; }
  clobber_stack();
  say("library unloaded (%d)\n", c);
  return 0;
}
