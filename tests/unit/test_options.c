/* test_options.c - TAGALLOC_* options, each read once per process, so each
 * case runs this program again as a child with the environment it needs:
 * TAGALLOC_DEPTH=4 cuts stacks to 4 frames; TAGALLOC_UNWIND=fast gives the
 * same frames as exact for code with frame pointers; a bad value
 * (TAGALLOC_DEPTH=banana, out of range, an unknown unwinder) warns with the
 * variable's name and value on stderr and keeps the default;
 * TAGALLOC_QUARANTINE=0 still allocates, frees and counts exactly;
 * TAGALLOC_POISON_SPAN bounds the bytes checked after free, and every
 * byte inside it is checked. */
#include "harness.h"
#include "child.h"
#include "internal.h"
#include "report.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the children ------------------------------------------------------------ */

static uint32_t deep_stack;

NOIPA static void recurse(int n) {
  if (n == 0) deep_stack = ta_stack_here();
  else recurse(n - 1);
  KEEP();
}

static uint32_t alloc_stack;

static void grab_stack(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  (void)p;
  (void)size;
  (void)tag;
  (void)arg;
  alloc_stack = stack;
}

NOIPA static void alloc_here(void) {
  ta_mark m = ta_mark_now();
  void *p = ta_alloc(ta_tag_get("opt"), 8);
  ta_live_since(m, TA_ANY, grab_stack, NULL);
  ta_free(p);
  KEEP();
}

/* Prints the options, then the stack of recurse(10)'s innermost call and
 * of an allocation, one function name a line. */
NOIPA static int child_stack(void) {
  printf("depth=%ld unwind=%ld quarantine=%ld\n", ta_option("depth"), ta_option("unwind"),
         ta_option("quarantine"));
  recurse(10);
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(deep_stack, pcs, TA_MAX_DEPTH);
  printf("frames=%zu\n", n);
  report_ctx *ctx = report_ctx_new();
  for (size_t i = 0; i < n && i < 12; i++) printf("#%zu %s\n", i, function_at(ctx, pcs[i]));
  alloc_here();
  n = ta_stack_frames(alloc_stack, pcs, TA_MAX_DEPTH);
  printf("alloc frames=%zu #0 %s\n", n, n ? function_at(ctx, pcs[0]) : "none");
  report_ctx_free(ctx);
  KEEP();
  return 0;
}

/* Without a quarantine: alloc and free, exact counts, and a second free is
 * still caught (as invalid: the ledger forgot the block). */
static int child_no_quarantine(void) {
  ta_tag T = ta_tag_get("noq");
  ta_mark m = ta_mark_now();
  int bad = 0;
  for (int i = 0; i < 1000; i++) {
    void *p = ta_alloc(T, (size_t)(i % 64) + 1);
    if (p == NULL || ta_block_size(p) != (size_t)(i % 64) + 1) bad++;
    memset(p, 1, (size_t)(i % 64) + 1);
    ta_free(p);
    if (ta_block_size(p) != 0) bad++;
    ta_counts c = ta_since(m, T);
    if (c.allocs != (uint64_t)i + 1 || c.frees != (uint64_t)i + 1 || c.live_blocks != 0) bad++;
  }
  void *p = ta_alloc(T, 32);
  ta_free(p);
  ta_free(p);
  printf("quarantine=%ld bad=%d double=%zu invalid=%zu all=%zu\n", ta_option("quarantine"), bad,
         ta_findings_count("free.double"), ta_findings_count("free.invalid"), ta_findings_count(NULL));
  void *q = ta_alloc(T, 16);                     /* and it goes on */
  ta_free(q);
  ta_counts c = ta_since(m, T);
  printf("allocs=%lu frees=%lu live=%lu\n", (unsigned long)c.allocs, (unsigned long)c.frees,
         (unsigned long)c.live_blocks);
  return 0;
}

/* The quarantine's cap on blocks: 1000 blocks freed in a row; a second free
 * of the 10th-last is a double free (still quarantined), one of the 900th-
 * last is invalid when the cap (64) has let it go, double when it has not. */
