/* preload_proc.c - the shim's process life: how a process image ends, and
 * what it leaves for `tagalloc run`.
 *
 * Exit status.  exit() and a return from main reach the ledger's atexit
 * handler, which runs when _dl_fini finalizes this library (atexit in a
 * shared library is tied to it).  An on_exit handler records the status
 * first: it is registered when main starts (__libc_start_main is
 * interposed to start main through a hook that tail-calls it, so no frame
 * of ours stays under main), after _dl_fini's registration, so it runs
 * before it.  _exit/_Exit/quick_exit are interposed: the exit work
 * (quarantine check, scan, report, trace) runs, then the real exit.
 * Before the scan, the runtime's own blocks are freed, as memcheck's
 * freeres does (see exit_before).
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
 * program has a SIGABRT handler that returns.
 *
 * fork.  The ledger's atfork handlers keep it consistent; trace.c opens a
 * trace per child ("%p").  The shim's child handler (registered after the
 * ledger's, so it runs after them) notes the new pid and takes a mark.  A
 * child that execs or _exits having left nothing of its own - no block made
 * since the fork still live, no new error - is a fork+exec helper (a shell,
 * make, posix_spawn fallbacks): its report would be its parent's heap
 * again, so it reports nothing and removes its trace.  Any other child
 * reports as its own process (label and trace with its pid).
 *
 * exec (execve, execv, execvp, execvpe, execl, execlp, execle, fexecve,
 * execveat).  When the exec will probably succeed (the file, or the PATH
 * search, finds an executable regular file), the exit work runs for the
 * image that is going away, and its trace is named "%p" ->
 * "PID.N" (N = 1, 2, ... the first free), so that the next image, with the
 * same pid, does not overwrite them.  If the exec fails after all, the
 * names go back to "PID" and the program goes on (its report stays the one
 * made at the exec).  The environment passed on: with TAGALLOC_FOLLOW=0 the
 * preload is taken out of LD_PRELOAD (and out of the process's own
 * environment at load, for system(), popen(), posix_spawn); otherwise
 * LD_PRELOAD and the TAGALLOC_* variables are put back when the program
 * passes an environment without them.  posix_spawn/posix_spawnp get the
 * same environment treatment.  A vfork child (no atfork handler ran: its
 * pid is not the shim's) is not an image of its own: nothing but the
 * environment, built on the stack.
 *
 * dlclose.  Before the library goes, its mappings are written to the trace
 * (MODULE records); after, if it is really gone, its path and load bias
 * are remembered for the exit symbolizer (report_module_unloaded), and the
 * unwinder forgets its rules.  dlopen is not interposed: glibc's dlopen
 * searches the caller's DT_RUNPATH, which a wrapper would hide; libraries
 * still loaded are written to the trace at exit, unloaded ones at dlclose.
 *
 * Output.  The text report goes to the stderr the process had when the
 * preload loaded (a descriptor of its own, close-on-exec: coreutils and
 * others close fd 2 at exit), or to fd 2 when that one is gone; it starts
 * with a label line "==PID== tagalloc: PROGRAM ARGS (parent PPID)".  The
 * ledger's messages go there too, but for failed allocations of the
 * program's (it gets NULL/ENOMEM as from glibc).  The findings leave the
 * process once, in its trace (alloc/trace.c: FINDING, REF_SITE, SUMMARY and
 * END records at exit; `tagalloc run` asks for an exit-only trace when no
 * output needs the events): the JSON, the page and the folded stacks are
 * made from it by the command-line tool. */
#include "preload.h"
#include "report.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

extern char **environ;

volatile int _pl_pid;

/* ---- the real functions ------------------------------------------------------ */

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*execveat_fn)(int, const char *, char *const[], char *const[], int);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
typedef int (*dlclose_fn)(void *);
typedef void (*abort_fn)(void);

static execve_fn real_execve, real_execvpe;
static fexecve_fn real_fexecve;
static execveat_fn real_execveat;
static spawn_fn real_posix_spawn, real_posix_spawnp;
static dlclose_fn real_dlclose;
static abort_fn real_abort;

extern int __sigaction(int, const struct sigaction *, struct sigaction *);

