/* internal.h - what the ledger's .c files share; prototypes grouped by the
 * file that defines them.  Names: _ta_ shared-internal, static private.
 * The pieces the LD_PRELOAD shim uses too are headers of their own, which
 * it includes instead of this one (tools/preload.h): attrs.h (compiler
 * hints), options.h (_ta_opt), errors.h (error.c), thread.h (a block's
 * record, ta_thread, solo mode), extents.h (mappings) and shim.h (the
 * ledger's calls the shim makes: entry points, exit work, init). */
#ifndef TAGALLOC_INTERNAL_H
#define TAGALLOC_INTERNAL_H

#include "attrs.h"
#include "errors.h"
#include "extents.h"
#include "kinds.h"
#include "options.h"
#include "procmaps.h"
#include "shim.h"
#include "tagalloc.h"
#include "thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- unwind.c ------------------------------------------------------------ */

/* Fills pcs with return addresses, innermost first, starting with the caller
 * of the function that is `skip` frames above the caller of _ta_unwind
 * (skip 0: the caller of _ta_unwind's caller's... see unwind.c).  Returns the
 * number of frames.  Exact: DWARF CFI rules from .eh_frame (elfutils libdw)
 * cached per return address, libunwind when a rule is not a simple one.
 * Fast: the frame-pointer chain.  Both stop at the thread's stack bounds. */
size_t _ta_unwind(uintptr_t *pcs, size_t max, size_t skip, int mode);
/* The same walk, put in the stack depot: the stack's id (0: none).  A walk
 * whose every input is as it was at a recent walk of this thread's (the
 * same frame, the same words read from the stack) gives that walk's id
 * without walking again (unwind.c: the walk memo). */
uint32_t _ta_unwind_id(size_t max, size_t skip, int mode);
/* Walks of the calling thread that the walk memo answered (tests). */
size_t _ta_unwind_memo_hits(void);
/* Walks of the calling thread that took over the outer frames of its last
 * walk, and the frames they took over (tests). */
size_t _ta_unwind_taken(size_t *frames);
/* Mark records held now (marks.c; freed marks leave). */
size_t _ta_marks_kept(void);
/* Tests: the quarantine checks spans with SSE2 even where the CPU has AVX2
 * (before the first quarantined free of the process). */
void _ta_quarantine_no_avx2(void);
/* Exact mode: rules this process computed with libdw (cache misses filled). */
size_t _ta_unwind_rules_computed(void);

/* ---- depot.c ------------------------------------------------------------- */

/* Stack depot (a trie of frames, outermost first): deduplicated stacks, ids
 * stable and never 0.  Memory comes from mmap, never from the audited heap. */
uint32_t _ta_depot_put(const uintptr_t *pcs, size_t n);
/* Copies up to max frames of stack id (innermost first); returns how many. */
size_t   _ta_depot_get(uint32_t id, uintptr_t *pcs, size_t max);
size_t   _ta_depot_depth(uint32_t id);        /* frames of stack id; 0: no such id */
bool     _ta_depot_node(uint32_t id, uint32_t *parent, uintptr_t *pc);   /* one node; false: no such id */
size_t   _ta_depot_count(void);               /* distinct stacks put */
size_t   _ta_depot_nodes(void);               /* nodes: stacks and their outer parts */
uint64_t _ta_depot_lookups(void);             /* this thread's lookups in the index (tests) */
uint64_t _ta_depot_memo_skipped(void);        /* this thread's puts past its memo (tests) */
/* Bytes the depot's nodes use (8 a node), and in *index_bytes its index's
 * slots (4 a slot); (tests). */
size_t   _ta_depot_bytes(size_t *index_bytes);
size_t   _ta_depot_addrs(void);               /* distinct return addresses in its nodes (tests) */
uint32_t _ta_depot_path_hash(uint32_t up, uintptr_t pc);   /* a node's home (tests) */
void     _ta_depot_fork(int phase);
/* Calls fn for each node made since *cursor (in order: a node's parent
 * comes before it) and advances *cursor; used by the trace writer to
 * write each node once. */
void     _ta_depot_each_since(uint64_t *cursor,
                              void (*fn)(uint32_t id, uint32_t parent, uintptr_t pc, void *arg),
                              void *arg);

/* ---- ledger.c: blocks ------------------------------------------------------ */

