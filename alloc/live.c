/* live.c - the live table (live.h): its shards, their growth (a shard's
 * new table from the meta arena, the old one's pages given back as its
 * records are copied), and its queries for the rest of the ledger (a
 * block by address, containing an address, flags, every live block, the
 * table's shape).  Allocation and free (ledger.c) use the inline probes
 * of live.h. */
#include "block.h"
#include "beside.h"
#include "live.h"

shard _ta_shards[NSHARDS] __attribute__((aligned(64)));

/* Starts loading the table slot where a's record would be: a record of a
 * large live table is a cache miss (python3 with PYTHONMALLOC=malloc:
 * a third of its time), and the stack capture that comes before the table
 * (50-100 ns) hides it.  A hint: the table may grow meanwhile. */
void _ta_block_prefetch(const void *p) {
  uintptr_t a = (uintptr_t)p;
  const shard *s = shard_of(a);
  const ta_slot *slots = s->slots;
  if (slots) __builtin_prefetch(&slots[slot_home(s, a)]);
}

/* A shard starts with 8 slots and grows at three quarters load, by 3/2
 * from a power of two and by 4/3 from three times one (8, 12, 16, 24, 32,
 * ...): 256 shards of 64 were 655 KB zeroed in every process, however few
 * blocks it had.  (Steps taken in bytes instead, over the sizes the meta
 * arena allocates exactly (192, 256, 384, 512, ...: 8, 10, 16, 21, 32, 42
 * records), the 11% of every other table that the arena rounds up was
 * not lost, but the tree's table was 57 to 67 MB for 48 to 55 MB: its
 * shards' records come in lumps of a 64 KiB region's 2048 nodes, and
 * 5461 slots hold 4095 records, one short of two regions.) */
static uint32_t cap_next(uint32_t cap) {
  if (cap == 0) return 8;
  uint64_t n = (cap & (cap - 1)) == 0 ? (uint64_t)cap / 2 * 3 : (uint64_t)cap / 3 * 4;
  return n <= UINT32_MAX ? (uint32_t)n : 0;             /* 0: no bigger */
}

/* Growth copies the old table's records into the new one, and gives the
 * old table's pages back to the system as it goes, GIVE_STEP bytes at a
 * time: at any moment the shard holds the new table and at most GIVE_STEP
 * of the old one.  Freed into the meta arena without this, an old table
 * stayed resident until the arena reused its extent for something else
 * (the tree: 6 to 8 MB of old tables at its end, next to 48 to 55 MB of
 * live ones: the meta range's huge pages keep all of it resident).
 * Nothing reads the old table meanwhile: the shard is locked (or the
 * thread is solo); _ta_block_prefetch may load from it, which is a hint
 * and cannot fault.  Tables smaller than GIVE_MIN share their pages with
 * other allocations of the meta arena (its slabs) and are only freed. */
#define GIVE_STEP ((size_t)64 << 10)
#define GIVE_MIN  ((size_t)16 << 10)

/* Gives back the whole pages of old below byte upto of it that are not
 * given back yet (*done: the bytes of old below the first page not given
 * back). */
static void give_back(const ta_slot *old, size_t *done, size_t upto) {
  uintptr_t lo = ((uintptr_t)old + *done + 4095) & ~(uintptr_t)4095;
  uintptr_t hi = ((uintptr_t)old + upto) & ~(uintptr_t)4095;
  if (hi <= lo) return;
  _ta_meta_give_back((void *)lo, hi - lo);
  *done = hi - (uintptr_t)old;
}

bool _ta_live_grow(shard *s) {
  uint32_t cap = cap_next(s->slots ? s->cap : 0);
  ta_slot *n = cap ? _ta_meta_calloc(cap, sizeof *n) : NULL;
  if (n == NULL) return false;
  ta_slot *old = s->slots;
  if (old) {
    size_t bytes = (size_t)s->cap * sizeof *old, done = 0;
    bool give = bytes >= GIVE_MIN;
    uint32_t step = (uint32_t)(GIVE_STEP / sizeof *old);
    for (uint32_t i = 0; i < s->cap; i++) {
      if (give && i % step == step - 1) give_back(old, &done, (size_t)i * sizeof *old);
      const ta_slot *r = &old[i];
      if (slot_empty(r)) continue;
      uint32_t j = slot_index(slot_hash(r->w[0] & SLOT_KEY_MASK), cap);
      while (!slot_empty(&n[j]))
        if (++j == cap) j = 0;
      n[j] = *r;
    }
    if (give) give_back(old, &done, bytes);
    _ta_meta_free(old);
  }
  s->slots = n;
  s->cap = cap;
  s->grow_at = (uint32_t)((uint64_t)cap * 3 / 4);
  return true;
}

