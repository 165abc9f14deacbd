/* live.h - the live table's shards and their probes, shared by live.c (the
 * table, its growth, its queries for the rest of the ledger) and ledger.c
 * (allocation and free); never included elsewhere (but by test_alloc,
 * which checks the records' packing).  Inline, as they were
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

/* A live block's record in the table: 24 bytes, where ta_block (the
 * quarantine's record, the copy the rest of the ledger is handed) is 32.
 * The table holds live blocks only, so it needs no state and no free
 * stack (a freed block's record leaves the table for the quarantine, which
 * adds them); what is left is packed into three words:
 *
 *   w[0]: addr >> 3 (45 bits) | flags (3) | tag (8) | seq bits 48..55 (8)
 *   w[1]: size (48 bits)                    | seq bits 32..47 (16)
 *   w[2]: seq bits 0..31                    | stack (32)
 *
 * Every block the table records is at least 8-byte aligned (jemalloc's
 * smallest class, guard mode's and arenas' 16) and below 2^48; an address
 * that is not has no record (slot_key_ok), and an interior pointer can
 * never match its block's key.  A tag is below TA_MAX_TAGS (256).  The
 * whole w[0] is 0 in an empty slot.  The tree of 2^20 nodes of 24 bytes:
 * 64 MB of table in 32-byte records, 37.7 MB in these were its shards
 * evenly filled (with the capacities below); measured, 48 to 55 MB, run
 * to run: its shards' records come in lumps of a 64 KiB region's 2048
 * nodes, about two lumps a shard, and a shard's table is sized by its
 * fullest moment in the run (tables never shrink): 1.05M records in 2.0
 * to 2.3M slots, about half full (bench/auditor/README.md, "The live
 * table's memory"). */
typedef struct { uint64_t w[3]; } ta_slot;
_Static_assert(sizeof(ta_slot) == 24, "a table record is 24 bytes");
_Static_assert(TA_MAX_TAGS <= 256, "a tag fits a table record's 8 bits");

#define SLOT_KEY_BITS 45
#define SLOT_KEY_MASK ((UINT64_C(1) << SLOT_KEY_BITS) - 1)
#define SLOT_LOW32    UINT64_C(0xFFFFFFFF)
#define SLOT_SIZE_MASK ((UINT64_C(1) << 48) - 1)

/* Can a block at a be recorded (8-byte aligned, below 2^48)? */
static inline bool slot_key_ok(uintptr_t a) { return a != 0 && ((uint64_t)a & UINT64_C(0xFFFF000000000007)) == 0; }
static inline uint64_t slot_key(uintptr_t a) { return (uint64_t)a >> 3; }

static inline uintptr_t slot_addr(const ta_slot *r) { return (uintptr_t)((r->w[0] & SLOT_KEY_MASK) << 3); }
static inline bool slot_empty(const ta_slot *r) { return r->w[0] == 0; }
static inline uint8_t slot_flags(const ta_slot *r) { return (uint8_t)((r->w[0] >> SLOT_KEY_BITS) & 7); }
static inline ta_tag slot_tag(const ta_slot *r) { return (ta_tag)((r->w[0] >> 48) & 0xFF); }
static inline uint64_t slot_size(const ta_slot *r) { return r->w[1] & SLOT_SIZE_MASK; }
static inline uint32_t slot_stack(const ta_slot *r) { return (uint32_t)(r->w[2] >> 32); }
static inline uint64_t slot_seq(const ta_slot *r) {
  return (r->w[0] >> 56) << 48 | (r->w[1] >> 48) << 32 | (r->w[2] & SLOT_LOW32);
}

static inline void slot_set_flags(ta_slot *r, uint8_t flags) {
  r->w[0] = (r->w[0] & ~((uint64_t)7 << SLOT_KEY_BITS)) | (uint64_t)(flags & 7) << SLOT_KEY_BITS;
}

/* A whole record (a must be slot_key_ok; size < 2^48, seq < 2^56). */
static inline void slot_set(ta_slot *r, uintptr_t a, uint64_t size, ta_tag tag, uint64_t seq, uint8_t flags,
                            uint32_t stack) {
  r->w[0] = slot_key(a) | (uint64_t)(flags & 7) << SLOT_KEY_BITS | (uint64_t)(tag & 0xFF) << 48 |
            (seq >> 48 & 0xFF) << 56;
  r->w[1] = (size & SLOT_SIZE_MASK) | (seq >> 32 & 0xFFFF) << 48;
  r->w[2] = (seq & SLOT_LOW32) | (uint64_t)stack << 32;
}

/* A new birth in place (realloc in place): size, seq and stack. */
static inline void slot_rebirth(ta_slot *r, uint64_t size, uint64_t seq, uint32_t stack) {
  r->w[0] = (r->w[0] & ~(UINT64_C(0xFF) << 56)) | (seq >> 48 & 0xFF) << 56;
  r->w[1] = (size & SLOT_SIZE_MASK) | (seq >> 32 & 0xFFFF) << 48;
  r->w[2] = (seq & SLOT_LOW32) | (uint64_t)stack << 32;
}

