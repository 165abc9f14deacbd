/* pool.c - the caching device pool, as PyTorch's CUDA caching allocator
 * works (its rules are in gpu.h), with every segment and block on the ledger.
 *
 * A segment is one backend allocation; it is cut into blocks, each either
 * allocated (handed out), free (in its pool's free set) or pending (freed
 * by the program, waiting for events on the streams it was used on).
 * Neighbours in a segment are linked by prev/next; a freed block merges
 * with free neighbours, so a segment with nothing allocated or pending is
 * one free block again, and empty_cache gives it back.
 *
 *   segment [ptr .............................................. ptr+size)
 *           | block A (allocated) | block B (free) | block C (pending) |
 *           prev <-> next <-> ...
 *
 * Free sets are arrays sorted by (stream, size, address): a request takes
 * the first block at or after (its stream, its size), the best fit on its
 * stream.  Allocated blocks are found by address in a hash table.
 *
 * Ledger: each segment is a device block of tag "gpu.segment"
 * (TA_DEVICE_RESERVE), each allocated block one of tag "gpu.buffer", both
 * with the stack of the call that made them (the caller of gpu_pool_alloc).
 * A free of an address the pool did not hand out goes to the ledger, which
 * reports it (free.invalid, free.double).  At exit, each segment with no
 * allocated block is gpu.pool-retained. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"
#include "tagalloc.h"

#define K_LARGE_BUFFER ((size_t)20 << 20)   /* an oversize block serves requests within this of its size */

enum { SMALL = 0, LARGE = 1 };

typedef struct segment segment;

typedef struct block {
  uintptr_t     ptr;
  size_t        size;        /* rounded */
  size_t        requested;   /* asked for (allocated blocks) */
  gpu_stream    stream;      /* the stream it was allocated on */
  struct block *prev, *next; /* neighbours in the segment */
  segment      *seg;
  int           pool;        /* SMALL or LARGE */
  bool          allocated;
  bool          cached;      /* in its pool's free set */
  int           event_count; /* events still pending before it is free */
  gpu_stream   *uses;        /* other streams it was used on (record_stream) */
  int           n_uses, cap_uses;
} block;

struct segment {
  uintptr_t ptr;
  size_t    size;
  int       pool;
  int       live;        /* blocks allocated or pending */
  segment  *next_seg, *prev_seg;
};

typedef struct {
  block **v;
  size_t  n, cap;
} block_set;

typedef struct {
  gpu_event e;
  block    *b;
} pending;

struct gpu_pool {
  pthread_mutex_t    lock;
  const gpu_backend *b;
  int                device;           /* the ledger's device number */
  size_t             max_split;        /* SIZE_MAX: no limit */
  block_set          free_set[2];
  block            **map;              /* allocated blocks by address, open addressing */
  size_t             map_cap, map_n;
  segment           *segs;             /* every segment, newest first */
  pending           *pend;
  size_t             n_pend, cap_pend;
  gpu_event         *spare_events;     /* recorded and completed: reused */
  size_t             n_spare, cap_spare;
  gpu_stats          st;
  gpu_pool          *next_pool;        /* every pool, for the exit check */
  void              *blas_ws;          /* the sgemm library's workspace, when this pool gave it one */
};

static ta_tag T_SEGMENT, T_BUFFER, T_BLAS_WS;
static pthread_once_t tags_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static gpu_pool *pools;
/* The backends whose sgemm workspace a pool gave (one pool each), under pools_lock. */
#define WS_OWNERS 4
static struct {
  const gpu_backend *b;
  gpu_pool *pool;
} ws_owners[WS_OWNERS];

static __thread char pool_msg[512];

const char *gpu_pool_error(void) { return pool_msg; }

static void pool_exit_check(void);

static void tags_init(void) {
  T_SEGMENT = ta_tag_get("gpu.segment");
  T_BUFFER = ta_tag_get("gpu.buffer");
  T_BLAS_WS = ta_tag_get("gpu.blas-workspace");
  ta_atexit(pool_exit_check);
}

/* ---- stats ------------------------------------------------------------------ */

static void stat_up(gpu_stat *s, int pool, int64_t n) {
  int kinds[2] = { GPU_STAT_ALL, pool == SMALL ? GPU_STAT_SMALL : GPU_STAT_LARGE };
  for (int i = 0; i < 2; i++) {
    gpu_stat *x = &s[kinds[i]];
    x->current += n;
    x->allocated += n;
    if (x->current > x->peak) x->peak = x->current;
  }
}

