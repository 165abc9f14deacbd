/* tagalloc.c - the command-line tool: `tagalloc run` audits a program under
 * the LD_PRELOAD shim (tagalloc_run.c), `tagalloc report` renders traces
 * later (tagalloc_report.c).  This file has main() and what both share. */
#include "tagalloc_cli.h"
#include "tagalloc.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

/* ---- messages ------------------------------------------------------------------- */

void cli_error(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  fputs("tagalloc: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

void cli_warn(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  fputs("tagalloc: warning: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

/* ---- files -------------------------------------------------------------------- */

bool cli_check_output_file(const char *opt, const char *path) {
  if (strcmp(path, "-") == 0) return true;   /* standard output */
  if (!*path) {
    cli_error("%s: an empty file name", opt);
    return false;
  }
  struct stat st;
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      cli_error("%s %s: is a directory, not a file", opt, path);
      return false;
    }
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NONBLOCK);   /* no O_TRUNC: nothing changes yet */
    if (fd < 0) {
      cli_error("%s %s: cannot write: %s", opt, path, strerror(errno));
      return false;
    }
    close(fd);
    return true;
  }
  if (errno != ENOENT) {
    cli_error("%s %s: cannot write: %s", opt, path, strerror(errno));
    return false;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    cli_error("%s %s: cannot create: %s", opt, path, strerror(errno));
    return false;
  }
  close(fd);
  unlink(path);   /* made for real at the end */
  return true;
}

bool cli_check_output_dir(const char *opt, const char *path, bool create) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT && create) {
      if (mkdir(path, 0777) == 0) return true;
      cli_error("%s %s: cannot create the directory: %s", opt, path, strerror(errno));
      return false;
    }
    cli_error("%s %s: %s", opt, path, strerror(errno));
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    cli_error("%s %s: not a directory", opt, path);
    return false;
  }
  char probe[4096];
  snprintf(probe, sizeof probe, "%s/.tagalloc-probe-XXXXXX", path);
  int fd = mkstemp(probe);
  if (fd < 0) {
    cli_error("%s %s: cannot write in the directory: %s", opt, path, strerror(errno));
    return false;
  }
  close(fd);
  unlink(probe);
  return true;
}

bool cli_one_stdout(const char *cmd, size_t n, const char *const *paths) {
  size_t dash = 0;
  for (size_t i = 0; i < n; i++) dash += paths[i] && strcmp(paths[i], "-") == 0;
  if (dash <= 1) return true;
  cli_error("%s: only one output can be - (standard output)", cmd);
  return false;
}

int cli_open_output(const char *path) {
  if (strcmp(path, "-") == 0) {
    fflush(stdout);
    return fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  }
  return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

char *cli_read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n + 1 >= cap) {
      char *b = realloc(buf, cap * 2);
      if (!b) {
        free(buf);
        buf = NULL;
        errno = ENOMEM;
        break;
      }
      buf = b;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      buf = NULL;
      errno = e;
      break;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  int e = errno;
  close(fd);
  errno = e;
  if (buf) {
    buf[n] = '\0';
    *len = n;
  }
  return buf;
}

bool cli_write_all(int fd, const char *buf, size_t len) {
  while (len) {
    ssize_t r = write(fd, buf, len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf += r;
    len -= (size_t)r;
  }
  return true;
}

/* ---- processes --------------------------------------------------------------- */

bool cli_trace_header(const char *path, uint32_t *pid, uint32_t *ppid, uint64_t *start_ns) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  tr_file_header h;
  ssize_t r = pread(fd, &h, sizeof h, 0);
  close(fd);
  if (r != (ssize_t)sizeof h || h.magic != TR_MAGIC) return false;
  *pid = h.pid;
  *ppid = h.ppid;
  *start_ns = h.start_ns;
  return true;
}

static int by_start(const void *a, const void *b) {
  const cli_proc *x = a, *y = b;
  if (x->start_ns != y->start_ns) return x->start_ns < y->start_ns ? -1 : 1;
  if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
  return strcmp(x->trace ? x->trace : "", y->trace ? y->trace : "");
}

void cli_procs_sort(cli_proc *p, size_t n) {
  if (n > 1) qsort(p, n, sizeof *p, by_start);
}

void cli_procs_free(cli_proc *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(p[i].trace);
  }
  free(p);
}

/* ---- the joined JSON ------------------------------------------------------------ */

bool cli_json_begin(int fd) {
  static const char head[] = "{\"tool\":\"tagalloc\",\"version\":\"" TA_VERSION "\",\"processes\":[\n";
  return cli_write_all(fd, head, sizeof head - 1);
}

bool cli_json_sep(int fd, size_t index) { return index == 0 || cli_write_all(fd, ",\n", 2); }

bool cli_json_end(int fd) { return cli_write_all(fd, "\n]}\n", 4); }

