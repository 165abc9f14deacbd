/* test_alloc.c - the ledger's allocation API and its counts: ta_alloc,
 * ta_calloc (zeroed, overflow -> NULL), ta_realloc (keeps the tag, always
 * moves, copies; NULL allocates with tag "realloc"; in leaks mode it stays
 * in place within the size class, the pad moved to the new end, counts and
 * sizes exact, an overflow past the new end caught), ta_aligned, the block
 * queries, tags, and exact ta_since counts per tag and for TA_ANY (allocs,
 * frees, live blocks and bytes, peak bytes) after scripted sequences and over
 * 10,000 iterations; ta_mark_free (a freed mark's peak still counts, a loop
 * of mark/check/free keeps no records); the live table's shape after
 * 50,000 small blocks (full enough, records near their home slots), a
 * growth giving every whole page of the old table back, its 24-byte
 * records (every field's extremes kept, an interior pointer never taken
 * for its block); the
 * assertion macros pass when they should and abort (in a forked child)
 * when they should not. */
#include "harness.h"
#include "child.h"
#include "internal.h"
#include "live.h"
#include "shim.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- an error handler that collects what the ledger says ------------------- */

static int last_code;
static char last_msg[512];
static int n_errors;

static void on_error(int code, const char *message, void *arg) {
  (void)arg;
  last_code = code;
  snprintf(last_msg, sizeof last_msg, "%s", message);
  n_errors++;
}

static int setup(void **state) {
  (void)state;
  last_code = 0;
  last_msg[0] = '\0';
  n_errors = 0;
  ta_findings_clear();
  return 0;
}

/* ---- allocation ------------------------------------------------------------ */

static void test_alloc_basic(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.basic");
  unsigned char *p = ta_alloc(T, 100);
  assert_non_null(p);
  assert_int_equal(ta_block_size(p), 100);
  assert_int_equal(ta_block_tag(p), T);
  assert_true(ta_usable_size(p) >= 100);
  memset(p, 0xAB, 100);                          /* all of it is ours */

  unsigned char *z = ta_alloc(T, 0);             /* a unique pointer of size 0 */
  assert_non_null(z);
  assert_ptr_not_equal(z, p);
  assert_int_equal(ta_block_size(z), 0);
  assert_int_equal(ta_block_tag(z), T);

  ta_free(p);
  ta_free(z);
  assert_int_equal(ta_block_size(p), 0);         /* no longer a live block */
  assert_int_equal(ta_block_tag(p), TA_ANY);
  assert_int_equal(ta_usable_size(p), 0);
  ta_free(NULL);                                 /* a no-op */

  int on_stack;
  assert_int_equal(ta_block_size(&on_stack), 0); /* not the ledger's */
  assert_int_equal(ta_usable_size(&on_stack), 0);
  assert_int_equal(ta_block_tag(&on_stack), TA_ANY);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void test_calloc_zeroed(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.calloc");
  ta_mark m = ta_mark_now();
  uint32_t *v = ta_calloc(T, 1000, sizeof *v);
  assert_non_null(v);
  assert_int_equal(ta_block_size(v), 4000);
  assert_int_equal(ta_block_tag(v), T);
  for (size_t i = 0; i < 1000; i++) assert_int_equal(v[i], 0);

  /* n * size overflows: NULL, TA_EOVERFLOW, nothing allocated. */
  ta_error_handler(on_error, NULL);
  assert_null(ta_calloc(T, SIZE_MAX / 2 + 1, 2));
  assert_int_equal(last_code, TA_EOVERFLOW);
  assert_null(ta_calloc(T, 2, SIZE_MAX / 2 + 1));
  assert_null(ta_calloc(T, SIZE_MAX, SIZE_MAX));
  assert_int_equal(n_errors, 3);
  ta_error_handler(NULL, NULL);

  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 1);
  assert_int_equal(c.live_blocks, 1);
  assert_int_equal(c.live_bytes, 4000);
  ta_free(v);
  assert_int_equal(ta_since(m, T).live_blocks, 0);
}

