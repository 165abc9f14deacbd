/* gemm_shapes.c - the matrix products of one train-charlm step (batch 64,
 * context 8 x embedding 64 = 512, hidden 256, vocabulary 114), timed with
 * OpenBLAS's cblas_sgemm, with tensor/gemm_small.c's kernels and, built
 * with -DHAVE_LIBXSMM, with libxsmm's JIT kernels (libxsmm_smmdispatch), on
 * the same operands, alternating, 1 thread; thread CPU time, the median of
 * --reps rounds of --n calls each.  Prints a markdown table.
 *
 * The step's products: the second linear layer's three (64 x 114 x 256 and
 * its two backward products), and the first layer's as the fused
 * embedding -> linear op makes them (tensor/embed_linear.c): per position
 * of the window (8 a step) three products over its U distinct indices (U
 * = 25: the mean over train-charlm's batches), with the leading dimensions
 * of the weight's 64-column block.  --u N sets U; --unfused adds the three
 * 64 x 256 x 512 products the separate layers make.
 *
 *   make build/gemm-shapes      (with libxsmm where its headers are installed)
 *   OPENBLAS_NUM_THREADS=1 build/gemm-shapes [--n 200] [--reps 15] [--u 25] [--unfused]
 *
 * libxsmm is column-major: a row-major C = op(A) op(B) is its C^T =
 * op(B)^T op(A)^T, so the operands swap and a row-major transposed B is
 * its transposed A. */
#include "gemm_small.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef HAVE_LIBXSMM
#include <libxsmm.h>
#endif

typedef struct {
  const char *what;
  int ta, tb, M, N, K;
  int lda, ldb, ldc;   /* 0: packed */
  float beta;
  int per_step;        /* calls a step */
} shape;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define WAYS 3   /* OpenBLAS, own, libxsmm */

int main(int argc, char **argv) {
  int n = 200, reps = 15, U = 25, unfused = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--unfused")) unfused = 1;
    else if (i + 1 < argc && !strcmp(argv[i], "--n")) n = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--u")) U = atoi(argv[++i]);
    else {
      fprintf(stderr, "gemm-shapes: unknown argument '%s' (--n N, --reps N, --u N, --unfused)\n", argv[i]);
      return 2;
    }
  }
  if (n < 1 || reps < 1 || reps > 100 || U < 1 || U > 64) {
    fprintf(stderr, "gemm-shapes: --n and --reps must be positive (reps <= 100), --u in 1..64\n");
    return 2;
  }
  const shape all[] = {
    { "fused forward P_j = E_j @ W1_j^T", 0, 1, U, 256, 64, 64, 512, 256, 0, 8 },
    { "fused backward dW1_j += S_j^T @ E_j", 1, 0, 256, 64, U, 256, 64, 512, 1, 8 },
    { "fused backward G_j = S_j @ W1_j", 0, 0, U, 64, 256, 256, 512, 64, 0, 8 },
    { "forward h @ W2^T", 0, 1, 64, 114, 256, 0, 0, 0, 0, 1 },
    { "backward dy @ W2", 0, 0, 64, 256, 114, 0, 0, 0, 0, 1 },
    { "backward dW2 += dy^T @ h", 1, 0, 114, 256, 64, 0, 0, 0, 1, 1 },
    { "unfused forward x @ W1^T", 0, 1, 64, 256, 512, 0, 0, 0, 0, 1 },
    { "unfused backward dh @ W1", 0, 0, 64, 512, 256, 0, 0, 0, 0, 1 },
    { "unfused backward dW1 += dh^T @ x", 1, 0, 256, 512, 64, 0, 0, 0, 1, 1 },
  };
  int nshapes = unfused ? 9 : 6;
