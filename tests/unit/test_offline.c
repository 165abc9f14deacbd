/* test_offline.c - reports/offline.c: a trace read after the run, as a
 * report source.  The traced programs are this binary again ("--child
 * MODE", TAGALLOC_TRACE set): one that exits cleanly (the exit scan's
 * findings, symbolized offline from the trace's modules), one killed by
 * SIGKILL (its live blocks unclassified, its double free with the
 * allocation and free stacks found by replaying the trace). */
#include "harness.h"
#include "support.h"
#include "child.h"
#include "offline.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile g_keep;

NOIPA static void offline_leak(ta_tag tag) {
  char *p = ta_alloc(tag, 30);
  memset(p, 1, 30);
  KEEP();
}

NOIPA static void offline_double_free(ta_tag tag) {
  void *p = ta_alloc(tag, 24);
  ta_free(p);
  ta_free(p);
  KEEP();
}

/* Enough events to fill 4 KiB trace buffers a few times (a packed ALLOC
 * takes ~8 bytes): what was flushed before the SIGKILL is in the trace. */
NOIPA static void offline_many(ta_tag tag) {
  for (int i = 0; i < 2000; i++) {
    void **p = ta_alloc(tag, 16);
    *p = (void *)g_keep;
    g_keep = p;   /* reachable: a chain */
  }
  KEEP();
}

static int child_main(const char *mode) {
  ta_tag t = ta_tag_get("offline.test");
  offline_leak(t);
  offline_double_free(t);
  scribble_stack();
  if (strcmp(mode, "kill") == 0) {
    offline_many(t);
    raise(SIGKILL);
  }
  return 0;
}

static char trace_path[256];

static report_offline *traced(const char *mode) {
  snprintf(trace_path, sizeof trace_path, "/tmp/tagalloc-test-offline-%d-%s.trace", (int)getpid(), mode);
  char var[320];
  snprintf(var, sizeof var, "TAGALLOC_TRACE=%s", trace_path);
  const char *env[] = { var, "TAGALLOC_TRACE_BUFFER=4096", "TAGALLOC_REPORT=0", NULL };
  child_result r;
  child_exec(mode, env, &r);
  child_result_free(&r);
  char err[512];
  report_offline *o = report_offline_open(trace_path, err, sizeof err);
  if (!o) fprintf(stderr, "%s\n", err);
  assert_non_null(o);
  return o;
}

typedef struct {
  const report_source *src;
  int n;
  ta_finding f[16];
  char fn0[16][128];   /* the function of each group's frame #0 */
} collected;

static int collect(const ta_finding *f, void *arg) {
  collected *c = arg;
  if (c->n == 16) return 1;
  c->f[c->n] = *f;
  uintptr_t pcs[1];
  report_frame fr[REPORT_MAX_INLINE];
  c->fn0[c->n][0] = '\0';
  if (c->src->stack_frames(c->src->arg, f->stack, pcs, 1) > 0 &&
      report_symbolize(report_source_ctx(c->src), pcs[0], fr, REPORT_MAX_INLINE) > 0 && fr[0].function)
    snprintf(c->fn0[c->n], sizeof c->fn0[0], "%s", fr[0].function);
  c->n++;
  return 0;
}

