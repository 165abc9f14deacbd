/* unwind.c - backtraces of the calling thread, exact (DWARF CFI) or fast
 * (frame pointers).
 *
 * Frames and skip
 * ---------------
 * _ta_unwind(pcs, max, skip, mode) sees the stack as a list of return
 * addresses, innermost first: frame 0 is the return address into the caller
 * of _ta_unwind, frame 1 the return address into that function's caller, and
 * so on up to the outermost frame (_start, or clone3 for threads).  The first
 * `skip` frames are dropped, the next `max` are stored; the count is
 * returned.  These are the same values as unw_backtrace() returns, from the
 * frame of the caller on.
 *
 * Exact mode (x86-64): a cache of unwind rules
 * ---------------------------------------------
 * The walk keeps three registers of the frame being unwound: pc (a return
 * address), sp (the frame's rsp, which is the CFA of the frame below it) and
 * bp (rbp).  It starts from the state of _ta_unwind's caller right after the
 * call returns, which _ta_unwind reads from its own frame record (it always
 * has one: __builtin_frame_address forces it).  Each step needs the CFI rule
 * of the caller at pc - 1 (the call instruction); on x86-64 nearly every rule
 * is
 *     CFA = rsp + k  or  CFA = rbp + k;   RA = [CFA - 8];
 *     rbp = unchanged, or [CFA + off]
 * and the caller's rsp is the CFA.  Such a rule fits in 64 bits:
 *
 *     bits  0..1   CFA base: 1 = rsp, 2 = rbp, 3 = special (bits 2..3);
 *                  0 = no rule (a slot whose rule is 0 is a miss)
 *     bits  2..3   special: 0 = END (RA undefined: the outermost frame),
 *                  1 = COMPLEX (anything else: CFA expression, signal
 *                  frame, RA not at CFA-8, no CFI for the pc ...)
 *     bits  4..5   rbp: 0 = same value, 1 = saved at [CFA + rbp_off],
 *                  2 = undefined
 *     bits 16..31  rbp_off, int16
 *     bits 32..63  cfa_off, int32
 *
 * The cache is a global open-addressing table of 2^16 slots keyed by the
 * return address (the rule is the one of pc - 1), slot = bits 4 to 19 of
 * the address, linear probing over at most PROBE_MAX slots.  A slot is 16
 * bytes, one cache line touched per frame: key, flags (the low half of the
 * rule) and cfa_off (the high half, sign-extended, so that the walk adds it
 * to sp or bp with no decoding: pc -> slot -> cfa -> next pc is the
 * critical path of a walk).
 * Readers take no lock: they load the key, on a match the flags (acquire)
 * and cfa_off; flags 0 is a miss.  A miss takes the one mutex that guards
 * libdw, looks again, computes the rule with elfutils (Dwfl of the own
 * process, .eh_frame then .debug_frame), and publishes it: CAS of the key
 * into an empty slot, cfa_off, then a release store of the flags.  Keys are
 * never removed: _ta_unwind_forget stores flags 0 in the slots of an
 * unloaded range (the next use recomputes them) and marks the Dwfl stale so
 * that the module list is read again.  When no slot is free within
 * PROBE_MAX the rule is computed but not cached (correct, slow).  The table
 * is a MAP_SHARED mapping shared with forked children (see rule_cache). 
 *
 * A COMPLEX rule anywhere on the stack sends the whole walk to libunwind's
 * unw_backtrace (per-thread caching), as do a nested miss on the same thread
 * (libdw allocates; an interposed malloc may come back here), an unknown
 * stack range and a stack pointer outside the thread's stack (sigaltstack).
 *
 * Safety: every read of the walk is checked against [max(lo, own frame),
 * hi) of the calling thread's stack (from _ta_thread_stack, or
 * pthread_getattr_np once per thread when that says 0,0), the CFA must grow
 * strictly and stay 8-aligned.  The hit path never allocates and never
 * locks.  Functions that read other frames are not ASan-instrumented.
 *
 * The walk memo (_ta_unwind_id, the ledger's entry): each thread keeps its
 * recent walks with every word they read from the stack; a walk that
 * starts where a kept one did and finds all its words unchanged takes the
 * kept stack id without walking (see "the walk memo" below).  It keeps two
 * walks per set of starts, and eight in a set whose misses keep finding
 * walks it had and let go (ghosts: a wider set would have answered them),
 * so that a program that reaches malloc from one start by many routes
 * (git) is answered and one whose walks are mostly new (a tree of 2^20
 * stacks) keeps the small memo.  A walk it
 * does not answer walks until it stands where the thread's last walk
 * stood (the same return address at the same stack address), and takes
 * the rest of its frames over when every word the last walk read from
 * there on is unchanged (walk_exact).
 *
 * Fast mode walks the frame-pointer chain ([fp] = caller's fp, [fp + 8] =
 * return address), stopping when fp leaves the stack, does not grow, or is
 * not 8-aligned, or when the return address read is no code address (in the
 * null page or on the stack).  Frames of functions built without frame
 * pointers are missing from its stacks (their callers appear in their
 * place).
 */
#include "internal.h"

#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#define TA_NO_ASAN __attribute__((no_sanitize_address))
#define TA_TLS     __thread __attribute__((tls_model("initial-exec")))

static _Atomic uint32_t rules_gen;   /* bumped when rules are forgotten (the walk memo) */

/* ---- stack bounds ------------------------------------------------------- */

/* Fallback when thread.c does not know the stack: ask pthread once per
 * thread.  state: 0 not asked, 1 asking (a nested call sees 0,0), 2 known,
 * 3 failed. */
static TA_TLS uintptr_t tls_stack_lo, tls_stack_hi;
static TA_TLS int tls_stack_state;

static void own_stack_bounds(uintptr_t *lo, uintptr_t *hi)
{
  if (TA_UNLIKELY(tls_stack_state != 2)) {
    if (tls_stack_state == 0) {
      pthread_attr_t attr;
      void *addr;
      size_t size;
      tls_stack_state = 1;
      int state = 3;
      if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &addr, &size) == 0 && size != 0) {
          tls_stack_lo = (uintptr_t)addr;
          tls_stack_hi = (uintptr_t)addr + size;
          state = 2;
        }
        pthread_attr_destroy(&attr);
      }
      tls_stack_state = state;
    }
    if (tls_stack_state != 2) {
      *lo = *hi = 0;
      return;
    }
  }
  *lo = tls_stack_lo;
  *hi = tls_stack_hi;
}

static inline void stack_bounds(uintptr_t *lo, uintptr_t *hi)
{
  _ta_thread_stack(lo, hi);
  if (TA_UNLIKELY(*lo == 0 && *hi == 0))
    own_stack_bounds(lo, hi);
}

/* A word of the stack; the caller has checked [a, a + 8) is in bounds. */
static inline __attribute__((always_inline)) TA_NO_ASAN uintptr_t peek(uintptr_t a)
{
  uintptr_t v;
  memcpy(&v, (const void *)a, sizeof v);
  return v;
}

/* The words a walk read from the stack, in order, for the walk memo (see
 * _ta_unwind_id): rd is where they go.  n counts every read; past
 * LOG_READS the walk is not kept.  needbp: the exact walk used the rbp it
 * started with (code without frame pointers leaves any value in rbp, so it
 * is compared only when the walk's result depends on it; the fast walk
 * reads the caller's rbp from the stack, [fp], and logs it as any word). */
#define LOG_READS 80
#define LOG_NONE  ((size_t)-1)       /* n: the walk cannot be kept (libunwind did it) */

typedef struct { uintptr_t addr, val; } walk_read;

/* The word where a fast walk stopped, as a condition, not a value: code
 * without frame pointers leaves data in rbp, and the fast walk stops at
 * the first word that is not a frame's (a saved rbp that does not point
 * further up the stack, a return address that is on the stack or in the
 * first page).  That word is data too, most often another one at the
 * next call from the same place, where the walk would stop all the same:
 * so the memo keeps the condition (the word is still not a frame's), and
 * a different word there is a hit while it keeps the walk stopped.
 * STOP_NEXT: a saved rbp, continued iff a < word <= b and 8-aligned
 * (a: the frame's own rbp, b: the stack's top less a frame record);
 * STOP_PC: a return address, a stop iff word < 4096 or a <= word < b (the
 * thread's stack). */
