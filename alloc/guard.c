/* guard.c - guard mode (TAGALLOC_GUARD=1): blocks on pages of their own, so
 * that a read or write after free, or past the end of a block, faults at
 * the instruction that does it and is reported there, with the stacks of
 * the block's allocation and free.  The program goes on (as under valgrind).
 *
 * Regions
 * -------
 * Two regions are reserved at init, PROT_NONE and MAP_NORESERVE (address
 * space only; nothing is committed until a slot is used):
 *   small  TAGALLOC_GUARD_SLOTS slots (default 65536: 512 MiB of address
 *          space) of two pages: the data page, then a guard page that stays
 *          PROT_NONE.  Blocks of up to 4096 bytes, any alignment up to 4096.
 *   big    BIG_SLOTS slots of BIG_DATA bytes of data and a guard page, for
 *          sampled blocks of 4097 bytes to 1 MiB.
 * A block sits at the END of its slot's data: its start is its end rounded
 * down to 16 (or to its alignment), so that a read or write past its end
 * reaches the guard page within 15 bytes.  Those bytes (the slack) are
 * filled with the poison byte and checked when the block is freed: an
 * overflow into the slack is reported then (heap.overflow, at the free).
 * Only the pages the block covers are read-write; in a big slot the pages
 * below the block stay PROT_NONE, so an underflow faults too.
 *
 * Which blocks (the policy)
 * -------------------------
 * - Blocks of up to 4096 bytes: every one takes a small slot, while fewer
 *   than (live cap - reserve) guarded blocks are live.  The live cap is the
 *   slot count, or less where the kernel's vm.max_map_count would be
 *   reached: each read-write page between two PROT_NONE pages is a mapping
 *   of its own, so the cap is about (max_map_count * 3/4) / 2, leaving a
 *   quarter of the mappings to the program (65530 by default: ~24000 live
 *   guarded blocks).  The last eighth of the cap (the reserve) goes to one
 *   block in N (TAGALLOC_GUARD_SAMPLE, default 100) in the manner of
 *   GWP-ASan, so that a program whose long-lived blocks took the budget
 *   still has guarded blocks later in its run.  With no slot free the block
 *   comes from jemalloc (the default mode's poison check applies to it).
 * - Blocks of 4097 bytes to 1 MiB: one in N takes a big slot; the others,
 *   and all bigger blocks or alignments over 4096, come from jemalloc.
 *
 * Lifetime of a slot
 * ------------------
 *   UNUSED -> LIVE: the pages of the block made read-write (mprotect);
 *   LIVE -> FREED (block_free): the pages made PROT_NONE (big slots also
 *       give their memory back); the record goes into the freeing thread's
 *       quarantine like any freed block, so a double free still finds it;
 *   FREED -> FREE (the record left the quarantine): the slot joins the free
 *       list, oldest first, still PROT_NONE; made read-write only when it is
 *       reused.  Slots never used are taken before freed ones.
 * In the quarantine a guarded block counts max(its pages, budget / (slots
 * / 2)) bytes, so at most half the slots wait there and the rest recycle.
 *
 * Faults
 * ------
 * The handler (SIGSEGV and SIGBUS, SA_SIGINFO | SA_ONSTACK; a per-thread
 * alternate signal stack is set up at a thread's first guarded block,
 * unless the thread has one) asks _ta_guard_fault: a fault address in a
 * region is ours:
 *   in the data of a FREED or FREE slot        -> use.after-free
 *   in the guard page past a LIVE block, or in
 *   the PROT_NONE pages below a LIVE big block -> heap.overflow (a finding
 *                                                 kind of guard mode)
 *   in the guard page past a freed block       -> use.after-free
 * A guard page is blamed on the nearer block: the one of its slot (past
 * its end) or the one of the next slot (before its start).  The finding's
 * stack is the faulting instruction's (libunwind from the signal context;
 * frame 0 is stored as pc + 1, since stacks hold return addresses and are
 * symbolized at pc - 1), with the alloc and free stacks of the block.  Then
 * the faulting page is made read-write and filled with the poison byte, and
 * the handler returns: the instruction runs again and the program goes on.
 * A fault elsewhere goes to the handler installed before ours, or to the
 * default action.
 *
 * Default mode pays one predictable branch on _ta_guard_on per allocation
 * and free, and nothing else. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#define TA_TLS __thread __attribute__((tls_model("initial-exec")))

#define PAGE       4096ul
#define BIG_DATA   (1ul << 20)
#define BIG_SLOTS  256u
#define ALT_SIZE   (128ul << 10)        /* alternate signal stack per thread */

