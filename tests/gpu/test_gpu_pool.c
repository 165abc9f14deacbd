/* test_gpu_pool.c - the caching pool's rules, with exact numbers: 512-byte
 * rounding, the small pool's 2 MiB segments, 20 MiB segments below 10 MiB
 * and 2 MiB rounding above, best fit by (stream, size), split and merge
 * inside a segment, max_split_size, per-stream free blocks, frees deferred
 * by events on the streams a block was used on, the free-and-retry before
 * out of memory (num_alloc_retries, num_ooms and the message), empty_cache;
 * PyTorch's stats, current and peak, for each pool and both; and the
 * invariants after a long random sequence, checked against the ledger as an
 * independent witness: reserved bytes = the sum of the gpu.segment blocks,
 * allocated bytes = the sum of the gpu.buffer blocks, and nothing reserved
 * after empty_cache with nothing in use.
 *
 * The host backend's capacity is 64 MiB here (TAGALLOC_GPU_HOST_MEM), so
 * out of memory is reached for real. */
#include "harness.h"
#include "gpu_test.h"

#include <pthread.h>
#include <sched.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static gpu_pool *P;
static gpu_stats S;

/* The host backend with events a test can hold back: while `held` is set,
 * event_query says GPU_ENOTREADY; event_synchronize releases them. */
static gpu_backend held_backend;
static int held, n_sync_calls;

static gpu_status held_query(gpu_event e) {
  gpu_status st = gpu_backend_host()->event_query(e);
  return st == GPU_OK && held ? GPU_ENOTREADY : st;
}

static gpu_status held_sync(gpu_event e) {
  n_sync_calls++;
  held = 0;
  return gpu_backend_host()->event_synchronize(e);
}

/* event_create fails once `events_left` reaches 0 (-1: never). */
static int events_left = -1;
static gpu_status limited_event_create(gpu_event *e) {
  if (events_left == 0) return GPU_ENOMEM;
  if (events_left > 0) events_left--;
  return gpu_backend_host()->event_create(e);
}

static int pool_setup(void **state) {
  (void)state;
  held_backend = *gpu_backend_host();
  held_backend.event_query = held_query;
  held_backend.event_synchronize = held_sync;
  held_backend.event_create = limited_event_create;
  held = n_sync_calls = 0;
  events_left = -1;
  P = gpu_pool_new(&held_backend, NULL);
  return P ? 0 : -1;
}

static int pool_teardown(void **state) {
  (void)state;
  gpu_pool_empty_cache(P);
  gpu_pool_stats(P, &S);
  /* Each test gives back everything it took. */
  assert_int_equal(S.allocated_bytes[GPU_STAT_ALL].current, 0);
  assert_int_equal(S.reserved_bytes[GPU_STAT_ALL].current, 0);
  gpu_pool_destroy(P);
  return 0;
}

static void stats(void) { gpu_pool_stats(P, &S); }
#define CUR(name, kind) S.name[GPU_STAT_##kind].current
#define PEAK(name, kind) S.name[GPU_STAT_##kind].peak

/* ---- rounding, small pool, split and merge ------------------------------------------------ */

