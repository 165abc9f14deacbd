/* tagalloc_diff.c - `tagalloc diff BASE NEW [--fail-on-increase]`: the
 * change, callsite by callsite, in allocations, bytes allocated and bytes
 * and blocks leaked between two runs.  BASE and NEW are each a trace (the
 * report model's callsites) or a JSON document of `tagalloc report --json`
 * or `tagalloc run --json` ("callsites" of each process; a process without
 * them, as run's in-process objects, gives its leaks by the top frame of
 * their allocation stacks, and no allocation counts).  Callsites are keyed
 * by the innermost frame's function, file name (no folders) and the line's
 * offset from the function's first line (report_callsite_key), so that
 * addresses that moved (ASLR, a rebuild), another checkout folder and lines
 * added elsewhere in the file still match.  JSON is read with libjansson.
 * With --fail-on-increase the exit status is 1 when any callsite allocates
 * more often, more bytes, or leaks more. */
#include "tagalloc_cli.h"
#include "model.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
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

/* ---- a JSON document (libjansson) --------------------------------------------------- */

static uint64_t num(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  if (json_is_integer(v)) return json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
  return json_is_real(v) && json_real_value(v) > 0 ? (uint64_t)json_real_value(v) : 0;
}

static const char *text(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));   /* NULL unless a string */
}

/* The key of a JSON frame, as model.c makes a callsite's (a run --json
 * frame has no function start line: "function file.c"). */
static void frame_key(const json_t *f, char *buf, size_t len) {
  const char *fn = text(f, "function"), *file = text(f, "file"), *mod = text(f, "module");
  report_callsite_key(fn, file, (int)num(f, "line"), (int)num(f, "function_line"), buf, len);
  if (buf[0]) return;
  if (fn) {
    snprintf(buf, len, "%s", fn);
  } else if (mod) {
    const char *base = strrchr(mod, '/');
    const char *off = text(f, "module_offset");
    snprintf(buf, len, "%s+%s", base ? base + 1 : mod, off ? off : "0x0");
  } else {
    const char *a = text(f, "address");
    snprintf(buf, len, "%s", a ? a : "0x0");
  }
}

static bool load_json(const char *path, const char *data, size_t len, sites *out) {
  json_error_t err;
  json_t *root = json_loadb(data, len, 0, &err);
  if (!root) {
    cli_error("diff: %s: not a tagalloc JSON report: %s at byte %zu", path, err.text, (size_t)err.position);
    return false;
  }
  json_t *procs = json_object_get(root, "processes");
  if (!json_is_array(procs)) {
    cli_error("diff: %s: not a tagalloc JSON report: no \"processes\" list", path);
    json_decref(root);
    return false;
  }
  bool ok = true;
  size_t i, k;
  json_t *p, *c;
  json_array_foreach(procs, i, p) {
    json_t *cs = json_object_get(p, "callsites");
    if (json_is_array(cs)) {
      json_array_foreach(cs, k, c) {
        const char *key = text(c, "key");
        if (!key) continue;
        site *s = site_get(out, key);
        if (!s) {
          ok = false;
          break;
        }
        s->allocs += num(c, "allocs");
        s->bytes += num(c, "bytes");
        s->leaked_bytes += num(c, "leaked_bytes");
        s->leaked_blocks += num(c, "leaked_blocks");
        s->has_allocs = true;
      }
      continue;
    }
    json_t *fs = json_object_get(p, "findings");
    json_array_foreach(fs, k, c) {   /* nothing when fs is not an array */
      if (!ta_kind_is_leak(text(c, "kind"))) continue;
      json_t *st = json_object_get(c, "stack");
      char key[4096] = "<no stack recorded>";
      if (json_array_size(st)) frame_key(json_array_get(st, 0), key, sizeof key);
      site *s = site_get(out, key);
      if (!s) {
        ok = false;
        break;
      }
      s->leaked_bytes += num(c, "bytes");
      s->leaked_blocks += num(c, "blocks");
    }
  }
  json_decref(root);
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

static void diff_usage(FILE *f) {
  fputs("usage: tagalloc diff [--fail-on-increase] BASE NEW\n"
        "The change, callsite by callsite, in allocations, bytes allocated and bytes and\n"
        "blocks leaked from BASE to NEW, each a trace or a JSON document of tagalloc report\n"
        "--json or tagalloc run --json.  A callsite is the innermost frame of an allocation\n"
        "stack, keyed \"function file.c:+N\" (N: lines from the function's first line), so\n"
        "that it matches across rebuilds, folders and edits elsewhere in the file.\n"
        "\n"
        "  --fail-on-increase     exit 1 when any callsite allocates or leaks more\n"
        "  -h, --help             this help\n"
        "\n"
        "Exit status: 0; 1 with --fail-on-increase and an increase; 2 for a bad command\n"
        "line or an input that cannot be read.  See tagalloc-diff(1).\n", f);
}

int cmd_diff(int argc, char **argv) {
  bool fail_on_increase = false;
  static const struct option longs[] = {
    { "fail-on-increase", no_argument, NULL, 'f' },
    { "help", no_argument, NULL, 'h' },
    { 0, 0, 0, 0 },
  };
  int c0;
  while ((c0 = cli_getopt(argc, argv, "h", longs, "diff")) != -1) {
    if (c0 == 'f') {
      fail_on_increase = true;
    } else if (c0 == 'h') {
      diff_usage(stdout);
      return 0;
    } else {
      return CLI_EXIT_USAGE;
    }
  }
  const char *in[2] = { NULL, NULL };
  int nin = argc - optind;
  if (nin != 2) {
    cli_error("diff: %s (usage: tagalloc diff [--fail-on-increase] BASE NEW)",
              nin < 2 ? "two inputs needed" : "more than two inputs");
    return CLI_EXIT_USAGE;
  }
  in[0] = argv[optind];
  in[1] = argv[optind + 1];
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
    char col[4][96], d[32], u[32], v[32];
    snprintf(col[0], sizeof col[0], "%s (%s -> %s)", cli_signed_thousands(d, x->d_allocs),
             cli_thousands(u, x->base.allocs), cli_thousands(v, x->now.allocs));
    snprintf(col[1], sizeof col[1], "%s (%s -> %s)", cli_signed_thousands(d, x->d_bytes),
             cli_thousands(u, x->base.bytes), cli_thousands(v, x->now.bytes));
    snprintf(col[2], sizeof col[2], "%s (%s -> %s)", cli_signed_thousands(d, x->d_leaked),
             cli_thousands(u, x->base.leaked_bytes), cli_thousands(v, x->now.leaked_bytes));
    snprintf(col[3], sizeof col[3], "%s", cli_signed_thousands(d, x->d_blocks));
    printf("%-24s %-24s %-24s %-14s %s\n", col[0], col[1], col[2], col[3], x->key);
  }
  char t1[32], t2[32], t3[32], t4[32];
  printf("total: allocs %s, bytes %s, leaked bytes %s, leaked blocks %s\n", cli_signed_thousands(t1, t_allocs),
         cli_signed_thousands(t2, t_bytes), cli_signed_thousands(t3, t_leaked), cli_signed_thousands(t4, t_blocks));
  if (fail_on_increase && increase) printf("tagalloc diff: FAIL: an increase (--fail-on-increase)\n");
  fflush(stdout);
  free(c);
  sites_free(&a);
  sites_free(&b);
  return fail_on_increase && increase ? 1 : 0;
}
