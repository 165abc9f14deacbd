/* cuda_test.h - what the CUDA backend's test programs share.  They run on
 * machines with a GPU that may lack this project's Debian packages (no
 * cmocka there), so they check with these few macros, not cmocka, and
 * print their results in cmocka's shape ("[       OK ] name", counted by
 * tests/lib.sh):
 *
 *   CHECK(cond, fmt, ...)   a failed check prints "FAIL file:line: ..." and
 *                           counts; the test goes on
 *   test_end(name)          "[       OK ] name" when no check of it failed,
 *                           else "[  FAILED  ] name"
 *   tests_finish()          the exit status: 0 when nothing failed
 *
 * Exit status 77 means SKIP (the reason printed first, on a line starting
 * "SKIP:"): a check that cannot run here is never a silent pass. */
#ifndef TAGALLOC_TEST_CUDA_TEST_H
#define TAGALLOC_TEST_CUDA_TEST_H

#include <stdio.h>

#define EXIT_SKIP 77

static int test_failures, tests_failed, tests_passed;
static int test_seen;   /* test_failures at the latest test_end */

#define CHECK(cond, ...)                                                                                   \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      test_failures++;                                                                                     \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                          \
      printf(__VA_ARGS__);                                                                                 \
      printf("\n");                                                                                        \
    }                                                                                                      \
  } while (0)

/* Closes the current test: its checks since the previous test_end. */
__attribute__((unused)) static void test_end(const char *name) {
  if (test_failures > test_seen) {
    printf("[  FAILED  ] %s\n", name);
    tests_failed++;
  } else {
    printf("[       OK ] %s\n", name);
    tests_passed++;
  }
  test_seen = test_failures;
  fflush(stdout);
}

__attribute__((unused)) static int tests_finish(void) {
  printf("%d passed, %d failed\n", tests_passed, tests_failed);
  return tests_failed || test_failures ? 1 : 0;
}

#endif
