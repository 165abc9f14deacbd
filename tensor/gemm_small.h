/* gemm_small.h - the project's own single-precision matrix product for the
 * small shapes of the training programs' linear layers (gemm_small.c).
 * Private to tensor/.
 *
 *   C[M x N] = alpha * op(A)[M x K] @ op(B)[K x N] + beta * C, row-major,
 *   op(X) = X or X^T as in cblas_sgemm (ta, tb nonzero: transposed), with
 *   leading dimensions lda, ldb, ldc as cblas_sgemm's.  beta == 0: C is
 *   written, never read (NaN in C does not survive), as in BLAS.
 *
 * Returns false, having done nothing, where it does not serve the call: no
 * AVX2 + FMA on this CPU, both operands transposed, a shape above the size
 * limit, or TENSOR_GEMM=blas in the environment; the caller then calls
 * cblas_sgemm. */
#ifndef TAGALLOC_TENSOR_GEMM_SMALL_H
#define TAGALLOC_TENSOR_GEMM_SMALL_H

#include <stdbool.h>
#include <stdint.h>

bool _tensor_sgemm_small(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Whether _tensor_sgemm_small serves an (M, N, K, ta, tb) call here; tests
 * use it to know which path they measure. */
bool _tensor_sgemm_small_serves(int ta, int tb, int64_t M, int64_t N, int64_t K);

#endif
