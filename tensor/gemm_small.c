/* gemm_small.c - single-precision matrix products for small shapes in
 * AVX2 + FMA registers, without packing (see gemm_small.h for the contract).
 *
 * The training programs' linear layers make six products a step, from
 * 64x114x256 to 256x512x64 (M x N x K).  OpenBLAS spends a large part of
 * such a call outside its kernel (copying both operands into its panel
 * layout, its thread checks); these kernels read the operands where they
 * are, which the shapes allow because every operand fits in L2:
 *
 *   op(B) = B (NN, TN): a tile of 6 rows x 16 columns of C in 12 vector
 *   accumulators; per k, two vectors of B's row k (loaded, or masked loads
 *   at the right edge) and one broadcast of A's (i, k) per row, read with
 *   A's strides, so A as it is or transposed costs the same.  B's 16-column
 *   strip is copied first to 64-byte rows (zeros past N), 256 k at a time
 *   (16 KiB), and stays in L1 across the tiles down M: read in place, rows
 *   2 KiB apart fall in a few L1 sets and evict each other.
 *
 *   op(A) = A, op(B) = B^T (NT: x @ W^T, the forward): both operands are
 *   rows along k, so a tile of 3 rows x 4 columns of C keeps 12 vectors of
 *   partial dot products over k (8 lanes each, masked loads for the last
 *   K % 8), summed across lanes once per tile.
 *
 *   op(A) = A^T and op(B) = B^T together: not served (OpenBLAS).
 *
 * Sums run in a different order than OpenBLAS's, so results differ from it
 * within float rounding: |C - exact| <= (K + 2) * 2^-23 * (|alpha| *
 * sum_k |a_ik b_kj| + |beta c_ij|), which tests/tensor/test_tensor_kernels.c
 * checks on every shape class against a double reference.
 *
 * Chosen once per process: AVX2 and FMA present (__builtin_cpu_supports),
 * and TENSOR_GEMM not "blas" (benchmarks and tests compare both paths). */
#include "gemm_small.h"

#include <stdlib.h>
#include <string.h>

/* The sizes served: every operand in L2 and the product too small for
 * OpenBLAS's blocking to pay (a 512x512x512 product is 2^27). */
#define SMALL_MAX_MNK ((int64_t)1 << 25)
#define SMALL_MAX_DIM 4096

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_X86 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#define KINLINE static inline __attribute__((always_inline))

/* lanes < n set, n in 0..8 */
static const int32_t mask_src[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
KINLINE __m256i lanes(int64_t n) {
  if (n < 0) n = 0;
  if (n > 8) n = 8;
  return _mm256_loadu_si256((const __m256i *)(mask_src + 8 - n));
}

/* C[r][h*8 ..] = alpha * acc + beta * C, the lanes of mask m only when !full */
KINLINE void put8(float *c, __m256 acc, float alpha, float beta, int full, __m256i m) {
  __m256 v = _mm256_mul_ps(acc, _mm256_set1_ps(alpha));
  if (full) {
    if (beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(c), v);
    _mm256_storeu_ps(c, v);
  } else {
    if (beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(c, m), v);
    _mm256_maskstore_ps(c, m, v);
  }
}

/* ---- op(B) = B: 6 x 16 tiles ------------------------------------------------------ */

/* MR rows (constant after inlining) x nb columns (16: full) of C from A at
 * (i, k) = A[i*ars + k*acs] and the packed strip Bp[k*16 ..] (zeros past
 * nb). */
KINLINE void tile_nn(const int MR, const int full, int64_t K, const float *A, int64_t ars, int64_t acs,
                     const float *Bp, int64_t nb, float alpha, float beta, float *C, int64_t ldc) {
  __m256 c0[6], c1[6];
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    const float *b = Bp + k * 16, *a = A + k * acs;
    __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
      __m256 av = _mm256_broadcast_ss(a + r * ars);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
  __m256i m0 = lanes(nb), m1 = lanes(nb - 8);
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) {
    put8(C + r * ldc, c0[r], alpha, beta, full, m0);
    if (full || nb > 8) put8(C + r * ldc + 8, c1[r], alpha, beta, full, m1);
  }
}

/* One strip of 16 (or nb < 16) columns down all M rows. */
KINLINE void strip_nn(const int full, const int a_rows, int64_t M, int64_t K, const float *A, int64_t lda,
                      const float *Bp, int64_t nb, float alpha, float beta, float *C, int64_t ldc) {
  /* a_rows: A's rows are along k (op(A) = A: ars = lda, acs = 1), else A^T */
  int64_t ars = a_rows ? lda : 1, acs = a_rows ? 1 : lda;
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) tile_nn(6, full, K, A + i * ars, ars, acs, Bp, nb, alpha, beta, C + i * ldc, ldc);
  const float *a = A + i * ars;
  float *c = C + i * ldc;
  switch (M - i) {
  case 5: tile_nn(5, full, K, a, ars, acs, Bp, nb, alpha, beta, c, ldc); break;
  case 4: tile_nn(4, full, K, a, ars, acs, Bp, nb, alpha, beta, c, ldc); break;
  case 3: tile_nn(3, full, K, a, ars, acs, Bp, nb, alpha, beta, c, ldc); break;
  case 2: tile_nn(2, full, K, a, ars, acs, Bp, nb, alpha, beta, c, ldc); break;
  case 1: tile_nn(1, full, K, a, ars, acs, Bp, nb, alpha, beta, c, ldc); break;
  default: break;
  }
}