static void stat_down(gpu_stat *s, int pool, int64_t n) {
  int kinds[2] = { GPU_STAT_ALL, pool == SMALL ? GPU_STAT_SMALL : GPU_STAT_LARGE };
  for (int i = 0; i < 2; i++) {
    s[kinds[i]].current -= n;
    s[kinds[i]].freed += n;
  }
}

/* Signed change of an inactive_split stat. */
static void stat_add(gpu_stat *s, int pool, int64_t n) {
  if (n > 0) stat_up(s, pool, n);
  else if (n < 0) stat_down(s, pool, -n);
}

/* ---- free sets: sorted by (stream, size, address) ---------------------------------- */

static int key_cmp(gpu_stream s1, size_t z1, uintptr_t p1, const block *b) {
  if ((uintptr_t)s1 != (uintptr_t)b->stream) return (uintptr_t)s1 < (uintptr_t)b->stream ? -1 : 1;
  if (z1 != b->size) return z1 < b->size ? -1 : 1;
  if (p1 != b->ptr) return p1 < b->ptr ? -1 : 1;
  return 0;
}

/* The index of the first block not below the key. */
static size_t set_lower(const block_set *s, gpu_stream stream, size_t size, uintptr_t ptr) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (key_cmp(stream, size, ptr, s->v[mid]) > 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static bool set_insert(block_set *s, block *b) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 32;
    block **v = realloc(s->v, cap * sizeof *v);
    if (v == NULL) return false;
    s->v = v;
    s->cap = cap;
  }
  size_t at = set_lower(s, b->stream, b->size, b->ptr);
  memmove(s->v + at + 1, s->v + at, (s->n - at) * sizeof *s->v);
  s->v[at] = b;
  s->n++;
  b->cached = true;
  return true;
}

static void set_erase(block_set *s, block *b) {
  size_t at = set_lower(s, b->stream, b->size, b->ptr);
  if (at < s->n && s->v[at] == b) {
    memmove(s->v + at, s->v + at + 1, (s->n - at - 1) * sizeof *s->v);
    s->n--;
  }
  b->cached = false;
}

/* ---- allocated blocks by address --------------------------------------------------- */

static size_t hash_ptr(uintptr_t p, size_t cap) {
  uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
  return (size_t)(h >> 20) & (cap - 1);
}

static bool map_grow(gpu_pool *p) {
  size_t cap = p->map_cap ? p->map_cap * 2 : 256;
  block **m = calloc(cap, sizeof *m);
  if (m == NULL) return false;
  for (size_t i = 0; i < p->map_cap; i++)
    if (p->map[i]) {
      size_t j = hash_ptr(p->map[i]->ptr, cap);
      while (m[j]) j = (j + 1) & (cap - 1);
      m[j] = p->map[i];
    }
  free(p->map);
  p->map = m;
  p->map_cap = cap;
  return true;
}

static bool map_put(gpu_pool *p, block *b) {
  if ((p->map_n + 1) * 2 > p->map_cap && !map_grow(p)) return false;
  size_t j = hash_ptr(b->ptr, p->map_cap);
  while (p->map[j]) j = (j + 1) & (p->map_cap - 1);
  p->map[j] = b;
  p->map_n++;
  return true;
}

static block *map_get(const gpu_pool *p, uintptr_t ptr) {
  if (p->map_cap == 0) return NULL;
  size_t j = hash_ptr(ptr, p->map_cap);
  while (p->map[j]) {
    if (p->map[j]->ptr == ptr) return p->map[j];
    j = (j + 1) & (p->map_cap - 1);
  }
  return NULL;
}

/* Removal with backward shift: no tombstones. */
static void map_del(gpu_pool *p, uintptr_t ptr) {
  size_t mask = p->map_cap - 1, j = hash_ptr(ptr, p->map_cap);
  while (p->map[j] && p->map[j]->ptr != ptr) j = (j + 1) & mask;
  if (p->map[j] == NULL) return;
  p->map[j] = NULL;
  p->map_n--;
  for (size_t k = (j + 1) & mask; p->map[k]; k = (k + 1) & mask) {
    size_t home = hash_ptr(p->map[k]->ptr, p->map_cap);
    /* Move k back to j if its home is not in (j, k]. */
    if ((k > j && (home <= j || home > k)) || (k < j && home <= j && home > k)) {
      p->map[j] = p->map[k];
      p->map[k] = NULL;
      j = k;
    }
  }
}

/* ---- sizes --------------------------------------------------------------------------- */

