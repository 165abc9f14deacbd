/* test_threads.c - the ledger under 16 threads (argv[1]) each doing 100,000
 * (argv[2]) random operations: allocate 1..512 bytes, free one of its own up
 * to 64 live blocks, hand a block over to a shared queue, or free a block
 * another thread allocated, taken from the queue.  Deterministic per thread
 * (a PRNG seeded from the thread's index).  Every block carries a pattern
 * checked before it is freed (no two live blocks overlap).  At the end, the
 * ledger's ta_since counts equal the sums the threads counted themselves:
 * allocations, frees, live blocks and bytes (what is still held); a scan
 * finds every held block reachable; no finding of any kind; after freeing
 * the rest, nothing is live.
 *
 *   test_threads [THREADS [OPS]]     (defaults 16 and 100000) */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 256
#define MAX_LIVE    64
#define QUEUE_CAP   1024

static ta_tag T;
static long n_threads = 16, n_ops = 100000;

/* The shared queue of blocks handed over between threads: a global ring, so
 * that the blocks in it stay reachable for the scan. */
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { unsigned char *p; size_t size; } queue[QUEUE_CAP];
static size_t queue_head, queue_len;

typedef struct {
  int index;
  uint64_t allocs, frees, cross_frees;
  size_t nlive;
  unsigned char *live[MAX_LIVE];      /* what the thread still holds at the end */
  size_t size[MAX_LIVE];
  int bad_pattern;
} worker;

static worker workers[MAX_THREADS];
static pthread_barrier_t start;

static uint64_t next_random(uint64_t *s) {   /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* A block's bytes say its size: checked before it is freed. */
static unsigned char pattern_of(size_t size) { return (unsigned char)(size * 7 + 1); }

static void fill(unsigned char *p, size_t size) { memset(p, pattern_of(size), size); }

static int intact(const unsigned char *p, size_t size) {
  for (size_t i = 0; i < size; i++)
    if (p[i] != pattern_of(size)) return 0;
  return 1;
}

static void release(worker *w, unsigned char *p, size_t size) {
  if (!intact(p, size) || ta_block_size(p) != size || ta_block_tag(p) != T) w->bad_pattern++;
  ta_free(p);
  w->frees++;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  uint64_t rng = 0x1234567ull + (uint64_t)w->index * 0x10001ull;
  pthread_barrier_wait(&start);
  for (long op = 0; op < n_ops; op++) {
    uint64_t r = next_random(&rng);
    unsigned what = (unsigned)(r % 16);
    if (w->nlive == 0 || (w->nlive < MAX_LIVE && what < 8)) {          /* allocate */
      size_t size = (size_t)(r >> 8) % 512 + 1;
      unsigned char *p = ta_alloc(T, size);
      if (p == NULL) { w->bad_pattern++; continue; }
      fill(p, size);
      w->allocs++;
      w->live[w->nlive] = p;
      w->size[w->nlive++] = size;
    } else if (what < 13) {                                           /* free one of ours */
      size_t k = (size_t)(r >> 16) % w->nlive;
      release(w, w->live[k], w->size[k]);
      w->live[k] = w->live[--w->nlive];
      w->size[k] = w->size[w->nlive];
    } else if (what < 15) {                                           /* hand one over */
      size_t k = (size_t)(r >> 16) % w->nlive;
      pthread_mutex_lock(&queue_lock);
      if (queue_len < QUEUE_CAP) {
        size_t at = (queue_head + queue_len++) % QUEUE_CAP;
        queue[at].p = w->live[k];
        queue[at].size = w->size[k];
        w->live[k] = w->live[--w->nlive];
        w->size[k] = w->size[w->nlive];
      }
      pthread_mutex_unlock(&queue_lock);
    } else {                                                          /* free someone's */
      unsigned char *p = NULL;
      size_t size = 0;
      pthread_mutex_lock(&queue_lock);
      if (queue_len > 0) {
        p = queue[queue_head].p;
        size = queue[queue_head].size;
        queue[queue_head].p = NULL;
        queue_head = (queue_head + 1) % QUEUE_CAP;
        queue_len--;
      }
      pthread_mutex_unlock(&queue_lock);
      if (p) {
        release(w, p, size);
        w->cross_frees++;
      }
    }
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  T = ta_tag_get("stress");
  ta_mark m = ta_mark_now();
  pthread_t th[MAX_THREADS];
  pthread_barrier_init(&start, NULL, (unsigned)n_threads);
  for (long i = 0; i < n_threads; i++) {
    workers[i].index = (int)i;
    assert_int_equal(pthread_create(&th[i], NULL, run_worker, &workers[i]), 0);
  }
  for (long i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);

  uint64_t allocs = 0, frees = 0, cross = 0, held = 0, held_bytes = 0;
  for (long i = 0; i < n_threads; i++) {
    worker *w = &workers[i];
    assert_int_equal(w->bad_pattern, 0);
    allocs += w->allocs;
    frees += w->frees;
    cross += w->cross_frees;
    held += w->nlive;
    for (size_t k = 0; k < w->nlive; k++) held_bytes += w->size[k];
  }
  for (size_t k = 0; k < queue_len; k++) {
    held++;
    held_bytes += queue[(queue_head + k) % QUEUE_CAP].size;
  }
  print_message("%ld threads x %ld ops: %lu allocs, %lu frees (%lu across threads), %lu held\n",
                n_threads, n_ops, (unsigned long)allocs, (unsigned long)frees, (unsigned long)cross,
                (unsigned long)held);
  assert_true(cross > 0);
  assert_int_equal(allocs, frees + held);

  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, allocs);
  assert_int_equal(c.frees, frees);
  assert_int_equal(c.live_blocks, held);
  assert_int_equal(c.live_bytes, held_bytes);
  assert_true(c.peak_bytes >= held_bytes);
  assert_true(c.peak_bytes <= (uint64_t)n_threads * MAX_LIVE * 512 + QUEUE_CAP * 512);
  c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, allocs);
  assert_int_equal(c.frees, frees);
  assert_int_equal(c.live_blocks, held);
  assert_int_equal(ta_findings_count(NULL), 0);

  /* Every held block is reachable: from workers[] and queue[], globals. */
  ta_scan();
  ta_summary s = ta_summary_get();
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(s.reachable_blocks, held);
  assert_int_equal(s.reachable_bytes, held_bytes);
  assert_int_equal(s.errors, 0);

  /* Free the rest: nothing live, counts still exact. */
  for (long i = 0; i < n_threads; i++)
    for (size_t k = 0; k < workers[i].nlive; k++) release(&workers[i], workers[i].live[k], workers[i].size[k]);
  for (size_t k = 0; k < queue_len; k++) {
    size_t at = (queue_head + k) % QUEUE_CAP;
    release(&workers[0], queue[at].p, queue[at].size);
  }
  c = ta_since(m, T);
  assert_int_equal(c.allocs, allocs);
  assert_int_equal(c.frees, allocs);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  for (long i = 0; i < n_threads; i++) assert_int_equal(workers[i].bad_pattern, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

int main(int argc, char **argv) {
  setenv("TAGALLOC_REPORT", "0", 1);
  if (argc > 1) n_threads = strtol(argv[1], NULL, 10);
  if (argc > 2) n_ops = strtol(argv[2], NULL, 10);
  if (n_threads < 1 || n_threads > MAX_THREADS || n_ops < 0) {
    fprintf(stderr, "usage: %s [THREADS (1..%d) [OPS]]\n", argv[0], MAX_THREADS);
    return 2;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
