/* scan_index.c - the block index of the reachability scan (scan_index.h). */
#include "internal.h"
#include "scan_index.h"

#include <string.h>
#include <sys/mman.h>

static void *map(size_t bytes) {
  void *v = _ta_sys_mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return v == MAP_FAILED ? NULL : v;
}

static void unmap(void *v, size_t bytes) {
  if (v) _ta_sys_munmap(v, bytes ? bytes : 1);
}

bool _ta_bindex_init(ta_bindex *x, size_t n, void *mem) {
  memset(x, 0, sizeof *x);
  if (n >= UINT32_MAX) return false;
  x->own = mem == NULL;
  x->addr = mem ? mem : map(n * 2 * sizeof(uintptr_t));
  if (x->addr == NULL) return false;
  x->end = x->addr + n;
  x->n = n;
  return true;
}

void _ta_bindex_free(ta_bindex *x) {
  if (x->own) unmap(x->addr, x->n * 2 * sizeof(uintptr_t));
  unmap(x->slots, x->nslots * sizeof(ta_bx_slot));
  memset(x, 0, sizeof *x);
}

/* The pieces of region `key` that [lo, hi) overlaps (hi > lo, and the
 * range meets the region). */
static uint64_t pieces_of(uintptr_t key, uintptr_t lo, uintptr_t hi) {
  uintptr_t rlo = key << TA_BX_REGION_SHIFT, rlast = rlo + (((uintptr_t)1 << TA_BX_REGION_SHIFT) - 1);
  uintptr_t first = lo > rlo ? lo : rlo, last = hi - 1 < rlast ? hi - 1 : rlast;
  unsigned j0 = (unsigned)((first >> TA_BX_PIECE_SHIFT) & 63), j1 = (unsigned)((last >> TA_BX_PIECE_SHIFT) & 63);
  return (~(uint64_t)0 >> (63 - j1)) & (~(uint64_t)0 << j0);
}

bool _ta_bindex_build(ta_bindex *x) {
  const uintptr_t *a = x->addr, *e = x->end;
  if (x->n == 0 || x->slots) return x->slots != NULL;
  /* How many regions; and whether the blocks are apart and end after they start. */
  size_t count = 0;
  uintptr_t last = TA_BX_EMPTY;
  for (size_t i = 0; i < x->n; i++) {
    if (e[i] <= a[i]) return false;                    /* wraps around */
    if (i && a[i] < e[i - 1]) return false;            /* overlaps the one before */
    uintptr_t r0 = a[i] >> TA_BX_REGION_SHIFT, r1 = (e[i] - 1) >> TA_BX_REGION_SHIFT;
    count += r1 - r0 + (r0 != last);
    last = r1;
    if (count > TA_BX_MAX_REGIONS) return false;
  }
  size_t nslots = 16;
  unsigned bits = 4;
  while (nslots < count * 2) { nslots *= 2; bits++; }
  ta_bx_slot *slots = map(nslots * sizeof *slots);
  if (slots == NULL) return false;
  for (size_t h = 0; h < nslots; h++) slots[h].key = TA_BX_EMPTY;
  x->slots = slots;
  x->nslots = nslots;
  x->shift = 64 - bits;
  x->nregions = count;
  /* Blocks in ascending order: a region's first visitor is its lowest block. */
  ta_bx_slot *s = NULL;
  for (size_t i = 0; i < x->n; i++) {
    uintptr_t r0 = a[i] >> TA_BX_REGION_SHIFT, r1 = (e[i] - 1) >> TA_BX_REGION_SHIFT;
    for (uintptr_t k = r0;; k++) {
      if (s == NULL || s->key != k) {                  /* regions come in ascending order too */
        size_t h = _ta_bx_hash(x, k);
        while (slots[h].key != TA_BX_EMPTY) h = (h + 1) & (nslots - 1);
        s = &slots[h];
        s->key = k;
        s->pieces = 0;
        s->lo = (uint32_t)i;
      }
      s->hi = (uint32_t)i + 1;
      s->pieces |= pieces_of(k, a[i], e[i]);
      if (k == r1) break;
    }
  }
  return true;
}

void _ta_sort_by_key(void *v, size_t n, size_t elem, void *tmp) {
  if (n < 2) return;
  uintptr_t any = 0, all = ~(uintptr_t)0;
  for (size_t i = 0; i < n; i++) {
    uintptr_t k;
    memcpy(&k, (char *)v + i * elem, sizeof k);
    any |= k;
    all &= k;
  }
  uintptr_t differ = any ^ all;          /* the bits that are not the same in every key */
  char *src = v, *dst = tmp;
  for (unsigned shift = 0; shift < 8 * sizeof(uintptr_t); shift += 8) {
    if (((differ >> shift) & 0xff) == 0) continue;
    size_t count[257] = { 0 };
    for (size_t i = 0; i < n; i++) {
      uintptr_t k;
      memcpy(&k, src + i * elem, sizeof k);
      count[((k >> shift) & 0xff) + 1]++;
    }
    for (int d = 0; d < 256; d++) count[d + 1] += count[d];
    for (size_t i = 0; i < n; i++) {
      uintptr_t k;
      memcpy(&k, src + i * elem, sizeof k);
      memcpy(dst + count[(k >> shift) & 0xff]++ * elem, src + i * elem, elem);
    }
    char *t = src;
    src = dst;
    dst = t;
  }
  if (src != v) memcpy(v, src, n * elem);
}