extern _Atomic uint64_t _ta_seq;                  /* the event sequence */
extern _Atomic uint64_t _ta_seq_epoch;            /* bumped by each mark */
extern _Atomic int _ta_threads_live;              /* threads with ledger state */
extern bool _ta_tracing;

/* The next sequence number of thread t.  Threads take blocks of 256 from
 * the shared counter, so it is not a contended line; a mark bumps the epoch,
 * and a thread that sees a new epoch takes a fresh block, so everything a
 * thread does after a mark (its own, or one it has seen) numbers after it.
 *
 * When tracing, the numbers order events across threads exactly (the
 * trace is replayed in their order: a block one thread frees and another
 * gets back from jemalloc must be freed first).  A single thread (solo
 * mode) counts: a plain load and store of the shared counter.  Several
 * threads each taking from it fought over its cache line: churn on 4
 * threads spent a third of its time on that one atomic add.  So where the
 * kernel keeps time with the TSC (it checked that the CPUs' counters agree
 * and never go back), several threads read the TSC instead, in units of 16
 * ticks (6 ns at 2.6 GHz; a malloc under the ledger takes 50 ns or more,
 * and a block passes from a free to another thread's malloc through
 * jemalloc's locks and far more than 16 ticks).  The two kinds of numbers
 * stay in one order: the TSC runs ahead of the counter (one count per
 * event, an event is many ticks), when solo mode ends the TSC is moved
 * ahead of the counter if it is not (_ta_seq_clock_sync), and when it
 * begins again the counter is moved past the TSC; a thread's own numbers
 * always grow (seq_last). */
extern bool _ta_seq_clock;                        /* several threads read the TSC */
extern _Atomic uint64_t _ta_seq_clock_base;       /* subtracted from the TSC / 16 */
#define TA_CLOCK_SHIFT 4
static inline uint64_t _ta_tsc(void) {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc() >> TA_CLOCK_SHIFT;
#else
  return 0;                                       /* _ta_seq_clock is never set */
#endif
}
static inline uint64_t _ta_clock(void) {
  return _ta_tsc() - atomic_load_explicit(&_ta_seq_clock_base, memory_order_relaxed);
}
void _ta_seq_raise(uint64_t v);                   /* the counter to at least v */
void _ta_seq_clock_sync(void);                    /* the TSC ahead of the counter */
void _ta_seq_counter_sync(void);                  /* the counter ahead of the TSC */
/* Where the sequence is now: the number the next event gets, or about
 * (trace anchors, findings, thread records). */
static inline uint64_t _ta_seq_now(void) {
  if (_ta_seq_clock && atomic_load_explicit(&_ta_solo, memory_order_relaxed) == NULL) return _ta_clock();
  return atomic_load_explicit(&_ta_seq, memory_order_relaxed);
}
/* One number while tracing; solo: t is the solo thread, in a solo section. */
static inline uint64_t _ta_seq_take(ta_thread *t, bool solo) {
  uint64_t v;
  if (solo) {
    v = atomic_load_explicit(&_ta_seq, memory_order_relaxed);
    if (TA_UNLIKELY(v <= t->seq_last)) v = t->seq_last + 1;
    atomic_store_explicit(&_ta_seq, v + 1, memory_order_relaxed);
  } else if (_ta_seq_clock && atomic_load_explicit(&_ta_solo, memory_order_relaxed) == NULL) {
    v = _ta_clock();
    if (t != NULL && TA_UNLIKELY(v <= t->seq_last)) v = t->seq_last + 1;
  } else {
    v = atomic_fetch_add_explicit(&_ta_seq, 1, memory_order_relaxed);
    if (t != NULL && TA_UNLIKELY(v <= t->seq_last)) {
      v = t->seq_last + 1;
      _ta_seq_raise(v + 1);
    }
  }
  if (t != NULL) t->seq_last = v;
  return v;
}
static inline uint64_t _ta_next_seq(ta_thread *t, bool solo) {
  if (_ta_tracing) return _ta_seq_take(t, solo);
  uint64_t e = atomic_load_explicit(&_ta_seq_epoch, memory_order_relaxed);
  if (TA_UNLIKELY(t->seq_next == t->seq_end || t->seq_epoch != e)) {
    t->seq_next = atomic_fetch_add_explicit(&_ta_seq, 256, memory_order_relaxed);
    t->seq_end = t->seq_next + 256;
    t->seq_epoch = e;
  }
  return t->seq_next++;
}

/* ---- live.c (ledger.c: arena blocks, peaks): the live table --------------- */

