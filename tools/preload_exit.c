/* preload_exit.c - the shim's process life: how a process image ends, and
 * what it leaves for `tagalloc run` (signals: preload_signal.c; exec and
 * posix_spawn: preload_exec.c).
 *
 * Exit status.  exit() and a return from main run the exit work in
 * late_exit, after ld.so's _dl_fini has run every library's finalizers:
 * this library is initialized after the program's libraries (it depends
 * on none of them) and so finalized before them, and their destructors
 * still free memory (libcurl's, GnuTLS's, p11-kit's: 694 blocks in curl)
 * and drop pointers; memcheck reads the heap after all of them.  The
 * ledger's own atexit handler, which runs when _dl_fini finalizes this
 * library (atexit in a shared library is tied to it), leaves the work to
 * late_exit (_ta_exit_late).  An on_exit handler records the status
 * first: it is registered when main starts (__libc_start_main is
 * interposed to start main through a hook that tail-calls it, so no frame
 * of ours stays under main), after _dl_fini's registration, so it runs
 * before it.  _exit/_Exit/quick_exit are interposed: the exit work
 * (quarantine check, scan, report, trace) runs, then the real exit.
 * Before the scan, the runtime's own blocks are freed, as memcheck's
 * freeres does (see exit_before).
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
 * dlclose.  Before the library goes, its mappings are written to the trace
 * (MODULE records); after, if it is really gone, its path and load bias
 * are remembered for the exit symbolizer (report_module_unloaded), and the
 * unwinder forgets its rules.  dlopen is not interposed: glibc's dlopen
 * searches the caller's DT_RUNPATH, which a wrapper would hide; libraries
 * still loaded are written to the trace at exit, unloaded ones at dlclose.
 *
 * Descriptors.  close_range and closefrom are interposed so that a
 * program closing every descriptor it did not open (ssh does) leaves the
 * trace and stderr's copy open (see own_fds).
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

typedef int (*dlclose_fn)(void *);
static dlclose_fn real_dlclose;

void *_pl_next_sym(const char *name) {
  ta_thread *t = _pl_enter();             /* dlsym's allocations are raw */
  void *p = dlsym(RTLD_NEXT, name);
  if (t) _pl_leave(t);
  return p;
}

/* ---- contexts of the program's making ---------------------------------------------- */

/* A coroutine runs on a stack the program made (often a malloc'd block);
 * the frames of the thread's own stack that switched to it stay live.
 * The scan of a thread found off its own stack reads that stack from
 * where it was left (thread.h's left_sp), not all of it: the dead frames
 * below hold stale words (a slab's first block, from jemalloc's frames).
 * Each wrapper keeps its own frame (no tail call): swapcontext saves the
 * context of the wrapper, which a switch back resumes. */
typedef int (*swapcontext_fn)(ucontext_t *, const ucontext_t *);
typedef int (*setcontext_fn)(const ucontext_t *);

static bool on_own_stack(ta_thread *t, uintptr_t sp) { return t && sp >= t->stack_lo && sp < t->stack_hi; }

PL_EXPORT int swapcontext(ucontext_t *from, const ucontext_t *to) {
  static swapcontext_fn real;
  if (!real) {
    void *s = _pl_next_sym("swapcontext");
    memcpy(&real, &s, sizeof s);
    if (!real) { errno = ENOSYS; return -1; }
  }
  ta_thread *t = _ta_self;
  uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
  bool own = on_own_stack(t, sp);
  if (own) atomic_store(&t->left_sp, sp);
  int r = real(from, to);
  if (own) atomic_store(&t->left_sp, 0);    /* back on it */
  __asm__ volatile("" ::: "memory");
  return r;
}

PL_EXPORT int setcontext(const ucontext_t *to) {
  static setcontext_fn real;
  if (!real) {
    void *s = _pl_next_sym("setcontext");
    memcpy(&real, &s, sizeof s);
    if (!real) { errno = ENOSYS; return -1; }
  }
  ta_thread *t = _ta_self;
  uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
  if (on_own_stack(t, sp)) atomic_store(&t->left_sp, sp);
  int r = real(to);                          /* returns only on an error */
  if (on_own_stack(t, sp)) atomic_store(&t->left_sp, 0);
  return r;
}