#ifdef HAVE_LIBXSMM
  libxsmm_init();
  const int ways = 3;
  printf("| product | op | M x N x K | calls a step | OpenBLAS us | own us | libxsmm us | OpenBLAS / own | OpenBLAS / libxsmm |\n"
         "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
#else
  const int ways = 2;
  printf("| product | op | M x N x K | calls a step | OpenBLAS us | own us | OpenBLAS / own |\n"
         "| --- | --- | --- | ---: | ---: | ---: | ---: |\n");
#endif
  double step[WAYS] = { 0, 0, 0 };
  int xsmm_all = 1;
  for (int s = 0; s < nshapes; s++) {
    const shape *p = &all[s];
    int lda = p->lda ? p->lda : p->ta ? p->M : p->K, ldb = p->ldb ? p->ldb : p->tb ? p->K : p->N;
    int ldc = p->ldc ? p->ldc : p->N;
    size_t na = (size_t)lda * (p->ta ? p->K : p->M), nb = (size_t)ldb * (p->tb ? p->N : p->K), nc = (size_t)ldc * p->M;
    if (p->per_step == 8 && p->tb) nb = (size_t)ldb * p->N;   /* W1 [256, 512]: N rows of 512 */
    float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb), *C = calloc(nc, sizeof(float));
    for (size_t i = 0; i < na; i++) A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    if (!_tensor_sgemm_small_serves(p->ta, p->tb, p->M, p->N, p->K)) {
      fprintf(stderr, "gemm-shapes: the own kernels do not serve %s here (no AVX2+FMA, or TENSOR_GEMM=blas)\n", p->what);
      return 1;
    }
#ifdef HAVE_LIBXSMM
    /* column-major: m = N, n = M, op(a) = op(B)^T, op(b) = op(A)^T */
    float alpha = 1.0f, beta = p->beta;
    int flags = (p->tb ? LIBXSMM_GEMM_FLAG_TRANS_A : 0) | (p->ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
    libxsmm_blasint xm = p->N, xn = p->M, xk = p->K, xlda = ldb, xldb = lda, xldc = ldc;
    libxsmm_smmfunction k = libxsmm_smmdispatch(xm, xn, xk, &xlda, &xldb, &xldc, &alpha, &beta, &flags, NULL);
#endif
    double t[WAYS][100];
    for (int r = 0; r < reps; r++)
      for (int w = 0; w < ways; w++) {
        double t0 = now();
        for (int i = 0; i < n; i++) {
          /* the fused products walk the weight's 8 column blocks, as a step does */
          const float *b = B + (p->per_step == 8 && !p->ta ? (i % 8) * 64 : 0);
          float *c = C + (p->per_step == 8 && p->ta ? (i % 8) * 64 : 0);
          if (w == 0)
            cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans, p->M,
                        p->N, p->K, 1.0f, A, lda, b, ldb, p->beta, c, ldc);
          else if (w == 1)
            _tensor_sgemm_small(p->ta, p->tb, p->M, p->N, p->K, 1.0f, A, lda, b, ldb, p->beta, c, ldc);
#ifdef HAVE_LIBXSMM
          else if (k)
            k(b, A, c);
#endif
        }
        t[w][r] = (now() - t0) / n * 1e6;
      }
    double med[WAYS];
    for (int w = 0; w < ways; w++) {
      qsort(t[w], reps, sizeof(double), cmp);
      med[w] = t[w][reps / 2];
      if (s < 6) step[w] += med[w] * p->per_step;
    }
    printf("| %s | %s%s | %d x %d x %d | %d | %.1f | %.1f |", p->what, p->ta ? "T" : "N", p->tb ? "T" : "N", p->M,
           p->N, p->K, p->per_step, med[0], med[1]);
#ifdef HAVE_LIBXSMM
    if (k) printf(" %.1f | %.2fx | %.2fx |\n", med[2], med[0] / med[1], med[0] / med[2]);
    else printf(" no kernel | %.2fx | |\n", med[0] / med[1]);
    xsmm_all &= k != NULL;
#else
    printf(" %.2fx |\n", med[0] / med[1]);
#endif
    free(A), free(B), free(C);
  }
  printf("| a step's products (U = %d) | | | | %.1f | %.1f |", U, step[0], step[1]);
#ifdef HAVE_LIBXSMM
  if (xsmm_all) printf(" %.1f | %.2fx | %.2fx |\n", step[2], step[0] / step[1], step[0] / step[2]);
  else printf(" (not all) | %.2fx | |\n", step[0] / step[1]);
#else
  printf(" %.2fx |\n", step[0] / step[1]);
#endif
  return 0;
}
