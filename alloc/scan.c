/* scan.c - the reachability scan: which live blocks can the program still
 * reach?  Classified as valgrind memcheck does:
 *
 *   reachable      a start pointer from a root, or from a reachable block
 *   possible       only interior pointers lead to it (or only from possible blocks)
 *   indirect       reachable only from lost blocks
 *   direct         no pointer at all; of a lost cycle, the first block in address order
 *
 * Roots: the writable segments of loaded modules (not the ledger's own, nor
 * jemalloc's), the resident writable pages of the mappings the program made
 * with mmap (recorded by the preload; of a shared or file mapping, the
 * pages in the page cache too: touched_run), the public part of ld.so's link maps
 * (scan_link_maps), every thread's stack from its stack
 * pointer up (the main thread's to the end of its mapping, argv, environ
 * and the auxiliary vector included: thread.c's stack_bounds), its registers,
 * its static TLS (less the ledger's and jemalloc's blocks), thread
 * descriptor and DTV (scan_dtv: where dlopen()ed libraries' TLS blocks
 * are).  At the end of a process image the scanning thread's stack and
 * registers are the program's where it stopped (see "where the program
 * stopped" below), never the frames of the ending path under it.  Other
 * threads are stopped with a signal while the roots and blocks are read; every root range is clipped to
 * the readable mappings of /proc/self/maps, so the scan never faults.
 *
 * While threads are stopped the scanner takes no lock that a stopped thread
 * could hold and calls no allocator: its arrays come from mmap.
 *
 * Every word of every root and reached block is looked up among the blocks:
 * scan_index.h turns most words away with a hash probe of their 1 MiB
 * region, and gives the same answer as a binary search over all blocks. */
#include "internal.h"
#include "scan_index.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

/* A conservative scan reads stack slots and padding nobody wrote: under
 * valgrind that is by design, so its reports are off while we mark. */
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define SCAN_QUIET_BEGIN() VALGRIND_DISABLE_ERROR_REPORTING
#define SCAN_QUIET_END()   VALGRIND_ENABLE_ERROR_REPORTING
#else
#define SCAN_QUIET_BEGIN() ((void)0)
#define SCAN_QUIET_END()   ((void)0)
#define RUNNING_ON_VALGRIND 0
#endif

enum { S_UNREACHED, S_INDIRECT, S_POSSIBLE, S_REACHABLE };

typedef struct {
  uintptr_t addr;
  uint64_t size;
  uint32_t stack;
  uint16_t tag;
  uint8_t state;
  uint8_t arena;
  uint8_t more;             /* from _ta_scan_more: counted only when reachable */
  uint32_t clique;          /* for indirect blocks: their leader's index + 1 */
} sblock;

typedef struct { uintptr_t lo, hi; } range;

/* A growable array in mmap'd memory. */
typedef struct { void *v; size_t n, cap, elem; } mvec;

/* It grows with mremap, which moves the pages: a page touched once is not
 * touched again (a fresh page costs microseconds in some VMs). */
static void *mvec_push(mvec *m) {
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 256;
    void *v;
    if (m->v) {
      v = (void *)syscall(SYS_mremap, m->v, m->cap * m->elem, cap * m->elem, MREMAP_MAYMOVE);
      if (v == MAP_FAILED) return NULL;
    } else {
      v = _ta_sys_mmap(NULL, cap * m->elem, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (v == MAP_FAILED) return NULL;
    }
    m->v = v;
    m->cap = cap;
  }
  return (char *)m->v + m->elem * m->n++;
}

static void mvec_free(mvec *m) {
  if (m->v) _ta_sys_munmap(m->v, m->cap * m->elem);
  m->v = NULL;
  m->n = m->cap = 0;
}

/* ---- stopping the other threads -------------------------------------------- */

#define MAX_STOPPED 4096

typedef struct {
  int tid;
  uintptr_t sp, tp;
  uintptr_t regs[NGREG];
  uintptr_t stack_lo, stack_hi;           /* the thread's stack (0: not known) */
  uintptr_t alt_lo, alt_hi;               /* its alternate signal stack, when sp is on it */
  uintptr_t left_sp;                      /* where it left its own stack (thread.h) */
  bool valid;
} stopped;

static stopped *stops;                    /* mmap'd, MAX_STOPPED entries */
static _Atomic int nstopped_acks;
static _Atomic int release_gen;
static _Atomic int slot_next;
static int scan_signal;

static bool alt_stack_of(uintptr_t sp, uintptr_t *lo, uintptr_t *hi);

static void on_scan_signal(int sig, siginfo_t *si, void *ctx) {
  (void)sig;
  (void)si;
  int saved = errno;
  int gen = atomic_load(&release_gen);
  int i = atomic_fetch_add(&slot_next, 1);
  if (i < MAX_STOPPED) {
    ucontext_t *uc = ctx;
    stopped *s = &stops[i];
    s->tid = (int)syscall(SYS_gettid);
    memcpy(s->regs, uc->uc_mcontext.gregs, sizeof s->regs);
    s->sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    s->tp = (uintptr_t)pthread_self();
    _ta_thread_stack(&s->stack_lo, &s->stack_hi);
    s->left_sp = _ta_self ? atomic_load(&_ta_self->left_sp) : 0;
    if (!alt_stack_of(s->sp, &s->alt_lo, &s->alt_hi)) s->alt_lo = s->alt_hi = 0;
    s->valid = true;
  }
  atomic_fetch_add(&nstopped_acks, 1);
  while (atomic_load(&release_gen) == gen) syscall(SYS_sched_yield);
  errno = saved;
}

static size_t tls_static_size, pthread_size;

static void scan_setup(void) {
  stops = _ta_sys_mmap(NULL, MAX_STOPPED * sizeof *stops, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (stops == MAP_FAILED) stops = NULL;
  scan_signal = SIGRTMIN + 5;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_scan_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(scan_signal, &sa, NULL);
  void (*info)(size_t *, size_t *) = (void (*)(size_t *, size_t *))dlsym(RTLD_DEFAULT, "_dl_get_tls_static_info");
  size_t align = 0;
  if (info) info(&tls_static_size, &align);
  const unsigned *sz = dlsym(RTLD_DEFAULT, "_thread_db_sizeof_pthread");
  pthread_size = sz ? *sz : 2304;
}

static int read_tids(int *tids, int max) {
  int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  int n = 0;
  for (;;) {
    long len = syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (len <= 0) break;
    for (long off = 0; off < len;) {
      struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type; char name[]; } *d =
          (void *)(buf + off);
      if (d->name[0] >= '0' && d->name[0] <= '9' && n < max) tids[n++] = atoi(d->name);
      off += d->reclen;
    }
  }
  close(fd);
  return n;
}