/* ---- how this image ends ---------------------------------------------------------- */

int _pl_exit_code = -1;                    /* the status given to exit/_exit; -1: none */
int _pl_fatal_signal;                      /* the signal that ends the process; 0: none */
int _pl_exec_suffix;                       /* N of "PID.N" while an exec is under way; 0: none */

/* fork children */
static bool image_forked;
static ta_mark fork_mark;
static uint64_t fork_errors;

/* ---- paths ("%p" -> pid, or pid.N) ------------------------------------------------- */

bool _pl_expand_path(const char *pattern, int suffix, char *out, size_t len) {
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

bool _pl_has_pid(const char *pattern) { return pattern && strstr(pattern, "%p") != NULL; }

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

/* ---- the preload's descriptors ----------------------------------------------------- */

/* A program that closes every descriptor but the standard ones (OpenSSH's
 * ssh at start: close_range(3, ~0U)) would close the trace, whose records
 * are the process's report for `tagalloc run`, and stderr's copy.  Both
 * sit at 1000 or above; close_range and closefrom leave them open, as if
 * they were not there. */
static void own_fds(unsigned out[2]) {
  int a = err_fd, b = _ta_trace_fd();
  if (a > b) { int t = a; a = b; b = t; }
  out[0] = (unsigned)a;                  /* -1 (none) becomes ~0U: never inside a range but the last */
  out[1] = (unsigned)b;
}

static int sys_close_range(unsigned first, unsigned last, int flags) {
  return (int)syscall(SYS_close_range, first, last, flags);
}

PL_EXPORT int close_range(unsigned first, unsigned last, int flags) {
  if (first > last) return sys_close_range(first, last, flags);    /* the kernel's error */
  unsigned own[2];
  own_fds(own);
  for (int i = 0; i < 2 && first <= last; i++) {
    if (own[i] < first || own[i] > last || own[i] == ~0U) continue;
    if (own[i] > first && sys_close_range(first, own[i] - 1, flags) != 0) return -1;
    if (own[i] == last) return 0;
    first = own[i] + 1;
  }
  return first <= last ? sys_close_range(first, last, flags) : 0;
}

PL_EXPORT void closefrom(int lowfd) {
  if (lowfd < 0) lowfd = 0;
  if (close_range((unsigned)lowfd, ~0U, 0) == 0) return;
  /* no close_range in the kernel: each open descriptor, from /proc */
  int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  unsigned own[2];
  own_fds(own);
  char buf[4096];
  for (;;) {
    long len = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (len <= 0) break;
    for (long off = 0; off < len;) {
      struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type; char name[]; } *d =
          (void *)(buf + off);
      off += d->reclen;
      if (d->name[0] < '0' || d->name[0] > '9') continue;
      int fd = atoi(d->name);
      if (fd >= lowfd && fd != dir && (unsigned)fd != own[0] && (unsigned)fd != own[1]) close(fd);
    }
  }
  close(dir);
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
  if (_pl_fatal_signal) {
    const char *abbrev = sigabbrev_np(_pl_fatal_signal);
    n += abbrev ? _ta_snprintf(line + n, sizeof line - (size_t)n, ", killed by SIG%s", abbrev)
                : _ta_snprintf(line + n, sizeof line - (size_t)n, ", killed by signal %d", _pl_fatal_signal);
  }
  line[n++] = '\n';
  _ta_write_all(fd, line, (size_t)n);
  report_source src;
  report_source_ledger(&src);
  report_process_info info = { .ppid = -1, .exit_code = _pl_exit_code, .signal = _pl_fatal_signal,
                               .clean_exit = _pl_fatal_signal ? 0 : 1 };   /* the report names the signal */
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
  _ta_trace_exit_status(_pl_exit_code, _pl_fatal_signal);
  _ta_exit_now(false);
}

/* exit() and a return from main: registered at load, with no library's
 * handle (so _dl_fini's finalization of this library does not run it),
 * before __libc_start_main registers _dl_fini: it runs after _dl_fini,
 * when every library's destructors have run, and before stdio's flush. */
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);
static void late_exit(void *arg) {
  (void)arg;
  _ta_exit_now(false);
}

