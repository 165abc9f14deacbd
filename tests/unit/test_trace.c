/* test_trace.c - the trace writer (alloc/trace.c) read back with the reader
 * (reports/trace_read.c): exact counts from a small traced program, a
 * killed program's prefix, an aborted program's signal flush, the
 * reader's robustness against truncated, bit-flipped and hand-made damaged
 * files, and the replay of several threads' events (merged) checked
 * against a plain sort of them, whole and cut short.
 *
 * The ledger reads its options once, in a constructor, before main: so the
 * traced programs are this binary again, exec'd with TAGALLOC_TRACE set and
 * a role in argv[1] ("child-trace PATH", "child-kill PATH N", ...). */
#include "harness.h"
#include "support.h"
#include "internal.h"
#include "trace_read.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define KILL_ALLOCS 8000   /* allocations of the killed child: ~16 flushes of 4 KiB buffers */

/* ---- the traced programs (children) ------------------------------------------ */

static struct { void *x; } g_holder;
static void *volatile g_keep;
static void *g_kept[KILL_ALLOCS];

/* The leaked block: its address is kept nowhere. */
NOIPA static void make_leak(ta_tag tag) {
  char *p = ta_alloc(tag, 30);
  memset(p, 1, 30);
  __asm__ volatile("" ::: "memory");
}

/* Overwrites the dead stack below us, where the leaked address may linger. */
NOIPA static void scrub_stack(void) {
  volatile char buf[64 << 10];
  memset((char *)buf, 0, sizeof buf);
  __asm__ volatile("" ::: "memory");
}

/* 3 blocks of "t.a" (10, 20, 30): one freed, one kept (refcounted, held),
 * one leaked; a mark; a clean exit. */
static int child_trace(void) {
  ta_tag t = ta_tag_get("t.a");
  void *a = ta_alloc(t, 10);
  void *b = ta_alloc(t, 20);
  make_leak(t);
  g_keep = a;
  ta_free(b);
  ta_ref_init(a, 0);
  ta_ref_acquire(a);
  ta_ref_release(a);
  g_holder.x = a;
  ta_hold(&g_holder, "x", a);
  ta_mark_now();
  a = b = NULL;
  scrub_stack();
  exit(0);
}

/* The writer's packed events with values of every varint length, written
 * straight with _ta_trace_alloc and _ta_trace_free (the ledger would not
 * allocate most of these sizes): 1 to 10 bytes, the lengths where the
 * writer's PDEP encoding and its loop meet (2^56), addresses whose deltas
 * go both ways and wrap.  test_encoding reads them back. */
static const uint64_t g_enc_vals[] = {
  0, 1, 127, 128, 16383, 16384, (1ull << 21) - 1, 1ull << 21, 1ull << 28, (1ull << 35) + 5, (1ull << 42) - 1,
  1ull << 49, (1ull << 56) - 1, 1ull << 56, (1ull << 63) + 12345, UINT64_MAX,
};
#define ENC_N (sizeof g_enc_vals / sizeof *g_enc_vals)
#define ENC_SEQ (1ull << 50)
static uint64_t enc_addr(size_t i) { return g_enc_vals[(i * 7 + 3) % ENC_N] ^ (0x10 * i); }
static uint32_t enc_stack(size_t i) { return (uint32_t)(g_enc_vals[i] >> (i % 3 == 2 ? 32 : 0)); }

static int child_encode(void) {
  ta_tag tag = ta_tag_get("t.enc");
  ta_thread *t = _ta_thread();
  for (size_t i = 0; i < ENC_N; i++) {
    _ta_trace_alloc(t, (uintptr_t)enc_addr(i), g_enc_vals[i], tag, enc_stack(i), ENC_SEQ + 3 * i, (int)(i & 1));
    _ta_trace_free(t, (uintptr_t)enc_addr(ENC_N - 1 - i), enc_stack(ENC_N - 1 - i), ENC_SEQ + 3 * i + 1);
  }
  exit(0);
}

/* n blocks of "t.k" of sizes 1..n, all kept; then killed (no exit, no
 * signal flush) or aborted (the fatal-signal flush). */
static int child_die(int n, int sig) {
  ta_tag t = ta_tag_get("t.k");
  for (int i = 0; i < n && i < KILL_ALLOCS; i++) g_kept[i] = ta_alloc(t, (size_t)i + 1);
  if (sig == SIGABRT) abort();
  raise(sig);
  return 1;
}

/* Blocks passed between threads: two threads allocate HANDOFF_BLOCKS
 * each and hand them over through a queue, two others free them, with
 * the quarantine off, so jemalloc gives the freed addresses back to the
 * allocating threads (through its arena, when the tcaches flush) while
 * the trace records them.  HANDOFF_KEPT of them are never freed.  The
 * replay of the trace must free each address before it is allocated
 * again: it does only if the threads' sequence numbers (TSC or counter)
 * order every free before the other thread's malloc of the same block. */
#define HANDOFF_BLOCKS 50000
#define HANDOFF_KEPT 100
#define HANDOFF_QUEUE 256

static struct {
  pthread_mutex_t lock;
  pthread_cond_t  cond;
  void           *q[HANDOFF_QUEUE];
  size_t          head, len, producers;
  ta_tag          tag;
} g_hand = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, { 0 }, 0, 0, 2, 0 };
static void *g_hand_kept[2 * HANDOFF_KEPT];
static void *g_main_kept[HANDOFF_KEPT];

static void *hand_produce(void *arg) {
  size_t who = (size_t)arg;
  for (size_t i = 0; i < HANDOFF_BLOCKS; i++) {
    void *p = ta_alloc(g_hand.tag, 16 + 16 * (i % 4));
    pthread_mutex_lock(&g_hand.lock);
    while (g_hand.len == HANDOFF_QUEUE) pthread_cond_wait(&g_hand.cond, &g_hand.lock);
    g_hand.q[(g_hand.head + g_hand.len++) % HANDOFF_QUEUE] = p;
    pthread_cond_broadcast(&g_hand.cond);
    pthread_mutex_unlock(&g_hand.lock);
  }
  for (size_t i = 0; i < HANDOFF_KEPT; i++) g_hand_kept[who * HANDOFF_KEPT + i] = ta_alloc(g_hand.tag, 48);
  pthread_mutex_lock(&g_hand.lock);
  g_hand.producers--;
  pthread_cond_broadcast(&g_hand.cond);
  pthread_mutex_unlock(&g_hand.lock);
  return NULL;
}

static void *hand_consume(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&g_hand.lock);
    while (g_hand.len == 0 && g_hand.producers > 0) pthread_cond_wait(&g_hand.cond, &g_hand.lock);
    if (g_hand.len == 0) {
      pthread_mutex_unlock(&g_hand.lock);
      return NULL;
    }
    void *p = g_hand.q[g_hand.head];
    g_hand.head = (g_hand.head + 1) % HANDOFF_QUEUE;
    g_hand.len--;
    pthread_cond_broadcast(&g_hand.cond);
    pthread_mutex_unlock(&g_hand.lock);
    ta_free(p);
  }
}

static int child_handoff(void) {
  setenv("TAGALLOC_QUARANTINE", "0", 1);       /* read at the first ledger call */
  g_hand.tag = ta_tag_get("h.block");
  pthread_t th[4];
  for (size_t i = 0; i < 2; i++) {
    if (pthread_create(&th[i], NULL, hand_produce, (void *)i) != 0) return 2;
    if (pthread_create(&th[2 + i], NULL, hand_consume, NULL) != 0) return 2;
  }
  for (size_t i = 0; i < 4; i++) pthread_join(th[i], NULL);
  /* alone again (solo: the counter, moved past the TSC): a mark, then
   * blocks that must number after everything the threads did */
  ta_mark_now();
  ta_tag main_tag = ta_tag_get("h.main");
  for (size_t i = 0; i < HANDOFF_KEPT; i++) g_main_kept[i] = ta_alloc(main_tag, 24);
  return 0;
}

/* ---- running a child ------------------------------------------------------------ */

static char g_self[4096];   /* argv[0] */
static char g_exe[4096];    /* this binary: /proc/self/exe resolved now (valgrind virtualizes the link, not an exec of it) */

/* Runs this binary with role and path (and arg), with TAGALLOC_TRACE=path,
 * TAGALLOC_REPORT=0 and the extra NAME=VALUE (may be NULL); returns the wait
 * status. */
static int spawn(const char *role, const char *path, const char *arg, const char *extra) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 5, sizeof *env);
    char trace[4200];
    snprintf(trace, sizeof trace, "TAGALLOC_TRACE=%s", path);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (strncmp(environ[i], "TAGALLOC_TRACE", 14) != 0 && strncmp(environ[i], "TAGALLOC_REPORT=", 16) != 0)
        env[k++] = environ[i];
    env[k++] = trace;
    env[k++] = (char *)"TAGALLOC_REPORT=0";
    if (extra) env[k++] = (char *)extra;
    env[k] = NULL;
    char *argv[] = { g_self, (char *)role, (char *)path, (char *)arg, NULL };
    execve(g_exe, argv, env);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) assert_int_equal(errno, EINTR);
  return status;
}

static void temp_path(char *buf, size_t n, const char *what) {
  snprintf(buf, n, "/tmp/test_trace.%s.XXXXXX", what);
  int fd = mkstemp(buf);
  assert_true(fd >= 0);
  close(fd);
}

/* Runs role ("child-kill" or "child-abort") with KILL_ALLOCS allocations and
 * 4 KiB trace buffers, tracing to a new temporary file named after what
 * (its name left in path); returns the wait status. */
static int spawn_dying(const char *role, const char *what, char *path, size_t size) {
  char n[16];
  temp_path(path, size, what);
  snprintf(n, sizeof n, "%d", KILL_ALLOCS);
  return spawn(role, path, n, "TAGALLOC_TRACE_BUFFER=4096");
}

/* The model of the trace at path: it must load. */
static report_trace_model *load_model(const char *path) {
  char err[512] = "";
  report_trace_model *m = report_trace_model_load(path, err, sizeof err);
  if (m == NULL) fail_msg("%s", err);
  return m;
}

static unsigned char *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  assert_true(n > 0);
  unsigned char *buf = malloc((size_t)n);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return buf;
}

/* The clean trace of child_trace, made once. */
static char g_trace[256];

static int make_clean_trace(void **state) {
  (void)state;
  temp_path(g_trace, sizeof g_trace, "clean");
  int st = spawn("child-trace", g_trace, NULL, NULL);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "child-trace: status 0x%x\n", st);
    return -1;
  }
  return 0;
}

static int remove_clean_trace(void **state) {
  (void)state;
  unlink(g_trace);
  return 0;
}

