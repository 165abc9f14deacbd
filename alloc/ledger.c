/* ledger.c - blocks: allocation, free, the live table, the quarantine,
 * counts and marks.
 *
 * The live table is 256 shards chosen by a hash of the address; each shard
 * is an open-addressing table (linear probing, backward-shift deletion) under
 * its own spin lock, so threads freeing and allocating different blocks
 * rarely meet.  A block's record:
 *
 *   addr | size, tag | seq (birth), state, flags | stack | free_stack   (32 bytes)
 *
 * A freed block leaves the table for its thread's quarantine (a FIFO
 * ring, its share of TAGALLOC_QUARANTINE bytes), its first
 * TAGALLOC_POISON_SPAN bytes filled with the poison byte; so a second
 * free, or a hold on a freed block, finds the record with both stacks, and
 * a write after free is seen when the block leaves the quarantine.
 *
 * Overflows (heap.overflow) in default mode, as SQLite's mem2 and glibc's
 * malloc checks see them: jemalloc rounds each request up to a size class,
 * and the first TA_PAD_MAX bytes of that slack past the requested size hold
 * TA_PAD_BYTE:
 *
 *   | requested size ......... | pad (<= 16 bytes of 0xDE) | rest of the class |
 *   ^ addr                     ^ addr + size                ^ addr + usable size
 *
 * The pad is checked when the block is freed, when it leaves the
 * quarantine, and at exit (live blocks too): a changed byte is heap.overflow
 * with the allocation and free stacks, the offsets and the value written.
 * A block whose size is a size class itself (16, 32, 48, 64, 80, ... 4096)
 * has no slack and no pad: asking jemalloc for more would move it to the
 * next class (16 -> 32 bytes, 64 -> 80, 4096 -> 5120: up to twice the
 * memory for the blocks programs ask for most), so those overflows are left
 * to --guard, which catches any of them at the faulting instruction.  The
 * cost is a memset of up to 16 bytes at each allocation and a compare at
 * each free (README: make bench-alloc).  ta_usable_size answers the
 * requested size, so a program that uses what malloc_usable_size says
 * never writes the pad.
 *
 * Counting: every thread counts its own allocations and frees per tag
 * (thread.c); live bytes per tag are shared atomics so that peaks are exact. */
#include "internal.h"

#include <jemalloc/jemalloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <emmintrin.h>
#include <fcntl.h>

_Atomic uint64_t _ta_seq = 1;
_Atomic uint64_t _ta_seq_epoch;
bool _ta_seq_clock;
_Atomic uint64_t _ta_seq_clock_base;
_Atomic int _ta_threads_live;
_Atomic int _ta_ready;

/* ---- tags --------------------------------------------------------------- */

static pthread_mutex_t tag_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *tag_names[TA_MAX_TAGS] = { "any" };
static _Atomic uint32_t tag_count = 1;

ta_tag ta_tag_get(const char *name) {
  _ta_ensure();
  if (name == NULL || *name == '\0') {
    _ta_error(TA_EINVAL, "ta_tag_get: a tag needs a non-empty name");
    return TA_ANY;
  }
  uint32_t n = atomic_load_explicit(&tag_count, memory_order_acquire);
  for (uint32_t i = 1; i < n; i++)
    if (strcmp(tag_names[i], name) == 0) return i;
  pthread_mutex_lock(&tag_lock);
  n = atomic_load(&tag_count);
  ta_tag found = TA_ANY;
  for (uint32_t i = 1; i < n && !found; i++)
    if (strcmp(tag_names[i], name) == 0) found = i;
  if (!found && n < TA_MAX_TAGS) {
    tag_names[n] = _ta_meta_strdup(name);
    found = n;
    atomic_store_explicit(&tag_count, n + 1, memory_order_release);
    _ta_trace_tag(found, name);
  }
  pthread_mutex_unlock(&tag_lock);
  if (!found) _ta_error(TA_EINVAL, "ta_tag_get: no room for tag \"%s\" (%d tags at most)", name, TA_MAX_TAGS);
  return found;
}

const char *ta_tag_name(ta_tag tag) {
  return tag < atomic_load(&tag_count) ? tag_names[tag] : "?";
}

static ta_tag tag_realloc;      /* the tag of ta_realloc(NULL, n) */

/* ---- the live table ------------------------------------------------------- */

#define NSHARDS 256

/* One cache line each (a hand-counted pad once made them 72 bytes: every
 * other shard straddled two lines). */
typedef struct {
  _Atomic int lock;
  uint32_t mask;              /* capacity - 1; capacity 0 before first use */
  uint32_t used;
  ta_block *slots;
} __attribute__((aligned(64))) shard;
_Static_assert(sizeof(shard) == 64, "a shard is one cache line");

static shard shards[NSHARDS] __attribute__((aligned(64)));
static _Atomic int64_t live_bytes[TA_MAX_TAGS];
static _Atomic uint64_t peak_cur[TA_MAX_TAGS];  /* peak since the latest mark */
static _Atomic uint64_t peak_run;            /* peak of all live bytes, whole run */

static inline uint64_t addr_hash(uintptr_t a) {
  uint64_t h = (uint64_t)a >> 4;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 31);
}

/* The shard of a block: by its 4 KiB page, so that the blocks of one
 * jemalloc slab page (one thread's, mostly) share a shard.  Coarser regions
 * keep more of a thread's blocks in its own shards but spread a heap over
 * fewer of them, and the shards' tables grow unevenly: by 64 KiB regions,
 * churn on 4 threads 0.573 -> 0.556 s, but the tree's peak RSS 226 -> 257
 * MB; by 2 MiB regions, the 4 threads shared a few shards' locks, 1.33 s. */
static inline shard *shard_of(uintptr_t a) { return &shards[addr_hash(a >> 12) >> 56]; }

/* The home slot of a block in its shard: the high half of the product.
 * Its low bits depend on every bit of the address (a product's low bits
 * only on the address's own low bits, which a slab's blocks share in
 * patterns): a find probed 1.4 slots on average, where addr_hash's low
 * bits made it 4.7 (python3 with PYTHONMALLOC=malloc; the tree 1.5 for
 * 4.9, the churn 1.5 for 2.2). */
static inline uint32_t slot_hash(uintptr_t a) {
  return (uint32_t)((((uint64_t)a >> 4) * 0x9E3779B97F4A7C15ull) >> 32);
}

/* Its home slot in s as s is now (shard_grow places records by the new
 * size's mask). */
static inline uint32_t slot_home(const shard *s, uintptr_t a) { return slot_hash(a) & s->mask; }

static inline void shard_lock(shard *s) {
  _ta_solo_check();
  int spins = 0;
  while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)) {
    while (atomic_load_explicit(&s->lock, memory_order_relaxed)) {
      if (++spins > 64) { sched_yield(); spins = 0; }
      else __builtin_ia32_pause();
    }
  }
}

static inline void shard_unlock(shard *s) {
  atomic_store_explicit(&s->lock, 0, memory_order_release);
}

/* The solo thread, inside a solo section, needs no lock (ta_thread: solo). */
static inline void shard_lock_if(shard *s, bool solo) {
  if (!solo) shard_lock(s);
}

static inline void shard_unlock_if(shard *s, bool solo) {
  if (!solo) shard_unlock(s);
}

static ta_block *slot_find(shard *s, uintptr_t a) {
  if (s->slots == NULL) return NULL;
  uint32_t i = slot_home(s, a);
  for (;;) {
    ta_block *b = &s->slots[i];
    if (b->addr == a) return b;
    if (b->addr == 0) return NULL;
    i = (i + 1) & s->mask;
  }
}

/* Starts loading the table slot where a's record would be: a record of a
 * large live table is a cache miss (python3 with PYTHONMALLOC=malloc:
 * a third of its time), and the stack capture that comes before the table
 * (50-100 ns) hides it.  A hint: the table may grow meanwhile. */
void _ta_block_prefetch(const void *p) {
  uintptr_t a = (uintptr_t)p;
  const shard *s = shard_of(a);
  const ta_block *slots = s->slots;
  if (slots) __builtin_prefetch(&slots[slot_home(s, a)]);
}

/* A shard starts with 8 slots (it doubles at three quarters load): 256
 * shards of 64 were 655 KB zeroed in every process, however few blocks it
 * had. */
static bool shard_grow(shard *s) {
  uint32_t cap = s->slots ? (s->mask + 1) * 2 : 8;
  ta_block *n = _ta_meta_calloc(cap, sizeof *n);
  if (n == NULL) return false;
  if (s->slots) {
    for (uint32_t i = 0; i <= s->mask; i++) {
      ta_block *b = &s->slots[i];
      if (b->addr == 0) continue;
      uint32_t j = slot_hash(b->addr) & (cap - 1);
      while (n[j].addr) j = (j + 1) & (cap - 1);
      n[j] = *b;
    }
    _ta_meta_free(s->slots);
  }
  s->slots = n;
  s->mask = cap - 1;
  return true;
}

/* Inserts a record; the address must not be in the table. */
static ta_block *slot_insert(shard *s, uintptr_t a) {
  /* Load <= 3/4: even at 3/4 a hit probes 2.5 slots on average (two
   * records a line), a miss 8.5; the tables of test_table_shape and of
   * python3, between 3/8 and 3/4, probe 1.2 to 1.4.  At 1/2 a record cost
   * 64 to 128 bytes of table: python3 with PYTHONMALLOC=malloc 110 MB peak
   * RSS, 86 MB at 3/4, in the same time. */
  if (s->slots == NULL || (uint64_t)(s->used + 1) * 4 > (uint64_t)(s->mask + 1) * 3)
    if (!shard_grow(s)) return NULL;
  uint32_t i = slot_home(s, a);
  while (s->slots[i].addr) i = (i + 1) & s->mask;
  s->used++;
  s->slots[i].addr = a;
  return &s->slots[i];
}