enum { STOP_NONE, STOP_NEXT, STOP_PC };

typedef struct {
  uint8_t   kind;
  uintptr_t addr, a, b;
} walk_stop;

typedef struct {
  size_t     n;
  bool       needbp;
  walk_read *rd;                     /* LOG_READS of them */
  walk_stop  stop;
} walk_log;

static inline __attribute__((always_inline)) void log_read(walk_log *log, uintptr_t a, uintptr_t v)
{
  if (log) {
    if (log->n < LOG_READS)
      log->rd[log->n] = (walk_read){ a, v };
    log->n++;
  }
}

static inline bool next_continues(uintptr_t next, uintptr_t a, uintptr_t b)
{
  return next > a && next <= b && (next & (sizeof(uintptr_t) - 1)) == 0;
}

static inline bool pc_stops(uintptr_t pc, uintptr_t a, uintptr_t b)
{
  return pc < 4096 || (pc >= a && pc < b);
}

/* A thread's last exact walk, kept so that the next one can take over its
 * outer frames (see walk_exact): for each step (one turn of the walk) the
 * state it started from (pc, sp, the rbp it was given), what it did with
 * rbp, and how many of the walk's reads (rd) are its own or of the steps
 * outside it.  rd: the words the walk read that decide it (each return
 * address, and a restored rbp where a later step uses it: logged at that
 * use, as for the walk memo).
 *
 * Two of them per thread.  The last walk is stored outermost first: its
 * step o is the o-th from the outer end, rd holds the reads of the
 * outermost step first, and rd_left[o] counts the reads of steps 0..o.
 * So a walk that takes over the last one's steps from step o out keeps
 * them where they are, with their reads and counts, and writes only its
 * own steps after them: a take-over costs the new frames, not the stack's
 * depth (a recursion takes over ~20 frames for every one or two it walks;
 * copying them was 12% of the tree workload's samples).  The walk being
 * made records its own steps in the other one, innermost first (the order
 * it meets them; rd_left: the index of the step's first read), until it
 * takes over or ends, and they are then written into the last walk's
 * record in its order. */
#define STEPS_MAX (TA_MAX_DEPTH + 8)
#define PREFETCH_TAKE 4      /* rules prefetched for a walk that may take over */

enum { END_MAX, END_STOP };  /* stopped at max frames (before its last step's rule); any other end */

enum {
  ST_RBP_BASE = 1,           /* the step's CFA is rbp + k: it uses the rbp it was given */
  ST_BP_SET   = 2,           /* it restored rbp from a word, or made it undefined */
};

typedef struct {
  uint32_t  n, nrd, end, gen;        /* steps (0: none kept), reads, how it ended, rules_gen */
  bool      first_bp;                /* the walk used the rbp it started with */
  uint32_t  took;                    /* frames it took over from the last walk */
  uintptr_t sp[STEPS_MAX], pc[STEPS_MAX], bp[STEPS_MAX];
  uint8_t   flags[STEPS_MAX];
  uint16_t  rd_left[STEPS_MAX];      /* the last walk: reads of the steps up to this one
                                        from the outer end; the walk being made: the index
                                        of the step's first read */
  walk_read rd[2 * STEPS_MAX];
} walk_steps;

/* ---- libunwind fallback ------------------------------------------------- */

#define UNW_EXTRA 8     /* frames of ours libunwind may report before ra0 */
#define UNW_CAP   512   /* most frames asked of libunwind */

static pthread_once_t unw_policy_once = PTHREAD_ONCE_INIT;

static void unw_policy_init(void)
{
  unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
}

/* The stack from ra0 (the return address into _ta_unwind's caller) on. */
static TA_NOINLINE size_t unwind_libunwind(uintptr_t *pcs, size_t max, size_t skip,
                                           uintptr_t ra0)
{
  void *buf[UNW_CAP];
  size_t want = UNW_CAP;
  if (skip < UNW_CAP && max < UNW_CAP && skip + max + UNW_EXTRA < UNW_CAP)
    want = skip + max + UNW_EXTRA;

  pthread_once(&unw_policy_once, unw_policy_init);
  int got = unw_backtrace(buf, (int)want);
  if (got <= 0)
    return 0;

  size_t first = 0, ngot = (size_t)got;
  while (first < ngot && first < UNW_EXTRA && (uintptr_t)buf[first] != ra0)
    first++;
  if (first == ngot || first == UNW_EXTRA)
    return 0;                     /* libunwind did not get to the caller */

  size_t n = 0;
  for (size_t i = first + skip; i < ngot && n < max; i++)
    pcs[n++] = (uintptr_t)buf[i];
  return n;
}

/* ---- fast: frame pointers ----------------------------------------------- */

#if defined(__x86_64__) || defined(__aarch64__)
/* fp is _ta_unwind's frame record: [fp] = caller's fp, [fp + 8] = ra0.
 * Frames are read from [lo, hi) (lo: that record); the thread's stack is
 * [stack_lo, hi).  Code without frame pointers may leave in rbp any
 * address on the stack, and the word after it is then whatever the frame
 * holds there: most often another address on the stack (python3.11's
 * eval loop), which is never a return address, so the walk stops there,
 * as at a null page address. */
static inline __attribute__((always_inline)) TA_NO_ASAN
size_t walk_fast(uintptr_t *pcs, size_t max, size_t skip, uintptr_t fp, uintptr_t lo,
                 uintptr_t hi, uintptr_t stack_lo, walk_log *log)
{
  size_t n = 0, k = 0;
  uintptr_t top = hi - 2 * sizeof(uintptr_t);     /* the highest frame record */
  if (hi - lo < 2 * sizeof(uintptr_t) || !next_continues(fp, lo - 1, top))
    return 0;
  for (;;) {
    uintptr_t pc = peek(fp + sizeof(uintptr_t));
    if (pc_stops(pc, stack_lo, hi)) {
      if (log)
        log->stop = (walk_stop){ STOP_PC, fp + sizeof(uintptr_t), stack_lo, hi };
      break;
    }
    log_read(log, fp + sizeof(uintptr_t), pc);
    if (k++ >= skip) {
      pcs[n++] = pc;
      if (n == max)
        break;
    }
    uintptr_t next = peek(fp);
    if (!next_continues(next, fp, top)) {
      if (log)
        log->stop = (walk_stop){ STOP_NEXT, fp, fp, top };
      break;
    }
    log_read(log, fp, next);
    fp = next;
  }
  return n;
}
#endif

/* ---- exact: the rule cache ---------------------------------------------- */

#if defined(__x86_64__)

enum {
  CFA_RSP = 1, CFA_RBP = 2, CFA_SPECIAL = 3,
  RBP_SAME = 0, RBP_SAVED = 1, RBP_UNDEF = 2,
};
#define RULE_END     ((uint64_t)CFA_SPECIAL)
#define RULE_COMPLEX ((uint64_t)CFA_SPECIAL | (1u << 2))

static inline uint64_t rule_make(int base, int32_t cfa_off, int rbp, int16_t rbp_off)
{
  return (uint64_t)base | ((uint64_t)rbp << 4) |
         ((uint64_t)(uint16_t)rbp_off << 16) | ((uint64_t)(uint32_t)cfa_off << 32);
}
/* The low half (flags) and the high half (cfa_off) of a rule. */
static inline uint32_t rule_flags(uint64_t r)  { return (uint32_t)r; }
static inline int32_t  rule_cfa_off(uint64_t r) { return (int32_t)(uint32_t)(r >> 32); }
static inline int      flags_base(uint32_t f)    { return (int)(f & 3); }
static inline int      flags_rbp(uint32_t f)     { return (int)((f >> 4) & 3); }
static inline int16_t  flags_rbp_off(uint32_t f) { return (int16_t)(uint16_t)(f >> 16); }

#define CACHE_BITS 16
#define CACHE_SIZE ((size_t)1 << CACHE_BITS)
#define PROBE_MAX  32

/* A slot is 16 bytes: the key (0 = empty, never removed), the flags half
 * of the rule (0 = not known) and its cfa_off half.  One cache line per
 * frame: when the program's own work (a matrix product) has pushed the
 * cache out between two walks, each frame costs one miss, where three
 * parallel arrays cost three.  The writer stores cfa_off, then the flags
 * with release; readers load the flags with acquire, then cfa_off. */
