/* depot.c - the stack depot: each distinct stack is stored once and named by
 * a 32-bit id.
 *
 *   index (mmap, open addressing)            region (mmap'd 64 MiB chunks)
 *   +-----------+                            +------------------------------+
 *   | hash | id-+--------------------------->| node: n|state|pcs[n]         |
 *   +-----------+                            | node ...                     |
 *
 * A node's id is its byte offset in the region divided by 8, so id -> node is
 * one shift and two loads.  The index maps a stack's hash to its id: 64-bit
 * slots (hash << 32 | id, 0 = empty), linear probing, at most three
 * quarters full, so a lookup reads a cache line or two of slots (the hash
 * is in the slot) and the one node it names.  It starts at 2^12 slots
 * (32 KiB) and doubles when three quarters full, so its size
 * follows the stacks the program has (a fixed 2^22-bucket array was 16 MiB
 * touched at random: every lookup missed the cache and the TLB, 11% of
 * cc1's time under the auditor).
 *
 * Lookups take no lock.  Inserts take one mutex (a new stack is rare next
 * to lookups): look again, write the node, publish its slot with a release
 * store; growing builds the bigger index, publishes it, and gives the old
 * one's pages back (MADV_DONTNEED): a reader still on it then reads zeros,
 * a miss, and goes to the locked path, which sees the new one.  The depot
 * never allocates from the audited heap.  A node that would straddle two
 * chunks leaves a "skip" marker and is placed at the next chunk.  Nodes are
 * never removed; the trace writer walks them in region order to write each
 * stack once (_ta_depot_each_since). */
#include "internal.h"

#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#define CHUNK_SHIFT 26                       /* 64 MiB */
#define CHUNK_SIZE  ((uint64_t)1 << CHUNK_SHIFT)
#define MAX_CHUNKS  512                      /* 32 GiB: ids fit 32 bits */
#define INDEX_FIRST_BITS 12

enum { NODE_EMPTY = 0, NODE_READY = 1, NODE_SKIP = 2 };

typedef struct {                             /* 8 bytes, then the frames */
  uint16_t n;
  _Atomic uint16_t state;
  uintptr_t pcs[];
} node;

typedef struct {
  uint64_t mask;                             /* slots - 1 */
  uint64_t size;                             /* bytes mapped */
  _Atomic uint64_t slots[];
} stack_index;

static stack_index *_Atomic index_now;
static uint64_t index_entries;               /* under put_lock */
static pthread_mutex_t put_lock = PTHREAD_MUTEX_INITIALIZER;
static char *_Atomic chunks[MAX_CHUNKS];
static _Atomic uint64_t used = 8;            /* offset 0 is never an id */
static _Atomic uint64_t count;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

/* Big regions, touched at random (buckets) or written once in order
 * (chunks).  Transparent huge pages cut the page faults and TLB misses of a
 * depot with millions of stacks, but a huge page is 2 MiB to zero on its
 * first touch: the buckets alone were 16 MiB of RSS and most of a
 * millisecond in every short process (a shell's echo).  So small pages
 * first, huge pages from HUGE_AFTER stacks on (madvise then covers what is
 * touched from there). */
#define HUGE_AFTER (1u << 16)
static _Atomic bool huge;

