/* bench_alloc.c - what one alloc+free pair costs under the ledger.
 *
 *   make bench-alloc            (or: build/bench-alloc [--reps N] [--pairs N] ...)
 *
 * Prints a markdown table: nanoseconds per ta_alloc(tag, size) + ta_free pair
 * at call-stack depths 8, 16 and 32, with exact (DWARF) and fast (frame
 * pointer) unwinding and with counting only (TAGALLOC_RECORD=0), on 1 and 2
 * threads, next to jemalloc mallocx/dallocx and glibc malloc/free measured in
 * the same run; two more rows run exact and fast without the quarantine
 * (TAGALLOC_QUARANTINE=0) to show the stacks' cost apart from it.  Then the
 * targets with PASS/MISS.  See bench/README.md.
 *
 * How
 * ---
 * The ledger reads its options once, in a constructor, so each ledger
 * configuration runs in processes of its own: the parent re-executes
 * /proc/self/exe as "--child IMPL UNWIND FILL PAIRS CELLS" with a clean
 * TAGALLOC_* environment (TAGALLOC_UNWIND, TAGALLOC_RECORD,
 * TAGALLOC_REPORT=0, TAGALLOC_SCAN=0; the quarantine and the stack depth
 * keep their defaults except in the two rows that say otherwise; whatever
 * TAGALLOC_* the caller had set is dropped) and reads one line per cell
 * (depth x threads) from the child's stdout.  One round runs one child per
 * allocator configuration, in a new shuffled order each round, and each
 * child measures its six cells in a new shuffled order: one repetition of
 * every cell per round.  Each cell of the table is the median over the
 * rounds (--reps, default 9).
 *
 * In a child each cell starts fresh threads.  Each thread descends a
 * recursion of noinline frames such that the stack of every ta_alloc and
 * ta_free call is DEPTH frames (run_pairs, bottom, descend x (DEPTH - 5),
 * thread_main, start_thread, clone3; the child reports what the ledger
 * records, capped by TAGALLOC_DEPTH = 32) and at the bottom runs the loop:
 * a ring of 64 live blocks; each pair frees the oldest block and allocates a
 * new one (sizes cycle through 16..256 bytes) and writes its first word.
 * Each thread warms up (unwinder rule cache, depot, jemalloc's tcache)
 * before the timed pairs.  A ledger child first fills the default
 * quarantine (64 MiB) with blocks of the same sizes, so that the timed pairs
 * see the steady state of a long run, where each free also evicts, checks
 * and releases an old block (--no-fill: do not).  The threads of a cell
 * start the timed loop together (a barrier); ns per pair per thread is the
 * wall time from the first start to the last end divided by the pairs of
 * one thread.  A second table gives the CPU time of the threads
 * (CLOCK_THREAD_CPUTIME_ID) per pair: what the pairs cost when the machine
 * is shared with other work (time spent preempted is not in it; cache and
 * memory-bandwidth interference still is).
 */
#include "tagalloc.h"

#include <errno.h>
#include <gnu/libc-version.h>
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* glibc's own allocator: plain malloc/free are jemalloc's in this binary
 * (libjemalloc exports them and is linked in). */
extern void *__libc_malloc(size_t size);
extern void  __libc_free(void *p);

extern char **environ;

#define NOFRAME_OPT __attribute__((noinline, noipa))

enum { IMPL_TA, IMPL_JE, IMPL_LIBC };

#define RING 64
static const uint32_t sizes[] = { 16, 32, 48, 64, 96, 128, 256 };
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define WARM_PAIRS 20000ull          /* per thread and cell, before timing */

