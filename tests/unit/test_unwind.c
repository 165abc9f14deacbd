/* test_unwind.c - the exact unwinder's rule cache is shared with forked
 * children: a rule a child computes (for code its parent never ran) is
 * there for the parent after the child is gone, and code that neither ran
 * still costs a rule.  Counted with _ta_unwind_rules_computed, the rules
 * this process had to compute with libdw.
 * And a walk survives a frame-pointer chain that points at the top of the
 * address space (the prefetch along that chain once wrapped around and
 * read address 0). */
#include "harness.h"
#include "support.h"
#include "internal.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static ta_tag T;

/* Two functions the test process runs for the first time when it says so;
 * each allocates from a call site of its own (a return address the cache
 * has never seen). */
NOIPA static void only_in_child(void) {
  void *p = ta_alloc(T, 24);
  KEEP();
  ta_free(p);
  KEEP();
}

NOIPA static void never_before(void) {
  void *p = ta_alloc(T, 24);
  KEEP();
  ta_free(p);
  KEEP();
}

static void test_child_rules_serve_parent(void **state) {
  (void)state;
  T = ta_tag_get("unwind");
  void *warm = ta_alloc(T, 8);               /* the cache is made on a first miss */
  ta_free(warm);

  /* The child runs only_in_child first, the parent after the child is
   * gone: from the same call site, so every return address of the walk is
   * one the child has seen. */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid > 0) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  __asm__ volatile("" : "+r"(pid));   /* one call site below, not one per branch */
  size_t before = _ta_unwind_rules_computed();
  only_in_child();
  size_t after = _ta_unwind_rules_computed();
  if (pid == 0) _exit(after > before ? 0 : 3);   /* the child did compute them */
  assert_int_equal(after, before);               /* the parent did not */

  never_before();                            /* the control: new code, new rules */
  assert_true(_ta_unwind_rules_computed() > before);
}

/* Called with rbp = 0xfffffffffffffff8: its frame record saves that. */
__attribute__((used, noinline)) void *unwind_alloc_one(void);
__attribute__((used, noinline)) void *unwind_alloc_one(void) {
  void *p = ta_alloc(T, 40);
  KEEP();
  return p;
}

NOIPA static void *call_with_wild_rbp(void) {
  void *p;
  __asm__ volatile("mov %%rsp, %%rbx\n\t"
                   "sub $128, %%rsp\n\t"          /* past the red zone */
                   "and $-16, %%rsp\n\t"
                   "push %%rbp\n\t"
                   "sub $8, %%rsp\n\t"            /* 16-byte aligned at the call */
                   "movabs $0xfffffffffffffff8, %%rbp\n\t"
                   "call unwind_alloc_one\n\t"
                   "add $8, %%rsp\n\t"
                   "pop %%rbp\n\t"
                   "mov %%rbx, %%rsp\n\t"
                   : "=a"(p)
                   :
                   : "rbx", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "memory");
  return p;
}

static void test_wild_frame_pointer(void **state) {
  (void)state;
  T = ta_tag_get("unwind");
  void *p = call_with_wild_rbp();
  assert_non_null(p);
  const uintptr_t *frames;
  ta_block b;
  assert_true(_ta_block_get((uintptr_t)p, &b));
  /* the walk stops at the wild frame: unwind_alloc_one, then at most the
   * frame the asm sits in */
  size_t n = ta_stack_frames(b.stack, &frames);
  assert_true(n >= 1 && n <= 2);
  ta_free(p);
}

int main(void) {
  setenv("TAGALLOC_UNWIND", "exact", 1);
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_child_rules_serve_parent),
    cmocka_unit_test(test_wild_frame_pointer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
