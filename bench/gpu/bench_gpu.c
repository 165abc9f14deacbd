/* bench_gpu.c - the caching pool against the backend's raw device
 * allocation, and the pool's hit rate in a training-like steady state.
 *
 *   build/bench-gpu [--steps N] [--reps N]      (make bench-gpu)
 *
 * 1. Latency: one allocation and its free, in steady state (the pool's
 *    cache warm), for several sizes; the same through the backend's own
 *    alloc/free (the host backend: its mapping's pages committed and given
 *    back; CUDA: cudaMalloc and cudaFree).  Median of --reps runs of a
 *    timed loop, nanoseconds per pair.  The pool's pair includes the
 *    ledger's two device-block records with their stacks.
 * 2. Steady state: the buffers of LeNet-5's training step at batch 64
 *    (activations, their gradients, the workspace, the parameters'
 *    gradients), allocated in the order a step makes them and freed at its
 *    end, for --steps steps.  After the first step no device allocation
 *    may happen, and at least 99% of the requests must be served from the
 *    cache: the program exits 1 otherwise.
 *
 * TAGALLOC_GPU picks the backend (auto: CUDA where it runs). */
#include "gpu.h"
#include "tagalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ns per alloc+free pair through the pool (cache warm). */
static double pool_pair(gpu_pool *p, size_t size, int iters) {
  gpu_pool_free(p, gpu_pool_alloc(p, size, NULL));   /* warm */
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    void *x = gpu_pool_alloc(p, size, NULL);
    if (x == NULL) {
      fprintf(stderr, "bench-gpu: pool allocation of %zu bytes failed: %s\n", size, gpu_pool_error());
      exit(2);
    }
    gpu_pool_free(p, x);
  }
  return (now_ns() - t0) / iters;
}

/* ns per alloc+free pair through the backend. */
static double raw_pair(const gpu_backend *b, size_t size, int iters) {
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    void *x = NULL;
    if (b->alloc(&x, size) != GPU_OK) {
      fprintf(stderr, "bench-gpu: %s alloc of %zu bytes failed: %s\n", b->name, size, b->last_error());
      exit(2);
    }
    b->free(x);
  }
  return (now_ns() - t0) / iters;
}

/* The device buffers of one LeNet-5 training step at batch 64, in bytes,
 * in the order a step allocates them (forward, loss, backward, update). */
static const size_t lenet_step[] = {
  64 * 1 * 28 * 28 * 4,    /* input */
  64 * 4,                  /* labels */
  64 * 6 * 28 * 28 * 4,    /* conv1 */
  64 * 6 * 28 * 28 * 4,    /* relu1 */
  64 * 6 * 14 * 14 * 4,    /* pool1 */
  64 * 6 * 14 * 14 * 4,    /* pool1 argmax */
  64 * 16 * 10 * 10 * 4,   /* conv2 */
  64 * 16 * 10 * 10 * 4,   /* relu2 */
  64 * 16 * 5 * 5 * 4,     /* pool2 */
  64 * 16 * 5 * 5 * 4,     /* pool2 argmax */
  64 * 120 * 4,            /* fc1 */
  64 * 120 * 4,            /* relu3 */
  64 * 84 * 4,             /* fc2 */
  64 * 84 * 4,             /* relu4 */
  64 * 10 * 4,             /* logits */
  64 * 10 * 4,             /* probabilities */
  4,                       /* loss */
  64 * 10 * 4,             /* dlogits */
  64 * 84 * 4,             /* d relu4 */
  84 * 10 * 4,             /* d fc3 weight */
  64 * 120 * 4,            /* d relu3 */
  120 * 84 * 4,            /* d fc2 weight */
  64 * 400 * 4,            /* d pool2 */
  400 * 120 * 4,           /* d fc1 weight */
  64 * 16 * 10 * 10 * 4,   /* d conv2 */
  16 * 6 * 5 * 5 * 4,      /* d conv2 weight */
  6 * 25 * 10 * 10 * 4,    /* conv2 workspace */
  64 * 6 * 14 * 14 * 4,    /* d pool1 */
  64 * 6 * 28 * 28 * 4,    /* d conv1 */
  6 * 1 * 5 * 5 * 4,       /* d conv1 weight */
  1 * 25 * 28 * 28 * 4,    /* conv1 workspace */
};
#define STEP_BUFS (sizeof lenet_step / sizeof *lenet_step)

