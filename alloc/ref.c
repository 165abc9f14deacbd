/* ref.c - refcount tracking.
 *
 * Each object (any address, usually a ledger block) has a record with its
 * count and its transition history: +1/-1, the count after, the stack.  A
 * release at count 0, or on a freed block, is ref.underflow at once, with the
 * history.  At exit, objects with count > 0 are ref.leak, listing the
 * acquisitions no release matched.  Releases match acquisitions last in,
 * first out (scopes nest), like the kernel's ref_tracker keeps one entry per
 * outstanding reference.  A history longer than TAGALLOC_REF_HISTORY drops
 * its oldest matched pairs, so a long-lived object costs bounded memory.
 * Records of freed objects stay, in a bounded FIFO, so that a late release
 * can show "freed at" with the full story.
 *
 * Balance by callsite (ta_ref_balance, tagalloc.h): ref.underflow and
 * ref.leak carry the transitions grouped by stack, each releasing callsite
 * paired with the acquiring callsite whose stack shares the most outermost
 * frames with it; the first release that takes its pair's balance below
 * zero is the extra release, ref.underflow's headline.  For the seed bug of
 * a view's destructor that releases the parent's storage twice: the view
 * acquires in the training step, its destructor (called from the same step)
 * releases twice, and the parent, made and freed in main, releases last -
 * the count goes below zero at the parent's release, but the destructor's
 * second release is the one that owes: its pair (the view's acquisition)
 * had one acquisition and gets two releases.  ref.leak's headline is the
 * latest acquisition of a callsite the balance says owes: for the seed of
 * weights cloned into a collection that keeps a reference, the clone's
 * acquisition, not the model's init that the model's release (the last in,
 * first out match) left unmatched; and the unmatched acquisitions it lists
 * are those callsites' latest ones (last in, first out only when the
 * balance names none). */
#include "internal.h"

#include <stdint.h>
#include <string.h>

typedef struct ref_rec {
  uintptr_t obj;
  long count;
  bool dead;                 /* the block was freed */
  uint64_t birth;            /* the block's birth seq when it was freed */
  uint32_t free_stack;
  size_t n, cap;
  uint64_t elided;           /* matched transitions dropped from the history */
  ta_ref_event *ev;
  struct ref_rec *dead_next;
} ref_rec;

#define NSHARDS 64
#define MAX_DEAD 4096

static struct {
  pthread_mutex_t lock;
  ta_map map;
} shards[NSHARDS];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t dead_fifo[MAX_DEAD];
static size_t dead_head, dead_len;

static void shards_init(void) {
  for (int i = 0; i < NSHARDS; i++) pthread_mutex_init(&shards[i].lock, NULL);
}

static inline int shard_of(uintptr_t obj) {
  return (int)(((uint64_t)obj * 0x9E3779B97F4A7C15ull) >> 58);
}

static void rec_free(ref_rec *r) {
  _ta_meta_free(r->ev);
  _ta_meta_free(r);
}

/* Matches releases to acquisitions, last in first out; an init of count N
 * is N acquisitions.  partner[i] is the index of the event matched with
 * event i, or SIZE_MAX; keep[i] says whether acquisition i is still open.
 * Returns the number of open acquisition events. */
static size_t match(const ref_rec *r, bool *keep, size_t *partner) {
  typedef struct { size_t i; long left; } open_acq;
  open_acq *st = _ta_meta_alloc((r->n + 1) * sizeof *st);
  if (st == NULL) return 0;
  size_t top = 0;
  for (size_t i = 0; i < r->n; i++) {
    const ta_ref_event *e = &r->ev[i];
    keep[i] = false;
    if (partner) partner[i] = SIZE_MAX;
    if (e->delta > 0) {
      st[top++] = (open_acq){ i, 1 };
    } else if (e->delta == 0) {
      if (e->count > 0) st[top++] = (open_acq){ i, e->count };
    } else if (top > 0) {
      open_acq *o = &st[top - 1];
      if (partner && r->ev[o->i].delta > 0) { partner[i] = o->i; partner[o->i] = i; }
      if (--o->left == 0) top--;
    }
  }
  for (size_t k = 0; k < top; k++) keep[st[k].i] = true;
  _ta_meta_free(st);
  return top;
}