static void slot_remove(shard *s, ta_block *b) {
  uint32_t i = (uint32_t)(b - s->slots), j = i;
  s->used--;
  for (;;) {
    s->slots[i].addr = 0;
    for (;;) {
      j = (j + 1) & s->mask;
      if (s->slots[j].addr == 0) return;
      uint32_t home = slot_home(s, s->slots[j].addr);
      /* Can the entry at j move to the hole at i?  Only if its home is not
       * in the cyclic range (i, j]. */
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
    }
    s->slots[i] = s->slots[j];
    i = j;
  }
}

/* ---- counting ------------------------------------------------------------- */

static inline void peak_raise(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);
  while (v > p && !atomic_compare_exchange_weak_explicit(peak, &p, v, memory_order_relaxed,
                                                         memory_order_relaxed)) {}
}

/* Live bytes per tag are shared counters, for exact peaks.  While one
 * thread is allocating it adds to them at every event (an uncontended
 * atomic is cheap); while several are, each thread adds up its own change
 * and publishes it when it reaches PUBLISH_BYTES either way, so threads do
 * not fight over the counters' cache line.  Counts and live bytes come from
 * the per-thread rows and stay exact; a peak may then miss by less than
 * PUBLISH_BYTES per thread. */
#define PUBLISH_BYTES (64 << 10)

static inline void publish(ta_tag tag, int64_t delta) {
  uint64_t v = (uint64_t)(atomic_fetch_add_explicit(&live_bytes[tag], delta, memory_order_relaxed) + delta);
  if (delta > 0 && v > atomic_load_explicit(&peak_cur[tag], memory_order_relaxed)) {
    peak_raise(&peak_cur[tag], v);
    if (tag == 0) peak_raise(&peak_run, v);
  }
}

/* The same, by the solo thread in a solo section: plain loads and stores. */
static inline void publish_solo(ta_tag tag, int64_t delta) {
  uint64_t v = (uint64_t)(atomic_load_explicit(&live_bytes[tag], memory_order_relaxed) + delta);
  atomic_store_explicit(&live_bytes[tag], (int64_t)v, memory_order_relaxed);
  if (delta > 0 && v > atomic_load_explicit(&peak_cur[tag], memory_order_relaxed)) {
    atomic_store_explicit(&peak_cur[tag], v, memory_order_relaxed);
    if (tag == 0 && v > atomic_load_explicit(&peak_run, memory_order_relaxed))
      atomic_store_explicit(&peak_run, v, memory_order_relaxed);
  }
}

void _ta_counts_publish(ta_thread *t) {
  for (size_t i = 0; i < TA_MAX_TAGS; i++)
    if (t->pending[i]) {
      publish((ta_tag)i, t->pending[i]);
      t->pending[i] = 0;
    }
  t->batching = false;
}

static inline void live_change(ta_thread *t, ta_tag tag, int64_t delta, bool solo) {
  if (solo && TA_LIKELY(!t->batching)) {
    if (tag) publish_solo(tag, delta);
    publish_solo(0, delta);
    return;
  }
  bool batch = atomic_load_explicit(&_ta_threads_live, memory_order_relaxed) > 1;
  if (TA_LIKELY(!batch)) {
    if (TA_UNLIKELY(t->batching)) _ta_counts_publish(t);
    if (tag) publish(tag, delta);
    publish(0, delta);
    return;
  }
  t->batching = true;
  if (tag) {
    int64_t p = t->pending[tag] += delta;
    if (p >= PUBLISH_BYTES || p <= -PUBLISH_BYTES) { publish(tag, p); t->pending[tag] = 0; }
  }
  int64_t p = t->pending[0] += delta;
  if (p >= PUBLISH_BYTES || p <= -PUBLISH_BYTES) { publish(0, p); t->pending[0] = 0; }
}

static inline void bump(_Atomic uint64_t *c, uint64_t v) {   /* single writer */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static inline void count_alloc(ta_thread *t, ta_tag tag, uint64_t size, uintptr_t addr, uint64_t seq,
                               bool solo) {
  ta_tag_counts *c = &t->counts[tag], *all = &t->counts[0];
  bump(&c->allocs, 1);
  bump(&c->alloc_bytes, size);
  if (tag != 0) {
    bump(&all->allocs, 1);
    bump(&all->alloc_bytes, size);
  }
  live_change(t, tag, (int64_t)size, solo);
  uint64_t h = atomic_load_explicit(&t->ring_head, memory_order_relaxed);
  ta_birth *r = &t->ring[h % TA_RING];
  atomic_store_explicit(&r->addr, addr, memory_order_relaxed);
  atomic_store_explicit(&r->seq, seq, memory_order_relaxed);
  atomic_store_explicit(&t->ring_head, h + 1, memory_order_release);
}

static inline void count_free(ta_thread *t, ta_tag tag, uint64_t size, bool solo) {
  ta_tag_counts *c = &t->counts[tag], *all = &t->counts[0];
  bump(&c->frees, 1);
  bump(&c->free_bytes, size);
  if (tag != 0) {
    bump(&all->frees, 1);
    bump(&all->free_bytes, size);
  }
  live_change(t, tag, -(int64_t)size, solo);
}

/* ---- stacks ---------------------------------------------------------------- */

TA_NOINLINE uint32_t _ta_stack_capture(size_t skip) {
  if (!_ta_opt.record || _ta_opt.unwind == TA_UNWIND_NONE) return 0;
  uint32_t id = _ta_unwind_id((size_t)_ta_opt.depth, skip + 1, (int)_ta_opt.unwind);
  __asm__ volatile("" ::: "memory");     /* keep this frame: no tail call above */
  return id;
}

size_t ta_stack_frames(uint32_t stack, uintptr_t *frames, size_t max) {
  return frames ? _ta_depot_get(stack, frames, max) : 0;
}

size_t ta_stacks_count(void) { return _ta_depot_count(); }

TA_NOINLINE uint32_t ta_stack_here(void) {
  _ta_ensure();
  uint32_t id = _ta_stack_capture(1);
  __asm__ volatile("" ::: "memory");     /* no tail call: this frame is skipped */
  return id;
}

/* ---- allocation ------------------------------------------------------------ */

/* jemalloc, or in guard mode a block on a page of its own (guard.c);
 * flags are mallocx's, align and zero are read by guard mode. */
static inline void *raw_alloc(ta_thread *t, size_t size, size_t align, int flags) {
  if (TA_UNLIKELY(_ta_guard_on)) {
    void *g = _ta_guard_alloc(size, align, (flags & MALLOCX_ZERO) != 0);
    if (g) return g;
  }
  (void)t;
  return mallocx(size ? size : 1, flags);
}

static inline void raw_free(ta_thread *t, uintptr_t a) {
  (void)t;
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_release(a)) return;
  dallocx((void *)a, 0);
}

/* ---- the pad past a block's end (the overflow check) ------------------------- */

#define TA_PAD_MAX 16
#define PAD_WORD (0x0101010101010101ull * TA_PAD_BYTE)

/* jemalloc's size class of a request of n bytes (x86-64: 16-byte quantum,
 * four classes per doubling above 128 bytes), computed inline: nallocx
 * cost as much as the rest of the pad (a call and jemalloc's thread
 * state).  _ta_init checks the formula against nallocx; where they differ
 * (another jemalloc configuration), nallocx is asked. */
static bool pad_use_nallocx;

static inline size_t class_of(size_t n) {
  if (n <= 8) return 8;
  if (n <= 128) return (n + 15) & ~(size_t)15;
  size_t delta = (size_t)1 << (63 - __builtin_clzll((unsigned long long)(n - 1)) - 2);
  return (n + delta - 1) & ~(delta - 1);
}

static void pad_check_classes(void) {
  for (size_t n = 1; n <= 70000 && !pad_use_nallocx; n += n < 4096 ? 1 : 7)
    pad_use_nallocx = class_of(n) != nallocx(n, 0);
}

/* Bytes of pad past a block of `size` bytes: the slack of its size class,
 * at most TA_PAD_MAX.  The class of an unaligned request; an aligned one's
 * is at least as big, so the pad is always inside the block's usable size. */
static inline size_t pad_len(uint64_t size) {
  size_t n = size ? (size_t)size : 1;
  size_t usable = TA_UNLIKELY(pad_use_nallocx) ? nallocx(n, 0) : class_of(n);
  size_t slack = usable > size ? usable - (size_t)size : 0;
  return slack < TA_PAD_MAX ? slack : TA_PAD_MAX;
}

static inline bool pad_owned(uintptr_t a) {
  return !(TA_UNLIKELY(_ta_guard_on) && _ta_guard_owns(a));   /* guard.c checks its own slack */
}

/* Two overlapping word stores (or loads) cover any n in [8, 16]; no call. */
static inline void pad_fill(uintptr_t a, uint64_t size) {
  size_t n = pad_len(size);
  unsigned char *p = (unsigned char *)(a + size);
  uint64_t w = PAD_WORD;
  uint32_t h = (uint32_t)PAD_WORD;
  if (n >= 8) {
    memcpy(p, &w, 8);
    memcpy(p + n - 8, &w, 8);
  } else if (n >= 4) {
    memcpy(p, &h, 4);
    memcpy(p + n - 4, &h, 4);
  } else {
    for (size_t i = 0; i < n; i++) p[i] = TA_PAD_BYTE;
  }
}

static inline bool pad_intact(const unsigned char *p, size_t n) {
  if (n >= 8) {
    uint64_t x, y;
    memcpy(&x, p, 8);
    memcpy(&y, p + n - 8, 8);
    return x == PAD_WORD && y == PAD_WORD;
  }
  if (n >= 4) {
    uint32_t x, y;
    memcpy(&x, p, 4);
    memcpy(&y, p + n - 4, 4);
    return x == (uint32_t)PAD_WORD && y == (uint32_t)PAD_WORD;
  }
  for (size_t i = 0; i < n; i++)
    if (p[i] != TA_PAD_BYTE) return false;
  return true;
}

