/* test_ref.c - refcount tracking: init/acquire/release return the new
 * count and ta_ref_count follows; a release at count 0, on an object with no
 * refcount, or after the block was freed is ref.underflow at once (release
 * returns -1) with the transition history; acquire after free is
 * use.after-free; ref.leak exists only at exit, and the exit report of a
 * child that leaves a count > 0 names the object and its unmatched
 * acquisitions with their stacks. */
#include "harness.h"
#include "child.h"
#include "support.h"

#include <stdlib.h>
#include <string.h>

static void test_counts(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("ref.obj");
  void *obj = ta_alloc(T, 32);
  assert_int_equal(ta_ref_count(obj), -1);       /* no refcount yet */
  ta_ref_init(obj, 1);
  assert_int_equal(ta_ref_count(obj), 1);
  assert_int_equal(ta_ref_acquire(obj), 2);
  assert_int_equal(ta_ref_acquire(obj), 3);
  assert_int_equal(ta_ref_count(obj), 3);
  assert_int_equal(ta_ref_release(obj), 2);
  assert_int_equal(ta_ref_release(obj), 1);
  assert_int_equal(ta_ref_count(obj), 1);
  assert_int_equal(ta_ref_release(obj), 0);
  assert_int_equal(ta_ref_count(obj), 0);

  /* init again restarts the count */
  ta_ref_init(obj, 5);
  assert_int_equal(ta_ref_count(obj), 5);
  assert_int_equal(ta_ref_release(obj), 4);

  /* an object that is not a block: acquire on a fresh address starts at 0 */
  static long plain;
  assert_int_equal(ta_ref_count(&plain), -1);
  assert_int_equal(ta_ref_acquire(&plain), 1);
  assert_int_equal(ta_ref_release(&plain), 0);
  assert_int_equal(ta_ref_count(&plain), 0);

  ta_free(obj);
  assert_int_equal(ta_ref_count(obj), -1);       /* dead with its block */
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_messages, 0);
}

NOIPA static long release_once_too_often(void *obj) {
  long r = ta_ref_release(obj);
  KEEP();
  return r;
}

static void test_underflow_at_zero(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("ref.obj");
  void *obj = ta_alloc(T, 40);
  ta_ref_init(obj, 1);
  assert_int_equal(ta_ref_release(obj), 0);
  assert_int_equal(ta_findings_count("ref.underflow"), 0);
  for (volatile int i = 0; i < 2; i++) assert_int_equal(release_once_too_often(obj), -1);
  assert_int_equal(ta_findings_count("ref.underflow"), 2);   /* two occurrences ... */
  assert_int_equal(ta_findings_count(NULL), 2);
  assert_int_equal(ta_ref_count(obj), 0);        /* stays at 0 */
  assert_int_equal(n_messages, 1);                /* ... of one group: one message */
  assert_non_null(strstr(messages[0], "ref.underflow at 0x"));
  assert_non_null(strstr(messages[0], "a release at count 0"));

  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, (uintptr_t)obj);
  assert_int_equal(a.f.bytes, 40);
  assert_int_equal(a.f.tag, T);
  assert_int_not_equal(a.f.stack, 0);
  assert_int_not_equal(a.f.alloc_stack, 0);
  assert_int_equal(a.f.free_stack, 0);
  assert_int_equal(a.f.blocks, 2);
  /* the story as of the first occurrence: init -> 1, -1 -> 0, and the bad
   * -1 (the count stays 0) */
  assert_int_equal(a.f.history_len, 3);
  assert_int_equal(a.history[0].delta, 0);
  assert_int_equal(a.history[0].count, 1);
  assert_int_equal(a.history[1].delta, -1);
  assert_int_equal(a.history[1].count, 0);
  assert_int_equal(a.history[2].delta, -1);
  assert_int_equal(a.history[2].count, 0);
  assert_int_equal(a.history[2].stack, a.f.stack);
  assert_true(a.history[0].seq < a.history[1].seq && a.history[1].seq < a.history[2].seq);

  /* From another call site: another group, another message. */
  assert_int_equal(release_once_too_often(obj), -1);
  assert_int_equal(ta_findings_count("ref.underflow"), 3);
  assert_int_equal(n_messages, 2);
  ta_free(obj);
}

static void test_underflow_no_refcount(void **state) {
  (void)state;
  void *obj = ta_alloc(ta_tag_get("ref.obj"), 8);
  assert_int_equal(ta_ref_release(obj), -1);
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_non_null(strstr(messages[0], "a release on an object with no refcount"));
  ta_free(obj);
}

