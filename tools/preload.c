/* preload.c - the LD_PRELOAD shim's allocation functions.
 *
 * malloc, free, calloc, realloc, reallocarray, posix_memalign, aligned_alloc,
 * memalign, valloc, pvalloc, malloc_usable_size, glibc's __libc_* names of
 * them, and every replaceable C++ operator new/delete (sized, nothrow,
 * align_val_t) go to the ledger.  Each exported function is noinline and
 * captures the stack itself (_ta_stack_capture(1): frame #0 is its caller,
 * the program) before calling _ta_alloc_at/_ta_free_at/_ta_realloc_at; the
 * bodies they share are always_inline, so that they add no frame.  Tags:
 * "malloc" for the C functions, "new" and "new[]" for the C++ operators.
 *
 * The recursion guard.  _pl_enter() raises the calling thread's ledger
 * guard (ta_thread.guard) around each ledger call.  An allocation that
 * finds the guard already raised comes from inside the ledger (libdw,
 * libunwind, pthread_getattr_np, stdio in a report, dlsym's error buffer),
 * and is served raw (preload_raw.c) - so is one made before the ledger can
 * run: the first mallocs come from ld.so and libc before libc has set
 * `environ`, which the ledger's options need.  A raw pointer is freed
 * silently wherever it is freed (a range check).  A free of a pointer that
 * is not raw while the guard is up, or from a thread whose ledger state is
 * already gone (frees made by glibc after the thread's TSD destructors ran),
 * is deferred: queued, and done by the next free() of a thread that can
 * call the ledger (or at exit), so the ledger sees it as a normal free.
 * Anything else the ledger does not know is its free.invalid finding.
 *
 * Errors are glibc's: NULL with errno ENOMEM for sizes over PTRDIFF_MAX and
 * failed allocations; posix_memalign returns EINVAL for an alignment that is
 * not a power of two multiple of sizeof(void *); memalign and aligned_alloc
 * follow glibc 2.36 (an alignment that is not a power of two is rounded up,
 * EINVAL above SIZE_MAX / 2 + 1).  Successful calls leave errno alone;
 * free() never changes it. */
#include "preload.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern char **environ;

static ta_tag tag_malloc, tag_new, tag_new_arr;
static atomic_bool live;                  /* the ledger has started */
/* 0: this thread never entered; 1: it has ledger state; 2: making it now */
static PL_TLS int tl_state;

static uintptr_t ldso_lo, ldso_len;      /* ld.so's range (below) */
static int find_ldso(struct dl_phdr_info *info, size_t size, void *arg);
extern void *__tls_get_addr(void *);

bool _pl_ledger_live(void) { return atomic_load_explicit(&live, memory_order_relaxed); }

/* ---- entering the ledger -------------------------------------------------- */

/* The first entry of a thread: starts the ledger once libc is initialised,
 * makes the thread's state.  NULL: serve this call raw. */
static TA_NOINLINE ta_thread *enter_slow(ta_thread *t) {
  if (t != NULL) return NULL;               /* the guard is up: inside the ledger */
  if (tl_state != 0) return NULL;           /* making the state now, or it is gone (exiting) */
  if (!atomic_load(&live) && environ == NULL) return NULL;   /* libc not initialised yet */
  tl_state = 2;                             /* what the ledger allocates now is raw */
  _ta_ensure();
  if (!atomic_load(&live)) {                /* idempotent: ta_tag_get returns the same ids */
    if (ldso_len == 0) dl_iterate_phdr(find_ldso, (void *)(uintptr_t)&__tls_get_addr);
    tag_malloc = ta_tag_get("malloc");
    tag_new = ta_tag_get("new");
    tag_new_arr = ta_tag_get("new[]");
    atomic_store(&live, true);
    _pl_early_maps_record();              /* the mappings made before (preload_map.c) */
  }
  t = _ta_thread();
  tl_state = 1;
  if (t->guard != 0) return NULL;
  t->guard = 1;
  return t;
}