/* ---- options, the environment, the terminal ---------------------------------------- */

int cli_getopt(int argc, char **argv, const char *shorts, const struct option *longs, const char *cmd) {
  char sh[32];   /* ':' first (after a '+'): a missing value returns ':' */
  bool in_order = shorts[0] == '+';
  snprintf(sh, sizeof sh, "%s:%s", in_order ? "+" : "", shorts + in_order);
  opterr = 0;
  int c = getopt_long(argc, argv, sh, longs, NULL);
  if (c != '?' && c != ':') return c;
  const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
  const char *name = NULL;
  for (const struct option *o = longs; o->name && optopt; o++)
    if (o->val == optopt) name = o->name;
  if (c == ':') {
    if (name) cli_error("%s: --%s needs a value", cmd, name);
    else cli_error("%s: -%c needs a value", cmd, optopt);
  } else if (optopt && name && strncmp(arg, "--", 2) == 0) {
    cli_error("%s: --%s takes no value", cmd, name);
  } else if (optopt && optopt < 256 && isprint(optopt)) {
    cli_error("%s: unknown option -%c (see tagalloc %s --help)", cmd, optopt, cmd);
  } else {
    cli_error("%s: unknown or ambiguous option %s (see tagalloc %s --help)", cmd, arg, cmd);
  }
  return '?';
}

void cli_warn_unknown_env(void) {
  /* The tool's own copy of the ledger (the renderers read its options)
   * then stays quiet, as the audited processes do: the ledger warns only
   * where TAGALLOC_TRACE_EVENTS is unset (alloc/options.c); `tagalloc run`
   * sets it for each process anyway. */
  if (!getenv("TAGALLOC_TRACE_EVENTS")) setenv("TAGALLOC_TRACE_EVENTS", "1", 0);
  for (char **e = environ; e && *e; e++) {
    char hint[80];
    const char *name = ta_options_unknown(*e, hint, sizeof hint);
    if (!name) continue;
    int n = (int)strcspn(name, "=");
    if (hint[0]) cli_warn("TAGALLOC_%.*s is not an option (did you mean %s?); ignored", n, name, hint);
    else cli_warn("TAGALLOC_%.*s is not an option; ignored", n, name);
  }
}

const char *cli_thousands(char *buf, uint64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), k = 0;
  for (int i = 0; i < n; i++) {
    if (i && (n - i) % 3 == 0) buf[k++] = ',';
    buf[k++] = tmp[i];
  }
  buf[k] = '\0';
  return buf;
}

const char *cli_signed_thousands(char buf[32], int64_t v) {
  buf[0] = v < 0 ? '-' : '+';
  cli_thousands(buf + 1, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
  return buf;
}

bool cli_color(int fd) {
  const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
  return isatty(fd) && !(nc && *nc) && !(term && strcmp(term, "dumb") == 0);
}

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: tagalloc run [OPTIONS] [--] PROGRAM [ARGS...]\n"
          "       tagalloc report [OPTIONS] TRACE|DIR...\n"
          "       tagalloc diff [--fail-on-increase] BASE NEW\n"
          "       tagalloc --version | --help\n"
          "\n"
          "  run     audits PROGRAM and every process it starts: leaks and misuse, reported\n"
          "          on stderr by each process at exit; --json, --html, --folded outputs\n"
          "  report  renders traces (TAGALLOC_TRACE=path, or run --trace) after the run\n"
          "  diff    per-callsite change in allocations, bytes and leaks from BASE to NEW\n"
          "\n"
          "tagalloc COMMAND --help says more; the manuals are tagalloc(1), tagalloc-run(1),\n"
          "tagalloc-report(1), tagalloc-diff(1) and tagalloc(7) (the TAGALLOC_* variables).\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  /* each subcommand gets its name as argv[0], as getopt_long expects */
  if (strcmp(cmd, "run") == 0) return cmd_run(argc - 1, argv + 1);
  if (strcmp(cmd, "report") == 0) return cmd_report(argc - 1, argv + 1);
  if (strcmp(cmd, "diff") == 0) return cmd_diff(argc - 1, argv + 1);
  if (strcmp(cmd, "help") == 0 && argc > 2) {   /* tagalloc help run: tagalloc run --help */
    char *sub[] = { argv[2], "--help", NULL };
    if (strcmp(argv[2], "run") == 0) return cmd_run(2, sub);
    if (strcmp(argv[2], "report") == 0) return cmd_report(2, sub);
    if (strcmp(argv[2], "diff") == 0) return cmd_diff(2, sub);
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0) {
    printf("tagalloc %s\n", TA_VERSION);
    return 0;
  }
  cli_error("unknown command \"%s\" (expected run, report or diff; see tagalloc --help)", cmd);
  return CLI_EXIT_USAGE;
}
