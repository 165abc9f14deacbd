/* test_depot_trie.c - the stack depot as a trie of frames (alloc/depot.c).
 *
 * Made-up stacks (return addresses no code has), so that every count is
 * exact: stacks that share their outer frames share those frames' nodes,
 * one node per frame not shared; the same frames give the same id and any
 * other frames, or fewer of them, another; an id reads back its frames;
 * two nodes whose path hashes are equal stay apart; the depot's memory is
 * 8 bytes a node (its return address a number in a table of the distinct
 * ones) and 4 an index slot, and every stack is found again after the
 * index was rebuilt bigger, 3/2 and 4/3 of its size in turn, and where
 * a probe runs past its last slot; the frames
 * inside a frame made now are made without a lookup, once each, also when
 * threads put the same new stacks at once.  (The depot
 * under millions of real stacks and racing threads: tests/stress/test_depot.c.) */
#include "harness.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SHARED 10

/* Stack k: its own innermost frame, a caller shared by ten stacks, then
 * SHARED callers shared by all (innermost first). */
static size_t prefix_stack(uintptr_t base, size_t k, uintptr_t *pcs) {
  pcs[0] = base + 0x100000 + k;
  pcs[1] = base + 0x200000 + k / 10;
  for (size_t f = 0; f < SHARED; f++) pcs[2 + f] = base + 0x300000 + f;
  return 2 + SHARED;
}

static void test_prefixes_shared(void **state) {
  (void)state;
  const uintptr_t base = 0x5100000000ull;
  uintptr_t pcs[2 + SHARED], got[2 + SHARED + 1];
  uint32_t ids[100];
  size_t nodes = _ta_depot_nodes(), stacks = _ta_depot_count();
  for (size_t k = 0; k < 100; k++) {
    size_t n = prefix_stack(base, k, pcs);
    ids[k] = _ta_depot_put(pcs, n);
    assert_true(ids[k] != 0);
    /* the first stack makes all its nodes, each later one its innermost
     * frame's, and one in ten its caller's too */
    assert_int_equal(_ta_depot_nodes() - nodes, SHARED + (k / 10 + 1) + (k + 1));
  }
  assert_int_equal(_ta_depot_count() - stacks, 100);
  /* every id apart, and each reads back its own frames */
  for (size_t k = 0; k < 100; k++) {
    for (size_t j = 0; j < k; j++) assert_true(ids[j] != ids[k]);
    size_t n = prefix_stack(base, k, pcs);
    assert_int_equal(_ta_depot_get(ids[k], got, sizeof got / sizeof *got), n);
    assert_memory_equal(got, pcs, n * sizeof *pcs);
    assert_int_equal(_ta_depot_depth(ids[k]), n);
  }
  /* the shared callers as stacks of their own: no node, one stack each */
  size_t made = _ta_depot_nodes();
  for (size_t j = 0; j < 10; j++) {
    prefix_stack(base, 10 * j, pcs);
    uint32_t id = _ta_depot_put(pcs + 1, 1 + SHARED);
    assert_true(id != 0);
    assert_int_equal(_ta_depot_get(id, got, sizeof got / sizeof *got), 1 + SHARED);
    assert_memory_equal(got, pcs + 1, (1 + SHARED) * sizeof *pcs);
    /* a stack's parent chain: ids[10 j]'s second frame is this node */
    assert_int_equal(_ta_depot_depth(id), 1 + SHARED);
  }
  assert_int_equal(_ta_depot_nodes(), made);
  assert_int_equal(_ta_depot_count() - stacks, 110);
  /* again, all of them: the same ids, nothing new */
  for (size_t k = 0; k < 100; k++) {
    size_t n = prefix_stack(base, k, pcs);
    assert_int_equal(_ta_depot_put(pcs, n), ids[k]);
  }
  assert_int_equal(_ta_depot_nodes(), made);
  assert_int_equal(_ta_depot_count() - stacks, 110);
}

/* A stack of 8 frames, then the same with one frame changed (each of the
 * 8 in turn), and its outer parts: 1 + 8 + 7 stacks, all apart; the same
 * frames again give the same ids. */
