/* preload_signal.c - the shim and signals: a crash or a termination signal
 * does the exit work (preload_exit.c) before the process dies of it.
 *
 * Crashes.  The exit work of a fatal signal runs on a stack of its own,
 * with the interrupted code's stack pointer and registers as the thread's
 * roots (the handler may run on a small alternate stack).
 *
 * Termination signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are handled as
 * the fatal ones below, as sent signals: while the program's action is the
 * default, one that arrives does the exit work (the roots: the interrupted
 * context), then the process dies of it; a handler of the program's runs
 * instead (nothing is reported unless it exits); an ignored one is ignored
 * by the kernel itself (the program's SIG_IGN is installed for real, so an
 * exec'd program inherits it), and the program's SA_RESTART is kept (an
 * interrupted read returns EINTR when the program asked for that).  One
 * that arrives while its thread is inside the ledger waits until the thread
 * leaves it (_pl_leave).  A second one while the report is being made (a
 * second Ctrl-C) ends the process at once, without the rest of it.
 *
 * Fatal signals (SIGSEGV, SIGBUS, SIGABRT, SIGFPE).  The shim's handler is
 * installed at load and stays installed: sigaction/signal/bsd_signal/
 * sysv_signal are interposed for these four signals, and record what the
 * program asks for ("the program's action") instead of installing it, and
 * report it back.  When one arrives, guard mode's fault handler is asked
 * first (its own page faults); then the program's handler runs, with its
 * mask and flags (SA_RESETHAND, SA_NODEFER, SA_SIGINFO), and if it returns
 * the program has handled the signal (a JIT's trap, a GC barrier): nothing
 * else happens.  When the signal is going to kill the process - the
 * program's action is the default, or it ignores a fault, or abort() is
 * calling - the exit work runs, then the default action is restored and the
 * signal goes on: a fault re-executes the instruction, a sent signal is
 * raised again, so the process dies of the same signal (same status, same
 * core).  A second thread that crashes meanwhile waits for the first.
 * abort() is interposed only to mark that SIGABRT is abort's (a handler
 * that returns does not stop abort); glibc's own internal aborts (assert,
 * stack protector) arrive as a plain SIGABRT and work the same unless the
 * program has a SIGABRT handler that returns. */
#include "preload.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* ---- fatal signals --------------------------------------------------------------------- */

volatile int _pl_in_abort;                 /* SIGABRT comes from abort() */
static atomic_int act_lock;                /* prog_action (below) */
static atomic_int dying;                   /* tid of the thread doing the crash's exit work */

typedef void (*abort_fn)(void);
static abort_fn real_abort;
extern int __sigaction(int, const struct sigaction *, struct sigaction *);

void _pl_signals_fork_child(void) {
  atomic_store(&act_lock, 0);
  atomic_store(&dying, 0);
  _pl_in_abort = 0;
}

static const int fatal_sigs[] = { SIGSEGV, SIGBUS, SIGABRT, SIGFPE };
#define NSIGS 65
static struct sigaction prog_action[NSIGS];     /* what the program asked for */
static volatile bool ours[NSIGS];               /* the shim's handler is installed */

static void alock(void) { while (atomic_exchange_explicit(&act_lock, 1, memory_order_acquire)) {} }
static void aunlock(void) { atomic_store_explicit(&act_lock, 0, memory_order_release); }

static bool is_term(int sig);
/* The sigqueue value of `tagalloc run`'s copy of a termination signal it
 * got (the same in tools/tagalloc_run.c). */
#define TA_RELAY_VALUE 0x74616c6c

static bool is_handler(const struct sigaction *a) {
  return a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN;
}

/* The exit work of a crash runs on a stack of its own: the handler may be on
 * a small alternate stack (guard mode sets one per thread; a program that
 * handles stack overflow has one), and the scan and the symbolizer need
 * room.  The interrupted code's stack pointer and registers are the
 * thread's roots (_ta_exit_sp). */
#define CRASH_STACK (16u << 20)
static ucontext_t crash_ctx, crash_back;

static PL_TLS ucontext_t *first_uc;      /* the outermost fatal signal's context */

/* The interrupted code's context, if its stack pointer is on the thread's
 * stack: the outermost fatal signal's, so that a handler that raises it
 * again (Python's faulthandler, on an alternate stack; the trace's flush
 * handler, chained as the program's) adds no frames of its own; else the
 * signal's. */