/* The record as the rest of the ledger sees it: live, no free stack. */
static inline void slot_load(const ta_slot *r, ta_block *out) {
  *out = (ta_block){ .addr = slot_addr(r), .size = slot_size(r), .tag = slot_tag(r), .seq = slot_seq(r),
                     .state = TA_LIVE, .flags = slot_flags(r), .stack = slot_stack(r) };
}

static inline void slot_store(ta_slot *r, const ta_block *b) {
  slot_set(r, b->addr, b->size, (ta_tag)b->tag, b->seq, (uint8_t)b->flags, b->stack);
}

/* One cache line each (a hand-counted pad once made them 72 bytes: every
 * other shard straddled two lines). */
typedef struct {
  _Atomic int lock;
  uint32_t cap;               /* slots; 0 before first use */
  uint32_t used;
  uint32_t grow_at;           /* used records that fill it (3/4 of cap); 0 before first use */
  ta_slot *slots;
} __attribute__((aligned(64))) shard;
_Static_assert(sizeof(shard) == 64, "a shard is one cache line");

extern TA_HIDDEN shard _ta_shards[NSHARDS];
/* Grows s (a first use: 8 slots); false when out of memory (live.c). */
bool _ta_live_grow(shard *s);

/* The shard of a block: by its 64 KiB region, so that the blocks of a few
 * neighbouring jemalloc slab pages (one thread's, mostly) share a shard,
 * and a small heap touches few shards' lines.  (Until the table's records
 * were packed, a comment here said 4 KiB pages, but the hash shifted the
 * page number by 4 more: it was 64 KiB, and what was measured as "64 KiB
 * regions" against it, 3% faster on churn with 4 threads and the tree's
 * peak RSS 226 -> 257 MB, was 1 MiB.)  By the page, churn's 150 pages of
 * blocks spread over all 256 shards, whose lines missed the L1 cache 0.9
 * times a free and an allocation (cachegrind) where 64 KiB regions
 * missed 0.1.  By 64 KiB regions, the tree's shards get its records in
 * lumps of 2048 (a region of its 32-byte nodes), about two a shard, and
 * its table is 50.5 to 52.3 MB, 2.1M slots for 1.05M records.  By 16 KiB
 * regions it was 42.7 to 45.2 MB, but the tree took 20% more CPU (user
 * time 7.59, 7.60, 8.08 s against 6.01, 6.19, 7.46 s, interleaved, no
 * other job) for 5 MB of peak RSS: taken back.  By 2 MiB regions, the 4
 * threads shared a few shards' locks, 1.33 s. */
static inline shard *shard_of(uintptr_t a) {
  uint64_t h = ((uint64_t)a >> 16) * 0x9E3779B97F4A7C15ull;
  return &_ta_shards[(h ^ (h >> 31)) >> 56];
}

/* The home slot of a record: the product of its address over 16 and the
 * golden ratio, its top bits scaled to the shard's capacity (any
 * capacity, not only powers of two: _ta_live_grow grows by 3/2 and 4/3
 * in turn).  A product's top
 * bits depend on every bit of the address (its low bits only on the
 * address's own low bits, which a slab's blocks share in patterns): a find
 * probed 1.4 slots on average, where the low bits made it 4.7 (python3
 * with PYTHONMALLOC=malloc; the tree 1.5 for 4.9, the churn 1.5 for 2.2).
 * Over 16, not 8 (the key): the blocks of a slab, 16-byte aligned, then
 * take consecutive multiples of the golden ratio, which spread evenly;
 * test_table_shape's records sat 0.47 slots past home on average, 0.92
 * hashed by the key.  Two 8-byte blocks of one 16 bytes share a home. */
static inline uint64_t slot_hash(uint64_t key) { return (key >> 1) * 0x9E3779B97F4A7C15ull; }
/* The product's top bits scaled to cap: one multiply's high word. */
static inline uint32_t slot_index(uint64_t hash, uint32_t cap) { return (uint32_t)(((unsigned __int128)hash * cap) >> 64); }

/* The home slot of a in s as s is now (_ta_live_grow places records by
 * the new capacity). */
static inline uint32_t slot_home(const shard *s, uintptr_t a) { return slot_index(slot_hash(slot_key(a)), s->cap); }

/* Starts loading the slot where a's record would be, as
 * _ta_block_prefetch (live.c) does, inline on the allocation path: a hint,
 * read without the lock (the table may grow meanwhile). */
static inline void slot_prefetch(uintptr_t a) {
  const shard *s = shard_of(a);
  const ta_slot *slots = s->slots;
  if (slots) __builtin_prefetch(&slots[slot_home(s, a)]);
}

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

#define SLOT_NONE UINT32_MAX

