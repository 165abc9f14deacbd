/* preload_map.c - the program's own mappings: mmap, mmap64, munmap, mremap;
 * the break (sbrk, brk) and System V shared memory (shmat, shmdt).
 *
 * Memcheck scans every mapping of the client's for pointers; the ledger's
 * scan reads the modules' writable segments and the threads' stacks and TLS,
 * plus the mappings recorded here (alloc/extents.c).  Python keeps its small
 * objects in mmap'd arenas, V8 its heap: blocks held only from there must
 * not look lost.
 *
 * Every call is made as a system call and recorded when the calling thread
 * is the program's (one made before the ledger starts, by a library's
 * constructor, is kept aside and recorded when it starts): not inside the ledger (jemalloc maps its extents through
 * the libc mmap symbol, which resolves here), and not before the ledger runs
 * in this thread.  The ledger itself never calls these symbols
 * (_ta_sys_mmap). */
#include "preload.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The program's call, not the ledger's (nor jemalloc's inside it).  A
 * thread the ledger has not met yet (one that maps memory before its first
 * malloc) calls for the program too, unless the call comes from the
 * preload's own code or its libraries: jemalloc, linked in, maps through
 * this symbol even then (a block kept only in such a thread's first
 * mapping looked definitely lost; memcheck: still reachable). */
static inline bool programs(uintptr_t ra) {
  if (!_pl_ledger_live()) return false;
  ta_thread *t = _ta_self;
  if (t != NULL) return t->guard == 0;
  return !_pl_own_code(ra);
}

#define RA ((uintptr_t)__builtin_return_address(0))

/* Mappings the program makes before the ledger starts (at the first
 * allocation after libc's start): a library's constructor, as the
 * program's libraries are initialized before this one.  Kept here, and
 * recorded when the ledger starts (_pl_early_maps_record); a block kept
 * only in such a mapping looked definitely lost (memcheck: still
 * reachable).  Past EARLY_MAX the rest are not roots. */
#define EARLY_MAX 64
static uintptr_t early_lo[EARLY_MAX], early_hi[EARLY_MAX];
static int early_n;
static atomic_flag early_lock = ATOMIC_FLAG_INIT;

static void early_take(void) { while (atomic_flag_test_and_set(&early_lock)) sched_yield(); }
static void early_give(void) { atomic_flag_clear(&early_lock); }

/* [lo, hi) is gone from the early mappings; early_lock is held. */
static void early_cut(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < early_n; i++) {
    if (early_hi[i] <= lo || early_lo[i] >= hi) continue;
    if (early_lo[i] < lo && early_hi[i] > hi && early_n < EARLY_MAX) {   /* a hole in the middle */
      early_lo[early_n] = hi;
      early_hi[early_n++] = early_hi[i];
      early_hi[i] = lo;
    } else if (early_lo[i] < lo) {
      early_hi[i] = lo;
    } else if (early_hi[i] > hi) {
      early_lo[i] = hi;
    } else {
      early_n--;
      early_lo[i] = early_lo[early_n];
      early_hi[i] = early_hi[early_n];
      i--;
    }
  }
}

/* A mapping made (add) or unmapped while the ledger has not started: true
 * when noted here, false when the ledger started meanwhile. */
static bool early_note(uintptr_t lo, uintptr_t hi, bool add) {
  early_take();
  bool early = !_pl_ledger_live();
  if (early) {
    early_cut(lo, hi);
    if (add && early_n < EARLY_MAX) {
      early_lo[early_n] = lo;
      early_hi[early_n++] = hi;
    }
  }
  early_give();
  return early;
}

void _pl_early_maps_record(void) {
  early_take();
  for (int i = 0; i < early_n; i++) _ta_program_map(early_lo[i], early_hi[i]);
  early_n = 0;
  early_give();
}

static inline uintptr_t page_up(uintptr_t v) { return (v + 4095) & ~(uintptr_t)4095; }

static inline __attribute__((always_inline))
void *map_body(void *addr, size_t len, int prot, int flags, int fd, off_t off, uintptr_t ra) {
  void *p = _ta_sys_mmap(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && !_pl_ledger_live() && !_pl_own_code(ra) &&
      early_note((uintptr_t)p, page_up((uintptr_t)p + len), true))
    return p;
  if (p != MAP_FAILED && programs(ra)) {
    int saved = errno;
    _ta_program_map((uintptr_t)p, page_up((uintptr_t)p + len));
    errno = saved;
  }
  return p;
}

PL_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return map_body(addr, len, prot, flags, fd, off, RA);
}

PL_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return map_body(addr, len, prot, flags, fd, off, RA);
}

PL_EXPORT int munmap(void *addr, size_t len) {
  int r = _ta_sys_munmap(addr, len);
  if (r == 0 && !_pl_ledger_live() && early_note((uintptr_t)addr, page_up((uintptr_t)addr + len), false))
    return r;
  if (r == 0 && programs(RA)) _ta_program_unmap((uintptr_t)addr, page_up((uintptr_t)addr + len));
  return r;
}