static void *next_sym(const char *name) {
  ta_thread *t = _pl_enter();             /* dlsym's allocations are raw */
  void *p = dlsym(RTLD_NEXT, name);
  if (t) _pl_leave(t);
  return p;
}

#define RESOLVE(var, name) do { void *s_ = next_sym(name); memcpy(&var, &s_, sizeof s_); } while (0)

static void resolve_all(void) {
  static atomic_int done;
  if (atomic_load(&done)) return;
  RESOLVE(real_execve, "execve");
  RESOLVE(real_execvpe, "execvpe");
  RESOLVE(real_fexecve, "fexecve");
  RESOLVE(real_execveat, "execveat");
  RESOLVE(real_posix_spawn, "posix_spawn");
  RESOLVE(real_posix_spawnp, "posix_spawnp");
  RESOLVE(real_dlclose, "dlclose");
  RESOLVE(real_abort, "abort");
  atomic_store(&done, 1);
}

/* ---- how this image ends ---------------------------------------------------------- */

static int exit_code = -1;                 /* the status given to exit/_exit; -1: none */
static int fatal_signal;                   /* the signal that ends the process; 0: none */
static int exec_suffix;                    /* N of "PID.N" while an exec is under way; 0: none */
static volatile int in_abort;              /* SIGABRT comes from abort() */

static atomic_int act_lock;                     /* prog_action (below) */
static atomic_int dying;                        /* tid of the thread doing the crash's exit work */

/* fork children */
static bool image_forked;
static ta_mark fork_mark;
static uint64_t fork_errors;

/* ---- paths ("%p" -> pid, or pid.N) ------------------------------------------------- */

static bool expand_path(const char *pattern, int suffix, char *out, size_t len) {
  if (!pattern) return false;
  size_t o = 0;
  for (const char *p = pattern; *p; p++) {
    if (o + 32 >= len) return false;
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)(suffix ? _ta_snprintf(out + o, len - o, "%d.%d", (int)getpid(), suffix)
                           : _ta_snprintf(out + o, len - o, "%d", (int)getpid()));
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
  return true;
}

static bool has_pid(const char *pattern) { return pattern && strstr(pattern, "%p") != NULL; }

static bool path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- the label and the argv --------------------------------------------------------- */

static char cmdline[16384];
static size_t cmdline_len;

static void read_cmdline(void) {
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  cmdline_len = 0;
  if (fd < 0) return;
  ssize_t r;
  while (cmdline_len + 1 < sizeof cmdline &&
         (r = read(fd, cmdline + cmdline_len, sizeof cmdline - 1 - cmdline_len)) > 0)
    cmdline_len += (size_t)r;
  close(fd);
  cmdline[cmdline_len] = '\0';
}

/* stderr as it was at load (see the top). */
static int err_fd = -1;
static dev_t err_dev;
static ino_t err_ino;

static void keep_stderr(void) {
  struct stat st;
  if (fstat(2, &st) != 0) return;
  int fd = fcntl(2, F_DUPFD_CLOEXEC, 1000);
  if (fd < 0) fd = fcntl(2, F_DUPFD_CLOEXEC, 100);
  if (fd < 0) return;
  err_fd = fd;
  err_dev = st.st_dev;
  err_ino = st.st_ino;
}

static int report_fd(void) {
  struct stat st;
  if (err_fd >= 0 && fstat(err_fd, &st) == 0 && st.st_dev == err_dev && st.st_ino == err_ino) return err_fd;
  return 2;
}

/* The reporter under the preload: the label line, then the text report, on
 * the stderr the process started with (the ledger passes fd 2). */
