/* thread.c - per-thread state: the registry of threads, their stack bounds,
 * counters and recent births.  A thread's state is made on its first ledger
 * call and folded into the "retired" totals when the thread exits, so counts
 * stay exact after threads end. */
#include "internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread ta_thread *_ta_self;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ta_thread *registry;
static uint32_t next_id = 1;
static ta_tag_counts_plain retired[TA_MAX_TAGS];
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* ---- solo mode (internal.h) ------------------------------------------------ */

_Atomic(ta_thread *) _ta_solo;
static pthread_mutex_t solo_lock = PTHREAD_MUTEX_INITIALIZER;  /* revocations, one at a time */
static bool solo_ok;                 /* membarrier works in this process */

static bool solo_register(void) {
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/* solo_lock is held. */
static void solo_revoke_locked(void) {
  ta_thread *s = atomic_load(&_ta_solo);
  if (s != NULL && s != _ta_self) {
    atomic_store(&_ta_solo, NULL);
    /* Every thread of the process now runs a full barrier: the solo thread
     * either had entered a section (and we see its depth) or will read
     * the cleared pointer. */
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) abort();
    for (int spins = 0; atomic_load_explicit(&s->solo_depth, memory_order_acquire) != 0; )
      if (++spins > 64) { sched_yield(); spins = 0; }
      else __builtin_ia32_pause();
    _ta_seq_clock_sync();                /* the solo thread's counts come first */
  }
}

void _ta_solo_revoke(void) {
  pthread_mutex_lock(&solo_lock);
  solo_revoke_locked();
  pthread_mutex_unlock(&solo_lock);
}

/* The registry is locked: makes the one live thread solo, if there is one. */
static void solo_grant(void) {
  if (solo_ok && registry != NULL && registry->next == NULL && !registry->dead) {
    _ta_seq_counter_sync();              /* its counts come after every TSC number */
    atomic_store(&_ta_solo, registry);
  }
}

void _ta_thread_lock(void) { pthread_mutex_lock(&registry_lock); }
void _ta_thread_unlock(void) { pthread_mutex_unlock(&registry_lock); }

/* Adds t's counts to the retired totals; the registry is locked. */
static void fold(ta_thread *t) {
  for (size_t i = 0; i < TA_MAX_TAGS; i++) {
    retired[i].allocs += atomic_load_explicit(&t->counts[i].allocs, memory_order_relaxed);
    retired[i].frees += atomic_load_explicit(&t->counts[i].frees, memory_order_relaxed);
    retired[i].alloc_bytes += atomic_load_explicit(&t->counts[i].alloc_bytes, memory_order_relaxed);
    retired[i].free_bytes += atomic_load_explicit(&t->counts[i].free_bytes, memory_order_relaxed);
  }
  _ta_thread_retire_births(t);
}

static void thread_exit(void *arg) {
  ta_thread *t = arg;
  if (t == NULL) return;
  _ta_quarantine_drain(t);
  _ta_counts_publish(t);
  _ta_trace_thread_exit(t);
  pthread_mutex_lock(&solo_lock);          /* no revoker may be waiting on t */
  if (atomic_load(&_ta_solo) == t) atomic_store(&_ta_solo, NULL);
  pthread_mutex_lock(&registry_lock);
  atomic_fetch_sub(&_ta_threads_live, 1);
  fold(t);
  if (t->prev) t->prev->next = t->next; else registry = t->next;
  if (t->next) t->next->prev = t->prev;
  solo_grant();                            /* the thread left alone runs solo again */
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_unlock(&solo_lock);
  _ta_self = NULL;
  _ta_quarantine_forget(t);                /* no lookup reaches its rings now */
  _ta_meta_free(t->stack_memo);
  _ta_meta_free(t->walk_memo);
  _ta_meta_free(t);
}

static void make_key(void) {
  pthread_key_create(&exit_key, thread_exit);
}

static bool mapping_of(uintptr_t a, uintptr_t *lo, uintptr_t *hi);

/* The initial stack pointer of the process (ld.so's). */
extern void *__libc_stack_end;

/* [lo, hi): the thread's stack.  The initial thread's runs to the end of
 * its mapping: above the stack pointer main starts with lie argv, environ
 * and the auxiliary vector, and a program may keep blocks there (ld
 * rewrites its "-l" arguments in place).  pthread_getattr_np ends that
 * stack at the page after __libc_stack_end, so a long argv spans the cut
 * or not as the stack's random start falls. */
