/* Still reachable at exit: blocks pointed to by globals, a function-static,
 * a linked list hanging off a global, and a thread-local of the main thread.
 * 128 + 3*24 + 32 + 56 bytes in 6 blocks, no leak. */
#include <stdlib.h>
#include "common.h"

struct item { struct item *next; long key, val; };   /* 24 bytes */

char *g_config;
static struct item *g_list;
static __thread char *t_scratch;

NOINLINE char *load_config(void) {
  char *c = malloc(128);
  memset(c, 'c', 128);
  return c;
}

NOINLINE void add_item(long key) {
  struct item *it = malloc(sizeof *it);
  it->key = key; it->val = key * key;
  it->next = g_list;
  g_list = it;
}

NOINLINE const char *cached_name(void) {
  static char *name;
  if (!name) { name = malloc(32); strcpy(name, "cached"); }
  return name;
}

NOINLINE void tls_alloc(void) {
  t_scratch = malloc(56);
  memset(t_scratch, 0, 56);
}

int main(void) {
  g_config = load_config();
  for (long k = 1; k <= 3; k++) add_item(k);
  const char *n = cached_name();
  tls_alloc();
  long sum = 0;
  for (struct item *it = g_list; it; it = it->next) sum += it->val;
  say("%s %ld %c\n", n, sum, g_config[0]);
  clobber_stack();
  return 0;
}
