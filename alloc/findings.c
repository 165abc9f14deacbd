/* findings.c - the findings store.
 *
 * Errors (double free, underflow, bad holds, ...) are recorded as they
 * happen, grouped at once by (kind, tag, stacks) so that a bug hit a million
 * times costs one group, and each first occurrence is announced on the error
 * path.  Leak findings are replaced by every scan.  Renderers read both
 * through ta_findings_visit() and never see the store itself. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  ta_finding f;
  uint64_t first_seq;
  ta_ref_event *history;        /* owned copy */
  char *slot;                   /* owned copy */
  ta_ref_site *sites;           /* owned copy */
} group;

typedef struct {
  group *v;
  size_t n, cap;
} group_list;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static group_list errors, leaks;
static group_list added;          /* ta_finding_add: classified by their callers, kept by scans */
static ta_summary leak_summary;
static size_t error_occurrences_dropped;

#define MAX_ERROR_GROUPS 100000

static bool list_push(group_list *l, const group *g) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    group *v = _ta_meta_realloc(l->v, cap * sizeof *v);
    if (v == NULL) return false;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *g;
  return true;
}

static void list_clear(group_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    _ta_meta_free(l->v[i].history);
    _ta_meta_free(l->v[i].slot);
    _ta_meta_free(l->v[i].sites);
  }
  l->n = 0;
}

static bool same_error(const group *g, const ta_error_info *e) {
  return strcmp(g->f.kind, e->kind) == 0 && g->f.tag == e->tag && g->f.stack == e->stack &&
         g->f.alloc_stack == e->alloc_stack && g->f.free_stack == e->free_stack &&
         g->f.aux_stack == e->aux_stack &&
         (g->slot == NULL) == (e->slot == NULL) && (!e->slot || strcmp(g->slot, e->slot) == 0);
}

static void fill_group(group *g, const char *kind, uint64_t bytes, ta_tag tag, uint32_t stack,
                       uintptr_t addr, uint32_t aux_stack, uintptr_t holder, const char *slot,
                       const ta_ref_event *history, size_t history_len, const char *detail) {
  memset(g, 0, sizeof *g);
  g->f.kind = kind;
  g->f.bytes = bytes;
  g->f.blocks = 1;
  g->f.tag = tag;
  g->f.stack = stack;
  g->f.aux_stack = aux_stack;
  g->f.addr = addr;
  g->f.holder = holder;
  if (slot) g->slot = _ta_meta_strdup(slot);
  if (history_len) {
    g->history = _ta_meta_alloc(history_len * sizeof *history);
    if (g->history) {
      memcpy(g->history, history, history_len * sizeof *history);
      g->f.history_len = history_len;
    }
  }
  if (detail) _ta_snprintf(g->f.detail, sizeof g->f.detail, "%s", detail);
}

static void group_sites(group *g, const ta_ref_site *sites, size_t nsites) {
  if (!nsites) return;
  g->sites = _ta_meta_alloc(nsites * sizeof *sites);
  if (!g->sites) return;
  memcpy(g->sites, sites, nsites * sizeof *sites);
  g->f.nsites = nsites;
}

void _ta_finding_error(const ta_error_info *e) {
  bool first = true;
  pthread_mutex_lock(&lock);
  for (size_t i = errors.n; i-- > 0;) {     /* recent groups first */
    if (same_error(&errors.v[i], e)) {
      errors.v[i].f.blocks++;
      first = false;
      break;
    }
  }
  if (first) {
    group g;
    fill_group(&g, e->kind, e->bytes, e->tag, e->stack, e->addr, e->aux_stack, e->holder, e->slot,
               e->history, e->history_len, e->detail);
    g.f.alloc_stack = e->alloc_stack;
    g.f.free_stack = e->free_stack;
    group_sites(&g, e->sites, e->nsites);
    g.first_seq = _ta_seq_now();
    if (errors.n >= MAX_ERROR_GROUPS || !list_push(&errors, &g)) {
      error_occurrences_dropped++;
      _ta_meta_free(g.history);
      _ta_meta_free(g.slot);
      _ta_meta_free(g.sites);
    }
  }
  pthread_mutex_unlock(&lock);
  if (_ta_tracing) _ta_trace_finding(e->kind, e->addr, e->stack, _ta_seq_now());
  if (first)
    _ta_error(TA_EFINDING, "%s at %p%s%s (the exit report has the stacks)", e->kind, (void *)e->addr,
              e->detail && *e->detail ? ": " : "", e->detail ? e->detail : "");
}

