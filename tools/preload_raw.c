/* preload_raw.c - raw memory for the shim: allocations the ledger must not
 * see or cannot record.  Two kinds:
 *
 *   internal  made while the ledger itself runs (libdw, libunwind,
 *             pthread_getattr_np, stdio and the symbolizer in a report,
 *             dlsym): the ledger's own memory, never a root of the scan;
 *   runtime   the runtime's blocks: made by ld.so (thread DTVs, dynamic TLS
 *             blocks, link maps), before libc is initialised, by the
 *             preload's own libraries before its constructor (libstdc++'s
 *             exception pool), or by a thread whose ledger state is gone.
 *             Most are gone by the exit scan (libc's freeres frees the
 *             DTVs and ld.so's tables, as under memcheck); those still
 *             live (the link maps of libraries dlopen()ed and never
 *             closed) memcheck counts as the program's, mostly still
 *             reachable.  So the preload keeps the runtime's live blocks
 *             in a set of its own (address and size, no stack: their
 *             allocator is ld.so or a runtime that must not be walked) and
 *             hands them to the scan as blocks tagged "runtime": read and
 *             counted like the program's when reachable, left out when
 *             nothing reaches them (no leak of the program's).  A program block
 *             held only from one (a __thread variable of a dlopen()ed
 *             library lives in a dynamic TLS block) is reachable, as
 *             under memcheck.
 *
 * Raw memory is one reserved range of address space, in two halves, each
 * the extents of a jemalloc arena of its own made with extent hooks that
 * carve every extent from its half.  So telling a raw pointer from a ledger
 * block on free() is a range check: no table, no lock.  Extents are never
 * given back (dalloc opts out: jemalloc retains and reuses them), so each
 * half is a bump allocator that jemalloc recycles.  The internal half is
 * read-write from the start (MAP_NORESERVE: touched only as used) and
 * registered as the ledger's own mapping (_ta_own_range); the runtime half
 * stays PROT_NONE but for the extents handed out, so a scan of the readable
 * and writable mappings would read only those.
 *
 * One exception: in a thread whose jemalloc state is already destroyed (a
 * TSD destructor that runs after jemalloc's, __libc_thread_freeres),
 * jemalloc ignores MALLOCX_ARENA and serves arena 0.  Such "stray" raw
 * blocks are kept in a small set (open addressing in mmap'd memory, its own
 * lock; lookups take no lock), consulted only while it is not empty.
 *
 * Raw calls never use the thread cache (MALLOCX_TCACHE_NONE): a raw block
 * parked in a tcache would come back from a plain mallocx as a ledger block
 * inside the raw range. */
#include "preload.h"
#include "extent_hooks.h"

#include <jemalloc/jemalloc.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>

uintptr_t _pl_raw_lo, _pl_raw_len, _pl_raw_mid;

typedef struct {
  _Atomic uintptr_t bump;                 /* next free address of the half */
  uintptr_t end;
  bool protect;                           /* PROT_NONE until handed out */
  int flags;                              /* MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE */
} half;

static half halves[2];                    /* 0 internal, 1 runtime */
static atomic_int raw_state;              /* 0 not made, 1 making, 2 ready, 3 failed */

/* ---- stray raw blocks -------------------------------------------------------- */

#define STRAY_CAP (1u << 16)              /* slots; a power of two */
#define STRAY_TOMB ((uintptr_t)1)
static _Atomic uintptr_t *stray;          /* mmap'd: 0 empty, 1 deleted, else a block */
_Atomic uint32_t _pl_stray_n;             /* blocks in the set */
static uint32_t stray_used;               /* slots not empty (blocks and tombstones) */
static atomic_int stray_lock;

static void slock(void) { while (atomic_exchange_explicit(&stray_lock, 1, memory_order_acquire)) sched_yield(); }
static void sunlock(void) { atomic_store_explicit(&stray_lock, 0, memory_order_release); }

static inline uint32_t stray_slot(uintptr_t p) {
  return (uint32_t)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 48) & (STRAY_CAP - 1);
}

