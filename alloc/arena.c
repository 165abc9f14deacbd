/* arena.c - arenas: bump allocation in chunks, all blocks die at reset.
 *
 * Each arena allocation is a ledger block (tag, stack, counts), so ta_since
 * sees tape ops like any block and holds can point at them.  A reset drops
 * every block of the generation, poisons the used memory, makes holds to it
 * dangling, gives back chunks grown beyond the arena's capacity (a long
 * graph that was an exception does not keep its memory), and starts a new
 * generation.
 *
 * Arena generations.  A block's address is only good for the generation
 * that made it; a pointer kept across a reset and used after it is
 * arena.after-reset.  While the arena has not handed its memory out again
 * that is plain (the address is in no live block); once it has, the stale
 * pointer and a new block share one address and no check can tell them
 * apart.  So an arena made with TA_ARENA_ALTERNATE keeps two sets of chunks
 * and each generation uses the set the one before did not: the previous
 * generation's memory stays dead (poisoned, outside every live block) for
 * a whole generation, and a pointer kept from it is caught at its first use
 * in the next one.  The previous generation's blocks are remembered
 * (address, size, allocation stack) so that the finding names where the
 * stale object was made as well as where the reset that killed it was.
 * The chunk a stale pointer was found in is then retired: kept, dead and
 * out of use, so that the same pointer is caught at every later use too
 * instead of landing in a live block two generations on (a few chunks at
 * most: one per stale object found). */
#include "internal.h"

#include <jemalloc/jemalloc.h>
#include <string.h>

typedef struct chunk {
  uintptr_t base;
  size_t size, used;
  struct chunk *next;
} chunk;

typedef struct {
  uintptr_t addr;
  uint64_t size;
  uint32_t stack;            /* allocation stack */
} dead_block;

struct ta_arena {
  ta_tag tag;
  size_t capacity;
  unsigned flags;            /* TA_ARENA_* */
  chunk *chunks;             /* newest first */
  chunk *cur;
  chunk *other;              /* TA_ARENA_ALTERNATE: the previous generation's set (dead) */
  dead_block *dead;          /* the previous generation's blocks */
  size_t ndead, cap_dead;
  chunk *retired;            /* chunks a stale pointer was found in: kept dead for good */
  dead_block *rdead;         /* the blocks they held */
  size_t nrdead;
  uint64_t generation;       /* 1, 2, ... */
  uint32_t reset_stack;      /* where the latest reset happened */
  uintptr_t *blocks;         /* the current generation's blocks */
  size_t nblocks, cap_blocks;
  pthread_mutex_t lock;
  struct ta_arena *next, *prev;
};

static pthread_mutex_t arenas_lock = PTHREAD_MUTEX_INITIALIZER;
static ta_arena *arenas;

static chunk *chunk_new(size_t size) {
  chunk *c = _ta_meta_calloc(1, sizeof *c);
  void *mem = c ? mallocx(size, MALLOCX_ALIGN(64)) : NULL;
  if (mem == NULL) {
    _ta_meta_free(c);
    return NULL;
  }
  c->base = (uintptr_t)mem;
  c->size = size;
  return c;
}

TA_NOINLINE ta_arena *ta_arena_new(ta_tag tag, size_t capacity) {
  return ta_arena_new_flags(tag, capacity, 0);
}

TA_NOINLINE ta_arena *ta_arena_new_flags(ta_tag tag, size_t capacity, unsigned flags) {
  _ta_ensure();
  ta_arena *a = _ta_meta_calloc(1, sizeof *a);
  if (a == NULL) return NULL;
  a->tag = tag;
  a->capacity = capacity < 256 ? 256 : capacity;
  a->flags = flags & TA_ARENA_ALTERNATE;
  a->generation = 1;
  pthread_mutex_init(&a->lock, NULL);
  a->chunks = a->cur = chunk_new(a->capacity);
  if (a->chunks && (a->flags & TA_ARENA_ALTERNATE)) {
    a->other = chunk_new(a->capacity);
    if (a->other == NULL) {
      dallocx((void *)a->chunks->base, 0);
      _ta_meta_free(a->chunks);
      a->chunks = NULL;
    }
  }
  if (a->chunks == NULL) {
    _ta_meta_free(a);
    _ta_error(TA_ENOMEM, "ta_arena_new: out of memory for %zu bytes", capacity);
    return NULL;
  }
  pthread_mutex_lock(&arenas_lock);
  a->next = arenas;
  if (arenas) arenas->prev = a;
  arenas = a;
  pthread_mutex_unlock(&arenas_lock);
  return a;
}