static void test_release_after_free(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("ref.obj");
  void *obj = ta_alloc(T, 24);
  ta_ref_init(obj, 1);
  ta_free(obj);                                  /* freed with a count of 1 */
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(ta_ref_release(obj), -1);
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_non_null(strstr(messages[0], "a release on a freed object"));

  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, (uintptr_t)obj);
  assert_int_equal(a.f.bytes, 24);
  assert_int_not_equal(a.f.free_stack, 0);       /* where it was freed */
  assert_int_not_equal(a.f.alloc_stack, 0);
  assert_int_equal(a.f.history_len, 2);          /* init -> 1, the bad -1 */

  /* acquiring a freed object is a use after free */
  assert_int_equal(ta_ref_acquire(obj), -1);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  assert_int_equal(ta_findings_count(NULL), 2);
}

static void test_release_after_free_no_count(void **state) {
  (void)state;
  void *obj = ta_alloc(ta_tag_get("ref.obj"), 16);
  ta_free(obj);                                  /* never had a refcount */
  assert_int_equal(ta_ref_release(obj), -1);
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_non_null(strstr(messages[0], "a release on a freed object"));
}

/* ---- the seed bug: a view's destructor that releases once too often --------------
 * The parent's storage is made (count 1) and dropped in the test; a view
 * made in a training step acquires it, and the view's destructor, called
 * from the same step, releases it twice (the second time in a helper).  The
 * count reaches 0 at that second release and the storage is freed there;
 * it goes below zero only at the parent's own, legitimate release.  The
 * headline is the extra release, not the parent's. */

static ta_tag seed_tag;

NOIPA static void storage_acquire(void *s) {
  ta_ref_acquire(s);
  KEEP();
}

NOIPA static long storage_release(void *s) {
  long c = ta_ref_release(s);
  if (c == 0) ta_free(s);
  KEEP();
  return c;
}

NOIPA static void *storage_new(void) {
  void *s = ta_alloc(seed_tag, 64);
  ta_ref_init(s, 1);
  KEEP();
  return s;
}

NOIPA static void view_create(void *s) { storage_acquire(s); KEEP(); }
NOIPA static void release_again(void *s) { storage_release(s); KEEP(); }   /* the bug */
NOIPA static void view_destroy(void *s) {
  storage_release(s);
  release_again(s);
  KEEP();
}
NOIPA static void train_step(void *s) {
  view_create(s);
  view_destroy(s);
  KEEP();
}
NOIPA static void parent_drop(void *s) { storage_release(s); KEEP(); }

/* Is fn one of the first frames of stack? */
static bool stack_has(uint32_t stack, const char *fn) {
  uintptr_t pcs[8];
  size_t n = ta_stack_frames(stack, pcs, 8);
  report_ctx *ctx = report_ctx_new();
  bool found = false;
  for (size_t i = 0; i < n && !found; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE);
    for (int j = 0; j < k && !found; j++) found = fr[j].function && strcmp(fr[j].function, fn) == 0;
  }
  report_ctx_free(ctx);
  return found;
}

static void test_underflow_extra_release(void **state) {
  (void)state;
  seed_tag = ta_tag_get("ref.seed");
  void *s = storage_new();
  train_step(s);
  assert_int_equal(ta_findings_count(NULL), 0);    /* the count only reached 0 */
  parent_drop(s);
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  assert_non_null(strstr(messages[0], "a release on a freed object"));

  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  /* the headline: the destructor's second release; aux: where it showed */
  assert_true(stack_has(a.f.stack, "release_again"));
  assert_true(stack_has(a.f.stack, "view_destroy"));
  assert_false(stack_has(a.f.stack, "parent_drop"));
  assert_true(stack_has(a.f.aux_stack, "parent_drop"));
  assert_true(stack_has(a.f.free_stack, "release_again"));   /* freed at the extra release */
  /* by callsite: [0] the init, [1] the view, [2] the destructor's release,
   * [3] the helper's (extra), [4] the parent's (paired with the init) */
  assert_int_equal(a.f.nsites, 5);
  const ta_ref_site *st = a.sites;
  assert_int_equal(st[0].delta, +1);
  assert_int_equal(st[0].transitions, 1);
  assert_true(stack_has(st[0].stack, "storage_new"));
  assert_int_equal(st[0].balance, 0);
  assert_int_equal(st[1].delta, +1);
  assert_true(stack_has(st[1].stack, "view_create"));
  assert_int_equal(st[1].balance, -1);                       /* acquired 1, released 2 */
  assert_int_equal(st[2].delta, -1);
  assert_int_equal(st[2].paired, 1);
  assert_int_equal(st[2].extra, 0);
  assert_false(stack_has(st[2].stack, "release_again"));
  assert_int_equal(st[3].delta, -1);
  assert_int_equal(st[3].paired, 1);
  assert_int_equal(st[3].extra, 1);
  assert_int_equal(st[3].stack, a.f.stack);
  assert_int_equal(st[4].delta, -1);
  assert_int_equal(st[4].paired, 0);
  assert_int_equal(st[4].extra, 0);
  assert_int_equal(st[4].stack, a.f.aux_stack);
  for (int i = 0; i < 5; i++) assert_int_equal(st[i].transitions, 1);
}