static inline __attribute__((always_inline)) ta_thread *enter(void) {
  ta_thread *t = _ta_self;
  if (TA_LIKELY(t != NULL && t->guard == 0)) {
    t->guard = 1;
    return t;
  }
  return enter_slow(t);
}

ta_thread *_pl_enter(void) { return enter(); }

/* ---- libraries only the preload brought ------------------------------------------ */

/* The preload's own dependencies (libdw, libelf, libunwind, ...; and
 * libjemalloc.so with its libstdc++ when jemalloc is not linked in
 * statically, see the Makefile) are loaded into every process it audits,
 * and their initialisers run before its constructor; libstdc++'s allocates
 * its exception pool then.  Valgrind does not see those libraries in a C
 * program, so the shim does not either: until its constructor has run, an
 * allocation called from a library that neither the program nor another
 * preloaded library needs is served raw. */

typedef struct { uintptr_t lo, hi; } range;
static range own_libs[64];
static int n_own_libs;
static range self_range;                  /* the preload itself (jemalloc is linked in) */
static atomic_int own_state;              /* 0 not known, 1 finding out, 2 known */
static atomic_bool ctor_done;

void _pl_ctor_done(void) { atomic_store(&ctor_done, true); }

typedef struct {
  const char *name, *soname;
  const ElfW(Dyn) *dyn;
  const char *strtab;
  uintptr_t lo, hi;
  bool keep, self;
} lib;

static lib libs[256];
static int nlibs;

static int collect_lib(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  if (nlibs == (int)(sizeof libs / sizeof *libs)) return 1;
  lib *l = &libs[nlibs++];
  memset(l, 0, sizeof *l);
  l->name = info->dlpi_name ? info->dlpi_name : "";
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_DYNAMIC) l->dyn = (const ElfW(Dyn) *)a;
    if (ph->p_type != PT_LOAD) continue;
    if (l->lo == 0 || a < l->lo) l->lo = a;
    if (a + ph->p_memsz > l->hi) l->hi = a + ph->p_memsz;
  }
  l->self = (uintptr_t)&collect_lib >= l->lo && (uintptr_t)&collect_lib < l->hi;
  for (const ElfW(Dyn) *d = l->dyn; d && d->d_tag != DT_NULL; d++)
    if (d->d_tag == DT_STRTAB) {
      uintptr_t s = d->d_un.d_ptr;
      l->strtab = (const char *)(s < info->dlpi_addr ? s + info->dlpi_addr : s);   /* vdso: not relocated */
    }
  for (const ElfW(Dyn) *d = l->dyn; d && l->strtab && d->d_tag != DT_NULL; d++)
    if (d->d_tag == DT_SONAME) l->soname = l->strtab + d->d_un.d_val;
  return 0;
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static lib *lib_named(const char *needed) {
  for (int i = 0; i < nlibs; i++)
    if ((libs[i].soname && strcmp(libs[i].soname, needed) == 0) || strcmp(base_name(libs[i].name), needed) == 0)
      return &libs[i];
  return NULL;
}

static void keep(lib *l, lib **queue, int *nq) {
  if (!l || l->keep || l->self) return;
  l->keep = true;
  queue[(*nq)++] = l;
}

/* The libraries the program needs: its DT_NEEDED closure, and the other
 * LD_PRELOAD entries'; the rest (but ld.so and the vdso) are the preload's. */