/* ---- the traced program, read back ---------------------------------------------- */

/* child_encode's events, read back value for value. */
static void test_encoding(void **state) {
  (void)state;
  char path[64];
  temp_path(path, sizeof path, "encode");
  int st = spawn("child-encode", path, NULL, NULL);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char err[512];
  report_trace *t = report_trace_open(path, err, sizeof err);
  assert_non_null(t);
  report_trace_iter it;
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  size_t allocs = 0, frees = 0;
  while (report_trace_next(&it, &r)) {
    if (r.type == TR_ALLOC) {
      tr_alloc a;
      memcpy(&a, r.payload, sizeof a);
      if (a.seq < ENC_SEQ) continue;
      size_t i = (size_t)(a.seq - ENC_SEQ) / 3;
      assert_int_equal(a.seq, ENC_SEQ + 3 * i);
      assert_int_equal(a.size, g_enc_vals[i]);
      assert_int_equal(a.addr, enc_addr(i));
      assert_int_equal(a.stack, enc_stack(i));
      assert_int_equal(a.arena, i & 1);
      assert_int_equal(i, allocs);
      allocs++;
    } else if (r.type == TR_FREE) {
      tr_free f;
      memcpy(&f, r.payload, sizeof f);
      if (f.seq < ENC_SEQ) continue;
      size_t i = (size_t)(f.seq - ENC_SEQ) / 3;
      assert_int_equal(f.seq, ENC_SEQ + 3 * i + 1);
      assert_int_equal(f.addr, enc_addr(ENC_N - 1 - i));
      assert_int_equal(f.stack, enc_stack(ENC_N - 1 - i));
      assert_int_equal(i, frees);
      frees++;
    }
  }
  assert_false(it.damaged);
  assert_int_equal(allocs, ENC_N);
  assert_int_equal(frees, ENC_N);
  report_trace_close(t);
  unlink(path);
}

static void test_exact_counts(void **state) {
  (void)state;
  report_trace_model *m = load_model(g_trace);
  assert_false(m->damaged);
  assert_string_equal(m->damage, "");
  assert_true(m->clean_exit);
  assert_int_equal(m->unknown_records, 0);
  assert_int_equal(m->allocs, 3);
  assert_int_equal(m->frees, 1);
  assert_int_equal(m->reallocs, 0);
  assert_int_equal(m->refs, 3);
  assert_int_equal(m->holds, 1);
  assert_int_equal(m->nmarks, 1);
  assert_int_equal(m->marks[0].mark, 1);
  assert_int_equal(m->unmatched_frees, 0);
  assert_int_equal(m->realloc_overlaps, 0);
  assert_int_equal(m->late_stacks, 0);
  assert_int_equal(m->peak_live_bytes, 60);
  assert_int_equal(m->live_bytes, 40);
  assert_true(m->thread_starts >= 1);
  assert_true(m->nmodules >= 1);            /* at least this executable */
  assert_true(m->pid > 0);

  /* live at the end: the 10 (kept) and the 30 (leaked), in sequence order */
  assert_int_equal(m->nblocks, 2);
  assert_int_equal(m->blocks[0].size, 10);
  assert_int_equal(m->blocks[1].size, 30);
  assert_true(m->blocks[0].seq < m->blocks[1].seq);
  const char *name = report_trace_model_tag(m, m->blocks[0].tag);
  assert_non_null(name);
  assert_string_equal(name, "t.a");
  assert_int_equal(m->blocks[1].tag, m->blocks[0].tag);
  assert_ptr_equal(report_trace_model_block(m, m->blocks[1].addr), &m->blocks[1]);
  for (size_t i = 0; i < m->nblocks; i++) {
    assert_false(m->blocks[i].arena);
    const report_trace_stack *s = report_trace_model_stack(m, m->blocks[i].stack);
    assert_non_null(s);
    assert_true(s->n >= 1);
  }

  /* the exit findings: the leaked 30-byte block is leak.direct */
  size_t groups = 0;
  const report_trace_finding *f = report_trace_model_finding(m, "leak.direct", &groups);
  assert_non_null(f);
  assert_int_equal(groups, 1);
  assert_int_equal(f->blocks, 1);
  assert_int_equal(f->bytes, 30);
  assert_int_equal(f->addr, m->blocks[1].addr);
  assert_int_equal(f->stack, m->blocks[1].stack);
  assert_int_equal(f->tag, m->blocks[1].tag);
  report_trace_model_free(m);
}

/* Record by record: each ALLOC's stack came before it, each FRAME's parent
 * before the FRAME; END is the last record. */
static void test_record_order(void **state) {
  (void)state;
  char err[512] = "";
  report_trace *t = report_trace_open(g_trace, err, sizeof err);
  if (t == NULL) fail_msg("%s", err);
  assert_int_equal(report_trace_header(t)->version, TR_VERSION);
  assert_int_equal(report_trace_header(t)->header_size, sizeof(tr_file_header));
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);

  uint32_t seen[4096];
  size_t nseen = 0, nallocs = 0, nend = 0, nstrings = 0;
  uint64_t last = 0, end_off = 0, prev = 0;
  report_trace_iter it;
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    assert_true(r.offset >= sizeof(tr_file_header));
    assert_true(r.offset >= prev);
    assert_int_equal(r.payload_size % 8, 0);
    prev = r.offset;
    last = r.offset;
    assert_int_not_equal(r.type, TR_STACK);     /* version 1 only */
    if (r.type == TR_FRAME) {
      const tr_frame *f = r.payload;
      assert_true(nseen < 4096);
      bool parent_before = f->parent == 0;
      for (size_t i = 0; i < nseen && !parent_before; i++) parent_before = seen[i] == f->parent;
      assert_true(parent_before);
      assert_true(f->parent < f->id);
      seen[nseen++] = f->id;
    } else if (r.type == TR_ALLOC) {
      const tr_alloc *a = r.payload;
      nallocs++;
      assert_int_not_equal(a->stack, 0);
      bool before = false;
      for (size_t i = 0; i < nseen && !before; i++) before = seen[i] == a->stack;
      assert_true(before);
      const report_trace_stack *s = report_trace_model_stack(m, a->stack);
      assert_non_null(s);
      assert_true(s->offset < r.offset);
    } else if (r.type == TR_END) {
      nend++;
      end_off = r.offset;
    } else if (r.type == TR_TAG || r.type == TR_MODULE || r.type == TR_HOLD || r.type == TR_FINDING) {
      assert_non_null(report_trace_string(&r, 0));
      nstrings++;
    }
  }
  assert_false(it.damaged);
  assert_int_equal(it.off, report_trace_size(t));
  assert_int_equal(nallocs, 3);
  assert_int_equal(nend, 1);
  assert_int_equal(end_off, last);
  assert_true(nstrings >= 3);

  report_trace_model_free(m);
  report_trace_close(t);
}

static int count_until_alloc(const report_trace_rec *r, void *arg) {
  (*(int *)arg)++;
  return r->type == TR_ALLOC ? 7 : 0;
}

static void test_callback(void **state) {
  (void)state;
  char err[512];
  report_trace *t = report_trace_open(g_trace, err, sizeof err);
  assert_non_null(t);
  report_trace_iter st;
  int n = 0;
  assert_int_equal(report_trace_each(t, count_until_alloc, &n, &st), 7);
  assert_true(n >= 2);
  assert_false(st.damaged);
  report_trace_close(t);
}

/* ---- killed, aborted ---------------------------------------------------------------- */

static void check_die_prefix(const report_trace_model *m, bool all) {
  assert_false(m->clean_exit);
  assert_false(m->damaged);              /* whole buffers were written */
  assert_int_equal(m->nfindings, 0);
  assert_int_equal(m->frees, 0);
  assert_int_equal(m->late_stacks, 0);
  assert_int_equal(m->unmatched_frees, 0);
  /* the allocations before the last flush are all there, in order: sizes 1..n */
  const size_t per_buffer = 4096 / 6;     /* a packed ALLOC takes 6 bytes at the least */
  if (all) assert_int_equal(m->allocs, KILL_ALLOCS);
  else assert_true(m->allocs + per_buffer + 1 >= KILL_ALLOCS);
  assert_true(m->allocs <= KILL_ALLOCS);
  assert_true(m->allocs > 0);
  assert_int_equal(m->nblocks, m->allocs);
  uint64_t bytes = 0;
  for (size_t i = 0; i < m->nblocks; i++) {
    assert_int_equal(m->blocks[i].size, i + 1);
    bytes += i + 1;
  }
  assert_int_equal(m->live_bytes, bytes);
  assert_int_equal(m->peak_live_bytes, bytes);
  assert_true(m->times >= 10);           /* a TIME record starts each buffer after a flush */
}

static void test_killed(void **state) {
  (void)state;
  char path[256];
  int st = spawn_dying("child-kill", "kill", path, sizeof path);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGKILL);
  report_trace_model *m = load_model(path);
  check_die_prefix(m, false);
  assert_true(m->allocs < KILL_ALLOCS);  /* the last buffer died with the process */
  report_trace_model_free(m);
  unlink(path);
}

static void test_aborted(void **state) {
  (void)state;
  char path[256];
  int st = spawn_dying("child-abort", "abort", path, sizeof path);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGABRT);
  report_trace_model *m = load_model(path);
  check_die_prefix(m, true);             /* the signal flush wrote every buffer */
  const char *name = report_trace_model_tag(m, m->blocks[0].tag);
  assert_non_null(name);
  assert_string_equal(name, "t.k");
  assert_true(m->nmodules >= 1);
  report_trace_model_free(m);
  unlink(path);
}

/* ---- robustness: truncation, bit flips ------------------------------------------------ */

/* What the reader yields for a whole file, in order: each record, and each
 * event of a PACKED record (those share their record's offset and end). */
typedef struct { uint64_t off, end; uint8_t type; } rec_pos;

static rec_pos *record_list(const unsigned char *data, size_t size, size_t *n) {
  char err[512];
  report_trace *t = report_trace_open_mem(data, size, "full", err, sizeof err);
  assert_non_null(t);
  size_t cap = 1024;
  rec_pos *v = malloc(cap * sizeof *v);
  assert_non_null(v);
  *n = 0;
  report_trace_iter it;
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    if (*n == cap) {
      cap *= 2;
      v = realloc(v, cap * sizeof *v);
      assert_non_null(v);
    }
    tr_header h;
    memcpy(&h, data + r.offset, sizeof h);
    v[(*n)++] = (rec_pos){ r.offset, r.offset + h.size, r.type };
  }
  assert_false(it.damaged);
  assert_int_equal(it.unknown, 0);
  report_trace_close(t);
  return v;
}

/* The first len bytes of data, in a buffer of exactly len bytes (so that
 * ASan sees any read past it), read with the reader and the model. */
