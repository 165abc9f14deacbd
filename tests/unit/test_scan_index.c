/* test_scan_index.c - the scan's block index (alloc/scan_index.h) answers
 * "which block holds this address" exactly as a search of every block does:
 * at the edges of its 1 MiB regions and 16 KiB pieces (a block that starts
 * 16 bytes before a region and ends 16 bytes into it, one that fills a
 * region exactly), one past the end of a block (no block, unless the next
 * starts there), a block of size 0 (one byte), a block spanning ten regions;
 * and for thousands of random blocks and probes.  Blocks that overlap, an end
 * that wraps around, or blocks spanning more regions than the table takes
 * leave no table, and the answer is still the binary search's.  And the
 * radix sort sorts as qsort does, stable. */
#include "harness.h"
#include "internal.h"
#include "scan_index.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((uintptr_t)1 << 20)
#define PIECE ((uintptr_t)1 << TA_BX_PIECE_SHIFT)

/* Builds an index of n blocks {addr, size}, sorted by the caller. */
static void make(ta_bindex *x, const uintptr_t *addr, const uintptr_t *size, size_t n) {
  assert_true(_ta_bindex_init(x, n, NULL));
  for (size_t i = 0; i < n; i++) {
    x->addr[i] = addr[i];
    x->end[i] = addr[i] + (size[i] ? size[i] : 1);
  }
}

/* The block holding p by looking at each one. */
static long brute(const ta_bindex *x, uintptr_t p) {
  for (size_t i = 0; i < x->n; i++)
    if (p >= x->addr[i] && p < x->end[i]) return (long)i;
  return -1;
}

/* p and its neighbours, against the brute answer. */
static void probe(const ta_bindex *x, uintptr_t p) {
  for (int d = -2; d <= 2; d++) {
    uintptr_t q = p + (uintptr_t)(intptr_t)d;
    long want = brute(x, q), got = _ta_bindex_find(x, q);
    if (want != got) fail_msg("address %#lx: block %ld, want %ld", (unsigned long)q, got, want);
  }
}

/* Every edge of every block, region and piece near them. */
static void probe_edges(const ta_bindex *x) {
  for (size_t i = 0; i < x->n; i++) {
    uintptr_t a = x->addr[i], e = x->end[i];
    probe(x, a);
    probe(x, e);
    probe(x, a + (e - a) / 2);
    probe(x, a & ~(MIB - 1));
    probe(x, (a | (MIB - 1)) + 1);
    probe(x, (e - 1) & ~(MIB - 1));
    probe(x, a & ~(PIECE - 1));
    probe(x, (a | (PIECE - 1)) + 1);
    probe(x, (e - 1) & ~(PIECE - 1));
    probe(x, ((e - 1) | (PIECE - 1)) + 1);
  }
  probe(x, 0);
  probe(x, 8);
  probe(x, UINTPTR_MAX - 2);
}

