/* churn.c - bench/auditor workload: malloc/free churn 5 to 12 frames deep.
 *
 *   churn [--allocs N] [--threads T]
 *
 * N allocations in all (default 5,000,000), split evenly over T threads
 * (default 1).  Each thread keeps a ring of live blocks; an operation frees
 * the block in one slot and allocates a new one there (sizes 16 B to 2 KiB,
 * a few up to 16 KiB) and writes into it.  The operations run in batches at
 * the bottom of a recursion of 1 to 8 noinline frames, so that each malloc
 * and free is called 5 to 12 frames deep (with main or the thread's start
 * function, and libc's frames below them).  Prints a checksum that depends
 * only on N (not on T or on the allocator), and leaks one block of 4242
 * bytes from leak_one() on purpose, for the auditors to find. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING  512
#define BATCH 64

typedef struct {
  uint64_t allocs;   /* to make */
  uint64_t seed;
  uint64_t sum;      /* result */
  void    *ring[RING];
} worker;

static inline uint64_t next_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static size_t pick_size(uint64_t r) {
  if ((r & 63) == 0) return 2048 + (size_t)((r >> 8) % 14336);   /* 1 in 64: 2-16 KiB */
  return 16 + (size_t)((r >> 8) % 2033);                          /* 16 B to 2 KiB */
}

/* One batch of operations: the bottom frame. */
static __attribute__((noinline)) uint64_t churn_batch(worker *w, uint64_t n) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = next_rand(&w->seed);
    size_t slot = (size_t)(r >> 40) % RING;
    free(w->ring[slot]);
    size_t size = pick_size(r);
    unsigned char *p = malloc(size);
    if (!p) {
      fprintf(stderr, "churn: out of memory\n");
      exit(1);
    }
    p[0] = (unsigned char)r;
    p[size - 1] = (unsigned char)(r >> 8);
    sum += size + p[0] + p[size - 1];
    w->ring[slot] = p;
  }
  return sum;
}

/* depth more frames, then a batch; the volatile keeps them real frames. */
static __attribute__((noinline)) uint64_t descend(worker *w, int depth, uint64_t n) {
  volatile int keep = depth;
  uint64_t s = depth > 1 ? descend(w, depth - 1, n) : churn_batch(w, n);
  return s + (uint64_t)keep * 0;
}

static void *work(void *arg) {
  worker *w = arg;
  uint64_t done = 0;
  int depth = 1;
  while (done < w->allocs) {
    uint64_t n = w->allocs - done < BATCH ? w->allocs - done : BATCH;
    w->sum += descend(w, depth, n);
    done += n;
    depth = depth == 8 ? 1 : depth + 1;
  }
  for (size_t i = 0; i < RING; i++) {
    free(w->ring[i]);
    w->ring[i] = NULL;
  }
  return NULL;
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

/* Each thread runs its shares one after the other: thread t of T runs
 * shares t, t + T, ... */
typedef struct {
  worker *w;
  int     first, step;
} job;

enum { SHARES = 64 };

static void *run_shares(void *arg) {
  job *j = arg;
  for (int s = j->first; s < SHARES; s += j->step) work(&j->w[s]);
  return NULL;
}

int main(int argc, char **argv) {
  uint64_t allocs = 5000000;
  int threads = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--allocs") == 0 && i + 1 < argc) allocs = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--allocs N] [--threads T]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1 || threads > SHARES) threads = 1;
  /* The work is cut into 64 fixed shares (seeded by share), whatever T is,
   * so the checksum does not depend on T. */
  worker *w = calloc(SHARES, sizeof *w);
  if (!w) return 1;
  for (int s = 0; s < SHARES; s++) {
    w[s].allocs = allocs / SHARES + ((uint64_t)s < allocs % SHARES);
    w[s].seed = 0x9E3779B97F4A7C15ull * (uint64_t)(s + 1);
  }
  pthread_t tid[SHARES];
  job jobs[SHARES];
  for (int t = 0; t < threads; t++) jobs[t] = (job){ w, t, threads };
  for (int t = 1; t < threads; t++)
    if (pthread_create(&tid[t], NULL, run_shares, &jobs[t]) != 0) {
      fprintf(stderr, "churn: pthread_create failed\n");
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
  printf("churn: %llu allocations, %d thread(s), checksum %016llx\n", (unsigned long long)allocs, threads,
         (unsigned long long)sum);
  return 0;
}
