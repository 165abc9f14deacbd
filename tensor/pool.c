/* pool.c - the tensor pool: storages kept by dtype and shape, reused last
 * in, first out.
 *
 * Each key keeps a stack of storages (top: the newest), and the pool keeps
 * every storage in the order it came back, for pruning oldest first.  The
 * storages are ledger blocks of tag "tensor.pool", and the pool declares the
 * pointers it keeps to them as holds: the key holds its bottom ("bottom"),
 * each storage the one above it ("pool.above", its kprev).  So a kept
 * storage is never an orphan, and one still kept at exit is reachable and
 * held, not a leak; and a push or a pop at the top, the steady traffic of a
 * training loop, changes one hold (the old top's), not two.
 *
 *   key --bottom--> s1 --pool.above--> s2 --pool.above--> s3 (= key->top)
 *
 * A storage's refcount is 0 while kept and counts its headers while out. */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#define NBUCKETS 64

typedef struct pool_key {
  tensor_dtype dtype;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  size_t nbytes;
  tensor_storage *top, *bottom;   /* held: "bottom" */
  size_t count;
  struct pool_key *next;        /* the bucket's chain */
} pool_key;

struct tensor_pool {
  pthread_mutex_t lock;
  pool_key *buckets[NBUCKETS];
  tensor_storage *oldest, *newest;   /* kept storages, in the order they came back */
  size_t storages, bytes, out;
  uint64_t hits, misses;
  bool closed, global;
  void *scratch;                     /* held: "scratch"; lent to one op at a time */
  size_t scratch_bytes;
  bool scratch_lent;
};

__thread tensor_pool *_tensor_pool_current;

static unsigned key_hash(tensor_dtype dt, int ndim, const int64_t *shape) {
  uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(dt + 1) + (uint64_t)ndim;
  for (int i = 0; i < ndim; i++) h = (h ^ (uint64_t)shape[i]) * 0x100000001B3ull;
  return (unsigned)(h >> 40) % NBUCKETS;
}

static pool_key *key_find(tensor_pool *p, tensor_dtype dt, int ndim, const int64_t *shape, bool make) {
  unsigned b = key_hash(dt, ndim, shape);
  for (pool_key *k = p->buckets[b]; k; k = k->next)   /* a scalar's shape may be NULL: no memcmp then */
    if (k->dtype == dt && k->ndim == ndim && (ndim == 0 || memcmp(k->shape, shape, (size_t)ndim * sizeof *shape) == 0))
      return k;
  if (!make) return NULL;
  pool_key *k = ta_calloc(_tensor_tag_meta, 1, sizeof *k);
  if (k == NULL) return NULL;
  k->dtype = dt;
  k->ndim = ndim;
  k->nbytes = 4;
  for (int i = 0; i < ndim; i++) k->nbytes *= (size_t)(k->shape[i] = shape[i]);
  k->next = p->buckets[b];
  p->buckets[b] = k;
  return k;
}

static tensor_pool *pool_make(bool global) {
  _tensor_init();
  tensor_pool *p = ta_calloc(_tensor_tag_meta, 1, sizeof *p);
  if (p == NULL) {
    _tensor_err(TENSOR_ENOMEM, "tensor_pool_new: out of memory");
    return NULL;
  }
  pthread_mutex_init(&p->lock, NULL);
  p->global = global;
  return p;
}

tensor_pool *tensor_pool_new(void) { return pool_make(false); }

static tensor_pool *global_pool;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static void global_make(void) { global_pool = pool_make(true); }

tensor_pool *tensor_pool_global(void) {
  pthread_once(&global_once, global_make);
  return global_pool;
}

/* ---- keeping and taking back, under the pool's lock --------------------------- */

