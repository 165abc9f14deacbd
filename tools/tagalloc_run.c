/* tagalloc_run.c - `tagalloc run [OPTIONS] -- PROGRAM [ARGS...]`.
 *
 * Checks PROGRAM (found on PATH) and every output before anything runs,
 * starts it with the preload library first in LD_PRELOAD and the options in
 * TAGALLOC_* variables, and waits for it and every process it started (the
 * tool is their subreaper: orphans come back to it).  Each audited process
 * prints its own report on stderr and writes its findings once, into its
 * trace in a private directory (an exit-only trace when no output needs the
 * events: TAGALLOC_TRACE_EVENTS=0).  Afterwards the tool builds one report
 * model from the traces, and renders from it the text of each process that
 * ended without its exit report (SIGKILL), the growth findings, the
 * roll-up, the JSON, the page and the folded stacks; it keeps the traces if
 * asked, and exits as the program did.  A trace's events are replayed only
 * where that is needed (--json, --html, --folded-peak, a process without
 * its exit report, growth across marks: report_offline_open_for); the rest
 * comes from its FINDING and SUMMARY records. */
#include "tagalloc_cli.h"
#include "model.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct {
  const char *json, *html, *folded, *folded_peak, *trace, *unwind, *supp, *check;
  bool        guard, no_follow, has_error_exitcode, quiet;
  int         error_exitcode;
  char       *skip;              /* --skip patterns, comma-separated (malloc'd) */
  char      **prog_argv;
  int         prog_argc;
} run_opts;

/* ---- the command line ---------------------------------------------------------- */

static void run_usage(FILE *f) {
  fputs("usage: tagalloc run [OPTIONS] [--] PROGRAM [ARGS...]\n"
        "Runs PROGRAM (found on PATH) with libtagalloc-preload.so preloaded and waits for it\n"
        "and every process it starts; each prints its leak and error report on stderr at exit.\n"
        "\n"
        "  --json FILE            one JSON document with every process's findings\n"
        "  --html FILE            one self-contained HTML page: findings, timeline, flame graphs\n"
        "  --folded FILE          leaked bytes by stack, folded (frame;frame;frame bytes)\n"
        "  --folded-peak FILE     live bytes at the peak by stack, folded\n"
        "                         (FILE - : standard output, for one of these four)\n"
        "  --trace FILE|DIR       keep the traces: DIR/PID.trace for each process, or the\n"
        "                         first process's in FILE (the others in FILE.PID)\n"
        "  --unwind exact|fast    stacks by DWARF unwinding (default) or frame pointers\n"
        "  --check leaks|errors|full\n"
        "                         what is checked: leaks and bad frees (default: no free\n"
        "                         stacks, no quarantine, no trace unless --trace, --html or\n"
        "                         --folded-peak asks);\n"
        "                         errors adds free stacks and a sampled quarantine (use\n"
        "                         after free); full quarantines every freed block\n"
        "  --guard                freed blocks' pages made inaccessible (use after free)\n"
        "  --suppressions FILE    leak:PATTERN and tag:PATTERN lines (LeakSanitizer's format)\n"
        "  --error-exitcode N     exit with N when any process had a leak or an error\n"
        "  --no-follow            do not audit the programs PROGRAM executes (exec)\n"
        "  --skip PATTERN         do not audit an executed program whose path or name matches\n"
        "                         the glob PATTERN (nor what it starts); may be repeated\n"
        "  -q, --quiet            no reports on stderr (the outputs above are still written)\n"
        "  -h, --help             this help\n"
        "\n"
        "Exit status: PROGRAM's own (a signal that killed it kills tagalloc the same way),\n"
        "or N with --error-exitcode; 2 when tagalloc refuses to start PROGRAM.\n"
        "See tagalloc-run(1) and tagalloc(7) for the TAGALLOC_* variables.\n", f);
}

enum { OPT_JSON = 256, OPT_HTML, OPT_FOLDED, OPT_FOLDED_PEAK, OPT_TRACE, OPT_UNWIND, OPT_SUPP, OPT_ERREXIT, OPT_GUARD,
       OPT_NOFOLLOW, OPT_SKIP, OPT_CHECK };

