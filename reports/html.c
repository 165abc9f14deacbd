/* html.c - the self-contained HTML page of a report model (model.h).
 *
 * The page is the template of reports/html/ (CSS, markup, JS, embedded at
 * build time into html_assets.c) around one JSON document with the model's
 * numbers: <script type="application/json">, where every string is escaped
 * by j_str (< > & as \u003c \u003e \u0026, so nothing in it can close the
 * script block or become markup).  The JS only ever puts program-controlled
 * strings into the page with textContent and SVG text nodes, never as HTML.
 *
 * Bounded: at most HTML_MAX_GROUPS finding groups (the largest of each
 * kind first), flame graphs of the HTML_MAX_FLAME heaviest stacks (the rest
 * in one "(N smaller stacks)" node), at most REPORT_TRACE_BUCKETS points per
 * timeline series and HTML_MAX_MARKS marks per process; the page says what
 * it left out. */
#include "html_assets.h"
#include "jbuf.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HTML_MAX_GROUPS 2000
#define HTML_MAX_FLAME  1500
#define HTML_MAX_MARKS  400
#define HTML_MAX_FRAMES 64       /* frames per stack in the findings table */

/* ---- interning ------------------------------------------------------------------ */

typedef struct {
  const char **v;
  size_t n, cap;
  size_t *ix;                    /* open addressing: index + 1, 0 empty */
  size_t icap;
  char **owned;                  /* the copies str_copy made */
  size_t nowned, capowned;
} strtab;

static size_t hstr(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
}

/* The index of s in the table (added if new); -1 for NULL or no memory. */
static long str_id(strtab *t, const char *s) {
  if (!s) return -1;
  if ((t->n + 1) * 2 > t->icap) {
    size_t cap = t->icap ? t->icap * 2 : 1024;
    size_t *ix = calloc(cap, sizeof *ix);
    if (!ix) return -1;
    for (size_t i = 0; i < t->n; i++) {
      size_t j = hstr(t->v[i]) & (cap - 1);
      while (ix[j]) j = (j + 1) & (cap - 1);
      ix[j] = i + 1;
    }
    free(t->ix);
    t->ix = ix;
    t->icap = cap;
  }
  size_t j = hstr(s) & (t->icap - 1);
  while (t->ix[j]) {
    if (strcmp(t->v[t->ix[j] - 1], s) == 0) return (long)(t->ix[j] - 1);
    j = (j + 1) & (t->icap - 1);
  }
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    const char **nv = realloc(t->v, cap * sizeof *nv);
    if (!nv) return -1;
    t->v = nv;
    t->cap = cap;
  }
  t->v[t->n] = s;
  t->ix[j] = ++t->n;
  return (long)(t->n - 1);
}

/* The same for a string in a temporary buffer: copied when new. */
static long str_copy(strtab *t, const char *s) {
  size_t before = t->n;
  long id = str_id(t, s);
  if (id < 0 || t->n == before) return id;
  if (t->nowned == t->capowned) {
    size_t cap = t->capowned ? t->capowned * 2 : 64;
    char **no = realloc(t->owned, cap * sizeof *no);
    if (!no) return -1;
    t->owned = no;
    t->capowned = cap;
  }
  char *copy = strdup(s);
  if (!copy) return -1;
  t->owned[t->nowned++] = copy;
  t->v[id] = copy;
  return id;
}

typedef struct {                 /* stacks referenced by the findings, by (process, id) */
  uint64_t *keys;
  size_t   *vals;                /* index + 1 */
  size_t    cap, n;
  const report_mstack **v;
  size_t    vcap;
} stacktab;

