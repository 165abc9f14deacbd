/* test_scan.c - the reachability scan classifies live blocks as valgrind's
 * memcheck does: pointed to from a global or another thread's stack ->
 * reachable (no finding); no pointer left -> leak.direct; reachable only
 * from a lost block -> leak.indirect (a lost tree: 1 direct + 6 indirect; a
 * lost cycle: 1 + 1); only an interior pointer -> leak.possible; a pointer
 * hidden by XOR is no pointer; 20 blocks of 64 MiB lost are 20 direct
 * leaks, whatever address jemalloc keeps in its thread cache.  Exact blocks and bytes from
 * ta_findings_count and ta_summary_get.  And the exit report of a child
 * that leaks 10 x 4 bytes says so, naming the leaking function.
 *
 * The blocks are made by noinline helpers that keep their addresses only
 * where the test wants them (globals, or hidden as ~address for the clean-up),
 * and the dead stack below the test is scribbled over before each scan, so
 * no stale copy in a register or a dead frame keeps a "lost" block alive. */
#include "harness.h"
#include "child.h"
#include "support.h"

#include <pthread.h>
#include <valgrind/valgrind.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ta_tag T;

/* Addresses the scan must not see: ~address is not a pointer. */
#define MAX_HIDDEN 64
static uintptr_t hidden[MAX_HIDDEN];
static size_t nhidden;

static void hide(void *p) { hidden[nhidden++] = ~(uintptr_t)p; }

NOIPA static void free_hidden(void) {
  for (size_t i = 0; i < nhidden; i++) ta_free((void *)~hidden[i]);
  nhidden = 0;
  KEEP();
}

/* The caller-saved registers are dead at a call, but the scan takes the
 * calling thread's registers as roots: clear them (general and vector) so
 * that a stale copy left there by an earlier call is not a root. */
NOIPA static void clear_scratch_registers(void) {
#if defined(__x86_64__)
  __asm__ volatile("xor %%eax, %%eax\n\txor %%ecx, %%ecx\n\txor %%edx, %%edx\n\t"
                   "xor %%esi, %%esi\n\txor %%edi, %%edi\n\txor %%r8d, %%r8d\n\t"
                   "xor %%r9d, %%r9d\n\txor %%r10d, %%r10d\n\txor %%r11d, %%r11d\n\t"
                   "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpxor %%xmm2, %%xmm2\n\t"
                   "pxor %%xmm3, %%xmm3\n\tpxor %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\t"
                   "pxor %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\tpxor %%xmm8, %%xmm8\n\t"
                   "pxor %%xmm9, %%xmm9\n\tpxor %%xmm10, %%xmm10\n\tpxor %%xmm11, %%xmm11\n\t"
                   "pxor %%xmm12, %%xmm12\n\tpxor %%xmm13, %%xmm13\n\tpxor %%xmm14, %%xmm14\n\t"
                   "pxor %%xmm15, %%xmm15"
                   ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
                       "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory");
#endif
}

/* Scribbles the dead stack, clears the scratch registers, scans. */
NOIPA static void scan(void) {
  scribble_stack();
  clear_scratch_registers();
  ta_scan();
  if (getenv("SCAN_DEBUG")) ta_report_now();
  KEEP();
}

static int setup(void **state) {
  (void)state;
  T = ta_tag_get("scan");
  ta_findings_clear();
  return 0;
}

/* Every test leaves nothing live behind. */
static int teardown(void **state) {
  (void)state;
  free_hidden();
  scan();
  ta_summary s = ta_summary_get();
  return s.reachable_blocks + s.direct_blocks + s.indirect_blocks + s.possible_blocks == 0 ? 0 : -1;
}

static void assert_leaks(size_t direct, size_t indirect, size_t possible) {
  assert_int_equal(ta_findings_count("leak.direct"), direct);
  assert_int_equal(ta_findings_count("leak.indirect"), indirect);
  assert_int_equal(ta_findings_count("leak.possible"), possible);
  assert_int_equal(ta_findings_count("leak.orphan"), 0);
  assert_int_equal(ta_findings_count(NULL), direct + indirect + possible);
}

/* ---- big blocks across 1 GiB boundaries ------------------------------------------ */

/* jemalloc's thread cache of its radix tree keeps leaf keys: addresses
 * aligned to 1 GiB.  20 blocks of 64 MiB span 1.25 GiB of address space, so
 * a boundary falls inside one of them; its leaf key, left in jemalloc's TLS,
 * is no interior pointer of the program's.  (The blocks are never touched:
 * address space only.)
 * A block over a 4 GiB boundary is kept reachable instead of lost: stale
 * words on the stack of the form 0x00007fXX00000001 (the high half of an
 * old pointer, an int stored over its low half; one sat in cmocka's frame)
 * point just past such a boundary, and made that block "possibly lost" in
 * about one run in six, as they would under memcheck. */
