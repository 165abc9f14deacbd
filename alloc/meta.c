/* meta.c - the ledger's own memory.  Bookkeeping (tables, histories, thread
 * state) comes from a jemalloc arena of its own through mallocx, so it is
 * never a block of the audited heap, never recorded, and never reachable by
 * an interposed malloc.
 *
 * The arena's extents are carved from one reserved range (MAP_NORESERVE:
 * pages are touched only as used), which transparent huge pages cover once
 * the ledger's memory passes META_HUGE_AFTER.  A big live table is touched
 * at random, one record per malloc and per free: with 4 KiB pages each of
 * those is a TLB miss as well as a cache miss (python3 with
 * PYTHONMALLOC=malloc, ~40 MB of table: 12% of its samples on the
 * prefetch of a record alone).  Small processes keep small pages: a huge
 * page is 2 MiB to zero and to count in RSS.  Extents are never given back
 * (jemalloc retains and reuses them), and the arena purges nothing; only a
 * caller done with a big block gives its pages back (_ta_meta_give_back:
 * the live table's outgrown tables).  When the range is used up, or could
 * not be reserved, extents come from mmap as jemalloc's own would. */
#include "internal.h"
#include "extent_hooks.h"

#include <jemalloc/jemalloc.h>
#include <string.h>
#include <sys/mman.h>

#define META_HUGE_AFTER ((uintptr_t)16 << 20)

static struct {
  _Atomic uintptr_t bump;
  uintptr_t lo, end;
  _Atomic bool huge;
} region;

/* Fresh memory outside the range: size bytes aligned to alignment. */
static void *map_aligned(size_t size, size_t alignment) {
  size_t len = size + alignment;
  if (len < size) return NULL;
  char *p = _ta_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  uintptr_t a = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
  if (a > (uintptr_t)p) _ta_sys_munmap(p, a - (uintptr_t)p);
  uintptr_t tail = (uintptr_t)p + len - (a + size);
  if (tail) _ta_sys_munmap((void *)(a + size), tail);
  return (void *)a;
}

static void *extent_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                          bool *zero, bool *commit, unsigned ind) {
  (void)h;
  (void)ind;
  if (new_addr != NULL) return NULL;         /* growing in place: no */
  uintptr_t start = _ta_extent_carve(&region.bump, region.end, size, alignment);
  void *p = start ? (void *)start : map_aligned(size, alignment < 4096 ? 4096 : alignment);
  if (p == NULL) return NULL;
  if (start && start + size - region.lo >= META_HUGE_AFTER && !atomic_exchange(&region.huge, true))
    madvise((void *)region.lo, region.end - region.lo, MADV_HUGEPAGE);
  *zero = true;                              /* never used before: the kernel's zero pages */
  *commit = true;
  return p;
}

uintptr_t _ta_extent_carve(_Atomic uintptr_t *bump, uintptr_t end, size_t size, size_t alignment) {
  if (alignment < 4096) alignment = 4096;
  uintptr_t cur = atomic_load(bump), start, stop;
  do {
    start = (cur + alignment - 1) & ~(uintptr_t)(alignment - 1);
    stop = start + size;
    if (start < cur || stop < start || stop > end) return 0;
  } while (!atomic_compare_exchange_weak(bump, &cur, stop));
  return start;
}

/* The hooks every such arena shares (extent_hooks.h). */
bool _ta_extent_keep(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind) {
  (void)h; (void)addr; (void)size; (void)committed; (void)ind;
  return true;                               /* not given back: retained */
}

void _ta_extent_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind) {
  (void)h; (void)addr; (void)size; (void)committed; (void)ind;
}

bool _ta_extent_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind) {
  (void)h; (void)addr; (void)size; (void)off; (void)len; (void)ind;
  return false;                              /* always committed */
}

bool _ta_extent_optout(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind) {
  (void)h; (void)addr; (void)size; (void)off; (void)len; (void)ind;
  return true;                               /* decommit, purge: not done */
}

bool _ta_extent_split(extent_hooks_t *h, void *addr, size_t size, size_t a, size_t b, bool committed,
                      unsigned ind) {
  (void)h; (void)addr; (void)size; (void)a; (void)b; (void)committed; (void)ind;
  return false;                              /* within one mapping: any split */
}

bool _ta_extent_merge(extent_hooks_t *h, void *a, size_t asize, void *b, size_t bsize, bool committed,
                      unsigned ind) {
  (void)h; (void)a; (void)asize; (void)b; (void)bsize; (void)committed; (void)ind;
  return false;                              /* within one mapping: any merge */
}

/* Two extents merge only within the range (one mapping); extents mapped
 * outside it are separate mappings. */
static bool extent_merge(extent_hooks_t *h, void *a, size_t asize, void *b, size_t bsize,
                         bool committed, unsigned ind) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  if (!(x >= region.lo && x < region.end && y >= region.lo && y < region.end)) return true;
  return _ta_extent_merge(h, a, asize, b, bsize, committed, ind);
}

static extent_hooks_t hooks = {
  extent_alloc, _ta_extent_keep, _ta_extent_destroy, _ta_extent_commit, _ta_extent_optout,
  _ta_extent_optout, _ta_extent_optout, _ta_extent_split, extent_merge,
};

/* The range (as large as the address-space limit allows), or none:
 * jemalloc's own hooks then. */
static bool region_reserve(void) {
  static const size_t sizes[] = { (size_t)64 << 30, (size_t)8 << 30, (size_t)1 << 30, (size_t)256 << 20 };
  void *p = MAP_FAILED;
  size_t len = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes && p == MAP_FAILED; i++) {
    len = sizes[i];
    p = _ta_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  if (p == MAP_FAILED) return false;
  region.lo = (uintptr_t)p;
  region.end = region.lo + len;
  atomic_store(&region.bump, region.lo);
  _ta_own_range(region.lo, region.end);
  return true;
}

static atomic_int meta_flags;   /* MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE, 0 before init */

static int meta_init(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  int flags = atomic_load(&meta_flags);
  if (flags == 0) {
    unsigned ind = 0;
    size_t sz = sizeof ind;
    extent_hooks_t *hp = &hooks;
    bool own = region_reserve();
    if (mallctl("arenas.create", &ind, &sz, own ? (void *)&hp : NULL, own ? sizeof hp : 0) != 0)
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

/* The pages [p, p + len) (page-aligned, within a block of the ledger's
 * own memory that the caller is done with) go back to the system: they
 * read as zeros from then on, and count in RSS again only when touched.
 * The arena still takes them for dirty: it zeroes what it hands out of
 * them for _ta_meta_calloc, as it zeroes any reused memory. */
void _ta_meta_give_back(void *p, size_t len) {
  if (len) madvise(p, len, MADV_DONTNEED);
}

char *_ta_meta_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = _ta_meta_alloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
