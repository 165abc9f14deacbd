/* kinds.h - the finding kinds: one table of their names, classes,
 * severities and titles, used by the ledger, every renderer and diff.
 *
 *   e.kind = ta_kind_name(TA_KIND_FREE_DOUBLE);       // the ledger names a finding
 *   if (ta_kind_is_leak(g->kind)) ...                  // a leak (not an error, not held memory)
 *   if (ta_kind_of(g->kind) == TA_KIND_LEAK_GROWTH) ... // one kind
 *   qsort by ta_kind_rank(kind): the worst first
 *   printf("%s of ...", ta_kind_title(kind));          // "Direct leak", NULL for most kinds
 *
 * Kinds travel as their names (in ta_finding, the trace, JSON), so a kind
 * this table does not know (ta_finding_add takes any name, and a trace may
 * come from a newer tagalloc) still has a class and a rank: a name starting
 * "leak." or ending ".leak" is a leak, any other an error, and it ranks with
 * the last kind of its class.  The table's order is the severity order of
 * the reports (docs/ARCHITECTURE.md lists the kinds). */
#ifndef TAGALLOC_KINDS_H
#define TAGALLOC_KINDS_H

#include <stdbool.h>

/* The kinds, in severity order: the worst first. */
typedef enum {
  TA_KIND_USE_AFTER_FREE,       /* "use.after-free" */
  TA_KIND_HEAP_OVERFLOW,        /* "heap.overflow" */
  TA_KIND_FREE_DOUBLE,          /* "free.double" */
  TA_KIND_FREE_INVALID,         /* "free.invalid" */
  TA_KIND_ARENA_AFTER_RESET,    /* "arena.after-reset" */
  TA_KIND_REF_UNDERFLOW,        /* "ref.underflow" */
  TA_KIND_HOLD_DANGLING,        /* "hold.dangling" */
  TA_KIND_HOLD_STACK,           /* "hold.stack" */
  TA_KIND_GPU_PURGE_REFERENCED, /* "gpu.purge-referenced" */
  TA_KIND_LEAK_DIRECT,          /* "leak.direct" */
  TA_KIND_LEAK_ORPHAN,          /* "leak.orphan" */
  TA_KIND_GPU_LEAK,             /* "gpu.leak" */
  TA_KIND_LEAK_INDIRECT,        /* "leak.indirect" */
  TA_KIND_REF_LEAK,             /* "ref.leak" */
  TA_KIND_GPU_POOL_RETAINED,    /* "gpu.pool-retained" */
  TA_KIND_LEAK_POSSIBLE,        /* "leak.possible" */
  TA_KIND_LEAK_GROWTH,          /* "leak.growth" */
  TA_KIND_UNCLASSIFIED,         /* "unclassified" */
  TA_KIND_COUNT,
  TA_KIND_UNKNOWN = TA_KIND_COUNT   /* ta_kind_of: a name not in the table */
} ta_kind;

typedef enum {
  TA_CLASS_ERROR,   /* a misuse caught when it happened (or found later) */
  TA_CLASS_LEAK,    /* memory lost: counted as a leak, suppressible */
  TA_CLASS_HELD,    /* memory still live that is neither: growth, unclassified blocks */
} ta_kind_class;

typedef struct {
  const char   *name;    /* the stable name reports, traces and tests use */
  ta_kind_class kclass;
  const char   *title;   /* the text report's "<title> of N byte(s) in M object(s)", or NULL */
} ta_kind_info;

extern const ta_kind_info ta_kinds[TA_KIND_COUNT];

/* The kind named name (NULL: TA_KIND_UNKNOWN), and the name of kind k. */
ta_kind       ta_kind_of(const char *name);
const char   *ta_kind_name(ta_kind k);
/* The class, rank (0 the worst) and title of a named kind, known or not. */
ta_kind_class ta_kind_class_of(const char *name);
int           ta_kind_rank(const char *name);
const char   *ta_kind_title(const char *name);
/* Shorthands for the class: a leak; an error; leak-like (a leak, or memory
 * still held: what bytes are shown for and suppressions apply to). */
bool          ta_kind_is_leak(const char *name);
bool          ta_kind_is_error(const char *name);
bool          ta_kind_is_held(const char *name);

#endif
