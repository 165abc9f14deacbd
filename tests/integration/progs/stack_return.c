/* The opposite case: main() keeps a 100-byte block in a local and returns.
 * When exit runs, main's frame is gone (below the stack pointer), so nothing
 * points to the block: definitely lost. */
#include <stdlib.h>
#include "common.h"

NOINLINE char *make_local(size_t n) {
  char *p = malloc(n);
  memset(p, 'x', n);
  return p;
}

int main(void) {
  char *a = make_local(100);
  escape(&a);
  say("returning with %c\n", a[0]);
  return 0;
}
