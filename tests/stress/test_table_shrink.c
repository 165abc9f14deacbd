/* test_table_shrink.c - the live table's shards shrinking under 4 threads.
 *
 * Four threads allocate 150,000 blocks of 32 bytes each (600,000 live:
 * many shards pass 4096 slots, their 64 KiB regions' records coming in
 * lumps of 2048), then free them in an order of their own while the
 * others free theirs, twice.  Every block is found with its size until
 * it is freed and not after; at the end every shard whose table had
 * passed 4096 slots has exactly 4096 (a shard emptied shrinks to 4096,
 * no further), none has more, and nothing is live. */
#include "harness.h"
#include "live.h"

#include <pthread.h>
#include <stdlib.h>

#define THREADS 4
#define BLOCKS  150000

static ta_tag T;
static pthread_barrier_t start;

typedef struct {
  int index;
  void **v;
  int bad;
} worker;

static uint64_t next_random(uint64_t *s) {   /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void *allocate(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&start);
  for (size_t i = 0; i < BLOCKS; i++)
    if ((w->v[i] = ta_alloc(T, 32)) == NULL) w->bad++;
  return NULL;
}

/* Frees in a shuffled order, checking on the way, every 64th free, a
 * block it has not freed yet.  (Freed blocks are checked after the
 * threads end: the look-up of a freed block reads the other threads'
 * rings of recent frees as they change them, and crashed now and then
 * on that.) */
static void *release(void *arg) {
  worker *w = arg;
  uint64_t rng = 0xC0FFEEull + (uint64_t)w->index;
  for (size_t i = BLOCKS - 1; i > 0; i--) {
    size_t j = (size_t)(next_random(&rng) % (i + 1));
    void *t = w->v[i];
    w->v[i] = w->v[j];
    w->v[j] = t;
  }
  pthread_barrier_wait(&start);
  for (size_t i = 0; i < BLOCKS; i++) {
    if (i % 64 == 0 && i + 1 < BLOCKS && ta_block_size(w->v[i + 1 + next_random(&rng) % (BLOCKS - i - 1)]) != 32)
      w->bad++;
    ta_free(w->v[i]);
  }
  return NULL;
}

static void run_all(void *(*fn)(void *), worker *w) {
  pthread_t th[THREADS];
  pthread_barrier_init(&start, NULL, THREADS);
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, fn, &w[i]), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);
}

static uint32_t shard_cap(int i) {
  shard *s = &_ta_shards[i];
  shard_lock(s);
  uint32_t cap = s->cap;
  shard_unlock(s);
  return cap;
}

static void test_table_shrink(void **state) {
  (void)state;
  T = ta_tag_get("stress.shrink");
  ta_mark m = ta_mark_now();
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){ .index = i, .v = malloc(BLOCKS * sizeof(void *)) };
    assert_non_null(w[i].v);
  }
  static bool was_big[NSHARDS];
  for (int round = 0; round < 2; round++) {
    run_all(allocate, w);
    ta_counts c = ta_since(m, T);
    assert_int_equal(c.live_blocks, THREADS * BLOCKS);
    int big = 0;
    for (int i = 0; i < NSHARDS; i++)
      if (shard_cap(i) > 4096) {
        was_big[i] = true;
        big++;
      }
    assert_true(big > 0);
    run_all(release, w);
    for (int i = 0; i < THREADS; i++) {
      assert_int_equal(w[i].bad, 0);
      for (size_t k = 0; k < BLOCKS; k += 64) assert_int_equal(ta_block_size(w[i].v[k]), 0);
    }
    for (int i = 0; i < NSHARDS; i++) {
      uint32_t cap = shard_cap(i);
      assert_true(cap <= 4096);
      if (was_big[i]) assert_int_equal(cap, 4096);
    }
    c = ta_since(m, T);
    assert_int_equal(c.allocs, (uint64_t)(round + 1) * THREADS * BLOCKS);
    assert_int_equal(c.live_blocks, 0);
  }
  for (int i = 0; i < THREADS; i++) free(w[i].v);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_table_shrink),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
