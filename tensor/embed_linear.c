/* embed_linear.c - an embedding lookup, flattened, into a linear layer, as
 * one op (tensor_embedding_linear) and its backward: the first layers of a
 * character model, computed over the distinct indices only.
 *
 *   y [B, O] = bias + concat_j table[idx[b, j]] @ w^T      (j < C; w [O, C*D])
 *            = bias + sum_j table[idx[b, j]] @ w_j^T       (w_j = w[:, j*D .. (j+1)*D])
 *
 * Where a position j of the batch repeats an index (64 windows of text hold
 * about 25 distinct bytes at each position), rows that repeat are computed
 * once: per position, the distinct indices u_j[0 .. U_j) are gathered
 * (E_j = table[u_j], U_j x D) and
 *
 *   forward:  P_j = E_j @ w_j^T (U_j x O); y[b] = bias + sum_j P_j[slot(b, j)]
 *   backward: S_j[u] = sum of dy[b] over the b whose index at j is u_j[u] (U_j x O)
 *             dw_j += S_j^T @ E_j;  dtable[u_j[u]] += (S_j @ w_j)[u];  dbias += sum_b dy[b]
 *
 * the same sums as the embedding, flatten and linear ops make, regrouped: a
 * product of K = C*D over B rows becomes C products of K = D over U_j rows
 * (B x O x C*D multiply-adds per product -> sum_j U_j x O x D), and the
 * [B, C*D] activation and its gradient are never made.  Results differ
 * from the three ops within float rounding (other summation order); the
 * products are gemm_small.c's, else OpenBLAS. */
#include "gemm_small.h"
#include "internal.h"
#include "vmath.h"

#include <cblas.h>
#include <string.h>

static void sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (_tensor_sgemm_small(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc)) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
              1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* The row loops, cloned for AVX2 and AVX-512 (vmath.h's TENSOR_SIMD): at
 * -O3 for the baseline they ran 4 lanes wide, 8% of a train-charlm step. */

/* dst row to[i] += src row i, i < n (rows of cols floats; to may repeat) */
TENSOR_SIMD static void rows_scatter_add(float *restrict dst, const int32_t *restrict to, const float *restrict src,
                                         int64_t n, int64_t cols) {
  for (int64_t i = 0; i < n; i++) {
    float *d = dst + (int64_t)to[i] * cols;
    const float *x = src + i * cols;
    for (int64_t c = 0; c < cols; c++) d[c] += x[c];
  }
}

/* dst row i += src row from[i], i < n */
TENSOR_SIMD static void rows_gather_add(float *restrict dst, const float *restrict src, const int32_t *restrict from,
                                        int64_t n, int64_t cols) {
  for (int64_t i = 0; i < n; i++) {
    float *d = dst + i * cols;
    const float *x = src + (int64_t)from[i] * cols;
    for (int64_t c = 0; c < cols; c++) d[c] += x[c];
  }
}

/* dst[c] += the sum of src's n rows at column c */
TENSOR_SIMD static void rows_sum_add(float *restrict dst, const float *restrict src, int64_t n, int64_t cols) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < cols; c++) dst[c] += src[i * cols + c];
}

/* The distinct indices at position j of idx [B, C]: uniq[0 .. U) in order
 * of first appearance, slot[b] = the row of b's index in uniq.  slot_of
 * [V] is -1 everywhere on entry and on return. */
static int64_t distinct(const int32_t *idx, int64_t B, int64_t C, int64_t j, int32_t *slot_of, int32_t *uniq,
                        int32_t *slot) {
  int64_t U = 0;
  for (int64_t b = 0; b < B; b++) {
    int32_t v = idx[b * C + j];
    if (slot_of[v] < 0) {
      slot_of[v] = (int32_t)U;
      uniq[U++] = v;
    }
    slot[b] = slot_of[v];
  }
  for (int64_t u = 0; u < U; u++) slot_of[uniq[u]] = -1;
  return U;
}

