/* underflow.c - two objects released once too often by the same function,
 * reached from two callers: two ref.underflow groups (their stacks differ
 * below the release) under one headline, drop_ref.  The page lists them as
 * one row (tests/cli/run.sh). */
#include "tagalloc.h"

static __attribute__((noinline)) void drop_ref(void *obj) { ta_ref_release(obj); }
static __attribute__((noinline)) void from_a(void *obj) { drop_ref(obj); }
static __attribute__((noinline)) void from_b(void *obj) { drop_ref(obj); }

int main(void) {
  ta_tag t = ta_tag_get("obj");
  void *a = ta_alloc(t, 32), *b = ta_alloc(t, 32);
  ta_ref_init(a, 1);
  ta_ref_init(b, 1);
  from_a(a);
  from_a(a);   /* below zero */
  from_b(b);
  from_b(b);   /* below zero */
  ta_free(a);
  ta_free(b);
  return 0;
}
