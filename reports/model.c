/* model.c - the report model (model.h): a process's findings with the
 * suppressions applied and the totals counted, its stacks symbolized on
 * demand, and what a trace adds (growth, callsites, timeline). */
#include "model.h"
#include "offline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------ */

typedef struct chunk {
  struct chunk *next;
  size_t        used, cap;
  char          data[];
} chunk;

typedef struct {                 /* strings and small copies, freed together */
  chunk *head;
} pool;

static void *pool_alloc(pool *p, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!p->head || p->head->cap - p->head->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    chunk *c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->next = p->head;
    c->used = 0;
    c->cap = cap;
    p->head = c;
  }
  void *r = p->head->data + p->head->used;
  p->head->used += n;
  return r;
}

static char *pool_str(pool *p, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = pool_alloc(p, n);
  if (d) memcpy(d, s, n);
  return d;
}

static void pool_free(pool *p) {
  for (chunk *c = p->head, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  p->head = NULL;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

static size_t hash_u32(uint32_t x) {
  uint64_t h = x * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 29);
}

static size_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
}

/* ---- the process --------------------------------------------------------------- */

typedef struct {
  pool            mem;
  report_mstack **stacks;        /* open addressing by id; NULL: empty */
  size_t          cap, n;
  report_offline *offline;       /* owned, for processes of the model */
  size_t          gcap;
} proc_priv;

static report_group *group_push(report_process *p) {
  proc_priv *pv = p->priv;
  if (p->ngroups == pv->gcap) {
    size_t cap = pv->gcap ? pv->gcap * 2 : 16;
    report_group *g = realloc(p->groups, cap * sizeof *g);
    if (!g) return NULL;
    p->groups = g;
    pv->gcap = cap;
  }
  report_group *g = &p->groups[p->ngroups++];
  memset(g, 0, sizeof *g);
  return g;
}

typedef struct {
  report_process      *p;
  report_suppressions *supp;
  ta_summary           cut;
  uint64_t             cut_unclassified_bytes, cut_unclassified_blocks;
  bool                 oom;
} build;

/* Counts a suppressed leak group into the cut of its category. */
static void cut_add(build *b, const char *kind, uint64_t bytes, uint64_t blocks) {
  uint64_t *by = NULL, *bl = NULL;
  ta_summary *c = &b->cut;
  switch (ta_kind_of(kind)) {
  case TA_KIND_LEAK_DIRECT: by = &c->direct_bytes, bl = &c->direct_blocks; break;
  case TA_KIND_LEAK_INDIRECT: by = &c->indirect_bytes, bl = &c->indirect_blocks; break;
  case TA_KIND_LEAK_POSSIBLE: by = &c->possible_bytes, bl = &c->possible_blocks; break;
  case TA_KIND_LEAK_ORPHAN: by = &c->orphan_bytes, bl = &c->orphan_blocks; break;
  case TA_KIND_UNCLASSIFIED: by = &b->cut_unclassified_bytes, bl = &b->cut_unclassified_blocks; break;
  default: break;
  }
  if (!by) return;
  *by += bytes;
  *bl += blocks;
  b->p->suppressed_bytes += bytes;
  b->p->suppressed_blocks += blocks;
}