/* The same bug with everything in one function (no step frame to tell the
 * view's release from the parent's): the helper's release shares the
 * destructor's call with its first release, so it is the view's too. */
static void test_underflow_extra_release_flat(void **state) {
  (void)state;
  seed_tag = ta_tag_get("ref.seed");
  void *s = storage_new();
  view_create(s);
  view_destroy(s);
  parent_drop(s);
  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_true(stack_has(a.f.stack, "release_again"));
  assert_true(stack_has(a.f.aux_stack, "parent_drop"));
  assert_int_equal(a.f.nsites, 5);
  assert_int_equal(a.sites[3].paired, 1);
  assert_int_equal(a.sites[3].extra, 1);
  assert_int_equal(a.sites[4].paired, 0);
  assert_int_equal(a.sites[4].extra, 0);
}

/* Synthetic stacks for ta_ref_balance (innermost first): seed 003's shape,
 * a model's init, a clone's extra acquisition and the model's release, all
 * three called from one function (the same outer frames but the caller's
 * return address). */
static uintptr_t syn_stacks[4][3] = {
  [1] = { 0x1010, 0x5000, 0x9000 },   /* the init: the constructor's code */
  [2] = { 0x7000, 0x5008, 0x9000 },   /* the clone's acquisition: elsewhere, and after */
  [3] = { 0x1090, 0x5100, 0x9000 },   /* the release: the destructor, beside the constructor */
};

static size_t syn_frames(void *arg, uint32_t stack, uintptr_t *pcs, size_t max) {
  (void)arg;
  size_t n = max < 3 ? max : 3;
  memcpy(pcs, syn_stacks[stack], n * sizeof *pcs);
  return n;
}

/* On a tie of shared outer frames and of balance, the release pairs with
 * the acquisition whose innermost frame is nearest its own: the init, so
 * the clone's acquisition is the one that owes (ref.leak's headline) even
 * though it acquired last; with the clone's code moved beside the release,
 * the pairing follows it. */
static void test_balance_tie_nearest_inner(void **state) {
  (void)state;
  const ta_ref_event ev[] = { { .delta = 0, .count = 1, .stack = 1, .thread = 1, .seq = 1 },
                              { .delta = +1, .count = 2, .stack = 2, .thread = 1, .seq = 2 },
                              { .delta = -1, .count = 1, .stack = 3, .thread = 1, .seq = 3 } };
  ta_ref_site sites[TA_REF_SITES_MAX];
  size_t extra = 0;
  assert_int_equal(ta_ref_balance(ev, 3, syn_frames, NULL, sites, TA_REF_SITES_MAX, &extra), 3);
  assert_int_equal(extra, SIZE_MAX);   /* no release owes */
  assert_int_equal(sites[2].delta, -1);
  assert_int_equal(sites[2].paired, 0);
  assert_int_equal(sites[0].balance, 0);
  assert_int_equal(sites[0].extra, 0);
  assert_int_equal(sites[1].balance, 1);
  assert_int_equal(sites[1].extra, 1);
  syn_stacks[2][0] = 0x10c0;           /* now the clone's code is the nearer */
  assert_int_equal(ta_ref_balance(ev, 3, syn_frames, NULL, sites, TA_REF_SITES_MAX, &extra), 3);
  assert_int_equal(sites[2].paired, 1);
  assert_int_equal(sites[0].extra, 1);
  assert_int_equal(sites[1].extra, 0);
  syn_stacks[2][0] = 0x7000;
}