static void test_same_and_different(void **state) {
  (void)state;
  const uintptr_t base = 0x5200000000ull;
  uintptr_t pcs[8], got[9];
  uint32_t ids[16];
  size_t k = 0;
  for (int round = 0; round < 2; round++) {
    k = 0;
    for (size_t i = 0; i < 8; i++) pcs[i] = base + 16 * i;
    uint32_t whole = _ta_depot_put(pcs, 8);
    for (size_t i = 0; i < 8; i++) {
      pcs[i] ^= 0x8000;                          /* frame i differs */
      uint32_t id = _ta_depot_put(pcs, 8);
      if (round == 0) ids[k] = id;
      else assert_int_equal(id, ids[k]);
      k++;
      assert_int_equal(_ta_depot_get(id, got, 9), 8);
      assert_memory_equal(got, pcs, sizeof pcs);
      pcs[i] ^= 0x8000;
    }
    for (size_t drop = 1; drop < 8; drop++) {    /* the outer 8 - drop frames */
      uint32_t id = _ta_depot_put(pcs + drop, 8 - drop);
      if (round == 0) ids[k] = id;
      else assert_int_equal(id, ids[k]);
      k++;
      assert_int_equal(_ta_depot_get(id, got, 9), 8 - drop);
      assert_memory_equal(got, pcs + drop, (8 - drop) * sizeof *pcs);
    }
    if (round == 0) ids[k] = whole;
    else assert_int_equal(whole, ids[k]);
    k++;
  }
  assert_int_equal(k, 16);
  for (size_t i = 0; i < k; i++) {
    assert_true(ids[i] != 0);
    for (size_t j = 0; j < i; j++) assert_true(ids[i] != ids[j]);
  }
}

/* Two return addresses whose nodes under the same parent have one path
 * hash: the same home slot and the same tag.  Found by sorting the hashes
 * of 2^18 made-up addresses (about eight such pairs are expected among
 * them; the hash is fixed, so the pair is the same every run). */
typedef struct { uint32_t h; uintptr_t pc; } hashed;

static int cmp_hashed(const void *a, const void *b) {
  const hashed *x = a, *y = b;
  return x->h < y->h ? -1 : x->h > y->h;
}

static void test_same_path_hash(void **state) {
  (void)state;
  const size_t N = (size_t)1 << 18;
  hashed *v = malloc(N * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < N; i++) {
    v[i].pc = 0x5300000000ull + 16 * i;
    v[i].h = _ta_depot_path_hash(0, v[i].pc);
  }
  qsort(v, N, sizeof *v, cmp_hashed);
  size_t i = 1;
  while (i < N && v[i].h != v[i - 1].h) i++;
  assert_true(i < N);
  uintptr_t p = v[i - 1].pc, q = v[i].pc;
  free(v);
  assert_true(p != q);
  assert_int_equal(_ta_depot_path_hash(0, p), _ta_depot_path_hash(0, q));
  /* outermost frames (parent 0), then each under one shared inner frame */
  size_t nodes = _ta_depot_nodes();
  uint32_t ip = _ta_depot_put(&p, 1), iq = _ta_depot_put(&q, 1);
  assert_true(ip != 0 && iq != 0 && ip != iq);
  assert_int_equal(_ta_depot_nodes() - nodes, 2);
  uintptr_t got[2];
  assert_int_equal(_ta_depot_get(iq, got, 2), 1);
  assert_true(got[0] == q);
  assert_int_equal(_ta_depot_put(&p, 1), ip);
  assert_int_equal(_ta_depot_put(&q, 1), iq);
  assert_int_equal(_ta_depot_put(&p, 1), ip);
  uintptr_t sp[2] = { 0x5400000000ull, p }, sq[2] = { 0x5400000000ull, q };
  uint32_t jp = _ta_depot_put(sp, 2), jq = _ta_depot_put(sq, 2);
  assert_true(jp != jq);
  assert_int_equal(_ta_depot_get(jp, got, 2), 2);
  assert_memory_equal(got, sp, sizeof sp);
  assert_int_equal(_ta_depot_get(jq, got, 2), 2);
  assert_memory_equal(got, sq, sizeof sq);
  assert_int_equal(_ta_depot_nodes() - nodes, 4);
}

/* The index's sizes: 2^12 slots doubling to 2^18 (FINE), then 3 * 2^(k-1)
 * and 2^k in turn, each 3/2 or 4/3 of the one before. */
#define FINE ((size_t)1 << 18)

static size_t index_slots(void) {
  size_t ib;
  _ta_depot_bytes(&ib);
  assert_int_equal(ib % 4, 0);
  return ib / 4;
}

static bool power_of_two(size_t n) { return (n & (n - 1)) == 0; }

static size_t slots_after(size_t slots) {
  return slots < FINE ? slots * 2 : power_of_two(slots) ? slots / 2 * 3 : slots / 3 * 4;
}

static size_t slots_before(size_t slots) {
  return slots <= FINE ? slots / 2 : power_of_two(slots) ? slots / 4 * 3 : slots / 3 * 2;
}