static long stack_id(stacktab *t, size_t proc, report_process *p, uint32_t id) {
  if (!id) return -1;
  uint64_t key = ((uint64_t)proc << 32) | id;
  if ((t->n + 1) * 2 > t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    uint64_t *k = calloc(cap, sizeof *k);
    size_t *v = calloc(cap, sizeof *v);
    if (!k || !v) {
      free(k);
      free(v);
      return -1;
    }
    for (size_t i = 0; i < t->cap; i++) {
      if (!t->vals[i]) continue;
      size_t j = (size_t)(t->keys[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
      while (v[j]) j = (j + 1) & (cap - 1);
      k[j] = t->keys[i];
      v[j] = t->vals[i];
    }
    free(t->keys);
    free(t->vals);
    t->keys = k;
    t->vals = v;
    t->cap = cap;
  }
  size_t j = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (t->cap - 1);
  while (t->vals[j]) {
    if (t->keys[j] == key) return (long)(t->vals[j] - 1);
    j = (j + 1) & (t->cap - 1);
  }
  const report_mstack *st = report_process_stack(p, id);
  if (!st) return -1;
  if (t->n == t->vcap) {
    size_t cap = t->vcap ? t->vcap * 2 : 256;
    const report_mstack **nv = realloc(t->v, cap * sizeof *nv);
    if (!nv) return -1;
    t->v = nv;
    t->vcap = cap;
  }
  t->v[t->n] = st;
  t->keys[j] = key;
  t->vals[j] = ++t->n;
  return (long)(t->n - 1);
}

/* The frame a row of the findings table is named by: the first that is no
 * allocator wrapper (as the page's topFrame); NULL without a stack. */
static const report_mframe *headline_frame(report_process *p, uint32_t stack) {
  const report_mstack *st = report_process_stack(p, stack);
  if (!st || !st->nframes) return NULL;
  uint32_t i = 0;
  while (i + 1 < st->nframes && report_function_is_wrapper(st->frames[i].function)) i++;
  return &st->frames[i];
}

static bool same_str(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

/* Two groups of p that the findings table would show under one headline:
 * the same kind, the same named frame. */
static bool same_headline(report_process *p, const report_group *a, const report_group *b) {
  if (strcmp(a->kind, b->kind) != 0) return false;
  if (a->stack == b->stack) return true;
  const report_mframe *x = headline_frame(p, a->stack), *y = headline_frame(p, b->stack);
  return x && y && same_str(x->function, y->function) && same_str(x->file, y->file) && x->line == y->line &&
         (x->function || x->address == y->address);
}

/* A finding's fields after its kind and counts: address, stacks (ids in
 * the page's stack table), holder, slot, detail, growth, history, sites. */
static void group_fields(jbuf *b, stacktab *stk, size_t pi, report_process *p, const report_group *g) {
  j_printf(b, ",\"addr\":\"0x%llx\"", (unsigned long long)g->addr);
  j_printf(b, ",\"stack\":%ld", stack_id(stk, pi, p, g->stack));
  j_printf(b, ",\"alloc_stack\":%ld", g->alloc_stack != g->stack ? stack_id(stk, pi, p, g->alloc_stack) : -1);
  /* the further stacks, unless the same as the first (as the text report) */
  j_printf(b, ",\"free_stack\":%ld", g->free_stack != g->stack ? stack_id(stk, pi, p, g->free_stack) : -1);
  j_printf(b, ",\"aux_stack\":%ld", g->aux_stack != g->stack ? stack_id(stk, pi, p, g->aux_stack) : -1);
  if (g->holder) j_printf(b, ",\"holder\":\"0x%llx\"", (unsigned long long)g->holder);
  if (g->slot) {
    j_lit(b, ",\"slot\":");
    j_str(b, g->slot);
  }
  if (g->detail && g->detail[0]) {
    j_lit(b, ",\"detail\":");
    j_str(b, g->detail);
  }
  if (ta_kind_of(g->kind) == TA_KIND_LEAK_GROWTH)
    j_printf(b, ",\"slope\":%.3f,\"iterations\":%zu,\"first\":%llu,\"last\":%llu", g->slope, g->iterations,
             (unsigned long long)g->growth_first, (unsigned long long)g->growth_last);
  if (g->history_len) {
    j_lit(b, ",\"history\":[");
    for (size_t h = 0; h < g->history_len; h++)
      j_printf(b, "%s[%d,%ld,%u,%ld]", h ? "," : "", g->history[h].delta, g->history[h].count,
               (unsigned)g->history[h].thread, stack_id(stk, pi, p, g->history[h].stack));
    j_lit(b, "]");
  }
  if (g->nsites) {   /* [delta, transitions, paired (-1: none), balance, extra, stack] */
    j_lit(b, ",\"sites\":[");
    for (size_t h = 0; h < g->nsites; h++) {
      const ta_ref_site *st = &g->sites[h];
      j_printf(b, "%s[%d,%llu,%ld,%lld,%d,%ld]", h ? "," : "", st->delta, (unsigned long long)st->transitions,
               st->paired < g->nsites ? (long)st->paired : -1L, (long long)st->balance, st->extra ? 1 : 0,
               stack_id(stk, pi, p, st->stack));
    }
    j_lit(b, "]");
  }
}


/* ---- flame graphs ---------------------------------------------------------------- */

typedef struct {
  long     name;                 /* string id */
  uint64_t value;
  size_t   child, next;          /* first child, next sibling; 0: none (node 0 is the root) */
} fnode;

typedef struct {
  fnode *v;
  size_t n, cap;
  bool   oom;
} ftree;

static size_t fnode_new(ftree *t, long name) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    fnode *nv = realloc(t->v, cap * sizeof *nv);
    if (!nv) {
      t->oom = true;
      return 0;
    }
    t->v = nv;
    t->cap = cap;
  }
  t->v[t->n] = (fnode){ name, 0, 0, 0 };
  return t->n++;
}

static size_t fnode_child(ftree *t, size_t parent, long name) {
  size_t last = 0;
  for (size_t c = t->v[parent].child; c; c = t->v[c].next) {
    if (t->v[c].name == name) return c;
    last = c;
  }
  size_t c = fnode_new(t, name);
  if (!c) return 0;
  if (last) t->v[last].next = c;
  else t->v[parent].child = c;
  return c;
}

typedef struct {
  size_t   proc;
  uint32_t stack;
  uint64_t value;
} weight;

static int by_weight(const void *a, const void *b) {
  const weight *x = a, *y = b;
  if (x->value != y->value) return x->value < y->value ? 1 : -1;
  if (x->proc != y->proc) return x->proc < y->proc ? -1 : 1;
  return x->stack < y->stack ? -1 : x->stack > y->stack;
}

/* The stacks and their weights of a flame graph (the same as folded.c's). */
static weight *flame_weights(report_model *m, report_folded_what what, size_t *count) {
  size_t n = 0, cap = 0;
  weight *w = NULL;
  for (size_t pi = 0; pi < m->nprocs; pi++) {
    report_process *p = m->procs[pi];
    size_t k = what == REPORT_FOLDED_LEAKED ? p->ngroups : p->tm ? p->tm->nsites : 0;
    for (size_t i = 0; i < k; i++) {
      weight x = { pi, 0, 0 };
      if (what == REPORT_FOLDED_LEAKED) {
        if (!ta_kind_is_leak(p->groups[i].kind)) continue;
        x.stack = p->groups[i].stack;
        x.value = p->groups[i].bytes;
      } else {
        x.stack = p->tm->sites[i].stack;
        x.value = p->tm->sites[i].peak_bytes;
      }
      if (!x.value) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 256;
        weight *nw = realloc(w, cap * sizeof *nw);
        if (!nw) {
          free(w);
          *count = 0;
          return NULL;
        }
        w = nw;
      }
      w[n++] = x;
    }
  }
  if (n > 1) qsort(w, n, sizeof *w, by_weight);
  *count = n;
  return w;
}