bool   _ta_block_get(uintptr_t addr, ta_block *out);       /* exact, live or quarantined */
bool   _ta_block_live(uintptr_t addr, ta_block *out);      /* exact, live table only */
/* One probe of the live table: is a the start of a live block of tag or alt? */
bool   _ta_block_check(uintptr_t a, ta_tag tag, ta_tag alt);
bool   _ta_block_find(uintptr_t p, ta_block *out);         /* containing p (slow) */
void   _ta_block_flag(uintptr_t addr, uint8_t flags);      /* ORs flags into a live block */
/* Records an arena block / removes one at reset (counts and trace included). */
void   _ta_block_add_arena(ta_thread *t, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack);
void   _ta_block_drop_arena(ta_thread *t, uintptr_t addr, uint32_t stack);
/* Visits every live block; with all shards locked by the caller, or not. */
void   _ta_block_each(bool locked, void (*fn)(const ta_block *b, void *arg), void *arg);
void   _ta_block_lock_all(void);
void   _ta_block_unlock_all(void);
/* The live table's shape (tests): its records, its slots, and the sum over
 * the records of how many slots each sits past its home slot (a find
 * probes that many more). */
void   _ta_table_shape(uint64_t *records, uint64_t *slots, uint64_t *displaced);
/* Peaks of live bytes: a tag's since the latest mark (restarted at live by
 * a new mark, the old value returned), and the whole run's (tag any). */
uint64_t _ta_peak_restart(ta_tag tag, uint64_t live);
uint64_t _ta_peak_now(ta_tag tag);
uint64_t _ta_peak_run(void);

/* ---- marks.c ------------------------------------------------------------------ */

void   _ta_summary_counts(ta_summary *s);            /* allocs, frees, live, peak */
void   _ta_marks_fork(int phase);                    /* mark_lock around fork */
void   _ta_thread_retire_births(ta_thread *t);        /* thread exit: see ta_since */

/* ---- tags.c -------------------------------------------------------------------- */

extern TA_HIDDEN _Atomic uint32_t _ta_tag_count;              /* ids below it are given */
extern ta_tag _ta_tag_realloc;                       /* the tag of ta_realloc(NULL, n) */
void   _ta_tags_init(void);                          /* _ta_init: the ledger's own tags */
void   _ta_tags_fork(int phase);

/* ---- seq.c --------------------------------------------------------------------- */

void   _ta_seq_clock_init(void);                     /* _ta_init: the TSC, when it is the clock */

/* ---- ledger.c, quarantine.c ------------------------------------------------------ */

void   _ta_quarantine_drain(ta_thread *t);           /* thread exit: evicts all, the rings stay mapped */
void   _ta_quarantine_forget(ta_thread *t);          /* its rings unmapped: a thread gone from the list (exit; fork child: its blocks kept) */
void   _ta_counts_publish(ta_thread *t);             /* thread exit: pending live bytes */
/* Checks the poison and the pads of the blocks the calling thread has
 * quarantined (exit; other threads may still be running, and change their
 * own rings), and the pads of every live block (heap.overflow). */
void   _ta_quarantine_check_all(void);

/* ---- guard.c: guard mode (TAGALLOC_GUARD=1) ------------------------------------
 * Blocks of up to 4096 bytes (and one bigger block in TAGALLOC_GUARD_SAMPLE,
 * up to 1 MiB) live at the end of a page of their own, before a PROT_NONE
 * page; a freed block's pages are made PROT_NONE while its record sits in
 * the quarantine.  A read or write after free faults and is reported as
 * use.after-free, a read or write past the end of a live block as
 * heap.overflow, with the faulting instruction's stack; then the page is
 * made read-write (full of poison) and the program goes on.  The block path calls
 * the hooks below only when _ta_guard_on (one branch in default mode).
 * _ta_guard_on, _ta_guard_owns and _ta_guard_fault, which the shim asks
 * too, are in shim.h. */

void     _ta_guard_init(void);               /* _ta_init, after the options */
/* A guarded block, or NULL: then the caller takes it from jemalloc. */
void    *_ta_guard_alloc(size_t size, size_t align, bool zero);
/* block_free: makes a guarded block's pages PROT_NONE (instead of the
 * poison) and checks the slack past its end; false: not a guarded block. */