typedef struct { size_t first, last, count; unsigned char value; } pad_damage;

/* Whether the pad of the block at a (size bytes) was written; d says where. */
static inline bool pad_changed(uintptr_t a, uint64_t size, pad_damage *d) {
  size_t n = pad_len(size);
  const unsigned char *p = (const unsigned char *)(a + size);
  if (TA_LIKELY(pad_intact(p, n))) return false;
  d->count = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == TA_PAD_BYTE) continue;
    if (d->count++ == 0) d->first = i, d->value = p[i];
    d->last = i;
  }
  return true;
}

enum { PAD_AT_FREE, PAD_AT_QUARANTINE, PAD_AT_EXIT };

/* heap.overflow: b's pad was written.  At its free the headline stack is
 * the free (where it was found); later the write is not placed (stack 0). */
static void report_overflow(const ta_block *b, const pad_damage *d, int when) {
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "wrote %zu byte(s) past the end of the %zu-byte block: offsets %zu..%zu, first 0x%02x%s",
               d->count, (size_t)b->size, (size_t)b->size + d->first, (size_t)b->size + d->last, d->value,
               when == PAD_AT_QUARANTINE ? " (left the quarantine)" : when == PAD_AT_EXIT ? " (at exit)" : "");
  ta_error_info e = { .kind = "heap.overflow", .bytes = b->size, .tag = b->tag,
                      .stack = when == PAD_AT_FREE ? b->free_stack : 0, .alloc_stack = b->stack,
                      .free_stack = b->state == TA_FREED ? b->free_stack : 0, .addr = b->addr,
                      .detail = detail };
  _ta_finding_error(&e);
}

/* Records a new block; p came from raw_alloc. */
static void *block_new(ta_thread *t, void *p, size_t size, ta_tag tag, uint32_t stack) {
  if (TA_UNLIKELY(p == NULL)) {
    _ta_error(TA_ENOMEM, "out of memory allocating %zu bytes", size);
    return NULL;
  }
  if (_ta_opt.fill >= 0) memset(p, (int)_ta_opt.fill, size);
  uintptr_t a = (uintptr_t)p;
  if (TA_LIKELY(pad_owned(a))) pad_fill(a, size);
  bool solo = _ta_solo_enter(t);
  uint64_t seq = _ta_next_seq(t, solo);
  shard *s = shard_of(a);
  shard_lock_if(s, solo);
  ta_block *b = slot_find(s, a);
  if (b == NULL) b = slot_insert(s, a);
  if (b) *b = (ta_block){ .addr = a, .size = size, .tag = tag, .seq = seq, .state = TA_LIVE, .stack = stack };
  shard_unlock_if(s, solo);
  if (TA_UNLIKELY(b == NULL)) {
    _ta_solo_leave(t, solo);
    raw_free(t, a);
    _ta_error(TA_ENOMEM, "out of memory for the ledger's own table");
    return NULL;
  }
  count_alloc(t, tag, size, a, seq, solo);
  _ta_solo_leave(t, solo);
  if (_ta_tracing) _ta_trace_alloc(t, a, size, tag, stack, seq, 0);
  return p;
}

static inline ta_tag tag_check(ta_tag tag) {
  return tag < atomic_load_explicit(&tag_count, memory_order_relaxed) ? tag : TA_ANY;
}

TA_NOINLINE void *ta_alloc(ta_tag tag, size_t size) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  void *p = raw_alloc(t, size, 16, 0);
  if (p) _ta_block_prefetch(p);             /* loads while the stack is taken */
  uint32_t stack = _ta_stack_capture(1);
  return block_new(t, p, size, tag_check(tag), stack);
}

TA_NOINLINE void *ta_calloc(ta_tag tag, size_t n, size_t size) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    _ta_error(TA_EOVERFLOW, "ta_calloc: %zu x %zu bytes overflows", n, size);
    return NULL;
  }
  uint32_t stack = _ta_stack_capture(1);
  void *p = block_new(t, raw_alloc(t, total, 16, MALLOCX_ZERO), total, tag_check(tag), stack);
  if (p && _ta_opt.fill >= 0) memset(p, 0, total);
  return p;
}

TA_NOINLINE void *ta_aligned(ta_tag tag, size_t align, size_t size) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  if (align == 0 || (align & (align - 1)) != 0) {
    _ta_error(TA_EINVAL, "ta_aligned: alignment %zu is not a power of two", align);
    return NULL;
  }
  uint32_t stack = _ta_stack_capture(1);
  return block_new(t, raw_alloc(t, size, align, MALLOCX_ALIGN(align)), size, tag_check(tag), stack);
}

/* ---- free and the quarantine ---------------------------------------------- */

static void report_bad_free(uintptr_t a, uint32_t stack, const ta_block *old) {
  ta_error_info e = { .stack = stack, .addr = a };
  char detail[96] = "";
  if (old) {                                   /* a freed block: double free */
    e.kind = "free.double";
    e.bytes = old->size;
    e.tag = old->tag;
    e.alloc_stack = old->stack;
    e.free_stack = old->free_stack;
  } else {
    ta_block in;
    e.kind = "free.invalid";
    if (_ta_block_find(a, &in)) {
      _ta_snprintf(detail, sizeof detail, "interior pointer at offset %zu of a %zu-byte %s block",
                   (size_t)(a - in.addr), (size_t)in.size, in.state == TA_LIVE ? "live" : "freed");
      e.bytes = in.size;
      e.tag = in.tag;
      e.alloc_stack = in.stack;
      e.free_stack = in.free_stack;
    } else {
      _ta_snprintf(detail, sizeof detail, "address never allocated by the ledger");
    }
  }
  e.detail = detail;
  _ta_finding_error(&e);
}

/* Reports a write into a quarantined block: byte `at` holds `value`. */
static void report_write_after_free(const ta_block *b, int64_t at, unsigned char value) {
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "byte %zu of the freed %zu-byte block was written (0x%x, poison 0x%x)",
               (size_t)at, (size_t)b->size, value, (unsigned)_ta_opt.poison);
  /* The write itself was not seen (stack 0): the report says so, and
   * shows the free and the allocation under their own labels. */
  ta_error_info e = { .kind = "use.after-free", .bytes = b->size, .tag = b->tag,
                      .stack = 0, .alloc_stack = b->stack,
                      .free_stack = b->free_stack, .addr = b->addr, .detail = detail };
  _ta_finding_error(&e);
}

typedef struct { ta_block b; int64_t at; unsigned char value; } evicted_block;

/* How many leading bytes of a freed block of `size` bytes are poisoned
 * and checked: TAGALLOC_POISON_SPAN (256) or the whole block if smaller.
 * A write after free lands in the first bytes of a block far more often
 * than deep inside it (a stale pointer to a struct writes one of its
 * fields; a stale buffer is written from its start), and a span keeps the
 * cost of a free bounded: filling and later re-reading every byte of every
 * freed block was a quarter of a malloc churn's time under the auditor,
 * most of it cache misses on lines the program never touched.
 * TAGALLOC_POISON_SPAN=all checks whole blocks; --guard catches any byte,
 * read or write, at the faulting instruction. */
static inline uint64_t poison_span(uint64_t size) {
  return size < (uint64_t)_ta_opt.poison_span ? size : (uint64_t)_ta_opt.poison_span;
}

/* Offset of the first byte of b's poisoned span that is not poison, or
 * -1.  Every block that leaves the quarantine is checked, so this goes 64
 * bytes at a time with SSE2 (four loads, one branch), then a word at a
 * time, and looks for the exact byte only once something differs. */
static int64_t poison_changed(const ta_block *b, unsigned char *value) {
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_owns(b->addr)) return -1;   /* PROT_NONE, not poisoned */
  const unsigned char *p = (const unsigned char *)b->addr;
  unsigned char poison = (unsigned char)_ta_opt.poison;
  uint64_t size = poison_span(b->size), i = 0;
  const __m128i pv = _mm_set1_epi8((char)poison);
  for (; i + 64 <= size; i += 64) {                /* blocks are 16-byte aligned */
    const __m128i *v = (const __m128i *)(p + i);
    __m128i d = _mm_or_si128(_mm_or_si128(_mm_xor_si128(_mm_load_si128(v), pv),
                                          _mm_xor_si128(_mm_load_si128(v + 1), pv)),
                             _mm_or_si128(_mm_xor_si128(_mm_load_si128(v + 2), pv),
                                          _mm_xor_si128(_mm_load_si128(v + 3), pv)));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) != 0xFFFF) break;
  }
  uint64_t word = 0x0101010101010101ull * poison;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != word) break;
  }
  for (; i < size; i++)
    if (p[i] != poison) { *value = p[i]; return (int64_t)i; }
  return -1;
}

/* The quarantine.  Each thread keeps the records of the blocks it freed in
 * a FIFO ring of its own: no lock to push, read in order (so the blocks
 * that leave next are prefetched well ahead), and out of the live table, so
 * the table holds live blocks only and stays small and warm.  While the
 * thread's quarantine holds more than its share of the budget (the budget
 * over the threads alive), the thread takes its own oldest blocks out:
 * checks their poison and gives them back to jemalloc.  A block bigger than
 * an eighth of the budget now (128 KiB to 8 MiB) skips the quarantine: it
 * would push out much of the rest at once, and filling it with poison costs
 * a write of every page (a freed 1 GiB buffer took a second).
 * A free, hold or check of an address the live table does not know looks
 * through every thread's ring (slow, and only on such error paths).  A
 * thread's ring is drained when the thread exits; at the process's exit,
 * _ta_quarantine_check_all checks the exiting thread's (the other threads
 * may still be running).
 *
 * The ring is one mmap'd array that never moves, so other threads may read
 * it while its owner writes; they verify what they read. */

#define Q_PREFETCH 16