#define BIG_N 20
#define BIG_SIZE ((size_t)64 << 20)

#define BIG_KEEP 64
static void *big_kept[BIG_KEEP];
static int big_nkept, big_lost_over_1g;

/* Loses BIG_N blocks, one of them over a 1 GiB boundary (the last one
 * waits for such a block); keeps the others it is given. */
NOIPA static void lose_big_blocks(void) {
  for (volatile int lost = 0; lost < BIG_N && big_nkept < BIG_KEEP; ) {
    void *p = ta_alloc(T, BIG_SIZE);
    uintptr_t a = (uintptr_t)p, z = a + BIG_SIZE - 1;
    bool over_1g = (a >> 30) != (z >> 30), over_4g = (a >> 32) != (z >> 32);
    if (over_4g || (lost == BIG_N - 1 && !big_lost_over_1g && !over_1g)) {
      big_kept[big_nkept++] = p;
      continue;
    }
    big_lost_over_1g += over_1g;
    hide(p);
    lost++;
  }
  KEEP();
}

static void test_big_blocks_are_direct(void **state) {
  (void)state;
  lose_big_blocks();
  scan();
  ta_summary s = ta_summary_get();
  assert_true(big_lost_over_1g > 0);      /* a leaf key falls inside a lost block */
  assert_int_equal(s.possible_blocks, 0);
  assert_int_equal(s.direct_blocks, BIG_N);
  assert_int_equal(s.direct_bytes, BIG_N * BIG_SIZE);
  for (int i = 0; i < big_nkept; i++) ta_free(big_kept[i]);
  big_nkept = 0;
}

/* ---- reachable from a global ------------------------------------------------- */

static void *volatile g_root;

NOIPA static void make_global(void) {
  g_root = ta_alloc(T, 48);
  KEEP();
}

static void test_global_is_reachable(void **state) {
  (void)state;
  make_global();
  scan();
  assert_leaks(0, 0, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.reachable_blocks, 1);
  assert_int_equal(s.reachable_bytes, 48);
  assert_int_equal(s.direct_blocks, 0);

  /* ... and what it points to, transitively */
  void **chain = ta_calloc(T, 1, 16);
  ((void **)g_root)[0] = chain;
  chain[0] = ta_alloc(T, 8);
  chain = NULL;
  scan();
  assert_leaks(0, 0, 0);
  s = ta_summary_get();
  assert_int_equal(s.reachable_blocks, 3);
  assert_int_equal(s.reachable_bytes, 72);

  void **c = ((void **)g_root)[0];
  ta_free(c[0]);
  ta_free(c);
  ta_free(g_root);
  g_root = NULL;
}

/* ---- reachable from a large .bss: only its touched pages are read ------------ */

/* 1 MiB of .bss, of which the test writes two pages: a block's address in
 * the middle and one in the last word.  The scan reads a module's segment
 * page by page where it is large (pagemap), and must still find both. */
static void *volatile g_big_bss[(1 << 20) / sizeof(void *)];
#define BSS_N (sizeof g_big_bss / sizeof g_big_bss[0])

NOIPA static void bss_fill(void) {
  g_big_bss[BSS_N / 2 + 3] = ta_alloc(T, 56);
  g_big_bss[BSS_N - 1] = ta_alloc(T, 72);
  KEEP();
}

NOIPA static void bss_drop_last(void) {
  hide(g_big_bss[BSS_N - 1]);                    /* the teardown frees it */
  g_big_bss[BSS_N - 1] = NULL;
  KEEP();
}

static void test_big_bss_is_scanned(void **state) {
  (void)state;
  bss_fill();
  scan();
  assert_leaks(0, 0, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.reachable_blocks, 2);
  assert_int_equal(s.reachable_bytes, 128);
  bss_drop_last();                               /* now only the one in the middle */
  scan();
  s = ta_summary_get();
  assert_int_equal(s.reachable_blocks, 1);
  assert_int_equal(s.reachable_bytes, 56);
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 72);
  ta_free(g_big_bss[BSS_N / 2 + 3]);
  g_big_bss[BSS_N / 2 + 3] = NULL;
}

/* ---- direct: the only pointer overwritten ------------------------------------ */

NOIPA static void overwrite_pointer(void) {
  g_root = ta_alloc(T, 40);
  hide(g_root);
  g_root = ta_alloc(T, 24);                      /* the 40 bytes are lost */
  KEEP();
}

static void test_overwritten_is_direct(void **state) {
  (void)state;
  overwrite_pointer();
  scan();
  assert_leaks(1, 0, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 40);
  assert_int_equal(s.reachable_blocks, 1);
  assert_int_equal(s.reachable_bytes, 24);
  find_arg a = { .kind = "leak.direct" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.bytes, 40);
  assert_int_equal(a.f.blocks, 1);
  assert_int_equal(a.f.tag, T);
  assert_int_equal(a.f.addr, ~hidden[0]);
  assert_int_not_equal(a.f.stack, 0);
  ta_free(g_root);
  g_root = NULL;
}