/* Drops matched pairs that lie wholly in the oldest half of the history. */
static void compact(ref_rec *r) {
  bool *keep = _ta_meta_alloc(r->n * sizeof *keep);
  size_t *partner = _ta_meta_alloc(r->n * sizeof *partner);
  if (keep && partner) {
    match(r, keep, partner);
    size_t out = 0, half = r->n / 2;
    for (size_t i = 0; i < r->n; i++) {
      if (i < half && partner[i] < half) { r->elided++; continue; }
      r->ev[out++] = r->ev[i];
    }
    if (out == r->n) {               /* nothing to drop: forget the oldest half */
      memmove(r->ev, r->ev + half, (r->n - half) * sizeof *r->ev);
      r->elided += half;
      out = r->n - half;
    }
    r->n = out;
  }
  _ta_meta_free(keep);
  _ta_meta_free(partner);
}

static void record(ref_rec *r, int delta, uint32_t stack, uint64_t seq, uint32_t thread) {
  if (r->n == r->cap) {
    if (r->cap >= (size_t)_ta_opt.ref_history) compact(r);
    if (r->n == r->cap) {
      size_t cap = r->cap ? r->cap * 2 : 4;
      ta_ref_event *ev = _ta_meta_realloc(r->ev, cap * sizeof *ev);
      if (ev == NULL) return;
      r->ev = ev;
      r->cap = cap;
    }
  }
  r->ev[r->n++] = (ta_ref_event){ delta, r->count, stack, thread, seq };
}

static ref_rec *rec_new(uintptr_t obj) {
  ref_rec *r = _ta_meta_calloc(1, sizeof *r);
  if (r) r->obj = obj;
  return r;
}

/* The record of obj, or NULL; a dead record whose address now holds a newer
 * block is forgotten.  The shard is locked. */
static ref_rec *rec_get(int sh, uintptr_t obj) {
  ref_rec *r = _ta_map_get(&shards[sh].map, obj);
  if (r && r->dead) {
    ta_block b;
    if (_ta_block_get(obj, &b) && b.state == TA_LIVE && b.seq > r->birth) {
      _ta_map_del(&shards[sh].map, obj);
      rec_free(r);
      return NULL;
    }
  }
  return r;
}

/* ---- balance by callsite ------------------------------------------------------ */

static size_t depot_frames(void *arg, uint32_t stack, uintptr_t *pcs, size_t max) {
  (void)arg;
  return ta_stack_frames(stack, pcs, max);
}

/* How far apart the innermost frames of two stacks are (the callers of
 * ta_ref_*): code of one source file is contiguous in the text segment, so
 * a constructor and the destructor that gives its reference back are near
 * each other, and a third party's acquisition is far from both. */
static uintptr_t inner_distance(const uintptr_t *a, size_t na, const uintptr_t *b, size_t nb) {
  if (na == 0 || nb == 0) return UINTPTR_MAX;
  return a[0] > b[0] ? a[0] - b[0] : b[0] - a[0];
}

/* How many outermost frames two stacks share (equal return addresses,
 * from the outer end inwards). */
static size_t shared_outer(const uintptr_t *a, size_t na, const uintptr_t *b, size_t nb) {
  size_t k = 0;
  while (k < na && k < nb && a[na - 1 - k] == b[nb - 1 - k]) k++;
  return k;
}

