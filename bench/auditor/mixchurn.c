/* mixchurn.c - bench/auditor workload: churn with mixed sizes, a long-lived
 * pool and reallocs, through varied deep stacks.
 *
 *   mixchurn [--ops N] [--threads T]
 *
 * N operations in all (default 5,000,000), split over T threads (default 1)
 * in 16 fixed shares, so that the checksum depends only on N.  A share keeps
 * a long-lived pool of 16,384 slots and a short ring of 64; of its
 * operations 10% realloc a block (from the ring or the pool) to a new size,
 * and of the rest 80% replace a block of the ring (short-lived: it lives 64
 * such operations on average) and 20% one of the pool (long-lived).  Sizes
 * go from 8 B to 64 KiB, skewed small: a power-of-two class picked with
 * halving odds, then a size in it.  The operations run in batches of 16 at
 * the bottom of a chain of 2 to 10 of 12 distinct noinline functions,
 * picked at random per batch, so that each malloc, free and realloc is
 * called 5 to 13 frames deep (with the share's and the thread's frames)
 * from tens of thousands of distinct stacks.  Prints a checksum and leaks
 * one block of 4242 bytes from leak_one() on purpose, for the auditors to
 * find. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL   16384
#define RING   64
#define BATCH  16
#define SHARES 16
#define FUNCS  12

typedef struct {
  uint64_t ops;      /* to make */
  uint64_t seed;
  uint64_t sum;      /* result */
  void    *ring[RING];
  size_t   ring_size[RING];
  void    *pool[POOL];
  size_t   pool_size[POOL];
} worker;

static inline uint64_t next_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* 8 B to 64 KiB: class k (8 << k up to 16 << k) with odds 2^-(k+1), k < 13. */
static size_t pick_size(uint64_t r) {
  unsigned k = (unsigned)__builtin_ctzll((r >> 20) | (1ull << 12));
  size_t lo = (size_t)8 << k;
  return lo + (size_t)((r >> 40) % lo);
}

static unsigned char *checked(void *p) {
  if (!p) {
    fprintf(stderr, "mixchurn: out of memory\n");
    exit(1);
  }
  return p;
}

static void touch(worker *w, unsigned char *p, size_t size, uint64_t r) {
  p[0] = (unsigned char)r;
  p[size - 1] = (unsigned char)(r >> 8);
  w->sum += size + p[0] + p[size - 1];
}

/* One batch of operations: the bottom frame. */
static __attribute__((noinline)) void ops(worker *w, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = next_rand(&w->seed);
    unsigned pct = (unsigned)(r % 100);
    uint64_t r2 = next_rand(&w->seed);
    size_t size = pick_size(r2);
    void **slot;
    size_t *sizep;
    if (pct < 10 || pct >= 28) {   /* realloc, or the ring (72% of all: 80% of the rest) */
      size_t s = (size_t)(r2 >> 8) % RING;
      slot = &w->ring[s];
      sizep = &w->ring_size[s];
    } else {                       /* the pool: 18% of all, 20% of the rest */
      size_t s = (size_t)(r2 >> 4) % POOL;
      slot = &w->pool[s];
      sizep = &w->pool_size[s];
    }
    if (pct < 10 && (r & 0x100)) {  /* half the reallocs resize a pool block */
      size_t s = (size_t)(r >> 16) % POOL;
      slot = &w->pool[s];
      sizep = &w->pool_size[s];
    }
    unsigned char *p;
    if (pct < 10) {
      p = checked(realloc(*slot, size));
      if (*sizep) w->sum += p[0];  /* kept across the realloc */
    } else {
      free(*slot);
      p = checked(malloc(size));
    }
    touch(w, p, size, r);
    *slot = p;
    *sizep = size;
  }
}

/* Twelve distinct functions (each its own code and return addresses): each
 * calls the next one the route names, the last one calls ops(). */
