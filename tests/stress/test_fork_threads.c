/* test_fork_threads.c - fork() while other threads are inside the ledger.
 *
 * A process whose two threads allocate and free without pause forks eight
 * times; each child allocates on its own thread and on a new one, and must
 * exit normally.  The first fork comes while the threads make their first
 * stacks, so while one of them is likely to be inside the unwinder's first
 * rule miss (libdw being set up under its lock).  Two bugs this caught:
 * the unwinder's lock was only registered for fork() at that first miss,
 * so a child forked during it inherited the lock held and hung at its own
 * first miss; and a child gave the other threads' quarantine rings (mmap'd)
 * to jemalloc as if they were its blocks, and crashed in a third of runs.
 *
 * The scenario runs in a fresh image of this binary (child_exec):
 * its main thread must not have made a stack before the threads start.
 *
 * Not under AddressSanitizer: GCC 12's ASan allocator keeps its locks
 * across fork() (LLVM's took them in atfork handlers only from late 2023),
 * so a child forked while another thread is in malloc can hang in ASan's
 * own calloc (seen here: in glibc's pthread_getattr_np). */
#include "harness.h"
#include "child.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FORKS 8

static ta_tag T;
static _Atomic int g_stop;

static void churn(int n) {
  for (int i = 0; i < n; i++) {
    void *p = ta_alloc(T, 16 + (size_t)(i % 200));
    ta_free(p);
  }
}

static void *churner(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) churn(100);
  return NULL;
}

static void *churn_2000(void *arg) {
  (void)arg;
  churn(2000);
  return NULL;
}

static int child(void) {
  alarm(30);                             /* a hang ends as SIGALRM */
  ta_mark m = ta_mark_now();
  pthread_t t;
  if (pthread_create(&t, NULL, churn_2000, NULL) != 0) return 3;
  churn(2000);
  pthread_join(t, NULL);
  ta_counts c = ta_since(m, T);
  return c.allocs == 4000 && c.live_blocks == 0 ? 0 : 4;
}

/* Returns how many children did not exit with status 0. */
static int scenario(void) {
  alarm(120);                            /* a fork that hangs ends as SIGALRM */
  T = ta_tag_get("fork.block");
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, churner, NULL) != 0) return 100;
  int failed = 0;
  for (int k = 0; k < FORKS; k++) {
    pid_t pid = fork();
    if (pid < 0) return 101;
    if (pid == 0) _exit(child());
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "test_fork_threads: child %d: status 0x%x\n", k, st);
      failed++;
    }
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  return failed;
}

static void test_fork_while_threads_allocate(void **state) {
  (void)state;
#if defined(__SANITIZE_ADDRESS__)
  fprintf(stderr, "test_fork_threads: skipped under AddressSanitizer (its allocator is not fork-safe with threads)\n");
  skip();
#endif
  child_exec_ok("scenario", NULL);             /* every child of it exited normally */
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--child") == 0 && strcmp(argv[2], "scenario") == 0) return scenario();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fork_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