static void test_small_pool_split_and_merge(void **state) {
  (void)state;
  char *a = gpu_pool_alloc(P, 1, NULL);
  assert_non_null(a);
  assert_int_equal(gpu_pool_size(P, a), 512);   /* 512-byte rounding */
  stats();
  assert_int_equal(CUR(segment, SMALL), 1);
  assert_int_equal(CUR(segment, LARGE), 0);
  assert_int_equal(CUR(reserved_bytes, SMALL), 2 * MiB);
  assert_int_equal(CUR(allocated_bytes, ALL), 512);
  assert_int_equal(CUR(requested_bytes, ALL), 1);
  assert_int_equal(CUR(allocation, SMALL), 1);
  assert_int_equal(CUR(active, ALL), 1);
  assert_int_equal(CUR(active_bytes, ALL), 512);
  assert_int_equal(CUR(inactive_split, SMALL), 1);              /* the rest of the segment */
  assert_int_equal(CUR(inactive_split_bytes, SMALL), 2 * MiB - 512);
  assert_int_equal(S.num_device_alloc, 1);
  assert_int_equal(S.num_hits, 0);

  char *b = gpu_pool_alloc(P, 513, NULL);   /* 1024, from the same segment, right after a */
  assert_ptr_equal(b, a + 512);
  assert_int_equal(gpu_pool_size(P, b), 1024);
  stats();
  assert_int_equal(S.num_device_alloc, 1);
  assert_int_equal(S.num_hits, 1);
  assert_int_equal(CUR(inactive_split, SMALL), 1);
  assert_int_equal(CUR(inactive_split_bytes, SMALL), 2 * MiB - 1536);
  assert_int_equal(CUR(allocated_bytes, SMALL), 1536);

  gpu_pool_free(P, a);   /* a split block: one more inactive split */
  stats();
  assert_int_equal(CUR(allocation, ALL), 1);
  assert_int_equal(CUR(inactive_split, SMALL), 2);
  assert_int_equal(CUR(inactive_split_bytes, SMALL), 2 * MiB - 1024);
  assert_int_equal(gpu_pool_size(P, a), 0);

  /* Best fit: a 512-byte request takes a's block, not the big remainder. */
  char *c = gpu_pool_alloc(P, 300, NULL);
  assert_ptr_equal(c, a);
  gpu_pool_free(P, c);
  gpu_pool_free(P, b);   /* merges with both neighbours: one whole free segment */
  stats();
  assert_int_equal(CUR(inactive_split, SMALL), 0);
  assert_int_equal(CUR(inactive_split_bytes, SMALL), 0);
  assert_int_equal(CUR(active, ALL), 0);
  assert_int_equal(CUR(allocated_bytes, ALL), 0);
  assert_int_equal(CUR(requested_bytes, ALL), 0);
  assert_int_equal(CUR(reserved_bytes, ALL), 2 * MiB);   /* cached */
  assert_int_equal(PEAK(allocated_bytes, ALL), 1536);
  assert_int_equal(PEAK(active, SMALL), 2);
  /* The merged segment serves a 1 MiB request whole-segment-first. */
  char *d = gpu_pool_alloc(P, 1 * MiB, NULL);   /* 1 MiB: still the small pool */
  assert_ptr_equal(d, a);
  stats();
  assert_int_equal(CUR(allocated_bytes, SMALL), 1 * MiB);
  assert_int_equal(S.num_device_alloc, 1);
  gpu_pool_free(P, d);
  gpu_pool_empty_cache(P);
  stats();
  assert_int_equal(CUR(segment, ALL), 0);
  assert_int_equal(S.num_device_free, 1);
  assert_int_equal(PEAK(reserved_bytes, SMALL), 2 * MiB);
}

/* ---- the large pool ------------------------------------------------------------------------ */

static void test_large_pool_sizes(void **state) {
  (void)state;
  /* Just above 1 MiB: the large pool, a 20 MiB segment, split (the rest is
   * more than 1 MiB). */
  char *a = gpu_pool_alloc(P, MiB + 1, NULL);
  assert_int_equal(gpu_pool_size(P, a), MiB + 512);
  stats();
  assert_int_equal(CUR(segment, LARGE), 1);
  assert_int_equal(CUR(reserved_bytes, LARGE), 20 * MiB);
  assert_int_equal(CUR(inactive_split_bytes, LARGE), 20 * MiB - (MiB + 512));
  /* 9 MiB: under 10 MiB, so it would get a 20 MiB segment; the remainder
   * of a's (19 MiB - 512) fits it best. */
  char *b = gpu_pool_alloc(P, 9 * MiB, NULL);
  assert_ptr_equal(b, a + MiB + 512);
  stats();
  assert_int_equal(S.num_device_alloc, 1);
  /* The rest is 10 MiB - 512: more than 1 MiB, split again. */
  assert_int_equal(CUR(inactive_split_bytes, LARGE), 10 * MiB - 512);
  /* 11 MiB + 1: above 10 MiB, a segment of the request rounded to 2 MiB
   * (12 MiB); the cached 10 MiB - 512 is too small. */
  char *c = gpu_pool_alloc(P, 11 * MiB + 1, NULL);
  stats();
  assert_int_equal(S.num_device_alloc, 2);
  assert_int_equal(CUR(reserved_bytes, LARGE), 32 * MiB);
  /* The rest of that segment is 1 MiB - 512: not more than 1 MiB, not
   * split: the block is the whole 12 MiB. */
  assert_int_equal(gpu_pool_size(P, c), 12 * MiB);
  assert_int_equal(CUR(allocated_bytes, LARGE), MiB + 512 + 9 * MiB + 12 * MiB);
  assert_int_equal(CUR(requested_bytes, LARGE), MiB + 1 + 9 * MiB + 11 * MiB + 1);
  gpu_pool_free(P, a);
  gpu_pool_free(P, b);
  gpu_pool_free(P, c);
  stats();
  assert_int_equal(CUR(inactive_split, LARGE), 0);
  assert_int_equal(CUR(segment, LARGE), 2);
  /* Cached 20 MiB and 12 MiB: a 5 MiB request takes the 12 MiB segment
   * (best fit), splitting it. */
  char *d = gpu_pool_alloc(P, 5 * MiB, NULL);
  assert_ptr_equal(d, c);
  stats();
  assert_int_equal(S.num_device_alloc, 2);
  assert_int_equal(CUR(inactive_split_bytes, LARGE), 7 * MiB);
  gpu_pool_free(P, d);
}

