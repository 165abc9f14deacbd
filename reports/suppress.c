/* suppress.c - suppressions in LeakSanitizer's format (see report.h):
 * `leak:PATTERN` against the function, source file and module of each frame
 * of a leak's allocation stack, `tag:PATTERN` against its tag's name.
 *
 * Matching follows LSan's TemplateMatch: the pattern is a substring of the
 * name, `*` matches any run, `^` anchors at the start, `$` at the end.  As in
 * LSan, a stack is tried frame by frame from the innermost, and for each
 * frame the patterns in file order: the module first, then the function and
 * file of each of its inlined frames.  Tag patterns are tried before any
 * frame.  Runs at report time only; memory comes from plain malloc. */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { SUPP_LEAK, SUPP_TAG };

typedef struct {
  char    *pattern;
  int      type;
  int      line;
  uint64_t hits, bytes;   /* updated atomically */
} supp_entry;

struct report_suppressions {
  supp_entry *v;
  size_t      n, cap;
  size_t      nleak, ntag;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- parsing ----------------------------------------------------------------- */

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

void report_suppressions_free(report_suppressions *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) free(s->v[i].pattern);
  free(s->v);
  free(s);
}

static int add(report_suppressions *s, int type, const char *p, size_t len, int line) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    supp_entry *v = realloc(s->v, cap * sizeof *v);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  char *copy = malloc(len + 1);
  if (!copy) return -1;
  memcpy(copy, p, len);
  copy[len] = '\0';
  s->v[s->n++] = (supp_entry){ .pattern = copy, .type = type, .line = line };
  if (type == SUPP_LEAK) s->nleak++;
  else s->ntag++;
  return 0;
}

report_suppressions *report_suppressions_parse(const char *text, size_t len, const char *name,
                                               char *err, size_t errlen) {
  report_suppressions *s = calloc(1, sizeof *s);
  if (!s) {
    set_err(err, errlen, "%s: out of memory", name);
    return NULL;
  }
  const char *p = text, *end = text + len;
  for (int line = 1; p < end; line++) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *a = p, *b = eol;
    p = eol < end ? eol + 1 : end;
    if (memchr(a, '\0', (size_t)(b - a))) {
      set_err(err, errlen, "%s:%d: a NUL byte in the line (not a text file?)", name, line);
      goto fail;
    }
    while (a < b && is_blank(*a)) a++;
    while (b > a && is_blank(b[-1])) b--;
    if (a == b || *a == '#') continue;
    const char *colon = memchr(a, ':', (size_t)(b - a));
    int shown = (int)(b - a > 60 ? 60 : b - a);
    if (!colon) {
      set_err(err, errlen, "%s:%d: expected leak:PATTERN or tag:PATTERN, got \"%.*s\"%s", name, line,
              shown, a, b - a > 60 ? "..." : "");
      goto fail;
    }
    int type;
    size_t tlen = (size_t)(colon - a);
    if (tlen == 4 && memcmp(a, "leak", 4) == 0) type = SUPP_LEAK;
    else if (tlen == 3 && memcmp(a, "tag", 3) == 0) type = SUPP_TAG;
    else {
      set_err(err, errlen, "%s:%d: unknown suppression type \"%.*s\" (tagalloc knows leak: and tag:)",
              name, line, (int)(tlen > 40 ? 40 : tlen), a);
      goto fail;
    }
    const char *pat = colon + 1;
    while (pat < b && is_blank(*pat)) pat++;
    if (pat == b) {
      set_err(err, errlen, "%s:%d: empty pattern after \"%.*s:\"", name, line, (int)tlen, a);
      goto fail;
    }
    if (add(s, type, pat, (size_t)(b - pat), line) != 0) {
      set_err(err, errlen, "%s: out of memory", name);
      goto fail;
    }
  }
  return s;
fail:
  report_suppressions_free(s);
  return NULL;
}