/* 0: run; 1: --help was asked (exit 0); -1: a usage error (said). */
static int parse(int argc, char **argv, run_opts *o) {
  static const struct option longs[] = {
    { "json", required_argument, NULL, OPT_JSON },
    { "html", required_argument, NULL, OPT_HTML },
    { "folded", required_argument, NULL, OPT_FOLDED },
    { "folded-peak", required_argument, NULL, OPT_FOLDED_PEAK },
    { "trace", required_argument, NULL, OPT_TRACE },
    { "unwind", required_argument, NULL, OPT_UNWIND },
    { "suppressions", required_argument, NULL, OPT_SUPP },
    { "error-exitcode", required_argument, NULL, OPT_ERREXIT },
    { "guard", no_argument, NULL, OPT_GUARD },
    { "no-follow", no_argument, NULL, OPT_NOFOLLOW },
    { "skip", required_argument, NULL, OPT_SKIP },
    { "check", required_argument, NULL, OPT_CHECK },
    { "quiet", no_argument, NULL, 'q' },
    { "help", no_argument, NULL, 'h' },
    { 0, 0, 0, 0 },
  };
  memset(o, 0, sizeof *o);
  int c;
  while ((c = cli_getopt(argc, argv, "+qh", longs, "run")) != -1) {
    switch (c) {
    case OPT_JSON: o->json = optarg; break;
    case OPT_HTML: o->html = optarg; break;
    case OPT_FOLDED: o->folded = optarg; break;
    case OPT_FOLDED_PEAK: o->folded_peak = optarg; break;
    case OPT_TRACE: o->trace = optarg; break;
    case OPT_UNWIND: o->unwind = optarg; break;
    case OPT_CHECK: o->check = optarg; break;
    case OPT_SUPP: o->supp = optarg; break;
    case OPT_GUARD: o->guard = true; break;
    case OPT_NOFOLLOW: o->no_follow = true; break;
    case 'q': o->quiet = true; break;
    case 'h':
      run_usage(stdout);
      return 1;
    case OPT_SKIP: {
      if (!*optarg || strchr(optarg, ',')) {
        cli_error("run: --skip %s: %s", optarg, *optarg ? "one pattern per --skip (no comma)" : "an empty pattern");
        return -1;
      }
      size_t old = o->skip ? strlen(o->skip) : 0, n = old + strlen(optarg) + 2;
      char *s = realloc(o->skip, n);
      if (!s) {
        cli_error("out of memory");
        return -1;
      }
      snprintf(s + old, n - old, "%s%s", old ? "," : "", optarg);
      o->skip = s;
      break;
    }
    case OPT_ERREXIT: {
      char *end;
      errno = 0;
      long n = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || n < 0 || n > 255) {
        cli_error("run: --error-exitcode %s: not an exit status (0 to 255)", optarg);
        return -1;
      }
      o->error_exitcode = (int)n;
      o->has_error_exitcode = true;
      break;
    }
    default:
      return -1;
    }
  }
  if (o->unwind && strcmp(o->unwind, "exact") != 0 && strcmp(o->unwind, "fast") != 0) {
    cli_error("run: --unwind %s: expected exact or fast", o->unwind);
    return -1;
  }
  if (o->check && strcmp(o->check, "leaks") != 0 && strcmp(o->check, "errors") != 0 && strcmp(o->check, "full") != 0) {
    cli_error("run: --check %s: expected leaks, errors or full", o->check);
    return -1;
  }
  if (o->trace && strcmp(o->trace, "-") == 0) {
    cli_error("run: --trace -: a trace is binary; name a file or a directory");
    return -1;
  }
  if (!cli_one_stdout("run", 4, (const char *[]){ o->json, o->html, o->folded, o->folded_peak })) return -1;
  if (optind >= argc) {
    cli_error("run: no program given (usage: tagalloc run [OPTIONS] -- PROGRAM [ARGS...])");
    return -1;
  }
  o->prog_argv = argv + optind;
  o->prog_argc = argc - optind;
  return 0;
}

/* ---- the program: found, executable, dynamically linked, not setuid --------- */

static bool is_exec_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* PROGRAM as execvp would find it; NULL with a reason. */
static char *resolve(const char *name, const char **why) {
  if (!*name) {
    *why = "an empty program name";
    return NULL;
  }
  if (strchr(name, '/')) return strdup(name);
  const char *path = getenv("PATH");
  char dflt[256];
  if (!path) {
    size_t n = confstr(_CS_PATH, dflt, sizeof dflt);
    path = n > 0 && n <= sizeof dflt ? dflt : "/bin:/usr/bin";
  }
  char *first_found = NULL;   /* a file that is there but not executable */
  for (const char *p = path;; ) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    char cand[PATH_MAX];
    int n = len ? snprintf(cand, sizeof cand, "%.*s/%s", (int)len, p, name)
                : snprintf(cand, sizeof cand, "%s", name);   /* an empty entry: the current directory */
    if (n > 0 && (size_t)n < sizeof cand) {
      if (is_exec_file(cand)) {
        free(first_found);
        return strdup(cand);
      }
      struct stat st;
      if (!first_found && stat(cand, &st) == 0 && S_ISREG(st.st_mode)) first_found = strdup(cand);
    }
    if (!colon) break;
    p = colon + 1;
  }
  if (first_found) return first_found;   /* the check below says why it cannot run */
  *why = "not found on PATH";
  return NULL;
}

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE
#endif

/* Why PATH cannot run under the preload, or NULL when it can.  Follows a #!
 * interpreter (what = "its interpreter ..." then). */