static void stack_bounds(uintptr_t *lo, uintptr_t *hi) {
  pthread_attr_t attr;
  void *addr;
  size_t size;
  *lo = *hi = 0;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
    *lo = (uintptr_t)addr;
    *hi = (uintptr_t)addr + size;
  }
  pthread_attr_destroy(&attr);
  uintptr_t initial = (uintptr_t)__libc_stack_end, mlo, mhi;
  if (initial >= *lo && initial < *hi && mapping_of(initial, &mlo, &mhi) && mhi > *hi) *hi = mhi;
}

ta_thread *_ta_thread_slow(void) {
  ta_thread *t = _ta_meta_calloc(1, sizeof *t);
  if (t == NULL) abort();
  t->guard = 1;                       /* stack_bounds may allocate */
  _ta_self = t;
  t->tid = (int)syscall(SYS_gettid);
  t->self = pthread_self();
  stack_bounds(&t->stack_lo, &t->stack_hi);
  pthread_once(&key_once, make_key);
  pthread_setspecific(exit_key, t);
  pthread_mutex_lock(&solo_lock);
  pthread_mutex_lock(&registry_lock);
  if (next_id == 1) solo_ok = solo_register();
  t->id = next_id++;
  t->next = registry;
  if (registry) registry->prev = t;
  registry = t;
  atomic_fetch_add(&_ta_threads_live, 1);
  solo_revoke_locked();                    /* before this thread touches anything shared */
  solo_grant();
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_unlock(&solo_lock);
  t->guard = 0;
  _ta_trace_thread_start(t);
  return t;
}

uint32_t _ta_thread_id(void) { return _ta_thread()->id; }

void _ta_thread_stack(uintptr_t *lo, uintptr_t *hi) {
  ta_thread *t = _ta_self;
  if (t) { *lo = t->stack_lo; *hi = t->stack_hi; }
  else { *lo = *hi = 0; }
}

/* Reads a small /proc file into buf; returns its length. */
static size_t read_small(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t len = 0;
  ssize_t r;
  while (len + 1 < n && (r = read(fd, buf + len, n - 1 - len)) > 0) len += (size_t)r;
  close(fd);
  buf[len] = '\0';
  return len;
}

typedef struct {
  uintptr_t a, lo, hi;
} mapping_query;

static int mapping_has(const ta_maps_entry *e, void *arg) {
  mapping_query *q = arg;
  if (q->a < e->lo || q->a >= e->hi) return 0;
  q->lo = e->lo;
  q->hi = e->hi;
  return 1;
}

/* The mapping [lo, hi) of /proc/self/maps that contains a; false if none. */
static bool mapping_of(uintptr_t a, uintptr_t *lo, uintptr_t *hi) {
  mapping_query q = { a, 0, 0 };
  if (_ta_maps_each(mapping_has, &q) <= 0) return false;
  *lo = q.lo;
  *hi = q.hi;
  return true;
}

/* Threads that never called the ledger are not registered: find their
 * stacks by the stack pointer each one shows in /proc/self/task/N/syscall
 * (blocked threads) - slow, and only for pointers nothing else explains. */
static bool on_unknown_stack(uintptr_t addr) {
  uintptr_t lo, hi;
  if (!mapping_of(addr, &lo, &hi)) return false;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%s/syscall", e->d_name);
    if (read_small(path, buf, sizeof buf) == 0 || strncmp(buf, "running", 7) == 0) continue;
    /* "nr a1 a2 a3 a4 a5 a6 sp pc" */
    char *p = buf;
    for (int field = 0; field < 7 && p; field++) {
      p = strchr(p, ' ');
      if (p) p++;
    }
    if (p == NULL) continue;
    uintptr_t sp = (uintptr_t)strtoull(p, NULL, 16);
    found = sp >= lo && sp < hi;
  }
  closedir(d);
  return found;
}

bool _ta_addr_on_stack(uintptr_t addr) {
  bool found = false;
  pthread_mutex_lock(&registry_lock);
  for (ta_thread *t = registry; t && !found; t = t->next)
    found = addr >= t->stack_lo && addr < t->stack_hi;
  pthread_mutex_unlock(&registry_lock);
  return found;
}

bool _ta_addr_on_unknown_stack(uintptr_t addr) {
  return on_unknown_stack(addr);
}

void _ta_thread_sum(ta_tag_counts_plain *out, size_t ntags) {
  if (ntags > TA_MAX_TAGS) ntags = TA_MAX_TAGS;
  pthread_mutex_lock(&registry_lock);
  memcpy(out, retired, ntags * sizeof *out);
  for (ta_thread *t = registry; t; t = t->next)
    for (size_t i = 0; i < ntags; i++) {
      out[i].allocs += atomic_load_explicit(&t->counts[i].allocs, memory_order_relaxed);
      out[i].frees += atomic_load_explicit(&t->counts[i].frees, memory_order_relaxed);
      out[i].alloc_bytes += atomic_load_explicit(&t->counts[i].alloc_bytes, memory_order_relaxed);
      out[i].free_bytes += atomic_load_explicit(&t->counts[i].free_bytes, memory_order_relaxed);
    }
  pthread_mutex_unlock(&registry_lock);
}

