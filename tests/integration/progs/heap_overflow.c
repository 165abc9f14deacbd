/* Overflows in default mode: 4 bytes written past a 40-byte block (its
 * size class is 48) and 8 past a 24-byte block (class 32), then both
 * freed.  Each is heap.overflow at its free, with the allocation and free
 * stacks (memcheck sees each write as it happens: "Invalid write of size
 * 4", "... of size 8"). */
#include <stdint.h>
#include <stdlib.h>
#include "common.h"

NOINLINE char *alloc_forty(void) { char *p = malloc(40); memset(p, 0, 40); escape(p); return p; }
NOINLINE char *alloc_twentyfour(void) { char *p = malloc(24); memset(p, 0, 24); escape(p); return p; }
NOINLINE void overflow_forty(char *p) { *(volatile uint32_t *)(p + 40) = 0x41414141u; }
NOINLINE void overflow_twentyfour(char *p) { *(volatile uint64_t *)(p + 24) = 0x4242424242424242ull; }
NOINLINE void free_forty(char *p) { free(p); }
NOINLINE void free_twentyfour(char *p) { free(p); }

int main(void) {
  char *a = alloc_forty();
  char *spacer = malloc(200);            /* keeps glibc's next chunk away from a and b in the bare run */
  char *b = alloc_twentyfour();
  char *spacer2 = malloc(200);
  overflow_forty(a);
  overflow_twentyfour(b);
  free_forty(a);
  free_twentyfour(b);
  free(spacer);
  free(spacer2);
  say("overflowed\n");
  clobber_stack();
  return 0;
}