static double clock_ns(clockid_t id)
{
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static double now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
  if (n == 0)
    return NAN;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ==== the child: one allocator configuration, one repetition of its cells  */

typedef struct {
  int impl, depth, nthreads;
  uint64_t pairs, warm;
  ta_tag tag;
  pthread_barrier_t *start, *stop;
  double t0, t1;                     /* this thread's timed loop, wall */
  double c0, c1;                     /* the same, the thread's CPU time */
  size_t frames;                     /* frames the ledger records per pair */
  void *ring[RING];
  unsigned head, si;
} __attribute__((aligned(64))) worker;   /* no false sharing between threads */

/* The pair loop, specialised for each allocator (impl is a constant). */
static inline __attribute__((always_inline)) void pairs_loop(worker *w, uint64_t n, const int impl)
{
  void **ring = w->ring;
  unsigned head = w->head, si = w->si;
  ta_tag tag = w->tag;
  for (uint64_t i = 0; i < n; i++) {
    void *old = ring[head];
    size_t size = sizes[si];
    si = si + 1 == NSIZES ? 0 : si + 1;
    void *p;
    switch (impl) {
    case IMPL_TA:   ta_free(old);       p = ta_alloc(tag, size); break;
    case IMPL_JE:   dallocx(old, 0);    p = mallocx(size, 0);    break;
    default:        __libc_free(old);   p = __libc_malloc(size); break;
    }
    if (p == NULL)
      abort();
    *(volatile uint64_t *)p = i;       /* the block is used */
    ring[head] = p;
    head = (head + 1) % RING;
  }
  w->head = head;
  w->si = si;
}

static NOFRAME_OPT void run_pairs(worker *w, uint64_t n)
{
  if (w->impl == IMPL_TA && w->frames == SIZE_MAX) {
    /* the stack that ta_alloc records here, untimed (first call only) */
    uintptr_t frames[TA_MAX_DEPTH];
    w->frames = ta_stack_frames(ta_stack_here(), frames, TA_MAX_DEPTH);
  }
  switch (w->impl) {
  case IMPL_TA: pairs_loop(w, n, IMPL_TA); break;
  case IMPL_JE: pairs_loop(w, n, IMPL_JE); break;
  default:      pairs_loop(w, n, IMPL_LIBC); break;
  }
}

/* The bottom frame: fill the ring, warm up, time, drain. */
static NOFRAME_OPT uint64_t bottom(worker *w)
{
  for (unsigned k = 0; k < RING; k++) {
    size_t size = sizes[k % NSIZES];
    w->ring[k] = w->impl == IMPL_TA ? ta_alloc(w->tag, size)
               : w->impl == IMPL_JE ? mallocx(size, 0) : __libc_malloc(size);
    if (w->ring[k] == NULL)
      abort();
  }
  w->frames = SIZE_MAX;
  run_pairs(w, w->warm);
  if (w->frames == SIZE_MAX)
    w->frames = 0;
  if (w->pairs) {
    pthread_barrier_wait(w->start);
    w->t0 = now_ns();
    w->c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    run_pairs(w, w->pairs);
    w->c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    w->t1 = now_ns();
    pthread_barrier_wait(w->stop);
  }
  for (unsigned k = 0; k < RING; k++) {
    if (w->impl == IMPL_TA) ta_free(w->ring[k]);
    else if (w->impl == IMPL_JE) dallocx(w->ring[k], 0);
    else __libc_free(w->ring[k]);
  }
  return w->head;
}

/* k noinline frames, then the bottom one. */
static NOFRAME_OPT uint64_t descend(worker *w, int k)
{
  uint64_t r = k <= 1 ? bottom(w) : descend(w, k - 1);
  __asm__ volatile("" : "+r"(r) : : "memory");    /* no tail call, no loop */
  return r;
}

/* The stack of each ta_alloc / ta_free call, innermost first: run_pairs,
 * bottom, descend x (DEPTH - 5), thread_main, start_thread, clone3: DEPTH
 * frames in all (ta_stack_here in run_pairs checks it). */
#define OUTER_FRAMES 5
static NOFRAME_OPT void *thread_main(void *arg)
{
  worker *w = arg;
  int k = w->depth - OUTER_FRAMES;
  uint64_t r = descend(w, k < 1 ? 1 : k);
  __asm__ volatile("" : "+r"(r) : : "memory");
  return NULL;
}

typedef struct {
  double wall;      /* ns per pair per thread: wall time, first start to last end */
  double cpu;       /* ns per pair: the threads' CPU time, averaged over threads */
  size_t frames;    /* frames in the stacks the ledger records */
} cell_result;

/* One cell: nthreads threads at depth `depth`, each warms up with `warm`
 * pairs and times `pairs` (0: warm-up only). */
static cell_result run_cell(int impl, ta_tag tag, int depth, int nthreads, uint64_t warm,
                            uint64_t pairs)
{
  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  pthread_barrier_init(&stop, NULL, (unsigned)nthreads);
  worker ws[nthreads];
  pthread_t th[nthreads];
  for (int i = 0; i < nthreads; i++) {
    ws[i] = (worker){ .impl = impl, .depth = depth, .nthreads = nthreads, .pairs = pairs,
                      .warm = warm, .tag = tag, .start = &start, .stop = &stop };
    if (pthread_create(&th[i], NULL, thread_main, &ws[i]) != 0) {
      fprintf(stderr, "bench-alloc: pthread_create failed\n");
      exit(4);
    }
  }
  for (int i = 0; i < nthreads; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&stop);
  double t0 = ws[0].t0, t1 = ws[0].t1, cpu = 0;
  for (int i = 0; i < nthreads; i++) {
    if (ws[i].t0 < t0) t0 = ws[i].t0;
    if (ws[i].t1 > t1) t1 = ws[i].t1;
    cpu += ws[i].c1 - ws[i].c0;
  }
  cell_result r = { 0, 0, ws[0].frames };
  if (pairs) {
    r.wall = (t1 - t0) / (double)pairs;
    r.cpu = cpu / nthreads / (double)pairs;
  }
  return r;
}

/* --child IMPL UNWIND FILL PAIRS CELLS: CELLS is "DEPTHxTHREADS,..."; prints
 * one line "DEPTH THREADS WALL_NS CPU_NS FRAMES" per cell, in the order given. */
static int child_main(int argc, char **argv)
{
  if (argc != 6) {
    fprintf(stderr, "bench-alloc: --child IMPL UNWIND FILL PAIRS CELLS\n");
    return 2;
  }
  const char *impl_s = argv[1], *unwind_s = argv[2];
  int impl = strcmp(impl_s, "ta") == 0 ? IMPL_TA : strcmp(impl_s, "je") == 0 ? IMPL_JE : IMPL_LIBC;
  int fill = atoi(argv[3]);
  uint64_t pairs = strtoull(argv[4], NULL, 10);
  if (pairs == 0)
    return 2;

  ta_tag tag = TA_ANY;
  if (impl == IMPL_TA) {
    long want = strcmp(unwind_s, "fast") == 0 ? 1 : strcmp(unwind_s, "none") == 0 ? 2 : 0;
    if (ta_option("unwind") != want) {
      fprintf(stderr, "bench-alloc: child expected TAGALLOC_UNWIND=%s, got mode %ld\n",
              unwind_s, ta_option("unwind"));
      return 3;
    }
    tag = ta_tag_get("bench.pair");
  }
  /* The quarantine is per thread (it is drained when a thread ends), so the
   * threads of each cell first fill it with blocks of the same sizes, and
   * the timed pairs pay for eviction too, as in a long run. */
  uint64_t fill_pairs = 0;
  long q = impl == IMPL_TA ? ta_option("quarantine") : 0;
  if (fill && q > 0) {
    double avg = 0;
    for (size_t i = 0; i < NSIZES; i++)
      avg += sizes[i];
    avg /= NSIZES;
    fill_pairs = (uint64_t)(1.05 * (double)q / avg);
  }

  for (char *cell = strtok(argv[5], ","); cell; cell = strtok(NULL, ",")) {
    int depth, nthreads;
    if (sscanf(cell, "%dx%d", &depth, &nthreads) != 2 || depth < 1 || depth > 1000 ||
        nthreads < 1 || nthreads > 64)
      return 2;
    uint64_t warm = fill_pairs / (uint64_t)nthreads > WARM_PAIRS ? fill_pairs / (uint64_t)nthreads : WARM_PAIRS;
    cell_result r = run_cell(impl, tag, depth, nthreads, warm, pairs);
    printf("%d %d %.3f %.3f %zu\n", depth, nthreads, r.wall, r.cpu, r.frames);
    fflush(stdout);
  }
  /* Skip the ledger's exit work (it checks the poison of every quarantined
   * block): it is not measured, and it would add seconds to a run. */
  _exit(0);
}

/* ==== the parent: configurations, rounds, the table ===================== */

typedef struct {
  const char *name;      /* row label */
  const char *impl;      /* ta | je | libc */
  const char *unwind;    /* exact | fast | none (or "-") */
  int record;
  int no_quarantine;     /* TAGALLOC_QUARANTINE=0 (else the default) */
} variant;

/* The first three are the ledger as users run it (default quarantine); the
 * two rows without quarantine show what the stacks cost apart from it. */
static const variant variants[] = {
  { "tagalloc, exact unwind",                 "ta",   "exact", 1, 0 },
  { "tagalloc, fast unwind (frame ptr)",      "ta",   "fast",  1, 0 },
  { "tagalloc, counting only (RECORD=0)",     "ta",   "exact", 0, 0 },
  { "tagalloc, exact, no quarantine (QUARANTINE=0)", "ta", "exact", 1, 1 },
  { "tagalloc, fast, no quarantine (QUARANTINE=0)",  "ta", "fast",  1, 1 },
  { "jemalloc mallocx/dallocx",               "je",   "-",     0, 0 },
  { "glibc malloc/free",                      "libc", "-",     0, 0 },
};
enum { V_EXACT, V_FAST, V_COUNT, V_EXACT_NOQ, V_FAST_NOQ };
#define NVARIANTS (sizeof variants / sizeof variants[0])
static const int depths[] = { 8, 16, 32 };
#define NDEPTHS 3
static const int threads[] = { 1, 2 };
#define NTHREADS 2
#define NCONFIGS (NVARIANTS * NDEPTHS * NTHREADS)

#define CELL(v, d, t) (((size_t)(v) * NDEPTHS + (size_t)(d)) * NTHREADS + (size_t)(t))

static char **child_env(const variant *v)
{
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 8, sizeof *env);
  if (!env)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TAGALLOC_", 9) != 0)
      env[k++] = environ[i];
  static char unwind[64], record[32];
  static char report[] = "TAGALLOC_REPORT=0", scan[] = "TAGALLOC_SCAN=0";
  static char noq[] = "TAGALLOC_QUARANTINE=0";
  snprintf(unwind, sizeof unwind, "TAGALLOC_UNWIND=%s",
           strcmp(v->unwind, "-") == 0 ? "exact" : v->unwind);
  snprintf(record, sizeof record, "TAGALLOC_RECORD=%d", v->record);
  env[k++] = unwind;
  env[k++] = record;
  env[k++] = report;
  env[k++] = scan;
  if (v->no_quarantine)
    env[k++] = noq;
  env[k] = NULL;
  return env;
}