static size_t round_size(size_t size) {
  if (size < GPU_POOL_ROUND) return GPU_POOL_ROUND;
  return (size + GPU_POOL_ROUND - 1) / GPU_POOL_ROUND * GPU_POOL_ROUND;
}

static size_t allocation_size(size_t size) {
  if (size <= GPU_POOL_SMALL_SIZE) return GPU_POOL_SMALL_SEG;
  if (size < GPU_POOL_MIN_LARGE) return GPU_POOL_LARGE_SEG;
  return (size + GPU_POOL_LARGE_ROUND - 1) / GPU_POOL_LARGE_ROUND * GPU_POOL_LARGE_ROUND;
}

static bool is_split(const block *b) { return b->prev || b->next; }

/* ---- segments ---------------------------------------------------------------------------- */

static void segment_release(gpu_pool *p, block *b) {
  segment *s = b->seg;
  set_erase(&p->free_set[b->pool], b);
  p->b->free((void *)b->ptr);
  ta_device_free(T_SEGMENT, p->device, s->ptr);
  stat_down(p->st.segment, s->pool, 1);
  stat_down(p->st.reserved_bytes, s->pool, (int64_t)s->size);
  p->st.num_device_free++;
  if (s->prev_seg) s->prev_seg->next_seg = s->next_seg;
  else p->segs = s->next_seg;
  if (s->next_seg) s->next_seg->prev_seg = s->prev_seg;
  free(s);
  free(b->uses);
  free(b);
}

/* A new segment of `size` bytes for `pool` and stream, as one free block
 * not in any set; NULL when the backend has no room. */
static block *segment_new(gpu_pool *p, size_t size, int pool, gpu_stream stream) {
  void *ptr = NULL;
  block *b = calloc(1, sizeof *b);
  segment *s = calloc(1, sizeof *s);
  if (b == NULL || s == NULL) {
    free(b);
    free(s);
    return NULL;
  }
  if (p->b->alloc(&ptr, size) != GPU_OK) {
    free(b);
    free(s);
    return NULL;
  }
  s->ptr = (uintptr_t)ptr;
  s->size = size;
  s->pool = pool;
  s->next_seg = p->segs;
  if (p->segs) p->segs->prev_seg = s;
  p->segs = s;
  b->ptr = s->ptr;
  b->size = size;
  b->stream = stream;
  b->pool = pool;
  b->seg = s;
  stat_up(p->st.segment, pool, 1);
  stat_up(p->st.reserved_bytes, pool, (int64_t)size);
  p->st.num_device_alloc++;
  return b;
}

/* ---- events: frees deferred until the streams a block was used on finish ------------------ */

static gpu_event event_take(gpu_pool *p) {
  if (p->n_spare) return p->spare_events[--p->n_spare];
  gpu_event e = NULL;
  if (p->b->event_create(&e) != GPU_OK) return NULL;
  return e;
}

static void event_give(gpu_pool *p, gpu_event e) {
  if (p->n_spare == p->cap_spare) {
    size_t cap = p->cap_spare ? p->cap_spare * 2 : 16;
    gpu_event *v = realloc(p->spare_events, cap * sizeof *v);
    if (v == NULL) {
      p->b->event_destroy(e);
      return;
    }
    p->spare_events = v;
    p->cap_spare = cap;
  }
  p->spare_events[p->n_spare++] = e;
}

static void free_block(gpu_pool *p, block *b);

/* Drops pending entry i (its event done) and frees its block when it was
 * the last. */
static void pending_done(gpu_pool *p, size_t i) {
  block *b = p->pend[i].b;
  event_give(p, p->pend[i].e);
  memmove(p->pend + i, p->pend + i + 1, (p->n_pend - i - 1) * sizeof *p->pend);
  p->n_pend--;
  if (--b->event_count == 0) free_block(p, b);
}

/* Frees the blocks whose events have all completed. */
static void process_events(gpu_pool *p) {
  for (size_t i = 0; i < p->n_pend;) {
    gpu_status st = p->b->event_query(p->pend[i].e);
    if (st == GPU_ENOTREADY) {
      i++;
      continue;
    }
    pending_done(p, i);
  }
}

/* Waits for every pending event, then frees their blocks. */
static void synchronize_events(gpu_pool *p) {
  while (p->n_pend) {
    p->b->event_synchronize(p->pend[0].e);
    pending_done(p, 0);
  }
}

/* Records an event on each stream b was used on; b is freed when all have
 * completed.  When an event cannot be made, the streams left are
 * synchronized instead; false when no event was queued at all (the caller
 * frees b at once), true when b waits for the events queued. */
