/* A thread that maps memory before it ever calls malloc, then keeps the
 * only pointer to a block in that mapping: the mapping is the program's,
 * a root of the scan, so the block is still reachable (it looked definitely
 * lost when a thread's mappings were recorded only after its first call
 * into the ledger).  Reachable: 100 bytes in 1 block. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "common.h"

static void **g_region;          /* the mapping is reachable from here */

static NOINLINE void keep_in_mapping(void **r) {
  r[0] = malloc(100);
  memset(r[0], 1, 100);
}

static void *worker(void *arg) {
  (void)arg;
  void **r = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return NULL;
  keep_in_mapping(r);
  g_region = r;
  return NULL;
}

int main(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, NULL) != 0) return 2;
  if (g_region == NULL) { say("mmap failed\n"); return 2; }
  clobber_stack();
  say("kept in a thread's first mapping\n");
  return 0;
}
