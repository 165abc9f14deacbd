/* dlopen a library by a relative name and keep it loaded: ld.so's own
 * blocks for it (its link map, its name, its search list) are live at exit
 * and held from ld.so's data, still reachable, as memcheck counts them; the
 * library's leak is direct, and the block only its global holds is
 * reachable, since the library is still there. */
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#include "common.h"
#include "dlleak.h"

int main(int argc, char **argv) {
  (void)argc;
  if (chdir_to_program(argv[0]) != 0) { say("chdir failed\n"); return 2; }
  void *h = dlopen("./libdlleak.so", RTLD_NOW | RTLD_LOCAL);   /* a name of fixed length */
  if (!h) { say("dlopen failed\n"); return 2; }
  int c = dlleak_run(h);
  if (c < 0) { say("dlsym failed\n"); return 2; }
  h = NULL;
  clobber_stack();
  say("library kept (%d)\n", c);
  return 0;
}