static bool insert_events(gpu_pool *p, block *b) {
  for (int i = 0; i < b->n_uses; i++) {
    if (p->n_pend == p->cap_pend) {
      size_t cap = p->cap_pend ? p->cap_pend * 2 : 16;
      pending *v = realloc(p->pend, cap * sizeof *v);
      if (v == NULL) goto sync;
      p->pend = v;
      p->cap_pend = cap;
    }
    gpu_event e = event_take(p);
    if (e == NULL || p->b->event_record(e, b->uses[i]) != GPU_OK) {
      if (e) event_give(p, e);
      goto sync;
    }
    p->pend[p->n_pend++] = (pending){ e, b };
    b->event_count++;
  }
  b->n_uses = 0;
  return true;
sync:
  for (int i = 0; i < b->n_uses; i++) p->b->stream_synchronize(b->uses[i]);
  b->n_uses = 0;
  return b->event_count > 0;
}

/* ---- blocks ---------------------------------------------------------------------------------- */

/* Absorbs neighbour n into b when n is free; returns the bytes taken. */
static size_t try_merge(gpu_pool *p, block *b, block *n) {
  if (n == NULL || n->allocated || n->event_count > 0 || !n->cached) return 0;
  set_erase(&p->free_set[n->pool], n);
  if (b->prev == n) {
    b->ptr = n->ptr;
    b->prev = n->prev;
    if (b->prev) b->prev->next = b;
  } else {
    b->next = n->next;
    if (b->next) b->next->prev = b;
  }
  size_t taken = n->size;
  b->size += taken;
  free(n->uses);
  free(n);
  return taken;
}

/* b (freed, no event pending) back to its pool's free set, merged. */
static void free_block(gpu_pool *p, block *b) {
  size_t original = b->size;
  int64_t d_split = 0, d_split_bytes = 0;
  block *cands[2] = { b->prev, b->next };
  for (int i = 0; i < 2; i++) {
    size_t taken = try_merge(p, b, cands[i]);
    if (taken) {
      d_split -= 1;
      d_split_bytes -= (int64_t)taken;
    }
  }
  b->seg->live--;
  if (!set_insert(&p->free_set[b->pool], b)) {
    /* No host memory for the set: the block stays out of the cache (its
     * segment is never given back, but nothing is corrupted). */
    fprintf(stderr, "tagalloc: gpu: out of host memory for the pool's free set: %zu bytes not cached\n", b->size);
  }
  if (is_split(b)) {
    d_split += 1;
    d_split_bytes += (int64_t)b->size;
  }
  stat_add(p->st.inactive_split, b->pool, d_split);
  stat_add(p->st.inactive_split_bytes, b->pool, d_split_bytes);
  stat_down(p->st.active, b->pool, 1);
  stat_down(p->st.active_bytes, b->pool, (int64_t)original);
  stat_down(p->st.requested_bytes, b->pool, (int64_t)b->requested);
  b->requested = 0;
}

/* The best fit on the stream, or NULL. */
static block *get_free_block(gpu_pool *p, int pool, gpu_stream stream, size_t size) {
  block_set *s = &p->free_set[pool];
  size_t at = set_lower(s, stream, size, 0);
  if (at == s->n || s->v[at]->stream != stream) return NULL;
  block *b = s->v[at];
  if (size < p->max_split && b->size >= p->max_split) return NULL;           /* keep oversize blocks whole */
  if (size >= p->max_split && b->size >= size + K_LARGE_BUFFER) return NULL; /* too wasteful */
  set_erase(s, b);
  return b;
}

/* Gives back whole-segment free blocks of the pool's oversize (above
 * max_split) cache on the stream, enough for size; PyTorch's
 * release_available_cached_blocks.  True when something was released that
 * may make room. */
static bool release_available(gpu_pool *p, int pool, gpu_stream stream, size_t size) {
  if (p->max_split == SIZE_MAX) return false;
  block_set *s = &p->free_set[pool];
  size_t key = size < p->max_split ? p->max_split : size;
  size_t at = set_lower(s, stream, key, 0);
  if (at < s->n && s->v[at]->stream == stream && !is_split(s->v[at])) {
    segment_release(p, s->v[at]);
    return true;
  }
  /* No one block is large enough: free oversize ones, largest first. */
  size_t released = 0;
  while (at > 0 && released < key) {
    block *b = s->v[at - 1];
    if (b->stream != stream || b->size < p->max_split) break;
    at--;
    if (is_split(b)) continue;
    released += b->size;
    segment_release(p, b);
  }
  return released >= key;
}

