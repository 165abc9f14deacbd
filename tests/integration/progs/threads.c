/* Four threads each leak 100 blocks of 16 bytes from thread_leak(), and keep
 * one 8-byte block reachable through a global array slot. */
#include <pthread.h>
#include <stdlib.h>
#include "common.h"

static long *g_kept[4];

NOINLINE void thread_leak(long id) {
  for (int i = 0; i < 100; i++) {
    long *p = malloc(16);
    p[0] = id; p[1] = i;
    escape(p);
  }
}

NOINLINE long *thread_keep(long id) {
  long *p = malloc(sizeof *p);
  *p = id;
  return p;
}

static void *worker(void *arg) {
  long id = (long)arg;
  thread_leak(id);
  g_kept[id] = thread_keep(id);
  clobber_stack();
  return NULL;
}

int main(void) {
  pthread_t t[4];
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  long sum = 0;
  for (int i = 0; i < 4; i++) sum += *g_kept[i];
  clobber_stack();
  say("threads done %ld\n", sum);
  return 0;
}