static void test_realloc_moves(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.realloc");
  ta_mark m = ta_mark_now();
  unsigned char *p = ta_alloc(T, 16);
  for (int i = 0; i < 16; i++) p[i] = (unsigned char)i;

  /* Grows: moves (always, so a stale pointer is caught), copies, keeps the tag. */
  unsigned char *q = ta_realloc(p, 64);
  assert_non_null(q);
  assert_ptr_not_equal(q, p);
  assert_int_equal(ta_block_size(q), 64);
  assert_int_equal(ta_block_tag(q), T);
  for (int i = 0; i < 16; i++) assert_int_equal(q[i], i);
  assert_int_equal(ta_block_size(p), 0);         /* the old block is freed */

  /* Shrinks: the prefix is kept. */
  unsigned char *r = ta_realloc(q, 8);
  assert_non_null(r);
  assert_ptr_not_equal(r, q);
  assert_int_equal(ta_block_size(r), 8);
  for (int i = 0; i < 8; i++) assert_int_equal(r[i], i);

  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 3);
  assert_int_equal(c.frees, 2);
  assert_int_equal(c.live_blocks, 1);
  assert_int_equal(c.live_bytes, 8);

  /* realloc(NULL) allocates with tag "realloc"; ta_realloc_tag with its tag. */
  ta_tag R = ta_tag_get("realloc");
  ta_mark m2 = ta_mark_now();
  void *n = ta_realloc(NULL, 32);
  assert_non_null(n);
  assert_int_equal(ta_block_tag(n), R);
  assert_int_equal(ta_block_size(n), 32);
  void *n2 = ta_realloc_tag(T, NULL, 24);
  assert_int_equal(ta_block_tag(n2), T);
  void *n3 = ta_realloc_tag(R, n2, 48);          /* not NULL: keeps n2's tag */
  assert_int_equal(ta_block_tag(n3), T);
  assert_int_equal(ta_since(m2, R).allocs, 1);
  assert_int_equal(ta_since(m2, T).allocs, 2);
  assert_int_equal(ta_since(m2, TA_ANY).allocs, 3);

  /* realloc(p, 0) frees p and returns NULL. */
  assert_null(ta_realloc(r, 0));
  assert_int_equal(ta_block_size(r), 0);
  ta_free(n);
  ta_free(n3);
  c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, 6);
  assert_int_equal(c.frees, 6);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* Leaks mode keeps a realloc within the block's size class in place:
 * the record says the new size, the counts say a free of the old size and
 * an allocation of the new one, the pad moves to the new end (a write past
 * it is an overflow at the free, one past the old end after a grow is
 * not), and a size in another class still moves. */
static int overflow_of(const ta_finding *f, void *arg) {
  if (strcmp(f->kind, "heap.overflow") == 0) *(ta_finding *)arg = *f;
  return 0;
}

static void test_realloc_in_place(void **state) {
  (void)state;
  int was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_LEAKS;
  ta_tag T = ta_tag_get("alloc.realloc-in-place");
  ta_mark m = ta_mark_now();
  unsigned char *p = ta_alloc(T, 100);               /* class 112: pad 100..111 */
  for (int i = 0; i < 100; i++) p[i] = (unsigned char)i;

  unsigned char *q = ta_realloc(p, 108);             /* grows in its class: stays */
  assert_ptr_equal(q, p);
  assert_int_equal(ta_block_size(q), 108);
  assert_int_equal(ta_usable_size(q), 108);
  assert_int_equal(ta_block_tag(q), T);
  for (int i = 0; i < 100; i++) assert_int_equal(q[i], i);
  for (int i = 108; i < 112; i++) assert_int_equal(q[i], 0xDE);   /* the pad, moved */
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 2);
  assert_int_equal(c.frees, 1);
  assert_int_equal(c.peak_bytes, 108);               /* never both sizes at once */
  assert_int_equal(c.live_blocks, 1);
  assert_int_equal(c.live_bytes, 108);
  for (int i = 100; i < 108; i++) q[i] = 7;          /* the old pad is the block's now */

  unsigned char *r = ta_realloc(q, 97);              /* shrinks in its class: stays */
  assert_ptr_equal(r, p);
  assert_int_equal(ta_block_size(r), 97);
  for (int i = 0; i < 97; i++) assert_int_equal(r[i], i);
  for (int i = 97; i < 112; i++) assert_int_equal(r[i], 0xDE);    /* pad over the old bytes */
  c = ta_since(m, T);
  assert_int_equal(c.allocs, 3);
  assert_int_equal(c.frees, 2);
  assert_int_equal(c.live_blocks, 1);
  assert_int_equal(c.live_bytes, 97);
  assert_int_equal(ta_findings_count(NULL), 0);

  r[97] = 0x42;                                      /* one past the new end */
  ta_free(r);
  assert_int_equal(ta_findings_count("heap.overflow"), 1);
  ta_finding f = { 0 };
  ta_findings_visit(overflow_of, &f);
  assert_int_equal(f.addr, (uintptr_t)p);
  assert_int_equal(f.bytes, 97);
  assert_string_equal(f.detail, "wrote 1 byte(s) past the end of the 97-byte block: offsets 97..97, first 0x42");
  c = ta_since(m, T);
  assert_int_equal(c.frees, 3);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  ta_findings_clear();

  /* a large class (20480 bytes) too, without asking jemalloc */
  unsigned char *big = ta_alloc(T, 20000);
  big[19999] = 9;
  unsigned char *big2 = ta_realloc(big, 20400);
  assert_ptr_equal(big2, big);
  assert_int_equal(ta_block_size(big2), 20400);
  assert_int_equal(big2[19999], 9);
  for (int i = 20400; i < 20416; i++) assert_int_equal(big2[i], 0xDE);
  ta_free(big2);
  assert_int_equal(ta_findings_count(NULL), 0);

  /* another class: moves, as in the other modes */
  unsigned char *s = ta_alloc(T, 40);
  unsigned char *u = ta_realloc(s, 200);
  assert_ptr_not_equal(u, s);
  assert_int_equal(ta_block_size(u), 200);
  assert_int_equal(ta_block_size(s), 0);
  /* a written pad is not moved: the move's free reports it */
  u[200] = 1;
  unsigned char *v = ta_realloc(u, 201);
  assert_ptr_not_equal(v, u);
  assert_int_equal(ta_findings_count("heap.overflow"), 1);
  ta_free(v);
  c = ta_since(m, T);
  assert_int_equal(c.allocs, 8);
  assert_int_equal(c.frees, 8);
  assert_int_equal(c.live_bytes, 0);
  ta_findings_clear();

  /* in full mode the same realloc moves */
  _ta_opt.check = TA_CHECK_FULL;
  unsigned char *w = ta_alloc(T, 100);
  unsigned char *x = ta_realloc(w, 108);
  assert_ptr_not_equal(x, w);
  ta_free(x);
  _ta_opt.check = was;
}

