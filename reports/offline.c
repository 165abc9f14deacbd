/* offline.c - a trace read after the run, as a report_source (offline.h). */
#include "offline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(uint64_t) == sizeof(uintptr_t), "trace frames are read as uintptr_t");

struct report_offline {
  report_source       src;
  report_trace_model *m;
  char               *path;
  ta_finding         *findings;
  size_t              nfindings;
  uint64_t           *finding_seq;     /* unclean traces: the seq of each error group's first event */
  ta_summary          summary;
  ta_ref_event      **histories;       /* owned, one per finding that has one */
  ta_ref_site       **sites;           /* owned: the balance by callsite of each ref.* finding */
  ta_ref_site        *rec_sites;       /* the ledger's balances (REF_SITE records), when the trace has them */
  report_ctx         *ctx;             /* the symbolizer of the trace's modules, made on first use */
  bool                ctx_tried;
};

/* ---- the source's callbacks -------------------------------------------------- */

static size_t off_frames(void *arg, uint32_t stack, uintptr_t *frames, size_t max) {
  report_offline *o = arg;
  const report_trace_stack *s = report_trace_model_stack(o->m, stack);
  if (!s) return 0;
  size_t n = s->n < max ? s->n : max;
  for (size_t i = 0; i < n; i++) frames[i] = (uintptr_t)s->frames[i];
  return n;
}

static const char *off_tag(void *arg, ta_tag tag) {
  report_offline *o = arg;
  return report_trace_model_tag(o->m, tag);
}

static size_t off_visit(void *arg, ta_finding_fn *fn, void *fn_arg) {
  report_offline *o = arg;
  size_t i = 0;
  while (i < o->nfindings) {
    ta_finding f = o->findings[i++];   /* a copy: fn cannot change ours */
    if (fn(&f, fn_arg)) break;
  }
  return i;
}

/* The symbolizer, made when a stack is first symbolized: libdw's view of
 * the process's modules costs about 1.4 MB, and most processes of a run
 * have nothing to symbolize. */
static report_ctx *off_ctx(void *arg) {
  report_offline *o = arg;
  if (o->ctx_tried) return o->ctx;
  o->ctx_tried = true;
  const report_trace_model *m = o->m;
  report_module *mods = calloc(m->nmodules ? m->nmodules : 1, sizeof *mods);
  if (!mods) return NULL;
  for (size_t i = 0; i < m->nmodules; i++)
    mods[i] = (report_module){ m->modules[i].lo, m->modules[i].hi, m->modules[i].offset, m->modules[i].path };
  o->ctx = report_ctx_new_offline(mods, m->nmodules);
  free(mods);
  return o->ctx;
}

static ta_summary off_summary(void *arg) {
  report_offline *o = arg;
  return o->summary;
}

/* ---- findings ------------------------------------------------------------------ */

static int push(report_offline *o, size_t *cap, const ta_finding *f) {
  if (o->nfindings == *cap) {
    size_t n = *cap ? *cap * 2 : 32;
    ta_finding *v = realloc(o->findings, n * sizeof *v);
    if (!v) return -1;
    o->findings = v;
    *cap = n;
  }
  o->findings[o->nfindings++] = *f;
  return 0;
}

