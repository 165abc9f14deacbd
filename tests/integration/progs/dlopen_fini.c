/* The heap at exit is the heap after every library's destructors, as
 * memcheck reads it: a library dlopen'ed and kept is finalized by ld.so
 * after the auditor's preload (it was loaded after it), and its destructor
 * frees one block (300 bytes: not reported) and drops the only pointer to
 * another (200 bytes: definitely lost).  ld.so's four blocks for the
 * library are still reachable, as in dlopen_keep (a name of the same
 * length). */
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
#include "common.h"

int main(int argc, char **argv) {
  (void)argc;
  if (chdir_to_program(argv[0]) != 0) { say("chdir failed\n"); return 2; }
  void *h = dlopen("./libdlfini.so", RTLD_NOW | RTLD_LOCAL);   /* as long as "./libdlleak.so" */
  if (!h) { say("dlopen failed\n"); return 2; }
  void (*setup)(void) = (void (*)(void))dlsym(h, "fini_setup");
  if (!setup) { say("dlsym failed\n"); return 2; }
  setup();
  h = NULL;
  clobber_stack();
  say("library kept\n");
  return 0;
}
