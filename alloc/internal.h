/* internal.h - what the ledger's .c files share; prototypes grouped by the
 * file that defines them.  Names: _ta_ shared-internal, static private. */
#ifndef TAGALLOC_INTERNAL_H
#define TAGALLOC_INTERNAL_H

#include "kinds.h"
#include "procmaps.h"
#include "tagalloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TA_LIKELY(x)   __builtin_expect(!!(x), 1)
#define TA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TA_NOINLINE    __attribute__((noinline))
#define TA_HIDDEN      __attribute__((visibility("hidden")))

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
  const char *suppressions; /* TAGALLOC_SUPPRESSIONS: the suppressions file (reports/suppress.c) */
  const char *skip;   /* TAGALLOC_SKIP: programs the preload does not follow into (glob, comma-separated) */
  const char *debug_cache; /* TAGALLOC_DEBUG_CACHE: the symbolizer's cache of debug files (reports/symbolize.c) */
  const char *alloc_wrappers; /* TAGALLOC_ALLOC_WRAPPERS: functions reports pass over (reports/wrappers.c) */
} ta_options_t;

extern ta_options_t _ta_opt;
void _ta_options_init(void);                  /* idempotent, never allocates */

/* ---- error.c ------------------------------------------------------------- */

/* printf-like into a stack buffer, then to the handler; never allocates. */
void _ta_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Async-signal-safe formatting helpers (no malloc, no locale). */
int  _ta_snprintf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void _ta_write_all(int fd, const void *buf, size_t n);

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
/* Forget cached rules in [lo, hi) (a module was unloaded). */
void   _ta_unwind_forget(uintptr_t lo, uintptr_t hi);
/* Mark records held now (marks.c; freed marks leave). */
size_t _ta_marks_kept(void);
/* Exact mode: rules this process computed with libdw (cache misses filled). */
size_t _ta_unwind_rules_computed(void);

/* ---- thread.c ------------------------------------------------------------ */

/* ---- ledger.c: a block's record ------------------------------------------ */

enum { TA_LIVE = 1, TA_FREED = 2 };               /* ta_block.state */
/* The byte written past a block's requested size, in its size class's
 * slack (ledger.c: the overflow check); mimalloc's padding byte. */
#define TA_PAD_BYTE 0xDE
enum {                                            /* ta_block.flags */
  TA_F_REF   = 1,   /* has a refcount record (ref.c) */
  TA_F_HOLD  = 2,   /* holds something, or is held (hold.c) */
  TA_F_ARENA = 4,   /* lives in an arena chunk: not freeable, dies at reset */
};

/* 32 bytes: two records a cache line, none across two lines (the table's
 * slots are 32-byte aligned).  A size fits 48 bits (no allocation is
 * larger than the 47-bit address space) and the sequence 56 bits (2^56
 * events, or of the TSC's 16-tick units that number several threads'
 * events: 14 years at 2.6 GHz). */
typedef struct {
  uintptr_t addr;          /* 0: an empty slot */
  uint64_t  size : 48;     /* bytes asked for */
  uint64_t  tag : 16;
  uint64_t  seq : 56;      /* birth: the ledger's event sequence number */
  uint64_t  state : 4;
  uint64_t  flags : 4;
  uint32_t  stack;         /* allocation stack */
  uint32_t  free_stack;    /* while quarantined */
} ta_block;
_Static_assert(sizeof(ta_block) == 32, "a block's record is 32 bytes");

/* Per-thread counters, one row per tag (row 0: all tags).  Each thread
 * writes only its own rows (relaxed atomics, so others may read them). */
typedef struct {
  _Atomic uint64_t allocs, frees, alloc_bytes, free_bytes;
} ta_tag_counts;

#define TA_RING 4096          /* recent births kept per thread, for ta_since */
typedef struct { _Atomic uintptr_t addr; _Atomic uint64_t seq; } ta_birth;

typedef struct { uint64_t allocs, frees, alloc_bytes, free_bytes; } ta_tag_counts_plain;

