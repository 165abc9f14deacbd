/* A pointer hidden by XOR in a global (an XOR-linked list does this): no
 * scan can see it, so the 128-byte block is definitely lost, although the
 * program could still find it. */
#include <stdint.h>
#include <stdlib.h>
#include "common.h"

#define KEY ((uintptr_t)0x5a5a5a5a5a5a5a5aULL)
static uintptr_t g_hidden;

NOINLINE void hide_pointer(void) {
  char *p = malloc(128);
  memset(p, 'h', 128);
  g_hidden = (uintptr_t)p ^ KEY;
}

int main(void) {
  hide_pointer();
  clobber_stack();
  say("hidden block starts with %c\n", ((char *)(g_hidden ^ KEY))[0]);
  clobber_stack();
  return 0;
}
