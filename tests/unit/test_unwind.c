/* test_unwind.c - the exact unwinder's rule cache is shared with forked
 * children: a rule a child computes (for code its parent never ran) is
 * there for the parent after the child is gone, and code that neither ran
 * still costs a rule.  Counted with _ta_unwind_rules_computed, the rules
 * this process had to compute with libdw.
 * And a walk survives a frame-pointer chain that points at the top of the
 * address space (the prefetch along that chain once wrapped around and
 * read address 0); and the fast (frame-pointer) walk stops at a frame
 * record whose return address is an address on the stack, as code
 * without frame pointers leaves them, instead of recording it.
 * And the walk memo (a walk that finds every word of a kept walk unchanged
 * takes its stack id) answers a repeated call path, and never a call path
 * that differs only in an outer frame: the stacks it gives are the ones a
 * fresh walk gives, in exact and in fast mode.
 * And a walk that takes over the outer frames of the thread's last walk
 * gives the fresh walk's stack: down a recursion path by path, at depths
 * that jump, through frames without a frame pointer, with stacks cut
 * short (TAGALLOC_DEPTH=5), where the last walk may hold too few frames,
 * with stacks as deep as they are kept (TA_MAX_DEPTH), and after a
 * longjmp out of the last walk's frames, which then never return. */
#include "harness.h"
#include "child.h"
#include "support.h"
#include "internal.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static ta_tag T;

/* Two functions the test process runs for the first time when it says so;
 * each allocates from a call site of its own (a return address the cache
 * has never seen). */
NOIPA static void only_in_child(void) {
  void *p = ta_alloc(T, 24);
  KEEP();
  ta_free(p);
  KEEP();
}

NOIPA static void never_before(void) {
  void *p = ta_alloc(T, 24);
  KEEP();
  ta_free(p);
  KEEP();
}

static void test_child_rules_serve_parent(void **state) {
  (void)state;
  T = ta_tag_get("unwind");
  void *warm = ta_alloc(T, 8);               /* the cache is made on a first miss */
  ta_free(warm);

  /* The child runs only_in_child first, the parent after the child is
   * gone: from the same call site, so every return address of the walk is
   * one the child has seen. */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid > 0) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  __asm__ volatile("" : "+r"(pid));   /* one call site below, not one per branch */
  size_t before = _ta_unwind_rules_computed();
  only_in_child();
  size_t after = _ta_unwind_rules_computed();
  if (pid == 0) _exit(after > before ? 0 : 3);   /* the child did compute them */
  assert_int_equal(after, before);               /* the parent did not */

  never_before();                            /* the control: new code, new rules */
  assert_true(_ta_unwind_rules_computed() > before);
}

/* Called with rbp = 0xfffffffffffffff8: its frame record saves that. */
__attribute__((used, noinline)) void *unwind_alloc_one(void);
__attribute__((used, noinline)) void *unwind_alloc_one(void) {
  void *p = ta_alloc(T, 40);
  KEEP();
  return p;
}

NOIPA static void *call_with_wild_rbp(void) {
  void *p;
  __asm__ volatile("mov %%rsp, %%rbx\n\t"
                   "sub $128, %%rsp\n\t"          /* past the red zone */
                   "and $-16, %%rsp\n\t"
                   "push %%rbp\n\t"
                   "sub $8, %%rsp\n\t"            /* 16-byte aligned at the call */
                   "movabs $0xfffffffffffffff8, %%rbp\n\t"
                   "call unwind_alloc_one\n\t"
                   "add $8, %%rsp\n\t"
                   "pop %%rbp\n\t"
                   "mov %%rbx, %%rsp\n\t"
                   : "=a"(p)
                   :
                   : "rbx", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "memory");
  return p;
}

static void test_wild_frame_pointer(void **state) {
  (void)state;
  T = ta_tag_get("unwind");
  void *p = call_with_wild_rbp();
  assert_non_null(p);
  uintptr_t frames[TA_MAX_DEPTH];
  ta_block b;
  assert_true(_ta_block_get((uintptr_t)p, &b));
  /* the walk stops at the wild frame: unwind_alloc_one, then at most the
   * frame the asm sits in */
  size_t n = ta_stack_frames(b.stack, frames, TA_MAX_DEPTH);
  assert_true(n >= 1 && n <= 2);
  ta_free(p);
}