static int on_group(const ta_finding *f, void *arg) {
  build *b = arg;
  report_process *p = b->p;
  proc_priv *pv = p->priv;
  if (!f || !f->kind) return 0;
  if (b->supp && report_suppressed(f, &p->src, b->supp)) {
    cut_add(b, f->kind, f->bytes, f->blocks);
    return 0;
  }
  report_group *g = group_push(p);
  if (!g) {
    b->oom = true;
    return 1;
  }
  g->kind = pool_str(&pv->mem, f->kind);
  g->bytes = f->bytes;
  g->blocks = f->blocks;
  g->addr = f->addr;
  g->holder = f->holder;
  g->tag = f->tag;
  g->tag_name = f->tag != TA_ANY ? pool_str(&pv->mem, report_source_tag(&p->src, f->tag)) : NULL;
  g->slot = pool_str(&pv->mem, f->slot);
  char d[sizeof f->detail + 1];
  memcpy(d, f->detail, sizeof f->detail);
  d[sizeof f->detail] = '\0';
  g->detail = pool_str(&pv->mem, d);
  g->stack = f->stack;
  g->alloc_stack = f->alloc_stack;
  g->free_stack = f->free_stack;
  g->aux_stack = f->aux_stack;
  if (f->history && f->history_len) {
    ta_ref_event *h = pool_alloc(&pv->mem, f->history_len * sizeof *h);
    if (h) {
      memcpy(h, f->history, f->history_len * sizeof *h);
      g->history = h;
      g->history_len = f->history_len;
    }
  }
  if (f->sites && f->nsites) {
    ta_ref_site *st = pool_alloc(&pv->mem, f->nsites * sizeof *st);
    if (st) {
      memcpy(st, f->sites, f->nsites * sizeof *st);
      g->sites = st;
      g->nsites = f->nsites;
    }
  }
  if (!g->kind || !g->detail || (f->slot && !g->slot)) b->oom = true;
  return b->oom;
}

static int by_rank(const void *a, const void *b) {
  const report_kind_total *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return strcmp(x->kind, y->kind);
}

/* Per-kind totals and findings_count, from the groups. */
static bool count_kinds(report_process *p) {
  free(p->kinds);
  p->kinds = NULL;
  p->nkinds = 0;
  p->findings_count = 0;
  if (!p->ngroups) return true;
  p->kinds = calloc(p->ngroups, sizeof *p->kinds);
  if (!p->kinds) return false;
  for (size_t i = 0; i < p->ngroups; i++) {
    const report_group *g = &p->groups[i];
    /* growth is still reachable memory: a warning, not a problem for the exit status */
    if (!ta_kind_is_held(g->kind)) p->findings_count++;
    report_kind_total *k = NULL;
    for (size_t j = 0; j < p->nkinds && !k; j++)
      if (strcmp(p->kinds[j].kind, g->kind) == 0) k = &p->kinds[j];
    if (!k) {
      k = &p->kinds[p->nkinds++];
      k->kind = g->kind;
      k->rank = ta_kind_rank(g->kind);
    }
    k->groups++;
    k->bytes += g->bytes;
    k->blocks += g->blocks;
  }
  qsort(p->kinds, p->nkinds, sizeof *p->kinds, by_rank);
  return true;
}

static char **copy_argv(char *const *argv, int argc) {
  char **v = calloc((size_t)argc + 1, sizeof *v);
  if (!v) return NULL;
  for (int i = 0; i < argc; i++)
    if (!(v[i] = strdup(argv[i] ? argv[i] : ""))) {
      for (int j = 0; j < i; j++) free(v[j]);
      free(v);
      return NULL;
    }
  return v;
}

static void free_argv(char **v, int argc) {
  if (!v) return;
  for (int i = 0; i < argc; i++) free(v[i]);
  free(v);
}

/* The patterns that suppressed something, copied (the suppressions object
 * may go before the model). */
static bool copy_used(report_process *p, report_suppressions *supp) {
  proc_priv *pv = p->priv;
  free(p->suppressions_used);
  p->suppressions_used = NULL;
  p->nsuppressions_used = 0;
  size_t nu = supp ? report_suppressions_used(supp, NULL, 0) : 0;
  if (!nu) return true;
  p->suppressions_used = calloc(nu, sizeof *p->suppressions_used);
  if (!p->suppressions_used) return false;
  nu = report_suppressions_used(supp, p->suppressions_used, nu);
  for (size_t i = 0; i < nu; i++) {
    p->suppressions_used[i].type = pool_str(&pv->mem, p->suppressions_used[i].type);
    p->suppressions_used[i].pattern = pool_str(&pv->mem, p->suppressions_used[i].pattern);
  }
  p->nsuppressions_used = nu;
  return true;
}