/* Stops every other thread; returns how many answered. */
/* Reads /proc/self/task/TID/FILE into buf (NUL-terminated); its length or -1. */
static long read_task_file(int tid, const char *file, char *buf, size_t size) {
  char path[64];
  int n = 0;
  const char *pre = "/proc/self/task/";
  for (const char *c = pre; *c; c++) path[n++] = *c;
  char digits[16];
  int nd = 0;
  for (unsigned v = (unsigned)tid; v || nd == 0; v /= 10) digits[nd++] = (char)('0' + v % 10);
  while (nd) path[n++] = digits[--nd];
  path[n++] = '/';
  for (const char *c = file; *c && n < (int)sizeof path - 1; c++) path[n++] = *c;
  path[n] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long len = read(fd, buf, size - 1);
  close(fd);
  if (len < 0) return -1;
  buf[len] = '\0';
  return len;
}

/* Does thread tid block the scan's signal?  (Node's signal thread blocks
 * every signal and waits in a futex: it would never answer.) */
static bool blocks_scan_signal(int tid) {
  char buf[2048];
  if (read_task_file(tid, "status", buf, sizeof buf) < 0) return false;
  const char *p = strstr(buf, "\nSigBlk:");
  if (p == NULL) return false;
  uint64_t mask = strtoull(p + 8, NULL, 16);
  return (mask >> (scan_signal - 1)) & 1;
}

/* The stack pointer of a thread blocked in a system call (the next-to-last
 * field of /proc/self/task/TID/syscall), or 0 when it runs. */
static uintptr_t blocked_sp(int tid) {
  char buf[256];
  if (read_task_file(tid, "syscall", buf, sizeof buf) <= 0) return 0;
  if (buf[0] < '0' || buf[0] > '9') return 0;       /* "running" */
  char *fields[10];
  int nf = 0;
  for (char *c = buf; *c && nf < 10;) {
    while (*c == ' ') c++;
    if (!*c || *c == '\n') break;
    fields[nf++] = c;
    while (*c && *c != ' ' && *c != '\n') c++;
  }
  return nf == 9 ? (uintptr_t)strtoull(fields[7], NULL, 16) : 0;
}

/* Threads that block the signal: not stopped, but read from their stack
 * pointer to the end of their stack's mapping, which for a thread of
 * pthread_create holds its static TLS and descriptor too. */
static uintptr_t unstoppable_sp[MAX_STOPPED];
static int nunstoppable;

static int stop_others(void) {
  static int tids[MAX_STOPPED];
  int self = (int)syscall(SYS_gettid), pid = getpid();
  int n = read_tids(tids, MAX_STOPPED), sent = 0;
  atomic_store(&slot_next, 0);
  atomic_store(&nstopped_acks, 0);
  nunstoppable = 0;
  for (int i = 0; i < n; i++) {
    if (tids[i] == self) continue;
    /* (Under valgrind, the kernel's view of a thread is valgrind's: every
     * thread blocks every signal there, and its stack pointer is not the
     * program's; valgrind delivers the signal itself.) */
    if (!RUNNING_ON_VALGRIND && blocks_scan_signal(tids[i])) {
      uintptr_t sp = 0;                 /* it may be on its way into the call: */
      for (int k = 0; k < 1000 && (sp = blocked_sp(tids[i])) == 0; k++) syscall(SYS_sched_yield);
      if (sp) unstoppable_sp[nunstoppable++] = sp;
      continue;
    }
    if (syscall(SYS_tgkill, pid, tids[i], scan_signal) == 0) sent++;
  }
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (atomic_load(&nstopped_acks) < sent) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) > 2000000000L) break;
    syscall(SYS_sched_yield);
  }
  return atomic_load(&nstopped_acks);
}

static void resume_others(void) {
  atomic_fetch_add(&release_gen, 1);
}

/* ---- roots -------------------------------------------------------------------- */

typedef struct { mvec *roots; uintptr_t self_lo, self_hi; } phdr_arg;

static int own_module(struct dl_phdr_info *info, uintptr_t addr) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (addr >= lo && addr < lo + ph->p_memsz) return 1;
  }
  return 0;
}

/* Static TLS blocks of the ledger and jemalloc, as offsets from the thread
 * pointer; found on each scan (a later dlopen does not move them). */
typedef struct { intptr_t off; size_t size; } tls_hole;
#define MAX_TLS_HOLES 4
static tls_hole tls_holes[MAX_TLS_HOLES];
static int ntls_holes;
/* The lowest module TLS block in the static TLS, from the thread pointer
 * (0: none seen): below it lies the surplus no module uses, and for the
 * main thread maybe not its TLS at all (the size _dl_get_tls_static_info
 * gives can reach below ld.so's allocation, into a mapping of the scan's). */
static intptr_t tls_lowest;

static void tls_note(struct dl_phdr_info *info) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    if (info->dlpi_phdr[i].p_type != PT_TLS || info->dlpi_tls_data == NULL) continue;
    intptr_t off = (intptr_t)info->dlpi_tls_data - (intptr_t)pthread_self();
    if (off < 0 && (size_t)-off <= tls_static_size && off < tls_lowest) tls_lowest = off;
  }
}

static int on_phdr(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  mvec *roots = arg;
  const char *name = info->dlpi_name ? info->dlpi_name : "";
  tls_note(info);
  /* The ledger's own library and its allocator hold bookkeeping, not roots;
   * linked statically into the program, the ledger keeps no block address
   * in its globals. */
  if (*name && (own_module(info, (uintptr_t)&on_phdr) || strstr(name, "libjemalloc"))) {
    /* Their static TLS too: jemalloc's tsd caches rtree leaf keys, addresses
     * aligned to 1 GiB that fall inside any big block spanning a boundary
     * (a 64 MiB leak then looked "possibly lost").  The block sits at the
     * same offset from every thread's pointer. */
    for (int i = 0; i < info->dlpi_phnum; i++) {
      const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
      if (ph->p_type != PT_TLS || info->dlpi_tls_data == NULL || ntls_holes == MAX_TLS_HOLES)
        continue;
      tls_hole *h = &tls_holes[ntls_holes++];
      h->off = (intptr_t)info->dlpi_tls_data - (intptr_t)pthread_self();
      h->size = ph->p_memsz;
    }
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W)) continue;
    range *r = mvec_push(roots);
    if (r == NULL) return 1;
    r->lo = info->dlpi_addr + ph->p_vaddr;
    r->hi = r->lo + ph->p_memsz;
  }
  return 0;
}

typedef struct {
  mvec *maps, *wmaps, *cmaps;
} maps_out;