typedef struct {
  _Atomic uintptr_t key;
  _Atomic uint32_t  flags;
  _Atomic int32_t   off;
} rule_slot;

typedef struct {
  rule_slot slot[CACHE_SIZE];
} rule_cache;

/* Shared with the forked children.  A rule depends only on the code at its
 * address, and a forked child has its parent's code at the same addresses:
 * so the cache lives in a MAP_SHARED mapping, and what a child learns (a
 * shell's subshells each run code their parent never ran) serves its
 * parent and its siblings.  A process whose code changes (a module loaded
 * or unloaded since the fork) first takes a private copy (cache_unshare),
 * so the shared cache only ever holds rules of code all its processes
 * have.  Until the first miss, an empty cache in .bss; exec starts anew. */
static rule_cache cache_empty;
static rule_cache *_Atomic cache = &cache_empty;
static bool cache_forked;       /* under dw_lock: a fork happened since the mapping was made */

static inline rule_cache *cache_now(void)
{
  return atomic_load_explicit(&cache, memory_order_acquire);
}

/* The slot is bits 4.. of the return address, no mixing: the hash is on
 * the critical path of the walk (pc -> slot -> cfa -> next pc), and call
 * sites are distinct addresses in modules that start at random pages.  A
 * slot per 16 bytes of code keeps the rules of nearby code together: a
 * cache line holds those of 64 bytes of code and a page those of 4 KiB,
 * where a slot per byte put every return address on a page of its own
 * (`git --version` touched 85 of the cache's 256 pages, each a page fault;
 * now 43).  Calls closer than 16 bytes probe to the next slot. */
static inline size_t rule_hash(uintptr_t ra)
{
  return (size_t)((ra >> 4) & (CACHE_SIZE - 1));
}

/* The flags of ra's rule, 0 on a miss; *off gets its cfa_off. */
static inline uint32_t cache_get(uintptr_t ra, intptr_t *off)
{
  rule_cache *c = cache_now();
  size_t h = rule_hash(ra);
  for (size_t i = 0; i < PROBE_MAX; i++) {
    size_t j = (h + i) & (CACHE_SIZE - 1);
    rule_slot *e = &c->slot[j];
    uintptr_t k = atomic_load_explicit(&e->key, memory_order_relaxed);
    if (TA_LIKELY(k == ra)) {
      uint32_t f = atomic_load_explicit(&e->flags, memory_order_acquire);
      *off = atomic_load_explicit(&e->off, memory_order_relaxed);
      return f;
    }
    if (k == 0)
      return 0;
  }
  return 0;
}

