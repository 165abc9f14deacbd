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

#include <stddef.h>
#include <stdint.h>

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
} report_frame;

/* A symbolizer of the calling process; NULL when libdw cannot be set up.
 * Thread-safe (one mutex per ctx). */
report_ctx *report_ctx_new(void);
void        report_ctx_free(report_ctx *ctx);

/* Symbolizes a return address (looks up pc - 1, the call instruction).
 * Fills out[0..n) innermost first: the inlined frames (inlined = 1), then the
 * function that really holds the code; all get address = pc.  Returns n
 * (>= 1 when max_out >= 1, > 1 when inlined frames exist); an address no
 * module maps still gives one frame with module NULL.  0 when max_out is 0
 * or ctx is NULL. */
int report_symbolize(report_ctx *ctx, uintptr_t pc, report_frame *out, size_t max_out);
/* The same for an exact code address (a function's start, a signal's pc). */
int report_symbolize_exact(report_ctx *ctx, uintptr_t addr, report_frame *out, size_t max_out);

/* ---- text report (text.c) ------------------------------------------------ */

/* Writes the report of all findings (ta_findings_visit, ta_summary_get) to
 * fd: errors, then leaks, then the leak summary; one line when there is
 * nothing to report.  Frames per stack and groups per kind are limited by
 * ta_option("report_frames") and ta_option("report_groups") (32 and 100
 * when unset).  Registered with ta_reporter_set at load time. */
void report_text_write(int fd);

/* Writes the frames of one stack of the ledger's depot to fd, one
 * "    #N 0xADDR in FUNCTION FILE:LINE (MODULE)" line each; max_frames <= 0
 * uses the option.  Returns the number of frame lines written. */
size_t report_text_write_stack(int fd, uint32_t stack, long max_frames);

#ifdef __cplusplus
}
#endif
#endif