static inline void q_prefetch(const ta_thread *t) {
  if (t->qlen > Q_PREFETCH) {
    const ta_block *e = &t->q[(t->qhead + Q_PREFETCH) & (t->qcap - 1)];
    const char *p = (const char *)e->addr;
    uint64_t n = poison_span(e->size < 4096 ? e->size : 4096);
    for (uint64_t i = 0; i < n; i += 64) __builtin_prefetch(p + i);
  }
}

/* What a quarantined block counts against the budget: its size, or in
 * guard mode what guard.c says for its pages. */
static inline int64_t q_charge(uintptr_t a, uint64_t size) {
  return (int64_t)(TA_UNLIKELY(_ta_guard_on) ? _ta_guard_charge(a, size) : size);
}

/* Takes t's oldest block out of the quarantine. */
static void quarantine_evict(ta_thread *t) {
  ta_block b = t->q[t->qhead];
  t->q[t->qhead].addr = 0;
  t->qhead = (t->qhead + 1) & (t->qcap - 1);
  t->qlen--;
  q_prefetch(t);
  unsigned char value = 0;
  int64_t at = poison_changed(&b, &value);
  pad_damage d;
  bool over = !(b.flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(b.addr) && pad_changed(b.addr, b.size, &d);
  t->qbytes -= q_charge(b.addr, b.size);
  raw_free(t, b.addr);
  if (at >= 0) report_write_after_free(&b, at, value);
  if (TA_UNLIKELY(over)) report_overflow(&b, &d, PAD_AT_QUARANTINE);
}

/* The ring: address space for enough entries for the whole budget in
 * 16-byte blocks (within [64K, 4M] entries), of which the first 4096 are
 * used; it grows in place while the blocks in it weigh less than the
 * thread's share.  (A ring cycling through 4M entries touched all 192 MiB
 * of them, whatever the budget.)  TAGALLOC_QUARANTINE_BLOCKS (16384,
 * rounded down to a power of two) caps the entries: a program that frees
 * few small blocks per step behind a large live heap (LeNet-5: ~30 tensor
 * headers a step, a 64 MiB budget) otherwise fills its quarantine for
 * eleven epochs, and its memory is not flat; capped, it is full within
 * the first. */
#define Q_FIRST 4096u

static bool quarantine_ring(ta_thread *t) {
  uint64_t cap = 1u << 16;
  while (cap < (uint64_t)_ta_opt.quarantine / 16 && cap < (1u << 22)) cap <<= 1;
  if (_ta_opt.quarantine_blocks > 0) {
    uint64_t most = 16;
    while (most * 2 <= (uint64_t)_ta_opt.quarantine_blocks) most <<= 1;
    if (most < cap) cap = most;
  }
  void *q = _ta_mmap(cap * sizeof(ta_block));
  if (q == NULL) return false;
  t->q = q;
  t->qmax = (uint32_t)cap;
  t->qcap = Q_FIRST < cap ? Q_FIRST : (uint32_t)cap;
  t->qhead = t->qlen = 0;
  return true;
}

/* Doubles a full ring in place: the entries that wrapped to the front
 * move to just past the old end, so every entry keeps its position from
 * the head.  Other threads reading the ring verify what they read. */
static void quarantine_grow(ta_thread *t) {
  uint32_t cap = t->qcap;
  memcpy(&t->q[cap], &t->q[0], (size_t)t->qhead * sizeof(ta_block));
  atomic_thread_fence(memory_order_release);
  t->qcap = cap * 2;
}

/* The records of the last TA_RECENT blocks a thread freed outside the
 * quarantine (the leaks and errors modes): their memory went back to
 * jemalloc at once, but a second free of one of them, before the ledger
 * hands its address out again, is still told as free.double with its
 * allocation stack (and in errors mode its free stack).  One 32-byte store
 * a free into 32 KiB that stays in cache; read only on a bad free. */
#define TA_RECENT 1024u

static void recent_push(ta_thread *t, const ta_block *b) {
  if (TA_UNLIKELY(t->recent == NULL)) {
    t->recent = _ta_mmap(TA_RECENT * sizeof(ta_block));
    if (t->recent == NULL) return;
  }
  t->recent[t->rpos] = *b;
  t->rpos = (t->rpos + 1) & (TA_RECENT - 1);
}

/* Does this free go to the quarantine?  full: every one; errors: one in
 * TAGALLOC_QUARANTINE_SAMPLE, counted per thread, so the rest are reused
 * while hot, as the bare program's are; leaks: none.  Guard mode keeps
 * every freed block out of reuse, whatever the mode. */
static inline bool quarantine_this(ta_thread *t) {
  if (TA_LIKELY(_ta_opt.check == TA_CHECK_FULL) || TA_UNLIKELY(_ta_guard_on)) return true;
  if (_ta_opt.check == TA_CHECK_LEAKS) return false;
  if (++t->qcount < (uint32_t)_ta_opt.quarantine_sample) return false;
  t->qcount = 0;
  return true;
}

static int64_t quarantine_share(int64_t budget);

static bool quarantine_push(ta_thread *t, const ta_block *b, int64_t budget) {
  if (t->q == NULL && !quarantine_ring(t)) return false;
  if (t->qlen == t->qcap) {                            /* full: grow, or the oldest leaves */
    if (t->qcap < t->qmax && t->qbytes < quarantine_share(budget)) quarantine_grow(t);
    else quarantine_evict(t);
  }
  t->q[(t->qhead + t->qlen) & (t->qcap - 1)] = *b;
  t->qlen++;
  return true;
}

/* The quarantine's budget follows the live heap: a quarter of the live
 * bytes, at least 1 MiB, at most TAGALLOC_QUARANTINE.  A small quarantine
 * stays in cache, where filling and checking the poison is cheap; a 64 MiB
 * one behind a program whose heap is 2 MiB made every check a cache miss
 * (80% of the cost of a malloc churn) and multiplied its RSS by 50. */
#define Q_FLOOR ((int64_t)1 << 20)

static inline int64_t quarantine_budget(void) {
  int64_t live = atomic_load_explicit(&live_bytes[0], memory_order_relaxed) / 4;
  int64_t b = live > Q_FLOOR ? live : Q_FLOOR;
  return b < _ta_opt.quarantine ? b : _ta_opt.quarantine;
}

/* Each thread's share of a budget: the budget over the live threads. */
static int64_t quarantine_share(int64_t budget) {
  int n = atomic_load_explicit(&_ta_threads_live, memory_order_relaxed);
  return budget / (n > 1 ? n : 1);
}

static void quarantine_trim(ta_thread *t, int64_t budget) {
  int64_t share = quarantine_share(budget);
  for (int k = 0; k < 8 && t->qlen > 0 && t->qbytes > share; k++) quarantine_evict(t);
}

void _ta_quarantine_forget(ta_thread *t) {
  if (t->q) _ta_munmap(t->q, (size_t)t->qmax * sizeof(ta_block));
  t->q = NULL;
  t->qcap = t->qmax = t->qhead = t->qlen = 0;
  if (t->recent) _ta_munmap(t->recent, TA_RECENT * sizeof(ta_block));
  t->recent = NULL;
  t->rpos = 0;
}

void _ta_quarantine_drain(ta_thread *t) {
  while (t->qlen > 0) quarantine_evict(t);
  _ta_quarantine_forget(t);
}

typedef struct { uintptr_t p; bool interior; ta_block *out; bool found; } q_search;

/* The newest record of p in t's recent frees. */
static void recent_search(ta_thread *t, q_search *qs) {
  ta_block *r = t->recent;
  uint32_t pos = t->rpos;
  if (r == NULL) return;
  for (uint32_t k = 1; k <= TA_RECENT; k++) {
    const ta_block *e = &r[(pos - k) & (TA_RECENT - 1)];
    uintptr_t a = e->addr;
    if (a == 0) continue;
    bool hit = qs->interior ? (qs->p >= a && qs->p < a + (e->size ? e->size : 1)) : qs->p == a;
    if (!hit) continue;
    *qs->out = *e;
    if (qs->out->addr != a) continue;            /* overwritten while we read */
    qs->out->state = TA_FREED;
    qs->found = true;
    return;
  }
}

static void q_search_thread(ta_thread *t, void *arg) {
  q_search *qs = arg;
  if (!qs->found) recent_search(t, qs);
  ta_block *q = t->q;
  uint32_t cap = t->qcap, head = t->qhead, len = t->qlen;   /* the owner may be moving them */
  if (q == NULL || qs->found) return;
  for (uint32_t k = 0; k < len && k < cap; k++) {
    const ta_block *e = &q[(head + k) & (cap - 1)];
    uintptr_t a = e->addr;
    if (a == 0) continue;
    uint64_t size = e->size;
    bool hit = qs->interior ? (qs->p >= a && qs->p < a + (size ? size : 1)) : qs->p == a;
    if (!hit) continue;
    *qs->out = *e;
    if (qs->out->addr != a) continue;            /* overwritten while we read */
    qs->out->state = TA_FREED;
    qs->found = true;
    return;
  }
}

/* Is p a quarantined block (or inside one)? */
static bool quarantine_find(uintptr_t p, bool interior, ta_block *out) {
  q_search qs = { p, interior, out, false };
  _ta_thread_each(q_search_thread, &qs);
  return qs.found;
}

/* Frees the block at a; `stack` is where.  Returns false for a bad free,
 * which it reports, unless `quiet`: then it changes nothing and the caller,
 * which took no stack (leaks mode), takes one and calls again.
 * Two solo sections (the table, the counts): the quarantine between them
 * may report, and reporting takes locks. */
static bool block_free(ta_thread *t, uintptr_t a, uint32_t stack, bool quiet) {
  shard *s = shard_of(a);
  bool solo = _ta_solo_enter(t);
  shard_lock_if(s, solo);
  ta_block *b = slot_find(s, a);
  if (TA_UNLIKELY(b == NULL || (b->flags & TA_F_ARENA))) {
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    if (quiet) return false;
    ta_block old;
    report_bad_free(a, stack, b == NULL && quarantine_find(a, false, &old) ? &old : NULL);
    return false;
  }
  uint8_t flags = b->flags;
  uint64_t size = b->size;
  ta_tag tag = b->tag;
  if (TA_UNLIKELY(flags & (TA_F_REF | TA_F_HOLD))) {
    /* Holds and refcounts take their own locks: leave ours first. */
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    if (flags & TA_F_REF) _ta_ref_on_free(a, stack);
    if (flags & TA_F_HOLD) _ta_hold_on_free(a, size, stack);
    solo = _ta_solo_enter(t);
    shard_lock_if(s, solo);
    b = slot_find(s, a);
    if (b == NULL) {                          /* freed meanwhile by another thread */
      shard_unlock_if(s, solo);
      _ta_solo_leave(t, solo);
      report_bad_free(a, stack, NULL);
      return false;
    }
  }
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, solo) : 0;
  ta_block freed = *b;
  slot_remove(s, b);
  shard_unlock_if(s, solo);
  _ta_solo_leave(t, solo);
  int64_t budget = quarantine_this(t) ? quarantine_budget() : 0;   /* 0: no quarantine */
  if (TA_UNLIKELY((int64_t)size > budget / 8) && !_ta_guard_on) budget = 0;   /* too big to keep */
  /* errors mode: a sample of the frees in a budget as much smaller, so
   * that a sampled block stays as many bytes of frees as in full mode,
   * while the blocks held stay few enough to sit in cache and pin few of
   * jemalloc's slabs (1 MiB held took the churn's reuse away: 0.55x of
   * its CPU time at 1 in 16; 64 KiB 0.1x) */
  if (_ta_opt.check == TA_CHECK_ERRORS && !_ta_guard_on) budget /= _ta_opt.quarantine_sample;
  freed.state = TA_FREED;
  freed.free_stack = stack;
  pad_damage d;
  /* only the blocks block_new padded: no flag but REF and HOLD */
  if (TA_UNLIKELY(!(flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(a) && pad_changed(a, size, &d))) {
    report_overflow(&freed, &d, PAD_AT_FREE);
    pad_fill(a, size);                           /* reported once: later checks see new writes only */
  }
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_retire(&freed)) {}   /* pages made PROT_NONE */
  else if (budget > 0) memset((void *)a, (int)_ta_opt.poison, poison_span(size));
  if (budget > 0 && quarantine_push(t, &freed, budget)) {
    t->qbytes += q_charge(a, size);
    quarantine_trim(t, budget);
  } else {
    if (_ta_opt.check != TA_CHECK_FULL) recent_push(t, &freed);
    raw_free(t, a);
  }
  solo = _ta_solo_enter(t);
  count_free(t, tag, size, solo);
  _ta_solo_leave(t, solo);
  if (seq) _ta_trace_free(t, a, stack, seq);   /* seq taken before the memory could be reused */
  return true;
}

