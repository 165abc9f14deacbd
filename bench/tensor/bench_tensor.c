/* bench_tensor.c - what tensor/ costs, next to numpy and PyTorch CPU in the
 * same run:
 *   1. sgemm GFLOP/s at 256, 512, 1024 (tensor_gemm_out) vs numpy.matmul;
 *   2. conv2d at LeNet-5 sizes, batch 64: forward, and the backward products
 *      (dL/dx, dL/dw, dL/db) vs torch conv2d and aten convolution_backward;
 *   both with 1 and 2 threads (OpenBLAS and torch);
 *   tanh, sigmoid, exp [64,256], softmax and cross-entropy [64,114] (the char
 *   LM's sizes) and 2x2 max pooling [64,6,28,28] with 1 thread;
 *   3. the ledger's overhead on a full LeNet-5 forward pass (batch 64, with
 *      cross-entropy): TAGALLOC_RECORD=1 (stacks, the default) vs
 *      TAGALLOC_RECORD=0 (counting only), each in a fresh process, rounds
 *      interleaved; target under 3 %.
 * Every cell is a median.  Output is markdown.
 *
 *   build/bench-tensor [--reps N] [--cycles N] [--rounds N] [--ref bench/tensor/ref.py]
 *                      [--python /usr/bin/python3] */
#include "tensor.h"
#include "tagalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CYCLES 15
static int reps = 9, rounds = 9, cycles = 3;
static const char *ref_script = "bench/tensor/ref.py", *python = "/usr/bin/python3";

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef void bench_fn(void *arg);

/* Median seconds per call over reps repetitions of inner calls. */
static double time_it(bench_fn *fn, void *arg, int inner) {
  double v[64];
  fn(arg);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    for (int i = 0; i < inner; i++) fn(arg);
    v[r] = (now() - t0) / inner;
  }
  return median(v, reps);
}

/* ---- sgemm ---------------------------------------------------------------- */

typedef struct { tensor *a, *b, *c; } gemm_arg;

static void run_gemm(void *p) {
  gemm_arg *g = p;
  if (tensor_gemm_out(g->c, g->a, g->b, 1.0f, 0.0f) != TENSOR_OK) exit(1);
}

/* ---- conv2d ---------------------------------------------------------------- */

typedef struct {
  const char *name;
  int64_t xs[4], ws[4];
  int pad;
  tensor *x, *w, *b, *dy;
} conv_arg;

static void run_conv_fwd(void *p) {
  conv_arg *c = p;
  tensor_free(tensor_conv2d(c->x, c->w, c->b, 1, c->pad));
}

static void run_conv_bwd(void *p) {
  conv_arg *c = p;
  tensor_free(tensor_conv2d_grad_input(c->dy, c->w, 4, c->xs, 1, c->pad));
  tensor_free(tensor_conv2d_grad_weight(c->dy, c->x, 4, c->ws, 1, c->pad));
  tensor_free(tensor_conv2d_grad_bias(c->dy));
}

/* ---- elementwise and row ops at the char LM's and LeNet's sizes ---------------- */

#define N_EW 6
typedef struct { tensor *h, *l, *y, *p; } ew_arg;
static const char *ew_names[N_EW] = { "tanh", "sigmoid", "exp", "softmax", "cross_entropy", "max_pool2d" };
static const char *ew_shapes[N_EW] = { "[64,256]", "[64,256]", "[64,256]", "[64,114] rows", "[64,114], labels [64]",
                                       "[64,6,28,28] 2x2/2, with argmax" };
static int ew_which;

static void run_ew(void *p) {
  ew_arg *e = p;
  tensor *am = NULL, *r;
  switch (ew_which) {
  case 0: r = tensor_tanh(e->h); break;
  case 1: r = tensor_sigmoid(e->h); break;
  case 2: r = tensor_exp(e->h); break;
  case 3: r = tensor_softmax(e->l, 1); break;
  case 4: r = tensor_cross_entropy(e->l, e->y); break;
  default: r = tensor_max_pool2d(e->p, 2, 2, &am); break;
  }
  if (r == NULL) exit(1);
  tensor_free(r);
  tensor_free(am);
}