/* A writable mapping whose pages live in the page cache: shared (an
 * anonymous shared mapping is shmem), or of a file.  A page of one that
 * this process never touched can still hold what another process (a fork's
 * parent) or a write(2) to the file put there. */
static bool page_cached(const ta_maps_entry *e) {
  return e->perms[3] == 's' || (e->path[0] != '\0' && e->path[0] != '[');
}

static int add_map(const ta_maps_entry *e, void *arg) {
  maps_out *o = arg;
  if (e->perms[0] != 'r') return 0;
  if (strstr(e->path, "[vvar]") || strstr(e->path, "[vsyscall]")) return 0;
  range *r = mvec_push(o->maps);
  if (r) { r->lo = e->lo; r->hi = e->hi; }
  if (e->perms[1] == 'w' && (r = mvec_push(o->wmaps)) != NULL) { r->lo = e->lo; r->hi = e->hi; }
  if (e->perms[1] == 'w' && page_cached(e) && (r = mvec_push(o->cmaps)) != NULL) { r->lo = e->lo; r->hi = e->hi; }
  return 0;
}

/* Readable mappings, of those the writable ones, and of those the ones
 * whose pages are the page cache's, sorted (the kernel lists them in
 * order). */
static void read_maps(mvec *maps, mvec *wmaps, mvec *cmaps) {
  maps_out o = { maps, wmaps, cmaps };
  _ta_maps_each(add_map, &o);
}

/* The readable mapping containing p, or {0,0}. */
static range map_of(const mvec *maps, uintptr_t p) {
  const range *v = maps->v;
  size_t lo = 0, hi = maps->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p < v[mid].lo) hi = mid;
    else if (p >= v[mid].hi) lo = mid + 1;
    else return v[mid];
  }
  return (range){ 0, 0 };
}

/* ---- marking ------------------------------------------------------------------- */

typedef struct {
  sblock *b;
  size_t n;
  uint32_t *stack;          /* mark stack of block indexes */
  size_t top;
  const mvec *maps;
  ta_bindex x;              /* the blocks' addresses, and their regions */
  uintptr_t first, last;    /* no block outside [first, last] */
  range dead[8];            /* parts of blocks never read: a stack's words below its pointer */
  int ndead;
} marker;

/* Index of the block containing p, or -1; *start says whether p is its start. */
static inline long block_of(const marker *m, uintptr_t p, bool *start) {
  long i = _ta_bindex_find(&m->x, p);
  if (i >= 0) *start = p == m->x.addr[i];
  return i;
}

/* memcheck's rule: a start pointer from a definite source makes a block
 * reachable; anything else makes an unreached block possibly lost. */
static inline void push_ptr(marker *m, uintptr_t p, bool definite) {
  if (p < m->first || p > m->last) return;
  bool start;
  long i = block_of(m, p, &start);
  if (i < 0) return;
  sblock *b = &m->b[i];
  if (start && definite && b->state != S_REACHABLE) {
    b->state = S_REACHABLE;
    m->stack[m->top++] = (uint32_t)i;
  } else if (b->state == S_UNREACHED) {
    b->state = S_POSSIBLE;
    m->stack[m->top++] = (uint32_t)i;
  }
}

__attribute__((no_sanitize_address))
static void scan_range(marker *m, uintptr_t lo, uintptr_t hi, bool definite) {
  lo = (lo + 7) & ~(uintptr_t)7;
  for (uintptr_t p = lo; p + 8 <= hi; p += 8) push_ptr(m, *(const uintptr_t *)p, definite);
}

/* The next part of [*lo, hi) inside one of maps (sorted): *lo and *end
 * set to it; false when none is left. */
static bool next_piece(const mvec *maps, uintptr_t *lo, uintptr_t hi, uintptr_t *end) {
  while (*lo < hi) {
    range r = map_of(maps, *lo);
    if (r.hi) {
      *end = r.hi < hi ? r.hi : hi;
      return true;
    }
    const range *v = maps->v;           /* not mapped here: to the next mapping */
    uintptr_t next = hi;
    for (size_t i = 0; i < maps->n; i++)
      if (v[i].lo > *lo) { next = v[i].lo; break; }
    *lo = next;
  }
  return false;
}

/* A root range, clipped to what is readable. */
static void scan_root(marker *m, uintptr_t lo, uintptr_t hi) {
  for (uintptr_t end; next_piece(m->maps, &lo, hi, &end); lo = end) scan_range(m, lo, end, true);
}

/* The ledger's own mappings (its tables, trace buffers, the crash stack;
 * copied before the world stops: their set has a lock) and the scan's own
 * arrays: never roots.  A stack's mapping may have been merged with one of
 * them by the kernel. */
#define MAX_OWN 80
static uintptr_t own_lo[MAX_OWN], own_hi[MAX_OWN];
static size_t nown;

static void own_add(const void *p, size_t size) {
  if (p == NULL || size == 0 || nown == MAX_OWN) return;
  own_lo[nown] = (uintptr_t)p;
  own_hi[nown++] = (uintptr_t)p + size;
}

/* scan_root over [lo, hi) less the ledger's own mappings. */
static void scan_root_not_own(marker *m, uintptr_t lo, uintptr_t hi) {
  while (lo < hi) {
    uintptr_t cut_lo = hi, cut_hi = hi;   /* the lowest own range that ends above lo */
    for (size_t i = 0; i < nown; i++)
      if (own_hi[i] > lo && own_lo[i] < cut_lo) { cut_lo = own_lo[i]; cut_hi = own_hi[i]; }
    if (cut_lo > lo) scan_root(m, lo, cut_lo < hi ? cut_lo : hi);
    lo = cut_hi;
  }
}

/* A thread's static TLS (its modules' blocks) and its struct pthread, less
 * the holes. */
static void scan_tls(marker *m, uintptr_t tp) {
  uintptr_t lo = tls_lowest ? tp + (uintptr_t)tls_lowest : tp - tls_static_size, hi = tp + pthread_size;
  while (lo < hi) {
    uintptr_t hl = hi, hh = hi;         /* the lowest hole that ends above lo */
    for (int i = 0; i < ntls_holes; i++) {
      uintptr_t l = tp + (uintptr_t)tls_holes[i].off, h = l + tls_holes[i].size;
      if (h > lo && l < hl) { hl = l; hh = h; }
    }
    if (hl > lo) scan_root_not_own(m, lo, hl < hi ? hl : hi);
    lo = hh;
  }
}

