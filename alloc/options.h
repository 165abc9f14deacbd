/* options.h - the TAGALLOC_* options as options.c reads them from the
 * environment (_ta_opt), read by the ledger and the preload. */
#ifndef TAGALLOC_OPTIONS_H
#define TAGALLOC_OPTIONS_H

/* ---- options.c ----------------------------------------------------------- */

enum { TA_UNWIND_EXACT = 0, TA_UNWIND_FAST = 1, TA_UNWIND_NONE = 2 };

/* TAGALLOC_CHECK: what a free records and keeps (ledger.c, block_free).
 * leaks: no free stack, no quarantine; errors: free stacks and one freed
 * block in TAGALLOC_QUARANTINE_SAMPLE quarantined; full: every freed block
 * quarantined with its free stack. */
enum { TA_CHECK_LEAKS = 0, TA_CHECK_ERRORS = 1, TA_CHECK_FULL = 2 };

typedef struct {
  long unwind;        /* TAGALLOC_UNWIND: exact | fast | none */
  long depth;         /* TAGALLOC_DEPTH: frames per stack, 1..TA_MAX_DEPTH */
  long quarantine;    /* TAGALLOC_QUARANTINE: bytes (K/M/G) */
  long quarantine_blocks; /* TAGALLOC_QUARANTINE_BLOCKS: blocks per thread, 0: no limit */
  long check;         /* TAGALLOC_CHECK: leaks | errors | full (TA_CHECK_*) */
  long quarantine_sample; /* TAGALLOC_QUARANTINE_SAMPLE: errors mode quarantines one freed block in N */
  long report;        /* TAGALLOC_REPORT: exit report on/off */
  long scan_at_exit;  /* TAGALLOC_SCAN: leak scan at exit on/off */
  long poison;        /* TAGALLOC_POISON: the byte written into freed blocks */
  long poison_span;   /* TAGALLOC_POISON_SPAN: leading bytes of a freed block poisoned and checked */
  long fill;          /* TAGALLOC_FILL: the byte written into new blocks, -1 = none */
  long ref_history;   /* TAGALLOC_REF_HISTORY: transitions kept per object */
  long trace_buffer;  /* TAGALLOC_TRACE_BUFFER: bytes per thread buffer */
  long max_frames;    /* TAGALLOC_REPORT_FRAMES: frames printed per stack */
  long max_groups;    /* TAGALLOC_REPORT_GROUPS: groups printed per kind */
  long record;        /* TAGALLOC_RECORD: 0 counts only (no stacks, no trace) */
  const char *trace;  /* TAGALLOC_TRACE: path of the trace, NULL for none */
  long follow;        /* TAGALLOC_FOLLOW: the preload follows exec (keeps LD_PRELOAD) */
  long clock;         /* TAGALLOC_CLOCK: threads number trace events from the TSC where it is the kernel's clock */
  long trace_events;  /* TAGALLOC_TRACE_EVENTS: 0 writes the trace's exit records only (trace.c) */
  long guard;         /* TAGALLOC_GUARD: guard mode on/off (guard.c) */
  long guard_slots;   /* TAGALLOC_GUARD_SLOTS: page slots of small guarded blocks */
  long guard_sample;  /* TAGALLOC_GUARD_SAMPLE: one block in N guarded beyond the budget */
  long beside;        /* TAGALLOC_BESIDE: the preload's leaks mode keeps small blocks' records beside them (beside.h) */
  const char *suppressions; /* TAGALLOC_SUPPRESSIONS: the suppressions file (reports/suppress.c) */
  const char *skip;   /* TAGALLOC_SKIP: programs the preload does not follow into (glob, comma-separated) */
  const char *debug_cache; /* TAGALLOC_DEBUG_CACHE: the symbolizer's cache of debug files (reports/symbolize.c) */
  const char *alloc_wrappers; /* TAGALLOC_ALLOC_WRAPPERS: functions reports pass over (reports/wrappers.c) */
} ta_options_t;

extern ta_options_t _ta_opt;
void _ta_options_init(void);                  /* idempotent, never allocates */

#endif
