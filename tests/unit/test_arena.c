/* test_arena.c - arenas: each arena allocation is a block of the arena's tag
 * (ta_since counts it, 16-byte aligned); a reset drops them all (live 0,
 * frees counted) and starts a new generation; a hold into arena memory
 * becomes hold.dangling at reset; a hold declared on a pointer into the reset
 * part is arena.after-reset; the capacity grown by an exceptional generation
 * is given back at the reset after the next, smaller one; ta_free of an arena
 * block is free.invalid and changes nothing. */
#include "harness.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_counts_and_reset(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape");
  ta_mark m = ta_mark_now();
  ta_arena *a = ta_arena_new(T, 4096);
  assert_non_null(a);
  assert_int_equal(ta_arena_generation(a), 1);
  assert_int_equal(ta_arena_capacity(a), 4096);
  assert_int_equal(ta_since(m, TA_ANY).allocs, 0);   /* the chunk is not a block */

  void *p[10];
  for (int i = 0; i < 10; i++) {
    p[i] = ta_arena_alloc(a, 100);
    assert_non_null(p[i]);
    assert_int_equal((uintptr_t)p[i] % 16, 0);
    assert_int_equal(ta_block_size(p[i]), 100);
    assert_int_equal(ta_block_tag(p[i]), T);
    assert_int_equal(ta_usable_size(p[i]), 100);
    memset(p[i], i, 100);
  }
  for (int i = 1; i < 10; i++) assert_true((char *)p[i] >= (char *)p[i - 1] + 100);   /* no overlap */
  void *z = ta_arena_alloc(a, 0);
  assert_non_null(z);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 11);
  assert_int_equal(c.frees, 0);
  assert_int_equal(c.live_blocks, 11);
  assert_int_equal(c.live_bytes, 1000);
  assert_int_equal(c.peak_bytes, 1000);
  assert_int_equal(ta_arena_capacity(a), 4096);      /* 11 blocks fit the first chunk */

  ta_arena_reset(a);
  assert_int_equal(ta_arena_generation(a), 2);
  c = ta_since(m, T);
  assert_int_equal(c.allocs, 11);
  assert_int_equal(c.frees, 11);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(c.peak_bytes, 1000);
  for (int i = 0; i < 10; i++) assert_int_equal(ta_block_size(p[i]), 0);

  /* The next generation reuses the memory, and counts as new blocks. */
  void *q = ta_arena_alloc(a, 64);
  assert_ptr_equal(q, p[0]);
  assert_int_equal(ta_block_size(q), 64);
  c = ta_since(m, T);
  assert_int_equal(c.allocs, 12);
  assert_int_equal(c.live_blocks, 1);
  assert_int_equal(c.live_bytes, 64);
  ta_arena_reset(a);
  assert_int_equal(ta_arena_generation(a), 3);

  /* ta_arena_free drops the blocks of the current generation too. */
  ta_arena_alloc(a, 32);
  ta_arena_alloc(a, 32);
  ta_arena_free(a);
  c = ta_since(m, T);
  assert_int_equal(c.allocs, 14);
  assert_int_equal(c.frees, 14);
  assert_int_equal(c.live_blocks, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
  assert_int_equal(ta_findings_count(NULL), 0);

  /* No leak findings from arena blocks: the arena owns them. */
  ta_arena *b = ta_arena_new(T, 1024);
  ta_arena_alloc(b, 100);
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_arena_free(b);
}