static void check_prefix(const unsigned char *data, size_t len, const rec_pos *recs, size_t nrecs,
                         bool model) {
  unsigned char *buf = malloc(len ? len : 1);
  assert_non_null(buf);
  memcpy(buf, data, len);
  char err[512] = "";
  report_trace *t = report_trace_open_mem(buf, len, "prefix.trace", err, sizeof err);
  if (len < sizeof(tr_file_header)) {
    assert_null(t);
    assert_memory_equal(err, "TRACE: ", 7);
    assert_non_null(strstr(err, "prefix.trace"));
    free(buf);
    return;
  }
  if (t == NULL) fail_msg("%zu: %s", len, err);
  size_t want = 0, want_records = 0;
  while (want < nrecs && recs[want].end <= len) {
    if (want == 0 || recs[want].off != recs[want - 1].off) want_records++;
    want++;
  }
  bool boundary = len == sizeof(tr_file_header) || (want > 0 && recs[want - 1].end == len);
  report_trace_iter it;
  report_trace_rec r;
  size_t got = 0;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    assert_true(got < want);
    assert_int_equal(r.offset, recs[got].off);
    assert_int_equal(r.type, recs[got].type);
    got++;
  }
  assert_int_equal(got, want);
  if (boundary) {
    assert_false(it.damaged);
  } else {
    assert_true(it.damaged);
    assert_int_equal(it.damage_offset, recs[want].off);
    char at[64];
    snprintf(at, sizeof at, "damaged at byte %llu", (unsigned long long)recs[want].off);
    assert_non_null(strstr(it.message, at));
    assert_non_null(strstr(it.message, "prefix.trace"));
    assert_null(strchr(it.message, '\n'));
  }
  if (!model) {
    report_trace_close(t);
    free(buf);
    return;
  }
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  assert_int_equal(m->damaged, !boundary);
  assert_int_equal(m->records, want_records);
  if (len < recs[nrecs - 1].end) assert_false(m->clean_exit);   /* END is the last record */
  report_trace_model_free(m);
  report_trace_close(t);
  free(buf);
}

static void truncations(const char *path) {
  size_t size, nrecs;
  unsigned char *data = slurp(path, &size);
  rec_pos *recs = record_list(data, size, &nrecs);
  assert_true(nrecs > 0);
  assert_int_equal(recs[nrecs - 1].end, size);
  /* The reader at every length of the last 2000 bytes and at every 61st
   * before; the model too (a whole build each) at every 29th of those. */
  size_t from = size > 2000 ? size - 2000 : 0;
  for (size_t len = from; len <= size; len++) check_prefix(data, len, recs, nrecs, len % 29 == 0);
  for (size_t len = 0; len < from; len += 61) check_prefix(data, len, recs, nrecs, len % 29 == 0);
  for (size_t i = 0; i < nrecs; i++) {       /* every record boundary, and one byte short */
    if (i > 0 && recs[i].off == recs[i - 1].off) continue;   /* events of one PACKED record */
    check_prefix(data, recs[i].end, recs, nrecs, true);
    check_prefix(data, recs[i].end - 1, recs, nrecs, true);
  }
  free(recs);
  free(data);
}

static void test_truncated(void **state) {
  (void)state;
  truncations(g_trace);
}

static void test_truncated_long(void **state) {
  (void)state;
  char path[256];
  int st = spawn_dying("child-abort", "long", path, sizeof path);
  assert_true(WIFSIGNALED(st));
  truncations(path);
  unlink(path);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static struct { int rejected, damaged, whole; } outcomes;

static void read_anything(const unsigned char *buf, size_t len) {
  char err[512] = "";
  report_trace *t = report_trace_open_mem(buf, len, "fuzz.trace", err, sizeof err);
  if (t == NULL) {
    assert_memory_equal(err, "TRACE: ", 7);
    outcomes.rejected++;
    return;
  }
  report_trace_iter it;
  report_trace_rec r;
  uint64_t prev = 0;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    assert_true(r.offset >= prev);        /* the events of a PACKED record share its offset */
    prev = r.offset;
    assert_true(r.offset + sizeof(tr_header) + r.payload_size <= len);
    if (r.payload != (const void *)&it.pk_ev)   /* a packed event's is the iterator's */
      assert_true((const unsigned char *)r.payload >= buf + sizeof(tr_file_header));
    for (int i = 0; i < 3; i++) {
      const char *s = report_trace_string(&r, i);
      if (s) assert_true(s + strlen(s) < (const char *)r.payload + r.payload_size);
    }
  }
  assert_true(it.off <= len);
  if (it.damaged) {
    assert_true(it.damage_offset < len);
    assert_non_null(strstr(it.message, "fuzz.trace"));
    outcomes.damaged++;
  } else {
    outcomes.whole++;
  }
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  for (size_t i = 0; i < m->nblocks; i++)
    assert_ptr_equal(report_trace_model_block(m, m->blocks[i].addr), &m->blocks[i]);
  for (size_t i = 0; i < m->nstacks; i++) (void)report_trace_model_stack(m, m->stacks[i].id);
  (void)report_trace_model_finding(m, NULL, NULL);
  report_trace_model_free(m);
  report_trace_close(t);
}

static void test_bit_flips(void **state) {
  (void)state;
  size_t size;
  unsigned char *data = slurp(g_trace, &size);
  unsigned char *buf = malloc(size);
  assert_non_null(buf);
  for (int trial = 0; trial < 2000; trial++) {
    memcpy(buf, data, size);
    int flips = 1 + (int)(rng() % 4);
    for (int k = 0; k < flips; k++) {
      size_t at = (size_t)(rng() % size);
      /* mostly past the file header, where the records are */
      if (trial % 8 != 0 && at < sizeof(tr_file_header)) at += sizeof(tr_file_header);
      if (at >= size) at = size - 1;
      if (trial % 2) buf[at] ^= (unsigned char)(1u << (rng() % 8));
      else buf[at] = (unsigned char)rng();
    }
    read_anything(buf, size);
  }
  /* a good header followed by noise, of every length up to 600 bytes */
  for (int trial = 0; trial < 600; trial++) {
    size_t len = sizeof(tr_file_header) + (size_t)trial;
    unsigned char *noise = malloc(len);
    assert_non_null(noise);
    memcpy(noise, data, sizeof(tr_file_header));
    for (size_t i = sizeof(tr_file_header); i < len; i++) noise[i] = (unsigned char)rng();
    /* now and then a plausible record header, to get further in */
    for (size_t i = sizeof(tr_file_header); i + 8 <= len && trial % 3 == 0; i += 8 + 8 * (rng() % 8)) {
      uint32_t sz = (uint32_t)(8 + 8 * (rng() % 10));
      memcpy(noise + i, &sz, 4);
      noise[i + 4] = (unsigned char)(1 + rng() % 18);
    }
    read_anything(noise, len);
    free(noise);
  }
  /* every outcome happened: rejected header, damage found, read through */
  assert_true(outcomes.rejected > 0);
  assert_true(outcomes.damaged > 0);
  assert_true(outcomes.whole > 0);
  free(buf);
  free(data);
}

/* ---- hand-made files: each kind of damage, and the header errors ---------------------- */

typedef struct { unsigned char *p; size_t len, cap; } bytes;

static void put(bytes *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
}

static bytes file_start(uint64_t magic, uint32_t version) {
  bytes b = { 0 };
  tr_file_header h = { .magic = magic, .version = version, .header_size = sizeof h, .pid = 42 };
  put(&b, &h, sizeof h);
  return b;
}

/* A record: header (with size, or the true padded size when size is 0), payload, padding. */
static uint64_t rec(bytes *b, uint8_t type, const void *payload, size_t n, uint32_t size) {
  uint64_t off = b->len;
  size_t padded = (n + 7) & ~(size_t)7;
  tr_header h = { .size = size ? size : (uint32_t)(sizeof h + padded), .type = type };
  put(b, &h, sizeof h);
  put(b, payload, n);
  static const unsigned char zeros[8];
  put(b, zeros, padded - n);
  return off;
}

static uint64_t rec_tag(bytes *b, uint32_t id, const char *name) {
  unsigned char buf[256];
  memcpy(buf, &id, 4);
  size_t n = strlen(name) + 1;
  memcpy(buf + 4, name, n);
  return rec(b, TR_TAG, buf, 4 + n, 0);
}

static uint64_t rec_stack(bytes *b, uint32_t id, uint16_t n, uint16_t claimed) {
  unsigned char buf[8 + 8 * 16];
  tr_stack s = { .id = id, .n = claimed };
  memcpy(buf, &s, sizeof s);
  for (uint16_t i = 0; i < n; i++) {
    uint64_t pc = 0x401000 + i;
    memcpy(buf + 8 + 8 * i, &pc, 8);
  }
  return rec(b, TR_STACK, buf, 8 + 8u * n, 0);
}

static uint64_t rec_alloc(bytes *b, uint64_t seq, uint64_t addr, uint64_t size, uint32_t stack, uint16_t tag) {
  tr_alloc a = { .seq = seq, .addr = addr, .size = size, .stack = stack, .tag = tag, .thread = 1 };
  return rec(b, TR_ALLOC, &a, sizeof a, 0);
}

static uint64_t rec_free(bytes *b, uint64_t seq, uint64_t addr) {
  tr_free f = { .seq = seq, .addr = addr, .stack = 7, .thread = 2 };
  return rec(b, TR_FREE, &f, sizeof f, 0);
}

/* Reads b: returns the records yielded; damage into *it. */
static size_t read_bytes(const bytes *b, report_trace_iter *it) {
  char err[512] = "";
  report_trace *t = report_trace_open_mem(b->p, b->len, "made.trace", err, sizeof err);
  if (t == NULL) fail_msg("%s", err);
  report_trace_rec r;
  size_t n = 0;
  report_trace_iter_init(it, t);
  while (report_trace_next(it, &r)) n++;
  it->t = NULL;
  report_trace_close(t);
  return n;
}

static void expect_damage(const bytes *b, size_t records, uint64_t off, const char *why) {
  report_trace_iter it;
  assert_int_equal(read_bytes(b, &it), records);
  assert_true(it.damaged);
  assert_int_equal(it.damage_offset, off);
  if (strstr(it.message, why) == NULL || strstr(it.message, "made.trace") == NULL)
    fail_msg("message \"%s\" lacks \"%s\"", it.message, why);
}