/* Gives back every cached whole segment; PyTorch's release_cached_blocks. */
static bool release_cached(gpu_pool *p) {
  synchronize_events(p);
  for (int pool = 0; pool < 2; pool++) {
    block_set *s = &p->free_set[pool];
    for (size_t i = s->n; i-- > 0;) {
      if (i >= s->n) continue;
      if (!is_split(s->v[i])) segment_release(p, s->v[i]);
    }
  }
  return true;
}

static void oom_message(gpu_pool *p, size_t asked, size_t rounded, size_t seg) {
  size_t fr = 0, total = 0;
  p->b->mem_get_info(&fr, &total);
  snprintf(pool_msg, sizeof pool_msg,
           "gpu_pool_alloc: out of device memory: tried to allocate %zu bytes (%zu rounded, a new segment of %zu); "
           "the pool has %lld bytes allocated and %lld reserved; the device (%s) has %zu free of %zu",
           asked, rounded, seg, (long long)p->st.allocated_bytes[GPU_STAT_ALL].current,
           (long long)p->st.reserved_bytes[GPU_STAT_ALL].current, p->b->name, fr, total);
}

/* ---- the public calls ----------------------------------------------------------------------------- */

/* The sgemm library's workspace, from the backend beside the segments, on
 * the ledger: the first pool over a backend that wants one gives it
 * (pools_lock held).  Without one the library allocates its own. */
static void blas_workspace_give(gpu_pool *p) {
  const gpu_backend *b = p->b;
  size_t n = b->blas_workspace_size && b->set_blas_workspace ? b->blas_workspace_size() : 0;
  int slot = -1;
  for (int i = 0; i < WS_OWNERS && n; i++) {
    if (ws_owners[i].b == b) return;   /* given already */
    if (ws_owners[i].b == NULL && slot < 0) slot = i;
  }
  void *ws = NULL;
  if (n == 0 || slot < 0 || b->alloc(&ws, n) != GPU_OK) return;
  if (b->set_blas_workspace(ws, n) != GPU_OK) {
    b->free(ws);
    return;
  }
  ta_device_alloc(T_BLAS_WS, p->device, (uintptr_t)ws, n, TA_DEVICE_RESERVE);
  p->blas_ws = ws;
  ws_owners[slot].b = b;
  ws_owners[slot].pool = p;
}

/* Takes the workspace back from the library, and frees it (pools_lock held). */
static void blas_workspace_take(gpu_pool *p) {
  if (p->blas_ws == NULL) return;
  p->b->set_blas_workspace(NULL, 0);
  ta_device_free(T_BLAS_WS, p->device, (uintptr_t)p->blas_ws);
  p->b->free(p->blas_ws);
  p->blas_ws = NULL;
  for (int i = 0; i < WS_OWNERS; i++)
    if (ws_owners[i].pool == p) ws_owners[i].b = NULL, ws_owners[i].pool = NULL;
}

gpu_pool *gpu_pool_new(const gpu_backend *b, const gpu_pool_config *cfg) {
  if (b == NULL) return NULL;
  pthread_once(&tags_once, tags_init);
  gpu_pool *p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  pthread_mutex_init(&p->lock, NULL);
  p->b = b;
  p->device = b->ledger_device ? b->ledger_device() : 0;
  p->max_split = cfg && cfg->max_split_size ? cfg->max_split_size : SIZE_MAX;
  pthread_mutex_lock(&pools_lock);
  p->next_pool = pools;
  pools = p;
  blas_workspace_give(p);
  pthread_mutex_unlock(&pools_lock);
  return p;
}

const gpu_backend *gpu_pool_backend(const gpu_pool *p) { return p ? p->b : NULL; }