void _ta_thread_each(void (*fn)(ta_thread *t, void *arg), void *arg) {
  pthread_mutex_lock(&registry_lock);
  for (ta_thread *t = registry; t; t = t->next) fn(t, arg);
  pthread_mutex_unlock(&registry_lock);
}

bool _ta_thread_each_try(void (*fn)(ta_thread *t, void *arg), void *arg) {
  if (pthread_mutex_trylock(&registry_lock) != 0) return false;
  for (ta_thread *t = registry; t; t = t->next) fn(t, arg);
  pthread_mutex_unlock(&registry_lock);
  return true;
}

void _ta_thread_fork(int phase) {
  if (phase == TA_FORK_PREPARE) {
    pthread_mutex_lock(&solo_lock);
    pthread_mutex_lock(&registry_lock);
    /* Another thread solo (the forking one never used the ledger): it
     * stops being solo now, under the lock, and not when the shard locks
     * that come next ask for it (_ta_solo_check would take solo_lock
     * again: the fork hung). */
    solo_revoke_locked();
    return;
  }
  if (phase == TA_FORK_CHILD) {
    /* The other threads are gone: their counts become history. */
    ta_thread *self = _ta_self, *next;
    for (ta_thread *t = registry; t; t = next) {
      next = t->next;
      if (t == self) continue;
      fold(t);
      atomic_fetch_sub(&_ta_threads_live, 1);
      if (t->prev) t->prev->next = t->next; else registry = t->next;
      if (t->next) t->next->prev = t->prev;
      _ta_meta_free(t->trace);
      _ta_quarantine_forget(t);      /* its blocks stay quarantined for good */
      _ta_meta_free(t->stack_memo);
      _ta_meta_free(t->walk_memo);
      _ta_meta_free(t);
    }
    if (self) self->tid = (int)syscall(SYS_gettid);
    atomic_store(&_ta_solo, NULL);
    solo_ok = solo_ok && solo_register();     /* a new mm: register again */
    solo_grant();
  }
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_unlock(&solo_lock);
}

/* ---- the preload's guard, from a ledger that is not the preload's ---------------- */

/* A program linked with libtagalloc.a and run under the preload has two
 * ledgers: its own and the preload's, each with its own guard.  The work of
 * its own (libdw reading unwind rules, the symbolizer) allocates through
 * malloc, the preload's, which would record those blocks as the program's:
 * so that work raises the preload's guard too, through the preload's
 * _pl_enter.  In the preload itself, or with no preload, nothing. */
typedef ta_thread *host_enter_fn(void);
static host_enter_fn *host_enter;
static atomic_int host_state;            /* 0: not looked up; 1: none; 2: host_enter */

ta_thread *_ta_host_enter(void) {
  int st = atomic_load_explicit(&host_state, memory_order_acquire);
  if (st == 0) {
    void *f = dlsym(RTLD_DEFAULT, "_pl_enter");
    Dl_info mine, theirs;
    /* the preload's own ledger finds itself: its guard is this one */
    if (f && dladdr((void *)_ta_host_enter, &mine) && dladdr(f, &theirs) && mine.dli_fbase == theirs.dli_fbase)
      f = NULL;
    memcpy(&host_enter, &f, sizeof f);
    st = f ? 2 : 1;
    atomic_store_explicit(&host_state, st, memory_order_release);
  }
  return st == 2 ? host_enter() : NULL;
}

static int count_finding(const ta_finding *f, void *arg) {
  (void)f;
  ++*(size_t *)arg;
  return 0;
}

/* The program's copy under the preload, with nothing of its own (its
 * blocks are malloc's, which the preload's ledger records): the preload's
 * report is the process's, this one would only say "no leaks" again. */
bool _ta_host_quiet(void) {
  ta_thread *t = _ta_host_enter();
  _ta_host_leave(t);
  if (atomic_load_explicit(&host_state, memory_order_acquire) != 2) return false;
  ta_summary s = ta_summary_get();
  size_t n = 0;
  ta_findings_visit(count_finding, &n);
  return s.allocs == 0 && s.errors == 0 && n == 0;
}

void _ta_host_leave(ta_thread *host) {
  if (host) host->guard--;
}