static int child_quarantine_blocks(void) {
  ta_tag T = ta_tag_get("qblocks");
  static void *p[1000];
  for (int i = 0; i < 1000; i++) p[i] = ta_alloc(T, 32);
  for (int i = 0; i < 1000; i++) ta_free(p[i]);
  ta_free(p[990]);
  ta_free(p[100]);
  printf("quarantine_blocks=%ld double=%zu invalid=%zu\n", ta_option("quarantine_blocks"),
         ta_findings_count("free.double"), ta_findings_count("free.invalid"));
  return 0;
}

/* The poisoned span: three 1000-byte blocks freed, then written after free
 * at byte 255 (the last of the default span of 256), 256 and 999; 32 more
 * frees push them out of a quarantine capped at 16 blocks, which checks
 * them.  Byte 255 is found with the default span, all three with
 * TAGALLOC_POISON_SPAN=all, none with 0. */
static int child_poison_span(void) {
  ta_tag T = ta_tag_get("span");
  static const size_t at[3] = { 255, 256, 999 };
  for (int i = 0; i < 3; i++) {
    volatile unsigned char *p = ta_alloc(T, 1000);
    ta_free((void *)p);
    p[at[i]] = 0x41;
  }
  for (int i = 0; i < 32; i++) ta_free(ta_alloc(T, 64));
  printf("poison_span=%ld found=%zu\n", ta_option("poison_span"), ta_findings_count("use.after-free"));
  return 0;
}

/* Every byte of the span is checked: blocks of 17, 40, 100, 255, 300 and
 * 1000 bytes, each freed and then written at one offset of its span, every
 * offset in turn (the AVX2 check's 64-byte steps, its 32-byte and
 * overlapping last loads, and the short blocks' paths all see a change
 * anywhere; again with the SSE2 check); 32 frees push the last ones out
 * of a quarantine capped at 16 blocks.  17 + 40 + 100 + 255 + 256 + 256 =
 * 924 writes, each found once. */
static int child_poison_every_byte(void) {
  ta_tag T = ta_tag_get("every");
  static const size_t sizes[6] = { 17, 40, 100, 255, 300, 1000 };
  for (int s = 0; s < 6; s++) {
    size_t span = sizes[s] < 256 ? sizes[s] : 256;
    for (size_t at = 0; at < span; at++) {
      volatile unsigned char *p = ta_alloc(T, sizes[s]);
      ta_free((void *)p);
      p[at] = 0x41;
    }
  }
  for (int i = 0; i < 32; i++) ta_free(ta_alloc(T, 64));
  printf("found=%zu\n", ta_findings_count("use.after-free"));
  return 0;
}

/* ---- the parent ------------------------------------------------------------------ */

static void run(const char *mode, const char *const *env, child_result *r) {
  child_exec(mode, env, r);
  if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0) child_dump(r);
  assert_true(WIFEXITED(r->status));
  assert_int_equal(WEXITSTATUS(r->status), 0);
}

static void expect(const child_result *r, const char *text, const char *where) {
  if (!strstr(where, text)) {
    fprintf(stderr, "expected to find: %s\n", text);
    child_dump(r);
  }
  assert_non_null(strstr(where, text));
}

static void test_default_stack(void **state) {
  (void)state;
  child_result r;
  run("stack", NULL, &r);
  expect(&r, "depth=32 unwind=0 quarantine=67108864\n", r.out);
  size_t frames = 0;
  assert_int_equal(sscanf(strstr(r.out, "frames="), "frames=%zu", &frames), 1);
  assert_true(frames >= 13 && frames <= 32);     /* recurse x11, child_stack, main, libc ... */
  expect(&r, "#0 recurse\n#1 recurse\n#2 recurse\n#3 recurse\n#4 recurse\n#5 recurse\n"
             "#6 recurse\n#7 recurse\n#8 recurse\n#9 recurse\n#10 recurse\n#11 child_stack\n", r.out);
  expect(&r, "#0 alloc_here\n", r.out);
  assert_string_equal(r.err, "");                /* no warning */
  child_result_free(&r);
}

