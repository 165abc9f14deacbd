/* device.c - device memory on the ledger.
 *
 * A device block is (tag, device, address, size, flags, stack, sequence),
 * kept in a table of its own: device addresses are another address space
 * (a pool's buffer may start where its segment starts, and a device address
 * may equal a host one), so they never enter the live table, the scan or the
 * host counts of bytes.  The table is an open-addressing hash of records
 * keyed by (tag, device, address), under one mutex: device allocations are
 * rare next to malloc (a driver call costs microseconds).
 *
 * A freed record stays in the table, marked freed, until FREED_KEEP later
 * frees have pushed it out of a FIFO, so that a second free of it is
 * free.double (with the allocation and first free stacks) rather than
 * free.invalid.
 *
 * Counts: a device allocation or free counts in the tag's allocs and frees
 * (ta_since, marks), and a live device block made since a mark in
 * live_blocks and live_bytes of ta_since and in ta_live_since; device bytes
 * never enter peak_bytes or the run's summary (host memory only).
 *
 * At exit (_ta_device_exit, before the scan) the functions registered with
 * ta_atexit run, newest first, then each live device block without
 * TA_DEVICE_RESERVE becomes a gpu.leak finding. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  uintptr_t addr;          /* 0 with tag 0 and device 0: an empty slot */
  uint64_t  size;
  uint64_t  seq;           /* birth */
  int32_t   device;
  uint16_t  tag;
  uint8_t   live;          /* 1 live, 0 freed (kept for free.double) */
  uint8_t   used;          /* 1: the slot holds a record; 2: deleted (tombstone) */
  uint32_t  stack, free_stack;
  unsigned  flags;
} dev_rec;

#define FREED_KEEP 1024

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dev_rec *slots;
static size_t   cap, used, tombs;           /* cap: a power of 2 */
static struct { uintptr_t addr; int32_t device; uint16_t tag; uint64_t seq; } freed_fifo[FREED_KEEP];
static size_t   freed_head, freed_len;
static _Atomic uint64_t dev_allocs, dev_frees;   /* subtracted from the host summary */

