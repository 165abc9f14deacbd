/* meta.c - the ledger's own memory.  Bookkeeping (tables, histories, thread
 * state) comes from a jemalloc arena of its own through mallocx, so it is
 * never a block of the audited heap, never recorded, and never reachable by
 * an interposed malloc. */
#include "internal.h"

#include <jemalloc/jemalloc.h>
#include <string.h>

static atomic_int meta_flags;   /* MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE, 0 before init */

static int meta_init(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  int flags = atomic_load(&meta_flags);
  if (flags == 0) {
    unsigned ind = 0;
    size_t sz = sizeof ind;
    if (mallctl("arenas.create", &ind, &sz, NULL, 0) != 0)
      flags = MALLOCX_TCACHE_NONE;                 /* fall back to the default arena */
    else
      flags = (int)(MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE);
    atomic_store(&meta_flags, flags);
  }
  pthread_mutex_unlock(&lock);
  return flags;
}

static inline int meta_get(void) {
  int f = atomic_load_explicit(&meta_flags, memory_order_relaxed);
  return TA_LIKELY(f) ? f : meta_init();
}

void *_ta_meta_alloc(size_t size) {
  return mallocx(size ? size : 1, meta_get());
}

void *_ta_meta_calloc(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) return NULL;
  return mallocx(total ? total : 1, meta_get() | MALLOCX_ZERO);
}

void *_ta_meta_realloc(void *p, size_t size) {
  if (p == NULL) return _ta_meta_alloc(size);
  return rallocx(p, size ? size : 1, meta_get());
}

void _ta_meta_free(void *p) {
  if (p) dallocx(p, meta_get());
}

char *_ta_meta_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = _ta_meta_alloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