__attribute__((noinline)) void *gpu_pool_alloc(gpu_pool *p, size_t bytes, gpu_stream stream) {
  if (p == NULL || bytes == 0) return NULL;
  if (bytes > SIZE_MAX / 2) {
    snprintf(pool_msg, sizeof pool_msg, "gpu_pool_alloc: %zu bytes: too large", bytes);
    return NULL;
  }
  pthread_mutex_lock(&p->lock);
  process_events(p);
  size_t size = round_size(bytes);
  int pool = size <= GPU_POOL_SMALL_SIZE ? SMALL : LARGE;
  size_t seg = allocation_size(size);
  bool hit = true;
  block *b = get_free_block(p, pool, stream, size);
  if (b == NULL) {
    hit = false;
    b = segment_new(p, seg, pool, stream);
    if (b == NULL && release_available(p, pool, stream, size)) b = segment_new(p, seg, pool, stream);
    if (b == NULL) {
      release_cached(p);
      p->st.num_alloc_retries++;
      b = segment_new(p, seg, pool, stream);
    }
    if (b == NULL) {
      p->st.num_ooms++;
      oom_message(p, bytes, size, seg);
      pthread_mutex_unlock(&p->lock);
      fprintf(stderr, "tagalloc: gpu: %s\n", pool_msg);
      return NULL;
    }
    ta_device_alloc(T_SEGMENT, p->device, b->ptr, b->size, TA_DEVICE_RESERVE);
  }
  /* Split off what the request does not need. */
  bool already_split = is_split(b);
  size_t remaining = b->size - size;
  bool split = pool == SMALL ? remaining >= GPU_POOL_ROUND : size < p->max_split && remaining > GPU_POOL_SMALL_SIZE;
  if (split) {
    block *r = calloc(1, sizeof *r);
    if (r == NULL) {
      split = false;   /* no host memory: hand out the whole block */
    } else {
      r->ptr = b->ptr + size;
      r->size = remaining;
      r->stream = b->stream;
      r->pool = b->pool;
      r->seg = b->seg;
      r->prev = b;
      r->next = b->next;
      if (r->next) r->next->prev = r;
      b->next = r;
      b->size = size;
      if (!set_insert(&p->free_set[pool], r)) {   /* undo: give the whole block */
        b->next = r->next;
        if (b->next) b->next->prev = b;
        b->size += remaining;
        free(r);
        split = false;
      }
    }
  }
  if (split) {
    if (already_split) {
      stat_down(p->st.inactive_split_bytes, pool, (int64_t)size);
    } else {
      stat_up(p->st.inactive_split, pool, 1);
      stat_up(p->st.inactive_split_bytes, pool, (int64_t)remaining);
    }
  } else if (already_split) {
    stat_down(p->st.inactive_split, pool, 1);
    stat_down(p->st.inactive_split_bytes, pool, (int64_t)b->size);
  }
  b->allocated = true;
  b->requested = bytes;
  b->seg->live++;
  if (!map_put(p, b)) {
    /* No host memory for the table: give the block back and fail. */
    b->allocated = false;
    stat_up(p->st.active, pool, 1);
    stat_up(p->st.active_bytes, pool, (int64_t)b->size);
    stat_up(p->st.requested_bytes, pool, (int64_t)bytes);
    free_block(p, b);
    snprintf(pool_msg, sizeof pool_msg, "gpu_pool_alloc: out of host memory for the pool's table");
    pthread_mutex_unlock(&p->lock);
    return NULL;
  }
  stat_up(p->st.allocation, pool, 1);
  stat_up(p->st.allocated_bytes, pool, (int64_t)b->size);
  stat_up(p->st.active, pool, 1);
  stat_up(p->st.active_bytes, pool, (int64_t)b->size);
  stat_up(p->st.requested_bytes, pool, (int64_t)bytes);
  p->st.num_requests++;
  if (hit) p->st.num_hits++;
  uintptr_t ptr = b->ptr;
  size_t got = b->size;
  pthread_mutex_unlock(&p->lock);
  ta_device_alloc(T_BUFFER, p->device, ptr, got, 0);
  return (void *)ptr;
}

__attribute__((noinline)) void gpu_pool_free(gpu_pool *p, void *ptr) {
  if (p == NULL || ptr == NULL) return;
  /* The ledger first, while the block is still the caller's: once it is
   * back in the cache another thread may be handed it (and record it).  A
   * pointer the pool did not hand out is reported there (free.double for a
   * block freed recently, free.invalid otherwise). */
  ta_device_free(T_BUFFER, p->device, (uintptr_t)ptr);
  pthread_mutex_lock(&p->lock);
  block *b = map_get(p, (uintptr_t)ptr);
  if (b) {
    map_del(p, b->ptr);
    b->allocated = false;
    stat_down(p->st.allocation, b->pool, 1);
    stat_down(p->st.allocated_bytes, b->pool, (int64_t)b->size);
    if (b->n_uses == 0 || !insert_events(p, b)) free_block(p, b);
  }
  pthread_mutex_unlock(&p->lock);
}