static const char *cannot_preload(const char *path, char *buf, size_t len, int depth) {
  struct stat st;
  if (stat(path, &st) != 0) {
    snprintf(buf, len, "%s", errno == ENOENT ? "no such file" : strerror(errno));
    return buf;
  }
  if (S_ISDIR(st.st_mode)) return "a directory, not a program";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (access(path, X_OK) != 0) return "not executable (no execute permission)";
  if (st.st_mode & S_ISUID)
    return "a setuid binary: the dynamic linker ignores LD_PRELOAD for it (secure-execution mode)";
  if (st.st_mode & S_ISGID)
    return "a setgid binary: the dynamic linker ignores LD_PRELOAD for it (secure-execution mode)";
  if (getxattr(path, "security.capability", NULL, 0) > 0)
    return "has file capabilities: the dynamic linker ignores LD_PRELOAD for it (secure-execution mode)";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(buf, len, "cannot read it: %s", strerror(errno));
    return buf;
  }
  unsigned char head[256];
  ssize_t n = pread(fd, head, sizeof head, 0);
  const char *why = NULL;
  if (n >= 4 && memcmp(head, ELFMAG, SELFMAG) == 0) {
    Elf64_Ehdr eh;
    if (n < (ssize_t)sizeof eh) {
      why = "a truncated ELF file";
    } else if (head[EI_CLASS] != ELFCLASS64) {
      why = "a 32-bit program: the 64-bit preload library cannot be loaded into it";
    } else {
      memcpy(&eh, head, sizeof eh);
      if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) {
        why = "not an executable ELF file";
      } else if (HOST_MACHINE != EM_NONE && eh.e_machine != HOST_MACHINE) {
        snprintf(buf, len, "built for another machine (ELF e_machine %u)", (unsigned)eh.e_machine);
        why = buf;
      } else {
        bool interp = false;
        for (unsigned i = 0; i < eh.e_phnum && !interp; i++) {
          Elf64_Phdr ph;
          if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * eh.e_phentsize)) != (ssize_t)sizeof ph)
            break;
          interp = ph.p_type == PT_INTERP;
        }
        if (!interp) why = "a static binary (no PT_INTERP): LD_PRELOAD cannot work";
      }
    }
  } else if (n >= 2 && head[0] == '#' && head[1] == '!') {
    /* a script: its interpreter is what gets the preload */
    char interp[sizeof head];
    size_t i = 2, k = 0;
    while (i < (size_t)n && (head[i] == ' ' || head[i] == '\t')) i++;
    while (i < (size_t)n && head[i] != ' ' && head[i] != '\t' && head[i] != '\n' && k + 1 < sizeof interp)
      interp[k++] = (char)head[i++];
    interp[k] = '\0';
    if (k == 0) {
      why = "a #! script without an interpreter";
    } else if (depth < 4) {
      char inner[512];
      const char *w = cannot_preload(interp, inner, sizeof inner, depth + 1);
      if (w) {
        snprintf(buf, len, "its interpreter %.255s: %.480s", interp, w);
        why = buf;
      }
    }
  }
  close(fd);
  return why;
}

/* ---- the preload library ------------------------------------------------------ */

/* TAGALLOC_PRELOAD; else beside the tagalloc binary (the build folder), or
 * in ../lib/tagalloc/ from it (an installed tagalloc: PREFIX/bin and
 * PREFIX/lib/tagalloc). */
static char *find_preload(void) {
  const char *env = getenv("TAGALLOC_PRELOAD");
  char cand[PATH_MAX];
  if (env && *env) {
    snprintf(cand, sizeof cand, "%s", env);
  } else {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
      cli_error("cannot find the preload library: /proc/self/exe: %s (set TAGALLOC_PRELOAD)", strerror(errno));
      return NULL;
    }
    self[n] = '\0';
    const char *dir = dirname(self);
    snprintf(cand, sizeof cand, "%s/libtagalloc-preload.so", dir);
    char installed[PATH_MAX];
    snprintf(installed, sizeof installed, "%s/../lib/tagalloc/libtagalloc-preload.so", dir);
    if (access(cand, R_OK) != 0 && access(installed, R_OK) == 0) snprintf(cand, sizeof cand, "%s", installed);
  }
  char *real = realpath(cand, NULL);
  if (!real || access(real, R_OK) != 0) {
    cli_error("cannot find the preload library %s: %s (build it with make, or set TAGALLOC_PRELOAD)",
              cand, strerror(errno));
    free(real);
    return NULL;
  }
  if (strpbrk(real, " :\t\n")) {
    cli_error("the preload library's path %s has a space or a colon: LD_PRELOAD cannot name it", real);
    free(real);
    return NULL;
  }
  return real;
}

/* ---- the environment ---------------------------------------------------------- */

static bool env_is(const char *entry, const char *name) {
  size_t n = strlen(name);
  return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static char *env_pair(const char *name, const char *value) {
  size_t n = strlen(name) + strlen(value) + 2;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s=%s", name, value);
  return s;
}

/* environ, with the preload first in LD_PRELOAD and our TAGALLOC_* set. */
static char **child_env(const run_opts *o, const char *preload, const char *dir, const char *supp) {
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 16, sizeof *env);
  if (!env) return NULL;
  static const char *ours[] = { "LD_PRELOAD", "TAGALLOC_TRACE", "TAGALLOC_TRACE_EVENTS", "TAGALLOC_REPORT",
                                "TAGALLOC_UNWIND", "TAGALLOC_GUARD", "TAGALLOC_FOLLOW",
                                "TAGALLOC_SUPPRESSIONS", "TAGALLOC_SKIP", "TAGALLOC_CHECK" };
  const char *old_preload = NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool skip = false;
    for (size_t j = 0; j < sizeof ours / sizeof *ours && !skip; j++) skip = env_is(environ[i], ours[j]);
    if (env_is(environ[i], "LD_PRELOAD")) old_preload = environ[i] + strlen("LD_PRELOAD=");
    /* keep a TAGALLOC_* the user set that we do not override */
    if (skip && env_is(environ[i], "TAGALLOC_UNWIND") && !o->unwind) skip = false;
    if (skip && env_is(environ[i], "TAGALLOC_SUPPRESSIONS") && !supp) skip = false;
    if (skip && env_is(environ[i], "TAGALLOC_GUARD") && !o->guard) skip = false;
    if (skip && env_is(environ[i], "TAGALLOC_FOLLOW") && !o->no_follow) skip = false;
    if (skip && env_is(environ[i], "TAGALLOC_SKIP") && !o->skip) skip = false;
    if (skip && env_is(environ[i], "TAGALLOC_CHECK") && !o->check) skip = false;
    if (!skip) env[k++] = environ[i];
  }
  /* LD_PRELOAD: ours first, then the others (without ours again) */
  size_t cap = strlen(preload) + (old_preload ? strlen(old_preload) : 0) + 2;
  char *pl = malloc(cap);
  if (!pl) return NULL;
  snprintf(pl, cap, "%s", preload);
  if (old_preload) {
    char *copy = strdup(old_preload), *save = NULL;
    for (char *t = copy ? strtok_r(copy, " :", &save) : NULL; t; t = strtok_r(NULL, " :", &save)) {
      if (strcmp(t, preload) == 0) continue;
      strcat(pl, ":");
      strcat(pl, t);
    }
    free(copy);
  }
  char trace[PATH_MAX + 16];
  snprintf(trace, sizeof trace, "%s/%%p.trace", dir);
  env[k++] = env_pair("LD_PRELOAD", pl);
  free(pl);
  /* The mode: --check, else the user's TAGALLOC_CHECK, else leaks.  Every
   * process writes a trace, its one record of its findings; its events only
   * where an output needs them (--trace, --html, --folded-peak: the
   * timeline and the peak are the trace's) or the mode does (errors, full:
   * the errors of a process killed before its exit report). */
  const char *check = o->check ? o->check : getenv("TAGALLOC_CHECK");
  bool leaks = check == NULL || strcmp(check, "leaks") == 0;
  if (!o->check && !check) env[k++] = env_pair("TAGALLOC_CHECK", "leaks");
  else if (o->check) env[k++] = env_pair("TAGALLOC_CHECK", o->check);
  env[k++] = env_pair("TAGALLOC_TRACE", trace);
  env[k++] = env_pair("TAGALLOC_TRACE_EVENTS", !leaks || o->trace || o->html || o->folded_peak ? "1" : "0");
  env[k++] = env_pair("TAGALLOC_REPORT", o->quiet ? "0" : "1");
  if (o->unwind) env[k++] = env_pair("TAGALLOC_UNWIND", o->unwind);
  if (o->guard) env[k++] = env_pair("TAGALLOC_GUARD", "1");
  if (o->no_follow) env[k++] = env_pair("TAGALLOC_FOLLOW", "0");
  if (o->skip) env[k++] = env_pair("TAGALLOC_SKIP", o->skip);
  if (supp) env[k++] = env_pair("TAGALLOC_SUPPRESSIONS", supp);
  for (size_t i = 0; i < k; i++)
    if (!env[i]) return NULL;
  env[k] = NULL;
  return env;
}

