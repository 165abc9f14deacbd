/* beside.c - the bitmaps of the blocks whose records are beside them (see
 * beside.h): their mappings, and the walks over them for the rest of the
 * ledger (live.c).  The blocks themselves are made and freed in ledger.c. */
#include "beside.h"

bool _ta_beside_on;
_Atomic(uint64_t *) _ta_beside_dir[BESIDE_DIR];

#define BITMAP_BYTES ((size_t)1 << (BESIDE_REGION_SHIFT - 4 - 3))   /* 8 MiB */
#define SUMMARY_BYTES ((size_t)4096)
#define REGIONS_MAX 4096

/* The regions that have a bitmap, in the order they got it; each bitmap's
 * mapping starts with a page whose first 32 words say which of its 2048
 * pages of bits were ever written (a walk reads those pages only). */
static uint32_t region_dir[REGIONS_MAX];
static _Atomic uint32_t nregions;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;

void _ta_beside_init(void) {
  _ta_beside_on = _ta_opt.beside && _ta_opt.check == TA_CHECK_LEAKS && !_ta_guard_on && !_ta_tracing &&
                  !_ta_pad_use_nallocx && _ta_je_malloc != NULL;
}

uint64_t *_ta_beside_map(uintptr_t a) {
  uint64_t *w = beside_word(a);
  if (w) return w;
  if (a >> 47) return NULL;
  pthread_mutex_lock(&map_lock);
  size_t d = a >> BESIDE_REGION_SHIFT;
  if (atomic_load_explicit(&_ta_beside_dir[d], memory_order_relaxed) == NULL) {
    uint32_t n = atomic_load_explicit(&nregions, memory_order_relaxed);
    /* the ledger's own (_ta_mmap): never a root of the scan, whose words
     * could pass for pointers into the heap */
    void *m = n < REGIONS_MAX ? _ta_mmap(SUMMARY_BYTES + BITMAP_BYTES) : NULL;
    if (m != NULL) {
      region_dir[n] = (uint32_t)d;
      atomic_store_explicit(&nregions, n + 1, memory_order_release);
      atomic_store_explicit(&_ta_beside_dir[d], (uint64_t *)((char *)m + SUMMARY_BYTES), memory_order_release);
    }
  }
  pthread_mutex_unlock(&map_lock);
  return beside_word(a);
}

void _ta_beside_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&map_lock);
  else pthread_mutex_unlock(&map_lock);
}

void _ta_beside_touch(uintptr_t a) {
  uint64_t *bm = atomic_load_explicit(&_ta_beside_dir[a >> BESIDE_REGION_SHIFT], memory_order_relaxed);
  _Atomic uint64_t *summary = (_Atomic uint64_t *)((char *)bm - SUMMARY_BYTES);
  size_t page = (a & (((uintptr_t)1 << BESIDE_REGION_SHIFT) - 1)) >> (10 + 9);   /* 512 words a page */
  uint64_t bit = (uint64_t)1 << (page & 63);
  if (!(atomic_load_explicit(&summary[page >> 6], memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(&summary[page >> 6], bit, memory_order_relaxed);
}

/* Calls fn(a, word, arg) for each nonzero bitmap word, a being the address
 * its bit 0 stands for; locked: the caller holds every shard's lock; else
 * each word is read and handed over under its shard's lock. */
static void each_word(bool locked, void (*fn)(uintptr_t a, uint64_t word, void *arg), void *arg) {
  uint32_t n = atomic_load_explicit(&nregions, memory_order_acquire);
  for (uint32_t r = 0; r < n; r++) {
    uintptr_t base = (uintptr_t)region_dir[r] << BESIDE_REGION_SHIFT;
    uint64_t *bm = atomic_load_explicit(&_ta_beside_dir[region_dir[r]], memory_order_acquire);
    const _Atomic uint64_t *summary = (const _Atomic uint64_t *)((char *)bm - SUMMARY_BYTES);
    for (size_t sw = 0; sw < 32; sw++) {
      uint64_t pages = atomic_load_explicit(&summary[sw], memory_order_relaxed);
      while (pages) {
        size_t page = sw * 64 + (size_t)__builtin_ctzll(pages);
        pages &= pages - 1;
        for (size_t i = page * 512; i < page * 512 + 512; i++) {
          if (*(volatile uint64_t *)&bm[i] == 0) continue;
          uintptr_t a = base + ((uintptr_t)i << 10);
          shard *s = shard_of(a);
          if (!locked) shard_lock(s);
          uint64_t word = bm[i];
          if (word) fn(a, word, arg);
          if (!locked) shard_unlock(s);
        }
      }
    }
  }
}

typedef struct { void (*fn)(const ta_block *b, void *arg); void *arg; } each_ctx;

static void each_block(uintptr_t a, uint64_t word, void *arg) {
  each_ctx *c = arg;
  while (word) {
    uintptr_t b = a + ((uintptr_t)__builtin_ctzll(word) << 4);
    word &= word - 1;
    beside_rec r;
    ta_block out;
    if (beside_read(b, &r)) {
      beside_load(b, &r, &out);
    } else {
      /* a written record (told at its free, if the block is freed): still
       * a live block to the scan, of jemalloc's size, with no stack */
      size_t usable = sallocx((void *)(b - BESIDE_HDR), 0) - BESIDE_HDR;
      out = (ta_block){ .addr = b, .size = usable, .state = TA_LIVE, .flags = TA_F_BESIDE };
    }
    c->fn(&out, c->arg);
  }
}

void _ta_beside_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg) {
  if (atomic_load_explicit(&nregions, memory_order_acquire) == 0) return;
  each_ctx c = { fn, arg };
  each_word(locked, each_block, &c);
}

/* The record of the block with its record beside it that starts at a (the
 * caller holds a's shard lock or is solo). */
bool _ta_beside_get_locked(uintptr_t a, ta_block *out) {
  if (!beside_is(a)) return false;
  beside_rec r;
  if (!beside_read(a, &r)) return false;
  beside_load(a, &r, out);
  return true;
}

/* The block with its record beside it that p points into: the nearest
 * block start at or below p within BESIDE_MAX bytes (blocks do not
 * overlap, so no other can hold p). */
bool _ta_beside_find(uintptr_t p, ta_block *out) {
  if (atomic_load_explicit(&nregions, memory_order_acquire) == 0 || (p >> 47)) return false;
  uintptr_t lo = p > BESIDE_MAX ? p - BESIDE_MAX : 0;
  for (uintptr_t a = p & ~(uintptr_t)15;; a -= 16) {
    shard *s = shard_of(a);
    shard_lock(s);
    bool is = beside_is(a);
    beside_rec r;
    bool found = is && beside_read(a, &r) && p < a + (r.size ? r.size : 1);
    if (found) beside_load(a, &r, out);
    shard_unlock(s);
    if (is) return found;
    if (a < lo + 16 || a < 16) return false;
  }
}
