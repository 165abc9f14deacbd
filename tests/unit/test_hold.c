/* test_hold.c - declared holds: a good hold is silent; a hold into a stack
 * frame (this thread's or another's) is hold.stack at once; a hold on a
 * freed block is hold.dangling at once; a held target freed later makes
 * ta_hold_check(holder) return 1 and count hold.dangling; a block that loses
 * its last hold while live (the view's dummy buffer replaced by the parent's
 * storage) is leak.orphan at the next scan, not leak.direct, until freed. */
#include "harness.h"
#include "support.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

static void test_good_hold(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("hold.obj");
  void *holder = ta_alloc(T, 64), *target = ta_alloc(T, 32), *other = ta_alloc(T, 16);
  ta_hold(holder, "data", target);
  ta_hold(holder, "grad", other);
  assert_int_equal(ta_hold_check(holder), 0);
  ta_hold(holder, "data", (char *)target + 8);   /* interior pointer: resolved to the block */
  assert_int_equal(ta_hold_check(holder), 0);
  ta_unhold(holder, "data");
  ta_unhold(holder, "grad");
  ta_unhold(holder, "nothing");                  /* no such hold: nothing happens */
  assert_int_equal(ta_hold_check(holder), 0);
  ta_free(target);
  ta_free(other);
  assert_int_equal(ta_hold_check(holder), 0);    /* unheld before the free: fine */
  ta_free(holder);
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(n_messages, 0);
}

NOIPA static void hold_stack_array(void *holder) {
  float inputs[4] = { 1, 2, 3, 4 };
  ta_hold(holder, "inputs", inputs);
  KEEP();
}

