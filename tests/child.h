/* child.h - run a piece of a test in a child process and capture what it
 * printed: for what only happens at exit (the exit report, ref.leak), for
 * options (read once per process), and for assertions that must abort.
 *
 *   child_result r;
 *   const char *env[] = { "TAGALLOC_DEPTH=4", NULL };
 *   child_exec("depth", env, &r);          // runs this program with argv[1] = "--child", argv[2] = "depth"
 *   assert_true(WIFEXITED(r.status));
 *   assert_non_null(strstr(r.err, "..."));
 *   child_result_free(&r);
 *
 * A test's main hands "--child MODE" to its own function before anything else.
 * The child's stdout and stderr go to memfds, read back whole after it ends. */
#ifndef TAGALLOC_TEST_CHILD_H
#define TAGALLOC_TEST_CHILD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  int   status;   /* as waitpid gives it */
  char *out;      /* the child's stdout, NUL-terminated (malloc) */
  char *err;      /* the child's stderr */
} child_result;

static char *child_slurp(int fd) {
  off_t n = lseek(fd, 0, SEEK_END);
  char *s = malloc(n > 0 ? (size_t)n + 1 : 1);
  if (s == NULL) abort();
  size_t got = 0;
  if (n > 0) {
    lseek(fd, 0, SEEK_SET);
    ssize_t k;
    while (got < (size_t)n && (k = read(fd, s + got, (size_t)n - got)) > 0) got += (size_t)k;
  }
  s[got] = '\0';
  close(fd);
  return s;
}

/* Forks; the child redirects stdout/stderr, sets env ("NAME=VALUE" strings),
 * then runs fn(arg) when fn is given (and exits 0 if it returns), else execs
 * this program with "--child MODE". */
static void child_run(void (*fn)(void *), void *arg, const char *mode, const char *const *env,
                      child_result *r) {
  int out = memfd_create("child-out", 0), err = memfd_create("child-err", 0);
  if (out < 0 || err < 0) abort();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) abort();
  if (pid == 0) {
    dup2(out, 1);
    dup2(err, 2);
    for (size_t i = 0; env && env[i]; i++) putenv((char *)env[i]);
    if (fn) {
      fn(arg);
      fflush(stdout);
      _exit(0);
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) _exit(126);
    self[n] = '\0';
    execl(self, self, "--child", mode, (char *)NULL);
    _exit(127);
  }
  if (waitpid(pid, &r->status, 0) != pid) abort();
  r->out = child_slurp(out);
  r->err = child_slurp(err);
}

static inline void child_exec(const char *mode, const char *const *env, child_result *r) {
  child_run(NULL, NULL, mode, env, r);
}

static inline void child_fork(void (*fn)(void *), void *arg, child_result *r) {
  child_run(fn, arg, NULL, NULL, r);
}

static inline void child_result_free(child_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

/* Prints what a child said, for a failing assertion's context. */
static inline void child_dump(const child_result *r) {
  fprintf(stderr, "---- child status 0x%x, stdout:\n%s---- stderr:\n%s----\n", r->status, r->out, r->err);
}

#ifdef assert_int_equal
/* Runs MODE (child_exec) and asserts that it exited with status 0, printing
 * what it said when it did not.  (After harness.h: it asserts with cmocka.) */
static inline void child_exec_ok(const char *mode, const char *const *env) {
  child_result r;
  child_exec(mode, env, &r);
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) child_dump(&r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  child_result_free(&r);
}
#endif

#endif