int main(int argc, char **argv) {
  int steps = 200, reps = 7;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "bench-gpu: %s: unknown argument (want --steps N, --reps N)\n", argv[i]);
      return 2;
    }
  }
  if (steps < 2 || reps < 1 || reps > 101) {
    fprintf(stderr, "bench-gpu: --steps %d (want >= 2), --reps %d (want 1 .. 101)\n", steps, reps);
    return 2;
  }
  const gpu_backend *b = gpu_backend_get();
  if (b == NULL) return 2;
  gpu_pool *p = gpu_pool_new(b, NULL);
  printf("backend: %s (%s)\n", b->name, b->device_name());

  /* 1. latency */
  static const size_t sizes[] = { 4096, 256 << 10, 4 << 20, 32 << 20 };
  printf("\nalloc+free pair, ns (median of %d):\n", reps);
  printf("%12s %12s %12s %9s\n", "bytes", "pool", "raw", "raw/pool");
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    double pv[101], rv[101];
    for (int r = 0; r < reps; r++) {
      pv[r] = pool_pair(p, sizes[s], 20000);
      rv[r] = raw_pair(b, sizes[s], 200);
    }
    double pm = median(pv, reps), rm = median(rv, reps);
    printf("%12zu %12.0f %12.0f %8.1fx\n", sizes[s], pm, rm, rm / pm);
  }
  gpu_pool_empty_cache(p);
  gpu_pool_stats_reset(p);

  /* 2. steady state */
  gpu_stats st;
  void *bufs[STEP_BUFS];
  int64_t after_first = 0, hits_first = 0, req_first = 0, reserved_first = 0, segs_first = 0;
  for (int step = 0; step < steps; step++) {
    for (size_t i = 0; i < STEP_BUFS; i++) {
      bufs[i] = gpu_pool_alloc(p, lenet_step[i], NULL);
      if (bufs[i] == NULL) {
        fprintf(stderr, "bench-gpu: step %d: %s\n", step, gpu_pool_error());
        return 2;
      }
    }
    for (size_t i = STEP_BUFS; i-- > 0;) gpu_pool_free(p, bufs[i]);
    if (step == 0) {
      gpu_pool_stats(p, &st);
      after_first = st.num_device_alloc;
      hits_first = st.num_hits;
      req_first = st.num_requests;
      reserved_first = st.reserved_bytes[GPU_STAT_ALL].current;
      segs_first = st.segment[GPU_STAT_ALL].current;
    }
  }
  gpu_pool_stats(p, &st);
  int64_t dev_after = st.num_device_alloc - after_first;
  int64_t req = st.num_requests - req_first, hits = st.num_hits - hits_first;
  double rate = req ? 100.0 * (double)hits / (double)req : 0.0;
  printf("\nsteady state: LeNet-5 step at batch 64, %zu buffers a step, %d steps\n", STEP_BUFS, steps);
  printf("  first step: %lld device allocations, %lld bytes reserved (%lld segments)\n", (long long)after_first,
         (long long)reserved_first, (long long)segs_first);
  printf("  steps 2..%d: %lld requests, %lld from the cache: hit rate %.2f%%, %lld device allocations\n", steps,
         (long long)req, (long long)hits, rate, (long long)dev_after);
  printf("  at the end: %lld bytes reserved; peak allocated %lld bytes, peak reserved %lld bytes\n",
         (long long)st.reserved_bytes[GPU_STAT_ALL].current,
         (long long)st.allocated_bytes[GPU_STAT_ALL].peak, (long long)st.reserved_bytes[GPU_STAT_ALL].peak);
  gpu_pool_empty_cache(p);
  gpu_pool_destroy(p);
  if (rate < 99.0 || dev_after != 0) {
    printf("FAIL: the steady state needs a hit rate of at least 99%% and no device allocation after the first step\n");
    return 1;
  }
  printf("ok: hit rate >= 99%%, no device allocation after the first step\n");
  return 0;
}