bool _pl_stray_has(const void *p) {
  _Atomic uintptr_t *t = stray;
  if (t == NULL) return false;
  uintptr_t key = (uintptr_t)p;
  for (uint32_t i = stray_slot(key), k = 0; k < STRAY_CAP; i = (i + 1) & (STRAY_CAP - 1), k++) {
    uintptr_t v = atomic_load_explicit(&t[i], memory_order_acquire);
    if (v == key) return true;
    if (v == 0) return false;
  }
  return false;
}

static void stray_add(void *p) {
  slock();
  if (stray == NULL) {
    void *m = _ta_mmap(STRAY_CAP * sizeof *stray);
    if (m) stray = m;
  }
  /* Only tombstones left: start over (no reader looks for a block then). */
  if (stray && atomic_load(&_pl_stray_n) == 0 && stray_used > STRAY_CAP / 2) {
    memset((void *)stray, 0, STRAY_CAP * sizeof *stray);
    stray_used = 0;
  }
  if (stray && stray_used < STRAY_CAP - STRAY_CAP / 8) {
    uint32_t i = stray_slot((uintptr_t)p);
    while (atomic_load_explicit(&stray[i], memory_order_relaxed) > STRAY_TOMB) i = (i + 1) & (STRAY_CAP - 1);
    if (atomic_load_explicit(&stray[i], memory_order_relaxed) == 0) stray_used++;
    atomic_store_explicit(&stray[i], (uintptr_t)p, memory_order_release);
    atomic_fetch_add(&_pl_stray_n, 1);
  }
  sunlock();
}

static void stray_del(void *p) {
  if (atomic_load_explicit(&_pl_stray_n, memory_order_relaxed) == 0 || stray == NULL) return;
  slock();
  for (uint32_t i = stray_slot((uintptr_t)p), k = 0; k < STRAY_CAP; i = (i + 1) & (STRAY_CAP - 1), k++) {
    uintptr_t v = atomic_load_explicit(&stray[i], memory_order_relaxed);
    if (v == 0) break;
    if (v == (uintptr_t)p) {
      atomic_store_explicit(&stray[i], STRAY_TOMB, memory_order_release);
      atomic_fetch_sub(&_pl_stray_n, 1);
      break;
    }
  }
  sunlock();
}

/* ---- the runtime's live blocks ------------------------------------------- */

/* Open addressing in mmap'd memory (the ledger's own, never a root), under
 * a spin lock that is innermost; it starts at 256 slots (a page or two:
 * most processes have a few dozen such blocks) and doubles at half full,
 * tombstones counted. */
typedef struct { uintptr_t addr; uint64_t size; } rt_slot;    /* addr 0 empty, 1 deleted */

static rt_slot *rt_tab;
static uint32_t rt_cap, rt_used;
static atomic_int rt_lock;

static void rlock(void) { while (atomic_exchange_explicit(&rt_lock, 1, memory_order_acquire)) sched_yield(); }
static void runlock(void) { atomic_store_explicit(&rt_lock, 0, memory_order_release); }

static inline uint32_t rt_home(uintptr_t p, uint32_t cap) {
  return (uint32_t)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
}

static void rt_put(rt_slot *tab, uint32_t cap, uintptr_t p, uint64_t size) {
  uint32_t i = rt_home(p, cap);
  while (tab[i].addr > STRAY_TOMB) i = (i + 1) & (cap - 1);
  tab[i] = (rt_slot){ p, size };
}

/* Room for one more (lock held): a table twice the size, live entries only. */
static bool rt_room(void) {
  if (rt_tab && (rt_used + 1) * 2 <= rt_cap) return true;
  uint32_t live = 0;
  for (uint32_t i = 0; i < rt_cap; i++) live += rt_tab[i].addr > STRAY_TOMB;
  uint32_t cap = 256;
  while ((live + 1) * 4 > cap) cap *= 2;
  rt_slot *n = _ta_mmap(cap * sizeof *n);
  if (n == NULL) return false;
  for (uint32_t i = 0; i < rt_cap; i++)
    if (rt_tab[i].addr > STRAY_TOMB) rt_put(n, cap, rt_tab[i].addr, rt_tab[i].size);
  if (rt_tab) _ta_munmap(rt_tab, rt_cap * sizeof *rt_tab);
  rt_tab = n;
  rt_cap = cap;
  rt_used = live;
  return true;
}