/* A frame record on the stack as code without frame pointers leaves one:
 * rbp holds the address of a local, and the word after it (where a return
 * address would be) is another address on the stack. */
static uintptr_t fake_record[2];

NOIPA static void *call_with_stack_rbp(void) {
  uintptr_t rec[2];
  rec[0] = 0;                                  /* no next frame */
  rec[1] = (uintptr_t)&rec[0];                 /* "returns" into the stack */
  fake_record[0] = (uintptr_t)&rec[0];
  fake_record[1] = rec[1];
  void *p;
  __asm__ volatile("mov %%rsp, %%rbx\n\t"
                   "sub $128, %%rsp\n\t"
                   "and $-16, %%rsp\n\t"
                   "push %%rbp\n\t"
                   "sub $8, %%rsp\n\t"
                   "mov %1, %%rbp\n\t"
                   "call unwind_alloc_one\n\t"
                   "add $8, %%rsp\n\t"
                   "pop %%rbp\n\t"
                   "mov %%rbx, %%rsp\n\t"
                   : "=a"(p)
                   : "r"(&rec[0])
                   : "rbx", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "memory");
  KEEP();
  return p;
}

/* In a child with TAGALLOC_UNWIND=fast: prints the frames of a block
 * allocated under that record, and which of them lie on the stack. */
