/* marks.c - marks and what is counted since them: ta_mark_now, ta_since,
 * ta_live_since and ta_print_live_since (the assertion macros' report),
 * the peaks of the intervals between marks, and the summary's counts. */
#include "internal.h"
#include "samples.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- marks and counts ---------------------------------------------------------- */

/* Marks are kept until ta_mark_free: marks[0 .. nmarks) in the order of
 * their ids (1, 2, ...; found by binary search).  A freed mark hands the
 * peak of its interval to the live mark before it (or to dropped_peak when
 * there is none), so that ta_since of an older mark still sees every
 * interval's peak, and leaves the array - but the last one, whose interval
 * is still open.  So a loop that takes a mark, checks and frees it each
 * iteration keeps one or two records, not one per iteration. */
typedef struct {
  ta_mark id;
  uint64_t seq;
  uint32_t ntags;
  bool freed;
  ta_tag_counts_plain *counts;  /* at the mark, per tag (NULL once freed) */
  uint64_t *peak_after;         /* peak per tag between this mark and the next */
} mark_rec;

static pthread_mutex_t mark_lock = PTHREAD_MUTEX_INITIALIZER;
static mark_rec *marks;
static size_t nmarks, cap_marks;
static ta_mark last_mark;
static uint64_t dropped_peak[TA_MAX_TAGS];   /* the peaks of the intervals of marks gone */

/* ---- samples: the timeline without a trace (samples.h) ------------------------- */

static _Atomic uint64_t start_ns;
static ta_sample *samples;         /* TA_SAMPLES of them, from the first mark; mark_lock */
static size_t nsamples;
static ta_sample pending;          /* the marks since the last sample kept */
static uint64_t stride = 1;        /* marks per sample kept */
static uint32_t max_tag;           /* the highest tag sampled */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void _ta_samples_start(void) {
  uint64_t zero = 0;
  atomic_compare_exchange_strong(&start_ns, &zero, now_ns());
}

uint64_t _ta_samples_start_ns(void) { return atomic_load(&start_ns); }

static size_t sample_col(uint32_t tag) { return tag < TA_SAMPLE_TAGS ? tag : TA_SAMPLE_TAGS; }

/* Adds the mark's live bytes (live[tag]) and the peaks since the mark
 * before (peak[tag]) to the pending sample; keeps it after stride marks,
 * merging neighbours first when the series is full.  mark_lock held. */
static void sample_mark(ta_mark id, uint64_t ns, const uint64_t *live, const uint64_t *peak, uint32_t ntags) {
  if (samples == NULL) {
    samples = _ta_meta_alloc(TA_SAMPLES * sizeof *samples);
    if (samples == NULL) return;   /* no timeline: the page says so */
  }
  ta_sample s = { .ns = ns, .mark = id };
  for (size_t c = 0; c <= TA_SAMPLE_TAGS; c++) s.lo[c] = UINT64_MAX;
  for (uint32_t i = 0; i < ntags; i++) {
    size_t c = sample_col(i);
    if (i > TA_SAMPLE_TAGS && c == TA_SAMPLE_TAGS) {   /* several tags in the last column: sums */
      s.hi[c] += peak[i];
      s.lo[c] = (s.lo[c] == UINT64_MAX ? 0 : s.lo[c]) + live[i];
      continue;
    }
    s.hi[c] = peak[i];
    s.lo[c] = live[i];
    if ((live[i] || peak[i]) && i > max_tag) max_tag = i;
  }
  for (size_t c = 0; c <= TA_SAMPLE_TAGS; c++)
    if (s.lo[c] == UINT64_MAX) s.lo[c] = 0;
  if (pending.marks == 0) {
    pending = s;
  } else {
    for (size_t c = 0; c <= TA_SAMPLE_TAGS; c++) {
      if (s.hi[c] > pending.hi[c]) pending.hi[c] = s.hi[c];
      if (s.lo[c] < pending.lo[c]) pending.lo[c] = s.lo[c];
    }
    pending.ns = ns;
    pending.mark = id;
  }
  if (++pending.marks < stride) return;
  if (nsamples == TA_SAMPLES) {          /* full: merge pairs, twice the marks per sample */
    for (size_t i = 0; i < TA_SAMPLES / 2; i++) {
      ta_sample *a = &samples[2 * i], *b = &samples[2 * i + 1];
      for (size_t c = 0; c <= TA_SAMPLE_TAGS; c++) {
        if (a->hi[c] > b->hi[c]) b->hi[c] = a->hi[c];
        if (a->lo[c] < b->lo[c]) b->lo[c] = a->lo[c];
      }
      b->marks += a->marks;
      samples[i] = *b;
    }
    nsamples = TA_SAMPLES / 2;
    stride *= 2;
  }
  samples[nsamples++] = pending;
  pending.marks = 0;
}

