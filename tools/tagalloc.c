/* tagalloc.c - the command-line tool: `tagalloc run` audits a program under
 * the LD_PRELOAD shim (tagalloc_run.c), `tagalloc report` renders traces
 * later (tagalloc_report.c).  This file has main() and what both share. */
#include "tagalloc_cli.h"
#include "tagalloc.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* ---- a JSON object's top level ------------------------------------------------ */

typedef struct {
  const char *p, *end, *start;
  bool        bad;
} jparse;

static void j_ws(jparse *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static bool j_fail(jparse *j) {
  j->bad = true;
  return false;
}

static bool j_string(jparse *j, const char **s, size_t *n) {
  if (j->p >= j->end || *j->p != '"') return j_fail(j);
  const char *a = ++j->p;
  while (j->p < j->end && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) return j_fail(j);
    if (c == '\\') {
      j->p++;
      if (j->p >= j->end) return j_fail(j);
      if (*j->p == 'u') {
        for (int i = 0; i < 4; i++) {
          j->p++;
          if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p)) return j_fail(j);
        }
      } else if (!strchr("\"\\/bfnrt", *j->p)) {
        return j_fail(j);
      }
    }
    j->p++;
  }
  if (j->p >= j->end) return j_fail(j);
  if (s) *s = a;
  if (n) *n = (size_t)(j->p - a);
  j->p++;
  return true;
}

static bool j_number(jparse *j, long long *out) {
  const char *a = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') return j_fail(j);
  if (*j->p == '0') j->p++;
  else while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  bool integral = true;
  if (j->p < j->end && *j->p == '.') {
    integral = false;
    j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return j_fail(j);
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    integral = false;
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return j_fail(j);
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  }
  if (out && integral) {
    char tmp[32];
    size_t n = (size_t)(j->p - a);
    if (n < sizeof tmp) {
      memcpy(tmp, a, n);
      tmp[n] = '\0';
      *out = strtoll(tmp, NULL, 10);
    }
  }
  return true;
}

static bool j_value(jparse *j, int depth, cli_json_top *top);

static bool j_word(jparse *j, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return j_fail(j);
  j->p += n;
  return true;
}

static bool j_object(jparse *j, int depth, cli_json_top *top) {
  j->p++;   /* '{' */
  j_ws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
    return true;
  }
  for (;;) {
    const char *k;
    size_t kn;
    j_ws(j);
    if (!j_string(j, &k, &kn)) return false;
    j_ws(j);
    if (j->p >= j->end || *j->p != ':') return j_fail(j);
    j->p++;
    j_ws(j);
    long long *want = NULL;
    if (top && depth == 1) {
      if (kn == 3 && memcmp(k, "pid", 3) == 0) want = &top->pid;
      else if (kn == 14 && memcmp(k, "findings_count", 14) == 0) want = &top->findings_count;
      else if (kn == 6 && memcmp(k, "errors", 6) == 0) want = &top->errors;
    }
    if (want && j->p < j->end && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) {
      if (!j_number(j, want)) return false;
    } else if (!j_value(j, depth, NULL)) {
      return false;
    }
    j_ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == '}') {
      j->p++;
      return true;
    }
    return j_fail(j);
  }
}

static bool j_value(jparse *j, int depth, cli_json_top *top) {
  j_ws(j);
  if (j->p >= j->end || depth > 200) return j_fail(j);
  switch (*j->p) {
  case '{':
    return j_object(j, depth + 1, top);
  case '[':
    j->p++;
    j_ws(j);
    if (j->p < j->end && *j->p == ']') {
      j->p++;
      return true;
    }
    for (;;) {
      if (!j_value(j, depth + 1, NULL)) return false;
      j_ws(j);
      if (j->p < j->end && *j->p == ',') {
        j->p++;
        continue;
      }
      if (j->p < j->end && *j->p == ']') {
        j->p++;
        return true;
      }
      return j_fail(j);
    }
  case '"':
    return j_string(j, NULL, NULL);
  case 't':
    return j_word(j, "true");
  case 'f':
    return j_word(j, "false");
  case 'n':
    return j_word(j, "null");
  default:
    return j_number(j, NULL);
  }
}

void cli_json_scan(const char *text, size_t len, cli_json_top *out) {
  jparse j = { .p = text, .end = text + len, .start = text };
  memset(out, 0, sizeof *out);
  out->pid = out->findings_count = out->errors = -1;
  j_ws(&j);
  bool ok = j.p < j.end && *j.p == '{' && j_value(&j, 0, out);
  if (ok) {
    j_ws(&j);
    ok = j.p == j.end;
    if (!ok) j.bad = true;
  }
  out->valid = ok && !j.bad;
  out->error_offset = (size_t)(j.p - text);
}

