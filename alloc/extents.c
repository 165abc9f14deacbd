/* extents.c - the mappings the ledger made for itself.
 *
 * For now the scan's roots are the modules' writable segments, the
 * threads' stacks, registers and TLS (scan.c); these ranges are what a
 * scan of every writable mapping, as memcheck does it, would have to leave
 * out.  jemalloc's own memory is not recorded yet. */
#include "internal.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_RANGES 8192

/* The ranges live in a mapping of their own (recorded too): in the
 * program's .bss, when the ledger is linked statically, the scan would read
 * them as roots, and they hold the start of jemalloc's extents. */
static _Atomic int ranges_lock;
static uintptr_t *range_lo, *range_hi;
static size_t nranges;

static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

static void lock(void) {
  while (atomic_exchange_explicit(&ranges_lock, 1, memory_order_acquire))
    while (atomic_load_explicit(&ranges_lock, memory_order_relaxed)) __builtin_ia32_pause();
}

static void unlock(void) { atomic_store_explicit(&ranges_lock, 0, memory_order_release); }

static void range_add(uintptr_t lo, uintptr_t hi) {
  lock();
  if (range_lo == NULL) {
    size_t len = 2 * MAX_RANGES * sizeof(uintptr_t);
    void *v = sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (v == MAP_FAILED) { unlock(); return; }
    range_lo = v;
    range_hi = range_lo + MAX_RANGES;
    range_lo[0] = (uintptr_t)v;
    range_hi[0] = (uintptr_t)v + len;
    nranges = 1;
  }
  if (nranges < MAX_RANGES) {
    range_lo[nranges] = lo;
    range_hi[nranges] = hi;
    nranges++;
  }
  unlock();
}

/* Takes [lo, hi) out of the recorded ranges (splitting one if needed). */
static void range_remove(uintptr_t lo, uintptr_t hi) {
  lock();
  for (size_t i = 0; i < nranges; i++) {
    if (hi <= range_lo[i] || lo >= range_hi[i]) continue;
    uintptr_t a = range_lo[i], b = range_hi[i];
    if (lo > a && hi < b && nranges < MAX_RANGES) {        /* a hole in the middle */
      range_hi[i] = lo;
      range_lo[nranges] = hi;
      range_hi[nranges] = b;
      nranges++;
    } else if (lo <= a && hi >= b) {                        /* all of it */
      range_lo[i] = range_lo[nranges - 1];
      range_hi[i] = range_hi[nranges - 1];
      nranges--;
      i--;
    } else if (lo <= a) {
      range_lo[i] = hi;
    } else {
      range_hi[i] = lo;
    }
  }
  unlock();
}

static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : (void *)r;
}

void *_ta_mmap(size_t len) {
  void *p = sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  range_add((uintptr_t)p, (uintptr_t)p + len);
  return p;
}

void _ta_munmap(void *p, size_t len) {
  if (p && syscall(SYS_munmap, p, len) == 0) range_remove((uintptr_t)p, (uintptr_t)p + len);
}

void _ta_own_range(uintptr_t lo, uintptr_t hi) { range_add(lo, hi); }

size_t _ta_own_ranges(uintptr_t *lo, uintptr_t *hi, size_t max) {
  lock();
  size_t n = nranges < max ? nranges : max;
  for (size_t i = 0; i < n; i++) {
    lo[i] = range_lo[i];
    hi[i] = range_hi[i];
  }
  unlock();
  return n;
}