bool     _ta_guard_retire(const ta_block *freed);
/* Whether the slack past the guard block at addr (size bytes) was written. */
bool     _ta_guard_slack_written(uintptr_t addr, uint64_t size);
/* Instead of dallocx: the slot goes back to the free list; false: not ours. */
bool     _ta_guard_release(uintptr_t addr);
/* What a quarantined block counts against the budget (size, unless guarded). */
uint64_t _ta_guard_charge(uintptr_t addr, uint64_t size);

/* ---- ref.c, hold.c, arena.c: hooks from the free path ------------------------ */

void _ta_ref_on_free(uintptr_t addr, uint32_t free_stack);
void _ta_hold_on_free(uintptr_t addr, size_t size, uint32_t free_stack);
void _ta_hold_on_arena_reset(uintptr_t lo, uintptr_t hi, uint32_t reset_stack);
/* Arena of an address: its generation and whether p is in the live part. */
bool _ta_arena_lookup(uintptr_t p, uint64_t *gen, bool *live, ta_tag *tag, uint32_t *reset_stack);
/* The block of the arena generation reset last that contains p: its
 * start, size and allocation stack. */
bool _ta_arena_dead_block(uintptr_t p, uintptr_t *addr, uint64_t *size, uint32_t *stack);
/* An alternating arena's dead chunk that holds p (a stale pointer was
 * found there) is kept dead for good: the pointer stays caught. */
void _ta_arena_retire(uintptr_t p);
/* ref.underflow at stack for obj, found freed by a holder of a reference. */
void _ta_ref_report_dead(uintptr_t obj, uint32_t stack, const char *why);
bool _ta_ref_is_dead(uintptr_t obj);   /* a refcounted object freed (its record kept) */
void _ta_ref_exit(void);          /* ref.leak findings for live counts */
void _ta_hold_exit(void);         /* hold.dangling and leak.orphan facts for the exit scan */
bool _ta_hold_is_orphan(uintptr_t addr, uint32_t *orphan_stack, uintptr_t *holder, const char **slot);
/* Live (not dangling) holds pointing at the block at addr. */
size_t _ta_hold_count_to(uintptr_t addr);

/* ---- findings.c -------------------------------------------------------------- */

typedef struct {
  const char *kind;
  uint64_t bytes;
  ta_tag tag;
  uint32_t stack, alloc_stack, free_stack, aux_stack;
  uintptr_t addr, holder;
  const char *slot;
  const ta_ref_event *history;
  size_t history_len;
  const char *detail;
  const ta_ref_site *sites;     /* ref.*: balance by callsite */
  size_t nsites;
} ta_error_info;

/* Records one occurrence of an error finding and says so on the error path. */
void _ta_finding_error(const ta_error_info *e);
/* Replaces the leak findings with those of a new scan. */
void _ta_findings_leaks_begin(void);
void _ta_findings_leak(const char *kind, uint64_t bytes, ta_tag tag, uint32_t stack,
                       uint32_t alloc_stack, uintptr_t addr, uint32_t aux_stack, uintptr_t holder,
                       const char *slot, const ta_ref_event *history, size_t history_len);
void _ta_findings_leaks_end(const ta_summary *s);
/* A ref.leak object (ref.c): a leak group with its balance by callsite. */
void _ta_findings_ref_leak(uint64_t bytes, ta_tag tag, uint32_t stack, uint32_t alloc_stack, uintptr_t addr,
                           const ta_ref_event *history, size_t history_len, const ta_ref_site *sites,
                           size_t nsites);

/* ---- device.c: device memory (tagalloc.h's ta_device_*) --------------------- */

/* The preload's entry points: the caller captured the stack. */
void   _ta_device_alloc_at(ta_tag tag, int device, uintptr_t addr, size_t size, unsigned flags,
                           uint32_t stack);
int    _ta_device_free_at(ta_tag tag, int device, uintptr_t addr, uint32_t stack);
/* Adds the live device blocks born at or after seq (of tag, or any) to
 * *blocks and *bytes, and calls fn on each when not NULL (ta_since). */
void   _ta_device_since(uint64_t seq, ta_tag tag, uint64_t *blocks, uint64_t *bytes,
                        void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg),
                        void *arg);
/* Device allocations and frees of the whole run (kept out of the host summary). */
void   _ta_device_summary(uint64_t *allocs, uint64_t *frees);
/* A gpu.leak finding for each live block of device (-1: all) without
 * TA_DEVICE_RESERVE; forget: the device's live blocks, reserved ones too,
 * are freed (a context torn down: counted and traced as frees with no
 * stack).  Returns the blocks reported. */
