/* quarantine.c - the quarantine: each thread's ring of the blocks it freed,
 * their poison checked when they leave it; the records of recent frees
 * outside it; the search of both for a bad free or check; the checks at
 * exit.  The free path (ledger.c, block_free) decides which frees come
 * here and with what budget, and fills the poison. */
#include "beside.h"
#include "block.h"

#include <emmintrin.h>
#include <immintrin.h>
#include <string.h>

/* Reports a write into a quarantined block: byte `at` holds `value`. */
static void report_write_after_free(const ta_block *b, int64_t at, unsigned char value) {
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "byte %zu of the freed %zu-byte block was written (0x%x, poison 0x%x)",
               (size_t)at, (size_t)b->size, value, (unsigned)_ta_opt.poison);
  /* The write itself was not seen (stack 0): the report says so, and
   * shows the free and the allocation under their own labels. */
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_USE_AFTER_FREE), .bytes = b->size, .tag = b->tag,
                      .stack = 0, .alloc_stack = b->stack,
                      .free_stack = b->free_stack, .addr = b->addr, .detail = detail };
  _ta_finding_error(&e);
}

typedef struct { ta_block b; int64_t at; unsigned char value; } evicted_block;

/* Whether all n bytes at p (n >= 32) are poison, 32 at a time with AVX2:
 * an XOR with the poison OR-ed into one register, one test at the end (a
 * byte that differs is rare; the caller then looks for it).  On churn in
 * full mode the SSE2 loop below, which tests every 64 bytes, took 117
 * instructions a freed block, a twentieth of a malloc-free pair's. */
__attribute__((target("avx2"))) static bool all_poison_avx2(const unsigned char *p, uint64_t n, unsigned char poison) {
  const __m256i pv = _mm256_set1_epi8((char)poison);
  __m256i d = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64)
    d = _mm256_or_si256(d, _mm256_or_si256(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + i)), pv),
                                           _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + i + 32)), pv)));
  if (i + 32 <= n) {
    d = _mm256_or_si256(d, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + i)), pv));
    i += 32;
  }
  if (i < n) d = _mm256_or_si256(d, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + n - 32)), pv));
  return _mm256_testz_si256(d, d);
}

/* Whether the CPU has AVX2: set with the first ring (_ta_quarantine_ring),
 * before any block is checked; never where a test asked for SSE2. */
static bool q_avx2, q_avx2_off;

void _ta_quarantine_no_avx2(void) { q_avx2_off = true; }

/* Offset of the first byte of b's poisoned span that is not poison, or
 * -1.  With AVX2, spans of 32 bytes or more go through all_poison_avx2.  Every block that leaves the quarantine is checked, so this goes 64
 * bytes at a time with SSE2 (four loads, one branch), then 16 at a time
 * with one overlapping load for the last bytes (blocks are 16-byte
 * aligned), or under 16 bytes two overlapping words; the exact byte is
 * looked for only once something differs.  (The rest of the span went a
 * word, then a byte at a time: most of the ~120 instructions a check took
 * on small blocks.) */
static int64_t poison_changed(const ta_block *b, unsigned char *value) {
  if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_owns(b->addr)) return -1;   /* PROT_NONE, not poisoned */
  const unsigned char *p = (const unsigned char *)b->addr;
  unsigned char poison = (unsigned char)_ta_opt.poison;
  uint64_t size = poison_span(b->size), i = 0;
  if (size >= 32 && TA_LIKELY(q_avx2)) {
    if (TA_LIKELY(all_poison_avx2(p, size, poison))) return -1;
  } else if (size >= 16) {
    const __m128i pv = _mm_set1_epi8((char)poison);
    for (; i + 64 <= size; i += 64) {
      const __m128i *v = (const __m128i *)(p + i);
      __m128i d = _mm_or_si128(_mm_or_si128(_mm_xor_si128(_mm_load_si128(v), pv),
                                            _mm_xor_si128(_mm_load_si128(v + 1), pv)),
                               _mm_or_si128(_mm_xor_si128(_mm_load_si128(v + 2), pv),
                                            _mm_xor_si128(_mm_load_si128(v + 3), pv)));
      if (_mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) != 0xFFFF) goto exact;
    }
    __m128i d = _mm_setzero_si128();
    uint64_t tail = i;                             /* what is left: under 64 bytes */
    for (; i + 16 <= size; i += 16) d = _mm_or_si128(d, _mm_xor_si128(_mm_load_si128((const __m128i *)(p + i)), pv));
    if (i < size) d = _mm_or_si128(d, _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + size - 16)), pv));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) == 0xFFFF) return -1;
    i = tail;
  } else if (size >= 8) {
    uint64_t word = 0x0101010101010101ull * poison, x, y;
    memcpy(&x, p, 8);
    memcpy(&y, p + size - 8, 8);
    if (x == word && y == word) return -1;
  } else {
    for (uint64_t k = 0; k < size; k++)
      if (p[k] != poison) goto exact;
    return -1;
  }