/* ---- the reference side ------------------------------------------------------- */

typedef struct { char name[32]; double sec; } ref_cell;
static char ref_versions[128] = "?";

static int run_ref(int threads, ref_cell *cells, int max) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d %s %s %d %d", threads, threads, python,
           ref_script, threads, reps);
  FILE *f = popen(cmd, "r");
  if (f == NULL) return 0;
  int n = 0;
  char line[256];
  while (n < max && fgets(line, sizeof line, f)) {
    if (strncmp(line, "versions ", 9) == 0) sscanf(line + 9, "%127s", ref_versions);
    else if (sscanf(line, "%31s %lf", cells[n].name, &cells[n].sec) == 2) n++;
  }
  if (pclose(f) != 0) fprintf(stderr, "bench-tensor: %s failed (numpy and torch installed? make bench-deps)\n", cmd);
  return n;
}

static double ref_get(const ref_cell *cells, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(cells[i].name, name) == 0) return cells[i].sec;
  return 0;
}

/* ---- LeNet-5 forward ---------------------------------------------------------- */

typedef struct {
  tensor *x, *y, *w1, *b1, *w2, *b2, *w3, *b3, *w4, *b4, *w5, *b5;
} lenet;

static void lenet_init(lenet *n) {
  n->x = tensor_randn(TS(64, 1, 28, 28), 1.0f, 1);
  n->y = tensor_zeros(TENSOR_I32, TS(64));
  for (int i = 0; i < 64; i++) tensor_i32(n->y)[i] = i % 10;
  n->w1 = tensor_randn(TS(6, 1, 5, 5), 0.2f, 2);
  n->b1 = tensor_zeros(TENSOR_F32, TS(6));
  n->w2 = tensor_randn(TS(16, 6, 5, 5), 0.08f, 3);
  n->b2 = tensor_zeros(TENSOR_F32, TS(16));
  n->w3 = tensor_randn(TS(400, 120), 0.05f, 4);
  n->b3 = tensor_zeros(TENSOR_F32, TS(120));
  n->w4 = tensor_randn(TS(120, 84), 0.09f, 5);
  n->b4 = tensor_zeros(TENSOR_F32, TS(84));
  n->w5 = tensor_randn(TS(84, 10), 0.1f, 6);
  n->b5 = tensor_zeros(TENSOR_F32, TS(10));
}

