/* test_guard.c - guard mode (TAGALLOC_GUARD=1, alloc/guard.c): small blocks
 * on pages of their own.  A read and a write after free are each reported
 * at once, at the faulting instruction (frame #0: the function that did the
 * access), with the alloc and free stacks, and the program goes on; so is
 * an access one byte past the end of a block's page (heap.overflow), and a
 * write into the slack between a block and its page's end (at the free).
 * A double free is still found; blocks over 4096 bytes work (one in
 * TAGALLOC_GUARD_SAMPLE is guarded in a big slot); 10,000 alloc/free cycles
 * recycle the slots; counts since a mark are the same as without guard
 * mode; a fault outside the guarded regions still kills the process.
 *
 * cmocka installs its own SIGSEGV handler around each test, over the
 * ledger's: each test's first line puts the ledger's back (a program that
 * replaces the handler takes guard mode's faults away: see alloc/guard.c).
 *
 * Under ASan the faults still reach the ledger's handler (ASan allows
 * other SIGSEGV handlers, and the guarded regions are plain mmap memory,
 * whose shadow says addressable), so the test runs there too. */
#include "harness.h"
#include "child.h"
#include "support.h"
#include "procmaps.h"
#include "report.h"

#include <valgrind/valgrind.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The ledger's internals this test looks at (alloc/internal.h). */
bool _ta_guard_owns(uintptr_t addr);

static report_ctx *ctx;
static ta_tag T;
static struct sigaction ledger_segv, ledger_bus;
static unsigned char poison;

static const char *frame0(uint32_t stack) { return stack_frame0(ctx, stack); }

/* cmocka puts its handler in place around each test (and each setup): the
 * test's first line puts the ledger's back. */
static void ledger_handler(void) {
  sigaction(SIGSEGV, &ledger_segv, NULL);
  sigaction(SIGBUS, &ledger_bus, NULL);
}

/* The finding of kind whose frame #0 is fn. */
typedef struct { const char *kind, *fn; int found; ta_finding f; } find_fn_arg;

static int find_fn(const ta_finding *f, void *arg) {
  find_fn_arg *a = arg;
  if (strcmp(f->kind, a->kind) != 0 || strcmp(frame0(f->stack), a->fn) != 0) return 0;
  a->found = 1;
  a->f = *f;
  a->f.slot = NULL;
  a->f.history = NULL;
  return 1;
}

static ta_finding finding_at(const char *kind, const char *fn) {
  find_fn_arg a = { .kind = kind, .fn = fn };
  ta_findings_visit(find_fn, &a);
  if (!a.found) fail_msg("no %s finding with frame #0 in %s", kind, fn);
  return a.f;
}

/* ---- the program's functions ------------------------------------------------ */

NOIPA static unsigned char *make_block(size_t size) {
  unsigned char *p = ta_alloc(T, size);
  KEEP();
  return p;
}

NOIPA static void free_block(void *p) {
  ta_free(p);
  KEEP();
}

NOIPA static void free_again(void *p) {
  ta_free(p);
  KEEP();
}

NOIPA static unsigned char read_after_free(const unsigned char *p, size_t i) {
  return ((const volatile unsigned char *)p)[i];
}

NOIPA static void write_after_free(unsigned char *p, size_t i) {
  ((volatile unsigned char *)p)[i] = 0x41;
}

NOIPA static void write_past_end(unsigned char *p, size_t i) {
  ((volatile unsigned char *)p)[i] = 0x42;
}

