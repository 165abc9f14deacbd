/* A correct program of the ledger's C API (not a .expect program: api.py
 * links it with build/libtagalloc.so and with build/libtagalloc.a and runs
 * each under `tagalloc run`).  Everything it makes it frees; every count it
 * raises it drops; its stacks take the exact unwinder through fresh code
 * (each first stack of a call site makes the ledger read DWARF with libdw).
 * Expected: zero findings, no leak of any kind, exit 0. */
#include <stdio.h>
#include <string.h>
#include "tagalloc.h"
#include "common.h"

typedef struct { float *data; long refs; } tensor;

static NOINLINE tensor *tensor_make(ta_tag tag, size_t n) {
  tensor *t = ta_alloc(tag, sizeof *t);
  t->data = ta_calloc(tag, n, sizeof *t->data);
  ta_ref_init(t, 1);
  ta_hold(t, "data", t->data);
  return t;
}

static NOINLINE void tensor_drop(tensor *t) {
  if (ta_ref_release(t) == 0) {
    ta_unhold(t, "data");
    ta_free(t->data);
    ta_free(t);
  }
}

int main(void) {
  ta_tag tag = ta_tag_get("api.tensor");
  ta_mark m = ta_mark_now();
  tensor *a = tensor_make(tag, 64);
  ta_ref_acquire(a);
  tensor_drop(a);
  int good = ta_check(a->data);
  tensor_drop(a);
  void *al = ta_aligned(tag, 64, 256);
  char *r = ta_realloc(ta_alloc(tag, 10), 4000);
  memset(r, 1, 4000);
  ta_free(r);
  ta_free(al);
  ta_arena *ar = ta_arena_new(tag, 4096);
  for (int gen = 0; gen < 3; gen++) {
    for (int i = 0; i < 20; i++) memset(ta_arena_alloc(ar, 100), 0, 100);
    ta_arena_reset(ar);
  }
  ta_arena_free(ar);
  ta_counts c = ta_since(m, tag);
  ta_mark_free(m);
  (void)ta_stack_here();
  say("ok %d live %llu\n", good, (unsigned long long)c.live_blocks);
  return 0;
}