typedef void (*step_fn)(worker *, const uint8_t *, int, uint64_t);
static const step_fn steps[FUNCS];

#define STEP(k)                                                                    \
  static __attribute__((noinline)) void step##k(worker *w, const uint8_t *route,  \
                                                int left, uint64_t n) {          \
    volatile int keep = k;                                                         \
    if (left > 0) steps[route[0]](w, route + 1, left - 1, n);                      \
    else ops(w, n);                                                                \
    w->sum += (uint64_t)keep * 0;                                                  \
  }
STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7) STEP(8) STEP(9) STEP(10) STEP(11)
static const step_fn steps[FUNCS] = {step0, step1, step2, step3, step4,  step5,
                                     step6, step7, step8, step9, step10, step11};

static __attribute__((noinline)) void work(worker *w) {
  uint64_t done = 0;
  uint64_t rs = w->seed ^ 0x5851F42D4C957F2Dull;
  while (done < w->ops) {
    uint64_t n = w->ops - done < BATCH ? w->ops - done : BATCH;
    uint64_t r = next_rand(&rs);
    int len = 2 + (int)(r % 9);    /* 2 to 10 of the 12 functions */
    uint8_t route[10];
    for (int i = 0; i < 10; i++) route[i] = (uint8_t)((r >> (8 + 5 * i)) % FUNCS);
    steps[route[0]](w, route + 1, len - 1, n);
    done += n;
  }
  for (size_t i = 0; i < RING; i++) free(w->ring[i]);
  for (size_t i = 0; i < POOL; i++) free(w->pool[i]);
  memset(w->ring, 0, sizeof w->ring);
  memset(w->pool, 0, sizeof w->pool);
}

void *volatile leak_sink;

/* Overwrites the dead stack below the caller, so that no stale copy of the
 * planted pointer is left for a conservative scan to find. */
static __attribute__((noinline)) void scrub_stack(void) {
  volatile uint64_t pad[4096];
  for (size_t i = 0; i < sizeof pad / sizeof pad[0]; i++) pad[i] = 0;
}

static __attribute__((noinline)) void *leak_one(void) {
  char *p = malloc(4242);
  if (p) memset(p, 0x42, 4242);
  return p;
}

/* Thread t of T runs shares t, t + T, ... one after the other. */
typedef struct {
  worker *w;
  int     first, step;
} job;

static void *run_shares(void *arg) {
  job *j = arg;
  for (int s = j->first; s < SHARES; s += j->step) work(&j->w[s]);
  return NULL;
}

int main(int argc, char **argv) {
  uint64_t ops_all = 5000000;
  int threads = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc) ops_all = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--ops N] [--threads T]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1 || threads > SHARES) threads = 1;
  worker *w = calloc(SHARES, sizeof *w);
  if (!w) return 1;
  for (int s = 0; s < SHARES; s++) {
    w[s].ops = ops_all / SHARES + ((uint64_t)s < ops_all % SHARES);
    w[s].seed = 0x9E3779B97F4A7C15ull * (uint64_t)(s + 1);
  }
  pthread_t tid[SHARES];
  job jobs[SHARES];
  for (int t = 0; t < threads; t++) jobs[t] = (job){ w, t, threads };
  for (int t = 1; t < threads; t++)
    if (pthread_create(&tid[t], NULL, run_shares, &jobs[t]) != 0) {
      fprintf(stderr, "mixchurn: pthread_create failed\n");
      return 1;
    }
  run_shares(&jobs[0]);
  for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
  uint64_t sum = 0;
  for (int s = 0; s < SHARES; s++) sum += w[s].sum;
  free(w);
  leak_sink = leak_one();   /* then lost: a direct leak */
  leak_sink = NULL;
  scrub_stack();
  printf("mixchurn: %llu operations, %d thread(s), checksum %016llx\n", (unsigned long long)ops_all, threads,
         (unsigned long long)sum);
  return 0;
}
