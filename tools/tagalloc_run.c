/* tagalloc_run.c - `tagalloc run [OPTIONS] -- PROGRAM [ARGS...]`.
 *
 * Checks PROGRAM (found on PATH) and every output before anything runs,
 * starts it with the preload library first in LD_PRELOAD and the options in
 * TAGALLOC_* variables, and waits for it and every process it started (the
 * tool is their subreaper: orphans come back to it).  Each audited process
 * writes its trace and its JSON object into a private directory and prints
 * its own report on stderr; afterwards the tool reports, from its trace, each
 * process that ended without its exit report (SIGKILL), joins the JSON
 * objects, keeps the traces if asked, and exits as the program did. */
#include "tagalloc_cli.h"
#include "model.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
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
  const char *json, *html, *folded, *folded_peak, *trace, *unwind, *supp;
  bool        guard, no_follow, has_error_exitcode;
  int         error_exitcode;
  char      **prog_argv;
  int         prog_argc;
} run_opts;

/* ---- the command line ---------------------------------------------------------- */

static int parse(int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  int i = 0;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-') break;   /* PROGRAM without "--" */
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
#define IS(name) (len == sizeof(name) - 1 && strncmp(a, name, len) == 0)
    if (IS("--guard") || IS("--no-follow")) {
      if (eq) {
        cli_error("run: %.*s takes no value", (int)len, a);
        return -1;
      }
      if (IS("--guard")) o->guard = true;
      else o->no_follow = true;
      continue;
    }
    const char **dst = NULL;
    const char *value = NULL;
    if (IS("--json")) dst = &o->json;
    else if (IS("--html")) dst = &o->html;
    else if (IS("--folded")) dst = &o->folded;
    else if (IS("--folded-peak")) dst = &o->folded_peak;
    else if (IS("--trace")) dst = &o->trace;
    else if (IS("--unwind")) dst = &o->unwind;
    else if (IS("--suppressions")) dst = &o->supp;
    else if (IS("--error-exitcode")) dst = &value;
    else {
      cli_error("run: unknown option %s (see tagalloc --help)", a);
      return -1;
    }
    if (eq) {
      *dst = eq + 1;
    } else if (i + 1 < argc) {
      *dst = argv[++i];
    } else {
      cli_error("run: %s needs a value", a);
      return -1;
    }
    if (IS("--error-exitcode")) {
      char *end;
      errno = 0;
      long n = strtol(value, &end, 10);
      if (errno || end == value || *end || n < 0 || n > 255) {
        cli_error("run: --error-exitcode %s: not an exit status (0 to 255)", value);
        return -1;
      }
      o->error_exitcode = (int)n;
      o->has_error_exitcode = true;
    }
#undef IS
  }
  if (o->unwind && strcmp(o->unwind, "exact") != 0 && strcmp(o->unwind, "fast") != 0) {
    cli_error("run: --unwind %s: expected exact or fast", o->unwind);
    return -1;
  }
  if (i >= argc) {
    cli_error("run: no program given (usage: tagalloc run [OPTIONS] -- PROGRAM [ARGS...])");
    return -1;
  }
  o->prog_argv = argv + i;
  o->prog_argc = argc - i;
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
    snprintf(cand, sizeof cand, "%s/libtagalloc-preload.so", dirname(self));
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
  static const char *ours[] = { "LD_PRELOAD", "TAGALLOC_TRACE", "TAGALLOC_JSON", "TAGALLOC_REPORT",
                                "TAGALLOC_UNWIND", "TAGALLOC_GUARD", "TAGALLOC_FOLLOW",
                                "TAGALLOC_SUPPRESSIONS" };
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
  char trace[PATH_MAX + 16], json[PATH_MAX + 16];
  snprintf(trace, sizeof trace, "%s/%%p.trace", dir);
  snprintf(json, sizeof json, "%s/%%p.json", dir);
  env[k++] = env_pair("LD_PRELOAD", pl);
  free(pl);
  env[k++] = env_pair("TAGALLOC_TRACE", trace);
  env[k++] = env_pair("TAGALLOC_JSON", json);
  env[k++] = env_pair("TAGALLOC_REPORT", "1");
  if (o->unwind) env[k++] = env_pair("TAGALLOC_UNWIND", o->unwind);
  if (o->guard) env[k++] = env_pair("TAGALLOC_GUARD", "1");
  if (o->no_follow) env[k++] = env_pair("TAGALLOC_FOLLOW", "0");
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
 * first is passed with sigqueue and TA_RELAY_VALUE (preload_proc.c): the
 * program ignores that copy when it got the signal itself already (a kill
 * of the whole process group).  One more of the same within 2 s is passed
 * with a plain kill: the program skips the rest of its report (as a
 * second Ctrl-C does).  Once it has ended, any of them stops the wait for
 * the processes it left behind. */
#define TA_RELAY_VALUE 0x74616c6c   /* the same in tools/preload_proc.c */
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

