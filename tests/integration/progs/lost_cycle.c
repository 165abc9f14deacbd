/* Lost cycles: a ring of three 24-byte nodes and a 40-byte node that points
 * to itself, none referenced from outside.  memcheck's rule: in a lost cycle
 * one block is "definitely lost" and the blocks reached from it are
 * "indirectly lost"; a block that points only to itself is definitely lost. */
#include <stdlib.h>
#include "common.h"

struct ring { struct ring *next; long a, b; };     /* 24 bytes */
struct self { struct self *me; long pad[4]; };     /* 40 bytes */

NOINLINE struct ring *new_ring_node(long v) {
  struct ring *n = malloc(sizeof *n);
  n->next = NULL; n->a = v; n->b = -v;
  return n;
}

NOINLINE void make_ring(void) {
  struct ring *a = new_ring_node(1), *b = new_ring_node(2), *c = new_ring_node(3);
  a->next = b; b->next = c; c->next = a;
  escape(a);
}

NOINLINE void make_self_loop(void) {
  struct self *s = malloc(sizeof *s);
  s->me = s;
  memset(s->pad, 0, sizeof s->pad);
  escape(s);
}

int main(void) {
  make_ring();
  make_self_loop();
  clobber_stack();
  say("cycles made\n");
  return 0;
}