static int child_fast_stack_rbp(void) {
  T = ta_tag_get("unwind");
  void *p = call_with_stack_rbp();
  ta_block b;
  if (p == NULL || !_ta_block_get((uintptr_t)p, &b)) return 2;
  uintptr_t frames[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(b.stack, frames, TA_MAX_DEPTH);
  size_t on_stack = 0;
  for (size_t i = 0; i < n; i++)
    if (frames[i] == fake_record[1]) on_stack++;
  printf("frames=%zu on_stack=%zu\n", n, on_stack);
  ta_free(p);
  return 0;
}

/* Runs `--child name` with env (one VAR=value): it exits 0 and prints want. */
static void child_says(const char *name, const char *setting, const char *want) {
  const char *env[] = { setting, NULL };
  child_result r;
  child_exec(name, env, &r);
  assert_true(WIFEXITED(r.status));
  assert_int_equal(WEXITSTATUS(r.status), 0);
  assert_string_equal(r.out, want);
  child_result_free(&r);
}

static void test_fast_stops_at_stack_address(void **state) {
  (void)state;
  /* unwind_alloc_one, then the asm's call site; not the stack address */
  child_says("fast-stack-rbp", "TAGALLOC_UNWIND=fast", "frames=2 on_stack=0\n");
}

/* ---- the walk memo ----------------------------------------------------- */

/* outer -> via_a, via_b or via_c -> middle -> leaf: the three have the
 * same frame, so leaf's stack pointer, its caller and its caller's caller
 * are the same on all paths; only the third frame's return address
 * differs. */
typedef struct {
  uint32_t  id;
  size_t    fresh_n;
  uintptr_t fresh[TA_MAX_DEPTH];
} memo_probe;

NOIPA static void leaf(memo_probe *p) {
  p->id = ta_stack_here();                    /* frame #0: this call site in leaf */
  KEEP();
  p->fresh_n = _ta_unwind(p->fresh, (size_t)_ta_opt.depth, 0, (int)_ta_opt.unwind);   /* no memo */
  KEEP();
}

NOIPA static void middle(memo_probe *p) {
  leaf(p);
  KEEP();
}

NOIPA static void via_a(memo_probe *p) {
  volatile int pad = 1;
  middle(p);
  KEEP();
  (void)pad;
}

NOIPA static void via_b(memo_probe *p) {
  volatile int pad = 2;
  middle(p);
  KEEP();
  (void)pad;
}

NOIPA static void via_c(memo_probe *p) {
  volatile int pad = 3;
  middle(p);
  KEEP();
  (void)pad;
}

/* A third path, built without a frame pointer: it keeps a value of its
 * own in rbp (a callee-saved register) across the call.  middle's frame
 * saves that value, the exact walk restores it, and no step uses it: a
 * different value there must not make the next walk a miss. */
static uintptr_t rbp_data;

__attribute__((noipa, optimize("omit-frame-pointer"))) static void via_data(memo_probe *p) {
  register uintptr_t r __asm__("rbp") = rbp_data;
  __asm__ volatile("" : "+r"(r));
  middle(p);
  __asm__ volatile("" : : "r"(r));
}

/* One call site for all paths: the same stack pointer all the way down. */
NOIPA static void outer(void (*via)(memo_probe *), memo_probe *p) {
  via(p);
  KEEP();
}

/* The memo's stack is the fresh walk's, but for frame #0 (another call site
 * in leaf); -1 where not, else the number of frames. */
static int probe_check(const memo_probe *p, size_t min) {
  uintptr_t frames[TA_MAX_DEPTH];
  size_t n = ta_stack_frames(p->id, frames, TA_MAX_DEPTH);
  if (n < min || n != p->fresh_n || (n == TA_MAX_DEPTH && _ta_opt.depth < TA_MAX_DEPTH)) return -1;
  for (size_t i = 1; i < n; i++)
    if (frames[i] != p->fresh[i]) return -1;
  return (int)n;
}

/* In a thread of its own (a memo of its own), from one call site: ten
 * calls on one path; six that take the three paths in turn; six that
 * alternate between two of them.  "hits=9 three=0 two=4 same=1 differ=1 bad=0":
 * the repeats after the first are answered, and stay right; with three
 * paths in turn no call is (each differs from both walks kept for that
 * stack pointer in the third frame); two paths in turn are both kept, so
 * after the first two calls every one is; each path keeps its stack id,
 * and the three have three.  Then ten calls through via_data, each with
 * another value in rbp, none of them an address on the stack: "data=9",
 * the repeats are answered (the exact walk does not use that rbp; the fast
 * walk stops at it, as at the last ten, and the memo keeps that it stops,
 * not its value).  Then one with rbp the address of a frame record further
 * up, which the fast walk follows to a fourth frame: "follow=1", the memo
 * does not answer with the walk that stopped (exact: the walk, which does
 * not use that rbp, gives the frames it gave before). */
static void *memo_thread(void *arg) {
  static void (*const path[])(memo_probe *) = { via_a, via_b, via_c };
  char *out = arg;
  memo_probe p;
  uint32_t ids[3] = { 0, 0, 0 };
  int bad = 0, same = 1;
  ta_free(ta_alloc(T, 8));                    /* the thread's ledger state, its memo */
  size_t h0 = _ta_unwind_memo_hits(), h[3] = { 0, 0, 0 };
  for (int i = 0; i < 22; i++) {
    if (i == 10) h[0] = _ta_unwind_memo_hits();
    if (i == 16) h[1] = _ta_unwind_memo_hits();
    int which = i < 10 ? 0 : i < 16 ? (i - 9) % 3 : 1 + (i - 16) % 2;   /* a..a, b c a b c a, b c b c b c */
    outer(path[which], &p);
    if (probe_check(&p, 4) < 0) bad++;
    if (ids[which] != 0 && ids[which] != p.id) same = 0;
    ids[which] = p.id;
  }
  h[2] = _ta_unwind_memo_hits();
  bool fast = _ta_opt.unwind == TA_UNWIND_FAST;
  uint32_t idd = 0;
  size_t h3 = _ta_unwind_memo_hits(), data = 0;
  uintptr_t rec[2] = { 0, (uintptr_t)&probe_check };   /* no next frame; a code address */
  for (int i = 0; i < 11; i++) {     /* the last call is the follow */
    if (i == 10) data = _ta_unwind_memo_hits() - h3;
    rbp_data = i < 10 ? 0x5eed0000u + (uintptr_t)i * 0x1010u : (uintptr_t)&rec[0];
    outer(via_data, &p);
    if (i == 10) break;
    if (probe_check(&p, fast ? 3 : 4) < 0) bad++;   /* fast: leaf, middle, via_data */
    if (idd != 0 && idd != p.id) same = 0;
    idd = p.id;
  }
  uintptr_t frames[TA_MAX_DEPTH];
  size_t nf = ta_stack_frames(p.id, frames, TA_MAX_DEPTH);
  /* exact: the frames of the calls before, up to outer's (the compiler
   * may give the last call a call site of its own in this function) */
  uintptr_t before[TA_MAX_DEPTH];
  size_t nb = ta_stack_frames(idd, before, TA_MAX_DEPTH);
  int follow = fast ? nf == 4 && frames[3] == rec[1] && probe_check(&p, 4) == 4
                    : nf == nb && nf >= 4 && memcmp(frames, before, 4 * sizeof *frames) == 0;
  bool differ = ids[0] && ids[1] && ids[2] && ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2];
  snprintf(out, 128, "hits=%zu three=%zu two=%zu same=%d differ=%d bad=%d data=%zu follow=%d", h[0] - h0,
           h[1] - h[0], h[2] - h[1], same, differ, bad, data, follow);
  return NULL;
}