size_t ta_ref_balance(const ta_ref_event *ev, size_t n,
                      size_t (*frames)(void *arg, uint32_t stack, uintptr_t *pcs, size_t max), void *arg,
                      ta_ref_site *sites, size_t max, size_t *extra) {
  if (frames == NULL) frames = depot_frames;
  size_t ns = 0, first_extra = SIZE_MAX;
  size_t last_acq[TA_REF_SITES_MAX];             /* event index of each site's latest acquisition */
  if (max > TA_REF_SITES_MAX) max = TA_REF_SITES_MAX;
  for (size_t i = 0; i < n; i++) {
    const ta_ref_event *e = &ev[i];
    int delta = e->delta < 0 ? -1 : +1;           /* an init acquires its count */
    uint64_t count = e->delta == 0 ? (e->count > 0 ? (uint64_t)e->count : 0) : 1;
    if (e->delta == 0 && count == 0) continue;
    size_t s = 0;
    while (s < ns && !(sites[s].stack == e->stack && sites[s].delta == delta)) s++;
    if (s == ns) {
      if (ns == max) continue;                    /* too many callsites: this one is left out */
      sites[ns] = (ta_ref_site){ .stack = e->stack, .delta = delta, .paired = UINT32_MAX };
      if (delta < 0) {
        /* Pair it: the acquiring callsite sharing the most outer frames;
         * on a tie, the one with the most left to release, then the one
         * whose innermost frame is nearest the release's (inner_distance),
         * then the one that acquired last.  A releasing callsite that
         * shares more outer frames with an earlier releasing one (the same
         * destructor, one release in a helper) takes that one's pair. */
        uintptr_t me[TA_MAX_DEPTH], other[TA_MAX_DEPTH];
        size_t nme = frames(arg, e->stack, me, TA_MAX_DEPTH), best = 0, best_rel = 0;
        uintptr_t best_dist = UINTPTR_MAX;
        uint32_t rel_pair = UINT32_MAX;
        for (size_t a = 0; a < ns; a++) {
          size_t no = frames(arg, sites[a].stack, other, TA_MAX_DEPTH);
          size_t k = shared_outer(me, nme, other, no);
          if (sites[a].delta < 0) {
            if (sites[a].paired != UINT32_MAX && k > best_rel) best_rel = k, rel_pair = sites[a].paired;
            continue;
          }
          uintptr_t dist = inner_distance(me, nme, other, no);
          uint32_t p = sites[ns].paired;
          if (p == UINT32_MAX || k > best ||
              (k == best &&
               (sites[a].balance > sites[p].balance ||
                (sites[a].balance == sites[p].balance &&
                 (dist < best_dist || (dist == best_dist && last_acq[a] > last_acq[p])))))) {
            sites[ns].paired = (uint32_t)a;
            best = k;
            best_dist = dist;
          }
        }
        if (rel_pair != UINT32_MAX && best_rel > best) sites[ns].paired = rel_pair;
      }
      ns++;
    }
    sites[s].transitions += count;
    if (delta > 0) {
      sites[s].balance += (int64_t)count;
      last_acq[s] = i;
    } else if (sites[s].paired == UINT32_MAX) {   /* nothing acquired before it */
      sites[s].extra = 1;
      if (first_extra == SIZE_MAX) first_extra = i;
    } else if (--sites[sites[s].paired].balance < 0) {
      sites[s].extra = 1;
      if (first_extra == SIZE_MAX) first_extra = i;
    }
  }
  /* no release owes: the acquisitions that no release took back (ref.leak) */
  for (size_t s = 0; s < ns && first_extra == SIZE_MAX; s++)
    if (sites[s].delta > 0 && sites[s].balance > 0) sites[s].extra = 1;
  if (extra) *extra = first_extra;
  return ns;
}

static void underflow(const ref_rec *r, uintptr_t obj, uint32_t stack, const char *why) {
  ta_block b = { 0 };
  bool known = _ta_block_get(obj, &b);
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_REF_UNDERFLOW), .stack = stack, .addr = obj, .detail = why,
                      .history = r ? r->ev : NULL, .history_len = r ? r->n : 0 };
  ta_ref_site sites[TA_REF_SITES_MAX];
  size_t extra = SIZE_MAX;
  if (r && r->n) {
    e.nsites = ta_ref_balance(r->ev, r->n, NULL, NULL, sites, TA_REF_SITES_MAX, &extra);
    e.sites = sites;
  }
  if (extra != SIZE_MAX && r->ev[extra].stack != stack) {   /* the extra release, then where it showed */
    e.stack = r->ev[extra].stack;
    e.aux_stack = stack;
  }
  if (known) {
    e.bytes = b.size;
    e.tag = b.tag;
    e.alloc_stack = b.stack;
    e.free_stack = b.state == TA_FREED ? b.free_stack : 0;
  }
  if (r && r->dead) e.free_stack = r->free_stack;
  _ta_finding_error(&e);
}