TA_NOINLINE void ta_free(void *p) {
  if (p == NULL) return;
  _ta_ensure();
  ta_thread *t = _ta_thread();
  _ta_block_prefetch(p);
  if (TA_UNLIKELY(_ta_opt.check == TA_CHECK_LEAKS)) {   /* no free stack but a bad free's */
    if (block_free(t, (uintptr_t)p, 0, true)) return;
  }
  uint32_t stack = _ta_stack_capture(1);
  block_free(t, (uintptr_t)p, stack, false);
}

static inline __attribute__((always_inline))
void *realloc_impl(ta_thread *t, ta_tag tag, void *p, size_t size, uint32_t stack) {
  if (p == NULL) return block_new(t, raw_alloc(t, size, 16, 0), size, tag_check(tag), stack);
  uintptr_t a = (uintptr_t)p;
  ta_block old;
  bool known = _ta_block_get(a, &old);
  if (!known || old.state != TA_LIVE || (old.flags & TA_F_ARENA)) {
    report_bad_free(a, stack, known && old.state == TA_FREED ? &old : NULL);
    return NULL;
  }
  if (size == 0) {                    /* as glibc: free, return NULL */
    block_free(t, a, stack, false);
    return NULL;
  }
  /* Always move, so that a stale pointer to the old block is caught. */
  void *n = block_new(t, raw_alloc(t, size, 16, 0), size, old.tag, stack);
  if (n == NULL) return NULL;
  memcpy(n, p, old.size < size ? old.size : size);
  if (_ta_tracing)
    _ta_trace_realloc(t, a, (uintptr_t)n, size, stack, _ta_seq_now());
  block_free(t, a, stack, false);
  return n;
}

TA_NOINLINE void *ta_realloc_tag(ta_tag tag, void *p, size_t size) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t stack = _ta_stack_capture(1);
  return realloc_impl(t, tag, p, size, stack);
}

TA_NOINLINE void *ta_realloc(void *p, size_t size) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t stack = _ta_stack_capture(1);
  return realloc_impl(t, tag_realloc, p, size, stack);
}

/* ---- entry points for the LD_PRELOAD shim (tools/preload.c) ---------------
 * The shim captures the stack itself (so that frame 0 is the program's) and
 * calls these; they never capture. */

void *_ta_alloc_raw(size_t size, size_t align, bool zero) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  int flags = (align > 16 ? (int)MALLOCX_ALIGN(align) : 0) | (zero ? MALLOCX_ZERO : 0);
  void *p = raw_alloc(t, size, align, flags);
  if (p) _ta_block_prefetch(p);
  return p;
}

void *_ta_alloc_record(void *raw, ta_tag tag, size_t size, bool zero, uint32_t stack) {
  void *p = block_new(_ta_thread(), raw, size, tag_check(tag), stack);
  if (p && zero && _ta_opt.fill >= 0) memset(p, 0, size);
  return p;
}

void *_ta_alloc_at(ta_tag tag, size_t size, size_t align, bool zero, uint32_t stack) {
  return _ta_alloc_record(_ta_alloc_raw(size, align, zero), tag, size, zero, stack);
}

bool _ta_free_at(void *p, uint32_t stack) {
  if (p == NULL) return true;
  _ta_ensure();
  return block_free(_ta_thread(), (uintptr_t)p, stack, false);
}

bool _ta_free_quiet(void *p) {
  if (p == NULL) return true;
  _ta_ensure();
  return block_free(_ta_thread(), (uintptr_t)p, 0, true);
}

void *_ta_realloc_at(ta_tag tag, void *p, size_t size, uint32_t stack) {
  _ta_ensure();
  return realloc_impl(_ta_thread(), tag, p, size, stack);
}

size_t ta_usable_size(const void *p) {
  ta_block b;
  if (p == NULL || !_ta_block_get((uintptr_t)p, &b) || b.state != TA_LIVE) return 0;
  if (b.flags & TA_F_ARENA) return b.size;
  /* the size asked for, not the class's: the pad past it is the overflow check's */
  return b.size;
}

size_t ta_block_size(const void *p) {
  ta_block b;
  if (p == NULL || !_ta_block_get((uintptr_t)p, &b) || b.state != TA_LIVE) return 0;
  return b.size;
}

ta_tag ta_block_tag(const void *p) {
  ta_block b;
  if (p == NULL || !_ta_block_get((uintptr_t)p, &b) || b.state != TA_LIVE) return TA_ANY;
  return b.tag;
}

/* ---- the table for the rest of the ledger ----------------------------------- */

static bool live_get(uintptr_t a, ta_block *out) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_block *b = slot_find(s, a);
  if (b) *out = *b;
  shard_unlock(s);
  return b != NULL;
}

bool _ta_block_get(uintptr_t a, ta_block *out) {
  return live_get(a, out) || quarantine_find(a, false, out);
}

bool _ta_block_find(uintptr_t p, ta_block *out) {
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &shards[i];
    bool found = false;
    shard_lock(s);
    for (uint32_t j = 0; s->slots && j <= s->mask && !found; j++) {
      ta_block *b = &s->slots[j];
      if (b->addr == 0 || p < b->addr || p >= b->addr + (b->size ? b->size : 1)) continue;
      *out = *b;
      found = true;
    }
    shard_unlock(s);
    if (found) return true;                    /* a live block wins over a quarantined one */
  }
  return quarantine_find(p, true, out);
}

void _ta_block_flag(uintptr_t a, uint8_t flags) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_block *b = slot_find(s, a);
  if (b && b->state == TA_LIVE) b->flags |= flags;
  shard_unlock(s);
}

void _ta_block_add_arena(ta_thread *t, uintptr_t a, size_t size, ta_tag tag, uint32_t stack) {
  uint64_t seq = _ta_next_seq(t, false);
  shard *s = shard_of(a);
  shard_lock(s);
  ta_block *b = slot_find(s, a);
  if (b && b->state == TA_FREED) {               /* arena memory never is; be safe */
    slot_remove(s, b);
    b = NULL;
  }
  if (b == NULL) b = slot_insert(s, a);
  if (b) {
    *b = (ta_block){ .addr = a, .size = size, .tag = tag, .seq = seq, .state = TA_LIVE, .flags = TA_F_ARENA,
                     .stack = stack };
  }
  shard_unlock(s);
  if (b == NULL) return;
  count_alloc(t, tag, size, a, seq, false);
  if (_ta_tracing) _ta_trace_alloc(t, a, size, tag, stack, seq, 1);
}

void _ta_block_drop_arena(ta_thread *t, uintptr_t a, uint32_t stack) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_block *b = slot_find(s, a);
  if (b == NULL || !(b->flags & TA_F_ARENA)) { shard_unlock(s); return; }
  ta_tag tag = b->tag;
  uint64_t size = b->size;
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, false) : 0;
  slot_remove(s, b);
  shard_unlock(s);
  count_free(t, tag, size, false);
  if (seq) _ta_trace_free(t, a, stack, seq);
}