report_suppressions *report_suppressions_load(const char *path, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    set_err(err, errlen, "%s: cannot open the suppressions file: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    set_err(err, errlen, "%s: the suppressions file is not a regular file", path);
    close(fd);
    return NULL;
  }
  size_t cap = (size_t)st.st_size + 1, len = 0;
  char *buf = malloc(cap);
  if (!buf) {
    set_err(err, errlen, "%s: out of memory", path);
    close(fd);
    return NULL;
  }
  for (;;) {
    if (len == cap) {
      char *n = realloc(buf, cap * 2);
      if (!n) {
        set_err(err, errlen, "%s: out of memory", path);
        free(buf);
        close(fd);
        return NULL;
      }
      buf = n;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      set_err(err, errlen, "%s: cannot read the suppressions file: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return NULL;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  close(fd);
  report_suppressions *s = report_suppressions_parse(buf, len, path, err, errlen);
  free(buf);
  return s;
}

static report_suppressions *default_set;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_load(void) {
  /* read when the ledger started: at exit the environment may be gone */
  const char *path = ta_option_string("suppressions");
  if (!path || !*path) return;
  char err[600], line[700];
  default_set = report_suppressions_load(path, err, sizeof err);
  if (!default_set) {
    int n = snprintf(line, sizeof line, "tagalloc: TAGALLOC_SUPPRESSIONS: %s; no suppressions used\n", err);
    if (n > 0) {
      ssize_t r = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
      (void)r;
    }
  }
}

report_suppressions *report_suppressions_default(void) {
  pthread_once(&default_once, default_load);
  return default_set;
}

/* ---- matching ------------------------------------------------------------------ */

/* LSan's TemplateMatch, except that a piece anchored at the end by `$` is
 * tried against the end of the name (LSan tries its first occurrence only). */
static int template_match(const char *t, const char *str) {
  if (!str || !*str) return 0;
  int start = 0, asterisk = 0;
  if (*t == '^') {
    start = 1;
    t++;
  }
  while (*t) {
    if (*t == '*') {
      t++;
      start = 0;
      asterisk = 1;
      continue;
    }
    if (*t == '$') return *str == '\0' || asterisk;
    if (*str == '\0') return 0;
    size_t len = strcspn(t, "*$"), slen = strlen(str);
    const char *spos;
    if (t[len] == '$' && t[len + 1] == '\0' && !start) {
      spos = slen >= len && memcmp(str + slen - len, t, len) == 0 ? str + slen - len : NULL;
    } else {
      spos = memmem(str, slen, t, len);
    }
    if (!spos) return 0;
    if (start && spos != str) return 0;
    str = spos + len;
    t += len;
    start = 0;
    asterisk = 0;
  }
  return 1;
}

static supp_entry *match(report_suppressions *s, int type, const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].type == type && template_match(s->v[i].pattern, name)) return &s->v[i];
  return NULL;
}

static supp_entry *match_stack(report_suppressions *s, const report_source *src, uint32_t stack) {
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = stack ? src->stack_frames(src->arg, stack, pcs, TA_MAX_DEPTH) : 0;
  if (!n) return NULL;
  report_ctx *ctx = report_source_ctx(src);
  for (size_t i = 0; i < n; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = ctx ? report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE) : 0;
    supp_entry *e = match(s, SUPP_LEAK, k > 0 && fr[0].module ? fr[0].module : "<unknown module>");
    for (int j = 0; !e && j < k; j++) {
      e = match(s, SUPP_LEAK, fr[j].function);
      if (!e) e = match(s, SUPP_LEAK, fr[j].file);
    }
    if (e) return e;
  }
  return NULL;
}

bool report_suppressed(const ta_finding *f, const report_source *src, report_suppressions *s) {
  if (!s) s = report_suppressions_default();
  if (!s || s->n == 0 || !f || !f->kind || ta_kind_is_error(f->kind)) return false;
  report_source ledger;
  if (!src) {
    report_source_ledger(&ledger);
    src = &ledger;
  }
  supp_entry *e = NULL;
  if (s->ntag && f->tag != TA_ANY && src->tag_name) e = match(s, SUPP_TAG, src->tag_name(src->arg, f->tag));
  if (!e && s->nleak) e = match_stack(s, src, f->stack);
  if (!e && s->nleak && f->alloc_stack && f->alloc_stack != f->stack) e = match_stack(s, src, f->alloc_stack);
  if (!e) return false;
  __atomic_add_fetch(&e->hits, f->blocks, __ATOMIC_RELAXED);
  __atomic_add_fetch(&e->bytes, f->bytes, __ATOMIC_RELAXED);
  return true;
}

void report_suppressions_reset_used(report_suppressions *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) {
    __atomic_store_n(&s->v[i].hits, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->v[i].bytes, 0, __ATOMIC_RELAXED);
  }
}

size_t report_suppressions_used(const report_suppressions *s, report_suppression_use *out, size_t max) {
  size_t k = 0;
  if (!s) return 0;
  for (size_t i = 0; i < s->n; i++) {
    uint64_t hits = __atomic_load_n(&s->v[i].hits, __ATOMIC_RELAXED);
    if (!hits) continue;
    if (out && k < max)
      out[k] = (report_suppression_use){ s->v[i].type == SUPP_LEAK ? "leak" : "tag", s->v[i].pattern, hits,
                                         __atomic_load_n(&s->v[i].bytes, __ATOMIC_RELAXED) };
    k++;
  }
  return k;
}