static void lenet_free(lenet *n) {
  tensor *all[] = { n->x, n->y, n->w1, n->b1, n->w2, n->b2, n->w3, n->b3, n->w4, n->b4, n->w5, n->b5 };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

static float lenet_forward(const lenet *n) {
  tensor_scope_begin();
  tensor *h = tensor_conv2d(n->x, n->w1, n->b1, 1, 2);     /* [64,6,28,28] */
  tensor_relu_(h);
  h = tensor_max_pool2d(h, 2, 2, NULL);                     /* [64,6,14,14] */
  h = tensor_conv2d(h, n->w2, n->b2, 1, 0);                 /* [64,16,10,10] */
  tensor_relu_(h);
  h = tensor_max_pool2d(h, 2, 2, NULL);                     /* [64,16,5,5] */
  h = tensor_reshape(h, TS(64, 400));
  h = tensor_matmul(h, n->w3);
  tensor_add_(h, n->b3);
  tensor_relu_(h);
  h = tensor_matmul(h, n->w4);
  tensor_add_(h, n->b4);
  tensor_relu_(h);
  h = tensor_matmul(h, n->w5);
  tensor_add_(h, n->b5);
  float loss = tensor_item(tensor_cross_entropy(h, n->y));
  tensor_scope_end();
  return loss;
}

static void run_forward(void *p) {
  if (lenet_forward(p) != lenet_forward(p)) exit(1);
}

/* The child: forward passes under this process's ledger configuration;
 * prints the median seconds per pass. */
static int child_forward(void) {
  tensor_set_threads(1);
  lenet n;
  lenet_init(&n);
  tensor_pool *p = tensor_pool_new();
  tensor_pool_use(p);
  for (int i = 0; i < 20; i++) lenet_forward(&n);          /* warm: unwinder cache, depot, pool */
  reps = 15;
  printf("%.9f\n", time_it(run_forward, &n, 10) / 2);
  tensor_pool_use(NULL);
  tensor_pool_free(p);
  lenet_free(&n);
  return 0;
}

static double spawn_forward(int record) {
  int fd[2];
  if (pipe(fd) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    setenv("TAGALLOC_RECORD", record ? "1" : "0", 1);
    setenv("TAGALLOC_REPORT", "0", 1);
    setenv("TAGALLOC_SCAN", "0", 1);
    unsetenv("TAGALLOC_TRACE");
    unsetenv("TAGALLOC_UNWIND");
    execl("/proc/self/exe", "bench-tensor", "--child-forward", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  char buf[64] = { 0 };
  ssize_t got = read(fd[0], buf, sizeof buf - 1);
  close(fd[0]);
  int st;
  waitpid(pid, &st, 0);
  return got > 0 ? atof(buf) : 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--child-forward") == 0) return child_forward();
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--cycles") == 0 && i + 1 < argc) cycles = atoi(argv[++i]);
    else if (strcmp(argv[i], "--ref") == 0 && i + 1 < argc) ref_script = argv[++i];
    else if (strcmp(argv[i], "--python") == 0 && i + 1 < argc) python = argv[++i];
    else {
      fprintf(stderr, "usage: bench-tensor [--reps N] [--cycles N] [--rounds N] [--ref PATH/ref.py] [--python PYTHON]\n");
      return 2;
    }
  }
  if (reps < 3) reps = 3;
  if (reps > 64) reps = 64;
  if (rounds < 3) rounds = 3;
  if (cycles < 1) cycles = 1;
  if (cycles > MAX_CYCLES) cycles = MAX_CYCLES;
  double load[3] = { 0 };
  getloadavg(load, 3);
  printf("# bench-tensor\n\nload average at start: %.2f %.2f %.2f; %ld CPUs; each cell: the median of %d cycles "
         "(ours, then numpy/torch), each the median of %d repetitions\n\n",
         load[0], load[1], load[2], sysconf(_SC_NPROCESSORS_ONLN), cycles, reps);

  /* inputs */
  gemm_arg g[3];
  int sizes[3] = { 256, 512, 1024 };
  for (int i = 0; i < 3; i++) {
    int64_t n = sizes[i];
    g[i].a = tensor_randn(TS(n, n), 1.0f, 10 + i);
    g[i].b = tensor_randn(TS(n, n), 1.0f, 20 + i);
    g[i].c = tensor_empty(TENSOR_F32, TS(n, n));
  }
  conv_arg conv[2] = {
    { "conv1", { 64, 1, 28, 28 }, { 6, 1, 5, 5 }, 2, 0, 0, 0, 0 },
    { "conv2", { 64, 6, 14, 14 }, { 16, 6, 5, 5 }, 0, 0, 0, 0, 0 },
  };
  for (int i = 0; i < 2; i++) {
    conv_arg *c = &conv[i];
    c->x = tensor_randn(4, c->xs, 1.0f, 30 + i);
    c->w = tensor_randn(4, c->ws, 0.1f, 40 + i);
    c->b = tensor_randn(TS(c->ws[0]), 1.0f, 50 + i);
    tensor *y = tensor_conv2d(c->x, c->w, c->b, 1, c->pad);
    c->dy = tensor_randn(4, y->shape, 1.0f, 60 + i);
    tensor_free(y);
  }

  ew_arg ew = { tensor_randn(TS(64, 256), 2.0f, 70), tensor_randn(TS(64, 114), 3.0f, 71),
                tensor_zeros(TENSOR_I32, TS(64)), tensor_randn(TS(64, 6, 28, 28), 1.0f, 72) };
  for (int i = 0; i < 64; i++) tensor_i32(ew.y)[i] = (i * 7) % 114;
  double ce[MAX_CYCLES][N_EW], re[MAX_CYCLES][N_EW], ours_e[N_EW], ref_e[N_EW];

  double ours_g[2][3], ours_c[2][2][2], heap_c[2][2][2], ref_g[2][3], ref_c[2][2][2];
  tensor_pool *pool = tensor_pool_new();
  /* cycles x threads, ours then the reference's each time: drift of the
   * machine's load lands on both sides; each cell is the median of the cycles. */
  double cg[MAX_CYCLES][2][3], cc[MAX_CYCLES][2][2][2], ch[MAX_CYCLES][2][2][2];
  double rg[MAX_CYCLES][2][3], rc[MAX_CYCLES][2][2][2];
  for (int cy = 0; cy < cycles; cy++)
    for (int t = 0; t < 2; t++) {
      tensor_set_threads(t + 1);
      for (int i = 0; i < 3; i++) {
        int inner = sizes[i] == 256 ? 32 : sizes[i] == 512 ? 4 : 1;
        cg[cy][t][i] = time_it(run_gemm, &g[i], inner);
      }
      for (int i = 0; i < 2; i++) {
        ch[cy][t][i][0] = time_it(run_conv_fwd, &conv[i], 5);
        ch[cy][t][i][1] = time_it(run_conv_bwd, &conv[i], 5);
        tensor_pool_use(pool);
        cc[cy][t][i][0] = time_it(run_conv_fwd, &conv[i], 5);
        cc[cy][t][i][1] = time_it(run_conv_bwd, &conv[i], 5);
        tensor_pool_use(NULL);
      }
      ref_cell cells[32];
      int nc = run_ref(t + 1, cells, 32);
      char name[32];
      for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "sgemm%d", sizes[i]);
        rg[cy][t][i] = ref_get(cells, nc, name);
      }
      if (t == 0) {   /* elementwise: 1 thread only */
        tensor_pool_use(pool);
        for (ew_which = 0; ew_which < N_EW; ew_which++) {
          ce[cy][ew_which] = time_it(run_ew, &ew, 20);
          re[cy][ew_which] = ref_get(cells, nc, ew_names[ew_which]);
        }
        tensor_pool_use(NULL);
      }
      for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s_fwd", conv[i].name);
        rc[cy][t][i][0] = ref_get(cells, nc, name);
        snprintf(name, sizeof name, "%s_bwd", conv[i].name);
        rc[cy][t][i][1] = ref_get(cells, nc, name);
      }
      fprintf(stderr, "cycle %d/%d, %d thread(s) done\n", cy + 1, cycles, t + 1);
    }
  double col[MAX_CYCLES];