NOIPA static unsigned char read_big_after_free(const unsigned char *p, size_t i) {
  return ((const volatile unsigned char *)p)[i];
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_read_after_free(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *p = make_block(64);
  assert_true(_ta_guard_owns((uintptr_t)p));
  assert_int_equal(((uintptr_t)p + 64) % 4096, 0);       /* at the end of its page */
  memset(p, 7, 64);
  free_block(p);
  assert_int_equal(ta_findings_count("use.after-free"), 0);
  unsigned char v = read_after_free(p, 5);
  assert_int_equal(ta_findings_count("use.after-free"), 1);   /* at once */
  assert_int_equal(v, poison);                               /* the page came back full of poison */
  assert_int_equal(n_messages, 1);
  assert_non_null(strstr(messages[0], "use.after-free at 0x"));
  assert_non_null(strstr(messages[0], "a read at offset 5 of the freed 64-byte block"));
  ta_finding f = finding_at("use.after-free", "read_after_free");
  assert_int_equal(f.bytes, 64);
  assert_int_equal(f.tag, T);
  assert_int_equal(f.addr, (uintptr_t)p);
  assert_string_equal(frame0(f.alloc_stack), "make_block");
  assert_string_equal(frame0(f.free_stack), "free_block");
  uintptr_t pcs[TA_MAX_DEPTH];
  assert_true(ta_stack_frames(f.stack, pcs, TA_MAX_DEPTH) >= 2);
  assert_string_equal(function_at(ctx, pcs[1]), "test_read_after_free");
  /* The program goes on; a second read of the opened page is not a fault. */
  assert_int_equal(read_after_free(p, 6), poison);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
}

static void test_write_after_free(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *p = make_block(100);
  assert_true(_ta_guard_owns((uintptr_t)p));
  free_block(p);
  write_after_free(p, 99);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  assert_int_equal(p[99], 0x41);                             /* the write went through */
  ta_finding f = finding_at("use.after-free", "write_after_free");
  assert_int_equal(f.bytes, 100);
  assert_non_null(strstr(f.detail, "a write at offset 99"));
  assert_string_equal(frame0(f.alloc_stack), "make_block");
  assert_string_equal(frame0(f.free_stack), "free_block");
  assert_int_equal(ta_findings_count(NULL), 1);
}

static void test_overflow_past_page_end(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *p = make_block(64);
  assert_true(_ta_guard_owns((uintptr_t)p));
  memset(p, 1, 64);                                          /* the whole block is fine */
  assert_int_equal(ta_findings_count(NULL), 0);
  write_past_end(p, 64);                                     /* the first byte of the guard page */
  assert_int_equal(ta_findings_count("heap.overflow"), 1);
  ta_finding f = finding_at("heap.overflow", "write_past_end");
  assert_int_equal(f.bytes, 64);
  assert_int_equal(f.addr, (uintptr_t)p);
  assert_non_null(strstr(f.detail, "a write 0 byte(s) past the end of the live 64-byte block"));
  assert_string_equal(frame0(f.alloc_stack), "make_block");
  assert_int_equal(f.free_stack, 0);
  free_block(p);
  assert_int_equal(ta_findings_count(NULL), 1);
}

static void test_overflow_into_slack(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *p = make_block(20);                         /* 12 bytes of slack before the guard page */
  assert_int_equal(((uintptr_t)p + 32) % 4096, 0);
  write_past_end(p, 20);                                     /* no fault: the slack is read-write */
  assert_int_equal(ta_findings_count(NULL), 0);
  free_block(p);                                             /* found here */
  assert_int_equal(ta_findings_count("heap.overflow"), 1);
  ta_finding f = finding_at("heap.overflow", "free_block");
  assert_string_equal(f.detail, "wrote 1 byte(s) past the end of the 20-byte block: offsets 20..20, first 0x42");
  assert_string_equal(frame0(f.alloc_stack), "make_block");
  assert_string_equal(frame0(f.free_stack), "free_block");   /* the text says "found at its free" */
}

static void test_double_free(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *p = make_block(48);
  assert_true(_ta_guard_owns((uintptr_t)p));
  free_block(p);
  free_again(p);
  assert_int_equal(ta_findings_count("free.double"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_finding f = the_finding("free.double");
  assert_string_equal(frame0(f.stack), "free_again");
  assert_string_equal(frame0(f.free_stack), "free_block");
  assert_string_equal(frame0(f.alloc_stack), "make_block");
}

static void test_big_blocks(void **state) {
  (void)state;
  ledger_handler();
  enum { N = 64, SIZE = 10000 };
  unsigned char *v[N];
  int guarded = 0;
  for (int i = 0; i < N; i++) {
    v[i] = ta_alloc(T, SIZE);
    assert_non_null(v[i]);
    guarded += _ta_guard_owns((uintptr_t)v[i]);
    memset(v[i], i, SIZE);
  }
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < SIZE; j += 997) assert_int_equal(v[i][j], (unsigned char)i);
    assert_int_equal(v[i][SIZE - 1], (unsigned char)i);
    assert_int_equal(ta_block_size(v[i]), SIZE);
    ta_free(v[i]);
  }
  assert_true(guarded > 0 && guarded < N);                   /* one in 4 (TAGALLOC_GUARD_SAMPLE) */
  unsigned char *huge = ta_alloc(T, 3 << 20);                /* over 1 MiB: jemalloc */
  assert_false(_ta_guard_owns((uintptr_t)huge));
  memset(huge, 3, 3 << 20);
  ta_free(huge);
  assert_int_equal(ta_findings_count(NULL), 0);
  /* A sampled big block, read after its free. */
  unsigned char *b = NULL;
  for (int i = 0; i < 16 && b == NULL; i++) {
    unsigned char *p = make_block(SIZE);
    if (_ta_guard_owns((uintptr_t)p)) b = p;
    else ta_free(p);
  }
  assert_non_null(b);
  assert_int_equal(((uintptr_t)b + SIZE + 15) / 16 * 16 % 4096, 0);
  free_block(b);
  assert_int_equal(read_big_after_free(b, 4321), poison);
  ta_finding f = finding_at("use.after-free", "read_big_after_free");
  assert_int_equal(f.bytes, SIZE);
  assert_string_equal(frame0(f.alloc_stack), "make_block");
  assert_string_equal(frame0(f.free_stack), "free_block");
}

static void test_api(void **state) {
  (void)state;
  ledger_handler();
  unsigned char *a = ta_aligned(T, 4096, 100);
  assert_true(_ta_guard_owns((uintptr_t)a));
  assert_int_equal((uintptr_t)a % 4096, 0);
  unsigned char *b = ta_aligned(T, 256, 100);
  assert_true(_ta_guard_owns((uintptr_t)b));
  assert_int_equal((uintptr_t)b % 256, 0);
  unsigned char *c = ta_calloc(T, 10, 30);
  assert_true(_ta_guard_owns((uintptr_t)c));
  for (int i = 0; i < 300; i++) assert_int_equal(c[i], 0);
  assert_int_equal(ta_usable_size(c), 300);
  memset(c, 9, 300);
  c = ta_realloc(c, 3000);
  assert_true(_ta_guard_owns((uintptr_t)c));
  for (int i = 0; i < 300; i++) assert_int_equal(c[i], 9);
  unsigned char *z = ta_alloc(T, 0);
  assert_non_null(z);
  ta_free(a);
  ta_free(b);
  ta_free(c);
  ta_free(z);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static int cmp_uintptr(const void *x, const void *y) {
  uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
  return a < b ? -1 : a > b;
}

typedef struct {
  uintptr_t lo, hi;
  int n;
} overlap;

static int count_overlap(const ta_maps_entry *e, void *arg) {
  overlap *o = arg;
  o->n += e->lo < o->hi && e->hi > o->lo;
  return 0;
}

/* The mappings of the process that overlap [lo, hi). */
static int mappings_in(uintptr_t lo, uintptr_t hi) {
  overlap o = { lo, hi, 0 };
  return _ta_maps_each(count_overlap, &o) < 0 ? -1 : o.n;
}

static void test_cycles_recycle_slots(void **state) {
  (void)state;
  ledger_handler();
  enum { CYCLES = 10000, RING = 16 };
  static uintptr_t pages[CYCLES];
  unsigned char *ring[RING] = { 0 };
  ta_mark m = ta_mark_now();
  for (int i = 0; i < CYCLES; i++) {          /* 16 live blocks; each cycle frees the oldest */
    ta_free(ring[i % RING]);
    size_t size = 1 + (size_t)(i * 37) % 4096;
    unsigned char *p = ring[i % RING] = ta_alloc(T, size);
    assert_true(_ta_guard_owns((uintptr_t)p));
    memset(p, 0x5A, size);
    pages[i] = (uintptr_t)p & ~(uintptr_t)4095;
  }
  for (int i = 0; i < RING; i++) ta_free(ring[i]);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, CYCLES);
  assert_int_equal(c.frees, CYCLES);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(c.live_bytes, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  qsort(pages, CYCLES, sizeof pages[0], cmp_uintptr);
  size_t distinct = 0;
  for (size_t i = 0; i < CYCLES; i++) distinct += i == 0 || pages[i] != pages[i - 1];
  assert_true(distinct <= 256);                               /* TAGALLOC_GUARD_SLOTS: slots were reused */
  /* and guarding still works after all that */
  unsigned char *p = make_block(24);
  assert_true(_ta_guard_owns((uintptr_t)p));
  free_block(p);
  assert_int_equal(read_after_free(p, 0), poison);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
}

/* A fresh process: 100 blocks written at once, then freed, twice.  A freed
 * slot's page merges back into the PROT_NONE mapping around it, so the
 * slots ever written do not stay mappings of their own (vm.max_map_count
 * would be reached after ~65000 blocks). */
static int child_maps(void) {
  enum { N = 100 };
  T = ta_tag_get("guard");
  uintptr_t lo = UINTPTR_MAX, hi = 0;          /* the slots used */
  for (int round = 0; round < 2; round++) {
    unsigned char *v[N];
    for (int i = 0; i < N; i++) {
      v[i] = ta_alloc(T, 32);
      if (!_ta_guard_owns((uintptr_t)v[i])) { printf("round %d block %d not guarded\n", round, i); return 3; }
      v[i][0] = 1;
      if ((uintptr_t)v[i] < lo) lo = (uintptr_t)v[i];
      if ((uintptr_t)v[i] > hi) hi = (uintptr_t)v[i];
    }
    for (int i = 0; i < N; i++) ta_free(v[i]);
  }
  int n = mappings_in(lo & ~(uintptr_t)4095, hi + 8192);   /* 200 slots written and freed */
  printf("%d mapping(s) over the slots used\n", n);
  return n > 0 && n < 8 ? 0 : 4;
}

static void test_freed_pages_merge(void **state) {
  (void)state;
  child_result r;
  child_exec("maps", NULL, &r);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
    fail_msg("child: status 0x%x, %s%s", r.status, r.out, r.err);
  child_result_free(&r);
}

static void test_counts_same_as_default(void **state) {
  (void)state;
  ledger_handler();
  ta_mark m = ta_mark_now();
  void *keep[10];
  for (int i = 0; i < 10; i++) keep[i] = ta_alloc(T, 100 + (size_t)i);
  for (int i = 0; i < 5; i++) ta_free(keep[i]);
  keep[5] = ta_realloc(keep[5], 200);
  ta_counts c = ta_since(m, T);
  assert_int_equal(c.allocs, 11);
  assert_int_equal(c.frees, 6);
  assert_int_equal(c.live_blocks, 5);
  assert_int_equal(c.live_bytes, 200 + 106 + 107 + 108 + 109);
  for (int i = 5; i < 10; i++) ta_free(keep[i]);
  c = ta_since(m, T);
  assert_int_equal(c.live_blocks, 0);
  assert_int_equal(ta_findings_count(NULL), 0);
}

static void *thread_body(void *arg) {
  (void)arg;
  unsigned char *p = make_block(32);
  free_block(p);
  return (void *)(uintptr_t)read_after_free(p, 1);
}

static void test_other_thread(void **state) {
  (void)state;
  ledger_handler();
  pthread_t th;
  void *ret;
  assert_int_equal(pthread_create(&th, NULL, thread_body, NULL), 0);
  pthread_join(th, &ret);
  assert_int_equal((uintptr_t)ret, poison);
  assert_int_equal(ta_findings_count("use.after-free"), 1);
  ta_finding f = finding_at("use.after-free", "read_after_free");
  uintptr_t pcs[TA_MAX_DEPTH];
  assert_true(ta_stack_frames(f.stack, pcs, TA_MAX_DEPTH) >= 2);
  assert_string_equal(function_at(ctx, pcs[1]), "thread_body");
}

/* A fault that is not the ledger's still ends the process. */
static void test_foreign_fault(void **state) {
  (void)state;
  if (RUNNING_ON_VALGRIND) skip();      /* memcheck reports the wild write: an error of the run */
  ledger_handler();
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    volatile int *volatile wild = (volatile int *)(uintptr_t)16;
    *wild = 1;                                       /* the ledger's handler, then the default */
    _exit(0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
#ifndef __SANITIZE_ADDRESS__
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
#endif
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(int argc, char **argv) {
  setenv("TAGALLOC_REPORT", "0", 1);
  setenv("TAGALLOC_GUARD", "1", 1);
  setenv("TAGALLOC_GUARD_SLOTS", "256", 1);
  setenv("TAGALLOC_GUARD_SAMPLE", "4", 1);
  unsetenv("TAGALLOC_QUARANTINE");
  if (argc == 3 && strcmp(argv[1], "--child") == 0)
    return strcmp(argv[2], "maps") == 0 ? child_maps() : 2;
  T = ta_tag_get("guard");                          /* the ledger starts: guard mode is on */
  poison = (unsigned char)ta_option("poison");
  if (ta_option("guard") != 1) return 1;
  sigaction(SIGSEGV, NULL, &ledger_segv);
  sigaction(SIGBUS, NULL, &ledger_bus);
  ctx = report_ctx_new();
  if (ctx == NULL) return 1;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_read_after_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_write_after_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_overflow_past_page_end, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_overflow_into_slack, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_double_free, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_big_blocks, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_api, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_cycles_recycle_slots, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_freed_pages_merge, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_counts_same_as_default, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_other_thread, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_foreign_fault, messages_setup, messages_teardown),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  report_ctx_free(ctx);
  return failed;
}