/* ---- max_split_size -------------------------------------------------------------------------- */

static void test_max_split_size(void **state) {
  (void)state;
  gpu_pool_config cfg = { .max_split_size = 4 * MiB };
  gpu_pool *p = gpu_pool_new(gpu_backend_host(), &cfg);
  /* 5 MiB >= max_split: a 20 MiB segment, not split: the block is all of it. */
  char *a = gpu_pool_alloc(p, 5 * MiB, NULL);
  assert_int_equal(gpu_pool_size(p, a), 20 * MiB);
  gpu_pool_free(p, a);
  /* 2 MiB < max_split: the cached 20 MiB block is oversize and is not used
   * (nor split) for it: a new segment, which is split. */
  char *b = gpu_pool_alloc(p, 2 * MiB, NULL);
  assert_ptr_not_equal(b, a);
  gpu_pool_stats(p, &S);
  assert_int_equal(S.num_device_alloc, 2);
  assert_int_equal(gpu_pool_size(p, b), 2 * MiB);
  assert_int_equal(S.inactive_split_bytes[GPU_STAT_LARGE].current, 18 * MiB);
  /* 6 MiB >= max_split: the best fit is the 18 MiB remainder, taken whole. */
  char *c = gpu_pool_alloc(p, 6 * MiB, NULL);
  assert_ptr_equal(c, b + 2 * MiB);
  assert_int_equal(gpu_pool_size(p, c), 18 * MiB);
  /* 30 MiB: 20 MiB cached is within 20 MiB of it but too small; a new
   * segment (30 MiB rounded to 2 MiB: 30 MiB). */
  gpu_pool_free(p, c);
  gpu_pool_free(p, b);
  char *d = gpu_pool_alloc(p, 30 * MiB, NULL);
  /* 64 MiB of device memory: 20 + 20 + 30 does not fit.  The oversize
   * cached blocks are released first, largest first, until 30 MiB are
   * (release_available: both, and no full retry). */
  assert_non_null(d);
  gpu_pool_stats(p, &S);
  assert_int_equal(S.num_alloc_retries, 0);
  assert_int_equal(S.num_device_free, 2);
  assert_int_equal(S.reserved_bytes[GPU_STAT_ALL].current, 30 * MiB);
  gpu_pool_free(p, d);
  gpu_pool_empty_cache(p);
  gpu_pool_stats(p, &S);
  assert_int_equal(S.reserved_bytes[GPU_STAT_ALL].current, 0);
  gpu_pool_destroy(p);
}

/* ---- streams ------------------------------------------------------------------------------- */

static void test_per_stream_free_blocks(void **state) {
  (void)state;
  gpu_stream s1;
  assert_int_equal(held_backend.stream_create(&s1), GPU_OK);
  char *a = gpu_pool_alloc(P, 1000, NULL);
  gpu_pool_free(P, a);
  /* The cached block is the default stream's: s1 gets a segment of its own. */
  char *b = gpu_pool_alloc(P, 1000, s1);
  stats();
  assert_int_equal(S.num_device_alloc, 2);
  assert_int_equal(CUR(segment, SMALL), 2);
  char *c = gpu_pool_alloc(P, 1000, NULL);
  assert_ptr_equal(c, a);
  gpu_pool_free(P, b);
  gpu_pool_free(P, c);
  assert_int_equal(held_backend.stream_destroy(s1), GPU_OK);
}

