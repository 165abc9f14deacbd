/* pvalloc: rounds the size up to a whole page, page-aligned.  Leaks one
 * pvalloc(100) block (4096 bytes, as glibc counts it) and frees another.
 * valgrind 3.19 does not support pvalloc (it aborts the program), so this
 * program is not checked against valgrind. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include "common.h"

NOINLINE void leak_pvalloc(void) {
  char *p = pvalloc(100);
  memset(p, 1, 4096);                      /* the whole page is ours */
  escape(p);
}

int main(void) {
  leak_pvalloc();
  void *q = pvalloc(1);
  int ok = ((uintptr_t)q & 4095) == 0;
  free(q);
  clobber_stack();
  say(ok ? "pvalloc: ok\n" : "pvalloc: misaligned\n");
  return !ok;
}