/* ---- signals and waiting -------------------------------------------------------- */

static volatile sig_atomic_t the_child, main_done, stop_waiting;
static const int relayed[] = { SIGINT, SIGQUIT, SIGTERM, SIGHUP };
#define NRELAYED (sizeof relayed / sizeof relayed[0])
static bool installed[NRELAYED];

/* While the program runs, a termination signal goes on to it (the preload
 * reports, then the program dies of it, and we exit as it did), but for one
 * from the terminal, which reached it without us (as system() does).  The
 * first is passed with sigqueue and TA_RELAY_VALUE (tools/preload_signal.c): the
 * program ignores that copy when it got the signal itself already (a kill
 * of the whole process group).  One more of the same within 2 s is passed
 * with a plain kill: the program skips the rest of its report (as a
 * second Ctrl-C does).  Once it has ended, any of them stops the wait for
 * the processes it left behind. */
#define TA_RELAY_VALUE 0x74616c6c   /* the same in tools/preload_signal.c */
static volatile sig_atomic_t relayed_sig;
static struct timespec relayed_at;

static void relay_signal(int sig, const siginfo_t *si) {
  if (si && si->si_code > 0) return;     /* the terminal's: it has it too */
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  bool again = relayed_sig == sig && (now.tv_sec - relayed_at.tv_sec) * 1000000000L +
                                         (now.tv_nsec - relayed_at.tv_nsec) < 2000000000L;
  if (again) {
    kill((pid_t)the_child, sig);
    return;
  }
  union sigval v = { .sival_int = TA_RELAY_VALUE };
  sigqueue((pid_t)the_child, sig, v);
  relayed_sig = sig;
  relayed_at = now;
}

static void on_signal(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  int e = errno;
  if (main_done) stop_waiting = 1;
  else if (the_child > 0) relay_signal(sig, si);
  errno = e;
}

static void signals_install(void) {
  for (size_t i = 0; i < NRELAYED; i++) {
    struct sigaction old, sa;
    if (sigaction(relayed[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue;   /* keep ignoring */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;   /* no SA_RESTART: waitpid returns EINTR */
    installed[i] = sigaction(relayed[i], &sa, NULL) == 0;
  }
}

static void signals_block(sigset_t *old) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < NRELAYED; i++) sigaddset(&set, relayed[i]);
  sigprocmask(SIG_BLOCK, &set, old);
}

typedef struct { pid_t pid; int status; } reaped;

typedef struct {
  reaped *v;
  size_t  n, cap;
} reaped_list;

static void reaped_add(reaped_list *l, pid_t pid, int status) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    reaped *v = realloc(l->v, cap * sizeof *v);
    if (!v) return;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = (reaped){ pid, status };
}

static const reaped *reaped_find(const reaped_list *l, pid_t pid) {
  for (size_t i = l->n; i-- > 0;)
    if (l->v[i].pid == pid) return &l->v[i];
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits for the program, then for what it left running (we are their
 * subreaper), until none is left or a signal says stop. */
static int wait_all(pid_t child, reaped_list *reaped_out, const char *prog) {
  int main_status = 0;
  double since = 0;
  bool noted = false;
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, main_done ? WNOHANG : 0);
    if (p > 0) {
      reaped_add(reaped_out, p, st);
      if (p == child) {
        main_status = st;
        main_done = 1;
        since = now_s();
      }
      continue;
    }
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;   /* ECHILD: nobody left */
    if (stop_waiting) {
      cli_warn("stopped waiting for the processes %s left running; their reports are missing", prog);
      break;
    }
    if (!noted && now_s() - since > 1.0) {
      cli_warn("%s has exited; waiting for the processes it left running (interrupt to stop waiting)", prog);
      noted = true;
    }
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    nanosleep(&ts, NULL);
  }
  return main_status;
}

