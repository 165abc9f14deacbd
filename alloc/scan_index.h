/* scan_index.h - which block does a word point into?  The reachability scan
 * (scan.c) asks this for every word of every root and reached block: millions
 * of words per scan, most of them small integers or pointers to code, data and
 * stacks, that point into no block.
 *
 * The blocks are kept as two sorted arrays (starts and ends); a binary search
 * over them is the answer.  In front of it, a hash set of the 1 MiB regions
 * that hold a block, each with a 64-bit map of its 16 KiB pieces that hold one
 * and the index range of the blocks that overlap it: a word outside every
 * block is, most of the time, turned away by one hash probe or one bit, and a
 * word inside a region is searched for among that region's blocks only.
 *
 * The answer is exactly that of the binary search over all blocks (the region
 * table only narrows it).  When the blocks overlap, an end wraps around, or
 * the blocks span more regions than TA_BX_MAX_REGIONS, there is no table and
 * every lookup is that binary search.
 *
 * Internal to alloc/.  Memory comes from mmap: a scan builds this while the
 * other threads are stopped, and must not call the allocator. */
#ifndef TA_SCAN_INDEX_H
#define TA_SCAN_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TA_BX_REGION_SHIFT 20                  /* 1 MiB regions ... */
#define TA_BX_PIECE_SHIFT  (TA_BX_REGION_SHIFT - 6)   /* ... of 64 pieces of 16 KiB */
#define TA_BX_MAX_REGIONS  ((size_t)1 << 18)   /* blocks over 256 GiB: no table */
#define TA_BX_EMPTY        UINTPTR_MAX         /* no region number is this */

typedef struct {
  uintptr_t key;            /* region number (address >> TA_BX_REGION_SHIFT) */
  uint64_t pieces;          /* bit j: a block overlaps piece j of the region */
  uint32_t lo, hi;          /* the blocks that overlap the region: [lo, hi) */
} ta_bx_slot;

typedef struct {
  uintptr_t *addr;          /* starts, ascending; filled by the caller */
  uintptr_t *end;           /* addr + size (a block of size 0 counts as 1 byte) */
  size_t n;
  ta_bx_slot *slots;        /* the region table, NULL when there is none */
  size_t nslots;            /* a power of two */
  unsigned shift;           /* 64 - log2(nslots) */
  size_t nregions;
  bool own;                 /* addr[] and end[] were mapped here */
} ta_bindex;

/* Room for n blocks (addr[] and end[], n at most 2^32 - 1): in mem, the
 * caller's (2 * n words, kept until _ta_bindex_free), or mapped when mem is
 * NULL; false when memory is short.  The caller then fills addr[] in ascending order and
 * end[], and calls _ta_bindex_build. */
bool _ta_bindex_init(ta_bindex *x, size_t n, void *mem);
/* Builds the region table, when the blocks allow one (see above): true if
 * it did. */
bool _ta_bindex_build(ta_bindex *x);
void _ta_bindex_free(ta_bindex *x);

/* Sorts n elements of elem bytes, each starting with a uintptr_t key, by
 * that key (stable: an LSD radix sort); tmp has room for n elements. */
void _ta_sort_by_key(void *v, size_t n, size_t elem, void *tmp);

static inline size_t _ta_bx_hash(const ta_bindex *x, uintptr_t key) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> x->shift);
}

/* Index of the block containing p, or -1. */
static inline long _ta_bindex_find(const ta_bindex *x, uintptr_t p) {
  size_t lo = 0, hi = x->n;
  if (x->slots) {
    uintptr_t key = p >> TA_BX_REGION_SHIFT;
    size_t h = _ta_bx_hash(x, key), mask = x->nslots - 1;
    const ta_bx_slot *s;
    for (;; h = (h + 1) & mask) {
      s = &x->slots[h];
      if (s->key == key) break;
      if (s->key == TA_BX_EMPTY) return -1;
    }
    if (!((s->pieces >> ((p >> TA_BX_PIECE_SHIFT) & 63)) & 1)) return -1;
    lo = s->lo;
    hi = s->hi;
  }
  const uintptr_t *a = x->addr, *e = x->end;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p < a[mid]) hi = mid;
    else if (p >= e[mid]) lo = mid + 1;
    else return (long)mid;
  }
  return -1;
}

#endif