static void *map(size_t size) {
  void *p = _ta_sys_mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (atomic_load_explicit(&huge, memory_order_relaxed)) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

static void go_huge(void) {
  pthread_mutex_lock(&init_lock);
  if (!atomic_load(&huge)) {
    atomic_store(&huge, true);
    stack_index *ix = atomic_load(&index_now);
    if (ix) madvise(ix, ix->size, MADV_HUGEPAGE);
    for (size_t i = 0; i < MAX_CHUNKS; i++) {
      char *c = atomic_load(&chunks[i]);
      if (c) madvise(c, CHUNK_SIZE, MADV_HUGEPAGE);
    }
  }
  pthread_mutex_unlock(&init_lock);
}

static char *chunk_get(size_t i) {
  char *c = atomic_load_explicit(&chunks[i], memory_order_acquire);
  if (TA_LIKELY(c != NULL)) return c;
  pthread_mutex_lock(&init_lock);
  c = atomic_load(&chunks[i]);
  if (c == NULL) {
    c = map(CHUNK_SIZE);
    atomic_store_explicit(&chunks[i], c, memory_order_release);
  }
  pthread_mutex_unlock(&init_lock);
  return c;
}

static inline node *node_at(uint64_t off) {
  char *c = atomic_load_explicit(&chunks[off >> CHUNK_SHIFT], memory_order_acquire);
  return c ? (node *)(c + (off & (CHUNK_SIZE - 1))) : NULL;
}

/* Four independent lanes, so the multiplies overlap instead of forming one
 * chain through every frame; mixed at the end. */
static inline uint32_t hash_pcs(const uintptr_t *pcs, size_t n) {
  uint64_t h0 = 0x9E3779B97F4A7C15ull ^ n, h1 = 0xC2B2AE3D27D4EB4Full, h2 = 0x165667B19E3779F9ull,
           h3 = 0x27D4EB2F165667C5ull;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    h0 = (h0 ^ pcs[i]) * 0xff51afd7ed558ccdull;
    h1 = (h1 ^ pcs[i + 1]) * 0xc4ceb9fe1a85ec53ull;
    h2 = (h2 ^ pcs[i + 2]) * 0xff51afd7ed558ccdull;
    h3 = (h3 ^ pcs[i + 3]) * 0xc4ceb9fe1a85ec53ull;
  }
  for (; i < n; i++) h0 = (h0 ^ pcs[i]) * 0xff51afd7ed558ccdull;
  uint64_t h = h0 ^ (h1 >> 7 | h1 << 57) ^ (h2 >> 19 | h2 << 45) ^ (h3 >> 31 | h3 << 33);
  h ^= h >> 32;
  h *= 0xff51afd7ed558ccdull;
  return (uint32_t)(h ^ (h >> 29));
}

/* The id of the stack pcs[0..n) with hash h in ix, or 0. */
static uint32_t index_find(const stack_index *ix, uint32_t h, const uintptr_t *pcs, size_t n) {
  if (ix == NULL) return 0;
  uint64_t mask = ix->mask;
  for (uint64_t i = h & mask, probes = 0; probes <= mask; i = (i + 1) & mask, probes++) {
    uint64_t v = atomic_load_explicit(&ix->slots[i], memory_order_acquire);
    if (v == 0) return 0;
    if ((uint32_t)(v >> 32) != h) continue;
    node *nd = node_at((v & 0xffffffffu) << 3);
    if (nd && nd->n == n && memcmp(nd->pcs, pcs, n * sizeof *pcs) == 0) return (uint32_t)v;
  }
  return 0;
}

/* Puts slot value v into ix (not there yet); false when ix is full. */
static bool index_add(stack_index *ix, uint64_t v) {
  uint64_t mask = ix->mask;
  for (uint64_t i = (v >> 32) & mask, probes = 0; probes <= mask; i = (i + 1) & mask, probes++) {
    if (atomic_load_explicit(&ix->slots[i], memory_order_relaxed) == 0) {
      atomic_store_explicit(&ix->slots[i], v, memory_order_release);
      return true;
    }
  }
  return false;
}

static stack_index *index_new(int bits) {
  uint64_t size = sizeof(stack_index) + (sizeof(uint64_t) << bits);
  stack_index *ix = map(size);
  if (ix == NULL) return NULL;
  ix->mask = ((uint64_t)1 << bits) - 1;
  ix->size = size;
  return ix;
}

/* Room for one more entry: a new index twice the size once this one is
 * three quarters full (under put_lock).  Keeps the old one when no memory is left: it
 * still works, with longer probes, until it is full. */