/* ---- after the run ------------------------------------------------------------------ */

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static char *path_join(const char *dir, const char *name) {
  size_t d = strlen(dir), n;
  while (d > 1 && dir[d - 1] == '/') d--;
  n = d + strlen(name) + 2;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%.*s/%s", (int)d, dir, name);
  return s;
}

/* The processes of the run: their traces. */
static cli_proc *collect(const char *dir, size_t *count) {
  cli_proc *v = NULL;
  size_t n = 0, cap = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!ends_with(e->d_name, ".trace")) continue;
    if (n == cap) {
      size_t c = cap ? cap * 2 : 16;
      cli_proc *nv = realloc(v, c * sizeof *nv);
      if (!nv) break;
      v = nv;
      cap = c;
    }
    cli_proc *p = &v[n++];
    memset(p, 0, sizeof *p);
    p->start_ns = UINT64_MAX;
    p->trace = path_join(dir, e->d_name);
    p->has_header = p->trace && cli_trace_header(p->trace, &p->pid, &p->ppid, &p->start_ns);
  }
  if (d) closedir(d);
  cli_procs_sort(v, n);
  *count = n;
  return v;
}

static void describe_end(char *buf, size_t len, const reaped *r) {
  if (!r) {
    snprintf(buf, len, "ended");
  } else if (WIFSIGNALED(r->status)) {
    const char *abbrev = sigabbrev_np(WTERMSIG(r->status));
    if (abbrev)
      snprintf(buf, len, "was killed by SIG%s (signal %d, %s)", abbrev, WTERMSIG(r->status), strsignal(WTERMSIG(r->status)));
    else
      snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(r->status), strsignal(WTERMSIG(r->status)));
  } else {
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(r->status));
  }
}

/* The report model of the run: one process per trace, with how it ended
 * (the last image of a pid: as we reaped it; an image that called exec:
 * exit_code -1), where its trace is kept, and the program's command line
 * for the program itself.  A trace that cannot be read is left out with a
 * warning. */
static report_model *build_model(const run_opts *o, cli_proc *procs, size_t nprocs, char **kept,
                                 const reaped_list *rl, pid_t child, report_suppressions *supp) {
  report_model *rm = report_model_new();
  if (!rm) return NULL;
  report_model_set_argv(rm, o->prog_argv, o->prog_argc);
  for (size_t i = 0; i < nprocs; i++) {
    cli_proc *p = &procs[i];
    char err[600];
    report_offline *off = report_offline_open_for(p->trace, o->json || o->html || o->folded_peak ? REPORT_OFFLINE_EVENTS
                                                                                       : REPORT_OFFLINE_RECORDS_FIRST,
                                                  err, sizeof err);
    if (!off) {
      cli_warn("process %" PRIu32 ": its trace cannot be read, it is left out: %s", p->pid, err);
      continue;
    }
    const report_trace_model *m = report_offline_model(off);
    if (m->damaged) cli_warn("%s; the records before it are reported", m->damage);
    const reaped *r = reaped_find(rl, (pid_t)p->pid);
    bool last = true, first = true;
    for (size_t j = i + 1; j < nprocs; j++) last &= procs[j].pid != p->pid;
    for (size_t j = 0; j < i; j++) first &= procs[j].pid != p->pid;
    if (!last) r = NULL;
    /* the command line its trace recorded; the program's as given when
     * none was (its first image) */
    bool given = (pid_t)p->pid == child && first && !m->argv;
    /* how it ended: as we reaped it, else as its trace says (EXIT) */
    int sig = r && WIFSIGNALED(r->status) ? WTERMSIG(r->status) : !r && m->has_exit ? m->exit_signal : 0;
    int code = r && WIFEXITED(r->status) ? WEXITSTATUS(r->status) : !r && m->has_exit ? m->exit_code : -1;
    report_process_info info = {
      .ppid = (long)m->ppid,
      .argv = given ? (const char *const *)o->prog_argv : NULL,
      .argc = given ? o->prog_argc : 0,
      .exit_code = code,
      .signal = sig,
      .clean_exit = m->clean_exit && !sig,
      .trace = kept ? kept[i] : NULL,
    };
    p->model = report_model_add_offline(rm, off, supp, &info);
    if (!p->model) cli_warn("process %" PRIu32 " left out of the report: out of memory", p->pid);
  }
  return rm;
}

/* What the tool says on stderr of each process: the report of one that
 * ended without its exit report (from its trace), and the growth groups of
 * one that made it (its own report had no marks to compare). */
static void report_process_text(const run_opts *o, const cli_proc *p, const reaped_list *rl, pid_t child) {
  report_process *rp = p->model;
  const report_trace_model *m = rp->tm;
  if (m && m->clean_exit) {
    fflush(stderr);
    report_text_growth(STDERR_FILENO, rp);
    return;
  }
  const reaped *r = reaped_find(rl, (pid_t)p->pid);
  char how[128];
  describe_end(how, sizeof how, r);
  bool prog = (pid_t)p->pid == child;
  fflush(stdout);
  if (m && !m->has_events) {   /* an exit-only trace: nothing to report from */
    fprintf(stderr, "==%" PRIu32 "== tagalloc: process %" PRIu32 "%s%s%s %s without its exit report "
            "(its trace has no events: run with --trace to see what was live)\n", p->pid, p->pid,
            prog ? " (" : "", prog ? o->prog_argv[0] : "", prog ? ")" : "", how);
    fflush(stderr);
    return;
  }
  fprintf(stderr, "==%" PRIu32 "== tagalloc: process %" PRIu32 "%s%s%s %s without its exit report; "
          "from its trace:\n", p->pid, p->pid, prog ? " (" : "", prog ? o->prog_argv[0] : "",
          prog ? ")" : "", how);
  fflush(stderr);
  report_text_process(STDERR_FILENO, rp);
}