report_process *report_process_new(const report_source *src, const report_process_info *info) {
  report_process *p = calloc(1, sizeof *p);
  proc_priv *pv = calloc(1, sizeof *pv);
  if (!p || !pv) {
    free(p);
    free(pv);
    return NULL;
  }
  p->priv = pv;
  p->src = *src;
  p->pid = src->pid;
  p->ppid = info ? info->ppid : -1;
  p->exit_code = info ? info->exit_code : -1;
  p->signal = info ? info->signal : 0;
  p->clean_exit = info && info->clean_exit >= 0 ? info->clean_exit : -1;
  if (p->clean_exit < 0 && src->unclassified) p->clean_exit = 0;
  p->unclassified = src->unclassified;
  bool ok = true;
  if (info && info->trace) ok = (p->trace = strdup(info->trace)) != NULL;
  if (ok && info && info->argv) {
    p->argv = copy_argv((char *const *)info->argv, info->argc);
    p->argc = info->argc;
    ok = p->argv != NULL;
  }

  build b = { .p = p, .supp = src->suppressions ? src->suppressions : report_suppressions_default() };
  if (b.supp) report_suppressions_reset_used(b.supp);
  if (ok) src->visit(src->arg, on_group, &b);
  ok = ok && !b.oom;

  ta_summary s = src->summary(src->arg);
  s.direct_bytes = minus(s.direct_bytes, b.cut.direct_bytes);
  s.direct_blocks = minus(s.direct_blocks, b.cut.direct_blocks);
  s.indirect_bytes = minus(s.indirect_bytes, b.cut.indirect_bytes);
  s.indirect_blocks = minus(s.indirect_blocks, b.cut.indirect_blocks);
  s.possible_bytes = minus(s.possible_bytes, b.cut.possible_bytes);
  s.possible_blocks = minus(s.possible_blocks, b.cut.possible_blocks);
  s.orphan_bytes = minus(s.orphan_bytes, b.cut.orphan_bytes);
  s.orphan_blocks = minus(s.orphan_blocks, b.cut.orphan_blocks);
  p->summary = s;
  p->unclassified_bytes = minus(src->unclassified_bytes, b.cut_unclassified_bytes);
  p->unclassified_blocks = minus(src->unclassified_blocks, b.cut_unclassified_blocks);

  ok = ok && copy_used(p, b.supp) && count_kinds(p);
  if (!ok) {
    report_process_free(p);
    return NULL;
  }
  return p;
}

void report_process_free(report_process *p) {
  if (!p) return;
  proc_priv *pv = p->priv;
  if (pv) {
    for (size_t i = 0; i < pv->cap; i++)
      if (pv->stacks[i]) free(pv->stacks[i]->frames);
    free(pv->stacks);
    pool_free(&pv->mem);
    report_offline_free(pv->offline);
    free(pv);
  }
  free_argv(p->argv, p->argc);
  free(p->trace);
  free(p->groups);
  free(p->kinds);
  free(p->callsites);
  free(p->suppressions_used);
  free(p);
}

/* ---- stacks -------------------------------------------------------------------- */

static report_mstack *symbolize_stack(report_process *p, uint32_t id) {
  proc_priv *pv = p->priv;
  report_mstack *st = pool_alloc(&pv->mem, sizeof *st);
  if (!st) return NULL;
  memset(st, 0, sizeof *st);
  st->id = id;
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = p->src.stack_frames(p->src.arg, id, pcs, TA_MAX_DEPTH);
  if (n == 0) return st;
  report_ctx *ctx = report_source_ctx(&p->src);
  size_t cap = n + 4;
  st->frames = malloc(cap * sizeof *st->frames);
  if (!st->frames) return NULL;
  st->npcs = (uint32_t)n;
  for (size_t i = 0; i < n; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = ctx ? report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE) : 0;
    if (k <= 0) {
      memset(fr, 0, sizeof fr[0]);
      fr[0].address = pcs[i];
      k = 1;
    }
    if (st->nframes + (size_t)k > cap) {
      cap = (st->nframes + (size_t)k) * 2;
      report_mframe *nf = realloc(st->frames, cap * sizeof *nf);
      if (!nf) {
        free(st->frames);
        return NULL;
      }
      st->frames = nf;
    }
    for (int j = 0; j < k; j++)
      st->frames[st->nframes++] = (report_mframe){ fr[j].function, fr[j].file, fr[j].module, fr[j].line,
                                                   fr[j].address, fr[j].module_offset, fr[j].inlined != 0,
                                                   (uint32_t)i, fr[j].decl_line };
  }
  return st;
}