static void find_own_libs(void) {
  nlibs = 0;
  dl_iterate_phdr(collect_lib, NULL);
  lib *queue[256];
  int nq = 0;
  if (nlibs) keep(&libs[0], queue, &nq);   /* the program */
  const char *pre = getenv("LD_PRELOAD");
  for (const char *p = pre; p && *p;) {
    while (*p == ':' || *p == ' ') p++;
    const char *s = p;
    while (*p && *p != ':' && *p != ' ') p++;
    char name[512];
    size_t n = (size_t)(p - s);
    if (n == 0 || n >= sizeof name) continue;
    memcpy(name, s, n);
    name[n] = '\0';
    for (int i = 0; i < nlibs; i++)
      if (strcmp(libs[i].name, name) == 0 || strcmp(base_name(libs[i].name), base_name(name)) == 0)
        keep(&libs[i], queue, &nq);
  }
  for (int q = 0; q < nq; q++)
    for (const ElfW(Dyn) *d = queue[q]->dyn; d && queue[q]->strtab && d->d_tag != DT_NULL; d++)
      if (d->d_tag == DT_NEEDED) keep(lib_named(queue[q]->strtab + d->d_un.d_val), queue, &nq);
  n_own_libs = 0;
  for (int i = 0; i < nlibs && n_own_libs < (int)(sizeof own_libs / sizeof *own_libs); i++) {
    lib *l = &libs[i];
    if (l->self) self_range = (range){ l->lo, l->hi };
    if (l->keep || l->self || !l->dyn || !l->name[0] || strstr(l->name, "ld-linux") || strstr(l->name, "vdso"))
      continue;
    own_libs[n_own_libs++] = (range){ l->lo, l->hi };
  }
}

/* Before the constructor: is this caller in one of the preload's own
 * libraries?  (dl_iterate_phdr neither allocates nor takes a lock that an
 * allocation holds.) */
static TA_NOINLINE bool from_own_lib(uintptr_t ra) {
  int zero = 0;
  if (atomic_compare_exchange_strong(&own_state, &zero, 1)) {
    find_own_libs();
    atomic_store(&own_state, 2);
  }
  if (atomic_load(&own_state) != 2) return false;
  for (int i = 0; i < n_own_libs; i++)
    if (ra >= own_libs[i].lo && ra < own_libs[i].hi) return true;
  return false;
}

/* Code of the preload or of a library only it brought (any time). */
bool _pl_own_code(uintptr_t ra) {
  if (from_own_lib(ra)) return true;
  return atomic_load(&own_state) == 2 && ra >= self_range.lo && ra < self_range.hi;
}

#define PRE_CTOR_OWN(ra) \
  (TA_UNLIKELY(!atomic_load_explicit(&ctor_done, memory_order_relaxed)) && from_own_lib((uintptr_t)(ra)))

/* The dynamic linker's own allocations (thread DTVs and dynamic TLS, the
 * dl_find_object tables, link maps) are the runtime's: memcheck frees or
 * ignores them (--run-libc-freeres), and so does the shim: an allocation
 * called from ld.so is raw.  Its range is known once the ledger starts. */
static int find_ldso(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  uintptr_t a = (uintptr_t)arg, lo = 0, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t l = info->dlpi_addr + ph->p_vaddr;
    if (lo == 0 || l < lo) lo = l;
    if (l + ph->p_memsz > hi) hi = l + ph->p_memsz;
  }
  if (a < lo || a >= hi) return 0;
  ldso_lo = lo;
  ldso_len = hi - lo;
  return 1;
}

#define FROM_LDSO(ra) TA_UNLIKELY((uintptr_t)(ra) - ldso_lo < ldso_len)
#define RUNTIME_OWN(ra) (FROM_LDSO(ra) || PRE_CTOR_OWN(ra))

/* ---- deferred frees ------------------------------------------------------------ */

typedef struct { void *p; uint32_t stack; } deferred;

#define DEFER_CAP (1u << 16)
static deferred *defer_q;                 /* mmap'd, DEFER_CAP entries */
static _Atomic uint32_t defer_n;
static atomic_int defer_lock;
static uint64_t defer_dropped;

static void dlock(void) {
  while (atomic_exchange_explicit(&defer_lock, 1, memory_order_acquire)) sched_yield();
}
static void dunlock(void) { atomic_store_explicit(&defer_lock, 0, memory_order_release); }