size_t _ta_samples_read(ta_sample *out, size_t max, bool *other_tags) {
  pthread_mutex_lock(&mark_lock);
  size_t n = nsamples + (pending.marks ? 1 : 0);
  for (size_t i = 0; i < n && i < max; i++) out[i] = i < nsamples ? samples[i] : pending;
  if (other_tags) *other_tags = max_tag > TA_SAMPLE_TAGS;
  pthread_mutex_unlock(&mark_lock);
  return n;
}

void _ta_samples_now(ta_sample *out) {
  _ta_ensure();
  uint32_t ntags = atomic_load(&_ta_tag_count);
  ta_tag_counts_plain counts[TA_MAX_TAGS];
  _ta_thread_sum(counts, ntags);
  memset(out, 0, sizeof *out);
  out->ns = now_ns();
  for (uint32_t i = 0; i < ntags; i++) {
    uint64_t live = counts[i].alloc_bytes - counts[i].free_bytes;
    size_t c = sample_col(i);
    if (i > TA_SAMPLE_TAGS) out->hi[c] += live;
    else out->hi[c] = live;
  }
  memcpy(out->lo, out->hi, sizeof out->lo);
}

/* The live mark m, or NULL; mark_lock held. */
static mark_rec *mark_get(ta_mark m) {
  size_t lo = 0, hi = nmarks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (marks[mid].id < m) lo = mid + 1;
    else hi = mid;
  }
  return lo < nmarks && marks[lo].id == m && !marks[lo].freed ? &marks[lo] : NULL;
}

/* Folds the interval peaks of freed marks into the live mark before them
 * (or dropped_peak) and drops them; the last mark's interval is still
 * open, so it stays.  mark_lock held. */
static void marks_compact(void) {
  for (size_t i = nmarks; i-- > 0;) {
    mark_rec *r = &marks[i];
    if (!r->freed || r->peak_after == NULL || i + 1 == nmarks) continue;
    uint64_t *into = dropped_peak;
    uint32_t n = TA_MAX_TAGS;
    for (size_t j = i; j-- > 0;)
      if (!marks[j].freed) { into = marks[j].peak_after; n = marks[j].ntags; break; }
    for (uint32_t k = 0; k < r->ntags; k++) {
      uint64_t *d = k < n ? &into[k] : &dropped_peak[k];
      if (r->peak_after[k] > *d) *d = r->peak_after[k];
    }
    _ta_meta_free(r->peak_after);
    r->peak_after = NULL;
  }
  size_t n = 0;
  for (size_t i = 0; i < nmarks; i++)
    if (!marks[i].freed || i + 1 == nmarks) marks[n++] = marks[i];
  nmarks = n;
}

ta_mark ta_mark_now(void) {
  _ta_ensure();
  ta_thread *t = _ta_thread();
  uint32_t ntags = atomic_load(&_ta_tag_count);
  ta_tag_counts_plain *counts = _ta_meta_alloc(ntags * sizeof *counts);
  uint64_t *peak_after = _ta_meta_calloc(ntags, sizeof *peak_after);
  if (counts == NULL || peak_after == NULL) {
    _ta_error(TA_ENOMEM, "out of memory for a mark");
    _ta_meta_free(counts);
    _ta_meta_free(peak_after);
    return 0;
  }
  pthread_mutex_lock(&mark_lock);
  if (nmarks == cap_marks) {
    size_t cap = cap_marks ? cap_marks * 2 : 64;
    mark_rec *m = _ta_meta_realloc(marks, cap * sizeof *m);
    if (m == NULL) {
      pthread_mutex_unlock(&mark_lock);
      _ta_meta_free(counts);
      _ta_meta_free(peak_after);
      return 0;
    }
    marks = m;
    cap_marks = cap;
  }
  atomic_fetch_add(&_ta_seq_epoch, 1);     /* threads take fresh sequence blocks */
  uint64_t seq = _ta_tracing ? _ta_seq_take(t, false) : atomic_fetch_add(&_ta_seq, 1);
  _ta_thread_sum(counts, ntags);
  /* Close the interval of the previous mark: its peak, and restart. */
  mark_rec *prev = nmarks ? &marks[nmarks - 1] : NULL;
  uint64_t live_at[TA_MAX_TAGS], peak_in[TA_MAX_TAGS];
  for (uint32_t i = 0; i < ntags; i++) {
    uint64_t live = counts[i].alloc_bytes - counts[i].free_bytes;
    uint64_t p = _ta_peak_restart((ta_tag)i, live);
    live_at[i] = live;
    peak_in[i] = p > live ? p : live;
    if (prev && i < prev->ntags) prev->peak_after[i] = peak_in[i];
  }
  ta_mark id = ++last_mark;
  sample_mark(id, now_ns(), live_at, peak_in, ntags);
  marks[nmarks++] = (mark_rec){ id, seq, ntags, false, counts, peak_after };
  if (prev && prev->freed) marks_compact();    /* its interval just closed */
  pthread_mutex_unlock(&mark_lock);
  if (_ta_tracing) _ta_trace_mark(t, id, seq);
  return id;
}