static void preload_reporter(int fd) {
  fd = report_fd();
  char line[4096 + 128];
  read_cmdline();
  int n = _ta_snprintf(line, sizeof line, "==%d== tagalloc: ", (int)getpid());
  for (size_t i = 0; i < cmdline_len && (size_t)n < sizeof line - 100; i++) {
    unsigned char c = (unsigned char)cmdline[i];
    line[n++] = c == '\0' ? ' ' : c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  while (n > 0 && line[n - 1] == ' ') n--;
  if (cmdline_len == 0) n += _ta_snprintf(line + n, sizeof line - (size_t)n, "?");
  n += _ta_snprintf(line + n, sizeof line - (size_t)n, " (parent %d)", (int)getppid());
  if (fatal_signal) {
    const char *abbrev = sigabbrev_np(fatal_signal);
    n += abbrev ? _ta_snprintf(line + n, sizeof line - (size_t)n, ", killed by SIG%s", abbrev)
                : _ta_snprintf(line + n, sizeof line - (size_t)n, ", killed by signal %d", fatal_signal);
  }
  line[n++] = '\n';
  _ta_write_all(fd, line, (size_t)n);
  report_source src;
  report_source_ledger(&src);
  report_process_info info = { .ppid = -1, .exit_code = exit_code, .signal = fatal_signal,
                               .clean_exit = fatal_signal ? 0 : 1 };   /* the report names the signal */
  report_text_render_info(fd, &src, &info);
}

/* The ledger's messages go where the report goes.  An allocation the
 * program asked for and jemalloc could not make is not one: the program
 * gets NULL and ENOMEM (or std::bad_alloc) and says what it wants, as it
 * would without the auditor. */
static void preload_error(int code, const char *message, void *arg) {
  (void)arg;
  if (code == TA_ENOMEM && strncmp(message, "out of memory allocating ", 25) == 0) return;
  char line[600];
  int n = _ta_snprintf(line, sizeof line, "tagalloc: %s\n", message);
  _ta_write_all(report_fd(), line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* ---- the exit work ------------------------------------------------------------------- */

/* The runtime's own blocks are not the program's: before the scan they are
 * freed, as memcheck does at exit (--run-cxx-freeres, --run-libc-freeres):
 * libstdc++'s emergency exception pool, and libc's stdio buffers, locale
 * data, NSS and resolver state.  libc's only when the process is about to
 * end for good - exit(), _exit() - not before an exec (which may fail, and
 * the program goes on) nor in a crash's handler (freeres takes stdio's
 * locks).  After it, stdio still works (unbuffered) and the locale is "C",
 * for the destructors that run after the ledger's exit handler.  Looked up
 * at load (dlsym is no function for a crash's handler). */
static void (*cxx_freeres_fn)(void);
extern void __libc_freeres(void);
static bool libc_freeres_ok;

PL_TLS bool _pl_in_freeres;

/* The runtime's frees record no stack: nobody reads it (these blocks were
 * never the program's), and a walk through __libc_freeres meets code
 * whose unwind rule the exact walker leaves to libunwind, which first
 * clears a 256 KiB cache of its own: 64 fresh pages in every process. */
static void exit_before(void) {
  _pl_in_freeres = true;
  if (cxx_freeres_fn) cxx_freeres_fn();
  if (libc_freeres_ok) __libc_freeres();
  _pl_in_freeres = false;
  ta_thread *t = _pl_enter();
  if (t) {
    _pl_drain_deferred();
    _pl_leave(t);
  }
}

void _pl_exit_work(void) {
  if (getpid() != _pl_pid || !_pl_ledger_live()) return;   /* a vfork child: not our image */
  ta_thread *t = _ta_self;
  if (t && t->guard > 0) return;          /* inside the ledger: it cannot run now */
  ta_reporter_set(preload_reporter);
  _ta_trace_exit_status(exit_code, fatal_signal);
  _ta_exit_now(false);
}

/* on_exit: exit() and a return from main; runs just before the ledger's
 * atexit handler, which does the exit work. */
static void on_exit_status(int status, void *arg) {
  (void)arg;
  if (getpid() != _pl_pid) return;
  exit_code = status & 0xff;
  libc_freeres_ok = true;
  ta_reporter_set(preload_reporter);
  _ta_trace_exit_status(exit_code, 0);
}

/* A fork child that leaves nothing of its own (see the top of the file). */
static bool quiet_fork_child(void) {
  if (!image_forked || !_pl_ledger_live()) return false;
  ta_thread *t = _pl_enter();
  if (!t) return false;
  ta_counts c = ta_since(fork_mark, TA_ANY);
  ta_summary s = ta_summary_get();
  _pl_leave(t);
  return c.live_blocks == 0 && s.errors == fork_errors;
}

/* Ends a quiet fork child's trace and removes it (its image is its parent's). */
static void quiet_end(void) {
  ta_thread *t = _pl_enter();
  if (!t) return;
  _ta_trace_close();
  char path[PATH_MAX];
  if (has_pid(_ta_opt.trace) && expand_path(_ta_opt.trace, 0, path, sizeof path)) unlink(path);
  _pl_leave(t);
}

static void child_after_fork(void) {
  _pl_fork_child_locks();
  atomic_store(&act_lock, 0);
  atomic_store(&dying, 0);
  _pl_pid = (int)getpid();
  image_forked = true;
  exit_code = -1;
  fatal_signal = 0;
  exec_suffix = 0;
  in_abort = 0;
  ta_thread *t = _pl_enter();
  if (t) {
    fork_mark = ta_mark_now();
    fork_errors = ta_summary_get().errors;
    _pl_leave(t);
  }
}

/* ---- main, quick_exit, _exit, _Exit -------------------------------------------------------- */

typedef int (*main_fn)(int, char **, char **);
typedef int (*start_fn)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *);
static main_fn real_main;

/* Runs in main's place: the status handler, then main itself by a tail
 * call (a jump: main returns straight to libc). */
static int main_hook(int argc, char **argv, char **envp) {
  on_exit(on_exit_status, NULL);
  return real_main(argc, argv, envp);
}

PL_EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void),
                                void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
  start_fn real = NULL;
  void *s = next_sym("__libc_start_main");
  memcpy(&real, &s, sizeof s);
  real_main = main;
  return real(main_hook, argc, argv, init, fini, rtld_fini, stack_end);
}