static void rt_add(void *p, uint64_t size) {
  rlock();
  if (rt_room()) {
    rt_put(rt_tab, rt_cap, (uintptr_t)p, size);
    rt_used++;
  }
  runlock();
}

/* Takes p out; its size in *size.  False if p is no runtime block. */
static bool rt_take(void *p, uint64_t *size) {
  bool found = false;
  rlock();
  if (rt_tab) {
    for (uint32_t i = rt_home((uintptr_t)p, rt_cap), k = 0; k < rt_cap; i = (i + 1) & (rt_cap - 1), k++) {
      if (rt_tab[i].addr == 0) break;
      if (rt_tab[i].addr == (uintptr_t)p) {
        *size = rt_tab[i].size;
        rt_tab[i].addr = STRAY_TOMB;
        found = true;
        break;
      }
    }
  }
  runlock();
  return found;
}

ta_tag _pl_runtime_tag;

/* For the scan (_ta_scan_more): every live runtime block.  A bounded wait
 * for the lock: a fatal signal's scan may run on a thread that holds it
 * (then the runtime's blocks go uncounted rather than the scan hanging). */
void _pl_runtime_blocks(void (*add)(uintptr_t addr, uint64_t size, ta_tag tag, void *arg), void *arg) {
  for (int k = 0; atomic_exchange_explicit(&rt_lock, 1, memory_order_acquire); k++) {
    if (k == 10000) return;
    sched_yield();
  }
  for (uint32_t i = 0; rt_tab && i < rt_cap; i++)
    if (rt_tab[i].addr > STRAY_TOMB) add(rt_tab[i].addr, rt_tab[i].size, _pl_runtime_tag, arg);
  runlock();
}

void _pl_raw_fork_child(void) {
  atomic_store(&stray_lock, 0);
  atomic_store(&rt_lock, 0);
}

static inline bool in_range(const void *p) { return (uintptr_t)p - _pl_raw_lo < _pl_raw_len; }

/* ---- extent hooks -------------------------------------------------------- */

static void *carve(half *h, void *new_addr, size_t size, size_t alignment, bool *zero, bool *commit) {
  if (new_addr != NULL) return NULL;       /* growing in place: not from a bump range */
  uintptr_t start = _ta_extent_carve(&h->bump, h->end, size, alignment);
  if (start == 0) return NULL;
  if (h->protect && mprotect((void *)start, size, PROT_READ | PROT_WRITE) != 0) return NULL;
  *zero = true;                            /* never used before: the kernel's zero pages */
  *commit = true;
  return (void *)start;
}

static void *rx_alloc_internal(extent_hooks_t *hk, void *new_addr, size_t size, size_t alignment,
                               bool *zero, bool *commit, unsigned ind) {
  (void)hk;
  (void)ind;
  return carve(&halves[0], new_addr, size, alignment, zero, commit);
}

static void *rx_alloc_runtime(extent_hooks_t *hk, void *new_addr, size_t size, size_t alignment,
                              bool *zero, bool *commit, unsigned ind) {
  (void)hk;
  (void)ind;
  return carve(&halves[1], new_addr, size, alignment, zero, commit);
}
/* Extents are never given back (jemalloc retains and reuses them): the
 * rest of the hooks are the ledger's shared ones (alloc/extent_hooks.h). */
static extent_hooks_t hooks_internal = {
  rx_alloc_internal, _ta_extent_keep, _ta_extent_destroy, _ta_extent_commit, _ta_extent_optout,
  _ta_extent_optout, _ta_extent_optout, _ta_extent_split, _ta_extent_merge,
};
static extent_hooks_t hooks_runtime = {
  rx_alloc_runtime, _ta_extent_keep, _ta_extent_destroy, _ta_extent_commit, _ta_extent_optout,
  _ta_extent_optout, _ta_extent_optout, _ta_extent_split, _ta_extent_merge,
};

/* ---- setup ----------------------------------------------------------------- */