exact:
  for (; i < size; i++)
    if (p[i] != poison) { *value = p[i]; return (int64_t)i; }
  return -1;
}

/* The quarantine.  Each thread keeps the records of the blocks it freed in
 * a FIFO ring of its own: no lock to push, read in order (so the blocks
 * that leave next are prefetched well ahead), and out of the live table, so
 * the table holds live blocks only and stays small and warm.  While the
 * thread's quarantine holds more than its share of the budget (the budget
 * over the threads alive), the thread takes its own oldest blocks out:
 * checks their poison and gives them back to jemalloc.  A block bigger than
 * an eighth of the budget now (128 KiB to 8 MiB) skips the quarantine: it
 * would push out much of the rest at once, and filling it with poison costs
 * a write of every page (a freed 1 GiB buffer took a second).
 * A free, hold or check of an address the live table does not know looks
 * through every thread's ring (slow, and only on such error paths).  A
 * thread's ring is drained when the thread exits; at the process's exit,
 * _ta_quarantine_check_all checks the exiting thread's (the other threads
 * may still be running).
 *
 * The ring is one mmap'd array that never moves, so other threads may read
 * it while its owner writes; they verify what they read. */

/* Evictions go in batches of up to Q_BATCH blocks: the first lines of
 * a block freed a megabyte of frees earlier, and its pad, are cache misses
 * (on churn under --check=full the poison check's first load and the pad's
 * had a fifth of all samples, one block at a time, though each was
 * prefetched 16 evictions ahead).  A batch copies its entries out of the
 * ring, loads a byte at each end of every block in one short loop, whose
 * misses the CPU keeps in flight together, checks them, and only then
 * gives them back to jemalloc and reports.
 * A thread over its share evicts down to 1/32 under it, so a batch is
 * full where blocks are small.  The entries of the next batch are
 * prefetched (its first lines and pads) as this one ends. */
#define Q_BATCH 8

static inline void q_prefetch(const ta_thread *t) {
  for (uint32_t k = 0; k < Q_BATCH && k < t->qlen; k++) {
    const ta_block *e = &t->q[(t->qhead + k) & (t->qcap - 1)];
    const char *p = (const char *)e->addr;
    __builtin_prefetch(p);
    __builtin_prefetch(p + e->size);          /* the pad past the end */
    __builtin_prefetch(p + e->size + TA_PAD_MAX - 1);
  }
}

typedef struct { int64_t at; unsigned char value; bool over; pad_damage d; } q_verdict;

