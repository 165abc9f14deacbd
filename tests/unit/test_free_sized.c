/* test_free_sized.c - the free path gives every block back to jemalloc in
 * its own size class (block.h: raw_free frees small blocks with their size,
 * sdallocx, and the rest without): after a free in leaks mode, or after
 * the quarantine lets a block go in full mode, jemalloc's next allocation
 * of the block's class (sallocx before the free) returns that very block,
 * for blocks of every small class, zero-sized, calloc'd, reallocated in
 * place, large, and aligned beyond their size's class (memalign(64, 16) is
 * a 64-byte block: freed with its size it would go to the 16-byte class).
 * And the decision itself, exactly, before and after an aligned block of
 * another class was made; and the freed record's words (record_freed,
 * record_copy), every field read back. */
#include "harness.h"
#include "block.h"

#include <jemalloc/jemalloc.h>
#include <stdlib.h>
#include <string.h>

static int setup(void **state) {
  (void)state;
  ta_findings_clear();
  return 0;
}

/* Frees p (leaks mode: straight back to jemalloc) and checks that jemalloc
 * hands the block out again for its class, and that the ledger knows it no
 * more. */
static void free_then_reused(void *p) {
  size_t usable = sallocx(p, 0);
  ta_free(p);
  assert_int_equal(ta_block_size(p), 0);
  void *q = mallocx(usable, 0);
  assert_ptr_equal(q, p);
  assert_int_equal(sallocx(q, 0), usable);
  dallocx(q, 0);
}

static void test_each_class_reused(void **state) {
  (void)state;
  long was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_LEAKS;
  ta_tag T = ta_tag_get("free-sized.classes");
  ta_mark m = ta_mark_now();
  int n = 0;
  /* every size up to 256, then each class's first and last size (and one
   * between) up to the last small class, then large ones (freed unsized) up to the
   * thread cache's largest class */
  for (size_t size = 0; size <= 32768; size += size < 256 ? 1 : size < 16384 ? 7 : 997) {
    unsigned char *p = ta_alloc(T, size);
    assert_non_null(p);
    if (size) p[size - 1] = 1;
    assert_int_equal(ta_usable_size(p), size);
    free_then_reused(p);
    n++;
  }
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, n);
  assert_int_equal(c.frees, n);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  _ta_opt.check = was;
}

static void test_calloc_and_realloc_reused(void **state) {
  (void)state;
  long was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_LEAKS;
  ta_tag T = ta_tag_get("free-sized.realloc");
  unsigned char *z = ta_calloc(T, 3, 33);              /* 99 bytes, class 112 */
  assert_int_equal(sallocx(z, 0), 112);
  free_then_reused(z);
  z = ta_calloc(T, 0, 8);                              /* 0 bytes: jemalloc's 8 */
  assert_int_equal(sallocx(z, 0), 8);
  free_then_reused(z);

  unsigned char *p = ta_alloc(T, 100);                 /* class 112 */
  unsigned char *q = ta_realloc(p, 97);                /* in place: the record says 97 */
  assert_ptr_equal(q, p);
  assert_int_equal(ta_block_size(q), 97);
  free_then_reused(q);
  p = ta_alloc(T, 14000);                              /* the last small class, 14336 */
  q = ta_realloc(p, 14336);
  assert_ptr_equal(q, p);
  free_then_reused(q);

  /* large, resized in place across classes (xallocx): freed without its size */
  p = ta_alloc(T, 20000);                              /* 20480 */
  q = ta_realloc(p, 17000);                            /* 20480 or 17408: jemalloc's call */
  assert_ptr_equal(q, p);
  assert_int_equal(ta_block_size(q), 17000);
  size_t usable = sallocx(q, 0);
  assert_true(usable == 17408 || usable == 20480);
  free_then_reused(q);
  assert_int_equal(ta_findings_count(NULL), 0);
  _ta_opt.check = was;
}

/* Blocks aligned beyond their size's class, through the API (ta_aligned)
 * and the preload's entry (_ta_alloc_at, as memalign and posix_memalign
 * call it), with ordinary blocks freed in between. */