static ucontext_t *roots_context(ucontext_t *uc) {
  uintptr_t lo = 0, hi = 0;
  _ta_thread_stack(&lo, &hi);
  ucontext_t *c[2] = { first_uc, uc };
  for (int i = 0; i < 2; i++) {
    uintptr_t sp = c[i] ? (uintptr_t)c[i]->uc_mcontext.gregs[REG_RSP] : 0;
    if (sp >= lo && sp < hi) return c[i];
  }
  return NULL;
}

static void crash_exit_work(ucontext_t *uc) {
  uintptr_t lo = 0, hi = 0;
  _ta_thread_stack(&lo, &hi);
  ucontext_t *r = roots_context(uc);
  if (r && _ta_stop_find(r)) {
    /* the program's frame that called abort/raise/kill, or the context */
  } else if (r) {
    _ta_exit_sp = (uintptr_t)r->uc_mcontext.gregs[REG_RSP];
    _ta_exit_regs = r->uc_mcontext.gregs;
    _ta_exit_regs_size = sizeof r->uc_mcontext.gregs;
  } else if (hi) {
    /* Nowhere on this thread's stack (bounds unknown to the context):
     * its registers only; never the scan's own stack, which is elsewhere. */
    _ta_exit_sp = hi;
    _ta_exit_regs = uc ? (const void *)uc->uc_mcontext.gregs : NULL;
    _ta_exit_regs_size = uc ? sizeof uc->uc_mcontext.gregs : 0;
  }
  void *stk = _ta_sys_mmap(NULL, CRASH_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (stk == MAP_FAILED || getcontext(&crash_ctx) != 0) {
    _pl_exit_work();
    return;
  }
  _ta_own_range((uintptr_t)stk, (uintptr_t)stk + CRASH_STACK);
  crash_ctx.uc_stack.ss_sp = stk;
  crash_ctx.uc_stack.ss_size = CRASH_STACK;
  crash_ctx.uc_link = &crash_back;
  makecontext(&crash_ctx, _pl_exit_work, 0);
  swapcontext(&crash_back, &crash_ctx);
}

/* The signal kills the process now: the exit work, then the default action. */
static void die_of(int sig, bool sent, ucontext_t *uc) {
  int me = (int)syscall(SYS_gettid), zero = 0;
  if (!atomic_compare_exchange_strong(&dying, &zero, me) && zero != me) {
    if (!is_term(sig))
      for (;;) pause();                   /* another thread reports; it will end us all */
    /* a second termination signal while another thread reports: now */
  }
  if (zero == 0) {                        /* the first time in the process */
    _pl_fatal_signal = sig;
    _pl_exit_code = -1;
    crash_exit_work(uc);
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  __sigaction(sig, &dfl, NULL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  if (sent) {
    raise(sig);
    syscall(SYS_tgkill, getpid(), me, sig);
  }
  /* a fault: returning runs the faulting instruction again, with the
   * default action in place */
}

static void on_fatal(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  ucontext_t *outer = first_uc;
  /* kill, raise, tgkill, sigqueue; a termination signal is never a fault
   * (the terminal's come from the kernel) */
  bool sent = is_term(sig) || si == NULL || si->si_code <= 0;
  if (is_term(sig) && si && si->si_code == SI_QUEUE && si->si_value.sival_int == TA_RELAY_VALUE &&
      si->si_pid == getppid() && atomic_load(&dying) != 0) {
    errno = saved;                        /* tagalloc run's copy of the signal we got */
    return;
  }
  if (is_term(sig) && atomic_load(&dying) == 0 && !is_handler(&prog_action[sig])) {
    ta_thread *t = _ta_self;
    if (t && t->guard > 0) {              /* inside the ledger: when it leaves */
      _pl_pending_term = sig;
      errno = saved;
      return;
    }
  }
  if (outer == NULL) first_uc = uc;
  if (!sent && (sig == SIGSEGV || sig == SIGBUS) && _ta_guard_on &&
      _ta_guard_fault(si->si_addr, (struct ucontext_t *)uc)) {
    first_uc = outer;
    errno = saved;
    return;                               /* guard mode's own fault, reported */
  }
  struct sigaction pa = prog_action[sig];
  bool from_abort = sig == SIGABRT && _pl_in_abort;
  if (is_handler(&pa)) {
    if (pa.sa_flags & SA_RESETHAND) {
      alock();
      prog_action[sig].sa_handler = SIG_DFL;
      prog_action[sig].sa_flags &= ~(SA_SIGINFO | SA_RESETHAND);
      aunlock();
    }
    sigset_t mask = pa.sa_mask, old;
    if (!(pa.sa_flags & SA_NODEFER)) sigaddset(&mask, sig);
    pthread_sigmask(SIG_BLOCK, &mask, &old);
    errno = saved;
    if (pa.sa_flags & SA_SIGINFO) pa.sa_sigaction(sig, si, uc);
    else pa.sa_handler(sig);
    saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!from_abort) {                    /* handled: the program goes on */
      first_uc = outer;
      errno = saved;
      return;
    }
  } else if (pa.sa_handler == SIG_IGN && sent && !from_abort) {
    first_uc = outer;
    errno = saved;
    return;                               /* ignored (a fault cannot be) */
  }
  die_of(sig, sent || from_abort, (ucontext_t *)uc);
  first_uc = outer;
  errno = saved;
}

static void install_fatal_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof fatal_sigs / sizeof *fatal_sigs; i++) {
    int sig = fatal_sigs[i];
    struct sigaction old;
    alock();
    if (__sigaction(sig, &sa, &old) == 0) {
      prog_action[sig] = old;             /* what was there: the program's (or guard mode's) */
      ours[sig] = true;
    }
    aunlock();
  }
}