typedef struct {
  uint64_t seq;
  ta_tag tag;
  uint64_t blocks, bytes;
  void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg);
  void *arg;
} since_walk;

static void since_visit(const ta_block *b, void *arg) {
  since_walk *w = arg;
  if (b->seq < w->seq || (w->tag && b->tag != w->tag)) return;
  w->blocks++;
  w->bytes += b->size;
  if (w->fn) w->fn((const void *)b->addr, b->size, b->tag, b->stack, w->arg);
}

typedef struct { since_walk *w; bool complete; } ring_walk;

/* Does t's ring of recent births reach back to seq? */
static void ring_check(ta_thread *t, void *arg) {
  ring_walk *rw = arg;
  uint64_t head = atomic_load_explicit(&t->ring_head, memory_order_acquire);
  if (head <= TA_RING) return;                       /* every birth is there */
  uint64_t oldest = atomic_load_explicit(&t->ring[head % TA_RING].seq, memory_order_relaxed);
  if (oldest >= rw->w->seq) rw->complete = false;    /* births before it are gone */
}

/* Walks a thread's recent births back to the mark. */
static void ring_visit(ta_thread *t, void *arg) {
  ring_walk *rw = arg;
  uint64_t head = atomic_load_explicit(&t->ring_head, memory_order_acquire);
  for (uint64_t k = head; k > 0 && head - k < TA_RING; k--) {
    ta_birth *r = &t->ring[(k - 1) % TA_RING];
    uint64_t seq = atomic_load_explicit(&r->seq, memory_order_relaxed);
    if (seq < rw->w->seq) return;
    ta_block b;
    uintptr_t a = atomic_load_explicit(&r->addr, memory_order_relaxed);
    if (_ta_block_live(a, &b) && b.seq == seq) since_visit(&b, rw->w);   /* registry locked: live table only */
  }
}

static bool retired_births_since(uint64_t seq);

static void live_since(uint64_t seq, ta_tag tag, since_walk *w) {
  w->seq = seq;
  w->tag = tag;
  w->blocks = w->bytes = 0;
  /* Fast: the births rings of live threads, when they reach back to the
   * mark and no thread that allocated since has exited. */
  if (seq > 1 && !retired_births_since(seq)) {
    ring_walk rw = { w, true };
    _ta_thread_each(ring_check, &rw);
    if (rw.complete) {
      _ta_thread_each(ring_visit, &rw);
      return;
    }
  }
  _ta_block_each(false, since_visit, w);
}

static _Atomic uint64_t last_retired_birth;   /* newest birth seq of an exited thread */
static bool retired_births_since(uint64_t seq) {
  return atomic_load(&last_retired_birth) >= seq;
}

void _ta_thread_retire_births(ta_thread *t) {
  uint64_t head = atomic_load(&t->ring_head);
  if (head == 0) return;
  uint64_t seq = atomic_load(&t->ring[(head - 1) % TA_RING].seq);
  uint64_t cur = atomic_load(&last_retired_birth);
  while (seq > cur && !atomic_compare_exchange_weak(&last_retired_birth, &cur, seq)) {}
}

ta_counts ta_since(ta_mark m, ta_tag tag) {
  _ta_ensure();
  ta_counts c = { 0 };
  uint32_t ntags = atomic_load(&_ta_tag_count);
  if (tag >= ntags) return c;
  ta_tag_counts_plain now[TA_MAX_TAGS];
  _ta_thread_sum(now, ntags);
  uint64_t seq = 0;
  uint64_t peak = _ta_peak_now(tag);
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = m ? mark_get(m) : NULL;
  if (m && r == NULL) {
    pthread_mutex_unlock(&mark_lock);
    _ta_error(TA_EINVAL, "ta_since: %lu is not a mark (or it was freed)", (unsigned long)m);
    return c;
  }
  if (m == 0) {
    peak = _ta_peak_run();
    if (tag) {     /* no whole-run peak per tag: the intervals since the first mark */
      if (dropped_peak[tag] > peak) peak = dropped_peak[tag];
      for (size_t i = 0; i < nmarks; i++)
        if (marks[i].peak_after && tag < marks[i].ntags && marks[i].peak_after[tag] > peak)
          peak = marks[i].peak_after[tag];
    }
  } else {
    seq = r->seq;
    if (tag < r->ntags) {
      c.allocs = now[tag].allocs - r->counts[tag].allocs;
      c.frees = now[tag].frees - r->counts[tag].frees;
    } else {
      c.allocs = now[tag].allocs;
      c.frees = now[tag].frees;
    }
    for (size_t i = (size_t)(r - marks); i + 1 < nmarks; i++)
      if (marks[i].peak_after && tag < marks[i].ntags && marks[i].peak_after[tag] > peak)
        peak = marks[i].peak_after[tag];
  }
  pthread_mutex_unlock(&mark_lock);
  if (m == 0) {
    c.allocs = now[tag].allocs;
    c.frees = now[tag].frees;
  }
  since_walk w = { 0 };
  live_since(seq, tag, &w);
  _ta_device_since(seq, tag, &w.blocks, &w.bytes, NULL, NULL);   /* device blocks count too */
  c.live_blocks = w.blocks;
  c.live_bytes = w.bytes;
  c.peak_bytes = peak;
  return c;
}