/* Under dw_lock (the only writer), readers may be running. */
static void cache_put(uintptr_t ra, uint64_t rule)
{
  rule_cache *c = cache_now();
  size_t h = rule_hash(ra);
  for (size_t i = 0; i < PROBE_MAX; i++) {
    size_t j = (h + i) & (CACHE_SIZE - 1);
    rule_slot *e = &c->slot[j];
    uintptr_t k = atomic_load_explicit(&e->key, memory_order_relaxed);
    if (k == 0) {
      uintptr_t empty = 0;
      if (atomic_compare_exchange_strong_explicit(&e->key, &empty, ra,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
        k = ra;
      else
        k = empty;
    }
    if (k == ra) {
      atomic_store_explicit(&e->off, rule_cfa_off(rule), memory_order_relaxed);
      atomic_store_explicit(&e->flags, rule_flags(rule), memory_order_release);
      return;
    }
  }
  /* full around ra: not cached */
}

/* ---- exact: rules from libdw (misses only) ------------------------------- */

static pthread_mutex_t dw_lock = PTHREAD_MUTEX_INITIALIZER;
static Dwfl *dw_fl;             /* under dw_lock */
static bool dw_broken;          /* libdw could not be set up: all COMPLEX */
static bool dw_stale;           /* a range was forgotten: report the maps again */
static TA_TLS int tls_in_miss;  /* this thread is inside compute (nesting) */

/* fork(): dw_lock is taken first and given back last, by the ledger's own
 * handlers (init.c), which are registered when the ledger starts.  Under
 * dw_lock libdw allocates, and its mallocs reach the ledger's locks, so it
 * comes before them.  (Registered on its own at the first rule miss, the
 * handler came too late for a fork while another thread was making that
 * first miss: the child was left with dw_lock held by a thread it does not
 * have, and hung at its own first miss.) */
void _ta_unwind_fork(int phase)
{
  if (phase == TA_FORK_PREPARE) {
    pthread_mutex_lock(&dw_lock);
    return;
  }
  cache_forked = true;
  pthread_mutex_unlock(&dw_lock);
}

/* A cache of this process's own, shared with the children it forks from
 * now on: the current one copied into a new MAP_SHARED mapping.  dw_lock
 * held.  The old mapping stays (threads may be reading it). */
static void cache_unshare(void)
{
  rule_cache *old = cache_now();
  if (old != &cache_empty && !cache_forked)
    return;                       /* ours alone already */
  void *p = _ta_sys_mmap(NULL, sizeof(rule_cache), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return;                       /* keep the private .bss one, or the shared one */
  _ta_own_range((uintptr_t)p, (uintptr_t)p + sizeof(rule_cache));
  if (old != &cache_empty)        /* (a new mapping is zeros: touch no page of it) */
    memcpy(p, old, sizeof(rule_cache));
  cache_forked = false;
  atomic_store_explicit(&cache, (rule_cache *)p, memory_order_release);
}

static char *dw_debuginfo_path;
static const Dwfl_Callbacks dw_callbacks = {
  .find_elf = dwfl_linux_proc_find_elf,
  .find_debuginfo = dwfl_standard_find_debuginfo,
  .debuginfo_path = &dw_debuginfo_path,
};

static bool dw_report(void)
{
  dwfl_report_begin(dw_fl);
  int rc = dwfl_linux_proc_report(dw_fl, getpid());
  return dwfl_report_end(dw_fl, NULL, NULL) == 0 && rc == 0;
}

static bool dw_setup(void)
{
  if (dw_fl)
    return true;
  if (dw_broken)
    return false;
  dw_fl = dwfl_begin(&dw_callbacks);
  if (!dw_fl || !dw_report()) {
    if (dw_fl)
      dwfl_end(dw_fl);
    dw_fl = NULL;
    dw_broken = true;
    return false;
  }
  return true;
}

/* ops is "DW_OP_call_frame_cfa [DW_OP_plus_uconst n | DW_OP_consts n DW_OP_plus]":
 * the register is saved at CFA + n.  Returns false for anything else. */
static bool ops_cfa_offset(const Dwarf_Op *ops, size_t nops, int64_t *off)
{
  if (nops == 0 || ops[0].atom != DW_OP_call_frame_cfa)
    return false;
  if (nops == 1) {
    *off = 0;
    return true;
  }
  if (nops == 2 && ops[1].atom == DW_OP_plus_uconst) {
    *off = (int64_t)ops[1].number;
    return true;
  }
  if (nops == 3 && (ops[1].atom == DW_OP_consts || ops[1].atom == DW_OP_constu) &&
      ops[2].atom == DW_OP_plus) {
    *off = (int64_t)ops[1].number;
    return true;
  }
  return false;
}

static uint64_t rule_of_frame(Dwarf_Frame *frame)
{
  bool signal = false;
  if (dwarf_frame_info(frame, NULL, NULL, &signal) != 16 || signal)
    return RULE_COMPLEX;

  /* RA: undefined ends the stack, otherwise it must be [CFA - 8] */
  Dwarf_Op mem[3], *ops = NULL;
  size_t nops = 0;
  int64_t off;
  if (dwarf_frame_register(frame, 16, mem, &ops, &nops) != 0)
    return RULE_COMPLEX;
  if (nops == 0)
    return ops ? RULE_END : RULE_COMPLEX;          /* undefined : same value */
  if (!ops_cfa_offset(ops, nops, &off) || off != -8)
    return RULE_COMPLEX;

  /* CFA = rsp + k or rbp + k */
  if (dwarf_frame_cfa(frame, &ops, &nops) != 0 || nops != 1)
    return RULE_COMPLEX;
  int reg;
  int64_t k;
  if (ops[0].atom == DW_OP_bregx) {
    reg = (int)ops[0].number;
    k = (int64_t)ops[0].number2;
  } else if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31) {
    reg = ops[0].atom - DW_OP_breg0;
    k = (int64_t)ops[0].number;
  } else {
    return RULE_COMPLEX;
  }
  int base = reg == 7 ? CFA_RSP : reg == 6 ? CFA_RBP : 0;
  if (!base || k < 8 || k > INT32_MAX)
    return RULE_COMPLEX;

  /* rbp: same value, undefined, or saved at CFA + n */
  int rbp;
  int64_t roff = 0;
  if (dwarf_frame_register(frame, 6, mem, &ops, &nops) != 0)
    return RULE_COMPLEX;
  if (nops == 0)
    rbp = ops ? RBP_UNDEF : RBP_SAME;
  else if (ops_cfa_offset(ops, nops, &roff) && roff >= INT16_MIN && roff <= INT16_MAX)
    rbp = RBP_SAVED;
  else
    return RULE_COMPLEX;
  return rule_make(base, (int32_t)k, rbp, (int16_t)roff);
}

/* The load bias of the object that holds pc, as the dynamic loader knows it
 * (lock-free, so no lock order against the loader's lock). */
static bool loader_bias(Dwarf_Addr pc, Dwarf_Addr *bias)
{
#if defined(__GLIBC_PREREQ) && __GLIBC_PREREQ(2, 35)
  struct dl_find_object dlfo;
  if (_dl_find_object((void *)(uintptr_t)pc, &dlfo) == 0 && dlfo.dlfo_link_map) {
    *bias = (Dwarf_Addr)dlfo.dlfo_link_map->l_addr;
    return true;
  }
#else
  (void)pc;
  (void)bias;
#endif
  return false;
}

/* The rule at pc from the modules libdw knows now.  False when no module
 * holds pc, or when its bias is not the loader's: /proc/self/maps can mislead
 * dwfl_linux_proc_report (e.g. a stale mapping of a reloaded library). */
static bool rule_from_dwfl(Dwarf_Addr pc, uint64_t *rule)
{
  Dwfl_Module *mod = dwfl_addrmodule(dw_fl, pc);
  if (!mod)
    return false;
  Dwarf_Addr want = 0;
  bool check = loader_bias(pc, &want);
  *rule = RULE_COMPLEX;           /* no CFI for pc: libunwind decides */
  for (int pass = 0; pass < 2; pass++) {
    Dwarf_Addr bias = 0;
    Dwarf_CFI *cfi = pass == 0 ? dwfl_module_eh_cfi(mod, &bias)
                               : dwfl_module_dwarf_cfi(mod, &bias);
    if (!cfi)
      continue;
    if (check && bias != want)
      return false;
    Dwarf_Frame *frame = NULL;
    if (dwarf_cfi_addrframe(cfi, pc - bias, &frame) == 0 && frame) {
      *rule = rule_of_frame(frame);
      free(frame);
      break;
    }
  }
  return true;
}

/* The rule of return address ra, from libdw; dw_lock held. */
static uint64_t rule_compute(uintptr_t ra)
{
  if (!dw_setup())
    return RULE_COMPLEX;
  bool reported = false;
  if (dw_stale) {                 /* a module was unloaded since */
    dw_stale = false;
    reported = true;
    cache_unshare();
    if (!dw_report())
      return RULE_COMPLEX;
  }
  uint64_t rule;
  if (rule_from_dwfl((Dwarf_Addr)ra - 1, &rule))
    return rule;
  /* dlopen'd since the last report?  Read the maps once more (our code
   * may differ from the other processes' now: a cache of our own first). */
  if (!reported) {
    cache_unshare();
    if (dw_report() && rule_from_dwfl((Dwarf_Addr)ra - 1, &rule))
      return rule;
  }
  return RULE_COMPLEX;            /* JIT code, garbage: libunwind decides */
}

static size_t rules_computed;   /* under dw_lock: by this process, since its start or fork */

size_t _ta_unwind_rules_computed(void)
{
  pthread_mutex_lock(&dw_lock);
  size_t n = rules_computed;
  pthread_mutex_unlock(&dw_lock);
  return n;
}

static TA_NOINLINE uint64_t rule_miss(uintptr_t ra)
{
  if (tls_in_miss)
    return RULE_COMPLEX;        /* nested (malloc inside libdw): not cached */
  tls_in_miss = 1;
  /* libdw allocates (its Dwfl, ELF handles, file names): under the preload
   * those are the ledger's own, raw, never blocks of the program's, even
   * when the program called a ta_* function (the guard the malloc
   * wrappers raise) */
  ta_thread *self = _ta_self;
  if (self) self->guard++;
  ta_thread *host = _ta_host_enter();
  int cancel = _ta_cancel_off();        /* libdw opens and reads files */
  pthread_mutex_lock(&dw_lock);
  intptr_t off;
  uint32_t flags = cache_get(ra, &off);
  uint64_t rule;
  if (flags)
    rule = flags | ((uint64_t)(uint32_t)off << 32);
  else {
    rule = rule_compute(ra);
    rules_computed++;
    if (cache_now() == &cache_empty)
      cache_unshare();            /* the first rule: the shared mapping */
    if (cache_now() != &cache_empty)
      cache_put(ra, rule);
  }
  pthread_mutex_unlock(&dw_lock);
  _ta_cancel_restore(cancel);
  _ta_host_leave(host);
  if (self) self->guard--;
  tls_in_miss = 0;
  return rule;
}

/* Does the last walk from its step o out (outer-first index) use the rbp
 * step o was given (before a step sets it)? */
static inline bool steps_need_bp(const walk_steps *last, size_t o)
{
  for (size_t j = o + 1; j-- > 0;) {
    if (last->flags[j] & ST_RBP_BASE)
      return true;
    if (last->flags[j] & ST_BP_SET)
      return false;
  }
  return false;
}

/* Writes the walk being made (rec: its k own steps and its reads,
 * innermost first) into last after last's steps [0, keep) and their
 * `kept` reads, in last's order (outermost first).  false when they do
 * not fit (last is then no walk: n 0). */
static inline bool steps_store(walk_steps *last, const walk_steps *rec, size_t k, size_t keep, size_t kept)
{
  size_t own = rec->nrd;
  if (keep + k > STEPS_MAX || kept + own > 2 * STEPS_MAX) {
    last->n = 0;
    return false;
  }
  size_t total = kept + own;
  for (size_t j = 0; j < k; j++) {
    size_t o = keep + k - 1 - j;
    last->sp[o] = rec->sp[j];
    last->pc[o] = rec->pc[j];
    last->bp[o] = rec->bp[j];
    last->flags[o] = rec->flags[j];
    last->rd_left[o] = (uint16_t)(total - rec->rd_left[j]);   /* reads from its first one out */
  }
  for (size_t r = 0; r < own; r++)
    last->rd[total - 1 - r] = rec->rd[r];
  last->nrd = (uint32_t)total;
  last->n = (uint32_t)(keep + k);
  return true;
}

/* The walk being made (rec), at its step k, stands where the last walk
 * stood at its step m (counted from the inner end; o = its index in last,
 * from the outer end): same pc and sp, and the same rbp if the last walk
 * went on to use it.  Takes over last's steps from m out if every word
 * last read from there out is still there (walking on would repeat them)
 * and they hold enough frames; returns the walk's frame count, or
 * SIZE_MAX with *fail at the outermost read that changed (SIZE_MAX:
 * none; a step further out whose reads are all outside it may still be
 * taken over).  The steps taken over stay where they are in last; rec's
 * own k steps are written after them.
 * (A restored rbp that step m was given and a later step used was read
 * by a step inside m, but is logged among last's reads from m on, at its
 * use: that word, now in this walk's own frames, is checked too, which
 * can only make a take-over fail; the rbp itself is compared before.) */
static inline __attribute__((always_inline)) TA_NO_ASAN
size_t take_over(walk_steps *rec, walk_steps *last, size_t m, uintptr_t *pcs, size_t n,
                 size_t max, size_t skip, size_t k, size_t *fail)
{
  size_t pn = last->n, lost = skip > k ? skip - k : 0, o = pn - 1 - m;
  *fail = SIZE_MAX;
  if (lost >= pn - m || k + (pn - m) > STEPS_MAX)
    return SIZE_MAX;
  size_t outs = pn - m - lost;       /* frames last's steps give this walk */
  if (last->end == END_MAX && outs < max - n)
    return SIZE_MAX;                 /* last stopped short of this walk's max */
  size_t nr = last->rd_left[o];      /* reads of steps o..0: rd[0, nr) */
  const walk_read *rd = last->rd;
  size_t r = 0;
  /* four at a time, one branch for four independent loads (a deep
   * recursion's walk checks ~50 words); the one that changed, one by one */
  for (; r + 4 <= nr; r += 4)
    if (((peek(rd[r].addr) ^ rd[r].val) | (peek(rd[r + 1].addr) ^ rd[r + 1].val) |
         (peek(rd[r + 2].addr) ^ rd[r + 2].val) | (peek(rd[r + 3].addr) ^ rd[r + 3].val)) != 0)
      break;
  for (; r < nr; r++)
    if (peek(rd[r].addr) != rd[r].val) {
      *fail = r;
      return SIZE_MAX;
    }
  size_t take = outs < max - n ? outs : max - n;
  for (size_t i = 0; i < take; i++)  /* frames m + lost on, outward */
    pcs[n + i] = last->pc[o - lost - i];
  n += take;
  rec->took = (uint32_t)take;
  /* last: its steps o..0 (fewer, when this walk stops at max inside them:
   * the step of the frame at max is kept without its reads, since the
   * walk stops before its rule), then this walk's own k steps */
  size_t steps = lost + take, keep = o + 1, kept = nr;
  if (steps < pn - m) {
    size_t drop = pn - m - steps;    /* outermost steps no longer walked */
    size_t cut = last->rd_left[drop];   /* reads of steps drop..0: dropped */
    kept = nr - cut;
    keep = steps;
    memmove(&last->sp[0], &last->sp[drop], keep * sizeof *last->sp);
    memmove(&last->pc[0], &last->pc[drop], keep * sizeof *last->pc);
    memmove(&last->bp[0], &last->bp[drop], keep * sizeof *last->bp);
    memmove(&last->flags[0], &last->flags[drop], keep * sizeof *last->flags);
    memmove(&last->rd[0], &last->rd[cut], kept * sizeof *last->rd);
    for (size_t j = 0; j < keep; j++)
      last->rd_left[j] = (uint16_t)(last->rd_left[j + drop] - cut);
    last->flags[0] = 0;
    last->end = END_MAX;
  }
  rec->n = steps_store(last, rec, k, keep, kept) ? last->n : 0;
  return n;
}

/* Logs a read into rec (the walk being made). */
static inline __attribute__((always_inline)) void steps_read(walk_steps *rec, uintptr_t a, uintptr_t v)
{
  if (rec->nrd < 2 * STEPS_MAX)
    rec->rd[rec->nrd] = (walk_read){ a, v };
  rec->nrd++;
}

/* pc, sp, bp: the state of _ta_unwind's caller after the call returned.
 * Returns SIZE_MAX when libunwind must do the walk.
 *
 * rec: where the walk records its own steps as it goes (NULL: nowhere);
 * last: the thread's last walk, outermost first (NULL: none; its n is 0
 * when it holds none), which the walk takes over from and, when it ends
 * or takes over, replaces with itself (n 0 when its steps are not all
 * kept).  Two walks
 * of one thread share their outer frames most of the time (a malloc and
 * the free that follows in the same caller, the nodes of a recursion, a
 * compiler's passes under one driver), and there the outer frames are the
 * same activations, at the same stack addresses.  So when this walk comes
 * to the state (pc, sp, and rbp where it is used) of a step of the last
 * walk, and every word the last walk read from there on is still there,
 * walking on would repeat the last walk step by step: it takes those
 * frames over, one compare per word, where a step is a rule lookup (a
 * cache miss where the program's code is large) and a chain of dependent
 * loads.  A word that changed is where the two walks part: the walk goes
 * on, and may take over from a step further out, whose reads all come
 * after that word. */
static inline __attribute__((always_inline)) TA_NO_ASAN
size_t walk_exact(uintptr_t *pcs, size_t max, size_t skip, uintptr_t pc, uintptr_t sp,
                  uintptr_t bp, uintptr_t hi, walk_steps *rec, walk_steps *last)
{
  size_t n = 0, k = 0, bad_at = SIZE_MAX;   /* last's read bad_at changed (outer-first) */
  size_t pn = 0, o = 0;              /* last's steps, and the one met next (outer-first) */
  if (rec) {                         /* its n and took are 0 (unwind_from) */
    rec->nrd = 0;
    rec->first_bp = false;
  }
  if (rec == NULL)
    last = NULL;
  walk_steps *prev = last && last->n ? last : NULL;
  if (prev) {
    pn = prev->n;
    o = pn - 1;
  }
  /* Where bp came from, for the log: a restored rbp is logged only when a
   * later step uses it (CFA = rbp + k).  Code without frame pointers saves
   * rbp as any callee-saved register, so what the walk restores is most
   * often data (a pointer of the program's) that no step uses: logged, a
   * different value there made the next walk from the same place a miss. */
  enum { BP_FIRST, BP_PENDING, BP_DONE } bp_src = BP_FIRST;
  uintptr_t bp_addr = 0;
  int end = END_STOP;
  for (;;) {
    if (prev) {
      while (o != SIZE_MAX && prev->sp[o] < sp)
        o--;
      if (o == SIZE_MAX)
        prev = NULL;
      else if (prev->sp[o] == sp && prev->pc[o] == pc && prev->rd_left[o] <= bad_at) {
        bool need = steps_need_bp(prev, o);
        if (need && prev->bp[o] != bp)
          goto walk_on;
        /* the steps taken over use the rbp this walk restored: its word
         * is one this walk's own steps read */
        if (need && bp_src == BP_PENDING) {
          steps_read(rec, bp_addr, bp);
          bp_src = BP_DONE;
        } else if (need && bp_src == BP_FIRST) {
          rec->first_bp = true;
        }
        size_t fail, r = take_over(rec, prev, pn - 1 - o, pcs, n, max, skip, k, &fail);
        if (r != SIZE_MAX)
          return r;
        if (fail == SIZE_MAX)
          prev = NULL;               /* not enough of it: walk on alone */
        else
          bad_at = fail;
      }
    }
  walk_on:
    if (rec) {
      if (k < STEPS_MAX) {
        rec->sp[k] = sp;
        rec->pc[k] = pc;
        rec->bp[k] = bp;
        rec->flags[k] = 0;
        rec->rd_left[k] = (uint16_t)(rec->nrd < 2 * STEPS_MAX ? rec->nrd : 2 * STEPS_MAX);
      } else {
        rec = NULL;                  /* too deep to keep: last stays the walk it was */
        prev = NULL;
        last = NULL;
      }
    }
    if (k++ >= skip) {
      pcs[n++] = pc;
      if (n == max) {
        end = END_MAX;
        break;
      }
    }
    intptr_t off;
    uint32_t flags = cache_get(pc, &off);
    if (TA_UNLIKELY(flags == 0)) {
      uint64_t rule = rule_miss(pc);
      flags = rule_flags(rule);
      off = rule_cfa_off(rule);
    }
    int base = flags_base(flags);
    if (TA_UNLIKELY(base == CFA_SPECIAL)) {
      if (flags == RULE_END)
        break;
      return SIZE_MAX;
    }
    /* a branch, not a cmov: predicted, it keeps the rule's bits off the
     * pc -> rule -> cfa -> pc dependency chain */
    uintptr_t cfa;
    if (base == CFA_RSP)
      cfa = sp;
    else {
      cfa = bp;
      __asm__("" : "+r"(cfa));
      if (rec) {
        rec->flags[k - 1] = ST_RBP_BASE;
        if (bp_src == BP_PENDING)
          steps_read(rec, bp_addr, bp);
        else if (bp_src == BP_FIRST)
          rec->first_bp = true;
      }
      bp_src = BP_DONE;
    }
    cfa += (uintptr_t)(intptr_t)off;
    /* [cfa - 8, cfa) holds the RA: need sp < cfa <= hi (sp >= lo already) */
    if (cfa <= sp || cfa > hi || (cfa & 7) != 0)
      break;
    switch (flags_rbp(flags)) {
    case RBP_SAVED: {
      uintptr_t a = cfa + (uintptr_t)(intptr_t)flags_rbp_off(flags);
      if (a < sp || a > hi - 8 || (a & 7) != 0)   /* a == sp: push rbp; call */
        goto stop;
      bp = peek(a);
      bp_addr = a;
      bp_src = BP_PENDING;
      if (rec)
        rec->flags[k - 1] |= ST_BP_SET;
      break;
    }
    case RBP_UNDEF:
      bp = 0;
      bp_src = BP_DONE;
      if (rec)
        rec->flags[k - 1] |= ST_BP_SET;
      break;
    default:
      break;
    }
    pc = peek(cfa - 8);
    if (rec)
      steps_read(rec, cfa - 8, pc);
    sp = cfa;
    if (pc == 0)
      break;
  }
stop:
  if (rec && last) {                 /* this walk, all its own, replaces the last one */
    last->end = (uint32_t)end;
    if (rec->nrd > 2 * STEPS_MAX || !steps_store(last, rec, k, 0, 0))
      last->n = 0;
    rec->n = last->n;
  }
  return n;
}

/* The exact walk is a chain of dependent loads (pc -> rule -> cfa -> next
 * pc), so when the rule cache is cold (the program's own work between two
 * walks pushed it out) its misses come one after the other.  Most code
 * keeps frame pointers: the frame-pointer chain, which is on the hot stack,
 * gives the likely return addresses at once, and their rules are
 * prefetched together.  Only a hint: a wrong guess costs a prefetch. */
static inline TA_NO_ASAN void prefetch_rules(uintptr_t fp, uintptr_t hi, size_t frames)
{
  rule_cache *c = cache_now();
  for (size_t i = 0; i < frames && fp < hi && hi - fp >= 16 && (fp & 7) == 0; i++) {
    __builtin_prefetch(&c->slot[rule_hash(peek(fp + 8))]);
    uintptr_t next = peek(fp);
    if (next <= fp)
      break;
    fp = next;
  }
}

void _ta_unwind_forget(uintptr_t lo, uintptr_t hi)
{
  pthread_mutex_lock(&dw_lock);
  if (cache_now() != &cache_empty)
    cache_unshare();              /* the other processes keep the module */
  rule_cache *c = cache_now();
  for (size_t i = 0; i < CACHE_SIZE; i++) {
    uintptr_t k = atomic_load_explicit(&c->slot[i].key, memory_order_relaxed);
    if (k >= lo && k < hi && k != 0)
      atomic_store_explicit(&c->slot[i].flags, 0, memory_order_relaxed);
  }
  dw_stale = true;
  atomic_fetch_add_explicit(&rules_gen, 1, memory_order_release);
  pthread_mutex_unlock(&dw_lock);
}

#else  /* !__x86_64__ */

size_t _ta_unwind_rules_computed(void)
{
  return 0;
}

void _ta_unwind_fork(int phase)
{
  (void)phase;
}

void _ta_unwind_forget(uintptr_t lo, uintptr_t hi)
{
  (void)lo;
  (void)hi;
}

#endif

/* ---- entry -------------------------------------------------------------- */

/* The walk from the state of the entry's caller: ra0 the return address
 * into it, fp the entry's own frame record ([fp] = the caller's rbp,
 * [fp + 8] = ra0).  log: NULL, or where the walk's reads go (LOG_NONE when
 * libunwind does the walk). */
static inline __attribute__((always_inline)) TA_NO_ASAN
size_t unwind_from(uintptr_t *pcs, size_t max, size_t skip, int mode, uintptr_t ra0,
                   uintptr_t fp, walk_log *log, walk_steps *rec, walk_steps *last)
{
  if (rec) {                      /* n: the walk was kept in last (walk_exact) */
    rec->n = 0;
    rec->took = 0;
  }
#if defined(__x86_64__) || defined(__aarch64__)
  uintptr_t lo, hi;
  stack_bounds(&lo, &hi);
  bool on_stack = fp >= lo && fp < hi && hi - fp >= 2 * sizeof(uintptr_t);
  if (mode == TA_UNWIND_FAST) {
    if (!on_stack) {
      if (log)
        log->n = LOG_NONE;
      return 0;
    }
    return walk_fast(pcs, max, skip, fp, fp, hi, lo, log);
  }
# if defined(__x86_64__)
  if (on_stack) {
    /* a walk that may take over the last one's frames walks its first few */
    prefetch_rules(fp, hi, last && last->n ? PREFETCH_TAKE : skip + max);
    size_t n = walk_exact(pcs, max, skip, ra0, fp + 16, peek(fp), hi, rec, rec ? last : NULL);
    if (TA_LIKELY(n != SIZE_MAX)) {
      if (log) {                  /* the memo keeps the walk: its reads, innermost first */
        if (rec && rec->n && last->nrd <= LOG_READS) {
          for (size_t r = 0, nr = last->nrd; r < nr; r++)
            log->rd[r] = last->rd[nr - 1 - r];
          log->n = last->nrd;
          log->needbp = rec->first_bp;
        } else {
          log->n = LOG_NONE;
        }
      }
      return n;
    }
  }
# endif
#else
  if (mode == TA_UNWIND_FAST) {
    if (log)
      log->n = LOG_NONE;
    return 0;
  }
#endif
  if (log)
    log->n = LOG_NONE;
  return unwind_libunwind(pcs, max, skip, ra0);
}

TA_NOINLINE TA_NO_ASAN size_t _ta_unwind(uintptr_t *pcs, size_t max, size_t skip, int mode)
{
  if (max == 0 || (mode != TA_UNWIND_EXACT && mode != TA_UNWIND_FAST))
    return 0;
  uintptr_t ra0 = (uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0));
  uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
  return unwind_from(pcs, max, skip, mode, ra0, fp, NULL, NULL, NULL);
}

/* ---- the walk memo ------------------------------------------------------- */

/* A walk is a function of where it starts (the caller's return address and
 * stack pointer, and rbp where the walk uses it), of the rules of the
 * return addresses it meets (fixed while no module is unloaded: rules_gen),
 * and of the words it reads from the stack.  So each thread keeps its
 * recent walks, in 16 sets by the stack pointer they started at, two ways
 * a set, or eight in a set that has widened (below; the one used longest
 * ago goes): the start, every address read and the word found there, and
 * the stack's id in the depot.  A walk that starts where a kept one did
 * and finds every one of its words unchanged would repeat it step by
 * step, so the kept id is the answer: one comparison per word,
 * independent loads where the walk is a chain of dependent ones (pc ->
 * rule -> cfa -> next pc), and no hash and no depot lookup.  A loop that
 * allocates from one call path (the same frames at the same depth) finds
 * its walk here every time.  Any other walk differs in a word, most often
 * one of the first ones read (its caller), and is made and kept in place
 * of its set's way used longest ago.
 *
 * Two ways or eight.  Two keep a loop that allocates from one or two call
 * paths at one depth.  Some programs reach malloc from one start (the
 * same function at the same depth) by many routes that part further out:
 * git's log by ~20, and two ways kept the walk it needed next for half of
 * its allocations, eight for 95%.  But eight ways for every set cost the
 * workloads whose walks are mostly new (the tree, whose every node has a
 * stack of its own, 40% of its CPU time; mixchurn, whose call paths are
 * picked at random, about 15%): every walk misses there, and is written
 * into a way touched less recently, in a memo four times the size.  So a
 * set widens only where it would have answered more:
 *
 * - Each set keeps ghosts: a hash of the start and stack id of each of
 *   the last MEMO_GHOSTS walks it let go for another.  A walk that misses
 *   and is kept, and finds its own among them, is one a wider set would
 *   have answered: it adds MEMO_GAIN to the set's score, and any other
 *   miss kept takes 1 off.  At MEMO_WIDEN (more than one kept miss in
 *   five met again, ~8 of them more than the others) the set uses eight
 *   ways, and keeps every walk it misses (not only while the thread's
 *   credit lasts, below: it has shown that its walks come back).
 * - In a wide set a hit on a way that was not one of the two used last
 *   (a hit that two ways would not have had) adds MEMO_GAIN, and a miss
 *   takes 1 off; at 0 it uses two ways again (the other six keep what
 *   they hold, unread, till it widens again).
 *
 * On the tree and mixchurn no set widens.  A capture pays for this a tag
 * and the ways' order read from the set's line, and a kept miss a hash,
 * eight compares in two and a store; the ghosts and the score move with
 * the walks kept only, so that a miss not kept (seven in eight, where
 * walks are mostly new) pays nothing more.  The six more ways of each set
 * come after the others in the memo, not touched before a set widens.
 *
 * A walk the memo does not answer takes over the outer frames of the
 * thread's last walk where it can (walk_exact), and leaves its own steps
 * and reads for the next one; a walk the memo keeps takes its reads from
 * there.  (Taking over the frames of a kept walk, found by its stack
 * pointer, was tried: in cc1, where nine walks in ten are new, checking
 * and copying the kept frames cost more instructions and cache misses than
 * the rule lookups they saved.  The last walk is the one that shares the
 * most: cc1's walks take over 16 of their 20 frames from it.) */
#define MEMO_SETS      16
#define MEMO_NARROW    2            /* ways of a set that has not widened */
#define MEMO_WAYS      8            /* ways of a wide set */
#define MEMO_GHOSTS    8
#define MEMO_GAIN      4
#define MEMO_WIDEN     32
#define MEMO_SCORE_MAX 64
#define MEMO_ORDER0    0x76543210u  /* way i at place i */

typedef struct {
  uintptr_t sp0, pc0, bp0;
  uint32_t  id;
  uint32_t  gen;
  uint16_t  max, skip, nreads;
  uint8_t   mode, needbp;
  walk_stop stop;                 /* where a fast walk stopped (STOP_NONE: elsewhere) */
  walk_read rd[LOG_READS];
} walk_entry;

/* A set, one cache line: what a lookup reads before a way's entry, and
 * all a miss reads and writes besides the way it replaces. */
typedef struct {
  uint32_t  ghost[MEMO_GHOSTS] __attribute__((aligned(16)));   /* walks seen and not held (memo_ghost); 0: none */
  uint16_t  tag[MEMO_WAYS];       /* each way's start (memo_tag); 0: an empty way */
  uint32_t  order;                /* the ways by last use, 4 bits each, the latest lowest */
  uint16_t  score;                /* 0 to MEMO_SCORE_MAX */
  uint8_t   ways;                 /* in use: MEMO_NARROW or MEMO_WAYS */
  uint8_t   gnext;                /* the ghost written next */
} __attribute__((aligned(64))) walk_set;

_Static_assert(sizeof(walk_set) == 64, "a memo set is one cache line");

#define MEMO_CREDIT_MAX 32
#define MEMO_KEEP_COST  4
#define MEMO_KEEP_EVERY 8

struct ta_walk_memo {
  uint32_t   credit, tick;
  size_t     hits;
  size_t     taken, taken_frames;       /* take-overs of the last walk's frames */
  size_t     widened;                   /* times a set widened */
  walk_set   set[MEMO_SETS];
  walk_steps last;                      /* the last walk, outermost first */
  walk_steps own;                       /* the walk being made: its own steps */
  /* way w of set s at e[w * MEMO_SETS + s]: the ways 0 and 1 of every set
   * first, together, and the six more a set uses once it widens after
   * them, not touched before */
  walk_entry e[MEMO_WAYS * MEMO_SETS];
};

static inline size_t memo_set(uintptr_t sp0)
{
  return (size_t)(((sp0 >> 3) * 0x9E3779B97F4A7C15ull) >> 60);
}

/* A hash of a walk's start (its stack pointer and caller). */
static inline uint64_t memo_start(uintptr_t sp0, uintptr_t pc0)
{
  return (sp0 ^ (pc0 * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
}

/* A way's tag: a hint (walks in one set start at stack pointers of one
 * hash, mostly at one; the head decides). */
static inline uint16_t memo_tag(uintptr_t sp0, uintptr_t pc0)
{
  return (uint16_t)((pc0 ^ (pc0 >> 16) ^ (sp0 >> 3)) | 1u);
}

/* A walk from that start, to the stack id. */
static inline uint32_t memo_ghost(uint64_t start, uint32_t id)
{
  return (uint32_t)(((start ^ id) * 0xD6E8FEB86659FD93ull) >> 32) | 1u;
}

static inline walk_entry *memo_way(struct ta_walk_memo *m, size_t si, unsigned w)
{
  return &m->e[w * MEMO_SETS + si];
}

/* order with the way at place moved first. */
static inline uint32_t order_front(uint32_t order, unsigned place)
{
  uint64_t o = order, below = o & ((1ull << (4 * place)) - 1), above = o & (~0ull << (4 * place + 4));
  return (uint32_t)(above | (below << 4) | ((o >> (4 * place)) & 15u));
}

/* Is g one of the set's ghosts?  (Eight compares in two.) */
static inline bool ghost_seen(const walk_set *s, uint32_t g)
{
#if defined(__SSE2__)
  __m128i v = _mm_set1_epi32((int)g);
  __m128i a = _mm_load_si128((const __m128i *)(const void *)&s->ghost[0]);
  __m128i b = _mm_load_si128((const __m128i *)(const void *)&s->ghost[4]);
  return _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi32(a, v), _mm_cmpeq_epi32(b, v))) != 0;
#else
  bool seen = false;
  for (unsigned i = 0; i < MEMO_GHOSTS; i++)
    seen |= s->ghost[i] == g;
  return seen;
#endif
}

static inline void ghost_add(walk_set *s, uint32_t g)
{
  s->ghost[s->gnext] = g;
  s->gnext = (uint8_t)((s->gnext + 1) % MEMO_GHOSTS);
}

/* A set's score goes up (gain) or down by a miss; it widens or narrows. */
static inline void memo_score(struct ta_walk_memo *m, walk_set *s, bool gain)
{
  unsigned sc = s->score;
  if (gain) {
    sc = sc + MEMO_GAIN < MEMO_SCORE_MAX ? sc + MEMO_GAIN : MEMO_SCORE_MAX;
  } else {
    if (sc == 0)
      return;
    sc--;
  }
  s->score = (uint16_t)sc;
  if (s->ways == MEMO_NARROW && sc >= MEMO_WIDEN) {
    s->ways = MEMO_WAYS;
    m->widened++;
  }
}

/* A wide set whose score fell to 0 uses two ways again: the two it used
 * last, moved into ways 0 and 1, where a set of two ways keeps its walks
 * (its lookup reads them there, without the order).  Rare: the entries
 * are swapped a cache line at a time. */
static TA_NOINLINE void memo_narrow(struct ta_walk_memo *m, size_t si)
{
  walk_set *s = &m->set[si];
  for (unsigned t = 0; t < MEMO_NARROW; t++) {
    unsigned x = (s->order >> (4 * t)) & 15u;   /* the way at place t */
    if (x == t)
      continue;
    unsigned char *a = (unsigned char *)memo_way(m, si, x), *b = (unsigned char *)memo_way(m, si, t);
    unsigned char line[64];
    for (size_t off = 0; off < sizeof(walk_entry); off += sizeof line) {
      size_t k = sizeof(walk_entry) - off < sizeof line ? sizeof(walk_entry) - off : sizeof line;
      memcpy(line, a + off, k);
      memcpy(a + off, b + off, k);
      memcpy(b + off, line, k);
    }
    uint16_t tg = s->tag[x];
    s->tag[x] = s->tag[t];
    s->tag[t] = tg;
    for (unsigned p = 0; p < MEMO_WAYS; p++)   /* way t's walk is in way x now */
      if (((s->order >> (4 * p)) & 15u) == t) {
        s->order = (s->order & ~(15u << (4 * p))) | (x << (4 * p));
        break;
      }
    s->order = (s->order & ~(15u << (4 * t))) | (t << (4 * t));
  }
  s->ways = MEMO_NARROW;
}

/* Are all the words e's walk read still there?  From the innermost word
 * out: two walks that start at one stack pointer mostly differ in their
 * first frames. */
static inline TA_NO_ASAN bool memo_same(const walk_entry *e)
{
  size_t n = e->nreads, i = 0;
  if (n > 0 && peek(e->rd[0].addr) != e->rd[0].val)   /* most misses: the caller */
    return false;
  /* the rest four at a time, one branch for four independent loads */
  for (i = 1; i + 4 <= n; i += 4) {
    uintptr_t d = (peek(e->rd[i].addr) ^ e->rd[i].val) |
                  (peek(e->rd[i + 1].addr) ^ e->rd[i + 1].val) |
                  (peek(e->rd[i + 2].addr) ^ e->rd[i + 2].val) |
                  (peek(e->rd[i + 3].addr) ^ e->rd[i + 3].val);
    if (d)
      return false;
  }
  uintptr_t d = 0;
  for (; i < n; i++)
    d |= peek(e->rd[i].addr) ^ e->rd[i].val;
  if (d)
    return false;
  switch (e->stop.kind) {         /* the word it stopped at still stops it */
  case STOP_NEXT:
    return !next_continues(peek(e->stop.addr), e->stop.a, e->stop.b);
  case STOP_PC:
    return pc_stops(peek(e->stop.addr), e->stop.a, e->stop.b);
  default:
    return true;
  }
}

TA_NOINLINE TA_NO_ASAN uint32_t _ta_unwind_id(size_t max, size_t skip, int mode)
{
  if (max == 0 || (mode != TA_UNWIND_EXACT && mode != TA_UNWIND_FAST))
    return 0;
  if (max > TA_MAX_DEPTH)
    max = TA_MAX_DEPTH;
  uintptr_t ra0 = (uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0));
  uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
  uintptr_t pcs[TA_MAX_DEPTH];
  ta_thread *t = _ta_self;
  if (t == NULL || t->walk_memo_busy || skip > UINT16_MAX)   /* busy: a signal handler nested in a walk */
    return _ta_depot_put(pcs, unwind_from(pcs, max, skip, mode, ra0, fp, NULL, NULL, NULL));
  t->walk_memo_busy = 1;
  atomic_signal_fence(memory_order_seq_cst);
  if (TA_UNLIKELY(t->walk_memo == NULL)) {
    struct ta_walk_memo *m = _ta_meta_calloc(1, sizeof *m);
    if (m) {
      m->credit = MEMO_CREDIT_MAX;   /* a new thread keeps its first walks */
      for (size_t i = 0; i < MEMO_SETS; i++) {
        m->set[i].order = MEMO_ORDER0;
        m->set[i].ways = MEMO_NARROW;
      }
    }
    t->walk_memo = m;
  }
  uint32_t id;
  if (TA_UNLIKELY(t->walk_memo == NULL)) {
    id = _ta_depot_put(pcs, unwind_from(pcs, max, skip, mode, ra0, fp, NULL, NULL, NULL));
  } else {
    uintptr_t sp0 = fp + 2 * sizeof(uintptr_t), bp0 = peek(fp);
    uint32_t gen = atomic_load_explicit(&rules_gen, memory_order_acquire);
    struct ta_walk_memo *m = t->walk_memo;
    size_t si = memo_set(sp0);
    walk_set *s = &m->set[si];
    uint16_t tag = memo_tag(sp0, ra0);
    uint32_t order = s->order;
    unsigned ways = s->ways, place;
    walk_entry *e = NULL;
#define MEMO_MATCH(c)                                                                         \
    ((c)->sp0 == sp0 && (c)->pc0 == ra0 && (c)->gen == gen && (c)->max == max &&              \
     (c)->skip == skip && (c)->mode == mode && (!(c)->needbp || (c)->bp0 == bp0) && memo_same(c))
    if (TA_LIKELY(ways == MEMO_NARROW)) {
      /* ways 0 and 1 (memo_narrow), the one used last first */
      unsigned w0 = order & 1u;
      walk_entry *c0 = &m->e[si], *c1 = &m->e[MEMO_SETS + si], *c;
      if (s->tag[w0] == tag && (c = w0 ? c1 : c0, MEMO_MATCH(c))) {
        e = c;
        place = 0;
      } else if (s->tag[w0 ^ 1u] == tag && (c = w0 ? c0 : c1, MEMO_MATCH(c))) {
        e = c;
        place = 0;                   /* moved first here: the two swap */
        s->order = order ^ 0x11u;
      }
    } else {
      for (place = 0; place < ways; place++) {
        unsigned w = (order >> (4 * place)) & 15u;
        walk_entry *c = memo_way(m, si, w);
        if (s->tag[w] == tag && MEMO_MATCH(c)) {
          e = c;
          break;
        }
      }
    }
#undef MEMO_MATCH
    if (e) {
      id = e->id;
      if (place > 0) {
        s->order = order_front(order, place);
        if (place >= MEMO_NARROW)    /* a hit that two ways would not have had */
          memo_score(m, s, true);
      }
      m->hits++;
      if (m->credit < MEMO_CREDIT_MAX)
        m->credit++;
    } else {
      /* Keeping a walk costs two stores per word read: worth it where
       * walks repeat, not where nine in ten are new (cc1).  Every miss is
       * kept while hits earn credit; else one in MEMO_KEEP_EVERY.  It
       * goes in place of the way used longest ago (an empty one, while a
       * set that has widened fills: they come last). */
      place = ways - 1;
      unsigned w = (order >> (4 * place)) & 15u;
      e = memo_way(m, si, w);
      bool keep = ways == MEMO_WAYS || m->credit > 0 || (++m->tick & (MEMO_KEEP_EVERY - 1)) == 0;
      if (m->credit > 0)
        m->credit = m->credit > MEMO_KEEP_COST ? m->credit - MEMO_KEEP_COST : 0;
      size_t n;
      uint32_t gone = 0;             /* the walk the way held, a ghost now */
      walk_log log = { 0, false, e->rd, { STOP_NONE, 0, 0, 0 } };
      /* Each walk is left for the next one to take over (last); the
       * walk's reads, its own and those taken over, are what the memo
       * keeps. */
      walk_steps *last = &m->last, *rec = &m->own;
      if (last->gen != gen) {     /* rules forgotten since: its steps may be wrong */
        last->n = 0;
        last->gen = gen;
      }
      if (keep) {
        if (s->tag[w])
          gone = memo_ghost(memo_start(e->sp0, e->pc0), e->id);
        s->tag[w] = 0;            /* the new walk goes straight into the way */
        n = unwind_from(pcs, max, skip, mode, ra0, fp, &log, rec, last);
      } else {
        n = unwind_from(pcs, max, skip, mode, ra0, fp, NULL, rec, last);
      }
      if (rec->took) {
        m->taken++;
        m->taken_frames += rec->took;
      }
      id = _ta_depot_put(pcs, n);
      if (keep && id != 0) {
        /* a set's score, and its ghosts, move with the walks it keeps */
        uint32_t g = memo_ghost(memo_start(sp0, ra0), id);
        bool seen = ghost_seen(s, g);
        if (seen || s->score)
          memo_score(m, s, seen && ways == MEMO_NARROW);
        if (log.n <= LOG_READS) {
          e->sp0 = sp0;
          e->pc0 = ra0;
          e->bp0 = bp0;
          e->gen = gen;
          e->max = (uint16_t)max;
          e->skip = (uint16_t)skip;
          e->mode = (uint8_t)mode;
          e->needbp = log.needbp;
          e->nreads = (uint16_t)log.n;
          e->stop = log.stop;
          e->id = id;
          s->tag[w] = tag;
          s->order = order_front(order, place);
          if (seen)               /* held again */
            for (unsigned i = 0; i < MEMO_GHOSTS; i++)
              if (s->ghost[i] == g)
                s->ghost[i] = 0;
        }
        if (gone == g)
          gone = 0;               /* the same walk, some other word changed */
      }
      if (gone)
        ghost_add(s, gone);
      if (TA_UNLIKELY(ways == MEMO_WAYS && s->score == 0))
        memo_narrow(m, si);
    }
  }
  atomic_signal_fence(memory_order_seq_cst);
  t->walk_memo_busy = 0;
  return id;
}

size_t _ta_unwind_taken(size_t *frames)
{
  ta_thread *t = _ta_self;
  *frames = t && t->walk_memo ? t->walk_memo->taken_frames : 0;
  return t && t->walk_memo ? t->walk_memo->taken : 0;
}

size_t _ta_unwind_memo_hits(void)
{
  ta_thread *t = _ta_self;
  return t && t->walk_memo ? t->walk_memo->hits : 0;
}

size_t _ta_unwind_memo_wide(size_t *widened)
{
  ta_thread *t = _ta_self;
  size_t wide = 0;
  *widened = 0;
  if (t && t->walk_memo) {
    for (size_t i = 0; i < MEMO_SETS; i++)
      wide += t->walk_memo->set[i].ways == MEMO_WAYS;
    *widened = t->walk_memo->widened;
  }
  return wide;
}
