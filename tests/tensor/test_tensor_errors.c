/* test_tensor_errors.c - bad input is a returned status (or NULL) and one
 * line naming the op and the shapes, never a crash or garbage, and leaves
 * nothing allocated behind: shape mismatches, out-of-range slices and
 * indices, reshape to another element count, dtype mismatches, bad axes,
 * NULL inputs (a chain of calls keeps its first error). */
#include "harness.h"
#include "tensor_test.h"

#include <stdlib.h>

/* The call must fail with status st and exactly the message msg. */
#define EXPECT_ERR(call, st, msg) do {                                             \
    tensor_error_clear();                                                          \
    int before = n_errors;                                                         \
    (void)(call);                                                                  \
    assert_int_equal(n_errors, before + 1);                                        \
    assert_int_equal(last_error_status, (st));                                     \
    assert_int_equal(tensor_last_status(), (st));                                  \
    assert_string_equal(last_error, (msg));                                        \
    assert_string_equal(tensor_error(), (msg));                                    \
  } while (0)

#define EXPECT_NULL_ERR(call, st, msg) do {                                        \
    tensor *r__ = NULL;                                                            \
    EXPECT_ERR(r__ = (call), st, msg);                                             \
    assert_null(r__);                                                              \
  } while (0)

static void test_bad_input(void **state) {
  (void)state;
  tensor *a = tensor_zeros(TENSOR_F32, TS(2, 3)), *b = tensor_zeros(TENSOR_F32, TS(4));
  tensor *l = tensor_zeros(TENSOR_I32, TS(3)), *v = tensor_zeros(TENSOR_F32, TS(4));
  tensor *x4 = tensor_zeros(TENSOR_F32, TS(2, 1, 5, 5)), *w4 = tensor_zeros(TENSOR_F32, TS(3, 2, 3, 3));
  ta_mark m = ta_mark_now();

  EXPECT_NULL_ERR(tensor_add(a, b), TENSOR_ESHAPE, "tensor_add: shapes f32[2,3] and f32[4] do not broadcast");
  EXPECT_NULL_ERR(tensor_mul(a, l), TENSOR_EDTYPE, "tensor_mul: b is i32[3], want f32");
  EXPECT_NULL_ERR(tensor_relu(l), TENSOR_EDTYPE, "tensor_relu: a is i32[3], want f32");
  EXPECT_ERR(tensor_add_(b, a), TENSOR_ESHAPE, "tensor_add_: shapes f32[4] and f32[2,3] do not broadcast");
  tensor *r3 = tensor_select(a, 0, 0);               /* [3]: a += r3 is fine, r3 += a is not */
  assert_int_equal(tensor_add_(a, r3), TENSOR_OK);
  EXPECT_ERR(tensor_add_(r3, a), TENSOR_ESHAPE,
             "tensor_add_: out is f32[3], the result of f32[3] and f32[2,3] is f32[2,3]");
  EXPECT_ERR(tensor_sub_out(v, a, a), TENSOR_ESHAPE,
             "tensor_sub_out: out is f32[4], the result of f32[2,3] and f32[2,3] is f32[2,3]");
  EXPECT_ERR(tensor_exp_out(v, a), TENSOR_ESHAPE, "tensor_exp_out: out is f32[4], a is f32[2,3]");
  EXPECT_ERR(tensor_copy_(a, l), TENSOR_EDTYPE, "tensor_copy_: dtype mismatch: dst f32[2,3], src i32[3]");
  EXPECT_ERR(tensor_copy_(a, b), TENSOR_ESHAPE, "tensor_copy_: src f32[4] does not broadcast to dst f32[2,3]");

  EXPECT_NULL_ERR(tensor_reshape(a, TS(4, 2)), TENSOR_ESHAPE,
                  "tensor_reshape: cannot reshape f32[2,3] (6 elements) to f32[4,2] (8 elements)");
  EXPECT_NULL_ERR(tensor_reshape(a, TS(-1, 4)), TENSOR_ESHAPE,
                  "tensor_reshape: cannot reshape f32[2,3] (6 elements) to f32[-1,4]");
  EXPECT_NULL_ERR(tensor_reshape(a, TS(-1, -1)), TENSOR_ESHAPE,
                  "tensor_reshape: bad shape f32[-1,-1] for f32[2,3]");
  EXPECT_NULL_ERR(tensor_reshape(a, TS(1, 1, 1, 1, 1, 1, 6)), TENSOR_ESHAPE,
                  "tensor_reshape: 7 dimensions asked for f32[2,3] (0 to 6 allowed)");
  EXPECT_NULL_ERR(tensor_slice(a, 1, 0, 4, 1), TENSOR_ERANGE,
                  "tensor_slice: [0:4:1] out of range for axis 1 (size 3) of f32[2,3]");
  EXPECT_NULL_ERR(tensor_slice(a, 1, 2, 1, 1), TENSOR_ERANGE,
                  "tensor_slice: [2:1:1] out of range for axis 1 (size 3) of f32[2,3]");
  EXPECT_NULL_ERR(tensor_slice(a, 0, 0, 2, 0), TENSOR_ERANGE,
                  "tensor_slice: [0:2:0] out of range for axis 0 (size 2) of f32[2,3]");
  EXPECT_NULL_ERR(tensor_slice(a, 2, 0, 1, 1), TENSOR_ERANGE, "tensor_slice: axis 2 out of range for f32[2,3]");
  EXPECT_NULL_ERR(tensor_select(a, 0, 2), TENSOR_ERANGE,
                  "tensor_select: index 2 out of range for axis 0 (size 2) of f32[2,3]");
  EXPECT_NULL_ERR(tensor_transpose(a, 0, -3), TENSOR_ERANGE, "tensor_transpose: axis -3 out of range for f32[2,3]");
  EXPECT_NULL_ERR(tensor_permute(a, (int[]){ 1, 1 }), TENSOR_ERANGE,
                  "tensor_permute: entry 1 (1) of the permutation is bad for f32[2,3]");
  EXPECT_NULL_ERR(tensor_squeeze(a, 0), TENSOR_ESHAPE, "tensor_squeeze: axis 0 of f32[2,3] has size 2, not 1");
  EXPECT_NULL_ERR(tensor_expand(a, TS(4, 3)), TENSOR_ESHAPE, "tensor_expand: cannot expand f32[2,3] to f32[4,3]");
  EXPECT_NULL_ERR(tensor_expand(a, TS(3)), TENSOR_ESHAPE, "tensor_expand: f32[2,3] has more dimensions than 1");

  EXPECT_NULL_ERR(tensor_sum(a, 2, 0), TENSOR_ERANGE, "tensor_sum: axis 2 out of range for f32[2,3]");
  EXPECT_NULL_ERR(tensor_argmax(l, 0, 0), TENSOR_EDTYPE, "tensor_argmax: a is i32[3], want f32");
  EXPECT_NULL_ERR(tensor_matmul(a, a), TENSOR_ESHAPE, "tensor_matmul: shapes f32[2,3] and f32[2,3] do not multiply");
  EXPECT_NULL_ERR(tensor_matmul(a, b), TENSOR_ESHAPE,
                  "tensor_matmul: want 2-D or 3-D operands, got f32[2,3] and f32[4]");
  tensor *at = tensor_transpose(a, 0, 1);
  EXPECT_ERR(tensor_gemm_out(a, a, at, 1.0f, 0.0f), TENSOR_ESHAPE,
             "tensor_gemm_out: out is f32[2,3], f32[2,3] @ f32[3,2] is f32[2,2]");
  tensor *o22 = tensor_zeros(TENSOR_F32, TS(2, 2));
  tensor *o22t = tensor_transpose(o22, 0, 1);
  EXPECT_ERR(tensor_gemm_out(o22t, a, at, 1.0f, 0.0f), TENSOR_ESHAPE,
             "tensor_gemm_out: out f32[2,2] must have rows of stride 1");
  EXPECT_NULL_ERR(tensor_conv2d(x4, w4, NULL, 1, 0), TENSOR_ESHAPE,
                  "tensor_conv2d: input f32[2,1,5,5] and weight f32[3,2,3,3] do not match (stride 1, padding 0)");
  EXPECT_NULL_ERR(tensor_conv2d(x4, a, NULL, 1, 0), TENSOR_ESHAPE, "tensor_conv2d: w is f32[2,3], want 4-D");
  EXPECT_NULL_ERR(tensor_conv2d(x4, x4, NULL, 0, 0), TENSOR_EINVAL,
                  "tensor_conv2d: stride 0, padding 0 (want stride >= 1, padding >= 0)");
  EXPECT_NULL_ERR(tensor_max_pool2d(x4, 6, 1, NULL), TENSOR_ESHAPE,
                  "tensor_max_pool2d: window 6, stride 1 do not fit f32[2,1,5,5]");

  tensor *logits = tensor_zeros(TENSOR_F32, TS(3, 4)), *bad = tensor_from_i32((int32_t[]){ 1, 4, 0 }, TS(3));
  EXPECT_NULL_ERR(tensor_cross_entropy(logits, bad), TENSOR_ERANGE,
                  "tensor_cross_entropy: label 4 of row 1 out of range [0, 4) for logits f32[3,4]");
  EXPECT_NULL_ERR(tensor_cross_entropy(logits, v), TENSOR_EDTYPE, "tensor_cross_entropy: labels are f32[4], want i32");
  EXPECT_NULL_ERR(tensor_cross_entropy(a, l), TENSOR_ESHAPE,
                  "tensor_cross_entropy: logits f32[2,3] and labels i32[3] do not match (want [N,C] and [N])");
  EXPECT_NULL_ERR(tensor_embedding(logits, bad), TENSOR_ERANGE,
                  "tensor_embedding: index 4 at 1 out of range [0, 3) for weight f32[3,4]");
  EXPECT_NULL_ERR(tensor_softmax(a, 5), TENSOR_ERANGE, "tensor_softmax: axis 5 out of range for f32[2,3]");
  EXPECT_NULL_ERR(tensor_zeros(TENSOR_F32, TS(2, -3)), TENSOR_ESHAPE, "tensor_empty: bad shape f32[2,-3]");
  EXPECT_NULL_ERR(tensor_batch(a, 0, 0), TENSOR_EINVAL, "tensor_batch: batch size 0 of f32[2,3]");
  float f = 0;
  EXPECT_ERR(f = tensor_item(a), TENSOR_ESHAPE, "tensor_item: f32[2,3] has 6 elements, want 1");
  assert_true(isnan(f));
  EXPECT_ERR(f = tensor_get(a, (int64_t[]){ 0, 3 }), TENSOR_ERANGE,
             "tensor_get: index 3 out of range for axis 1 of f32[2,3]");

  /* NULL inputs: an error of their own, or the chain's first error kept */
  EXPECT_NULL_ERR(tensor_exp(NULL), TENSOR_EINVAL, "tensor_exp: a is NULL");
  EXPECT_NULL_ERR(tensor_relu(tensor_add(a, b)), TENSOR_ESHAPE,
                  "tensor_add: shapes f32[2,3] and f32[4] do not broadcast");
  tensor_free(NULL);

  /* nothing is left behind by a failed call */
  tensor_free(at);
  tensor_free(r3);
  tensor_free(o22t);
  tensor_free(o22);
  tensor_free(logits);
  tensor_free(bad);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  tensor *all[] = { a, b, l, v, x4, w4 };
  for (int i = 0; i < 6; i++) tensor_free(all[i]);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* A count or pointer that the ledger's fill made (0xDF, the freed-memory
 * poison) is said to be one in the message: a pointer read from a freed
 * struct, and a header's counts as a freed header's would read (set here
 * on a live header, the argument checks refusing a freed one). */