/* k per packed strip: 16 KiB, in L1 beside A's rows */
#define KC 256

static void gemm_nn(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  /* B's 16-column strip copied to consecutive rows of 64 bytes: read in
   * place, rows ldb apart (2 KiB for N = 512) fall in a few L1 sets and
   * evict each other. */
  float Bp[KC * 16] __attribute__((aligned(64)));
  for (int64_t j = 0; j < N; j += 16) {
    int64_t nb = N - j < 16 ? N - j : 16;
    __m256i m0 = lanes(nb), m1 = lanes(nb - 8);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      int64_t kc = K - k0 < KC ? K - k0 : KC;
      float bk = k0 == 0 ? beta : 1.0f;   /* later k blocks add to the first's */
      for (int64_t k = 0; k < kc; k++) {
        const float *b = B + (k0 + k) * ldb + j;
        if (nb == 16) {
          _mm256_store_ps(Bp + k * 16, _mm256_loadu_ps(b));
          _mm256_store_ps(Bp + k * 16 + 8, _mm256_loadu_ps(b + 8));
        } else {
          _mm256_store_ps(Bp + k * 16, _mm256_maskload_ps(b, m0));
          _mm256_store_ps(Bp + k * 16 + 8, _mm256_maskload_ps(b + 8, m1));
        }
      }
      const float *a = ta ? A + k0 * lda : A + k0;
      if (nb == 16) {
        if (ta) strip_nn(1, 0, M, kc, a, lda, Bp, 16, alpha, bk, C + j, ldc);
        else strip_nn(1, 1, M, kc, a, lda, Bp, 16, alpha, bk, C + j, ldc);
      } else {
        if (ta) strip_nn(0, 0, M, kc, a, lda, Bp, nb, alpha, bk, C + j, ldc);
        else strip_nn(0, 1, M, kc, a, lda, Bp, nb, alpha, bk, C + j, ldc);
      }
    }
  }
}

/* ---- op(A) = A, op(B) = B^T: 3 x 4 tiles of dot products ---------------------------- */

/* the four lane sums of c0..c3, in order */
KINLINE __m128 sum4(__m256 c0, __m256 c1, __m256 c2, __m256 c3) {
  __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* MR rows of A (rows along k) x NR rows of B (the columns of C). */
KINLINE void tile_nt(const int MR, const int NR, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float alpha, float beta, float *C, int64_t ldc) {
  __m256 acc[3][4];
#pragma GCC unroll 3
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) acc[r][s] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 a[3];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++) a[r] = _mm256_loadu_ps(A + r * lda + k);
#pragma GCC unroll 4
    for (int s = 0; s < NR; s++) {
      __m256 b = _mm256_loadu_ps(B + s * ldb + k);
#pragma GCC unroll 3
      for (int r = 0; r < MR; r++) acc[r][s] = _mm256_fmadd_ps(a[r], b, acc[r][s]);
    }
  }
  if (k < K) {
    __m256i m = lanes(K - k);
    __m256 a[3];
#pragma GCC unroll 3
    for (int r = 0; r < MR; r++) a[r] = _mm256_maskload_ps(A + r * lda + k, m);
#pragma GCC unroll 4
    for (int s = 0; s < NR; s++) {
      __m256 b = _mm256_maskload_ps(B + s * ldb + k, m);
#pragma GCC unroll 3
      for (int r = 0; r < MR; r++) acc[r][s] = _mm256_fmadd_ps(a[r], b, acc[r][s]);
    }
  }
#pragma GCC unroll 3
  for (int r = 0; r < MR; r++) {
    __m128 v = _mm_mul_ps(sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), _mm_set1_ps(alpha));
    float *c = C + r * ldc;
    if (NR == 4) {
      if (beta != 0.0f) v = _mm_fmadd_ps(_mm_set1_ps(beta), _mm_loadu_ps(c), v);
      _mm_storeu_ps(c, v);
    } else {
      float o[4];
      _mm_storeu_ps(o, v);
#pragma GCC unroll 4
      for (int s = 0; s < NR; s++) c[s] = beta != 0.0f ? o[s] + beta * c[s] : o[s];
    }
  }
}

