/* support.h - helpers that several tests share (include after harness.h):
 *
 *   NOIPA, KEEP()        keep a function a frame of its own on the stack
 *   scribble_stack()     overwrite the dead stack below the caller
 *   n_messages, messages the ledger's finding messages, counted and kept by
 *                        messages_setup / messages_teardown (cmocka fixtures)
 *   find_arg, find_kind  the first finding of a kind, copied (slot and history
 *                        too), for ta_findings_visit; the_finding(kind) for short
 *   stack_frame0()       the function of frame #0 of a ledger stack
 *   stack_has_function() is a function among the first frames of a stack
 *
 * Everything is static: each test program gets its own copy of what it uses. */
#ifndef TAGALLOC_TEST_SUPPORT_H
#define TAGALLOC_TEST_SUPPORT_H

#include "harness.h"
#include "report.h"

#include <stdio.h>
#include <string.h>

/* ---- functions that stay frames of their own ------------------------------------ */

#ifdef __clang__
#define NOIPA __attribute__((noinline))
#else
#define NOIPA __attribute__((noipa))   /* not inlined, not cloned, not tail-called */
#endif
#define KEEP() __asm__ volatile("" ::: "memory")   /* no tail call: the caller stays on the stack */

/* Overwrites the dead part of the stack below the caller, so that no stale
 * copy of a block's address is left there for the scan to find.
 * Not instrumented by ASan: no redzone at the top of its frame is left
 * unwritten, so the whole dead stack below the caller is overwritten. */
NOIPA __attribute__((no_sanitize_address, unused)) static void scribble_stack(void) {
  char buf[65536];
  memset(buf, 0, sizeof buf);
  __asm__ volatile("" : : "r"(buf) : "memory");    /* the stores must happen */
}

/* ---- what the ledger says: the finding messages --------------------------------- */

#define MESSAGES_KEPT 16

static int n_messages;                             /* TA_EFINDING messages since the setup */
static char messages[MESSAGES_KEPT][512] __attribute__((unused));   /* the first ones */

static inline void on_finding_message(int code, const char *message, void *arg) {
  (void)arg;
  if (code != TA_EFINDING) return;
  if (n_messages < MESSAGES_KEPT) snprintf(messages[n_messages], sizeof messages[0], "%s", message);
  n_messages++;
}

/* The fixtures: no findings, no messages, and the handler above installed
 * (until the teardown). */
static inline int messages_setup(void **state) {
  (void)state;
  ta_findings_clear();
  n_messages = 0;
  messages[0][0] = '\0';
  ta_error_handler(on_finding_message, NULL);
  return 0;
}

static inline int messages_teardown(void **state) {
  (void)state;
  ta_error_handler(NULL, NULL);
  return 0;
}

/* ---- finding a finding -------------------------------------------------------------- */

/* The first finding of a kind, copied: its slot and history too, as the
 * finding's own pointers do not outlive the visit (set to NULL in f). */
#define FIND_HISTORY 16

typedef struct {
  const char *kind;
  int found;
  ta_finding f;
  char slot[64];
  ta_ref_event history[FIND_HISTORY];
  ta_ref_site sites[TA_REF_SITES_MAX];
} find_arg;

static inline int find_kind(const ta_finding *f, void *arg) {
  find_arg *a = arg;
  if (strcmp(f->kind, a->kind) != 0) return 0;
  a->found = 1;
  a->f = *f;
  snprintf(a->slot, sizeof a->slot, "%s", f->slot ? f->slot : "");
  size_t n = f->history_len < FIND_HISTORY ? f->history_len : FIND_HISTORY;
  if (n) memcpy(a->history, f->history, n * sizeof *f->history);
  if (f->nsites) memcpy(a->sites, f->sites, f->nsites * sizeof *f->sites);
  a->f.slot = NULL;
  a->f.history = NULL;
  a->f.sites = NULL;
  return 1;
}

/* The one finding of kind: it must exist. */
static inline ta_finding the_finding(const char *kind) {
  find_arg a = { .kind = kind };
  ta_findings_visit(find_kind, &a);
  if (!a.found) fail_msg("no finding of kind %s", kind);
  return a.f;
}

/* ---- symbolizing ---------------------------------------------------------------------- */

/* The function at pc (the innermost, inlined or not), "??" if unknown. */
static inline const char *function_at(report_ctx *ctx, uintptr_t pc) {
  report_frame fr[REPORT_MAX_INLINE];
  int n = report_symbolize(ctx, pc, fr, REPORT_MAX_INLINE);
  return n > 0 && fr[0].function ? fr[0].function : "??";
}

/* The function of frame #0 of a ledger stack, "<no stack>" if it has none. */
static inline const char *stack_frame0(report_ctx *ctx, uint32_t stack) {
  uintptr_t pcs[TA_MAX_DEPTH];
  if (stack == 0 || ta_stack_frames(stack, pcs, TA_MAX_DEPTH) == 0) return "<no stack>";
  return function_at(ctx, pcs[0]);
}

/* Is fn among the first `top` frames of a ledger stack (inlined frames
 * included)? */
static inline int stack_has_function(report_ctx *ctx, uint32_t stack, const char *fn, size_t top) {
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(stack, pcs, TA_MAX_DEPTH);
  for (size_t i = 0; i < n && i < top; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE);
    for (int j = 0; j < k; j++)
      if (fr[j].function && strcmp(fr[j].function, fn) == 0) return 1;
  }
  return 0;
}

#endif