static inline uint64_t key_hash(ta_tag tag, int device, uintptr_t addr) {
  uint64_t h = ((uint64_t)addr ^ ((uint64_t)(uint32_t)device << 48) ^ ((uint64_t)tag << 32)) *
               0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

static inline bool same_key(const dev_rec *r, ta_tag tag, int device, uintptr_t addr) {
  return r->used == 1 && r->addr == addr && r->device == device && r->tag == tag;
}

/* The slot of a key, or NULL.  lock held. */
static dev_rec *find(ta_tag tag, int device, uintptr_t addr) {
  if (cap == 0) return NULL;
  for (size_t i = key_hash(tag, device, addr) & (cap - 1);; i = (i + 1) & (cap - 1)) {
    dev_rec *r = &slots[i];
    if (r->used == 0) return NULL;
    if (same_key(r, tag, device, addr)) return r;
  }
}

static bool grow(void) {
  size_t ncap = cap ? cap * 2 : 256;
  if ((used - tombs) * 2 < cap) ncap = cap;       /* mostly tombstones: rehash in place */
  dev_rec *n = _ta_meta_calloc(ncap, sizeof *n);
  if (n == NULL) return false;
  for (size_t i = 0; i < cap; i++) {
    if (slots[i].used != 1) continue;
    size_t j = key_hash(slots[i].tag, slots[i].device, slots[i].addr) & (ncap - 1);
    while (n[j].used) j = (j + 1) & (ncap - 1);
    n[j] = slots[i];
  }
  _ta_meta_free(slots);
  slots = n;
  cap = ncap;
  used -= tombs;
  tombs = 0;
  return true;
}

/* A slot for a new key (the key is not in the table).  lock held. */
static dev_rec *insert(ta_tag tag, int device, uintptr_t addr) {
  if ((used + 1) * 4 > cap * 3 && !grow()) return NULL;
  size_t i = key_hash(tag, device, addr) & (cap - 1);
  while (slots[i].used == 1) i = (i + 1) & (cap - 1);
  if (slots[i].used == 2) tombs--;
  else used++;
  return &slots[i];
}

static void drop(dev_rec *r) {
  memset(r, 0, sizeof *r);
  r->used = 2;
  tombs++;
}

/* Keeps a freed record for a while; pushes the oldest out.  lock held. */
static void freed_keep(const dev_rec *r) {
  if (freed_len == FREED_KEEP) {
    size_t o = freed_head;
    dev_rec *old = find(freed_fifo[o].tag, freed_fifo[o].device, freed_fifo[o].addr);
    if (old && !old->live && old->seq == freed_fifo[o].seq) drop(old);
    freed_head = (freed_head + 1) % FREED_KEEP;
    freed_len--;
  }
  size_t k = (freed_head + freed_len) % FREED_KEEP;
  freed_fifo[k].addr = r->addr;
  freed_fifo[k].device = r->device;
  freed_fifo[k].tag = r->tag;
  freed_fifo[k].seq = r->seq;
  freed_len++;
}

static void count(ta_thread *t, ta_tag tag, bool alloc) {
  ta_tag_counts *c = &t->counts[tag], *all = &t->counts[0];
  _Atomic uint64_t *a = alloc ? &c->allocs : &c->frees, *b = alloc ? &all->allocs : &all->frees;
  atomic_store_explicit(a, atomic_load_explicit(a, memory_order_relaxed) + 1, memory_order_relaxed);
  if (tag != 0)
    atomic_store_explicit(b, atomic_load_explicit(b, memory_order_relaxed) + 1, memory_order_relaxed);
  atomic_fetch_add_explicit(alloc ? &dev_allocs : &dev_frees, 1, memory_order_relaxed);
}

static ta_tag tag_ok(ta_tag tag) {
  return tag < TA_MAX_TAGS ? tag : TA_ANY;
}

void _ta_device_alloc_at(ta_tag tag, int device, uintptr_t addr, size_t size, unsigned flags,
                         uint32_t stack) {
  _ta_ensure();
  _ta_solo_check();
  ta_thread *t = _ta_thread();
  tag = tag_ok(tag);
  uint64_t seq = _ta_next_seq(t, false);
  pthread_mutex_lock(&lock);
  dev_rec *r = find(tag, device, addr);
  bool twice = r != NULL && r->live;
  uint32_t first = twice ? r->stack : 0;
  if (r == NULL) r = insert(tag, device, addr);
  if (r != NULL) {
    *r = (dev_rec){ .addr = addr, .size = size, .seq = seq, .device = device, .tag = (uint16_t)tag,
                    .live = 1, .used = 1, .stack = stack, .flags = flags };
  }
  pthread_mutex_unlock(&lock);
  if (r == NULL) {
    _ta_error(TA_ENOMEM, "out of memory for the device table (device %d, 0x%lx)", device,
              (unsigned long)addr);
    return;
  }
  count(t, tag, true);
  if (twice)      /* the old record is replaced: the driver reused a live address */
    _ta_error(TA_EINVAL, "device %d: 0x%lx allocated again while live (tag %s, first stack %u)",
              device, (unsigned long)addr, ta_tag_name(tag), (unsigned)first);
  if (_ta_tracing) _ta_trace_device_alloc(t, device, addr, size, tag, stack, flags, seq);
}

int _ta_device_free_at(ta_tag tag, int device, uintptr_t addr, uint32_t stack) {
  _ta_ensure();
  _ta_solo_check();
  ta_thread *t = _ta_thread();
  tag = tag_ok(tag);
  pthread_mutex_lock(&lock);
  dev_rec *r = find(tag, device, addr);
  dev_rec old = r ? *r : (dev_rec){ 0 };
  if (r && r->live) {
    r->live = 0;
    r->free_stack = stack;
    if (r->flags & TA_DEVICE_RESERVE) drop(r);   /* nothing to report twice: the driver says so */
    else freed_keep(r);
  }
  pthread_mutex_unlock(&lock);
  if (r && old.live) {
    count(t, tag, false);
    if (_ta_tracing) _ta_trace_device_free(t, device, addr, tag, stack, _ta_next_seq(t, false));
    return 1;
  }
  char detail[96];
  ta_error_info e = { .tag = tag, .stack = stack, .addr = addr, .detail = detail };
  if (r) {
    e.kind = ta_kind_name(TA_KIND_FREE_DOUBLE);
    e.bytes = old.size;
    e.alloc_stack = old.stack;
    e.free_stack = old.free_stack;
    _ta_snprintf(detail, sizeof detail, "device %d: a freed %lu-byte device block", device,
                 (unsigned long)old.size);
  } else {
    e.kind = ta_kind_name(TA_KIND_FREE_INVALID);
    _ta_snprintf(detail, sizeof detail, "device %d: not a device block of tag %s", device,
                 ta_tag_name(tag));
  }
  _ta_finding_error(&e);
  return 0;
}

TA_NOINLINE void ta_device_alloc(ta_tag tag, int device, uintptr_t addr, size_t size, unsigned flags) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  _ta_device_alloc_at(tag, device, addr, size, flags, stack);
}

TA_NOINLINE int ta_device_free(ta_tag tag, int device, uintptr_t addr) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  return _ta_device_free_at(tag, device, addr, stack);
}

size_t ta_device_size(ta_tag tag, int device, uintptr_t addr) {
  if (tag >= TA_MAX_TAGS) return 0;
  pthread_mutex_lock(&lock);
  dev_rec *r = find(tag, device, addr);
  size_t n = r && r->live ? (size_t)r->size : 0;
  pthread_mutex_unlock(&lock);
  return n;
}

/* A copy of the live records (of device, or all with -1; born at or after
 * seq; of tag, or all with TA_ANY), so that callbacks run without the lock.
 * Returns the count; *out is the ledger's memory (NULL when none). */