void _ta_table_shape(uint64_t *records, uint64_t *slots, uint64_t *displaced) {
  uint64_t r = 0, n = 0, d = 0;
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &shards[i];
    shard_lock(s);
    for (uint32_t j = 0; s->slots && j <= s->mask; j++) {
      if (s->slots[j].addr == 0) continue;
      r++;
      d += (j - slot_home(s, s->slots[j].addr)) & s->mask;
    }
    if (s->slots) n += (uint64_t)s->mask + 1;
    shard_unlock(s);
  }
  *records = r;
  *slots = n;
  *displaced = d;
}

void _ta_block_lock_all(void) {
  for (int i = 0; i < NSHARDS; i++) shard_lock(&shards[i]);
}

void _ta_block_unlock_all(void) {
  for (int i = NSHARDS - 1; i >= 0; i--) shard_unlock(&shards[i]);
}

void _ta_block_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg) {
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &shards[i];
    if (!locked) shard_lock(s);
    for (uint32_t j = 0; s->slots && j <= s->mask; j++)
      if (s->slots[j].addr && s->slots[j].state == TA_LIVE) fn(&s->slots[j], arg);
    if (!locked) shard_unlock(s);
  }
}


typedef struct { evicted_block bad[16]; int n; ta_block over[16]; pad_damage d[16]; int nover; } q_check;

static void q_check_ring(const ta_thread *t, q_check *c) {
  for (uint32_t k = 0; k < t->qlen && c->n < 16; k++) {
    evicted_block *e = &c->bad[c->n];
    e->b = t->q[(t->qhead + k) & (t->qcap - 1)];
    e->at = poison_changed(&e->b, &e->value);
    if (e->at >= 0) c->n++;
    if (c->nover < 16 && !(e->b.flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(e->b.addr) &&
        pad_changed(e->b.addr, e->b.size, &c->d[c->nover]))
      c->over[c->nover++] = e->b;
  }
}

/* At exit: the pads of the live blocks (under each shard's lock, so that no
 * block is freed while it is read); reported after, without the locks. */
static void pad_check_live(const ta_block *b, void *arg) {
  q_check *c = arg;
  /* only the blocks block_new padded (arena blocks, or any other kind a
   * flag marks, have no pad, and may not even be host memory) */
  if (c->nover >= 16 || (b->flags & ~(TA_F_REF | TA_F_HOLD)) || !pad_owned(b->addr)) return;
  if (pad_changed(b->addr, b->size, &c->d[c->nover])) c->over[c->nover++] = *b;
}

/* Only the calling thread's ring: another thread that is still running
 * (exit() or an exec while other threads allocate) pushes, evicts and grows
 * its ring meanwhile, and reading it here read torn entries and blocks it
 * had just given back (a program that exits with its threads churning
 * crashed in 7 runs of 10).  A thread that ends checks its own ring
 * (_ta_quarantine_drain). */
void _ta_quarantine_check_all(void) {
  q_check c = { .n = 0 };
  if (_ta_self != NULL) q_check_ring(_ta_self, &c);
  for (int k = 0; k < c.n; k++) report_write_after_free(&c.bad[k].b, c.bad[k].at, c.bad[k].value);
  for (int k = 0; k < c.nover; k++) report_overflow(&c.over[k], &c.d[k], PAD_AT_EXIT);
  c.nover = 0;
  _ta_block_each(false, pad_check_live, &c);
  for (int k = 0; k < c.nover; k++) report_overflow(&c.over[k], &c.d[k], PAD_AT_EXIT);
}

/* ---- marks and counts ---------------------------------------------------------- */

/* Marks are kept until ta_mark_free: marks[0 .. nmarks) in the order of
 * their ids (1, 2, ...; found by binary search).  A freed mark hands the
 * peak of its interval to the live mark before it (or to dropped_peak when
 * there is none), so that ta_since of an older mark still sees every
 * interval's peak, and leaves the array - but the last one, whose interval
 * is still open.  So a loop that takes a mark, checks and frees it each
 * iteration keeps one or two records, not one per iteration. */
typedef struct {
  ta_mark id;
  uint64_t seq;
  uint32_t ntags;
  bool freed;
  ta_tag_counts_plain *counts;  /* at the mark, per tag (NULL once freed) */
  uint64_t *peak_after;         /* peak per tag between this mark and the next */
} mark_rec;

static pthread_mutex_t mark_lock = PTHREAD_MUTEX_INITIALIZER;
static mark_rec *marks;
static size_t nmarks, cap_marks;
static ta_mark last_mark;
static uint64_t dropped_peak[TA_MAX_TAGS];   /* the peaks of the intervals of marks gone */

/* The live mark m, or NULL; mark_lock held. */
static mark_rec *mark_get(ta_mark m) {
  size_t lo = 0, hi = nmarks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (marks[mid].id < m) lo = mid + 1;
    else hi = mid;
  }
  return lo < nmarks && marks[lo].id == m && !marks[lo].freed ? &marks[lo] : NULL;
}

/* Folds the interval peaks of freed marks into the live mark before them
 * (or dropped_peak) and drops them; the last mark's interval is still
 * open, so it stays.  mark_lock held. */
static void marks_compact(void) {
  for (size_t i = nmarks; i-- > 0;) {
    mark_rec *r = &marks[i];
    if (!r->freed || r->peak_after == NULL || i + 1 == nmarks) continue;
    uint64_t *into = dropped_peak;
    uint32_t n = TA_MAX_TAGS;
    for (size_t j = i; j-- > 0;)
      if (!marks[j].freed) { into = marks[j].peak_after; n = marks[j].ntags; break; }
    for (uint32_t k = 0; k < r->ntags; k++) {
      uint64_t *d = k < n ? &into[k] : &dropped_peak[k];
      if (r->peak_after[k] > *d) *d = r->peak_after[k];
    }
    _ta_meta_free(r->peak_after);
    r->peak_after = NULL;
  }
  size_t n = 0;
  for (size_t i = 0; i < nmarks; i++)
    if (!marks[i].freed || i + 1 == nmarks) marks[n++] = marks[i];
  nmarks = n;
}

ta_mark ta_mark_now(void) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t ntags = atomic_load(&tag_count);
  ta_tag_counts_plain *counts = _ta_meta_alloc(ntags * sizeof *counts);
  uint64_t *peak_after = _ta_meta_calloc(ntags, sizeof *peak_after);
  if (counts == NULL || peak_after == NULL) {
    _ta_error(TA_ENOMEM, "out of memory for a mark");
    _ta_meta_free(counts);
    _ta_meta_free(peak_after);
    return 0;
  }
  pthread_mutex_lock(&mark_lock);
  if (nmarks == cap_marks) {
    size_t cap = cap_marks ? cap_marks * 2 : 64;
    mark_rec *m = _ta_meta_realloc(marks, cap * sizeof *m);
    if (m == NULL) {
      pthread_mutex_unlock(&mark_lock);
      _ta_meta_free(counts);
      _ta_meta_free(peak_after);
      return 0;
    }
    marks = m;
    cap_marks = cap;
  }
  atomic_fetch_add(&_ta_seq_epoch, 1);     /* threads take fresh sequence blocks */
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, false) : atomic_fetch_add(&_ta_seq, 1);
  _ta_thread_sum(counts, ntags);
  /* Close the interval of the previous mark: its peak, and restart. */
  mark_rec *prev = nmarks ? &marks[nmarks - 1] : NULL;
  for (uint32_t i = 0; i < ntags; i++) {
    uint64_t live = counts[i].alloc_bytes - counts[i].free_bytes;
    uint64_t p = atomic_exchange(&peak_cur[i], live);
    if (prev && i < prev->ntags) prev->peak_after[i] = p > live ? p : live;
  }
  ta_mark id = ++last_mark;
  marks[nmarks++] = (mark_rec){ id, seq, ntags, false, counts, peak_after };
  if (prev && prev->freed) marks_compact();    /* its interval just closed */
  pthread_mutex_unlock(&mark_lock);
  if (_ta_tracing) _ta_trace_mark(t, id, seq);
  return id;
}

typedef struct {
  uint64_t seq;
  ta_tag tag;
  uint64_t blocks, bytes;
  void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg);
  void *arg;
} since_walk;

static void since_visit(const ta_block *b, void *arg) {
  since_walk *w = arg;
  if (b->seq < w->seq || (w->tag && b->tag != w->tag)) return;
  w->blocks++;
  w->bytes += b->size;
  if (w->fn) w->fn((const void *)b->addr, b->size, b->tag, b->stack, w->arg);
}

typedef struct { since_walk *w; bool complete; } ring_walk;

/* Does t's ring of recent births reach back to seq? */
static void ring_check(ta_thread *t, void *arg) {
  ring_walk *rw = arg;
  uint64_t head = atomic_load_explicit(&t->ring_head, memory_order_acquire);
  if (head <= TA_RING) return;                       /* every birth is there */
  uint64_t oldest = atomic_load_explicit(&t->ring[head % TA_RING].seq, memory_order_relaxed);
  if (oldest >= rw->w->seq) rw->complete = false;    /* births before it are gone */
}

/* Walks a thread's recent births back to the mark. */
static void ring_visit(ta_thread *t, void *arg) {
  ring_walk *rw = arg;
  uint64_t head = atomic_load_explicit(&t->ring_head, memory_order_acquire);
  for (uint64_t k = head; k > 0 && head - k < TA_RING; k--) {
    ta_birth *r = &t->ring[(k - 1) % TA_RING];
    uint64_t seq = atomic_load_explicit(&r->seq, memory_order_relaxed);
    if (seq < rw->w->seq) return;
    ta_block b;
    uintptr_t a = atomic_load_explicit(&r->addr, memory_order_relaxed);
    if (live_get(a, &b) && b.seq == seq) since_visit(&b, rw->w);   /* registry locked: live table only */
  }
}

static bool retired_births_since(uint64_t seq);