static TA_NOINLINE void defer_free(void *p, uint32_t stack) {
  dlock();
  if (defer_q == NULL) {
    void *q = _ta_mmap(DEFER_CAP * sizeof *defer_q);   /* the ledger's own: not a root */
    if (q) defer_q = q;
  }
  uint32_t n = atomic_load_explicit(&defer_n, memory_order_relaxed);
  if (defer_q && n < DEFER_CAP) {
    defer_q[n] = (deferred){ p, stack };
    atomic_store_explicit(&defer_n, n + 1, memory_order_release);
  } else {
    defer_dropped++;                      /* the block stays live in the ledger */
  }
  dunlock();
}

void _pl_fork_child_locks(void) {
  atomic_store(&defer_lock, 0);
  _pl_raw_fork_child();
}

/* The guard is held by the caller. */
void _pl_drain_deferred(void) {
  deferred batch[64];
  for (;;) {
    dlock();
    uint32_t n = atomic_load_explicit(&defer_n, memory_order_relaxed), k = n < 64 ? n : 64;
    memcpy(batch, defer_q + (n - k), k * sizeof *batch);
    atomic_store_explicit(&defer_n, n - k, memory_order_release);
    dunlock();
    if (k == 0) return;
    for (uint32_t i = 0; i < k; i++) _ta_free_at(batch[i].p, batch[i].stack);
  }
}

/* A free that cannot go to the ledger now: a thread whose ledger state is
 * gone captures its stack (the unwinder's allocations are raw then). */
static TA_NOINLINE void free_later(void *p, bool capture) {
  uint32_t stack = 0;
  if (capture && atomic_load(&live) && tl_state == 1 && _ta_self == NULL) stack = _ta_stack_capture(2);
  defer_free(p, stack);
}

/* ---- shared bodies (always_inline: no frame of their own) --------------------- */

#define BODY static inline __attribute__((always_inline))
#define RA __builtin_return_address(0)   /* in an exported function: its caller */

/* Raw memory of which kind: the ledger's own (made inside it), or the
 * runtime's (before the ledger started, in an exiting thread, ld.so's). */
static inline bool inside_ledger(void) {
  ta_thread *t = _ta_self;
  return (t && t->guard > 0) || tl_state == 2;
}

static TA_NOINLINE void *raw_or_enomem(size_t size, size_t align, bool zero, bool runtime) {
  void *p = size <= PTRDIFF_MAX ? _pl_raw_alloc(size, align, zero, runtime, runtime && !inside_ledger()) : NULL;
  if (p == NULL) errno = ENOMEM;
  return p;
}

/* Allocation `size` aligned to `align` (0: malloc's), zeroed or not. */
BODY void *alloc_body(ta_tag *tagp, size_t size, size_t align, bool zero, void *ra) {
  if (RUNTIME_OWN(ra)) return raw_or_enomem(size, align, zero, true);
  ta_thread *t = enter();
  if (TA_UNLIKELY(t == NULL)) return raw_or_enomem(size, align, zero, !inside_ledger());
  int *ep = &errno, e = *ep;
  void *p = NULL;
  if (TA_LIKELY(size <= TA_BESIDE_MAX) && TA_LIKELY(_ta_beside_on) && align == 0) {
    p = _ta_alloc_beside(*tagp, size, zero, _ta_stack_capture(1));   /* leaks mode: its record beside it */
  } else if (TA_LIKELY(size <= PTRDIFF_MAX)) {
    void *raw = _ta_alloc_raw(size, align, zero);   /* its table slot loads ... */
    uint32_t stack = _ta_stack_capture(1);          /* ... while the stack is taken */
    p = _ta_alloc_record(raw, *tagp, size, zero, stack);
  }
  _pl_leave(t);
  *ep = p ? e : ENOMEM;
  return p;
}

