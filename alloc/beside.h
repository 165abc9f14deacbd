/* beside.h - records beside their blocks: the default mode's small blocks
 * keep their record in the 16 bytes before them, not in the live table.
 *
 * Why.  In the preload's leaks mode (tagalloc run's default) a plain
 * allocation and its free were a find, an insert and a removal in the live
 * table (live.h), whose slot is a line of its own that the program never
 * touches: on a churn of small blocks the table was 18% of the
 * instructions and a fifth of the cache misses, on a tree of 2^20 nodes
 * freed long after they were made a miss of its own at every free.  A
 * record beside the block is on the line the program itself writes, and
 * a free reads it with the pad past the block's end.
 *
 * Which blocks.  Where _ta_beside_on (the preload, leaks mode, no guard
 * mode, no trace, jemalloc's size classes as class_of computes them,
 * TAGALLOC_BESIDE not off): malloc, calloc, operator new and realloc's new
 * blocks of at most BESIDE_MAX (4,080) bytes, whose 16 more stay within
 * jemalloc's classes of up to a page.  The 16 bytes push a block one class
 * up at most (a 1 KiB block takes 1,280 bytes, a 24-byte one 48 where it
 * took 32), where the table's record took 24 bytes in a table kept under
 * three quarters full.  The rest (aligned allocations, bigger blocks, the
 * training stack's ta_alloc) stay in the table: 4 KiB + 16
 * bytes would be a 5 KiB block, and the table's record costs a big block
 * little.
 *
 * The layout.  jemalloc's block is raw; the program's starts 16 bytes in:
 *
 *   raw             raw + 16 = a                   a + size
 *   | w0 | w1 |     | the program's bytes ...       | pad | class slack |
 *
 *   w0: size (12 bits) | flags (2: TA_F_REF, TA_F_HOLD) | tag (8)
 *       | seq bits 32..47 (16) | check (26)
 *   w1: seq bits 0..31 (32) | stack (32)
 *
 * The pad is the class slack past a + size, at most TA_PAD_MAX bytes, as
 * for a table block (block.h), with the class of size + 16.  check is a
 * hash of the address and the other 102 bits: a header that an overflow
 * of the block before it (past that block's pad and slack) or a write
 * before this block changed fails it but once in 2^26, and is reported
 * (heap.overflow, "the record before the block was written") and freed by
 * jemalloc's own size, never by the size it read; a block whose record
 * was written and that is never freed is still a live block to the exit
 * scan, of jemalloc's size, with no stack.
 *
 * Which addresses are blocks.  A bitmap, a bit for every 16 bytes of the
 * address space, set while a block with a record beside it starts there:
 * a double free, a free of an interior pointer or of memory the ledger
 * never handed out finds its bit clear and goes the table's way, which
 * says which it is, exactly as before.  It is made of one 8 MiB mapping
 * (MAP_NORESERVE: only its touched pages cost memory, 4 KiB for 512 KiB
 * of heap) for each GiB of address space that holds such a block, found
 * through a directory of 2^17 pointers.  A bitmap word covers 1 KiB, within
 * one 64 KiB region, so within one shard of the live table: the shard's
 * lock (or solo mode) guards the word and the headers of its blocks, as it
 * guards the table's slots, and the rest of the ledger's readers
 * (_ta_block_live, _ta_block_each, ...) see records beside blocks under
 * the same locks (live.c). */
#ifndef TAGALLOC_BESIDE_H
#define TAGALLOC_BESIDE_H

#include "block.h"
#include "live.h"

#define BESIDE_HDR   16u
#define BESIDE_MAX   ((size_t)TA_BESIDE_MAX)   /* 4080: size + 16 <= 4096 */
_Static_assert(TA_BESIDE_MAX + 16 <= 4096, "a record beside its block fits 12 bits of size");
#define BESIDE_REGION_SHIFT 30           /* a bitmap maps 1 GiB */
#define BESIDE_DIR   ((size_t)1 << (47 - BESIDE_REGION_SHIFT))
#define BESIDE_SEQ_BITS 48

/* The bitmaps: [a >> 30] -> 2^20 words (8 MiB), NULL where none was needed. */
extern TA_HIDDEN _Atomic(uint64_t *) _ta_beside_dir[BESIDE_DIR];

/* _ta_init: decides _ta_beside_on. */
void _ta_beside_init(void);
/* The bitmap word of a, its bitmap made where none was (NULL: out of memory). */
uint64_t *_ta_beside_map(uintptr_t a);
/* Marks the page of bits that holds a's bit as written (for the walks). */
void _ta_beside_touch(uintptr_t a);
/* For live.c: fn on each live block with its record beside it (locked:
 * the caller holds every shard's lock); the record of the block at a
 * (under a's shard lock); the block p points into. */
void _ta_beside_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg);
bool _ta_beside_get_locked(uintptr_t a, ta_block *out);
bool _ta_beside_find(uintptr_t p, ta_block *out);
/* fork: the bitmaps' lock, taken before and released after (init.c). */
void _ta_beside_fork(int phase);