typedef struct ta_thread ta_thread;
struct ta_thread {
  uint32_t     id;             /* 1, 2, ... in order of first use */
  int          tid;            /* kernel thread id */
  pthread_t    self;
  uintptr_t    stack_lo, stack_hi;
  int          guard;          /* recursion guard: >0 while inside the ledger */
  bool         dead;
  ta_thread   *next, *prev;    /* the registry, under its lock */
  void        *trace;          /* trace.c's buffer, NULL when not tracing */
  ta_block    *q;              /* the blocks this thread freed, oldest first (quarantine.c) */
  uint32_t     qcap, qhead, qlen;  /* qcap: the ring in use, a power of 2 */
  uint32_t     qmax;           /* the ring reserved (mmap'd, touched up to qcap) */
  int64_t      qbytes;         /* bytes in this thread's quarantine */
  uint32_t     qcount;         /* frees since the last one sampled (errors mode) */
  uint32_t     rpos;           /* the next slot of `recent` */
  ta_block    *recent;         /* the last TA_RECENT records freed outside the quarantine */
  uint64_t     seq_next, seq_end, seq_epoch;   /* a block of sequence numbers */
  uint64_t     seq_last;       /* the last number it took while tracing */
  _Atomic int  solo_depth;     /* >0 while inside a solo section (thread.c) */
  struct ta_stack_memo *stack_memo;   /* recent stacks and their ids (depot.c) */
  int          stack_memo_busy;       /* inside _ta_depot_put (a signal may nest) */
  struct ta_walk_memo *walk_memo;     /* recent walks and their stack ids (unwind.c) */
  int          walk_memo_busy;        /* inside _ta_unwind_id (a signal may nest) */
  bool         batching;       /* live-byte deltas are published in batches */
  int64_t      pending[TA_MAX_TAGS];           /* unpublished live-byte deltas */
  _Atomic uint64_t ring_head;  /* births written so far */
  ta_birth     ring[TA_RING];
  ta_tag_counts counts[TA_MAX_TAGS];
};

/* initial-exec: an access never calls __tls_get_addr, which may call malloc
 * (dtv growth after a dlopen) - under LD_PRELOAD that malloc is the shim's,
 * which reads _ta_self first, and would recurse. */
extern __thread ta_thread *_ta_self __attribute__((tls_model("initial-exec")));
ta_thread *_ta_thread_slow(void);     /* creates the calling thread's state */
/* The preload's guard raised (thread.c) when this ledger is another one, a
 * copy linked into the program: around work of the ledger's own that
 * allocates (libdw, the symbolizer).  NULL: nothing was raised. */
ta_thread *_ta_host_enter(void);
void       _ta_host_leave(ta_thread *host);
/* This ledger is a program's copy, the preload's runs beside it, and this
 * one recorded nothing: its exit report would repeat the preload's. */
bool       _ta_host_quiet(void);
static inline ta_thread *_ta_thread(void) {   /* the calling thread's, created on first use */
  ta_thread *t = _ta_self;
  return TA_LIKELY(t != NULL) ? t : _ta_thread_slow();
}
/* Solo mode (thread.c).  While a single thread uses the ledger, _ta_solo
 * points to it and it updates the shared state (the live table, live
 * bytes and peaks, the event sequence) with plain loads and stores inside
 * "solo sections" instead of locked instructions: on this machine a locked
 * instruction costs about 12 ns, and a malloc/free pair made eight.  Any
 * other thread revokes solo mode before it touches that state
 * (_ta_solo_revoke: it clears _ta_solo, runs membarrier so that the solo
 * thread either shows it is inside a section or sees the cleared pointer,
 * and waits for it to leave).  A section never takes a lock that a revoker
 * may hold.  Without membarrier (old kernels, valgrind) there is no solo
 * mode. */
extern _Atomic(ta_thread *) _ta_solo;
void _ta_solo_revoke(void);
static inline bool _ta_solo_enter(ta_thread *t) {
  if (atomic_load_explicit(&_ta_solo, memory_order_relaxed) != t) return false;
  int d = atomic_load_explicit(&t->solo_depth, memory_order_relaxed);
  atomic_store_explicit(&t->solo_depth, d + 1, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);    /* the revoker's membarrier orders the rest */
  if (TA_LIKELY(atomic_load_explicit(&_ta_solo, memory_order_relaxed) == t)) return true;
  atomic_store_explicit(&t->solo_depth, d, memory_order_release);
  return false;
}
static inline void _ta_solo_leave(ta_thread *t, bool solo) {
  if (!solo) return;
  int d = atomic_load_explicit(&t->solo_depth, memory_order_relaxed);
  atomic_store_explicit(&t->solo_depth, d - 1, memory_order_release);
}
/* Revokes solo mode unless the caller is the solo thread (a thread about
 * to touch shared state outside the paths that register it). */
static inline void _ta_solo_check(void) {
  ta_thread *s = atomic_load_explicit(&_ta_solo, memory_order_relaxed);
  if (TA_UNLIKELY(s != NULL && s != _ta_self)) _ta_solo_revoke();
}
/* Sums the counters of every thread, live and exited, into out[ntags]. */
void       _ta_thread_sum(ta_tag_counts_plain *out, size_t ntags);
/* Calls fn on each live thread, under the registry lock. */
void       _ta_thread_each(void (*fn)(ta_thread *t, void *arg), void *arg);
bool       _ta_thread_each_try(void (*fn)(ta_thread *t, void *arg), void *arg);  /* signal handlers */
void       _ta_thread_lock(void);
void       _ta_thread_unlock(void);
uint32_t   _ta_thread_id(void);       /* small, stable number of the calling thread (1 = first) */
/* The calling thread's stack bounds [lo, hi); 0,0 when unknown. */
void       _ta_thread_stack(uintptr_t *lo, uintptr_t *hi);
/* Is addr inside the stack of any thread the ledger knows of? */
bool       _ta_addr_on_stack(uintptr_t addr);
/* ... of a thread that never called the ledger (slow: reads /proc). */
bool       _ta_addr_on_unknown_stack(uintptr_t addr);