BODY void free_body(void *p) {
  if (p == NULL) return;
  if (_pl_is_raw(p)) {
    _pl_raw_free(p);
    return;
  }
  int *ep = &errno, e = *ep;
  ta_thread *t = enter();
  if (TA_LIKELY(t != NULL)) {
    /* leaks mode takes no free stack: only a bad free's, found without
     * one; nor a prefetch of the record, which the lookup would follow at
     * once: nothing to hide its load behind */
    bool quiet = TA_UNLIKELY(_ta_opt.check == TA_CHECK_LEAKS || _pl_in_freeres);
    bool done = quiet && _ta_free_quiet(p);
    if (!done) {
      if (!quiet) _ta_block_prefetch(p);  /* its record loads while the stack is taken */
      _ta_free_at(p, TA_UNLIKELY(_pl_in_freeres) ? 0 : _ta_stack_capture(1));
    }
    if (TA_UNLIKELY(atomic_load_explicit(&defer_n, memory_order_relaxed) != 0)) _pl_drain_deferred();
    _pl_leave(t);
  } else if (atomic_load_explicit(&live, memory_order_relaxed)) {
    free_later(p, true);
  }
  /* else: before the ledger started no block of its exists: a pointer of
   * ld.so's own early allocator, or garbage; nothing to do */
  *ep = e;
}

/* realloc when the ledger cannot be called: raw memory, the old block
 * (if it is a ledger block) freed later. */
static TA_NOINLINE void *realloc_unguarded(void *p, size_t size) {
  if (_pl_is_raw(p)) {
    if (size == 0) {
      _pl_raw_free(p);
      return NULL;
    }
    void *n = _pl_raw_realloc(p, size);
    if (n == NULL) errno = ENOMEM;
    return n;
  }
  if (size == 0) {
    free_later(p, false);
    return NULL;
  }
  void *n = raw_or_enomem(size, 0, false, !inside_ledger());
  if (n == NULL) return NULL;
  size_t old = malloc_usable_size(p);
  memcpy(n, p, old < size ? old : size);
  free_later(p, false);
  return n;
}

BODY void *realloc_body(void *p, size_t size, void *ra) {
  if (TA_UNLIKELY(size > PTRDIFF_MAX)) {
    errno = ENOMEM;
    return NULL;
  }
  ta_thread *t = RUNTIME_OWN(ra) && (p == NULL || _pl_is_raw(p)) ? NULL : enter();
  if (TA_UNLIKELY(t == NULL))
    return p ? realloc_unguarded(p, size) : raw_or_enomem(size, 0, false, !inside_ledger());
  int *ep = &errno, e = *ep;
  uint32_t stack = _ta_stack_capture(1);
  void *n;
  if (TA_UNLIKELY(p != NULL && _pl_is_raw(p))) {
    /* A raw block (made before the ledger started) grows into a ledger block. */
    if (size == 0) {
      _pl_raw_free(p);
      n = NULL;
    } else {
      n = _ta_alloc_at(tag_malloc, size, 0, false, stack);
      if (n) {
        size_t old = _pl_raw_usable(p);
        memcpy(n, p, old < size ? old : size);
        _pl_raw_free(p);
      }
    }
  } else {
    n = _ta_realloc_at(tag_malloc, p, size, stack);
  }
  _pl_leave(t);
  *ep = n || size == 0 ? e : ENOMEM;
  return n;
}

/* glibc 2.36's memalign and aligned_alloc: an alignment up to malloc's is
 * malloc; one that is not a power of two is rounded up; EINVAL above
 * SIZE_MAX / 2 + 1. */
static inline size_t glibc_alignment(size_t align, bool *bad) {
  *bad = false;
  if (align > SIZE_MAX / 2 + 1) {
    *bad = true;
    return 0;
  }
  if (align & (align - 1)) {
    size_t a = 1;
    while (a < align) a <<= 1;
    align = a;
  }
  return align;
}

/* The alignment to ask the ledger for: jemalloc gives 16 bytes to every size
 * class but the 8-byte one, and the ledger aligns only beyond 16. */
static inline size_t ledger_alignment(size_t align, size_t size) {
  if (align <= 8) return 0;
  if (align == 16) return size <= 8 ? 32 : 0;
  return align;
}

BODY void *memalign_body(size_t align, size_t size) {
  bool bad;
  align = glibc_alignment(align, &bad);
  if (bad) {
    errno = EINVAL;
    return NULL;
  }
  return alloc_body(&tag_malloc, size, ledger_alignment(align, size), false, RA);
}