/* Same group: kind, tag, stacks and detail. */
static bool same_added(const group *g, const char *kind, ta_tag tag, uint32_t stack, uint32_t aux,
                       const char *detail) {
  return g->f.stack == stack && g->f.tag == tag && g->f.aux_stack == aux &&
         strcmp(g->f.kind, kind) == 0 && strncmp(g->f.detail, detail ? detail : "",
                                                  sizeof g->f.detail - 1) == 0;
}

/* The kind must stay valid (a string literal): groups keep the pointer. */
void ta_finding_add(const char *kind, ta_tag tag, uintptr_t addr, uint64_t bytes, uint32_t stack,
                    uint32_t aux_stack, const char *detail) {
  if (kind == NULL || *kind == '\0') {
    _ta_error(TA_EINVAL, "ta_finding_add: no kind");
    return;
  }
  bool first = true;
  pthread_mutex_lock(&lock);
  for (size_t i = added.n; i-- > 0;) {
    group *g = &added.v[i];
    if (same_added(g, kind, tag, stack, aux_stack, detail)) {
      g->f.bytes += bytes;
      g->f.blocks++;
      first = false;
      break;
    }
  }
  if (first) {
    group g;
    fill_group(&g, kind, bytes, tag, stack, addr, aux_stack, 0, NULL, NULL, 0, detail);
    g.first_seq = _ta_seq_now();
    if (added.n >= MAX_ERROR_GROUPS || !list_push(&added, &g)) error_occurrences_dropped++;
  }
  pthread_mutex_unlock(&lock);
  if (_ta_tracing) _ta_trace_finding(kind, addr, stack, _ta_seq_now());
}

void _ta_findings_leaks_begin(void) {
  pthread_mutex_lock(&lock);
  list_clear(&leaks);
  memset(&leak_summary, 0, sizeof leak_summary);
  pthread_mutex_unlock(&lock);
}

/* Same group: a ref.leak group keeps the history of its first object. */
static bool same_leak(const group *g, const char *kind, ta_tag tag, uint32_t stack, uint32_t aux) {
  return g->f.stack == stack && g->f.tag == tag &&
         g->f.aux_stack == aux && strcmp(g->f.kind, kind) == 0;
}

void _ta_findings_leak(const char *kind, uint64_t bytes, ta_tag tag, uint32_t stack,
                       uint32_t alloc_stack, uintptr_t addr, uint32_t aux_stack, uintptr_t holder,
                       const char *slot, const ta_ref_event *history, size_t history_len) {
  pthread_mutex_lock(&lock);
  /* The scan reports blocks sorted by stack, so equal keys arrive together;
   * leaks_merge() joins the rest. */
  group *last = leaks.n ? &leaks.v[leaks.n - 1] : NULL;
  if (last && same_leak(last, kind, tag, stack, aux_stack)) {
    last->f.bytes += bytes;
    last->f.blocks++;
  } else {
    group g;
    fill_group(&g, kind, bytes, tag, stack, addr, aux_stack, holder, slot, history, history_len, NULL);
    g.f.alloc_stack = alloc_stack;
    list_push(&leaks, &g);
  }
  pthread_mutex_unlock(&lock);
}

void _ta_findings_ref_leak(uint64_t bytes, ta_tag tag, uint32_t stack, uint32_t alloc_stack, uintptr_t addr,
                           const ta_ref_event *history, size_t history_len, const ta_ref_site *sites,
                           size_t nsites) {
  pthread_mutex_lock(&lock);
  group *last = leaks.n ? &leaks.v[leaks.n - 1] : NULL;
  if (last && same_leak(last, ta_kind_name(TA_KIND_REF_LEAK), tag, stack, 0)) {
    last->f.bytes += bytes;
    last->f.blocks++;
  } else {
    group g;
    fill_group(&g, ta_kind_name(TA_KIND_REF_LEAK), bytes, tag, stack, addr, 0, 0, NULL, history, history_len, NULL);
    g.f.alloc_stack = alloc_stack;
    group_sites(&g, sites, nsites);
    if (!list_push(&leaks, &g)) {
      _ta_meta_free(g.history);
      _ta_meta_free(g.sites);
    }
  }
  pthread_mutex_unlock(&lock);
}

