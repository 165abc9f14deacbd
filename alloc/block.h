/* block.h - what the files of the block path share (ledger.c: allocation
 * and free; quarantine.c: the quarantine; live.c: the live table), never
 * included elsewhere: raw memory, the pad past a block's end, the poisoned
 * span of a freed block, and the quarantine's calls from the free path.
 * Inline, as they were when all of it was one file: they are on the path of
 * every allocation and free. */
#ifndef TAGALLOC_BLOCK_H
#define TAGALLOC_BLOCK_H

#include "internal.h"

#include <jemalloc/jemalloc.h>
#include <string.h>

/* ---- raw memory ------------------------------------------------------------ */

/* jemalloc's size class of a request of n bytes (x86-64: 16-byte quantum,
 * four classes per doubling above 128 bytes), computed inline: nallocx
 * cost as much as the rest of the pad (a call and jemalloc's thread
 * state).  _ta_init checks the formula against nallocx; where they differ
 * (another jemalloc configuration), nallocx is asked. */
extern TA_HIDDEN bool _ta_pad_use_nallocx;

static inline size_t class_of(size_t n) {
  if (n <= 8) return 8;
  if (n <= 128) return (n + 15) & ~(size_t)15;
  size_t delta = (size_t)1 << (63 - __builtin_clzll((unsigned long long)(n - 1)) - 2);
  return (n + delta - 1) & ~(delta - 1);
}

/* jemalloc's first large class (4 KiB pages): a block whose size's class
 * is below it is freed with its size (sdallocx), the others without
 * (dallocx).  realloc_in_place resizes a block in place across classes
 * only at or above it (xallocx), where the record's size may then no
 * longer name the block's class. */
#define TA_LARGE_FROM ((size_t)16 << 10)

/* Freeing with the size: jemalloc's free without it (dallocx) looks the
 * pointer up in its radix tree to learn the size class (119 instructions
 * a free on churn, the thread cache's flushes included), and for a block
 * leaving the quarantine a megabyte of frees after it was freed that
 * lookup's lines are cold; sdallocx with the size takes the class from a
 * table (its fast path, classes up to 4 KiB) or from the size (up to 14
 * KiB): 70 instructions.  jemalloc's rule:
 * the size passed must name the block's class.  The record's size does,
 * for every block raw_alloc made without an alignment flag (calloc's
 * zeroing does not change the class; a realloc in place keeps its class
 * below TA_LARGE_FROM).  An aligned one may be in a bigger class than its
 * size (memalign(64, 16) is a 64-byte block): raw_alloc notes the largest
 * alignment of such a block in _ta_align_odd, and a free takes the size
 * only where no such alignment can have placed the block: an aligned
 * block's class is its size's unless the alignment exceeds the lowest set
 * bit of that class (or a page), and the block's address is a multiple of
 * its alignment.  So while no aligned block of another class was made
 * (churn, most programs), every small block is freed with its size; after
 * one, those at addresses aligned beyond their class's lowest bit are not. */
extern TA_HIDDEN _Atomic size_t _ta_align_odd;

/* An allocation with alignment flags (mallocx's) of n bytes: is its class
 * bigger than its size's?  Then note its alignment. */
static inline void align_note(size_t n, int flags) {
  size_t align = (size_t)1 << (flags & 63);
  size_t c = class_of(n);
  if (c >= TA_LARGE_FROM) return;                    /* freed without its size */
  if (!TA_UNLIKELY(_ta_pad_use_nallocx) && align <= (c & -c) && align <= 4096) return;
  size_t odd = atomic_load_explicit(&_ta_align_odd, memory_order_relaxed);
  while (odd < align && !atomic_compare_exchange_weak_explicit(&_ta_align_odd, &odd, align, memory_order_relaxed,
                                                                 memory_order_relaxed)) {}
}

/* Can the block at a, of `size` bytes, be freed with its size?  (Sizes
 * up to 14 KiB are those whose class is below TA_LARGE_FROM.) */
static inline bool free_sized_ok(uintptr_t a, uint64_t size) {
  if (size > TA_LARGE_FROM - TA_LARGE_FROM / 8) return false;
  size_t odd = atomic_load_explicit(&_ta_align_odd, memory_order_relaxed);
  if (TA_LIKELY(odd == 0)) return true;
  if (TA_UNLIKELY(_ta_pad_use_nallocx)) return false;    /* class_of is not jemalloc's there */
  size_t c = class_of(size ? (size_t)size : 1);
  size_t low = a & -a;                                   /* the address's alignment */
  size_t most = low < odd ? low : odd;                   /* the largest alignment that can have placed it */
  return most <= (c & -c) && most <= 4096;
}