#define POISON " (the freed-memory poison: read from a freed block)"
static void poisoned_values_explained(void **state) {
  (void)state;
  tensor *wild = (tensor *)(uintptr_t)0xdfdfdfdfdfdfdfdfull;
  tensor_error_clear();
  assert_true(isnan(tensor_item(wild)));
  assert_string_equal(tensor_error(), "tensor_item: t (0xdfdfdfdfdfdfdfdf)" POISON " is not a live tensor (freed, "
                                      "or its storage released too often: see the ledger's finding)");
  ta_findings_clear();

  tensor *a = tensor_zeros(TENSOR_F32, TS(2, 3));
  int64_t numel = a->numel, dim = a->shape[1];
  a->numel = (int64_t)0xdfdfdfdfdfdfdfdfull;
  EXPECT_ERR(tensor_item(a), TENSOR_ESHAPE,
             "tensor_item: f32[2,3] has -2314885530818453537 elements" POISON ", want 1");
  EXPECT_NULL_ERR(tensor_reshape(a, TS(6)), TENSOR_ESHAPE,
                  "tensor_reshape: cannot reshape f32[2,3] (-2314885530818453537 elements" POISON ") to f32[6] "
                  "(6 elements)");
  a->numel = numel;
  a->shape[1] = (int64_t)0xdfdfdfdfdfdfdfdfull;
  EXPECT_ERR(tensor_item(a), TENSOR_ESHAPE, "tensor_item: f32[2,-2314885530818453537" POISON "] has 6 elements, want 1");
  EXPECT_NULL_ERR(tensor_select(a, 1, 0), TENSOR_ERANGE,
                  "tensor_select: index 0 out of range for axis 1 (size -2314885530818453537" POISON ") of f32[2,"
                  "-2314885530818453537" POISON "]");
  a->shape[1] = dim;
  a->numel = numel;
  int ndim = a->ndim;
  a->ndim = (int)0xdfdfdfdfu;
  EXPECT_ERR(tensor_item(a), TENSOR_ESHAPE, "tensor_item: f32[ndim -538976289" POISON "] has 6 elements, want 1");
  a->ndim = ndim;
  /* an ordinary count is printed as it is */
  EXPECT_ERR(tensor_item(a), TENSOR_ESHAPE, "tensor_item: f32[2,3] has 6 elements, want 1");
  tensor_free(a);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void print_to_stderr(void **state) {
  (void)state;
  /* the default handler prints one line on stderr; here it is just called */
  tensor_error_handler(NULL, NULL);
  assert_null(tensor_select(NULL, 0, 0));
  assert_string_equal(tensor_error(), "tensor_select: t is NULL");
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_bad_input, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(poisoned_values_explained, errors_setup, errors_teardown),
    cmocka_unit_test_setup_teardown(print_to_stderr, errors_setup, errors_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