/* Moves (or copies) from to to. */
static bool move_file(const char *from, const char *to) {
  if (rename(from, to) == 0) return true;
  if (errno != EXDEV) return false;
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = out >= 0;
  char buf[1 << 16];
  while (ok) {
    ssize_t r = read(in, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ok = r == 0;
      break;
    }
    ok = cli_write_all(out, buf, (size_t)r);
  }
  close(in);
  if (out >= 0 && close(out) != 0) ok = false;
  if (ok) unlink(from);
  return ok;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char *p = path_join(dir, e->d_name);
      if (p) unlink(p);
      free(p);
    }
    closedir(d);
  }
  if (rmdir(dir) != 0) cli_warn("could not remove the directory %s: %s", dir, strerror(errno));
}

/* The final name of each kept trace: DIR/X.trace, or FILE for the first
 * process and FILE.PID for the others (%p in FILE: the pid). */
static char *trace_destination(const run_opts *o, bool to_dir, const cli_proc *p, size_t index) {
  if (!o->trace) return NULL;
  if (to_dir) return path_join(o->trace, strrchr(p->trace, '/') + 1);
  /* the process's name in the directory: "PID", or "PID.N" for an image
   * that called exec */
  const char *base = strrchr(p->trace, '/') + 1;
  int stem = (int)(strlen(base) - strlen(".trace"));
  const char *pp = strstr(o->trace, "%p");
  char buf[PATH_MAX];
  if (pp) {
    snprintf(buf, sizeof buf, "%.*s%.*s%s", (int)(pp - o->trace), o->trace, stem, base, pp + 2);
  } else if (index == 0) {
    snprintf(buf, sizeof buf, "%s", o->trace);
  } else {
    snprintf(buf, sizeof buf, "%s.%.*s", o->trace, stem, base);
  }
  return strdup(buf);
}

/* ---- the roll-up ---------------------------------------------------------------------- */

typedef struct {
  long long pid, exit_code, signal;
  char      name[64];              /* argv[0]'s last component */
  uint64_t  leaked_bytes, leaked_blocks, reachable_bytes, unclassified_bytes, errors;
  bool      problems, unclassified;
  bool      listed;                /* on a line of its own, or counted in the grouped line */
} rollup_row;

static void rollup_read(const report_process *p, rollup_row *r) {
  memset(r, 0, sizeof *r);
  r->pid = p->pid;
  r->exit_code = p->exit_code;
  r->signal = p->signal;
  const char *a0 = p->argv && p->argc ? p->argv[0] : p->tm && p->tm->argc ? p->tm->argv[0] : NULL;
  const char *base = a0 ? strrchr(a0, '/') : NULL;
  snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : a0 ? a0 : "?");
  const ta_summary *s = &p->summary;
  r->leaked_bytes = s->direct_bytes + s->indirect_bytes + s->orphan_bytes;
  r->leaked_blocks = s->direct_blocks + s->indirect_blocks + s->orphan_blocks;
  r->reachable_bytes = s->reachable_bytes;
  r->unclassified = p->unclassified;
  r->unclassified_bytes = p->unclassified_bytes;
  r->errors = s->errors;
  r->problems = p->findings_count > 0 || s->errors > 0;
}

#define th cli_thousands

#define ROLLUP_LINES 16   /* process lines at most: the roll-up fits one screen */

/* With several processes, after their reports: one line per process (those
 * with findings first; beyond ROLLUP_LINES the clean ones by program name),
 * then the totals. */