void gpu_pool_record_stream(gpu_pool *p, void *ptr, gpu_stream s) {
  if (p == NULL || ptr == NULL) return;
  pthread_mutex_lock(&p->lock);
  block *b = map_get(p, (uintptr_t)ptr);
  if (b && s != b->stream) {
    bool known = false;
    for (int i = 0; i < b->n_uses; i++) known |= b->uses[i] == s;
    if (!known) {
      if (b->n_uses == b->cap_uses) {
        int cap = b->cap_uses ? b->cap_uses * 2 : 4;
        gpu_stream *v = realloc(b->uses, (size_t)cap * sizeof *v);
        if (v) {
          b->uses = v;
          b->cap_uses = cap;
        }
      }
      if (b->n_uses < b->cap_uses) b->uses[b->n_uses++] = s;
      else p->b->stream_synchronize(s);   /* no host memory: make the use complete now */
    }
  }
  pthread_mutex_unlock(&p->lock);
  if (b == NULL)
    snprintf(pool_msg, sizeof pool_msg, "gpu_pool_record_stream: %p is not a live block of the pool", ptr);
}

size_t gpu_pool_size(gpu_pool *p, const void *ptr) {
  if (p == NULL || ptr == NULL) return 0;
  pthread_mutex_lock(&p->lock);
  block *b = map_get(p, (uintptr_t)ptr);
  size_t n = b ? b->size : 0;
  pthread_mutex_unlock(&p->lock);
  return n;
}

void gpu_pool_empty_cache(gpu_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  release_cached(p);
  pthread_mutex_unlock(&p->lock);
}

void gpu_pool_stats(gpu_pool *p, gpu_stats *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  *out = p->st;
  pthread_mutex_unlock(&p->lock);
}

static void stat_reset(gpu_stat *s) {
  for (int k = 0; k < GPU_STAT_KINDS; k++) {
    s[k].peak = s[k].current;
    s[k].allocated = s[k].freed = 0;
  }
}

void gpu_pool_stats_reset(gpu_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  gpu_stats *s = &p->st;
  gpu_stat *all[] = { s->allocation, s->segment, s->active, s->inactive_split, s->allocated_bytes,
                      s->reserved_bytes, s->active_bytes, s->inactive_split_bytes, s->requested_bytes };
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) stat_reset(all[i]);
  s->num_alloc_retries = s->num_ooms = s->num_device_alloc = s->num_device_free = 0;
  s->num_hits = s->num_requests = 0;
  pthread_mutex_unlock(&p->lock);
}

/* ---- purge, destroy, the default pool, the exit check ------------------------------------------------ */

/* The allocation stacks of the live device blocks of one tag and device. */
typedef struct {
  ta_tag     tag;
  int        device;
  uintptr_t *addr;
  uint32_t  *stack;
  size_t     n, cap;
} stack_list;

static void collect_stack(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack, unsigned flags,
                          void *arg) {
  (void)size;
  (void)flags;
  stack_list *l = arg;
  if (tag != l->tag || device != l->device) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    uintptr_t *a = realloc(l->addr, cap * sizeof *a);
    if (a == NULL) return;
    l->addr = a;
    uint32_t *s = realloc(l->stack, cap * sizeof *s);
    if (s == NULL) return;
    l->stack = s;
    l->cap = cap;
  }
  l->addr[l->n] = addr;
  l->stack[l->n++] = stack;
}

static uint32_t stack_of(const stack_list *l, uintptr_t addr) {
  for (size_t i = 0; i < l->n; i++)
    if (l->addr[i] == addr) return l->stack[i];
  return 0;
}

__attribute__((noinline)) size_t gpu_pool_purge(gpu_pool *p) {
  if (p == NULL) return 0;
  uint32_t here = ta_stack_here();
  stack_list bufs = { .tag = T_BUFFER, .device = p->device };
  ta_device_each(p->device, collect_stack, &bufs);
  pthread_mutex_lock(&p->lock);
  int64_t before = p->st.reserved_bytes[GPU_STAT_ALL].current;
  /* The live blocks, judged by their references: count 0 (released by
   * every owner, never given back) are freed; count > 0 are refused. */
  size_t n = 0;
  block **live = malloc((p->map_n + 1) * sizeof *live);
  for (size_t i = 0; live && i < p->map_cap; i++)
    if (p->map[i]) live[n++] = p->map[i];
  pthread_mutex_unlock(&p->lock);
  for (size_t i = 0; i < n; i++) {
    void *ptr = (void *)live[i]->ptr;
    long refs = ta_ref_count(ptr);
    if (refs == 0) {
      gpu_pool_free(p, ptr);
    } else if (refs > 0) {
      char detail[160];
      snprintf(detail, sizeof detail, "gpu_pool_purge refused a buffer still referenced (%ld reference%s)", refs,
               refs == 1 ? "" : "s");
      ta_finding_add(ta_kind_name(TA_KIND_GPU_PURGE_REFERENCED), T_BUFFER, (uintptr_t)ptr, gpu_pool_size(p, ptr),
                     stack_of(&bufs, (uintptr_t)ptr), here, detail);
    }
  }
  free(live);
  free(bufs.addr);
  free(bufs.stack);
  pthread_mutex_lock(&p->lock);
  release_cached(p);
  int64_t after = p->st.reserved_bytes[GPU_STAT_ALL].current;
  pthread_mutex_unlock(&p->lock);
  return (size_t)(before - after);
}