static bool make_arena(half *h, extent_hooks_t *hooks) {
  unsigned ind = 0;
  size_t sz = sizeof ind;
  if (mallctl("arenas.create", &ind, &sz, &hooks, sizeof hooks) != 0) return false;
  h->flags = (int)(MALLOCX_ARENA(ind) | MALLOCX_TCACHE_NONE);
  return true;
}

/* Reserves the range (as large as the address-space limit allows) and makes
 * the arenas.  Runs once, from whichever thread first needs raw memory; the
 * others wait.  jemalloc never calls malloc, so nothing here recurses. */
static bool raw_setup(void) {
  int s = atomic_load_explicit(&raw_state, memory_order_acquire);
  if (TA_LIKELY(s == 2)) return true;
  if (s == 3) return false;
  int zero = 0;
  if (!atomic_compare_exchange_strong(&raw_state, &zero, 1)) {
    while ((s = atomic_load_explicit(&raw_state, memory_order_acquire)) == 1) sched_yield();
    return s == 2;
  }
  static const size_t sizes[] = { (size_t)128 << 30, (size_t)16 << 30, (size_t)2 << 30, (size_t)512 << 20 };
  void *base = MAP_FAILED;
  size_t len = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes && base == MAP_FAILED; i++) {
    len = sizes[i];
    base = _ta_sys_mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  uintptr_t lo = (uintptr_t)base, mid = lo + len / 2;
  bool ok = base != MAP_FAILED && mprotect(base, len / 2, PROT_READ | PROT_WRITE) == 0;
  if (ok) {
    _ta_own_range(lo, mid);                /* the internal half: never a root */
    halves[0] = (half){ .end = mid, .protect = false };
    halves[1] = (half){ .end = lo + len, .protect = true };
    atomic_store(&halves[0].bump, lo);
    atomic_store(&halves[1].bump, mid);
    ok = make_arena(&halves[0], &hooks_internal) && make_arena(&halves[1], &hooks_runtime);
  }
  if (!ok) {
    if (base != MAP_FAILED) _ta_sys_munmap(base, len);
    atomic_store(&raw_state, 3);
    return false;
  }
  /* lo and mid before len: a reader that sees the length sees the rest */
  __atomic_store_n(&_pl_raw_lo, lo, __ATOMIC_RELEASE);
  __atomic_store_n(&_pl_raw_mid, mid, __ATOMIC_RELEASE);
  __atomic_store_n(&_pl_raw_len, len, __ATOMIC_RELEASE);
  atomic_store_explicit(&raw_state, 2, memory_order_release);
  return true;
}

void *_pl_raw_alloc(size_t size, size_t align, bool zero, bool runtime, bool counted) {
  if (!raw_setup()) return NULL;
  int flags = halves[runtime].flags | (zero ? MALLOCX_ZERO : 0);
  if (align > 8) flags |= (int)MALLOCX_ALIGN(align);
  void *p = mallocx(size ? size : 1, flags);
  if (p && !in_range(p)) stray_add(p);
  if (p && counted) rt_add(p, size);
  return p;
}

/* A block the ledger's own work made (the internal half) is never one of
 * the runtime's counted blocks: no look in their set. */
static inline bool maybe_counted(const void *p) {
  return !in_range(p) || (uintptr_t)p >= _pl_raw_mid;
}

void *_pl_raw_realloc(void *p, size_t size) {
  bool was_stray = !in_range(p);
  uint64_t old = 0;
  bool was_rt = maybe_counted(p) && rt_take(p, &old);
  void *n = rallocx(p, size ? size : 1, halves[(uintptr_t)p >= _pl_raw_mid].flags);
  if (n && n != p) {
    if (was_stray) stray_del(p);
    if (!in_range(n)) stray_add(n);
  }
  if (was_rt) rt_add(n ? n : p, n ? size : old);
  return n;
}

void _pl_raw_free(void *p) {
  uint64_t size;
  if (maybe_counted(p)) rt_take(p, &size);
  if (!in_range(p)) stray_del(p);
  dallocx(p, MALLOCX_TCACHE_NONE);
}

size_t _pl_raw_usable(const void *p) {
  return sallocx(p, 0);
}