static void flame_emit(jbuf *b, const ftree *t, size_t node) {
  const fnode *f = &t->v[node];
  j_printf(b, "[%ld,%llu", f->name, (unsigned long long)f->value);
  if (f->child) {
    j_lit(b, ",[");
    for (size_t c = f->child; c; c = t->v[c].next) {
      flame_emit(b, t, c);
      if (t->v[c].next) j_put(b, ",", 1);
    }
    j_put(b, "]", 1);
  }
  j_put(b, "]", 1);
}

static void flame(jbuf *b, report_model *m, strtab *st, report_folded_what what, jbuf *notes) {
  size_t n = 0;
  weight *w = flame_weights(m, what, &n);
  ftree t = { 0 };
  fnode_new(&t, str_id(st, "all"));
  size_t keep = n < HTML_MAX_FLAME ? n : HTML_MAX_FLAME;
  uint64_t rest = 0;
  for (size_t i = keep; i < n; i++) rest += w[i].value;
  for (size_t i = 0; i < keep && !t.oom; i++) {
    report_process *p = m->procs[w[i].proc];
    size_t node = 0;
    t.v[0].value += w[i].value;
    if (m->nprocs > 1) {
      char name[64];
      snprintf(name, sizeof name, "pid %ld", p->pid);
      node = fnode_child(&t, node, str_copy(st, name));
      if (t.oom) break;
      t.v[node].value += w[i].value;
    }
    const report_mstack *s = report_process_stack(p, w[i].stack);
    if (!s || !s->nframes) {
      node = fnode_child(&t, node, str_id(st, "<no stack recorded>"));
      if (!t.oom) t.v[node].value += w[i].value;
      continue;
    }
    for (size_t k = s->nframes; k-- > 0 && !t.oom;) {
      char buf[128];
      const char *label = report_frame_label(&s->frames[k], buf, sizeof buf);
      node = fnode_child(&t, node, label == buf ? str_copy(st, buf) : str_id(st, label));
      if (!t.oom) t.v[node].value += w[i].value;
    }
  }
  if (rest && !t.oom) {
    char name[96];
    snprintf(name, sizeof name, "(%zu smaller stacks)", n - keep);
    size_t node = fnode_child(&t, 0, str_copy(st, name));
    if (!t.oom) {
      t.v[node].value += rest;
      t.v[0].value += rest;
    }
    j_printf(notes, "%s\"the flame graph of %s shows the %zu heaviest of %zu stacks; the other %zu "
             "(%llu bytes) are one node\"", notes->len ? "," : "",
             what == REPORT_FOLDED_LEAKED ? "leaked bytes" : "live bytes at the peak", keep, n, n - keep,
             (unsigned long long)rest);
  }
  if (t.oom) b->oom = true;
  else flame_emit(b, &t, 0);
  free(t.v);
  free(w);
}

