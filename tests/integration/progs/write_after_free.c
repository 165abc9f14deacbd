/* A write after free: 48-byte block allocated in alloc_victim, freed in
 * free_victim, then byte 40 written in scribble.  Caught when the block
 * leaves the quarantine or at exit (memcheck catches it at the write).
 * Byte 40 is past glibc's free-list links, so the bare run is not disturbed. */
#include <stdlib.h>
#include "common.h"

NOINLINE char *alloc_victim(void) { char *p = malloc(48); memset(p, 0, 48); return p; }
NOINLINE void free_victim(char *p) { free(p); }
NOINLINE void scribble(char *p) { p[40] = 'x'; }

int main(void) {
  char *p = alloc_victim();
  free_victim(p);
  scribble(p);
  p = NULL;
  say("wrote after free\n");
  return 0;
}
