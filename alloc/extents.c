/* extents.c - two sets of address ranges the scan must know:
 *
 *   own      the mappings the ledger made for itself (and the preload's raw
 *            region): never roots, never blocks;
 *   program  the mappings the program made with mmap (recorded by the
 *            preload's mmap, munmap and mremap): roots of the scan, as
 *            memcheck scans every mapping of the client's.  Python keeps
 *            its small objects (type dicts, lists of malloc'd buffers) in
 *            mmap'd arenas; without these roots their malloc'd blocks look
 *            lost.
 *
 * Each set is an unsorted array in a mapping of its own (in the program's
 * .bss, with the ledger linked statically, the scan would read them as
 * roots), under a spin lock that is innermost: nothing is called while it
 * is held. */
#include "internal.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
  _Atomic int lock;
  uintptr_t *lo, *hi;
  size_t n, max;
} rangeset;

static rangeset own = { .max = 8192 };
static rangeset program = { .max = 65536 };

void *_ta_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off) {
  long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : (void *)r;
}

int _ta_sys_munmap(void *p, size_t len) { return (int)syscall(SYS_munmap, p, len); }

static void lock(rangeset *s) {
  while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire))
    while (atomic_load_explicit(&s->lock, memory_order_relaxed)) __builtin_ia32_pause();
}

static void unlock(rangeset *s) { atomic_store_explicit(&s->lock, 0, memory_order_release); }

static void range_add(rangeset *s, uintptr_t lo, uintptr_t hi) {
  if (hi <= lo) return;
  lock(s);
  if (s->lo == NULL) {
    size_t len = 2 * s->max * sizeof(uintptr_t);
    void *v = _ta_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
    if (v == MAP_FAILED) { unlock(s); return; }
    s->lo = v;
    s->hi = s->lo + s->max;
    if (s != &own) range_add(&own, (uintptr_t)v, (uintptr_t)v + len);
    else {                              /* the array is the ledger's own too */
      s->lo[0] = (uintptr_t)v;
      s->hi[0] = (uintptr_t)v + len;
      s->n = 1;
    }
  }
  if (s->n < s->max) {
    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->n++;
  }
  unlock(s);
}

/* Takes [lo, hi) out of the recorded ranges (splitting one if needed). */
static void range_remove(rangeset *s, uintptr_t lo, uintptr_t hi) {
  lock(s);
  for (size_t i = 0; i < s->n; i++) {
    if (hi <= s->lo[i] || lo >= s->hi[i]) continue;
    uintptr_t a = s->lo[i], b = s->hi[i];
    if (lo > a && hi < b) {                                 /* a hole in the middle */
      s->hi[i] = lo;
      if (s->n < s->max) {
        s->lo[s->n] = hi;
        s->hi[s->n] = b;
        s->n++;
      }
    } else if (lo <= a && hi >= b) {                        /* all of it */
      s->lo[i] = s->lo[s->n - 1];
      s->hi[i] = s->hi[s->n - 1];
      s->n--;
      i--;
    } else if (lo <= a) {
      s->lo[i] = hi;
    } else {
      s->hi[i] = lo;
    }
  }
  unlock(s);
}

static size_t range_copy(rangeset *s, uintptr_t *lo, uintptr_t *hi, size_t max) {
  lock(s);
  size_t n = s->n < max ? s->n : max;
  for (size_t i = 0; i < n; i++) {
    lo[i] = s->lo[i];
    hi[i] = s->hi[i];
  }
  unlock(s);
  return n;
}

void *_ta_mmap(size_t len) {
  void *p = _ta_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  range_add(&own, (uintptr_t)p, (uintptr_t)p + len);
  return p;
}

void _ta_munmap(void *p, size_t len) {
  if (p && _ta_sys_munmap(p, len) == 0) range_remove(&own, (uintptr_t)p, (uintptr_t)p + len);
}

void _ta_own_range(uintptr_t lo, uintptr_t hi) { range_add(&own, lo, hi); }

size_t _ta_own_ranges(uintptr_t *lo, uintptr_t *hi, size_t max) { return range_copy(&own, lo, hi, max); }

/* A mapping (or a new place of one) replaces whatever was recorded there:
 * MAP_FIXED over an older mapping, or an mremap. */
void _ta_program_map(uintptr_t lo, uintptr_t hi) {
  range_remove(&program, lo, hi);
  range_add(&program, lo, hi);
}

void _ta_program_unmap(uintptr_t lo, uintptr_t hi) { range_remove(&program, lo, hi); }

size_t _ta_program_maps(uintptr_t *lo, uintptr_t *hi, size_t max) {
  return range_copy(&program, lo, hi, max);
}

size_t _ta_program_maps_count(void) {
  lock(&program);
  size_t n = program.n;
  unlock(&program);
  return n;
}

/* Innermost locks: taken last before fork, released first after. */
void _ta_extents_fork(int phase) {
  if (phase == TA_FORK_PREPARE) {
    lock(&own);
    lock(&program);
  } else {
    unlock(&program);
    unlock(&own);
  }
}
