/* tagalloc.h - the ledger: a tagged, instrumented allocator.
 *
 *   #include "tagalloc.h"
 *
 *   ta_tag T = ta_tag_get("tensor.data");
 *   ta_mark m = ta_mark_now();
 *   float *x = ta_alloc(T, 64 * sizeof *x);     // recorded with its stack
 *   ta_ref_init(x, 1);                          // refcount history starts
 *   ta_hold(layer, "weights", x);               // layer keeps x beyond this call
 *   ...
 *   ta_unhold(layer, "weights");
 *   if (ta_ref_release(x) == 0) ta_free(x);
 *   TA_ASSERT_NO_LEAKS_SINCE(m);                // nothing made since m is live
 *
 * Every allocation, free, refcount transition and hold is recorded with the
 * callsite's backtrace (TAGALLOC_UNWIND=exact|fast, TAGALLOC_DEPTH).  Misuse
 * (double free, refcount underflow, a hold into a stack frame, ...) becomes a
 * finding at once and the program goes on; leaks are classified by a
 * reachability scan (ta_scan(), and at exit).  At exit a report of all
 * findings is printed on stderr (TAGALLOC_REPORT=0 turns it off), and with
 * TAGALLOC_TRACE=path every event is written to a binary trace (TRACE.md).
 *
 * Finding kinds (stable names): leak.direct, leak.indirect, leak.possible,
 * leak.orphan, ref.underflow, ref.leak, hold.stack, hold.dangling,
 * free.double, free.invalid, use.after-free, arena.after-reset, gpu.leak,
 * gpu.pool-retained, gpu.purge-referenced (device memory, see below),
 * heap.overflow: bytes written past a block's end, found in the guard bytes
 * of its size class's slack when it is freed, leaves the quarantine or at
 * exit (a block whose size is a size class has none); in guard mode
 * (TAGALLOC_GUARD=1) any read or write past the end (or before the start) of
 * a live block, at its guard page.
 */
#ifndef TAGALLOC_H
#define TAGALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TA_VERSION "0.1.0"

/* ---- tags ---------------------------------------------------------------- */

typedef uint32_t ta_tag;
#define TA_ANY ((ta_tag)0)
#define TA_MAX_TAGS 256

/* Registered on first use, stable after; names are copied.  Returns TA_ANY
 * (and reports an error) when the table is full or name is NULL/empty. */
ta_tag      ta_tag_get(const char *name);
const char *ta_tag_name(ta_tag tag);         /* "?" for an unknown tag */

/* ---- allocation ---------------------------------------------------------- */

void  *ta_alloc(ta_tag tag, size_t size);
void  *ta_calloc(ta_tag tag, size_t n, size_t size);    /* overflow-checked */
void  *ta_realloc(void *p, size_t size);                /* keeps p's tag; NULL p allocates with tag "realloc" */
void  *ta_realloc_tag(ta_tag tag, void *p, size_t size);/* same, with the tag for a NULL p */
void  *ta_aligned(ta_tag tag, size_t align, size_t size);/* align: a power of two */
void   ta_free(void *p);                                /* NULL is a no-op */
size_t ta_usable_size(const void *p);                   /* 0 for a pointer the ledger does not own */
size_t ta_block_size(const void *p);                    /* the size asked for; 0 if not a live block */
ta_tag ta_block_tag(const void *p);                     /* TA_ANY if not a live block */

/* ---- refcounts ----------------------------------------------------------- */

/* obj: any address, usually a ledger block.  Each transition is recorded with
 * its stack; a release below zero, or on a freed block, is ref.underflow at
 * once.  At exit, objects with count > 0 are ref.leak, whose headline is
 * the latest acquisition of a callsite the balance by callsite (below) says
 * owes, and whose history lists those callsites' unreturned acquisitions;
 * when the balance names none, the acquisitions no release matched last
 * in, first out. */
