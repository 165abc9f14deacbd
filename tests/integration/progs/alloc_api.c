/* The whole allocation API: every function leaks one block of a distinct
 * size from its own function, and frees others so the free paths run too.
 * realloc moves a block (the leak is the new size, allocated by realloc's
 * caller).  pvalloc is in alloc_pvalloc.c: valgrind 3.19 aborts on it. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include "common.h"

static int bad;
static void check(int ok, const char *what) {
  if (!ok) { bad = 1; say("FAILED: %s\n", what); }
}

NOINLINE void leak_malloc(void)  { char *p = malloc(10); check(p != NULL, "malloc"); escape(p); }
NOINLINE void leak_calloc(void)  {
  unsigned char *p = calloc(3, 7);
  int zero = 1;
  for (int i = 0; i < 21; i++) zero &= p[i] == 0;
  check(zero, "calloc zeroes");
  escape(p);
}
NOINLINE void leak_realloc(void) {
  char *p = realloc(NULL, 30);             /* realloc(NULL) allocates */
  memcpy(p, "0123456789", 10);
  p = realloc(p, 4000);                    /* grows (moves) */
  check(memcmp(p, "0123456789", 10) == 0, "realloc keeps contents");
  p = realloc(p, 33);                      /* shrinks */
  escape(p);
}
NOINLINE void leak_reallocarray(void) {
  int *p = reallocarray(NULL, 11, sizeof(int));
  p = reallocarray(p, 12, sizeof(int));    /* 48 bytes */
  volatile size_t huge = SIZE_MAX / 2;
  void *q = reallocarray(p, huge, 4);    /* fails, p stays valid */
  check(q == NULL, "reallocarray overflow");
  escape(q ? q : p);
}
NOINLINE void leak_posix_memalign(void) {
  void *p = NULL;
  check(posix_memalign(&p, 64, 100) == 0 && ((uintptr_t)p & 63) == 0, "posix_memalign");
  escape(p);
}
NOINLINE void leak_aligned_alloc(void) {
  void *p = aligned_alloc(128, 256);
  check(((uintptr_t)p & 127) == 0, "aligned_alloc");
  escape(p);
}
NOINLINE void leak_memalign(void) {
  void *p = memalign(32, 48);
  check(((uintptr_t)p & 31) == 0, "memalign");
  escape(p);
}
NOINLINE void leak_valloc(void) {
  void *p = valloc(200);
  check(((uintptr_t)p & 4095) == 0, "valloc");
  escape(p);
}
NOINLINE void usable_size(void) {
  char *p = malloc(13);
  size_t u = malloc_usable_size(p);
  check(u >= 13, "malloc_usable_size");
  memset(p, 1, u);                         /* the whole usable size is ours */
  check(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL)");
  free(p);
}
NOINLINE void free_all_kinds(void) {
  void *p;
  free(malloc(5)); free(calloc(2, 2)); free(realloc(NULL, 7));
  free(reallocarray(NULL, 2, 3));
  if (posix_memalign(&p, 256, 9) == 0) free(p);
  free(aligned_alloc(64, 64)); free(memalign(16, 3)); free(valloc(1));
  free(NULL);
  p = malloc(16);
  p = realloc(p, 24);
  free(p);
}

/* A block freed dirty comes back from jemalloc's thread cache at once:
 * calloc's must be zeroed and an aligned one aligned (they go through
 * mallocx with its flags, not the ledger's plain allocation). */
NOINLINE void reuse_keeps_flags(void) {
  for (int i = 0; i < 64; i++) {
    unsigned char *p = malloc(40);
    memset(p, 0xAB, 40);
    free(p);
    unsigned char *q = calloc(5, 8);
    int zero = 1;
    for (int k = 0; k < 40; k++) zero &= q[k] == 0;
    check(zero, "calloc zeroes a reused block");
    free(q);
    void *a = memalign(256, 48);
    check(((uintptr_t)a & 255) == 0, "memalign(256) after frees");
    free(a);
  }
}

int main(void) {
  leak_malloc(); leak_calloc(); leak_realloc(); leak_reallocarray();
  leak_posix_memalign(); leak_aligned_alloc(); leak_memalign();
  leak_valloc(); usable_size(); free_all_kinds(); reuse_keeps_flags();
  clobber_stack();
  say(bad ? "api: failures\n" : "api: ok\n");
  return bad;
}
