/* test_suppress.c - reports/suppress.c: the file format and its errors
 * (file:line), LeakSanitizer's pattern matching (substring, `*`, `^`, `$`)
 * against the function, file and module of a stack's frames and against
 * tag names, what is never suppressed (errors), and the use counts. */
#include "harness.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

NOIPA static int leaky_function(volatile int *x) { return *x + 1; }
NOIPA static int other_function(volatile int *x) { return *x + 2; }

/* ---- a hand-made source: two stacks, two tags --------------------------------- */

static uintptr_t stack1[2], stack2[1];

static size_t fake_frames(void *arg, uint32_t stack, uintptr_t *frames, size_t max) {
  (void)arg;
  const uintptr_t *from = stack == 1 ? stack1 : stack == 2 ? stack2 : NULL;
  size_t n = stack == 1 ? 2 : stack == 2 ? 1 : 0;
  if (n > max) n = max;
  for (size_t i = 0; i < n; i++) frames[i] = from[i];
  return n;
}

static const char *fake_tag(void *arg, ta_tag tag) {
  (void)arg;
  return tag == 1 ? "tensor.view" : tag == 2 ? "malloc" : NULL;
}

static report_source fake_source(void) {
  report_source s;
  report_source_ledger(&s);   /* this process's symbolizer */
  s.stack_frames = fake_frames;
  s.tag_name = fake_tag;
  s.ctx = report_ctx_new();
  stack1[0] = (uintptr_t)&leaky_function + 1;   /* as return addresses */
  stack1[1] = (uintptr_t)&other_function + 1;
  stack2[0] = (uintptr_t)&other_function + 1;
  return s;
}

static ta_finding finding(const char *kind, uint32_t stack, ta_tag tag, uint64_t bytes, uint64_t blocks) {
  ta_finding f;
  memset(&f, 0, sizeof f);
  f.kind = kind;
  f.stack = stack;
  f.tag = tag;
  f.bytes = bytes;
  f.blocks = blocks;
  return f;
}

static report_suppressions *parse(const char *text, char *err, size_t errlen) {
  return report_suppressions_parse(text, strlen(text), "supp.txt", err, errlen);
}

/* Whether a one-line suppression file `line` suppresses f. */
static bool suppresses(const char *line, const ta_finding *f, const report_source *src) {
  char err[256];
  report_suppressions *s = parse(line, err, sizeof err);
  assert_non_null(s);
  bool r = report_suppressed(f, src, s);
  report_suppressions_free(s);
  return r;
}

/* ---- tests ----------------------------------------------------------------------- */

