/* test_depot.c - the stack depot with millions of distinct stacks.
 *
 * A recursive binary tree build where every node is allocated at the bottom
 * of a different call path (left and right children are built from two
 * different call sites): depth 21 gives 2^21 - 1 nodes, each with a stack of
 * its own (`test_depot 21`; make test uses depth 18, 262,143 stacks).
 * Proves that every distinct stack gets a distinct id, that equal stacks
 * share one, that ids read back the same frames, and that the counts stay
 * exact; that stacks share their outer frames' nodes, and a thread finds
 * stacks it asks for again in order without index lookups; and that the
 * trace writer's walk of the depot sees every node once, after its
 * parent. */
#include "harness.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct node { struct node *l, *r; uint32_t stack; } node;

static ta_tag T;
static size_t nodes;

static node *build(int depth);

__attribute__((noinline)) static node *build_left(int depth) {
  node *n = build(depth);
  __asm__ volatile("" ::: "memory");
  return n;
}

__attribute__((noinline)) static node *build_right(int depth) {
  node *n = build(depth);
  __asm__ volatile("" ::: "memory");
  return n;
}

__attribute__((noinline)) static node *build(int depth) {
  node *n = ta_alloc(T, sizeof *n);
  nodes++;
  n->stack = ta_stack_here();
  n->l = depth > 1 ? build_left(depth - 1) : NULL;
  n->r = depth > 1 ? build_right(depth - 1) : NULL;
  __asm__ volatile("" ::: "memory");
  return n;
}

static size_t free_tree(node *n, uint32_t *ids, size_t k) {
  if (n == NULL) return k;
  ids[k++] = n->stack;
  k = free_tree(n->l, ids, k);
  k = free_tree(n->r, ids, k);
  ta_free(n);
  return k;
}