/* ta_arena_alloc and ta_arena_alloc_at: a block made at stack. */
static void *arena_alloc(ta_arena *a, size_t size, uint32_t stack) {
  ta_thread *t = _ta_thread();
  size_t need = (size + 15) & ~(size_t)15;
  if (need == 0) need = 16;
  pthread_mutex_lock(&a->lock);
  chunk *c = a->cur;
  /* Chunks are filled in order (oldest first after a reset); take the next
   * one with room, or grow. */
  while (c && c->size - c->used < need) {
    chunk *n = NULL;
    for (chunk *k = a->chunks; k; k = k->next)
      if (k->next == c) n = k;          /* the chunk made after c */
    c = n;
  }
  if (c == NULL) {
    size_t size_new = need > a->capacity ? need : a->capacity;
    c = chunk_new(size_new);
    if (c == NULL) {
      pthread_mutex_unlock(&a->lock);
      _ta_error(TA_ENOMEM, "ta_arena_alloc: out of memory for %zu bytes", size);
      return NULL;
    }
    c->next = a->chunks;
    a->chunks = c;
  }
  a->cur = c;
  uintptr_t p = c->base + c->used;
  c->used += need;
  if (a->nblocks == a->cap_blocks) {
    size_t cap = a->cap_blocks ? a->cap_blocks * 2 : 64;
    uintptr_t *v = _ta_meta_realloc(a->blocks, cap * sizeof *v);
    if (v == NULL) {
      c->used -= need;
      pthread_mutex_unlock(&a->lock);
      return NULL;
    }
    a->blocks = v;
    a->cap_blocks = cap;
  }
  a->blocks[a->nblocks++] = p;
  pthread_mutex_unlock(&a->lock);
  _ta_block_add_arena(t, p, size, a->tag, stack);
  return (void *)p;
}

TA_NOINLINE void *ta_arena_alloc(ta_arena *a, size_t size) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  return arena_alloc(a, size, stack);
}

void *ta_arena_alloc_at(ta_arena *a, size_t size, uint32_t stack) {
  _ta_ensure();
  return arena_alloc(a, size, stack);
}

/* Drops the blocks of the generation, remembering them as the dead
 * generation's; a is locked. */
static void arena_drop(ta_thread *t, ta_arena *a, uint32_t stack) {
  if (a->cap_dead < a->nblocks) {
    dead_block *v = _ta_meta_realloc(a->dead, a->nblocks * sizeof *v);
    if (v) {
      a->dead = v;
      a->cap_dead = a->nblocks;
    }
  }
  a->ndead = 0;
  for (size_t i = 0; i < a->nblocks; i++) {
    ta_block b;
    bool known = _ta_block_get(a->blocks[i], &b);
    if (known && (b.flags & TA_F_HOLD)) _ta_hold_on_free(a->blocks[i], b.size, stack);
    if (known && a->ndead < a->cap_dead)
      a->dead[a->ndead++] = (dead_block){ a->blocks[i], b.size, b.stack };
    _ta_block_drop_arena(t, a->blocks[i], stack);
  }
  a->nblocks = 0;
  for (chunk *c = a->chunks; c; c = c->next) {
    memset((void *)c->base, (int)_ta_opt.poison, c->used);
    c->used = 0;
  }
}

/* Keeps the oldest chunks of *list up to limit bytes (at least one), gives
 * back the rest; returns the oldest kept (where filling starts). */
static chunk *chunks_trim(chunk **list, size_t limit) {
  size_t n = 0, kept = 0, k = 0;
  for (chunk *c = *list; c; c = c->next) n++;
  chunk *order[64], **v = n <= 64 ? order : _ta_meta_alloc(n * sizeof *v);
  if (v == NULL) {                        /* keep them all */
    chunk *oldest = NULL;
    for (chunk *c = *list; c; c = c->next) oldest = c;
    return oldest;
  }
  for (chunk *c = *list; c; c = c->next) v[n - 1 - k++] = c;   /* oldest first */
  *list = NULL;
  chunk *oldest = NULL;
  for (size_t i = 0; i < n; i++) {
    if (kept < limit) {
      kept += v[i]->size;
      v[i]->next = *list;
      *list = v[i];
      if (oldest == NULL) oldest = v[i];
    } else {
      dallocx((void *)v[i]->base, 0);
      _ta_meta_free(v[i]);
    }
  }
  if (v != order) _ta_meta_free(v);
  return oldest;
}

TA_NOINLINE void ta_arena_reset(ta_arena *a) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t stack = _ta_stack_capture(1);
  pthread_mutex_lock(&a->lock);
  size_t used = 0;
  for (chunk *c = a->chunks; c; c = c->next) used += c->used;
  arena_drop(t, a, stack);
  /* Keep the oldest chunks up to what this generation used (at least the
   * capacity); give back the rest.  A steady workload keeps its chunks; the
   * growth of an exceptional generation goes back at the next reset.  An
   * alternating arena trims both sets so (the next generation's set is
   * sized for what this one used), then takes the other set: this
   * generation's memory stays dead until the reset after the next. */
  size_t limit = used > a->capacity ? used : a->capacity;
  a->cur = chunks_trim(&a->chunks, limit);
  if (a->flags & TA_ARENA_ALTERNATE) {
    chunk *next = a->other;
    chunk *cur = chunks_trim(&next, limit);
    a->other = a->chunks;
    a->chunks = next;
    a->cur = cur;
    if (a->chunks == NULL) a->chunks = a->cur = chunk_new(a->capacity);
  }
  a->generation++;
  a->reset_stack = stack;
  uint64_t gen = a->generation;
  pthread_mutex_unlock(&a->lock);
  if (_ta_tracing) _ta_trace_arena_reset(t, (uintptr_t)a, gen, stack, _ta_seq_take(t, false));
}

