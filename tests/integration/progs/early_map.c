/* A block whose only pointer lies in a mapping a library's constructor
 * made before the ledger started (libearlymap.so, linked): 64 bytes still
 * reachable.  That library also mapped and unmapped a second region at
 * start, which is no root. */
#include <stdlib.h>
#include <sys/mman.h>
#include "common.h"

extern void **early_region;

NOINLINE void keep_early(void) {
  early_region[100] = malloc(64);
  memset(early_region[100], 'e', 64);
}

int main(void) {
  if (early_region == MAP_FAILED) { say("mmap failed\n"); return 2; }
  keep_early();
  clobber_stack();
  say("kept\n");
  return 0;
}