void ta_ref_init(void *obj, long count);
long ta_ref_acquire(void *obj);   /* returns the new count */
long ta_ref_release(void *obj);   /* returns the new count (-1 after an underflow) */
long ta_ref_count(const void *obj); /* current count; -1 if obj has no refcount */
/* The same transitions recorded at a stack the caller took already (from
 * ta_stack_here): a library that records several events in one call
 * (a header's allocation, its acquisition of the storage and its hold on
 * it) pays for one stack walk, not one per event.  The stack should be the
 * caller's own or its caller's; 0 records none. */
long ta_ref_acquire_at(void *obj, uint32_t stack);
long ta_ref_release_at(void *obj, uint32_t stack);

/* ---- holds --------------------------------------------------------------- */

/* holder keeps ptr in slot beyond the current call (slot names are copied).
 * ptr should be a block's start (an interior pointer is resolved more slowly).
 * A pointer into any thread's stack is hold.stack; into a freed block,
 * hold.dangling; into an arena reset since, arena.after-reset.  Declaring the
 * same slot again replaces the previous hold.  ptr NULL drops the hold.
 * Freeing the holder (a block of the ledger's) ends all its holds. */
void   ta_hold(void *holder, const char *slot, const void *ptr);
void   ta_unhold(void *holder, const char *slot);
/* The same at a stack the caller took already (see ta_ref_acquire_at). */
void   ta_hold_at(void *holder, const char *slot, const void *ptr, uint32_t stack);
void   ta_unhold_at(void *holder, const char *slot, uint32_t stack);
/* Checks every hold of holder now: a target freed or reset since is
 * hold.dangling.  Returns the number of bad holds found. */
size_t ta_hold_check(const void *holder);
/* Checks that p points into a live block or the live part of an arena:
 * use.after-free or arena.after-reset otherwise.  Returns 1 if p is good. */
int    ta_check(const void *p);

/* The cheap check of a library's arguments: is p the start of a live block
 * of tag `tag` or `alt` (TA_ANY: any tag)?  1 if so: one probe of the live
 * table, no stack taken, no lock when one thread uses the ledger.  Else 0
 * and a finding, so that the library returns its error instead of reading
 * freed memory:
 *   - a freed (quarantined) block: use.after-free, or free.double under
 *     TA_CHECK_FREE (the caller was about to free or release p), or
 *     ref.underflow under TA_CHECK_REF (the caller holds a reference on p:
 *     some release was one too many; the finding has p's refcount history);
 *   - memory of an arena reset since (a block of an older generation):
 *     arena.after-reset, with the block's allocation stack (when it was of
 *     the previous generation) and the reset's stack;
 *   - a live block of another tag (p was freed and its memory handed out
 *     again), or memory the ledger does not know (freed long ago, or never
 *     a block): use.after-free, or free.invalid under TA_CHECK_FREE.
 * The finding's stack is the caller's; under TA_CHECK_CALLER it starts one
 * frame further out, at the caller's caller: a library's public function
 * checking its argument names its user's line.  what (may be NULL) names
 * the argument in the finding's detail ("tensor_add: a"). */
enum { TA_CHECK_CALLER = 1, TA_CHECK_FREE = 2, TA_CHECK_REF = 4 };
int    ta_check_block(const void *p, ta_tag tag, ta_tag alt, unsigned flags, const char *what);
/* ta_check_block(p, tag, tag, 0, NULL). */
int    ta_check_tag(const void *p, ta_tag tag);

/* ---- arenas -------------------------------------------------------------- */

typedef struct ta_arena ta_arena;
/* capacity: bytes of the first chunk; the arena grows by chunks when needed,
 * and reset gives back chunks grown beyond the capacity. */
ta_arena *ta_arena_new(ta_tag tag, size_t capacity);
/* TA_ARENA_ALTERNATE: consecutive generations use two different sets of
 * chunks (twice the memory), so that a pointer kept from the previous
 * generation never lands in a live block of the next one: its first use
 * there (ta_check, ta_check_block, ta_hold) is arena.after-reset, with the
 * stale block's allocation stack and the reset's stack. */