static size_t snapshot(int device, uint64_t seq, ta_tag tag, dev_rec **out) {
  pthread_mutex_lock(&lock);
  size_t n = 0;
  for (size_t i = 0; i < cap; i++) n += slots[i].used == 1 && slots[i].live;
  dev_rec *v = n ? _ta_meta_alloc(n * sizeof *v) : NULL;
  size_t k = 0;
  if (v) {
    for (size_t i = 0; i < cap; i++) {
      const dev_rec *r = &slots[i];
      if (r->used != 1 || !r->live || r->seq < seq) continue;
      if ((device >= 0 && r->device != device) || (tag && r->tag != tag)) continue;
      v[k++] = *r;
    }
  }
  pthread_mutex_unlock(&lock);
  *out = v;
  return k;
}

/* Oldest first: callers see blocks in the order they were made. */
static int by_seq(const void *a, const void *b) {
  const dev_rec *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void ta_device_each(int device, void (*fn)(int device, uintptr_t addr, size_t size, ta_tag tag,
                                           uint32_t stack, unsigned flags, void *arg),
                    void *arg) {
  dev_rec *v;
  size_t n = snapshot(device, 0, TA_ANY, &v);
  if (n > 1) qsort(v, n, sizeof *v, by_seq);
  for (size_t i = 0; i < n; i++)
    fn(v[i].device, v[i].addr, (size_t)v[i].size, v[i].tag, v[i].stack, v[i].flags, arg);
  _ta_meta_free(v);
}

void _ta_device_since(uint64_t seq, ta_tag tag, uint64_t *blocks, uint64_t *bytes,
                      void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg),
                      void *arg) {
  if (cap == 0) return;                   /* no device block was ever made */
  dev_rec *v;
  size_t n = snapshot(-1, seq, tag, &v);
  if (n > 1) qsort(v, n, sizeof *v, by_seq);
  for (size_t i = 0; i < n; i++) {
    *blocks += 1;
    *bytes += v[i].size;
    if (fn) fn((const void *)v[i].addr, (size_t)v[i].size, v[i].tag, v[i].stack, arg);
  }
  _ta_meta_free(v);
}

void _ta_device_summary(uint64_t *allocs, uint64_t *frees) {
  *allocs = atomic_load_explicit(&dev_allocs, memory_order_relaxed);
  *frees = atomic_load_explicit(&dev_frees, memory_order_relaxed);
}

/* ---- leaks -------------------------------------------------------------------- */

/* By tag, device and stack, so that equal groups come together. */
static int by_group(const void *a, const void *b) {
  const dev_rec *x = a, *y = b;
  if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->stack != y->stack) return x->stack < y->stack ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

size_t _ta_device_leaks(int device, bool forget) {
  dev_rec *v;
  size_t n = snapshot(device, 0, TA_ANY, &v), found = 0;
  if (n > 1) qsort(v, n, sizeof *v, by_group);
  for (size_t i = 0; i < n; i++) {
    if (v[i].flags & TA_DEVICE_RESERVE) continue;
    char detail[96];
    _ta_snprintf(detail, sizeof detail, "device %d%s", v[i].device, forget ? ", at context teardown" : "");
    ta_finding_add(ta_kind_name(TA_KIND_GPU_LEAK), v[i].tag, v[i].addr, v[i].size, v[i].stack, 0, detail);
    found++;
  }
  if (forget) {                 /* the driver freed them: freed here too, with no stack */
    ta_thread *t = _ta_thread();
    for (size_t i = 0; i < n; i++) {
      pthread_mutex_lock(&lock);
      dev_rec *r = find(v[i].tag, v[i].device, v[i].addr);
      bool mine = r && r->live && r->seq == v[i].seq;
      if (mine) drop(r);
      pthread_mutex_unlock(&lock);
      if (!mine) continue;
      count(t, v[i].tag, false);
      if (_ta_tracing) _ta_trace_device_free(t, v[i].device, v[i].addr, v[i].tag, 0, _ta_next_seq(t, false));
    }
  }
  _ta_meta_free(v);
  return found;
}

/* ---- exit functions ------------------------------------------------------------ */

#define MAX_ATEXIT 64
static void (*atexit_fns[MAX_ATEXIT])(void);
static _Atomic size_t atexit_n;

void ta_atexit(void (*fn)(void)) {
  if (fn == NULL) return;
  _ta_ensure();                 /* the exit work runs only once the ledger is ready */
  size_t i = atomic_fetch_add(&atexit_n, 1);
  if (i >= MAX_ATEXIT) {
    atomic_fetch_sub(&atexit_n, 1);
    _ta_error(TA_EINVAL, "ta_atexit: more than %d functions", MAX_ATEXIT);
    return;
  }
  atexit_fns[i] = fn;
}

void _ta_device_exit(void) {
  for (size_t i = atomic_exchange(&atexit_n, 0); i-- > 0;)
    if (atexit_fns[i]) atexit_fns[i]();
  _ta_device_leaks(-1, false);
}

void _ta_device_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&lock);
  else pthread_mutex_unlock(&lock);
}
