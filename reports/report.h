/* report.h - reports: symbolization and rendering of the ledger's findings.
 *
 *   #include "report.h"
 *
 *   report_ctx *ctx = report_ctx_new();          // symbolizer for this process
 *   report_frame fr[REPORT_MAX_INLINE];
 *   int n = report_symbolize(ctx, return_address, fr, REPORT_MAX_INLINE);
 *   for (int i = 0; i < n; i++)                  // innermost (inlined) first
 *     printf("%s %s:%d%s\n", fr[i].function ? fr[i].function : "??",
 *            fr[i].file ? fr[i].file : "?", fr[i].line, fr[i].inlined ? " (inlined)" : "");
 *   report_ctx_free(ctx);                        // the strings in fr die here
 *
 *   report_text_write(2);   // the exit report of every finding, on stderr
 *
 * The symbolizer reads the DWARF of the running process with elfutils libdw
 * (Dwfl over /proc/self/maps); results are cached per address.  The text
 * emitter renders ta_findings_visit()/ta_summary_get() in the shape of
 * LeakSanitizer's report, writing with write(2) only (no stdio), so it works
 * from atexit handlers and after fork.  Linking reports/text.c registers
 * report_text_write as the ledger's exit reporter (ta_reporter_set).
 * This code runs at report time only; its memory comes from plain malloc.
 */
#ifndef REPORT_H
#define REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kinds.h"
#include "tagalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- symbolizer (symbolize.c) -------------------------------------------- */

/* The most frames one address expands to (the function and the frames
 * inlined into it); deeper inline chains are cut from the outside. */
#define REPORT_MAX_INLINE 16

typedef struct report_ctx report_ctx;

/* One source-level frame.  Strings belong to the ctx (valid until
 * report_ctx_free) and are NULL when unknown; line/column are 0 then. */
typedef struct {
  uintptr_t   address;       /* the address asked for, as given */
  const char *function;      /* demangled when it was a C++ name */
  const char *file;          /* source file, as the DWARF names it (usually absolute) */
  int         line;
  int         column;
  const char *module;        /* path of the ELF module mapping the address; NULL: none */
  uintptr_t   module_offset; /* address - module's load start (for "module+0xOFF") */
  int         inlined;       /* 1: this frame was inlined into the next one */
  int         decl_line;     /* the line the function is declared on (DW_AT_decl_line); 0: unknown */
} report_frame;

/* A symbolizer of the calling process; NULL when libdw cannot be set up.
 * Thread-safe (one mutex per ctx). */
report_ctx *report_ctx_new(void);
void        report_ctx_free(report_ctx *ctx);

/* A library that was dlclose()d (the LD_PRELOAD shim calls this): path, its
 * load bias (link_map.l_addr) and the range its segments had.  Symbolizers
 * of this process then still name its functions where nothing else is
 * mapped now (each later report of the maps adds it). */
void report_module_unloaded(const char *path, uintptr_t base, uintptr_t lo, uintptr_t hi);

/* An executable mapping of a process that is not this one (a trace's MODULE
 * record): [lo, hi) maps the file path from file offset `offset`. */
typedef struct {
  uint64_t    lo, hi, offset;
  const char *path;          /* " (deleted)" at the end is ignored */
} report_module;

/* A symbolizer of another process, offline: each module's ELF file is
 * reported to libdw at the load bias its mapping implies (separate debug
 * files are found as for a live process).  Addresses of a module whose file
 * cannot be read still get the module's path and offset.  The list is
 * copied.  NULL when libdw cannot be set up. */
report_ctx *report_ctx_new_offline(const report_module *modules, size_t n);

/* Symbolizes a return address (looks up pc - 1, the call instruction).
 * Fills out[0..n) innermost first: the inlined frames (inlined = 1), then the
 * function that really holds the code; all get address = pc.  Returns n
 * (>= 1 when max_out >= 1, > 1 when inlined frames exist); an address no
 * module maps still gives one frame with module NULL.  0 when max_out is 0
 * or ctx is NULL. */