static stack_index *index_room(stack_index *ix) {
  if (ix == NULL) {
    ix = index_new(INDEX_FIRST_BITS);
    if (ix) atomic_store_explicit(&index_now, ix, memory_order_release);
    return ix;
  }
  if ((index_entries + 1) * 4 <= (ix->mask + 1) * 3) return ix;
  int bits = 0;
  while (((uint64_t)1 << bits) <= ix->mask) bits++;
  stack_index *big = bits + 1 <= 34 ? index_new(bits + 1) : NULL;
  if (big == NULL) return index_entries < ix->mask ? ix : NULL;
  for (uint64_t i = 0; i <= ix->mask; i++) {
    uint64_t v = atomic_load_explicit(&ix->slots[i], memory_order_relaxed);
    if (v) index_add(big, v);
  }
  atomic_store_explicit(&index_now, big, memory_order_release);
  madvise(ix, ix->size, MADV_DONTNEED);      /* readers still on it read zeros: a miss */
  return big;
}

/* Room for a node of n frames, under put_lock (the only writer of
 * `used`).  A node never straddles two chunks: one that would goes to the
 * start of the next chunk, and the rest of this one is marked skipped
 * (when a header fits; the reader skips a shorter rest by itself).  The
 * chunk exists and the skip mark is written before `used` moves, so a
 * reader never meets space nobody will fill (the trace writer once waited
 * on such a node at every flush once the depot passed 64 MiB). */
static uint64_t take(size_t n) {
  uint64_t size = sizeof(node) + n * sizeof(uintptr_t);
  uint64_t cur = atomic_load_explicit(&used, memory_order_relaxed);
  uint64_t room = CHUNK_SIZE - (cur & (CHUNK_SIZE - 1));
  uint64_t off = room < size ? cur + room : cur;
  if (off + size > (uint64_t)MAX_CHUNKS << CHUNK_SHIFT || !chunk_get(off >> CHUNK_SHIFT)) return 0;
  if (off != cur && room >= sizeof(node) && chunk_get(cur >> CHUNK_SHIFT))
    atomic_store_explicit(&node_at(cur)->state, NODE_SKIP, memory_order_release);
  atomic_store_explicit(&used, off + size, memory_order_release);
  return off;
}

/* Each thread's memo of the stacks it put recently: direct-mapped by hash,
 * each entry a full copy of its frames, compared whole before its id is
 * used, so a hit is exact.  A hit reads only the thread's own memory; the
 * depot's bucket and node are cold whenever the program's own work (a
 * matrix product between two tensor allocations) has pushed them out of
 * the CPU's caches, and they cost about half of a stack's recording in a
 * training loop.  Stacks deeper than MEMO_FRAMES go to the depot. */
#define MEMO_BITS   8
#define MEMO_FRAMES 32

typedef struct {
  uint32_t hash, id, n, pad;
  uintptr_t pcs[MEMO_FRAMES];
} memo_entry;

struct ta_stack_memo { memo_entry e[1u << MEMO_BITS]; };

static inline bool same_pcs(const uintptr_t *a, const uintptr_t *b, size_t n) {
  uintptr_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= a[i] ^ b[i];
  return diff == 0;
}

static uint32_t depot_put(const uintptr_t *pcs, size_t n, uint32_t h, bool may_lock);

uint32_t _ta_depot_put(const uintptr_t *pcs, size_t n) {
  if (n == 0) return 0;
  if (n > TA_MAX_DEPTH) n = TA_MAX_DEPTH;
  uint32_t h = hash_pcs(pcs, n);
  ta_thread *t = _ta_self;
  if (t == NULL) return depot_put(pcs, n, h, true);
  /* A call nested in this one (a signal handler that allocates) may find
   * put_lock held by the frame it interrupted: it only looks up. */
  if (t->stack_memo_busy) return depot_put(pcs, n, h, false);
  t->stack_memo_busy = 1;
  atomic_signal_fence(memory_order_seq_cst);   /* a nested call (a signal) sees busy */
  if (TA_UNLIKELY(t->stack_memo == NULL)) t->stack_memo = _ta_meta_calloc(1, sizeof *t->stack_memo);
  uint32_t id;
  if (TA_LIKELY(t->stack_memo != NULL && n <= MEMO_FRAMES)) {
    memo_entry *e = &t->stack_memo->e[h & ((1u << MEMO_BITS) - 1)];
    if (e->hash == h && e->n == n && same_pcs(e->pcs, pcs, n)) {
      id = e->id;
    } else {
      id = depot_put(pcs, n, h, true);
      e->n = 0;                          /* no entry while it is written */
      memcpy(e->pcs, pcs, n * sizeof *pcs);
      e->hash = h;
      e->id = id;
      e->n = id ? (uint32_t)n : 0;
    }
  } else {
    id = depot_put(pcs, n, h, true);
  }
  atomic_signal_fence(memory_order_seq_cst);
  t->stack_memo_busy = 0;
  return id;
}