/* Runs one child for variant v over the cells (indices into depths x
 * threads) in the given order; stores its results into res[CELL] (NAN when
 * the child failed). */
static void run_child(int v, const size_t *cells, size_t ncells, uint64_t pairs, int fill,
                      cell_result *res)
{
  const variant *var = &variants[v];
  char list[256] = "", npairs[32], nfill[8];
  size_t len = 0;
  for (size_t i = 0; i < ncells; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%dx%d", i ? "," : "",
                            depths[cells[i] / NTHREADS], threads[cells[i] % NTHREADS]);
  snprintf(npairs, sizeof npairs, "%llu", (unsigned long long)pairs);
  snprintf(nfill, sizeof nfill, "%d", fill);
  for (size_t i = 0; i < ncells; i++)
    res[(size_t)v * NDEPTHS * NTHREADS + cells[i]] = (cell_result){ NAN, NAN, 0 };
  char name[] = "bench-alloc", child[] = "--child", impl[8], unwind[8];
  snprintf(impl, sizeof impl, "%s", var->impl);
  snprintf(unwind, sizeof unwind, "%s", var->unwind);
  char *argv[] = { name, child, impl, unwind, nfill, npairs, list, NULL };
  char **env = child_env(var);
  int fd[2];
  if (!env || pipe(fd) != 0)
    return;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0)
    return;
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execve("/proc/self/exe", argv, env);
    _exit(127);
  }
  close(fd[1]);
  free(env);
  FILE *in = fdopen(fd[0], "r");
  char line[256];
  int depth, nthr;
  cell_result r;
  while (in && fgets(line, sizeof line, in)) {
    if (sscanf(line, "%d %d %lf %lf %zu", &depth, &nthr, &r.wall, &r.cpu, &r.frames) != 5)
      continue;
    for (int d = 0; d < NDEPTHS; d++)
      for (int t = 0; t < NTHREADS; t++)
        if (depths[d] == depth && threads[t] == nthr)
          res[CELL(v, d, t)] = r;
  }
  if (in)
    fclose(in);
  else
    close(fd[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fprintf(stderr, "bench-alloc: child %s/%s failed (status 0x%x)\n",
            var->impl, var->unwind, status);
}

static void shuffle(size_t *v, size_t n, unsigned *seed)
{
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)rand_r(seed) % (i + 1);
    size_t x = v[i];
    v[i] = v[j];
    v[j] = x;
  }
}