static void test_hold_into_arena_then_reset(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape"), O = ta_tag_get("tape.owner");
  ta_arena *a = ta_arena_new(T, 4096);
  void *holder = ta_alloc(O, 32);
  void *op = ta_arena_alloc(a, 64);
  ta_hold(holder, "op", op);
  assert_int_equal(ta_hold_check(holder), 0);
  assert_int_equal(ta_findings_count(NULL), 0);

  ta_arena_reset(a);                             /* op dies while held */
  assert_int_equal(ta_findings_count(NULL), 0);  /* found when checked */
  assert_int_equal(ta_hold_check(holder), 1);
  assert_int_equal(ta_findings_count("hold.dangling"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  find_arg f = { .kind = "hold.dangling" };
  ta_findings_visit(find_kind, &f);
  assert_true(f.found);
  assert_int_equal(f.f.addr, (uintptr_t)op);
  assert_int_equal(f.f.holder, (uintptr_t)holder);
  assert_int_equal(f.f.tag, T);
  assert_int_not_equal(f.f.free_stack, 0);       /* where the reset happened */

  /* The memory is live again in the new generation, but not for this hold. */
  void *again = ta_arena_alloc(a, 64);
  assert_ptr_equal(again, op);
  assert_int_equal(ta_hold_check(holder), 1);

  ta_unhold(holder, "op");
  assert_int_equal(ta_hold_check(holder), 0);
  ta_free(holder);
  ta_arena_free(a);
}

static void test_hold_after_reset(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape"), O = ta_tag_get("tape.owner");
  ta_arena *a = ta_arena_new(T, 4096);
  void *holder = ta_alloc(O, 32);
  void *op = ta_arena_alloc(a, 64);
  void *op2 = ta_arena_alloc(a, 64);
  ta_arena_reset(a);
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_hold(holder, "op", op2);                    /* a stale pointer into the reset part */
  assert_int_equal(ta_findings_count("arena.after-reset"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  assert_int_equal(n_messages, 1);
  find_arg f = { .kind = "arena.after-reset" };
  ta_findings_visit(find_kind, &f);
  assert_true(f.found);
  assert_int_equal(f.f.addr, (uintptr_t)op2);
  assert_int_equal(f.f.holder, (uintptr_t)holder);
  assert_int_equal(f.f.tag, T);
  assert_int_not_equal(f.f.free_stack, 0);       /* the reset */
  ta_unhold(holder, "op");

  /* Into the live part of the new generation: fine. */
  void *fresh = ta_arena_alloc(a, 64);
  assert_ptr_equal(fresh, op);
  ta_hold(holder, "op", fresh);
  assert_int_equal(ta_hold_check(holder), 0);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_unhold(holder, "op");
  ta_free(holder);
  ta_arena_free(a);
}

/* ta_check (tagalloc.h): 1 for a live block or the live part of an arena;
 * arena.after-reset or use.after-free otherwise.  Declared, so it must link:
 * it is looked up weakly so that its absence fails this test only. */
#pragma weak ta_check
static void test_check_after_reset(void **state) {
  (void)state;
  if (&ta_check == NULL) fail_msg("ta_check is declared in tagalloc.h but not defined by the library");
  ta_arena *a = ta_arena_new(ta_tag_get("tape"), 4096);
  void *op = ta_arena_alloc(a, 64);
  assert_int_equal(ta_check(op), 1);
  ta_arena_reset(a);
  assert_int_equal(ta_check(op), 0);
  assert_int_equal(ta_findings_count("arena.after-reset"), 1);
  ta_arena_free(a);
  void *p = ta_alloc(ta_tag_get("tape.owner"), 8);
  assert_int_equal(ta_check(p), 1);
  ta_free(p);
  assert_int_equal(ta_check(p), 0);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
}

static void test_capacity_shrinks(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape");
  ta_arena *a = ta_arena_new(T, 4096);
  assert_int_equal(ta_arena_capacity(a), 4096);

  /* An exceptional generation: ten chunks' worth. */
  for (int i = 0; i < 10; i++) assert_non_null(ta_arena_alloc(a, 4096));
  assert_int_equal(ta_arena_capacity(a), 40960);
  /* One larger than the capacity: a chunk of its own size. */
  assert_non_null(ta_arena_alloc(a, 10000));
  assert_int_equal(ta_arena_capacity(a), 50960);

  ta_arena_reset(a);                             /* it used all of it: keeps it */
  size_t kept = ta_arena_capacity(a);
  assert_int_equal(kept, 50960);
  ta_arena_alloc(a, 100);                        /* a small generation */
  ta_arena_reset(a);                             /* gives back all but the first chunk */
  assert_int_equal(ta_arena_capacity(a), 4096);
  assert_int_equal(ta_arena_generation(a), 3);

  /* A steady workload keeps its chunks. */
  for (int gen = 0; gen < 3; gen++) {
    for (int i = 0; i < 3; i++) ta_arena_alloc(a, 4096);
    assert_int_equal(ta_arena_capacity(a), 12288);
    ta_arena_reset(a);
    assert_int_equal(ta_arena_capacity(a), 12288);
  }
  ta_arena_free(a);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_free_arena_block(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape");
  ta_arena *a = ta_arena_new(T, 4096);
  ta_mark m = ta_mark_now();
  void *op = ta_arena_alloc(a, 48);
  ta_free(op);
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  assert_int_equal(ta_block_size(op), 48);       /* still a live block */
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.frees, 0);
  assert_int_equal(c.live_blocks, 1);
  assert_null(ta_realloc(op, 96));               /* nor can it be reallocated */
  assert_int_equal(ta_findings_count("free.invalid"), 2);
  assert_int_equal(ta_block_size(op), 48);
  ta_arena_reset(a);
  assert_int_equal(ta_since(m, T).frees, 1);
  ta_arena_free(a);
}

/* An alternating arena: consecutive generations use different memory, so a
 * pointer kept across a reset is arena.after-reset at its next check, with
 * its allocation stack and the reset's; the chunk it is in is then retired,
 * so it stays caught at every later check (it never lands in a live block). */
NOIPA static void *make_one(ta_arena *a) {
  void *p = ta_arena_alloc(a, 48);
  KEEP();
  return p;
}

NOIPA static int check_stale(const void *p, ta_tag T) {
  int r = ta_check_tag(p, T);
  KEEP();
  return r;
}

static void test_alternate_generations(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape");
  report_ctx *ctx = report_ctx_new();
  ta_arena *a = ta_arena_new_flags(T, 4096, TA_ARENA_ALTERNATE);
  assert_int_equal(ta_arena_capacity(a), 2 * 4096);
  void *old = make_one(a);
  assert_int_equal(check_stale(old, T), 1);
  ta_arena_reset(a);
  void *fresh = ta_arena_alloc(a, 48);
  assert_ptr_not_equal(fresh, old);              /* the other set */
  assert_int_equal(check_stale(fresh, T), 1);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(check_stale(old, T), 0);
  assert_int_equal(ta_findings_count("arena.after-reset"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("arena.after-reset");
  assert_string_equal(stack_frame0(ctx, f.stack), "check_stale");
  assert_string_equal(stack_frame0(ctx, f.alloc_stack), "make_one");
  assert_string_equal(stack_frame0(ctx, f.free_stack), "test_alternate_generations");
  assert_int_equal(f.bytes, 48);
  assert_int_equal(f.tag, T);
  /* two generations on, the old address would be the first block of its
   * set again; its chunk is retired, so it is not */
  ta_arena_reset(a);
  void *again = ta_arena_alloc(a, 48);
  assert_ptr_not_equal(again, old);
  assert_int_equal(check_stale(old, T), 0);
  assert_int_equal(ta_findings_count("arena.after-reset"), 2);
  ta_arena_reset(a);
  assert_int_equal(check_stale(old, T), 0);
  assert_int_equal(ta_findings_count("arena.after-reset"), 3);
  assert_int_equal(ta_findings_count(NULL), 3);
  ta_arena_free(a);
  report_ctx_free(ctx);
}

/* ta_check_block's kinds: a freed block, a block released once too often,
 * a block of another tag, memory the ledger does not know. */
static void test_check_block_kinds(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("thing"), U = ta_tag_get("other");
  void *p = ta_alloc(T, 32), *q = ta_alloc(U, 32);
  assert_int_equal(ta_check_block(p, T, T, 0, "x"), 1);
  assert_int_equal(ta_check_block(p, U, T, 0, "x"), 1);   /* either tag */
  assert_int_equal(ta_check_block(p, TA_ANY, TA_ANY, 0, "x"), 1);
  assert_int_equal(ta_check_block(q, T, T, 0, "x"), 0);   /* live, but another tag */
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  ta_free(p);
  assert_int_equal(ta_check_block(p, T, T, 0, "x"), 0);
  assert_int_equal(ta_findings_count("use.after-free"), 2);
  assert_int_equal(ta_check_block(p, T, T, TA_CHECK_FREE, "x"), 0);
  assert_int_equal(ta_findings_count("free.double"), 1);
  int local;
  assert_int_equal(ta_check_block(&local, T, T, TA_CHECK_FREE, "x"), 0);
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  void *r = ta_alloc(T, 16);
  ta_ref_init(r, 1);
  assert_int_equal(ta_ref_release(r), 0);
  ta_free(r);
  assert_int_equal(ta_check_block(r, T, T, TA_CHECK_REF, "x"), 0);
  assert_int_equal(ta_findings_count("ref.underflow"), 1);
  ta_finding f = the_finding("ref.underflow");
  assert_int_equal(f.history_len, 2);            /* init, the release */
  assert_int_equal(ta_findings_count(NULL), 5);
  ta_free(q);
}

/* ta_arena_alloc_at: a block counted like ta_arena_alloc's, made at the
 * stack it is given (ta_live_since reports it), and dropped by the reset. */
NOIPA static uint32_t stack_of_op(void) {
  uint32_t s = ta_stack_here();
  KEEP();
  return s;
}

typedef struct { size_t n; uint32_t stack; const void *p; } live_arg;

static void live_one(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  (void)size;
  (void)tag;
  live_arg *a = arg;
  a->n++;
  a->stack = stack;
  a->p = p;
}

static void test_alloc_at_given_stack(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("tape.at");
  uint32_t s = stack_of_op();
  assert_int_not_equal(s, 0);
  ta_arena *a = ta_arena_new(T, 4096);
  ta_mark m = ta_mark_now();
  void *p = ta_arena_alloc_at(a, 80, s);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 16, 0);
  assert_int_equal(ta_block_size(p), 80);
  assert_int_equal(ta_block_tag(p), T);
  TA_ASSERT_ALLOCS_SINCE(m, T, 1);
  TA_ASSERT_LIVE_SINCE(m, T, 1);
  live_arg l = { 0 };
  ta_live_since(m, T, live_one, &l);
  assert_int_equal(l.n, 1);
  assert_ptr_equal(l.p, p);
  assert_int_equal(l.stack, s);
  void *q = ta_arena_alloc(a, 16);               /* the plain call: its own stack */
  l = (live_arg){ 0 };
  ta_live_since(m, T, live_one, &l);
  assert_int_equal(l.n, 2);
  ta_arena_reset(a);
  assert_int_equal(ta_block_size(p), 0);
  assert_int_equal(ta_block_size(q), 0);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 2);
  assert_int_equal(c.frees, 2);
  assert_int_equal(c.live_blocks, 0);
  ta_mark_free(m);
  ta_arena_free(a);
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_counts_and_reset, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_into_arena_then_reset, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_after_reset, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_check_after_reset, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_capacity_shrinks, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_free_arena_block, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_alternate_generations, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_check_block_kinds, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_alloc_at_given_stack, messages_setup, messages_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