enum { TA_ARENA_ALTERNATE = 1 };
ta_arena *ta_arena_new_flags(ta_tag tag, size_t capacity, unsigned flags);
void     *ta_arena_alloc(ta_arena *a, size_t size);    /* 16-byte aligned */
/* The same, the block's stack taken already (see ta_ref_acquire_at). */
void     *ta_arena_alloc_at(ta_arena *a, size_t size, uint32_t stack);
void      ta_arena_reset(ta_arena *a);                 /* all its blocks die; a new generation starts */
void      ta_arena_free(ta_arena *a);
uint64_t  ta_arena_generation(const ta_arena *a);
size_t    ta_arena_capacity(const ta_arena *a);        /* bytes of chunk memory held now */

/* ---- device memory -------------------------------------------------------- */

/* Device memory (a GPU's, or the host backend's device range) is on the
 * ledger as device blocks, keyed by (tag, device, addr): a table of their
 * own, apart from host blocks, so a pool's buffer may share its segment's
 * address and a device address may equal a host one.  Each is recorded with
 * the caller's stack, is never read by the scan, and counts in its tag's
 * allocs, frees, live_blocks and live_bytes (ta_since, ta_live_since, the
 * assertion macros) but never in peak_bytes or ta_summary_get (host memory
 * only).  Thread-safe.  A free of a key that is not live is free.double (a
 * recently freed block) or free.invalid, reported at once.  At exit, after
 * the ta_atexit functions, each live device block without
 * TA_DEVICE_RESERVE is a gpu.leak finding (allocation stack, bytes, tag;
 * the device in its detail).
 *
 *   ta_tag B = ta_tag_get("gpu.buffer");
 *   ta_device_alloc(B, 0, dptr, 4096, 0);        // dptr: a device address
 *   ...
 *   ta_device_free(B, 0, dptr);                  // 1 */
#define TA_DEVICE_RESERVE 1u  /* reserved memory (a pool's segment, a VA reservation): not gpu.leak by itself at exit */
void   ta_device_alloc(ta_tag tag, int device, uintptr_t addr, size_t size, unsigned flags);
int    ta_device_free(ta_tag tag, int device, uintptr_t addr);   /* 1; 0 after a bad free (free.invalid/free.double reported) */
size_t ta_device_size(ta_tag tag, int device, uintptr_t addr);   /* 0: not a live device block of that tag */
/* Calls fn for each live device block of device (-1: all), oldest first;
 * fn may allocate and free device blocks (it sees a copy). */
void   ta_device_each(int device /* -1: all */, void (*fn)(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack, unsigned flags, void *arg), void *arg);
/* A finding classified by its caller (gpu.pool-retained, ...): grouped with
 * earlier ones of the same kind, tag, stack, aux_stack and detail (blocks
 * counted, bytes added; addr is the group's first).  kind must stay valid
 * (a string literal).  Kept until ta_findings_clear (a scan does not
 * replace them); visited with the leaks, after ref.leak, largest first. */
void   ta_finding_add(const char *kind, ta_tag tag, uintptr_t addr, uint64_t bytes, uint32_t stack, uint32_t aux_stack, const char *detail);
/* fn runs in the ledger's exit work, before gpu.leak, the scan and the
 * report; the newest registered runs first, as with atexit(3).  At most
 * 64 functions. */
void   ta_atexit(void (*fn)(void));

/* ---- marks and counts ---------------------------------------------------- */

typedef uint64_t ta_mark;
typedef struct {
  uint64_t allocs;      /* blocks allocated since the mark */
  uint64_t frees;       /* blocks freed since the mark (whenever they were made) */
  uint64_t live_blocks; /* blocks made since the mark and still live */
  uint64_t live_bytes;  /* their bytes */
  uint64_t peak_bytes;  /* highest live bytes of the tag (all blocks) at any moment since the mark */
} ta_counts;

ta_mark   ta_mark_now(void);
ta_counts ta_since(ta_mark m, ta_tag tag);   /* tag TA_ANY: all tags */
/* Forgets m (ta_since(m) is then an error).  A mark holds its counts per
 * tag until freed: a loop that marks every iteration frees them. */
