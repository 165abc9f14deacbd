/* preload_exec.c - the shim and exec: the exit work of the image that goes
 * (preload_exit.c), and the environment passed on.
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
 * environment, built on the stack. */
#include "preload.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

extern char **environ;

/* ---- the environment of a new image ------------------------------------------------------ */

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*execveat_fn)(int, const char *, char *const[], char *const[], int);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
static execve_fn real_execve, real_execvpe;
static fexecve_fn real_fexecve;
static execveat_fn real_execveat;
static spawn_fn real_posix_spawn, real_posix_spawnp;

#define RESOLVE(var, name) do { void *s_ = _pl_next_sym(name); memcpy(&var, &s_, sizeof s_); } while (0)

/* The real functions, once (the first exec may come before the constructor). */
static void resolve_all(void) {
  static atomic_int done;
  if (atomic_load(&done)) return;
  RESOLVE(real_execve, "execve");
  RESOLVE(real_execvpe, "execvpe");
  RESOLVE(real_fexecve, "fexecve");
  RESOLVE(real_execveat, "execveat");
  RESOLVE(real_posix_spawn, "posix_spawn");
  RESOLVE(real_posix_spawnp, "posix_spawnp");
  atomic_store(&done, 1);
}

static bool path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

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
  if (!_pl_has_pid(_ta_opt.trace)) return;
  if (_pl_expand_path(_ta_opt.trace, from_suffix, from, sizeof from) &&
      _pl_expand_path(_ta_opt.trace, to_suffix, to, sizeof to))
    rename(from, to);
}

/* Before an exec: the exit work of the image going away.  Returns whether it
 * ran (the exec's failure must then undo the names). */
static bool before_exec(const char *file, bool search) {
  if (getpid() != _pl_pid || !_pl_ledger_live()) return false;
  ta_thread *t = _ta_self;
  if (t && t->guard > 0) return false;
  if (!exec_will_work(file, search)) return false;
  if (_pl_quiet_fork_child()) {
    _pl_quiet_end();
    return false;
  }
  /* "PID.N": the first N free for the trace */
  int n = 1;
  for (char b[PATH_MAX]; n < 10000; n++)
    if (!(_pl_has_pid(_ta_opt.trace) && _pl_expand_path(_ta_opt.trace, n, b, sizeof b) && path_exists(b))) break;
  _pl_exec_suffix = n;
  _pl_exit_code = -1;
  _pl_exit_work();
  rename_trace(0, n);
  return true;
}

/* The exec failed: this image goes on, and keeps the report made for it. */
static void exec_failed(bool reported) {
  if (!reported) return;
  int e = errno;
  rename_trace(_pl_exec_suffix, 0);
  _pl_exec_suffix = 0;
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

void _pl_exec_init(void) {
  resolve_all();
  Dl_info info;
  if (dladdr((void *)&_pl_pid, &info) && info.dli_fname && info.dli_fname[0]) {
    if (info.dli_fname[0] == '/' || !realpath(info.dli_fname, self_path))
      _ta_snprintf(self_path, sizeof self_path, "%s", info.dli_fname);
    size_t bl;
    self_base = base_of(self_path, strlen(self_path), &bl);
  }
  save_vars();
  if (!_ta_opt.follow) strip_own_environ();
}
