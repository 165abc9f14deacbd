/* map.c - a small open-addressing map from an address to a pointer, for the
 * ledger's side tables (refcounts, holds).  Not thread-safe: each user holds
 * its own lock.  Memory is the ledger's own (meta). */
#include "internal.h"

static inline uint64_t key_hash(uintptr_t k) {
  uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

static bool map_grow(ta_map *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  ta_map_entry *n = _ta_meta_calloc(cap, sizeof *n);
  if (n == NULL) return false;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->v[i].key == 0) continue;
    size_t j = key_hash(m->v[i].key) & (cap - 1);
    while (n[j].key) j = (j + 1) & (cap - 1);
    n[j] = m->v[i];
  }
  _ta_meta_free(m->v);
  m->v = n;
  m->cap = cap;
  return true;
}

void *_ta_map_get(const ta_map *m, uintptr_t key) {
  if (m->cap == 0 || key == 0) return NULL;
  for (size_t i = key_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (m->v[i].key == key) return m->v[i].value;
    if (m->v[i].key == 0) return NULL;
  }
}

bool _ta_map_put(ta_map *m, uintptr_t key, void *value) {
  if (key == 0) return false;
  if ((m->n + 1) * 4 > m->cap * 3 && !map_grow(m)) return false;
  size_t i = key_hash(key) & (m->cap - 1);
  while (m->v[i].key && m->v[i].key != key) i = (i + 1) & (m->cap - 1);
  if (m->v[i].key == 0) m->n++;
  m->v[i].key = key;
  m->v[i].value = value;
  return true;
}

void *_ta_map_del(ta_map *m, uintptr_t key) {
  if (m->cap == 0 || key == 0) return NULL;
  size_t mask = m->cap - 1, i = key_hash(key) & mask;
  while (m->v[i].key != key) {
    if (m->v[i].key == 0) return NULL;
    i = (i + 1) & mask;
  }
  void *value = m->v[i].value;
  m->n--;
  size_t j = i;
  for (;;) {
    m->v[i].key = 0;
    m->v[i].value = NULL;
    for (;;) {
      j = (j + 1) & mask;
      if (m->v[j].key == 0) return value;
      size_t home = key_hash(m->v[j].key) & mask;
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
    }
    m->v[i] = m->v[j];
    i = j;
  }
}

void _ta_map_each(const ta_map *m, void (*fn)(uintptr_t key, void *value, void *arg), void *arg) {
  for (size_t i = 0; i < m->cap; i++)
    if (m->v[i].key) fn(m->v[i].key, m->v[i].value, arg);
}