/* Values read from freed memory are explained as the poison (0xDF). */
/* ta_ref_acquire_at and ta_ref_release_at count like the plain calls and
 * record the stack they are given in the history, not their own. */
NOIPA static uint32_t stack_of_acquiring(void) {
  uint32_t s = ta_stack_here();
  KEEP();
  return s;
}

NOIPA static uint32_t stack_of_releasing(void) {
  uint32_t s = ta_stack_here();
  KEEP();
  return s;
}

static void test_at_given_stack(void **state) {
  (void)state;
  uint32_t sa = stack_of_acquiring(), sr = stack_of_releasing();
  assert_int_not_equal(sa, 0);
  assert_int_not_equal(sr, 0);
  assert_int_not_equal(sa, sr);
  void *obj = ta_alloc(ta_tag_get("ref.obj"), 16);
  ta_ref_init(obj, 1);
  assert_int_equal(ta_ref_acquire_at(obj, sa), 2);
  assert_int_equal(ta_ref_release_at(obj, sr), 1);
  assert_int_equal(ta_ref_release_at(obj, sr), 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(ta_ref_release_at(obj, sr), -1);   /* one too many: ref.underflow at sr */
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  find_arg a = { .kind = "ref.underflow" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.history_len, 5);
  assert_int_equal(a.history[1].delta, +1);
  assert_int_equal(a.history[1].count, 2);
  assert_int_equal(a.history[1].stack, sa);
  for (int i = 2; i < 5; i++) {
    assert_int_equal(a.history[i].delta, -1);
    assert_int_equal(a.history[i].stack, sr);
  }
  assert_int_not_equal(a.history[0].stack, sa);   /* the init took its own */
  assert_int_not_equal(a.history[0].stack, 0);
  ta_free(obj);
}

static void test_poison_explain(void **state) {
  (void)state;
  const char *poison = " (the freed-memory poison: read from a freed block)";
  assert_string_equal(ta_poison_explain(0xdfdfdfdfdfdfdfdfull, 8), poison);
  assert_string_equal(ta_poison_explain((uint64_t)-2314885530818453537ll, 0), poison);   /* a count */
  assert_string_equal(ta_poison_explain(0xdfdfdfdfull, 4), poison);                      /* an int */
  assert_string_equal(ta_poison_explain((uint64_t)(int64_t)(int32_t)0xdfdfdfdf, 0), poison);
  assert_string_equal(ta_poison_explain(0xdeadeadeadeadeadull, 8), "");
  assert_string_equal(ta_poison_explain(0xdedededededededeull, 8),
                      " (the guard bytes past a block's end: read past the end)");
  assert_string_equal(ta_poison_explain(0x1234dfdfdfdfull, 4), "");   /* wider than 4 bytes */
  assert_string_equal(ta_poison_explain(0, 8), "");
  assert_string_equal(ta_poison_explain(0xdfdfdfdfdfdfdf00ull, 8), "");
}

/* A pointer read from a freed block, released: the report explains it. */
NOIPA static void release_poisoned(void) {
  ta_ref_release((void *)(uintptr_t)0xdfdfdfdfdfdfdfdfull);
  KEEP();
}

static int child_poisoned_release(void) {
  release_poisoned();
  return 0;
}

static void test_poisoned_pointer_in_report(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("poisoned-release", env, &r);
  assert_true(WIFEXITED(r.status));
  const char *want = "ref.underflow: refcount of 0xdfdfdfdfdfdfdfdf (the freed-memory poison: read from a "
                     "freed block) released below zero or after free at:";
  if (!strstr(r.err, want)) child_dump(&r);
  assert_non_null(strstr(r.err, want));
  child_result_free(&r);
}

/* ref.leak is an exit finding: a scan during the run does not make one. */
static void test_no_ref_leak_before_exit(void **state) {
  (void)state;
  static void *volatile keep;
  keep = ta_alloc(ta_tag_get("ref.obj"), 8);
  ta_ref_init(keep, 2);
  ta_scan();
  assert_int_equal(ta_findings_count("ref.leak"), 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(ta_ref_release(keep), 1);
  assert_int_equal(ta_ref_release(keep), 0);
  ta_free(keep);
  keep = NULL;
}

/* ---- the child: an object left with references at exit ----------------------- */

static void *volatile leaked_obj;              /* reachable: only the count leaks */

NOIPA static void leaky_acquire(void *obj) {
  ta_ref_acquire(obj);
  KEEP();
}

NOIPA static void balanced_pair(void *obj) {
  ta_ref_acquire(obj);
  ta_ref_release(obj);
  KEEP();
}

static int child_ref_leak(void) {
  leaked_obj = ta_alloc(ta_tag_get("refobj"), 24);
  ta_ref_init(leaked_obj, 1);
  balanced_pair(leaked_obj);
  leaky_acquire(leaked_obj);
  printf("obj=%p\n", leaked_obj);
  return 0;
}

static void test_ref_leak_at_exit(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("ref-leak", env, &r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  char obj[64];
  assert_int_equal(sscanf(r.out, "obj=%63s", obj), 1);
  char want[256];
  snprintf(want, sizeof want,
           "ref.leak: 1 object(s) of 24 byte(s) in all with references left at exit, such as %s, "
           "last acquired at:   [tag: refobj]\n    #0 0x", obj);
  if (!strstr(r.err, want)) child_dump(&r);
  assert_non_null(strstr(r.err, want));
  /* the finding's stack is the last unmatched acquisition */
  const char *frame0 = strstr(r.err, want) + strlen(want);
  const char *eol = strchr(frame0, '\n');
  assert_non_null(eol);
  assert_non_null(strstr(frame0, " in leaky_acquire "));
  assert_true(strstr(frame0, " in leaky_acquire ") < eol);
  /* and where the object itself was allocated */
  assert_non_null(strstr(frame0, "allocated at:\n    #0 0x"));
  /* the unmatched acquisitions: the init's 1 and leaky_acquire's +1; the
   * balanced pair is not listed */
  const char *hist = strstr(r.err, "unmatched acquisitions (2, oldest first):\n  init -> 1 by thread T1:\n");
  assert_non_null(hist);
  const char *plus = strstr(hist, "  +1 -> 2 by thread T1:\n      #0 0x");
  assert_non_null(plus);
  eol = strchr(plus + strlen("  +1 -> 2 by thread T1:\n"), '\n');
  assert_true(strstr(plus, " in leaky_acquire ") < eol);
  assert_null(strstr(hist, "balanced_pair"));             /* not among the unmatched */
  /* the balance by callsite: the init and leaky_acquire owe, the pair is even */
  const char *tab = strstr(r.err, "references by callsite (each releasing callsite is paired with the acquiring "
                                  "one whose stack shares the most outer frames):\n  [1] acquired 1 at child_ref_leak ");
  assert_non_null(tab);
  assert_true(tab < hist);
  const char *l2 = strstr(tab, "\n  [2] acquired 1 at balanced_pair test_ref.c:");
  const char *l3 = strstr(tab, "\n  [3] released 1 at balanced_pair test_ref.c:");
  const char *l4 = strstr(tab, "\n  [4] acquired 1 at leaky_acquire test_ref.c:");
  assert_true(l2 && l3 && l4 && l2 < l3 && l3 < l4 && l4 < hist);
  assert_true(strstr(tab, "  <== acquired 1 more than its releases\n") < l2);   /* [1], the init */
  assert_true(strstr(l2 + 1, "\n") == l3);                                       /* [2]: no mark */
  assert_true(strstr(l3, " (paired with [2])\n") < l4);
  assert_true(strstr(l4, "  <== acquired 1 more than its releases\n") < hist);
  /* a refcount leak is a loss record, counted as an error as memcheck's ERROR SUMMARY does */
  assert_non_null(strstr(r.err, "SUMMARY: tagalloc: 0 byte(s) leaked in 0 allocation(s); 1 error(s) (1 of them loss records: definitely or possibly lost, orphaned, refcount leaks, one per group, as memcheck's ERROR SUMMARY counts them).\n"));
  assert_null(strstr(r.err, "Direct leak"));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "ref-leak") == 0) return child_ref_leak();
    if (strcmp(argv[2], "poisoned-release") == 0) return child_poisoned_release();
    return 2;
  }
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_counts, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_underflow_at_zero, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_underflow_no_refcount, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_release_after_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_release_after_free_no_count, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_no_ref_leak_before_exit, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_ref_leak_at_exit, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_underflow_extra_release, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_underflow_extra_release_flat, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_balance_tie_nearest_inner, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_at_given_stack, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_poison_explain, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_poisoned_pointer_in_report, messages_setup, messages_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