/* on_exit: exit() and a return from main; runs before _dl_fini and
 * late_exit, which does the exit work. */
static void on_exit_status(int status, void *arg) {
  (void)arg;
  if (getpid() != _pl_pid) return;
  _pl_exit_code = status & 0xff;
  libc_freeres_ok = true;
  ta_reporter_set(preload_reporter);
  _ta_trace_exit_status(_pl_exit_code, 0);
}

/* A fork child that leaves nothing of its own (see the top of the file). */
bool _pl_quiet_fork_child(void) {
  if (!image_forked || !_pl_ledger_live()) return false;
  ta_thread *t = _pl_enter();
  if (!t) return false;
  ta_counts c = ta_since(fork_mark, TA_ANY);
  ta_summary s = ta_summary_get();
  _pl_leave(t);
  return c.live_blocks == 0 && s.errors == fork_errors;
}

/* Ends a quiet fork child's trace and removes it (its image is its parent's). */
void _pl_quiet_end(void) {
  ta_thread *t = _pl_enter();
  if (!t) return;
  _ta_trace_close();
  char path[PATH_MAX];
  if (_pl_has_pid(_ta_opt.trace) && _pl_expand_path(_ta_opt.trace, 0, path, sizeof path)) unlink(path);
  _pl_leave(t);
}

static void child_after_fork(void) {
  _pl_fork_child_locks();
  _pl_signals_fork_child();
  _pl_pid = (int)getpid();
  image_forked = true;
  _pl_exit_code = -1;
  _pl_fatal_signal = 0;
  _pl_exec_suffix = 0;
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
  void *s = _pl_next_sym("__libc_start_main");
  memcpy(&real, &s, sizeof s);
  real_main = main;
  return real(main_hook, argc, argv, init, fini, rtld_fini, stack_end);
}

PL_EXPORT void quick_exit(int status) {
  if (getpid() == _pl_pid) {
    _pl_exit_code = status & 0xff;
    libc_freeres_ok = true;
    _pl_exit_work();
  }
  void (*real)(int) = NULL;
  void *s = _pl_next_sym("quick_exit");
  memcpy(&real, &s, sizeof s);
  if (real) real(status);
  for (;;) syscall(SYS_exit_group, status);
}

/* ---- _exit, _Exit ---------------------------------------------------------------------- */

static __attribute__((noreturn)) void exit_now(int status) {
  if (getpid() == _pl_pid && _pl_ledger_live()) {
    if (_pl_quiet_fork_child()) {
      _pl_quiet_end();
    } else {
      _pl_exit_code = status & 0xff;
      libc_freeres_ok = true;
      _pl_exit_work();
    }
  }
  for (;;) syscall(SYS_exit_group, status);
}

PL_EXPORT void _exit(int status) { exit_now(status); }
PL_EXPORT void _Exit(int status) { exit_now(status); }

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
  if (!real_dlclose) {
    void *s = _pl_next_sym("dlclose");
    memcpy(&real_dlclose, &s, sizeof s);
  }
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
  _pl_exec_init();                          /* this library's path, the environment */
  void *s = _pl_next_sym("_ZN9__gnu_cxx9__freeresEv");
  memcpy(&cxx_freeres_fn, &s, sizeof s);
  ta_thread *t = _pl_enter();               /* starts the ledger if nothing has yet */
  if (t) _pl_leave(t);
  _pl_runtime_tag = ta_tag_get("runtime");
  _ta_scan_more = _pl_runtime_blocks;       /* the runtime's live blocks are scanned too */
  keep_stderr();
  ta_error_handler(preload_error, NULL);
  pthread_atfork(NULL, NULL, child_after_fork);
  _ta_stop_init();                          /* before any signal: it calls dlsym */
  _pl_signals_init();
  _ta_exit_before = exit_before;
  if (__cxa_atexit(late_exit, NULL, NULL) == 0) _ta_exit_late = true;
  ta_reporter_set(preload_reporter);
  _pl_ctor_done();
}