static void test_depth_4(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_DEPTH=4", NULL };
  run("stack", env, &r);
  expect(&r, "depth=4 unwind=0", r.out);
  expect(&r, "frames=4\n#0 recurse\n#1 recurse\n#2 recurse\n#3 recurse\nalloc frames=4 #0 alloc_here\n", r.out);
  assert_string_equal(r.err, "");
  child_result_free(&r);

  const char *one[] = { "TAGALLOC_DEPTH=1", NULL };
  run("stack", one, &r);
  expect(&r, "frames=1\n#0 recurse\nalloc frames=1 #0 alloc_here\n", r.out);
  child_result_free(&r);
}

static void test_unwind_fast(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_UNWIND=fast", NULL };
  run("stack", env, &r);
  expect(&r, "depth=32 unwind=1", r.out);
  size_t frames = 0;
  assert_int_equal(sscanf(strstr(r.out, "frames="), "frames=%zu", &frames), 1);
  assert_true(frames >= 13 && frames <= 32);
  expect(&r, "#0 recurse\n#1 recurse\n#2 recurse\n#3 recurse\n#4 recurse\n#5 recurse\n"
             "#6 recurse\n#7 recurse\n#8 recurse\n#9 recurse\n#10 recurse\n#11 child_stack\n", r.out);
  expect(&r, "#0 alloc_here\n", r.out);
  assert_string_equal(r.err, "");
  child_result_free(&r);

  const char *both[] = { "TAGALLOC_UNWIND=fast", "TAGALLOC_DEPTH=4", NULL };
  run("stack", both, &r);
  expect(&r, "depth=4 unwind=1", r.out);
  expect(&r, "frames=4\n#0 recurse\n#1 recurse\n#2 recurse\n#3 recurse\n", r.out);
  child_result_free(&r);
}

static void test_unwind_none(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_UNWIND=none", NULL };
  run("stack", env, &r);
  expect(&r, "depth=32 unwind=2", r.out);
  expect(&r, "frames=0\nalloc frames=0 #0 none\n", r.out);
  child_result_free(&r);
}

