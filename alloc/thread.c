/* thread.c - per-thread state: the registry of threads, their stack bounds,
 * counters and recent births.  A thread's state is made on its first ledger
 * call and folded into the "retired" totals when the thread exits, so counts
 * stay exact after threads end. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread ta_thread *_ta_self;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ta_thread *registry;
static uint32_t next_id = 1;
static ta_tag_counts_plain retired[TA_MAX_TAGS];
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

void _ta_thread_lock(void) { pthread_mutex_lock(&registry_lock); }
void _ta_thread_unlock(void) { pthread_mutex_unlock(&registry_lock); }

static void thread_exit(void *arg) {
  ta_thread *t = arg;
  if (t == NULL) return;
  _ta_trace_thread_exit(t);
  _ta_thread_retire_births(t);
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < TA_MAX_TAGS; i++) {
    retired[i].allocs += atomic_load_explicit(&t->counts[i].allocs, memory_order_relaxed);
    retired[i].frees += atomic_load_explicit(&t->counts[i].frees, memory_order_relaxed);
    retired[i].alloc_bytes += atomic_load_explicit(&t->counts[i].alloc_bytes, memory_order_relaxed);
    retired[i].free_bytes += atomic_load_explicit(&t->counts[i].free_bytes, memory_order_relaxed);
  }
  if (t->prev) t->prev->next = t->next; else registry = t->next;
  if (t->next) t->next->prev = t->prev;
  pthread_mutex_unlock(&registry_lock);
  _ta_self = NULL;
  _ta_meta_free(t);
}

static void make_key(void) {
  pthread_key_create(&exit_key, thread_exit);
}

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
  pthread_mutex_lock(&registry_lock);
  t->id = next_id++;
  t->next = registry;
  if (registry) registry->prev = t;
  registry = t;
  pthread_mutex_unlock(&registry_lock);
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

bool _ta_addr_on_stack(uintptr_t addr) {
  bool found = false;
  pthread_mutex_lock(&registry_lock);
  for (ta_thread *t = registry; t && !found; t = t->next)
    found = addr >= t->stack_lo && addr < t->stack_hi;
  pthread_mutex_unlock(&registry_lock);
  return found;
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
