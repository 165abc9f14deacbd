/* Memory that grows from iteration to iteration, reachable to the end: a
 * list that gains one 64-byte node per step, with a mark per step.  Under
 * tagalloc run the program finds the ledger's ta_mark_now in the preload
 * (dlsym: the bare run and memcheck have none, and take no marks); the
 * trace's 10 marks show leak.growth at grow_step, in run's text and JSON.
 * Nothing is lost: the list is reachable from a global at exit. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include "common.h"

struct node { struct node *next; char pad[56]; };
static struct node *list;

NOINLINE void grow_step(void) {
  struct node *n = malloc(sizeof *n);
  memset(n, 0, sizeof *n);
  n->next = list;
  list = n;
}

int main(void) {
  uint64_t (*mark)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "ta_mark_now");
  for (int i = 0; i < 10; i++) {
    grow_step();
    if (mark) mark();
  }
  say("grew %d nodes\n", 10);
  clobber_stack();
  return 0;
}
