/* Invalid frees: a global's address, and a pointer into the middle of a
 * live heap block (which is then freed correctly).  Reported, the program
 * goes on (glibc would abort). */
#include <stdlib.h>
#include "common.h"

static char g_array[64];

NOINLINE void free_global(void) { free(g_array); }
NOINLINE void free_interior(char *p) { free(p + 16); }
NOINLINE char *alloc_block(void) { char *p = malloc(48); memset(p, 0, 48); return p; }

int main(void) {
  free_global();
  char *p = alloc_block();
  free_interior(p);
  free(p);
  say("still running after the invalid frees\n");
  return 0;
}