/* A thread's DTV (glibc's dynamic thread vector; on x86-64 the second word
 * of the descriptor at the thread pointer): its entries point at the TLS
 * blocks of dlopen()ed libraries, blocks of the runtime's, where a
 * __thread variable of such a library keeps its pointer.  A DTV that ld.so
 * grew or made for a later thread is itself a runtime block, reached from
 * the descriptor; the main thread's first one is in memory ld.so took
 * before libc's malloc, no module's segment and no mapping of the
 * program's, so it is a root of its own: its length word (entry -1), its
 * generation and its entries of two words each.  memcheck finds it as it
 * reads every writable mapping. */
#define DTV_MAX 65536
static void scan_dtv(marker *m, uintptr_t tp) {
#if defined(__x86_64__) && defined(__GLIBC__)
  uintptr_t at = tp + sizeof(void *), dtv, len;
  range r = map_of(m->maps, at);
  if (r.hi < at + sizeof dtv) return;
  memcpy(&dtv, (const void *)at, sizeof dtv);
  if (dtv < 2 * sizeof(void *) || dtv % sizeof(void *)) return;
  uintptr_t lo = dtv - 2 * sizeof(void *);
  r = map_of(m->maps, lo);
  if (r.hi < lo + sizeof len) return;
  memcpy(&len, (const void *)lo, sizeof len);
  if (len > DTV_MAX) len = DTV_MAX;
  scan_root_not_own(m, lo, dtv + (len + 1) * 2 * sizeof(void *));
#else
  (void)m;
  (void)tp;
#endif
}

/* ld.so's link maps: the program reaches each loaded object's through
 * _r_debug and dl_iterate_phdr.  Those of the objects loaded at start come
 * from ld.so's own early allocator (its pages are no root: anonymous, not
 * the program's mappings); those of libraries dlopen'ed later are blocks of
 * the runtime's.  memcheck reads ld.so's pages as it reads every writable
 * mapping, and so finds the later ones (and their names and version
 * tables) reachable.  Here: the public part of each link map that is no
 * block is a root, and each one that is a block is pointed to, but for the
 * objects libc opened for itself (libgcc_s for unwinding, NSS and gconv
 * modules): its freeres closes them, and memcheck runs it after ld.so's
 * finalization, where the close takes effect.  The preload's exit scan of
 * exit() runs there too (after its freeres, so those link maps are gone);
 * one of _exit, an exec or a fatal signal runs where no freeres did. */
static bool opened_by_libc(const char *path) {
  const char *base = path ? strrchr(path, '/') : NULL;
  base = base ? base + 1 : path ? path : "";
  return strncmp(base, "libgcc_s.so", 11) == 0 || strncmp(base, "libnss_", 7) == 0 ||
         (path && strstr(path, "/gconv/") != NULL);
}

static void scan_link_maps(marker *m) {
  for (struct link_map *l = _r_debug.r_map; l; l = l->l_next) {
    bool start;
    uintptr_t a = (uintptr_t)l;
    if (m->x.addr && block_of(m, a, &start) >= 0) {
      if (!opened_by_libc(l->l_name)) push_ptr(m, a, true);
      continue;
    }
    /* l_addr, l_name, l_ld: the chain itself is followed here */
    scan_root(m, a, (uintptr_t)&l->l_next);
  }
}

/* Pages never touched hold zeros: a 1 GiB block malloc'd and left alone,
 * or the gigabytes V8 reserves, need not be read (reading them would also
 * make the kernel map them).  /proc/self/pagemap tells, per page, present
 * (bit 63) or swapped (bit 62); neither means never touched.  Open during
 * a scan; -1 when it cannot be read, and then every page is read.
 *
 * That holds for private anonymous memory only.  A page of a shared or
 * file mapping is in the page cache, and the page table of this process
 * maps it only once this process touched it: a fork child's page tables
 * start without its parent's shared pages, and a page written to the file
 * with write(2) was never mapped.  For those (cached) the page counts as
 * touched when mincore says it is resident too; reading it maps what is
 * there, and allocates nothing. */
static int pagemap_fd = -1;

/* The next run of touched pages in [*lo, hi): *lo and *end set to it;
 * false when there is none.  A range under 64 KiB is one run. */
static bool touched_run(uintptr_t *lo, uintptr_t hi, uintptr_t *end, bool cached) {
  if (*lo >= hi) return false;
  if (hi - *lo < ((uintptr_t)64 << 10) || pagemap_fd < 0) { *end = hi; return true; }
  uint64_t ent[512];
  uintptr_t page = *lo & ~(uintptr_t)4095, run = 0;
  bool in = false;
  while (page < hi) {
    size_t n = (hi - page + 4095) / 4096;
    if (n > 512) n = 512;
    if (pread(pagemap_fd, ent, n * 8, (off_t)(page / 4096 * 8)) != (ssize_t)(n * 8)) {
      if (!in) run = page > *lo ? page : *lo;         /* unreadable: the rest is one run */
      *lo = run;
      *end = hi;
      return true;
    }
    unsigned char core[512];
    if (cached && mincore((void *)page, n * 4096, core) != 0) memset(core, 1, n);   /* unknown: read it */
    for (size_t i = 0; i < n; i++) {
      bool touched = (ent[i] >> 62) != 0 || (cached && (core[i] & 1));
      uintptr_t a = page + i * 4096;
      if (touched && !in) { in = true; run = a > *lo ? a : *lo; }
      else if (!touched && in) { *lo = run; *end = a; return true; }
    }
    page += n * 4096;
  }
  if (in) { *lo = run; *end = hi; return true; }
  *lo = hi;
  return false;
}

/* scan_range over the touched pages only. */
static void scan_touched(marker *m, uintptr_t lo, uintptr_t hi, bool definite, bool cached) {
  uintptr_t end;
  while (touched_run(&lo, hi, &end, cached)) {
    scan_range(m, lo, end, definite);
    lo = end;
  }
}

/* The touched pages of [lo, hi) that lie in maps: a mapping the program
 * made (in its writable mappings; cmaps: those of them whose pages are the
 * page cache's), or a module's writable segment (in the readable ones; no
 * cmaps): a page of .data or .bss never written holds what the file or the
 * zero-fill gave it, never a block's address, and reading it would only
 * map it. */
static void scan_resident(marker *m, const mvec *maps, const mvec *cmaps, uintptr_t lo, uintptr_t hi) {
  for (uintptr_t end; next_piece(maps, &lo, hi, &end); lo = end)
    scan_touched(m, lo, end, true, cmaps && map_of(cmaps, lo).hi != 0);
}