bool _ta_guard_on;

enum { G_UNUSED = 0, G_LIVE, G_FREED, G_FREE };

typedef struct {
  _Atomic uint8_t  state;
  _Atomic uint8_t  opened;     /* a fault made pages of the slot read-write */
  uint16_t         tag;        /* of the last freed block (for a FREE slot) */
  uint32_t         alloc_stack, free_stack;
  _Atomic uintptr_t addr;      /* the block; 0: the slot was never used */
  uint64_t         size;
  uintptr_t        rw;         /* first page made read-write for the block */
} g_meta;

typedef struct {
  uintptr_t base, end;         /* [base, end): nslots slots of stride bytes */
  size_t    data, stride;      /* data bytes per slot; stride = data + a guard page */
  uint32_t  nslots;
  g_meta   *meta;
  _Atomic int lock;            /* fresh and the free list */
  uint32_t  fresh;             /* slots [fresh, nslots) were never used */
  uint32_t *fifo;              /* freed slots, oldest first */
  uint32_t  head, len;
  _Atomic int64_t live;
  _Atomic int64_t live_cap;    /* lowered when mprotect runs out of mappings */
  int64_t   reserve;
  uint64_t  charge;            /* quarantine bytes per block, at least */
} g_pool;

static g_pool small, big;
static struct sigaction old_segv, old_bus;
static pthread_key_t alt_key;
static TA_TLS uint32_t tick;          /* sampling: blocks seen since the last one guarded */
static TA_TLS bool alt_done;
static atomic_int warned_maps;

/* ---- pools ---------------------------------------------------------------- */

static inline void spin_lock(_Atomic int *l) {
  int spins = 0;
  while (atomic_exchange_explicit(l, 1, memory_order_acquire)) {
    while (atomic_load_explicit(l, memory_order_relaxed)) {
      if (++spins > 64) { sched_yield(); spins = 0; }
      else __builtin_ia32_pause();
    }
  }
}

static inline void spin_unlock(_Atomic int *l) { atomic_store_explicit(l, 0, memory_order_release); }

static inline g_pool *pool_of(uintptr_t a) {
  if (a - small.base < small.end - small.base) return &small;
  if (a - big.base < big.end - big.base) return &big;
  return NULL;
}

static inline uint32_t slot_of(const g_pool *pl, uintptr_t a) { return (uint32_t)((a - pl->base) / pl->stride); }
static inline uintptr_t slot_lo(const g_pool *pl, uint32_t k) { return pl->base + (uintptr_t)k * pl->stride; }