static void test_region_edges(void **state) {
  (void)state;
  uintptr_t R = (uintptr_t)0x7f1234500000;             /* a region start */
  uintptr_t addr[] = { R - 16, R + 100, R + 200,  R + MIB, R + 2 * MIB + 5 * PIECE, R + 3 * MIB - 8, R + 4 * MIB - 8,
                       R + 5 * MIB };
  uintptr_t size[] = { 32,     100,     0,        MIB,     PIECE,                   24,               9,
                       10 * MIB + 3 };
  size_t n = sizeof addr / sizeof *addr;
  ta_bindex x;
  make(&x, addr, size, n);
  assert_true(_ta_bindex_build(&x));
  assert_non_null(x.slots);

  /* the one that straddles the region start */
  assert_int_equal(_ta_bindex_find(&x, R - 16), 0);
  assert_int_equal(_ta_bindex_find(&x, R - 1), 0);
  assert_int_equal(_ta_bindex_find(&x, R), 0);
  assert_int_equal(_ta_bindex_find(&x, R + 15), 0);
  assert_int_equal(_ta_bindex_find(&x, R + 16), -1);     /* one past the end */
  assert_int_equal(_ta_bindex_find(&x, R - 17), -1);
  /* adjacent: one past the end of block 1 is the start of block 2 (size 0: one byte) */
  assert_int_equal(_ta_bindex_find(&x, R + 199), 1);
  assert_int_equal(_ta_bindex_find(&x, R + 200), 2);
  assert_int_equal(_ta_bindex_find(&x, R + 201), -1);
  /* a block that is exactly one region */
  assert_int_equal(_ta_bindex_find(&x, R + MIB - 1), -1);
  assert_int_equal(_ta_bindex_find(&x, R + MIB), 3);
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB - 1), 3);
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB), -1);
  /* a block that is exactly one piece */
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB + 5 * PIECE - 1), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB + 5 * PIECE), 4);
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB + 6 * PIECE - 1), 4);
  assert_int_equal(_ta_bindex_find(&x, R + 2 * MIB + 6 * PIECE), -1);
  /* across the next region start, from its last 8 bytes */
  assert_int_equal(_ta_bindex_find(&x, R + 3 * MIB + 15), 5);
  assert_int_equal(_ta_bindex_find(&x, R + 3 * MIB + 16), -1);
  /* its last byte alone in the next region */
  assert_int_equal(_ta_bindex_find(&x, R + 4 * MIB - 9), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 4 * MIB - 8), 6);
  assert_int_equal(_ta_bindex_find(&x, R + 4 * MIB), 6);
  assert_int_equal(_ta_bindex_find(&x, R + 4 * MIB + 1), -1);
  /* over ten regions and a bit */
  for (uintptr_t p = R + 5 * MIB; p < R + 15 * MIB; p += MIB / 4) assert_int_equal(_ta_bindex_find(&x, p), 7);
  assert_int_equal(_ta_bindex_find(&x, R + 15 * MIB + 2), 7);
  assert_int_equal(_ta_bindex_find(&x, R + 15 * MIB + 3), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 16 * MIB), -1);
  /* far away, and small integers */
  assert_int_equal(_ta_bindex_find(&x, 0), -1);
  assert_int_equal(_ta_bindex_find(&x, 42), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 64 * MIB), -1);
  probe_edges(&x);
  _ta_bindex_free(&x);

  /* last bytes alone in the next piece, and first bytes alone in the piece before */
  uintptr_t a2[] = { R + 7 * PIECE - 8, R + 9 * PIECE - 1 }, s2[] = { 9, 2 };
  make(&x, a2, s2, 2);
  assert_true(_ta_bindex_build(&x));
  assert_int_equal(_ta_bindex_find(&x, R + 7 * PIECE), 0);
  assert_int_equal(_ta_bindex_find(&x, R + 7 * PIECE + 1), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 9 * PIECE - 2), -1);
  assert_int_equal(_ta_bindex_find(&x, R + 9 * PIECE - 1), 1);
  assert_int_equal(_ta_bindex_find(&x, R + 9 * PIECE), 1);
  assert_int_equal(_ta_bindex_find(&x, R + 9 * PIECE + 1), -1);
  probe_edges(&x);
  _ta_bindex_free(&x);
}