/* A block's words [lo, hi), less the dead ranges. */
static void scan_block(marker *m, uintptr_t lo, uintptr_t hi, bool definite) {
  for (int i = 0; i < m->ndead; i++)
    if (m->dead[i].lo < hi && m->dead[i].hi > lo) {
      if (m->dead[i].lo > lo) scan_block(m, lo, m->dead[i].lo, definite);
      if (m->dead[i].hi < hi) scan_block(m, m->dead[i].hi, hi, definite);
      return;
    }
  scan_touched(m, lo, hi, definite, false);
}

static bool is_dead(const marker *m, uintptr_t p) {
  for (int i = 0; i < m->ndead; i++)
    if (p >= m->dead[i].lo && p < m->dead[i].hi) return true;
  return false;
}

/* A stack inside a block (an alternate signal stack, a coroutine's):
 * its words below sp are dead, as memcheck holds them undefined; the
 * scanner's own frames are there too. */
static void add_dead(marker *m, uintptr_t lo, uintptr_t hi) {
  if (lo < hi && m->ndead < (int)(sizeof m->dead / sizeof *m->dead)) m->dead[m->ndead++] = (range){ lo, hi };
}

static void drain(marker *m) {
  while (m->top) {
    sblock *b = &m->b[m->stack[--m->top]];
    if (m->top) {                       /* the next block's first lines, while this one is read */
      const sblock *n = &m->b[m->stack[m->top - 1]];
      __builtin_prefetch((const void *)n->addr);
      if (n->size > 64) __builtin_prefetch((const void *)(n->addr + 64));
    }
    scan_block(m, b->addr, b->addr + b->size, b->state == S_REACHABLE);
  }
}

/* Cliques: an unreached block leads everything unreached that it points to
 * (start or interior); those become indirect, and a former leader it reaches
 * too.  Visited in address order, so of a cycle the first block stays direct. */
__attribute__((no_sanitize_address))
static void clique(marker *m, uint32_t leader) {
  m->top = 0;
  m->stack[m->top++] = leader;
  while (m->top) {
    sblock *b = &m->b[m->stack[--m->top]];
    uintptr_t lo = (b->addr + 7) & ~(uintptr_t)7, hi = b->addr + b->size, end;
    for (; touched_run(&lo, hi, &end, false); lo = end)
    for (uintptr_t p = lo; p + 8 <= end; p += 8) {
      if (TA_UNLIKELY(m->ndead) && is_dead(m, p)) continue;
      uintptr_t v = *(const uintptr_t *)p;
      bool start;
      long i = block_of(m, v, &start);
      if (i < 0 || (uint32_t)i == leader) continue;
      sblock *t = &m->b[i];
      if (t->state != S_UNREACHED) continue;
      t->state = S_INDIRECT;
      t->clique = leader + 1;
      m->stack[m->top++] = (uint32_t)i;
    }
  }
}

/* ---- where the program stopped ---------------------------------------------------- */

/* At the end of an image the scanning thread's roots are the program's
 * frames from the one that called the function ending it (exit, _exit,
 * abort, an exec, raise or kill of a fatal signal; a return from main is
 * libc's call of exit), with that frame's callee-saved registers as they
 * were at the call (recovered by unwinding: the ending path saved them in
 * its frames, or left them in place).  The frames of the ending path
 * (exit's, __run_exit_handlers', the ledger's, abort's) are not the
 * program's, and most of their words were never written: they hold what
 * earlier, deeper calls of the program left there, stale copies of
 * pointers the program has lost.  memcheck never counts those (it reads
 * only stack words written since their frame was entered); neither does
 * the scan.  A fatal signal's roots are its interrupted context: all its
 * registers, its stack from its stack pointer; or, when that context is
 * inside an ending function (abort's raise), the program's frame that
 * called it.
 *
 * The ending functions are found by address range, computed once by
 * _ta_stop_init (dlsym is no function for a crash's handler): the first
 * definition of each name (the preload's wrapper, when there is one) and
 * the next (libc's). */

static const char *const ending_names[] = {
  "exit", "_exit", "_Exit", "quick_exit", "abort", "raise", "gsignal", "kill", "tgkill",
  "pthread_kill", "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle",
  "fexecve", "execveat", "__assert_fail", "__assert_perror_fail", "__stack_chk_fail",
  "__fortify_fail", "__chk_fail",
};
#define MAX_ENDINGS 64
static range endings[MAX_ENDINGS];
static int nendings;
static atomic_int endings_ready;

static void ending_add(void *fn) {
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (fn == NULL || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || sym == NULL || sym->st_size == 0)
    return;
  uintptr_t lo = (uintptr_t)fn, hi = lo + sym->st_size;
  for (int i = 0; i < nendings; i++)
    if (endings[i].lo == lo) return;
  if (nendings < MAX_ENDINGS) endings[nendings++] = (range){ lo, hi };
}

void _ta_stop_init(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  if (atomic_load(&endings_ready)) return;
  pthread_mutex_lock(&lock);
  if (!atomic_load(&endings_ready)) {
    for (size_t i = 0; i < sizeof ending_names / sizeof *ending_names; i++) {
      ending_add(dlsym(RTLD_DEFAULT, ending_names[i]));
      ending_add(dlsym(RTLD_NEXT, ending_names[i]));
    }
    atomic_store(&endings_ready, 1);
  }
  pthread_mutex_unlock(&lock);
}

static bool is_ending(uintptr_t pc) {
  for (int i = 0; i < nendings; i++)
    if (pc >= endings[i].lo && pc < endings[i].hi) return true;
  return false;
}

/* The stop frame's registers (the exit scan reads them after the walk). */
static uintptr_t stop_regs[NGREG];

#define STOP_MAX_FRAMES 1024

/* A frame of the walk: its stack pointer and callee-saved registers. */
typedef struct { uintptr_t sp, rbx, rbp, r12, r13, r14, r15; } stop_frame;