void ta_mark_free(ta_mark m) {
  if (m == 0) return;
  _ta_ensure();
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = mark_get(m);
  if (r == NULL) {
    pthread_mutex_unlock(&mark_lock);
    _ta_error(TA_EINVAL, "ta_mark_free: %lu is not a mark (or it was freed)", (unsigned long)m);
    return;
  }
  r->freed = true;
  _ta_meta_free(r->counts);
  r->counts = NULL;
  marks_compact();
  pthread_mutex_unlock(&mark_lock);
}

size_t _ta_marks_kept(void) {
  pthread_mutex_lock(&mark_lock);
  size_t n = nmarks;
  pthread_mutex_unlock(&mark_lock);
  return n;
}

void ta_live_since(ta_mark m, ta_tag tag,
                   void (*fn)(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg),
                   void *arg) {
  _ta_ensure();
  uint64_t seq = 0;
  pthread_mutex_lock(&mark_lock);
  mark_rec *r = mark_get(m);
  if (r) seq = r->seq;
  pthread_mutex_unlock(&mark_lock);
  since_walk w = { .fn = fn, .arg = arg };
  live_since(seq, tag, &w);
  _ta_device_since(seq, tag, &w.blocks, &w.bytes, fn, arg);
}

static ta_stack_writer_fn *stack_writer;
void ta_stack_writer_set(ta_stack_writer_fn *fn) { stack_writer = fn; }

typedef struct { size_t max, n; } print_state;

static void print_one(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  print_state *ps = arg;
  if (ps->n++ >= ps->max) return;
  char line[256];
  int len = _ta_snprintf(line, sizeof line, "  live: %zu bytes at %p [tag %s] allocated from:\n",
                         size, p, ta_tag_name(tag));
  _ta_write_all(2, line, (size_t)len);
  if (stack_writer && stack) {   /* symbolized, as the exit report writes them */
    stack_writer(2, stack, 0);
    return;
  }
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(stack, pcs, TA_MAX_DEPTH);
  for (size_t i = 0; i < n; i++) {
    len = _ta_snprintf(line, sizeof line, "    #%zu 0x%lx\n", i, (unsigned long)pcs[i]);
    _ta_write_all(2, line, (size_t)len);
  }
}

size_t ta_print_live_since(ta_mark m, ta_tag tag, size_t max_blocks) {
  print_state ps = { max_blocks, 0 };
  ta_live_since(m, tag, print_one, &ps);
  return ps.n;
}

void ta__assert_fail(const char *file, int line, const char *what, uint64_t got, uint64_t want,
                     ta_mark m, ta_tag tag) {
  char buf[512];
  int len = _ta_snprintf(buf, sizeof buf, "%s:%d: tagalloc assertion failed: %s [tag %s]: got %lu, expected %lu\n",
                         file, line, what, ta_tag_name(tag), (unsigned long)got, (unsigned long)want);
  _ta_write_all(2, buf, (size_t)len);
  if (m) ta_print_live_since(m, tag, 16);
  abort();
}

/* ---- summary for reports ------------------------------------------------------- */

void _ta_summary_counts(ta_summary *s) {
  ta_tag_counts_plain all[1];
  _ta_thread_sum(all, 1);
  uint64_t dev_allocs, dev_frees;       /* device blocks count in the tags' rows: not here */
  _ta_device_summary(&dev_allocs, &dev_frees);
  s->allocs = all[0].allocs - dev_allocs;
  s->frees = all[0].frees - dev_frees;
  s->live_bytes = all[0].alloc_bytes - all[0].free_bytes;
  s->peak_bytes = _ta_peak_run();
}

void _ta_marks_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&mark_lock);
  else pthread_mutex_unlock(&mark_lock);
}
