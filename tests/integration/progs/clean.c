/* No leak, no error: 100,000 blocks allocated and freed, a tree built and
 * torn down.  The summary is all zeros and --error-exitcode is not used. */
#include <stdlib.h>
#include "common.h"

struct node { struct node *l, *r; int v; };

static struct node *build(int depth) {
  if (depth == 0) return NULL;
  struct node *n = malloc(sizeof *n);
  n->l = build(depth - 1); n->r = build(depth - 1); n->v = depth;
  return n;
}

static int teardown(struct node *n) {
  if (!n) return 0;
  int c = 1 + teardown(n->l) + teardown(n->r);
  free(n);
  return c;
}

int main(void) {
  void *ring[64] = {0};
  for (int i = 0; i < 100000; i++) {
    free(ring[i % 64]);
    ring[i % 64] = malloc((size_t)(i % 200) + 1);
  }
  for (int i = 0; i < 64; i++) free(ring[i]);
  int n = teardown(build(12));
  say("clean: %d nodes\n", n);
  return 0;
}