static void assert_index_size(size_t slots) {
  assert_true(slots >= 4096);
  assert_true(power_of_two(slots) || (slots > FINE && slots % 3 == 0 && power_of_two(slots / 3)));
}

/* 8 bytes a node, 4 an index slot, the index at most 3/4 full and at
 * least 1/2 past its first size: the tree workload's 2.1M nodes are 17 MB
 * of nodes and 12 MB of index.  The index grew from 2^12 slots past 2^16
 * on the way, each time rebuilt from the nodes: every stack is found
 * again. */
static void test_bytes(void **state) {
  (void)state;
  const uintptr_t base = 0x5500000000ull;
  uintptr_t pcs[2], got[3];
  size_t nodes0 = _ta_depot_nodes();
  uint32_t first = 0, last = 0;
  for (size_t k = 0; k < 60000; k++) {          /* 60,000 + 600 nodes more */
    pcs[0] = base + 16 * k;
    pcs[1] = base + 0x10000000 + 16 * (k / 100);
    last = _ta_depot_put(pcs, 2);
    assert_true(last != 0);
    if (k == 0) first = last;
  }
  size_t ib, nb = _ta_depot_bytes(&ib), nodes = _ta_depot_nodes();
  assert_int_equal(nodes - nodes0, 60600);
  assert_int_equal(nb, 8 * nodes);
  size_t slots = index_slots();
  assert_int_equal(ib, 4 * slots);
  assert_index_size(slots);
  assert_true(nodes * 4 <= slots * 3);
  assert_true(nodes * 4 > slots_before(slots) * 3);   /* it grew only when 3/4 full */
  /* the same stacks again, in another order: the same ids, no node */
  for (size_t k = 60000; k-- > 0;) {
    pcs[0] = base + 16 * k;
    pcs[1] = base + 0x10000000 + 16 * (k / 100);
    uint32_t id = _ta_depot_put(pcs, 2);
    if (k == 0) assert_int_equal(id, first);
    if (k == 59999) assert_int_equal(id, last);
    assert_int_equal(_ta_depot_get(id, got, 3), 2);
    assert_memory_equal(got, pcs, sizeof pcs);
  }
  assert_int_equal(_ta_depot_nodes(), nodes);
}

/* The index through its growths, one node a put: each growth comes at
 * the put that makes it more than 3/4 full and takes it to twice its size
 * below FINE, and from there to 3/2 or 4/3 of it, in turn, up to 2^19
 * slots; when it is as full as it gets and again after each growth,
 * every stack put so far is found again (the same id, no node made) and
 * reads back its frames: the homes of a size that is no power of two
 * come from the hashes' high bits, and the ids (up to 3/4 of the size)
 * fit the slots beside the hashes' low bits. */

static void assert_found_again(uintptr_t base, uintptr_t outer, const uint32_t *ids, size_t k) {
  size_t nodes = _ta_depot_nodes();
  uintptr_t pcs[2] = { 0, outer }, got[3];
  for (size_t j = 0; j < k; j++) {
    pcs[0] = base + 16 * j;
    assert_int_equal(_ta_depot_put(pcs, 2), ids[j]);
    assert_int_equal(_ta_depot_get(ids[j], got, 3), 2);
    assert_memory_equal(got, pcs, sizeof pcs);
  }
  assert_int_equal(_ta_depot_nodes(), nodes);
}

static void test_growth_steps(void **state) {
  (void)state;
  const uintptr_t base = 0x5b00000000ull, outer = 0x5bf0000000ull;
  enum { MAX = 1 << 20 };
  uint32_t *ids = malloc(MAX * sizeof *ids);
  assert_non_null(ids);
  uintptr_t pcs[2] = { 0, outer };
  assert_true(_ta_depot_put(&outer, 1) != 0);
  size_t slots = index_slots(), k = 0, odd = 0;
  assert_true(slots < FINE);
  while (slots < 2 * FINE) {
    assert_true(k < MAX);
    size_t nodes = _ta_depot_nodes();
    pcs[0] = base + 16 * k;
    ids[k] = _ta_depot_put(pcs, 2);
    assert_true(ids[k] != 0);
    assert_int_equal(_ta_depot_nodes(), nodes + 1);
    k++;
    size_t now = index_slots();
    if (now == slots) {
      assert_true((nodes + 1) * 4 <= slots * 3);
      if ((nodes + 2) * 4 > slots * 3) assert_found_again(base, outer, ids, k);   /* full */
      continue;
    }
    /* grown at the node that would fill it past 3/4, by 3/2 or 4/3 */
    assert_true(nodes * 4 <= slots * 3);
    assert_true((nodes + 1) * 4 > slots * 3);
    assert_int_equal(now, slots_after(slots));
    assert_index_size(now);
    odd += !power_of_two(now);
    slots = now;
    assert_found_again(base, outer, ids, k);
  }
  assert_int_equal(slots, 2 * FINE);
  assert_int_equal(odd, 1);                     /* 3 * 2^17 on the way */
  free(ids);
}

