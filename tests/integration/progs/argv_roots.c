/* Blocks whose only pointers are in the program's own argument and
 * environment arrays, which the kernel puts at the top of the main
 * thread's stack mapping, above the stack pointer main starts with.  A
 * program may rewrite its arguments in place: ld replaces each "-lNAME" by
 * a longer string of its own.  Those arrays are roots as the stack is:
 * memcheck reads them, and an auditor that ends the main thread's stack
 * where glibc's pthread_getattr_np does (the page after __libc_stack_end)
 * loses whatever lies beyond that page.
 *
 * Run with fewer than 1,000 arguments, the program execs itself with 1,000
 * (8,000 bytes of argv: its end lies past that page wherever the stack
 * starts), and that image keeps
 *   24 bytes in argv[1]               (the stack pointer's page: a control),
 *   40 bytes in argv[999]             (pages above it),
 *   56 bytes in the last environ slot (above argv),
 * 120 bytes in 3 blocks, all still reachable, nothing lost.  The image that
 * calls exec allocates nothing. */
#include <stdlib.h>
#include "common.h"

#define NARGS 1000

extern char **environ;

static char *args[NARGS + 1];      /* static: the first image allocates nothing */

NOINLINE void keep_in(char **slot, size_t size) {
  char *p = malloc(size);
  memset(p, 'a', size - 1);
  p[size - 1] = '\0';
  *slot = p;
}

int main(int argc, char **argv) {
  if (argc < NARGS) {
    args[0] = argv[0];
    for (int i = 1; i < NARGS; i++) args[i] = "x";
    execv(argv[0], args);          /* a path: the harness runs it by one */
    say("exec failed\n");
    return 127;
  }
  size_t nenv = 0;
  while (environ[nenv]) nenv++;
  if (nenv == 0) { say("no environment\n"); return 2; }
  keep_in(&argv[1], 24);
  keep_in(&argv[NARGS - 1], 40);
  keep_in(&environ[nenv - 1], 56);
  clobber_stack();
  say("kept %d\n", argc);
  return 0;
}
