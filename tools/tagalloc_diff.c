/* tagalloc_diff.c - `tagalloc diff BASE NEW [--fail-on-increase]`: the
 * change, callsite by callsite, in allocations, bytes allocated and bytes
 * and blocks leaked between two runs.  BASE and NEW are each a trace (the
 * report model's callsites) or a JSON document of `tagalloc report --json`
 * or `tagalloc run --json` ("callsites" of each process; a process without
 * them, as run's in-process objects, gives its leaks by the top frame of
 * their allocation stacks, and no allocation counts).  Callsites are keyed
 * by "function file:line" of the innermost frame, so addresses that moved
 * (ASLR, a rebuild) still match.  With --fail-on-increase the exit status
 * is 1 when any callsite allocates more often, more bytes, or leaks more. */
#include "tagalloc_cli.h"
#include "model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char    *key;
  uint64_t allocs, bytes, leaked_bytes, leaked_blocks;
  bool     has_allocs;           /* the input said how often it allocated */
} site;

typedef struct {
  site   *v;
  size_t  n, cap;
  size_t *ix;                    /* open addressing on the key: index + 1, 0 empty */
  size_t  icap;
} sites;

static size_t key_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)h;
}

/* The site of key, NULL when there is none (add: made when missing; NULL
 * then means out of memory). */
static site *site_find(sites *s, const char *key, bool add) {
  if (add && (s->n + 1) * 2 > s->icap) {
    size_t cap = s->icap ? s->icap * 2 : 256;
    size_t *ix = calloc(cap, sizeof *ix);
    if (!ix) return NULL;
    for (size_t i = 0; i < s->n; i++) {
      size_t j = key_hash(s->v[i].key) & (cap - 1);
      while (ix[j]) j = (j + 1) & (cap - 1);
      ix[j] = i + 1;
    }
    free(s->ix);
    s->ix = ix;
    s->icap = cap;
  }
  if (!s->icap) return NULL;
  size_t j = key_hash(key) & (s->icap - 1);
  while (s->ix[j]) {
    if (strcmp(s->v[s->ix[j] - 1].key, key) == 0) return &s->v[s->ix[j] - 1];
    j = (j + 1) & (s->icap - 1);
  }
  if (!add) return NULL;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    site *nv = realloc(s->v, cap * sizeof *nv);
    if (!nv) return NULL;
    s->v = nv;
    s->cap = cap;
  }
  site *x = &s->v[s->n];
  memset(x, 0, sizeof *x);
  if (!(x->key = strdup(key))) return NULL;
  s->ix[j] = ++s->n;
  return x;
}

static site *site_get(sites *s, const char *key) { return site_find(s, key, true); }

static void sites_free(sites *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i].key);
  free(s->v);
  free(s->ix);
}

/* ---- a small JSON reader: values into a tree -------------------------------------- */

typedef enum { JNULL, JBOOL, JNUM, JSTR, JARR, JOBJ } jtype;

typedef struct jval {
  jtype        type;
  double       num;
  char        *str;              /* JSTR: decoded; a member's key for members of JOBJ */
  struct jval *kids;             /* JARR, JOBJ */
  size_t       nkids;
  char        *key;
} jval;

typedef struct {
  const char *p, *end, *start;
  const char *why;
} jin;

static void jv_free(jval *v) {
  for (size_t i = 0; i < v->nkids; i++) jv_free(&v->kids[i]);
  free(v->kids);
  free(v->str);
  free(v->key);
}

