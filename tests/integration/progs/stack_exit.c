/* Pointers alive only on the stack when exit() is called.  run() keeps a
 * 100-byte and a 20-byte block in its locals and calls finish(), which calls
 * exit(0): run()'s frame is still live, so memcheck counts both blocks as
 * still reachable (it scans the stack), not lost. */
#include <stdlib.h>
#include "common.h"

NOINLINE char *make_local(size_t n) {
  char *p = malloc(n);
  memset(p, 'x', n);
  return p;
}

NOINLINE void finish(int code) {
  say("finishing\n");
  exit(code);
}

NOINLINE void run(void) {
  char *a = make_local(100);
  char *b = make_local(20);
  escape(&a); escape(&b);
  finish(0);
}

int main(void) {
  run();
  return 1;
}