static int by_key(const void *a, const void *b) {
  const group *x = a, *y = b;
  int k = strcmp(x->f.kind, y->f.kind);
  if (k) return k;
  if (x->f.tag != y->f.tag) return x->f.tag < y->f.tag ? -1 : 1;
  if (x->f.stack != y->f.stack) return x->f.stack < y->f.stack ? -1 : 1;
  if (x->f.aux_stack != y->f.aux_stack) return x->f.aux_stack < y->f.aux_stack ? -1 : 1;
  return x->f.addr < y->f.addr ? -1 : x->f.addr > y->f.addr;
}

/* Joins groups of the same key. */
static void leaks_merge(void) {
  if (leaks.n < 2) return;
  qsort(leaks.v, leaks.n, sizeof *leaks.v, by_key);
  size_t out = 1;
  for (size_t i = 1; i < leaks.n; i++) {
    group *g = &leaks.v[i], *h = &leaks.v[out - 1];
    if (same_leak(h, g->f.kind, g->f.tag, g->f.stack, g->f.aux_stack)) {
      h->f.bytes += g->f.bytes;
      h->f.blocks += g->f.blocks;
      _ta_meta_free(g->slot);
      _ta_meta_free(g->history);
      _ta_meta_free(g->sites);
    } else {
      leaks.v[out++] = *g;
    }
  }
  leaks.n = out;
}

void _ta_findings_leaks_end(const ta_summary *s) {
  pthread_mutex_lock(&lock);
  leaks_merge();
  leak_summary = *s;
  pthread_mutex_unlock(&lock);
}

/* The order ta_findings_visit lists leak-like groups in, which the text and
 * JSON reports keep: the scan's kinds as memcheck lists them (definite,
 * orphaned, indirect, possible), then refcounts and device memory, then the
 * rest (the reports' severity, ta_kind_rank, orders their kind totals and
 * the page's table). */
static int visit_rank(const char *kind) {
  static const ta_kind order[] = { TA_KIND_LEAK_DIRECT, TA_KIND_LEAK_ORPHAN, TA_KIND_LEAK_INDIRECT,
                                   TA_KIND_LEAK_POSSIBLE, TA_KIND_REF_LEAK, TA_KIND_GPU_LEAK,
                                   TA_KIND_GPU_POOL_RETAINED };
  ta_kind k = ta_kind_of(kind);
  int n = (int)(sizeof order / sizeof *order);
  for (int i = 0; i < n; i++)
    if (k == order[i]) return i;
  return n;
}

static int by_rank(const void *a, const void *b) {
  const group *x = a, *y = b;
  int r = visit_rank(x->f.kind) - visit_rank(y->f.kind);
  if (r) return r;
  if (x->f.bytes != y->f.bytes) return x->f.bytes < y->f.bytes ? 1 : -1;
  return x->f.stack < y->f.stack ? -1 : x->f.stack > y->f.stack;
}

/* A copy of g that owns its own history and slot. */
static void group_copy(group *dst, const group *src) {
  *dst = *src;
  dst->history = NULL;
  if (src->f.history_len) {
    dst->history = _ta_meta_alloc(src->f.history_len * sizeof(ta_ref_event));
    if (dst->history) memcpy(dst->history, src->history, src->f.history_len * sizeof(ta_ref_event));
    else dst->f.history_len = 0;
  }
  dst->slot = src->slot ? _ta_meta_strdup(src->slot) : NULL;
  dst->sites = NULL;
  if (src->f.nsites) {
    dst->sites = _ta_meta_alloc(src->f.nsites * sizeof(ta_ref_site));
    if (dst->sites) memcpy(dst->sites, src->sites, src->f.nsites * sizeof(ta_ref_site));
    else dst->f.nsites = 0;
  }
}