static void ws(jin *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static bool fail(jin *j, const char *why) {
  if (!j->why) j->why = why;
  return false;
}

static void put_utf8(char **o, unsigned c) {
  if (c < 0x80) {
    *(*o)++ = (char)c;
  } else if (c < 0x800) {
    *(*o)++ = (char)(0xC0 | c >> 6);
    *(*o)++ = (char)(0x80 | (c & 0x3F));
  } else {
    *(*o)++ = (char)(0xE0 | c >> 12);
    *(*o)++ = (char)(0x80 | ((c >> 6) & 0x3F));
    *(*o)++ = (char)(0x80 | (c & 0x3F));
  }
}

static bool jstring(jin *j, char **out) {
  if (j->p >= j->end || *j->p != '"') return fail(j, "expected a string");
  const char *a = ++j->p;
  while (j->p < j->end && *j->p != '"') j->p += *j->p == '\\' ? 2 : 1;
  if (j->p >= j->end) return fail(j, "a string does not end");
  char *s = malloc((size_t)(j->p - a) + 1), *o = s;
  if (!s) return fail(j, "out of memory");
  for (const char *q = a; q < j->p; q++) {
    if (*q != '\\') {
      *o++ = *q;
      continue;
    }
    q++;
    switch (*q) {
    case 'n': *o++ = '\n'; break;
    case 't': *o++ = '\t'; break;
    case 'r': *o++ = '\r'; break;
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'u': {
      unsigned c = 0;
      for (int k = 0; k < 4; k++) {
        q++;
        if (q >= j->p) {
          free(s);
          return fail(j, "a bad \\u escape");
        }
        char h = *q;
        c = c * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
      }
      put_utf8(&o, c);
      break;
    }
    default: *o++ = *q; break;
    }
  }
  *o = '\0';
  j->p++;
  *out = s;
  return true;
}

static bool jvalue(jin *j, jval *v, int depth);

static bool jlist(jin *j, jval *v, int depth, char close, bool members) {
  j->p++;
  ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    return true;
  }
  size_t cap = 0;
  for (;;) {
    if (v->nkids == cap) {
      cap = cap ? cap * 2 : 8;
      jval *nk = realloc(v->kids, cap * sizeof *nk);
      if (!nk) return fail(j, "out of memory");
      v->kids = nk;
    }
    jval *k = &v->kids[v->nkids];
    memset(k, 0, sizeof *k);
    ws(j);
    char *key = NULL;
    if (members) {
      if (!jstring(j, &key)) return false;
      ws(j);
      if (j->p >= j->end || *j->p != ':') {
        free(key);
        return fail(j, "expected ':'");
      }
      j->p++;
    }
    v->nkids++;
    k->key = key;
    if (!jvalue(j, k, depth + 1)) return false;
    ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == close) {
      j->p++;
      return true;
    }
    return fail(j, members ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static bool jvalue(jin *j, jval *v, int depth) {
  ws(j);
  if (j->p >= j->end) return fail(j, "the document ends too early");
  if (depth > 64) return fail(j, "nested too deeply");
  switch (*j->p) {
  case '{': v->type = JOBJ; return jlist(j, v, depth, '}', true);
  case '[': v->type = JARR; return jlist(j, v, depth, ']', false);
  case '"': v->type = JSTR; return jstring(j, &v->str);
  case 't':
  case 'f':
  case 'n': {
    const char *w = *j->p == 't' ? "true" : *j->p == 'f' ? "false" : "null";
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return fail(j, "an unknown word");
    v->type = *w == 'n' ? JNULL : JBOOL;
    v->num = *w == 't';
    j->p += n;
    return true;
  }
  default: {
    char *e;
    errno = 0;
    v->num = strtod(j->p, &e);
    if (e == j->p || e > j->end) return fail(j, "expected a value");
    v->type = JNUM;
    j->p = e;
    return true;
  }
  }
}

static const jval *member(const jval *o, const char *key) {
  if (!o || o->type != JOBJ) return NULL;
  for (size_t i = 0; i < o->nkids; i++)
    if (o->kids[i].key && strcmp(o->kids[i].key, key) == 0) return &o->kids[i];
  return NULL;
}

static uint64_t num(const jval *o, const char *key) {
  const jval *v = member(o, key);
  return v && v->type == JNUM && v->num > 0 ? (uint64_t)v->num : 0;
}

static const char *text(const jval *o, const char *key) {
  const jval *v = member(o, key);
  return v && v->type == JSTR ? v->str : NULL;
}

static bool is_leak_kind(const char *k) {
  return k && report_kind_is_leak(k) && strcmp(k, "unclassified") != 0 && strcmp(k, "leak.growth") != 0;
}

/* The key of a JSON frame, as model.c makes it. */
static void frame_key(const jval *f, char *buf, size_t len) {
  const char *fn = text(f, "function"), *file = text(f, "file"), *mod = text(f, "module");
  uint64_t line = num(f, "line");
  if (fn && file && line) snprintf(buf, len, "%s %s:%" PRIu64, fn, file, line);
  else if (fn && file) snprintf(buf, len, "%s %s", fn, file);
  else if (fn) snprintf(buf, len, "%s", fn);
  else if (mod) {
    const char *base = strrchr(mod, '/');
    const char *off = text(f, "module_offset");
    snprintf(buf, len, "%s+%s", base ? base + 1 : mod, off ? off : "0x0");
  } else {
    const char *a = text(f, "address");
    snprintf(buf, len, "%s", a ? a : "0x0");
  }
}

static bool load_json(const char *path, const char *data, size_t len, sites *out) {
  jin j = { data, data + len, data, NULL };
  jval root = { 0 };
  bool ok = jvalue(&j, &root, 0);
  if (ok) {
    ws(&j);
    if (j.p != j.end) ok = fail(&j, "text after the document");
  }
  const jval *procs = ok ? member(&root, "processes") : NULL;
  if (ok && (!procs || procs->type != JARR)) ok = fail(&j, "no \"processes\" list (not a tagalloc JSON report)");
  if (!ok) {
    cli_error("diff: %s: not a tagalloc JSON report: %s at byte %zu", path, j.why, (size_t)(j.p - j.start));
    jv_free(&root);
    return false;
  }
  for (size_t i = 0; ok && i < procs->nkids; i++) {
    const jval *p = &procs->kids[i];
    const jval *cs = member(p, "callsites");
    if (cs && cs->type == JARR) {
      for (size_t k = 0; ok && k < cs->nkids; k++) {
        const char *key = text(&cs->kids[k], "key");
        if (!key) continue;
        site *s = site_get(out, key);
        if (!s) ok = false;
        else {
          s->allocs += num(&cs->kids[k], "allocs");
          s->bytes += num(&cs->kids[k], "bytes");
          s->leaked_bytes += num(&cs->kids[k], "leaked_bytes");
          s->leaked_blocks += num(&cs->kids[k], "leaked_blocks");
          s->has_allocs = true;
        }
      }
      continue;
    }
    const jval *fs = member(p, "findings");
    for (size_t k = 0; ok && fs && fs->type == JARR && k < fs->nkids; k++) {
      const jval *f = &fs->kids[k];
      if (!is_leak_kind(text(f, "kind"))) continue;
      const jval *st = member(f, "stack");
      char key[4096] = "<no stack recorded>";
      if (st && st->type == JARR && st->nkids) frame_key(&st->kids[0], key, sizeof key);
      site *s = site_get(out, key);
      if (!s) ok = false;
      else {
        s->leaked_bytes += num(f, "bytes");
        s->leaked_blocks += num(f, "blocks");
      }
    }
  }
  jv_free(&root);
  if (!ok) cli_error("diff: %s: out of memory", path);
  return ok;
}

static bool load_trace(const char *path, sites *out) {
  char err[600];
  report_offline *o = report_offline_open(path, err, sizeof err);
  if (!o) {
    cli_error("diff: %s", err);
    return false;
  }
  const report_trace_model *tm = report_offline_model(o);
  if (tm->damaged) cli_warn("%s; the records before it are compared", tm->damage);
  report_model *m = report_model_new();
  report_process *p = m ? report_model_add_offline(m, o, NULL, NULL) : NULL;
  bool ok = p != NULL;
  for (size_t i = 0; ok && i < p->ncallsites; i++) {
    const report_callsite *c = &p->callsites[i];
    site *s = site_get(out, c->key);
    if (!s) {
      ok = false;
      break;
    }
    s->allocs += c->allocs;
    s->bytes += c->bytes;
    s->leaked_bytes += c->leaked_bytes;
    s->leaked_blocks += c->leaked_blocks;
    s->has_allocs = true;
  }
  if (!ok) cli_error("diff: %s: out of memory", path);
  if (m) report_model_free(m);
  else report_offline_free(o);
  return ok;
}

static bool load(const char *path, sites *out) {
  size_t len = 0;
  char *data = cli_read_file(path, &len);
  if (!data) {
    cli_error("diff: %s: %s", path, strerror(errno));
    return false;
  }
  bool ok;
  uint64_t magic = 0;
  if (len >= sizeof magic) memcpy(&magic, data, sizeof magic);
  if (magic == TR_MAGIC) {
    free(data);
    ok = load_trace(path, out);
  } else {
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\n' || data[i] == '\t' || data[i] == '\r')) i++;
    if (i == len || data[i] != '{') {
      cli_error("diff: %s: neither a tagalloc trace nor a JSON report", path);
      ok = false;
    } else {
      ok = load_json(path, data, len, out);
    }
    free(data);
  }
  return ok;
}

/* ---- the comparison ------------------------------------------------------------------ */

typedef struct {
  const char *key;
  site        base, now;
  int64_t     d_allocs, d_bytes, d_leaked, d_blocks;
} change;

static int64_t delta(uint64_t a, uint64_t b) { return (int64_t)b - (int64_t)a; }

static uint64_t mag(int64_t x) { return x < 0 ? (uint64_t)-x : (uint64_t)x; }

static int by_change(const void *a, const void *b) {
  const change *x = a, *y = b;
  uint64_t mx = mag(x->d_leaked) + mag(x->d_bytes), my = mag(y->d_leaked) + mag(y->d_bytes);
  if (mx != my) return mx < my ? 1 : -1;
  if (mag(x->d_allocs) != mag(y->d_allocs)) return mag(x->d_allocs) < mag(y->d_allocs) ? 1 : -1;
  return strcmp(x->key, y->key);
}

int cmd_diff(int argc, char **argv) {
  const char *in[2] = { NULL, NULL };
  int nin = 0;
  bool fail_on_increase = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--fail-on-increase") == 0) {
      fail_on_increase = true;
    } else if (argv[i][0] == '-' && argv[i][1] == '-' && argv[i][2]) {
      cli_error("diff: unknown option %s (see tagalloc --help)", argv[i]);
      return CLI_EXIT_USAGE;
    } else if (nin < 2) {
      in[nin++] = argv[i];
    } else {
      cli_error("diff: more than two inputs (usage: tagalloc diff BASE NEW [--fail-on-increase])");
      return CLI_EXIT_USAGE;
    }
  }
  if (nin < 2) {
    cli_error("diff: two inputs needed (usage: tagalloc diff BASE NEW [--fail-on-increase])");
    return CLI_EXIT_USAGE;
  }
  sites a = { 0 }, b = { 0 };
  if (!load(in[0], &a) || !load(in[1], &b)) {
    sites_free(&a);
    sites_free(&b);
    return CLI_EXIT_USAGE;
  }
  change *c = calloc(a.n + b.n + 1, sizeof *c);
  size_t n = 0;
  if (!c) {
    cli_error("out of memory");
    sites_free(&a);
    sites_free(&b);
    return 1;
  }
  for (size_t i = 0; i < a.n; i++) {
    c[n].key = a.v[i].key;
    c[n++].base = a.v[i];
  }
  for (size_t i = 0; i < b.n; i++) {
    const site *in_a = site_find(&a, b.v[i].key, false);
    if (!in_a) {
      c[n].key = b.v[i].key;
      c[n++].now = b.v[i];
    } else {
      c[in_a - a.v].now = b.v[i];
    }
  }
  bool increase = false, counted = true;
  int64_t t_allocs = 0, t_bytes = 0, t_leaked = 0, t_blocks = 0;
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) {
    change *x = &c[i];
    x->d_allocs = delta(x->base.allocs, x->now.allocs);
    x->d_bytes = delta(x->base.bytes, x->now.bytes);
    x->d_leaked = delta(x->base.leaked_bytes, x->now.leaked_bytes);
    x->d_blocks = delta(x->base.leaked_blocks, x->now.leaked_blocks);
    t_allocs += x->d_allocs;
    t_bytes += x->d_bytes;
    t_leaked += x->d_leaked;
    t_blocks += x->d_blocks;
    if (x->d_allocs || x->d_bytes || x->d_leaked || x->d_blocks) changed++;
    if (x->d_allocs > 0 || x->d_bytes > 0 || x->d_leaked > 0 || x->d_blocks > 0) increase = true;
  }
  for (size_t i = 0; i < a.n; i++) counted &= a.v[i].has_allocs;
  for (size_t i = 0; i < b.n; i++) counted &= b.v[i].has_allocs;
  if (n > 1) qsort(c, n, sizeof *c, by_change);

  printf("tagalloc diff: %s -> %s: %zu callsite(s), %zu changed\n", in[0], in[1], n, changed);
  if (!counted)
    printf("(an input has no allocation counts, only leaks: a run --json document; diff traces or report --json)\n");
  if (changed)
    printf("%-24s %-24s %-24s %-14s %s\n", "allocs (base -> new)", "bytes (base -> new)",
           "leaked bytes", "leaked blocks", "callsite");
  for (size_t i = 0; i < n; i++) {
    const change *x = &c[i];
    if (!(x->d_allocs || x->d_bytes || x->d_leaked || x->d_blocks)) continue;
    char col[4][64];
    snprintf(col[0], sizeof col[0], "%+" PRId64 " (%" PRIu64 " -> %" PRIu64 ")", x->d_allocs, x->base.allocs, x->now.allocs);
    snprintf(col[1], sizeof col[1], "%+" PRId64 " (%" PRIu64 " -> %" PRIu64 ")", x->d_bytes, x->base.bytes, x->now.bytes);
    snprintf(col[2], sizeof col[2], "%+" PRId64 " (%" PRIu64 " -> %" PRIu64 ")", x->d_leaked, x->base.leaked_bytes,
             x->now.leaked_bytes);
    snprintf(col[3], sizeof col[3], "%+" PRId64, x->d_blocks);
    printf("%-24s %-24s %-24s %-14s %s\n", col[0], col[1], col[2], col[3], x->key);
  }
  printf("total: allocs %+" PRId64 ", bytes %+" PRId64 ", leaked bytes %+" PRId64 ", leaked blocks %+" PRId64 "\n",
         t_allocs, t_bytes, t_leaked, t_blocks);
  if (fail_on_increase && increase) printf("tagalloc diff: FAIL: an increase (--fail-on-increase)\n");
  fflush(stdout);
  free(c);
  sites_free(&a);
  sites_free(&b);
  return fail_on_increase && increase ? 1 : 0;
}
