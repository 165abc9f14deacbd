/* ends.h - the programs that end each way (end_*.c): before they end, the
 * last pointer to a block dies deep in a call chain, and copies of it are
 * left in every frame of that chain.  After the chain returns they lie in
 * the dead stack below the caller, where the frames of the ending path
 * (exit's, abort's, a signal's, the auditor's own) are pushed next.  A scan
 * whose roots are the program's own frames from where it stopped finds no
 * pointer to the block: it is definitely lost, as memcheck reports it (it
 * reads only the stack words written since each frame was entered).  The
 * programs do not wipe the dead stack (no clobber_stack()): the stale
 * copies are the point.  One block stays reachable from a global. */
#ifndef ITEST_ENDS_H
#define ITEST_ENDS_H
#include <stdlib.h>
#include "common.h"

#define LOST_BYTES 100
#define KEPT_BYTES 50

static char *g_kept;

/* Copies of p in 16 slots of each of depth frames. */
static NOINLINE __attribute__((unused)) int spread(char *p, int depth) {
  char *volatile slots[16];
  for (int i = 0; i < 16; i++) slots[i] = p;
  int r = depth > 0 ? spread(p, depth - 1) : 0;
  escape((const void *)slots);
  return r + (slots[depth & 15] != NULL);
}

/* A block whose last pointer dies here, after 64 frames held it. */
static NOINLINE __attribute__((unused)) void lose_deep(void) {
  char *p = (char *)malloc(LOST_BYTES);
  memset(p, 'l', LOST_BYTES);
  spread(p, 64);
}

static NOINLINE __attribute__((unused)) void keep_global(void) {
  g_kept = (char *)malloc(KEPT_BYTES);
  memset(g_kept, 'k', KEPT_BYTES);
  escape(&g_kept);
}
#endif