TA_NOINLINE void ta_arena_free(ta_arena *a) {
  if (a == NULL) return;
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t stack = _ta_stack_capture(1);
  pthread_mutex_lock(&arenas_lock);
  if (a->prev) a->prev->next = a->next; else arenas = a->next;
  if (a->next) a->next->prev = a->prev;
  pthread_mutex_unlock(&arenas_lock);
  pthread_mutex_lock(&a->lock);
  arena_drop(t, a, stack);
  for (int set = 0; set < 3; set++)
    for (chunk *c = set == 2 ? a->retired : set ? a->other : a->chunks, *n; c; c = n) {
      n = c->next;
      dallocx((void *)c->base, 0);
      _ta_meta_free(c);
    }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  if (_ta_tracing) _ta_trace_arena_reset(t, (uintptr_t)a, 0, stack, _ta_seq_take(t, false));
  _ta_meta_free(a->blocks);
  _ta_meta_free(a->dead);
  _ta_meta_free(a->rdead);
  _ta_meta_free(a);
}

uint64_t ta_arena_generation(const ta_arena *a) { return a->generation; }

size_t ta_arena_capacity(const ta_arena *a) {
  size_t n = 0;
  pthread_mutex_lock((pthread_mutex_t *)&a->lock);
  for (chunk *c = a->chunks; c; c = c->next) n += c->size;
  for (chunk *c = a->other; c; c = c->next) n += c->size;
  pthread_mutex_unlock((pthread_mutex_t *)&a->lock);
  return n;
}

bool _ta_arena_lookup(uintptr_t p, uint64_t *gen, bool *live, ta_tag *tag, uint32_t *reset_stack) {
  bool found = false;
  pthread_mutex_lock(&arenas_lock);
  for (ta_arena *a = arenas; a && !found; a = a->next) {
    pthread_mutex_lock(&a->lock);
    for (int set = 0; set < 3 && !found; set++)
      for (chunk *c = set == 2 ? a->retired : set ? a->other : a->chunks; c; c = c->next) {
        if (p < c->base || p >= c->base + c->size) continue;
        *gen = a->generation;
        *live = set == 0 && p < c->base + c->used;
        *tag = a->tag;
        *reset_stack = a->reset_stack;
        found = true;
        break;
      }
    pthread_mutex_unlock(&a->lock);
  }
  pthread_mutex_unlock(&arenas_lock);
  return found;
}

bool _ta_arena_dead_block(uintptr_t p, uintptr_t *addr, uint64_t *size, uint32_t *stack) {
  bool found = false;
  pthread_mutex_lock(&arenas_lock);
  for (ta_arena *a = arenas; a && !found; a = a->next) {
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->ndead + a->nrdead; i++) {
      const dead_block *d = i < a->ndead ? &a->dead[i] : &a->rdead[i - a->ndead];
      if (p < d->addr || p >= d->addr + (d->size ? d->size : 1)) continue;
      *addr = d->addr;
      *size = d->size;
      *stack = d->stack;
      found = true;
      break;
    }
    pthread_mutex_unlock(&a->lock);
  }
  pthread_mutex_unlock(&arenas_lock);
  return found;
}

void _ta_arena_retire(uintptr_t p) {
  pthread_mutex_lock(&arenas_lock);
  for (ta_arena *a = arenas; a; a = a->next) {
    pthread_mutex_lock(&a->lock);
    chunk **link = &a->other, *c = NULL;
    for (; *link; link = &(*link)->next)
      if (p >= (*link)->base && p < (*link)->base + (*link)->size) break;
    if (*link) {
      c = *link;
      size_t n = 0;
      for (size_t i = 0; i < a->ndead; i++)
        if (a->dead[i].addr >= c->base && a->dead[i].addr < c->base + c->size) n++;
      dead_block *v = _ta_meta_realloc(a->rdead, (a->nrdead + n + 1) * sizeof *v);
      if (v) {
        a->rdead = v;
        for (size_t i = 0; i < a->ndead; i++)
          if (a->dead[i].addr >= c->base && a->dead[i].addr < c->base + c->size) v[a->nrdead++] = a->dead[i];
        /* out of the dead set (so out of the next generation), into the retired */
        *link = c->next;
        c->next = a->retired;
        a->retired = c;
        size_t k = 0;       /* the dead list keeps only blocks still in the sets */
        for (size_t i = 0; i < a->ndead; i++)
          if (!(a->dead[i].addr >= c->base && a->dead[i].addr < c->base + c->size)) a->dead[k++] = a->dead[i];
        a->ndead = k;
      }
    }
    pthread_mutex_unlock(&a->lock);
    if (c) break;
  }
  pthread_mutex_unlock(&arenas_lock);
}