/* Outermost frames whose homes are the index's last slot: the second and
 * later of them are put past it, in the slots from the first on, and each
 * is found there again. */
static void test_probe_wraps(void **state) {
  (void)state;
  enum { N = 4 };
  size_t slots = index_slots();
  assert_true((_ta_depot_nodes() + N) * 4 <= slots * 3);   /* no growth meanwhile */
  uintptr_t pcs[N], got[2];
  uint32_t ids[N];
  size_t n = 0;
  for (uintptr_t pc = 0x5c00000000ull; n < N; pc += 16) {
    uint32_t h = _ta_depot_path_hash(0, pc);
    if ((uint32_t)(((uint64_t)h * slots) >> 32) == slots - 1) pcs[n++] = pc;
  }
  size_t nodes = _ta_depot_nodes();
  for (size_t i = 0; i < N; i++) {
    ids[i] = _ta_depot_put(&pcs[i], 1);
    assert_true(ids[i] != 0);
  }
  assert_int_equal(_ta_depot_nodes() - nodes, N);
  assert_int_equal(index_slots(), slots);
  for (size_t r = 0; r < 2; r++)
    for (size_t i = N; i-- > 0;) {
      assert_int_equal(_ta_depot_put(&pcs[i], 1), ids[i]);
      assert_int_equal(_ta_depot_get(ids[i], got, 2), 1);
      assert_true(got[0] == pcs[i]);
    }
  assert_int_equal(_ta_depot_nodes() - nodes, N);
}

/* Nodes name their return addresses by number: stacks of a binary tree
 * built recursively (2^12 stacks of 12 frames below a shared outer frame,
 * each frame one of two call sites) are 2^13 - 1 nodes over 3 addresses,
 * each address stored once, and read back whole. */
static void test_few_addresses(void **state) {
  (void)state;
  const uintptr_t outer = 0x5a00000000ull, site[2] = { 0x5a00000100ull, 0x5a00000200ull };
  enum { DEPTH = 12 };
  uintptr_t pcs[DEPTH + 1], got[DEPTH + 2];
  size_t nodes = _ta_depot_nodes(), addrs = _ta_depot_addrs();
  pcs[DEPTH] = outer;
  for (int round = 0; round < 2; round++) {
    for (uint32_t k = 0; k < 1u << DEPTH; k++) {
      for (int f = 0; f < DEPTH; f++) pcs[f] = site[k >> f & 1];   /* innermost first */
      uint32_t id = _ta_depot_put(pcs, DEPTH + 1);
      assert_true(id != 0);
      assert_int_equal(_ta_depot_get(id, got, DEPTH + 2), DEPTH + 1);
      assert_memory_equal(got, pcs, sizeof pcs);
    }
    assert_int_equal(_ta_depot_nodes() - nodes, (1u << (DEPTH + 1)) - 1);
    assert_int_equal(_ta_depot_addrs() - addrs, 3);
  }
}

/* The thread's memo of whole stacks is used while it answers: stacks that
 * never repeat turn it off but for one put in 16, and a stack that repeats
 * turns it on again. */
static void test_memo_credit(void **state) {
  (void)state;
  const uintptr_t base = 0x5600000000ull;
  uintptr_t pcs[4] = { 0, base + 0x100, base + 0x200, base + 0x300 };
  assert_non_null(_ta_thread());
  size_t k = 0;
  for (; k < 300; k++) {                        /* no credit left after these */
    pcs[0] = base + 0x1000 + 16 * k;
    assert_true(_ta_depot_put(pcs, 4) != 0);
  }
  uint64_t s0 = _ta_depot_memo_skipped();
  for (; k < 460; k++) {                        /* 160 puts: 10 of them try the memo */
    pcs[0] = base + 0x1000 + 16 * k;
    assert_true(_ta_depot_put(pcs, 4) != 0);
  }
  assert_int_equal(_ta_depot_memo_skipped() - s0, 150);
  pcs[0] = base + 0x50;
  uint32_t id = _ta_depot_put(pcs, 4);
  for (int i = 0; i < 32; i++) assert_int_equal(_ta_depot_put(pcs, 4), id);
  uint64_t s1 = _ta_depot_memo_skipped();
  for (int i = 0; i < 100; i++) assert_int_equal(_ta_depot_put(pcs, 4), id);
  assert_int_equal(_ta_depot_memo_skipped(), s1);
}