/* fn(out) in a thread of its own: a walk memo and a last walk of its own. */
static void thread_run(void *(*fn)(void *), char *out) {
  T = ta_tag_get("unwind");
  pthread_t th;
  if (pthread_create(&th, NULL, fn, out) != 0) { snprintf(out, 128, "no thread"); return; }
  pthread_join(th, NULL);
}

static void memo_run(char *out) { thread_run(memo_thread, out); }

static void test_memo_exact(void **state) {
  (void)state;
  char out[128];
  memo_run(out);
  assert_string_equal(out, "hits=9 three=0 two=4 same=1 differ=1 bad=0 data=9 follow=1");
}

/* A child that prints what run says. */
static int child_prints(void (*run)(char *)) {
  char out[128];
  run(out);
  printf("%s\n", out);
  return 0;
}

static void test_memo_fast(void **state) {
  (void)state;
  child_says("memo-fast", "TAGALLOC_UNWIND=fast", "hits=9 three=0 two=4 same=1 differ=1 bad=0 data=9 follow=1\n");
}

/* A set of the memo widens where it would answer more: a recursion like
 * climb's, all of one function with two call sites, so that each of its
 * 2^depth paths is a walk of its own from one start (leaf's stack pointer
 * and caller are the same on all of them). */
static volatile int fan_sink;                /* two call sites, two return addresses */

NOIPA static void fan(int depth, unsigned path, memo_probe *p) {
  volatile int pad = depth;
  if (depth == 0) {
    leaf(p);
  } else if ((path >> (depth - 1)) & 1) {
    fan(depth - 1, path, p);                  /* call site 1 */
    fan_sink = 1;
  } else {
    fan(depth - 1, path, p);                  /* call site 2 */
    fan_sink = 2;
  }
  KEEP();
  (void)pad;
}

/* One call site for every path: its stack id, checked against a fresh walk. */
NOIPA static uint32_t fan_one(unsigned path, memo_probe *p, int *bad) {
  fan(10, path, p);
  KEEP();
  if (probe_check(p, 10) < 0) (*bad)++;
  return p->id;
}

/* In a thread of its own: forty calls on path 0 (the memo answers 39 and
 * earns the credit to keep the next walks); then paths 1 to 8 in turn,
 * twelve rounds.  Two ways answer few of those (each path was let go
 * before it comes again), but from the second round on each miss the set
 * keeps (while the credit lasts, then one in eight) finds the walk it
 * makes among the set's ghosts, the walks it let go: the set widens, once
 * ("widened=1"), keeps every miss from then on, fills its eight ways, and
 * answers every call of the last two rounds ("last=16"), each with the
 * path's own stack ("same=1").  Then paths met once each (as the tree's
 * nodes are), none answered ("new=0"), none a ghost: each takes 1 off the
 * score, and within 600 of them the set uses two ways again ("wide=0"),
 * not having widened again ("widened=1").  The two walks it used last,
 * moved into the two ways it uses now, answer the same paths again with
 * the same stacks ("again=2,2").  "bad=0": every stack is the fresh
 * walk's. */
/* After the rounds: new paths from k = 9 on until the set narrows (or
 * 600 of them), then (redo 1 and 2) the last two of them again.  The
 * paths come from these two (the compiler cannot make the loop that
 * calls them two loops, two call sites of fan_one). */
