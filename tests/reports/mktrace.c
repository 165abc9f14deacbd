/* mktrace.c - writes the synthetic traces of the golden tests
 * (tests/reports/traces/), byte for byte the same on every run: fixed pids,
 * addresses, times and stacks in a module that does not exist (its frames
 * stay "app+0xOFF").  The stored traces were made with it:
 *
 *   build/tests/reports/mktrace tests/reports/traces
 *
 * leaks.trace     a clean exit: tags, 5 marks, a site that grows by 64 bytes
 *                 per iteration, leak groups, a double free, refcounts
 * killed.trace    no END record: live blocks are unclassified; an error event
 * truncated.trace leaks.trace cut in the middle of a record
 * base.trace, new.trace   the same program before and after a change that
 *                 allocates more at one callsite and leaks at another
 * xss.trace       tag, slot, detail and module names that are HTML and
 *                 script: `<img src=x onerror=...>`, `</script>`
 *
 * They are version 1 traces (whole STACK records), which the reader still
 * reads; the ledger's own traces (FRAME records) are checked by
 * tests/unit/test_trace.c and the integration tests. */
#include "trace_format.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned char *b;
  size_t n, cap;
} out;

static void put(out *o, const void *p, size_t n) {
  if (o->n + n > o->cap) {
    o->cap = (o->n + n) * 2 + 4096;
    o->b = realloc(o->b, o->cap);
    if (!o->b) exit(1);
  }
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

/* One record: the fixed part, then strings (NULL ends the list). */
static void rec(out *o, uint8_t type, const void *fixed, size_t nfixed, const char *s0, const char *s1,
                const char *s2) {
  const char *s[3] = { s0, s1, s2 };
  size_t size = 8 + nfixed;
  for (int i = 0; i < 3 && s[i]; i++) size += strlen(s[i]) + 1;
  size_t padded = (size + 7) & ~(size_t)7;
  tr_header h = { (uint32_t)padded, type, { 0, 0, 0 } };
  put(o, &h, sizeof h);
  put(o, fixed, nfixed);
  for (int i = 0; i < 3 && s[i]; i++) put(o, s[i], strlen(s[i]) + 1);
  static const char zero[8];
  put(o, zero, padded - size);
}

static void header(out *o, uint32_t pid, uint32_t ppid, uint64_t start) {
  tr_file_header h = { TR_MAGIC, 1, sizeof h, pid, ppid, start };   /* version 1: whole STACK records */
  put(o, &h, sizeof h);
}

static void module(out *o, const char *path) {
  tr_module m = { 0x400000, 0x500000, 0 };
  rec(o, TR_MODULE, &m, sizeof m, path, NULL, NULL);
}

static void tag(out *o, uint32_t id, const char *name) { rec(o, TR_TAG, &id, sizeof id, name, NULL, NULL); }

/* Stack id with n frames: 0x401000 + 0x100 * f[i]. */
static void stack(out *o, uint32_t id, int n, const int *f) {
  tr_stack s = { id, (uint16_t)n, 0 };
  uint64_t fr[16];
  for (int i = 0; i < n; i++) fr[i] = 0x401000 + 0x100 * (uint64_t)f[i] + 0x10;
  size_t size = 8 + sizeof s + 8 * (size_t)n;
  tr_header h = { (uint32_t)size, TR_STACK, { 0, 0, 0 } };
  put(o, &h, sizeof h);
  put(o, &s, sizeof s);
  put(o, fr, 8 * (size_t)n);
}

static uint64_t seq;

static void alloc(out *o, uint64_t addr, uint64_t size, uint32_t st, uint16_t t) {
  tr_alloc a = { seq++, addr, size, st, t, 0, 0, 1 };
  rec(o, TR_ALLOC, &a, sizeof a, NULL, NULL, NULL);
}

static void dealloc(out *o, uint64_t addr, uint32_t st) {
  tr_free f = { seq++, addr, st, 1 };
  rec(o, TR_FREE, &f, sizeof f, NULL, NULL, NULL);
}

static void mark(out *o, uint64_t id, uint64_t ns) {
  tr_mark m = { seq++, id, ns, 1, 0 };
  rec(o, TR_MARK, &m, sizeof m, NULL, NULL, NULL);
}

static void timestamp(out *o, uint64_t ns) {
  tr_time t = { seq, ns };
  rec(o, TR_TIME, &t, sizeof t, NULL, NULL, NULL);
}

static void ref(out *o, uint64_t obj, int64_t count, int32_t delta, uint32_t st) {
  tr_ref r = { seq++, obj, count, delta, st, 1, 0 };
  rec(o, TR_REF, &r, sizeof r, NULL, NULL, NULL);
}

static void finding(out *o, const char *kind, uint64_t bytes, uint64_t blocks, uint64_t addr, uint64_t holder,
                    uint32_t st, uint32_t ast, uint32_t fst, uint32_t xst, uint16_t t, const char *slot,
                    const char *detail) {
  tr_finding f = { bytes, blocks, addr, holder, st, ast, fst, xst, t, 0, 0 };
  rec(o, TR_FINDING, &f, sizeof f, kind, slot, detail);
}

static void finding_event(out *o, const char *kind, uint64_t addr, uint32_t st) {
  tr_finding_event e = { seq, addr, st, 1 };
  rec(o, TR_FINDING_EVENT, &e, sizeof e, kind, NULL, NULL);
}

static void end(out *o, uint64_t ns) {
  tr_end e = { seq, ns };
  rec(o, TR_END, &e, sizeof e, NULL, NULL, NULL);
}

static void save(const char *dir, const char *name, const out *o, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(o->b, 1, len, f) != len || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

#define T0 1000000000ull   /* the traces' start_ns: 1 s */

/* The program of leaks.trace: main (frame 1) calls train (2), which each
 * iteration allocates a tensor (3, freed) and appends to a tape (4, never
 * freed: +64 bytes per iteration); setup (5) leaks a buffer (6) and a node
 * tree (7 -> 8). */
static void leaks(const char *dir) {
  out o = { 0 };
  seq = 100;
  header(&o, 4242, 4241, T0);
  module(&o, "/nonexistent/golden/app");
  tag(&o, 1, "tensor.data");
  tag(&o, 2, "tape.op");
  const int s1[] = { 3, 2, 1 }, s2[] = { 4, 2, 1 }, s3[] = { 6, 5, 1 }, s4[] = { 8, 7, 5, 1 },
            s5[] = { 9, 2, 1 }, s6[] = { 10, 2, 1 }, s7[] = { 11, 5, 1 };
  stack(&o, 1, 3, s1);
  stack(&o, 2, 3, s2);
  stack(&o, 3, 3, s3);
  stack(&o, 4, 4, s4);
  stack(&o, 5, 3, s5);
  stack(&o, 6, 3, s6);
  stack(&o, 7, 3, s7);
  alloc(&o, 0x10000, 1000, 3, 1);            /* leaked buffer */
  alloc(&o, 0x11000, 48, 4, 0);              /* leaked tree: 3 nodes */
  alloc(&o, 0x11100, 48, 4, 0);
  alloc(&o, 0x11200, 48, 4, 0);
  for (int it = 0; it < 5; it++) {
    mark(&o, (uint64_t)it + 1, T0 + 1000000ull * (uint64_t)(it + 1));
    timestamp(&o, T0 + 1000000ull * (uint64_t)(it + 1) + 100000);
    alloc(&o, 0x20000, 4096, 1, 1);          /* tensor, freed */
    alloc(&o, 0x30000 + 0x100 * (uint64_t)it, 64, 2, 2);   /* tape op, kept */
    dealloc(&o, 0x20000, 5);
  }
  alloc(&o, 0x40000, 32, 6, 1);              /* double free */
  dealloc(&o, 0x40000, 5);
  finding_event(&o, "free.double", 0x40000, 5);
  ref(&o, 0x50000, 1, 0, 7);                 /* refcount: init, +1, -1, -1, -1 */
  ref(&o, 0x50000, 2, 1, 7);
  ref(&o, 0x50000, 1, -1, 6);
  ref(&o, 0x50000, 0, -1, 6);
  ref(&o, 0x50000, -1, -1, 6);
  finding_event(&o, "ref.underflow", 0x50000, 6);
  finding(&o, "free.double", 32, 1, 0x40000, 0, 5, 6, 5, 0, 1, NULL, NULL);
  finding(&o, "ref.underflow", 0, 1, 0x50000, 0, 6, 0, 0, 0, 0, NULL, NULL);
  finding(&o, "leak.direct", 1000, 1, 0x10000, 0, 3, 0, 0, 0, 1, NULL, NULL);
  finding(&o, "leak.direct", 48, 1, 0x11000, 0, 4, 0, 0, 0, 0, NULL, NULL);
  finding(&o, "leak.indirect", 96, 2, 0x11100, 0, 4, 0, 0, 0, 0, NULL, NULL);
  end(&o, T0 + 6000000);
  save(dir, "leaks.trace", &o, o.n);
  /* cut in the middle of the last FINDING record */
  save(dir, "truncated.trace", &o, o.n - 16 - 40);
  free(o.b);
}

static void killed(const char *dir) {
  out o = { 0 };
  seq = 10;
  header(&o, 777, 1, T0);
  module(&o, "/nonexistent/golden/app");
  tag(&o, 1, "gpu.buffer");
  const int s1[] = { 3, 1 }, s2[] = { 4, 1 }, s3[] = { 5, 1 };
  stack(&o, 1, 2, s1);
  stack(&o, 2, 2, s2);
  stack(&o, 3, 2, s3);
  for (int i = 0; i < 4; i++) alloc(&o, 0x1000 + 0x100 * (uint64_t)i, 256, 1, 1);
  alloc(&o, 0x9000, 16, 2, 0);
  dealloc(&o, 0x9000, 3);
  finding_event(&o, "use.after-free", 0x9000, 3);
  timestamp(&o, T0 + 2500000);
  alloc(&o, 0x5000, 4000, 2, 0);
  save(dir, "killed.trace", &o, o.n);
  free(o.b);
}

/* base: site A allocates 10 x 100 bytes (freed), site B 5 x 10 bytes, site
 * C leaks 1 x 8.  new: site A allocates 12 x 100, B the same, C leaks 3 x 8,
 * site D (new) 1 x 50 freed. */
static void diffs(const char *dir, const char *name, int a, int c, bool d) {
  out o = { 0 };
  seq = 1;
  header(&o, 1000, 1, T0);
  module(&o, "/nonexistent/golden/app");
  tag(&o, 1, "malloc");
  const int sa[] = { 20, 1 }, sb[] = { 21, 1 }, sc[] = { 22, 1 }, sd[] = { 23, 1 }, sf[] = { 24, 1 };
  stack(&o, 1, 2, sa);
  stack(&o, 2, 2, sb);
  stack(&o, 3, 2, sc);
  stack(&o, 4, 2, sd);
  stack(&o, 5, 2, sf);
  for (int i = 0; i < a; i++) {
    alloc(&o, 0x1000, 100, 1, 1);
    dealloc(&o, 0x1000, 5);
  }
  for (int i = 0; i < 5; i++) {
    alloc(&o, 0x2000, 10, 2, 1);
    dealloc(&o, 0x2000, 5);
  }
  for (int i = 0; i < c; i++) alloc(&o, 0x3000 + 0x10 * (uint64_t)i, 8, 3, 1);
  if (d) {
    alloc(&o, 0x4000, 50, 4, 1);
    dealloc(&o, 0x4000, 5);
  }
  finding(&o, "leak.direct", 8 * (uint64_t)c, (uint64_t)c, 0x3000, 0, 3, 0, 0, 0, 1, NULL, NULL);
  end(&o, T0 + 1000000);
  save(dir, name, &o, o.n);
  free(o.b);
}

#define XSS "<img src=x onerror=\"document.body.dataset.pwned=1\">"

static void xss(const char *dir) {
  out o = { 0 };
  seq = 1;
  header(&o, 31337, 1, T0);
  module(&o, "/nonexistent/</script><script>document.body.dataset.pwned=1</script>/" XSS "app");
  tag(&o, 1, XSS);
  tag(&o, 2, "tag&amp;<b>bold</b>");
  const int s1[] = { 30, 1 }, s2[] = { 31, 1 };
  stack(&o, 1, 2, s1);
  stack(&o, 2, 2, s2);
  alloc(&o, 0x1000, 24, 1, 1);
  alloc(&o, 0x2000, 40, 2, 2);
  finding(&o, "leak.orphan", 24, 1, 0x1000, 0x9000, 1, 0, 0, 2, 1, XSS, "</script><script>document.body.dataset.pwned=1</script>");
  finding(&o, "leak.direct", 40, 1, 0x2000, 0, 2, 0, 0, 0, 2, NULL, NULL);
  end(&o, T0 + 1000);
  save(dir, "xss.trace", &o, o.n);
  free(o.b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: mktrace DIR\n");
    return 2;
  }
  leaks(argv[1]);
  killed(argv[1]);
  diffs(argv[1], "base.trace", 10, 1, false);
  diffs(argv[1], "new.trace", 12, 3, true);
  xss(argv[1]);
  return 0;
}
