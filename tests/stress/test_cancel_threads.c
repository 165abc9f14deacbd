/* test_cancel_threads.c - pthread_cancel of threads that allocate.
 *
 * Twenty times, two threads allocate and free (with pthread_testcancel, so
 * that a bare run ends) while the trace flushes every 4 KiB, and the main
 * thread cancels and joins them.  The ledger must not be a place where a
 * thread is cancelled holding a lock: the trace's write(2) under its file
 * lock was such a cancellation point, and the next flush of any other
 * thread hung (an alarm turns a hang into a failure). */
#include "harness.h"
#include "child.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ta_tag T;

static void *churner(void *arg) {
  (void)arg;
  for (size_t i = 0;; i++) {
    ta_free(ta_alloc(T, 16 + i % 200));
    pthread_testcancel();
  }
  return NULL;
}

static int scenario(void) {
  alarm(60);
  T = ta_tag_get("cancel.block");
  for (int round = 0; round < 20; round++) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
      if (pthread_create(&t[i], NULL, churner, NULL) != 0) return 100;
    usleep(5000);
    for (int i = 0; i < 2; i++) {
      pthread_cancel(t[i]);
      pthread_join(t[i], NULL);
    }
  }
  return 0;
}

static void test_cancel_while_threads_allocate(void **state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof path, "/tmp/test_cancel_threads.%d.trace", (int)getpid());
  char trace[96];
  snprintf(trace, sizeof trace, "TAGALLOC_TRACE=%s", path);
  const char *env[] = { trace, "TAGALLOC_TRACE_BUFFER=4096", "TAGALLOC_REPORT=0", NULL };
  child_exec_ok("scenario", env);
  unlink(path);
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--child") == 0 && strcmp(argv[2], "scenario") == 0) return scenario();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_cancel_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