__attribute__((noinline)) static size_t free_all(node *root, uint32_t *ids) {
  size_t k = free_tree(root, ids, 0);
  __asm__ volatile("" ::: "memory");
  return k;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static int depth = 18;

__attribute__((noinline)) static node *make_tree(void) {
  node *n = build(depth);
  __asm__ volatile("" ::: "memory");
  return n;
}

static void test_many_stacks(void **state) {
  (void)state;
  T = ta_tag_get("tree.node");
  size_t expected = ((size_t)1 << depth) - 1;
  size_t before = ta_stacks_count(), after_first = 0;
  uint32_t *ids = malloc(expected * sizeof *ids);
  assert_non_null(ids);
  /* Two rounds from the same call sites: the second finds every stack of
   * the first already in the depot. */
  for (volatile int round = 0; round < 2; round++) {
    ta_mark m = ta_mark_now();
    nodes = 0;
    node *root = make_tree();
    assert_int_equal(nodes, expected);
    ta_counts c = ta_since(m, T);
    assert_int_equal(c.allocs, expected);
    assert_int_equal(c.live_blocks, expected);
    assert_int_equal(free_all(root, ids), expected);
    c = ta_since(m, T);
    assert_int_equal(c.frees, expected);
    assert_int_equal(c.live_blocks, 0);
    /* every node's ta_stack_here is a stack of its own */
    qsort(ids, expected, sizeof *ids, cmp_u32);
    for (size_t i = 1; i < expected; i++) assert_true(ids[i] != ids[i - 1]);
    if (round == 0) {
      /* per node: its allocation, its ta_stack_here and its free */
      assert_int_equal(ta_stacks_count() - before, 3 * expected);
      after_first = ta_stacks_count();
    } else {
      assert_int_equal(ta_stacks_count(), after_first);
    }
  }
  free(ids);
}

static void test_frames_read_back(void **state) {
  (void)state;
  uint32_t a = ta_stack_here(), b = ta_stack_here();
  assert_true(a != 0 && b != 0 && a != b);   /* two call sites */
  uintptr_t fa[TA_MAX_DEPTH], fa2[TA_MAX_DEPTH];
  size_t na = ta_stack_frames(a, fa, TA_MAX_DEPTH);
  assert_true(na >= 2);
  uint32_t a2 = 0;
  for (volatile int i = 0; i < 2; i++) {   /* volatile: not unrolled into two sites */
    uint32_t s = ta_stack_here();           /* the same call site twice */
    if (i == 0) a2 = s;
    else assert_int_equal(s, a2);
  }
  size_t na2 = ta_stack_frames(a2, fa2, TA_MAX_DEPTH);
  assert_int_equal(na2, na);
  assert_memory_equal(fa + 1, fa2 + 1, (na - 1) * sizeof *fa);   /* same callers */
  assert_int_equal(ta_stack_frames(0, fa, TA_MAX_DEPTH), 0);
  assert_int_equal(ta_stack_frames(0x7fffffff, fa, TA_MAX_DEPTH), 0);
}

/* The trace writer's walk of the depot (every node in the order it was
 * made) sees each node once, each after its parent, and the frames of
 * each node's stack are its own pc and then its parent's frames. */
typedef struct { size_t n, bad; uint32_t last; } walk_acc;

static void walk_one(uint32_t id, uint32_t parent, uintptr_t pc, void *arg) {
  walk_acc *a = arg;
  uintptr_t got[TA_MAX_DEPTH], up[TA_MAX_DEPTH];
  a->n++;
  size_t n = _ta_depot_get(id, got, TA_MAX_DEPTH);
  size_t np = parent ? _ta_depot_get(parent, up, TA_MAX_DEPTH) : 0;
  if (id != a->last + 1 || parent >= id || n != np + 1 || n != _ta_depot_depth(id) || got[0] != pc ||
      memcmp(got + 1, up, np * sizeof *up) != 0)
    a->bad++;
  a->last = id;
}

static void test_walk_all(void **state) {
  (void)state;
  size_t nodes = _ta_depot_nodes();
  assert_true(_ta_depot_count() > 200000);
  assert_true(nodes >= _ta_depot_count());
  walk_acc a = { 0 };
  uint64_t cursor = 0;
  _ta_depot_each_since(&cursor, walk_one, &a);
  assert_int_equal(a.n, nodes);
  assert_int_equal(a.bad, 0);
  walk_acc again = { .last = a.last };
  _ta_depot_each_since(&cursor, walk_one, &again);   /* nothing new since */
  assert_int_equal(again.n, 0);
}

/* Stacks share their outer frames: two stacks that differ only in the
 * innermost frame add one node each past their shared callers, and the
 * callers' stack, when put later as a stack of its own, adds no node but
 * counts once as a stack. */
static void test_shared_frames(void **state) {
  (void)state;
  uintptr_t a[3] = { 0x6100000001ull, 0x6100000002ull, 0x6100000003ull };
  uintptr_t b[3] = { 0x6100000004ull, 0x6100000002ull, 0x6100000003ull };
  size_t stacks = _ta_depot_count(), nodes = _ta_depot_nodes();
  uint32_t ia = _ta_depot_put(a, 3), ib = _ta_depot_put(b, 3);
  assert_true(ia != 0 && ib != 0 && ia != ib);
  assert_int_equal(_ta_depot_nodes() - nodes, 4);      /* 3, then 2, then 1, then 4 */
  assert_int_equal(_ta_depot_count() - stacks, 2);
  uint32_t callers = _ta_depot_put(a + 1, 2);
  assert_int_equal(_ta_depot_nodes() - nodes, 4);
  assert_int_equal(_ta_depot_count() - stacks, 3);
  assert_int_equal(_ta_depot_put(b + 1, 2), callers);
  assert_int_equal(_ta_depot_put(a, 3), ia);
  assert_int_equal(_ta_depot_count() - stacks, 3);
  uintptr_t got[4];
  assert_int_equal(_ta_depot_get(ib, got, 4), 3);
  assert_memory_equal(got, b, sizeof b);
  assert_int_equal(_ta_depot_get(ib, got, 2), 2);      /* the innermost two */
  assert_memory_equal(got, b, 2 * sizeof *b);
  assert_int_equal(_ta_depot_get(callers, got, 4), 2);
  assert_memory_equal(got, a + 1, 2 * sizeof *a);
  assert_int_equal(_ta_depot_depth(ia), 3);
  assert_int_equal(_ta_depot_depth(callers), 2);
}

/* A thread that puts again the stacks it made, in the order it made
 * them, finds them by guessing the next node, not in the index; and a
 * stack that is all in the thread's path (the callers of its last stack)
 * is found with no lookup once it is known to be a whole stack.  The
 * stacks are deeper than the per-thread memo's 32 frames, so that every
 * put reaches the path. */
enum { SEQ_STACKS = 3000, SEQ_SHARED = 34, SEQ_FRAMES = SEQ_SHARED + 3 };

static void seq_stack(size_t k, uintptr_t *pcs) {
  pcs[0] = 0x6200000000ull + k;                       /* the allocating frame */
  pcs[1] = 0x6300000000ull + k / 10;                  /* its caller, one per ten stacks */
  pcs[2] = 0x6400000000ull + k / 100;
  for (size_t f = 3; f < SEQ_FRAMES; f++) pcs[f] = 0x6500000000ull + f;   /* the shared callers */
}

static void test_guessed_in_order(void **state) {
  (void)state;
  static uint32_t ids[SEQ_STACKS];
  uintptr_t pcs[SEQ_FRAMES];
  assert_non_null(_ta_thread());                      /* the path is the thread's */
  size_t nodes = _ta_depot_nodes();
  uint64_t l0 = _ta_depot_lookups();
  for (size_t k = 0; k < SEQ_STACKS; k++) {
    seq_stack(k, pcs);
    ids[k] = _ta_depot_put(pcs, SEQ_FRAMES);
  }
  size_t made = _ta_depot_nodes() - nodes;
  assert_int_equal(made, SEQ_SHARED + SEQ_STACKS / 100 + SEQ_STACKS / 10 + SEQ_STACKS);
  uint64_t l1 = _ta_depot_lookups();
  /* one lookup a stack, for its first new frame: the frames inside a
   * node made now are made without one */
  assert_int_equal(l1 - l0, SEQ_STACKS);
  /* Again, in order: the guesses start after their credit ran out while
   * the nodes were being made (one try in 32), then stay right; the next
   * round has one lookup, where it goes back from stack 2999 to stack 0
   * (stack 0's callers are an older node than any guess). */
  for (int round = 0; round < 2; round++) {
    uint64_t before = _ta_depot_lookups();
    for (size_t k = 0; k < SEQ_STACKS; k++) {
      seq_stack(k, pcs);
      assert_int_equal(_ta_depot_put(pcs, SEQ_FRAMES), ids[k]);
    }
    uint64_t looked = _ta_depot_lookups() - before;
    if (round == 0) assert_true(looked < 32);
    else assert_int_equal(looked, 1);
  }
  assert_int_equal(_ta_depot_nodes() - nodes, made);
  /* The callers of stack 5 (a free in the function that allocated): all in
   * the path; looked up once, for its whole-stack bit, then not again. */
  seq_stack(5, pcs);
  assert_int_equal(_ta_depot_put(pcs, SEQ_FRAMES), ids[5]);
  size_t stacks = _ta_depot_count();
  uint64_t before = _ta_depot_lookups();
  uint32_t callers = _ta_depot_put(pcs + 1, SEQ_FRAMES - 1);
  assert_int_equal(_ta_depot_lookups() - before, 1);
  assert_int_equal(_ta_depot_count() - stacks, 1);
  seq_stack(6, pcs);
  assert_int_equal(_ta_depot_put(pcs, SEQ_FRAMES), ids[6]);
  before = _ta_depot_lookups();
  assert_int_equal(_ta_depot_put(pcs + 1, SEQ_FRAMES - 1), callers);
  assert_int_equal(_ta_depot_lookups() - before, 0);
  assert_int_equal(_ta_depot_count() - stacks, 1);
  assert_int_equal(_ta_depot_nodes() - nodes, made);
}

/* Four threads put the same 150,000 made-up stacks at once, in the same
 * order, so that they race on every insert and on the index's growth
 * (2^12 slots to 2^18 on the way): each stack gets one id, the same in
 * every thread, the depot grows by exactly 150,000, and no two stacks
 * share an id. */
enum { RACE_THREADS = 4, RACE_STACKS = 150000, RACE_FRAMES = 6 };

typedef struct { uint32_t *ids; pthread_barrier_t *go; } race_arg;

static void race_stack(size_t k, uintptr_t *pcs) {
  for (size_t f = 0; f < RACE_FRAMES; f++) pcs[f] = 0x7000000000ull + k * 64 + f;
}

static void *race_thread(void *arg) {
  race_arg *a = arg;
  uintptr_t pcs[RACE_FRAMES];
  pthread_barrier_wait(a->go);
  for (size_t k = 0; k < RACE_STACKS; k++) {
    race_stack(k, pcs);
    a->ids[k] = _ta_depot_put(pcs, 1 + k % RACE_FRAMES);
  }
  return NULL;
}

static void test_racing_puts(void **state) {
  (void)state;
  size_t before = _ta_depot_count();
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, RACE_THREADS);
  pthread_t th[RACE_THREADS];
  race_arg args[RACE_THREADS];
  for (int i = 0; i < RACE_THREADS; i++) {
    args[i].ids = malloc(RACE_STACKS * sizeof(uint32_t));
    assert_non_null(args[i].ids);
    args[i].go = &go;
    assert_int_equal(pthread_create(&th[i], NULL, race_thread, &args[i]), 0);
  }
  for (int i = 0; i < RACE_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&go);
  assert_int_equal(_ta_depot_count() - before, RACE_STACKS);
  size_t differ = 0, zero = 0;
  for (size_t k = 0; k < RACE_STACKS; k++) {
    zero += args[0].ids[k] == 0;
    for (int i = 1; i < RACE_THREADS; i++) differ += args[i].ids[k] != args[0].ids[k];
  }
  assert_int_equal(zero, 0);
  assert_int_equal(differ, 0);
  uint32_t *sorted = args[0].ids;
  qsort(sorted, RACE_STACKS, sizeof *sorted, cmp_u32);
  for (size_t k = 1; k < RACE_STACKS; k++) assert_true(sorted[k] != sorted[k - 1]);
  /* and each id reads back its own frames */
  uintptr_t pcs[RACE_FRAMES];
  for (size_t k = 0; k < RACE_STACKS; k += 997) {
    race_stack(k, pcs);
    uint32_t id = _ta_depot_put(pcs, 1 + k % RACE_FRAMES);
    uintptr_t got[RACE_FRAMES];
    assert_int_equal(_ta_depot_get(id, got, RACE_FRAMES), 1 + k % RACE_FRAMES);
    assert_memory_equal(got, pcs, (1 + k % RACE_FRAMES) * sizeof *pcs);
  }
  assert_int_equal(_ta_depot_count() - before, RACE_STACKS);
  for (int i = 0; i < RACE_THREADS; i++) free(args[i].ids);
}

int main(int argc, char **argv) {
  if (argc > 1) depth = atoi(argv[1]);
  setenv("TAGALLOC_REPORT", "0", 1);
  setenv("TAGALLOC_SCAN", "0", 1);
  setenv("TAGALLOC_QUARANTINE", "0", 1);
  setenv("TAGALLOC_DEPTH", "64", 1);   /* the deepest nodes are 2 * depth + 5 frames down */
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_racing_puts),
    cmocka_unit_test(test_frames_read_back),
    cmocka_unit_test(test_shared_frames),
    cmocka_unit_test(test_guessed_in_order),
    cmocka_unit_test(test_many_stacks),
    cmocka_unit_test(test_walk_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