static void keep(tensor_pool *p, tensor_storage *s, uint32_t stack) {
  pool_key *k = s->key;
  tensor_storage *top = k->top;
  s->kprev = NULL;
  s->knext = top;
  if (top) {
    top->kprev = s;
    ta_hold_at(top, "pool.above", s, stack);
  } else {
    k->bottom = s;
    ta_hold_at(k, "bottom", s, stack);
  }
  k->top = s;
  k->count++;
  s->anext = NULL;
  s->aprev = p->newest;
  if (p->newest) p->newest->anext = s;
  else p->oldest = s;
  p->newest = s;
  p->storages++;
  p->bytes += s->nbytes;
}

/* Takes s out of its key's stack and the keep order, and its holds: what
 * held s (the storage below, or the key) holds the one above s instead,
 * before s lets go of it; the top (no storage above) costs one unhold.
 * The holds change at stack (the caller's). */
static void unkeep(tensor_pool *p, tensor_storage *s, uint32_t stack) {
  pool_key *k = s->key;
  tensor_storage *above = s->kprev, *below = s->knext;
  if (above) above->knext = below;
  else k->top = below;
  if (below) {
    below->kprev = above;
    if (above) ta_hold_at(below, "pool.above", above, stack);
    else ta_unhold_at(below, "pool.above", stack);
  } else {
    k->bottom = above;
    if (above) ta_hold_at(k, "bottom", above, stack);
    else ta_unhold_at(k, "bottom", stack);
  }
  if (above) ta_unhold_at(s, "pool.above", stack);
  s->kprev = s->knext = NULL;
  k->count--;
  if (s->aprev) s->aprev->anext = s->anext;
  else p->oldest = s->anext;
  if (s->anext) s->anext->aprev = s->aprev;
  else p->newest = s->aprev;
  s->aprev = s->anext = NULL;
  p->storages--;
  p->bytes -= s->nbytes;
}

static void drop(tensor_pool *p, tensor_storage *s) {
  unkeep(p, s, ta_stack_here());
  ta_free(s);
}

/* Frees the scratch buffer unless it is lent (its op frees it then, the
 * pool being closed or cleared).  Under the pool's lock. */
static void scratch_drop(tensor_pool *p) {
  if (p->scratch == NULL || p->scratch_lent) return;
  ta_unhold(p, "scratch");
  ta_free(p->scratch);
  p->scratch = NULL;
  p->scratch_bytes = 0;
}

static void pool_destroy(tensor_pool *p) {
  scratch_drop(p);
  for (int b = 0; b < NBUCKETS; b++)
    for (pool_key *k = p->buckets[b], *next; k; k = next) {
      next = k->next;
      ta_free(k);
    }
  pthread_mutex_destroy(&p->lock);
  ta_free(p);
}

bool _tensor_pool_put(tensor_storage *s, uint32_t stack) {
  tensor_pool *p = s->pool;
  pthread_mutex_lock(&p->lock);
  p->out--;
  if (p->closed) {
    bool last = p->out == 0 && !p->scratch_lent;   /* (else the scratch's give destroys it) */
    pthread_mutex_unlock(&p->lock);
    if (last) pool_destroy(p);
    return false;
  }
  keep(p, s, stack);
  pthread_mutex_unlock(&p->lock);
  return true;
}

/* ---- the API ------------------------------------------------------------------ */