PL_EXPORT void quick_exit(int status) {
  if (getpid() == _pl_pid) {
    exit_code = status & 0xff;
    libc_freeres_ok = true;
    _pl_exit_work();
  }
  void (*real)(int) = NULL;
  void *s = next_sym("quick_exit");
  memcpy(&real, &s, sizeof s);
  if (real) real(status);
  for (;;) syscall(SYS_exit_group, status);
}

/* ---- _exit, _Exit ---------------------------------------------------------------------- */

static __attribute__((noreturn)) void exit_now(int status) {
  if (getpid() == _pl_pid && _pl_ledger_live()) {
    if (quiet_fork_child()) {
      quiet_end();
    } else {
      exit_code = status & 0xff;
      libc_freeres_ok = true;
      _pl_exit_work();
    }
  }
  for (;;) syscall(SYS_exit_group, status);
}

PL_EXPORT void _exit(int status) { exit_now(status); }
PL_EXPORT void _Exit(int status) { exit_now(status); }

/* ---- fatal signals --------------------------------------------------------------------- */

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
    fatal_signal = sig;
    exit_code = -1;
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
  bool from_abort = sig == SIGABRT && in_abort;
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

PL_EXPORT void abort(void) {
  in_abort = 1;
  resolve_all();
  if (real_abort) real_abort();
  raise(SIGABRT);
  for (;;) syscall(SYS_exit_group, 128 + SIGABRT);
}

/* ---- the environment of a new image ------------------------------------------------------ */

static char self_path[PATH_MAX];           /* this library, as loaded */
static const char *self_base = "libtagalloc-preload.so";
static char saved_vars[8192];              /* TAGALLOC_*=... at load, NUL-separated */
static size_t saved_len;

static const char *base_of(const char *p, size_t n, size_t *blen) {
  const char *b = p;
  for (size_t i = 0; i < n; i++)
    if (p[i] == '/') b = p + i + 1;
  *blen = (size_t)(p + n - b);
  return b;
}

static bool is_self(const char *p, size_t n) {
  size_t bl;
  const char *b = base_of(p, n, &bl);
  return bl == strlen(self_base) && memcmp(b, self_base, bl) == 0;
}

/* LD_PRELOAD's value without this library, into out; false if it does not fit. */
static bool preload_without_self(const char *value, char *out, size_t len, bool *had) {
  size_t o = 0;
  *had = false;
  for (const char *p = value; *p;) {
    while (*p == ':' || *p == ' ') p++;
    const char *s = p;
    while (*p && *p != ':' && *p != ' ') p++;
    if (p == s) continue;
    if (is_self(s, (size_t)(p - s))) {
      *had = true;
      continue;
    }
    if (o + (size_t)(p - s) + 2 > len) return false;
    if (o) out[o++] = ':';
    memcpy(out + o, s, (size_t)(p - s));
    o += (size_t)(p - s);
  }
  out[o] = '\0';
  return true;
}

