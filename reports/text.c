/* text.c - the text report of a process's findings, shaped like
 * LeakSanitizer's: errors first, then leak groups, then valgrind's leak
 * summary.  The findings come from a report_source: the running ledger (the
 * exit report) or a trace read offline (`tagalloc report`).  Output goes
 * through a small buffered writer over write(2) (no stdio, no locks of
 * libc's), so it works from atexit handlers and after fork.  Symbolization
 * and all memory happen at report time only. */
#include "report.h"
#include "tagalloc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_FRAMES 32
#define DEFAULT_GROUPS 100
#define HISTORY_SHOWN  8     /* ref transitions printed: the first and last halves */
#define MAX_KINDS      32

/* ---- buffered writer ------------------------------------------------------ */

typedef struct {
  int    fd;
  size_t len;
  char   buf[8192];
} wbuf;

static void w_flush(wbuf *w) {
  size_t off = 0;
  while (off < w->len) {
    ssize_t r = write(w->fd, w->buf + off, w->len - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;   /* nowhere to report a failing report: drop it */
    off += (size_t)r;
  }
  w->len = 0;
}

static void w_put(wbuf *w, const char *s, size_t n) {
  while (n) {
    if (w->len == sizeof w->buf) w_flush(w);
    size_t k = sizeof w->buf - w->len;
    if (k > n) k = n;
    memcpy(w->buf + w->len, s, k);
    w->len += k;
    s += k;
    n -= k;
  }
}

__attribute__((format(printf, 2, 3)))
static void w_printf(wbuf *w, const char *fmt, ...) {
  va_list ap;
  for (int attempt = 0; attempt < 2; attempt++) {
    size_t room = sizeof w->buf - w->len;
    va_start(ap, fmt);
    int n = vsnprintf(w->buf + w->len, room, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < room) {
      w->len += (size_t)n;
      return;
    }
    if (attempt == 0 && w->len > 0) {
      w_flush(w);   /* retry into an empty buffer */
      continue;
    }
    w->len = sizeof w->buf - 1;   /* longer than the whole buffer: cut */
    w_put(w, "\n", 1);
    return;
  }
}

/* ---- shared state --------------------------------------------------------- */

typedef struct {
  report_ctx *ctx;
  pid_t       pid;
} ctx_slot;

static ctx_slot *the_slot;   /* accessed atomically */

/* The symbolizer of this process, made on first use.  A forked child makes
 * its own (the parent's may have been locked by another thread at fork) and
 * leaks the copy it inherited. */
static report_ctx *symbolizer(void) {
  pid_t pid = getpid();
  ctx_slot *s = __atomic_load_n(&the_slot, __ATOMIC_ACQUIRE);
  if (s && s->pid == pid) return s->ctx;
  ctx_slot *n = malloc(sizeof *n);
  if (!n) return NULL;
  n->ctx = report_ctx_new();
  n->pid = pid;
  if (!n->ctx) {
    free(n);
    return NULL;
  }
  if (__atomic_compare_exchange_n(&the_slot, &s, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return n->ctx;
  report_ctx_free(n->ctx);   /* another thread was first */
  free(n);
  return s && s->pid == pid ? s->ctx : NULL;
}

static long option_or(const char *name, long dflt) {
  long v = ta_option(name);
  return v > 0 ? v : dflt;
}

/* ---- the ledger as a source ------------------------------------------------- */

static size_t ledger_frames(void *arg, uint32_t stack, const uintptr_t **frames) {
  (void)arg;
  return ta_stack_frames(stack, frames);
}

static const char *ledger_tag(void *arg, ta_tag tag) {
  (void)arg;
  return ta_tag_name(tag);
}

static size_t ledger_visit(void *arg, ta_finding_fn *fn, void *fn_arg) {
  (void)arg;
  return ta_findings_visit(fn, fn_arg);
}

static ta_summary ledger_summary(void *arg) {
  (void)arg;
  return ta_summary_get();
}

void report_source_ledger(report_source *out) {
  memset(out, 0, sizeof *out);
  out->pid = (long)getpid();
  out->stack_frames = ledger_frames;
  out->tag_name = ledger_tag;
  out->visit = ledger_visit;
  out->summary = ledger_summary;
}

report_ctx *report_source_ctx(const report_source *src) {
  if (src && src->ctx) return src->ctx;
  /* only the ledger's own stacks are this process's addresses */
  return !src || src->stack_frames == ledger_frames ? symbolizer() : NULL;
}

const char *report_source_tag(const report_source *src, ta_tag tag) {
  const char *n = src->tag_name ? src->tag_name(src->arg, tag) : NULL;
  return n ? n : "?";
}

bool report_kind_is_leak(const char *kind) {
  size_t n = strlen(kind);
  return strncmp(kind, "leak.", 5) == 0 || (n >= 5 && strcmp(kind + n - 5, ".leak") == 0) ||
         strcmp(kind, "gpu.pool-retained") == 0 || strcmp(kind, "unclassified") == 0;
}

/* ---- frames and stacks ---------------------------------------------------- */

static void write_frame(wbuf *w, const char *indent, size_t index, const report_frame *f) {
  w_printf(w, "%s#%zu 0x%lx in %s", indent, index, (unsigned long)f->address,
           f->function ? f->function : "??");
  if (f->file) {
    if (f->line > 0) w_printf(w, " %s:%d", f->file, f->line);
    else w_printf(w, " %s", f->file);
  }
  if (!f->module) w_printf(w, " (<unknown module>)");
  else if (f->file) w_printf(w, " (%s)", f->module);
  else w_printf(w, " (%s+0x%lx)", f->module, (unsigned long)f->module_offset);
  if (f->inlined) w_printf(w, " (inlined)");
  w_put(w, "\n", 1);
}

/* Writes the frames of stack, at most max_frames lines; returns the lines. */
static size_t write_stack(wbuf *w, const report_source *src, uint32_t stack, long max_frames,
                          const char *indent) {
  const uintptr_t *pcs = NULL;
  size_t n = stack ? src->stack_frames(src->arg, stack, &pcs) : 0;
  if (n == 0 || !pcs) {
    w_printf(w, "%s<no stack recorded>\n", indent);
    return 0;
  }
  report_ctx *ctx = report_source_ctx(src);
  size_t lines = 0;
  for (size_t i = 0; i < n; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE);
    if (k <= 0) {   /* no symbolizer at all */
      memset(fr, 0, sizeof fr[0]);
      fr[0].address = pcs[i];
      k = 1;
    }
    for (int j = 0; j < k; j++) {
      if ((long)lines >= max_frames) {
        w_printf(w, "%s... %zu more frame(s)\n", indent, n - i);
        return lines;
      }
      write_frame(w, indent, lines++, &fr[j]);
    }
  }
  return lines;
}

size_t report_text_write_stack(int fd, uint32_t stack, long max_frames) {
  wbuf w = { .fd = fd };
  report_source src;
  report_source_ledger(&src);
  if (max_frames <= 0) max_frames = option_or("report_frames", DEFAULT_FRAMES);
  size_t lines = write_stack(&w, &src, stack, max_frames, "    ");
  w_flush(&w);
  return lines;
}

/* ---- one finding group ----------------------------------------------------- */

typedef struct {
  const char *kind;
  uint64_t    groups, omitted, omitted_bytes, omitted_blocks;
} kind_stat;

typedef struct {
  wbuf      *w;
  const report_source *src;
  const bool *hidden;        /* by visit index: suppressed groups (NULL: none) */
  size_t     nhidden, index;
  long       max_frames, max_groups;
  size_t     shown;
  kind_stat  kinds[MAX_KINDS];
  size_t     nkinds;
  kind_stat  other;   /* when more kinds than MAX_KINDS show up */
} render;

static kind_stat *kind_of(render *r, const char *kind) {
  for (size_t i = 0; i < r->nkinds; i++)
    if (strcmp(r->kinds[i].kind, kind) == 0) return &r->kinds[i];
  if (r->nkinds == MAX_KINDS) return &r->other;
  r->kinds[r->nkinds].kind = kind;
  return &r->kinds[r->nkinds++];
}

static int kind_is(const ta_finding *f, const char *k) { return strcmp(f->kind, k) == 0; }

static void write_tag(render *r, ta_tag tag) {
  if (tag != TA_ANY) w_printf(r->w, "   [tag: %s]", report_source_tag(r->src, tag));
}

static void write_times(wbuf *w, const ta_finding *f) {
  if (f->blocks > 1) w_printf(w, " (%llu times)", (unsigned long long)f->blocks);
}

/* " (40-byte block)" when the size is known. */
static void write_block(wbuf *w, uint64_t bytes) {
  if (bytes) w_printf(w, " (%llu-byte block)", (unsigned long long)bytes);
}

/* A further stack of the finding, labelled, unless 0 or already shown. */
static void write_section(render *r, const ta_finding *f, uint32_t stack, const char *label) {
  if (!stack || stack == f->stack) return;
  w_printf(r->w, "%s\n", label);
  write_stack(r->w, r->src, stack, r->max_frames, "    ");
}

static void write_event(render *r, const ta_ref_event *e) {
  if (e->delta == 0) w_printf(r->w, "  init -> %ld", e->count);
  else w_printf(r->w, "  %+d -> %ld", e->delta, e->count);
  w_printf(r->w, " by thread T%u:\n", (unsigned)e->thread);
  write_stack(r->w, r->src, e->stack, r->max_frames, "      ");
}

static void write_history(render *r, const ta_finding *f, const char *what) {
  if (!f->history || f->history_len == 0) return;
  size_t n = f->history_len;
  w_printf(r->w, "%s (%zu, oldest first):\n", what, n);
  if (n <= HISTORY_SHOWN) {
    for (size_t i = 0; i < n; i++) write_event(r, &f->history[i]);
    return;
  }
  size_t head = HISTORY_SHOWN / 2, tail = HISTORY_SHOWN - head;
  for (size_t i = 0; i < head; i++) write_event(r, &f->history[i]);
  w_printf(r->w, "  ... %zu more transition(s)\n", n - head - tail);
  for (size_t i = n - tail; i < n; i++) write_event(r, &f->history[i]);
}

/* Leak-like groups: "<Title> of B byte(s) in N object(s) allocated from:". */
static const char *leak_title(const char *kind) {
  if (strcmp(kind, "leak.direct") == 0) return "Direct leak";
  if (strcmp(kind, "leak.indirect") == 0) return "Indirect leak";
  if (strcmp(kind, "leak.possible") == 0) return "Possible leak";
  if (strcmp(kind, "leak.orphan") == 0) return "Orphaned leak";
  if (strcmp(kind, "gpu.leak") == 0) return "GPU leak";
  if (strcmp(kind, "gpu.pool-retained") == 0) return "GPU memory retained by the pool";
  return NULL;
}


static void write_finding(render *r, const ta_finding *f) {
  wbuf *w = r->w;
  unsigned long addr = (unsigned long)f->addr, holder = (unsigned long)f->holder;
  const char *slot = f->slot ? f->slot : "?";
  const char *title = leak_title(f->kind);

  if (kind_is(f, "unclassified")) {
    w_printf(w, "Unclassified: %llu byte(s) in %llu object(s) live at the end, allocated from:",
             (unsigned long long)f->bytes, (unsigned long long)f->blocks);
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
  } else if (title) {
    w_printf(w, "%s of %llu byte(s) in %llu object(s) allocated from:", title,
             (unsigned long long)f->bytes, (unsigned long long)f->blocks);
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    if (kind_is(f, "leak.orphan")) {
      if (f->holder) w_printf(w, "last held by 0x%lx in slot \"%s\"; ", holder, slot);
      w_printf(w, "orphaned at:\n");
      write_stack(w, r->src, f->aux_stack, r->max_frames, "    ");
    }
  } else if (kind_is(f, "ref.leak")) {
    w_printf(w, "ref.leak: %llu object(s) with references left at exit, such as 0x%lx",
             (unsigned long long)f->blocks, addr);
    write_block(w, f->bytes);
    w_printf(w, ", last acquired at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->alloc_stack, "allocated at:");
    write_history(r, f, "unmatched acquisitions");
  } else if (kind_is(f, "free.double")) {
    w_printf(w, "free.double: attempting double-free on 0x%lx", addr);
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, " at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "previously allocated at:");
  } else if (kind_is(f, "free.invalid")) {
    w_printf(w, "free.invalid: attempting free on address 0x%lx which was not allocated by tagalloc", addr);
    write_times(w, f);
    w_printf(w, ", at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->alloc_stack, "the block around it was allocated at:");
    write_section(r, f, f->free_stack, "freed at:");
  } else if (kind_is(f, "use.after-free")) {
    w_printf(w, "use.after-free: freed block 0x%lx", addr);
    write_block(w, f->bytes);
    w_printf(w, " used after free");
    write_times(w, f);
    w_printf(w, ", detected at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "previously allocated at:");
  } else if (kind_is(f, "arena.after-reset")) {
    w_printf(w, "arena.after-reset: pointer 0x%lx into an arena reset since", addr);
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, ", used at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "hold declared at:");
    write_section(r, f, f->free_stack, "arena reset at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, "ref.underflow")) {
    w_printf(w, "ref.underflow: refcount of 0x%lx", addr);
    write_block(w, f->bytes);
    w_printf(w, " released below zero or after free");
    write_times(w, f);
    w_printf(w, " at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_history(r, f, "refcount transitions");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, "hold.stack")) {
    w_printf(w, "hold.stack: holder 0x%lx keeps a pointer into a stack frame (0x%lx) in slot \"%s\"",
             holder, addr, slot);
    write_times(w, f);
    w_printf(w, ", declared at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack ? f->stack : f->aux_stack, r->max_frames, "    ");
    if (f->stack) write_section(r, f, f->aux_stack, "hold declared at:");
  } else if (kind_is(f, "hold.dangling")) {
    w_printf(w, "hold.dangling: holder 0x%lx keeps in slot \"%s\" a pointer to dead memory 0x%lx",
             holder, slot, addr);
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, ", found at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "hold declared at:");
    write_section(r, f, f->free_stack, "target freed or reset at:");
    write_section(r, f, f->alloc_stack, "target allocated at:");
  } else {   /* a kind this emitter does not know yet: every fact we have */
    w_printf(w, "%s: on 0x%lx", f->kind, addr);
    write_block(w, f->bytes);
    write_times(w, f);
    if (f->holder) w_printf(w, ", holder 0x%lx slot \"%s\"", holder, slot);
    w_printf(w, " at:");
    write_tag(r, f->tag);
    w_put(w, "\n", 1);
    write_stack(w, r->src, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "declared at:");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
    write_history(r, f, "transitions");
  }
  if (f->detail[0])
    w_printf(w, "  detail: %.*s\n", (int)sizeof f->detail, f->detail);
}

static int visit(const ta_finding *f, void *arg) {
  render *r = arg;
  size_t index = r->index++;
  if (!f || !f->kind) return 0;
  if (r->hidden && index < r->nhidden && r->hidden[index]) return 0;
  kind_stat *ks = kind_of(r, f->kind);
  if (++ks->groups > (uint64_t)r->max_groups) {
    ks->omitted++;
    ks->omitted_bytes += f->bytes;
    ks->omitted_blocks += f->blocks;
    return 0;
  }
  w_put(r->w, "\n", 1);
  write_finding(r, f);
  r->shown++;
  return 0;
}

static int any_group(const ta_finding *f, void *arg) {
  (void)f;
  (void)arg;
  return 1;
}

/* ---- suppressions ------------------------------------------------------------ */

typedef struct {
  const report_source *src;
  report_suppressions *supp;
  bool       *hidden;            /* by visit index */
  size_t      n, cap;
  size_t      shown;             /* groups not suppressed */
  ta_summary  cut;               /* what the suppressed leak groups held, by category */
  uint64_t    cut_unclassified_bytes, cut_unclassified_blocks;
  uint64_t    bytes, blocks;     /* all suppressed leak blocks (valgrind's "suppressed:") */
} supp_pass;

static int supp_visit(const ta_finding *f, void *arg) {
  supp_pass *p = arg;
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    bool *h = realloc(p->hidden, cap * sizeof *h);
    if (!h) return 1;
    p->hidden = h;
    p->cap = cap;
  }
  bool hide = f && f->kind && report_suppressed(f, p->src, p->supp);
  p->hidden[p->n++] = hide;
  if (!hide) {
    p->shown += f && f->kind;
    return 0;
  }
  uint64_t *bytes = NULL, *blocks = NULL;
  if (strcmp(f->kind, "leak.direct") == 0) bytes = &p->cut.direct_bytes, blocks = &p->cut.direct_blocks;
  else if (strcmp(f->kind, "leak.indirect") == 0) bytes = &p->cut.indirect_bytes, blocks = &p->cut.indirect_blocks;
  else if (strcmp(f->kind, "leak.possible") == 0) bytes = &p->cut.possible_bytes, blocks = &p->cut.possible_blocks;
  else if (strcmp(f->kind, "leak.orphan") == 0) bytes = &p->cut.orphan_bytes, blocks = &p->cut.orphan_blocks;
  else if (strcmp(f->kind, "unclassified") == 0) bytes = &p->cut_unclassified_bytes, blocks = &p->cut_unclassified_blocks;
  if (bytes) {
    *bytes += f->bytes;
    *blocks += f->blocks;
    p->bytes += f->bytes;
    p->blocks += f->blocks;
  }
  return 0;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* LeakSanitizer's section, after the groups. */
static void write_suppressions_used(wbuf *w, const report_suppressions *supp) {
  size_t n = report_suppressions_used(supp, NULL, 0);
  if (n == 0) return;
  report_suppression_use *u = malloc(n * sizeof *u);
  if (!u) return;
  n = report_suppressions_used(supp, u, n);
  w_printf(w, "-----------------------------------------------------\n"
              "Suppressions used:\n"
              "  count      bytes template\n");
  for (size_t i = 0; i < n; i++)
    w_printf(w, "%7llu %10llu %s%s\n", (unsigned long long)u[i].hits, (unsigned long long)u[i].bytes,
             strcmp(u[i].type, "leak") == 0 ? "" : "tag:", u[i].pattern);
  w_printf(w, "-----------------------------------------------------\n");
  free(u);
}

/* ---- the report ------------------------------------------------------------ */

static void write_omitted(wbuf *w, const kind_stat *k, const char *kind) {
  if (!k->omitted) return;
  w_printf(w, "... %llu more group(s) of %s not shown (%llu byte(s), %llu object(s)); "
           "TAGALLOC_REPORT_GROUPS raises the limit\n",
           (unsigned long long)k->omitted, kind, (unsigned long long)k->omitted_bytes,
           (unsigned long long)k->omitted_blocks);
}

void report_text_render(int fd, const report_source *src) {
  wbuf w = { .fd = fd };
  long pid = src->pid;
  ta_summary s = src->summary(src->arg);
  uint64_t live_bytes = src->unclassified_bytes, live_blocks = src->unclassified_blocks;

  /* Suppressions first: which groups are shown, and what the summary keeps. */
  supp_pass sp = { .src = src, .supp = src->suppressions ? src->suppressions : report_suppressions_default() };
  size_t any;
  if (sp.supp) {
    report_suppressions_reset_used(sp.supp);
    src->visit(src->arg, supp_visit, &sp);
    any = sp.shown;
    s.direct_bytes = minus(s.direct_bytes, sp.cut.direct_bytes);
    s.direct_blocks = minus(s.direct_blocks, sp.cut.direct_blocks);
    s.indirect_bytes = minus(s.indirect_bytes, sp.cut.indirect_bytes);
    s.indirect_blocks = minus(s.indirect_blocks, sp.cut.indirect_blocks);
    s.possible_bytes = minus(s.possible_bytes, sp.cut.possible_bytes);
    s.possible_blocks = minus(s.possible_blocks, sp.cut.possible_blocks);
    s.orphan_bytes = minus(s.orphan_bytes, sp.cut.orphan_bytes);
    s.orphan_blocks = minus(s.orphan_blocks, sp.cut.orphan_blocks);
    live_bytes = minus(live_bytes, sp.cut_unclassified_bytes);
    live_blocks = minus(live_blocks, sp.cut_unclassified_blocks);
  } else {
    any = src->visit(src->arg, any_group, NULL);
  }

  if (any == 0 && s.errors == 0 && s.direct_blocks == 0 && s.indirect_blocks == 0 &&
      s.possible_blocks == 0 && s.orphan_blocks == 0 && live_blocks == 0) {
    if (src->unclassified && s.allocs == 0)
      w_printf(&w, "==%ld== tagalloc: the trace holds no allocation (the process ended before a trace "
               "buffer was written out)\n", pid);
    else if (src->unclassified)
      w_printf(&w, "==%ld== tagalloc: no errors, nothing live at the end (%llu allocations, %llu frees, "
               "peak %llu bytes; no exit scan)\n",
               pid, (unsigned long long)s.allocs, (unsigned long long)s.frees,
               (unsigned long long)s.peak_bytes);
    else
      w_printf(&w, "==%ld== tagalloc: no leaks, no errors (%llu allocations, %llu frees, peak %llu bytes)\n",
               pid, (unsigned long long)s.allocs, (unsigned long long)s.frees,
               (unsigned long long)s.peak_bytes);
    if (sp.blocks) write_suppressions_used(&w, sp.supp);
    w_flush(&w);
    free(sp.hidden);
    return;
  }

  if (src->unclassified)
    w_printf(&w, "=================================================================\n"
                 "==%ld==WARNING: tagalloc: no exit scan (the process was killed, crashed or ended "
                 "without exit): the blocks still live are unclassified, not leaks\n", pid);
  else
    w_printf(&w, "=================================================================\n"
                 "==%ld==ERROR: tagalloc: detected memory problems\n", pid);
  render r = {
    .w = &w,
    .src = src,
    .hidden = sp.supp ? sp.hidden : NULL,
    .nhidden = sp.n,
    .max_frames = option_or("report_frames", DEFAULT_FRAMES),
    .max_groups = option_or("report_groups", DEFAULT_GROUPS),
  };
  r.other.kind = "other kinds";
  src->visit(src->arg, visit, &r);

  int omitted = 0;
  for (size_t i = 0; i < r.nkinds; i++) omitted |= r.kinds[i].omitted != 0;
  if (omitted || r.other.omitted) {
    w_put(&w, "\n", 1);
    for (size_t i = 0; i < r.nkinds; i++) write_omitted(&w, &r.kinds[i], r.kinds[i].kind);
    write_omitted(&w, &r.other, r.other.kind);
  }
  if (sp.blocks) {
    w_put(&w, "\n", 1);
    write_suppressions_used(&w, sp.supp);
  }

  if (src->unclassified) {
    w_printf(&w, "\nLIVE AT THE END (unclassified: no exit scan):\n"
                 "   %llu bytes in %llu blocks\n",
             (unsigned long long)live_bytes, (unsigned long long)live_blocks);
    if (sp.blocks)
      w_printf(&w, "   suppressed: %llu bytes in %llu blocks\n", (unsigned long long)sp.bytes,
               (unsigned long long)sp.blocks);
    w_printf(&w, "SUMMARY: tagalloc: %llu byte(s) unclassified in %llu allocation(s); %llu error(s).\n",
             (unsigned long long)live_bytes, (unsigned long long)live_blocks,
             (unsigned long long)s.errors);
    w_flush(&w);
    free(sp.hidden);
    return;
  }

  unsigned long long leaked_bytes = s.direct_bytes + s.indirect_bytes + s.orphan_bytes;
  unsigned long long leaked_blocks = s.direct_blocks + s.indirect_blocks + s.orphan_blocks;
  w_printf(&w, "\nLEAK SUMMARY:\n"
               "   definitely lost: %llu bytes in %llu blocks\n"
               "   indirectly lost: %llu bytes in %llu blocks\n"
               "     possibly lost: %llu bytes in %llu blocks\n"
               "   still reachable: %llu bytes in %llu blocks\n"
               "          orphaned: %llu bytes in %llu blocks\n",
           (unsigned long long)s.direct_bytes, (unsigned long long)s.direct_blocks,
           (unsigned long long)s.indirect_bytes, (unsigned long long)s.indirect_blocks,
           (unsigned long long)s.possible_bytes, (unsigned long long)s.possible_blocks,
           (unsigned long long)s.reachable_bytes, (unsigned long long)s.reachable_blocks,
           (unsigned long long)s.orphan_bytes, (unsigned long long)s.orphan_blocks);
  if (sp.blocks)
    w_printf(&w, "        suppressed: %llu bytes in %llu blocks\n", (unsigned long long)sp.bytes,
             (unsigned long long)sp.blocks);
  w_printf(&w, "SUMMARY: tagalloc: %llu byte(s) leaked in %llu allocation(s); %llu error(s).\n",
           leaked_bytes, leaked_blocks, (unsigned long long)s.errors);
  w_flush(&w);
  free(sp.hidden);
}

void report_text_write(int fd) {
  report_source src;
  report_source_ledger(&src);
  report_text_render(fd, &src);
}

/* The ledger calls this at exit (and from ta_report_now). */
__attribute__((constructor)) static void report_text_register(void) {
  ta_reporter_set(report_text_write);
}