const report_mstack *report_process_stack(report_process *p, uint32_t id) {
  if (id == 0) return NULL;
  proc_priv *pv = p->priv;
  if ((pv->n + 1) * 2 > pv->cap) {
    size_t cap = pv->cap ? pv->cap * 2 : 64;
    report_mstack **t = calloc(cap, sizeof *t);
    if (!t) return NULL;
    for (size_t i = 0; i < pv->cap; i++) {
      if (!pv->stacks[i]) continue;
      size_t j = hash_u32(pv->stacks[i]->id) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = pv->stacks[i];
    }
    free(pv->stacks);
    pv->stacks = t;
    pv->cap = cap;
  }
  size_t j = hash_u32(id) & (pv->cap - 1);
  while (pv->stacks[j]) {
    if (pv->stacks[j]->id == id) return pv->stacks[j];
    j = (j + 1) & (pv->cap - 1);
  }
  report_mstack *st = symbolize_stack(p, id);
  if (!st) return NULL;
  pv->stacks[j] = st;
  pv->n++;
  return st;
}

const char *report_frame_label(const report_mframe *f, char *buf, size_t len) {
  if (f->function) return f->function;
  if (f->module) {
    const char *base = strrchr(f->module, '/');
    snprintf(buf, len, "%s+0x%llx", base ? base + 1 : f->module, (unsigned long long)f->module_offset);
  } else {
    snprintf(buf, len, "0x%llx", (unsigned long long)f->address);
  }
  return buf;
}

/* ---- what a trace adds ---------------------------------------------------------- */

bool report_site_grows(const report_trace_site *s, size_t nmarks) {
  return nmarks >= 3 && s->mark_last > s->mark_first && s->ups >= 2 && s->downs * 4 <= s->ups &&
         s->slope >= 1.0 && s->r2 >= 0.5;
}