int report_symbolize(report_ctx *ctx, uintptr_t pc, report_frame *out, size_t max_out);
/* The same for an exact code address (a function's start, a signal's pc). */
int report_symbolize_exact(report_ctx *ctx, uintptr_t addr, report_frame *out, size_t max_out);
/* 1 (default): a module's compilation units are found from its
 * .debug_aranges (symbolize.c); 0: by libdw alone.  The same frames either
 * way (test_symbolize); read when a context first looks at a module. */
extern int report_cu_aranges;

/* ---- sources: what a report renders ----------------------------------------
 *
 * A report renders the findings of one process from a source: the running
 * ledger (report_source_ledger, text.c), or a trace read offline
 * (report_offline_source, offline.h).  The renderers (text, JSON) and the
 * suppressions only read a source through these callbacks. */

typedef struct report_suppressions report_suppressions;
typedef struct report_process_info report_process_info;   /* see the JSON section */

typedef struct report_source {
  long        pid;
  report_ctx *ctx;          /* the symbolizer; NULL: ctx_make's, or this process's own (made on first use) */
  /* The symbolizer made on first use (an offline source's, which owns it);
   * NULL: none. */
  report_ctx *(*ctx_make)(void *arg);
  void       *arg;          /* passed to the callbacks */
  /* Copies up to max frames of a stack id (return addresses, innermost
   * first) into frames; returns how many, 0 if unknown. */
  size_t    (*stack_frames)(void *arg, uint32_t stack, uintptr_t *frames, size_t max);
  /* A tag's name; NULL when the tag has none. */
  const char *(*tag_name)(void *arg, ta_tag tag);
  /* ta_findings_visit: errors first, then leaks, largest first. */
  size_t    (*visit)(void *arg, ta_finding_fn *fn, void *fn_arg);
  ta_summary (*summary)(void *arg);
  /* Offline only: the process ended without its exit scan (no END record),
   * so the blocks still live are "unclassified" groups, not leaks. */
  bool        unclassified;
  uint64_t    unclassified_bytes, unclassified_blocks;
  /* The suppressions to apply; NULL: report_suppressions_default(). */
  report_suppressions *suppressions;
} report_source;

/* The running process's ledger (pid = getpid(), the process's symbolizer). */
void        report_source_ledger(report_source *out);
/* src's symbolizer (made on first use for the ledger's); NULL without libdw. */
report_ctx *report_source_ctx(const report_source *src);
/* A tag's name from src ("?" for a tag the source cannot name). */
const char *report_source_tag(const report_source *src, ta_tag tag);

/* ---- suppressions (suppress.c) ----------------------------------------------
 *
 * LeakSanitizer's file format, one per line: `leak:PATTERN` matches a leak
 * whose allocation stack has a frame whose function, source file or module
 * matches; `tag:PATTERN` matches a leak whose tag name matches.  Blank lines
 * and lines starting with `#` are ignored; leading and trailing blanks are
 * trimmed.  PATTERN matches as LSan's: a substring, with `*` matching any
 * run of characters, `^` anchoring at the start and `$` at the end.
 * Errors (double free, underflow, ...) are never suppressed.  Each pattern
 * counts the objects and bytes it suppressed (LSan's "Suppressions used"). */

/* Parses a suppressions file.  NULL on failure with one line in err, e.g.
 * "supp.txt:3: unknown type \"fun\" (expected leak: or tag:)". */
report_suppressions *report_suppressions_load(const char *path, char *err, size_t errlen);
/* The same on text in memory; name is used in messages. */
report_suppressions *report_suppressions_parse(const char *text, size_t len, const char *name,
                                               char *err, size_t errlen);
void report_suppressions_free(report_suppressions *s);
/* The process's own: TAGALLOC_SUPPRESSIONS, loaded on first use (a bad file
 * is reported once on stderr and ignored); NULL when unset. */
report_suppressions *report_suppressions_default(void);

/* Whether finding f (of source src; NULL: the running ledger) is suppressed
 * by s (NULL: report_suppressions_default()).  When it is, the first pattern
 * that matched counts it: hits += f->blocks, bytes += f->bytes.  Always false
 * for errors, and when there are no suppressions. */