size_t ta_findings_visit(ta_finding_fn *fn, void *arg) {
  /* Copy under the lock, visit without it: fn may symbolize, allocate, or
   * even record findings of its own. */
  pthread_mutex_lock(&lock);
  size_t n = errors.n + leaks.n + added.n, k = 0;
  group *copy = _ta_meta_alloc((n ? n : 1) * sizeof *copy);
  if (copy == NULL) {
    pthread_mutex_unlock(&lock);
    return 0;
  }
  for (size_t i = 0; i < errors.n; i++) group_copy(&copy[k++], &errors.v[i]);
  size_t nerr = k;
  for (size_t i = 0; i < leaks.n; i++) group_copy(&copy[k++], &leaks.v[i]);
  for (size_t i = 0; i < added.n; i++) group_copy(&copy[k++], &added.v[i]);
  pthread_mutex_unlock(&lock);
  qsort(copy + nerr, k - nerr, sizeof *copy, by_rank);
  size_t visited = 0;
  bool stop = false;
  for (size_t i = 0; i < k; i++) {
    copy[i].f.history = copy[i].history;
    copy[i].f.slot = copy[i].slot;
    copy[i].f.sites = copy[i].sites;
    if (!stop) {
      visited++;
      stop = fn(&copy[i].f, arg) != 0;
    }
    _ta_meta_free(copy[i].history);
    _ta_meta_free(copy[i].slot);
    _ta_meta_free(copy[i].sites);
  }
  _ta_meta_free(copy);
  return visited;
}

ta_summary ta_summary_get(void) {
  pthread_mutex_lock(&lock);
  ta_summary s = leak_summary;
  uint64_t errs = 0;
  for (size_t i = 0; i < errors.n; i++) errs += errors.v[i].f.blocks;
  /* Findings added by their callers (ta_finding_add) count as errors when
   * their kind is one: gpu.purge-referenced is an error like free.double. */
  for (size_t i = 0; i < added.n; i++)
    if (ta_kind_is_error(added.v[i].f.kind)) errs += added.v[i].f.blocks;
  s.errors = errs + error_occurrences_dropped;
  pthread_mutex_unlock(&lock);
  _ta_summary_counts(&s);
  return s;
}

size_t ta_findings_count(const char *kind) {
  size_t n = 0;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < errors.n; i++)
    if (kind == NULL || strcmp(errors.v[i].f.kind, kind) == 0) n += errors.v[i].f.blocks;
  for (size_t i = 0; i < leaks.n; i++)
    if (kind == NULL || strcmp(leaks.v[i].f.kind, kind) == 0) n += leaks.v[i].f.blocks;
  for (size_t i = 0; i < added.n; i++)
    if (kind == NULL || strcmp(added.v[i].f.kind, kind) == 0) n += added.v[i].f.blocks;
  pthread_mutex_unlock(&lock);
  return n;
}

void ta_findings_clear(void) {
  pthread_mutex_lock(&lock);
  list_clear(&errors);
  list_clear(&leaks);
  list_clear(&added);
  memset(&leak_summary, 0, sizeof leak_summary);
  error_occurrences_dropped = 0;
  pthread_mutex_unlock(&lock);
}

void _ta_findings_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&lock);
  else pthread_mutex_unlock(&lock);
}

/* ---- values read from memory the ledger filled ---------------------------------- */

static bool all_bytes(uint64_t v, unsigned width, unsigned char byte) {
  for (unsigned i = 0; i < width; i++)
    if (((v >> (8 * i)) & 0xff) != byte) return false;
  return true;
}

const char *ta_poison_explain(uint64_t v, unsigned width) {
  _ta_options_init();
  unsigned widths[2] = { width, 0 };
  if (width == 0) widths[0] = 8, widths[1] = 4;
  for (int k = 0; k < 2 && widths[k]; k++) {
    unsigned w = widths[k];
    if (w > 8) w = 8;
    /* narrower than 8 bytes: the rest is zero, or a sign extension */
    if (w < 8 && (v >> (8 * w)) != 0 && (v >> (8 * w)) != (UINT64_MAX >> (8 * w))) continue;
    if (all_bytes(v, w, (unsigned char)_ta_opt.poison))
      return " (the freed-memory poison: read from a freed block)";
    if (_ta_opt.fill >= 0 && all_bytes(v, w, (unsigned char)_ta_opt.fill) && _ta_opt.fill != 0)
      return " (the fill of new blocks: read before it was written)";
    if (all_bytes(v, w, TA_PAD_BYTE))
      return " (the guard bytes past a block's end: read past the end)";
  }
  return "";
}