static void *map_none(size_t n) {
  void *p = _ta_sys_mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void *map_rw(size_t n) {
  void *p = _ta_sys_mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static bool pool_init(g_pool *pl, size_t data, uint32_t nslots) {
  pl->data = data;
  pl->stride = data + PAGE;
  /* One anon_vma for the whole region: mapped read-write and touched while
   * it is one mapping, then made PROT_NONE.  The mappings mprotect splits
   * off later share it, so a page made PROT_NONE again merges back into its
   * neighbours; otherwise each slot ever written stays a mapping of its own
   * and vm.max_map_count is reached after ~65000 blocks. */
  void *r = map_rw((size_t)nslots * pl->stride);
  if (r) {
    *(volatile char *)r = 0;
    mprotect(r, (size_t)nslots * pl->stride, PROT_NONE);
    madvise(r, PAGE, MADV_DONTNEED);
  } else {
    r = map_none((size_t)nslots * pl->stride);
  }
  pl->meta = map_rw((size_t)nslots * sizeof *pl->meta);
  pl->fifo = map_rw((size_t)nslots * sizeof *pl->fifo);
  if (r == NULL || pl->meta == NULL || pl->fifo == NULL) {
    if (r) _ta_sys_munmap(r, (size_t)nslots * pl->stride);
    if (pl->meta) _ta_sys_munmap(pl->meta, (size_t)nslots * sizeof *pl->meta);
    if (pl->fifo) _ta_sys_munmap(pl->fifo, (size_t)nslots * sizeof *pl->fifo);
    memset(pl, 0, sizeof *pl);
    return false;
  }
  pl->base = (uintptr_t)r;
  pl->end = pl->base + (size_t)nslots * pl->stride;
  pl->nslots = nslots;
  pl->live_cap = nslots;
  /* At most half the slots wait in the quarantine (the budget is shared by
   * the threads, so this holds for all of them together). */
  uint64_t per = (uint64_t)_ta_opt.quarantine / (nslots / 2 ? nslots / 2 : 1);
  pl->charge = per > PAGE ? per : PAGE;
  return true;
}

static void fifo_push(g_pool *pl, uint32_t k) {
  spin_lock(&pl->lock);
  uint32_t tail = pl->head + pl->len;
  if (tail >= pl->nslots) tail -= pl->nslots;
  pl->fifo[tail] = k;
  pl->len++;
  spin_unlock(&pl->lock);
}

/* A slot to use: one never used, else the one freed longest ago. */
static bool slot_take(g_pool *pl, uint32_t *k) {
  bool ok = true;
  spin_lock(&pl->lock);
  if (pl->fresh < pl->nslots) {
    *k = pl->fresh++;
  } else if (pl->len > 0) {
    *k = pl->fifo[pl->head];
    if (++pl->head == pl->nslots) pl->head = 0;
    pl->len--;
  } else {
    ok = false;
  }
  spin_unlock(&pl->lock);
  return ok;
}

static inline bool sample_hit(void) {
  if (++tick >= (uint32_t)_ta_opt.guard_sample) {
    tick = 0;
    return true;
  }
  return false;
}

/* ---- the alternate signal stack --------------------------------------------- */

static void alt_free(void *m) {
  stack_t cur;
  if (sigaltstack(NULL, &cur) == 0 && cur.ss_sp == (char *)m + PAGE && !(cur.ss_flags & SS_ONSTACK)) {
    stack_t off = { .ss_flags = SS_DISABLE };
    sigaltstack(&off, NULL);
  }
  _ta_sys_munmap(m, ALT_SIZE + PAGE);
}

/* The calling thread gets an alternate signal stack (below it a guard
 * page), unless it has one; released when the thread exits. */
static void alt_ensure(void) {
  alt_done = true;
  stack_t cur;
  if (sigaltstack(NULL, &cur) != 0 || !(cur.ss_flags & SS_DISABLE)) return;
  char *m = map_rw(ALT_SIZE + PAGE);
  if (m == NULL) return;
  mprotect(m, PAGE, PROT_NONE);
  stack_t ss = { .ss_sp = m + PAGE, .ss_size = ALT_SIZE, .ss_flags = 0 };
  if (sigaltstack(&ss, NULL) != 0 || pthread_setspecific(alt_key, m) != 0) {
    stack_t off = { .ss_flags = SS_DISABLE };
    sigaltstack(&off, NULL);
    _ta_sys_munmap(m, ALT_SIZE + PAGE);
  }
}

/* ---- allocation, free, release ----------------------------------------------- */

static void *pool_alloc(g_pool *pl, size_t size, size_t align, bool zero) {
  uint32_t k;
  if (!slot_take(pl, &k)) return NULL;
  g_meta *m = &pl->meta[k];
  uintptr_t lo = slot_lo(pl, k), end = lo + pl->data;
  size_t sz = size ? size : 1;
  size_t pages = (sz + PAGE - 1) & ~(PAGE - 1);
  uintptr_t rw = end - pages;
  if (atomic_load_explicit(&m->opened, memory_order_relaxed)) {   /* a fault opened pages of it */
    mprotect((void *)lo, pl->stride, PROT_NONE);
    atomic_store_explicit(&m->opened, 0, memory_order_relaxed);
  }
  if (mprotect((void *)rw, pages, PROT_READ | PROT_WRITE) != 0) {
    /* Out of mappings (vm.max_map_count): no more live blocks than now. */
    fifo_push(pl, k);
    int64_t cap = atomic_load(&pl->live);
    atomic_store(&pl->live_cap, cap);
    if (!atomic_exchange(&warned_maps, 1))
      _ta_error(TA_ENOMEM, "guard mode: mprotect failed (%s); at most %ld guarded blocks from now on",
                strerror(errno), (long)cap);
    return NULL;
  }
  size_t a = align > 16 ? align : 16;
  uintptr_t p = (end - sz) & ~(uintptr_t)(a - 1);
  if (zero) memset((void *)p, 0, size);              /* a reused page holds the last block's bytes */
  memset((void *)(p + size), (int)_ta_opt.poison, end - (p + size));   /* the slack */
  m->size = size;
  m->rw = rw;
  atomic_store_explicit(&m->addr, p, memory_order_relaxed);
  atomic_store_explicit(&m->state, G_LIVE, memory_order_release);
  atomic_fetch_add_explicit(&pl->live, 1, memory_order_relaxed);
  return (void *)p;
}

void *_ta_guard_alloc(size_t size, size_t align, bool zero) {
  if (align > PAGE) return NULL;
  g_pool *pl;
  if (size <= PAGE) {
    pl = &small;
    int64_t live = atomic_load_explicit(&pl->live, memory_order_relaxed);
    int64_t cap = atomic_load_explicit(&pl->live_cap, memory_order_relaxed);
    if (live >= cap) return NULL;
    if (live >= cap - pl->reserve && !sample_hit()) return NULL;
  } else {
    pl = &big;
    if (size > pl->data || !sample_hit()) return NULL;
    if (atomic_load_explicit(&pl->live, memory_order_relaxed) >= atomic_load(&pl->live_cap)) return NULL;
  }
  if (TA_UNLIKELY(!alt_done)) alt_ensure();
  return pool_alloc(pl, size, align, zero);
}

bool _ta_guard_owns(uintptr_t a) { return pool_of(a) != NULL; }

uint64_t _ta_guard_charge(uintptr_t a, uint64_t size) {
  g_pool *pl = pool_of(a);
  if (pl == NULL) return size;
  uint64_t pages = ((size ? size : 1) + PAGE - 1) & ~(PAGE - 1);
  return pages > pl->charge ? pages : pl->charge;
}

/* Where the slack between a block's end and its guard page was written
 * (no longer poison): the count of bytes, the first and last offsets past
 * the end, the first value.  False when it is intact. */
typedef struct { size_t first, last, count; unsigned char value; } slack_damage;

static bool slack_written(uintptr_t addr, uint64_t size, uintptr_t end, slack_damage *d) {
  const unsigned char *s = (const unsigned char *)(addr + size);
  size_t n = end - (addr + size);
  unsigned char poison = (unsigned char)_ta_opt.poison;
  d->count = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == poison) continue;
    if (d->count++ == 0) d->first = i, d->value = s[i];
    d->last = i;
  }
  return d->count > 0;
}