/* A free without a stack (leaks mode) that finds the pad written changes
 * nothing: the record, put back after its removal, is there for the free
 * that comes back with a stack, which reports the overflow and frees; a
 * clean one frees at once.  Blocks that share a shard's probe run with it
 * stay where a lookup finds them. */
static void test_quiet_free_pad(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.quiet-free");
  ta_mark m = ta_mark_now();
  enum { N = 64 };
  unsigned char *v[N];
  for (int i = 0; i < N; i++) v[i] = ta_alloc(T, 40);   /* class 48: pad 40..47 */
  uint32_t here = ta_stack_here();
  for (int i = 0; i < N; i += 2) {
    v[i][44] = 0x55;                                     /* inside the pad */
    assert_false(_ta_free_quiet(v[i]));
    assert_int_equal(ta_block_size(v[i]), 40);          /* still live, as it was */
    assert_int_equal(ta_block_tag(v[i]), T);
  }
  for (int i = 1; i < N; i += 2) assert_true(_ta_free_quiet(v[i]));
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.frees, N / 2);
  assert_int_equal(c.live_blocks, N / 2);
  assert_int_equal(c.live_bytes, 40 * N / 2);
  assert_int_equal(ta_findings_count(NULL), 0);
  for (int i = 0; i < N; i += 2) {
    assert_int_equal(ta_block_size(v[i]), 40);
    assert_true(_ta_free_at(v[i], here));
  }
  assert_int_equal(ta_findings_count("heap.overflow"), N / 2);
  assert_int_equal(ta_findings_count(NULL), N / 2);
  c = ta_since(m, T);
  assert_int_equal(c.frees, N);
  assert_int_equal(c.live_blocks, 0);
  ta_findings_clear();
}

/* Leaks mode's own free (block_free_plain): a block with no flag, found,
 * pad intact, freed from the table's words straight into the recent
 * frees.  Everything else goes the general way with nothing changed: a
 * written pad (the record put back among its probe run's neighbours, then
 * the free with a stack reports it), a flagged block, a bad free.  A
 * second free of a block it freed is free.double with the record it wrote
 * (size, tag, allocation stack); an interior pointer is free.invalid. */
static int finding_of(const ta_finding *f, void *arg) {
  ta_finding *want = arg;
  if (strcmp(f->kind, want->kind) == 0) *want = *f;
  return 0;
}

static void test_plain_free(void **state) {
  (void)state;
  int was = _ta_opt.check;
  _ta_opt.check = TA_CHECK_LEAKS;
  ta_tag T = ta_tag_get("alloc.plain-free");
  ta_mark m = ta_mark_now();
  enum { N = 64 };
  unsigned char *v[N];
  uint32_t born[N];
  for (int i = 0; i < N; i++) {
    v[i] = ta_alloc(T, 40);                              /* class 48: pad 40..47 */
    ta_block b;
    assert_true(_ta_block_live((uintptr_t)v[i], &b));
    born[i] = b.stack;
  }
  uint32_t here = ta_stack_here();
  for (int i = 0; i < N; i += 2) {
    v[i][47] = 0x55;                                     /* the pad's last byte */
    assert_false(_ta_free_quiet(v[i]));
    assert_int_equal(ta_block_size(v[i]), 40);          /* put back, found */
  }
  for (int i = 1; i < N; i += 2) assert_true(_ta_free_quiet(v[i]));
  for (int i = 1; i < N; i += 2) assert_int_equal(ta_block_size(v[i]), 0);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, N);
  assert_int_equal(c.frees, N / 2);
  assert_int_equal(c.live_blocks, N / 2);
  assert_int_equal(c.live_bytes, 40 * N / 2);
  assert_int_equal(c.peak_bytes, 40 * N);
  assert_int_equal(ta_findings_count(NULL), 0);
  for (int i = 0; i < N; i += 2) {
    assert_int_equal(ta_block_tag(v[i]), T);
    assert_true(_ta_free_at(v[i], here));
  }
  assert_int_equal(ta_findings_count("heap.overflow"), N / 2);
  ta_finding f = { .kind = "heap.overflow" };
  ta_findings_visit(finding_of, &f);
  assert_int_equal(f.stack, here);                      /* found at the free, named by it */
  assert_string_equal(f.detail, "wrote 1 byte(s) past the end of the 40-byte block: offsets 47..47, first 0x55");
  ta_findings_clear();

  /* a second free of a block the plain path freed: the recent frees' record */
  ta_free(v[N - 1]);
  assert_int_equal(ta_findings_count("free.double"), 1);
  f = (ta_finding){ .kind = "free.double" };
  ta_findings_visit(finding_of, &f);
  assert_int_equal(f.addr, (uintptr_t)v[N - 1]);
  assert_int_equal(f.bytes, 40);
  assert_int_equal(f.tag, T);
  assert_int_equal(f.alloc_stack, born[N - 1]);
  assert_int_not_equal(f.alloc_stack, 0);
  ta_findings_clear();

  /* a realloc that moves frees the old block with its own stack, which a
   * second free of the old block shows as the free stack */
  unsigned char *x = ta_alloc(T, 40);
  ta_block xb;
  assert_true(_ta_block_live((uintptr_t)x, &xb));
  unsigned char *y = ta_realloc(x, 400);
  assert_ptr_not_equal(y, x);
  ta_free(x);
  assert_int_equal(ta_findings_count("free.double"), 1);
  f = (ta_finding){ .kind = "free.double" };
  ta_findings_visit(finding_of, &f);
  assert_int_equal(f.addr, (uintptr_t)x);
  assert_int_equal(f.bytes, 40);
  assert_int_equal(f.alloc_stack, xb.stack);
  assert_int_not_equal(f.free_stack, 0);
  assert_int_not_equal(f.free_stack, xb.stack);
  ta_free(y);
  ta_findings_clear();

  /* an interior pointer: the general path's report, the block unchanged */
  unsigned char *w = ta_alloc(T, 100);
  ta_free(w + 16);
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  f = (ta_finding){ .kind = "free.invalid" };
  ta_findings_visit(finding_of, &f);
  assert_string_equal(f.detail, "interior pointer at offset 16 of a 100-byte live block");
  assert_int_equal(ta_block_size(w), 100);
  ta_free(w);
  c = ta_since(m, T);
  assert_int_equal(c.frees, N + 3);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  ta_findings_clear();
  _ta_opt.check = was;
}