/* ---- depot.c ------------------------------------------------------------- */

/* Stack depot (a trie of frames, outermost first): deduplicated stacks, ids
 * stable and never 0.  Memory comes from mmap, never from the audited heap. */
uint32_t _ta_depot_put(const uintptr_t *pcs, size_t n);
/* Copies up to max frames of stack id (innermost first); returns how many. */
size_t   _ta_depot_get(uint32_t id, uintptr_t *pcs, size_t max);
size_t   _ta_depot_depth(uint32_t id);        /* frames of stack id; 0: no such id */
size_t   _ta_depot_count(void);               /* distinct stacks put */
size_t   _ta_depot_nodes(void);               /* nodes: stacks and their outer parts */
uint64_t _ta_depot_lookups(void);             /* this thread's lookups in the index (tests) */
uint64_t _ta_depot_memo_skipped(void);        /* this thread's puts past its memo (tests) */
/* Bytes the depot's nodes use (12 a node), and in *index_bytes its index's
 * slots (8 a slot); (tests). */
size_t   _ta_depot_bytes(size_t *index_bytes);
uint32_t _ta_depot_path_hash(uint32_t up, uintptr_t pc);   /* a node's home (tests) */
void     _ta_depot_fork(int phase);
/* Calls fn for each node made since *cursor (in order: a node's parent
 * comes before it) and advances *cursor; used by the trace writer to
 * write each node once. */
void     _ta_depot_each_since(uint64_t *cursor,
                              void (*fn)(uint32_t id, uint32_t parent, uintptr_t pc, void *arg),
                              void *arg);

/* The LD_PRELOAD shim's entry points (ledger.c): the shim captures the stack. */
void *_ta_alloc_at(ta_tag tag, size_t size, size_t align, bool zero, uint32_t stack);
/* The same in two steps, so that the stack is taken between them while
 * the block's table slot loads: the memory (NULL on failure), then its
 * record (raw may be NULL: the error is reported there). */
void *_ta_alloc_raw(size_t size, size_t align, bool zero);
void *_ta_alloc_record(void *raw, ta_tag tag, size_t size, bool zero, uint32_t stack);
bool  _ta_free_at(void *p, uint32_t stack);                 /* false: a bad free, reported */
bool  _ta_free_quiet(void *p);          /* leaks mode, no stack: false for a bad free, not reported, nothing done */
void *_ta_realloc_at(ta_tag tag, void *p, size_t size, uint32_t stack);
/* The exit work (scan, report, trace), callable early: _exit, a fatal
 * signal, exec.  Runs once per process image unless `again`. */
void  _ta_exit_now(bool again);
/* Called by the exit work first, guard not raised (the shim frees the
 * runtime's own blocks there, as memcheck's freeres does); NULL: nothing. */
extern void (*_ta_exit_before)(void);
/* Set when the exit work runs in a fatal signal's handler (the preload):
 * the interrupted context's stack pointer and registers are this thread's
 * roots, not the handler's frames (which may be on another stack). */
extern uintptr_t   _ta_exit_sp;
extern const void *_ta_exit_regs;
extern size_t      _ta_exit_regs_size;
/* Where the program stopped (scan.c): from a signal's ucontext_t (NULL:
 * from the caller), the program's frame that called the function ending
 * the image (exit, abort, exec...), or the interrupted context itself,
 * into _ta_exit_sp and _ta_exit_regs.  False (nothing set) when none is
 * found.  _ta_stop_init finds the ending functions (dlsym: call it where
 * that may run, not in a signal handler). */
void _ta_stop_init(void);
bool _ta_stop_find(const void *uc);

/* Captures the caller's stack (skip frames of the ledger) into the depot. */
uint32_t _ta_stack_capture(size_t skip);

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
void _ta_init(void);                              /* idempotent */
extern _Atomic int _ta_ready;
static inline void _ta_ensure(void) {
  if (TA_UNLIKELY(!atomic_load_explicit(&_ta_ready, memory_order_acquire))) _ta_init();
}

