/* test_exit_threads.c - exit() while other threads are inside the ledger.
 *
 * The main thread calls exit(0) while two threads allocate and free without
 * pause, and the ledger's exit work (quarantine check, hold check, scan,
 * trace, report) runs with them still running; the process must end with
 * status 0, five times out of five.  It crashed in 7 runs of 10 when the
 * exit check read the other threads' quarantine rings, which they were
 * changing meanwhile. */
#include "harness.h"

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

static char g_exe[4096];

static void test_exit_while_threads_allocate(void **state) {
  (void)state;
  for (int r = 0; r < RUNS; r++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      char *argv[] = { g_exe, (char *)"scenario", NULL };
      execv(g_exe, argv);
      _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "test_exit_threads: run %d: status 0x%x\n", r, st);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
  }
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "scenario") == 0) return scenario();
  ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
  if (n > 0) g_exe[n] = '\0';
  else snprintf(g_exe, sizeof g_exe, "%s", argv[0]);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_exit_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