/* ---- the table for the rest of the ledger ----------------------------------- */

/* The solo thread looks without the lock (a realloc looks its block up
 * first: a locked instruction each). */
bool _ta_block_live(uintptr_t a, ta_block *out) {
  ta_thread *t = _ta_self;
  shard *s = shard_of(a);
  bool solo = t != NULL && _ta_solo_enter(t);
  shard_lock_if(s, solo);
  const ta_slot *r = slot_find(s, a);
  bool found = r != NULL;
  if (r) slot_load(r, out);
  else if (_ta_beside_on) found = _ta_beside_get_locked(a, out);
  shard_unlock_if(s, solo);
  if (t != NULL) _ta_solo_leave(t, solo);
  return found;
}

bool _ta_block_get(uintptr_t a, ta_block *out) {
  return _ta_block_live(a, out) || _ta_quarantine_find(a, false, out);
}

bool _ta_block_find(uintptr_t p, ta_block *out) {
  if (_ta_beside_on && _ta_beside_find(p, out)) return true;
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
    bool found = false;
    shard_lock(s);
    for (uint32_t j = 0; s->slots && j < s->cap && !found; j++) {
      const ta_slot *r = &s->slots[j];
      if (slot_empty(r)) continue;
      uintptr_t a = slot_addr(r);
      uint64_t size = slot_size(r);
      if (p < a || p >= a + (size ? size : 1)) continue;
      slot_load(r, out);
      found = true;
    }
    shard_unlock(s);
    if (found) return true;                    /* a live block wins over a quarantined one */
  }
  return _ta_quarantine_find(p, true, out);
}

void _ta_block_flag(uintptr_t a, uint8_t flags) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_slot *r = slot_find(s, a);
  if (r) slot_set_flags(r, slot_flags(r) | flags);
  else if (_ta_beside_on) {
    beside_rec b;
    if (beside_is(a) && beside_read(a, &b))     /* a refcount or a hold: the slow free */
      beside_write(a, b.size, (uint8_t)(b.flags | (flags & (TA_F_REF | TA_F_HOLD))), b.tag, b.seq, b.stack);
  }
  shard_unlock(s);
}

/* One probe of the live table: is a the start of a live block of tag or alt? */
bool _ta_block_check(uintptr_t a, ta_tag tag, ta_tag alt) {
  ta_thread *t = _ta_self;
  shard *s = shard_of(a);
  bool solo = t != NULL && _ta_solo_enter(t);
  shard_lock_if(s, solo);
  const ta_slot *r = slot_find(s, a);
  bool ok = r != NULL && (tag == TA_ANY || slot_tag(r) == tag || slot_tag(r) == alt);
  ta_block b;
  if (r == NULL && _ta_beside_on && _ta_beside_get_locked(a, &b))
    ok = tag == TA_ANY || b.tag == tag || b.tag == alt;
  shard_unlock_if(s, solo);
  if (t != NULL) _ta_solo_leave(t, solo);
  return ok;
}

void _ta_table_shape(uint64_t *records, uint64_t *slots, uint64_t *displaced) {
  uint64_t r = 0, n = 0, d = 0;
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
    shard_lock(s);
    for (uint32_t j = 0; s->slots && j < s->cap; j++) {
      if (slot_empty(&s->slots[j])) continue;
      uint32_t home = slot_home(s, slot_addr(&s->slots[j]));
      r++;
      d += j >= home ? j - home : j + s->cap - home;
    }
    if (s->slots) n += s->cap;
    shard_unlock(s);
  }
  *records = r;
  *slots = n;
  *displaced = d;
}

void _ta_block_lock_all(void) {
  for (int i = 0; i < NSHARDS; i++) shard_lock(&_ta_shards[i]);
}

void _ta_block_unlock_all(void) {
  for (int i = NSHARDS - 1; i >= 0; i--) shard_unlock(&_ta_shards[i]);
}

/* fn sees each live block's record as a ta_block (a copy: the table's
 * records are packed). */
void _ta_block_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg) {
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
    if (!locked) shard_lock(s);
    for (uint32_t j = 0; s->slots && j < s->cap; j++) {
      if (slot_empty(&s->slots[j])) continue;
      ta_block b;
      slot_load(&s->slots[j], &b);
      fn(&b, arg);
    }
    if (!locked) shard_unlock(s);
  }
  if (_ta_beside_on) _ta_beside_each(locked, fn, arg);
}