bool _ta_guard_slack_written(uintptr_t addr, uint64_t size) {
  g_pool *pl = pool_of(addr);
  if (pl == NULL) return false;
  slack_damage d;
  return slack_written(addr, size, slot_lo(pl, slot_of(pl, addr)) + pl->data, &d);
}

/* heap.overflow found at b's free: the slack between its end and its
 * guard page was written, by a write the guard page could not stop.  The
 * free is where it was found (stack and free stack both, as the pad's
 * report says it). */
static void check_slack(const ta_block *b, uintptr_t end) {
  slack_damage d;
  if (!slack_written(b->addr, b->size, end, &d)) return;
  char detail[96];
  _ta_snprintf(detail, sizeof detail,
               "wrote %zu byte(s) past the end of the %zu-byte block: offsets %zu..%zu, first 0x%02x",
               d.count, (size_t)b->size, (size_t)b->size + d.first, (size_t)b->size + d.last, d.value);
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_HEAP_OVERFLOW), .bytes = b->size, .tag = b->tag,
                      .stack = b->free_stack, .free_stack = b->free_stack, .alloc_stack = b->stack,
                      .addr = b->addr, .detail = detail };
  _ta_finding_error(&e);
}

static void unmap_block(const g_pool *pl, const g_meta *m, uintptr_t end) {
  if (pl == &big) madvise((void *)m->rw, end - m->rw, MADV_DONTNEED);   /* give the memory back */
  mprotect((void *)m->rw, end - m->rw, PROT_NONE);
}