static void live_since(uint64_t seq, ta_tag tag, since_walk *w) {
  w->seq = seq;
  w->tag = tag;
  w->blocks = w->bytes = 0;
  /* Fast: the births rings of live threads, when they reach back to the
   * mark and no thread that allocated since has exited. */
  if (seq > 1 && !retired_births_since(seq)) {
    ring_walk rw = { w, true };
    _ta_thread_each(ring_check, &rw);
    if (rw.complete) {
      _ta_thread_each(ring_visit, &rw);
      return;
    }
  }
  _ta_block_each(false, since_visit, w);
}

static _Atomic uint64_t last_retired_birth;   /* newest birth seq of an exited thread */
static bool retired_births_since(uint64_t seq) {
  return atomic_load(&last_retired_birth) >= seq;
}

void _ta_thread_retire_births(ta_thread *t) {
  uint64_t head = atomic_load(&t->ring_head);
  if (head == 0) return;
  uint64_t seq = atomic_load(&t->ring[(head - 1) % TA_RING].seq);
  uint64_t cur = atomic_load(&last_retired_birth);
  while (seq > cur && !atomic_compare_exchange_weak(&last_retired_birth, &cur, seq)) {}
}

ta_counts ta_since(ta_mark m, ta_tag tag) {
  _ta_ensure();
  ta_counts c = { 0 };
  uint32_t ntags = atomic_load(&tag_count);
  if (tag >= ntags) return c;
  ta_tag_counts_plain now[TA_MAX_TAGS];
  _ta_thread_sum(now, ntags);
  uint64_t seq = 0;
  uint64_t peak = atomic_load(&peak_cur[tag]);
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = m ? mark_get(m) : NULL;
  if (m && r == NULL) {
    pthread_mutex_unlock(&mark_lock);
    _ta_error(TA_EINVAL, "ta_since: %lu is not a mark (or it was freed)", (unsigned long)m);
    return c;
  }
  if (m == 0) {
    peak = atomic_load(&peak_run);
    if (tag) {     /* no whole-run peak per tag: the intervals since the first mark */
      if (dropped_peak[tag] > peak) peak = dropped_peak[tag];
      for (size_t i = 0; i < nmarks; i++)
        if (marks[i].peak_after && tag < marks[i].ntags && marks[i].peak_after[tag] > peak)
          peak = marks[i].peak_after[tag];
    }
  } else {
    seq = r->seq;
    if (tag < r->ntags) {
      c.allocs = now[tag].allocs - r->counts[tag].allocs;
      c.frees = now[tag].frees - r->counts[tag].frees;
    } else {
      c.allocs = now[tag].allocs;
      c.frees = now[tag].frees;
    }
    for (size_t i = (size_t)(r - marks); i + 1 < nmarks; i++)
      if (marks[i].peak_after && tag < marks[i].ntags && marks[i].peak_after[tag] > peak)
        peak = marks[i].peak_after[tag];
  }
  pthread_mutex_unlock(&mark_lock);
  if (m == 0) {
    c.allocs = now[tag].allocs;
    c.frees = now[tag].frees;
  }
  since_walk w = { 0 };
  live_since(seq, tag, &w);
  _ta_device_since(seq, tag, &w.blocks, &w.bytes, NULL, NULL);   /* device blocks count too */
  c.live_blocks = w.blocks;
  c.live_bytes = w.bytes;
  c.peak_bytes = peak;
  return c;
}

void ta_mark_free(ta_mark m) {
  if (m == 0) return;
  _ta_ensure();
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = mark_get(m);
  if (r == NULL) {
    pthread_mutex_unlock(&mark_lock);
    _ta_error(TA_EINVAL, "ta_mark_free: %lu is not a mark (or it was freed)", (unsigned long)m);
    return;
  }
  r->freed = true;
  _ta_meta_free(r->counts);
  r->counts = NULL;
  marks_compact();
  pthread_mutex_unlock(&mark_lock);
}

size_t _ta_marks_kept(void) {
  pthread_mutex_lock(&mark_lock);
  size_t n = nmarks;
  pthread_mutex_unlock(&mark_lock);
  return n;
}

void ta_live_since(ta_mark m, ta_tag tag,
                   void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg),
                   void *arg) {
  _ta_ensure();
  uint64_t seq = 0;
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = mark_get(m);
  if (r) seq = r->seq;
  pthread_mutex_unlock(&mark_lock);
  since_walk w = { .fn = fn, .arg = arg };
  live_since(seq, tag, &w);
  _ta_device_since(seq, tag, &w.blocks, &w.bytes, fn, arg);
}

static ta_stack_writer_fn *stack_writer;

typedef struct { size_t max, n; } print_state;

static void print_one(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  print_state *ps = arg;
  if (ps->n++ >= ps->max) return;
  char line[256];
  int len = _ta_snprintf(line, sizeof line, "  live: %zu bytes at %p [tag %s] allocated from:\n",
                         size, p, ta_tag_name(tag));
  _ta_write_all(2, line, (size_t)len);
  if (stack_writer && stack) {   /* symbolized, as the exit report writes them */
    stack_writer(2, stack, 0);
    return;
  }
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(stack, pcs, TA_MAX_DEPTH);
  for (size_t i = 0; i < n; i++) {
    len = _ta_snprintf(line, sizeof line, "    #%zu 0x%lx\n", i, (unsigned long)pcs[i]);
    _ta_write_all(2, line, (size_t)len);
  }
}

size_t ta_print_live_since(ta_mark m, ta_tag tag, size_t max_blocks) {
  print_state ps = { max_blocks, 0 };
  ta_live_since(m, tag, print_one, &ps);
  return ps.n;
}

void ta__assert_fail(const char *file, int line, const char *what, uint64_t got, uint64_t want,
                     ta_mark m, ta_tag tag) {
  char buf[512];
  int len = _ta_snprintf(buf, sizeof buf, "%s:%d: tagalloc assertion failed: %s [tag %s]: got %lu, expected %lu\n",
                         file, line, what, ta_tag_name(tag), (unsigned long)got, (unsigned long)want);
  _ta_write_all(2, buf, (size_t)len);
  if (m) ta_print_live_since(m, tag, 16);
  abort();
}

/* ---- summary for reports ------------------------------------------------------- */

void _ta_summary_counts(ta_summary *s) {
  ta_tag_counts_plain all[1];
  _ta_thread_sum(all, 1);
  uint64_t dev_allocs, dev_frees;       /* device blocks count in the tags' rows: not here */
  _ta_device_summary(&dev_allocs, &dev_frees);
  s->allocs = all[0].allocs - dev_allocs;
  s->frees = all[0].frees - dev_frees;
  s->live_bytes = all[0].alloc_bytes - all[0].free_bytes;
  s->peak_bytes = atomic_load(&peak_run);
}

/* ---- fork: no lock may be held across it ------------------------------------- */

/* Every lock of the ledger, in the order the code nests them, so that no
 * thread is inside the ledger when fork() copies the process. */
static void fork_phase(int phase) {
  if (phase == TA_FORK_PREPARE) {
    _ta_unwind_fork(phase);                /* first: libdw's lock comes before the ledger's */
    _ta_scan_fork(phase);
    pthread_mutex_lock(&mark_lock);
    pthread_mutex_lock(&tag_lock);
    _ta_trace_fork(phase);
    _ta_ref_fork(phase);
    _ta_hold_fork(phase);
    _ta_thread_fork(phase);
    _ta_block_lock_all();
    _ta_device_fork(phase);
    _ta_findings_fork(phase);
    _ta_extents_fork(phase);
    _ta_depot_fork(phase);
    return;
  }
  _ta_depot_fork(phase);
  _ta_extents_fork(phase);
  _ta_findings_fork(phase);
  _ta_device_fork(phase);
  _ta_block_unlock_all();
  _ta_thread_fork(phase);
  _ta_hold_fork(phase);
  _ta_ref_fork(phase);
  _ta_trace_fork(phase);
  pthread_mutex_unlock(&tag_lock);
  pthread_mutex_unlock(&mark_lock);
  _ta_scan_fork(phase);
  _ta_unwind_fork(phase);
}

static void fork_prepare(void) { fork_phase(TA_FORK_PREPARE); }
static void fork_parent(void) { fork_phase(TA_FORK_PARENT); }
static void fork_child(void) { fork_phase(TA_FORK_CHILD); }

static void init_tags(void) {
  tag_realloc = ta_tag_get("realloc");
}

/* ---- init and exit ---------------------------------------------------------------- */

static void ledger_exit(void);

/* ---- the sequence's two sources (internal.h) --------------------------------------- */

void _ta_seq_raise(uint64_t v) {
  uint64_t c = atomic_load(&_ta_seq);
  while (c < v && !atomic_compare_exchange_weak(&_ta_seq, &c, v)) {}
}

/* Solo mode has ended (the revoker waited for the solo thread to leave its
 * section): TSC numbers from now on must come after every count given.
 * (The solo thread may still take a count or two outside a section, if it
 * read _ta_solo just before the revoker cleared it: CLOCK_LEAD covers them.) */
#define CLOCK_LEAD 64
void _ta_seq_clock_sync(void) {
  if (!_ta_seq_clock) return;
  uint64_t c = atomic_load(&_ta_seq) + CLOCK_LEAD, k = _ta_clock();
  if (k <= c) atomic_fetch_sub(&_ta_seq_clock_base, c - k + 1);
}

/* Solo mode begins (the registry is locked, no thread is solo yet): counts
 * from now on must come after every TSC number given. */
void _ta_seq_counter_sync(void) {
  if (_ta_seq_clock) _ta_seq_raise(_ta_clock() + 1);
}

/* The kernel keeps time with the TSC only when it is invariant and agrees
 * across CPUs (it falls back to another clocksource when a check fails). */
static bool tsc_is_clock(void) {
#if !defined(__x86_64__)
  return false;
#else
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
  if (a < 0x80000007u) return false;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000007u), "c"(0));
  if (!(d & (1u << 8))) return false;             /* invariant TSC */
  int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[16];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n == 4 && memcmp(buf, "tsc\n", 4) == 0;
#endif
}

