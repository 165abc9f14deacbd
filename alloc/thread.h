/* thread.h - a block's record and a thread's state (thread.c): the
 * registry, the recursion guard, the per-thread counters and births, and
 * solo mode. */
#ifndef TAGALLOC_THREAD_H
#define TAGALLOC_THREAD_H

#include "attrs.h"
#include "tagalloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ledger.c: a block's record ------------------------------------------ */

enum { TA_LIVE = 1, TA_FREED = 2 };               /* ta_block.state */
/* The byte written past a block's requested size, in its size class's
 * slack (ledger.c: the overflow check); mimalloc's padding byte. */
#define TA_PAD_BYTE 0xDE
enum {                                            /* ta_block.flags */
  TA_F_REF   = 1,   /* has a refcount record (ref.c) */
  TA_F_HOLD  = 2,   /* holds something, or is held (hold.c) */
  TA_F_ARENA = 4,   /* lives in an arena chunk: not freeable, dies at reset */
  TA_F_BESIDE = 8,  /* its record is the 16 bytes before it, not a table slot (beside.h); never in the table */
};

/* A block's whole record: the quarantine's ring and the recent frees
 * (quarantine.c) hold these, and the live table hands out copies of them
 * (_ta_block_live, _ta_block_each).  The table itself keeps each live
 * block in 24 bytes (ta_slot, live.h): no state (all live) and no free
 * stack (a block gets one when it leaves the table).  32 bytes: two
 * records a cache line.  A size fits 48 bits (no allocation is larger
 * than the 47-bit address space) and the sequence 56 bits (2^56 events,
 * or of the TSC's 16-tick units that number several threads' events: 14
 * years at 2.6 GHz). */
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

/* ---- thread.c ------------------------------------------------------------ */

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
  _Atomic uintptr_t left_sp;   /* where it left its own stack for a context of the program's
                                  (swapcontext, setcontext: the preload): its frames above
                                  are live; 0: on it, or not known */
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

#endif