/* The processes of the run: X.trace and X.json paired by name. */
static cli_proc *collect(const char *dir, size_t *count) {
  cli_proc *v = NULL;
  size_t n = 0, cap = 0;
  for (int pass = 0; pass < 2; pass++) {   /* traces first, then JSON files */
    DIR *d = opendir(dir);
    if (!d) break;
    struct dirent *e;
    while ((e = readdir(d))) {
      const char *ext = pass == 0 ? ".trace" : ".json";
      if (!ends_with(e->d_name, ext) || ends_with(e->d_name, ".gen.json")) continue;
      size_t stem = strlen(e->d_name) - strlen(ext);
      cli_proc *p = NULL;
      if (pass == 1) {
        for (size_t i = 0; i < n && !p; i++) {
          const char *t = v[i].trace ? strrchr(v[i].trace, '/') + 1 : NULL;
          if (t && strlen(t) == stem + 6 && strncmp(t, e->d_name, stem) == 0) p = &v[i];
        }
      }
      if (!p) {
        if (n == cap) {
          size_t c = cap ? cap * 2 : 16;
          cli_proc *nv = realloc(v, c * sizeof *nv);
          if (!nv) break;
          v = nv;
          cap = c;
        }
        p = &v[n++];
        memset(p, 0, sizeof *p);
        p->start_ns = UINT64_MAX;
      }
      char *path = path_join(dir, e->d_name);
      if (pass == 0) {
        p->trace = path;
        p->has_header = path && cli_trace_header(path, &p->pid, &p->ppid, &p->start_ns);
      } else {
        p->json = path;
        if (!p->trace) {   /* no trace: the pid from the name */
          char *end;
          unsigned long pid = strtoul(e->d_name, &end, 10);
          if (end != e->d_name) p->pid = (uint32_t)pid;
        }
      }
    }
    closedir(d);
  }
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

/* A process that left no JSON object (no exit report): its report from the
 * trace on stderr, and its object generated into dir/X.gen.json. */
static void report_from_trace(cli_proc *p, size_t index, const char *dir, const reaped_list *rl, pid_t child,
                              const run_opts *o, report_suppressions *supp, const char *kept_trace) {
  char err[600];
  report_offline *off = report_offline_open(p->trace, err, sizeof err);
  if (!off) {
    cli_warn("process %" PRIu32 " left no report, and its trace cannot be read: %s", p->pid, err);
    return;
  }
  const report_trace_model *m = report_offline_model(off);
  report_source *src = report_offline_source(off);
  src->suppressions = supp;
  const reaped *r = reaped_find(rl, (pid_t)p->pid);
  char how[128];
  describe_end(how, sizeof how, r);
  if (m->damaged) cli_warn("%s; the records before it are reported", m->damage);
  fflush(stdout);
  fprintf(stderr, "==%" PRIu32 "== tagalloc: process %" PRIu32 "%s%s%s %s without its exit report; "
          "from its trace:\n", p->pid, p->pid, (pid_t)p->pid == child ? " (" : "",
          (pid_t)p->pid == child ? o->prog_argv[0] : "", (pid_t)p->pid == child ? ")" : "", how);
  fflush(stderr);
  report_text_render(STDERR_FILENO, src);

  char name[64];
  snprintf(name, sizeof name, "%" PRIu32 ".%zu.gen.json", p->pid, index);
  char *path = path_join(dir, name);
  int fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
  if (fd >= 0) {
    report_process_info info = {
      .ppid = (long)m->ppid,
      .argv = (pid_t)p->pid == child ? (const char *const *)o->prog_argv : NULL,
      .argc = (pid_t)p->pid == child ? o->prog_argc : 0,
      .exit_code = r && WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1,
      .signal = r && WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0,
      .clean_exit = m->clean_exit,
      .trace = kept_trace,
    };
    bool ok = report_source_json(fd, src, &info) == 0;
    close(fd);
    size_t len = 0;
    char *text = ok ? cli_read_file(path, &len) : NULL;
    cli_json_top top;
    if (text) {
      cli_json_scan(text, len, &top);
      p->json_text = text;
      p->json_len = len;
      p->problems = top.findings_count > 0 || top.errors > 0;
    }
    unlink(path);
  }
  free(path);
  report_offline_free(off);
}

/* The report model of the run's traces, rendered as --html, --folded and
 * --folded-peak ask. */
static void render_model(const run_opts *o, cli_proc *procs, size_t nprocs, char **kept, const reaped_list *rl,
                         pid_t child, report_suppressions *supp) {
  report_model *rm = report_model_new();
  if (!rm) {
    cli_error("out of memory building the report");
    return;
  }
  report_model_set_argv(rm, o->prog_argv, o->prog_argc);
  for (size_t i = 0; i < nprocs; i++) {
    cli_proc *p = &procs[i];
    if (!p->trace) continue;
    char err[600];
    report_offline *off = report_offline_open(p->trace, err, sizeof err);
    if (!off) {
      cli_warn("--html/--folded: process %" PRIu32 " left out: %s", p->pid, err);
      continue;
    }
    const report_trace_model *m = report_offline_model(off);
    const reaped *r = reaped_find(rl, (pid_t)p->pid);
    bool last = true;
    for (size_t j = i + 1; j < nprocs; j++) last &= procs[j].pid != p->pid;
    report_process_info info = {
      .ppid = (long)m->ppid,
      .argv = (pid_t)p->pid == child ? (const char *const *)o->prog_argv : NULL,
      .argc = (pid_t)p->pid == child ? o->prog_argc : 0,
      .exit_code = r && last && WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1,
      .signal = r && last && WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0,
      .clean_exit = m->clean_exit,
      .trace = kept ? kept[i] : NULL,
    };
    if (!report_model_add_offline(rm, off, supp, &info))
      cli_warn("--html/--folded: process %" PRIu32 " left out: out of memory", p->pid);
  }
  cli_write_renderings(rm, o->html, o->folded, o->folded_peak);
  report_model_free(rm);
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

/* ---- run ---------------------------------------------------------------------------- */

int cmd_run(int argc, char **argv) {
  run_opts o;
  if (parse(argc, argv, &o) != 0) return CLI_EXIT_USAGE;

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

  /* The private directory of the per-process traces and JSON objects, next
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

  /* What each process said, or what its trace says. */
  size_t nprocs = 0;
  cli_proc *procs = collect(dir, &nprocs);
  bool problems = false;
  for (size_t i = 0; i < nprocs; i++) {
    cli_proc *p = &procs[i];
    if (p->json) {
      size_t len = 0;
      char *text = cli_read_file(p->json, &len);
      cli_json_top top;
      if (text) cli_json_scan(text, len, &top);
      if (text && top.valid) {
        p->json_text = text;
        p->json_len = len;
        while (p->json_len && (text[p->json_len - 1] == '\n' || text[p->json_len - 1] == ' '))
          p->json_len--;
        p->problems = top.findings_count > 0 || top.errors > 0;
      } else {
        if (text)
          cli_warn("%s: not one complete JSON object (it stops being JSON at byte %zu)%s", p->json,
                   top.error_offset, p->trace ? "; using the process's trace instead" : "");
        else
          cli_warn("%s: %s", p->json, strerror(errno));
        free(text);
      }
    }
  }
  /* The kept traces' names, then the reports of the processes without one. */
  char **kept = calloc(nprocs ? nprocs : 1, sizeof *kept);
  size_t first_trace = SIZE_MAX;   /* --trace FILE: the program's own (first) trace */
  for (size_t i = 0; i < nprocs && first_trace == SIZE_MAX; i++)
    if (procs[i].trace && (pid_t)procs[i].pid == child) first_trace = i;
  for (size_t i = 0; i < nprocs && first_trace == SIZE_MAX; i++)
    if (procs[i].trace) first_trace = i;
  for (size_t i = 0, other = 1; kept && i < nprocs; i++)
    if (procs[i].trace) kept[i] = trace_destination(&o, trace_to_dir, &procs[i], i == first_trace ? 0 : other++);
  for (size_t i = 0; i < nprocs; i++) {
    cli_proc *p = &procs[i];
    if (!p->json_text && p->trace) {
      report_from_trace(p, i, dir, &rl, child, &o, supp, kept ? kept[i] : NULL);
    } else if (p->json_text) {
      /* What the process could not know: where its trace is kept, and how
       * it ended when we reaped it (the last image of its pid only). */
      if (kept && kept[i]) {
        char *q = cli_json_quote(kept[i]);
        if (q) cli_json_fill(&p->json_text, &p->json_len, "trace", q);
        free(q);
      }
      const reaped *r = reaped_find(&rl, (pid_t)p->pid);
      bool last = true;
      for (size_t j = i + 1; j < nprocs; j++) last &= procs[j].pid != p->pid;
      if (r && last) {
        char v[32];
        snprintf(v, sizeof v, "%d", WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status));
        cli_json_fill(&p->json_text, &p->json_len, WIFEXITED(r->status) ? "exit_code" : "signal", v);
        const char *abbrev = WIFSIGNALED(r->status) ? sigabbrev_np(WTERMSIG(r->status)) : NULL;
        if (abbrev) {
          snprintf(v, sizeof v, "\"SIG%s\"", abbrev);
          cli_json_fill(&p->json_text, &p->json_len, "signal_name", v);
        }
      }
    }
    problems |= p->problems;
  }

  /* The joined JSON. */
  if (o.json) {
    int fd = open(o.json, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool wok = fd >= 0 && cli_json_begin(fd);
    size_t k = 0;
    for (size_t i = 0; wok && i < nprocs; i++) {
      if (!procs[i].json_text) continue;
      wok = cli_json_sep(fd, k++) && cli_write_all(fd, procs[i].json_text, procs[i].json_len);
    }
    wok = wok && cli_json_end(fd);
    if (fd >= 0 && close(fd) != 0) wok = false;
    if (!wok) cli_error("--json %s: %s", o.json, strerror(errno));
  }

  /* The page and the folded stacks: the report model of the traces. */
  if (o.html || o.folded || o.folded_peak)
    render_model(&o, procs, nprocs, kept, &rl, child, supp);

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
