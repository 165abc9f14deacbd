/* Interior pointers.  A global keeps a pointer 16 bytes into a 64-byte block
 * and nothing points to its start: "possibly lost".  Another keeps a pointer
 * one past the end of a 40-byte block, which points into no block at all:
 * "definitely lost".  A third block has both a start and an interior pointer:
 * still reachable.  (Offsets avoid memcheck's length64/newarray/stdstring
 * heuristics, which apply at offset 8 and 24 with special contents.) */
#include <stdlib.h>
#include "common.h"

static char *g_middle;
static char *g_past_end;
static char *g_start, *g_start_mid;

NOINLINE char *alloc_interior(size_t n) {
  char *p = calloc(1, n);
  return p;
}

NOINLINE char *alloc_past_end(size_t n) {
  char *p = calloc(1, n);
  return p;
}

NOINLINE char *alloc_anchored(size_t n) {
  char *p = calloc(1, n);
  return p;
}

int main(void) {
  g_middle = alloc_interior(64) + 16;
  g_past_end = alloc_past_end(40) + 40;
  g_start = alloc_anchored(48);
  g_start_mid = g_start + 20;
  escape(&g_middle); escape(&g_past_end); escape(&g_start); escape(&g_start_mid);
  clobber_stack();
  say("interior pointers set\n");
  return 0;
}