static bool env_is(const char *e, const char *name) {
  size_t n = strlen(name);
  return strncmp(e, name, n) == 0 && e[n] == '=';
}

static size_t env_count(char *const *envp) {
  size_t n = 0;
  while (envp && envp[n]) n++;
  return n;
}

#define ENV_EXTRA 72   /* LD_PRELOAD and up to 64 TAGALLOC_* put back, the NULL */

static bool executable_file(const char *path);

/* s matches the glob pat: '*' any run of bytes ('/' too), '?' one byte,
 * the rest itself.  No allocation (the preload's exec path). */
static bool glob_match(const char *pat, size_t plen, const char *s) {
  const char *star = NULL, *resume = NULL, *p = pat, *end = pat + plen;
  while (*s) {
    if (p < end && (*p == '?' || *p == *s)) {
      p++;
      s++;
    } else if (p < end && *p == '*') {
      star = ++p;
      resume = s;
    } else if (star) {
      p = star;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (p < end && *p == '*') p++;
  return p == end;
}

/* TAGALLOC_SKIP (`tagalloc run --skip`): comma-separated globs; a program
 * matches when one matches the path it is executed by (found on PATH for
 * execvp and posix_spawnp) or that path's last component. */
static bool skipped(const char *file, bool search) {
  const char *list = _ta_opt.skip;
  if (!list || !*list || !file) return false;
  char found[PATH_MAX];
  const char *path = file;
  if (search && !strchr(file, '/')) {
    const char *dirs = getenv("PATH");
    if (!dirs) dirs = "/bin:/usr/bin";
    for (const char *d = dirs;;) {
      const char *e = strchr(d, ':');
      size_t dl = e ? (size_t)(e - d) : strlen(d);
      if (dl + strlen(file) + 2 <= sizeof found) {
        memcpy(found, d, dl);
        found[dl] = '/';
        memcpy(found + dl + 1, file, strlen(file) + 1);
        if (executable_file(found)) {
          path = found;
          break;
        }
      }
      if (!e) break;
      d = e + 1;
    }
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  for (const char *p = list; *p;) {
    const char *c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    if (n && (glob_match(p, n, path) || glob_match(p, n, base) || glob_match(p, n, file))) return true;
    if (!c) break;
    p = c + 1;
  }
  return false;
}

/* The environment for a new image of file in out (n + ENV_EXTRA slots); ld:
 * room for a new LD_PRELOAD entry.  Returns envp itself when nothing
 * changes.  Without TAGALLOC_FOLLOW, or for a program TAGALLOC_SKIP names,
 * the preload leaves LD_PRELOAD. */
static char *const *exec_env(const char *file, bool search, char *const *envp, char **out, char *ld,
                             size_t ldlen) {
  size_t n = 0;
  long ld_at = -1;
  bool changed = false;
  for (size_t i = 0; envp && envp[i]; i++) {
    if (env_is(envp[i], "LD_PRELOAD")) ld_at = (long)n;
    out[n++] = envp[i];
  }
  bool had = false;
  if (!_ta_opt.follow || skipped(file, search)) {
    if (ld_at >= 0) {
      char *value = out[ld_at] + strlen("LD_PRELOAD=");
      int k = _ta_snprintf(ld, ldlen, "LD_PRELOAD=");
      if (preload_without_self(value, ld + k, ldlen - (size_t)k, &had) && had) {
        changed = true;
        if (ld[k] == '\0') {             /* nothing left: no LD_PRELOAD at all */
          memmove(&out[ld_at], &out[ld_at + 1], (n - (size_t)ld_at - 1) * sizeof *out);
          n--;
        } else {
          out[ld_at] = ld;
        }
      }
    }
  } else if (self_path[0]) {
    if (ld_at >= 0) {
      char rest[4096];
      const char *value = out[ld_at] + strlen("LD_PRELOAD=");
      if (preload_without_self(value, rest, sizeof rest, &had) && !had) {
        _ta_snprintf(ld, ldlen, rest[0] ? "LD_PRELOAD=%s:%s" : "LD_PRELOAD=%s%s", self_path, rest);
        out[ld_at] = ld;
        changed = true;
      }
    } else {
      _ta_snprintf(ld, ldlen, "LD_PRELOAD=%s", self_path);
      out[n++] = ld;
      changed = true;
    }
    size_t added = 0;
    for (size_t o = 0; o < saved_len && added < 64; o += strlen(saved_vars + o) + 1) {
      const char *var = saved_vars + o, *eq = strchr(var, '=');
      bool present = false;
      for (size_t i = 0; i < n && !present; i++)
        present = strncmp(out[i], var, (size_t)(eq - var) + 1) == 0;
      if (!present) {
        out[n++] = (char *)var;
        added++;
        changed = true;
      }
    }
  }
  out[n] = NULL;
  return changed ? out : envp;
}

/* With TAGALLOC_FOLLOW=0, this process's own environment loses the preload
 * at load, in place (no allocation): system(), popen() and posix_spawn with
 * environ start programs without it. */
static void strip_own_environ(void) {
  for (size_t i = 0; environ && environ[i]; i++) {
    if (!env_is(environ[i], "LD_PRELOAD")) continue;
    char *value = environ[i] + strlen("LD_PRELOAD=");
    char buf[4096];
    bool had;
    if (!preload_without_self(value, buf, sizeof buf, &had) || !had) return;
    if (buf[0] == '\0') {
      for (size_t j = i; environ[j]; j++) environ[j] = environ[j + 1];
    } else {
      memcpy(value, buf, strlen(buf) + 1);   /* shorter: fits in place */
    }
    return;
  }
}

static void save_vars(void) {
  saved_len = 0;
  for (size_t i = 0; environ && environ[i]; i++) {
    if (strncmp(environ[i], "TAGALLOC_", 9) != 0 || !strchr(environ[i], '=')) continue;
    size_t n = strlen(environ[i]) + 1;
    if (saved_len + n > sizeof saved_vars) break;
    memcpy(saved_vars + saved_len, environ[i], n);
    saved_len += n;
  }
}

/* ---- exec ---------------------------------------------------------------------------------- */

static bool executable_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Will an exec of file probably succeed?  search: execvp's PATH search. */
static bool exec_will_work(const char *file, bool search) {
  if (!file || !*file) return false;
  if (!search || strchr(file, '/')) return executable_file(file);
  const char *path = getenv("PATH");
  if (!path) path = "/bin:/usr/bin";
  size_t fl = strlen(file);
  for (const char *p = path;;) {
    const char *e = strchr(p, ':');
    size_t dl = e ? (size_t)(e - p) : strlen(p);
    char buf[PATH_MAX];
    if (dl + fl + 2 <= sizeof buf) {
      if (dl == 0) memcpy(buf, file, fl + 1);            /* empty entry: the current directory */
      else {
        memcpy(buf, p, dl);
        buf[dl] = '/';
        memcpy(buf + dl + 1, file, fl + 1);
      }
      if (executable_file(buf)) return true;
    }
    if (!e) return false;
    p = e + 1;
  }
}

/* Renames this image's trace "PID" <-> "PID.N". */
static void rename_trace(int from_suffix, int to_suffix) {
  char from[PATH_MAX], to[PATH_MAX];
  if (!has_pid(_ta_opt.trace)) return;
  if (expand_path(_ta_opt.trace, from_suffix, from, sizeof from) &&
      expand_path(_ta_opt.trace, to_suffix, to, sizeof to))
    rename(from, to);
}

/* Before an exec: the exit work of the image going away.  Returns whether it
 * ran (the exec's failure must then undo the names). */
static bool before_exec(const char *file, bool search) {
  if (getpid() != _pl_pid || !_pl_ledger_live()) return false;
  ta_thread *t = _ta_self;
  if (t && t->guard > 0) return false;
  if (!exec_will_work(file, search)) return false;
  if (quiet_fork_child()) {
    quiet_end();
    return false;
  }
  /* "PID.N": the first N free for the trace */
  int n = 1;
  for (char b[PATH_MAX]; n < 10000; n++)
    if (!(has_pid(_ta_opt.trace) && expand_path(_ta_opt.trace, n, b, sizeof b) && path_exists(b))) break;
  exec_suffix = n;
  exit_code = -1;
  _pl_exit_work();
  rename_trace(0, n);
  return true;
}

/* The exec failed: this image goes on, and keeps the report made for it. */
static void exec_failed(bool reported) {
  if (!reported) return;
  int e = errno;
  rename_trace(exec_suffix, 0);
  exec_suffix = 0;
  errno = e;
}

/* The exec wrappers keep their frames (no tail call): the exit scan's roots
 * start at the program's frame that called one (scan.c finds it by the
 * wrapper's address). */
#define KEEP_FRAME(rc) ({ __asm__ volatile("" : "+r"(rc) : : "memory"); rc; })

#define WITH_ENV(file, search, envp, newenv)                                     \
  size_t n_env_ = env_count(envp);                                               \
  char *slots_[n_env_ + ENV_EXTRA];                                              \
  char ldbuf_[PATH_MAX + 4096];                                                  \
  char *const *newenv = exec_env(file, search, envp, slots_, ldbuf_, sizeof ldbuf_)

static int do_execve(const char *path, char *const argv[], char *const envp[]) {
  resolve_all();
  bool r = before_exec(path, false);
  WITH_ENV(path, false, envp, env);
  int rc = real_execve ? real_execve(path, argv, env) : (int)syscall(SYS_execve, path, argv, env);
  exec_failed(r);
  return rc;
}

static int do_execvpe(const char *file, char *const argv[], char *const envp[]) {
  resolve_all();
  bool r = before_exec(file, true);
  WITH_ENV(file, true, envp, env);
  int rc = real_execvpe ? real_execvpe(file, argv, env) : (errno = ENOSYS, -1);
  exec_failed(r);
  return rc;
}

PL_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
  int rc = do_execve(path, argv, envp);
  return KEEP_FRAME(rc);
}
PL_EXPORT int execv(const char *path, char *const argv[]) {
  int rc = do_execve(path, argv, environ);
  return KEEP_FRAME(rc);
}
PL_EXPORT int execvp(const char *file, char *const argv[]) {
  int rc = do_execvpe(file, argv, environ);
  return KEEP_FRAME(rc);
}
PL_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
  int rc = do_execvpe(file, argv, envp);
  return KEEP_FRAME(rc);
}

PL_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
  resolve_all();
  char path[64];
  _ta_snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  bool r = before_exec(path, false);
  char target[PATH_MAX];
  ssize_t tl = readlink(path, target, sizeof target - 1);
  target[tl > 0 ? tl : 0] = '\0';
  WITH_ENV(tl > 0 ? target : path, false, envp, env);
  int rc = real_fexecve ? real_fexecve(fd, argv, env) : (errno = ENOSYS, -1);
  exec_failed(r);
  return rc;
}