/* ---- the document ---------------------------------------------------------------- */

/* [function, file, line, module, address, inlined, module offset, wrapper]
 * (strings as indexes into "strings"; wrapper: 1 for an allocator wrapper,
 * which the table's top frame passes over). */
static void frame_json(jbuf *b, strtab *st, const report_mframe *f) {
  j_printf(b, "[%ld,%ld,%d,%ld,\"0x%llx\",%d,\"0x%llx\",%d]", str_id(st, f->function), str_id(st, f->file),
           f->line, str_id(st, f->module), (unsigned long long)f->address, f->inlined ? 1 : 0,
           (unsigned long long)f->module_offset, report_function_is_wrapper(f->function) ? 1 : 0);
}

static int by_group_rank(const void *a, const void *b) {
  const report_group *x = *(const report_group *const *)a, *y = *(const report_group *const *)b;
  int rx = ta_kind_rank(x->kind), ry = ta_kind_rank(y->kind);
  if (rx != ry) return rx < ry ? -1 : 1;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x < y ? -1 : x > y;
}

static uint64_t rel(const report_model *m, uint64_t ns) { return ns > m->start_ns ? ns - m->start_ns : 0; }

/* Device memory beside the host's: two series of a process's device
 * blocks (DEVICE_ALLOC/DEVICE_FREE), allocated and reserved, at most
 * REPORT_TRACE_BUCKETS points each (the highest of each run of events). */
static void device_series(jbuf *b, report_model *m, const report_trace_model *tm, long pid) {
  size_t n = tm->ndevice_points;
  if (n == 0) return;
  size_t step = (n + REPORT_TRACE_BUCKETS - 1) / REPORT_TRACE_BUCKETS;
  for (int reserved = 0; reserved < 2; reserved++) {
    j_lit(b, ",\n{\"name\":");
    j_str(b, reserved ? "device: reserved" : "device: allocated");
    j_printf(b, ",\"pid\":%ld,\"total\":false,\"device\":true,\"x\":[", pid);
    for (size_t i = 0; i < n; i += step) {
      size_t last = i + step < n ? i + step - 1 : n - 1;
      j_printf(b, "%s%llu", i ? "," : "",
               (unsigned long long)rel(m, report_trace_model_ns(tm, tm->device_points[last].seq)));
    }
    j_lit(b, "],\"y\":[");
    for (size_t i = 0; i < n; i += step) {
      uint64_t hi = 0;
      for (size_t k = i; k < i + step && k < n; k++) {
        uint64_t v = reserved ? tm->device_points[k].reserved : tm->device_points[k].allocated;
        if (v > hi) hi = v;
      }
      j_printf(b, "%s%llu", i ? "," : "", (unsigned long long)hi);
    }
    j_lit(b, "]}");
  }
}

/* What was live at the process's peak, by tag, largest first: the sites'
 * bytes at the peak (exact: the replay's, not the timeline's buckets);
 * without sites, the timeline's values in the interval of the peak. */
