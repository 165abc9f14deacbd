/* live.c - the live table (live.h): its shards, their growth, and its
 * queries for the rest of the ledger (a block by address, containing an
 * address, flags, every live block, the table's shape).  Allocation and
 * free (ledger.c) use the inline probes of live.h. */
#include "block.h"
#include "live.h"

shard _ta_shards[NSHARDS] __attribute__((aligned(64)));

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
bool _ta_live_grow(shard *s) {
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

/* ---- the table for the rest of the ledger ----------------------------------- */

/* The solo thread looks without the lock (a realloc looks its block up
 * first: a locked instruction each). */
bool _ta_block_live(uintptr_t a, ta_block *out) {
  ta_thread *t = _ta_self;
  shard *s = shard_of(a);
  bool solo = t != NULL && _ta_solo_enter(t);
  shard_lock_if(s, solo);
  ta_block *b = slot_find(s, a);
  if (b) *out = *b;
  shard_unlock_if(s, solo);
  if (t != NULL) _ta_solo_leave(t, solo);
  return b != NULL;
}

bool _ta_block_get(uintptr_t a, ta_block *out) {
  return _ta_block_live(a, out) || _ta_quarantine_find(a, false, out);
}

bool _ta_block_find(uintptr_t p, ta_block *out) {
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
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
  return _ta_quarantine_find(p, true, out);
}

void _ta_block_flag(uintptr_t a, uint8_t flags) {
  shard *s = shard_of(a);
  shard_lock(s);
  ta_block *b = slot_find(s, a);
  if (b && b->state == TA_LIVE) b->flags |= flags;
  shard_unlock(s);
}

/* One probe of the live table: is a the start of a live block of tag or alt? */
bool _ta_block_check(uintptr_t a, ta_tag tag, ta_tag alt) {
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

void _ta_table_shape(uint64_t *records, uint64_t *slots, uint64_t *displaced) {
  uint64_t r = 0, n = 0, d = 0;
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
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
  for (int i = 0; i < NSHARDS; i++) shard_lock(&_ta_shards[i]);
}

void _ta_block_unlock_all(void) {
  for (int i = NSHARDS - 1; i >= 0; i--) shard_unlock(&_ta_shards[i]);
}

void _ta_block_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg) {
  for (int i = 0; i < NSHARDS; i++) {
    shard *s = &_ta_shards[i];
    if (!locked) shard_lock(s);
    for (uint32_t j = 0; s->slots && j <= s->mask; j++)
      if (s->slots[j].addr && s->slots[j].state == TA_LIVE) fn(&s->slots[j], arg);
    if (!locked) shard_unlock(s);
  }
}