static void test_aligned_reused(void **state) {
  (void)state;
  long was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_LEAKS;
  ta_tag T = ta_tag_get("free-sized.aligned");
  static const size_t sizes[] = { 0, 1, 8, 16, 40, 48, 100, 1000, 2000, 4096, 5000, 14336, 20000 };
  int odd = 0;
  for (size_t align = 1; align <= 16384; align *= 2)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      size_t size = sizes[i];
      void *p = ta_aligned(T, align, size);
      assert_non_null(p);
      assert_int_equal((uintptr_t)p % align, 0);
      if (sallocx(p, 0) != nallocx(size ? size : 1, 0)) odd++;
      free_then_reused(p);
      void *o = ta_alloc(T, size);                     /* an ordinary block of the size */
      free_then_reused(o);
      p = _ta_alloc_at(T, size, align > 16 ? align : 0, false, 0);
      assert_non_null(p);
      assert_int_equal((uintptr_t)p % align, 0);
      size_t usable = sallocx(p, 0);
      assert_true(_ta_free_at(p, 0));
      void *q = mallocx(usable, 0);
      assert_ptr_equal(q, p);
      dallocx(q, 0);
    }
  assert_true(odd > 20);                               /* the case in point was made */
  assert_int_equal(ta_findings_count(NULL), 0);
  _ta_opt.check = was;
}