static void test_free_deferred_by_events(void **state) {
  (void)state;
  gpu_stream s1;
  assert_int_equal(held_backend.stream_create(&s1), GPU_OK);
  char *a = gpu_pool_alloc(P, 1000, NULL);
  char *keep = gpu_pool_alloc(P, 1000, NULL);   /* after a: a stays a block of its own */
  gpu_pool_record_stream(P, a, s1);
  gpu_pool_record_stream(P, a, s1);   /* once per stream */
  gpu_pool_record_stream(P, a, NULL); /* its own stream: nothing to wait for */
  held = 1;
  gpu_pool_free(P, a);
  stats();
  assert_int_equal(CUR(allocation, ALL), 1);          /* no longer allocated ... */
  assert_int_equal(CUR(allocated_bytes, ALL), 1024);
  assert_int_equal(CUR(active, ALL), 2);              /* ... but still active */
  assert_int_equal(CUR(active_bytes, ALL), 2048);
  /* While s1's work may still run, a's memory is not handed out again. */
  char *b = gpu_pool_alloc(P, 1000, NULL);
  assert_ptr_not_equal(b, a);
  assert_ptr_equal(b, keep + 1024);
  gpu_pool_free(P, b);
  /* The event completes: the next request frees a first, and gets it. */
  held = 0;
  char *c = gpu_pool_alloc(P, 1000, NULL);
  assert_ptr_equal(c, a);
  stats();
  assert_int_equal(CUR(active, ALL), 2);
  assert_int_equal(CUR(allocation, ALL), 2);
  /* empty_cache waits for pending events (event_synchronize) first. */
  gpu_pool_record_stream(P, c, s1);
  held = 1;
  gpu_pool_free(P, c);
  gpu_pool_free(P, keep);
  gpu_pool_empty_cache(P);
  assert_int_equal(n_sync_calls, 1);
  stats();
  assert_int_equal(CUR(active, ALL), 0);
  assert_int_equal(CUR(reserved_bytes, ALL), 0);
  assert_int_equal(held_backend.stream_destroy(s1), GPU_OK);
}

/* No event can be made: the streams are synchronized and the block is free
 * at once; one of two made: the block waits for that one. */
static void test_deferral_without_events(void **state) {
  (void)state;
  gpu_stream s1, s2;
  assert_int_equal(held_backend.stream_create(&s1), GPU_OK);
  assert_int_equal(held_backend.stream_create(&s2), GPU_OK);
  char *a = gpu_pool_alloc(P, 1000, NULL), *keep = gpu_pool_alloc(P, 1000, NULL);
  gpu_pool_record_stream(P, a, s1);
  gpu_pool_record_stream(P, a, s2);
  held = 1;
  events_left = 0;
  gpu_pool_free(P, a);
  stats();
  assert_int_equal(CUR(active, ALL), 1);   /* freed at once */
  assert_ptr_equal(gpu_pool_alloc(P, 1000, NULL), a);
  gpu_pool_record_stream(P, a, s1);
  gpu_pool_record_stream(P, a, s2);
  events_left = 1;
  gpu_pool_free(P, a);
  stats();
  assert_int_equal(CUR(active, ALL), 2);   /* waits for s1's event */
  char *b = gpu_pool_alloc(P, 1000, NULL);
  assert_ptr_not_equal(b, a);
  held = 0;
  events_left = -1;
  gpu_pool_free(P, b);
  char *c = gpu_pool_alloc(P, 1000, NULL);   /* the event done: a is free again, and merged once */
  assert_ptr_equal(c, a);
  stats();
  assert_int_equal(CUR(active, ALL), 2);
  gpu_pool_free(P, c);
  gpu_pool_free(P, keep);
  assert_int_equal(held_backend.stream_destroy(s1), GPU_OK);
  assert_int_equal(held_backend.stream_destroy(s2), GPU_OK);
}

/* ---- out of memory ----------------------------------------------------------------------------- */