static void test_aligned(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.aligned");
  for (size_t align = 1; align <= 8192; align *= 2) {
    void *p = ta_aligned(T, align, 40);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % align, 0);
    assert_int_equal(ta_block_size(p), 40);
    assert_int_equal(ta_block_tag(p), T);
    assert_true(ta_usable_size(p) >= 40);
    ta_free(p);
  }
  ta_error_handler(on_error, NULL);
  ta_mark m = ta_mark_now();
  assert_null(ta_aligned(T, 48, 40));
  assert_int_equal(last_code, TA_EINVAL);
  assert_null(ta_aligned(T, 0, 40));
  assert_null(ta_aligned(T, 3, 40));
  assert_null(ta_aligned(T, ((size_t)1 << 20) + 1, 40));
  assert_int_equal(n_errors, 4);
  ta_error_handler(NULL, NULL);
  assert_int_equal(ta_since(m, TA_ANY).allocs, 0);
}

/* ---- tags ---------------------------------------------------------------------- */

static void test_tags(void **state) {
  (void)state;
  char name[32] = "tag.one";
  ta_tag a = ta_tag_get(name);
  assert_int_not_equal(a, TA_ANY);
  strcpy(name, "tag.XXX");                       /* the name was copied */
  assert_string_equal(ta_tag_name(a), "tag.one");
  assert_int_equal(ta_tag_get("tag.one"), a);
  ta_tag b = ta_tag_get("tag.two");
  assert_int_not_equal(b, a);
  assert_int_not_equal(b, TA_ANY);
  assert_int_equal(ta_tag_get("tag.two"), b);
  assert_string_equal(ta_tag_name(b), "tag.two");
  assert_string_equal(ta_tag_name(TA_MAX_TAGS + 7), "?");

  ta_error_handler(on_error, NULL);
  assert_int_equal(ta_tag_get(NULL), TA_ANY);
  assert_int_equal(last_code, TA_EINVAL);
  assert_int_equal(ta_tag_get(""), TA_ANY);
  assert_int_equal(n_errors, 2);
  ta_error_handler(NULL, NULL);

  /* An unknown tag number allocates as TA_ANY rather than out of range. */
  void *p = ta_alloc(TA_MAX_TAGS - 1, 8);
  assert_non_null(p);
  assert_int_equal(ta_block_tag(p), TA_ANY);
  ta_free(p);
}

/* ---- counts ---------------------------------------------------------------------- */

