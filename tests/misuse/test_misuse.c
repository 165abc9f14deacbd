/* test_misuse.c - the deliberate-misuse suite: double free, invalid free
 * (never allocated, interior pointer, a libc pointer), refcount underflow,
 * a hold into a stack frame, a hold into a reset arena, a held target freed,
 * an orphaned dummy buffer, a write after free, a freed block passed back to
 * the ledger.  For each: the finding's kind and count, a one-line message
 * naming the kind, and frame #0 of the finding's stack symbolized to the
 * noinline function that did the bad operation (and of its other stacks to
 * where the block was allocated or freed).  The program goes on after each
 * and the ledger still counts exactly at the end.
 *
 * TAGALLOC_QUARANTINE is small (4096) so that a block written after its free
 * leaves the quarantine, and is checked, after a few hundred more frees; a
 * child checks that such a write still in the quarantine is found at exit. */
#include "harness.h"
#include "child.h"
#include "report.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static report_ctx *ctx;
static ta_tag T;

/* ---- what the ledger says: support.h's messages_setup counts and keeps it ------ */

/* The function of frame #0 of a stack (the innermost, inlined or not). */
static const char *frame0(uint32_t stack) { return stack_frame0(ctx, stack); }

/* One finding of kind, announced once on the error path. */
static void assert_one(const char *kind) {
  assert_int_equal(ta_findings_count(kind), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  assert_int_equal(n_messages, 1);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%s at 0x", kind);
  if (strncmp(messages[0], prefix, strlen(prefix)) != 0) fail_msg("message: %s", messages[0]);
}

/* ---- the bad operations, each in a function of its own ---------------------- */

NOIPA static void *make_victim(size_t size) {
  void *p = ta_alloc(T, size);
  KEEP();
  return p;
}

NOIPA static void do_double_free(void *p) {
  ta_free(p);
  ta_free(p);
  KEEP();
}

NOIPA static void do_invalid_free(void *p) {
  ta_free(p);
  KEEP();
}

NOIPA static long do_underflow(void *obj) {
  long r = ta_ref_release(obj);
  KEEP();
  return r;
}

NOIPA static void do_stack_hold(void *op) {
  float inputs[8] = { 0 };
  ta_hold(op, "inputs", inputs);
  KEEP();
}

NOIPA static void do_reset(ta_arena *a) {
  ta_arena_reset(a);
  KEEP();
}

NOIPA static void do_hold_after_reset(void *op, void *stale) {
  ta_hold(op, "input", stale);
  KEEP();
}

NOIPA static void do_free_held(void *p) {
  ta_free(p);
  KEEP();
}

NOIPA static size_t do_hold_check(void *holder) {
  size_t n = ta_hold_check(holder);
  KEEP();
  return n;
}

NOIPA static void *make_dummy(void) {
  void *p = ta_alloc(T, 4);
  KEEP();
  return p;
}

NOIPA static void do_orphan(void *view, void *parent) {
  ta_hold(view, "storage", parent);                 /* the dummy loses its last hold */
  KEEP();
}

NOIPA static void *do_write_after_free(void) {
  volatile unsigned char *p = ta_alloc(T, 32);
  ta_free((void *)p);
  p[3] = 0x41;
  KEEP();
  return (void *)p;
}

NOIPA static void do_free_and_write(void *p) {
  ta_free(p);
  ((volatile unsigned char *)p)[0] = 0x42;
  KEEP();
}

NOIPA static long do_acquire_freed(void *obj) {
  long r = ta_ref_acquire(obj);
  KEEP();
  return r;
}

NOIPA static void *do_realloc_freed(void *p) {
  void *q = ta_realloc(p, 100);
  KEEP();
  return q;
}

/* ---- the tests ------------------------------------------------------------------ */

static void test_double_free(void **state) {
  (void)state;
  void *p = make_victim(48);
  do_double_free(p);
  assert_one("free.double");
  ta_finding f = the_finding("free.double");
  assert_int_equal(f.addr, (uintptr_t)p);
  assert_int_equal(f.bytes, 48);
  assert_int_equal(f.tag, T);
  assert_string_equal(frame0(f.stack), "do_double_free");        /* the second free */
  assert_string_equal(frame0(f.free_stack), "do_double_free");   /* the first */
  assert_int_not_equal(f.free_stack, f.stack);
  assert_string_equal(frame0(f.alloc_stack), "make_victim");
}

static void test_invalid_free_never_allocated(void **state) {
  (void)state;
  static long not_a_block[4];
  do_invalid_free(&not_a_block[1]);
  assert_one("free.invalid");
  ta_finding f = the_finding("free.invalid");
  assert_int_equal(f.addr, (uintptr_t)&not_a_block[1]);
  assert_string_equal(frame0(f.stack), "do_invalid_free");
  assert_string_equal(f.detail, "not a block of the ledger: never allocated, or freed too long ago to remember");
  assert_int_equal(f.alloc_stack, 0);

  void *libc = malloc(16);                          /* not the ledger's either */
  do_invalid_free(libc);
  assert_int_equal(ta_findings_count("free.invalid"), 2);
  free(libc);
}

static void test_invalid_free_interior(void **state) {
  (void)state;
  char *p = make_victim(64);
  do_invalid_free(p + 8);
  assert_one("free.invalid");
  ta_finding f = the_finding("free.invalid");
  assert_int_equal(f.addr, (uintptr_t)(p + 8));
  assert_int_equal(f.bytes, 64);
  assert_int_equal(f.tag, T);
  assert_string_equal(frame0(f.stack), "do_invalid_free");
  assert_string_equal(frame0(f.alloc_stack), "make_victim");
  assert_string_equal(f.detail, "interior pointer at offset 8 of a 64-byte live block");
  assert_int_equal(ta_block_size(p), 64);           /* the block is untouched */
  ta_free(p);
  assert_int_equal(ta_findings_count(NULL), 1);
}

static void test_refcount_underflow(void **state) {
  (void)state;
  void *obj = make_victim(24);
  ta_ref_init(obj, 1);
  assert_int_equal(ta_ref_release(obj), 0);
  assert_int_equal(do_underflow(obj), -1);
  assert_one("ref.underflow");
  ta_finding f = the_finding("ref.underflow");
  assert_int_equal(f.addr, (uintptr_t)obj);
  assert_string_equal(frame0(f.stack), "do_underflow");
  assert_string_equal(frame0(f.alloc_stack), "make_victim");
  assert_int_equal(f.history_len, 3);
  ta_free(obj);
}

static void test_stack_hold(void **state) {
  (void)state;
  void *op = make_victim(40);
  do_stack_hold(op);
  assert_one("hold.stack");
  ta_finding f = the_finding("hold.stack");
  assert_int_equal(f.holder, (uintptr_t)op);
  assert_string_equal(frame0(f.stack), "do_stack_hold");
  ta_unhold(op, "inputs");
  ta_free(op);
}

static void test_arena_after_reset(void **state) {
  (void)state;
  ta_arena *a = ta_arena_new(T, 1024);
  void *op = make_victim(40);
  void *x = ta_arena_alloc(a, 32);
  void *stale = ta_arena_alloc(a, 32);
  (void)x;
  do_reset(a);
  do_hold_after_reset(op, stale);
  assert_one("arena.after-reset");
  ta_finding f = the_finding("arena.after-reset");
  assert_int_equal(f.addr, (uintptr_t)stale);
  assert_int_equal(f.holder, (uintptr_t)op);
  assert_string_equal(frame0(f.stack), "do_hold_after_reset");
  assert_string_equal(frame0(f.free_stack), "do_reset");
  ta_unhold(op, "input");
  ta_free(op);
  ta_arena_free(a);
}

static void test_held_target_freed(void **state) {
  (void)state;
  void *layer = make_victim(64), *weights = make_victim(128);
  ta_hold(layer, "weights", weights);
  do_free_held(weights);
  assert_int_equal(do_hold_check(layer), 1);
  assert_one("hold.dangling");
  ta_finding f = the_finding("hold.dangling");
  assert_int_equal(f.addr, (uintptr_t)weights);
  assert_int_equal(f.holder, (uintptr_t)layer);
  assert_string_equal(frame0(f.stack), "do_hold_check");
  assert_string_equal(frame0(f.free_stack), "do_free_held");
  assert_string_equal(frame0(f.alloc_stack), "make_victim");
  assert_string_equal(frame0(f.aux_stack), "test_held_target_freed");   /* the hold */
  ta_unhold(layer, "weights");
  ta_free(layer);
}

static void *volatile g_view, *volatile g_parent, *volatile g_dummy;

static void test_orphan(void **state) {
  (void)state;
  g_parent = make_victim(400);
  g_view = make_victim(48);
  g_dummy = make_dummy();
  ta_hold(g_view, "storage", g_dummy);
  do_orphan(g_view, g_parent);
  assert_int_equal(ta_findings_count(NULL), 0);     /* an orphan is a leak: found by a scan */
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("leak.orphan");
  assert_int_equal(f.addr, (uintptr_t)g_dummy);
  assert_int_equal(f.holder, (uintptr_t)g_view);
  assert_int_equal(f.bytes, 4);
  assert_string_equal(frame0(f.stack), "make_dummy");      /* allocated at */
  assert_string_equal(frame0(f.aux_stack), "do_orphan");   /* orphaned at */
  ta_free(g_dummy);
  ta_unhold(g_view, "storage");
  ta_free(g_view);
  ta_free(g_parent);
  g_view = g_parent = g_dummy = NULL;
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* The written block is checked when it leaves the quarantine: after a few
 * hundred frees of other blocks (here: made 256 at a time, then freed). */
static void test_write_after_free(void **state) {
  (void)state;
  assert_int_equal(ta_option("quarantine"), 4096);
  void *p = do_write_after_free();
  assert_int_equal(ta_findings_count(NULL), 0);     /* seen when it leaves the quarantine */
  static void *batch[256];
  size_t frees = 0;
  for (int round = 0; round < 100 && ta_findings_count("use.after-free") == 0; round++) {
    for (int i = 0; i < 256; i++) batch[i] = make_victim(64);
    for (int i = 0; i < 256; i++, frees++) ta_free(batch[i]);
  }
  assert_true(frees <= 2048);
  assert_one("use.after-free");
  ta_finding f = the_finding("use.after-free");
  assert_int_equal(f.addr, (uintptr_t)p);
  assert_int_equal(f.bytes, 32);
  assert_int_equal(f.stack, 0);                                   /* the write itself was not seen */
  assert_string_equal(frame0(f.free_stack), "do_write_after_free");
  assert_string_equal(frame0(f.alloc_stack), "do_write_after_free");
  assert_string_equal(f.detail, "byte 3 of the freed 32-byte block was written (0x41, poison 0xdf)");
}

/* The same with the commonest pattern of all, alloc+free in a loop: each
 * written block must leave the quarantine, and be reported, after a bounded
 * number of further frees (the quarantine holds 4096 bytes: 64 blocks of
 * 64; 1000 frees is plenty), wherever its address falls.  64 blocks in a
 * row, in a forked child so that a block left in the quarantine cannot be
 * reported during a later test. */
enum { CHURN_TRIALS = 64, CHURN_MAX_FREES = 1000 };

static void churn_child(void *arg) {
  (void)arg;
  void *written[CHURN_TRIALS];                      /* distinct addresses */
  for (int trial = 0; trial < CHURN_TRIALS; trial++) written[trial] = make_victim(32);
  size_t detected = 0, frees_total = 0;
  for (int trial = 0; trial < CHURN_TRIALS; trial++) {
    size_t before = ta_findings_count("use.after-free");
    do_free_and_write(written[trial]);
    for (size_t frees = 0; frees < CHURN_MAX_FREES && ta_findings_count("use.after-free") == before; frees++) {
      ta_free(make_victim(64));
      frees_total++;
    }
    detected += ta_findings_count("use.after-free") > before;
  }
  printf("detected=%zu frees=%zu\n", detected, frees_total);
}

static void test_write_after_free_churn(void **state) {
  (void)state;
  child_result r;
  child_fork(churn_child, NULL, &r);
  assert_true(WIFEXITED(r.status));
  size_t detected = 0, frees = 0;
  assert_int_equal(sscanf(r.out, "detected=%zu frees=%zu", &detected, &frees), 2);
  if (detected != CHURN_TRIALS)
    print_message("%zu of %d writes after free reported, after %zu frees in a loop\n", detected,
                  CHURN_TRIALS, frees);
  assert_int_equal(detected, CHURN_TRIALS);
  child_result_free(&r);
}

/* Blocks leave the quarantine in batches (quarantine.c), each block's
 * poison and pad checked before any of them goes back to jemalloc: 12
 * blocks freed in a row, writes into six of them across the batches'
 * edges and into the pad of a seventh, then frees enough to push them all
 * out.  Each write is told once, of its own block: a batch that mixed up
 * its blocks' verdicts, skipped one or checked a block it had given back
 * (jemalloc's reuse then rewrites it) counts otherwise. */
enum { BATCH_BLOCKS = 12 };

/* Prints each finding of the child's as "kind tag: detail" (a tag per
 * block: findings of one stack and tag are one group). */
static int print_finding(const ta_finding *f, void *arg) {
  (void)arg;
  printf("%s %s: %s\n", f->kind, ta_tag_name(f->tag), f->detail);
  return 0;
}

NOIPA static void *make_tagged(ta_tag tag, size_t size) {
  void *p = ta_alloc(tag, size);
  KEEP();
  return p;
}

static void batch_child(void *arg) {
  (void)arg;
  static const int written[] = { 0, 3, 5, 7, 8, 11 };
  unsigned char *b[BATCH_BLOCKS];
  for (int k = 0; k < BATCH_BLOCKS; k++) {
    char name[24];
    snprintf(name, sizeof name, "batch%d", k);
    b[k] = make_tagged(ta_tag_get(name), k == 6 ? 24 : 32);
  }
  ta_findings_clear();
  for (int k = 0; k < BATCH_BLOCKS; k++) ta_free(b[k]);
  for (size_t k = 0; k < sizeof written / sizeof *written; k++)
    ((volatile unsigned char *)b[written[k]])[written[k]] = (unsigned char)(0x10 + k);
  ((volatile unsigned char *)b[6])[26] = 0x77;          /* the pad: bytes 24..31 of a 24-byte block */
  for (int k = 0; k < 1000; k++) ta_free(make_victim(64));
  ta_findings_visit(print_finding, NULL);
}

static void test_write_after_free_batch(void **state) {
  (void)state;
  child_result r;
  child_fork(batch_child, NULL, &r);
  assert_true(WIFEXITED(r.status));
  /* one line a finding, in the order they were found (the overflow's
   * detail, too long for its 96 bytes with the first byte's value, leaves
   * that value out and keeps when it was found) */
  static const char *const want[] = {
    "use.after-free batch0: byte 0 of the freed 32-byte block was written (0x10, poison 0xdf)\n",
    "use.after-free batch3: byte 3 of the freed 32-byte block was written (0x11, poison 0xdf)\n",
    "use.after-free batch5: byte 5 of the freed 32-byte block was written (0x12, poison 0xdf)\n",
    "heap.overflow batch6: wrote 1 byte(s) past the end of the 24-byte block: offsets 26..26 (left the quarantine)\n",
    "use.after-free batch7: byte 7 of the freed 32-byte block was written (0x13, poison 0xdf)\n",
    "use.after-free batch8: byte 8 of the freed 32-byte block was written (0x14, poison 0xdf)\n",
    "use.after-free batch11: byte 11 of the freed 32-byte block was written (0x15, poison 0xdf)\n",
  };
  const char *line = r.out;
  for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
    if (line == NULL || strncmp(line, want[k], strlen(want[k])) != 0) child_dump(&r);
    assert_non_null(line);
    assert_int_equal(strncmp(line, want[k], strlen(want[k])), 0);
    line = strchr(line, '\n');
    if (line) line++;
  }
  assert_string_equal(line, "");
  child_result_free(&r);
}

/* The poison check's paths (quarantine.c, poison_changed): a block under
 * 8 bytes, under 16, a multiple of 16, one ending in a part of 16 bytes
 * (an overlapping load), one of 64-byte chunks and a tail, one past the
 * 256-byte span; each written at the last byte of its span, or inside a
 * 64-byte chunk or the tail after them; one written twice, the first byte
 * told. */
static void tails_child(void *arg) {
  (void)arg;
  static const struct { size_t size, at; } w[] = {
    { 5, 4 }, { 12, 11 }, { 48, 47 }, { 40, 39 }, { 100, 99 }, { 300, 255 }, { 200, 64 }, { 90, 17 },
    { 100, 70 },
  };
  enum { N = sizeof w / sizeof *w };
  unsigned char *b[N];
  for (int k = 0; k < N; k++) {
    char name[24];
    snprintf(name, sizeof name, "tail%d", k);
    b[k] = make_tagged(ta_tag_get(name), w[k].size);
  }
  ta_findings_clear();
  for (int k = 0; k < N; k++) ta_free(b[k]);
  for (int k = 0; k < N; k++) ((volatile unsigned char *)b[k])[w[k].at] = (unsigned char)(0x30 + k);
  ((volatile unsigned char *)b[6])[100] = 0x55;        /* after the byte told: not told */
  for (int k = 0; k < 1000; k++) ta_free(make_victim(64));
  ta_findings_visit(print_finding, NULL);
}

static void test_write_after_free_tails(void **state) {
  (void)state;
  child_result r;
  child_fork(tails_child, NULL, &r);
  assert_true(WIFEXITED(r.status));
  const char *want =
      "use.after-free tail0: byte 4 of the freed 5-byte block was written (0x30, poison 0xdf)\n"
      "use.after-free tail1: byte 11 of the freed 12-byte block was written (0x31, poison 0xdf)\n"
      "use.after-free tail2: byte 47 of the freed 48-byte block was written (0x32, poison 0xdf)\n"
      "use.after-free tail3: byte 39 of the freed 40-byte block was written (0x33, poison 0xdf)\n"
      "use.after-free tail4: byte 99 of the freed 100-byte block was written (0x34, poison 0xdf)\n"
      "use.after-free tail5: byte 255 of the freed 300-byte block was written (0x35, poison 0xdf)\n"
      "use.after-free tail6: byte 64 of the freed 200-byte block was written (0x36, poison 0xdf)\n"
      "use.after-free tail7: byte 17 of the freed 90-byte block was written (0x37, poison 0xdf)\n"
      "use.after-free tail8: byte 70 of the freed 100-byte block was written (0x38, poison 0xdf)\n";
  if (strcmp(r.out, want) != 0) child_dump(&r);
  assert_string_equal(r.out, want);
  child_result_free(&r);
}

/* A write after free still in the quarantine at exit: the exit report has it. */
static int child_write_after_free(void) {
  T = ta_tag_get("misuse");
  do_write_after_free();
  return 0;
}

static void test_write_after_free_at_exit(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("write-after-free", env, &r);
  assert_true(WIFEXITED(r.status));
  const char *at = strstr(r.err, "use.after-free: freed block 0x");
  if (!at) child_dump(&r);
  assert_non_null(at);
  /* the access (not seen in default mode), the free and the allocation, each under its label */
  const char *head = strstr(at, " (32-byte block) used after free   [tag: misuse]\n"
                                "accessed at: not seen (a write into the freed block, found when the block "
                                "left the quarantine or at exit; --guard stops at the access)\n"
                                "freed at:\n    #0 0x");
  assert_non_null(head);
  assert_non_null(strstr(head, "allocated at:\n    #0 0x"));
  const char *freed = strstr(head, "freed at:\n") + strlen("freed at:\n");
  const char *eol = strchr(freed, '\n');
  const char *fn = strstr(freed, " in do_write_after_free ");
  assert_true(fn != NULL && fn < eol);                         /* frame #0 of the free */
  assert_non_null(strstr(r.err, "  detail: byte 3 of the freed 32-byte block was written (0x41, poison 0xdf)\n"));
  assert_non_null(strstr(r.err, "SUMMARY: tagalloc: 0 byte(s) leaked in 0 allocation(s); 1 error(s).\n"));
  child_result_free(&r);
}

static void test_freed_block_back_to_ledger(void **state) {
  (void)state;
  void *obj = make_victim(16);
  ta_ref_init(obj, 1);
  ta_free(obj);
  assert_int_equal(do_acquire_freed(obj), -1);
  assert_one("use.after-free");
  ta_finding f = the_finding("use.after-free");
  assert_string_equal(frame0(f.stack), "do_acquire_freed");
  assert_string_equal(frame0(f.free_stack), "test_freed_block_back_to_ledger");

  void *p = make_victim(16);
  ta_free(p);
  assert_null(do_realloc_freed(p));
  assert_int_equal(ta_findings_count("free.double"), 1);
  f = the_finding("free.double");
  assert_string_equal(frame0(f.stack), "do_realloc_freed");
}

/* After all of the above, the ledger still works and counts exactly. */
static void test_goes_on(void **state) {
  (void)state;
  ta_mark m = ta_mark_now();
  void *v[100];
  for (int i = 0; i < 100; i++) v[i] = ta_alloc(T, (size_t)i + 1);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 100);
  assert_int_equal(c.live_blocks, 100);
  assert_int_equal(c.live_bytes, 5050);
  for (int i = 0; i < 100; i++) ta_free(v[i]);
  c = ta_since(m, T);
  assert_int_equal(c.frees, 100);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* ---- overflows in default mode (heap.overflow): the pad past the block's end ---- */

NOIPA static void do_overflow(void *p, size_t size, size_t n, char c) {
  memset((char *)p + size, c, n);                  /* n bytes past the end */
  KEEP();
}

NOIPA static void do_free_overflowed(void *p) {
  ta_free(p);
  KEEP();
}

/* 4 bytes past a 40-byte block (class 48) and 8 past a 24-byte one (class
 * 32): each is heap.overflow at its free, with the free and the allocation
 * stacks, the offsets and the first byte written. */
static void test_overflow_at_free(void **state) {
  (void)state;
  char *a = make_victim(40), *b = make_victim(24);
  do_overflow(a, 40, 4, 'A');
  do_overflow(b, 24, 8, 'B');
  do_free_overflowed(a);
  assert_one("heap.overflow");
  do_free_overflowed(b);
  assert_int_equal(ta_findings_count("heap.overflow"), 2);
  assert_int_equal(ta_findings_count(NULL), 2);
  ta_finding f = the_finding("heap.overflow");           /* the first group */
  assert_int_equal(f.addr, (uintptr_t)a);
  assert_int_equal(f.bytes, 40);
  assert_string_equal(frame0(f.stack), "do_free_overflowed");      /* found at its free */
  assert_string_equal(frame0(f.free_stack), "do_free_overflowed");
  assert_string_equal(frame0(f.alloc_stack), "make_victim");
  assert_string_equal(f.detail, "wrote 4 byte(s) past the end of the 40-byte block: offsets 40..43, first 0x41");
  assert_int_equal(n_messages, 2);                        /* the second block's, announced too */
  assert_non_null(strstr(messages[1], "heap.overflow at 0x"));
  assert_non_null(strstr(messages[1], ": wrote 8 byte(s) past the end of the 24-byte block: offsets 24..31, "
                                      "first 0x42 (the exit report has the stacks)"));
}

/* A block whose size is a size class (32) has no slack and no pad: default
 * mode does not see its overflow (--guard does), and says nothing false. */
static void test_overflow_exact_class(void **state) {
  (void)state;
  char *a = make_victim(32);
  assert_int_equal(ta_usable_size(a), 32);
  do_free_overflowed(a);
  char *b = make_victim(30);
  assert_int_equal(ta_usable_size(b), 30);               /* the size asked for, not the class's 32 */
  memset(b, 'x', 30);                                      /* writing all of it is fine */
  do_free_overflowed(b);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* A live block overflowed and never freed: found at exit. */
static int child_overflow_live(void) {
  T = ta_tag_get("misuse");
  char *p = make_victim(100);                            /* class 112: 12 bytes of pad */
  do_overflow(p, 100, 2, 'Z');
  static char *keep;
  keep = p;
  return keep != NULL ? 0 : 1;
}

static void test_overflow_at_exit(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("overflow-live", env, &r);
  assert_true(WIFEXITED(r.status));
  const char *at = strstr(r.err, "heap.overflow: block 0x");
  if (!at) child_dump(&r);
  assert_non_null(at);
  assert_non_null(strstr(at, " (100-byte block) written past its end   [tag: misuse]\n"
                              "accessed at: not seen (found when the block was checked at exit; --guard stops "
                              "at the access)\nallocated at:\n    #0 0x"));
  assert_non_null(strstr(at, " in make_victim "));
  assert_non_null(strstr(r.err, "  detail: wrote 2 byte(s) past the end of the 100-byte block: offsets "
                                "100..101, first 0x5a (at exit)\n"));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "overflow-live") == 0) return child_overflow_live();
    return strcmp(argv[2], "write-after-free") == 0 ? child_write_after_free() : 2;
  }
  setenv("TAGALLOC_REPORT", "0", 1);
  setenv("TAGALLOC_QUARANTINE", "4096", 1);
  T = ta_tag_get("misuse");
  ctx = report_ctx_new();
  if (ctx == NULL) return 1;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup(test_double_free, messages_setup),
    cmocka_unit_test_setup(test_invalid_free_never_allocated, messages_setup),
    cmocka_unit_test_setup(test_invalid_free_interior, messages_setup),
    cmocka_unit_test_setup(test_refcount_underflow, messages_setup),
    cmocka_unit_test_setup(test_stack_hold, messages_setup),
    cmocka_unit_test_setup(test_arena_after_reset, messages_setup),
    cmocka_unit_test_setup(test_held_target_freed, messages_setup),
    cmocka_unit_test_setup(test_orphan, messages_setup),
    cmocka_unit_test_setup(test_write_after_free, messages_setup),
    cmocka_unit_test_setup(test_write_after_free_churn, messages_setup),
    cmocka_unit_test_setup(test_write_after_free_at_exit, messages_setup),
    cmocka_unit_test_setup(test_write_after_free_batch, messages_setup),
    cmocka_unit_test_setup(test_write_after_free_tails, messages_setup),
    cmocka_unit_test_setup(test_freed_block_back_to_ledger, messages_setup),
    cmocka_unit_test_setup(test_goes_on, messages_setup),
    cmocka_unit_test_setup(test_overflow_at_free, messages_setup),
    cmocka_unit_test_setup(test_overflow_exact_class, messages_setup),
    cmocka_unit_test_setup(test_overflow_at_exit, messages_setup),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  report_ctx_free(ctx);
  return failed;
}
