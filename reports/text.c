/* text.c - the text report of a process's findings, shaped like
 * LeakSanitizer's: errors first, then leak groups, then valgrind's leak
 * summary.  The findings come from a report_source: the running ledger (the
 * exit report) or a trace read offline (`tagalloc report`).  Output goes
 * through a small buffered writer over write(2) (no stdio, no locks of
 * libc's), so it works from atexit handlers and after fork.  Symbolization
 * and all memory happen at report time only. */
#include "model.h"
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
  bool   color;          /* ANSI colours: a terminal, and NO_COLOR unset */
  bool   reset_at_nl;    /* a coloured line: reset at its end */
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
  const char *nl = w->reset_at_nl ? memchr(s, '\n', n) : NULL;
  if (nl) {   /* the end of a coloured line */
    w->reset_at_nl = false;
    w_put(w, s, (size_t)(nl - s));
    w_put(w, "\033[0m", 4);
    n -= (size_t)(nl - s);
    s = nl;
  }
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

/* ---- colours and numbers ------------------------------------------------------ */

/* NO_COLOR (https://no-color.org) and TERM=dumb, read at load: at the exit
 * report of an audited process __libc_freeres may have cleared environ. */
static bool no_color;
__attribute__((constructor)) static void color_init(void) {
  const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
  no_color = (nc && *nc) || (term && strcmp(term, "dumb") == 0);
}

static bool color_for(int fd) { return !no_color && isatty(fd); }

#define C_ERROR "\033[1;31m"   /* bold red: the report's first line */
#define C_TITLE "\033[1;34m"   /* bold blue: a finding's first line */
#define C_GOOD  "\033[1;32m"   /* bold green: nothing found */
#define C_BOLD  "\033[1m"      /* the summary line */

/* Starts colour code for the rest of the line (up to the next "\n" put). */
static void w_color(wbuf *w, const char *code) {
  if (!w->color) return;
  w_put(w, code, strlen(code));
  w->reset_at_nl = true;
}

/* Ends the colour before the line's end. */
static void w_uncolor(wbuf *w) {
  if (!w->reset_at_nl) return;
  w->reset_at_nl = false;
  w_put(w, "\033[0m", 4);
}