void gpu_pool_destroy(gpu_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&pools_lock);
  for (gpu_pool **q = &pools; *q; q = &(*q)->next_pool)
    if (*q == p) {
      *q = p->next_pool;
      break;
    }
  blas_workspace_take(p);
  pthread_mutex_unlock(&pools_lock);
  pthread_mutex_lock(&p->lock);
  synchronize_events(p);
  /* Every segment goes back, its blocks with it; live buffers stay on the
   * ledger (gpu.leak at exit). */
  while (p->segs) {
    segment *s = p->segs;
    block *b = NULL;
    for (size_t i = 0; i < p->map_cap && b == NULL; i++)
      if (p->map[i] && p->map[i]->seg == s) b = p->map[i];
    for (int pool = 0; pool < 2 && b == NULL; pool++)
      for (size_t i = 0; i < p->free_set[pool].n; i++)
        if (p->free_set[pool].v[i]->seg == s) {
          b = p->free_set[pool].v[i];
          break;
        }
    if (b == NULL) break;   /* cannot happen: every segment has a block */
    while (b->prev) b = b->prev;
    while (b->next) {   /* the segment as one block, then released */
      block *n = b->next;
      if (n->allocated) map_del(p, n->ptr);
      if (n->cached) set_erase(&p->free_set[n->pool], n);
      b->next = n->next;
      b->size += n->size;
      free(n->uses);
      free(n);
    }
    b->next = NULL;
    if (b->allocated) map_del(p, b->ptr);
    if (!b->cached) set_insert(&p->free_set[b->pool], b);
    segment_release(p, b);
  }
  for (size_t i = 0; i < p->n_spare; i++) p->b->event_destroy(p->spare_events[i]);
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_destroy(&p->lock);
  free(p->free_set[0].v);
  free(p->free_set[1].v);
  free(p->map);
  free(p->pend);
  free(p->spare_events);
  free(p);
}

static gpu_pool *default_pool;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_make(void) {
  const gpu_backend *b = gpu_backend_get();
  if (b == NULL) return;
  gpu_pool_config cfg = { 0 };
  const char *s = getenv("TAGALLOC_GPU_MAX_SPLIT");
  if (s && *s && !_gpu_parse_size(s, &cfg.max_split_size)) {
    fprintf(stderr, "tagalloc: gpu: TAGALLOC_GPU_MAX_SPLIT=%s: not a size (K/M/G suffixes); no limit\n", s);
    cfg.max_split_size = 0;
  }
  default_pool = gpu_pool_new(b, &cfg);
}

gpu_pool *gpu_pool_default(void) {
  pthread_once(&default_once, default_make);
  return default_pool;
}

/* At exit, before the ledger's gpu.leak and its report: each segment of
 * every pool with no block allocated or waiting is gpu.pool-retained, with
 * the stack that made it. */
static void pool_exit_check(void) {
  pthread_mutex_lock(&pools_lock);
  for (gpu_pool *p = pools; p; p = p->next_pool) {
    stack_list segs = { .tag = T_SEGMENT, .device = p->device };
    ta_device_each(p->device, collect_stack, &segs);
    pthread_mutex_lock(&p->lock);
    for (segment *s = p->segs; s; s = s->next_seg)
      if (s->live == 0)
        ta_finding_add(ta_kind_name(TA_KIND_GPU_POOL_RETAINED), T_SEGMENT, s->ptr, s->size,
                       stack_of(&segs, s->ptr), 0,
                       s->pool == SMALL ? "idle cache: a small-pool segment with no live buffer"
                                        : "idle cache: a large-pool segment with no live buffer");
    pthread_mutex_unlock(&p->lock);
    free(segs.addr);
    free(segs.stack);
  }
  pthread_mutex_unlock(&pools_lock);
}