#define MED(dst, src) do { for (int cy = 0; cy < cycles; cy++) col[cy] = (src); (dst) = median(col, cycles); } while (0)
  for (int t = 0; t < 2; t++) {
    for (int i = 0; i < 3; i++) {
      MED(ours_g[t][i], cg[cy][t][i]);
      MED(ref_g[t][i], rg[cy][t][i]);
    }
    for (int i = 0; i < 2; i++)
      for (int p = 0; p < 2; p++) {
        MED(ours_c[t][i][p], cc[cy][t][i][p]);
        MED(heap_c[t][i][p], ch[cy][t][i][p]);
        MED(ref_c[t][i][p], rc[cy][t][i][p]);
      }
  }

  for (int i = 0; i < N_EW; i++) {
    MED(ours_e[i], ce[cy][i]);
    MED(ref_e[i], re[cy][i]);
  }

  printf("reference: %s (%s)\n\n", ref_versions, python);
  printf("## sgemm (tensor_gemm_out vs numpy.matmul)\n\n");
  printf("| n | threads | tensor GFLOP/s | numpy GFLOP/s | tensor / numpy |\n|---|---|---|---|---|\n");
  for (int i = 0; i < 3; i++)
    for (int t = 0; t < 2; t++) {
      double fl = 2.0 * sizes[i] * sizes[i] * (double)sizes[i];
      double a = fl / ours_g[t][i] * 1e-9, b = ref_g[t][i] ? fl / ref_g[t][i] * 1e-9 : 0;
      printf("| %d | %d | %.1f | %.1f | %.2f |\n", sizes[i], t + 1, a, b, b ? a / b : 0);
    }
  printf("\n## conv2d, LeNet-5 sizes, batch 64 (vs PyTorch CPU)\n\n");
  printf("conv1: x [64,1,28,28], w [6,1,5,5], padding 2; conv2: x [64,6,14,14], w [16,6,5,5].\n"
         "bwd = dL/dx + dL/dw + dL/db (torch: aten::convolution_backward with all three).\n\n");
  printf("tensor: results and scratch from a tensor pool (tensor_pool_use), as a training loop runs; "
         "heap: every result and scratch buffer a fresh ledger block.\n\n");
  printf("| layer | pass | threads | tensor ms | tensor (heap) ms | torch ms | torch time / tensor time |\n"
         "|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < 2; i++)
    for (int p = 0; p < 2; p++)
      for (int t = 0; t < 2; t++)
        printf("| %s | %s | %d | %.3f | %.3f | %.3f | %.2f |\n", conv[i].name, p ? "bwd" : "fwd", t + 1,
               ours_c[t][i][p] * 1e3, heap_c[t][i][p] * 1e3, ref_c[t][i][p] * 1e3,
               ours_c[t][i][p] > 0 ? ref_c[t][i][p] / ours_c[t][i][p] : 0);

  printf("\n## elementwise and row ops, 1 thread (vs PyTorch CPU; results from a tensor pool)\n\n");
  printf("| op | shape | tensor us | torch us | torch time / tensor time |\n|---|---|---|---|---|\n");
  for (int i = 0; i < N_EW; i++)
    printf("| %s | %s | %.2f | %.2f | %.2f |\n", ew_names[i], ew_shapes[i], ours_e[i] * 1e6, ref_e[i] * 1e6,
           ours_e[i] > 0 ? ref_e[i] / ours_e[i] : 0);

  /* the ledger's overhead */
  double rec[64], cnt[64];
  for (int r = 0; r < rounds && r < 64; r++) {
    if (r % 2 == 0) {
      rec[r] = spawn_forward(1);
      cnt[r] = spawn_forward(0);
    } else {
      cnt[r] = spawn_forward(0);
      rec[r] = spawn_forward(1);
    }
    fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
  int nr = rounds < 64 ? rounds : 64;
  double ratios[64];
  for (int r = 0; r < nr; r++) ratios[r] = cnt[r] > 0 ? rec[r] / cnt[r] : 0;
  double mr = median(rec, nr), mc = median(cnt, nr), mratio = median(ratios, nr);
  double over = (mratio - 1) * 100;
  printf("\n## the ledger's overhead on a LeNet-5 forward pass (batch 64, 1 thread, a tensor pool)\n\n");
  lenet net;
  lenet_init(&net);
  ta_mark m = ta_mark_now();
  lenet_forward(&net);
  lenet_free(&net);
  printf("Each configuration in a fresh process, %d rounds interleaved; one pass makes %llu tensor headers and "
         "%llu storages (%llu ledger allocations in all).\n\n",
         nr, (unsigned long long)ta_since(m, ta_tag_get("tensor.header")).allocs,
         (unsigned long long)ta_since(m, ta_tag_get("tensor.storage")).allocs,
         (unsigned long long)ta_since(m, TA_ANY).allocs);
  printf("| ledger | ms per forward pass |\n|---|---|\n");
  printf("| recording (TAGALLOC_RECORD=1, exact stacks) | %.3f |\n", mr * 1e3);
  printf("| counting only (TAGALLOC_RECORD=0) | %.3f |\n", mc * 1e3);
  printf("\noverhead (median of per-round ratios): %+.2f %% (target < 3 %%): %s\n", over, over < 3 ? "PASS" : "MISS");
  getloadavg(load, 3);
  printf("\nload average at end: %.2f %.2f %.2f\n", load[0], load[1], load[2]);

  for (int i = 0; i < 3; i++) {
    tensor_free(g[i].a);
    tensor_free(g[i].b);
    tensor_free(g[i].c);
  }
  tensor_pool_free(pool);
  tensor_free(ew.h);
  tensor_free(ew.l);
  tensor_free(ew.y);
  tensor_free(ew.p);
  for (int i = 0; i < 2; i++) {
    tensor_free(conv[i].x);
    tensor_free(conv[i].w);
    tensor_free(conv[i].b);
    tensor_free(conv[i].dy);
  }
  return 0;
}