/* ---- termination signals ----------------------------------------------------------------- */

static const int term_sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };

static bool is_term(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

volatile int _pl_pending_term;

/* The thread that got a termination signal inside the ledger has left it. */
void _pl_term_pending(void) {
  int sig = _pl_pending_term;
  _pl_pending_term = 0;
  if (sig) raise(sig);
}

/* What the kernel gets for the program's action on a termination signal:
 * SIG_IGN as it is; otherwise the shim's handler, with the program's
 * SA_RESTART. */
static int apply_term(int sig, const struct sigaction *act) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  if (act->sa_handler == SIG_IGN && !(act->sa_flags & SA_SIGINFO)) {
    sa.sa_handler = SIG_IGN;
  } else {
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER | (act->sa_flags & SA_RESTART);
  }
  sigemptyset(&sa.sa_mask);
  return __sigaction(sig, &sa, NULL);
}

static void install_term_handlers(void) {
  for (size_t i = 0; i < sizeof term_sigs / sizeof *term_sigs; i++) {
    int sig = term_sigs[i];
    struct sigaction old;
    alock();
    if (__sigaction(sig, NULL, &old) == 0 && apply_term(sig, &old) == 0) {
      prog_action[sig] = old;             /* what was there: inherited (SIG_IGN under nohup) */
      ours[sig] = true;
    }
    aunlock();
  }
}

PL_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (sig > 0 && sig < NSIGS && ours[sig]) {
    alock();
    if (old) *old = prog_action[sig];
    if (act) prog_action[sig] = *act;
    if (act && is_term(sig)) apply_term(sig, act);
    aunlock();
    return 0;
  }
  return __sigaction(sig, act, old);
}

static sighandler_t set_handler(int sig, sighandler_t h, int flags, bool block_self) {
  struct sigaction a, o;
  memset(&a, 0, sizeof a);
  a.sa_handler = h;
  a.sa_flags = flags;
  sigemptyset(&a.sa_mask);
  if (block_self && sig > 0 && sig < NSIGS) sigaddset(&a.sa_mask, sig);
  if (h == SIG_ERR || sigaction(sig, &a, &o) < 0) {
    errno = EINVAL;
    return SIG_ERR;
  }
  return o.sa_handler;
}

/* BSD semantics (glibc's signal): SA_RESTART, the signal blocked in its handler. */
PL_EXPORT sighandler_t signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART, true); }
PL_EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART, true); }
/* System V semantics: reset to the default on delivery, not blocked. */
PL_EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) {
  return set_handler(sig, h, SA_RESETHAND | SA_NODEFER, false);
}
PL_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t h) {
  return set_handler(sig, h, SA_RESETHAND | SA_NODEFER, false);
}

void _pl_signals_init(void) {
  void *s = _pl_next_sym("abort");
  memcpy(&real_abort, &s, sizeof s);
  install_fatal_handlers();
  install_term_handlers();
}

PL_EXPORT void abort(void) {
  _pl_in_abort = 1;
  if (real_abort) real_abort();
  raise(SIGABRT);
  for (;;) syscall(SYS_exit_group, 128 + SIGABRT);
}

