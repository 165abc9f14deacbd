/* A tree whose root pointer is lost: the root is a direct leak, its six
 * children and their six leaves are indirect (reachable only from the root). */
#include <stdlib.h>
#include "common.h"

struct leaf { long v[2]; };                          /* 16 bytes */
struct child { struct leaf *leaf; long v[3]; };      /* 32 bytes */
struct root { struct child *kid[6]; long v[2]; };    /* 64 bytes */

NOINLINE struct leaf *new_leaf(long v) {
  struct leaf *l = malloc(sizeof *l);
  l->v[0] = v; l->v[1] = -v;
  return l;
}

NOINLINE struct child *new_child(long v) {
  struct child *c = malloc(sizeof *c);
  c->leaf = new_leaf(v);
  c->v[0] = c->v[1] = c->v[2] = v;
  return c;
}

NOINLINE struct root *new_root(void) {
  struct root *r = calloc(1, sizeof *r);
  return r;
}

NOINLINE long build_tree(void) {
  struct root *r = new_root();
  for (int i = 0; i < 6; i++) r->kid[i] = new_child(i + 1);
  long sum = 0;
  for (int i = 0; i < 6; i++) sum += r->kid[i]->leaf->v[0];
  escape(r);
  return sum;                      /* r goes out of scope: the tree is lost */
}

int main(void) {
  long sum = build_tree();
  clobber_stack();
  say("tree sum %ld\n", sum);
  return 0;
}