/* Full mode: the blocks leave the quarantine in their own classes. */
static void test_quarantine_reused(void **state) {
  (void)state;
  long was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_FULL;
  ta_tag T = ta_tag_get("free-sized.quarantine");
  void *plain = ta_alloc(T, 24);                       /* class 32 */
  void *wide = ta_aligned(T, 64, 16);                  /* class 64 */
  void *page = ta_aligned(T, 4096, 100);               /* class 4096 */
  size_t up = sallocx(plain, 0), uw = sallocx(wide, 0), ug = sallocx(page, 0);
  assert_int_equal(up, 32);
  assert_int_equal(uw, 64);
  assert_int_equal(ug, 4096);
  ta_free(plain);
  ta_free(wide);
  ta_free(page);
  ta_thread *t = _ta_thread();
  assert_true(t->qlen >= 3);
  while (t->qlen > 0) _ta_quarantine_evict_batch(t, -1);   /* oldest first: these three last */
  void *a = mallocx(up, 0), *b = mallocx(uw, 0), *c = mallocx(ug, 0);
  assert_ptr_equal(a, plain);
  assert_ptr_equal(b, wide);
  assert_ptr_equal(c, page);
  dallocx(a, 0);
  dallocx(b, 0);
  dallocx(c, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  _ta_opt.check = was;
}

/* record_freed writes the record as whole words: every field reads back,
 * at its extremes, and the copy (record_copy) keeps them all. */
static void test_record_words(void **state) {
  (void)state;
  ta_block r, c;
  memset(&r, 0x5A, sizeof r);
  record_freed(&r, (uintptr_t)0x7ffffffffff0, (UINT64_C(1) << 48) - 1, 255, (UINT64_C(1) << 56) - 1,
               TA_F_REF | TA_F_HOLD | TA_F_ARENA, 0xFFFFFFFFu, 0x12345678u);
  assert_int_equal(r.addr, 0x7ffffffffff0);
  assert_int_equal(r.size, (UINT64_C(1) << 48) - 1);
  assert_int_equal(r.tag, 255);
  assert_int_equal(r.seq, (UINT64_C(1) << 56) - 1);
  assert_int_equal(r.state, TA_FREED);
  assert_int_equal(r.flags, TA_F_REF | TA_F_HOLD | TA_F_ARENA);
  assert_int_equal(r.stack, 0xFFFFFFFFu);
  assert_int_equal(r.free_stack, 0x12345678u);
  record_freed(&r, 16, 1, 0, 0, 0, 0, 0);
  assert_int_equal(r.addr, 16);
  assert_int_equal(r.size, 1);
  assert_int_equal(r.tag, 0);
  assert_int_equal(r.seq, 0);
  assert_int_equal(r.state, TA_FREED);
  assert_int_equal(r.flags, 0);
  assert_int_equal(r.stack, 0);
  assert_int_equal(r.free_stack, 0);
  record_freed(&r, 0x1000, 4242, 7, 99, TA_F_HOLD, 3, 4);
  memset(&c, 0, sizeof c);
  record_copy(&c, &r);
  assert_memory_equal(&c, &r, sizeof r);
  assert_int_equal(c.size, 4242);
  assert_int_equal(c.tag, 7);
  assert_int_equal(c.seq, 99);
  assert_int_equal(c.flags, TA_F_HOLD);
  assert_int_equal(c.stack, 3);
  assert_int_equal(c.free_stack, 4);
}

/* The decision, exactly.  Run last: it sets the note by hand. */
static void test_sized_decision(void **state) {
  (void)state;
  size_t saved = atomic_load(&_ta_align_odd);
  atomic_store(&_ta_align_odd, 0);
  /* no odd aligned block yet: every small block, wherever it is */
  assert_true(free_sized_ok(0x7f0000001000, 16));
  assert_true(free_sized_ok(0x7f0000001010, 0));
  assert_true(free_sized_ok(0x7f0000040000, 14336));
  assert_false(free_sized_ok(0x7f0000040000, 14337));     /* large: no */
  /* an allocation aligned within its class notes nothing */
  align_note(48, MALLOCX_ALIGN(16));
  align_note(64, MALLOCX_ALIGN(64));
  align_note(20000, MALLOCX_ALIGN(8192));                 /* large: freed unsized anyway */
  assert_int_equal(atomic_load(&_ta_align_odd), 0);
  align_note(16, MALLOCX_ALIGN(64));                      /* memalign(64, 16): class 64 */
  assert_int_equal(atomic_load(&_ta_align_odd), 64);
  align_note(8, MALLOCX_ALIGN(32));
  assert_int_equal(atomic_load(&_ta_align_odd), 64);      /* the largest is kept */
  /* now a block whose address is aligned beyond its class's lowest bit
   * may be such a block: freed unsized */
  assert_false(free_sized_ok(0x7f0000001040, 16));        /* 64-aligned, class 16 */
  assert_false(free_sized_ok(0x7f0000001020, 16));        /* 32-aligned, class 16 */
  assert_true(free_sized_ok(0x7f0000001010, 16));         /* 16-aligned: not aligned beyond */
  assert_true(free_sized_ok(0x7f0000001040, 64));         /* class 64 is 64-aligned anyway */
  assert_true(free_sized_ok(0x7f0000001000, 64));         /* page-aligned, but no alignment above 64 was asked */
  assert_false(free_sized_ok(0x7f0000001000, 48));        /* class 48: lowest bit 16 */
  assert_true(free_sized_ok(0x7f0000001000, 128));
  assert_true(free_sized_ok(0x7f0000001008, 8));
  assert_false(free_sized_ok(0x7f0000001010, 8));
  align_note(100, MALLOCX_ALIGN(8192));                   /* beyond a page: a large block */
  assert_int_equal(atomic_load(&_ta_align_odd), 8192);
  assert_false(free_sized_ok(0x7f0000002000, 8192));      /* 8192-aligned, class 8192: may be it */
  assert_true(free_sized_ok(0x7f0000001000, 4096));
  assert_true(free_sized_ok(0x7f0000003000, 8192));       /* only 4096-aligned */
  atomic_store(&_ta_align_odd, saved > 8192 ? saved : 8192);   /* never lower it while such blocks may live */
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup(test_each_class_reused, setup),
    cmocka_unit_test_setup(test_calloc_and_realloc_reused, setup),
    cmocka_unit_test_setup(test_aligned_reused, setup),
    cmocka_unit_test_setup(test_quarantine_reused, setup),
    cmocka_unit_test_setup(test_record_words, setup),
    cmocka_unit_test_setup(test_sized_decision, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