static void print_machine(void)
{
  cpu_set_t set;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    ncpu = CPU_COUNT(&set);
  char model[256] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    while (fgets(line, sizeof line, f)) {
      if (strncmp(line, "model name", 10) == 0) {
        char *p = strchr(line, ':');
        if (p) {
          p++;
          while (*p == ' ' || *p == '\t')
            p++;
          p[strcspn(p, "\n")] = '\0';
          snprintf(model, sizeof model, "%s", p);
        }
        break;
      }
    }
    fclose(f);
  }
  char date[64];
  time_t t = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
  struct utsname u;
  if (uname(&u) != 0)
    snprintf(u.release, sizeof u.release, "?");
  printf("# tagalloc alloc+free benchmark\n\n");
  printf("- date: %s\n", date);
  printf("- machine: nproc %ld, CPU \"%s\", Linux %s\n", ncpu, model, u.release);
  printf("- tagalloc %s, jemalloc %s, glibc %s\n", TA_VERSION, JEMALLOC_VERSION,
         gnu_get_libc_version());
}

static void print_table(const double *ns)
{
  printf("| allocator | threads | depth 8 | depth 16 | depth 32 |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (int t = 0; t < NTHREADS; t++)
    for (int v = 0; v < (int)NVARIANTS; v++) {
      printf("| %s | %d |", variants[v].name, threads[t]);
      for (int d = 0; d < NDEPTHS; d++)
        printf(" %.1f |", ns[CELL(v, d, t)]);
      printf("\n");
    }
}

static void print_load(const char *what)
{
  char buf[128] = "?";
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fgets(buf, sizeof buf, f))
      buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
  }
  printf("%s (1, 5, 15 min, /proc/loadavg): %s\n", what, buf);
}