static void test_counts_scripted(void **state) {
  (void)state;
  ta_tag A = ta_tag_get("count.A"), B = ta_tag_get("count.B");
  uint64_t live0 = ta_summary_get().live_bytes;  /* whatever else is live (nothing, normally) */

  void *pre = ta_alloc(A, 1000);                 /* made before the mark */
  ta_mark m = ta_mark_now();
  void *a1 = ta_alloc(A, 100);                   /* A live: 1100 */
  void *a2 = ta_alloc(A, 200);                   /*         1300 */
  void *b1 = ta_alloc(B, 50);                    /* all:    1350 (+live0) */
  ta_free(pre);                                  /* A: 300  all: 350 */
  void *a3 = ta_alloc(A, 300);                   /* A: 600  all: 650 */
  ta_free(a1);                                   /* A: 500  all: 550 */
  ta_free(b1);                                   /*         all: 500 */

  ta_counts c = ta_since(m, A);
  assert_int_equal(c.allocs, 3);
  assert_int_equal(c.frees, 2);                  /* pre was made before the mark: counted */
  assert_int_equal(c.live_blocks, 2);
  assert_int_equal(c.live_bytes, 500);
  assert_int_equal(c.peak_bytes, 1300);          /* pre counts toward the tag's peak */

  c = ta_since(m, B);
  assert_int_equal(c.allocs, 1);
  assert_int_equal(c.frees, 1);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(c.peak_bytes, 50);

  c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, 4);
  assert_int_equal(c.frees, 3);
  assert_int_equal(c.live_blocks, 2);
  assert_int_equal(c.live_bytes, 500);
  assert_int_equal(c.peak_bytes, live0 + 1350);

  /* A later mark: its own counts; the earlier mark's peak spans both. */
  ta_mark m2 = ta_mark_now();
  void *big = ta_alloc(A, 5000);                 /* A: 5500 */
  ta_free(big);                                  /* A: 500 */
  c = ta_since(m2, A);
  assert_int_equal(c.allocs, 1);
  assert_int_equal(c.frees, 1);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(c.peak_bytes, 5500);
  assert_int_equal(ta_since(m, A).peak_bytes, 5500);
  assert_int_equal(ta_since(m, A).allocs, 4);

  ta_mark m3 = ta_mark_now();                    /* after the peak: the level now */
  assert_int_equal(ta_since(m3, A).peak_bytes, 500);
  assert_int_equal(ta_since(m2, A).peak_bytes, 5500);
  assert_int_equal(ta_since(m, A).peak_bytes, 5500);
  assert_int_equal(ta_since(m, B).peak_bytes, 50);

  ta_free(a2);
  ta_free(a3);
  c = ta_since(m, A);
  assert_int_equal(c.allocs, 4);
  assert_int_equal(c.frees, 5);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);

  /* A mark that does not exist: zeros and TA_EINVAL. */
  ta_error_handler(on_error, NULL);
  c = ta_since(m3 + 1000, A);
  assert_int_equal(c.allocs, 0);
  assert_int_equal(c.peak_bytes, 0);
  assert_int_equal(last_code, TA_EINVAL);
  ta_error_handler(NULL, NULL);
}

/* ta_mark_free: a freed mark's interval still counts toward the peak of an
 * older mark; the freed mark is an error for ta_since and a second free;
 * a loop that marks, checks and frees each iteration keeps no records. */
static void test_mark_free(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("markfree");
  size_t kept0 = _ta_marks_kept();
  ta_mark m = ta_mark_now();
  ta_free(ta_alloc(T, 5000));
  ta_mark m2 = ta_mark_now();
  ta_mark_free(m2);                              /* its interval is still open */
  ta_free(ta_alloc(T, 7000));                    /* the peak, inside m2's interval */
  ta_mark m3 = ta_mark_now();                    /* closes it: folded into m's */
  ta_free(ta_alloc(T, 100));
  assert_int_equal(ta_since(m, T).peak_bytes, 7000);
  assert_int_equal(ta_since(m, T).allocs, 3);
  assert_int_equal(ta_since(m3, T).peak_bytes, 100);

  ta_error_handler(on_error, NULL);
  last_code = 0;
  assert_int_equal(ta_since(m2, T).allocs, 0);
  assert_int_equal(last_code, TA_EINVAL);
  last_code = 0;
  ta_mark_free(m2);
  assert_int_equal(last_code, TA_EINVAL);
  ta_error_handler(NULL, NULL);

  ta_mark_free(m);
  ta_mark_free(m3);
  for (size_t i = 0; i < 10000; i++) {
    ta_mark k = ta_mark_now();
    void *p = ta_alloc(T, 64);
    assert_int_equal(ta_since(k, T).live_blocks, 1);
    ta_free(p);
    ta_mark_free(k);
  }
  assert_true(_ta_marks_kept() <= kept0 + 1);    /* the last one's interval stays open */
}

typedef struct { size_t n, bytes; } live_acc;

static void count_live(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  (void)p;
  (void)tag;
  live_acc *a = arg;
  a->n++;
  a->bytes += size;
  assert_int_not_equal(stack, 0);
}

/* 10,000 iterations of alloc+free, exact at every step; every 7th block
 * stays live, so the number made since the mark soon exceeds the ledger's
 * per-thread ring of recent births and ta_since must still be exact. */
static void test_since_loop(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("loop");
  enum { N = 10000 };
  static void *kept[N / 7 + 1];
  size_t nkept = 0;
  uint64_t kept_bytes = 0;
  ta_mark m = ta_mark_now();
  for (size_t i = 0; i < N; i++) {
    size_t size = i % 100 + 1;
    void *p = ta_alloc(T, size);
    assert_non_null(p);
    ta_counts c = ta_since(m, T);
    assert_int_equal(c.allocs, i + 1);
    assert_int_equal(c.live_blocks, nkept + 1);
    assert_int_equal(c.live_bytes, kept_bytes + size);
    if (i % 7 == 0) {
      kept[nkept++] = p;
      kept_bytes += size;
    } else {
      ta_free(p);
    }
    c = ta_since(m, T);
    assert_int_equal(c.frees, i + 1 - nkept);
    assert_int_equal(c.live_blocks, nkept);
    assert_int_equal(c.live_bytes, kept_bytes);
  }
  assert_int_equal(nkept, 1429);
  TA_ASSERT_LIVE_SINCE(m, T, 1429);
  TA_ASSERT_ALLOCS_SINCE(m, T, N);
  for (size_t i = 0; i < nkept; i++) ta_free(kept[i]);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, N);
  assert_int_equal(c.frees, N);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