static void test_hold_stack(void **state) {
  (void)state;
  void *op = ta_alloc(ta_tag_get("tape.op"), 48);
  hold_stack_array(op);
  assert_int_equal(ta_findings_count("hold.stack"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  assert_int_equal(n_messages, 1);
  find_arg a = { .kind = "hold.stack" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.holder, (uintptr_t)op);
  assert_string_equal(a.slot, "inputs");
  assert_int_not_equal(a.f.stack, 0);
  ta_unhold(op, "inputs");
  ta_free(op);
  assert_int_equal(ta_findings_count(NULL), 1);
}

/* A thread that shows the address of a local and waits. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static void *volatile thread_local_addr;
static int thread_done;
static volatile pid_t thread_tid;

/* Waits (2 s at most) until thread tid sleeps: blocked in the kernel. */
static void wait_until_sleeping(pid_t tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  for (int i = 0; i < 2000; i++) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    const char *state = strrchr(buf, ')');       /* "pid (comm) S ..." */
    if (state && state[1] == ' ' && state[2] == 'S') return;
    usleep(1000);
  }
}

static void *stack_owner(void *arg) {
  volatile long local[8] = { 0 };
  if (arg) ta_free(ta_alloc(ta_tag_get("hold.obj"), 1));  /* the ledger knows this thread */
  pthread_mutex_lock(&mu);
  thread_tid = gettid();
  thread_local_addr = (void *)&local[3];
  pthread_cond_broadcast(&cv);
  while (!thread_done) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return NULL;
}

static void hold_other_thread_stack(int thread_used_ledger) {
  pthread_t th;
  thread_done = 0;
  thread_local_addr = NULL;
  assert_int_equal(pthread_create(&th, NULL, stack_owner, thread_used_ledger ? &th : NULL), 0);
  pthread_mutex_lock(&mu);
  while (thread_local_addr == NULL) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  wait_until_sleeping(thread_tid);               /* blocked in pthread_cond_wait */

  void *holder = ta_alloc(ta_tag_get("hold.obj"), 16);
  ta_hold(holder, "remote", thread_local_addr);
  size_t found = ta_findings_count("hold.stack");
  ta_unhold(holder, "remote");
  ta_free(holder);

  pthread_mutex_lock(&mu);
  thread_done = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(th, NULL);
  assert_int_equal(found, 1);
}

static void test_hold_other_thread_stack(void **state) {
  (void)state;
  hold_other_thread_stack(1);
}

/* "A pointer into any thread's stack": also of a thread that never called
 * the ledger (a BLAS or thread-pool worker), here blocked in the kernel.
 * Under valgrind the kernel sees valgrind's stacks, not the program's: skipped. */
static void test_hold_unknown_thread_stack(void **state) {
  (void)state;
#ifdef RUNNING_ON_VALGRIND
  if (RUNNING_ON_VALGRIND) skip();
#endif
  hold_other_thread_stack(0);
}

static void test_hold_freed_block(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("hold.obj");
  void *holder = ta_alloc(T, 32), *target = ta_alloc(T, 24);
  ta_free(target);
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_hold(holder, "data", target);
  assert_int_equal(ta_findings_count("hold.dangling"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  find_arg a = { .kind = "hold.dangling" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, (uintptr_t)target);
  assert_int_equal(a.f.holder, (uintptr_t)holder);
  assert_int_equal(a.f.bytes, 24);
  assert_int_equal(a.f.tag, T);
  assert_string_equal(a.slot, "data");
  assert_int_not_equal(a.f.free_stack, 0);
  assert_int_not_equal(a.f.alloc_stack, 0);
  ta_unhold(holder, "data");
  ta_free(holder);
}

static void test_held_target_freed(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("hold.obj");
  void *layer = ta_alloc(T, 64), *weights = ta_alloc(T, 256), *bias = ta_alloc(T, 16);
  ta_hold(layer, "weights", weights);
  ta_hold(layer, "bias", bias);
  assert_int_equal(ta_hold_check(layer), 0);
  ta_free(weights);                              /* still held: found when checked */
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(ta_hold_check(layer), 1);
  assert_int_equal(ta_findings_count("hold.dangling"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  find_arg a = { .kind = "hold.dangling" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, (uintptr_t)weights);
  assert_int_equal(a.f.holder, (uintptr_t)layer);
  assert_int_equal(a.f.bytes, 256);
  assert_string_equal(a.slot, "weights");
  assert_int_not_equal(a.f.free_stack, 0);      /* where weights was freed */
  assert_int_not_equal(a.f.aux_stack, 0);       /* where the hold was declared */
  assert_int_not_equal(a.f.free_stack, a.f.aux_stack);

  ta_unhold(layer, "weights");                   /* dropped: fine again */
  assert_int_equal(ta_hold_check(layer), 0);
  ta_unhold(layer, "bias");
  ta_free(bias);
  ta_free(layer);
  assert_int_equal(ta_findings_count(NULL), 1);
}

/* ---- orphans: the reshape() dummy buffer ------------------------------------ */

static void *volatile g_view, *volatile g_parent;
static uintptr_t g_dummy_hidden;               /* ~address: invisible to the scan */

NOIPA static void make_view_with_dummy(void) {
  ta_tag S = ta_tag_get("tensor.storage"), V = ta_tag_get("tensor.view");
  g_parent = ta_alloc(S, 400);
  g_view = ta_alloc(V, 48);
  void *dummy = ta_alloc(S, 4);                  /* the 1-element "dummy" buffer */
  ((void **)g_view)[0] = dummy;                  /* view->data = dummy */
  ta_hold(g_view, "storage", dummy);
  g_dummy_hidden = ~(uintptr_t)dummy;
  KEEP();
}

NOIPA static void view_takes_parent_storage(void) {
  ((void **)g_view)[0] = g_parent;               /* view->data = parent->data: the bug */
  ta_hold(g_view, "storage", g_parent);          /* replaces the dummy: orphaned */
  KEEP();
}

NOIPA static void free_dummy(void) {
  ta_free((void *)~g_dummy_hidden);
  g_dummy_hidden = 0;
  KEEP();
}

static void test_orphan(void **state) {
  (void)state;
  make_view_with_dummy();
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 0);   /* held: not an orphan */
  assert_int_equal(ta_findings_count("leak.direct"), 0);

  view_takes_parent_storage();
  assert_int_equal(ta_findings_count("leak.orphan"), 0);   /* counted by a scan */
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 1);
  assert_int_equal(ta_findings_count("leak.direct"), 0);   /* the orphan, not a direct leak */
  assert_int_equal(ta_findings_count("leak.indirect"), 0);
  assert_int_equal(ta_findings_count("leak.possible"), 0);
  assert_int_equal(ta_findings_count(NULL), 1);
  ta_summary s = ta_summary_get();
  assert_int_equal(s.orphan_blocks, 1);
  assert_int_equal(s.orphan_bytes, 4);
  assert_int_equal(s.direct_blocks, 0);
  assert_int_equal(s.reachable_blocks, 2);       /* the view and the parent */
  assert_int_equal(s.reachable_bytes, 448);
  find_arg a = { .kind = "leak.orphan" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, ~g_dummy_hidden);
  assert_int_equal(a.f.holder, (uintptr_t)g_view);
  assert_string_equal(a.slot, "storage");
  assert_int_equal(a.f.bytes, 4);
  assert_int_equal(a.f.blocks, 1);
  assert_int_equal(a.f.tag, ta_tag_get("tensor.storage"));
  assert_int_not_equal(a.f.stack, 0);            /* allocated at */
  assert_int_not_equal(a.f.aux_stack, 0);        /* orphaned at */
  assert_int_not_equal(a.f.aux_stack, a.f.stack);

  free_dummy();
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 0);
  assert_int_equal(ta_findings_count(NULL), 0);
  s = ta_summary_get();
  assert_int_equal(s.orphan_blocks, 0);
  assert_int_equal(s.reachable_blocks, 2);

  ta_unhold(g_view, "storage");
  ta_free(g_view);
  ta_free(g_parent);
  g_view = g_parent = NULL;
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);
  assert_int_equal(ta_summary_get().reachable_blocks, 0);
}

/* ta_hold_at and ta_unhold_at record the stack they are given (taken once
 * by a caller that records several events of one call), not their own:
 * the orphan names the unhold's stack, a dangling declaration its hold's. */
NOIPA static uint32_t stack_of_declaring(void) {
  uint32_t s = ta_stack_here();
  KEEP();
  return s;
}

NOIPA static uint32_t stack_of_dropping(void) {
  uint32_t s = ta_stack_here();
  KEEP();
  return s;
}

static void test_hold_at_given_stack(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("hold.obj");
  uint32_t s1 = stack_of_declaring(), s2 = stack_of_dropping();
  assert_int_not_equal(s1, 0);
  assert_int_not_equal(s2, 0);
  assert_int_not_equal(s1, s2);
  static void *volatile holder;
  static uintptr_t target_hidden;              /* ~address: invisible to the scan */
  holder = ta_alloc(T, 32);
  void *target = ta_alloc(T, 24);
  target_hidden = ~(uintptr_t)target;
  ((void **)holder)[0] = target;                 /* holder->x = target */
  ta_hold_at(holder, "x", target, s1);
  target = NULL;
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);   /* held: no orphan, no leak */
  ((void **)holder)[0] = NULL;                   /* holder->x = NULL, and the hold ends */
  ta_unhold_at(holder, "x", s2);
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 1);
  assert_int_equal(ta_findings_count(NULL), 1);
  find_arg a = { .kind = "leak.orphan" };
  ta_findings_visit(find_kind, &a);
  assert_true(a.found);
  assert_int_equal(a.f.addr, ~target_hidden);
  assert_int_equal(a.f.holder, (uintptr_t)holder);
  assert_string_equal(a.slot, "x");
  assert_int_equal(a.f.aux_stack, s2);          /* orphaned at the given stack */

  /* a declaration on a freed block: hold.dangling at once, at s1 */
  void *freed = ta_alloc(T, 16);
  ta_free(freed);
  ta_hold_at(holder, "y", freed, s1);
  assert_int_equal(ta_findings_count("hold.dangling"), 1);
  find_arg d = { .kind = "hold.dangling" };
  ta_findings_visit(find_kind, &d);
  assert_true(d.found);
  assert_int_equal(d.f.stack, s1);
  assert_int_equal(d.f.aux_stack, s1);
  ta_unhold_at(holder, "y", s2);
  ta_free((void *)~target_hidden);
  target_hidden = 0;
  ta_free(holder);
  holder = NULL;
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count("leak.orphan"), 0);
}

/* Holds end with their holder: freeing the holder orphans nothing that
 * is still held elsewhere. */
static void test_holder_freed(void **state) {
  (void)state;
  ta_tag T = ta_tag_get("hold.obj");
  static void *volatile a, *volatile b, *volatile target;
  a = ta_alloc(T, 8);
  b = ta_alloc(T, 8);
  target = ta_alloc(T, 8);
  ta_hold(a, "x", target);
  ta_hold(b, "x", target);
  ta_free(a);                                    /* b still holds target */
  scribble_stack();
  ta_scan();
  assert_int_equal(ta_findings_count(NULL), 0);
  ta_free(b);
  ta_free(target);
  a = b = target = NULL;
  assert_int_equal(ta_findings_count(NULL), 0);
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_good_hold, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_stack, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_other_thread_stack, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_unknown_thread_stack, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_freed_block, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_held_target_freed, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_orphan, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_holder_freed, messages_setup, messages_teardown),
    cmocka_unit_test_setup_teardown(test_hold_at_given_stack, messages_setup, messages_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