bool _ta_stop_find(const void *ucv) {
  if (!atomic_load(&endings_ready)) return false;
  const ucontext_t *uc = ucv;
  unw_context_t ctx;
  unw_cursor_t c;
  if (uc) {
    memcpy(&ctx, uc, sizeof ctx);
    if (unw_init_local2(&c, &ctx, UNW_INIT_SIGNAL_FRAME) < 0) return false;
  } else {
    if (unw_getcontext(&ctx) < 0 || unw_init_local(&c, &ctx) < 0) return false;
  }
  /* The frame above the outermost ending function. */
  static stop_frame frames[STOP_MAX_FRAMES];
  int n = 0, stop = -1;
  do {
    unw_word_t ip = 0, v[7] = { 0 };
    unw_get_reg(&c, UNW_REG_IP, &ip);
    unw_get_reg(&c, UNW_REG_SP, &v[0]);
    unw_get_reg(&c, UNW_X86_64_RBX, &v[1]);
    unw_get_reg(&c, UNW_X86_64_RBP, &v[2]);
    unw_get_reg(&c, UNW_X86_64_R12, &v[3]);
    unw_get_reg(&c, UNW_X86_64_R13, &v[4]);
    unw_get_reg(&c, UNW_X86_64_R14, &v[5]);
    unw_get_reg(&c, UNW_X86_64_R15, &v[6]);
    frames[n] = (stop_frame){ v[0], v[1], v[2], v[3], v[4], v[5], v[6] };
    /* a return address is one past its call; a signal frame's pc is exact */
    uintptr_t pc = (uintptr_t)ip - (n > 0 || uc == NULL ? 1 : 0);
    if (ip && is_ending(pc)) stop = n + 1;
    n++;
    /* A signal handler that ends the image (exit in a SIGUSR1 handler of
     * a program that had called raise): the handler's frames are live,
     * and the outermost ending function is the one under the handler. */
    if (stop >= 0 && unw_is_signal_frame(&c) > 0) break;
  } while (n < STOP_MAX_FRAMES && unw_step(&c) > 0);
  memset(stop_regs, 0, sizeof stop_regs);
  if (stop < 0 || stop >= n) {
    if (uc == NULL) return false;
    /* A signal in the program's own code: its whole context. */
    uintptr_t sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    if (sp == 0) return false;
    memcpy(stop_regs, uc->uc_mcontext.gregs, sizeof stop_regs);
    _ta_exit_sp = sp;
    _ta_exit_regs = stop_regs;
    _ta_exit_regs_size = sizeof stop_regs;
    return true;
  }
  const stop_frame *f = &frames[stop];
  if (f->sp == 0) return false;           /* on the thread's stack or another (_ta_scan_impl) */
  stop_regs[REG_RBX] = (greg_t)f->rbx;
  stop_regs[REG_RBP] = (greg_t)f->rbp;
  stop_regs[REG_R12] = (greg_t)f->r12;
  stop_regs[REG_R13] = (greg_t)f->r13;
  stop_regs[REG_R14] = (greg_t)f->r14;
  stop_regs[REG_R15] = (greg_t)f->r15;
  _ta_exit_sp = f->sp;
  _ta_exit_regs = stop_regs;
  _ta_exit_regs_size = sizeof stop_regs;
  return true;
}

/* ---- the scan ---------------------------------------------------------------------- */

typedef struct { mvec *v; } collect_arg;

static void collect(const ta_block *b, void *arg) {
  mvec *v = arg;
  sblock *s = mvec_push(v);
  if (s == NULL) return;
  *s = (sblock){ b->addr, b->size, b->stack, b->tag, S_UNREACHED, (b->flags & TA_F_ARENA) != 0, 0, 0 };
}

void (*_ta_scan_more)(void (*add)(uintptr_t addr, uint64_t size, ta_tag tag, void *arg), void *arg);

static void collect_more(uintptr_t addr, uint64_t size, ta_tag tag, void *arg) {
  mvec *v = arg;
  sblock *s = mvec_push(v);
  if (s == NULL) return;
  *s = (sblock){ addr, size, 0, (uint16_t)tag, S_UNREACHED, 0, 1, 0 };
}

