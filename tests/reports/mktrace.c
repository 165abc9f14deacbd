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
 * threads.trace   4 threads, each event in its thread's buffer and the
 *                 buffers written when full, as the ledger's writer does
 *                 (the main thread's only at exit): blocks freed by one
 *                 thread and their addresses allocated again by another,
 *                 two threads' events numbered alike (the TSC), a queue
 *                 that grows across 4 marks, a leak, the ledger's SUMMARY
 * threads-cut.trace  threads.trace cut in the middle of a record
 * threads2.trace  the same with 2 marks: no growth to find, so the text
 *                 alone needs no replay
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

/* ---- threads.trace: the program, simulated step by step ---------------------------- */

#define TH_THREADS 4
#define TH_CAP 512

typedef struct {
  out    buf;                  /* the thread's buffer: its records not written yet */
  size_t events, flush_at;     /* events in it; written when it holds flush_at (0: only at exit) */
} th_buf;

static th_buf thb[TH_THREADS + 1];
static uint64_t th_ns;

static void th_flush(out *o, uint32_t t) {
  th_buf *b = &thb[t];
  if (!b->events) return;
  timestamp(o, th_ns);              /* the buffer's TIME record, as the writer starts each one */
  put(o, b->buf.b, b->buf.n);
  b->buf.n = 0;
  b->events = 0;
}

static void th_event(out *o, uint32_t t) {
  th_ns += 1000;
  if (++thb[t].events == thb[t].flush_at) th_flush(o, t);
}

static void th_alloc(out *o, uint32_t t, uint64_t s, uint64_t addr, uint64_t size, uint32_t st, uint16_t tg) {
  tr_alloc a;
  memset(&a, 0, sizeof a);          /* its tail padding too: the file is the same on every run */
  a.seq = s, a.addr = addr, a.size = size, a.stack = st, a.tag = tg, a.thread = t;
  rec(&thb[t].buf, TR_ALLOC, &a, sizeof a, NULL, NULL, NULL);
  th_event(o, t);
}

static void th_free(out *o, uint32_t t, uint64_t s, uint64_t addr, uint32_t st) {
  tr_free f = { s, addr, st, t };
  rec(&thb[t].buf, TR_FREE, &f, sizeof f, NULL, NULL, NULL);
  th_event(o, t);
}

/* The program, with a mark every mark_every iterations (of 160): main
 * (thread 1) sets up 3 blocks of tag 1, frees one and leaks one;
 * producers (2 and 3) allocate queue items of tag 2 at one callsite, 3
 * every other iteration with the same number as 2's; the consumer (4)
 * frees the oldest item in 3 iterations of 4: the queue grows.  Freed
 * addresses are reused, newest first, by whichever producer allocates
 * next. */
static void threads(const char *dir, const char *name, int mark_every, const char *cut_name) {
  out o = { 0 };
  header(&o, 4242, 4200, T0);
  module(&o, "/nonexistent/threads");
  tag(&o, 1, "th.setup");
  tag(&o, 2, "th.queue");
  const int s1[] = { 40, 1 }, s2[] = { 41, 42, 1 }, s3[] = { 43, 44, 1 };
  stack(&o, 1, 2, s1);
  stack(&o, 2, 3, s2);
  stack(&o, 3, 3, s3);
  th_ns = T0;
  const size_t flush_at[TH_THREADS + 1] = { 0, 0, 7, 5, 9 };
  for (uint32_t t = 1; t <= TH_THREADS; t++) thb[t] = (th_buf){ { 0 }, 0, flush_at[t] };
  uint64_t s = 1, live = 0, peak = 0, allocs = 0, frees = 0;
  uint64_t queue[TH_CAP], qsize[TH_CAP], freed[TH_CAP], next_addr = 0x200000;
  size_t qhead = 0, qlen = 0, nfreed = 0;
  for (int i = 0; i < 3; i++) {
    th_alloc(&o, 1, s++, 0x100000 + 0x100 * (uint64_t)i, 64, 1, 1);
    live += 64, allocs++;
  }
  peak = live;
  th_free(&o, 1, s++, 0x100100, 1);
  live -= 64, frees++;
  for (int it = 0; it < 160; it++) {
    if (it % mark_every == 0) {       /* marks 1, 2, ... at iterations 0, mark_every, ... */
      tr_mark m = { s++, (uint64_t)(it / mark_every + 1), th_ns, 1, 0 };
      rec(&thb[1].buf, TR_MARK, &m, sizeof m, NULL, NULL, NULL);
      th_event(&o, 1);
    }
    uint64_t same = s++;
    for (uint32_t t = 2; t <= (it % 2 ? 3u : 2u); t++) {
      uint64_t addr = nfreed ? freed[--nfreed] : (next_addr += 0x40);
      uint64_t size = 32 + 8 * (uint64_t)((it + (int)t) % 5);
      th_alloc(&o, t, same, addr, size, 2, 2);
      queue[(qhead + qlen) % TH_CAP] = addr;
      qsize[(qhead + qlen++) % TH_CAP] = size;
      live += size, allocs++;
      if (live > peak) peak = live;
    }
    if (it % 4 != 3) {
      th_free(&o, 4, s++, queue[qhead], 3);
      live -= qsize[qhead], frees++;
      freed[nfreed++] = queue[qhead];
      qhead = (qhead + 1) % TH_CAP;
      qlen--;
    }
  }
  for (uint32_t t = TH_THREADS; t >= 1; t--) th_flush(&o, t);
  size_t cut = o.n - 20;              /* inside the last record of thread 1's buffer */
  finding(&o, "leak.direct", 64, 1, 0x100000, 0, 1, 0, 0, 0, 1, NULL, NULL);
  tr_summary sm = { .direct_bytes = 64, .direct_blocks = 1, .reachable_bytes = live - 64,
                    .reachable_blocks = qlen + 1, .allocs = allocs, .frees = frees, .live_bytes = live,
                    .peak_bytes = peak };
  rec(&o, TR_SUMMARY, &sm, sizeof sm, NULL, NULL, NULL);
  end(&o, th_ns);
  save(dir, name, &o, o.n);
  if (cut_name) save(dir, cut_name, &o, cut);
  free(o.b);
  for (uint32_t t = 1; t <= TH_THREADS; t++) free(thb[t].buf.b);
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
  threads(argv[1], "threads.trace", 40, "threads-cut.trace");
  threads(argv[1], "threads2.trace", 80, NULL);
  return 0;
}
