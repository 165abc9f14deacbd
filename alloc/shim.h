/* shim.h - the ledger's internal calls the LD_PRELOAD shim makes
 * (tools/preload*.c), grouped by the file that defines them: its entry
 * points (the shim captures the stack), the exit work, init, and the
 * hooks of guard mode, the scan, the trace and the unwinder it calls.
 * internal.h includes it for the ledger's own files. */
#ifndef TAGALLOC_SHIM_H
#define TAGALLOC_SHIM_H

#include "attrs.h"
#include "tagalloc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The LD_PRELOAD shim's entry points (ledger.c): the shim captures the stack. */
void *_ta_alloc_at(ta_tag tag, size_t size, size_t align, bool zero, uint32_t stack);
/* The same in two steps, so that the stack is taken between them while
 * the block's table slot loads: the memory (NULL on failure), then its
 * record (raw may be NULL: the error is reported there). */
void *_ta_alloc_raw(size_t size, size_t align, bool zero);
void *_ta_alloc_record(void *raw, ta_tag tag, size_t size, bool zero, uint32_t stack);
/* In leaks mode a block of at most 4080 bytes keeps its record beside it
 * (beside.h): where _ta_beside_on, malloc's, calloc's and operator new's
 * blocks that small come from _ta_alloc_beside (the stack taken first);
 * _ta_beside_usable: whether p is such a block, and its bytes asked for
 * (malloc_usable_size outside the ledger). */
extern TA_HIDDEN bool _ta_beside_on;
#define TA_BESIDE_MAX 4080
void *_ta_alloc_beside(ta_tag tag, size_t size, bool zero, uint32_t stack);
bool _ta_beside_usable(const void *p, size_t *n);
bool  _ta_free_at(void *p, uint32_t stack);                 /* false: a bad free, reported */
bool  _ta_free_quiet(void *p);          /* leaks mode, no stack: false for a bad free, not reported, nothing done */
void *_ta_realloc_at(ta_tag tag, void *p, size_t size, uint32_t stack);
/* The exit work (scan, report, trace), callable early: _exit, a fatal
 * signal, exec.  Runs once per process image unless `again`. */
void  _ta_exit_now(bool again);
/* Set by the preload, which runs the exit work of exit() and a return from
 * main itself, later (after ld.so's _dl_fini): the ledger's atexit handler
 * then does nothing. */
extern bool _ta_exit_late;
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

/* ---- init.c ---------------------------------------------------------------- */

void _ta_init(void);                              /* idempotent */
extern _Atomic int _ta_ready;
static inline void _ta_ensure(void) {
  if (TA_UNLIKELY(!atomic_load_explicit(&_ta_ready, memory_order_acquire))) _ta_init();
}

/* ---- live.c ------------------------------------------------------------------ */

void   _ta_block_prefetch(const void *p);                  /* its table slot, a hint */

/* ---- guard.c: what the shim asks of guard mode (internal.h has the rest) ----- */

struct ucontext_t;
extern bool _ta_guard_on;                    /* set by _ta_guard_init, never cleared */
bool     _ta_guard_owns(uintptr_t addr);     /* in a guarded region? */
/* The fault handler's question: is this SIGSEGV/SIGBUS ours?  addr is
 * si_addr, uc the handler's third argument; call it only for faults the
 * kernel raised (si_code > 0).  When it returns true the fault was reported
 * and the page made accessible: return from the handler, and the faulting
 * instruction runs again.  Guard mode installs a handler (SA_SIGINFO |
 * SA_ONSTACK) that asks it first and passes other faults to the handler
 * that was installed before it, or to the default action; a handler
 * installed later (the preload shim's crash report) must ask it first. */
bool     _ta_guard_fault(void *addr, struct ucontext_t *uc);

/* ---- scan.c ------------------------------------------------------------------ */

/* More blocks for the scan, outside the ledger's table (the preload: the
 * runtime's live blocks); add() takes each, with no stack.  They are read
 * and counted when reachable, and left out of the numbers otherwise.
 * Called with the table held, before the other threads stop: it must take
 * no lock an allocating thread can hold across a call into the ledger. */
extern void (*_ta_scan_more)(void (*add)(uintptr_t addr, uint64_t size, ta_tag tag, void *arg), void *arg);

/* ---- trace.c ----------------------------------------------------------------- */

void _ta_trace_close(void);              /* flushes everything (exit) */
int  _ta_trace_fd(void);                 /* its descriptor, or -1 */
void _ta_trace_modules(void);            /* MODULE records for mappings new since (dlclose) */
/* How the image ends (the preload: exit status, or -1 and the fatal
 * signal), written as an EXIT record at close. */
void _ta_trace_exit_status(int code, int sig);

/* ---- unwind.c ---------------------------------------------------------------- */

/* Forget cached rules in [lo, hi) (a module was unloaded). */
void   _ta_unwind_forget(uintptr_t lo, uintptr_t hi);

#endif