static char *render(const report_source *src, bool json) {
  FILE *f = tmpfile();
  assert_non_null(f);
  if (json) {
    report_process_info info = { .ppid = -1, .exit_code = -1, .clean_exit = !src->unclassified };
    assert_int_equal(report_source_json(fileno(f), src, &info), 0);
  } else {
    report_text_render(fileno(f), src);
  }
  static char buf[1 << 16];
  rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void test_clean_exit(void **state) {
  (void)state;
  report_offline *o = traced("clean");
  const report_trace_model *m = report_offline_model(o);
  assert_true(m->clean_exit);
  report_source *src = report_offline_source(o);
  assert_false(src->unclassified);
  assert_non_null(report_source_ctx(src));   /* made on first use */
  collected c = { .src = src };
  src->visit(src->arg, collect, &c);
  assert_int_equal(c.n, 2);
  assert_string_equal(c.f[0].kind, "free.double");
  assert_int_equal(c.f[0].bytes, 24);
  assert_string_equal(c.fn0[0], "offline_double_free");
  assert_string_equal(report_source_tag(src, c.f[0].tag), "offline.test");
  assert_string_equal(c.f[1].kind, "leak.direct");
  assert_int_equal(c.f[1].bytes, 30);
  assert_int_equal(c.f[1].blocks, 1);
  assert_string_equal(c.fn0[1], "offline_leak");
  ta_summary s = src->summary(src->arg);
  assert_int_equal(s.direct_bytes, 30);
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.errors, 1);

  char *text = render(src, false);
  assert_non_null(strstr(text, "==ERROR: tagalloc: detected memory problems"));
  assert_non_null(strstr(text, "free.double: attempting double-free on"));
  assert_non_null(strstr(text, "Direct leak of 30 byte(s) in 1 object(s) allocated from:   [tag: offline.test]"));
  assert_non_null(strstr(text, " in offline_leak "));
  assert_non_null(strstr(text, "test_offline.c:"));
  /* the double free and the loss record: the exit status's count */
  assert_non_null(strstr(text, "SUMMARY: tagalloc: 30 byte(s) leaked in 1 allocation(s); 2 error(s) (1 of them loss records"));
  char *json = render(src, true);
  char head[64];
  snprintf(head, sizeof head, "{\"pid\":%u,\"findings_count\":2,\"errors\":1,", m->pid);
  assert_true(strncmp(json, head, strlen(head)) == 0);
  assert_non_null(strstr(json, "\"function\":\"offline_leak\""));
  assert_non_null(strstr(json, "\"clean_exit\":true"));
  assert_true(m->replayed);
  /* the text alone needs no replay of a clean exit with its SUMMARY: the
   * same text and summary from the records */
  char *full = strdup(render(src, false));
  char err[512] = "";
  report_offline *lo = report_offline_open_for(trace_path, 0, err, sizeof err);
  assert_non_null(lo);
  assert_false(report_offline_model(lo)->replayed);
  assert_int_equal(report_offline_model(lo)->nblocks, 0);
  report_source *lsrc = report_offline_source(lo);
  ta_summary ls = lsrc->summary(lsrc->arg);
  assert_memory_equal(&ls, &s, sizeof s);
  assert_string_equal(render(lsrc, false), full);
  free(full);
  report_offline_free(lo);
  report_offline_free(o);
  unlink(trace_path);
}

static void test_killed(void **state) {
  (void)state;
  report_offline *o = traced("kill");
  const report_trace_model *m = report_offline_model(o);
  assert_false(m->clean_exit);
  report_source *src = report_offline_source(o);
  assert_true(src->unclassified);
  collected c = { .src = src };
  src->visit(src->arg, collect, &c);
  assert_true(c.n >= 2);
  assert_string_equal(c.f[0].kind, "free.double");
  assert_int_equal(c.f[0].bytes, 24);            /* the block, found by replaying the trace */
  assert_int_not_equal(c.f[0].alloc_stack, 0);
  assert_int_not_equal(c.f[0].free_stack, 0);
  assert_string_equal(c.fn0[0], "offline_double_free");
  /* the live blocks: unclassified, largest group first, never leaks */
  bool many = false;
  for (int i = 1; i < c.n; i++) {
    assert_string_equal(c.f[i].kind, "unclassified");
    if (strcmp(c.fn0[i], "offline_many") == 0) many = c.f[i].blocks > 0;
  }
  assert_true(many);
  ta_summary s = src->summary(src->arg);
  assert_int_equal(s.direct_blocks, 0);
  assert_int_equal(s.errors, 1);
  char *text = render(src, false);
  assert_non_null(strstr(text, "WARNING: tagalloc: no exit scan"));
  assert_non_null(strstr(text, "Unclassified: "));
  assert_non_null(strstr(text, "LIVE AT THE END (unclassified: no exit scan):"));
  assert_null(strstr(text, "Direct leak"));
  char *json = render(src, true);
  assert_non_null(strstr(json, "\"findings_count\":1,\"errors\":1,"));   /* unclassified groups are not findings */
  assert_non_null(strstr(json, "\"kind\":\"unclassified\""));
  assert_non_null(strstr(json, "\"clean_exit\":false"));
  /* no clean exit: the text needs the replay (its blocks), asked or not */
  char err[512] = "";
  report_offline *lo = report_offline_open_for(trace_path, 0, err, sizeof err);
  assert_non_null(lo);
  assert_true(report_offline_model(lo)->replayed);
  report_offline_free(lo);
  report_offline_free(o);
  unlink(trace_path);
}

static void test_bad_files(void **state) {
  (void)state;
  char err[512];
  assert_null(report_offline_open("/nonexistent/x.trace", err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent/x.trace"));
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_clean_exit),
    cmocka_unit_test(test_killed),
    cmocka_unit_test(test_bad_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