PL_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
  resolve_all();
  char full[PATH_MAX];
  if (path[0] == '/') _ta_snprintf(full, sizeof full, "%s", path);
  else if (path[0] == '\0') _ta_snprintf(full, sizeof full, "/proc/self/fd/%d", dirfd);
  else if (dirfd == AT_FDCWD) _ta_snprintf(full, sizeof full, "%s", path);
  else _ta_snprintf(full, sizeof full, "/proc/self/fd/%d/%s", dirfd, path);
  bool r = before_exec(full, false);
  WITH_ENV(full, false, envp, env);
  int rc = real_execveat ? real_execveat(dirfd, path, argv, env, flags)
                         : (int)syscall(SYS_execveat, dirfd, path, argv, env, flags);
  exec_failed(r);
  return rc;
}

/* execl, execlp, execle: the arguments into an array on the stack. */
#define COLLECT_ARGS(arg0, ap, argv, after)                                      \
  size_t argc_ = 1;                                                              \
  va_start(ap, arg0);                                                            \
  while (va_arg(ap, char *)) argc_++;                                            \
  va_end(ap);                                                                    \
  char *argv[argc_ + 1];                                                         \
  va_start(ap, arg0);                                                            \
  argv[0] = (char *)arg0;                                                        \
  for (size_t i_ = 1; i_ <= argc_; i_++) argv[i_] = va_arg(ap, char *);          \
  after;                                                                         \
  va_end(ap)

