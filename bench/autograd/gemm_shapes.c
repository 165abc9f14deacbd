/* gemm_shapes.c - the six matrix products of one train-charlm step (batch
 * 64, context 8 x embedding 64 = 512, hidden 256, vocabulary 114), timed
 * with OpenBLAS's cblas_sgemm and with tensor/gemm_small.c's kernels, on
 * the same operands, alternating, 1 thread; thread CPU time, the median of
 * --reps rounds of --n calls each.  Prints a markdown table.
 *
 *   cc -O2 -Itensor bench/autograd/gemm_shapes.c build/libtagalloc-tensor.a build/libtagalloc.a \
 *      -lopenblas -ljemalloc -lunwind -ldw -lelf -lpthread -ldl -lm -o build/gemm-shapes
 *   OPENBLAS_NUM_THREADS=1 build/gemm-shapes [--n 200] [--reps 15] */
#include "gemm_small.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *what;
  int ta, tb, M, N, K;
  float beta;
} shape;

static const shape shapes[] = {
  { "forward x @ W1^T", 0, 1, 64, 256, 512, 0 },
  { "forward h @ W2^T", 0, 1, 64, 114, 256, 0 },
  { "backward dy @ W2", 0, 0, 64, 256, 114, 0 },
  { "backward dW2 += dy^T @ h", 1, 0, 114, 256, 64, 1 },
  { "backward dh @ W1", 0, 0, 64, 512, 256, 0 },
  { "backward dW1 += dh^T @ x", 1, 0, 256, 512, 64, 1 },
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int n = 200, reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--n")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
  }
  if (n < 1 || reps < 1 || reps > 100) {
    fprintf(stderr, "gemm-shapes: --n and --reps must be positive (reps <= 100)\n");
    return 2;
  }
  printf("| product | op | M x N x K | OpenBLAS us | own us | OpenBLAS / own |\n| --- | --- | --- | ---: | ---: | ---: |\n");
  double tot[2] = { 0, 0 };
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const shape *p = &shapes[s];
    int lda = p->ta ? p->M : p->K, ldb = p->tb ? p->K : p->N;
    float *A = malloc(sizeof(float) * p->M * p->K), *B = malloc(sizeof(float) * p->K * p->N),
          *C = calloc((size_t)p->M * p->N, sizeof(float));
    for (int i = 0; i < p->M * p->K; i++) A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < p->K * p->N; i++) B[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    if (!_tensor_sgemm_small_serves(p->ta, p->tb, p->M, p->N, p->K)) {
      fprintf(stderr, "gemm-shapes: the own kernels do not serve %s here (no AVX2+FMA, or TENSOR_GEMM=blas)\n", p->what);
      return 1;
    }
    double t[2][100];
    for (int r = 0; r < reps; r++)
      for (int w = 0; w < 2; w++) {
        double t0 = now();
        for (int i = 0; i < n; i++) {
          if (w == 0)
            cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans, p->M,
                        p->N, p->K, 1.0f, A, lda, B, ldb, p->beta, C, p->N);
          else _tensor_sgemm_small(p->ta, p->tb, p->M, p->N, p->K, 1.0f, A, lda, B, ldb, p->beta, C, p->N);
        }
        t[w][r] = (now() - t0) / n * 1e6;
      }
    qsort(t[0], reps, sizeof(double), cmp);
    qsort(t[1], reps, sizeof(double), cmp);
    double b = t[0][reps / 2], o = t[1][reps / 2];
    tot[0] += b, tot[1] += o;
    printf("| %s | %s%s | %d x %d x %d | %.1f | %.1f | %.2fx |\n", p->what, p->ta ? "T" : "N", p->tb ? "T" : "N", p->M,
           p->N, p->K, b, o, b / o);
    free(A), free(B), free(C);
  }
  printf("| all six | | | %.1f | %.1f | %.2fx |\n", tot[0], tot[1], tot[0] / tot[1]);
  return 0;
}