static int by_growth(const void *a, const void *b) {
  const report_group *x = a, *y = b;
  if (x->slope != y->slope) return x->slope < y->slope ? 1 : -1;
  return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static bool add_growth(report_process *p, report_suppressions *supp) {
  const report_trace_model *tm = p->tm;
  proc_priv *pv = p->priv;
  size_t first = p->ngroups;
  for (size_t i = 0; i < tm->nsites; i++) {
    const report_trace_site *s = &tm->sites[i];
    if (!report_site_grows(s, tm->nmarks)) continue;
    ta_finding f;
    memset(&f, 0, sizeof f);
    f.kind = ta_kind_name(TA_KIND_LEAK_GROWTH);
    f.bytes = s->mark_last;
    f.blocks = s->live_blocks;
    f.tag = s->tag;
    f.stack = s->stack;
    if (supp && report_suppressed(&f, &p->src, supp)) continue;
    report_group *g = group_push(p);
    if (!g) return false;
    g->kind = ta_kind_name(TA_KIND_LEAK_GROWTH);
    g->bytes = s->mark_last;
    g->blocks = s->live_blocks;
    g->tag = s->tag;
    g->tag_name = s->tag != TA_ANY ? pool_str(&pv->mem, report_source_tag(&p->src, s->tag)) : NULL;
    g->stack = s->stack;
    g->slope = s->slope;
    g->growth_first = s->mark_first;
    g->growth_last = s->mark_last;
    g->iterations = tm->nmarks - 1;
    char d[96];
    snprintf(d, sizeof d, "grows %.1f bytes/iteration over %zu iterations (%llu -> %llu bytes live)",
             s->slope, tm->nmarks - 1, (unsigned long long)s->mark_first, (unsigned long long)s->mark_last);
    g->detail = pool_str(&pv->mem, d);
  }
  if (p->ngroups - first > 1) qsort(p->groups + first, p->ngroups - first, sizeof *p->groups, by_growth);
  return true;
}

void report_callsite_key(const char *function, const char *file, int line, int decl_line, char *key,
                         size_t len) {
  if (!function || !file) {
    if (len) key[0] = '\0';
    return;
  }
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  if (line > 0 && decl_line > 0 && line >= decl_line)
    snprintf(key, len, "%s %s:+%d", function, base, line - decl_line);
  else
    snprintf(key, len, "%s %s", function, base);
}

typedef struct {
  report_callsite *v;
  size_t n, cap;
  size_t *index;                 /* open addressing on key; SIZE_MAX: empty */
  size_t icap;
} site_table;

static report_callsite *callsite_get(site_table *t, pool *mem, const report_mframe *f) {
  char buf[128], key[4096];
  report_callsite_key(f->function, f->file, f->line, f->decl_line, key, sizeof key);
  if (!key[0]) snprintf(key, sizeof key, "%s", report_frame_label(f, buf, sizeof buf));
  if ((t->n + 1) * 2 > t->icap) {
    size_t cap = t->icap ? t->icap * 2 : 256;
    size_t *ix = malloc(cap * sizeof *ix);
    if (!ix) return NULL;
    memset(ix, 0xff, cap * sizeof *ix);
    for (size_t i = 0; i < t->n; i++) {
      size_t j = hash_str(t->v[i].key) & (cap - 1);
      while (ix[j] != SIZE_MAX) j = (j + 1) & (cap - 1);
      ix[j] = i;
    }
    free(t->index);
    t->index = ix;
    t->icap = cap;
  }
  size_t j = hash_str(key) & (t->icap - 1);
  while (t->index[j] != SIZE_MAX) {
    if (strcmp(t->v[t->index[j]].key, key) == 0) return &t->v[t->index[j]];
    j = (j + 1) & (t->icap - 1);
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    report_callsite *nv = realloc(t->v, cap * sizeof *nv);
    if (!nv) return NULL;
    t->v = nv;
    t->cap = cap;
  }
  report_callsite *c = &t->v[t->n];
  memset(c, 0, sizeof *c);
  c->key = pool_str(mem, key);
  c->function = f->function;
  c->file = f->file;
  c->module = f->module;
  c->line = f->line;
  if (!c->key) return NULL;
  t->index[j] = t->n++;
  return c;
}

static int by_callsite(const void *a, const void *b) {
  const report_callsite *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  if (x->leaked_bytes != y->leaked_bytes) return x->leaked_bytes < y->leaked_bytes ? 1 : -1;
  return strcmp(x->key, y->key);
}

/* The innermost frame of a stack that is no allocator wrapper
 * (report_function_is_wrapper), symbolized; the outermost one when all are. */
static bool top_frame(report_process *p, uint32_t stack, report_mframe *out) {
  uintptr_t pcs[8];
  size_t n = stack ? p->src.stack_frames(p->src.arg, stack, pcs, 8) : 0;
  memset(out, 0, sizeof *out);
  if (!n) return false;
  report_ctx *ctx = report_source_ctx(&p->src);
  for (size_t i = 0; i < n; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = ctx ? report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE) : 0;
    if (k <= 0) {
      *out = (report_mframe){ .address = pcs[i] };
      return true;
    }
    for (int j = 0; j < k; j++) {
      *out = (report_mframe){ fr[j].function, fr[j].file, fr[j].module, fr[j].line, fr[j].address,
                              fr[j].module_offset, fr[j].inlined != 0, (uint32_t)i, fr[j].decl_line };
      if (!report_function_is_wrapper(fr[j].function)) return true;
    }
  }
  return true;
}