void      ta_mark_free(ta_mark m);
/* Calls fn for each block made since m (of tag, or any) that is still live. */
void      ta_live_since(ta_mark m, ta_tag tag,
                        void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg),
                        void *arg);

/* ---- findings and scans -------------------------------------------------- */

/* Errors count occurrences; leak.* count blocks as of the latest scan;
 * ref.leak counts objects as of the latest scan.  kind NULL: all kinds. */
size_t ta_findings_count(const char *kind);
void   ta_scan(void);          /* reachability scan now; replaces the leak findings */
void   ta_findings_clear(void);/* forget every finding so far (tests) */

/* Prints the stacks of the blocks made since m that are still live (of tag,
 * or any) on stderr; returns how many.  Used by the assertion macros. */
size_t ta_print_live_since(ta_mark m, ta_tag tag, size_t max_blocks);
/* Prints the report of all findings now (the exit report's text) on stderr. */
void   ta_report_now(void);

/* ---- the findings model (read by reports/, never formatted here) -------- */

typedef struct {
  int       delta;     /* +1 acquire, -1 release, 0 init */
  long      count;     /* the count after the transition */
  uint32_t  stack;
  uint32_t  thread;
  uint64_t  seq;       /* the ledger's event sequence number */
} ta_ref_event;

/* Refcount balance by callsite (ref.underflow, ref.leak), after the Linux
 * kernel's ref_tracker, which keeps a stack per reference: the transitions
 * of an object grouped by stack (a callsite), replayed oldest first.
 *  - An init of count N is N acquisitions of its callsite.
 *  - A releasing callsite is paired, when it first releases, with one
 *    acquiring callsite seen before it: the one whose stack shares the
 *    most outermost frames with it (equal return addresses from the
 *    thread's start inwards: a view made and destroyed in one training
 *    step shares the step's frame, the parent tensor made in main does
 *    not); on a tie, the one with the highest balance then (the most left
 *    to release), then the one whose innermost frame (the caller of
 *    ta_ref_*) is nearest the release's in the address space, then the one
 *    that acquired last.  The nearest innermost frame: a reference is most
 *    often given back by the owner's destructor, in the same source file
 *    as the constructor that took it, whose code is contiguous; a third
 *    party's extra acquisition (weights "cloned" into a collection that
 *    keeps a reference) is far from both, and stays the one that owes even
 *    when it acquired last and from the same function.  But a releasing
 *    callsite that shares more outer frames with an earlier releasing
 *    callsite than with any acquiring one takes that one's pair: two
 *    releases of one destructor call are one release path.
 *  - Each acquisition adds one to its callsite's balance; each release
 *    takes one from its pair's.  The first release that takes a balance
 *    below zero is the extra release: the one that made the count owe,
 *    even when the count itself goes below zero only later, at another,
 *    legitimate release.  Its callsite, and any other releasing callsite
 *    that takes its pair below zero, is marked (extra).  When no release
 *    owes, the acquiring callsites left with a positive balance are marked
 *    (ref.leak: what was acquired and never released).
 * ref.underflow's headline stack is the extra release (aux_stack: where
 * the count went below zero, when that is another release). */
typedef struct {
  uint32_t stack;        /* the callsite's stack */
  int      delta;        /* +1: acquisitions (inits included), -1: releases */
  uint64_t transitions;  /* how many (an init counts its count) */
  uint32_t paired;       /* releases: the index of the acquiring site it is paired with; UINT32_MAX: none */
  int64_t  balance;      /* acquisitions: acquired less released by its paired sites */
  int      extra;        /* releases: released more than its pair acquired (the first such is the
                          * headline of ref.underflow); acquisitions: acquired more than was released */
} ta_ref_site;

#define TA_REF_SITES_MAX 16   /* callsites kept per object; more are left out (and not paired) */
/* Fills sites[0..max) from the transitions ev[0..n) (oldest first), with
 * the stack frames from frames(arg, stack, pcs, max) (ta_stack_frames's
 * shape; NULL: ta_stack_frames).  Returns the number of sites; *extra (may
 * be NULL) is the index in ev of the extra release, or SIZE_MAX. */
