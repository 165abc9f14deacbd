/* agree.c - findings of several kinds in one run, for the test that every
 * rendering of the run says the same (tests/cli/agree.py): two groups of
 * direct leaks, an indirect leak, a double free and an invalid free. */
#include <stdlib.h>
#include <string.h>

struct node { struct node *next; char pad[24]; };

static __attribute__((noinline)) void *leak_one(size_t n) { return malloc(n); }

static __attribute__((noinline)) void lose_list(void) {
  struct node *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  memset(a, 0, sizeof *a);
  memset(b, 0, sizeof *b);
  a->next = b;   /* b is reachable only from a: indirectly lost */
  a = NULL;
}

static __attribute__((noinline)) void free_twice(void) {
  char *p = malloc(40);
  free(p);
  free(p);
}

static __attribute__((noinline)) void free_inside(void) {
  char *p = malloc(64);
  free(p + 8);
  free(p);
}

int main(void) {
  for (int i = 0; i < 3; i++) leak_one(100);   /* 3 objects, 300 bytes: one group */
  char *big = malloc(5000);                    /* another group */
  big[0] = 1;
  big = NULL;
  lose_list();
  free_twice();
  free_inside();
  return 0;
}