/* v with a comma between each group of three digits: 1,234,567. */
static const char *th(char buf[32], unsigned long long v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%llu", v), o = 0;
  for (int i = 0; i < n; i++) {
    if (i && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
  return buf;
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

static size_t ledger_frames(void *arg, uint32_t stack, uintptr_t *frames, size_t max) {
  (void)arg;
  return ta_stack_frames(stack, frames, max);
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

static size_t no_groups(void *arg, ta_finding_fn *fn, void *fn_arg) {
  (void)arg;
  (void)fn;
  (void)fn_arg;
  return 0;
}

static ta_summary no_summary(void *arg) {
  (void)arg;
  return (ta_summary){ 0 };
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
  if (src && src->ctx_make) return src->ctx_make(src->arg);
  /* only the ledger's own stacks are this process's addresses */
  return !src || src->stack_frames == ledger_frames ? symbolizer() : NULL;
}

const char *report_source_tag(const report_source *src, ta_tag tag) {
  const char *n = src->tag_name ? src->tag_name(src->arg, tag) : NULL;
  return n ? n : "?";
}

/* ---- frames and stacks ---------------------------------------------------- */

static void write_frame(wbuf *w, const char *indent, size_t index, const report_mframe *f) {
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
static size_t write_stack(wbuf *w, report_process *p, uint32_t stack, long max_frames, const char *indent) {
  const report_mstack *st = report_process_stack(p, stack);
  if (!st || st->npcs == 0) {
    w_printf(w, "%s<no stack recorded>\n", indent);
    return 0;
  }
  size_t lines = 0;
  for (size_t i = 0; i < st->nframes; i++) {
    if ((long)lines >= max_frames) {
      w_printf(w, "%s... %zu more frame(s)\n", indent, (size_t)(st->npcs - st->frames[i].pc));
      return lines;
    }
    write_frame(w, indent, lines++, &st->frames[i]);
  }
  return lines;
}

size_t report_text_write_stack(int fd, uint32_t stack, long max_frames) {
  wbuf w = { .fd = fd };
  report_source src;
  report_source_ledger(&src);
  if (max_frames <= 0) max_frames = option_or("report_frames", DEFAULT_FRAMES);
  /* one stack: no findings to visit */
  report_process *p = report_process_new(&(report_source){ .pid = src.pid, .stack_frames = src.stack_frames,
                                                           .tag_name = src.tag_name, .visit = no_groups,
                                                           .summary = no_summary }, NULL);
  size_t lines = p ? write_stack(&w, p, stack, max_frames, "    ") : 0;
  report_process_free(p);
  w_flush(&w);
  return lines;
}

/* ---- one finding group ----------------------------------------------------- */

typedef struct {
  wbuf           *w;
  report_process *p;
  long            max_frames, max_groups;
} render;

static bool kind_is(const report_group *f, ta_kind k) { return ta_kind_of(f->kind) == k; }

static void write_tag(render *r, const report_group *f) {
  if (f->tag_name) w_printf(r->w, "   [tag: %s]", f->tag_name);
}

static void write_times(wbuf *w, const report_group *f) {
  if (f->blocks > 1) w_printf(w, " (%llu times)", (unsigned long long)f->blocks);
}

/* An address, explained when it is a fill pattern of the ledger's (a
 * pointer read from a freed block: 0xdfdfdfdfdfdfdfdf). */
static void write_addr(wbuf *w, uint64_t addr) {
  w_printf(w, "0x%llx%s", (unsigned long long)addr, ta_poison_explain(addr, 8));
}

/* " (40-byte block)" when the size is known. */
static void write_block(wbuf *w, uint64_t bytes) {
  if (bytes) w_printf(w, " (%llu-byte block)", (unsigned long long)bytes);
}

/* A further stack of the finding, labelled, unless 0 or already shown. */
/* A stack under its label, when there is one. */
static void write_labeled(render *r, uint32_t stack, const char *label) {
  if (!stack) return;
  w_printf(r->w, "%s\n", label);
  write_stack(r->w, r->p, stack, r->max_frames, "    ");
}

/* The same, unless it is the headline stack already printed. */
static void write_section(render *r, const report_group *f, uint32_t stack, const char *label) {
  if (stack != f->stack) write_labeled(r, stack, label);
}

static void write_event(render *r, const ta_ref_event *e) {
  if (e->delta == 0) w_printf(r->w, "  init -> %ld", e->count);
  else w_printf(r->w, "  %+d -> %ld", e->delta, e->count);
  w_printf(r->w, " by thread T%u:\n", (unsigned)e->thread);
  write_stack(r->w, r->p, e->stack, r->max_frames, "      ");
}

static void write_history(render *r, const report_group *f, const char *what) {
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

/* A callsite in one line: its first frames, "function file:line < ...". */
static void write_site_frames(render *r, uint32_t stack) {
  const report_mstack *st = report_process_stack(r->p, stack);
  if (!st || st->npcs == 0) {
    w_printf(r->w, "<no stack recorded>");
    return;
  }
  for (size_t i = 0; i < st->nframes && i < 3; i++) {
    const report_mframe *f = &st->frames[i];
    const char *file = f->file ? strrchr(f->file, '/') : NULL;
    file = file ? file + 1 : f->file;
    w_printf(r->w, "%s%s", i ? " < " : "", f->function ? f->function : "??");
    if (file && f->line > 0) w_printf(r->w, " %s:%d", file, f->line);
    else if (f->module && !f->function) w_printf(r->w, " (%s+0x%llx)", f->module, (unsigned long long)f->module_offset);
  }
  if (st->nframes > 3) w_printf(r->w, " < ...");
}

/* The balance by callsite (ta_ref_balance): each acquiring and releasing
 * callsite, its transitions, the pairs, and the callsite that owes. */
static void write_sites(render *r, const report_group *f) {
  if (!f->sites || f->nsites == 0) return;
  bool leak = kind_is(f, TA_KIND_REF_LEAK);
  w_printf(r->w, "references by callsite (each releasing callsite is paired with the acquiring one whose "
                 "stack shares the most outer frames):\n");
  for (size_t i = 0; i < f->nsites; i++) {
    const ta_ref_site *s = &f->sites[i];
    w_printf(r->w, "  [%zu] %s %llu at ", i + 1, s->delta > 0 ? "acquired" : "released",
             (unsigned long long)s->transitions);
    write_site_frames(r, s->stack);
    if (s->delta < 0 && s->paired < f->nsites) w_printf(r->w, " (paired with [%u])", (unsigned)s->paired + 1);
    if (s->delta < 0 && s->extra)
      w_printf(r->w, s->paired < f->nsites ? "  <== releases more than [%u] acquired" : "  <== releases what "
               "nothing acquired", (unsigned)s->paired + 1);
    if (s->delta > 0 && s->extra && leak)
      w_printf(r->w, "  <== acquired %lld more than its releases", (long long)s->balance);
    w_put(r->w, "\n", 1);
  }
}

static void write_finding(render *r, const report_group *f) {
  wbuf *w = r->w;
  report_process *p = r->p;
  unsigned long addr = (unsigned long)f->addr, holder = (unsigned long)f->holder;
  const char *slot = f->slot ? f->slot : "?";
  /* leak-like groups: "<Title> of B byte(s) in N object(s) allocated from:" */
  const char *title = ta_kind_title(f->kind);

  if (kind_is(f, TA_KIND_UNCLASSIFIED)) {
    char b1[32], b2[32];
    w_color(w, C_TITLE);
    w_printf(w, "Unclassified: %s byte(s) in %s object(s) live at the end, allocated from:",
             th(b1, f->bytes), th(b2, f->blocks));
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
  } else if (kind_is(f, TA_KIND_LEAK_GROWTH)) {
    char b1[32], b2[32];
    w_color(w, C_TITLE);
    w_printf(w, "Growing memory: %.1f byte(s) per iteration over %zu iteration(s), %s -> %s byte(s) "
             "live at the marks, allocated from:",
             f->slope, f->iterations, th(b1, f->growth_first), th(b2, f->growth_last));
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    return;   /* the detail says the same */
  } else if (title) {
    char b1[32], b2[32];
    w_color(w, C_TITLE);
    w_printf(w, "%s of %s byte(s) in %s object(s) allocated from:", title, th(b1, f->bytes), th(b2, f->blocks));
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    if (kind_is(f, TA_KIND_LEAK_ORPHAN)) {
      if (f->holder) w_printf(w, "last held by 0x%lx in slot \"%s\"; ", holder, slot);
      w_printf(w, "orphaned at:\n");
      write_stack(w, p, f->aux_stack, r->max_frames, "    ");
    }
  } else if (kind_is(f, TA_KIND_REF_LEAK)) {
    char b1[32];
    w_color(w, C_TITLE);
    w_printf(w, "ref.leak: %s object(s)", th(b1, f->blocks));
    if (f->bytes) {
      char b2[32];
      w_printf(w, " of %s byte(s) in all", th(b2, f->bytes));
    }
    w_printf(w, " with references left at exit, such as 0x%lx, last acquired at:", addr);
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->alloc_stack, "allocated at:");
    write_sites(r, f);
    write_history(r, f, "unmatched acquisitions");
  } else if (kind_is(f, TA_KIND_FREE_DOUBLE)) {
    w_color(w, C_TITLE);
    w_printf(w, "free.double: attempting double-free on 0x%lx", addr);
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, " at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "previously allocated at:");
  } else if (kind_is(f, TA_KIND_FREE_INVALID)) {
    w_color(w, C_TITLE);
    w_printf(w, "free.invalid: attempting free on address ");
    write_addr(w, f->addr);
    w_printf(w, " which was not allocated by tagalloc");
    write_times(w, f);
    w_printf(w, ", at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->alloc_stack, "the block around it was allocated at:");
    write_section(r, f, f->free_stack, "freed at:");
  } else if (kind_is(f, TA_KIND_USE_AFTER_FREE)) {
    w_color(w, C_TITLE);
    w_printf(w, "use.after-free: freed block ");
    write_addr(w, f->addr);
    write_block(w, f->bytes);
    w_printf(w, " used after free");
    write_times(w, f);
    write_tag(r, f);
    w_put(w, "\n", 1);
    /* three labels: the access (when it was seen), the free, the allocation */
    if (f->stack && f->stack != f->free_stack) {
      write_labeled(r, f->stack, "accessed at:");
    } else {
      w_printf(w, "accessed at: not seen (a write into the freed block, found when the block left the "
                  "quarantine or at exit; --guard stops at the access)\n");
    }
    write_labeled(r, f->free_stack, "freed at:");
    write_labeled(r, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, TA_KIND_HEAP_OVERFLOW)) {
    w_color(w, C_TITLE);
    w_printf(w, "heap.overflow: block ");
    write_addr(w, f->addr);
    write_block(w, f->bytes);
    w_printf(w, " written past its end");
    write_times(w, f);
    write_tag(r, f);
    w_put(w, "\n", 1);
    /* the access (guard mode: the faulting instruction), or the free where
     * the pad was found written, then the free and the allocation */
    if (f->stack && f->stack == f->free_stack) {
      write_labeled(r, f->stack, "found at its free:");
    } else {
      if (f->stack) {
        write_labeled(r, f->stack, "accessed at:");
      } else {
        w_printf(w, "accessed at: not seen (found when the block %s; --guard stops at the access)\n",
                 f->free_stack ? "left the quarantine or at exit" : "was checked at exit");
      }
      write_labeled(r, f->free_stack, "freed at:");
    }
    write_labeled(r, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, TA_KIND_ARENA_AFTER_RESET)) {
    w_color(w, C_TITLE);
    w_printf(w, "arena.after-reset: pointer ");
    write_addr(w, f->addr);
    w_printf(w, " into an arena reset since");
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, ", used at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "hold declared at:");
    write_section(r, f, f->free_stack, "arena reset at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, TA_KIND_REF_UNDERFLOW)) {
    w_color(w, C_TITLE);
    w_printf(w, "ref.underflow: refcount of ");
    write_addr(w, f->addr);
    write_block(w, f->bytes);
    w_printf(w, " released below zero or after free");
    write_times(w, f);
    w_printf(w, f->aux_stack ? "; the extra release:" : " at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "the count went below zero at (a later, legitimate release):");
    write_sites(r, f);
    write_history(r, f, "refcount transitions");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
  } else if (kind_is(f, TA_KIND_HOLD_STACK)) {
    w_color(w, C_TITLE);
    w_printf(w, "hold.stack: holder 0x%lx keeps a pointer into a stack frame (0x%lx) in slot \"%s\"",
             holder, addr, slot);
    write_times(w, f);
    w_printf(w, ", declared at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack ? f->stack : f->aux_stack, r->max_frames, "    ");
    if (f->stack) write_section(r, f, f->aux_stack, "hold declared at:");
  } else if (kind_is(f, TA_KIND_HOLD_DANGLING)) {
    w_color(w, C_TITLE);
    w_printf(w, "hold.dangling: holder 0x%lx keeps in slot \"%s\" a pointer to dead memory ", holder, slot);
    write_addr(w, f->addr);
    write_block(w, f->bytes);
    write_times(w, f);
    w_printf(w, ", found at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "hold declared at:");
    write_section(r, f, f->free_stack, "target freed or reset at:");
    write_section(r, f, f->alloc_stack, "target allocated at:");
  } else if (kind_is(f, TA_KIND_GPU_PURGE_REFERENCED)) {
    w_printf(w, "gpu.purge-referenced: a purge refused %llu device buffer(s) still referenced, such as 0x%lx",
             (unsigned long long)f->blocks, addr);
    write_block(w, f->bytes);
    w_printf(w, ", allocated at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "purge called at:");
  } else {   /* a kind this emitter does not know yet: every fact we have */
    w_color(w, C_TITLE);
    w_printf(w, "%s: on 0x%lx", f->kind, addr);
    write_block(w, f->bytes);
    write_times(w, f);
    if (f->holder) w_printf(w, ", holder 0x%lx slot \"%s\"", holder, slot);
    w_printf(w, " at:");
    write_tag(r, f);
    w_put(w, "\n", 1);
    write_stack(w, p, f->stack, r->max_frames, "    ");
    write_section(r, f, f->aux_stack, "declared at:");
    write_section(r, f, f->free_stack, "freed at:");
    write_section(r, f, f->alloc_stack, "allocated at:");
    write_history(r, f, "transitions");
  }
  if (f->detail[0])
    w_printf(w, "  detail: %.*s\n", (int)sizeof ((ta_finding *)0)->detail, f->detail);
}

/* ---- suppressions ------------------------------------------------------------ */

/* LeakSanitizer's section, after the groups. */
static void write_suppressions_used(wbuf *w, const report_process *p) {
  if (p->nsuppressions_used == 0) return;
  w_printf(w, "-----------------------------------------------------\n"
              "Suppressions used:\n"
              "  count      bytes template\n");
  for (size_t i = 0; i < p->nsuppressions_used; i++) {
    const report_suppression_use *u = &p->suppressions_used[i];
    w_printf(w, "%7llu %10llu %s%s\n", (unsigned long long)u->hits, (unsigned long long)u->bytes,
             strcmp(u->type, "leak") == 0 ? "" : "tag:", u->pattern);
  }
  w_printf(w, "-----------------------------------------------------\n");
}

/* ---- the report ------------------------------------------------------------ */

/* " (killed by SIGSEGV)" style: how the process ended, when it did not
 * exit cleanly; "" otherwise. */
static const char *end_note(const report_process *p, char *buf, size_t len) {
  buf[0] = '\0';
  if (p->signal > 0) {
    const char *abbrev = sigabbrev_np(p->signal);
    if (abbrev) snprintf(buf, len, "the process was killed by signal %d (SIG%s)", p->signal, abbrev);
    else snprintf(buf, len, "the process was killed by signal %d", p->signal);
  } else if (p->clean_exit == 0 && !p->unclassified) {
    snprintf(buf, len, "the process did not exit cleanly");
  }
  return buf;
}

void report_text_process(int fd, report_process *p) {
  wbuf w = { .fd = fd, .color = color_for(fd) };
  long pid = p->pid;
  ta_summary s = p->summary;
  char n1[32], n2[32], n3[32];
  uint64_t live_bytes = p->unclassified_bytes, live_blocks = p->unclassified_blocks;

  char note[96];
  end_note(p, note, sizeof note);
  uint64_t loss_records = p->loss_records, growth = 0;
  for (size_t i = 0; i < p->ngroups; i++) growth += ta_kind_of(p->groups[i].kind) == TA_KIND_LEAK_GROWTH;
  if (p->ngroups == 0 && s.errors == 0 && s.direct_blocks == 0 && s.indirect_blocks == 0 &&
      s.possible_blocks == 0 && s.orphan_blocks == 0 && live_blocks == 0) {
    if (note[0]) w_printf(&w, "==%ld== tagalloc: %s\n", pid, note);
    if (p->unclassified && s.allocs == 0)
      w_printf(&w, "==%ld== tagalloc: the trace holds no allocation (the process ended before a trace "
               "buffer was written out)\n", pid);
    else if (p->unclassified)
      w_printf(&w, "==%ld== tagalloc: no errors, nothing live at the end (%s allocations, %s frees, "
               "peak %s bytes; no exit scan)\n",
               pid, th(n1, s.allocs), th(n2, s.frees), th(n3, s.peak_bytes));
    else {
      w_printf(&w, "==%ld== tagalloc: ", pid);
      w_color(&w, C_GOOD);
      w_printf(&w, "no leaks, no errors");
      w_uncolor(&w);
      w_printf(&w, " (%s allocations, %s frees, peak %s bytes)\n", th(n1, s.allocs), th(n2, s.frees),
               th(n3, s.peak_bytes));
      /* memory held at exit is no leak, but a program holding a lot should hear of it */
      if (s.reachable_blocks)
        w_printf(&w, "==%ld== tagalloc: still reachable at exit: %s bytes in %s blocks (not leaks: "
                 "pointers to them remain)\n", pid, th(n1, s.reachable_bytes), th(n2, s.reachable_blocks));
    }
    if (p->suppressed_blocks) write_suppressions_used(&w, p);
    w_flush(&w);
    return;
  }

  w_printf(&w, "=================================================================\n");
  w_color(&w, C_ERROR);
  if (p->unclassified)
    w_printf(&w, "==%ld==WARNING: tagalloc: no exit scan (the process was killed, crashed or ended "
                 "without exit): the blocks still live are unclassified, not leaks%s%s", pid,
             note[0] ? "; " : "", note);
  else if (s.errors || p->findings_count > growth || s.direct_blocks || s.indirect_blocks ||
           s.possible_blocks || s.orphan_blocks)
    w_printf(&w, "==%ld==ERROR: tagalloc: detected memory problems%s%s", pid, note[0] ? "; " : "", note);
  else   /* growth alone: still reachable memory, no leak and no error */
    w_printf(&w, "==%ld==WARNING: tagalloc: memory that grows from iteration to iteration (no leaks, "
                 "no errors)%s%s", pid, note[0] ? "; " : "", note);
  w_put(&w, "\n", 1);
  render r = {
    .w = &w,
    .p = p,
    .max_frames = option_or("report_frames", DEFAULT_FRAMES),
    .max_groups = option_or("report_groups", DEFAULT_GROUPS),
  };
  /* Groups per kind beyond max_groups are left out: the kind's totals
   * (from the model) less what was shown say how much. */
  report_kind_total shown[MAX_KINDS + 1];
  size_t order[MAX_KINDS], norder = 0;   /* kinds in order of first appearance */
  memset(shown, 0, sizeof shown);
  for (size_t i = 0; i < p->ngroups; i++) {
    const report_group *g = &p->groups[i];
    size_t k = 0;
    while (k < p->nkinds && k < MAX_KINDS && strcmp(p->kinds[k].kind, g->kind) != 0) k++;
    if (k >= MAX_KINDS) k = MAX_KINDS;   /* more kinds than MAX_KINDS: shown as they come */
    if (k < MAX_KINDS && shown[k].groups == 0) order[norder++] = k;
    if (++shown[k].groups > (uint64_t)r.max_groups) continue;
    shown[k].bytes += g->bytes;
    shown[k].blocks += g->blocks;
    w_put(&w, "\n", 1);
    write_finding(&r, g);
  }
  bool omitted = false;
  for (size_t k = 0; k < p->nkinds && k < MAX_KINDS; k++) omitted |= shown[k].groups > (uint64_t)r.max_groups;
  if (omitted) {
    w_put(&w, "\n", 1);
    for (size_t o = 0; o < norder; o++) {
      size_t k = order[o];
      const report_kind_total *t = &p->kinds[k];
      if (shown[k].groups <= (uint64_t)r.max_groups) continue;
      w_printf(&w, "... %s more group(s) of %s not shown (%s byte(s), %s object(s)); "
               "TAGALLOC_REPORT_GROUPS raises the limit\n",
               th(n1, t->groups - (uint64_t)r.max_groups), t->kind, th(n2, t->bytes - shown[k].bytes),
               th(n3, t->blocks - shown[k].blocks));
    }
  }
  if (p->suppressed_blocks) {
    w_put(&w, "\n", 1);
    write_suppressions_used(&w, p);
  }

  if (p->unclassified) {
    w_printf(&w, "\nLIVE AT THE END (unclassified: no exit scan):\n"
                 "   %s bytes in %s blocks\n", th(n1, live_bytes), th(n2, live_blocks));
    if (p->suppressed_blocks)
      w_printf(&w, "   suppressed: %s bytes in %s blocks\n", th(n1, p->suppressed_bytes),
               th(n2, p->suppressed_blocks));
    w_color(&w, C_BOLD);
    w_printf(&w, "SUMMARY: tagalloc: %s byte(s) unclassified in %s allocation(s); %s error(s).",
             th(n1, live_bytes), th(n2, live_blocks), th(n3, s.errors));
    w_put(&w, "\n", 1);
    w_flush(&w);
    return;
  }

  unsigned long long leaked_bytes = s.direct_bytes + s.indirect_bytes + s.orphan_bytes;
  unsigned long long leaked_blocks = s.direct_blocks + s.indirect_blocks + s.orphan_blocks;
  static const char *const names[] = { "definitely lost", "indirectly lost", "possibly lost",
                                       "still reachable", "orphaned" };
  const uint64_t rows[][2] = { { s.direct_bytes, s.direct_blocks }, { s.indirect_bytes, s.indirect_blocks },
                               { s.possible_bytes, s.possible_blocks }, { s.reachable_bytes, s.reachable_blocks },
                               { s.orphan_bytes, s.orphan_blocks } };
  w_printf(&w, "\nLEAK SUMMARY:\n");
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    w_printf(&w, "%18s: %s bytes in %s blocks\n", names[i], th(n1, rows[i][0]), th(n2, rows[i][1]));
  if (p->suppressed_blocks)
    w_printf(&w, "        suppressed: %s bytes in %s blocks\n", th(n1, p->suppressed_bytes),
             th(n2, p->suppressed_blocks));
  for (size_t k = 0; k < p->nkinds; k++)     /* device memory: only when there is some */
    if (ta_kind_of(p->kinds[k].kind) == TA_KIND_GPU_LEAK && p->kinds[k].blocks)
      w_printf(&w, "       device lost: %s bytes in %s blocks (gpu.leak)\n", th(n1, p->kinds[k].bytes),
               th(n2, p->kinds[k].blocks));
  w_color(&w, C_BOLD);
  if (loss_records) {
    char n4[32];
    w_printf(&w, "SUMMARY: tagalloc: %s byte(s) leaked in %s allocation(s); %s error(s) (%s of them "
             "loss records: definitely or possibly lost, orphaned, refcount leaks, one per group, as "
             "memcheck's ERROR SUMMARY counts them).",
             th(n1, leaked_bytes), th(n2, leaked_blocks), th(n3, s.errors + loss_records), th(n4, loss_records));
  } else {
    w_printf(&w, "SUMMARY: tagalloc: %s byte(s) leaked in %s allocation(s); %s error(s).", th(n1, leaked_bytes),
             th(n2, leaked_blocks), th(n3, s.errors));
  }
  w_put(&w, "\n", 1);
  w_flush(&w);
}

size_t report_text_growth(int fd, report_process *p) {
  wbuf w = { .fd = fd };
  render r = { .w = &w, .p = p, .max_frames = option_or("report_frames", DEFAULT_FRAMES),
               .max_groups = option_or("report_groups", DEFAULT_GROUPS) };
  size_t n = 0;
  for (size_t i = 0; i < p->ngroups; i++) {
    const report_group *g = &p->groups[i];
    if (!kind_is(g, TA_KIND_LEAK_GROWTH) || (long)n >= r.max_groups) continue;
    if (n++ == 0)
      w_printf(&w, "==%ld== tagalloc: from its trace: memory that grows from iteration to iteration "
                   "(leak.growth: still reachable, a warning, not an error)\n", p->pid);
    w_put(&w, "\n", 1);
    write_finding(&r, g);
  }
  w_flush(&w);
  return n;
}

void report_text_render(int fd, const report_source *src) { report_text_render_info(fd, src, NULL); }

void report_text_render_info(int fd, const report_source *src, const report_process_info *info) {
  report_process *p = report_process_new(src, info);
  if (!p) {
    static const char msg[] = "tagalloc: out of memory building the report\n";
    ssize_t r = write(fd, msg, sizeof msg - 1);
    (void)r;
    return;
  }
  report_text_process(fd, p);
  report_process_free(p);
}

void report_text_write(int fd) {
  report_source src;
  report_source_ledger(&src);
  report_text_render(fd, &src);
}

/* The ledger calls this at exit (and from ta_report_now). */
__attribute__((constructor)) static void report_text_register(void) {
  ta_reporter_set(report_text_write);
  ta_stack_writer_set(report_text_write_stack);   /* the assertions' stacks */
}