TA_NOINLINE void ta_ref_init(void *obj, long count) {
  _ta_ensure();
  pthread_once(&once, shards_init);
  ta_thread *t = _ta_thread();
  uint32_t stack = _ta_stack_capture(1);
  uintptr_t a = (uintptr_t)obj;
  int sh = shard_of(a);
  uint64_t seq = _ta_next_seq(t, false);
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = _ta_map_get(&shards[sh].map, a);
  if (r) {
    r->n = 0;
    r->elided = 0;
    r->dead = false;
  } else if ((r = rec_new(a)) != NULL && !_ta_map_put(&shards[sh].map, a, r)) {
    rec_free(r);
    r = NULL;
  }
  if (r) {
    r->count = count;
    record(r, 0, stack, seq, t->id);
  }
  pthread_mutex_unlock(&shards[sh].lock);
  _ta_block_flag(a, TA_F_REF);
  if (_ta_tracing) _ta_trace_ref(t, a, 0, count, stack, seq);
}

/* ta_ref_acquire and ta_ref_acquire_at: the transition, recorded at stack. */
static long acquire(void *obj, uint32_t stack) {
  pthread_once(&once, shards_init);
  ta_thread *t = _ta_thread();
  uintptr_t a = (uintptr_t)obj;
  int sh = shard_of(a);
  uint64_t seq = _ta_next_seq(t, false);
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = rec_get(sh, a);
  bool fresh = false;
  if (r && r->dead) {
    pthread_mutex_unlock(&shards[sh].lock);
    ta_block b = { 0 };
    _ta_block_get(a, &b);
    ta_error_info e = { .kind = ta_kind_name(TA_KIND_USE_AFTER_FREE), .bytes = b.size, .tag = b.tag, .stack = stack,
                        .alloc_stack = b.stack, .free_stack = r->free_stack, .addr = a,
                        .detail = "a refcount acquired on a freed object" };
    _ta_finding_error(&e);
    return -1;
  }
  if (r == NULL) {            /* never initialised: starts at 0 */
    r = rec_new(a);
    if (r && !_ta_map_put(&shards[sh].map, a, r)) { rec_free(r); r = NULL; }
    fresh = r != NULL;
  }
  long count = -1;
  if (r) {
    count = ++r->count;
    record(r, +1, stack, seq, t->id);
  }
  pthread_mutex_unlock(&shards[sh].lock);
  if (fresh) _ta_block_flag(a, TA_F_REF);
  if (_ta_tracing) _ta_trace_ref(t, a, +1, count, stack, seq);
  return count;
}

TA_NOINLINE long ta_ref_acquire(void *obj) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  return acquire(obj, stack);
}

long ta_ref_acquire_at(void *obj, uint32_t stack) {
  _ta_ensure();
  return acquire(obj, stack);
}

/* ta_ref_release and ta_ref_release_at. */
static long release(void *obj, uint32_t stack) {
  pthread_once(&once, shards_init);
  ta_thread *t = _ta_thread();
  uintptr_t a = (uintptr_t)obj;
  int sh = shard_of(a);
  uint64_t seq = _ta_next_seq(t, false);
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = rec_get(sh, a);
  long count;
  if (r == NULL || r->dead || r->count <= 0) {
    if (r) record(r, -1, stack, seq, t->id);
    /* report outside the shard lock, on a copy of the history */
    ref_rec copy = { 0 };
    if (r) {
      copy = *r;
      copy.ev = _ta_meta_alloc((r->n ? r->n : 1) * sizeof *copy.ev);
      if (copy.ev) memcpy(copy.ev, r->ev, r->n * sizeof *copy.ev);
      else copy.n = 0;
    }
    pthread_mutex_unlock(&shards[sh].lock);
    ta_block b;
    bool freed_block = _ta_block_get(a, &b) && b.state == TA_FREED;
    underflow(r ? &copy : NULL, a, stack,
              r == NULL ? (freed_block ? "a release on a freed object" : "a release on an object with no refcount")
              : r->dead ? "a release on a freed object" : "a release at count 0");
    _ta_meta_free(copy.ev);
    if (_ta_tracing) _ta_trace_ref(t, a, -1, -1, stack, seq);
    return -1;
  }
  count = --r->count;
  record(r, -1, stack, seq, t->id);
  pthread_mutex_unlock(&shards[sh].lock);
  if (_ta_tracing) _ta_trace_ref(t, a, -1, count, stack, seq);
  return count;
}