static void test_bad_values(void **state) {
  (void)state;
  static const struct { const char *env, *warning, *values; } cases[] = {
    { "TAGALLOC_DEPTH=banana", "tagalloc: TAGALLOC_DEPTH=banana is not a valid value; keeping the default\n",
      "depth=32 unwind=0 " },
    { "TAGALLOC_DEPTH=0", "TAGALLOC_DEPTH=0 is not a valid value", "depth=32 " },
    { "TAGALLOC_DEPTH=129", "TAGALLOC_DEPTH=129 is not a valid value", "depth=32 " },
    { "TAGALLOC_DEPTH=4x", "TAGALLOC_DEPTH=4x is not a valid value", "depth=32 " },
    { "TAGALLOC_UNWIND=sideways", "TAGALLOC_UNWIND=sideways is not a valid value", "depth=32 unwind=0 " },
    { "TAGALLOC_QUARANTINE=-5", "TAGALLOC_QUARANTINE=-5 is not a valid value", "quarantine=67108864\n" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    child_result r;
    const char *env[] = { cases[i].env, NULL };
    run("stack", env, &r);
    expect(&r, cases[i].warning, r.err);
    expect(&r, cases[i].values, r.out);
    expect(&r, "#0 recurse\n", r.out);             /* and it works */
    child_result_free(&r);
  }
}

static void test_good_values(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_QUARANTINE=64K", "TAGALLOC_DEPTH=0x8", NULL };
  run("stack", env, &r);
  expect(&r, "depth=8 unwind=0 quarantine=65536\n", r.out);
  expect(&r, "frames=8\n", r.out);
  assert_string_equal(r.err, "");
  child_result_free(&r);
}

static void test_quarantine_0(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_QUARANTINE=0", NULL };
  run("no-quarantine", env, &r);
  expect(&r, "quarantine=0 bad=0 double=0 invalid=1 all=1\n", r.out);
  expect(&r, "allocs=1002 frees=1002 live=0\n", r.out);
  expect(&r, "free.invalid at 0x", r.err);
  child_result_free(&r);
}

static void test_quarantine_blocks(void **state) {
  (void)state;
  child_result r;
  const char *capped[] = { "TAGALLOC_QUARANTINE_BLOCKS=100", NULL };   /* 64: a power of two */
  run("quarantine-blocks", capped, &r);
  expect(&r, "quarantine_blocks=100 double=1 invalid=1\n", r.out);
  child_result_free(&r);
  const char *dflt[] = { NULL };
  run("quarantine-blocks", dflt, &r);
  expect(&r, "quarantine_blocks=16384 double=2 invalid=0\n", r.out);
  child_result_free(&r);
}

static void test_poison_span(void **state) {
  (void)state;
  child_result r;
  const char *dflt[] = { "TAGALLOC_QUARANTINE_BLOCKS=16", NULL };
  run("poison-span", dflt, &r);
  expect(&r, "poison_span=256 found=1\n", r.out);
  child_result_free(&r);
  const char *all[] = { "TAGALLOC_QUARANTINE_BLOCKS=16", "TAGALLOC_POISON_SPAN=all", NULL };
  run("poison-span", all, &r);
  expect(&r, "poison_span=9223372036854775807 found=3\n", r.out);
  child_result_free(&r);
  const char *none[] = { "TAGALLOC_QUARANTINE_BLOCKS=16", "TAGALLOC_POISON_SPAN=0", NULL };
  run("poison-span", none, &r);
  expect(&r, "poison_span=0 found=0\n", r.out);
  child_result_free(&r);
}

static void test_poison_every_byte(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_QUARANTINE_BLOCKS=16", NULL };
  run("poison-every-byte", env, &r);
  expect(&r, "found=924\n", r.out);
  child_result_free(&r);
  run("poison-every-byte-sse2", env, &r);        /* the check without AVX2 */
  expect(&r, "found=924\n", r.out);
  child_result_free(&r);
}

static void test_option_names(void **state) {
  (void)state;
  assert_int_equal(ta_option("no-such-option"), -1);
  assert_int_equal(ta_option("report"), 0);      /* set in main */
  assert_int_equal(ta_option("depth"), 32);
  assert_int_equal(ta_option("poison"), 0xDF);
  assert_int_equal(ta_option("poison_span"), 256);
  assert_int_equal(ta_option("fill"), -1);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "stack") == 0) return child_stack();
    if (strcmp(argv[2], "no-quarantine") == 0) return child_no_quarantine();
    if (strcmp(argv[2], "quarantine-blocks") == 0) return child_quarantine_blocks();
    if (strcmp(argv[2], "poison-span") == 0) return child_poison_span();
    if (strcmp(argv[2], "poison-every-byte") == 0) return child_poison_every_byte();
    if (strcmp(argv[2], "poison-every-byte-sse2") == 0) {
      _ta_quarantine_no_avx2();
      return child_poison_every_byte();
    }
    return 2;
  }
  setenv("TAGALLOC_REPORT", "0", 1);             /* the children inherit it */
  unsetenv("TAGALLOC_DEPTH");
  unsetenv("TAGALLOC_UNWIND");
  unsetenv("TAGALLOC_QUARANTINE");
  unsetenv("TAGALLOC_QUARANTINE_BLOCKS");
  unsetenv("TAGALLOC_POISON_SPAN");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_default_stack),
    cmocka_unit_test(test_depth_4),
    cmocka_unit_test(test_unwind_fast),
    cmocka_unit_test(test_unwind_none),
    cmocka_unit_test(test_bad_values),
    cmocka_unit_test(test_good_values),
    cmocka_unit_test(test_quarantine_0),
    cmocka_unit_test(test_quarantine_blocks),
    cmocka_unit_test(test_poison_span),
    cmocka_unit_test(test_poison_every_byte),
    cmocka_unit_test(test_option_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