static void test_oom_free_cache_and_retry(void **state) {
  (void)state;
  size_t fr, total;
  assert_int_equal(held_backend.mem_get_info(&fr, &total), GPU_OK);
  assert_int_equal(total, 64 * MiB);
  /* Three 16 MiB segments (15 MiB rounded to 2 MiB), 16 MiB left. */
  char *a = gpu_pool_alloc(P, 15 * MiB, NULL), *b = gpu_pool_alloc(P, 15 * MiB, NULL),
       *c = gpu_pool_alloc(P, 15 * MiB, NULL);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  gpu_pool_free(P, c);   /* cached: the pool still holds 48 MiB */
  stats();
  assert_int_equal(CUR(reserved_bytes, ALL), 48 * MiB);
  /* 20 MiB: the device has 16 MiB; the pool frees its cache (c's segment)
   * and retries. */
  char *d = gpu_pool_alloc(P, 20 * MiB, NULL);
  assert_non_null(d);
  stats();
  assert_int_equal(S.num_alloc_retries, 1);
  assert_int_equal(S.num_ooms, 0);
  assert_int_equal(S.num_device_free, 1);
  assert_int_equal(CUR(reserved_bytes, ALL), 52 * MiB);
  /* 40 MiB cannot fit even with the cache freed: NULL, counted, said. */
  char *e = gpu_pool_alloc(P, 40 * MiB, NULL);
  assert_null(e);
  stats();
  assert_int_equal(S.num_alloc_retries, 2);
  assert_int_equal(S.num_ooms, 1);
  assert_string_equal(gpu_pool_error(),
                      "gpu_pool_alloc: out of device memory: tried to allocate 41943040 bytes (41943040 rounded, a "
                      "new segment of 41943040); the pool has 54525952 bytes allocated and 54525952 reserved; the "
                      "device (host) has 12582912 free of 67108864");
  gpu_pool_free(P, a);
  gpu_pool_free(P, b);
  gpu_pool_free(P, d);
  /* Now it fits. */
  e = gpu_pool_alloc(P, 40 * MiB, NULL);
  assert_non_null(e);
  gpu_pool_free(P, e);
}

/* ---- invariants, against the ledger ------------------------------------------------------------ */

typedef struct {
  int64_t seg, buf;
  int     nseg, nbuf;
} ledger_sums;

static void sum_blocks(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack, unsigned flags,
                       void *arg) {
  (void)addr;
  (void)stack;
  ledger_sums *s = arg;
  if (device != GPU_HOST_DEVICE) return;
  if (tag == ta_tag_get("gpu.segment")) {
    assert_int_equal(flags, TA_DEVICE_RESERVE);
    s->seg += (int64_t)size;
    s->nseg++;
  } else if (tag == ta_tag_get("gpu.buffer")) {
    assert_int_equal(flags, 0);
    s->buf += (int64_t)size;
    s->nbuf++;
  }
}

static void check_invariants(void) {
  ledger_sums l = { 0 };
  ta_device_each(GPU_HOST_DEVICE, sum_blocks, &l);
  stats();
  assert_int_equal(CUR(reserved_bytes, ALL), l.seg);
  assert_int_equal(CUR(segment, ALL), l.nseg);
  assert_int_equal(CUR(allocated_bytes, ALL), l.buf);
  assert_int_equal(CUR(allocation, ALL), l.nbuf);
  for (int k = 0; k < GPU_STAT_KINDS; k++) {
    assert_true(CUR(allocated_bytes, ALL) <= CUR(reserved_bytes, ALL));
    assert_true(S.active_bytes[k].current >= S.allocated_bytes[k].current);
    assert_true(S.active_bytes[k].current + S.inactive_split_bytes[k].current <= S.reserved_bytes[k].current);
    assert_true(S.reserved_bytes[k].peak >= S.reserved_bytes[k].current);
  }
  assert_int_equal(CUR(reserved_bytes, SMALL) + CUR(reserved_bytes, LARGE), CUR(reserved_bytes, ALL));
  assert_int_equal(CUR(allocated_bytes, SMALL) + CUR(allocated_bytes, LARGE), CUR(allocated_bytes, ALL));
  assert_int_equal(CUR(inactive_split, SMALL) + CUR(inactive_split, LARGE), CUR(inactive_split, ALL));
}