static bool add_callsites(report_process *p) {
  const report_trace_model *tm = p->tm;
  proc_priv *pv = p->priv;
  site_table t = { 0 };
  bool ok = true;
  report_mframe f;
  for (size_t i = 0; i < tm->nsites && ok; i++) {
    const report_trace_site *s = &tm->sites[i];
    if (!top_frame(p, s->stack, &f)) f.function = "<no stack recorded>";
    report_callsite *c = callsite_get(&t, &pv->mem, &f);
    if (!c) {
      ok = false;
      break;
    }
    c->allocs += s->allocs;
    c->bytes += s->alloc_bytes;
    c->peak_bytes += s->peak_bytes;
  }
  for (size_t i = 0; i < p->ngroups && ok; i++) {
    const report_group *g = &p->groups[i];
    if (!ta_kind_is_leak(g->kind)) continue;
    if (!top_frame(p, g->stack, &f)) f.function = "<no stack recorded>";
    report_callsite *c = callsite_get(&t, &pv->mem, &f);
    if (!c) {
      ok = false;
      break;
    }
    c->leaked_bytes += g->bytes;
    c->leaked_blocks += g->blocks;
  }
  free(t.index);
  if (!ok) {
    free(t.v);
    return false;
  }
  if (t.n > 1) qsort(t.v, t.n, sizeof *t.v, by_callsite);
  p->callsites = t.v;
  p->ncallsites = t.n;
  return true;
}

/* ---- the model ------------------------------------------------------------------- */

report_model *report_model_new(void) { return calloc(1, sizeof(report_model)); }

void report_model_free(report_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nprocs; i++) report_process_free(m->procs[i]);
  free(m->procs);
  free_argv(m->argv, m->argc);
  free(m);
}

void report_model_set_argv(report_model *m, char *const *argv, int argc) {
  free_argv(m->argv, m->argc);
  m->argv = argv ? copy_argv(argv, argc) : NULL;
  m->argc = m->argv ? argc : 0;
}

report_process *report_model_add_offline(report_model *m, report_offline *o, report_suppressions *supp,
                                         const report_process_info *info) {
  report_source *src = report_offline_source(o);
  const report_trace_model *tm = report_offline_model(o);
  src->suppressions = supp;
  report_process_info local = { .ppid = (long)tm->ppid, .exit_code = -1, .clean_exit = tm->clean_exit,
                                .trace = report_offline_path(o) };
  report_process_info given;
  if (info && !info->argv && tm->argv) {   /* the command line the trace recorded */
    given = *info;
    given.argv = (const char *const *)tm->argv;
    given.argc = tm->argc;
    info = &given;
  } else if (!info) {
    local.argv = (const char *const *)tm->argv;
    local.argc = tm->argc;
  }
  report_process *p = report_process_new(src, info ? info : &local);
  report_process **v = p ? realloc(m->procs, (m->nprocs + 1) * sizeof *v) : NULL;
  if (!v) {
    report_process_free(p);
    report_offline_free(o);
    return NULL;
  }
  m->procs = v;
  ((proc_priv *)p->priv)->offline = o;
  p->tm = tm;
  p->start_ns = tm->start_ns;
  uint64_t last = tm->clean_exit ? tm->end_ns : report_trace_model_ns(tm, tm->last_seq);
  p->end_ns = last > tm->start_ns ? last : tm->start_ns;
  report_suppressions *s = supp ? supp : report_suppressions_default();
  if (!add_growth(p, s) || !copy_used(p, s) || !count_kinds(p) || !add_callsites(p)) {
    report_process_free(p);
    return NULL;
  }
  m->procs[m->nprocs++] = p;
  if (m->nprocs == 1 || p->start_ns < m->start_ns) m->start_ns = p->start_ns;
  if (p->end_ns > m->end_ns) m->end_ns = p->end_ns;
  return p;
}
