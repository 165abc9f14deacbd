/* A thread loses a block deep in a call chain (see ends.h) and ends with
 * pthread_exit; main joins it and returns: 100 bytes definitely lost.  The
 * dead thread's stack (kept by libc for the next thread) is no root. */
#include <pthread.h>
#include "ends.h"

static void *worker(void *arg) {
  (void)arg;
  lose_deep();
  pthread_exit(NULL);
}

int main(void) {
  keep_global();
  pthread_t t;
  pthread_create(&t, NULL, worker, NULL);
  pthread_join(t, NULL);
  say("joined\n");
  return 0;
}