size_t _ta_device_leaks(int device, bool forget);
/* The exit work's first step: the ta_atexit functions, newest first, then
 * _ta_device_leaks(-1, false). */
void   _ta_device_exit(void);
void   _ta_device_fork(int phase);

/* ---- scan.c ------------------------------------------------------------------- */

void _ta_scan_impl(uintptr_t stack_from, const void *regs, size_t regs_size, bool at_exit);
void _ta_scan_exit(void);         /* the exit scan: leaks, orphans and ref.leak */

/* ---- trace.c ------------------------------------------------------------- */

extern bool _ta_tracing;
void _ta_trace_open(void);
void _ta_trace_flush_all_signal(void);   /* best effort, from a fatal signal */
void _ta_trace_alloc(ta_thread *t, uintptr_t addr, uint64_t size, ta_tag tag, uint32_t stack, uint64_t seq, int arena);
void _ta_trace_free(ta_thread *t, uintptr_t addr, uint32_t stack, uint64_t seq);
void _ta_trace_device_alloc(ta_thread *t, int device, uintptr_t addr, uint64_t size, ta_tag tag,
                            uint32_t stack, unsigned flags, uint64_t seq);
void _ta_trace_device_free(ta_thread *t, int device, uintptr_t addr, ta_tag tag, uint32_t stack,
                           uint64_t seq);
void _ta_trace_realloc(ta_thread *t, uintptr_t old, uintptr_t addr, uint64_t size, uint32_t stack, uint64_t seq);
void _ta_trace_ref(ta_thread *t, uintptr_t obj, int delta, long count, uint32_t stack, uint64_t seq);
void _ta_trace_hold(ta_thread *t, uintptr_t holder, const char *slot, uintptr_t ptr, uint32_t stack, uint64_t seq);
void _ta_trace_arena_reset(ta_thread *t, uintptr_t arena, uint64_t gen, uint32_t stack, uint64_t seq);
void _ta_trace_mark(ta_thread *t, uint64_t mark, uint64_t seq);
void _ta_trace_tag(ta_tag tag, const char *name);
void _ta_trace_finding(const char *kind, uintptr_t addr, uint32_t stack, uint64_t seq);
void _ta_trace_thread_start(ta_thread *t);
void _ta_trace_thread_exit(ta_thread *t);

/* ---- fork: each module's locks, taken before fork() and let go after ---- */

enum { TA_FORK_PREPARE, TA_FORK_PARENT, TA_FORK_CHILD };
void _ta_findings_fork(int phase);
void _ta_hold_fork(int phase);
void _ta_ref_fork(int phase);
void _ta_trace_fork(int phase);       /* child: a trace of its own, or none */
void _ta_thread_fork(int phase);      /* child: only the forking thread is left */
void _ta_scan_fork(int phase);
void _ta_unwind_fork(int phase);      /* the unwinder's libdw lock */

/* Cancellation held off around a lock whose section reaches cancellation
 * points (write, open, read): a thread that pthread_cancel ended there
 * would keep the lock (trace.c's file lock, the unwinder's, the scan's). */
static inline int _ta_cancel_off(void) {
  int old;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  return old;
}
static inline void _ta_cancel_restore(int old) { pthread_setcancelstate(old, &old); }

/* ---- map.c -------------------------------------------------------------------- */

typedef struct { uintptr_t key; void *value; } ta_map_entry;
typedef struct { ta_map_entry *v; size_t n, cap; } ta_map;   /* zero-initialised is empty */
void *_ta_map_get(const ta_map *m, uintptr_t key);
bool  _ta_map_put(ta_map *m, uintptr_t key, void *value);   /* replaces */
void *_ta_map_del(ta_map *m, uintptr_t key);                /* returns the old value */
void  _ta_map_each(const ta_map *m, void (*fn)(uintptr_t key, void *value, void *arg), void *arg);

/* ---- internal memory ------------------------------------------------------ */

/* The ledger's own bookkeeping memory: jemalloc through mallocx in an arena of
 * its own, never the audited heap, never recorded. */
void *_ta_meta_alloc(size_t size);
void *_ta_meta_calloc(size_t n, size_t size);
void *_ta_meta_realloc(void *p, size_t size);
void  _ta_meta_free(void *p);
void  _ta_meta_give_back(void *p, size_t len);   /* pages of a block the caller is done with */
char *_ta_meta_strdup(const char *s);

#endif