/* Checks the four (dy: the backward's; bias may be NULL) and sets the sizes. */
static bool args(const char *op, const tensor *table, const tensor *indices, const tensor *w, const tensor *bias,
                 int64_t *V, int64_t *D, int64_t *B, int64_t *C, int64_t *O) {
  if (!_tensor_arg_f32(op, "table", table) || !_tensor_arg(op, "indices", indices) ||
      !_tensor_arg_f32(op, "weight", w) || (bias && !_tensor_arg_f32(op, "bias", bias)))
    return false;
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR], b3[TENSOR_SHAPE_STR], b4[TENSOR_SHAPE_STR];
  if (indices->dtype != TENSOR_I32) {
    _tensor_err(TENSOR_EDTYPE, "%s: indices are %s, want i32", op, _tensor_desc(indices, b2));
    return false;
  }
  if (table->ndim != 2 || indices->ndim != 2 || w->ndim != 2 || w->shape[1] != indices->shape[1] * table->shape[1] ||
      (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0]))) {
    _tensor_err(TENSOR_ESHAPE,
                "%s: table %s (want [V,D]), indices %s ([B,C]), weight %s ([O,C*D]) and bias %s do not fit", op,
                _tensor_desc(table, b1), _tensor_desc(indices, b2), _tensor_desc(w, b3),
                bias ? _tensor_desc(bias, b4) : "none");
    return false;
  }
  *V = table->shape[0], *D = table->shape[1], *B = indices->shape[0], *C = indices->shape[1], *O = w->shape[0];
  return true;
}

/* false, with an error naming the first, when an index is outside [0, V). */
static bool indices_in_range(const char *op, const int32_t *idx, int64_t n, int64_t V, const tensor *table) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= V) {
      char b1[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ERANGE, "%s: index %d at %lld out of range [0, %lld%s) for table %s", op, idx[i], (long long)i,
                  (long long)V, ta_poison_explain((uint64_t)V, 8), _tensor_desc(table, b1));
      return false;
    }
  return true;
}

/* Scratch of the sizes below, in floats (int32 slots are float-sized). */
static int64_t scratch_floats(int64_t V, int64_t D, int64_t B, int64_t O) { return V + 2 * B + B * D + B * O + B * D; }

tensor *tensor_embedding_linear(const tensor *table, const tensor *indices, const tensor *w, const tensor *bias) {
  const char *op = "tensor_embedding_linear";
  int64_t V, D, B, C, O;
  if (!args(op, table, indices, w, bias, &V, &D, &B, &C, &O)) return NULL;   /* host tensors only */
  tensor *tc = _tensor_borrow(table), *ic = tc ? _tensor_borrow(indices) : NULL, *wc = ic ? _tensor_borrow(w) : NULL,
         *bc = wc && bias ? _tensor_borrow(bias) : NULL;
  tensor *out = NULL;
  _tensor_scratch s = { 0 };
  if (wc == NULL || (bias && bc == NULL) || !indices_in_range(op, ic->data, B * C, V, table)) goto done;
  out = _tensor_out(op, TENSOR_F32, 2, (int64_t[]){ B, O });
  if (out == NULL || !_tensor_scratch_take(&s, op, scratch_floats(V, D, B, O))) {
    tensor_free(out);
    out = NULL;
    goto done;
  }
  int32_t *slot_of = (int32_t *)s.data, *uniq = slot_of + V, *slot = uniq + B;
  float *E = s.data + V + 2 * B, *P = E + B * D, *y = out->data;
  const float *tab = tc->data, *wt = wc->data;
  const int32_t *idx = ic->data;
  for (int64_t v = 0; v < V; v++) slot_of[v] = -1;
  for (int64_t b = 0; b < B; b++) {
    if (bc) memcpy(y + b * O, bc->data, (size_t)O * sizeof *y);
    else memset(y + b * O, 0, (size_t)O * sizeof *y);
  }
  for (int64_t j = 0; j < C; j++) {
    int64_t U = distinct(idx, B, C, j, slot_of, uniq, slot);
    for (int64_t u = 0; u < U; u++) memcpy(E + u * D, tab + (int64_t)uniq[u] * D, (size_t)D * sizeof *E);
    sgemm(0, 1, U, O, D, E, D, wt + j * D, C * D, 0.0f, P, O);   /* P = E @ w_j^T */
    rows_gather_add(y, P, slot, B, O);
  }
done:
  _tensor_scratch_give(&s);
  _tensor_unborrow(table, tc);
  _tensor_unborrow(indices, ic);
  _tensor_unborrow(w, wc);
  _tensor_unborrow(bias, bc);
  return out;
}