bool _ta_guard_retire(const ta_block *b) {
  g_pool *pl = pool_of(b->addr);
  if (pl == NULL) return false;
  g_meta *m = &pl->meta[slot_of(pl, b->addr)];
  uintptr_t end = slot_lo(pl, slot_of(pl, b->addr)) + pl->data;
  check_slack(b, end);
  m->tag = (uint16_t)b->tag;
  m->alloc_stack = b->stack;
  m->free_stack = b->free_stack;
  atomic_store_explicit(&m->state, G_FREED, memory_order_release);
  unmap_block(pl, m, end);
  atomic_fetch_sub_explicit(&pl->live, 1, memory_order_relaxed);
  return true;
}

bool _ta_guard_release(uintptr_t a) {
  g_pool *pl = pool_of(a);
  if (pl == NULL) return false;
  uint32_t k = slot_of(pl, a);
  g_meta *m = &pl->meta[k];
  if (atomic_load_explicit(&m->state, memory_order_relaxed) == G_LIVE) {   /* never retired */
    unmap_block(pl, m, slot_lo(pl, k) + pl->data);
    atomic_fetch_sub_explicit(&pl->live, 1, memory_order_relaxed);
  }
  atomic_store_explicit(&m->state, G_FREE, memory_order_release);
  fifo_push(pl, k);
  return true;
}

/* ---- faults ------------------------------------------------------------------- */

/* The stack of the faulting instruction, from the signal context. */
static uint32_t fault_stack(ucontext_t *uc) {
  if (!_ta_opt.record || _ta_opt.unwind == TA_UNWIND_NONE || uc == NULL) return 0;
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = 0, max = (size_t)_ta_opt.depth;
  unw_cursor_t c;
  if (unw_init_local2(&c, (unw_context_t *)uc, UNW_INIT_SIGNAL_FRAME) == 0) {
    do {
      unw_word_t ip;
      if (unw_get_reg(&c, UNW_REG_IP, &ip) < 0 || ip == 0) break;
      pcs[n] = n == 0 ? (uintptr_t)ip + 1 : (uintptr_t)ip;   /* frame 0: the instruction itself */
      n++;
    } while (n < max && unw_step(&c) > 0);
  }
#if defined(__x86_64__)
  if (n == 0) pcs[n++] = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP] + 1;
#endif
  return n ? _ta_depot_put(pcs, n) : 0;
}

static const char *access_of(const ucontext_t *uc) {
#if defined(__x86_64__)
  if (uc) return (uc->uc_mcontext.gregs[REG_ERR] & 2) ? "write" : "read";   /* page fault error code */
#else
  (void)uc;
#endif
  return "access";
}

