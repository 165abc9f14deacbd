/* ledger.c - blocks: counting, allocation and free.  The rest of the
 * ledger's core is beside it: the live table (live.c, its inline probes in
 * live.h), the quarantine (quarantine.c), marks (marks.c), tags (tags.c),
 * the sequence and its clock (seq.c), init, fork and exit (init.c), the
 * pointer checks (check.c); what the block path shares inline with the
 * quarantine is in block.h.
 *
 * The live table is 256 shards chosen by a hash of the address; each shard
 * is an open-addressing table (linear probing, backward-shift deletion) under
 * its own spin lock, so threads freeing and allocating different blocks
 * rarely meet.  A block's record (ta_block, thread.h):
 *
 *   addr | size, tag | seq (birth), state, flags | stack | free_stack   (32 bytes)
 *
 * and in the table, where every block is live and has no free stack, the
 * same packed into 24 bytes (ta_slot, live.h).
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
#include "beside.h"
#include "block.h"
#include "live.h"

#include <jemalloc/jemalloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

_Atomic int _ta_threads_live;

static _Atomic int64_t live_bytes[TA_MAX_TAGS];
static _Atomic uint64_t peak_cur[TA_MAX_TAGS];  /* peak since the latest mark */
static _Atomic uint64_t peak_run;            /* peak of all live bytes, whole run */

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
static inline __attribute__((always_inline)) void publish_solo(ta_tag tag, int64_t delta) {
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

/* For marks.c: the peak since the latest mark of a tag, restarted at live
 * (a new mark), or read; and the whole run's. */
uint64_t _ta_peak_restart(ta_tag tag, uint64_t live) { return atomic_exchange(&peak_cur[tag], live); }
uint64_t _ta_peak_now(ta_tag tag) { return atomic_load(&peak_cur[tag]); }
uint64_t _ta_peak_run(void) { return atomic_load(&peak_run); }

/* live_change off the solo path: several threads, or a thread that
 * batched while they were several. */
static TA_NOINLINE void live_change_shared(ta_thread *t, ta_tag tag, int64_t delta) {
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

/* A block's bytes in or out of its tag's live bytes and the whole run's.
 * Always inline, at a constant sign: an allocation raises the peaks, a
 * free never does, and the solo thread's common case is two plain
 * read-modify-writes (a free) or those and the peaks' compares (an
 * allocation), where an out-of-line call with the sign tested inside it
 * was about 30 instructions each (callgrind, mixchurn). */
static inline __attribute__((always_inline)) void live_change(ta_thread *t, ta_tag tag, int64_t delta, bool solo) {
  if (TA_LIKELY(solo) && TA_LIKELY(!t->batching)) {
    if (tag) publish_solo(tag, delta);
    publish_solo(0, delta);
    return;
  }
  live_change_shared(t, tag, delta);
}

static inline void bump(_Atomic uint64_t *c, uint64_t v) {   /* single writer */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static inline __attribute__((always_inline))
void count_alloc(ta_thread *t, ta_tag tag, uint64_t size, uintptr_t addr, uint64_t seq, bool solo) {
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

static inline __attribute__((always_inline)) void count_free(ta_thread *t, ta_tag tag, uint64_t size, bool solo) {
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

/* ---- the pad (block.h): the size classes, the report ------------------------ */

TA_HIDDEN bool _ta_pad_use_nallocx;   /* block.h: class_of */
TA_HIDDEN _Atomic size_t _ta_align_odd;   /* block.h: raw_free */

void _ta_pad_check_classes(void) {
  for (size_t n = 1; n <= 70000 && !_ta_pad_use_nallocx; n += n < 4096 ? 1 : 7)
    _ta_pad_use_nallocx = class_of(n) != nallocx(n, 0);
}

/* heap.overflow: b's pad was written.  At its free the headline stack is
 * the free (where it was found); later the write is not placed (stack 0). */
void _ta_report_overflow(const ta_block *b, const pad_damage *d, int when) {
  /* A finding's detail is 96 bytes (tagalloc.h): when the whole line does
   * not fit, the first byte's value goes, then the offsets, so that the
   * line is never cut and always says when the damage was found. */
  char detail[96];
  const char *at = when == PAD_AT_QUARANTINE ? " (left the quarantine)" : when == PAD_AT_EXIT ? " (at exit)" : "";
  size_t n = (size_t)b->size;
  int len = _ta_snprintf(detail, sizeof detail, "wrote %zu byte(s) past the end of the %zu-byte block: offsets %zu..%zu, first 0x%02x%s",
                         d->count, n, n + d->first, n + d->last, d->value, at);
  if (len >= (int)sizeof detail)
    len = _ta_snprintf(detail, sizeof detail, "wrote %zu byte(s) past the end of the %zu-byte block: offsets %zu..%zu%s",
                       d->count, n, n + d->first, n + d->last, at);
  if (len >= (int)sizeof detail)
    _ta_snprintf(detail, sizeof detail, "wrote %zu byte(s) past the end of the %zu-byte block%s", d->count, n, at);
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_HEAP_OVERFLOW), .bytes = b->size, .tag = b->tag,
                      .stack = when == PAD_AT_FREE ? b->free_stack : 0, .alloc_stack = b->stack,
                      .free_stack = b->state == TA_FREED ? b->free_stack : 0, .addr = b->addr,
                      .detail = detail };
  _ta_finding_error(&e);
}

/* ---- allocation ------------------------------------------------------------ */

/* Records a new block; p came from raw_alloc.  Inline in the preload's
 * allocation (_ta_alloc_record), a call (block_new) elsewhere. */
static inline __attribute__((always_inline))
void *block_new_at(ta_thread *t, void *p, size_t size, ta_tag tag, uint32_t stack) {
  if (TA_UNLIKELY(p == NULL)) {
    _ta_error(TA_ENOMEM, "out of memory allocating %zu bytes", size);
    return NULL;
  }
  uintptr_t a = (uintptr_t)p;
  if (TA_UNLIKELY(!slot_key_ok(a))) {          /* never from jemalloc, guard mode or an arena */
    raw_free(t, a, size);
    _ta_error(TA_EINVAL, "block at %p: not 8-byte aligned or above 2^48, the live table cannot record it", p);
    return NULL;
  }
  if (_ta_opt.fill >= 0) memset(p, (int)_ta_opt.fill, size);
  if (TA_LIKELY(pad_owned(a))) pad_fill(a, size);
  bool solo = _ta_solo_enter(t);
  uint64_t seq = _ta_next_seq(t, solo);
  shard *s = shard_of(a);
  shard_lock_if(s, solo);
  ta_slot *b = slot_claim(s, a);
  if (b) slot_set(b, a, size, tag, seq, 0, stack);
  shard_unlock_if(s, solo);
  if (TA_UNLIKELY(b == NULL)) {
    _ta_solo_leave(t, solo);
    raw_free(t, a, size);
    _ta_error(TA_ENOMEM, "out of memory for the ledger's own table");
    return NULL;
  }
  count_alloc(t, tag, size, a, seq, solo);
  _ta_solo_leave(t, solo);
  if (_ta_tracing) _ta_trace_alloc(t, a, size, tag, stack, seq, 0);
  return p;
}

static TA_NOINLINE void *block_new(ta_thread *t, void *p, size_t size, ta_tag tag, uint32_t stack) {
  return block_new_at(t, p, size, tag, stack);
}

static inline ta_tag tag_check(ta_tag tag) {
  return tag < atomic_load_explicit(&_ta_tag_count, memory_order_relaxed) ? tag : TA_ANY;
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

/* ---- free (the quarantine itself: quarantine.c) ----------------------------- */

static void report_bad_free(uintptr_t a, uint32_t stack, const ta_block *old) {
  ta_error_info e = { .stack = stack, .addr = a };
  char detail[96] = "";
  if (old) {                                   /* a freed block: double free */
    e.kind = ta_kind_name(TA_KIND_FREE_DOUBLE);
    e.bytes = old->size;
    e.tag = old->tag;
    e.alloc_stack = old->stack;
    e.free_stack = old->free_stack;
  } else {
    ta_block in;
    e.kind = ta_kind_name(TA_KIND_FREE_INVALID);
    if (_ta_block_find(a, &in)) {
      _ta_snprintf(detail, sizeof detail, "interior pointer at offset %zu of a %zu-byte %s block",
                   (size_t)(a - in.addr), (size_t)in.size, in.state == TA_LIVE ? "live" : "freed");
      e.bytes = in.size;
      e.tag = in.tag;
      e.alloc_stack = in.stack;
      e.free_stack = in.free_stack;
    } else {
      _ta_snprintf(detail, sizeof detail, "not a block of the ledger: never allocated, or freed too long ago to remember");
    }
  }
  e.detail = detail;
  _ta_finding_error(&e);
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

/* ---- blocks with their records beside them (beside.h) ------------------------ */

/* A block of size bytes (at most BESIDE_MAX) with its record beside it;
 * NULL when jemalloc or the bitmap has no memory (the caller reports). */
static inline __attribute__((always_inline))
void *beside_new(ta_thread *t, size_t size, ta_tag tag, bool zero, uint32_t stack) {
  char *raw = _ta_je_malloc(size + BESIDE_HDR);
  if (TA_UNLIKELY(raw == NULL)) return NULL;
  uintptr_t a = (uintptr_t)raw + BESIDE_HDR;
  uint64_t *w = beside_word(a);
  if (TA_UNLIKELY(w == NULL) && (w = _ta_beside_map(a)) == NULL) {
    sdallocx(raw, size + BESIDE_HDR, 0);
    return NULL;
  }
  if (zero) memset((void *)a, 0, size);
  else if (_ta_opt.fill >= 0) memset((void *)a, (int)_ta_opt.fill, size);
  pad_fill_n(a + size, beside_pad_len(size));
  uint64_t bit = beside_bit(a);
  bool solo = _ta_solo_enter(t);
  uint64_t seq = _ta_next_seq(t, solo);
  if (TA_UNLIKELY(seq >> BESIDE_SEQ_BITS)) {      /* past the header's 48 bits: the table's 56 */
    _ta_solo_leave(t, solo);
    sdallocx(raw, size + BESIDE_HDR, 0);
    return block_new(t, raw_alloc(t, size, 16, 0), size, tag, stack);
  }
  beside_write(a, size, 0, tag, seq, stack);
  shard *s = shard_of(a);
  shard_lock_if(s, solo);
  if (TA_UNLIKELY(*w == 0)) _ta_beside_touch(a);   /* before the bit: a walk finds its page */
  *w |= bit;
  shard_unlock_if(s, solo);
  count_alloc(t, tag, size, a, seq, solo);
  _ta_solo_leave(t, solo);
  return (void *)a;
}

static TA_NOINLINE void *beside_new_out(ta_thread *t, size_t size, ta_tag tag, uint32_t stack) {
  void *p = beside_new(t, size, tag, false, stack);
  if (TA_UNLIKELY(p == NULL)) _ta_error(TA_ENOMEM, "out of memory allocating %zu bytes", size);
  return p;
}

/* A new block of size bytes for the heap: beside its record where it fits. */
static inline void *block_new_any(ta_thread *t, size_t size, ta_tag tag, uint32_t stack) {
  if (beside_fits(size)) return beside_new_out(t, size, tag, stack);
  return block_new(t, raw_alloc(t, size, 16, 0), size, tag, stack);
}

/* The record before the block at a failed its check: the 16 bytes before
 * the block were written (an overflow of the block before it, past that
 * block's pad, or a write before this one).  The block goes back by
 * jemalloc's own size; its record, stacks and tag are lost, and the
 * counts take what jemalloc says of its size. */
static TA_NOINLINE void beside_report_damage(ta_thread *t, uintptr_t a, uint32_t stack, bool solo) {
  size_t usable = sallocx((void *)(a - BESIDE_HDR), 0) - BESIDE_HDR;
  count_free(t, 0, usable, solo);
  _ta_solo_leave(t, solo);
  char detail[96];                               /* a finding's detail: 96 bytes (tagalloc.h) */
  _ta_snprintf(detail, sizeof detail, "wrote the 16 bytes before the block (its record): an underflow, or the block before overflowed");
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_HEAP_OVERFLOW), .bytes = usable, .stack = stack,
                      .free_stack = stack, .addr = a, .detail = detail };
  _ta_finding_error(&e);
  beside_raw_free(a, 0, false);
}

enum { BF_NOT = -1, BF_QUIET = 0, BF_DONE = 1, BF_BAD = 2 };

/* Leaves the shard's lock and the solo section with r. */
static inline int beside_leave(ta_thread *t, shard *s, bool solo, int r) {
  shard_unlock_if(s, solo);
  _ta_solo_leave(t, solo);
  return r;
}

/* Frees the block at a if its record is beside it (BF_NOT: it is not).
 * As block_free, in leaks mode (the only one with such blocks): no
 * quarantine.  quiet with no stack: anything to report (a written pad or
 * record) changes nothing and returns BF_QUIET, for the caller to come
 * back with its stack. */
static int beside_free(ta_thread *t, uintptr_t a, uint32_t stack, bool quiet) {
  if (!beside_is(a)) return BF_NOT;               /* a hint; again under the lock */
  shard *s = shard_of(a);
  bool solo = _ta_solo_enter(t);
  shard_lock_if(s, solo);
  uint64_t *w = beside_word(a), bit = beside_bit(a);
  if (!(*w & bit)) return beside_leave(t, s, solo, BF_NOT);
  bool quiet_check = quiet && stack == 0;
  beside_rec r;
  if (TA_UNLIKELY(!beside_read(a, &r))) {
    if (!quiet_check) *w &= ~bit;
    shard_unlock_if(s, solo);
    if (quiet_check) {
      _ta_solo_leave(t, solo);
      return BF_QUIET;
    }
    beside_report_damage(t, a, stack, solo);
    return BF_DONE;
  }
  size_t padn = beside_pad_len(r.size);
  pad_damage d;
  if (TA_UNLIKELY(r.flags & (TA_F_REF | TA_F_HOLD))) {
    if (quiet_check && pad_changed_n(a, r.size, padn, &d)) return beside_leave(t, s, solo, BF_QUIET);
    shard_unlock_if(s, solo);                     /* holds and refcounts take their own locks */
    _ta_solo_leave(t, solo);
    if (r.flags & TA_F_REF) _ta_ref_on_free(a, stack);
    if (r.flags & TA_F_HOLD) _ta_hold_on_free(a, r.size, stack);
    solo = _ta_solo_enter(t);
    shard_lock_if(s, solo);
    if (!(*w & bit) || !beside_read(a, &r)) {     /* freed meanwhile by another thread */
      shard_unlock_if(s, solo);
      _ta_solo_leave(t, solo);
      report_bad_free(a, stack, NULL);
      return BF_BAD;
    }
    quiet_check = false;
    padn = beside_pad_len(r.size);
  }
  bool damaged = pad_changed_n(a, r.size, padn, &d);
  if (TA_UNLIKELY(damaged && quiet_check)) return beside_leave(t, s, solo, BF_QUIET);
  *w &= ~bit;
  shard_unlock_if(s, solo);
  count_free(t, r.tag, r.size, solo);
  _ta_solo_leave(t, solo);
  ta_block freed;
  record_freed(&freed, a, r.size, r.tag, r.seq, (uint8_t)(r.flags | TA_F_BESIDE), r.stack, stack);
  if (TA_UNLIKELY(damaged)) _ta_report_overflow(&freed, &d, PAD_AT_FREE);
  quarantine_recent(t, &freed);
  beside_raw_free(a, r.size, true);
  return BF_DONE;
}

/* The default mode's free of a block with its record beside it, whole,
 * as block_free_plain's: no flag, the record and the pad intact (else
 * BF_QUIET, nothing changed: beside_free says why); BF_NOT where a is not
 * such a block.  The record and the pad are on the block's own lines. */
static inline __attribute__((always_inline)) int beside_free_plain(ta_thread *t, uintptr_t a) {
  if (a & 15) return BF_NOT;
  uint64_t *w = beside_word(a);
  if (w == NULL) return BF_NOT;
  ta_block *ring = t->recent;
  if (TA_UNLIKELY(ring == NULL)) return beside_is(a) ? BF_QUIET : BF_NOT;   /* the ring's first use */
  uint64_t bit = beside_bit(a);
  shard *s = shard_of(a);
  bool solo = _ta_solo_enter(t);
  shard_lock_if(s, solo);
  if (!(*w & bit)) return beside_leave(t, s, solo, BF_NOT);
  beside_rec r;
  if (TA_UNLIKELY(!beside_read(a, &r)) || TA_UNLIKELY(r.flags != 0) ||
      TA_UNLIKELY(!pad_intact((const unsigned char *)(a + r.size), beside_pad_len(r.size))))
    return beside_leave(t, s, solo, BF_QUIET);
  *w &= ~bit;
  shard_unlock_if(s, solo);
  count_free(t, r.tag, r.size, solo);
  _ta_solo_leave(t, solo);
  uint32_t pos = t->rpos;
  record_freed(&ring[pos], a, r.size, r.tag, r.seq, TA_F_BESIDE, r.stack, 0);
  t->rpos = (pos + 1) & (TA_RECENT - 1);
  sdallocx((void *)(a - BESIDE_HDR), (size_t)r.size + BESIDE_HDR, 0);
  return BF_DONE;
}

/* Frees the block at a; `stack` is where.  Returns false for a bad free,
 * which it reports, unless `quiet`: then it changes nothing and the caller,
 * which took no stack (leaks mode), takes one and calls again.
 * One solo section, the table's and the counts': the quarantine after it
 * may report, and reporting takes locks.  (The counts had a section of
 * their own after the quarantine: a second enter and leave each free.)
 *
 * The pad is read once, after the record is out of the table: its line,
 * known from the record's size, starts loading first, and the removal's
 * work goes on under that load (the pad of a block freed long after its
 * allocation is a cache miss of its own, after the record's: on churn a
 * quarter of block_free's samples were that load, right after the
 * record's).  A quiet free that finds it written puts the record back,
 * under the same lock, so that it changed nothing. */
static bool block_free(ta_thread *t, uintptr_t a, uint32_t stack, bool quiet) {
  if (TA_UNLIKELY(_ta_beside_on)) {
    int r = beside_free(t, a, stack, quiet);
    if (r != BF_NOT) return r == BF_DONE;
  }
  shard *s = shard_of(a);
  bool solo = _ta_solo_enter(t);
  shard_lock_if(s, solo);
  ta_slot *b = slot_find(s, a);
  if (TA_UNLIKELY(b == NULL || (slot_flags(b) & TA_F_ARENA))) {
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    if (quiet) return false;
    ta_block old;
    report_bad_free(a, stack, b == NULL && _ta_quarantine_find(a, false, &old) ? &old : NULL);
    return false;
  }
  uint8_t flags = slot_flags(b);
  uint64_t size = slot_size(b);
  ta_tag tag = slot_tag(b);
  /* only the blocks block_new padded: no flag but REF and HOLD */
  bool padded = !(flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(a);
  if (padded) __builtin_prefetch((const void *)(a + size));
  /* A quiet free has no stack (leaks mode).  A written pad or guard slack
   * is a heap.overflow found at this free, and its report names the free:
   * leave the block as it is and let the caller come back with its stack. */
  bool quiet_check = TA_UNLIKELY(quiet) && stack == 0;
  if (TA_UNLIKELY(quiet_check && _ta_guard_on) && _ta_guard_slack_written(a, size)) {
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    return false;
  }
  pad_damage d;
  if (TA_UNLIKELY(flags & (TA_F_REF | TA_F_HOLD))) {
    if (quiet_check && padded && pad_changed(a, size, &d)) {   /* before the holds and refcounts change */
      shard_unlock_if(s, solo);
      _ta_solo_leave(t, solo);
      return false;
    }
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
    quiet_check = false;                      /* checked, and they have changed now */
  }
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, solo) : 0;
  /* the record as it leaves the table, in whole words (block.h:
   * record_freed), for the copy into the recent frees or the quarantine */
  ta_block freed;
  record_freed(&freed, a, slot_size(b), slot_tag(b), slot_seq(b), slot_flags(b), slot_stack(b), stack);
  slot_remove(s, b);
  bool damaged = padded && pad_changed(a, size, &d);
  if (TA_UNLIKELY(damaged && quiet_check)) {
    slot_put_back(s, &freed);
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    return false;
  }
  shard_unlock_if(s, solo);
  count_free(t, tag, size, solo);             /* in the same solo section: the block is out of the table */
  _ta_solo_leave(t, solo);
  int64_t budget = quarantine_this(t) ? quarantine_budget() : 0;   /* 0: no quarantine */
  if (TA_UNLIKELY((int64_t)size > budget / 8) && !_ta_guard_on) budget = 0;   /* too big to keep */
  /* errors mode: a sample of the frees in a budget as much smaller, so
   * that a sampled block stays as many bytes of frees as in full mode,
   * while the blocks held stay few enough to sit in cache and pin few of
   * jemalloc's slabs (1 MiB held took the churn's reuse away: 0.55x of
   * its CPU time at 1 in 16; 64 KiB 0.1x) */
  if (_ta_opt.check == TA_CHECK_ERRORS && !_ta_guard_on) budget /= _ta_opt.quarantine_sample;
  if (TA_UNLIKELY(damaged)) {
    _ta_report_overflow(&freed, &d, PAD_AT_FREE);
    pad_fill(a, size);                           /* reported once: later checks see new writes only */
  }
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_retire(&freed)) {}   /* pages made PROT_NONE */
  else if (budget > 0) memset((void *)a, (int)_ta_opt.poison, poison_span(size));
  if (budget > 0 && quarantine_push(t, &freed, budget)) {
    t->qbytes += q_charge(a, size);
    quarantine_trim(t, budget);
  } else {
    if (_ta_opt.check != TA_CHECK_FULL) quarantine_recent(t, &freed);
    raw_free(t, a, size);
  }
  if (seq) _ta_trace_free(t, a, stack, seq);   /* seq taken before the memory could be reused */
  return true;
}

/* The default mode's free, whole, where nothing else is asked of it
 * (leaks mode, no guard mode, no trace; the caller checks the mode): a
 * block with no flag, found, its pad intact.  The rest (a bad free, a
 * flagged block, a written pad, a thread's first free) returns false
 * with nothing changed, and the caller goes the general way
 * (block_free), which finds it again.  What it leaves out of
 * block_free's path is what that mode never does: the quarantine's and
 * the trace's branches, the holds and refcounts, the guard's checks, the
 * record built on the stack and copied into the recent frees (it goes
 * into the ring from the table's words, once the pad is known intact). */
static inline __attribute__((always_inline)) bool block_free_plain(ta_thread *t, uintptr_t a) {
  ta_block *ring = t->recent;
  if (TA_UNLIKELY(ring == NULL) || TA_UNLIKELY(_ta_guard_on) || TA_UNLIKELY(_ta_tracing)) return false;
  shard *s = shard_of(a);
  bool solo = _ta_solo_enter(t);
  shard_lock_if(s, solo);
  uint32_t i = slot_find_index(s, a);
  if (TA_UNLIKELY(i == SLOT_NONE) || TA_UNLIKELY(slot_flags(&s->slots[i]) != 0)) {
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    return false;
  }
  ta_slot r = s->slots[i];
  uint64_t size = slot_size(&r);
  __builtin_prefetch((const void *)(a + size));   /* the pad's line, under the removal */
  slot_remove_at(s, i);
  if (TA_UNLIKELY(!pad_intact((const unsigned char *)(a + size), pad_len(size)))) {
    slot_put_back_words(s, &r);                    /* reported with the free's stack */
    shard_unlock_if(s, solo);
    _ta_solo_leave(t, solo);
    return false;
  }
  shard_unlock_if(s, solo);
  ta_tag tag = slot_tag(&r);
  count_free(t, tag, size, solo);
  _ta_solo_leave(t, solo);
  uint32_t pos = t->rpos;
  record_freed(&ring[pos], a, size, tag, slot_seq(&r), 0, slot_stack(&r), 0);
  t->rpos = (pos + 1) & (TA_RECENT - 1);
  raw_free(t, a, size);
  return true;
}

TA_NOINLINE void ta_free(void *p) {
  if (p == NULL) return;
  _ta_ensure();
  ta_thread *t = _ta_thread();
  _ta_block_prefetch(p);
  if (TA_UNLIKELY(_ta_opt.check == TA_CHECK_LEAKS)) {   /* no free stack but a bad free's */
    if (block_free_plain(t, (uintptr_t)p) || block_free(t, (uintptr_t)p, 0, true)) return;
  }
  uint32_t stack = _ta_stack_capture(1);
  block_free(t, (uintptr_t)p, stack, false);
}

/* realloc in place, in leaks mode.  A move there catches nothing (the old
 * block goes back to jemalloc at once, no quarantine keeps it) and costs a
 * new block, a copy and a free: where the new size is in the block's size
 * class (any class), or both sizes are large and jemalloc resizes the
 * extent in place (xallocx), the block stays.  The record is what a move
 * would leave: the new size, a new birth, the realloc's stack, the tag;
 * the counts a free of the old size and an allocation of the new one; the
 * pad moves to the new end (a shrink writes it over bytes that were the
 * block's).  An old pad that was written is not moved: the move's free
 * reports it with this stack.  Not while tracing (the trace's realloc
 * event names a new block), in guard mode, or for a block with a hold,
 * a refcount or an arena. */

static bool realloc_in_place(ta_thread *t, uintptr_t a, const ta_block *old, size_t size, uint32_t stack) {
  if (_ta_opt.check != TA_CHECK_LEAKS || TA_UNLIKELY(_ta_guard_on) || _ta_tracing || old->flags != 0 ||
      TA_UNLIKELY(_ta_pad_use_nallocx))
    return false;
  bool same = class_of(size) == class_of(old->size);
  if (!same && (size < TA_LARGE_FROM || old->size < TA_LARGE_FROM)) return false;
  pad_damage d;
  if (pad_changed(a, old->size, &d)) return false;
  /* the block's usable size must hold the new pad: a failed xallocx
   * leaves the old size (a shrink that failed still fits) */
  if (!same && xallocx((void *)a, size, 0, 0) < size + pad_len(size)) return false;
  bool solo = _ta_solo_enter(t);
  uint64_t seq = _ta_next_seq(t, solo);
  shard *s = shard_of(a);
  shard_lock_if(s, solo);
  ta_slot *b = slot_find(s, a);
  bool ok = b != NULL && slot_seq(b) == old->seq && slot_flags(b) == 0;   /* not freed or changed meanwhile */
  if (ok) {
    if (_ta_opt.fill >= 0 && size > old->size) memset((void *)(a + old->size), (int)_ta_opt.fill, size - old->size);
    pad_fill(a, size);
    slot_rebirth(b, size, seq, stack);
  }
  shard_unlock_if(s, solo);
  if (ok) {
    count_free(t, (ta_tag)old->tag, old->size, solo);
    count_alloc(t, (ta_tag)old->tag, size, a, seq, solo);
  }
  _ta_solo_leave(t, solo);
  return ok;
}

/* realloc in place of a block with its record beside it (leaks mode):
 * where the new size + 16 is in the same size class, as realloc_in_place
 * does for a table block. */
static bool beside_realloc_in_place(ta_thread *t, uintptr_t a, const ta_block *old, size_t size, uint32_t stack) {
  if ((old->flags & ~TA_F_BESIDE) || size > BESIDE_MAX || _ta_tracing ||
      class_of(size + BESIDE_HDR) != class_of((size_t)old->size + BESIDE_HDR))
    return false;
  pad_damage d;
  if (pad_changed_n(a, old->size, beside_pad_len(old->size), &d)) return false;   /* the move's free tells it */
  bool solo = _ta_solo_enter(t);
  uint64_t seq = _ta_next_seq(t, solo);
  shard *s = shard_of(a);
  shard_lock_if(s, solo);
  beside_rec r;
  bool ok = !(seq >> BESIDE_SEQ_BITS) && beside_is(a) && beside_read(a, &r) && r.seq == old->seq && r.flags == 0;
  if (ok) {
    if (_ta_opt.fill >= 0 && size > old->size) memset((void *)(a + old->size), (int)_ta_opt.fill, size - old->size);
    pad_fill_n(a + size, beside_pad_len(size));
    beside_write(a, size, 0, r.tag, seq, stack);
  }
  shard_unlock_if(s, solo);
  if (ok) {
    count_free(t, r.tag, old->size, solo);
    count_alloc(t, r.tag, size, a, seq, solo);
  }
  _ta_solo_leave(t, solo);
  return ok;
}

static inline __attribute__((always_inline))
void *realloc_impl(ta_thread *t, ta_tag tag, void *p, size_t size, uint32_t stack) {
  if (p == NULL) return block_new_any(t, size, tag_check(tag), stack);
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
  if ((old.flags & TA_F_BESIDE) ? beside_realloc_in_place(t, a, &old, size, stack)
                                : realloc_in_place(t, a, &old, size, stack))
    return p;
  /* Else move, so that a stale pointer to the old block is caught. */
  void *n = block_new_any(t, size, old.tag, stack);
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
  return realloc_impl(t, _ta_tag_realloc, p, size, stack);
}

/* ---- entry points for the LD_PRELOAD shim (tools/preload.c) ---------------
 * The shim captures the stack itself (so that frame 0 is the program's) and
 * calls these; they never capture. */

void *_ta_alloc_raw(size_t size, size_t align, bool zero) {
  _ta_ensure();
  int flags = (align > 16 ? (int)MALLOCX_ALIGN(align) : 0) | (zero ? MALLOCX_ZERO : 0);
  void *p = raw_alloc(NULL, size, align, flags);     /* (raw_alloc does not read its thread) */
  if (p) slot_prefetch((uintptr_t)p);
  return p;
}

void *_ta_alloc_record(void *raw, ta_tag tag, size_t size, bool zero, uint32_t stack) {
  void *p = block_new_at(_ta_thread(), raw, size, tag_check(tag), stack);
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
  ta_thread *t = _ta_thread();
  if (TA_LIKELY(_ta_opt.check == TA_CHECK_LEAKS)) {
    if (TA_LIKELY(_ta_beside_on)) {
      int r = beside_free_plain(t, (uintptr_t)p);
      if (r == BF_DONE) return true;
      if (r == BF_QUIET) return block_free(t, (uintptr_t)p, 0, true);   /* beside_free: why */
    }
    if (block_free_plain(t, (uintptr_t)p)) return true;
  }
  return block_free(t, (uintptr_t)p, 0, true);
}

/* The preload's malloc, calloc and operator new in leaks mode, for a
 * block that fits beside its record (zero: calloc's). */
void *_ta_alloc_beside(ta_tag tag, size_t size, bool zero, uint32_t stack) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  if (TA_UNLIKELY(_ta_tracing)) return _ta_alloc_at(tag, size, 0, zero, stack);
  void *p = beside_new(t, size, tag_check(tag), zero, stack);
  if (TA_UNLIKELY(p == NULL)) _ta_error(TA_ENOMEM, "out of memory allocating %zu bytes", size);
  return p;
}

/* Is the block at p one with its record beside it?  Then *n is the bytes
 * asked for (the preload's malloc_usable_size where the ledger cannot be
 * entered: without the shard's lock, the block being the caller's). */
bool _ta_beside_usable(const void *p, size_t *n) {
  beside_rec r;
  if (!_ta_beside_on || !beside_is((uintptr_t)p) || !beside_read((uintptr_t)p, &r)) return false;
  *n = (size_t)r.size;
  return true;
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

/* ---- arena blocks in the live table ------------------------------------------ */

void _ta_block_add_arena(ta_thread *t, uintptr_t a, size_t size, ta_tag tag, uint32_t stack) {
  tag = tag_check(tag);        /* as block_new's: a tag never registered is TA_ANY (the counts have 256 rows) */
  uint64_t seq = _ta_next_seq(t, false);
  shard *s = shard_of(a);
  shard_lock(s);
  ta_slot *b = slot_claim(s, a);
  if (b) slot_set(b, a, size, tag, seq, TA_F_ARENA, stack);
  shard_unlock(s);
  if (b == NULL) {
    _ta_error(TA_ENOMEM, "out of memory for the ledger's own table: the arena block at %p is not recorded", (void *)a);
    return;
  }
  count_alloc(t, tag, size, a, seq, false);
  if (_ta_tracing) _ta_trace_alloc(t, a, size, tag, stack, seq, 1);
}

void _ta_block_drop_arena(ta_thread *t, uintptr_t a, uint32_t stack) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_slot *b = slot_find(s, a);
  if (b == NULL || !(slot_flags(b) & TA_F_ARENA)) { shard_unlock(s); return; }
  ta_tag tag = slot_tag(b);
  uint64_t size = slot_size(b);
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, false) : 0;
  slot_remove(s, b);
  shard_unlock(s);
  count_free(t, tag, size, false);
  if (seq) _ta_trace_free(t, a, stack, seq);
}