size_t ta_ref_balance(const ta_ref_event *ev, size_t n,
                      size_t (*frames)(void *arg, uint32_t stack, uintptr_t *pcs, size_t max), void *arg,
                      ta_ref_site *sites, size_t max, size_t *extra);

/* One group of findings: same kind, same stacks, same tag. */
typedef struct {
  const char *kind;        /* a stable name, see the top of this file */
  uint64_t    bytes;       /* leak: bytes of all blocks in the group; error: size of the block involved */
  uint64_t    blocks;      /* leak: blocks in the group; error: occurrences; ref.leak: objects */
  ta_tag      tag;
  uint32_t    stack;       /* leak: allocation stack; error: where the bad operation happened */
  uint32_t    alloc_stack; /* errors: where the block was allocated (0: unknown) */
  uint32_t    free_stack;  /* errors: where it was freed or reset (0: unknown) */
  uint32_t    aux_stack;   /* hold.*: where the hold was declared; leak.orphan: where it was orphaned;
                            * ref.underflow: where the count went below zero (0: at the headline's release) */
  uintptr_t   addr;        /* the first block or object of the group */
  uintptr_t   holder;      /* hold.*, leak.orphan: the holder's address */
  const char *slot;        /* hold.*, leak.orphan: the hold's slot */
  const ta_ref_event *history;  /* ref.*: the object's transitions (ref.leak: the unmatched acquisitions) */
  size_t      history_len;
  char        detail[96];  /* one line of extra facts, may be empty */
  const ta_ref_site *sites;     /* ref.*: the first object's balance by callsite (see ta_ref_balance) */
  size_t      nsites;
} ta_finding;

typedef struct {
  uint64_t direct_bytes, direct_blocks;
  uint64_t indirect_bytes, indirect_blocks;
  uint64_t possible_bytes, possible_blocks;
  uint64_t reachable_bytes, reachable_blocks;
  uint64_t orphan_bytes, orphan_blocks;
  uint64_t allocs, frees, live_bytes, peak_bytes;  /* the whole run so far */
  uint64_t errors;                                 /* findings that are not leaks */
} ta_summary;

/* Visits the finding groups, errors first (in the order they happened), then
 * leaks of the latest scan, largest first.  Stops early when fn returns
 * non-zero.  Returns the number of groups visited. */
typedef int ta_finding_fn(const ta_finding *f, void *arg);
size_t ta_findings_visit(ta_finding_fn *fn, void *arg);
ta_summary ta_summary_get(void);

/* Explains a value read from memory that the ledger filled: when every
 * byte of v's low `width` bytes (8, 4 or 2; 0: try 8, then 4) is the
 * freed-memory poison (TAGALLOC_POISON, 0xDF: 0xdfdfdfdfdfdfdfdf, as a
 * signed count -2314885530818453537) it returns " (the freed-memory poison:
 * read from a freed block)", the fill byte of new blocks (TAGALLOC_FILL)
 * " (the fill of new blocks: read before it was written)", or the guard
 * bytes past a block's end " (the guard bytes past a block's end: read past
 * the end)"; otherwise "".  For messages that print a pointer or a count:
 *   fprintf(stderr, "%s has %lld elements%s", name, n, ta_poison_explain((uint64_t)n, 0)); */
const char *ta_poison_explain(uint64_t v, unsigned width);

/* The renderer of the exit report (reports/ registers one at load time). */
typedef void ta_reporter_fn(int fd);
void ta_reporter_set(ta_reporter_fn *fn);
/* The writer of one symbolized stack (reports/ registers one at load time;
 * without it the assertions print bare return addresses).  Writes at most
 * max_frames frames of stack on fd, returns the lines written. */
typedef size_t ta_stack_writer_fn(int fd, uint32_t stack, long max_frames);
void ta_stack_writer_set(ta_stack_writer_fn *fn);

