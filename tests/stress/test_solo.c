/* test_solo.c - solo mode (alloc/thread.c): while one thread alone uses
 * the ledger it updates the shared state with plain stores; any other
 * thread revokes that before it touches the state.
 *
 * - The mode follows the threads: the only thread is solo; while a second
 *   thread is registered nobody is; when it exits the first is solo again;
 *   a forked child's thread is solo in the child.
 * - No update is lost when threads come and go while the solo thread is
 *   allocating as fast as it can: afterwards the counts are exact, and the
 *   shared live-byte counter is too (a peak measured since a mark, which
 *   compares that counter with exact counts, equals what was allocated).
 *   A lost or doubled update there shows as a peak off by the block's size.
 * Without a working membarrier (valgrind, old kernels) there is no solo
 * mode: the first test then checks that nobody is solo, and the race runs
 * on locked instructions. */
#include "harness.h"
#include "internal.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static ta_tag T;

static bool membarrier_works(void) {
  long r = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  return r > 0 && (r & MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

static pthread_barrier_t in, out;

static void *second(void *arg) {
  (void)arg;
  ta_free(ta_alloc(T, 32));               /* registers this thread */
  pthread_barrier_wait(&in);
  pthread_barrier_wait(&out);
  return NULL;
}

static void test_mode_follows_threads(void **state) {
  (void)state;
  ta_free(ta_alloc(T, 16));
  ta_thread *me = _ta_self;
  assert_non_null(me);
  ta_thread *want = membarrier_works() ? me : NULL;
  assert_ptr_equal(atomic_load(&_ta_solo), want);

  pthread_barrier_init(&in, NULL, 2);
  pthread_barrier_init(&out, NULL, 2);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, second, NULL), 0);
  pthread_barrier_wait(&in);
  assert_null(atomic_load(&_ta_solo));    /* two threads: nobody */
  pthread_barrier_wait(&out);
  pthread_join(th, NULL);
  assert_ptr_equal(atomic_load(&_ta_solo), want);   /* alone again */

  pid_t pid = fork();
  if (pid == 0) {
    ta_free(ta_alloc(T, 16));
    _exit(atomic_load(&_ta_solo) == (want ? _ta_self : NULL) ? 0 : 1);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  pthread_barrier_destroy(&in);
  pthread_barrier_destroy(&out);
}

/* Threads that come and go: each registers (revoking solo mode), churns a
 * little and exits (making the main thread solo again). */
static _Atomic int stop;
static _Atomic uint64_t worker_allocs;

static void *worker(void *arg) {
  (void)arg;
  void *p[8];
  for (int i = 0; i < 200; i++) {
    for (int k = 0; k < 8; k++) p[k] = ta_alloc(T, 24 + (size_t)k * 8);
    for (int k = 0; k < 8; k++) ta_free(p[k]);
  }
  atomic_fetch_add(&worker_allocs, 200 * 8);
  return NULL;
}

static void *spawner(void *arg) {
  (void)arg;
  int n = 0;
  while (!atomic_load(&stop) || n < 50) {
    pthread_t th;
    if (pthread_create(&th, NULL, worker, NULL) != 0) break;
    pthread_join(th, NULL);
    n++;
  }
  return (void *)(intptr_t)n;
}

static void test_no_update_lost(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  pthread_t sp;
  assert_int_equal(pthread_create(&sp, NULL, spawner, NULL), 0);
  uint64_t mine = 0;
  void *ring[64] = { 0 };
  for (uint64_t i = 0; i < 400000; i++) {
    size_t slot = i % 64;
    ta_free(ring[slot]);
    ring[slot] = ta_alloc(T, 16 + (i * 37) % 1000);
    mine++;
  }
  atomic_store(&stop, 1);
  void *spawned = NULL;
  pthread_join(sp, &spawned);
  for (int k = 0; k < 64; k++) ta_free(ring[k]);
  assert_true((intptr_t)spawned >= 50);

  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, mine + atomic_load(&worker_allocs));
  assert_int_equal(c.frees, c.allocs);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);

  /* The shared counter: nothing of T is live now, so the peak since a new
   * mark of one 777-byte block is 777 exactly. */
  ta_mark m2 = ta_mark_now();
  void *b = ta_alloc(T, 777);
  assert_int_equal(ta_since(m2, T).peak_bytes, 777);
  ta_free(b);
  ta_mark_free(m2);
  ta_mark_free(m);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  T = ta_tag_get("solo.test");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_mode_follows_threads),
    cmocka_unit_test(test_no_update_lost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