static inline void q_check_one(const ta_block *b, q_verdict *v) {
  v->value = 0;
  v->at = poison_changed(b, &v->value);
  v->over = !(b->flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(b->addr) && pad_changed(b->addr, b->size, &v->d);
}

/* Takes up to Q_BATCH of t's oldest blocks out of the quarantine, while it
 * holds more than `keep` bytes (keep < 0: until it is empty or the batch
 * full); returns how many. */
uint32_t _ta_quarantine_evict_batch(ta_thread *t, int64_t keep) {
  ta_block b[Q_BATCH];
  q_verdict v[Q_BATCH];
  uint32_t n = 0;
  while (n < Q_BATCH && t->qlen > 0 && t->qbytes > keep) {
    b[n] = t->q[t->qhead];
    t->q[t->qhead].addr = 0;
    t->qhead = (t->qhead + 1) & (t->qcap - 1);
    t->qlen--;
    t->qbytes -= q_charge(b[n].addr, b[n].size);
    n++;
  }
  /* Loads, not prefetches, of each block's first and last bytes (the pad
   * is on the last byte's line but where it starts a line) come first:
   * they are not dropped as a prefetch may be, and with nothing between
   * them their misses overlap (churn, full mode: poison_changed 13% -> 5%
   * of the samples, the eviction's share of all 17% -> 14%, 3 runs each).
   * Guard mode's blocks are PROT_NONE: not touched. */
  uint64_t touch = 0;
  for (uint32_t k = 0; k < n; k++) {
    if (TA_UNLIKELY(_ta_guard_on) && _ta_guard_owns(b[k].addr)) continue;
    const volatile unsigned char *p = (const volatile unsigned char *)b[k].addr;
    touch += p[0] + p[b[k].size ? b[k].size - 1 : 0];
  }
  __asm__ volatile("" ::"r"(touch));
  for (uint32_t k = 0; k < n; k++) q_check_one(&b[k], &v[k]);
  for (uint32_t k = 0; k < n; k++) raw_free(t, b[k].addr, b[k].size);
  q_prefetch(t);
  for (uint32_t k = 0; k < n; k++) {
    if (v[k].at >= 0) report_write_after_free(&b[k], v[k].at, v[k].value);
    if (TA_UNLIKELY(v[k].over)) _ta_report_overflow(&b[k], &v[k].d, PAD_AT_QUARANTINE);
  }
  return n;
}

/* Takes t's oldest block out of the quarantine (a full ring that may not
 * grow). */
void _ta_quarantine_evict(ta_thread *t) {
  ta_block b = t->q[t->qhead];
  t->q[t->qhead].addr = 0;
  t->qhead = (t->qhead + 1) & (t->qcap - 1);
  t->qlen--;
  q_verdict v;
  q_check_one(&b, &v);
  t->qbytes -= q_charge(b.addr, b.size);
  raw_free(t, b.addr, b.size);
  if (v.at >= 0) report_write_after_free(&b, v.at, v.value);
  if (TA_UNLIKELY(v.over)) _ta_report_overflow(&b, &v.d, PAD_AT_QUARANTINE);
}

/* The ring: address space for enough entries for the whole budget in
 * 16-byte blocks (within [64K, 4M] entries), of which the first 4096 are
 * used; it grows in place while the blocks in it weigh less than the
 * thread's share.  (A ring cycling through 4M entries touched all 192 MiB
 * of them, whatever the budget.)  TAGALLOC_QUARANTINE_BLOCKS (16384,
 * rounded down to a power of two) caps the entries: a program that frees
 * few small blocks per step behind a large live heap (LeNet-5: ~30 tensor
 * headers a step, a 64 MiB budget) otherwise fills its quarantine for
 * eleven epochs, and its memory is not flat; capped, it is full within
 * the first. */
#define Q_FIRST 4096u

bool _ta_quarantine_ring(ta_thread *t) {
  __builtin_cpu_init();
  q_avx2 = !q_avx2_off && __builtin_cpu_supports("avx2");
  uint64_t cap = 1u << 16;
  while (cap < (uint64_t)_ta_opt.quarantine / 16 && cap < (1u << 22)) cap <<= 1;
  if (_ta_opt.quarantine_blocks > 0) {
    uint64_t most = 16;
    while (most * 2 <= (uint64_t)_ta_opt.quarantine_blocks) most <<= 1;
    if (most < cap) cap = most;
  }
  void *q = _ta_mmap(cap * sizeof(ta_block));
  if (q == NULL) return false;
  t->q = q;
  t->qmax = (uint32_t)cap;
  t->qcap = Q_FIRST < cap ? Q_FIRST : (uint32_t)cap;
  t->qhead = t->qlen = 0;
  return true;
}

/* Doubles a full ring in place: the entries that wrapped to the front
 * move to just past the old end, so every entry keeps its position from
 * the head.  Other threads reading the ring verify what they read. */
void _ta_quarantine_grow(ta_thread *t) {
  uint32_t cap = t->qcap;
  memcpy(&t->q[cap], &t->q[0], (size_t)t->qhead * sizeof(ta_block));
  atomic_thread_fence(memory_order_release);
  t->qcap = cap * 2;
}

bool _ta_quarantine_recent_ring(ta_thread *t) {   /* block.h: quarantine_recent */
  t->recent = _ta_mmap(TA_RECENT * sizeof(ta_block));
  t->rpos = 0;
  return t->recent != NULL;
}

void _ta_quarantine_forget(ta_thread *t) {
  if (t->q) _ta_munmap(t->q, (size_t)t->qmax * sizeof(ta_block));
  t->q = NULL;
  t->qcap = t->qmax = t->qhead = t->qlen = 0;
  if (t->recent) _ta_munmap(t->recent, TA_RECENT * sizeof(ta_block));
  t->recent = NULL;
  t->rpos = 0;
}

/* A thread that ends: its quarantine is evicted (checked and given back);
 * its rings stay mapped, for a lookup of a freed block (_ta_quarantine_find)
 * reads them as long as the thread is in the list of threads, and the
 * thread forgets them once it has left it (thread.c: thread_exit). */
void _ta_quarantine_drain(ta_thread *t) {
  while (t->qlen > 0) _ta_quarantine_evict_batch(t, -1);
}

typedef struct { uintptr_t p; bool interior; ta_block *out; bool found; } q_search;

/* The newest record of p in t's recent frees. */
static void recent_search(ta_thread *t, q_search *qs) {
  ta_block *r = t->recent;
  uint32_t pos = t->rpos;
  if (r == NULL) return;
  for (uint32_t k = 1; k <= TA_RECENT; k++) {
    const ta_block *e = &r[(pos - k) & (TA_RECENT - 1)];
    uintptr_t a = e->addr;
    if (a == 0) continue;
    bool hit = qs->interior ? (qs->p >= a && qs->p < a + (e->size ? e->size : 1)) : qs->p == a;
    if (!hit) continue;
    *qs->out = *e;
    if (qs->out->addr != a) continue;            /* overwritten while we read */
    qs->out->state = TA_FREED;
    qs->found = true;
    return;
  }
}

static void q_search_thread(ta_thread *t, void *arg) {
  q_search *qs = arg;
  if (!qs->found) recent_search(t, qs);
  ta_block *q = t->q;
  uint32_t cap = t->qcap, head = t->qhead, len = t->qlen;   /* the owner may be moving them */
  if (q == NULL || qs->found) return;
  for (uint32_t k = 0; k < len && k < cap; k++) {
    const ta_block *e = &q[(head + k) & (cap - 1)];
    uintptr_t a = e->addr;
    if (a == 0) continue;
    uint64_t size = e->size;
    bool hit = qs->interior ? (qs->p >= a && qs->p < a + (size ? size : 1)) : qs->p == a;
    if (!hit) continue;
    *qs->out = *e;
    if (qs->out->addr != a) continue;            /* overwritten while we read */
    qs->out->state = TA_FREED;
    qs->found = true;
    return;
  }
}

/* Is p a quarantined block (or inside one)? */
bool _ta_quarantine_find(uintptr_t p, bool interior, ta_block *out) {
  q_search qs = { p, interior, out, false };
  _ta_thread_each(q_search_thread, &qs);
  return qs.found;
}

/* ---- checks at exit ------------------------------------------------------------ */

typedef struct { evicted_block bad[16]; int n; ta_block over[16]; pad_damage d[16]; int nover; } q_check;

static void q_check_ring(const ta_thread *t, q_check *c) {
  for (uint32_t k = 0; k < t->qlen && c->n < 16; k++) {
    evicted_block *e = &c->bad[c->n];
    e->b = t->q[(t->qhead + k) & (t->qcap - 1)];
    e->at = poison_changed(&e->b, &e->value);
    if (e->at >= 0) c->n++;
    if (c->nover < 16 && !(e->b.flags & ~(TA_F_REF | TA_F_HOLD)) && pad_owned(e->b.addr) &&
        pad_changed(e->b.addr, e->b.size, &c->d[c->nover]))
      c->over[c->nover++] = e->b;
  }
}

/* At exit: the pads of the live blocks (under each shard's lock, so that no
 * block is freed while it is read); reported after, without the locks. */
static void pad_check_live(const ta_block *b, void *arg) {
  q_check *c = arg;
  /* only the blocks block_new padded (arena blocks, or any other kind a
   * flag marks, have no pad, and may not even be host memory) */
  if (c->nover >= 16 || (b->flags & ~(TA_F_REF | TA_F_HOLD | TA_F_BESIDE)) || !pad_owned(b->addr)) return;
  if (pad_changed_n(b->addr, b->size, block_pad_len(b->size, b->flags), &c->d[c->nover])) c->over[c->nover++] = *b;
}

/* Only the calling thread's ring: another thread that is still running
 * (exit() or an exec while other threads allocate) pushes, evicts and grows
 * its ring meanwhile, and reading it here read torn entries and blocks it
 * had just given back (a program that exits with its threads churning
 * crashed in 7 runs of 10).  A thread that ends checks its own ring
 * (_ta_quarantine_drain). */
void _ta_quarantine_check_all(void) {
  q_check c = { .n = 0 };
  if (_ta_self != NULL) q_check_ring(_ta_self, &c);
  for (int k = 0; k < c.n; k++) report_write_after_free(&c.bad[k].b, c.bad[k].at, c.bad[k].value);
  for (int k = 0; k < c.nover; k++) _ta_report_overflow(&c.over[k], &c.d[k], PAD_AT_EXIT);
  c.nover = 0;
  _ta_block_each(false, pad_check_live, &c);
  for (int k = 0; k < c.nover; k++) _ta_report_overflow(&c.over[k], &c.d[k], PAD_AT_EXIT);
}