static void rollup(const report_model *rm, const char *prog) {
  rollup_row *rows = calloc(rm->nprocs ? rm->nprocs : 1, sizeof *rows);
  if (!rows) return;
  size_t n = 0;
  for (size_t i = 0; i < rm->nprocs; i++) rollup_read(rm->procs[i], &rows[n++]);
  if (n < 2) {
    free(rows);
    return;
  }
  bool color = cli_color(STDERR_FILENO);
  const char *bold = color ? "\033[1m" : "", *red = color ? "\033[1;31m" : "", *off = color ? "\033[0m" : "";
  uint64_t t_leaked = 0, t_blocks = 0, t_errors = 0, t_reach = 0, t_unclass = 0;
  size_t with = 0;
  for (size_t i = 0; i < n; i++) {
    t_leaked += rows[i].leaked_bytes;
    t_blocks += rows[i].leaked_blocks;
    t_errors += rows[i].errors;
    t_reach += rows[i].reachable_bytes;
    t_unclass += rows[i].unclassified_bytes;
    with += rows[i].problems;
  }
  /* every process when they fit; else those with findings, then the rest grouped */
  bool all = n <= ROLLUP_LINES;
  fflush(stdout);
  fprintf(stderr, "\n%s==tagalloc== %zu processes of %s:%s\n", bold, n, prog, off);
  fprintf(stderr, "  %8s  %-16s %15s %9s %7s %15s  %s\n", "pid", "program", "leaked bytes", "blocks", "errors",
          "reachable", "end");
  size_t shown = 0, hidden_problems = 0;
  for (size_t i = 0; i < n; i++) {
    rollup_row *r = &rows[i];
    if (!all && (!r->problems || shown >= ROLLUP_LINES)) {
      hidden_problems += r->problems;
      continue;
    }
    char b1[32], b2[32], b3[32], end[40];
    if (r->signal) snprintf(end, sizeof end, "signal %lld", r->signal);
    else if (r->exit_code >= 0) snprintf(end, sizeof end, "exit %lld", r->exit_code);
    else snprintf(end, sizeof end, "exec");
    if (r->unclassified) snprintf(end + strlen(end), sizeof end - strlen(end), ", no exit scan");
    fprintf(stderr, "  %s%8lld  %-16.16s %15s %9s %7" PRIu64 " %15s  %s%s\n", r->problems ? red : "", r->pid,
            r->name, th(b1, r->leaked_bytes), th(b2, r->leaked_blocks), r->errors, th(b3, r->reachable_bytes),
            end, r->problems ? off : "");
    r->listed = true;
    shown++;
  }
  if (shown < n) {   /* the others, by program name, in the order they came */
    fprintf(stderr, "  ... %zu more process(es)", n - shown);
    if (hidden_problems) fprintf(stderr, " (%zu with leaks or errors)", hidden_problems);
    else fprintf(stderr, " with no leaks and no errors");
    const char *sep = ": ";
    for (size_t i = 0; i < n; i++) {
      if (rows[i].listed) continue;
      size_t count = 0;
      for (size_t j = i; j < n; j++) {
        if (rows[j].listed || strcmp(rows[j].name, rows[i].name) != 0) continue;
        count++;
        rows[j].listed = true;
      }
      fprintf(stderr, "%s%s x%zu", sep, rows[i].name, count);
      sep = ", ";
    }
    fprintf(stderr, "\n");
  }
  char b1[32], b2[32], b3[32];
  fprintf(stderr, "%s  total: %s bytes leaked in %s blocks, %" PRIu64 " error(s), %s bytes still reachable",
          bold, th(b1, t_leaked), th(b2, t_blocks), t_errors, th(b3, t_reach));
  if (t_unclass) fprintf(stderr, ", %s bytes unclassified (no exit scan)", th(b1, t_unclass));
  fprintf(stderr, "; %zu of %zu processes with leaks or errors%s\n", with, n, off);
  fflush(stderr);
  free(rows);
}

/* ---- run ---------------------------------------------------------------------------- */