typedef struct {
  unsigned k, redo;
  uint32_t last2[2];
  size_t   wide, widened, h2;
  int      again, done;
} widen_walk;

NOIPA static unsigned widen_path(const widen_walk *st) {
  return st->redo ? st->k - 3 + st->redo : st->k;
}

NOIPA static void widen_next(widen_walk *st, uint32_t id) {
  unsigned path = widen_path(st);
  if (st->redo) {
    st->again += id == st->last2[path % 2];
    st->done = ++st->redo == 3;
  } else {
    st->last2[path % 2] = id;
    st->wide = _ta_unwind_memo_wide(&st->widened);
    if (++st->k == 609 || st->wide == 0) {
      st->redo = 1;
      st->h2 = _ta_unwind_memo_hits();
    }
  }
}

static void *widen_thread(void *arg) {
  char *out = arg;
  memo_probe p;
  int bad = 0, same = 1;
  uint32_t ids[9] = { 0 };
  ta_free(ta_alloc(T, 8));                    /* the thread's ledger state, its memo */
  for (int i = 0; i < 40; i++) fan_one(0, &p, &bad);
  size_t h0 = 0;
  for (int round = 0; round < 12; round++) {
    if (round == 10) h0 = _ta_unwind_memo_hits();
    for (unsigned k = 1; k <= 8; k++) {
      uint32_t id = fan_one(k, &p, &bad);
      if (ids[k] != 0 && ids[k] != id) same = 0;
      ids[k] = id;
    }
  }
  size_t h1 = _ta_unwind_memo_hits(), widened1;
  size_t wide1 = _ta_unwind_memo_wide(&widened1);
  widen_walk st = { .k = 9, .wide = wide1, .widened = widened1 };
  while (!st.done) widen_next(&st, fan_one(widen_path(&st), &p, &bad));
  size_t h3 = _ta_unwind_memo_hits();
  snprintf(out, 128, "widened=%zu wide=%zu last=%zu same=%d new=%zu wide=%zu widened=%zu again=%d,%zu bad=%d",
           widened1, wide1, h1 - h0, same, st.h2 - h1, st.wide, st.widened, st.again, h3 - st.h2, bad);
  return NULL;
}

static void widen_run(char *out) { thread_run(widen_thread, out); }

static void test_memo_widens(void **state) {
  (void)state;
  char out[128];
  widen_run(out);
  assert_string_equal(out, "widened=1 wide=1 last=16 same=1 new=0 wide=0 widened=1 again=2,2 bad=0");
}

static void test_memo_widens_fast(void **state) {
  (void)state;
  child_says("memo-widen", "TAGALLOC_UNWIND=fast",
             "widened=1 wide=1 last=16 same=1 new=0 wide=0 widened=1 again=2,2 bad=0\n");
}

/* ---- taking over the last walk's frames ---------------------------------- */

/* A recursion that goes down one of two call sites at each level (as a
 * binary tree is built), with frame pointers (climb) or without one and
 * data of its own in rbp (climb_data, every third level), to `depth`
 * levels, where leaf takes the stack's id and a fresh walk.  Consecutive
 * walks share the outer frames down to where their paths part. */
static uintptr_t climb_rbp;
static volatile int climb_sink;              /* two call sites, two return addresses */

NOIPA static void climb(int depth, unsigned path, memo_probe *p);

__attribute__((noipa, optimize("omit-frame-pointer"))) static void climb_data(int depth, unsigned path,
                                                                           memo_probe *p) {
  register uintptr_t r __asm__("rbp") = climb_rbp + (uintptr_t)depth;
  __asm__ volatile("" : "+r"(r));
  climb(depth, path, p);
  __asm__ volatile("" : : "r"(r));
}

NOIPA static void climb(int depth, unsigned path, memo_probe *p) {
  volatile int pad = depth;
  unsigned bit = depth > 0 ? (path >> ((depth - 1) % 32)) & 1 : 0;   /* the top level: the high bit */
  if (depth == 0) {
    leaf(p);
  } else if (depth % 3 == 0 && bit) {
    climb_data(depth - 1, path, p);
  } else if (bit) {
    climb(depth - 1, path, p);                /* call site 1 */
    climb_sink = 1;
  } else {
    climb(depth - 1, path, p);                /* call site 2 */
    climb_sink = 2;
  }
  KEEP();
  (void)pad;
}