tensor *tensor_pool_acquire(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape) {
  const char *op = "tensor_pool_acquire";
  if (p == NULL) {
    _tensor_err(TENSOR_EINVAL, "%s: pool is NULL", op);
    return NULL;
  }
  if (dtype != TENSOR_F32 && dtype != TENSOR_I32) {
    _tensor_err(TENSOR_EDTYPE, "%s: unknown dtype %d", op, (int)dtype);
    return NULL;
  }
  int64_t n = _tensor_check_shape(op, ndim, shape);
  if (n < 0) return NULL;
  int64_t strides[TENSOR_MAX_DIMS];
  _tensor_contig_strides(ndim, shape, strides);
  pthread_mutex_lock(&p->lock);
  if (p->closed) {
    pthread_mutex_unlock(&p->lock);
    _tensor_err(TENSOR_EINVAL, "%s: the pool was freed", op);
    return NULL;
  }
  pool_key *k = key_find(p, dtype, ndim, shape, true);
  if (k == NULL) {
    pthread_mutex_unlock(&p->lock);
    _tensor_err(TENSOR_ENOMEM, "%s: out of memory", op);
    return NULL;
  }
  tensor_storage *s = k->top;
  if (s) {
    /* The header holds the storage before the pool lets go of it; its
     * acquisition, its hold and the pool's hold changes are one event of
     * this call, recorded at one stack (the header's allocation has its own). */
    uint32_t here = ta_stack_here();
    tensor *t = _tensor_header(s, false, dtype, ndim, shape, strides, 0, here);
    if (t) {
      unkeep(p, s, here);
      p->hits++;
      p->out++;
    }
    pthread_mutex_unlock(&p->lock);
    return t;
  }
  p->misses++;
  p->out++;
  pthread_mutex_unlock(&p->lock);
  s = _tensor_storage_new(_tensor_tag_pool, (size_t)n * 4);
  tensor *t = NULL;
  if (s) {
    s->pool = p;
    s->key = k;
    t = _tensor_header(s, true, dtype, ndim, shape, strides, 0, 0);
    if (t == NULL && ta_ref_release(s) == 0) ta_free(s);
  }
  if (t == NULL) {
    pthread_mutex_lock(&p->lock);
    p->out--;
    pthread_mutex_unlock(&p->lock);
  }
  return t;
}

tensor_status tensor_pool_release(tensor_pool *p, tensor *t) {
  if (t == NULL) {
    _tensor_arg_null("tensor_pool_release", "t");
    return TENSOR_EINVAL;
  }
  /* a second release of the same tensor is free.double at the caller */
  if (!_tensor_check_block(t, _tensor_tag_header, _tensor_tag_header, TA_CHECK_CALLER | TA_CHECK_FREE,
                           "tensor_pool_release") ||
      !_tensor_check_block(t->storage, _tensor_tag_storage, _tensor_tag_pool, TA_CHECK_CALLER | TA_CHECK_REF,
                           "tensor_pool_release")) {
    _tensor_arg_dead("tensor_pool_release", "t", t);
    return TENSOR_EINVAL;
  }
  if (p == NULL || t->storage->pool != p) {
    char b[TENSOR_SHAPE_STR];
    return _tensor_err(TENSOR_EINVAL, "tensor_pool_release: %s does not come from this pool", _tensor_desc(t, b));
  }
  _tensor_free(t);
  return TENSOR_OK;
}

void tensor_pool_free(tensor_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  while (p->oldest) drop(p, p->oldest);
  scratch_drop(p);
  if (p->global) {   /* the global pool lives on, emptied */
    pthread_mutex_unlock(&p->lock);
    return;
  }
  if (_tensor_pool_current == p) _tensor_pool_current = NULL;
  p->closed = true;
  bool last = p->out == 0 && !p->scratch_lent;
  pthread_mutex_unlock(&p->lock);
  if (last) pool_destroy(p);
}

/* ---- the ops' scratch buffer ------------------------------------------------- */

