/* preload_map.c - the program's own mappings: mmap, mmap64, munmap, mremap.
 *
 * Memcheck scans every mapping of the client's for pointers; the ledger's
 * scan reads the modules' writable segments and the threads' stacks and TLS,
 * plus the mappings recorded here (alloc/extents.c).  Python keeps its small
 * objects in mmap'd arenas, V8 its heap: blocks held only from there must
 * not look lost.
 *
 * Every call is made as a system call and recorded when the calling thread
 * is the program's: not inside the ledger (jemalloc maps its extents through
 * the libc mmap symbol, which resolves here), and not before the ledger runs
 * in this thread.  The ledger itself never calls these symbols
 * (_ta_sys_mmap). */
#include "preload.h"

#include <errno.h>
#include <stdarg.h>
#include <sys/mman.h>
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

static inline uintptr_t page_up(uintptr_t v) { return (v + 4095) & ~(uintptr_t)4095; }

static inline __attribute__((always_inline))
void *map_body(void *addr, size_t len, int prot, int flags, int fd, off_t off, uintptr_t ra) {
  void *p = _ta_sys_mmap(addr, len, prot, flags, fd, off);
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
  if (p != MAP_FAILED && programs(RA)) {
    int saved = errno;
    if (!(flags & MREMAP_DONTUNMAP))
      _ta_program_unmap((uintptr_t)old, page_up((uintptr_t)old + old_len));
    _ta_program_map((uintptr_t)p, page_up((uintptr_t)p + new_len));
    errno = saved;
  }
  return p;
}
