/* process.c - one process of the report model (model.h): a source's
 * findings with the suppressions applied and the totals counted, its stacks
 * symbolized on demand.  What the LD_PRELOAD shim's exit report needs, and
 * nothing of the traces (model.c). */
#include "model_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------ */

void *report_pool_alloc(report_pool *p, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!p->head || p->head->cap - p->head->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    report_chunk *c = malloc(sizeof *c + cap);
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

char *report_pool_str(report_pool *p, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = report_pool_alloc(p, n);
  if (d) memcpy(d, s, n);
  return d;
}

void report_pool_free(report_pool *p) {
  for (report_chunk *c = p->head, *n; c; c = n) {
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

/* ---- the process --------------------------------------------------------------- */


report_group *report_group_push(report_process *p) {
  report_proc_priv *pv = p->priv;
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
  report_proc_priv *pv = p->priv;
  if (!f || !f->kind) return 0;
  if (b->supp && report_suppressed(f, &p->src, b->supp)) {
    cut_add(b, f->kind, f->bytes, f->blocks);
    return 0;
  }
  report_group *g = report_group_push(p);
  if (!g) {
    b->oom = true;
    return 1;
  }
  g->kind = report_pool_str(&pv->mem, f->kind);
  g->bytes = f->bytes;
  g->blocks = f->blocks;
  g->addr = f->addr;
  g->holder = f->holder;
  g->tag = f->tag;
  g->tag_name = f->tag != TA_ANY ? report_pool_str(&pv->mem, report_source_tag(&p->src, f->tag)) : NULL;
  g->slot = report_pool_str(&pv->mem, f->slot);
  char d[sizeof f->detail + 1];
  memcpy(d, f->detail, sizeof f->detail);
  d[sizeof f->detail] = '\0';
  g->detail = report_pool_str(&pv->mem, d);
  g->stack = f->stack;
  g->alloc_stack = f->alloc_stack;
  g->free_stack = f->free_stack;
  g->aux_stack = f->aux_stack;
  if (f->history && f->history_len) {
    ta_ref_event *h = report_pool_alloc(&pv->mem, f->history_len * sizeof *h);
    if (h) {
      memcpy(h, f->history, f->history_len * sizeof *h);
      g->history = h;
      g->history_len = f->history_len;
    }
  }
  if (f->sites && f->nsites) {
    ta_ref_site *st = report_pool_alloc(&pv->mem, f->nsites * sizeof *st);
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

bool report_group_is_loss_record(const report_group *g) {
  return ta_kind_is_leak(g->kind) && ta_kind_of(g->kind) != TA_KIND_LEAK_INDIRECT;
}

/* Per-kind totals, findings_count and loss_records, from the groups. */
bool report_process_count(report_process *p) {
  free(p->kinds);
  p->kinds = NULL;
  p->nkinds = 0;
  p->findings_count = 0;
  p->loss_records = 0;
  if (!p->ngroups) return true;
  p->kinds = calloc(p->ngroups, sizeof *p->kinds);
  if (!p->kinds) return false;
  for (size_t i = 0; i < p->ngroups; i++) {
    const report_group *g = &p->groups[i];
    /* growth is still reachable memory: a warning, not a problem for the exit status */
    if (!ta_kind_is_held(g->kind)) p->findings_count++;
    p->loss_records += report_group_is_loss_record(g);
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

char **report_argv_copy(char *const *argv, int argc) {
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

void report_argv_free(char **v, int argc) {
  if (!v) return;
  for (int i = 0; i < argc; i++) free(v[i]);
  free(v);
}

/* The patterns that suppressed something, copied (the suppressions object
 * may go before the model). */
bool report_process_copy_used(report_process *p, report_suppressions *supp) {
  report_proc_priv *pv = p->priv;
  free(p->suppressions_used);
  p->suppressions_used = NULL;
  p->nsuppressions_used = 0;
  size_t nu = supp ? report_suppressions_used(supp, NULL, 0) : 0;
  if (!nu) return true;
  p->suppressions_used = calloc(nu, sizeof *p->suppressions_used);
  if (!p->suppressions_used) return false;
  nu = report_suppressions_used(supp, p->suppressions_used, nu);
  for (size_t i = 0; i < nu; i++) {
    p->suppressions_used[i].type = report_pool_str(&pv->mem, p->suppressions_used[i].type);
    p->suppressions_used[i].pattern = report_pool_str(&pv->mem, p->suppressions_used[i].pattern);
  }
  p->nsuppressions_used = nu;
  return true;
}

report_process *report_process_new(const report_source *src, const report_process_info *info) {
  report_process *p = calloc(1, sizeof *p);
  report_proc_priv *pv = calloc(1, sizeof *pv);
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
    p->argv = report_argv_copy((char *const *)info->argv, info->argc);
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

  ok = ok && report_process_copy_used(p, b.supp) && report_process_count(p);
  if (!ok) {
    report_process_free(p);
    return NULL;
  }
  return p;
}

void report_process_free(report_process *p) {
  if (!p) return;
  report_proc_priv *pv = p->priv;
  if (pv) {
    for (size_t i = 0; i < pv->cap; i++)
      if (pv->stacks[i]) free(pv->stacks[i]->frames);
    free(pv->stacks);
    report_pool_free(&pv->mem);
    if (pv->release) pv->release(pv->release_arg);
    free(pv);
  }
  report_argv_free(p->argv, p->argc);
  free(p->trace);
  free(p->groups);
  free(p->kinds);
  free(p->callsites);
  free(p->suppressions_used);
  free(p);
}

/* ---- stacks -------------------------------------------------------------------- */

static report_mstack *symbolize_stack(report_process *p, uint32_t id) {
  report_proc_priv *pv = p->priv;
  report_mstack *st = report_pool_alloc(&pv->mem, sizeof *st);
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
  report_proc_priv *pv = p->priv;
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
