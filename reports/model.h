/* model.h - the report model: one structure, built once, that every
 * renderer draws from (text, JSON, HTML, folded stacks, diff).  No renderer
 * computes its own numbers: suppressions, summaries, per-kind totals,
 * symbolized stacks, callsites, the timeline, flame graph weights and the
 * growth findings are all here.
 *
 *   report_model *rm = report_model_new();
 *   report_offline *o = report_offline_open("run.trace", err, sizeof err);
 *   report_process *p = report_model_add_offline(rm, o, supp, NULL);   // rm owns o now
 *   report_text_process(1, p);                   // LeakSanitizer-shaped text
 *   report_json_process(fd, p);                  // one process's JSON object
 *   report_html_write(fd, rm);                   // the self-contained page
 *   report_folded_write(fd, rm, REPORT_FOLDED_LEAKED);
 *   report_model_free(rm);
 *
 * A process from the running ledger (the exit report) is built the same
 * way from report_source_ledger(): report_process_new(src, info) and
 * report_process_free().  A page the program renders itself adds it with
 * report_model_add_ledger(rm, info), which brings the ledger's timeline
 * (samples at marks) too.  Stacks are symbolized on first use and cached,
 * so a renderer that shows 100 groups symbolizes only their stacks.
 * This code runs at report time; its memory comes from plain malloc. */
#ifndef REPORT_MODEL_H
#define REPORT_MODEL_H

#include "report.h"
#include "trace_read.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct report_offline report_offline;

/* ---- stacks ------------------------------------------------------------------ */

/* One source-level frame of a symbolized stack (report_frame, plus which
 * return address it came from).  Strings live as long as the process. */
typedef struct {
  const char *function, *file, *module;   /* NULL when unknown */
  int         line;                       /* 0 when unknown */
  uint64_t    address, module_offset;
  bool        inlined;
  uint32_t    pc;                         /* index of the return address it came from */
  int         decl_line;                  /* the function's first line (DW_AT_decl_line); 0: unknown */
} report_mframe;

typedef struct {
  uint32_t       id;                      /* the stack id of the trace or the ledger */
  uint32_t       npcs;                    /* return addresses (0: no stack recorded) */
  uint32_t       nframes;                 /* source-level frames (>= npcs: inlined ones added) */
  report_mframe *frames;                  /* innermost first */
} report_mstack;

/* ---- findings ---------------------------------------------------------------- */

typedef struct {
  const char *kind;
  uint64_t    bytes, blocks, addr, holder;
  uint16_t    tag;                        /* TA_ANY: none */
  const char *tag_name;                   /* NULL for TA_ANY; "?" when unnamed */
  const char *slot;                       /* NULL when none */
  const char *detail;                     /* "" when none */
  uint32_t    stack, alloc_stack, free_stack, aux_stack;   /* ids; 0: none */
  const ta_ref_event *history;            /* ref.*: transitions (see ta_finding) */
  size_t      history_len;
  const ta_ref_site *sites;               /* ref.*: balance by callsite (see ta_ref_balance) */
  size_t      nsites;
  /* leak.growth */
  double      slope;                      /* bytes per iteration */
  uint64_t    growth_first, growth_last;  /* live bytes at the first and the last mark */
  size_t      iterations;                 /* intervals between marks */
} report_group;

/* What the groups of one kind add up to (the groups shown: not suppressed). */
typedef struct {
  const char *kind;
  uint64_t    groups, bytes, blocks;
  int         rank;                       /* severity: 0 the worst (ta_kind_rank, alloc/kinds.h) */
} report_kind_total;

/* A loss record counted as an error, as memcheck's ERROR SUMMARY counts
 * them (--errors-for-leak-kinds=definite,possible: one per group): the
 * groups of definitely and possibly lost, orphaned, refcount-leaked and
 * GPU-leaked memory (ta_kind_is_leak but leak.indirect); indirectly lost,
 * growing and unclassified memory are not errors. */
bool report_group_is_loss_record(const report_group *g);

/* A callsite: the allocation stacks whose innermost frame is the same
 * source line.  Its key names the line so that it survives address-space
 * randomisation, a rebuild in another folder and edits elsewhere in the
 * file, for diffs: "function file.c:+N", N the line's offset from the
 * function's first line (DW_AT_decl_line) and file.c the file's name
 * without its folders; "function file.c" without the function's line;
 * "module+0xOFF" without symbols. */
typedef struct {
  const char *key;                        /* "function file.c:+N", "function file.c" or "module+0xOFF" */
  const char *function, *file, *module;
  int         line;
  uint64_t    allocs, bytes;              /* allocations and their bytes */
  uint64_t    leaked_bytes, leaked_blocks;/* of the leak.* / ref.leak / gpu.* groups */
  uint64_t    peak_bytes;                 /* live at the process's peak */
} report_callsite;

/* Whether the function is an allocator wrapper (reports/wrappers.c: a
 * list of globs, TAGALLOC_ALLOC_WRAPPERS, and names ending in malloc,
 * calloc, realloc, zalloc, strdup, strndup): a report names an allocation
 * by the first frame of its stack that is not one. */
bool report_function_is_wrapper(const char *function);

/* The key of a callsite at function, file, line, for a function first
 * declared on decl_line (0: unknown) into key; "" without a function or a
 * file (the caller then uses "module+0xOFF"). */