PL_EXPORT int execl(const char *path, const char *arg, ...) {
  va_list ap;
  COLLECT_ARGS(arg, ap, argv, (void)0);
  int rc = do_execve(path, argv, environ);
  return KEEP_FRAME(rc);
}

PL_EXPORT int execlp(const char *file, const char *arg, ...) {
  va_list ap;
  COLLECT_ARGS(arg, ap, argv, (void)0);
  int rc = do_execvpe(file, argv, environ);
  return KEEP_FRAME(rc);
}

PL_EXPORT int execle(const char *path, const char *arg, ...) {
  va_list ap;
  char *const *envp;
  COLLECT_ARGS(arg, ap, argv, envp = va_arg(ap, char *const *));
  int rc = do_execve(path, argv, envp);
  return KEEP_FRAME(rc);
}

/* posix_spawn: the parent goes on; only the new image's environment. */
PL_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
  resolve_all();
  WITH_ENV(path, false, envp, env);
  return real_posix_spawn ? real_posix_spawn(pid, path, fa, attr, argv, env) : ENOSYS;
}

PL_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
  resolve_all();
  WITH_ENV(file, true, envp, env);
  return real_posix_spawnp ? real_posix_spawnp(pid, file, fa, attr, argv, env) : ENOSYS;
}

/* ---- dlclose ----------------------------------------------------------------------------- */