/* ---- stacks -------------------------------------------------------------- */

#define TA_MAX_DEPTH 128
/* Copies up to max frames (return addresses, innermost first) of a stack id
 * into frames; returns how many, 0 for an unknown id.  A stack has at most
 * TA_MAX_DEPTH frames. */
size_t ta_stack_frames(uint32_t stack, uintptr_t *frames, size_t max);
uint32_t ta_stack_here(void);   /* the stack of the caller, deduplicated */
size_t   ta_stacks_count(void); /* distinct stacks recorded so far */

/* ---- assertions for tests ------------------------------------------------ */

void ta__assert_fail(const char *file, int line, const char *what,
                     uint64_t got, uint64_t want, ta_mark m, ta_tag tag);

/* Aborts with the stacks of what is live when any block made since m is live. */
#define TA_ASSERT_NO_LEAKS_SINCE(m) do {                                       \
    ta_counts ta__c = ta_since((m), TA_ANY);                                   \
    if (ta__c.live_blocks != 0)                                                \
      ta__assert_fail(__FILE__, __LINE__, "live blocks since mark",           \
                      ta__c.live_blocks, 0, (m), TA_ANY);                      \
  } while (0)
/* Aborts when the number of allocations of tag since m is not n. */
#define TA_ASSERT_ALLOCS_SINCE(m, tag, n) do {                                 \
    ta_counts ta__c = ta_since((m), (tag));                                    \
    if (ta__c.allocs != (uint64_t)(n))                                         \
      ta__assert_fail(__FILE__, __LINE__, "allocations since mark",           \
                      ta__c.allocs, (uint64_t)(n), (m), (tag));               \
  } while (0)
/* Aborts when the live blocks of tag made since m are not n. */
#define TA_ASSERT_LIVE_SINCE(m, tag, n) do {                                   \
    ta_counts ta__c = ta_since((m), (tag));                                    \
    if (ta__c.live_blocks != (uint64_t)(n))                                    \
      ta__assert_fail(__FILE__, __LINE__, "live blocks since mark",           \
                      ta__c.live_blocks, (uint64_t)(n), (m), (tag));          \
  } while (0)
/* Aborts when the number of findings of kind is not n. */
#define TA_ASSERT_FINDINGS(kind, n) do {                                       \
    size_t ta__n = ta_findings_count(kind);                                    \
    if (ta__n != (size_t)(n))                                                  \
      ta__assert_fail(__FILE__, __LINE__, "findings of " #kind,               \
                      ta__n, (uint64_t)(n), 0, TA_ANY);                        \
  } while (0)

/* ---- options and errors -------------------------------------------------- */

/* Options are read once from TAGALLOC_<NAME> (see README.md); a bad value
 * warns and keeps the default.  Returns -1 for an unknown name. */
long ta_option(const char *name);
/* A string option's value as read at start (a copy: the environment may be
 * gone at exit), NULL when unset or not a string option
 * ("trace", "json", "suppressions"). */
const char *ta_option_string(const char *name);
/* When entry ("TAGALLOC_NAME=value") names no option: NAME (up to the '=');
 * hint gets "TAGALLOC_X" for the closest option two edits away or less, or
 * "".  NULL for a known option or a variable not starting TAGALLOC_. */
const char *ta_options_unknown(const char *entry, char *hint, size_t hintlen);

/* Error codes passed to the error handler. */
enum {
  TA_EOK = 0,
  TA_ENOMEM,     /* the backing allocator failed */
  TA_EOVERFLOW,  /* n * size overflows */
  TA_EINVAL,     /* a bad argument (alignment, NULL tag name, ...) */
  TA_EFINDING,   /* a finding was recorded (message names its kind) */
  TA_EOPTION     /* a bad TAGALLOC_* value */
};
/* Called with a message that must not be kept; never allocates.  The default
 * handler writes "tagalloc: <message>" on stderr.  NULL restores it. */
typedef void ta_error_fn(int code, const char *message, void *arg);
void ta_error_handler(ta_error_fn *fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