void report_callsite_key(const char *function, const char *file, int line, int decl_line, char *key, size_t len);

/* ---- one process ------------------------------------------------------------- */

typedef struct report_process {
  long        pid, ppid;                  /* ppid < 0: unknown */
  char      **argv;                       /* NULL: unknown (a copy) */
  int         argc;
  int         exit_code, signal;          /* < 0 / 0: unknown / none */
  int         clean_exit;                 /* < 0: unknown */
  char       *trace;                      /* the trace file named in reports; NULL: none */
  bool        unclassified;               /* no exit scan: live blocks are not leaks */

  /* the source's summary, less what suppressions took */
  ta_summary  summary;
  uint64_t    unclassified_bytes, unclassified_blocks;
  uint64_t    suppressed_bytes, suppressed_blocks;
  report_suppression_use *suppressions_used;
  size_t      nsuppressions_used;

  report_group *groups;                   /* shown (not suppressed), in the source's order */
  size_t      ngroups;
  size_t      findings_count;             /* groups that are leaks or errors (not unclassified, not leak.growth) */
  uint64_t    loss_records;               /* groups counted as errors as memcheck's ERROR SUMMARY counts
                                           * them (report_group_is_loss_record); every renderer's error
                                           * count is summary.errors + loss_records */
  report_kind_total *kinds;               /* one per kind, worst first */
  size_t      nkinds;

  /* from the trace (NULL / 0 without one) */
  const report_trace_model *tm;
  uint64_t    start_ns, end_ns;           /* the trace's first and last known times */
  report_callsite *callsites;             /* by bytes allocated, largest first */
  size_t      ncallsites;

  /* private: the source and the symbolized stacks */
  report_source src;
  void       *priv;
} report_process;

/* The process of a source (the ledger's, or an offline one): suppressions
 * applied (src->suppressions, or report_suppressions_default()), groups
 * copied, totals counted.  info may be NULL.  NULL when out of memory. */
report_process *report_process_new(const report_source *src, const report_process_info *info);
void            report_process_free(report_process *p);

/* A stack of the process, symbolized (cached); NULL for id 0.  A stack the
 * source does not know has npcs 0. */
const report_mstack *report_process_stack(report_process *p, uint32_t id);

/* ---- the whole report: processes, and what the traces add ----------------------- */

typedef struct report_model {
  report_process **procs;                 /* in the order added (by start time for run/report) */
  size_t           nprocs;
  uint64_t         start_ns, end_ns;      /* over all processes with a trace */
  char           **argv;                  /* the program and its arguments (run), NULL for report */
  int              argc;
  void            *priv;
} report_model;

report_model *report_model_new(void);
void          report_model_free(report_model *m);
/* The command line the page shows (copied). */
void          report_model_set_argv(report_model *m, char *const *argv, int argc);

/* Adds the process of an offline trace: the model takes o (freed with the
 * model, even on failure).  supp may be NULL (none); info may be NULL (ppid
 * and clean_exit come from the trace).  Adds the leak.growth groups, the
 * callsites and the timeline.  NULL when out of memory. */
report_process *report_model_add_offline(report_model *m, report_offline *o, report_suppressions *supp,
                                         const report_process_info *info);

/* Adds the running process (report_source_ledger), with the timeline
 * the ledger samples at its marks (alloc/samples.h; ledger_timeline.c):
 * its duration, live bytes by tag and marks, for a program that writes its
 * own page without a trace.  info may be NULL.  NULL when out of memory. */
report_process *report_model_add_ledger(report_model *m, const report_process_info *info);

/* leak.growth: a site grows when the trace has at least 3 marks, its live
 * bytes at the last mark exceed those at the first, it grew in at least 2
 * iterations and shrank in at most a quarter as many, its slope is at least
 * 1 byte per iteration and the least-squares fit explains at least half of
 * the variation (r^2 >= 0.5). */
bool report_site_grows(const report_trace_site *s, size_t nmarks);

/* ---- renderers --------------------------------------------------------------- */

/* text.c: LeakSanitizer's shape (see report_text_render). */
void report_text_process(int fd, report_process *p);
/* source_json.c: the object of report_source_json. */
int  report_json_process(int fd, report_process *p);
/* The finding objects of p's groups of one kind, comma-separated (malloc'd,
 * *len bytes, not NUL-terminated); NULL when there are none. */
char *report_json_groups(report_process *p, const char *kind, size_t *len);
/* text.c: p's leak.growth groups alone, under a line that says they come
 * from the trace (tagalloc run adds them after a process's own exit
 * report, which has no marks to compare).  Returns the groups written. */
size_t report_text_growth(int fd, report_process *p);

/* html.c: the self-contained page.  0, or -1 when a write failed. */
int  report_html_write(int fd, report_model *m);

/* folded.c: "frame;frame;frame bytes" lines, outermost frame first, one
 * per stack, for flamegraph.pl and speedscope; frames are "function" (or
 * "module+0xOFF", or "0xADDR"), with " [pid N]" as the root when the model
 * has several processes. */
typedef enum { REPORT_FOLDED_LEAKED, REPORT_FOLDED_PEAK } report_folded_what;
int  report_folded_write(int fd, report_model *m, report_folded_what what);

/* A frame's name in folded stacks and flame graphs; buf for the fallbacks. */
const char *report_frame_label(const report_mframe *f, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