bool report_suppressed(const ta_finding *f, const report_source *src, report_suppressions *s);

/* The uses: zero them before a report, read them after. */
void   report_suppressions_reset_used(report_suppressions *s);
typedef struct {
  const char *type;          /* "leak" or "tag" */
  const char *pattern;
  uint64_t    hits;          /* objects suppressed (groups' blocks) */
  uint64_t    bytes;
} report_suppression_use;
/* The patterns with hits, in file order: fills out[0..max) and returns how
 * many there are. */
size_t report_suppressions_used(const report_suppressions *s, report_suppression_use *out,
                                size_t max);

/* ---- JSON of one process (source_json.c) -----------------------------------
 *
 * The object `tagalloc run --json` and `tagalloc report --json` put in
 * "processes": {"pid", "findings_count", "errors", "loss_records", "ppid", "argv",
 * "exit_code", "signal", "clean_exit", "trace", "summary", "findings",
 * "suppressions"}.  findings_count counts the groups in "findings" that are
 * leaks or errors ("unclassified" and "leak.growth" groups are neither: the
 * exit status of `tagalloc run --error-exitcode` follows findings_count and
 * errors); errors counts error occurrences, loss_records the groups the
 * text's SUMMARY line counts as errors besides (report_group_is_loss_record).  "signal" is the name of the
 * signal that killed the process ("SIGSEGV"), null when none, and
 * "clean_exit" false then.  Each finding: "kind", "bytes", "blocks", "tag", "address",
 * "stack", "alloc_stack" (errors), "free_stack", and "aux_stack", "holder",
 * "slot", "detail" when known, and for ref.* "ref_sites": the balance by
 * callsite, [{"kind": "acquire"|"release", "transitions", "balance"
 * (acquire) or "paired" (release: an index in ref_sites, or null), "extra",
 * "stack"}]; each frame: "function", "file", "line",
 * "module", "address" (and "inlined": true for an inlined frame), null when
 * unknown.  Suppressed leaks are left out, as in the text report. */
struct report_process_info {
  long               ppid;       /* < 0: unknown */
  const char *const *argv;       /* NULL: unknown */
  int                argc;
  int                exit_code;  /* < 0: unknown or killed */
  int                signal;     /* 0: none */
  int                clean_exit; /* < 0: unknown */
  const char        *trace;      /* the trace file; NULL: none */
};

/* Writes the object (no newline) to fd; 0, or -1 when a write failed. */
int report_source_json(int fd, const report_source *src, const report_process_info *info);

/* ---- text report (text.c) ------------------------------------------------ */

/* Writes the report of all findings (ta_findings_visit, ta_summary_get) to
 * fd: errors, then leaks, then the leak summary; one line when there is
 * nothing to report.  Frames per stack and groups per kind are limited by
 * ta_option("report_frames") and ta_option("report_groups") (32 and 100
 * when unset).  Registered with ta_reporter_set at load time. */
void report_text_write(int fd);

/* The same report for any source: report_text_write(fd) renders
 * report_source_ledger().  An unclassified source prints its live blocks
 * grouped by allocation stack, and a summary of them instead of the leak
 * summary.  Suppressed leaks are left out of the groups and the summary
 * (valgrind's "suppressed:" line and LSan's "Suppressions used:" section
 * appear only when something was suppressed). */
void report_text_render(int fd, const report_source *src);
/* The same, with how the process ended (info may be NULL): a process killed
 * by a signal is named so in the report's first line ("the process was
 * killed by signal 11 (SIGSEGV)"). */
void report_text_render_info(int fd, const report_source *src, const report_process_info *info);

/* Writes the frames of one stack of the ledger's depot to fd, one
 * "    #N 0xADDR in FUNCTION FILE:LINE (MODULE)" line each; max_frames <= 0
 * uses the option.  Returns the number of frame lines written. */
size_t report_text_write_stack(int fd, uint32_t stack, long max_frames);

#ifdef __cplusplus
}
#endif
#endif