/* A clean exit: the FINDING groups as the ledger visited them. */
static int clean_findings(report_offline *o) {
  const report_trace_model *m = o->m;
  size_t cap = 0;
  ta_summary *s = &o->summary;
  uint64_t leaked_blocks = 0, leaked_bytes = 0;
  if (m->nref_sites && !(o->rec_sites = calloc(m->nref_sites, sizeof *o->rec_sites))) return -1;
  for (size_t i = 0; i < m->nfindings; i++) {
    const report_trace_finding *g = &m->findings[i];
    ta_finding f;
    memset(&f, 0, sizeof f);
    f.kind = g->kind;
    f.bytes = g->bytes;
    f.blocks = g->blocks;
    f.tag = g->tag;
    f.stack = g->stack;
    f.alloc_stack = g->alloc_stack;
    f.free_stack = g->free_stack;
    f.aux_stack = g->aux_stack;
    f.addr = (uintptr_t)g->addr;
    f.holder = (uintptr_t)g->holder;
    f.slot = g->slot[0] ? g->slot : NULL;
    snprintf(f.detail, sizeof f.detail, "%s", g->detail);
    if (g->nsites && o->rec_sites) {   /* the ledger's balance, as its own report printed it */
      ta_ref_site *v = o->rec_sites + g->site0;
      for (size_t k = 0; k < g->nsites; k++) {
        const tr_ref_site *r = &m->ref_sites[g->site0 + k];
        v[k] = (ta_ref_site){ .stack = r->stack, .delta = r->delta, .transitions = r->transitions,
                              .paired = r->paired, .balance = r->balance, .extra = r->extra };
      }
      f.sites = v;
      f.nsites = g->nsites;
    }
    if (push(o, &cap, &f) != 0) return -1;
    uint64_t *bytes = NULL, *blocks = NULL;
    switch (ta_kind_of(f.kind)) {
    case TA_KIND_LEAK_DIRECT: bytes = &s->direct_bytes, blocks = &s->direct_blocks; break;
    case TA_KIND_LEAK_INDIRECT: bytes = &s->indirect_bytes, blocks = &s->indirect_blocks; break;
    case TA_KIND_LEAK_POSSIBLE: bytes = &s->possible_bytes, blocks = &s->possible_blocks; break;
    case TA_KIND_LEAK_ORPHAN: bytes = &s->orphan_bytes, blocks = &s->orphan_blocks; break;
    default: if (ta_kind_is_error(f.kind)) s->errors += f.blocks; break;
    }
    if (bytes) {
      *bytes += f.bytes;
      *blocks += f.blocks;
      leaked_bytes += f.bytes;
      leaked_blocks += f.blocks;
    }
  }
  /* The blocks live at the end that the scan did not call leaked. */
  uint64_t live_bytes = 0, live_blocks = m->nblocks;
  for (size_t i = 0; i < m->nblocks; i++) live_bytes += m->blocks[i].size;
  s->reachable_bytes = live_bytes > leaked_bytes ? live_bytes - leaked_bytes : 0;
  s->reachable_blocks = live_blocks > leaked_blocks ? live_blocks - leaked_blocks : 0;
  if (m->has_summary) {   /* the ledger's own numbers: what the process's report printed */
    const tr_summary *r = &m->summary;
    *s = (ta_summary){ r->direct_bytes, r->direct_blocks, r->indirect_bytes, r->indirect_blocks,
                       r->possible_bytes, r->possible_blocks, r->reachable_bytes, r->reachable_blocks,
                       r->orphan_bytes, r->orphan_blocks, r->allocs, r->frees, r->live_bytes, r->peak_bytes,
                       r->errors };
  }
  return 0;
}

/* ---- no clean exit: errors as they happened, and what is left live ---------- */

typedef struct {
  uint64_t seq, size;
  uint32_t stack;
  uint16_t tag;
  bool     is_free;
} addr_event;

typedef struct {
  uint64_t    addr;          /* 0: empty slot */
  addr_event *ev;
  size_t      n, cap;
} addr_slot;

typedef struct {
  addr_slot *v;
  size_t     cap;            /* a power of two */
  bool       oom;
} addr_set;