static void seq_clock_init(void) {
  if (!_ta_opt.clock || !tsc_is_clock()) return;
  atomic_store(&_ta_seq_clock_base, _ta_tsc() - atomic_load(&_ta_seq) - CLOCK_LEAD);
  _ta_seq_clock = true;
}

void _ta_init(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static bool running;
  pthread_mutex_lock(&lock);
  if (!atomic_load(&_ta_ready) && !running) {
    running = true;
    _ta_options_init();
    seq_clock_init();
    _ta_guard_init();                    /* guard mode: its regions and fault handler */
    pad_check_classes();                 /* the overflow pad: the size classes as jemalloc makes them */
    atomic_store(&_ta_ready, 1);         /* what follows may call the ledger */
    init_tags();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    _ta_trace_open();
  }
  pthread_mutex_unlock(&lock);
}

/* Options are read at the first ledger call (a test may set them in main);
 * the exit handler is registered here, as early as can be, so that it runs
 * after every handler the program registers later (C++ destructors, ...). */
__attribute__((constructor(101))) static void ledger_ctor(void) { atexit(ledger_exit); }

static ta_reporter_fn *reporter;
void ta_reporter_set(ta_reporter_fn *fn) { reporter = fn; }
void ta_stack_writer_set(ta_stack_writer_fn *fn) { stack_writer = fn; }

void ta_report_now(void) {
  if (!reporter) return;
  ta_thread *t = _ta_thread();          /* the symbolizer's allocations are the ledger's */
  t->guard++;
  ta_thread *host = _ta_host_enter();
  reporter(2);
  _ta_host_leave(host);
  t->guard--;
}

static atomic_int exit_done;
void (*_ta_exit_hook)(void);
void (*_ta_exit_before)(void);
uintptr_t   _ta_exit_sp;
const void *_ta_exit_regs;
size_t      _ta_exit_regs_size;

void _ta_exit_now(bool again) {
  if (!atomic_load(&_ta_ready)) return;     /* the ledger was never used */
  if (atomic_exchange(&exit_done, 1) && !again) return;
  _ta_device_exit();                        /* ta_atexit functions, then gpu.leak */
  if (_ta_exit_before) _ta_exit_before();   /* the preload: the runtime's blocks go */
  ta_thread *t = _ta_thread();
  t->guard++;
  ta_thread *host = _ta_host_enter();     /* a copy of the ledger under the preload */
  _ta_quarantine_check_all();
  _ta_hold_exit();
  if (_ta_opt.scan_at_exit) {
    /* The roots: a fatal signal's (set by the preload), or where the
     * program called exit, _exit or exec (scan.c); the caller's frame when
     * neither is known (ta_scan's roots). */
    bool here = false;
    if (!_ta_exit_sp) {
      _ta_stop_init();
      here = _ta_stop_find(NULL);
    }
    if (_ta_exit_sp)
      _ta_scan_impl(_ta_exit_sp, _ta_exit_regs, _ta_exit_regs_size, true);
    else
      _ta_scan_exit();
    if (here) _ta_exit_sp = 0;          /* an exec that fails goes on */
  }
  _ta_trace_close();
  if (_ta_opt.report && reporter && !_ta_host_quiet()) reporter(2);
  if (_ta_exit_hook) _ta_exit_hook();       /* the preload's per-process JSON */
  _ta_host_leave(host);
  t->guard--;
}

static void ledger_exit(void) { _ta_exit_now(false); }

/* ---- pointer checks ---------------------------------------------------------- */

TA_NOINLINE int ta_check(const void *ptr) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  uintptr_t p = (uintptr_t)ptr;
  ta_block b;
  uint64_t gen;
  bool live = false;
  ta_tag atag;
  uint32_t reset_stack = 0;
  bool found = _ta_block_get(p, &b);
  if (!found && _ta_arena_lookup(p, &gen, &live, &atag, &reset_stack)) {
    if (live) return 1;
    uintptr_t daddr = 0;
    uint64_t dsize = 0;
    uint32_t dstack = 0;
    _ta_arena_dead_block(p, &daddr, &dsize, &dstack);
    ta_error_info e = { .kind = "arena.after-reset", .bytes = dsize, .tag = atag, .stack = stack,
                        .alloc_stack = dstack, .free_stack = reset_stack, .addr = p,
                        .detail = "a pointer into arena memory reset since" };
    _ta_finding_error(&e);
    return 0;
  }
  if (!found) found = _ta_block_find(p, &b);
  if (!found) return 0;                      /* not the ledger's memory */
  if (b.state == TA_LIVE) return 1;
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "a pointer at offset %zu of a freed %zu-byte block",
               (size_t)(p - b.addr), (size_t)b.size);
  ta_error_info e = { .kind = "use.after-free", .bytes = b.size, .tag = b.tag, .stack = stack,
                      .alloc_stack = b.stack, .free_stack = b.free_stack, .addr = p,
                      .detail = detail };
  _ta_finding_error(&e);
  return 0;
}

/* ---- argument checks (ta_check_block) ------------------------------------------ */

/* One probe of the live table: is a the start of a live block of tag or alt? */
static inline bool check_fast(uintptr_t a, ta_tag tag, ta_tag alt) {
  ta_thread *t = _ta_self;
  shard *s = shard_of(a);
  bool solo = t != NULL && _ta_solo_enter(t);
  shard_lock_if(s, solo);
  const ta_block *b = slot_find(s, a);
  bool ok = b != NULL && b->state == TA_LIVE &&
            (tag == TA_ANY || b->tag == tag || b->tag == alt);
  shard_unlock_if(s, solo);
  if (t != NULL) _ta_solo_leave(t, solo);
  return ok;
}

/* The finding for a p that failed check_fast; skip: frames of the ledger
 * and the caller's to leave out of its stack. */
static TA_NOINLINE void check_report(uintptr_t p, ta_tag tag, unsigned flags, const char *what, size_t skip) {
  uint32_t stack = _ta_stack_capture(skip);
  char detail[96];
  const char *w = what ? what : "a pointer";
  const char *want = tag == TA_ANY ? "block" : ta_tag_name(tag);
  ta_block b;
  bool found = _ta_block_get(p, &b);
  /* a refcounted object freed, too big for the quarantine or out of it:
   * its refcount record is still kept */
  if ((flags & TA_CHECK_REF) && !(found && b.state == TA_LIVE) && _ta_ref_is_dead(p)) {
    _ta_snprintf(detail, sizeof detail, "%s: a refcounted block freed while still referenced", w);
    _ta_ref_report_dead(p, stack, detail);
    return;
  }
  if (found && b.state == TA_FREED) {
    if (flags & TA_CHECK_REF) {
      _ta_snprintf(detail, sizeof detail, "%s: its %s was freed while still referenced", w, ta_tag_name(b.tag));
      _ta_ref_report_dead(p, stack, detail);
      return;
    }
    _ta_snprintf(detail, sizeof detail, "%s: a freed %s (%zu bytes)", w, ta_tag_name(b.tag), (size_t)b.size);
    ta_error_info e = { .kind = (flags & TA_CHECK_FREE) ? "free.double" : "use.after-free", .bytes = b.size,
                        .tag = b.tag, .stack = stack, .alloc_stack = b.stack, .free_stack = b.free_stack,
                        .addr = p, .detail = detail };
    _ta_finding_error(&e);
    return;
  }
  uint64_t gen;
  bool live = false;
  ta_tag atag = TA_ANY;
  uint32_t reset_stack = 0;
  uintptr_t daddr = 0;
  uint64_t dsize = 0;
  uint32_t dstack = 0;
  bool in_arena = _ta_arena_lookup(p, &gen, &live, &atag, &reset_stack);
  bool dead = _ta_arena_dead_block(p, &daddr, &dsize, &dstack);
  if ((in_arena && !(found && b.state == TA_LIVE)) || (!found && dead)) {
    if (dead) _ta_snprintf(detail, sizeof detail, "%s: a %s of an arena generation reset since", w,
                           ta_tag_name(atag != TA_ANY ? atag : tag));
    else _ta_snprintf(detail, sizeof detail, "%s: not a block of the arena's current generation", w);
    ta_error_info e = { .kind = "arena.after-reset", .bytes = dsize, .tag = atag != TA_ANY ? atag : tag,
                        .stack = stack, .alloc_stack = dstack, .free_stack = reset_stack, .addr = p,
                        .detail = detail };
    _ta_finding_error(&e);
    _ta_arena_retire(p);
    return;
  }
  const char *kind = (flags & TA_CHECK_FREE) ? "free.invalid" : "use.after-free";
  if (found)   /* live, another tag: the memory was handed out again */
    _ta_snprintf(detail, sizeof detail, "%s: want a live %s, found a %s (freed, reused)", w, want,
                 ta_tag_name(b.tag));
  else
    _ta_snprintf(detail, sizeof detail, "%s: want a live %s, found no block (freed long ago?)", w, want);
  ta_error_info e = { .kind = kind, .bytes = found ? b.size : 0, .tag = found ? b.tag : tag, .stack = stack,
                      .alloc_stack = found ? b.stack : 0, .addr = p, .detail = detail };
  _ta_finding_error(&e);
}

TA_NOINLINE int ta_check_block(const void *ptr, ta_tag tag, ta_tag alt, unsigned flags, const char *what) {
  _ta_ensure();
  uintptr_t p = (uintptr_t)ptr;
  if (TA_LIKELY(check_fast(p, tag, alt))) return 1;
  check_report(p, tag, flags, what, (flags & TA_CHECK_CALLER) ? 3 : 2);
  __asm__ volatile("" ::: "memory");     /* keep this frame: no tail call above */
  return 0;
}

TA_NOINLINE int ta_check_tag(const void *ptr, ta_tag tag) {
  _ta_ensure();
  uintptr_t p = (uintptr_t)ptr;
  if (TA_LIKELY(check_fast(p, tag, tag))) return 1;
  check_report(p, tag, 0, NULL, 2);
  __asm__ volatile("" ::: "memory");
  return 0;
}