/* An accumulated gradient: contiguous f32 of like's shape, or NULL. */
static bool grad_arg(const char *op, const char *name, const tensor *g, const tensor *like) {
  if (g == NULL) return true;
  if (!_tensor_arg_f32(op, name, g)) return false;
  if (!_tensor_contig(g) || !_tensor_same_shape(g, like)) {
    char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "%s: %s %s must be contiguous, of the shape %s", op, name, _tensor_desc(g, b1),
                _tensor_desc(like, b2));
    return false;
  }
  return true;
}

tensor_status tensor_embedding_linear_grad_(tensor *dtable, tensor *dw, tensor *dbias, const tensor *dy,
                                            const tensor *table, const tensor *indices, const tensor *w) {
  const char *op = "tensor_embedding_linear_grad_";
  int64_t V, D, B, C, O;
  if (!args(op, table, indices, w, NULL, &V, &D, &B, &C, &O) || !_tensor_arg_f32(op, "dy", dy) ||
      !grad_arg(op, "dtable", dtable, table) || !grad_arg(op, "dweight", dw, w) ||
      (dbias && !_tensor_arg_f32(op, "dbias", dbias)))
    return tensor_last_status();
  char b1[TENSOR_SHAPE_STR], b2[TENSOR_SHAPE_STR];
  if (dy->ndim != 2 || dy->shape[0] != B || dy->shape[1] != O)
    return _tensor_err(TENSOR_ESHAPE, "%s: dy %s, want [%lld, %lld]", op, _tensor_desc(dy, b1), (long long)B,
                       (long long)O);
  if (dbias && (dbias->ndim != 1 || dbias->shape[0] != O || !_tensor_contig(dbias)))
    return _tensor_err(TENSOR_ESHAPE, "%s: dbias %s, want contiguous [%lld]", op, _tensor_desc(dbias, b2),
                       (long long)O);
  tensor *tc = _tensor_borrow(table), *ic = tc ? _tensor_borrow(indices) : NULL, *wc = ic ? _tensor_borrow(w) : NULL,
         *dc = wc ? _tensor_borrow(dy) : NULL;
  tensor_status st = tensor_last_status();
  _tensor_scratch s = { 0 };
  if (dc == NULL) goto done;
  if (!indices_in_range(op, ic->data, B * C, V, table) || !_tensor_scratch_take(&s, op, scratch_floats(V, D, B, O))) {
    st = tensor_last_status();
    goto done;
  }
  int32_t *slot_of = (int32_t *)s.data, *uniq = slot_of + V, *slot = uniq + B;
  float *E = s.data + V + 2 * B, *S = E + B * D, *G = S + B * O;
  const float *tab = tc->data, *wt = wc->data, *g = dc->data;
  const int32_t *idx = ic->data;
  if (dbias) rows_sum_add(dbias->data, g, B, O);
  if (dtable || dw) {
    for (int64_t v = 0; v < V; v++) slot_of[v] = -1;
    for (int64_t j = 0; j < C; j++) {
      int64_t U = distinct(idx, B, C, j, slot_of, uniq, slot);
      if (U == 0) continue;
      memset(S, 0, (size_t)(U * O) * sizeof *S);
      rows_scatter_add(S, slot, g, B, O);
      if (dw) {   /* dw_j += S^T @ E */
        for (int64_t u = 0; u < U; u++) memcpy(E + u * D, tab + (int64_t)uniq[u] * D, (size_t)D * sizeof *E);
        sgemm(1, 0, O, D, U, S, O, E, D, 1.0f, (float *)dw->data + j * D, C * D);
      }
      if (dtable) {   /* dtable[u] += (S @ w_j)[u] */
        sgemm(0, 0, U, D, O, S, O, wt + j * D, C * D, 0.0f, G, D);
        rows_scatter_add(dtable->data, uniq, G, U, D);
      }
    }
  }
  st = TENSOR_OK;
done:
  _tensor_scratch_give(&s);
  _tensor_unborrow(table, tc);
  _tensor_unborrow(indices, ic);
  _tensor_unborrow(w, wc);
  _tensor_unborrow(dy, dc);
  return st;
}