static size_t addr_hash(uint64_t a, size_t cap) {
  return (size_t)((a * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static addr_slot *addr_find(addr_set *s, uint64_t a) {
  for (size_t j = addr_hash(a, s->cap);; j = (j + 1) & (s->cap - 1)) {
    if (s->v[j].addr == a) return &s->v[j];
    if (s->v[j].addr == 0) return NULL;
  }
}

static void addr_event_add(addr_set *s, uint64_t a, const addr_event *e) {
  addr_slot *k = addr_find(s, a);
  if (!k) return;
  if (k->n == k->cap) {
    size_t cap = k->cap ? k->cap * 2 : 4;
    addr_event *v = realloc(k->ev, cap * sizeof *v);
    if (!v) {
      s->oom = true;
      return;
    }
    k->ev = v;
    k->cap = cap;
  }
  k->ev[k->n++] = *e;
}

static int on_block_record(const report_trace_rec *r, void *arg) {
  addr_set *s = arg;
  if (r->type == TR_ALLOC) {
    tr_alloc a;
    memcpy(&a, r->payload, sizeof a);
    addr_event_add(s, a.addr, &(addr_event){ a.seq, a.size, a.stack, a.tag, false });
  } else if (r->type == TR_FREE) {
    tr_free f;
    memcpy(&f, r->payload, sizeof f);
    addr_event_add(s, f.addr, &(addr_event){ .seq = f.seq, .stack = f.stack, .is_free = true });
  }
  return s->oom;
}

static int by_seq(const void *a, const void *b) {
  const addr_event *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The block at addr as it was just before seq: its allocation, and the
 * free after it (if any). */
static void block_before(addr_set *s, uint64_t addr, uint64_t seq, ta_finding *f) {
  addr_slot *k = s->v ? addr_find(s, addr) : NULL;
  if (!k) return;
  const addr_event *alloc = NULL, *freed = NULL;
  for (size_t i = 0; i < k->n && k->ev[i].seq < seq; i++) {
    if (k->ev[i].is_free) {
      if (alloc) freed = &k->ev[i];
    } else {
      alloc = &k->ev[i];
      freed = NULL;
    }
  }
  if (!alloc) return;
  f->bytes = alloc->size;
  f->alloc_stack = alloc->stack;
  f->tag = alloc->tag;
  if (freed) f->free_stack = freed->stack;
}

static int error_findings(report_offline *o, const report_trace *t, size_t *cap) {
  const report_trace_model *m = o->m;
  if (!m->nfinding_events) return 0;
  addr_set s = { 0 };
  size_t want = 16;
  while (want < m->nfinding_events * 2) want *= 2;
  s.v = calloc(want, sizeof *s.v);
  if (s.v) {
    s.cap = want;
    for (size_t i = 0; i < m->nfinding_events; i++) {
      uint64_t a = m->finding_events[i].addr;
      if (!a) continue;
      size_t j = addr_hash(a, s.cap);
      while (s.v[j].addr && s.v[j].addr != a) j = (j + 1) & (s.cap - 1);
      s.v[j].addr = a;
    }
    report_trace_each(t, on_block_record, &s, NULL);
    for (size_t j = 0; j < s.cap; j++)
      if (s.v[j].n > 1) qsort(s.v[j].ev, s.v[j].n, sizeof *s.v[j].ev, by_seq);
  }
  int rc = 0;
  size_t first = o->nfindings;
  for (size_t i = 0; i < m->nfinding_events && rc == 0; i++) {
    const report_trace_finding_event *e = &m->finding_events[i];
    ta_finding f;
    memset(&f, 0, sizeof f);
    f.kind = e->kind;
    f.blocks = 1;
    f.stack = e->stack;
    f.addr = (uintptr_t)e->addr;
    block_before(&s, e->addr, e->seq, &f);
    o->summary.errors++;
    bool joined = false;
    for (size_t k = first; k < o->nfindings && !joined; k++) {
      ta_finding *g = &o->findings[k];
      if (strcmp(g->kind, f.kind) == 0 && g->stack == f.stack && g->alloc_stack == f.alloc_stack &&
          g->free_stack == f.free_stack && g->tag == f.tag) {
        g->blocks++;
        joined = true;
      }
    }
    if (!joined) {
      rc = push(o, cap, &f);
      if (rc == 0) {
        uint64_t *fs = realloc(o->finding_seq, *cap * sizeof *fs);
        if (fs) {
          o->finding_seq = fs;
          fs[o->nfindings - 1] = e->seq;
        } else {
          rc = -1;
        }
      }
    }
  }
  for (size_t j = 0; j < s.cap; j++) free(s.v[j].ev);
  free(s.v);
  return rc;
}

typedef struct { uint32_t stack; uint16_t tag; uint64_t bytes, blocks, addr, seq; } live_group;

static int by_stack_tag(const void *a, const void *b) {
  const report_trace_block *x = *(const report_trace_block *const *)a, *y = *(const report_trace_block *const *)b;
  if (x->stack != y->stack) return x->stack < y->stack ? -1 : 1;
  if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int by_bytes(const void *a, const void *b) {
  const live_group *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  if (x->blocks != y->blocks) return x->blocks < y->blocks ? 1 : -1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The blocks live at the end, grouped by (stack, tag), largest first. */
static int unclassified_findings(report_offline *o, size_t *cap) {
  const report_trace_model *m = o->m;
  if (!m->nblocks) return 0;
  const report_trace_block **b = malloc(m->nblocks * sizeof *b);
  live_group *g = malloc(m->nblocks * sizeof *g);
  if (!b || !g) {
    free(b);
    free(g);
    return -1;
  }
  for (size_t i = 0; i < m->nblocks; i++) b[i] = &m->blocks[i];
  qsort(b, m->nblocks, sizeof *b, by_stack_tag);
  size_t ng = 0;
  for (size_t i = 0; i < m->nblocks; i++) {
    if (ng && g[ng - 1].stack == b[i]->stack && g[ng - 1].tag == b[i]->tag) {
      g[ng - 1].bytes += b[i]->size;
      g[ng - 1].blocks++;
      continue;
    }
    g[ng++] = (live_group){ b[i]->stack, b[i]->tag, b[i]->size, 1, b[i]->addr, b[i]->seq };
  }
  qsort(g, ng, sizeof *g, by_bytes);
  int rc = 0;
  for (size_t i = 0; i < ng && rc == 0; i++) {
    ta_finding f;
    memset(&f, 0, sizeof f);
    f.kind = ta_kind_name(TA_KIND_UNCLASSIFIED);
    f.bytes = g[i].bytes;
    f.blocks = g[i].blocks;
    f.tag = g[i].tag;
    f.stack = g[i].stack;
    f.addr = (uintptr_t)g[i].addr;
    o->src.unclassified_bytes += g[i].bytes;
    o->src.unclassified_blocks += g[i].blocks;
    rc = push(o, cap, &f);
  }
  free(b);
  free(g);
  return rc;
}

/* ---- refcount histories, from the REF records ------------------------------------ */

typedef struct { uint64_t obj; ta_ref_event e; } obj_event;

typedef struct {
  uint64_t  *objs;           /* sorted */
  size_t     nobjs;
  obj_event *v;
  size_t     n, cap;
  bool       oom;
} ref_pass;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int by_obj_seq(const void *a, const void *b) {
  const obj_event *x = a, *y = b;
  if (x->obj != y->obj) return x->obj < y->obj ? -1 : 1;
  return x->e.seq < y->e.seq ? -1 : x->e.seq > y->e.seq;
}

static int on_ref_record(const report_trace_rec *r, void *arg) {
  ref_pass *p = arg;
  if (r->type != TR_REF) return 0;
  tr_ref x;
  memcpy(&x, r->payload, sizeof x);
  if (!bsearch(&x.obj, p->objs, p->nobjs, sizeof *p->objs, cmp_u64)) return 0;
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    obj_event *v = realloc(p->v, cap * sizeof *v);
    if (!v) {
      p->oom = true;
      return 1;
    }
    p->v = v;
    p->cap = cap;
  }
  p->v[p->n++] = (obj_event){ x.obj, { x.delta, (long)x.count, x.stack, x.thread, x.seq } };
  return 0;
}

/* ref.underflow: the object's transitions from its last init up to the bad
 * release (the first one with count -1, or the last before `until`), which
 * keeps the count it had.  ref.leak: the acquisitions since the last init
 * that no release matched, last in first out (as alloc/ref.c matches). */
static void ref_history(report_offline *o, size_t fi, const obj_event *ev, size_t n, uint64_t until) {
  ta_finding *f = &o->findings[fi];
  bool leak = ta_kind_of(f->kind) == TA_KIND_REF_LEAK;
  size_t end = n;   /* one past the last event of the history */
  if (!leak) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (ev[i].e.delta < 0 && ev[i].e.count < 0 && (!until || ev[i].e.seq < until)) bad = i;
    if (bad == n && until) {
      while (bad > 0 && ev[bad - 1].e.seq >= until) bad--;
      bad = bad ? bad - 1 : n;
    }
    if (bad == n) return;
    end = bad + 1;
  }
  size_t start = 0;
  for (size_t i = end; i-- > 0;)
    if (ev[i].e.delta == 0) {
      start = i;
      break;
    }
  if (end <= start) return;
  ta_ref_event *h = malloc((end - start) * sizeof *h);
  if (!h) return;
  size_t k = 0;
  if (!leak) {
    for (size_t i = start; i < end; i++) h[k++] = ev[i].e;
    h[k - 1].count = k > 1 && h[k - 2].count > 0 ? h[k - 2].count : 0;   /* the failed release changed nothing */
  } else {
    size_t *open = malloc((end - start) * sizeof *open);
    long *left = malloc((end - start) * sizeof *left);
    size_t top = 0;
    for (size_t i = start; open && left && i < end; i++) {
      const ta_ref_event *e = &ev[i].e;
      if (e->delta > 0) open[top] = i, left[top++] = 1;
      else if (e->delta == 0 && e->count > 0) open[top] = i, left[top++] = e->count;
      else if (e->delta < 0 && top > 0 && --left[top - 1] == 0) top--;
    }
    for (size_t j = 0; open && left && j < top; j++) h[k++] = ev[open[j]].e;
    free(open);
    free(left);
  }
  if (!k) {
    free(h);
    return;
  }
  o->histories[fi] = h;
  f->history = h;
  f->history_len = k;
  /* The balance by callsite, over the whole story (ta_ref_balance).  The
   * ledger already made the extra release the group's stack; the release
   * that went below zero is the history's last.  A trace with the
   * ledger's own balances (REF_SITE records) keeps them. */
  if (f->nsites) return;
  ta_ref_event *all = malloc((end - start) * sizeof *all);
  ta_ref_site *sites = malloc(TA_REF_SITES_MAX * sizeof *sites);
  if (all && sites) {
    for (size_t i = start; i < end; i++) all[i - start] = ev[i].e;
    size_t extra = SIZE_MAX;
    f->nsites = ta_ref_balance(all, end - start, off_frames, o, sites, TA_REF_SITES_MAX, &extra);
    f->sites = sites;
    o->sites[fi] = sites;
    sites = NULL;
    if (!leak && extra != SIZE_MAX) {
      uint32_t below = all[end - start - 1].stack;
      f->stack = all[extra].stack;
      f->aux_stack = below != f->stack ? below : 0;
    }
  }
  free(all);
  free(sites);
}

static void ref_histories(report_offline *o, const report_trace *t) {
  ref_pass p = { 0 };
  size_t nref = 0;
  for (size_t i = 0; i < o->nfindings; i++) nref += strncmp(o->findings[i].kind, "ref.", 4) == 0;
  if (!nref) return;
  o->histories = calloc(o->nfindings, sizeof *o->histories);
  o->sites = calloc(o->nfindings, sizeof *o->sites);
  p.objs = malloc(nref * sizeof *p.objs);
  if (!o->histories || !o->sites || !p.objs) {
    free(p.objs);
    return;
  }
  for (size_t i = 0; i < o->nfindings; i++)
    if (strncmp(o->findings[i].kind, "ref.", 4) == 0) p.objs[p.nobjs++] = o->findings[i].addr;
  qsort(p.objs, p.nobjs, sizeof *p.objs, cmp_u64);
  report_trace_each(t, on_ref_record, &p, NULL);
  if (!p.oom && p.n) {
    qsort(p.v, p.n, sizeof *p.v, by_obj_seq);
    for (size_t i = 0; i < o->nfindings; i++) {
      if (strncmp(o->findings[i].kind, "ref.", 4) != 0) continue;
      size_t a = 0, b;
      while (a < p.n && p.v[a].obj != o->findings[i].addr) a++;
      for (b = a; b < p.n && p.v[b].obj == o->findings[i].addr; b++) {}
      if (b > a) ref_history(o, i, p.v + a, b - a, o->finding_seq ? o->finding_seq[i] : 0);
    }
  }
  free(p.v);
  free(p.objs);
}

/* ---- the object ------------------------------------------------------------------ */

/* Whether the report needs the events replayed: it renders them (events),
 * or it has no clean exit (the errors' blocks and what was left live come
 * from the replay), or no SUMMARY record (the still-reachable bytes are
 * the blocks live at the end), or enough marks for a site to grow. */
static bool needs_replay(const report_trace_model *m, bool events) {
  return events || !m->clean_exit || !m->has_summary || m->nmarks >= 3;
}

report_offline *report_offline_open(const char *path, char *err, size_t errlen) {
  return report_offline_open_for(path, REPORT_OFFLINE_EVENTS, err, errlen);
}

report_offline *report_offline_open_for(const char *path, unsigned needs, char *err, size_t errlen) {
  report_trace *t = report_trace_open(path, err, errlen);
  if (!t) return NULL;
  report_offline *o = calloc(1, sizeof *o);
  bool records_first = (needs & REPORT_OFFLINE_RECORDS_FIRST) && !(needs & REPORT_OFFLINE_EVENTS);
  if (o && (o->path = strdup(path)) && records_first && (o->m = report_trace_model_read_records(t)) &&
      (o->m->damaged || needs_replay(o->m, false))) {
    report_trace_model_free(o->m);             /* the events are needed after all: read it whole */
    o->m = NULL;
  }
  if (o && o->path && !o->m && (o->m = report_trace_model_read(t)) &&
      needs_replay(o->m, needs & REPORT_OFFLINE_EVENTS) && report_trace_model_replay(o->m, t) != 0) {
    report_trace_model_free(o->m);
    o->m = NULL;
  }
  if (!o || !o->path || !o->m) {
    if (err && errlen) snprintf(err, errlen, "TRACE: out of memory reading %s", path);
    report_trace_close(t);
    report_offline_free(o);
    return NULL;
  }
  const report_trace_model *m = o->m;
  o->src.pid = (long)m->pid;
  o->src.arg = o;
  o->src.stack_frames = off_frames;
  o->src.tag_name = off_tag;
  o->src.visit = off_visit;
  o->src.summary = off_summary;
  o->summary.allocs = m->allocs;
  o->summary.frees = m->frees;
  o->summary.live_bytes = m->live_bytes;
  o->summary.peak_bytes = m->peak_live_bytes;
  int rc;
  if (m->clean_exit) {
    rc = clean_findings(o);
  } else {
    size_t cap = 0;
    o->src.unclassified = true;
    rc = error_findings(o, t, &cap);
    if (rc == 0) rc = unclassified_findings(o, &cap);
    if (rc == 0 && o->finding_seq) {   /* the unclassified groups have no event */
      uint64_t *fs = realloc(o->finding_seq, (o->nfindings ? o->nfindings : 1) * sizeof *fs);
      if (fs) {
        for (size_t i = 0; i < o->nfindings; i++)
          if (ta_kind_of(o->findings[i].kind) == TA_KIND_UNCLASSIFIED) fs[i] = 0;
        o->finding_seq = fs;
      } else {
        rc = -1;
      }
    }
  }
  if (rc == 0) ref_histories(o, t);
  report_trace_close(t);
  if (rc != 0) {
    if (err && errlen) snprintf(err, errlen, "TRACE: out of memory reading %s", path);
    report_offline_free(o);
    return NULL;
  }
  o->src.ctx_make = off_ctx;
  return o;
}

void report_offline_free(report_offline *o) {
  if (!o) return;
  report_ctx_free(o->ctx);
  report_trace_model_free(o->m);
  for (size_t i = 0; o->histories && i < o->nfindings; i++) free(o->histories[i]);
  free(o->histories);
  for (size_t i = 0; o->sites && i < o->nfindings; i++) free(o->sites[i]);
  free(o->sites);
  free(o->rec_sites);
  free(o->finding_seq);
  free(o->findings);
  free(o->path);
  free(o);
}

report_source *report_offline_source(report_offline *o) { return &o->src; }
const report_trace_model *report_offline_model(const report_offline *o) { return o->m; }
const char *report_offline_path(const report_offline *o) { return o->path; }