PL_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  void *want = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    want = va_arg(ap, void *);
    va_end(ap);
  }
  long r = syscall(SYS_mremap, old, old_len, new_len, flags, want);
  void *p = r == -1 ? MAP_FAILED : (void *)r;
  if (p != MAP_FAILED && !_pl_ledger_live() && !(flags & MREMAP_DONTUNMAP) &&
      early_note((uintptr_t)old, page_up((uintptr_t)old + old_len), false)) {
    if (!_pl_own_code(RA)) early_note((uintptr_t)p, page_up((uintptr_t)p + new_len), true);
    return p;
  }
  if (p != MAP_FAILED && programs(RA)) {
    int saved = errno;
    if (!(flags & MREMAP_DONTUNMAP))
      _ta_program_unmap((uintptr_t)old, page_up((uintptr_t)old + old_len));
    _ta_program_map((uintptr_t)p, page_up((uintptr_t)p + new_len));
    errno = saved;
  }
  return p;
}

/* ---- the break, and System V shared memory ----------------------------------------- */

/* A mapping made (add) or unmapped (!add) by the caller at ra. */
static void note(uintptr_t lo, uintptr_t hi, bool add, uintptr_t ra) {
  if (lo >= hi) return;
  if (!_pl_ledger_live() && (!add || !_pl_own_code(ra)) && early_note(lo, hi, add)) return;
  if (!programs(ra)) return;
  int saved = errno;
  if (add) _ta_program_map(lo, hi);
  else _ta_program_unmap(lo, hi);
  errno = saved;
}

/* sbrk and brk: a program's allocator of its own may take memory past the
 * break (jemalloc takes it there only when mmap fails, and then it is the
 * preload's own code).  The pages between the old and the new break. */
typedef void *(*sbrk_fn)(intptr_t);
typedef int (*brk_fn)(void *);

PL_EXPORT void *sbrk(intptr_t incr) {
  static sbrk_fn real;
  if (real == NULL) {
    void *s = _pl_next_sym("sbrk");
    memcpy(&real, &s, sizeof s);
    if (real == NULL) { errno = ENOMEM; return (void *)-1; }
  }
  void *old = real(incr);
  if (old != (void *)-1 && incr != 0) {
    uintptr_t o = (uintptr_t)old, n = o + (uintptr_t)incr;
    if (incr > 0) note(o & ~(uintptr_t)4095, page_up(n), true, RA);
    else note(page_up(n), page_up(o), false, RA);
  }
  return old;
}

PL_EXPORT int brk(void *addr) {
  static brk_fn real;
  if (real == NULL) {
    void *s = _pl_next_sym("brk");
    memcpy(&real, &s, sizeof s);
    if (real == NULL) { errno = ENOMEM; return -1; }
  }
  uintptr_t o = (uintptr_t)syscall(SYS_brk, 0), n = (uintptr_t)addr;
  int r = real(addr);
  if (r == 0 && n > o) note(o & ~(uintptr_t)4095, page_up(n), true, RA);
  else if (r == 0 && n < o) note(page_up(n), page_up(o), false, RA);
  return r;
}

/* shmat and shmdt: a segment attached writable is the program's mapping
 * (shared: its pages are read where the page cache has them, scan.c).
 * shmdt names only the address: the sizes of the attached segments are
 * kept here. */
#define SHM_MAX 64
static uintptr_t shm_lo[SHM_MAX], shm_hi[SHM_MAX];
static int shm_n;
static atomic_flag shm_lock = ATOMIC_FLAG_INIT;

typedef void *(*shmat_fn)(int, const void *, int);
typedef int (*shmdt_fn)(const void *);

PL_EXPORT void *shmat(int id, const void *addr, int flags) {
  static shmat_fn real;
  if (real == NULL) {
    void *s = _pl_next_sym("shmat");
    memcpy(&real, &s, sizeof s);
    if (real == NULL) { errno = EINVAL; return (void *)-1; }
  }
  void *p = real(id, addr, flags);
  struct shmid_ds ds;
  if (p != (void *)-1 && !(flags & SHM_RDONLY) && shmctl(id, IPC_STAT, &ds) == 0) {
    uintptr_t lo = (uintptr_t)p, hi = page_up(lo + ds.shm_segsz);
    while (atomic_flag_test_and_set(&shm_lock)) sched_yield();
    if (shm_n < SHM_MAX) {
      shm_lo[shm_n] = lo;
      shm_hi[shm_n++] = hi;
    }
    atomic_flag_clear(&shm_lock);
    note(lo, hi, true, RA);
  }
  return p;
}

PL_EXPORT int shmdt(const void *addr) {
  static shmdt_fn real;
  if (real == NULL) {
    void *s = _pl_next_sym("shmdt");
    memcpy(&real, &s, sizeof s);
    if (real == NULL) { errno = EINVAL; return -1; }
  }
  int r = real(addr);
  if (r != 0) return r;
  uintptr_t lo = (uintptr_t)addr, hi = 0;
  while (atomic_flag_test_and_set(&shm_lock)) sched_yield();
  for (int i = 0; i < shm_n; i++)
    if (shm_lo[i] == lo) {
      hi = shm_hi[i];
      shm_n--;
      shm_lo[i] = shm_lo[shm_n];
      shm_hi[i] = shm_hi[shm_n];
      break;
    }
  atomic_flag_clear(&shm_lock);
  note(lo, hi, false, RA);
  return r;
}
