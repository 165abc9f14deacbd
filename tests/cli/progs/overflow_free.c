/* overflow_free.c - one 40-byte block written 4 bytes past its end, then
 * freed (line 13): the heap.overflow is found at that free, and its report
 * names the free in every mode, with and without --guard. */
#include <stdlib.h>
#include <string.h>

int main(void) {
  char *volatile p = malloc(40);
  size_t n = 44;
  char *q = p;
  memset(q, 1, 40);
  for (size_t i = 40; i < n; i++) q[i] = 2;   /* 4 bytes past the end */
  free(p);
  return 0;
}
