/* test_symbolize.c - reports/symbolize.c on this very program: a static
 * function, an inlined call chain, libc, a library dlopen()ed after the
 * symbolizer was made, and addresses no module maps. */
#include "harness.h"
#include "support.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* Each function below sits on one line, so that every address of its code
 * maps to the line recorded next to it, whatever the optimizer does. */
static const int my_function_line = __LINE__; NOIPA static int my_function(volatile int *x) { return *x * 3 + 1; }

static uintptr_t captured_ra;
NOIPA static void capture_ra(void) { captured_ra = (uintptr_t)__builtin_return_address(0); }
static const int callee_line = __LINE__; static inline __attribute__((always_inline)) void inlined_callee(void) { capture_ra(); __asm__ volatile("" ::: "memory"); }
static const int caller_line = __LINE__; NOIPA static void inline_caller(void) { inlined_callee(); __asm__ volatile("" ::: "memory"); }

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int setup(void **state) {
  report_ctx *ctx = report_ctx_new();
  if (!ctx) return -1;
  *state = ctx;
  return 0;
}

static int teardown(void **state) {
  report_ctx_free(*state);
  return 0;
}

static void test_static_function(void **state) {
  report_ctx *ctx = *state;
  volatile int v = 2;
  assert_int_equal(my_function(&v), 7);

  report_frame fr[REPORT_MAX_INLINE];
  uintptr_t ra = (uintptr_t)&my_function + 1;   /* as if a call returned there */
  int n = report_symbolize(ctx, ra, fr, REPORT_MAX_INLINE);
  assert_int_equal(n, 1);
  assert_int_equal(fr[0].address, ra);
  assert_non_null(fr[0].function);
  assert_string_equal(fr[0].function, "my_function");
  assert_non_null(fr[0].file);
  assert_true(ends_with(fr[0].file, "test_symbolize.c"));
  assert_int_equal(fr[0].line, my_function_line);
  assert_int_equal(fr[0].inlined, 0);
  assert_non_null(fr[0].module);
  Dl_info info;
  assert_true(dladdr((void *)ra, &info) != 0);
  assert_int_equal(fr[0].module_offset, ra - (uintptr_t)info.dli_fbase);

  /* The same code address, given exactly. */
  report_frame ex;
  assert_int_equal(report_symbolize_exact(ctx, (uintptr_t)&my_function, &ex, 1), 1);
  assert_string_equal(ex.function, "my_function");
  assert_int_equal(ex.line, my_function_line);
  assert_ptr_equal(ex.function, fr[0].function);   /* cached and interned */
  assert_ptr_equal(ex.file, fr[0].file);
  assert_int_equal(ex.module_offset + 1, fr[0].module_offset);

  /* Twice: the cache answers the same. */
  report_frame again;
  assert_int_equal(report_symbolize(ctx, ra, &again, 1), 1);
  assert_ptr_equal(again.function, fr[0].function);
  assert_int_equal(again.line, fr[0].line);
}

static void test_inlined_frames(void **state) {
  report_ctx *ctx = *state;
  inline_caller();
  assert_true(captured_ra != 0);

  report_frame fr[REPORT_MAX_INLINE];
  int n = report_symbolize(ctx, captured_ra, fr, REPORT_MAX_INLINE);
  assert_int_equal(n, 2);
  assert_string_equal(fr[0].function, "inlined_callee");
  assert_int_equal(fr[0].inlined, 1);
  assert_int_equal(fr[0].line, callee_line);
  assert_true(ends_with(fr[0].file, "test_symbolize.c"));
  assert_string_equal(fr[1].function, "inline_caller");
  assert_int_equal(fr[1].inlined, 0);
  assert_int_equal(fr[1].line, caller_line);
  assert_true(ends_with(fr[1].file, "test_symbolize.c"));
  assert_int_equal(fr[0].address, captured_ra);
  assert_int_equal(fr[1].address, captured_ra);

  /* Room for one frame: the innermost. */
  report_frame one;
  assert_int_equal(report_symbolize(ctx, captured_ra, &one, 1), 1);
  assert_string_equal(one.function, "inlined_callee");
}

static void test_libc(void **state) {
  report_ctx *ctx = *state;
  void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(libc);
  void *fn = dlsym(libc, "qsort");
  assert_non_null(fn);

  report_frame fr[REPORT_MAX_INLINE];
  int n = report_symbolize(ctx, (uintptr_t)fn + 1, fr, REPORT_MAX_INLINE);
  assert_true(n >= 1);
  report_frame *outer = &fr[n - 1];
  assert_non_null(outer->function);
  assert_true(strstr(outer->function, "qsort") != NULL);
  assert_non_null(outer->module);
  assert_non_null(strstr(outer->module, "libc"));
  assert_int_equal(outer->inlined, 0);
  dlclose(libc);
}

/* A library loaded after the symbolizer read the maps: found on a miss. */
static void test_module_loaded_later(void **state) {
  report_ctx *ctx = *state;
  void *h = dlopen("libthread_db.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) skip();
  void *fn = dlsym(h, "td_init");
  assert_non_null(fn);
  report_frame fr;
  assert_int_equal(report_symbolize_exact(ctx, (uintptr_t)fn, &fr, 1), 1);
  assert_non_null(fr.module);
  assert_non_null(strstr(fr.module, "libthread_db"));
  assert_non_null(fr.function);
  assert_string_equal(fr.function, "td_init");
  dlclose(h);
}

static void test_unknown_address(void **state) {
  report_ctx *ctx = *state;
  report_frame fr;
  assert_int_equal(report_symbolize(ctx, 0x10, &fr, 1), 1);
  assert_int_equal(fr.address, 0x10);
  assert_null(fr.function);
  assert_null(fr.file);
  assert_null(fr.module);
  assert_int_equal(fr.line, 0);
  assert_int_equal(fr.module_offset, 0);

  assert_int_equal(report_symbolize(ctx, 0x10, &fr, 0), 0);
  assert_int_equal(report_symbolize(NULL, 0x10, &fr, 1), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_static_function),
    cmocka_unit_test(test_inlined_frames),
    cmocka_unit_test(test_libc),
    cmocka_unit_test(test_module_loaded_later),
    cmocka_unit_test(test_unknown_address),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