/* The id's stack is the fresh walk's (frame #0 aside) for every path of
 * 64 in turn at depth 6, then at depths going 2, 9, 4, 12, 1, 7 ... (a
 * walk much shallower or deeper than the last); rbp's data changes every
 * walk.  "bad=0": every stack is right.  "took=100": every walk takes
 * frames over from the one before (none is a path met again, which the
 * memo would answer): the first of each loop the 2 frames of the thread's
 * start, "deep=98" the others at least 4 (take_thread's and a climb frame
 * at least). */
static void take_one(int depth, unsigned path, memo_probe *p, size_t *stats) {
  size_t f0, t0 = _ta_unwind_taken(&f0);
  climb(depth, path, p);
  size_t f1, t1 = _ta_unwind_taken(&f1);
  if (probe_check(p, 4) < 0) stats[0]++;
  if (t1 - t0 == 1) stats[1]++;
  if (t1 - t0 == 1 && f1 - f0 >= 4) stats[2]++;
}

/* Through a call site that calls a function pointer: a walk from leaf,
 * and one from leaf two calls deeper, stand at y_call's step alike. */
NOIPA static void y_call(void (*fn)(memo_probe *), memo_probe *p) {
  fn(p);
  KEEP();
}

NOIPA static void chain2(memo_probe *p) {
  leaf(p);
  KEEP();
}

NOIPA static void chain1(memo_probe *p) {
  chain2(p);
  KEEP();
}

static void *take_thread(void *arg) {
  char *out = arg;
  memo_probe p;
  size_t stats[3] = { 0, 0, 0 }, walks = 0;
  ta_free(ta_alloc(T, 8));                    /* the thread's ledger state */
  for (unsigned path = 0; path < 64; path++, walks++) {
    climb_rbp = 0x7a110000u + path * 0x100u;
    take_one(6, path, &p, stats);
  }
  static const int depths[] = { 2, 9, 4, 12, 1, 7, 3, 11, 0, 10, 5, 8 };
  for (unsigned i = 0; i < 3 * sizeof depths / sizeof *depths; i++, walks++) {
    climb_rbp = 0x5eed0000u + i * 0x10u;
    take_one(depths[i % (sizeof depths / sizeof *depths)], i * 37u, &p, stats);
  }
  /* Cut at 5 frames, the deeper walk stops at y_call's caller: the
   * shallower one after it finds too few of its frames there, and walks
   * on; the deeper one after that takes over 2 of the shallower one's
   * frames, and its walk stops inside them. */
  for (int i = 0; i < 6; i++, walks++) {
    y_call(i % 2 ? leaf : chain1, &p);
    if (probe_check(&p, 4) < 0) stats[0]++;
  }
  /* As deep as a stack may be kept: walks cut at TA_MAX_DEPTH frames,
   * whose steps and reads fill the records to the brim. */
  if (_ta_opt.depth == TA_MAX_DEPTH) {
    for (int i = 0; i < 8; i++, walks++) {
      take_one(TA_MAX_DEPTH - 6 + i, (unsigned)i * 0x9e3779b9u, &p, stats);
    }
  }
  if (_ta_opt.depth != 32)
    snprintf(out, 128, "bad=%zu walks=%zu", stats[0], walks);
  else
    snprintf(out, 128, "bad=%zu walks=%zu took=%zu deep=%zu", stats[0], walks, stats[1], stats[2]);
  return NULL;
}

static void take_run(char *out) { thread_run(take_thread, out); }

/* Stacks cut at 5 frames (a child): a walk takes over frames up to its
 * max, inside the last walk's, or not at all where the last walk stopped
 * short of them; every stack is still the fresh walk's. */
static void test_take_over_short(void **state) {
  (void)state;
  child_says("take-short", "TAGALLOC_DEPTH=5", "bad=0 walks=106\n");
}

/* And with stacks of up to TA_MAX_DEPTH frames, recursions past it. */
static void test_take_over_deep(void **state) {
  (void)state;
  char want[64];
  snprintf(want, sizeof want, "TAGALLOC_DEPTH=%d", TA_MAX_DEPTH);
  child_says("take-short", want, "bad=0 walks=114\n");
}