static void peak_by_tag(jbuf *b, const report_trace_model *tm) {
  enum { MAXT = 256 };
  uint64_t bytes[MAXT] = { 0 };
  uint16_t tags[MAXT];
  size_t n = 0;
  for (size_t i = 0; i < tm->nsites; i++) {
    const report_trace_site *s = &tm->sites[i];
    if (!s->peak_bytes) continue;
    size_t k = 0;
    while (k < n && tags[k] != s->tag) k++;
    if (k == n) {
      if (n == MAXT) continue;
      tags[n++] = s->tag;
    }
    bytes[k] += s->peak_bytes;
  }
  const report_trace_timeline *tl = &tm->timeline;
  for (size_t i = 0; tm->nsites == 0 && i < tl->nbuckets; i++) {
    /* no sites (the ledger's samples, ledger_timeline.c): each tag's
     * highest in the interval that holds the peak */
    if (tl->seq[i] != tm->peak_seq) continue;
    for (size_t col = 1; col <= tl->ntags && n < MAXT; col++) {
      uint64_t v = tl->values[i * (REPORT_TRACE_TAGS + 1) + col];
      if (!v || (col == REPORT_TRACE_TAGS && tl->other_tags)) continue;
      tags[n] = tl->tags[col - 1];
      bytes[n++] = v;
    }
    break;
  }
  for (size_t i = 1; i < n; i++)   /* insertion sort, largest first: few tags */
    for (size_t j = i; j > 0 && bytes[j] > bytes[j - 1]; j--) {
      uint64_t t = bytes[j];
      bytes[j] = bytes[j - 1];
      bytes[j - 1] = t;
      uint16_t g = tags[j];
      tags[j] = tags[j - 1];
      tags[j - 1] = g;
    }
  for (size_t i = 0; i < n; i++) {
    const char *name = tags[i] == TA_ANY ? "(no tag)" : report_trace_model_tag(tm, tags[i]);
    j_lit(b, i ? ",[" : "[");
    j_str(b, name ? name : "?");
    j_printf(b, ",%llu]", (unsigned long long)bytes[i]);
  }
}

static void timeline(jbuf *b, report_model *m, strtab *st, jbuf *notes) {
  j_lit(b, "{\"series\":[");
  bool first = true;
  uint64_t peak = 0, peak_x = 0;
  long peak_pid = -1;
  const report_trace_model *peak_tm = NULL;
  for (size_t pi = 0; pi < m->nprocs; pi++) {
    report_process *p = m->procs[pi];
    const report_trace_model *tm = p->tm;
    if (!tm || !tm->timeline.nbuckets) continue;
    const report_trace_timeline *tl = &tm->timeline;
    size_t stride = REPORT_TRACE_TAGS + 1;
    for (size_t col = 0; col <= tl->ntags; col++) {
      char name[160];
      const char *tag = NULL;
      if (col == 0) {
        snprintf(name, sizeof name, "all tags");
      } else if (col == REPORT_TRACE_TAGS && tl->other_tags) {
        snprintf(name, sizeof name, "other tags");
      } else {
        tag = report_trace_model_tag(tm, tl->tags[col - 1]);
        if (tl->tags[col - 1] == TA_ANY) snprintf(name, sizeof name, "(no tag)");
        else if (!tag) snprintf(name, sizeof name, "tag %u", (unsigned)tl->tags[col - 1]);
      }
      j_lit(b, first ? "\n{\"name\":" : ",\n{\"name\":");
      first = false;
      j_str(b, tag ? tag : name);
      j_printf(b, ",\"pid\":%ld,\"proc\":%zu,\"total\":%s,\"x\":[", p->pid, pi, col == 0 ? "true" : "false");
      for (size_t i = 0; i < tl->nbuckets; i++)
        j_printf(b, "%s%llu", i ? "," : "", (unsigned long long)rel(m, report_trace_model_ns(tm, tl->seq[i])));
      j_lit(b, "],\"y\":[");
      for (size_t i = 0; i < tl->nbuckets; i++)
        j_printf(b, "%s%llu", i ? "," : "", (unsigned long long)tl->values[i * stride + col]);
      j_lit(b, "],\"lo\":[");   /* the lowest of each interval: the band under the line */
      for (size_t i = 0; i < tl->nbuckets; i++)
        j_printf(b, "%s%llu", i ? "," : "", (unsigned long long)tl->lows[i * stride + col]);
      j_lit(b, "]}");
    }
    device_series(b, m, tm, p->pid);
    if (tm->peak_live_bytes > peak) {
      peak = tm->peak_live_bytes;
      peak_x = rel(m, report_trace_model_ns(tm, tm->peak_seq));
      peak_pid = p->pid;
      peak_tm = tm;
    }
    uint64_t events = tm->allocs + tm->frees;
    if (events > tl->nbuckets)
      j_printf(notes, "%s\"the timeline of process %ld shows %llu events as %zu points (the highest live "
               "bytes of each interval)\"", notes->len ? "," : "", p->pid, (unsigned long long)events,
               tl->nbuckets);
  }
  j_lit(b, "],\"marks\":[");
  first = true;
  for (size_t pi = 0; pi < m->nprocs; pi++) {
    report_process *p = m->procs[pi];
    const report_trace_model *tm = p->tm;
    if (!tm || !tm->nmarks) continue;
    size_t step = (tm->nmarks + HTML_MAX_MARKS - 1) / HTML_MAX_MARKS;
    for (size_t i = 0; i < tm->nmarks; i += step) {
      j_printf(b, "%s[%ld,%llu,%llu]", first ? "" : ",", p->pid, (unsigned long long)rel(m, tm->marks[i].ns),
               (unsigned long long)tm->marks[i].mark);
      first = false;
    }
    if (step > 1)
      j_printf(notes, "%s\"process %ld has %zu marks; one in %zu is drawn\"", notes->len ? "," : "", p->pid,
               tm->nmarks, step);
  }
  j_lit(b, "]");
  if (peak_pid >= 0) {
    j_printf(b, ",\"peak\":{\"pid\":%ld,\"x\":%llu,\"y\":%llu,\"tags\":[", peak_pid, (unsigned long long)peak_x,
             (unsigned long long)peak);
    peak_by_tag(b, peak_tm);
    j_lit(b, "]}");
  }
  j_printf(b, ",\"duration\":%llu}", (unsigned long long)(m->end_ns > m->start_ns ? m->end_ns - m->start_ns : 0));
  (void)st;
}