/* A stack whose outer frames are known and whose inner ones are new: one
 * lookup finds its first new frame missing and makes it, and the frames
 * inside it are made without one (none can be in the index, their parent
 * was made a moment ago), each once, and read back. */
static void test_new_frames_made(void **state) {
  (void)state;
  const uintptr_t base = 0x5700000000ull;
  uintptr_t pcs[12], got[13];
  for (size_t f = 0; f < 12; f++) pcs[f] = base + 0x1000 * f;   /* innermost first */
  assert_non_null(_ta_thread());
  uint32_t outer = _ta_depot_put(pcs + 8, 4);
  assert_true(outer != 0);
  size_t nodes = _ta_depot_nodes(), stacks = _ta_depot_count();
  uint64_t looked = _ta_depot_lookups();
  uint32_t id = _ta_depot_put(pcs, 12);
  assert_true(id != 0);
  assert_int_equal(_ta_depot_lookups() - looked, 1);
  assert_int_equal(_ta_depot_nodes() - nodes, 8);
  assert_int_equal(_ta_depot_count() - stacks, 1);
  assert_int_equal(_ta_depot_get(id, got, 13), 12);
  assert_memory_equal(got, pcs, sizeof pcs);
  assert_int_equal(_ta_depot_put(pcs, 12), id);
  assert_int_equal(_ta_depot_put(pcs + 8, 4), outer);
  uint32_t mid = _ta_depot_put(pcs + 3, 9);      /* a made node named whole later */
  assert_int_equal(_ta_depot_get(mid, got, 13), 9);
  assert_memory_equal(got, pcs + 3, 9 * sizeof *pcs);
  assert_int_equal(_ta_depot_nodes() - nodes, 8);
  assert_int_equal(_ta_depot_count() - stacks, 2);
}

/* Threads putting the same new stacks at once make each node once: the
 * lock stays held from a stack's first new frame to its innermost. */
#define RACE_THREADS 4
#define RACE_STACKS 400
#define RACE_DEPTH 8

static pthread_barrier_t race_start;

static void race_stack(size_t k, uintptr_t *pcs) {
  for (size_t f = 0; f < RACE_DEPTH; f++) pcs[f] = 0x5800000000ull + 0x100000 * (k % 7) + 0x1000 * k + f;
}

static void *race_put(void *arg) {
  uint32_t *ids = arg;
  uintptr_t pcs[RACE_DEPTH];
  pthread_barrier_wait(&race_start);
  for (size_t k = 0; k < RACE_STACKS; k++) {
    race_stack(k, pcs);
    ids[k] = _ta_depot_put(pcs, RACE_DEPTH);
  }
  return NULL;
}

static void test_new_frames_threads(void **state) {
  (void)state;
  static uint32_t ids[RACE_THREADS][RACE_STACKS];
  pthread_t th[RACE_THREADS];
  size_t nodes = _ta_depot_nodes(), stacks = _ta_depot_count();
  pthread_barrier_init(&race_start, NULL, RACE_THREADS);
  for (int i = 0; i < RACE_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, race_put, ids[i]), 0);
  for (int i = 0; i < RACE_THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&race_start);
  assert_int_equal(_ta_depot_nodes() - nodes, RACE_STACKS * RACE_DEPTH);
  assert_int_equal(_ta_depot_count() - stacks, RACE_STACKS);
  uintptr_t pcs[RACE_DEPTH], got[RACE_DEPTH + 1];
  for (size_t k = 0; k < RACE_STACKS; k++) {
    for (int i = 1; i < RACE_THREADS; i++) assert_int_equal(ids[i][k], ids[0][k]);
    race_stack(k, pcs);
    assert_int_equal(_ta_depot_get(ids[0][k], got, RACE_DEPTH + 1), RACE_DEPTH);
    assert_memory_equal(got, pcs, sizeof pcs);
  }
}

int main(void) {
  setenv("TAGALLOC_REPORT", "0", 1);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prefixes_shared),
    cmocka_unit_test(test_same_and_different),
    cmocka_unit_test(test_same_path_hash),
    cmocka_unit_test(test_growth_steps),
    cmocka_unit_test(test_bytes),
    cmocka_unit_test(test_probe_wraps),
    cmocka_unit_test(test_few_addresses),
    cmocka_unit_test(test_memo_credit),
    cmocka_unit_test(test_new_frames_made),
    cmocka_unit_test(test_new_frames_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