/* ta_live_since visits each live block made since the mark once, also when
 * more blocks were made since the mark than the per-thread ring of recent
 * births holds (4096), and ta_print_live_since counts the same. */
static void test_live_since_visits_once(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("live.since");
  enum { N = 5000 };
  static void *kept[N];
  uint64_t bytes = 0;
  ta_mark m = ta_mark_now();
  for (size_t i = 0; i < N; i++) {
    kept[i] = ta_alloc(T, i % 50 + 1);
    bytes += i % 50 + 1;
  }
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.live_blocks, N);
  assert_int_equal(c.live_bytes, bytes);
  live_acc acc = { 0, 0 };
  ta_live_since(m, T, count_live, &acc);
  size_t printed = ta_print_live_since(m, T, 0);  /* counts, prints none */
  for (size_t i = 0; i < N; i++) ta_free(kept[i]);
  assert_int_equal(acc.n, N);
  assert_int_equal(acc.bytes, bytes);
  assert_int_equal(printed, N);

  /* Fewer than the ring holds: the same. */
  ta_mark m2 = ta_mark_now();
  for (size_t i = 0; i < 100; i++) kept[i] = ta_alloc(T, 8);
  acc = (live_acc){ 0, 0 };
  ta_live_since(m2, T, count_live, &acc);
  for (size_t i = 0; i < 100; i++) ta_free(kept[i]);
  assert_int_equal(acc.n, 100);
  assert_int_equal(acc.bytes, 800);
}

/* ---- assertion macros --------------------------------------------------------- */

__attribute__((noinline)) static void do_double_free(void *p) {
  ta_free(p);
  ta_free(p);
  __asm__ volatile("" ::: "memory");
}

/* ---- the live table --------------------------------------------------------- */

/* 50,000 small blocks of four sizes, allocated in turn, as an interpreter
 * makes its objects: slabs of consecutive blocks of each size.  Every
 * record sits in the table, the table is at most three quarters full, and
 * a record sits on average less than one slot past its home slot (a find
 * probes less than two): 0.2 here.  A home slot taken from the low bits
 * of a product of the address put them 1.9 slots past it; 0.92 slots
 * hashed by the address over 8, 0.39 to 0.47 over 16. */
#define SHAPE_BLOCKS 50000

static void test_table_shape(void **state) {
  (void)state;
  static const size_t sizes[] = { 24, 48, 64, 96 };
  ta_tag T = ta_tag_get("alloc.shape");
  void **v = malloc(SHAPE_BLOCKS * sizeof *v);
  assert_non_null(v);
  uint64_t r0, n0, d0;
  _ta_table_shape(&r0, &n0, &d0);
  for (size_t i = 0; i < SHAPE_BLOCKS; i++) assert_non_null(v[i] = ta_alloc(T, sizes[i % 4]));
  uint64_t records, slots, displaced;
  _ta_table_shape(&records, &slots, &displaced);
  printf("table: %llu records in %llu slots, %.2f slots past home on average\n",
         (unsigned long long)records, (unsigned long long)slots, (double)displaced / (double)records);
  assert_int_equal(records, r0 + SHAPE_BLOCKS);
  assert_true(records * 4 <= slots * 3);
  /* growing by 3/2 and 4/3 in turn, more than 0.55 full (0.62 here);
   * doubling left it 0.51 full */
  assert_true(records * 20 > slots * 11);
  assert_true(displaced < records);
  for (size_t i = 0; i < SHAPE_BLOCKS; i++) ta_free(v[i]);
  _ta_table_shape(&records, &slots, &displaced);
  assert_int_equal(records, r0);
  free(v);
}

/* A growing shard gives its old table's pages back: after a growth
 * from 12,288 slots (288 KiB, copied in steps of 64 KiB), not one whole
 * page of the old table is resident (mincore), where the copy had read
 * every page (a page read is resident, if only as the zero page); and
 * every record is still found in the new table. */
#define GIVE_BLOCKS 64