bool cli_json_fill(char **text, size_t *len, const char *key, const char *value) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":null", key);
  /* The first match is the object's own key: inside a JSON string every
   * quote is escaped, so the pattern cannot start there. */
  char *at = memmem(*text, *len, pat, strlen(pat));
  if (!at) return false;
  size_t klen = strlen(key) + 3, vlen = strlen(value), old = strlen(pat);
  size_t nlen = *len - old + klen + vlen;
  char *n = malloc(nlen + 1);
  if (!n) return false;
  size_t pre = (size_t)(at - *text);
  memcpy(n, *text, pre);
  snprintf(n + pre, klen + 1, "\"%s\":", key);
  memcpy(n + pre + klen, value, vlen);
  memcpy(n + pre + klen + vlen, at + old, *len - pre - old);
  n[nlen] = '\0';
  free(*text);
  *text = n;
  *len = nlen;
  return true;
}

char *cli_json_quote(const char *s) {
  size_t n = strlen(s);
  char *q = malloc(n * 6 + 3), *o = q;
  if (!q) return NULL;
  *o++ = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      *o++ = '\\';
      *o++ = (char)*p;
    } else if (*p < 0x20 || *p >= 0x80) {   /* bytes past ASCII escaped one by one: always valid JSON */
      o += sprintf(o, "\\u%04x", *p);
    } else {
      *o++ = (char)*p;
    }
  }
  *o++ = '"';
  *o = '\0';
  return q;
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
  return strcmp(x->trace ? x->trace : x->json ? x->json : "", y->trace ? y->trace : y->json ? y->json : "");
}

void cli_procs_sort(cli_proc *p, size_t n) {
  if (n > 1) qsort(p, n, sizeof *p, by_start);
}

void cli_procs_free(cli_proc *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(p[i].trace);
    free(p[i].json);
    free(p[i].json_text);
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

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: tagalloc run [OPTIONS] -- PROGRAM [ARGS...]\n"
          "       tagalloc report TRACE... [--json FILE] [--html FILE] [--folded FILE]\n"
          "                       [--folded-peak FILE] [--suppressions FILE]\n"
          "       tagalloc diff BASE NEW [--fail-on-increase]\n"
          "       tagalloc --version | --help\n"
          "\n"
          "run: runs PROGRAM (found on PATH) with libtagalloc-preload.so preloaded; every\n"
          "process it starts prints its leak and error report on stderr at exit.\n"
          "  --json FILE            one JSON document with every process's findings\n"
          "  --html FILE            one self-contained HTML page: findings, timeline, flame graphs\n"
          "  --folded FILE          leaked bytes by stack, folded (frame;frame;frame bytes)\n"
          "  --folded-peak FILE     live bytes at the peak by stack, folded\n"
          "  --trace FILE|DIR       keep the traces: DIR/PID.trace for each process, or the\n"
          "                         first process's in FILE (the others in FILE.PID)\n"
          "  --unwind exact|fast    stacks by DWARF unwinding (default) or frame pointers\n"
          "  --guard                freed blocks' pages made inaccessible (use after free)\n"
          "  --suppressions FILE    leak:PATTERN and tag:PATTERN lines (LeakSanitizer's format)\n"
          "  --error-exitcode N     exit with N when any process had a leak or an error\n"
          "  --no-follow            do not audit the programs PROGRAM executes (exec)\n"
          "Exit status: PROGRAM's own (a signal that killed it kills tagalloc the same way),\n"
          "or N with --error-exitcode; 2 when tagalloc refuses to start PROGRAM.\n"
          "\n"
          "report: renders traces (TAGALLOC_TRACE=path, or run --trace) after the run,\n"
          "symbolized offline; a directory stands for the *.trace files in it.\n"
          "  --json FILE            the same JSON document as run's\n"
          "  --suppressions FILE    as for run\n"
          "  --html, --folded, --folded-peak FILE   as for run\n"
          "\n"
          "diff: per-callsite change in allocations, bytes and leaks from BASE to NEW\n"
          "(each a trace, or a JSON document of run --json or report --json).\n"
          "  --fail-on-increase     exit 1 when any callsite allocates or leaks more\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
  if (strcmp(cmd, "report") == 0) return cmd_report(argc - 2, argv + 2);
  if (strcmp(cmd, "diff") == 0) return cmd_diff(argc - 2, argv + 2);
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("tagalloc %s\n", TA_VERSION);
    return 0;
  }
  cli_error("unknown command \"%s\" (expected run, report or diff; see tagalloc --help)", cmd);
  return CLI_EXIT_USAGE;
}