static void usage(void)
{
  fprintf(stderr,
          "usage: bench-alloc [--reps N] [--pairs N] [--no-fill]\n"
          "  --reps N    rounds (one child process per allocator each), default 9\n"
          "  --pairs N   timed alloc+free pairs per thread per repetition, default 200000\n"
          "  --no-fill   do not fill the ledger's quarantine before timing\n");
}

int main(int argc, char **argv)
{
  if (argc > 1 && strcmp(argv[1], "--child") == 0)
    return child_main(argc - 1, argv + 1);

  int reps = 9, fill = 1;
  uint64_t pairs = 200000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--pairs") == 0 && i + 1 < argc)
      pairs = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--no-fill") == 0)
      fill = 0;
    else {
      usage();
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (reps < 1 || pairs == 0) {
    usage();
    return 2;
  }

  print_machine();
  printf("- ");
  print_load("load average at the start");
  printf("- %d repetitions per cell (rounds of one process per allocator, configurations"
         " interleaved), %llu timed pairs per thread each; cells are medians\n",
         reps, (unsigned long long)pairs);
  fflush(stdout);

  cell_result *res = calloc(NCONFIGS * (size_t)reps, sizeof *res);
  if (!res)
    return 1;
  double t_start = now_ns();
  unsigned seed = 12345;
  for (int r = 0; r < reps; r++) {
    /* a new order each round, of the allocators and of the cells within
     * each child: configurations interleave over time */
    size_t vorder[NVARIANTS], corder[NDEPTHS * NTHREADS];
    for (size_t i = 0; i < NVARIANTS; i++)
      vorder[i] = i;
    shuffle(vorder, NVARIANTS, &seed);
    for (size_t i = 0; i < NVARIANTS; i++) {
      for (size_t k = 0; k < NDEPTHS * NTHREADS; k++)
        corder[k] = k;
      shuffle(corder, NDEPTHS * NTHREADS, &seed);
      run_child((int)vorder[i], corder, NDEPTHS * NTHREADS, pairs, fill,
                res + (size_t)r * NCONFIGS);
    }
    fprintf(stderr, "bench-alloc: round %d/%d done (%.0f s)\n", r + 1, reps,
            (now_ns() - t_start) / 1e9);
  }

  /* medians over the rounds, and the spread (p75 - p25) / median */
  double wall[NCONFIGS], cpu[NCONFIGS], spread[NCONFIGS];
  size_t frames[NCONFIGS];
  for (size_t c = 0; c < NCONFIGS; c++) {
    double v[reps], u[reps];
    size_t n = 0, m = 0;
    frames[c] = 0;
    for (int r = 0; r < reps; r++) {
      const cell_result *x = &res[(size_t)r * NCONFIGS + c];
      if (!isnan(x->wall))
        v[n++] = x->wall;
      if (!isnan(x->cpu))
        u[m++] = x->cpu;
      if (x->frames)
        frames[c] = x->frames;
    }
    wall[c] = median(v, n);                 /* sorts v */
    cpu[c] = median(u, m);
    spread[c] = n ? (v[(3 * n) / 4] - v[n / 4]) / wall[c] * 100 : NAN;
  }

  printf("\nns per alloc+free pair, per thread: wall time of the timed loop / pairs per"
         " thread (median of %d; tagalloc: default quarantine%s, TAGALLOC_DEPTH 32):\n\n",
         reps, fill ? ", filled before timing" : ", not filled before timing");
  print_table(wall);
  printf("\nThe same, from the threads' CPU time (CLOCK_THREAD_CPUTIME_ID; excludes time"
         " spent preempted):\n\n");
  print_table(cpu);

  printf("\nFrames in the stack the ledger records for each alloc and free (depth 8/16/32): "
         "exact %zu/%zu/%zu, fast %zu/%zu/%zu.\n",
         frames[CELL(V_EXACT, 0, 0)], frames[CELL(V_EXACT, 1, 0)], frames[CELL(V_EXACT, 2, 0)],
         frames[CELL(V_FAST, 0, 0)], frames[CELL(V_FAST, 1, 0)], frames[CELL(V_FAST, 2, 0)]);
  double sp[NCONFIGS];
  size_t worst = 0;
  for (size_t c = 0; c < NCONFIGS; c++) {
    sp[c] = isnan(spread[c]) ? 1e9 : spread[c];
    if (sp[c] > sp[worst])
      worst = c;
  }
  printf("Spread of the repetitions (wall), (p75 - p25) / median: %.0f%% in the median cell,"
         " %.0f%% at most (%s, %d thread%s, depth %d).\n",
         median(sp, NCONFIGS), spread[worst], variants[worst / (NDEPTHS * NTHREADS)].name,
         threads[worst % NTHREADS], threads[worst % NTHREADS] > 1 ? "s" : "",
         depths[(worst / NTHREADS) % NDEPTHS]);
  printf("- ");
  print_load("load average at the end");

  double exact16 = wall[CELL(V_EXACT, 1, 0)], fast16 = wall[CELL(V_FAST, 1, 0)];
  printf("\nTargets (tagalloc, depth 16, 1 thread, wall time; CPU time in brackets):\n\n");
  printf("- exact unwinding under 250 ns per pair: %.1f ns (%.1f): %s\n", exact16,
         cpu[CELL(V_EXACT, 1, 0)], exact16 < 250 ? "PASS" : "MISS");
  printf("- fast unwinding under 60 ns per pair: %.1f ns (%.1f): %s\n", fast16,
         cpu[CELL(V_FAST, 1, 0)], fast16 < 60 ? "PASS" : "MISS");
  printf("- for reference, without the quarantine (TAGALLOC_QUARANTINE=0): exact %.1f ns"
         " (%s), fast %.1f ns (%s)\n",
         wall[CELL(V_EXACT_NOQ, 1, 0)], wall[CELL(V_EXACT_NOQ, 1, 0)] < 250 ? "under 250" : "over 250",
         wall[CELL(V_FAST_NOQ, 1, 0)], wall[CELL(V_FAST_NOQ, 1, 0)] < 60 ? "under 60" : "over 60");
  printf("\n(total %.0f s)\n", (now_ns() - t_start) / 1e9);
  free(res);
  return 0;
}