/* ---- a lost tree: 1 root + 6 children ----------------------------------------- */

NOIPA static void lose_tree(void) {
  void **root = ta_calloc(T, 6, sizeof(void *));          /* 48 bytes */
  hide(root);
  for (volatile int i = 0; i < 6; i++) {          /* volatile: not unrolled, one call site */
    root[i] = ta_calloc(T, 1, 32);
    hide(root[i]);
  }
  KEEP();
}

static void test_lost_tree(void **state) {
  (void)state;
  lose_tree();
  scan();
  assert_leaks(1, 6, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 48);
  assert_int_equal(s.indirect_blocks, 6);
  assert_int_equal(s.indirect_bytes, 192);
  assert_int_equal(s.reachable_blocks, 0);
  find_arg a = { .kind = "leak.direct" };
  ta_findings_visit(find_kind, &a);
  assert_int_equal(a.f.addr, ~hidden[0]);        /* the root */
  find_arg b = { .kind = "leak.indirect" };
  ta_findings_visit(find_kind, &b);
  assert_int_equal(b.f.blocks, 6);               /* one allocation site: one group */
  assert_int_equal(b.f.bytes, 192);
}

/* ---- a lost cycle of 2 --------------------------------------------------------- */

NOIPA static void lose_cycle(void) {
  void **a = ta_calloc(T, 2, sizeof(void *)), **b = ta_calloc(T, 2, sizeof(void *));
  a[0] = b;
  b[1] = a;
  hide(a);
  hide(b);
  KEEP();
}

static void test_lost_cycle(void **state) {
  (void)state;
  lose_cycle();
  scan();
  assert_leaks(1, 1, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 16);
  assert_int_equal(s.indirect_blocks, 1);
  assert_int_equal(s.indirect_bytes, 16);
  find_arg a = { .kind = "leak.direct" };
  ta_findings_visit(find_kind, &a);
  uintptr_t x = ~hidden[0], y = ~hidden[1];
  assert_int_equal(a.f.addr, x < y ? x : y);     /* the first in address order */
}

/* ---- only an interior pointer -------------------------------------------------- */

static char *volatile g_interior;

NOIPA static void keep_interior(void) {
  char *p = ta_alloc(T, 64);
  hide(p);
  g_interior = p + 16;
  KEEP();
}

static void test_interior_is_possible(void **state) {
  (void)state;
  keep_interior();
  scan();
  assert_leaks(0, 0, 1);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.possible_blocks, 1);
  assert_int_equal(s.possible_bytes, 64);
  assert_int_equal(s.direct_blocks, 0);
  assert_int_equal(s.reachable_blocks, 0);

  /* the start pointer back: reachable again */
  g_root = g_interior - 16;
  scan();
  assert_leaks(0, 0, 0);
  assert_int_equal(ta_summary_get().reachable_blocks, 1);
  g_root = NULL;
  g_interior = NULL;
}

/* ---- a pointer hidden by XOR --------------------------------------------------- */

static volatile uintptr_t g_xored;
#define XOR_KEY ((uintptr_t)0x5DEECE66DA5A5A5Aull)

NOIPA static void hide_by_xor(void) {
  g_xored = (uintptr_t)ta_alloc(T, 56) ^ XOR_KEY;
  KEEP();
}

NOIPA static void free_xored(void) {
  ta_free((void *)(g_xored ^ XOR_KEY));
  g_xored = 0;
  KEEP();
}

static void test_xor_is_direct(void **state) {
  (void)state;
  hide_by_xor();
  scan();
  assert_leaks(1, 0, 0);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 56);
  free_xored();
}

/* ---- reachable from another thread's stack ----------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ready, done;

typedef struct { int xor_it, block_signals; } holder_arg;

/* 88 bytes for the block held, 200 for the XOR control: another size
 * class, so the control's block is never the held block of the run
 * before (freed when its thread ended), whose address may still lie in the
 * stack the new thread reuses. */
NOIPA static uintptr_t alloc_block(int xor_it) {
  uintptr_t p = (uintptr_t)ta_alloc(T, xor_it ? 200 : 88);
  return xor_it ? p ^ XOR_KEY : p;
}

static void *stack_holder(void *arg) {
  holder_arg *h = arg;
  if (h->block_signals) {               /* as node's signal thread does */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
  }
  /* the only copy: a local of this thread (or its XOR, for the control) */
  volatile uintptr_t local = alloc_block(h->xor_it);
  scribble_stack();
  clear_scratch_registers();
  pthread_mutex_lock(&mu);
  ready = 1;
  pthread_cond_broadcast(&cv);
  while (!done) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  ta_free((void *)(h->xor_it ? local ^ XOR_KEY : local));
  return NULL;
}