bool _tensor_scratch_take(_tensor_scratch *s, const char *op, int64_t n) {
  *s = (_tensor_scratch){ 0 };
  tensor_pool *p = _tensor_pool_current;
  size_t bytes = n > 0 ? (size_t)n * 4 : 0;
  if (p && n >= 0) {
    pthread_mutex_lock(&p->lock);
    if (!p->closed && !p->scratch_lent) {
      if (p->scratch_bytes < bytes || p->scratch == NULL) {
        /* grown to what this op needs: the old contents are not kept */
        void *grown = ta_aligned(_tensor_tag_scratch, 64, bytes ? bytes : 64);
        if (grown) {
          ta_hold(p, "scratch", grown);   /* replaces the hold on the old one */
          ta_free(p->scratch);
          p->scratch = grown;
          p->scratch_bytes = bytes ? bytes : 64;
        }
      }
      if (p->scratch && p->scratch_bytes >= bytes) {
        p->scratch_lent = true;
        s->data = p->scratch;
        s->pool = p;
      }
    }
    pthread_mutex_unlock(&p->lock);
    if (s->pool) return true;
  }
  s->tmp = _tensor_out(op, TENSOR_F32, 1, &n);
  if (s->tmp == NULL) return false;
  s->data = s->tmp->data;
  return true;
}

void _tensor_scratch_give(_tensor_scratch *s) {
  tensor_pool *p = s->pool;
  if (p) {
    pthread_mutex_lock(&p->lock);
    p->scratch_lent = false;
    bool last = false;
    if (p->closed) {
      scratch_drop(p);
      last = p->out == 0;
    }
    pthread_mutex_unlock(&p->lock);
    if (last) pool_destroy(p);
  }
  tensor_free(s->tmp);
  *s = (_tensor_scratch){ 0 };
}

tensor_pool_stats tensor_pool_stats_get(tensor_pool *p) {
  tensor_pool_stats st = { 0 };
  if (p == NULL) return st;
  pthread_mutex_lock(&p->lock);
  st.storages = p->storages;
  st.bytes = p->bytes;
  st.out = p->out;
  st.hits = p->hits;
  st.misses = p->misses;
  for (int b = 0; b < NBUCKETS; b++)
    for (pool_key *k = p->buckets[b]; k; k = k->next) st.keys += k->count > 0;
  pthread_mutex_unlock(&p->lock);
  st.hit_rate = st.hits + st.misses ? (double)st.hits / (double)(st.hits + st.misses) : 0.0;
  return st;
}

size_t tensor_pool_key_size(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape) {
  if (p == NULL || ndim < 0 || ndim > TENSOR_MAX_DIMS) return 0;
  pthread_mutex_lock(&p->lock);
  pool_key *k = key_find(p, dtype, ndim, shape, false);
  size_t n = k ? k->count : 0;
  pthread_mutex_unlock(&p->lock);
  return n;
}

void tensor_pool_visit(tensor_pool *p,
                       void (*fn)(tensor_dtype, int, const int64_t *, size_t, size_t, void *), void *arg) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  for (int b = 0; b < NBUCKETS; b++)
    for (pool_key *k = p->buckets[b]; k; k = k->next)
      if (k->count) fn(k->dtype, k->ndim, k->shape, k->count, k->count * k->nbytes, arg);
  pthread_mutex_unlock(&p->lock);
}

void tensor_pool_clear(tensor_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  while (p->oldest) drop(p, p->oldest);
  scratch_drop(p);
  pthread_mutex_unlock(&p->lock);
}

void tensor_pool_clear_key(tensor_pool *p, tensor_dtype dtype, int ndim, const int64_t *shape) {
  if (p == NULL || ndim < 0 || ndim > TENSOR_MAX_DIMS) return;
  pthread_mutex_lock(&p->lock);
  pool_key *k = key_find(p, dtype, ndim, shape, false);
  while (k && k->top) drop(p, k->top);
  pthread_mutex_unlock(&p->lock);
}

void tensor_pool_prune(tensor_pool *p, size_t target_bytes) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  while (p->oldest && p->bytes > target_bytes) drop(p, p->oldest);
  pthread_mutex_unlock(&p->lock);
}

void tensor_pool_reset_stats(tensor_pool *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  p->hits = p->misses = 0;
  pthread_mutex_unlock(&p->lock);
}

tensor_pool *tensor_pool_use(tensor_pool *p) {
  tensor_pool *old = _tensor_pool_current;
  _tensor_pool_current = p;
  return old;
}
