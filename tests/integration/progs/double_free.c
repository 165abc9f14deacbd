/* A double free: allocated in alloc_it, freed in first_free, freed again in
 * do_double_free.  The auditor reports it and the program goes on (glibc
 * itself would abort, so the bare run differs). */
#include <stdlib.h>
#include "common.h"

NOINLINE char *alloc_it(void) { char *p = malloc(32); memset(p, 0, 32); return p; }
NOINLINE void first_free(char *p) { free(p); }
NOINLINE void do_double_free(char *p) { free(p); }

int main(void) {
  char *p = alloc_it();
  first_free(p);
  do_double_free(p);
  char *q = malloc(32);
  free(q);
  say("still running after the double free\n");
  return 0;
}
