/* live.h - the live table's shards and their probes, shared by live.c (the
 * table, its growth, its queries for the rest of the ledger) and ledger.c
 * (allocation and free); never included elsewhere.  Inline, as they were
 * when the table shared ledger.c with the block path: a find, an insert
 * and a removal are on the path of every allocation and free.
 *
 * 256 shards chosen by a hash of the address; each shard is an
 * open-addressing table (linear probing, backward-shift deletion) under its
 * own spin lock, so threads freeing and allocating different blocks rarely
 * meet. */
#ifndef TAGALLOC_LIVE_H
#define TAGALLOC_LIVE_H

#include "internal.h"

#include <sched.h>

#define NSHARDS 256                 /* the live table's shards */

/* One cache line each (a hand-counted pad once made them 72 bytes: every
 * other shard straddled two lines). */
typedef struct {
  _Atomic int lock;
  uint32_t mask;              /* capacity - 1; capacity 0 before first use */
  uint32_t used;
  ta_block *slots;
} __attribute__((aligned(64))) shard;
_Static_assert(sizeof(shard) == 64, "a shard is one cache line");

extern TA_HIDDEN shard _ta_shards[NSHARDS];
/* Doubles s (a first use: 8 slots); false when out of memory (live.c). */
bool _ta_live_grow(shard *s);

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
static inline shard *shard_of(uintptr_t a) { return &_ta_shards[addr_hash(a >> 12) >> 56]; }

/* The home slot of a block in its shard: the high half of the product.
 * Its low bits depend on every bit of the address (a product's low bits
 * only on the address's own low bits, which a slab's blocks share in
 * patterns): a find probed 1.4 slots on average, where addr_hash's low
 * bits made it 4.7 (python3 with PYTHONMALLOC=malloc; the tree 1.5 for
 * 4.9, the churn 1.5 for 2.2). */
static inline uint32_t slot_hash(uintptr_t a) {
  return (uint32_t)((((uint64_t)a >> 4) * 0x9E3779B97F4A7C15ull) >> 32);
}

/* Its home slot in s as s is now (_ta_live_grow places records by the new
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

static inline ta_block *slot_find(shard *s, uintptr_t a) {
  if (s->slots == NULL) return NULL;
  uint32_t i = slot_home(s, a);
  for (;;) {
    ta_block *b = &s->slots[i];
    if (b->addr == a) return b;
    if (b->addr == 0) return NULL;
    i = (i + 1) & s->mask;
  }
}

/* Inserts a record; the address must not be in the table. */
static inline ta_block *slot_insert(shard *s, uintptr_t a) {
  /* Load <= 3/4: even at 3/4 a hit probes 2.5 slots on average (two
   * records a line), a miss 8.5; the tables of test_table_shape and of
   * python3, between 3/8 and 3/4, probe 1.2 to 1.4.  At 1/2 a record cost
   * 64 to 128 bytes of table: python3 with PYTHONMALLOC=malloc 110 MB peak
   * RSS, 86 MB at 3/4, in the same time. */
  if (s->slots == NULL || (uint64_t)(s->used + 1) * 4 > (uint64_t)(s->mask + 1) * 3)
    if (!_ta_live_grow(s)) return NULL;
  uint32_t i = slot_home(s, a);
  while (s->slots[i].addr) i = (i + 1) & s->mask;
  s->used++;
  s->slots[i].addr = a;
  return &s->slots[i];
}

/* The record of a, made if missing (one probe where a find and then an
 * insert were two): a new block's.  An address can be in the table
 * already only where the ledger missed a free (a deferred free the shim
 * had to drop); the new block takes the record over. */
static inline ta_block *slot_claim(shard *s, uintptr_t a) {
  if (s->slots == NULL || (uint64_t)(s->used + 1) * 4 > (uint64_t)(s->mask + 1) * 3)
    if (!_ta_live_grow(s)) return s->slots ? slot_find(s, a) : NULL;
  uint32_t i = slot_home(s, a);
  for (;;) {
    ta_block *b = &s->slots[i];
    if (b->addr == a) return b;
    if (b->addr == 0) {
      s->used++;
      b->addr = a;
      return b;
    }
    i = (i + 1) & s->mask;
  }
}

/* Puts back a record slot_remove just took out, under the same lock (or
 * solo section): the table has room (one record fewer than it held), so it
 * neither grows nor fails. */
static inline void slot_put_back(shard *s, const ta_block *r) {
  uint32_t i = slot_home(s, r->addr);
  while (s->slots[i].addr) i = (i + 1) & s->mask;
  s->used++;
  s->slots[i] = *r;
}

static inline void slot_remove(shard *s, ta_block *b) {
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

#endif