/* NR columns of C down all M rows */
KINLINE void col_nt(const int NR, int64_t M, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float alpha, float beta, float *C, int64_t ldc) {
  int64_t i = 0;
  for (; i + 3 <= M; i += 3) tile_nt(3, NR, K, A + i * lda, lda, B, ldb, alpha, beta, C + i * ldc, ldc);
  if (M - i == 2) tile_nt(2, NR, K, A + i * lda, lda, B, ldb, alpha, beta, C + i * ldc, ldc);
  else if (M - i == 1) tile_nt(1, NR, K, A + i * lda, lda, B, ldb, alpha, beta, C + i * ldc, ldc);
}

/* ---- op(B) = B^T with a short k: B^T's strips packed, then the 6 x 16 tiles --------- */

/* Bp[k*16 + c] = B[c*ldb + k] for the nb (<= 16) rows of B at b, k < K
 * (zeros past nb): B^T's 16-column strip in the layout tile_nn reads.
 * Full 8 x 8 blocks by register transposes, the edges one by one. */
static void pack_bt(float *Bp, const float *b, int64_t ldb, int64_t nb, int64_t K) {
  int64_t k = 0;
  if (nb == 16)
    for (; k + 8 <= K; k += 8)
      for (int h = 0; h < 2; h++) {
        const float *r = b + h * 8 * ldb + k;
        __m256 r0 = _mm256_loadu_ps(r), r1 = _mm256_loadu_ps(r + ldb), r2 = _mm256_loadu_ps(r + 2 * ldb),
               r3 = _mm256_loadu_ps(r + 3 * ldb), r4 = _mm256_loadu_ps(r + 4 * ldb),
               r5 = _mm256_loadu_ps(r + 5 * ldb), r6 = _mm256_loadu_ps(r + 6 * ldb),
               r7 = _mm256_loadu_ps(r + 7 * ldb);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float *o = Bp + k * 16 + h * 8;
        _mm256_store_ps(o + 0 * 16, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_store_ps(o + 1 * 16, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_store_ps(o + 2 * 16, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_store_ps(o + 3 * 16, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_store_ps(o + 4 * 16, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_store_ps(o + 5 * 16, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_store_ps(o + 6 * 16, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_store_ps(o + 7 * 16, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
  for (; k < K; k++)
    for (int64_t c = 0; c < 16; c++) Bp[k * 16 + c] = c < nb ? b[c * ldb + k] : 0.0f;
}

/* k up to this: B^T packed (the dot products' lane sums cost as much as
 * their k loop there: 25 x 256 x 64, the fused embedding op's forward,
 * ran at about half the FMA rate of the NN tiles) */
#define NT_PACK_K 128

static void gemm_nt_packed(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  float Bp[NT_PACK_K * 16] __attribute__((aligned(64)));
  for (int64_t j = 0; j < N; j += 16) {
    int64_t nb = N - j < 16 ? N - j : 16;
    pack_bt(Bp, B + j * ldb, ldb, nb, K);
    if (nb == 16) strip_nn(1, 1, M, K, A, lda, Bp, 16, alpha, beta, C + j, ldc);
    else strip_nn(0, 1, M, K, A, lda, Bp, nb, alpha, beta, C + j, ldc);
  }
}

static void gemm_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float beta, float *C, int64_t ldc) {
  if (K <= NT_PACK_K && M >= 6) {
    gemm_nt_packed(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) col_nt(4, M, K, A, lda, B + j * ldb, ldb, alpha, beta, C + j, ldc);
  switch (N - j) {
  case 3: col_nt(3, M, K, A, lda, B + j * ldb, ldb, alpha, beta, C + j, ldc); break;
  case 2: col_nt(2, M, K, A, lda, B + j * ldb, ldb, alpha, beta, C + j, ldc); break;
  case 1: col_nt(1, M, K, A, lda, B + j * ldb, ldb, alpha, beta, C + j, ldc); break;
  default: break;
  }
}

#pragma GCC pop_options
#endif

static int enabled(void) {
  static int on = -1;   /* -1: not decided yet; the same answer from any thread */
  int got = __atomic_load_n(&on, __ATOMIC_RELAXED);
  if (got >= 0) return got;
#ifdef GEMM_X86
  const char *e = getenv("TENSOR_GEMM");
  got = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !(e && strcmp(e, "blas") == 0);
#else
  got = 0;
#endif
  __atomic_store_n(&on, got, __ATOMIC_RELAXED);
  return got;
}

bool _tensor_sgemm_small_serves(int ta, int tb, int64_t M, int64_t N, int64_t K) {
  if (!enabled() || (ta && tb)) return false;
  if (M < 1 || N < 1 || K < 1 || M > SMALL_MAX_DIM || N > SMALL_MAX_DIM || K > SMALL_MAX_DIM) return false;
  return M * N * K <= SMALL_MAX_MNK;
}

bool _tensor_sgemm_small(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (!_tensor_sgemm_small_serves(ta, tb, M, N, K)) return false;
#ifdef GEMM_X86
  if (tb) gemm_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else gemm_nn(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  return true;
#else
  (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
  return false;
#endif
}