static void test_take_over(void **state) {
  (void)state;
  char out[128];
  take_run(out);
  assert_string_equal(out, "bad=0 walks=106 took=100 deep=98");
}

/* A recursion like climb's that leaves by longjmp from its bottom: the
 * last walk's frames are abandoned, not returned from, and the next
 * descent puts other frames (other return addresses, other call sites) at
 * the same stack addresses.  A frame taken over is checked by its stack
 * pointer, its return address and every word the last walk read outside
 * it, so every stack is still the fresh walk's: "bad=0" over 96 walks at
 * depths and paths that change every walk.  And the walks were not made
 * afresh: 90 or more of them are answered by the walk memo (a path met
 * before, all its words unchanged: 8 to 10, by how the thread's stack
 * addresses fall into the memo's sets) or take frames over from the walk
 * before (80 or more, 86 to 88 here); "reused=1 took=1". */
static jmp_buf jump_out;

NOIPA static void jump_climb(int depth, unsigned path, memo_probe *p) {
  volatile int pad = depth;
  if (depth < 0) return;
  if (depth == 0) {
    leaf(p);
    longjmp(jump_out, 1);
  } else if ((path >> (depth % 32)) & 1) {
    jump_climb(depth - 1, path, p);           /* call site 1 */
    climb_sink = 1;
  } else {
    jump_climb(depth - 1, path, p);           /* call site 2 */
    climb_sink = 2;
  }
  KEEP();
  (void)pad;
}

NOIPA static void jump_other(int depth, memo_probe *p) {   /* another function at those addresses */
  volatile int pad[3] = { depth, depth, depth };
  if (depth < 0) return;
  if (depth == 0) {
    leaf(p);
    longjmp(jump_out, 1);
  }
  jump_other(depth - 1, p);
  KEEP();
  (void)pad;
}

static void *jump_thread(void *arg) {
  char *out = arg;
  static memo_probe p;                        /* static: kept across longjmp */
  static size_t bad, took;
  bad = took = 0;
  ta_free(ta_alloc(T, 8));                    /* the thread's ledger state */
  size_t h0 = _ta_unwind_memo_hits();
  for (volatile unsigned i = 0; i < 96; i++) {
    size_t f0, t0 = _ta_unwind_taken(&f0);
    if (setjmp(jump_out) == 0) {
      if (i % 4 == 3) jump_other((int)(i % 7), &p);
      else jump_climb((int)(3 + i % 9), i * 0x9e3779b9u, &p);
    }
    size_t f1, t1 = _ta_unwind_taken(&f1);
    if (probe_check(&p, 4) < 0) bad++;
    took += t1 - t0;
  }
  size_t hits = _ta_unwind_memo_hits() - h0;
  snprintf(out, 128, "bad=%zu reused=%d took=%d", bad, took + hits >= 90, took >= 80);
  return NULL;
}

static void test_take_over_longjmp(void **state) {
  (void)state;
  char out[128];
  thread_run(jump_thread, out);
  assert_string_equal(out, "bad=0 reused=1 took=1");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) {
    if (strcmp(argv[2], "fast-stack-rbp") == 0) return child_fast_stack_rbp();
    if (strcmp(argv[2], "memo-fast") == 0) return child_prints(memo_run);
    if (strcmp(argv[2], "memo-widen") == 0) return child_prints(widen_run);
    if (strcmp(argv[2], "take-short") == 0) return child_prints(take_run);
    return 2;
  }
  setenv("TAGALLOC_UNWIND", "exact", 1);
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_child_rules_serve_parent),
    cmocka_unit_test(test_wild_frame_pointer),
    cmocka_unit_test(test_fast_stops_at_stack_address),
    cmocka_unit_test(test_memo_exact),
    cmocka_unit_test(test_memo_fast),
    cmocka_unit_test(test_memo_widens),
    cmocka_unit_test(test_memo_widens_fast),
    cmocka_unit_test(test_take_over),
    cmocka_unit_test(test_take_over_short),
    cmocka_unit_test(test_take_over_deep),
    cmocka_unit_test(test_take_over_longjmp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