static void test_invariants_random(void **state) {
  (void)state;
  enum { SLOTS = 48, STEPS = 3000 };
  char *live[SLOTS] = { 0 };
  size_t sizes[SLOTS] = { 0 };
  gpu_stream s1;
  assert_int_equal(held_backend.stream_create(&s1), GPU_OK);
  uint64_t rng = 12345;
  for (int step = 0; step < STEPS; step++) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    int i = (int)((rng >> 33) % SLOTS);
    if (live[i]) {
      /* The block's bytes are intact: nothing else was given them. */
      assert_int_equal(gpu_pool_size(P, live[i]) >= sizes[i], 1);
      if ((rng >> 20) % 4 == 0) gpu_pool_record_stream(P, live[i], s1);
      held = (rng >> 24) % 3 == 0;
      gpu_pool_free(P, live[i]);
      live[i] = NULL;
    } else {
      unsigned r = (unsigned)(rng >> 40);
      size_t sz = r % 16 == 0 ? (r % (4 * MiB)) + 1 : r % 8 == 1 ? (r % (3 * MiB / 2)) + 1 : (r % (64 * KiB)) + 1;
      live[i] = gpu_pool_alloc(P, sz, (rng >> 10) % 5 == 0 ? s1 : NULL);
      assert_non_null(live[i]);
      sizes[i] = sz;
    }
    if (step % 50 == 0) check_invariants();
    if (step % 700 == 0) gpu_pool_empty_cache(P);
  }
  check_invariants();
  for (int i = 0; i < SLOTS; i++) gpu_pool_free(P, live[i]);
  held = 0;
  gpu_pool_empty_cache(P);
  check_invariants();
  stats();
  assert_int_equal(CUR(reserved_bytes, ALL), 0);
  assert_int_equal(CUR(active, ALL), 0);
  assert_int_equal(CUR(inactive_split, ALL), 0);
  assert_true(S.num_hits > 0);
  assert_int_equal(held_backend.stream_destroy(s1), GPU_OK);
}

/* Four threads allocating and freeing at once: every buffer handed out is
 * one thread's alone (its bytes keep what the thread wrote), and the stats
 * and the ledger agree at the end. */
static void *churn(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg;
  const gpu_backend *hb = gpu_backend_host();
  for (int i = 0; i < 2000; i++) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    size_t n = (size_t)((rng >> 40) % (256 * KiB)) + 4;
    uint32_t *x = gpu_pool_alloc(P, n, NULL), mark = (uint32_t)rng, back = 0;
    if (x == NULL) return (void *)1;
    hb->memcpy_h2d(x, &mark, 4, NULL);
    sched_yield();
    hb->memcpy_d2h(&back, x, 4, NULL);
    gpu_pool_free(P, x);
    if (back != mark) return (void *)2;
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  pthread_t t[4];
  for (uintptr_t i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(i + 1)), 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    assert_null(r);
  }
  check_invariants();
  stats();
  assert_int_equal(S.num_requests, 8000);
  assert_int_equal(CUR(allocation, ALL), 0);
  assert_int_equal(CUR(active, ALL), 0);
  assert_true(PEAK(allocation, ALL) >= 1 && PEAK(allocation, ALL) <= 4);
}

static void test_stats_reset_and_zero(void **state) {
  (void)state;
  char *a = gpu_pool_alloc(P, 4096, NULL);
  gpu_pool_free(P, a);
  assert_null(gpu_pool_alloc(P, 0, NULL));
  gpu_pool_stats_reset(P);
  stats();
  assert_int_equal(PEAK(allocated_bytes, ALL), 0);
  assert_int_equal(PEAK(reserved_bytes, ALL), 2 * MiB);   /* peaks to the current values */
  assert_int_equal(S.allocated_bytes[GPU_STAT_ALL].allocated, 0);
  assert_int_equal(S.num_device_alloc, 0);
  assert_int_equal(S.num_requests, 0);
}

int main(void) {
  setenv("TAGALLOC_GPU_HOST_MEM", "64M", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_small_pool_split_and_merge, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_large_pool_sizes, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_max_split_size, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_per_stream_free_blocks, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_free_deferred_by_events, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_deferral_without_events, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_oom_free_cache_and_retry, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_invariants_random, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_threads, pool_setup, pool_teardown),
    cmocka_unit_test_setup_teardown(test_stats_reset_and_zero, pool_setup, pool_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