/* jemalloc's own malloc, where the preload links jemalloc's archive in
 * (tools/part.mk renames it so; NULL elsewhere: libtagalloc.a with
 * libjemalloc.so, where the program's malloc may be the preload's).  A
 * plain block (no flag) comes from it: its fast path, the thread cache's
 * bin, is about 40 instructions fewer than mallocx's general path, which
 * every flag goes through (callgrind, mixchurn); the same bin, the same
 * class, freed with sdallocx as before. */
extern void *_ta_je_malloc(size_t size) __attribute__((weak));

/* jemalloc, or in guard mode a block on a page of its own (guard.c);
 * flags are mallocx's, align and zero are read by guard mode. */
static inline void *raw_alloc(ta_thread *t, size_t size, size_t align, int flags) {
  if (TA_UNLIKELY(flags & 63)) align_note(size ? size : 1, flags);   /* before the block can be freed */
  if (TA_UNLIKELY(_ta_guard_on)) {
    void *g = _ta_guard_alloc(size, align, (flags & MALLOCX_ZERO) != 0);
    if (g) return g;
  }
  (void)t;
  if (flags == 0 && _ta_je_malloc != NULL) return _ta_je_malloc(size ? size : 1);
  return mallocx(size ? size : 1, flags);
}

/* Gives back the block at a that raw_alloc made for `size` bytes (the
 * record's size: the request, or after a realloc in place the new one). */
static inline void raw_free(ta_thread *t, uintptr_t a, uint64_t size) {
  (void)t;
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_release(a)) return;
  if (TA_LIKELY(free_sized_ok(a, size))) sdallocx((void *)a, size ? (size_t)size : 1, 0);
  else dallocx((void *)a, 0);
}

/* ---- the pad past a block's end (the overflow check; ledger.c) ------------- */

#define TA_PAD_MAX 16
#define PAD_WORD (0x0101010101010101ull * TA_PAD_BYTE)

/* Bytes of pad past a block of `size` bytes: the slack of its size class,
 * at most TA_PAD_MAX.  The class of an unaligned request; an aligned one's
 * is at least as big, so the pad is always inside the block's usable size. */
static inline size_t pad_len(uint64_t size) {
  size_t n = size ? (size_t)size : 1;
  size_t usable = TA_UNLIKELY(_ta_pad_use_nallocx) ? nallocx(n, 0) : class_of(n);
  size_t slack = usable > size ? usable - (size_t)size : 0;
  return slack < TA_PAD_MAX ? slack : TA_PAD_MAX;
}

static inline bool pad_owned(uintptr_t a) {
  return !(TA_UNLIKELY(_ta_guard_on) && _ta_guard_owns(a));   /* guard.c checks its own slack */
}

/* Two overlapping word stores (or loads) cover any n in [8, 16]; no call.
 * n bytes of pad at p. */