int report_html_write(int fd, report_model *m) {
  jbuf b = { 0 }, notes = { 0 }, fl = { 0 };
  strtab st = { 0 };
  stacktab stk = { 0 };

  /* the header */
  j_lit(&b, "{\"tool\":\"tagalloc\",\"version\":");
  j_str(&b, TA_VERSION);
  char *const *argv = m->argv;
  int argc = m->argc;
  for (size_t i = 0; !argv && i < m->nprocs; i++)
    if (m->procs[i]->argv) argv = m->procs[i]->argv, argc = m->procs[i]->argc;
  j_lit(&b, ",\"argv\":");
  if (argv) {
    j_put(&b, "[", 1);
    for (int i = 0; i < argc; i++) {
      if (i) j_put(&b, ",", 1);
      j_str(&b, argv[i]);
    }
    j_put(&b, "]", 1);
  } else {
    j_lit(&b, "null");
  }
  uint64_t allocs = 0, frees = 0, peak = 0, errors = 0, loss_records = 0;
  size_t findings = 0;
  j_lit(&b, ",\"processes\":[");
  for (size_t i = 0; i < m->nprocs; i++) {
    report_process *p = m->procs[i];
    allocs += p->summary.allocs;
    frees += p->summary.frees;
    errors += p->summary.errors;
    loss_records += p->loss_records;
    findings += p->findings_count;
    if (p->summary.peak_bytes > peak) peak = p->summary.peak_bytes;
    j_printf(&b, "%s{\"pid\":%ld,\"ppid\":%ld,\"trace\":", i ? "," : "", p->pid, p->ppid);
    j_str(&b, p->trace);
    j_lit(&b, ",\"program\":");   /* argv[0] without its folders: the legend tells images apart */
    const char *prog = p->argv && p->argc > 0 ? p->argv[0] : NULL;
    j_str(&b, prog && strrchr(prog, '/') ? strrchr(prog, '/') + 1 : prog);
    j_printf(&b, ",\"clean_exit\":%d,\"exit_code\":%d,\"signal\":%d,\"allocs\":%llu,\"frees\":%llu,"
             "\"peak\":%llu,\"start\":%llu,\"end\":%llu,\"unclassified\":%s,\"findings\":%zu,"
             "\"errors\":%llu,\"loss_records\":%llu}",
             p->clean_exit, p->exit_code, p->signal, (unsigned long long)p->summary.allocs,
             (unsigned long long)p->summary.frees, (unsigned long long)p->summary.peak_bytes,
             (unsigned long long)rel(m, p->start_ns), (unsigned long long)rel(m, p->end_ns),
             p->unclassified ? "true" : "false", p->findings_count, (unsigned long long)p->summary.errors,
             (unsigned long long)p->loss_records);
  }
  j_printf(&b, "],\"allocs\":%llu,\"frees\":%llu,\"peak\":%llu,\"errors\":%llu,\"loss_records\":%llu,"
           "\"findings\":%zu,\"duration\":%llu",
           (unsigned long long)allocs, (unsigned long long)frees, (unsigned long long)peak,
           (unsigned long long)errors, (unsigned long long)loss_records, findings, (unsigned long long)(m->end_ns > m->start_ns ? m->end_ns - m->start_ns : 0));

  /* kinds over all processes, worst first */
  report_kind_total *kinds = NULL;
  size_t nkinds = 0, ngroups = 0;
  for (size_t i = 0; i < m->nprocs; i++) ngroups += m->procs[i]->ngroups, nkinds += m->procs[i]->nkinds;
  kinds = calloc(nkinds ? nkinds : 1, sizeof *kinds);
  nkinds = 0;
  for (size_t i = 0; kinds && i < m->nprocs; i++)
    for (size_t k = 0; k < m->procs[i]->nkinds; k++) {
      const report_kind_total *t = &m->procs[i]->kinds[k];
      size_t j = 0;
      while (j < nkinds && strcmp(kinds[j].kind, t->kind) != 0) j++;
      if (j == nkinds) kinds[nkinds++] = (report_kind_total){ t->kind, 0, 0, 0, t->rank };
      kinds[j].groups += t->groups;
      kinds[j].bytes += t->bytes;
      kinds[j].blocks += t->blocks;
    }
  for (size_t i = 1; i < nkinds; i++)   /* insertion sort by rank: few kinds */
    for (size_t j = i; j > 0 && kinds[j].rank < kinds[j - 1].rank; j--) {
      report_kind_total t = kinds[j];
      kinds[j] = kinds[j - 1];
      kinds[j - 1] = t;
    }
  j_lit(&b, ",\"kinds\":[");
  for (size_t i = 0; i < nkinds; i++) {
    j_lit(&b, i ? ",{\"kind\":" : "{\"kind\":");
    j_str(&b, kinds[i].kind);
    j_printf(&b, ",\"groups\":%llu,\"bytes\":%llu,\"blocks\":%llu,\"leak\":%s}", (unsigned long long)kinds[i].groups,
             (unsigned long long)kinds[i].bytes, (unsigned long long)kinds[i].blocks,
             !ta_kind_is_error(kinds[i].kind) ? "true" : "false");
  }
  j_lit(&b, "]");
  free(kinds);

  /* the findings: worst kinds and largest groups first, bounded */
  const report_group **order = malloc((ngroups ? ngroups : 1) * sizeof *order);
  if (!order) b.oom = true;
  size_t k = 0;
  for (size_t i = 0; order && i < m->nprocs; i++)
    for (size_t g = 0; g < m->procs[i]->ngroups; g++) order[k++] = &m->procs[i]->groups[g];
  if (order && k > 1) qsort(order, k, sizeof *order, by_group_rank);
  size_t shown = k < HTML_MAX_GROUPS ? k : HTML_MAX_GROUPS;
  j_lit(&b, ",\n\"findings\":[");
  size_t rows = 0, used = 0;
  for (size_t i = 0; order && i < k && rows < shown; i++) {
    const report_group *g = order[i];
    if (!g) continue;   /* merged into an earlier row */
    size_t pi = 0;
    while (pi < m->nprocs && !(g >= m->procs[pi]->groups && g < m->procs[pi]->groups + m->procs[pi]->ngroups)) pi++;
    report_process *p = m->procs[pi];
    /* ref.underflow: one row per place of the extra release (the row's
     * headline), the groups of its objects together in it */
    uint64_t blocks = g->blocks;
    size_t same = 0;
    bool merge = ta_kind_of(g->kind) == TA_KIND_REF_UNDERFLOW;
    for (size_t j = i + 1; merge && j < k; j++)
      if (order[j] && order[j] >= p->groups && order[j] < p->groups + p->ngroups && same_headline(p, g, order[j]))
        blocks += order[j]->blocks, same++;
    j_lit(&b, rows++ ? ",\n{\"kind\":" : "\n{\"kind\":");
    j_str(&b, g->kind);
    j_printf(&b, ",\"bytes\":%llu,\"blocks\":%llu,\"pid\":%ld,\"tag\":", (unsigned long long)g->bytes,
             (unsigned long long)blocks, p->pid);
    j_str(&b, g->tag_name);
    group_fields(&b, &stk, pi, p, g);
    used++;
    if (same) {   /* the other groups of the row: their own objects, stacks and histories */
      j_printf(&b, ",\"groups\":%zu,\"others\":[", same + 1);
      for (size_t j = i + 1, n = 0; j < k && n < same; j++) {
        const report_group *o = order[j];
        if (!o || !(o >= p->groups && o < p->groups + p->ngroups) || !same_headline(p, g, o)) continue;
        j_printf(&b, "%s{\"bytes\":%llu,\"blocks\":%llu", n++ ? "," : "", (unsigned long long)o->bytes,
                 (unsigned long long)o->blocks);
        group_fields(&b, &stk, pi, p, o);
        j_lit(&b, "}");
        order[j] = NULL;
        used++;
      }
      j_lit(&b, "]");
    }
    j_lit(&b, "}");
  }
  j_lit(&b, "]");
  if (used < k)
    j_printf(&notes, "%s\"the table lists the %zu worst of %zu finding groups\"", notes.len ? "," : "", used, k);
  free(order);

  /* the timeline, the flame graphs */
  j_lit(&b, ",\n\"timeline\":");
  timeline(&b, m, &st, &notes);
  j_lit(&fl, "{\"leaked\":");
  flame(&fl, m, &st, REPORT_FOLDED_LEAKED, &notes);
  j_lit(&fl, ",\"peak\":");
  flame(&fl, m, &st, REPORT_FOLDED_PEAK, &notes);
  j_lit(&fl, "}");
  j_lit(&b, ",\n\"flame\":");
  if (fl.s) j_put(&b, fl.s, fl.len);
  if (fl.oom) b.oom = true;

  /* the stacks the findings name, then every string */
  j_lit(&b, ",\n\"stacks\":[");
  for (size_t i = 0; i < stk.n; i++) {
    const report_mstack *s = stk.v[i];
    j_lit(&b, i ? ",\n[" : "\n[");
    size_t nf = s->nframes < HTML_MAX_FRAMES ? s->nframes : HTML_MAX_FRAMES;
    for (size_t f = 0; f < nf; f++) {
      if (f) j_put(&b, ",", 1);
      frame_json(&b, &st, &s->frames[f]);
    }
    j_lit(&b, "]");
  }
  j_lit(&b, "],\n\"strings\":[");
  for (size_t i = 0; i < st.n; i++) {
    if (i) j_put(&b, ",", 1);
    j_str(&b, st.v[i]);
  }
  j_lit(&b, "],\n\"notes\":[");
  if (notes.s) j_put(&b, notes.s, notes.len);
  j_lit(&b, "]}");

  /* the page around it */
  jbuf page = { 0 };
  j_lit(&page, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
               "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
               "<title>tagalloc report</title>\n<style>\n");
  j_put(&page, (const char *)report_html_css, report_html_css_len);
  j_lit(&page, "</style></head>\n<body>\n");
  j_put(&page, (const char *)report_html_body, report_html_body_len);
  j_lit(&page, "\n<script type=\"application/json\" id=\"tagalloc-data\">");
  bool ok = !b.oom && !notes.oom && !page.oom;
  int rc = ok && j_write(fd, &page) && j_write(fd, &b) ? 0 : -1;
  free(page.s);
  page = (jbuf){ 0 };
  j_lit(&page, "</script>\n<script>\n");
  j_put(&page, (const char *)report_html_js, report_html_js_len);
  j_lit(&page, "</script>\n</body></html>\n");
  if (rc == 0 && !j_write(fd, &page)) rc = -1;
  free(page.s);
  free(b.s);
  free(fl.s);
  free(notes.s);
  for (size_t i = 0; i < st.nowned; i++) free(st.owned[i]);
  free(st.owned);
  free(st.v);
  free(st.ix);
  free(stk.keys);
  free(stk.vals);
  free(stk.v);
  return rc;
}