/* The word of a's bit, or NULL where no bitmap covers it. */
static inline uint64_t *beside_word(uintptr_t a) {
  if (TA_UNLIKELY(a >> 47)) return NULL;
  uint64_t *m = atomic_load_explicit(&_ta_beside_dir[a >> BESIDE_REGION_SHIFT], memory_order_acquire);
  if (m == NULL) return NULL;
  return &m[(a & (((uintptr_t)1 << BESIDE_REGION_SHIFT) - 1)) >> 10];
}
static inline uint64_t beside_bit(uintptr_t a) { return (uint64_t)1 << ((a >> 4) & 63); }

/* Is a the start of a block with its record beside it?  Under a's shard
 * lock (or solo), or as a hint. */
static inline bool beside_is(uintptr_t a) {
  if (a & 15) return false;
  const uint64_t *w = beside_word(a);
  return w != NULL && (*(const volatile uint64_t *)w & beside_bit(a)) != 0;
}

/* ---- the header ---------------------------------------------------------- */

#define BH_CHECK_SHIFT 38

static inline uint64_t beside_check(uintptr_t a, uint64_t w0_low, uint64_t w1) {
  uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ull ^ w0_low * 0xC2B2AE3D27D4EB4Full ^ w1 * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h >> BH_CHECK_SHIFT;                     /* 26 bits */
}

static inline void beside_write(uintptr_t a, uint64_t size, uint8_t flags, ta_tag tag, uint64_t seq, uint32_t stack) {
  uint64_t low = (size & 4095) | (uint64_t)(flags & 3) << 12 | (uint64_t)(tag & 0xFF) << 14 |
                 (seq >> 32 & 0xFFFF) << 22;
  uint64_t w1 = (seq & 0xFFFFFFFFu) | (uint64_t)stack << 32;
  uint64_t w0 = low | beside_check(a, low, w1) << BH_CHECK_SHIFT;
  memcpy((void *)(a - 16), &w0, 8);
  memcpy((void *)(a - 8), &w1, 8);
}

/* The header of the block at a, decoded: false where its check fails. */
typedef struct { uint64_t size, seq; uint32_t stack; uint8_t flags; ta_tag tag; } beside_rec;

static inline bool beside_read(uintptr_t a, beside_rec *r) {
  uint64_t w0, w1;
  memcpy(&w0, (const void *)(a - 16), 8);
  memcpy(&w1, (const void *)(a - 8), 8);
  uint64_t low = w0 & ((UINT64_C(1) << BH_CHECK_SHIFT) - 1);
  if (TA_UNLIKELY(beside_check(a, low, w1) != w0 >> BH_CHECK_SHIFT)) return false;
  r->size = low & 4095;
  r->flags = (uint8_t)(low >> 12 & 3);
  r->tag = (ta_tag)(low >> 14 & 0xFF);
  r->seq = (low >> 22 & 0xFFFF) << 32 | (w1 & 0xFFFFFFFFu);
  r->stack = (uint32_t)(w1 >> 32);
  return r->size <= BESIDE_MAX;
}

/* The record as the rest of the ledger sees it. */
static inline void beside_load(uintptr_t a, const beside_rec *r, ta_block *out) {
  *out = (ta_block){ .addr = a, .size = r->size, .tag = r->tag, .seq = r->seq, .state = TA_LIVE,
                     .flags = (uint8_t)(r->flags | TA_F_BESIDE), .stack = r->stack };
}

/* ---- the pad ------------------------------------------------------------- */

/* The pad past a block of size bytes with its record beside it: the slack
 * of the class of size + 16, at most TA_PAD_MAX. */
static inline size_t beside_pad_len(uint64_t size) {
  size_t n = (size_t)size + BESIDE_HDR;
  size_t slack = class_of(n) - n;
  return slack < TA_PAD_MAX ? slack : TA_PAD_MAX;
}

/* Either kind of block's pad length, by its record's flags. */
static inline size_t block_pad_len(uint64_t size, unsigned flags) {
  return (flags & TA_F_BESIDE) ? beside_pad_len(size) : pad_len(size);
}

/* ---- allocation and free (ledger.c) --------------------------------------- */

/* Can a block of size bytes have its record beside it now? */
static inline bool beside_fits(size_t size) {
  return TA_LIKELY(_ta_beside_on) && size <= BESIDE_MAX && TA_LIKELY(!_ta_tracing);
}

/* Gives back the memory of a block with its record beside it: with its
 * size where the record is known good, else by jemalloc's own. */
static inline void beside_raw_free(uintptr_t a, uint64_t size, bool known) {
  if (TA_LIKELY(known)) sdallocx((void *)(a - BESIDE_HDR), (size_t)size + BESIDE_HDR, 0);
  else dallocx((void *)(a - BESIDE_HDR), 0);
}

#endif