static void scan_with_thread_holding(int xor_it, int block_signals, ta_summary *s, size_t *direct) {
  pthread_t th;
  holder_arg arg = { xor_it, block_signals };
  ready = done = 0;
  assert_int_equal(pthread_create(&th, NULL, stack_holder, &arg), 0);
  pthread_mutex_lock(&mu);
  while (!ready) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  scan();
  *s = ta_summary_get();
  *direct = ta_findings_count("leak.direct");
  pthread_mutex_lock(&mu);
  done = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(th, NULL);
}

/* The block held by the other thread is reachable; the control, the same
 * thread holding only the XOR of the address, leaves it lost. */
static void check_thread_holding(int block_signals) {
  ta_summary s;
  size_t direct;
  scan_with_thread_holding(0, block_signals, &s, &direct);
  assert_int_equal(direct, 0);
  assert_int_equal(s.direct_blocks, 0);
  assert_int_equal(s.reachable_blocks, 1);
  assert_int_equal(s.reachable_bytes, 88);

  scan_with_thread_holding(1, block_signals, &s, &direct);
  assert_int_equal(direct, 1);
  assert_int_equal(s.direct_blocks, 1);
  assert_int_equal(s.direct_bytes, 200);
  assert_int_equal(s.reachable_blocks, 0);
}

static void test_other_thread_stack_is_reachable(void **state) {
  (void)state;
  check_thread_holding(0);
}

/* A thread that blocks every signal cannot be stopped: the scan reads its
 * stack from the stack pointer of its blocking system call up to the end
 * of the stack's mapping (its TLS and descriptor included). */
static void test_thread_blocking_signals_is_scanned(void **state) {
  (void)state;
  /* Under valgrind the kernel's view of a thread (its stack pointer in
   * /proc/self/task/TID/syscall) is valgrind's, not the program's. */
  if (RUNNING_ON_VALGRIND) skip();
  check_thread_holding(1);
}

/* ---- the exit report (a child with the report on) ---------------------------- */

NOIPA static void leak_ten(void) {
  ta_tag L = ta_tag_get("leaky");
  for (volatile int i = 0; i < 10; i++) {         /* volatile: not unrolled, one call site */
    void *volatile p = ta_alloc(L, 4);
    (void)p;
  }
  KEEP();
}

static int child_exit_leak(void) {
  leak_ten();
  scribble_stack();
  return 0;
}

static void test_exit_report(void **state) {
  (void)state;
  child_result r;
  const char *env[] = { "TAGALLOC_REPORT=1", NULL };
  child_exec("exit-leak", env, &r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  const char *want = "Direct leak of 40 byte(s) in 10 object(s) allocated from:   [tag: leaky]\n    #0 0x";
  const char *at = strstr(r.err, want);
  if (!at) child_dump(&r);
  assert_non_null(at);
  const char *eol = strchr(at + strlen(want), '\n');
  const char *fn = strstr(at, " in leak_ten ");
  assert_non_null(fn);
  assert_true(fn < eol);                         /* frame #0 is the leaking function */
  assert_non_null(strstr(r.err, "==ERROR: tagalloc: detected memory problems\n"));
  assert_non_null(strstr(r.err, "   definitely lost: 40 bytes in 10 blocks\n"));
  assert_non_null(strstr(r.err, "   indirectly lost: 0 bytes in 0 blocks\n"));
  assert_non_null(strstr(r.err, "SUMMARY: tagalloc: 40 byte(s) leaked in 10 allocation(s); 1 error(s) (1 of them loss records: definitely or possibly lost, orphaned, refcount leaks, one per group, as memcheck's ERROR SUMMARY counts them).\n"));
  child_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "exit-leak") == 0) return child_exit_leak();
    return 2;
  }
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_global_is_reachable, setup, teardown),
    cmocka_unit_test_setup_teardown(test_big_bss_is_scanned, setup, teardown),
    cmocka_unit_test_setup_teardown(test_overwritten_is_direct, setup, teardown),
    cmocka_unit_test_setup_teardown(test_lost_tree, setup, teardown),
    cmocka_unit_test_setup_teardown(test_lost_cycle, setup, teardown),
    cmocka_unit_test_setup_teardown(test_interior_is_possible, setup, teardown),
    cmocka_unit_test_setup_teardown(test_xor_is_direct, setup, teardown),
    cmocka_unit_test_setup_teardown(test_other_thread_stack_is_reachable, setup, teardown),
    cmocka_unit_test_setup_teardown(test_thread_blocking_signals_is_scanned, setup, teardown),
    cmocka_unit_test_setup_teardown(test_exit_report, setup, teardown),
    cmocka_unit_test_setup_teardown(test_big_blocks_are_direct, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