typedef struct { uintptr_t base; const char *name; uintptr_t lo, hi; } phdr_find;

static int find_loads(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  phdr_find *f = arg;
  if (info->dlpi_addr != f->base || !info->dlpi_name || strcmp(info->dlpi_name, f->name) != 0) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (f->lo == 0 || lo < f->lo) f->lo = lo;
    if (hi > f->hi) f->hi = hi;
  }
  return 1;
}

PL_EXPORT int dlclose(void *handle) {
  resolve_all();
  struct link_map *lm = NULL;
  char path[PATH_MAX] = "";
  phdr_find f = { 0, NULL, 0, 0 };
  void *volatile h = handle;               /* declared nonnull; a program may still pass NULL */
  if (h && dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) {
    /* l_name is the name dlopen found it by ("./libx.so" stays relative) */
    if (lm->l_name[0] == '/' || !realpath(lm->l_name, path)) _ta_snprintf(path, sizeof path, "%s", lm->l_name);
    f.base = lm->l_addr;
    f.name = lm->l_name;
    dl_iterate_phdr(find_loads, &f);
    ta_thread *t = _pl_enter();
    if (t) {
      _ta_trace_modules();                  /* its mappings, while they are there */
      _pl_leave(t);
    }
  }
  int rc = real_dlclose ? real_dlclose(handle) : -1;
  if (rc == 0 && path[0] && f.hi > f.lo) {
    void *still = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (still) {
      real_dlclose(still);                  /* other references keep it loaded */
    } else {
      ta_thread *t = _pl_enter();
      if (t) {
        report_module_unloaded(path, f.base, f.lo, f.hi);
        _ta_unwind_forget(f.lo, f.hi);
        _pl_leave(t);
      }
    }
  }
  return rc;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* After the ledger's constructor (101: its atexit handler first, so that
 * ours runs before it). */
__attribute__((constructor(102))) static void preload_init(void) {
  _pl_pid = (int)getpid();
  resolve_all();
  Dl_info info;
  if (dladdr((void *)&_pl_pid, &info) && info.dli_fname && info.dli_fname[0]) {
    if (info.dli_fname[0] == '/' || !realpath(info.dli_fname, self_path))
      _ta_snprintf(self_path, sizeof self_path, "%s", info.dli_fname);
    size_t bl;
    self_base = base_of(self_path, strlen(self_path), &bl);
  }
  void *s = next_sym("_ZN9__gnu_cxx9__freeresEv");
  memcpy(&cxx_freeres_fn, &s, sizeof s);
  ta_thread *t = _pl_enter();               /* starts the ledger if nothing has yet */
  if (t) _pl_leave(t);
  _pl_runtime_tag = ta_tag_get("runtime");
  _ta_scan_more = _pl_runtime_blocks;       /* the runtime's live blocks are scanned too */
  keep_stderr();
  ta_error_handler(preload_error, NULL);
  save_vars();
  if (!_ta_opt.follow) strip_own_environ();
  pthread_atfork(NULL, NULL, child_after_fork);
  _ta_stop_init();                          /* before any signal: it calls dlsym */
  install_fatal_handlers();
  install_term_handlers();
  _ta_exit_before = exit_before;
  ta_reporter_set(preload_reporter);
  _pl_ctor_done();
}
