/* test_exit_lookup.c - a freed block looked up while threads end.
 *
 * Looking up a freed block (ta_block_size of a pointer no longer live)
 * searches every thread's quarantine and ring of recent frees.  Here the
 * main thread does that without pause while rounds of four threads each
 * free 20,000 blocks (a quarantine of thousands to search) and end.  A
 * thread that ends gives its rings back: it once did so before it left
 * the list of threads the search walks, and the search read a ring
 * already unmapped: this test died of SIGSEGV in 6 runs of 6 then.  The
 * freed block must be found freed every time, every block counted, no
 * finding made. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <valgrind/valgrind.h>

#define THREADS 4
#define ROUNDS  8
#define BLOCKS  20000

/* Under memcheck (make check-valgrind), which runs one thread at a time
 * and where the whole test ran past 15 minutes, 2 rounds of 2,000 blocks
 * (2 s): the checks, not the race. */
static size_t rounds = ROUNDS, blocks = BLOCKS;

static ta_tag T;
static _Atomic int running;

static void *ender(void *arg) {
  (void)arg;
  void *v[BLOCKS];
  for (size_t i = 0; i < blocks; i++) v[i] = ta_alloc(T, 24 + i);
  for (size_t i = 0; i < blocks; i++) ta_free(v[i]);   /* into its rings, which go when it ends */
  atomic_fetch_sub(&running, 1);
  return NULL;
}

static void test_lookup_while_threads_end(void **state) {
  (void)state;
  if (RUNNING_ON_VALGRIND) {
    rounds = 2;
    blocks = 2000;
  }
  T = ta_tag_get("stress.exit_lookup");
  ta_mark m = ta_mark_now();
  void *gone = ta_alloc(T, 40);
  assert_non_null(gone);
  ta_free(gone);
  uint64_t lookups = 0;
  for (size_t round = 0; round < rounds; round++) {
    pthread_t th[THREADS];
    atomic_store(&running, THREADS);
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, ender, NULL), 0);
    do {                                  /* until the last has freed; then through their ends */
      assert_int_equal(ta_block_size(gone), 0);
      lookups++;
    } while (atomic_load(&running) > 0);
    for (int k = 0; k < 200; k++) assert_int_equal(ta_block_size(gone), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  }
  assert_true(lookups >= rounds);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 1 + (uint64_t)rounds * THREADS * blocks);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_lookup_while_threads_end),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
