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

/* The program's call, not the ledger's (nor jemalloc's inside it). */
static inline bool programs(void) {
  ta_thread *t = _ta_self;
  return t != NULL && t->guard == 0 && _pl_ledger_live();
}

static inline uintptr_t page_up(uintptr_t v) { return (v + 4095) & ~(uintptr_t)4095; }

PL_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  void *p = _ta_sys_mmap(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && programs()) {
    int saved = errno;
    _ta_program_map((uintptr_t)p, page_up((uintptr_t)p + len));
    errno = saved;
  }
  return p;
}

PL_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

PL_EXPORT int munmap(void *addr, size_t len) {
  int r = _ta_sys_munmap(addr, len);
  if (r == 0 && programs()) _ta_program_unmap((uintptr_t)addr, page_up((uintptr_t)addr + len));
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
  if (p != MAP_FAILED && programs()) {
    int saved = errno;
    if (!(flags & MREMAP_DONTUNMAP))
      _ta_program_unmap((uintptr_t)old, page_up((uintptr_t)old + old_len));
    _ta_program_map((uintptr_t)p, page_up((uintptr_t)p + new_len));
    errno = saved;
  }
  return p;
}