static void test_table_growth_gives_back(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.give");
  void *v[GIVE_BLOCKS];
  v[0] = ta_alloc(T, 32);
  assert_non_null(v[0]);
  shard *s = shard_of((uintptr_t)v[0]);
  size_t n = 1;
  for (size_t tries = 0; n < GIVE_BLOCKS && tries < 1000000; tries++) {   /* blocks of the same shard */
    void *p = ta_alloc(T, 32);
    assert_non_null(p);
    if (shard_of((uintptr_t)p) == s) v[n++] = p;
    else ta_free(p);
  }
  assert_int_equal(n, GIVE_BLOCKS);
  shard_lock(s);
  while (s->cap < 12288) assert_true(_ta_live_grow(s));
  assert_int_equal(s->cap, 12288);
  const ta_slot *old = s->slots;
  uintptr_t lo = ((uintptr_t)old + 4095) & ~(uintptr_t)4095;
  uintptr_t hi = ((uintptr_t)old + 12288 * sizeof(ta_slot)) & ~(uintptr_t)4095;
  size_t pages = (hi - lo) / 4096;
  assert_true(pages >= 71 && pages <= 72);
  assert_true(_ta_live_grow(s));                        /* its copy reads every page of the old table */
  assert_int_equal(s->cap, 16384);
  unsigned char core[72];
  assert_int_equal(mincore((void *)lo, hi - lo, core), 0);
  size_t resident = 0;
  for (size_t i = 0; i < pages; i++) resident += core[i] & 1;
  shard_unlock(s);
  assert_int_equal(resident, 0);
  for (size_t i = 0; i < GIVE_BLOCKS; i++) {
    assert_int_equal(ta_block_size(v[i]), 32);
    ta_free(v[i]);
    assert_int_equal(ta_block_size(v[i]), 0);
  }
}

/* A table record (live.h) keeps every field at its extremes and in
 * between, and a new birth or a flag changes only its own fields. */
static void test_table_record_fields(void **state) {
  (void)state;
  static const struct { uintptr_t addr; uint64_t size, seq; ta_tag tag; uint8_t flags; uint32_t stack; } cases[] = {
    { 8, 0, 0, 0, 0, 0 },
    { 0xFFFFFFFFFFF8u, (UINT64_C(1) << 48) - 1, (UINT64_C(1) << 56) - 1, 255, 7, UINT32_MAX },
    { 0x7f12345678a0u, 0x123456789ABCu, 0x00ABCDEF01234567u, 0x5A, TA_F_HOLD, 0x89ABCDEFu },
    { 0x555500001230u, 24, UINT64_C(1) << 32, 1, TA_F_ARENA, 1 },
    { 0x10, 1, (UINT64_C(1) << 48) | 1, 128, TA_F_REF, 1u << 31 },
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ta_slot r;
    ta_block b;
    memset(&r, 0xA5, sizeof r);
    slot_set(&r, cases[i].addr, cases[i].size, cases[i].tag, cases[i].seq, cases[i].flags, cases[i].stack);
    assert_false(slot_empty(&r));
    slot_load(&r, &b);
    assert_int_equal(b.addr, cases[i].addr);
    assert_int_equal(b.size, cases[i].size);
    assert_int_equal(b.seq, cases[i].seq);
    assert_int_equal(b.tag, cases[i].tag);
    assert_int_equal(b.flags, cases[i].flags);
    assert_int_equal(b.stack, cases[i].stack);
    assert_int_equal(b.state, TA_LIVE);
    assert_int_equal(b.free_stack, 0);
    ta_slot copy;
    slot_store(&copy, &b);
    assert_memory_equal(&copy, &r, sizeof r);
    slot_rebirth(&r, cases[i].size ^ 0x5555, cases[i].seq ^ UINT64_C(0x00F0F0F0F0F0F0F0), ~cases[i].stack);
    slot_set_flags(&r, (uint8_t)(cases[i].flags ^ 7));
    slot_load(&r, &b);
    assert_int_equal(b.addr, cases[i].addr);
    assert_int_equal(b.size, cases[i].size ^ 0x5555);
    assert_int_equal(b.seq, cases[i].seq ^ UINT64_C(0x00F0F0F0F0F0F0F0));
    assert_int_equal(b.tag, cases[i].tag);
    assert_int_equal(b.flags, cases[i].flags ^ 7);
    assert_int_equal(b.stack, ~cases[i].stack);
  }
  assert_false(slot_key_ok(0));
  assert_false(slot_key_ok(0x1004));                    /* not 8-byte aligned */
  assert_false(slot_key_ok(UINT64_C(1) << 48));         /* above 2^48 */
  assert_true(slot_key_ok(0x1008));
}

/* An address inside a block, within the 8 bytes its key stands for, is
 * not the block: no size, no tag, and freeing it is free.invalid. */
static void test_table_interior_not_block(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("alloc.interior");
  char *p = ta_alloc(T, 64);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p & 7, 0);
  assert_int_equal(ta_block_size(p), 64);
  for (int off = 1; off < 8; off++) {
    assert_int_equal(ta_block_size(p + off), 0);
    assert_int_equal(ta_block_tag(p + off), TA_ANY);
  }
  assert_int_equal(ta_findings_count("free.invalid"), 0);
  ta_free(p + 4);
  assert_int_equal(ta_findings_count("free.invalid"), 1);
  assert_int_equal(ta_block_size(p), 64);             /* still live */
  ta_free(p);
  assert_int_equal(ta_block_size(p), 0);
}

/* An arena of a tag never registered: its blocks count as TA_ANY, as
 * ta_alloc's do (a table record keeps 8 bits of tag, and the counts have
 * TA_MAX_TAGS rows). */
