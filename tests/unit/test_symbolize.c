/* test_symbolize.c - reports/symbolize.c on this very program: a static
 * function, an inlined call chain, libc, a library dlopen()ed after the
 * symbolizer was made, and addresses no module maps; and the units found
 * from .debug_aranges give libdw's frames. */
#include "harness.h"
#include "support.h"

#include <dlfcn.h>
#include <link.h>
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

/* The compilation unit of an address is found from the module's
 * .debug_aranges (report_cu_aranges = 1, the default), and the frames are
 * the ones libdw's own lookup gives: function, file, line, column and
 * inlined frames, for addresses spread over the text of this program (its
 * own DWARF) and of libc (its debug file, where installed), one every
 * 1,021 bytes. */
typedef struct { uintptr_t lo, hi; } text_range;
typedef struct { text_range r[2]; } texts;

/* The executable segments of this program (dlpi_name "") and of libc. */
static int find_texts(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  texts *t = arg;
  int which = info->dlpi_name[0] == '\0' ? 0 : strstr(info->dlpi_name, "/libc.so") ? 1 : -1;
  if (which < 0) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      t->r[which].lo = info->dlpi_addr + ph->p_vaddr;
      t->r[which].hi = t->r[which].lo + ph->p_memsz;
    }
  }
  return 0;
}

static bool same_str(const char *a, const char *b) {
  return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static void test_units_from_aranges(void **state) {
  (void)state;
  texts t;
  memset(&t, 0, sizeof t);
  dl_iterate_phdr(find_texts, &t);
  assert_true(t.r[0].hi > t.r[0].lo);
  assert_true(t.r[1].hi > t.r[1].lo);
  report_cu_aranges = 0;
  report_ctx *plain = report_ctx_new();
  report_cu_aranges = 1;
  report_ctx *fast = report_ctx_new();
  assert_non_null(plain);
  assert_non_null(fast);
  size_t looked = 0, with_line = 0, own_with_line = 0, differ = 0;
  for (int w = 0; w < 2; w++) {
    for (uintptr_t a = t.r[w].lo + 1; a < t.r[w].hi; a += 1021) {
      report_frame x[REPORT_MAX_INLINE], y[REPORT_MAX_INLINE];
      report_cu_aranges = 0;
      int nx = report_symbolize(plain, a, x, REPORT_MAX_INLINE);
      report_cu_aranges = 1;
      int ny = report_symbolize(fast, a, y, REPORT_MAX_INLINE);
      looked++;
      bool same = nx == ny;
      for (int i = 0; same && i < nx; i++)
        same = same_str(x[i].function, y[i].function) && same_str(x[i].file, y[i].file) &&
               x[i].line == y[i].line && x[i].column == y[i].column && x[i].inlined == y[i].inlined;
      if (!same) {
        differ++;
        print_message("%#lx: %s %s:%d vs %s %s:%d\n", (unsigned long)a, x[0].function, x[0].file,
                      x[0].line, y[0].function, y[0].file, y[0].line);
      }
      if (ny > 0 && y[0].line > 0) {
        with_line++;
        own_with_line += w == 0;
      }
    }
  }
  report_ctx_free(plain);
  report_ctx_free(fast);
  assert_true(looked > 1000);
  assert_true(own_with_line > 20);        /* this program's DWARF was read */
  print_message("%zu addresses, %zu with a line\n", looked, with_line);
  assert_int_equal(differ, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_static_function),
    cmocka_unit_test(test_inlined_frames),
    cmocka_unit_test(test_libc),
    cmocka_unit_test(test_module_loaded_later),
    cmocka_unit_test(test_unknown_address),
    cmocka_unit_test(test_units_from_aranges),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
