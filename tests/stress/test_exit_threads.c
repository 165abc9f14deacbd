/* test_exit_threads.c - exit() while other threads are inside the ledger.
 *
 * The main thread calls exit(0) while two threads allocate and free without
 * pause, and the ledger's exit work (quarantine check, hold check, scan,
 * trace, report) runs with them still running; the process must end with
 * status 0, five times out of five.  It crashed in 7 runs of 10 when the
 * exit check read the other threads' quarantine rings, which they were
 * changing meanwhile. */
#include "harness.h"
#include "child.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RUNS 5

static ta_tag T;

static void *churner(void *arg) {
  (void)arg;
  for (size_t i = 0;; i++) ta_free(ta_alloc(T, 16 + i % 200));
  return NULL;
}

static int scenario(void) {
  alarm(60);                             /* a hang ends as SIGALRM */
  T = ta_tag_get("exit.block");
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, churner, NULL) != 0) return 100;
  usleep(20000);                         /* their quarantines fill and evict */
  exit(0);
}

static void test_exit_while_threads_allocate(void **state) {
  (void)state;
  for (int run = 0; run < RUNS; run++) child_exec_ok("scenario", NULL);
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--child") == 0 && strcmp(argv[2], "scenario") == 0) return scenario();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_exit_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