/* ---- the C functions ----------------------------------------------------------- */

PL_EXPORT void *malloc(size_t size) { return alloc_body(&tag_malloc, size, 0, false, RA); }

PL_EXPORT void free(void *p) { free_body(p); }

PL_EXPORT void *calloc(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return alloc_body(&tag_malloc, total, 0, true, RA);
}

PL_EXPORT void *realloc(void *p, size_t size) { return realloc_body(p, size, RA); }

PL_EXPORT void *reallocarray(void *p, size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc_body(p, total, RA);
}

PL_EXPORT int posix_memalign(void **out, size_t align, size_t size) {
  if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0) return EINVAL;
  int e = errno;
  void *p = alloc_body(&tag_malloc, size, ledger_alignment(align, size), false, RA);
  errno = e;                                /* glibc: the result says it, errno stays */
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

PL_EXPORT void *aligned_alloc(size_t align, size_t size) { return memalign_body(align, size); }

PL_EXPORT void *memalign(size_t align, size_t size) { return memalign_body(align, size); }

PL_EXPORT void *valloc(size_t size) {
  return alloc_body(&tag_malloc, size, (size_t)sysconf(_SC_PAGESIZE), false, RA);
}

/* pvalloc: the size rounded up to whole pages (one page for 0), page-aligned;
 * the ledger records the rounded size, as glibc counts it. */
PL_EXPORT void *pvalloc(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), rounded;
  if (__builtin_add_overflow(size, page - 1, &rounded)) {
    errno = ENOMEM;
    return NULL;
  }
  rounded &= ~(page - 1);
  return alloc_body(&tag_malloc, rounded ? rounded : page, page, false, RA);
}

PL_EXPORT size_t malloc_usable_size(void *p) {
  if (p == NULL) return 0;
  if (_pl_is_raw(p)) return _pl_raw_usable(p);
  ta_thread *t = enter();
  if (t == NULL) {                          /* inside the ledger: jemalloc's answer, */
    if (_ta_guard_on && _ta_guard_owns((uintptr_t)p)) return 0;   /* not for a guarded page */
    size_t n;
    if (_ta_beside_usable(p, &n)) return n;       /* jemalloc's block starts 16 bytes before it */
    return _pl_raw_usable(p);
  }
  size_t n = ta_usable_size(p);
  _pl_leave(t);
  return n;
}

/* glibc's own names: a program that calls them gets the ledger too. */
PL_EXPORT void *__libc_malloc(size_t size) { return alloc_body(&tag_malloc, size, 0, false, RA); }
PL_EXPORT void __libc_free(void *p) { free_body(p); }
PL_EXPORT void *__libc_calloc(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return alloc_body(&tag_malloc, total, 0, true, RA);
}
PL_EXPORT void *__libc_realloc(void *p, size_t size) { return realloc_body(p, size, RA); }
PL_EXPORT void *__libc_memalign(size_t align, size_t size) { return memalign_body(align, size); }

/* ---- C++ --------------------------------------------------------------------------- */

typedef void (*new_handler_fn)(void);

/* operator new failed: call the new-handler until it gives up (no handler:
 * std::bad_alloc, or NULL for the nothrow forms), trying again after each. */
static TA_NOINLINE void *new_failed(ta_tag tag, size_t size, size_t align, uint32_t stack, bool nothrow) {
  for (;;) {
    new_handler_fn (*get)(void) = NULL;
    void *sym = dlsym(RTLD_DEFAULT, "_ZSt15get_new_handlerv");
    memcpy(&get, &sym, sizeof sym);
    new_handler_fn h = get ? get() : NULL;
    if (h == NULL) {
      if (nothrow) return NULL;
      void (*thrower)(void) = NULL;
      sym = dlsym(RTLD_DEFAULT, "_ZSt17__throw_bad_allocv");
      memcpy(&thrower, &sym, sizeof sym);
      if (thrower) thrower();             /* does not return */
      abort();
    }
    h();
    ta_thread *t = enter();
    void *p;
    if (t) {
      p = _ta_alloc_at(tag, size, align, false, stack);
      _pl_leave(t);
    } else {
      p = size <= PTRDIFF_MAX ? _pl_raw_alloc(size, align, false, !inside_ledger(), !inside_ledger()) : NULL;
    }
    if (p) return p;
  }
}