static void test_header_errors(void **state) {
  (void)state;
  char err[512];
  bytes b = file_start(0x1234, TR_VERSION);
  assert_null(report_trace_open_mem(b.p, b.len, "x.trace", err, sizeof err));
  assert_string_equal(err, "TRACE: not a tagalloc trace (bad magic): x.trace");
  free(b.p);
  b = file_start(TR_MAGIC, 3);
  assert_null(report_trace_open_mem(b.p, b.len, "x.trace", err, sizeof err));
  assert_string_equal(err, "TRACE: version 3 is not supported (this reader knows 1 and 2): x.trace");
  free(b.p);
  b = file_start(TR_MAGIC, 1);                /* version 1: STACK records */
  rec_stack(&b, 1, 2, 2);
  report_trace *t1 = report_trace_open_mem(b.p, b.len, "v1.trace", err, sizeof err);
  assert_non_null(t1);
  report_trace_model *m1 = report_trace_model_build(t1);
  assert_non_null(m1);
  assert_false(m1->damaged);
  assert_int_equal(report_trace_model_stack(m1, 1)->n, 2);
  report_trace_model_free(m1);
  report_trace_close(t1);
  assert_null(report_trace_open_mem(b.p, 3, "x.trace", err, sizeof err));
  assert_non_null(strstr(err, "not a tagalloc trace"));
  free(b.p);
  b = file_start(TR_MAGIC, TR_VERSION);
  assert_null(report_trace_open_mem(b.p, 20, "x.trace", err, sizeof err));
  assert_non_null(strstr(err, "cut short"));
  ((tr_file_header *)b.p)->header_size = 12;
  assert_null(report_trace_open_mem(b.p, b.len, "x.trace", err, sizeof err));
  assert_non_null(strstr(err, "header size"));
  free(b.p);
  assert_null(report_trace_open("/nonexistent/dir/x.trace", err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent/dir/x.trace"));
  assert_null(report_trace_open("/dev/null", err, sizeof err));   /* empty, not mappable */
  assert_non_null(strstr(err, "not a tagalloc trace"));
  assert_null(report_trace_open_mem(NULL, 0, NULL, NULL, 0));      /* err may be NULL */
  /* a bigger header (a future field within version 1): records start after it */
  b = file_start(TR_MAGIC, TR_VERSION);
  uint64_t extra = 0;
  put(&b, &extra, sizeof extra);
  ((tr_file_header *)b.p)->header_size = sizeof(tr_file_header) + 8;
  rec_tag(&b, 1, "x");
  report_trace_iter it;
  assert_int_equal(read_bytes(&b, &it), 1);
  assert_false(it.damaged);
  /* bytes at an odd address are copied, and read the same */
  unsigned char *odd = malloc(b.len + 1);
  assert_non_null(odd);
  memcpy(odd + 1, b.p, b.len);
  report_trace *t = report_trace_open_mem(odd + 1, b.len, "odd.trace", err, sizeof err);
  assert_non_null(t);
  free(odd);                                 /* the reader has its own copy */
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  assert_true(report_trace_next(&it, &r));
  assert_int_equal(r.type, TR_TAG);
  assert_int_equal((uintptr_t)r.payload % 8, 0);
  assert_string_equal(report_trace_string(&r, 0), "x");
  assert_null(report_trace_string(&r, 1));
  assert_false(report_trace_next(&it, &r));
  assert_false(it.damaged);
  report_trace_close(t);
  free(b.p);
}

static void test_damage_kinds(void **state) {
  (void)state;
  /* good records, then one bad one, then a good one never read */
  struct { const char *why; } cases[] = {
    { "smaller than its 8-byte header" },
    { "not a multiple of 8" },
    { "runs past the end of the file" },
    { "shorter than its 40-byte fixed part" },
    { "STACK record of 9 frames" },
    { "not NUL-terminated" },
    { "ends inside a record header" },
    { "FINDING record whose string 2 is not NUL-terminated" },
    { "FRAME record of stack 5 names parent 5, which is not below it" },
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    bytes b = file_start(TR_MAGIC, TR_VERSION);
    rec_tag(&b, 1, "t.a");
    rec_stack(&b, 1, 2, 2);
    rec_alloc(&b, 1, 0x1000, 10, 1, 1);
    uint64_t bad = b.len;
    switch (c) {
    case 0: { uint64_t z = 0; tr_header h = { .size = 4, .type = TR_FREE }; put(&b, &h, 8); put(&b, &z, 8); break; }
    case 1: { tr_free f = { 0 }; rec(&b, TR_FREE, &f, sizeof f, 28); break; }
    case 2: { tr_free f = { 0 }; rec(&b, TR_FREE, &f, sizeof f, 4096); break; }
    case 3: { tr_free f = { 0 }; rec(&b, TR_ALLOC, &f, sizeof f, 0); break; }
    case 4: rec_stack(&b, 9, 3, 9); break;
    case 5: { unsigned char p[24]; uint32_t id = 2;    /* 20 name bytes, no NUL, no padding */
              memset(p, 'x', sizeof p); memcpy(p, &id, 4); rec(&b, TR_TAG, p, sizeof p, 0); break; }
    case 6: { uint32_t half = 48; put(&b, &half, 4); break; }
    case 7: { unsigned char p[64] = { 0 }; memcpy(p + sizeof(tr_finding), "k\0s\0dd", 6);
              /* 62 bytes of which the last string "dd" runs to the end: pad with non-zero */
              rec(&b, TR_FINDING, p, 64, 0);
              memcpy(b.p + b.len - 2, "ee", 2); break; }
    case 8: { tr_frame f = { .id = 5, .parent = 5, .pc = 0x401000 }; rec(&b, TR_FRAME, &f, sizeof f, 0); break; }
    }
    if (c != 6) rec_tag(&b, 3, "never");
    expect_damage(&b, 3, bad, cases[c].why);
    /* the model keeps what came before the damage */
    report_trace *t = report_trace_open_mem(b.p, b.len, "made.trace", NULL, 0);
    assert_non_null(t);
    report_trace_model *m = report_trace_model_build(t);
    assert_non_null(m);
    assert_true(m->damaged);
    assert_int_equal(m->damage_offset, bad);
    assert_int_equal(m->allocs, 1);
    assert_int_equal(m->nblocks, 1);
    assert_string_equal(report_trace_model_tag(m, 1), "t.a");
    assert_null(report_trace_model_tag(m, 3));
    assert_false(m->clean_exit);
    report_trace_model_free(m);
    report_trace_close(t);
    free(b.p);
  }
}

/* A PACKED record by hand: thread 3; an ALLOC (seq 10, addr 0x1000, size
 * 300, stack 1, tag 1), a FREE 2 later 64 bytes on (stack 2), an arena
 * ALLOC (arena 1) at a lower address; then the events read as ALLOC, FREE,
 * ALLOC with the deltas undone.  Ending inside an event is damage naming
 * the event; so is an unknown event kind. */
static size_t packed_events(unsigned char *p) {
  size_t n = 0;
  p[n++] = TR_PK_ALLOC; p[n++] = 20; p[n++] = 0x80; p[n++] = 0x40;      /* seq +10, addr +0x1000 */
  p[n++] = 0xac; p[n++] = 0x02; p[n++] = 1; p[n++] = 1;                 /* size 300, stack 1, tag 1 */
  p[n++] = TR_PK_FREE; p[n++] = 4; p[n++] = 0x80; p[n++] = 0x01; p[n++] = 2;   /* seq +2, addr +64 */
  p[n++] = TR_PK_ALLOC | TR_PK_ARENA; p[n++] = 2; p[n++] = 0xff; p[n++] = 0x01;  /* seq +1, addr -128 */
  p[n++] = 16; p[n++] = 1; p[n++] = 1; p[n++] = 1;                      /* size 16, stack 1, tag 1, arena 1 */
  return n;
}

/* The next record is an ALLOC event of the PACKED record at off, equal to want. */
static void expect_alloc(report_trace_iter *it, uint64_t off, tr_alloc want) {
  report_trace_rec r;
  assert_true(report_trace_next(it, &r));
  assert_int_equal(r.type, TR_ALLOC);
  assert_int_equal(r.offset, off);
  tr_alloc a;
  memcpy(&a, r.payload, sizeof a);
  assert_int_equal(a.seq, want.seq);
  assert_int_equal(a.addr, want.addr);
  assert_int_equal(a.size, want.size);
  assert_int_equal(a.stack, want.stack);
  assert_int_equal(a.tag, want.tag);
  assert_int_equal(a.arena, want.arena);
  assert_int_equal(a.thread, want.thread);
}

static void test_packed_events(void **state) {
  (void)state;
  unsigned char payload[64] = { 0 };
  tr_packed pk = { .thread = 3 };
  memcpy(payload, &pk, sizeof pk);
  size_t n = sizeof pk + packed_events(payload + sizeof pk);

  bytes b = file_start(TR_MAGIC, TR_VERSION);
  uint64_t off = rec(&b, TR_PACKED, payload, n, 0);
  char err[512] = "";
  report_trace *t = report_trace_open_mem(b.p, b.len, "made.trace", err, sizeof err);
  assert_non_null(t);
  report_trace_iter it;
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  expect_alloc(&it, off, (tr_alloc){ .seq = 10, .addr = 0x1000, .size = 300, .stack = 1, .tag = 1,
                                      .thread = 3 });
  assert_true(report_trace_next(&it, &r));
  assert_int_equal(r.type, TR_FREE);
  tr_free f;
  memcpy(&f, r.payload, sizeof f);
  assert_int_equal(f.seq, 12);
  assert_int_equal(f.addr, 0x1040);
  assert_int_equal(f.stack, 2);
  assert_int_equal(f.thread, 3);
  expect_alloc(&it, off, (tr_alloc){ .seq = 13, .addr = 0x1040 - 128, .size = 16, .stack = 1, .tag = 1,
                                      .arena = 1, .thread = 3 });
  assert_false(report_trace_next(&it, &r));
  assert_false(it.damaged);
  assert_int_equal(it.records, 1);
  report_trace_close(t);
  free(b.p);

  /* the record ends inside the third event's address (0xff: more to come;
   * 8 + 16 bytes, no padding) */
  b = file_start(TR_MAGIC, TR_VERSION);
  off = rec(&b, TR_PACKED, payload, sizeof pk + 16, 0);
  assert_int_equal(read_bytes(&b, &it), 2);
  assert_true(it.damaged);
  assert_int_equal(it.damage_offset, off);
  assert_non_null(strstr(it.message, "event 2 of a PACKED record"));
  assert_non_null(strstr(it.message, "cut short"));
  free(b.p);

  /* an unknown kind in place of the FREE */
  payload[sizeof pk + 8] = 0x40;
  b = file_start(TR_MAGIC, TR_VERSION);
  rec(&b, TR_PACKED, payload, n, 0);
  assert_int_equal(read_bytes(&b, &it), 1);
  assert_true(it.damaged);
  assert_non_null(strstr(it.message, "event 1 of a PACKED record (at byte 24 of it) is of an unknown kind"));
  free(b.p);
}

static void test_unknown_types_skipped(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  unsigned char junk[24];
  memset(junk, 0xAB, sizeof junk);            /* no NUL: it is not looked at */
  rec(&b, 200, junk, sizeof junk, 0);
  rec_tag(&b, 1, "t.a");
  rec(&b, 0, junk, 0, 0);
  rec(&b, 99, junk, 3, 0);
  rec_stack(&b, 1, 1, 1);
  rec_alloc(&b, 5, 0x2000, 8, 1, 1);
  tr_end e = { 9, 1 };
  rec(&b, TR_END, &e, sizeof e, 0);
  report_trace_iter it;
  assert_int_equal(read_bytes(&b, &it), 4);
  assert_false(it.damaged);
  assert_int_equal(it.unknown, 3);
  assert_int_equal(it.records, 7);
  report_trace *t = report_trace_open_mem(b.p, b.len, "made.trace", NULL, 0);
  report_trace_model *m = report_trace_model_build(t);
  assert_int_equal(m->unknown_records, 3);
  assert_true(m->clean_exit);
  assert_int_equal(m->end_seq, 9);
  assert_int_equal(m->nblocks, 1);
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

/* The model replays in sequence order, not file order (per-thread buffers
 * reach the file in flush order); it counts oddities instead of failing. */
static void test_model_replay(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_alloc(&b, 4, 0x3000, 100, 7, 1);       /* stack 7 before its STACK record: late */
  rec_stack(&b, 7, 1, 1);
  rec_free(&b, 3, 0x1000);                   /* thread 2's buffer, flushed late */
  rec_alloc(&b, 1, 0x1000, 50, 7, 1);
  rec_alloc(&b, 2, 0x2000, 60, 7, 1);
  rec_free(&b, 5, 0x9000);                   /* never allocated */
  rec_alloc(&b, 6, 0x2000, 70, 7, 1);        /* over a live block */
  tr_mark mk = { .seq = 8, .mark = 1 };
  rec(&b, TR_MARK, &mk, sizeof mk, 0);
  char err[512];
  report_trace *t = report_trace_open_mem(b.p, b.len, "made.trace", err, sizeof err);
  assert_non_null(t);
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  assert_int_equal(m->replay, REPORT_TRACE_MERGED);   /* thread 1's 4, 1, 2, 6: inside the window */
  assert_int_equal(m->allocs, 4);
  assert_int_equal(m->frees, 2);
  assert_int_equal(m->unmatched_frees, 1);
  assert_int_equal(m->realloc_overlaps, 1);
  assert_int_equal(m->late_stacks, 1);
  assert_int_equal(m->nblocks, 2);
  assert_int_equal(m->blocks[0].addr, 0x3000);
  assert_int_equal(m->blocks[1].addr, 0x2000);
  assert_int_equal(m->blocks[1].size, 70);
  assert_null(report_trace_model_block(m, 0x1000));
  assert_int_equal(m->live_bytes, 170);
  assert_int_equal(m->peak_live_bytes, 170);   /* seq 6: 100 + 70 (seq 4 had 60 + 100) */
  assert_int_equal(m->nmarks, 1);
  assert_false(m->clean_exit);
  assert_false(m->damaged);
  const report_trace_stack *s = report_trace_model_stack(m, 7);
  assert_non_null(s);
  assert_int_equal(s->n, 1);
  assert_int_equal(s->frames[0], 0x401000);
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

static uint64_t rec_frame(bytes *b, uint32_t id, uint32_t parent, uint64_t pc) {
  tr_frame f = { .id = id, .parent = parent, .pc = pc };
  return rec(b, TR_FRAME, &f, sizeof f, 0);
}

/* Stacks from FRAME records: each id is its pc, then its parent's frames;
 * ids shared by several stacks; an id said twice keeps the first; an id
 * whose parent was never said ends there; an event naming an id before
 * its FRAME is late. */
/* child_handoff's trace: every free before the next allocation of its
 * address, with the TSC numbering threads where it may (the parent's own
 * ledger says whether it may here) and with the shared counter. */
static void handoff_check(const char *clock, bool tsc) {
  char path[256];
  temp_path(path, sizeof path, "handoff");
  int st = spawn("child-handoff", path, NULL, clock);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  report_trace_model *m = load_model(path);
  assert_false(m->damaged);
  uint64_t events = 2 * 2 * HANDOFF_BLOCKS + 3 * HANDOFF_KEPT;
  assert_int_equal(m->unmatched_frees, 0);
  assert_int_equal(m->realloc_overlaps, 0);
  assert_int_equal(m->frees, 2 * HANDOFF_BLOCKS);
  assert_true(m->allocs >= 2 * HANDOFF_BLOCKS + 2 * HANDOFF_KEPT);
  size_t kept = 0, kept_main = 0;
  uint64_t threads_last = 0, main_first = UINT64_MAX;
  for (size_t i = 0; i < m->nblocks; i++) {
    const char *name = report_trace_model_tag(m, m->blocks[i].tag);
    if (name && strcmp(name, "h.block") == 0) {
      assert_int_equal(m->blocks[i].size, 48);
      kept++;
      if (m->blocks[i].seq > threads_last) threads_last = m->blocks[i].seq;
    } else if (name && strcmp(name, "h.main") == 0) {
      kept_main++;
      if (m->blocks[i].seq < main_first) main_first = m->blocks[i].seq;
    }
  }
  assert_int_equal(kept, 2 * HANDOFF_KEPT);
  assert_int_equal(kept_main, HANDOFF_KEPT);
  /* the threads' last blocks, then the mark, then the lone thread's */
  assert_int_equal(m->nmarks, 1);
  assert_true(threads_last < m->marks[0].seq);
  assert_true(m->marks[0].seq < main_first);
  /* TSC numbers advance by a unit every 16 ticks, many per event; the
   * counter by one per event (and a few for marks, threads, the end) */
  uint64_t span = m->last_seq - m->first_seq;
  if (tsc) assert_true(span > 4 * events);
  else assert_true(span < events + 1000);
  report_trace_model_free(m);
  unlink(path);
}

static void test_threads_order(void **state) {
  (void)state;
  ta_tag_get("h.block");                       /* the ledger starts: _ta_seq_clock is known */
  handoff_check(NULL, _ta_seq_clock);
  handoff_check("TAGALLOC_CLOCK=0", false);
}

static void test_model_frames(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_frame(&b, 1, 0, 0x401000);             /* main */
  rec_frame(&b, 2, 1, 0x402000);             /* f, from main */
  uint64_t off3 = rec_frame(&b, 3, 2, 0x403000);   /* g, from f */
  rec_frame(&b, 4, 2, 0x404000);             /* h, from f */
  rec_alloc(&b, 1, 0x1000, 10, 3, 1);
  rec_alloc(&b, 2, 0x2000, 20, 6, 1);        /* 6: said after: late */
  rec_frame(&b, 3, 1, 0x409000);             /* said again: the first stays */
  rec_frame(&b, 6, 5, 0x406000);             /* parent 5 never said */
  rec_alloc(&b, 3, 0x3000, 30, 4, 1);
  rec_frame(&b, 0x40000000, 2, 0x407000);    /* an id far past the others: kept apart from the dense ones */
  rec_frame(&b, 0x40000001, 0x40000000, 0x408000);
  char err[512];
  report_trace *t = report_trace_open_mem(b.p, b.len, "frames.trace", err, sizeof err);
  assert_non_null(t);
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  assert_false(m->damaged);
  assert_int_equal(m->allocs, 3);
  assert_int_equal(m->late_stacks, 1);
  const report_trace_stack *g = report_trace_model_stack(m, 3);
  assert_non_null(g);
  assert_int_equal(g->id, 3);
  assert_int_equal(g->n, 3);
  assert_int_equal(g->frames[0], 0x403000);
  assert_int_equal(g->frames[1], 0x402000);
  assert_int_equal(g->frames[2], 0x401000);
  assert_int_equal(g->offset, off3);
  const report_trace_stack *h = report_trace_model_stack(m, 4);
  assert_non_null(h);
  assert_int_equal(h->n, 3);
  assert_int_equal(h->frames[0], 0x404000);
  assert_int_equal(h->frames[2], 0x401000);
  assert_ptr_equal(report_trace_model_stack(m, 3), g);   /* put together once */
  assert_int_equal(g->frames[0], 0x403000);              /* and still there */
  const report_trace_stack *lone = report_trace_model_stack(m, 6);
  assert_non_null(lone);
  assert_int_equal(lone->n, 1);
  assert_int_equal(lone->frames[0], 0x406000);
  assert_int_equal(report_trace_model_stack(m, 1)->n, 1);
  assert_null(report_trace_model_stack(m, 5));
  assert_null(report_trace_model_stack(m, 7));
  const report_trace_stack *far = report_trace_model_stack(m, 0x40000001);
  assert_non_null(far);
  assert_int_equal(far->n, 4);
  assert_int_equal(far->frames[0], 0x408000);
  assert_int_equal(far->frames[1], 0x407000);
  assert_int_equal(far->frames[2], 0x402000);
  assert_int_equal(far->frames[3], 0x401000);
  assert_null(report_trace_model_stack(m, 0x40000002));
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

/* Runs of FRAME records (the writer puts each flush's new nodes in one),
 * which the model reads without the round through report_trace_next: an
 * id said twice inside a run keeps the first, a padded FRAME (32 bytes)
 * and a record of another type end a run and the next one starts after
 * them, and a FRAME whose parent is not below it is damage at its own
 * offset, with the records before it counted as the iterator counts them. */
static void test_model_frame_runs(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_frame(&b, 1, 0, 0x401000);
  rec_frame(&b, 2, 1, 0x402000);
  uint64_t off3 = rec_frame(&b, 3, 2, 0x403000);
  rec_frame(&b, 4, 3, 0x404000);
  rec_frame(&b, 3, 1, 0x409000);                    /* said again inside the run: the first stays */
  unsigned char padded[24] = { 0 };
  tr_frame f5 = { .id = 5, .parent = 4, .pc = 0x405000 };
  memcpy(padded, &f5, sizeof f5);
  rec(&b, TR_FRAME, padded, sizeof padded, 0);      /* 32 bytes: read by the iterator */
  rec_frame(&b, 6, 5, 0x406000);
  rec_alloc(&b, 1, 0x1000, 10, 6, 1);
  rec_alloc(&b, 2, 0x2000, 10, 8, 1);               /* 8 is said after it: late */
  rec_frame(&b, 7, 6, 0x407000);
  rec_frame(&b, 8, 7, 0x408000);
  uint64_t bad = rec_frame(&b, 9, 9, 0x40a000);     /* its parent is not below it */
  rec_frame(&b, 10, 8, 0x40b000);

  report_trace_iter it;
  size_t yielded = read_bytes(&b, &it);
  assert_int_equal(yielded, 11);
  assert_true(it.damaged);
  assert_int_equal(it.damage_offset, bad);

  char err[512];
  report_trace *t = report_trace_open_mem(b.p, b.len, "made.trace", err, sizeof err);
  assert_non_null(t);
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  assert_true(m->damaged);
  assert_int_equal(m->damage_offset, bad);
  assert_int_equal(m->records, it.records);
  assert_string_equal(strstr(m->damage, "a FRAME record"), strstr(it.message, "a FRAME record"));
  assert_int_equal(m->allocs, 2);
  assert_int_equal(m->late_stacks, 1);
  const report_trace_stack *s3 = report_trace_model_stack(m, 3);
  assert_non_null(s3);
  assert_int_equal(s3->n, 3);
  assert_int_equal(s3->frames[0], 0x403000);
  assert_int_equal(s3->offset, off3);
  const report_trace_stack *s8 = report_trace_model_stack(m, 8);
  assert_non_null(s8);
  assert_int_equal(s8->n, 8);
  static const uint64_t want8[] = { 0x408000, 0x407000, 0x406000, 0x405000, 0x404000, 0x403000, 0x402000, 0x401000 };
  for (size_t i = 0; i < 8; i++) assert_int_equal(s8->frames[i], want8[i]);
  assert_null(report_trace_model_stack(m, 9));
  assert_null(report_trace_model_stack(m, 10));     /* after the damage */
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

/* A run of FRAME records longer than the reader's 4 MiB window over a
 * mapped file (the pages behind it are given back as it goes): every node
 * is read, and a stack from the far end has all its frames. */
static void test_model_frame_run_long(void **state) {
  (void)state;
  enum { NODES = 200000 };                          /* 4.8 MB of FRAME records */
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  for (uint32_t id = 1; id <= NODES; id++) rec_frame(&b, id, id / 2, 0x400000 + 16 * (uint64_t)id);
  rec_alloc(&b, 1, 0x1000, 10, NODES, 1);
  char path[64];
  temp_path(path, sizeof path, "frames");
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b.p, 1, b.len, f), b.len);
  assert_int_equal(fclose(f), 0);
  char err[512];
  report_trace *t = report_trace_open(path, err, sizeof err);
  assert_non_null(t);
  report_trace_model *m = report_trace_model_build(t);
  assert_non_null(m);
  assert_false(m->damaged);
  assert_int_equal(m->records, NODES + 1);
  assert_int_equal(m->late_stacks, 0);
  const report_trace_stack *s = report_trace_model_stack(m, NODES);
  assert_non_null(s);
  size_t n = 0;
  for (uint32_t id = NODES; id != 0; id /= 2) {
    assert_true(n < s->n);
    assert_int_equal(s->frames[n], 0x400000 + 16 * (uint64_t)id);
    n++;
  }
  assert_int_equal(s->n, n);
  report_trace_model_free(m);
  report_trace_close(t);
  unlink(path);
  free(b.p);
}

/* report_trace_model_read_records of a file: its FRAME records are only
 * marked said, and read when a stack is first asked for, after the trace
 * was closed too.  Every stack is the one a whole read gives: an id said
 * twice (by FRAME or STACK records, either first) keeps the first, a
 * large id's chain runs through small ones, late stacks count the same;
 * and a damaged file's nodes stop at the damage. */
static void test_model_frames_lazy(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_frame(&b, 1, 0, 0x401000);
  rec_frame(&b, 2, 1, 0x402000);
  rec_frame(&b, 3, 2, 0x403000);
  rec_stack(&b, 3, 2, 2);                           /* a STACK after a FRAME of its id: the FRAME stays */
  rec_stack(&b, 5, 3, 3);                           /* a STACK first: it stays */
  rec_frame(&b, 5, 1, 0x405000);
  rec_alloc(&b, 1, 0x1000, 10, 7, 1);               /* late */
  rec_alloc(&b, 2, 0x2000, 10, 0x40000001, 1);      /* late, a large id */
  rec_frame(&b, 7, 3, 0x407000);
  rec_frame(&b, 3, 1, 0x409000);                    /* said again: the first stays */
  rec_frame(&b, 0x40000000, 7, 0x40a000);           /* a large id from small ones */
  rec_frame(&b, 0x40000001, 0x40000000, 0x40b000);
  rec_alloc(&b, 3, 0x3000, 10, 0x40000001, 1);
  rec_frame(&b, 8, 7, 0x408000);
  rec_frame(&b, 14, 12, 0x40e000);                  /* its parent is said after it: a depth of 1 */
  rec_frame(&b, 12, 8, 0x40f000);
  uint64_t bad = rec_frame(&b, 9, 9, 0x40c000);
  rec_frame(&b, 10, 8, 0x40d000);
  char path[64];
  temp_path(path, sizeof path, "lazy");
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b.p, 1, b.len, f), b.len);
  assert_int_equal(fclose(f), 0);
  char err[512];
  report_trace *tw = report_trace_open(path, err, sizeof err);
  report_trace *tl = report_trace_open(path, err, sizeof err);
  assert_non_null(tw);
  assert_non_null(tl);
  report_trace_model *w = report_trace_model_build(tw);
  report_trace_model *l = report_trace_model_read_records(tl);
  assert_non_null(w);
  assert_non_null(l);
  report_trace_close(tl);                           /* the lazy model keeps what it needs */
  unlink(path);
  assert_true(l->damaged);
  assert_int_equal(l->damage_offset, bad);
  assert_int_equal(l->records, w->records);
  assert_int_equal(l->late_stacks, 2);
  assert_int_equal(l->late_stacks, w->late_stacks);
  static const uint32_t ids[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 0x40000000, 0x40000001, 0x40000002 };
  for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
    const report_trace_stack *x = report_trace_model_stack(w, ids[i]);
    const report_trace_stack *y = report_trace_model_stack(l, ids[i]);
    if (x == NULL) {
      assert_null(y);
      continue;
    }
    assert_non_null(y);
    assert_int_equal(y->id, x->id);
    assert_int_equal(y->n, x->n);
    assert_int_equal(y->offset, x->offset);
    for (size_t k = 0; k < x->n; k++) assert_int_equal(y->frames[k], x->frames[k]);
  }
  const report_trace_stack *s3 = report_trace_model_stack(l, 3);
  assert_int_equal(s3->n, 3);
  assert_int_equal(s3->frames[0], 0x403000);
  assert_int_equal(report_trace_model_stack(l, 5)->n, 3);           /* the STACK record's 3 frames */
  const report_trace_stack *far = report_trace_model_stack(l, 0x40000001);
  assert_int_equal(far->n, 6);
  assert_int_equal(far->frames[2], 0x407000);
  assert_int_equal(far->frames[5], 0x401000);
  assert_int_equal(report_trace_model_stack(l, 8)->n, 5);
  assert_int_equal(report_trace_model_stack(l, 14)->n, 1);
  assert_int_equal(report_trace_model_stack(l, 12)->n, 6);
  assert_null(report_trace_model_stack(l, 10));     /* after the damage */
  report_trace_model_free(l);
  report_trace_model_free(w);
  report_trace_close(tw);
  free(b.p);
}

/* ---- the replay of several threads: merged, checked against a plain sort ------------ */

/* The replay done the plain way, apart from the reader's: every ALLOC,
 * FREE and MARK the iterator yields, in file order, sorted by (seq, place
 * in the file), replayed over a table of live blocks.  What the model must
 * hold whatever order the file gives the events in. */
typedef struct { uint64_t seq, order, addr, size; uint32_t stack, thread; uint16_t tag; int kind; } oev;

#define ORACLE_STACKS 256
typedef struct {
  uint64_t allocs, frees, live_bytes, peak, peak_seq, unmatched, overlaps, first_seq, last_seq;
  size_t nevents, nblocks;
  report_trace_block *blocks;            /* live at the end, by seq */
  uint32_t stack[ORACLE_STACKS];         /* the sites: allocation stacks */
  uint64_t site_allocs[ORACLE_STACKS], site_frees[ORACLE_STACKS];
  uint64_t site_live[ORACLE_STACKS], site_blocks[ORACLE_STACKS];
  uint64_t site_peak[ORACLE_STACKS], site_peak_blocks[ORACLE_STACKS];
  size_t nstacks;
} oracle;

static int oev_cmp(const void *a, const void *b) {
  const oev *x = a, *y = b;
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static int block_seq_cmp(const void *a, const void *b) {
  const report_trace_block *x = a, *y = b;
  /* Threads' TSC sequence numbers can tie: then by thread and address, so
   * that the order (and every report listing blocks) is the same each time. */
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static size_t oracle_site(oracle *o, uint32_t stack) {
  for (size_t i = 0; i < o->nstacks; i++)
    if (o->stack[i] == stack) return i;
  assert_true(o->nstacks < ORACLE_STACKS);
  o->stack[o->nstacks] = stack;
  return o->nstacks++;
}

static void oracle_run(const report_trace *t, oracle *o) {
  memset(o, 0, sizeof *o);
  size_t cap = 1024, n = 0;
  oev *v = malloc(cap * sizeof *v);
  assert_non_null(v);
  report_trace_iter it;
  report_trace_rec r;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    oev e = { .order = n };
    if (r.type == TR_ALLOC) {
      tr_alloc a;
      memcpy(&a, r.payload, sizeof a);
      e = (oev){ a.seq, n, a.addr, a.size, a.stack, a.thread, a.tag, 0 };
      o->allocs++;
    } else if (r.type == TR_FREE) {
      tr_free f;
      memcpy(&f, r.payload, sizeof f);
      e = (oev){ .seq = f.seq, .order = n, .addr = f.addr, .kind = 1 };
      o->frees++;
    } else if (r.type == TR_MARK) {
      tr_mark mk;
      memcpy(&mk, r.payload, sizeof mk);
      e = (oev){ .seq = mk.seq, .order = n, .kind = 2 };
    } else {
      continue;
    }
    if (n == cap) {
      cap *= 2;
      v = realloc(v, cap * sizeof *v);
      assert_non_null(v);
    }
    v[n++] = e;
  }
  o->nevents = n;
  qsort(v, n, sizeof *v, oev_cmp);
  /* live blocks: an open-addressing table on the address, never shrunk */
  size_t tcap = 16;
  while (tcap < 2 * n + 16) tcap *= 2;
  report_trace_block *live = calloc(tcap, sizeof *live);
  bool *used = calloc(tcap, sizeof *used);
  assert_non_null(live);
  assert_non_null(used);
  for (size_t i = 0; i < n; i++) {
    const oev *e = &v[i];
    if (i == 0) o->first_seq = e->seq;
    o->last_seq = e->seq;
    if (e->kind == 2) continue;
    size_t j = (size_t)(e->addr * 0x9E3779B97F4A7C15ull >> 20) & (tcap - 1);
    while (used[j] && live[j].addr != e->addr) j = (j + 1) & (tcap - 1);
    bool found = used[j] && live[j].size != UINT64_MAX;
    if (found) {
      size_t s = oracle_site(o, live[j].stack);
      o->live_bytes -= live[j].size;
      o->site_frees[s]++;
      o->site_live[s] -= live[j].size;
      o->site_blocks[s]--;
      live[j].size = UINT64_MAX;               /* dead, its slot kept for the address */
      if (e->kind == 1) continue;
      o->overlaps++;
    } else if (e->kind == 1) {
      o->unmatched++;
      continue;
    }
    used[j] = true;
    live[j] = (report_trace_block){ e->addr, e->size, e->seq, e->stack, e->thread, e->tag, false };
    size_t s = oracle_site(o, e->stack);
    o->site_allocs[s]++;
    o->site_live[s] += e->size;
    o->site_blocks[s]++;
    o->live_bytes += e->size;
    if (o->live_bytes > o->peak) {
      o->peak = o->live_bytes;
      o->peak_seq = e->seq;
      memcpy(o->site_peak, o->site_live, sizeof o->site_peak);
      memcpy(o->site_peak_blocks, o->site_blocks, sizeof o->site_peak_blocks);
    }
  }
  o->blocks = malloc((n ? n : 1) * sizeof *o->blocks);
  assert_non_null(o->blocks);
  for (size_t j = 0; j < tcap; j++)
    if (used[j] && live[j].size != UINT64_MAX) o->blocks[o->nblocks++] = live[j];
  qsort(o->blocks, o->nblocks, sizeof *o->blocks, block_seq_cmp);
  free(live);
  free(used);
  free(v);
}

/* The model of t equals the plain replay, number for number. */
static void expect_oracle(const report_trace *t, const report_trace_model *m) {
  oracle o;
  oracle_run(t, &o);
  assert_int_equal(m->allocs, o.allocs);
  assert_int_equal(m->frees, o.frees);
  assert_int_equal(m->live_bytes, o.live_bytes);
  assert_int_equal(m->peak_live_bytes, o.peak);
  assert_int_equal(m->peak_seq, o.peak_seq);
  assert_int_equal(m->unmatched_frees, o.unmatched);
  assert_int_equal(m->realloc_overlaps, o.overlaps);
  if (o.nevents) {
    assert_int_equal(m->first_seq, o.first_seq);
    assert_int_equal(m->last_seq, o.last_seq);
  }
  assert_int_equal(m->nblocks, o.nblocks);
  for (size_t i = 0; i < o.nblocks; i++) {
    assert_int_equal(m->blocks[i].addr, o.blocks[i].addr);
    assert_int_equal(m->blocks[i].size, o.blocks[i].size);
    assert_int_equal(m->blocks[i].seq, o.blocks[i].seq);
    assert_int_equal(m->blocks[i].stack, o.blocks[i].stack);
    assert_int_equal(m->blocks[i].thread, o.blocks[i].thread);
    assert_int_equal(m->blocks[i].tag, o.blocks[i].tag);
  }
  for (size_t i = 0; i < o.nstacks; i++) {
    const report_trace_site *s = report_trace_model_site(m, o.stack[i]);
    assert_non_null(s);
    assert_int_equal(s->allocs, o.site_allocs[i]);
    assert_int_equal(s->frees, o.site_frees[i]);
    assert_int_equal(s->live_bytes, o.site_live[i]);
    assert_int_equal(s->live_blocks, o.site_blocks[i]);
    assert_int_equal(s->peak_bytes, o.site_peak[i]);
    assert_int_equal(s->peak_blocks, o.site_peak_blocks[i]);
  }
  assert_int_equal(m->nsites, o.nstacks);
  free(o.blocks);
}

/* A PACKED record of thread's events: (kind, seq, addr, size, stack), kind
 * 'a' an ALLOC of tag 1, 'f' a FREE. */
typedef struct { char kind; uint64_t seq, addr, size; uint32_t stack; } pk_ev;

static unsigned char *pk_uv(unsigned char *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  *p++ = (unsigned char)v;
  return p;
}

static unsigned char *pk_sv(unsigned char *p, uint64_t d) {
  return pk_uv(p, (d << 1) ^ (uint64_t)((int64_t)d >> 63));
}

static uint64_t rec_packed(bytes *b, uint32_t thread, const pk_ev *ev, size_t n) {
  unsigned char *buf = malloc(sizeof(tr_packed) + n * 40);
  assert_non_null(buf);
  tr_packed pk = { .thread = thread };
  memcpy(buf, &pk, sizeof pk);
  unsigned char *p = buf + sizeof pk;
  uint64_t seq = 0, addr = 0;
  for (size_t i = 0; i < n; i++) {
    *p++ = ev[i].kind == 'a' ? TR_PK_ALLOC : TR_PK_FREE;
    p = pk_sv(p, ev[i].seq - seq);
    p = pk_sv(p, ev[i].addr - addr);
    seq = ev[i].seq;
    addr = ev[i].addr;
    if (ev[i].kind == 'a') {
      p = pk_uv(p, ev[i].size);
      p = pk_uv(p, ev[i].stack);
      p = pk_uv(p, 1);
    } else {
      p = pk_uv(p, ev[i].stack);
    }
  }
  uint64_t off = rec(b, TR_PACKED, buf, (size_t)(p - buf), 0);
  free(buf);
  return off;
}

static uint64_t rec_event_t(bytes *b, int kind, uint32_t thread, uint64_t seq, uint64_t addr, uint64_t size,
                            uint32_t stack) {
  if (kind == 'a') {
    tr_alloc a = { .seq = seq, .addr = addr, .size = size, .stack = stack, .tag = 1, .thread = thread };
    return rec(b, TR_ALLOC, &a, sizeof a, 0);
  }
  tr_free f = { .seq = seq, .addr = addr, .stack = stack, .thread = thread };
  return rec(b, TR_FREE, &f, sizeof f, 0);
}

static report_trace_model *model_of(const bytes *b, report_trace **t) {
  char err[512] = "";
  *t = report_trace_open_mem(b->p, b->len, "threads.trace", err, sizeof err);
  if (*t == NULL) fail_msg("%s", err);
  report_trace_model *m = report_trace_model_build(*t);
  assert_non_null(m);
  return m;
}

/* Three threads' buffers in flush order, not in sequence order: thread 1
 * allocates A at seq 21 in a buffer written before thread 2's, which
 * frees A at seq 20 (an address handed on); thread 3 frees B at seq 30 and
 * thread 2 allocates B at seq 30 too (the TSC numbers two threads' events
 * alike: the file's order decides, the free first); thread 1's first
 * buffer (seq 1..) comes last, and a MARK and thread 0's unpacked ALLOC
 * are among them.  A merge by seq alone, or one that trusted the file's
 * order, would see A allocated over a live block and a free of nothing;
 * one that broke the tie the other way would leave B dead. */
static void test_merge_made(void **state) {
  (void)state;
  enum { A = 0x1000, B = 0x2000, C = 0x3000, D = 0x4000, E = 0x5000 };
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_stack(&b, 1, 1, 1);
  rec_stack(&b, 2, 1, 1);
  rec_stack(&b, 3, 1, 1);
  const pk_ev t3[] = { { 'a', 5, C, 300, 3 }, { 'f', 30, B, 0, 3 } };
  rec_packed(&b, 3, t3, 2);
  const pk_ev t1b[] = { { 'a', 21, A, 100, 1 }, { 'a', 40, E, 1000, 1 } };
  rec_packed(&b, 1, t1b, 2);
  rec_event_t(&b, 'a', 0, 3, D, 7, 2);         /* thread 0: no buffer of its own */
  const pk_ev t2[] = { { 'a', 4, A, 50, 2 }, { 'a', 6, B, 60, 2 }, { 'f', 20, A, 0, 2 },
                       { 'a', 30, B, 70, 2 }, { 'f', 41, C, 0, 2 } };
  rec_packed(&b, 2, t2, 5);
  tr_mark mk = { .seq = 25, .mark = 1, .thread = 1 };
  rec(&b, TR_MARK, &mk, sizeof mk, 0);
  const pk_ev t1a[] = { { 'a', 1, 0x9000, 10, 1 }, { 'f', 2, 0x9000, 0, 1 } };
  rec_packed(&b, 1, t1a, 2);
  report_trace *t;
  report_trace_model *m = model_of(&b, &t);
  assert_int_equal(m->replay, REPORT_TRACE_MERGED);
  assert_int_equal(m->allocs, 8);
  assert_int_equal(m->frees, 4);
  assert_int_equal(m->unmatched_frees, 0);
  assert_int_equal(m->realloc_overlaps, 0);
  /* live at the end: D 7 (seq 3), A 100 (21), B 70 (30), E 1000 (40) */
  assert_int_equal(m->nblocks, 4);
  const uint64_t addr[] = { D, A, B, E }, size[] = { 7, 100, 70, 1000 }, seq[] = { 3, 21, 30, 40 };
  const uint32_t thread[] = { 0, 1, 2, 1 };
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(m->blocks[i].addr, addr[i]);
    assert_int_equal(m->blocks[i].size, size[i]);
    assert_int_equal(m->blocks[i].seq, seq[i]);
    assert_int_equal(m->blocks[i].thread, thread[i]);
  }
  assert_int_equal(m->live_bytes, 1177);
  assert_int_equal(m->peak_live_bytes, 1477);   /* seq 40: C (300) still live, freed at 41 */
  assert_int_equal(m->peak_seq, 40);
  assert_int_equal(m->first_seq, 1);
  assert_int_equal(m->last_seq, 41);
  assert_int_equal(m->nmarks, 1);
  const report_trace_site *s2 = report_trace_model_site(m, 2);
  assert_non_null(s2);
  assert_int_equal(s2->allocs, 4);              /* D, A, B, B */
  assert_int_equal(s2->frees, 2);               /* A at 20, B at 30 */
  assert_int_equal(s2->live_bytes, 77);
  assert_int_equal(s2->peak_bytes, 77);
  expect_oracle(t, m);
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

/* One thread's own order slipping: a few places (a signal handler's
 * allocation numbered after, written before) the merge's window puts back;
 * 300 events written in reverse, past any window, are sorted whole.  Both
 * give the plain replay's numbers. */
static void test_merge_window(void **state) {
  (void)state;
  bytes b = file_start(TR_MAGIC, TR_VERSION);
  rec_stack(&b, 1, 1, 1);
  const pk_ev t2[] = { { 'a', 2, 0x100, 8, 1 }, { 'a', 5, 0x200, 16, 1 }, { 'a', 3, 0x300, 32, 1 },
                       { 'f', 6, 0x100, 0, 1 }, { 'f', 4, 0x300, 0, 1 } };
  rec_packed(&b, 2, t2, 5);
  const pk_ev t1[] = { { 'a', 1, 0x400, 64, 1 }, { 'f', 7, 0x200, 0, 1 } };
  rec_packed(&b, 1, t1, 2);
  report_trace *t;
  report_trace_model *m = model_of(&b, &t);
  assert_int_equal(m->replay, REPORT_TRACE_MERGED);
  assert_int_equal(m->unmatched_frees, 0);
  assert_int_equal(m->nblocks, 1);
  assert_int_equal(m->blocks[0].addr, 0x400);
  assert_int_equal(m->peak_live_bytes, 104);   /* seq 3: 64 + 8 + 32 (16 comes at 5, after 32 went) */
  assert_int_equal(m->peak_seq, 3);
  expect_oracle(t, m);
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);

  b = file_start(TR_MAGIC, TR_VERSION);
  rec_stack(&b, 1, 1, 1);
  pk_ev rev[300];
  for (size_t i = 0; i < 300; i++)          /* seq 1000 down to 701: alloc i, free i - 1 in between */
    rev[i] = (pk_ev){ i % 2 ? 'f' : 'a', 1000 - i, 0x10000 + 64 * (i / 2), 24, 1 };
  rec_packed(&b, 2, rev, 300);
  rec_event_t(&b, 'a', 1, 500, 0x100, 5, 1);
  m = model_of(&b, &t);
  assert_int_equal(m->replay, REPORT_TRACE_SORTED);
  assert_int_equal(m->allocs, 151);
  assert_int_equal(m->frees, 150);
  assert_int_equal(m->unmatched_frees, 150);   /* each free numbered before its allocation */
  assert_int_equal(m->nblocks, 151);
  assert_int_equal(m->blocks[0].addr, 0x100);
  assert_int_equal(m->peak_live_bytes, 5 + 150 * 24);
  expect_oracle(t, m);
  report_trace_model_free(m);
  report_trace_close(t);
  free(b.p);
}

/* A traced program of 4 threads (child_handoff, the ledger's own PACKED
 * records): merged, equal to the plain replay; and cut anywhere, its
 * prefix's model equal to the plain replay of that prefix (the merge stops
 * at the damage as the first pass does). */
static void test_merge_threads(void **state) {
  (void)state;
  char path[256];
  temp_path(path, sizeof path, "merge");
  int st = spawn("child-handoff", path, NULL, "TAGALLOC_TRACE_BUFFER=4096");
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  size_t size;
  unsigned char *data = slurp(path, &size);
  unlink(path);
  for (size_t k = 0; k <= 40; k++) {
    size_t len = k == 40 ? size : sizeof(tr_file_header) + (size - sizeof(tr_file_header)) / 40 * k + k * 7;
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    memcpy(buf, data, len);
    char err[512] = "";
    report_trace *t = report_trace_open_mem(buf, len, "cut.trace", err, sizeof err);
    if (t == NULL) fail_msg("%s", err);
    report_trace_model *m = report_trace_model_build(t);
    assert_non_null(m);
    if (k == 40) {
      assert_false(m->damaged);
      assert_true(m->clean_exit);
      assert_int_equal(m->frees, 2 * HANDOFF_BLOCKS);
      assert_int_equal(m->unmatched_frees, 0);
    } else {
      assert_false(m->clean_exit);
    }
    if (k >= 20) assert_int_equal(m->replay, REPORT_TRACE_MERGED);
    expect_oracle(t, m);
    report_trace_model_free(m);
    report_trace_close(t);
    free(buf);
  }
  free(data);
}

static void expect_same_marks(const report_trace_model *a, const report_trace_model *b) {
  assert_int_equal(a->nmarks, b->nmarks);
  for (size_t i = 0; i < a->nmarks; i++) {
    assert_int_equal(a->marks[i].seq, b->marks[i].seq);
    assert_int_equal(a->marks[i].mark, b->marks[i].mark);
    assert_int_equal(a->marks[i].ns, b->marks[i].ns);
    assert_int_equal(a->marks[i].thread, b->marks[i].thread);
  }
}

/* b, read lean and replayed after, holds what a's build replayed. */
static void expect_same_replay(const report_trace_model *a, const report_trace_model *b) {
  assert_true(a->replayed);
  assert_true(b->replayed);
  assert_int_equal(a->replay, b->replay);
  assert_int_equal(a->live_bytes, b->live_bytes);
  assert_int_equal(a->peak_live_bytes, b->peak_live_bytes);
  assert_int_equal(a->peak_seq, b->peak_seq);
  assert_int_equal(a->first_seq, b->first_seq);
  assert_int_equal(a->last_seq, b->last_seq);
  assert_int_equal(a->unmatched_frees, b->unmatched_frees);
  assert_int_equal(a->realloc_overlaps, b->realloc_overlaps);
  assert_int_equal(a->nblocks, b->nblocks);
  for (size_t i = 0; i < a->nblocks; i++) {     /* field by field: the structs' padding is not set */
    const report_trace_block *x = &a->blocks[i], *y = &b->blocks[i];
    assert_int_equal(x->addr, y->addr);
    assert_int_equal(x->size, y->size);
    assert_int_equal(x->seq, y->seq);
    assert_int_equal(x->stack, y->stack);
    assert_int_equal(x->thread, y->thread);
    assert_int_equal(x->tag, y->tag);
    assert_int_equal(x->arena, y->arena);
  }
  assert_int_equal(a->nsites, b->nsites);
  assert_memory_equal(a->sites, b->sites, a->nsites * sizeof *a->sites);
  assert_int_equal(a->nanchors, b->nanchors);
  assert_memory_equal(a->anchors, b->anchors, a->nanchors * sizeof *a->anchors);
  expect_same_marks(a, b);
  const report_trace_timeline *x = &a->timeline, *y = &b->timeline;
  assert_int_equal(x->nbuckets, y->nbuckets);
  assert_int_equal(x->ntags, y->ntags);
  size_t cells = x->nbuckets * (REPORT_TRACE_TAGS + 1);
  assert_memory_equal(x->seq, y->seq, x->nbuckets * sizeof *x->seq);
  assert_memory_equal(x->values, y->values, cells * sizeof *x->values);
  assert_memory_equal(x->lows, y->lows, cells * sizeof *x->lows);
  assert_int_equal(report_trace_model_ns(a, a->last_seq), report_trace_model_ns(b, b->last_seq));
}

/* The records alone (report_trace_model_read): everything said once and
 * counted, nothing replayed; replayed later, the model a whole build
 * makes, one thread or four. */
static void lean_check(const char *path, report_trace_replay want) {
  char err[512] = "";
  report_trace *t = report_trace_open(path, err, sizeof err);
  if (t == NULL) fail_msg("%s", err);
  report_trace_model *a = report_trace_model_build(t);
  report_trace_model *b = report_trace_model_read(t);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->replay, want);
  assert_false(b->replayed);
  assert_int_equal(b->nblocks, 0);
  assert_int_equal(b->nsites, 0);
  assert_int_equal(b->peak_live_bytes, 0);
  assert_int_equal(b->timeline.nbuckets, 0);
  assert_int_equal(b->allocs, a->allocs);
  assert_int_equal(b->frees, a->frees);
  assert_int_equal(b->late_stacks, a->late_stacks);
  assert_int_equal(b->nfindings, a->nfindings);
  assert_int_equal(b->has_summary, a->has_summary);
  assert_int_equal(b->clean_exit, a->clean_exit);
  assert_int_equal(b->end_seq, a->end_seq);
  expect_same_marks(a, b);
  assert_int_equal(report_trace_model_replay(b, t), 0);
  expect_same_replay(a, b);
  assert_int_equal(report_trace_model_replay(b, t), 0);   /* once only */
  expect_same_replay(a, b);
  report_trace_model_free(a);
  report_trace_model_free(b);
  report_trace_close(t);
}