TA_NOINLINE long ta_ref_release(void *obj) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  return release(obj, stack);
}

long ta_ref_release_at(void *obj, uint32_t stack) {
  _ta_ensure();
  return release(obj, stack);
}

long ta_ref_count(const void *obj) {
  pthread_once(&once, shards_init);
  uintptr_t a = (uintptr_t)obj;
  int sh = shard_of(a);
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = rec_get(sh, a);
  long c = r && !r->dead ? r->count : -1;
  pthread_mutex_unlock(&shards[sh].lock);
  return c;
}

void _ta_ref_on_free(uintptr_t a, uint32_t free_stack) {
  pthread_once(&once, shards_init);
  int sh = shard_of(a);
  ta_block b;
  uint64_t birth = _ta_block_get(a, &b) ? b.seq : 0;
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = _ta_map_get(&shards[sh].map, a);
  if (r && !r->dead) {
    r->dead = true;
    r->birth = birth;
    r->free_stack = free_stack;
  }
  pthread_mutex_unlock(&shards[sh].lock);
  if (r == NULL) return;
  /* Keep at most MAX_DEAD dead records: forget the oldest. */
  uintptr_t old = 0;
  pthread_mutex_lock(&dead_lock);
  if (dead_len == MAX_DEAD) {
    old = dead_fifo[dead_head];
    dead_head = (dead_head + 1) % MAX_DEAD;
    dead_len--;
  }
  dead_fifo[(dead_head + dead_len++) % MAX_DEAD] = a;
  pthread_mutex_unlock(&dead_lock);
  if (old) {
    int osh = shard_of(old);
    pthread_mutex_lock(&shards[osh].lock);
    ref_rec *o = _ta_map_get(&shards[osh].map, old);
    if (o && o->dead) rec_free(_ta_map_del(&shards[osh].map, old));
    pthread_mutex_unlock(&shards[osh].lock);
  }
}

typedef struct { ref_rec **v; size_t n, cap; } rec_list;

static void collect_live(uintptr_t key, void *value, void *arg) {
  (void)key;
  ref_rec *r = value;
  rec_list *l = arg;
  if (r->dead || r->count <= 0) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    ref_rec **v = _ta_meta_realloc(l->v, cap * sizeof *v);
    if (v == NULL) return;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = r;
}