static void test_no_table(void **state) {
  (void)state;
  ta_bindex x;
  /* overlapping blocks: the binary search over all of them, as before */
  uintptr_t a1[] = { 0x100000, 0x100010, 0x300000 }, s1[] = { 64, 8, 16 };
  make(&x, a1, s1, 3);
  assert_false(_ta_bindex_build(&x));
  assert_null(x.slots);
  assert_int_equal(_ta_bindex_find(&x, 0x300000), 2);
  assert_int_equal(_ta_bindex_find(&x, 0x100000), 0);
  assert_int_equal(_ta_bindex_find(&x, 0x400000), -1);
  _ta_bindex_free(&x);
  /* an end that wraps around */
  uintptr_t a2[] = { 0x100000, UINTPTR_MAX - 15 }, s2[] = { 16, 32 };
  make(&x, a2, s2, 2);
  assert_false(_ta_bindex_build(&x));
  assert_int_equal(_ta_bindex_find(&x, 0x100008), 0);
  _ta_bindex_free(&x);
  /* more regions than the table takes (addresses only: nothing is read) */
  uintptr_t a3[] = { 0x10000000, 0x20000000000 }, s3[] = { 16, (TA_BX_MAX_REGIONS + 1) << TA_BX_REGION_SHIFT };
  make(&x, a3, s3, 2);
  assert_false(_ta_bindex_build(&x));
  assert_int_equal(_ta_bindex_find(&x, 0x20000000000 + (TA_BX_MAX_REGIONS << TA_BX_REGION_SHIFT)), 1);
  assert_int_equal(_ta_bindex_find(&x, 0x10000010), -1);
  _ta_bindex_free(&x);
  /* just as many as it takes */
  s3[1] = (TA_BX_MAX_REGIONS - 1) << TA_BX_REGION_SHIFT;
  make(&x, a3, s3, 2);
  assert_true(_ta_bindex_build(&x));
  assert_int_equal(x.nregions, TA_BX_MAX_REGIONS);
  assert_int_equal(_ta_bindex_find(&x, 0x20000000000 + s3[1] - 1), 1);
  assert_int_equal(_ta_bindex_find(&x, 0x20000000000 + s3[1]), -1);
  _ta_bindex_free(&x);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_random(void **state) {
  (void)state;
  enum { N = 600 };
  static uintptr_t addr[N], size[N];
  for (int round = 0; round < 4; round++) {
    uintptr_t p = (uintptr_t)0x7f0000000000 + (rnd() & 0xffff0);
    for (size_t i = 0; i < N; i++) {
      uint64_t r = rnd();
      switch (r % 8) {                       /* gaps: none, small, pieces, regions */
        case 0: break;
        case 1: case 2: case 3: p += (r >> 8) % 256 * 16; break;
        case 4: case 5: p += (r >> 8) % 64 * PIECE + ((r >> 20) % 2) * 16; break;
        case 6: p += ((r >> 8) % 8 + 1) * MIB - 16 * (r >> 16 & 1); break;
        default: p += (r >> 8) % 1000 * MIB; break;
      }
      uint64_t s = rnd();
      switch (s % 10) {                      /* sizes: 0, small, around a piece, big */
        case 0: size[i] = 0; break;
        case 1: case 2: case 3: case 4: size[i] = (s >> 8) % 512 + 1; break;
        case 5: case 6: size[i] = PIECE + (s >> 8) % 64 - 32; break;
        case 7: size[i] = (s >> 8) % (4 * MIB) + 1; break;
        case 8: size[i] = MIB; break;
        default: size[i] = (s >> 8) % (40 * MIB) + 1; break;
      }
      addr[i] = p;
      p += size[i] ? size[i] : 1;
    }
    ta_bindex x;
    make(&x, addr, size, N);
    assert_true(_ta_bindex_build(&x));
    probe_edges(&x);
    for (int k = 0; k < 5000; k++) {          /* anywhere between the first and the last */
      uintptr_t lo = addr[0] - MIB, span = x.end[N - 1] + MIB - lo;
      probe(&x, lo + rnd() % span);
    }
    _ta_bindex_free(&x);
  }
}

typedef struct { uintptr_t key; uint32_t seq; uint32_t pad[5]; } elem;

static int by_key_seq(const void *a, const void *b) {
  const elem *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void test_sort(void **state) {
  (void)state;
  enum { N = 5000 };
  static elem v[N], w[N], tmp[N];
  uintptr_t masks[] = { ~(uintptr_t)0, 0xfff0, (uintptr_t)0xff << 40 | 0xf0, 0 };
  for (size_t m = 0; m < sizeof masks / sizeof *masks; m++) {
    for (uint32_t i = 0; i < N; i++) {
      v[i] = (elem){ .key = (rnd() & masks[m]) | (uintptr_t)0x7f0000000000 * (m == 2), .seq = i };
      for (int j = 0; j < 5; j++) v[i].pad[j] = i * 7 + j;
    }
    memcpy(w, v, sizeof v);
    _ta_sort_by_key(v, N, sizeof(elem), tmp);
    qsort(w, N, sizeof(elem), by_key_seq);   /* keys, then the order they came in */
    assert_memory_equal(v, w, sizeof v);
  }
  _ta_sort_by_key(v, 1, sizeof(elem), tmp);
  _ta_sort_by_key(v, 0, sizeof(elem), tmp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_region_edges),
    cmocka_unit_test(test_no_table),
    cmocka_unit_test(test_random),
    cmocka_unit_test(test_sort),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