int cmd_run(int argc, char **argv) {
  run_opts o;
  int pr = parse(argc, argv, &o);
  if (pr != 0) {
    free(o.skip);
    return pr > 0 ? 0 : CLI_EXIT_USAGE;
  }
  cli_warn_unknown_env();

  /* The program. */
  const char *name = o.prog_argv[0], *why = NULL;
  char *prog = resolve(name, &why);
  if (!prog) {
    cli_error("%s: %s", name, why);
    return CLI_EXIT_USAGE;
  }
  char buf[768];
  why = cannot_preload(prog, buf, sizeof buf, 0);
  if (why) {
    if (strcmp(prog, name) == 0) cli_error("%s: %s", name, why);
    else cli_error("%s (%s): %s", name, prog, why);
    free(prog);
    return CLI_EXIT_USAGE;
  }

  /* The suppressions, checked now; the processes read the file themselves. */
  char *supp_abs = NULL;
  report_suppressions *supp = NULL;
  if (o.supp) {
    char err[600];
    supp = report_suppressions_load(o.supp, err, sizeof err);
    if (!supp || !(supp_abs = realpath(o.supp, NULL))) {
      cli_error("--suppressions %s", supp ? strerror(errno) : err);
      report_suppressions_free(supp);
      free(prog);
      return CLI_EXIT_USAGE;
    }
  }

  /* Outputs, before anything runs. */
  bool trace_to_dir = false;
  char *tmp_base = NULL;
  bool ok = true;
  if (o.json && !cli_check_output_file("--json", o.json)) ok = false;
  if (ok && o.html && !cli_check_output_file("--html", o.html)) ok = false;
  if (ok && o.folded && !cli_check_output_file("--folded", o.folded)) ok = false;
  if (ok && o.folded_peak && !cli_check_output_file("--folded-peak", o.folded_peak)) ok = false;
  if (ok && o.trace) {
    struct stat st;
    size_t tl = strlen(o.trace);
    trace_to_dir = (stat(o.trace, &st) == 0 && S_ISDIR(st.st_mode)) || (tl && o.trace[tl - 1] == '/');
    if (trace_to_dir) {
      ok = cli_check_output_dir("--trace", o.trace, true);
      tmp_base = ok ? realpath(o.trace, NULL) : NULL;
    } else {
      char probe[PATH_MAX];
      const char *pp = strstr(o.trace, "%p");
      if (pp) snprintf(probe, sizeof probe, "%.*s0%s", (int)(pp - o.trace), o.trace, pp + 2);
      else snprintf(probe, sizeof probe, "%s", o.trace);
      ok = cli_check_output_file("--trace", probe);
      char copy[PATH_MAX];
      snprintf(copy, sizeof copy, "%s", probe);
      tmp_base = ok ? realpath(dirname(copy), NULL) : NULL;
    }
  }
  char *preload = ok ? find_preload() : NULL;
  if (!ok || !preload) {
    free(tmp_base);
    free(prog);
    free(supp_abs);
    report_suppressions_free(supp);
    return CLI_EXIT_USAGE;
  }

  /* The private directory of the per-process traces, next
   * to where the traces are kept (a rename, not a copy), or in TMPDIR. */
  char dir[PATH_MAX];
  const char *tmpdir = getenv("TMPDIR");
  if (tmp_base) snprintf(dir, sizeof dir, "%s/.tagalloc-run-XXXXXX", tmp_base);
  else snprintf(dir, sizeof dir, "%s/tagalloc-run-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  free(tmp_base);
  if (!mkdtemp(dir)) {
    cli_error("cannot make a private directory %s: %s", dir, strerror(errno));
    free(prog);
    free(preload);
    free(supp_abs);
    report_suppressions_free(supp);
    return CLI_EXIT_USAGE;
  }
  char *adir = realpath(dir, NULL);
  if (adir) {
    snprintf(dir, sizeof dir, "%s", adir);
    free(adir);
  }
  char **env = child_env(&o, preload, dir, supp_abs);
  if (!env) {
    cli_error("out of memory");
    remove_dir(dir);
    return CLI_EXIT_USAGE;
  }

  /* Start it. */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  fflush(stdout);
  fflush(stderr);
  signals_install();
  sigset_t oldmask;
  signals_block(&oldmask);
  pid_t child = fork();
  if (child < 0) {
    cli_error("fork: %s", strerror(errno));
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    remove_dir(dir);
    return CLI_EXIT_USAGE;
  }
  if (child == 0) {
    for (size_t i = 0; i < NRELAYED; i++)
      if (installed[i]) signal(relayed[i], SIG_DFL);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    execve(prog, o.prog_argv, env);
    if (errno == ENOEXEC) {   /* as execvp: a script without #! goes to the shell */
      char **sh = calloc((size_t)o.prog_argc + 2, sizeof *sh);
      if (sh) {
        sh[0] = "sh";
        sh[1] = prog;
        for (int i = 1; i < o.prog_argc; i++) sh[i + 1] = o.prog_argv[i];
        execve("/bin/sh", sh, env);
      }
    }
    int e = errno;
    char msg[PATH_MAX + 128];
    int n = snprintf(msg, sizeof msg, "tagalloc: %s: cannot execute: %s\n", name, strerror(e));
    if (n > 0) cli_write_all(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    _exit(e == ENOENT ? 127 : 126);
  }
  the_child = child;
  sigprocmask(SIG_SETMASK, &oldmask, NULL);
  reaped_list rl = { 0 };
  int status = wait_all(child, &rl, name);

  /* The processes' traces, the names they are kept under, and the report
   * model of them all: every output below is rendered from it. */
  size_t nprocs = 0;
  cli_proc *procs = collect(dir, &nprocs);
  bool problems = false;
  char **kept = calloc(nprocs ? nprocs : 1, sizeof *kept);
  size_t first_trace = SIZE_MAX;   /* --trace FILE: the program's own (first) trace */
  for (size_t i = 0; i < nprocs && first_trace == SIZE_MAX; i++)
    if ((pid_t)procs[i].pid == child) first_trace = i;
  if (first_trace == SIZE_MAX && nprocs) first_trace = 0;
  for (size_t i = 0, other = 1; kept && i < nprocs; i++)
    kept[i] = trace_destination(&o, trace_to_dir, &procs[i], i == first_trace ? 0 : other++);
  report_model *rm = build_model(&o, procs, nprocs, kept, &rl, child, supp);
  if (!rm) cli_error("out of memory building the report");
  for (size_t i = 0; rm && i < nprocs; i++) {
    const report_process *p = procs[i].model;
    if (!p) continue;
    if (!o.quiet) report_process_text(&o, &procs[i], &rl, child);
    problems |= p->findings_count > 0 || p->summary.errors > 0;
  }
  if (rm && !o.quiet) rollup(rm, name);

  /* The joined JSON, the page and the folded stacks. */
  if (rm && o.json) cli_write_json(o.json, rm);
  if (rm) cli_write_renderings(rm, o.html, o.folded, o.folded_peak);
  report_model_free(rm);

  /* The traces: kept, or gone with the directory. */
  size_t others = 0;
  for (size_t i = 0; kept && i < nprocs; i++) {
    if (!kept[i]) continue;
    if (!move_file(procs[i].trace, kept[i])) cli_error("--trace: cannot keep %s: %s", kept[i], strerror(errno));
    else if (!trace_to_dir && i != first_trace && !strstr(o.trace, "%p")) others++;
  }
  if (others)
    cli_warn("--trace %s: %zu other process(es) traced: their traces are in %s.PID", o.trace, others,
             o.trace);
  if (nprocs == 0)
    cli_warn("no process of %s was audited (no trace was written: did the preload library load?)", name);
  for (size_t i = 0; kept && i < nprocs; i++) free(kept[i]);
  free(kept);
  remove_dir(dir);
  cli_procs_free(procs, nprocs);
  report_suppressions_free(supp);
  free(rl.v);
  free(prog);
  free(preload);
  free(supp_abs);
  free(o.skip);
  for (size_t i = 0; env[i]; i++)
    if (strncmp(env[i], "LD_PRELOAD=", 11) == 0 || strncmp(env[i], "TAGALLOC_", 9) == 0) {
      bool from_environ = false;
      for (size_t j = 0; environ[j] && !from_environ; j++) from_environ = environ[j] == env[i];
      if (!from_environ) free(env[i]);
    }
  free(env);

  /* Exit as the program did. */
  fflush(stdout);
  fflush(stderr);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    struct rlimit no_core = { 0, 0 };
    setrlimit(RLIMIT_CORE, &no_core);   /* the program dumped its own core, if any */
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig;   /* a signal that does not kill */
  }
  if (problems && o.has_error_exitcode) return o.error_exitcode;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