static void test_arena_unknown_tag(void **state) {
  (void)state;
  ta_arena *a = ta_arena_new((ta_tag)(TA_MAX_TAGS + 44), 4096);
  assert_non_null(a);
  ta_mark m = ta_mark_now();
  void *p = ta_arena_alloc(a, 40);
  assert_non_null(p);
  assert_int_equal(ta_block_tag(p), TA_ANY);
  assert_int_equal(ta_block_size(p), 40);
  ta_counts c = ta_since(m, TA_ANY);
  assert_int_equal(c.allocs, 1);
  assert_int_equal(c.live_bytes, 40);
  ta_arena_free(a);
  ta_mark_free(m);
}

static void test_assert_macros_pass(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("assert.pass");
  ta_mark m = ta_mark_now();
  TA_ASSERT_NO_LEAKS_SINCE(m);
  TA_ASSERT_ALLOCS_SINCE(m, T, 0);
  void *a = ta_alloc(T, 10), *b = ta_alloc(T, 20);
  TA_ASSERT_ALLOCS_SINCE(m, T, 2);
  TA_ASSERT_ALLOCS_SINCE(m, TA_ANY, 2);
  TA_ASSERT_LIVE_SINCE(m, T, 2);
  ta_free(a);
  TA_ASSERT_LIVE_SINCE(m, T, 1);
  TA_ASSERT_FINDINGS("free.double", 0);
  ta_error_handler(on_error, NULL);
  do_double_free(b);
  ta_error_handler(NULL, NULL);
  TA_ASSERT_FINDINGS("free.double", 1);
  TA_ASSERT_FINDINGS(NULL, 1);
  TA_ASSERT_LIVE_SINCE(m, T, 0);
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

/* Each runs in a forked child and must abort with the message given. */
static void fail_no_leaks(void *arg) {
  (void)arg;
  ta_mark m = ta_mark_now();
  void *volatile p = ta_alloc(ta_tag_get("assert.fail"), 24);
  (void)p;
  TA_ASSERT_NO_LEAKS_SINCE(m);
}

static void fail_allocs(void *arg) {
  (void)arg;
  ta_tag T = ta_tag_get("assert.fail");
  ta_mark m = ta_mark_now();
  ta_free(ta_alloc(T, 1));
  TA_ASSERT_ALLOCS_SINCE(m, T, 2);
}

static void fail_live(void *arg) {
  (void)arg;
  ta_tag T = ta_tag_get("assert.fail");
  ta_mark m = ta_mark_now();
  void *volatile p = ta_alloc(T, 8);
  void *volatile q = ta_alloc(T, 8);
  (void)p;
  (void)q;
  TA_ASSERT_LIVE_SINCE(m, T, 1);
}

static void fail_findings(void *arg) {
  (void)arg;
  TA_ASSERT_FINDINGS("free.double", 1);
}

typedef struct { void (*fn)(void *); const char *message; } failing_case;

static void test_assert_macros_abort(void **state) {
  (void)state;
  static const failing_case cases[] = {
    { fail_no_leaks, "tagalloc assertion failed: live blocks since mark [tag any]: got 1, expected 0\n"
                     "  live: 24 bytes at " },
    { fail_allocs,   "tagalloc assertion failed: allocations since mark [tag assert.fail]: got 1, expected 2\n" },
    { fail_live,     "tagalloc assertion failed: live blocks since mark [tag assert.fail]: got 2, expected 1\n" },
    { fail_findings, "tagalloc assertion failed: findings of \"free.double\" [tag any]: got 0, expected 1\n" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    child_result r;
    child_fork(cases[i].fn, NULL, &r);
    if (!WIFSIGNALED(r.status) || WTERMSIG(r.status) != SIGABRT || !strstr(r.err, cases[i].message))
      child_dump(&r);
    assert_true(WIFSIGNALED(r.status));
    assert_int_equal(WTERMSIG(r.status), SIGABRT);
    assert_non_null(strstr(r.err, cases[i].message));
    assert_non_null(strstr(r.err, "test_alloc.c:"));
    child_result_free(&r);
  }
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup(test_alloc_basic, setup),
    cmocka_unit_test_setup(test_calloc_zeroed, setup),
    cmocka_unit_test_setup(test_realloc_moves, setup),
    cmocka_unit_test_setup(test_realloc_in_place, setup),
    cmocka_unit_test_setup(test_quiet_free_pad, setup),
    cmocka_unit_test_setup(test_plain_free, setup),
    cmocka_unit_test_setup(test_aligned, setup),
    cmocka_unit_test_setup(test_tags, setup),
    cmocka_unit_test_setup(test_counts_scripted, setup),
    cmocka_unit_test_setup(test_mark_free, setup),
    cmocka_unit_test_setup(test_since_loop, setup),
    cmocka_unit_test_setup(test_live_since_visits_once, setup),
    cmocka_unit_test_setup(test_table_shape, setup),
    cmocka_unit_test_setup(test_table_growth_gives_back, setup),
    cmocka_unit_test_setup(test_table_record_fields, setup),
    cmocka_unit_test_setup(test_table_interior_not_block, setup),
    cmocka_unit_test_setup(test_arena_unknown_tag, setup),
    cmocka_unit_test_setup(test_assert_macros_pass, setup),
    cmocka_unit_test_setup(test_assert_macros_abort, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
