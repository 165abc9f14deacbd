/* demo.c - three bugs of ML training code, on purpose, and the ledger's
 * exit report that names each one with its stacks.
 *
 *   1. reshape() allocates a 1-element "dummy" storage, then points the view
 *      at its parent's storage: the dummy is orphaned, 4 bytes per view;
 *   2. a view's destructor releases the shared storage once too often;
 *   3. a batch buffer that nobody frees.
 *
 * Run: make demo */
#include "tagalloc.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  float *data;     /* (n) */
  size_t n;
} storage;

typedef struct {
  storage *st;
  size_t offset, n;
} tensor;

static ta_tag T_STORAGE, T_HEADER, T_BATCH;

static storage *storage_new(size_t n) {
  storage *s = ta_alloc(T_STORAGE, sizeof *s);
  s->data = ta_calloc(T_STORAGE, n, sizeof(float));
  s->n = n;
  ta_ref_init(s, 1);
  ta_hold(s, "data", s->data);
  return s;
}

static void storage_release(storage *s) {
  if (ta_ref_release(s) == 0) {
    ta_unhold(s, "data");
    ta_free(s->data);
    ta_free(s);
  }
}

static tensor *tensor_new(size_t n) {
  tensor *t = ta_alloc(T_HEADER, sizeof *t);
  t->st = storage_new(n);
  ta_hold(t, "storage", t->st);
  t->offset = 0;
  t->n = n;
  return t;
}

/* Bug 1: the view gets a storage of its own, then shares its parent's. */
__attribute__((noinline)) static tensor *reshape(tensor *parent) {
  tensor *v = tensor_new(1);              /* the "dummy" */
  v->st = parent->st;                     /* ... overwritten: the dummy is lost */
  ta_hold(v, "storage", v->st);
  ta_ref_acquire(v->st);
  v->n = parent->n;
  return v;
}

/* Bug 2: one release too many. */
__attribute__((noinline)) static void view_free(tensor *v) {
  ta_unhold(v, "storage");
  storage_release(v->st);
  storage_release(v->st);                 /* the view never owned this one */
  ta_free(v);
}

static void tensor_free(tensor *t) {
  ta_unhold(t, "storage");
  storage_release(t->st);
  ta_free(t);
}

/* Bug 3: a batch buffer that is never freed. */
__attribute__((noinline)) static float *load_batch(size_t n) {
  float *b = ta_alloc(T_BATCH, n * sizeof *b);
  memset(b, 0, n * sizeof *b);
  return b;
}

int main(void) {
  T_STORAGE = ta_tag_get("tensor.storage");
  T_HEADER = ta_tag_get("tensor.header");
  T_BATCH = ta_tag_get("data.batch");

  ta_mark m = ta_mark_now();
  tensor *x = tensor_new(64);
  for (int step = 0; step < 3; step++) {
    float *batch = load_batch(256);
    (void)batch;
    tensor *v = reshape(x);               /* orphans a dummy storage each step */
    ta_unhold(v, "storage");
    storage_release(v->st);
    ta_free(v);
  }
  view_free(reshape(x));                  /* frees x's storage under x's feet */
  tensor_free(x);                         /* ... and x's own release underflows */

  ta_counts c = ta_since(m, TA_ANY);
  printf("demo: %lu allocations, %lu frees, %lu blocks still live since the mark\n",
         (unsigned long)c.allocs, (unsigned long)c.frees, (unsigned long)c.live_blocks);
  printf("demo: the exit report follows on stderr\n");
  return 0;
}