static inline void pad_fill_n(uintptr_t at, size_t n) {
  unsigned char *p = (unsigned char *)at;
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

static inline void pad_fill(uintptr_t a, uint64_t size) { pad_fill_n(a + size, pad_len(size)); }

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

/* Whether the n bytes of pad of the block at a (size bytes) were written;
 * d says where. */
static inline bool pad_changed_n(uintptr_t a, uint64_t size, size_t n, pad_damage *d) {
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

/* ... of its pad_len(size) bytes (a table block's). */
static inline bool pad_changed(uintptr_t a, uint64_t size, pad_damage *d) {
  return pad_changed_n(a, size, pad_len(size), d);
}

enum { PAD_AT_FREE, PAD_AT_QUARANTINE, PAD_AT_EXIT };

/* _ta_init: checks class_of against nallocx (sets _ta_pad_use_nallocx). */
void _ta_pad_check_classes(void);
/* heap.overflow: b's pad was written (found at its free, when it left the
 * quarantine, or at exit). */
void _ta_report_overflow(const ta_block *b, const pad_damage *d, int when);

/* ---- the quarantine (quarantine.c) ------------------------------------------- */

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

/* What a quarantined block counts against the budget: its size, or in
 * guard mode what guard.c says for its pages. */
static inline int64_t q_charge(uintptr_t a, uint64_t size) {
  return (int64_t)(TA_UNLIKELY(_ta_guard_on) ? _ta_guard_charge(a, size) : size);
}

/* The ring (quarantine.c says how it works): its first use, doubling it
 * in place, and taking its oldest block out (poison and pad checked). */
bool _ta_quarantine_ring(ta_thread *t);
void _ta_quarantine_grow(ta_thread *t);
void _ta_quarantine_evict(ta_thread *t);
uint32_t _ta_quarantine_evict_batch(ta_thread *t, int64_t keep);

/* Pushing a freed (poisoned) block on t's ring, and trimming the ring to
 * t's share of the budget: on every quarantined free. */
/* Each thread's share of a budget: the budget over the live threads. */
static inline int64_t quarantine_share(int64_t budget) {
  int n = atomic_load_explicit(&_ta_threads_live, memory_order_relaxed);
  return n > 1 ? budget / n : budget;        /* no division on every free of one thread */
}

/* A freed block's record, stored as four whole words: built field by
 * field, the bit-fields are written with narrow stores (2 bytes for the
 * tag, 1 for the state and flags), and any later load of a whole word
 * waits for them (below).  The words are ta_block's bit-fields as GCC lays
 * them out on a little-endian target (test_free_sized reads every field
 * back). */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "record_freed: ta_block's words are laid out for a little-endian target"
#endif
static inline void record_freed(ta_block *dst, uintptr_t addr, uint64_t size, ta_tag tag, uint64_t seq,
                                uint8_t flags, uint32_t stack, uint32_t free_stack) {
  uint64_t w0 = addr;
  uint64_t w1 = (size & ((UINT64_C(1) << 48) - 1)) | (uint64_t)(uint16_t)tag << 48;
  uint64_t w2 = (seq & ((UINT64_C(1) << 56) - 1)) | (uint64_t)TA_FREED << 56 | (uint64_t)(flags & 15) << 60;
  uint64_t w3 = stack | (uint64_t)free_stack << 32;
  memcpy((char *)dst, &w0, 8);
  memcpy((char *)dst + 8, &w1, 8);
  memcpy((char *)dst + 16, &w2, 8);
  memcpy((char *)dst + 24, &w3, 8);
}

/* Copies a record a word at a time.  block_free builds the record on its
 * stack just before (record_freed): a load that spans two stores (a
 * 16-byte load over two 8-byte stores, what a plain struct copy compiles
 * to, or a word over a bit-field's narrow stores) cannot take its data from
 * the store buffer and waits for the stores to reach the cache; on churn
 * in leaks mode that wait had 55% of the samples of the copy into the
 * recent frees. */
static inline void record_copy(ta_block *dst, const ta_block *src) {
  uint64_t w0, w1, w2, w3;
  memcpy(&w0, (const char *)src, 8);
  memcpy(&w1, (const char *)src + 8, 8);
  memcpy(&w2, (const char *)src + 16, 8);
  memcpy(&w3, (const char *)src + 24, 8);
  __asm__("" : "+r"(w0), "+r"(w1), "+r"(w2), "+r"(w3));   /* in registers: no vector loads */
  memcpy((char *)dst, &w0, 8);
  memcpy((char *)dst + 8, &w1, 8);
  memcpy((char *)dst + 16, &w2, 8);
  memcpy((char *)dst + 24, &w3, 8);
}

static inline bool quarantine_push(ta_thread *t, const ta_block *b, int64_t budget) {
  if (t->q == NULL && !_ta_quarantine_ring(t)) return false;
  if (t->qlen == t->qcap) {                            /* full: grow, or the oldest leaves */
    if (t->qcap < t->qmax && t->qbytes < quarantine_share(budget)) _ta_quarantine_grow(t);
    else _ta_quarantine_evict(t);
  }
  record_copy(&t->q[(t->qhead + t->qlen) & (t->qcap - 1)], b);
  t->qlen++;
  return true;
}

/* Over its share, a thread evicts a batch (at most 8 blocks) down to 1/32
 * under it (quarantine.c: why in batches). */
static inline void quarantine_trim(ta_thread *t, int64_t budget) {
  int n = atomic_load_explicit(&_ta_threads_live, memory_order_relaxed);
  /* over the share (budget / n), without a division on every free */
  if ((__int128)t->qbytes * (n > 1 ? n : 1) <= budget) return;
  int64_t share = quarantine_share(budget);
  _ta_quarantine_evict_batch(t, share - share / 32);
}

/* The records of the last TA_RECENT blocks a thread freed outside the
 * quarantine (the leaks and errors modes): their memory went back to
 * jemalloc at once, but a second free of one of them, before the ledger
 * hands its address out again, is still told as free.double with its
 * allocation stack (and in errors mode its free stack).  One 32-byte store
 * a free into 32 KiB that stays in cache; read only on a bad free.
 * _ta_quarantine_recent_ring makes a thread's ring at its first free. */
#define TA_RECENT 1024u

bool _ta_quarantine_recent_ring(ta_thread *t);

/* Remembers a block freed outside the quarantine. */
static inline void quarantine_recent(ta_thread *t, const ta_block *b) {
  if (TA_UNLIKELY(t->recent == NULL) && !_ta_quarantine_recent_ring(t)) return;
  record_copy(&t->recent[t->rpos], b);
  t->rpos = (t->rpos + 1) & (TA_RECENT - 1);
}
/* Is p a quarantined or recently freed block (or, interior, inside one)? */
bool _ta_quarantine_find(uintptr_t p, bool interior, ta_block *out);

#endif