bool   _ta_block_get(uintptr_t addr, ta_block *out);       /* exact, live or quarantined */
bool   _ta_block_live(uintptr_t addr, ta_block *out);      /* exact, live table only */
/* One probe of the live table: is a the start of a live block of tag or alt? */
bool   _ta_block_check(uintptr_t a, ta_tag tag, ta_tag alt);
void   _ta_block_prefetch(const void *p);                  /* its table slot, a hint */
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

void   _ta_quarantine_drain(ta_thread *t);           /* thread exit */
void   _ta_quarantine_forget(ta_thread *t);          /* fork child: a gone thread's ring, its blocks kept */
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
 * the hooks below only when _ta_guard_on (one branch in default mode). */

struct ucontext_t;
extern bool _ta_guard_on;                    /* set by _ta_guard_init, never cleared */
void     _ta_guard_init(void);               /* _ta_init, after the options */
/* A guarded block, or NULL: then the caller takes it from jemalloc. */
void    *_ta_guard_alloc(size_t size, size_t align, bool zero);
bool     _ta_guard_owns(uintptr_t addr);     /* in a guarded region? */
/* block_free: makes a guarded block's pages PROT_NONE (instead of the
 * poison) and checks the slack past its end; false: not a guarded block. */
bool     _ta_guard_retire(const ta_block *freed);
/* Whether the slack past the guard block at addr (size bytes) was written. */
bool     _ta_guard_slack_written(uintptr_t addr, uint64_t size);
/* Instead of dallocx: the slot goes back to the free list; false: not ours. */
bool     _ta_guard_release(uintptr_t addr);
/* What a quarantined block counts against the budget (size, unless guarded). */
uint64_t _ta_guard_charge(uintptr_t addr, uint64_t size);
/* The fault handler's question: is this SIGSEGV/SIGBUS ours?  addr is
 * si_addr, uc the handler's third argument; call it only for faults the
 * kernel raised (si_code > 0).  When it returns true the fault was reported
 * and the page made accessible: return from the handler, and the faulting
 * instruction runs again.  Guard mode installs a handler (SA_SIGINFO |
 * SA_ONSTACK) that asks it first and passes other faults to the handler
 * that was installed before it, or to the default action; a handler
 * installed later (the preload shim's crash report) must ask it first. */
bool     _ta_guard_fault(void *addr, struct ucontext_t *uc);

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
/* More blocks for the scan, outside the ledger's table (the preload: the
 * runtime's live blocks); add() takes each, with no stack.  They are read
 * and counted when reachable, and left out of the numbers otherwise.
 * Called with the table held, before the other threads stop: it must take
 * no lock an allocating thread can hold across a call into the ledger. */
extern void (*_ta_scan_more)(void (*add)(uintptr_t addr, uint64_t size, ta_tag tag, void *arg), void *arg);

/* ---- trace.c ------------------------------------------------------------- */

extern bool _ta_tracing;
void _ta_trace_open(void);
void _ta_trace_close(void);              /* flushes everything (exit) */
void _ta_trace_modules(void);            /* MODULE records for mappings new since (dlclose) */
/* How the image ends (the preload: exit status, or -1 and the fatal
 * signal), written as an EXIT record at close. */
void _ta_trace_exit_status(int code, int sig);
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

/* ---- extents.c: the ledger's own mappings ------------------------------------ */

/* Mappings the ledger made for itself (the preload's raw arena records its
 * region here too): never scanned. */
/* mmap and munmap as system calls: the ledger never calls the libc symbols,
 * which the preload interposes to record the program's mappings. */
void  *_ta_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off);
int    _ta_sys_munmap(void *p, size_t len);
void  *_ta_mmap(size_t len);            /* read-write, recorded as the ledger's */
void   _ta_munmap(void *p, size_t len);
void   _ta_own_range(uintptr_t lo, uintptr_t hi);   /* a mapping made elsewhere, ours */
size_t _ta_own_ranges(uintptr_t *lo, uintptr_t *hi, size_t max);
/* Mappings the program made (the preload records its mmap, munmap, mremap):
 * roots of the scan, clipped to what is readable and resident. */
void   _ta_program_map(uintptr_t lo, uintptr_t hi);
void   _ta_program_unmap(uintptr_t lo, uintptr_t hi);
size_t _ta_program_maps(uintptr_t *lo, uintptr_t *hi, size_t max);
size_t _ta_program_maps_count(void);
void   _ta_extents_fork(int phase);

/* ---- internal memory ------------------------------------------------------ */

/* The ledger's own bookkeeping memory: jemalloc through mallocx in an arena of
 * its own, never the audited heap, never recorded. */
void *_ta_meta_alloc(size_t size);
void *_ta_meta_calloc(size_t n, size_t size);
void *_ta_meta_realloc(void *p, size_t size);
void  _ta_meta_free(void *p);
char *_ta_meta_strdup(const char *s);


#endif