/* put_lock for a thread the ledger does not know (it cannot tell a nested
 * call): a bounded wait, then no stack rather than a deadlock. */
static bool put_lock_take(bool may_lock) {
  if (may_lock && _ta_self != NULL) return pthread_mutex_lock(&put_lock) == 0;
  for (int k = 0; k < 100000; k++) {
    if (pthread_mutex_trylock(&put_lock) == 0) return true;
    if (!may_lock) return false;
    sched_yield();
  }
  return false;
}

static uint32_t depot_put(const uintptr_t *pcs, size_t n, uint32_t h, bool may_lock) {
  uint32_t id = index_find(atomic_load_explicit(&index_now, memory_order_acquire), h, pcs, n);
  if (id != 0 || !put_lock_take(may_lock)) return id;
  stack_index *ix = atomic_load_explicit(&index_now, memory_order_relaxed);
  id = index_find(ix, h, pcs, n);              /* put meanwhile by another thread? */
  if (id == 0 && (ix = index_room(ix)) != NULL) {
    uint64_t off = take(n);
    if (off != 0) {
      node *nd = node_at(off);
      nd->n = (uint16_t)n;
      memcpy(nd->pcs, pcs, n * sizeof *pcs);
      atomic_store_explicit(&nd->state, NODE_READY, memory_order_release);
      id = (uint32_t)(off >> 3);
      index_add(ix, (uint64_t)h << 32 | id);
      index_entries++;
      if (TA_UNLIKELY(atomic_fetch_add_explicit(&count, 1, memory_order_relaxed) + 1 == HUGE_AFTER))
        go_huge();
    }
  }
  pthread_mutex_unlock(&put_lock);
  return id;
}

/* No lock held across fork: the child's depot is consistent. */
void _ta_depot_fork(int phase) {
  if (phase == TA_FORK_PREPARE) {
    pthread_mutex_lock(&put_lock);
    pthread_mutex_lock(&init_lock);
  } else {
    pthread_mutex_unlock(&init_lock);
    pthread_mutex_unlock(&put_lock);
  }
}

size_t _ta_depot_get(uint32_t id, const uintptr_t **pcs) {
  uint64_t off = (uint64_t)id << 3;
  if (id == 0 || off >= atomic_load_explicit(&used, memory_order_acquire)) return 0;
  node *nd = node_at(off);
  if (nd == NULL || atomic_load_explicit(&nd->state, memory_order_acquire) != NODE_READY) return 0;
  *pcs = nd->pcs;
  return nd->n;
}

size_t _ta_depot_count(void) { return atomic_load(&count); }

void _ta_depot_each_since(uint64_t *cursor,
                          void (*fn)(uint32_t id, const uintptr_t *pcs, size_t n, void *arg),
                          void *arg) {
  uint64_t off = *cursor < 8 ? 8 : *cursor;
  uint64_t end = atomic_load_explicit(&used, memory_order_acquire);
  while (off < end) {
    uint64_t in_chunk = CHUNK_SIZE - (off & (CHUNK_SIZE - 1));
    if (in_chunk < sizeof(node)) { off += in_chunk; continue; }
    node *nd = node_at(off);
    if (nd == NULL) break;
    uint16_t st;
    int spins = 0;
    while ((st = atomic_load_explicit(&nd->state, memory_order_acquire)) == NODE_EMPTY) {
      if (++spins > 1000000) { *cursor = off; return; }   /* a writer died mid-insert */
      sched_yield();
    }
    if (st == NODE_SKIP) { off += in_chunk; continue; }
    fn((uint32_t)(off >> 3), nd->pcs, nd->n, arg);
    off += sizeof(node) + (uint64_t)nd->n * sizeof(uintptr_t);
  }
  *cursor = off;
}
