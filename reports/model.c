/* model.c - what a trace adds to the report model (model.h): growth,
 * callsites, the model of several processes.  The process itself, its
 * groups and stacks, is process.c's. */
#include "model_priv.h"
#include "offline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
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
  report_proc_priv *pv = p->priv;
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
    report_group *g = report_group_push(p);
    if (!g) return false;
    g->kind = ta_kind_name(TA_KIND_LEAK_GROWTH);
    g->bytes = s->mark_last;
    g->blocks = s->live_blocks;
    g->tag = s->tag;
    g->tag_name = s->tag != TA_ANY ? report_pool_str(&pv->mem, report_source_tag(&p->src, s->tag)) : NULL;
    g->stack = s->stack;
    g->slope = s->slope;
    g->growth_first = s->mark_first;
    g->growth_last = s->mark_last;
    g->iterations = tm->nmarks - 1;
    char d[96];
    snprintf(d, sizeof d, "grows %.1f bytes/iteration over %zu iterations (%llu -> %llu bytes live)",
             s->slope, tm->nmarks - 1, (unsigned long long)s->mark_first, (unsigned long long)s->mark_last);
    g->detail = report_pool_str(&pv->mem, d);
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

static report_callsite *callsite_get(site_table *t, report_pool *mem, const report_mframe *f) {
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
  c->key = report_pool_str(mem, key);
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
  report_proc_priv *pv = p->priv;
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
  report_argv_free(m->argv, m->argc);
  free(m);
}

void report_model_set_argv(report_model *m, char *const *argv, int argc) {
  report_argv_free(m->argv, m->argc);
  m->argv = argv ? report_argv_copy(argv, argc) : NULL;
  m->argc = m->argv ? argc : 0;
}

/* Room for one more process in m; false when out of memory. */
bool _report_model_reserve(report_model *m) {
  report_process **v = realloc(m->procs, (m->nprocs + 1) * sizeof *v);
  if (v == NULL) return false;
  m->procs = v;
  return true;
}

/* Appends p, its room reserved, and widens m's span of time to p's. */
void _report_model_push(report_model *m, report_process *p) {
  m->procs[m->nprocs++] = p;
  if (m->nprocs == 1 || p->start_ns < m->start_ns) m->start_ns = p->start_ns;
  if (p->end_ns > m->end_ns) m->end_ns = p->end_ns;
}

static void release_offline(void *o) { report_offline_free(o); }

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
  if (!p || !_report_model_reserve(m)) {
    report_process_free(p);
    report_offline_free(o);
    return NULL;
  }
  report_proc_priv *pv = p->priv;
  pv->release = release_offline;
  pv->release_arg = o;
  p->tm = tm;
  p->start_ns = tm->start_ns;
  uint64_t last = tm->clean_exit ? tm->end_ns : report_trace_model_ns(tm, tm->last_seq);
  p->end_ns = last > tm->start_ns ? last : tm->start_ns;
  report_suppressions *s = supp ? supp : report_suppressions_default();
  if (!add_growth(p, s) || !report_process_copy_used(p, s) || !report_process_count(p) || !add_callsites(p)) {
    report_process_free(p);
    return NULL;
  }
  _report_model_push(m, p);
  return p;
}