bool _ta_guard_fault(void *addr, struct ucontext_t *uc) {
  if (!_ta_guard_on) return false;
  uintptr_t f = (uintptr_t)addr;
  g_pool *pl = pool_of(f);
  if (pl == NULL) return false;
  uint32_t k = slot_of(pl, f);
  uintptr_t lo = slot_lo(pl, k), end = lo + pl->data;
  g_meta *m = &pl->meta[k], *v = NULL;         /* v: the block the access is blamed on */
  if (f < end) {
    v = m;
  } else {                                       /* the guard page: past m's block, or before the next */
    g_meta *n = k + 1 < pl->nslots ? &pl->meta[k + 1] : NULL;
    uintptr_t ma = atomic_load(&m->addr), na = n ? atomic_load(&n->addr) : 0;
    if (ma && (!na || f - (ma + m->size) <= na - f)) v = m;
    else if (na) v = n;
  }
  uintptr_t ba = v ? atomic_load(&v->addr) : 0;
  if (ba == 0) return false;                     /* no block was ever there: not ours to judge */
  int st = atomic_load_explicit(&v->state, memory_order_acquire);
  uint64_t bs = v->size;
  if (st == G_LIVE && f >= ba && f < ba + (bs ? bs : 1)) return false;   /* a live block is read-write */

  ta_thread *t = _ta_self;
  if (t) t->guard++;
  const char *how = access_of(uc);
  char where[64];
  if (f < ba) _ta_snprintf(where, sizeof where, "%zu byte(s) before the start", (size_t)(ba - f));
  else if (f >= ba + bs) _ta_snprintf(where, sizeof where, "%zu byte(s) past the end", (size_t)(f - ba - bs));
  else _ta_snprintf(where, sizeof where, "at offset %zu", (size_t)(f - ba));
  char detail[96];
  ta_error_info e = { .bytes = bs, .stack = fault_stack(uc), .addr = ba, .detail = detail };
  if (st == G_LIVE) {
    ta_block b;
    e.kind = ta_kind_name(TA_KIND_HEAP_OVERFLOW);
    if (_ta_block_get(ba, &b) && b.state == TA_LIVE) {
      e.tag = b.tag;
      e.alloc_stack = b.stack;
    }
    _ta_snprintf(detail, sizeof detail, "a %s %s of the live %zu-byte block (guard page)",
                 how, where, (size_t)bs);
  } else {
    e.kind = ta_kind_name(TA_KIND_USE_AFTER_FREE);
    e.tag = v->tag;
    e.alloc_stack = v->alloc_stack;
    e.free_stack = v->free_stack;
    _ta_snprintf(detail, sizeof detail, "a %s %s of the freed %zu-byte block (guard page)",
                 how, where, (size_t)bs);
  }
  _ta_finding_error(&e);
  if (t) t->guard--;
  /* The page becomes accessible, full of poison, and the access is retried. */
  uintptr_t page = f & ~(PAGE - 1);
  if (mprotect((void *)page, PAGE, PROT_READ | PROT_WRITE) != 0) return false;
  memset((void *)page, (int)_ta_opt.poison, PAGE);
  atomic_store_explicit(&m->opened, 1, memory_order_relaxed);
  return true;
}

/* Faults that are not ours go to the handler installed before ours, or to
 * the default action: a fault happens again when the handler returns, a
 * signal that was sent is sent again. */
static void on_fault(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  bool ours = si && si->si_code > 0 && _ta_guard_fault(si->si_addr, uc);
  errno = saved;
  if (ours) return;
  const struct sigaction *old = sig == SIGBUS ? &old_bus : &old_segv;
  if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
    old->sa_sigaction(sig, si, uc);
    return;
  }
  if (!(old->sa_flags & SA_SIGINFO) && old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
    return;
  }
  bool sent = si == NULL || si->si_code <= 0;
  if (sent && old->sa_handler == SIG_IGN) return;
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  if (sent) raise(sig);
  errno = saved;
}

/* ---- init and fork -------------------------------------------------------------- */

static void fork_prepare(void) { spin_lock(&small.lock); spin_lock(&big.lock); }
static void fork_after(void) { spin_unlock(&big.lock); spin_unlock(&small.lock); }

static long max_map_count(void) {
  char buf[32];
  long v = 65530;
  int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return v;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n > 0) {
    long x = 0;
    for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) x = x * 10 + (buf[i] - '0');
    if (x > 0) v = x;
  }
  return v;
}

void _ta_guard_init(void) {
  if (!_ta_opt.guard || _ta_guard_on) return;
  if (!pool_init(&small, PAGE, (uint32_t)_ta_opt.guard_slots)) {
    _ta_error(TA_ENOMEM, "guard mode: cannot reserve %ld guarded slots; guard mode is off",
              _ta_opt.guard_slots);
    return;
  }
  if (!pool_init(&big, BIG_DATA, BIG_SLOTS))
    _ta_error(TA_ENOMEM, "guard mode: cannot reserve the region of big blocks; only small blocks are guarded");
  /* Each read-write page between PROT_NONE pages is a mapping: leave a
   * quarter of vm.max_map_count, and the big slots' share, to the program. */
  long maps = max_map_count();
  long avail = (maps - maps / 4 - 2 * (long)big.nslots - 256) / 2;
  if (avail < 16) avail = 16;
  if (small.live_cap > avail) small.live_cap = avail;
  small.reserve = atomic_load(&small.live_cap) / 8;
  pthread_key_create(&alt_key, alt_free);
  pthread_atfork(fork_prepare, fork_after, fork_after);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  _ta_guard_on = true;
}