void _ta_ref_exit(void) {
  pthread_once(&once, shards_init);
  for (int sh = 0; sh < NSHARDS; sh++) {
    rec_list l = { 0 };
    pthread_mutex_lock(&shards[sh].lock);
    _ta_map_each(&shards[sh].map, collect_live, &l);
    for (size_t i = 0; i < l.n; i++) {
      ref_rec *r = l.v[i];
      /* References each kept by a declared hold (a tensor header holding
       * its storage, a layer its parameters) are accounted for: the holder
       * is the owner of each, and a leaked holder is a leak of its own. */
      if (r->count > 0 && (size_t)r->count <= _ta_hold_count_to(r->obj)) continue;
      bool *keep = _ta_meta_alloc((r->n ? r->n : 1) * sizeof *keep);
      ta_ref_event *open = _ta_meta_alloc((r->n ? r->n : 1) * sizeof *open);
      if (keep == NULL || open == NULL) { _ta_meta_free(keep); _ta_meta_free(open); continue; }
      match(r, keep, NULL);
      size_t k = 0;
      for (size_t j = 0; j < r->n; j++) if (keep[j]) open[k++] = r->ev[j];
      ta_block b = { 0 };
      bool known = _ta_block_get(r->obj, &b) && b.state == TA_LIVE;
      ta_ref_site sites[TA_REF_SITES_MAX];
      size_t nsites = ta_ref_balance(r->ev, r->n, NULL, NULL, sites, TA_REF_SITES_MAX, NULL);
      /* the headline: the latest acquisition of a callsite the balance
       * says owes (acquired more than its paired releases gave back);
       * else the latest acquisition no release matched */
      uint32_t head = k ? open[k - 1].stack : 0;
      bool owed = false;
      for (size_t j = r->n; j-- > 0 && !owed;)
        for (size_t s = 0; s < nsites && !owed && r->ev[j].delta >= 0; s++)
          if (sites[s].delta > 0 && sites[s].extra && sites[s].stack == r->ev[j].stack) {
            head = r->ev[j].stack;
            owed = true;
          }
      if (owed) {
        /* the unmatched acquisitions likewise: the latest `balance` ones
         * of each callsite that owes, oldest first */
        memset(keep, 0, r->n * sizeof *keep);
        for (size_t s = 0; s < nsites; s++) {
          int64_t left = sites[s].delta > 0 && sites[s].extra ? sites[s].balance : 0;
          for (size_t j = r->n; j-- > 0 && left > 0;)
            if (r->ev[j].delta >= 0 && r->ev[j].stack == sites[s].stack) {
              keep[j] = true;
              left -= r->ev[j].delta == 0 ? (r->ev[j].count > 0 ? r->ev[j].count : 1) : 1;
            }
        }
        k = 0;
        for (size_t j = 0; j < r->n; j++) if (keep[j]) open[k++] = r->ev[j];
      }
      _ta_findings_ref_leak(known ? b.size : 0, known ? b.tag : TA_ANY, head, known ? b.stack : 0, r->obj, open, k,
                            sites, nsites);
      _ta_meta_free(keep);
      _ta_meta_free(open);
    }
    pthread_mutex_unlock(&shards[sh].lock);
    _ta_meta_free(l.v);
  }
}

void _ta_ref_fork(int phase) {
  pthread_once(&once, shards_init);
  if (phase == TA_FORK_PREPARE) {
    for (int i = 0; i < NSHARDS; i++) pthread_mutex_lock(&shards[i].lock);
    pthread_mutex_lock(&dead_lock);
  } else {
    pthread_mutex_unlock(&dead_lock);
    for (int i = NSHARDS - 1; i >= 0; i--) pthread_mutex_unlock(&shards[i].lock);
  }
}

/* A holder that keeps a reference on obj found it freed (ta_check_block
 * with TA_CHECK_REF): some release was one too many.  ref.underflow at
 * `stack`, with the object's history. */
bool _ta_ref_is_dead(uintptr_t a) {
  pthread_once(&once, shards_init);
  int sh = shard_of(a);
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = _ta_map_get(&shards[sh].map, a);
  bool dead = r != NULL && r->dead;
  pthread_mutex_unlock(&shards[sh].lock);
  return dead;
}

void _ta_ref_report_dead(uintptr_t a, uint32_t stack, const char *why) {
  pthread_once(&once, shards_init);
  int sh = shard_of(a);
  ref_rec copy = { 0 };
  bool have = false;
  pthread_mutex_lock(&shards[sh].lock);
  ref_rec *r = _ta_map_get(&shards[sh].map, a);
  if (r) {
    copy = *r;
    copy.ev = _ta_meta_alloc((r->n ? r->n : 1) * sizeof *copy.ev);
    if (copy.ev) memcpy(copy.ev, r->ev, r->n * sizeof *copy.ev);
    else copy.n = 0;
    have = true;
  }
  pthread_mutex_unlock(&shards[sh].lock);
  underflow(have ? &copy : NULL, a, stack, why);
  _ta_meta_free(copy.ev);
}