static int by_addr(const void *a, const void *b) {
  const sblock *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int by_report(const void *a, const void *b) {
  const sblock *x = a, *y = b;
  if (x->state != y->state) return x->state < y->state ? -1 : 1;
  if (x->stack != y->stack) return x->stack < y->stack ? -1 : 1;
  if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The blocks, in address order, into by_report's order: a stable radix sort
 * on (state, stack, tag) keeps the address order among equals.  In scratch
 * (n sblocks' room): no allocator, no fresh pages. */
static void sort_for_report(sblock *b, size_t n, void *scratch) {
  typedef struct { uint64_t key, at; } keyed;
  keyed *k = scratch, *tmp = k + n;
  for (size_t i = 0; i < n; i++)
    k[i] = (keyed){ (uint64_t)b[i].state << 48 | (uint64_t)b[i].stack << 16 | b[i].tag, i };
  _ta_sort_by_key(k, n, sizeof *k, tmp);
  for (size_t i = 0; i < n; i++) {        /* position j takes the block at k[j].at: cycle by cycle */
    if (k[i].at == i) continue;
    sblock t = b[i];
    size_t j = i;
    for (;;) {
      size_t from = k[j].at;
      k[j].at = j;
      if (from == i) { b[j] = t; break; }
      b[j] = b[from];
      j = from;
    }
  }
}

/* ---- alternate signal stacks --------------------------------------------------- */

/* A thread in a handler of a signal delivered on an alternate stack
 * (sigaltstack; often a malloc'd block) runs on that stack, while the
 * frames it interrupted stay live on its own.  Its roots are both: the
 * alternate stack from the stack pointer up to its end (the kernel's
 * signal frame, with the interrupted registers, is at its top), and its
 * own stack from the interrupted stack pointer up.  Never the range from
 * one stack to the other: a scan from the alternate stack to the end of
 * the thread's own read every mapping between them as roots (and died of
 * SIGBUS on a file mapped past its end). */

/* The alternate stack holding sp, if the calling thread has one there. */
static bool alt_stack_of(uintptr_t sp, uintptr_t *lo, uintptr_t *hi) {
  stack_t ss;
  if (sigaltstack(NULL, &ss) != 0 || (ss.ss_flags & SS_DISABLE) || sp - (uintptr_t)ss.ss_sp >= ss.ss_size)
    return false;
  *lo = (uintptr_t)ss.ss_sp;
  *hi = *lo + ss.ss_size;
  return true;
}

/* The stack pointer of the innermost frame of the calling thread's own
 * stack [lo, hi) (the context a signal on the alternate stack
 * interrupted), by unwinding from here; 0 when none is found. */
static uintptr_t interrupted_sp(uintptr_t lo, uintptr_t hi) {
  unw_context_t ctx;
  unw_cursor_t c;
  if (unw_getcontext(&ctx) < 0 || unw_init_local(&c, &ctx) < 0) return 0;
  for (int n = 0; n < STOP_MAX_FRAMES && unw_step(&c) > 0; n++) {
    unw_word_t sp = 0;
    unw_get_reg(&c, UNW_REG_SP, &sp);
    if (sp >= lo && sp < hi) return (uintptr_t)sp;
  }
  return 0;
}

/* A thread's own stack from sp up, and the 128-byte red zone under it
 * (a leaf function's live words), within [lo, hi). */
static void scan_stack_from(marker *m, uintptr_t sp, uintptr_t lo, uintptr_t hi) {
  scan_root_not_own(m, sp - 128 > lo ? sp - 128 : lo, hi);
}

static pthread_mutex_t scan_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

void _ta_scan_impl(uintptr_t stack_from, const void *regs, size_t regs_size, bool at_exit) {
  pthread_once(&setup_once, scan_setup);
  int cancel = _ta_cancel_off();         /* the scan reads /proc */
  pthread_mutex_lock(&scan_lock);
  ta_thread *self = _ta_thread();
  self->guard++;

  mvec roots = { .elem = sizeof(range) }, maps = { .elem = sizeof(range) };
  mvec wmaps = { .elem = sizeof(range) }, cmaps = { .elem = sizeof(range) };
  mvec blocks = { .elem = sizeof(sblock) };
  /* Where this thread's roots are (before the stop: unwinding may take
   * ld.so's lock, which a stopped thread could hold). */
  uintptr_t lo, hi, alt_lo = 0, alt_hi = 0, int_sp = 0, left_sp = atomic_load(&self->left_sp);
  _ta_thread_stack(&lo, &hi);
  if ((stack_from < lo || stack_from >= hi) && alt_stack_of(stack_from, &alt_lo, &alt_hi) && hi)
    int_sp = interrupted_sp(lo, hi);
  ntls_holes = 0;
  tls_lowest = 0;
  dl_iterate_phdr(on_phdr, &roots);

  /* Hold every shard, then stop the world: no stopped thread can be inside
   * the ledger's table, and the table stays still while we read it. */
  _ta_block_lock_all();
  _ta_block_each(true, collect, &blocks);
  if (_ta_scan_more) _ta_scan_more(collect_more, &blocks);
  /* Sorted by address (no allocator: a sort with qsort's own buffer from
   * the audited heap is slow), and indexed. */
  marker m = { .b = blocks.v, .n = blocks.n, .maps = &maps };
  /* One buffer, its pages taken at once: the sort's, then the index's. */
  size_t scratch_size = blocks.n * sizeof(sblock);
  void *scratch = NULL;
  if (blocks.n) {
    scratch = _ta_sys_mmap(NULL, scratch_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                           -1, 0);
    if (scratch == MAP_FAILED) scratch = NULL;
    if (scratch) _ta_sort_by_key(blocks.v, blocks.n, sizeof(sblock), scratch);
    else qsort(blocks.v, blocks.n, sizeof(sblock), by_addr);
    if (_ta_bindex_init(&m.x, blocks.n, scratch)) {
      const sblock *b = blocks.v;
      for (size_t i = 0; i < blocks.n; i++) {
        m.x.addr[i] = b[i].addr;
        m.x.end[i] = b[i].addr + (b[i].size ? b[i].size : 1);
      }
      _ta_bindex_build(&m.x);
      m.first = b[0].addr;
      m.last = b[blocks.n - 1].addr + b[blocks.n - 1].size;
    }
  }
  /* The program's mappings: copied under their lock before the stop (a
   * stopped thread may hold it); one unmapped since is clipped by the maps. */
  size_t pcap = _ta_program_maps_count(), np = 0;
  uintptr_t *plo = NULL, *phi = NULL;
  if (pcap) {
    pcap += 64;
    plo = _ta_sys_mmap(NULL, pcap * 2 * sizeof *plo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (plo == MAP_FAILED) plo = NULL;
    else {
      phi = plo + pcap;
      np = _ta_program_maps(plo, phi, pcap);
    }
  }
  nown = _ta_own_ranges(own_lo, own_hi, MAX_OWN - 16);
  if (nown > MAX_OWN - 16) nown = MAX_OWN - 16;
  own_add(blocks.v, blocks.cap * blocks.elem);
  own_add(scratch, scratch_size);
  own_add(plo, pcap * 2 * sizeof *plo);
  own_add(roots.v, roots.cap * roots.elem);
  own_add(stops, MAX_STOPPED * sizeof *stops);
  int nstopped = stops ? stop_others() : 0;
  read_maps(&maps, &wmaps, &cmaps);
  own_add(maps.v, maps.cap * maps.elem);
  own_add(wmaps.v, wmaps.cap * wmaps.elem);
  own_add(cmaps.v, cmaps.cap * cmaps.elem);
  pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

  if (m.x.addr) {
    m.stack = _ta_sys_mmap(NULL, (blocks.n + 1) * sizeof *m.stack * 2, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m.stack == MAP_FAILED) m.stack = NULL;
    else own_add(m.stack, (blocks.n + 1) * sizeof *m.stack * 2);
  }
  if (m.stack) {
    SCAN_QUIET_BEGIN();
    /* Arena blocks belong to their arena, which the ledger keeps: reachable. */
    for (size_t i = 0; i < m.n; i++)
      if (m.b[i].arena) { m.b[i].state = S_REACHABLE; m.stack[m.top++] = (uint32_t)i; }
    const range *r = roots.v;
    for (size_t i = 0; i < roots.n; i++) scan_resident(&m, m.maps, NULL, r[i].lo, r[i].hi);
    for (size_t i = 0; i < np; i++) scan_resident(&m, &wmaps, &cmaps, plo[i], phi[i]);
    scan_link_maps(&m);
    /* our own thread: from the caller's frame up, registers, TLS */
    if (stack_from >= lo && stack_from < hi) {
      scan_root_not_own(&m, stack_from, hi);
    } else if (alt_hi) {
      add_dead(&m, alt_lo, stack_from);
      scan_root_not_own(&m, stack_from, alt_hi);
      /* the interrupted frames up; all of the stack when unwinding found
       * none (the live frames are somewhere in it) */
      if (hi) scan_stack_from(&m, int_sp ? int_sp : lo + 128, lo, hi);
    } else {
      /* another stack (a coroutine's): the block it is in, or its mapping,
       * from here up; and the thread's own from where it was left (the
       * preload's swapcontext), or all of it */
      bool start;
      long bi = m.first <= stack_from && stack_from <= m.last ? block_of(&m, stack_from, &start) : -1;
      range st = bi >= 0 ? (range){ m.b[bi].addr, m.b[bi].addr + m.b[bi].size } : map_of(&maps, stack_from);
      if (bi >= 0) add_dead(&m, st.lo, stack_from);
      if (st.hi) scan_root_not_own(&m, stack_from, st.hi);
      if (hi) scan_stack_from(&m, left_sp >= lo && left_sp < hi ? left_sp : lo + 128, lo, hi);
    }
    scan_range(&m, (uintptr_t)regs, (uintptr_t)regs + regs_size, true);
    uintptr_t tp = (uintptr_t)pthread_self();
    scan_tls(&m, tp);
    scan_dtv(&m, tp);
    /* the stopped threads */
    for (int i = 0; i < nstopped && i < MAX_STOPPED; i++) {
      stopped *s = &stops[i];
      if (!s->valid) continue;
      scan_range(&m, (uintptr_t)s->regs, (uintptr_t)(s->regs + NGREG), true);
      bool on_own = s->sp >= s->stack_lo && s->sp < s->stack_hi, start;
      uintptr_t own_from = s->left_sp >= s->stack_lo && s->left_sp < s->stack_hi ? s->left_sp : s->stack_lo + 128;
      long bi = -1;
      if (!on_own && !s->alt_hi && s->sp >= m.first && s->sp <= m.last) bi = block_of(&m, s->sp, &start);
      if (s->alt_hi || bi >= 0) {
        /* in a handler on its alternate stack, or on a coroutine's stack
         * in a block: that stack from sp up, never its dead words; and
         * its own from where it left it, or all of it (where a signal
         * interrupted it is not known here) */
        range st = s->alt_hi ? (range){ s->alt_lo, s->alt_hi } : (range){ m.b[bi].addr, m.b[bi].addr + m.b[bi].size };
        add_dead(&m, st.lo, s->sp - 128 > st.lo ? s->sp - 128 : st.lo);
        scan_stack_from(&m, s->sp, st.lo, st.hi);
        if (s->stack_hi) scan_stack_from(&m, s->alt_hi ? s->stack_lo + 128 : own_from, s->stack_lo, s->stack_hi);
      } else {
        range st = map_of(&maps, s->sp);
        if (st.hi) scan_stack_from(&m, s->sp, st.lo, st.hi);
        if (!on_own && s->stack_hi) scan_stack_from(&m, own_from, s->stack_lo, s->stack_hi);   /* a mapped stack */
      }
      scan_tls(&m, s->tp);
      scan_dtv(&m, s->tp);
      s->valid = false;
    }
    for (int i = 0; i < nunstoppable; i++) {
      range st = map_of(&maps, unstoppable_sp[i]);
      if (st.hi) scan_stack_from(&m, unstoppable_sp[i], st.lo, st.hi);
    }
    drain(&m);
    for (size_t i = 0; i < m.n; i++)
      if (m.b[i].state == S_UNREACHED) clique(&m, (uint32_t)i);
    SCAN_QUIET_END();
  }
  resume_others();
  _ta_block_unlock_all();

  /* Classify and report, with the world running again. */
  ta_summary sum = { 0 };
  _ta_findings_leaks_begin();
  if (m.stack) {
    if (scratch) sort_for_report(blocks.v, blocks.n, scratch);
    else qsort(blocks.v, blocks.n, sizeof(sblock), by_report);
    sblock *b = blocks.v;
    for (size_t i = 0; i < blocks.n; i++) {
      uint32_t ostack;
      uintptr_t holder;
      const char *slot;
      /* The runtime's blocks count as memcheck counts them when reachable;
       * one that nothing reaches is no leak of the program's (it has no
       * stack, and the runtime frees what it drops): left out, as before
       * they were scanned at all. */
      if (b[i].more && b[i].state != S_REACHABLE) continue;
      if (!b[i].arena && _ta_hold_is_orphan(b[i].addr, &ostack, &holder, &slot)) {
        sum.orphan_bytes += b[i].size;
        sum.orphan_blocks++;
        _ta_findings_leak(ta_kind_name(TA_KIND_LEAK_ORPHAN), b[i].size, b[i].tag, b[i].stack, 0, b[i].addr, ostack,
                          holder, slot, NULL, 0);
        continue;
      }
      switch (b[i].state) {
        case S_REACHABLE:
          sum.reachable_bytes += b[i].size;
          sum.reachable_blocks++;
          break;
        case S_POSSIBLE:
          sum.possible_bytes += b[i].size;
          sum.possible_blocks++;
          _ta_findings_leak(ta_kind_name(TA_KIND_LEAK_POSSIBLE), b[i].size, b[i].tag, b[i].stack, 0, b[i].addr,
                            0, 0, NULL, NULL, 0);
          break;
        case S_INDIRECT:
          sum.indirect_bytes += b[i].size;
          sum.indirect_blocks++;
          _ta_findings_leak(ta_kind_name(TA_KIND_LEAK_INDIRECT), b[i].size, b[i].tag, b[i].stack, 0, b[i].addr,
                            0, 0, NULL, NULL, 0);
          break;
        default:
          sum.direct_bytes += b[i].size;
          sum.direct_blocks++;
          _ta_findings_leak(ta_kind_name(TA_KIND_LEAK_DIRECT), b[i].size, b[i].tag, b[i].stack, 0, b[i].addr,
                            0, 0, NULL, NULL, 0);
          break;
      }
    }
  }
  if (at_exit) _ta_ref_exit();
  _ta_findings_leaks_end(&sum);
  if (m.stack) _ta_sys_munmap(m.stack, (blocks.n + 1) * sizeof *m.stack * 2);
  _ta_bindex_free(&m.x);
  if (scratch) _ta_sys_munmap(scratch, scratch_size);
  mvec_free(&roots);
  mvec_free(&maps);
  if (pagemap_fd >= 0) close(pagemap_fd);
  pagemap_fd = -1;
  mvec_free(&wmaps);
  mvec_free(&cmaps);
  if (plo) _ta_sys_munmap(plo, pcap * 2 * sizeof *plo);
  mvec_free(&blocks);
  self->guard--;
  pthread_mutex_unlock(&scan_lock);
  _ta_cancel_restore(cancel);
}

static void scan_here(bool at_exit) __attribute__((noinline));

/* The registers and stack of the caller are roots: take them here, and scan
 * the stack from this frame up (the scanner's own frames are below it). */
static void scan_here(bool at_exit) {
  ucontext_t uc;
  getcontext(&uc);
  /* At a call, only the callee-saved registers can hold the caller's
   * pointers; the others are dead (and may hold stale ones). */
  greg_t regs[6] = { uc.uc_mcontext.gregs[REG_RBX], uc.uc_mcontext.gregs[REG_RBP],
                     uc.uc_mcontext.gregs[REG_R12], uc.uc_mcontext.gregs[REG_R13],
                     uc.uc_mcontext.gregs[REG_R14], uc.uc_mcontext.gregs[REG_R15] };
  _ta_scan_impl((uintptr_t)__builtin_frame_address(0), regs, sizeof regs, at_exit);
  __asm__ volatile("" ::: "memory");
}

TA_NOINLINE void ta_scan(void) {
  _ta_ensure();
  scan_here(false);
}

void _ta_scan_exit(void) {
  scan_here(true);
}

void _ta_scan_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&scan_lock);
  else pthread_mutex_unlock(&scan_lock);
}
