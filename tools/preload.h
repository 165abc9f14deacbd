/* preload.h - what the files of the LD_PRELOAD shim share (tools/preload*.c).
 *
 * The shim's files:
 *   preload.c        the allocation functions (malloc ... operator delete),
 *                    the recursion guard, the raw path and its bootstrap;
 *   preload_raw.c    raw memory: a jemalloc arena of its own whose extents
 *                    all come from one reserved address range, so "is this
 *                    pointer raw?" is a range check;
 *   preload_exit.c   how a process image ends: exit status, fork, _exit,
 *                    the exit work, the label and stderr of the report,
 *                    dlclose, the constructor;
 *   preload_signal.c fatal and termination signals (sigaction/signal
 *                    interposed), abort;
 *   preload_exec.c   exec and posix_spawn: the exit work before an exec,
 *                    the environment passed on;
 *   preload_map.c    the program's own mappings (mmap, munmap, mremap),
 *                    roots of the scan;
 *   preload_cuda.c   the CUDA driver's device memory (it includes
 *                    alloc/internal.h: the depot, the unwinder, device.c).
 *
 * Of the ledger they include only what the shim uses (alloc/attrs.h,
 * options.h, errors.h, thread.h, extents.h, shim.h), not internal.h.
 *
 * Every thread-local of the shim uses the initial-exec TLS model: a
 * global-dynamic access may call __tls_get_addr, which may call malloc. */
#ifndef TAGALLOC_PRELOAD_H
#define TAGALLOC_PRELOAD_H

#include "attrs.h"
#include "errors.h"
#include "extents.h"
#include "options.h"
#include "shim.h"
#include "tagalloc.h"
#include "thread.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PL_TLS    __thread __attribute__((tls_model("initial-exec")))
#define PL_EXPORT __attribute__((visibility("default"), noinline))

/* ---- preload_raw.c ------------------------------------------------------- */

/* Raw memory: what the shim serves while the ledger cannot run (before libc
 * is initialised, inside the ledger, in a thread whose ledger state is gone).
 * A raw pointer is freed silently wherever it is freed. */
extern uintptr_t _pl_raw_lo, _pl_raw_len;          /* 0, 0 until the first raw allocation */
extern _Atomic uint32_t _pl_stray_n;               /* raw blocks outside the range (see there) */
bool _pl_stray_has(const void *p);
static inline bool _pl_is_raw(const void *p) {
  return (uintptr_t)p - _pl_raw_lo < _pl_raw_len ||
         (TA_UNLIKELY(atomic_load_explicit(&_pl_stray_n, memory_order_relaxed) != 0) && _pl_stray_has(p));
}
/* runtime: a block of the runtime's (a root of the scan), not the ledger's
 * own (see preload_raw.c).  NULL: out of memory. */
/* runtime: from the runtime's half (else the ledger's own); counted: one of
 * the runtime's blocks the exit scan counts (not one the ledger's own work
 * made, such as ld.so's when libdw dlopens a library). */
void  *_pl_raw_alloc(size_t size, size_t align, bool zero, bool runtime, bool counted);
void  *_pl_raw_realloc(void *p, size_t size);
void   _pl_raw_free(void *p);
size_t _pl_raw_usable(const void *p);

/* ---- preload.c ----------------------------------------------------------- */

/* Enters the ledger from the shim: the calling thread's state with its
 * guard raised, or NULL when the ledger must not be called now (it is not
 * ready, this thread is already inside it, or the thread is exiting). */
ta_thread *_pl_enter(void);
/* A termination signal that arrived inside the ledger (preload_signal.c):
 * delivered again when its thread leaves the ledger. */
extern volatile int _pl_pending_term;
void _pl_term_pending(void);
static inline void _pl_leave(ta_thread *t) {
  t->guard--;
  if (TA_UNLIKELY(_pl_pending_term != 0) && t->guard == 0) _pl_term_pending();
}
/* Is the ledger running in this process (the first allocation after libc's
 * initialisation made it so)? */
bool _pl_ledger_live(void);
void _pl_early_maps_record(void);                   /* preload_map.c: mappings made before it */
/* Frees that an exiting thread left for later: done now (guard held). */
void _pl_drain_deferred(void);
/* The constructor has run: the preload's own libraries no longer allocate. */
void _pl_ctor_done(void);
/* In a fork child: the shim's spin locks, which another thread of the
 * parent may have held at the fork, are free. */
void _pl_fork_child_locks(void);
void _pl_raw_fork_child(void);
bool _pl_own_code(uintptr_t ra);                    /* the preload's or its own libraries' code */
extern ta_tag _pl_runtime_tag;                      /* "runtime": the runtime's live blocks */
void _pl_runtime_blocks(void (*add)(uintptr_t addr, uint64_t size, ta_tag tag, void *arg), void *arg);

/* ---- preload_exit.c: how an image ends ----------------------------------- */

/* The pid the shim's process state belongs to (a vfork child has another). */
extern volatile int _pl_pid;
/* Runs the exit work of this process image once: scan, report, trace.
 * Safe to call from a fatal signal (does nothing when the thread is inside
 * the ledger). */
void _pl_exit_work(void);
/* Set on the thread that frees the runtime's own blocks at exit (libc's
 * and libstdc++'s freeres): those frees record no stack. */
extern PL_TLS bool _pl_in_freeres;
extern int _pl_exit_code;        /* the status given to exit/_exit; -1: none (an exec, a crash) */
extern int _pl_fatal_signal;     /* the signal that ends the process; 0: none */
extern int _pl_exec_suffix;      /* N of the trace's "PID.N" while an exec is under way; 0: none */
/* dlsym(RTLD_NEXT, name), its allocations raw. */
void *_pl_next_sym(const char *name);
/* pattern with "%p" made the pid ("PID.N" for suffix N > 0) into out;
 * false when it does not fit. */
bool _pl_expand_path(const char *pattern, int suffix, char *out, size_t len);
bool _pl_has_pid(const char *pattern);
/* A fork child that leaves nothing of its own (a fork+exec helper), and
 * the end of its trace (removed: its image is its parent's). */
bool _pl_quiet_fork_child(void);
void _pl_quiet_end(void);

/* ---- preload_signal.c: fatal and termination signals --------------------- */

/* The shim's handlers installed, abort() looked up (the constructor). */
void _pl_signals_init(void);
/* In a fork child: the locks of the signal state free again. */
void _pl_signals_fork_child(void);
extern volatile int _pl_in_abort;   /* SIGABRT comes from abort() */

/* ---- preload_exec.c: exec, posix_spawn, the environment passed on -------- */

/* The real exec functions, this library's path, the TAGALLOC_* variables
 * kept for the programs this one executes (the constructor). */
void _pl_exec_init(void);

#endif
