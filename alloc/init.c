/* init.c - the ledger's life: _ta_init at the first call (options, the
 * clock, guard mode, the pad, tags, fork handlers, the trace), the locks
 * taken around fork(), and the exit (the quarantine's and holds' checks,
 * the scan, the trace's end, the report). */
#include "beside.h"
#include "block.h"
#include "samples.h"

#include <stdlib.h>

_Atomic int _ta_ready;

/* ---- fork: no lock may be held across it ------------------------------------- */

/* Every lock of the ledger, in the order the code nests them, so that no
 * thread is inside the ledger when fork() copies the process. */
static void fork_phase(int phase) {
  if (phase == TA_FORK_PREPARE) {
    _ta_unwind_fork(phase);                /* first: libdw's lock comes before the ledger's */
    _ta_scan_fork(phase);
    _ta_marks_fork(phase);
    _ta_tags_fork(phase);
    _ta_trace_fork(phase);
    _ta_ref_fork(phase);
    _ta_hold_fork(phase);
    _ta_thread_fork(phase);
    _ta_beside_fork(phase);
    _ta_block_lock_all();
    _ta_device_fork(phase);
    _ta_findings_fork(phase);
    _ta_extents_fork(phase);
    _ta_depot_fork(phase);
    return;
  }
  _ta_depot_fork(phase);
  _ta_extents_fork(phase);
  _ta_findings_fork(phase);
  _ta_device_fork(phase);
  _ta_block_unlock_all();
  _ta_beside_fork(phase);
  _ta_thread_fork(phase);
  _ta_hold_fork(phase);
  _ta_ref_fork(phase);
  _ta_trace_fork(phase);
  _ta_tags_fork(phase);
  _ta_marks_fork(phase);
  _ta_scan_fork(phase);
  _ta_unwind_fork(phase);
}

static void fork_prepare(void) { fork_phase(TA_FORK_PREPARE); }
static void fork_parent(void) { fork_phase(TA_FORK_PARENT); }
static void fork_child(void) { fork_phase(TA_FORK_CHILD); }

/* ---- init and exit ---------------------------------------------------------------- */

static void ledger_exit(void);

void _ta_init(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static bool running;
  pthread_mutex_lock(&lock);
  if (!atomic_load(&_ta_ready) && !running) {
    running = true;
    _ta_options_init();
    _ta_seq_clock_init();
    _ta_samples_start();                 /* the timeline's start (samples.h) */
    _ta_guard_init();                    /* guard mode: its regions and fault handler */
    _ta_pad_check_classes();                 /* the overflow pad: the size classes as jemalloc makes them */
    atomic_store(&_ta_ready, 1);         /* what follows may call the ledger */
    _ta_tags_init();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    _ta_trace_open();
    _ta_beside_init();                   /* after the mode, guard mode and the trace are known */
  }
  pthread_mutex_unlock(&lock);
}

/* Options are read at the first ledger call (a test may set them in main);
 * the exit handler is registered here, as early as can be, so that it runs
 * after every handler the program registers later (C++ destructors, ...). */
__attribute__((constructor(101))) static void ledger_ctor(void) { atexit(ledger_exit); }

static ta_reporter_fn *reporter;
void ta_reporter_set(ta_reporter_fn *fn) { reporter = fn; }

void ta_report_now(void) {
  if (!reporter) return;
  ta_thread *t = _ta_thread();          /* the symbolizer's allocations are the ledger's */
  t->guard++;
  ta_thread *host = _ta_host_enter();
  reporter(2);
  _ta_host_leave(host);
  t->guard--;
}

static atomic_int exit_done;
void (*_ta_exit_before)(void);
uintptr_t   _ta_exit_sp;
const void *_ta_exit_regs;
size_t      _ta_exit_regs_size;

void _ta_exit_now(bool again) {
  if (!atomic_load(&_ta_ready)) return;     /* the ledger was never used */
  if (atomic_exchange(&exit_done, 1) && !again) return;
  _ta_device_exit();                        /* ta_atexit functions, then gpu.leak */
  if (_ta_exit_before) _ta_exit_before();   /* the preload: the runtime's blocks go */
  ta_thread *t = _ta_thread();
  t->guard++;
  ta_thread *host = _ta_host_enter();     /* a copy of the ledger under the preload */
  _ta_quarantine_check_all();
  _ta_hold_exit();
  if (_ta_opt.scan_at_exit) {
    /* The roots: a fatal signal's (set by the preload), or where the
     * program called exit, _exit or exec (scan.c); the caller's frame when
     * neither is known (ta_scan's roots). */
    bool here = false;
    if (!_ta_exit_sp) {
      _ta_stop_init();
      here = _ta_stop_find(NULL);
    }
    if (_ta_exit_sp)
      _ta_scan_impl(_ta_exit_sp, _ta_exit_regs, _ta_exit_regs_size, true);
    else
      _ta_scan_exit();
    if (here) _ta_exit_sp = 0;          /* an exec that fails goes on */
  }
  _ta_trace_close();
  if (_ta_opt.report && reporter && !_ta_host_quiet()) reporter(2);
  _ta_host_leave(host);
  t->guard--;
}

bool _ta_exit_late;
static void ledger_exit(void) {
  if (!_ta_exit_late) _ta_exit_now(false);
}
