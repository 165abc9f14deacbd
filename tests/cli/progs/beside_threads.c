/* beside_threads.c - four threads make small blocks (records beside them,
 * alloc/beside.h) and free them crosswise: each frees the blocks the
 * thread before it made, at the same time as that thread makes more in the
 * same slabs' regions.  Each thread leaks its last 25 blocks of 1 + i
 * bytes (i = 0..24, 325 bytes): 100 blocks and 1,300 bytes lost in all,
 * exactly, or the bitmap lost a block or kept a freed one. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define ROUNDS 200
#define PER 500

static char *made[THREADS][ROUNDS][PER];
static _Atomic int done[THREADS];

static void *work(void *arg) {
  int me = (int)(long)arg, prev = (me + THREADS - 1) % THREADS;
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < PER; i++) {
      size_t n = 1 + (size_t)((r * 7 + i * 13 + me) % 4080);
      made[me][r][i] = malloc(n);
      memset(made[me][r][i], me, n);
    }
    atomic_store_explicit(&done[me], r + 1, memory_order_release);
    if (r > 0) {                                 /* the thread before me: its round r - 1 */
      while (atomic_load_explicit(&done[prev], memory_order_acquire) < r) {}
      for (int i = 0; i < PER; i++) free(made[prev][r - 1][i]);
    }
  }
  while (atomic_load_explicit(&done[prev], memory_order_acquire) < ROUNDS) {}
  for (int i = 0; i < PER; i++) free(made[prev][ROUNDS - 1][i]);
  for (int i = 0; i < 25; i++) {
    char *lost = malloc(1 + (size_t)i);
    lost[0] = 1;
  }
  return NULL;
}

int main(void) {
  pthread_t t[THREADS];
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  puts("done");
  return 0;
}