static void test_model_lean(void **state) {
  (void)state;
  lean_check(g_trace, REPORT_TRACE_FILE_ORDER);
  char path[256];
  temp_path(path, sizeof path, "lean");
  int st = spawn("child-handoff", path, NULL, "TAGALLOC_TRACE_BUFFER=4096");
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  lean_check(path, REPORT_TRACE_MERGED);
  unlink(path);
}

int main(int argc, char **argv) {
  snprintf(g_self, sizeof g_self, "%s", argv[0]);
  ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
  if (n > 0) g_exe[n] = '\0';
  else snprintf(g_exe, sizeof g_exe, "/proc/self/exe");
  if (argc >= 3 && strcmp(argv[1], "child-trace") == 0) return child_trace();
  if (argc >= 4 && strcmp(argv[1], "child-kill") == 0) return child_die(atoi(argv[3]), SIGKILL);
  if (argc >= 4 && strcmp(argv[1], "child-abort") == 0) return child_die(atoi(argv[3]), SIGABRT);
  if (argc >= 3 && strcmp(argv[1], "child-handoff") == 0) return child_handoff();
  if (argc >= 3 && strcmp(argv[1], "child-encode") == 0) return child_encode();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_exact_counts),
    cmocka_unit_test(test_record_order),
    cmocka_unit_test(test_callback),
    cmocka_unit_test(test_killed),
    cmocka_unit_test(test_aborted),
    cmocka_unit_test(test_truncated),
    cmocka_unit_test(test_truncated_long),
    cmocka_unit_test(test_bit_flips),
    cmocka_unit_test(test_header_errors),
    cmocka_unit_test(test_damage_kinds),
    cmocka_unit_test(test_packed_events),
    cmocka_unit_test(test_encoding),
    cmocka_unit_test(test_unknown_types_skipped),
    cmocka_unit_test(test_model_replay),
    cmocka_unit_test(test_model_frames),
    cmocka_unit_test(test_model_frame_runs),
    cmocka_unit_test(test_model_frame_run_long),
    cmocka_unit_test(test_model_frames_lazy),
    cmocka_unit_test(test_threads_order),
    cmocka_unit_test(test_merge_made),
    cmocka_unit_test(test_merge_window),
    cmocka_unit_test(test_merge_threads),
    cmocka_unit_test(test_model_lean),
  };
  return cmocka_run_group_tests(tests, make_clean_trace, remove_clean_trace);
}