/* The index of a's record in s, or SLOT_NONE: for a removal that follows
 * (slot_remove_at), which then needs no division of a pointer
 * difference by 24 to learn it. */
static inline uint32_t slot_find_index(const shard *s, uintptr_t a) {
  if (s->slots == NULL || !slot_key_ok(a)) return SLOT_NONE;
  uint64_t k = slot_key(a);
  uint32_t i = slot_index(slot_hash(k), s->cap);
  for (;;) {
    uint64_t w = s->slots[i].w[0];
    if ((w & SLOT_KEY_MASK) == k) return i;
    if (w == 0) return SLOT_NONE;
    if (++i == s->cap) i = 0;
  }
}

static inline ta_slot *slot_find(shard *s, uintptr_t a) {
  if (s->slots == NULL || !slot_key_ok(a)) return NULL;
  uint64_t k = slot_key(a);
  uint32_t i = slot_index(slot_hash(k), s->cap);
  for (;;) {
    ta_slot *r = &s->slots[i];
    uint64_t w = r->w[0];
    if ((w & SLOT_KEY_MASK) == k) return r;
    if (w == 0) return NULL;
    if (++i == s->cap) i = 0;
  }
}

/* Load <= 3/4: even at 3/4 a hit probes 2.5 slots on average, a miss 8.5;
 * the tables of test_table_shape and of python3, between 3/8 and 3/4,
 * probed 1.2 to 1.4.  At 1/2 a record cost 64 to 128 bytes of table:
 * python3 with PYTHONMALLOC=malloc 110 MB peak RSS, 86 MB at 3/4, in the
 * same time.  Growing by 3/2 and 4/3 in turn (8, 12, 16, 24, ...), a
 * table is between 1/2 and 3/4 full, where doubling left it between 3/8
 * and 3/4. */
static inline bool slot_room(const shard *s) { return s->used < s->grow_at; }

/* Inserts a record's slot for a (slot_key_ok); a must not be in the
 * table.  The caller fills the record. */
static inline ta_slot *slot_insert(shard *s, uintptr_t a) {
  if (!slot_key_ok(a) || (!slot_room(s) && !_ta_live_grow(s))) return NULL;
  uint32_t i = slot_home(s, a);
  while (!slot_empty(&s->slots[i]))
    if (++i == s->cap) i = 0;
  s->used++;
  return &s->slots[i];
}

/* The record of a, made if missing (one probe where a find and then an
 * insert were two): a new block's.  An address can be in the table
 * already only where the ledger missed a free (a deferred free the shim
 * had to drop); the new block takes the record over.  NULL: out of
 * memory, or an address no record can hold (slot_key_ok). */
static inline ta_slot *slot_claim(shard *s, uintptr_t a) {
  if (!slot_key_ok(a)) return NULL;
  if (!slot_room(s) && !_ta_live_grow(s)) return slot_find(s, a);
  uint64_t k = slot_key(a);
  uint32_t i = slot_index(slot_hash(k), s->cap);
  for (;;) {
    ta_slot *r = &s->slots[i];
    uint64_t w = r->w[0];
    if ((w & SLOT_KEY_MASK) == k) return r;
    if (w == 0) {
      s->used++;
      return r;
    }
    if (++i == s->cap) i = 0;
  }
}

/* Puts back a record slot_remove just took out, under the same lock (or
 * solo section): the table has room (one record fewer than it held), so it
 * neither grows nor fails. */
static inline void slot_put_back(shard *s, const ta_block *b) {
  uint32_t i = slot_home(s, b->addr);
  while (!slot_empty(&s->slots[i]))
    if (++i == s->cap) i = 0;
  s->used++;
  slot_store(&s->slots[i], b);
}

/* Puts back a record's words that a free took out under the same lock
 * (block_free_plain: its pad was written), as slot_put_back does. */
static inline void slot_put_back_words(shard *s, const ta_slot *saved) {
  uint32_t i = slot_home(s, slot_addr(saved));
  while (!slot_empty(&s->slots[i]))
    if (++i == s->cap) i = 0;
  s->used++;
  s->slots[i] = *saved;
}

static inline void slot_remove_at(shard *s, uint32_t i) {
  uint32_t j = i, cap = s->cap;
  s->used--;
  for (;;) {
    s->slots[i].w[0] = 0;
    for (;;) {
      if (++j == cap) j = 0;
      uint64_t w = s->slots[j].w[0];
      if (w == 0) return;
      uint32_t home = slot_index(slot_hash(w & SLOT_KEY_MASK), cap);
      /* Can the entry at j move to the hole at i?  Only if its home is not
       * in the cyclic range (i, j]. */
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
    }
    s->slots[i] = s->slots[j];
    i = j;
  }
}

static inline void slot_remove(shard *s, ta_slot *r) { slot_remove_at(s, (uint32_t)(r - s->slots)); }

#endif