static void test_format(void **state) {
  (void)state;
  char err[256];
  report_suppressions *s = parse("# comment\n\n   leak:foo  \r\n\ttag:tensor.*\n#leak:not-this\n", err, sizeof err);
  assert_non_null(s);
  report_suppressions_free(s);

  s = parse("", err, sizeof err);   /* empty: fine, suppresses nothing */
  assert_non_null(s);
  report_suppressions_free(s);

  assert_null(parse("leak:ok\nfun:bad\n", err, sizeof err));
  assert_non_null(strstr(err, "supp.txt:2:"));
  assert_non_null(strstr(err, "\"fun\""));
  assert_null(strchr(err, '\n'));

  assert_null(parse("leak:\n", err, sizeof err));
  assert_non_null(strstr(err, "supp.txt:1: empty pattern"));

  assert_null(parse("\n\nno colon here\n", err, sizeof err));
  assert_non_null(strstr(err, "supp.txt:3:"));

  assert_null(report_suppressions_load("/nonexistent/supp.txt", err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent/supp.txt"));
}

static void test_patterns(void **state) {
  (void)state;
  report_source src = fake_source();
  ta_finding f = finding("leak.direct", 1, 2, 40, 1);
  /* function names, as substrings, globs and anchors */
  assert_true(suppresses("leak:leaky_function", &f, &src));
  assert_true(suppresses("leak:aky_fun", &f, &src));
  assert_true(suppresses("leak:leaky*tion", &f, &src));
  assert_true(suppresses("leak:^leaky_function$", &f, &src));
  assert_false(suppresses("leak:^eaky_function", &f, &src));
  assert_false(suppresses("leak:leaky_functio$", &f, &src));
  assert_true(suppresses("leak:other_function", &f, &src));   /* any frame of the stack */
  assert_false(suppresses("leak:no_such_function", &f, &src));
  /* the source file and the module */
  assert_true(suppresses("leak:test_suppress.c", &f, &src));
  assert_true(suppresses("leak:tests/unit/test_suppress", &f, &src));
  /* tags */
  assert_true(suppresses("tag:malloc", &f, &src));
  assert_true(suppresses("tag:^mal*c$", &f, &src));
  assert_false(suppresses("tag:tensor", &f, &src));
  ta_finding v = finding("leak.indirect", 2, 1, 8, 2);
  assert_true(suppresses("tag:tensor.*", &v, &src));
  assert_false(suppresses("leak:leaky_function", &v, &src));   /* not in stack 2 */
  /* every leak kind, never an error */
  ta_finding u = finding("unclassified", 1, 0, 8, 1);
  assert_true(suppresses("leak:leaky", &u, &src));
  ta_finding r = finding("ref.leak", 1, 0, 8, 1);
  assert_true(suppresses("leak:leaky", &r, &src));
  ta_finding e = finding("free.double", 1, 2, 24, 3);
  assert_false(suppresses("leak:leaky", &e, &src));
  assert_false(suppresses("tag:malloc", &e, &src));
  report_ctx_free(src.ctx);
}

static void test_counts(void **state) {
  (void)state;
  report_source src = fake_source();
  char err[256];
  report_suppressions *s = parse("leak:no_match\nleak:other_function\ntag:tensor.view\n", err, sizeof err);
  assert_non_null(s);
  ta_finding a = finding("leak.direct", 1, 2, 40, 2);
  ta_finding b = finding("leak.direct", 2, 2, 10, 1);
  ta_finding c = finding("leak.possible", 2, 1, 7, 7);   /* the tag pattern comes first */
  assert_true(report_suppressed(&a, &src, s));
  assert_true(report_suppressed(&b, &src, s));
  assert_true(report_suppressed(&c, &src, s));
  report_suppression_use u[4];
  assert_int_equal(report_suppressions_used(s, u, 4), 2);
  assert_string_equal(u[0].type, "leak");
  assert_string_equal(u[0].pattern, "other_function");
  assert_int_equal(u[0].hits, 3);
  assert_int_equal(u[0].bytes, 50);
  assert_string_equal(u[1].type, "tag");
  assert_string_equal(u[1].pattern, "tensor.view");
  assert_int_equal(u[1].hits, 7);
  assert_int_equal(u[1].bytes, 7);
  report_suppressions_reset_used(s);
  assert_int_equal(report_suppressions_used(s, u, 4), 0);
  report_suppressions_free(s);
  report_ctx_free(src.ctx);
}

/* The text report of a source: suppressed groups leave the groups and the
 * summary; LSan's "Suppressions used" section and valgrind's "suppressed:". */
static ta_finding g_findings[2];

static size_t two_visit(void *arg, ta_finding_fn *fn, void *fn_arg) {
  (void)arg;
  for (size_t i = 0; i < 2; i++)
    if (fn(&g_findings[i], fn_arg)) return i + 1;
  return 2;
}

static ta_summary two_summary(void *arg) {
  (void)arg;
  ta_summary s = { 0 };
  s.direct_bytes = 50;
  s.direct_blocks = 3;
  return s;
}

static void test_text(void **state) {
  (void)state;
  report_source src = fake_source();
  src.visit = two_visit;
  src.summary = two_summary;
  g_findings[0] = finding("leak.direct", 1, 2, 40, 2);
  g_findings[1] = finding("leak.direct", 2, 2, 10, 1);
  char err[256];
  src.suppressions = parse("leak:leaky_function\n", err, sizeof err);
  assert_non_null(src.suppressions);
  FILE *f = tmpfile();
  assert_non_null(f);
  report_text_render(fileno(f), &src);
  char buf[8192];
  rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  assert_non_null(strstr(buf, "Direct leak of 10 byte(s) in 1 object(s)"));
  assert_null(strstr(buf, "Direct leak of 40 byte(s)"));
  assert_non_null(strstr(buf, "Suppressions used:\n  count      bytes template\n      2         40 leaky_function\n"));
  assert_non_null(strstr(buf, "definitely lost: 10 bytes in 1 blocks"));
  assert_non_null(strstr(buf, "suppressed: 40 bytes in 2 blocks"));
  assert_non_null(strstr(buf, "SUMMARY: tagalloc: 10 byte(s) leaked in 1 allocation(s); 1 error(s) (1 of them loss records"));
  report_suppressions_free(src.suppressions);
  report_ctx_free(src.ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_format),
    cmocka_unit_test(test_patterns),
    cmocka_unit_test(test_counts),
    cmocka_unit_test(test_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