BODY void *new_body(ta_tag *tagp, size_t size, size_t align, bool nothrow, void *ra) {
  bool runtime = RUNTIME_OWN(ra);
  ta_thread *t = runtime ? NULL : enter();
  void *p;
  uint32_t stack = 0;
  if (TA_LIKELY(t != NULL)) {
    int *ep = &errno, e = *ep;
    if (TA_LIKELY(size <= PTRDIFF_MAX)) {
      stack = _ta_stack_capture(1);
      p = _ta_alloc_at(*tagp, size, ledger_alignment(align, size), false, stack);
    } else {
      p = NULL;
    }
    _pl_leave(t);
    *ep = e;
  } else {
    p = size <= PTRDIFF_MAX ? _pl_raw_alloc(size, align, false, runtime || !inside_ledger(), !inside_ledger()) : NULL;
  }
  if (TA_UNLIKELY(p == NULL)) p = new_failed(*tagp, size, ledger_alignment(align, size), stack, nothrow);
  return p;
}

#define NEW_FN(name, tag, params, align, nothrow) \
  PL_EXPORT void *name params { return new_body(&tag, size, align, nothrow, __builtin_return_address(0)); }
#define DELETE_FN(name, params) \
  PL_EXPORT void name params { free_body(p); }

typedef struct { int dummy; } nothrow_t_;   /* const std::nothrow_t &: a pointer */

/* The sizes, alignments and nothrow tags these forms take are not needed. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"

/* operator new(size_t), new[](size_t), their nothrow and align_val_t forms */
NEW_FN(_Znwm, tag_new, (size_t size), 0, false)
NEW_FN(_Znam, tag_new_arr, (size_t size), 0, false)
NEW_FN(_ZnwmRKSt9nothrow_t, tag_new, (size_t size, const nothrow_t_ *nt), 0, true)
NEW_FN(_ZnamRKSt9nothrow_t, tag_new_arr, (size_t size, const nothrow_t_ *nt), 0, true)
NEW_FN(_ZnwmSt11align_val_t, tag_new, (size_t size, size_t al), al, false)
NEW_FN(_ZnamSt11align_val_t, tag_new_arr, (size_t size, size_t al), al, false)
NEW_FN(_ZnwmSt11align_val_tRKSt9nothrow_t, tag_new, (size_t size, size_t al, const nothrow_t_ *nt), al, true)
NEW_FN(_ZnamSt11align_val_tRKSt9nothrow_t, tag_new_arr, (size_t size, size_t al, const nothrow_t_ *nt), al, true)

/* operator delete and delete[]: plain, sized, nothrow, align_val_t */
DELETE_FN(_ZdlPv, (void *p))
DELETE_FN(_ZdaPv, (void *p))
DELETE_FN(_ZdlPvm, (void *p, size_t size))
DELETE_FN(_ZdaPvm, (void *p, size_t size))
DELETE_FN(_ZdlPvRKSt9nothrow_t, (void *p, const nothrow_t_ *nt))
DELETE_FN(_ZdaPvRKSt9nothrow_t, (void *p, const nothrow_t_ *nt))
DELETE_FN(_ZdlPvSt11align_val_t, (void *p, size_t al))
DELETE_FN(_ZdaPvSt11align_val_t, (void *p, size_t al))
DELETE_FN(_ZdlPvmSt11align_val_t, (void *p, size_t size, size_t al))
DELETE_FN(_ZdaPvmSt11align_val_t, (void *p, size_t size, size_t al))
DELETE_FN(_ZdlPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const nothrow_t_ *nt))
DELETE_FN(_ZdaPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t al, const nothrow_t_ *nt))

#pragma GCC diagnostic pop
