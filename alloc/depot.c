/* depot.c - the stack depot: each distinct stack is stored once and named by
 * a 32-bit id.
 *
 * Stacks share their outer frames.  The depot is a tree of frames grown from
 * the outermost frame in (a trie): a node is one return address and the id
 * of the node of its callers, and the id of a stack is the id of the node
 * of its innermost frame.  A recursive build of a binary tree has a
 * different stack for each of its 2^20 nodes, 20 frames deep, but each
 * differs from its parent's by one or two frames: as whole stacks they were
 * 430 MB of the depot and 400 MB of the trace; as nodes they are 2.1M
 * (3.1M with the free stacks) of 8 bytes (17 MB, 25 MB) and an index of
 * 12 MB (16 MB).
 *
 *   index (mmap, open addressing)   nodes (mmap'd 32 MiB chunks)   addresses
 *   +------------------+            +--------------------+         +------+
 *   | ph' | id --------+----------->| parent | addr -----+-------->| pc   |
 *   +------------------+            | ...                |         | ...  |
 *
 * A node holds its return address as a number in a table of the distinct
 * addresses (each once, numbered in the order first seen, with a map from
 * address to number used when a node is made): a program has few of them
 * next to its nodes (the tree a handful under 2.1M nodes, cc1 7,600 under
 * 73,000), so a node is 8 bytes where the address itself made it 12.
 *
 * The index maps (parent, pc) to a node id.  It has cap slots, cap any
 * size, and b is the number of bits of cap - 1 (2^b >= cap).  A node's
 * home slot is the hash of its path (ph: of every return address from the
 * outermost in; see hash_frame) scaled to cap: the high word of ph * cap,
 * so its high bits.  Its slot, 4 bytes, is its id in the low b bits and
 * ph's low 32 - b bits above them, the bits the home does not give: an
 * index of cap slots holds fewer than cap nodes, so the id fits b bits
 * (and 32 - b = 10 hash bits are kept at the tree's 3 * 2^20 slots).  A
 * lookup shifts ph left by b once, compares each slot with it in one xor
 * and compare, and reads the node only where they are the same (a hit,
 * or once in 2^(32 - b) another node).  Linear probing, at most three
 * quarters full.  It starts at 2^12 slots and doubles up to 2^18 (1 MiB);
 * from there it grows by 3/2 and 4/3 in turn (2^k, 3 * 2^(k-1), 2^(k+1)),
 * so a big index is 1/2 to 3/4 full.  Doubling at 7/8 full, as it did,
 * left it 7/16 to 7/8 full: over all node counts the mean is the same
 * (0.63), but the emptiest is fuller (the tree's 2.1M nodes take 3 * 2^20
 * slots, 12 MB, where they took 2^22, 16 MB) and the fullest probes less:
 * at 3/4 a hit probes 2.5 slots on average (sixteen to a line) and a
 * miss, once per new node, 8.5; at 7/8, 4.5 and 32.5.  Below 1 MiB a step
 * saves little memory and costs a rebuild.  The slots
 * do not hold whole path hashes, so a bigger index is built from the
 * nodes: in id order each node's path hash is its parent's and its address
 * hashed, kept meanwhile in a scratch array of 4 bytes a node, and each is
 * inserted with its home loaded a few inserts ahead.  (Earlier layouts,
 * the tree's 2.1M nodes: 16-byte slots with the whole key and 16-byte
 * nodes with the path hash, 96 MB; 8-byte slots with the whole path hash
 * and 12-byte nodes with the pc, 57 MB, and a growth that held the old
 * index and the new, 48 MB, at once; these, doubling at 7/8, 33 MB, and
 * 31 MB while growing; now 29 MB, and 26 MB while growing: 8 + 12 MB of
 * index and 6 MB of scratch.)  Each node's `up` has a bit, w, that says
 * it has been named as a whole stack (what ta_stacks_count counts: a
 * stack's outer part is a node too, but not a stack of the program's).
 * Node ids are given in order, so node i's parent is below i, and the
 * nodes array is a record of every node in the order it was made: the
 * trace writer walks it to write each node once (_ta_depot_each_since),
 * and reading a stack back follows the parents (_ta_depot_get).
 *
 * Putting a stack looks up its frames from the outermost in, each with the
 * node found for its callers; a thread keeps the path of its last stack,
 * so the frames its new stack shares with that one (usually all but the
 * innermost few: the same main loop, the same caller) cost a compare each,
 * not a lookup; and it guesses the node of each other frame (below) before
 * it looks it up.  The innermost frame's node must also have its w bit.
 *
 * Lookups take no lock.  Inserts take one mutex (a new node is rare next to
 * lookups): look again (from the empty slot where the lookup without the
 * lock ended, while the index is the same one: a slot is only ever
 * filled, so the run before it is as it was), write the address, then the
 * node, publish its slot (that empty slot, or the first one after it)
 * with a release store; growing builds the bigger index, publishes it, and
 * gives the old one's pages back (MADV_DONTNEED): a reader still on it then
 * reads zeros, a miss, and goes to the locked path, which sees the new one.
 * The depot never allocates from the audited heap. */
#include "internal.h"

#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#define CHUNK_NODES_SHIFT 22                 /* 2^22 nodes a chunk */
#define CHUNK_SIZE  (sizeof(node) << CHUNK_NODES_SHIFT)   /* 32 MiB */
#define MAX_CHUNKS  512                      /* 2^31 nodes: ids fit 31 bits */
#define INDEX_FIRST (1u << 12)               /* slots */
#define INDEX_MAX   (1u << 31)               /* slots: ids below it fit 31 bits */
#define INDEX_FINE  (1u << 18)               /* slots (1 MiB): grows by 3/2 and 4/3 from here */
#define WHOLE 0x80000000u                    /* in a node's up: named as a whole stack */
#define ID_MASK 0x7fffffffu

/* 8 bytes: the return address is a number in the table of addresses
 * (below), not the address itself. */
typedef struct {
  _Atomic uint32_t up;                       /* parent id (0: pc is the outermost frame), and
                                                WHOLE: the node is a whole stack */
  uint32_t addr;                             /* its return address's number */
} node;
_Static_assert(sizeof(node) == 8, "a node is 8 bytes");

/* cap slots, cap any number from INDEX_FIRST to INDEX_MAX; b the bits
 * of cap - 1 (2^b >= cap).  A slot is a node's id in its low b bits and
 * the low 32 - b bits of its path hash above them; 0: empty.  The home
 * comes from the hash's high bits (index_home). */
typedef _Atomic uint32_t slot;

typedef struct {
  _Atomic uint64_t shape;                    /* cap | b << 32, read in one load; 0 where its
                                                pages were given back (a miss) */
  uint64_t size;                             /* bytes mapped */
  slot slots[];
} stack_index;

#define SHAPE_CAP(s) ((uint32_t)(s))
#define SHAPE_BITS(s) ((uint32_t)((s) >> 32))

/* The home of path hash h among cap slots: its high bits scaled to cap,
 * one multiply's high word (h * cap / 2^32).  The slot keeps h's low
 * 32 - b bits, which the home does not give. */
static inline uint32_t index_home(uint32_t h, uint32_t cap) { return (uint32_t)(((uint64_t)h * cap) >> 32); }

static stack_index *_Atomic index_now;
static uint64_t index_entries;               /* under put_lock */
static pthread_mutex_t put_lock = PTHREAD_MUTEX_INITIALIZER;
static node *_Atomic chunks[MAX_CHUNKS];
static _Atomic uint32_t next_id = 1;         /* 0 is never an id */
static _Atomic uint64_t count;               /* whole stacks */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

/* Big regions, touched at random (the index) or written once in order
 * (chunks).  Transparent huge pages cut the page faults and TLB misses of a
 * depot with millions of nodes, but a huge page is 2 MiB to zero on its
 * first touch, most of a millisecond in every short process (a shell's
 * echo).  So small pages first, huge pages from HUGE_AFTER nodes on
 * (madvise then covers what is touched from there). */
#define HUGE_AFTER (1u << 16)
static _Atomic bool huge;

static void *map_small(size_t size) {
  void *p = _ta_sys_mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void *map(size_t size) {
  void *p = map_small(size);
  if (p && atomic_load_explicit(&huge, memory_order_relaxed)) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

static void go_huge(void) {
  pthread_mutex_lock(&init_lock);
  if (!atomic_load(&huge)) {
    atomic_store(&huge, true);
    stack_index *ix = atomic_load(&index_now);
    if (ix) madvise(ix, ix->size, MADV_HUGEPAGE);
    for (size_t i = 0; i < MAX_CHUNKS; i++) {
      node *c = atomic_load(&chunks[i]);
      if (c) madvise(c, CHUNK_SIZE, MADV_HUGEPAGE);
    }
  }
  pthread_mutex_unlock(&init_lock);
}

static node *chunk_get(size_t i) {
  node *c = atomic_load_explicit(&chunks[i], memory_order_acquire);
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

/* ---- the table of return addresses ----------------------------------------
 * Every distinct return address once, numbered from 1 in the order first
 * seen, in chunks that never move (read without a lock), and a map from
 * address to number (open addressing, at most 3/4 full, doubling), used
 * only under put_lock when a node is made.  A program has few distinct
 * return addresses next to its nodes (the tree: a handful under 2.1M
 * nodes), so a node's 4-byte number in place of its 8-byte address saves
 * about 4 bytes a node. */
#define ADDR_CHUNK_SHIFT 18                  /* 2^18 addresses a chunk, 2 MiB */
#define ADDR_CHUNKS (1u << (31 - ADDR_CHUNK_SHIFT))   /* 2^31: no more than nodes */
#define ADDR_MAP_FIRST_BITS 10

static uintptr_t *_Atomic addr_chunks[ADDR_CHUNKS];
static _Atomic uint32_t addr_next = 1;       /* written under put_lock */
static uint32_t *addr_map;                   /* under put_lock: numbers; 0 empty */
static uint32_t addr_map_bits;

/* The address numbered a (a number a node holds: written before it). */
static inline uintptr_t addr_at(uint32_t a) {
  uintptr_t *c = atomic_load_explicit(&addr_chunks[a >> ADDR_CHUNK_SHIFT], memory_order_relaxed);
  return c[a & ((1u << ADDR_CHUNK_SHIFT) - 1)];
}

static inline uint32_t addr_home(uintptr_t pc, uint32_t bits) {
  return (uint32_t)(((uint64_t)pc * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static bool addr_map_grow(void) {
  uint32_t bits = addr_map_bits ? addr_map_bits + 1 : ADDR_MAP_FIRST_BITS;
  if (bits > 31) return false;
  uint32_t *m = map_small(sizeof(uint32_t) << bits);
  if (m == NULL) return false;
  uint32_t mask = (1u << bits) - 1;
  uint32_t end = atomic_load_explicit(&addr_next, memory_order_relaxed);
  for (uint32_t a = 1; a < end; a++) {
    uint32_t i = addr_home(addr_at(a), bits);
    while (m[i] != 0) i = (i + 1) & mask;
    m[i] = a;
  }
  if (addr_map) _ta_sys_munmap(addr_map, sizeof(uint32_t) << addr_map_bits);
  addr_map = m;
  addr_map_bits = bits;
  return true;
}

/* The number of address pc, numbered now if new (under put_lock); 0 when
 * no memory is left. */
static uint32_t addr_number(uintptr_t pc) {
  if (addr_map == NULL && !addr_map_grow()) return 0;
  uint32_t mask = (1u << addr_map_bits) - 1;
  uint32_t i = addr_home(pc, addr_map_bits);
  for (uint32_t a; (a = addr_map[i]) != 0; i = (i + 1) & mask)
    if (addr_at(a) == pc) return a;
  uint32_t a = atomic_load_explicit(&addr_next, memory_order_relaxed);
  if ((a >> ADDR_CHUNK_SHIFT) >= ADDR_CHUNKS) return 0;
  if (((uint64_t)a + 1) * 4 > ((uint64_t)mask + 1) * 3) {
    if (!addr_map_grow()) return 0;
    return addr_number(pc);
  }
  uintptr_t *c = atomic_load_explicit(&addr_chunks[a >> ADDR_CHUNK_SHIFT], memory_order_relaxed);
  if (c == NULL) {
    if ((c = map_small(sizeof(uintptr_t) << ADDR_CHUNK_SHIFT)) == NULL) return 0;
    atomic_store_explicit(&addr_chunks[a >> ADDR_CHUNK_SHIFT], c, memory_order_release);
  }
  c[a & ((1u << ADDR_CHUNK_SHIFT) - 1)] = pc;
  addr_map[i] = a;
  atomic_store_explicit(&addr_next, a + 1, memory_order_relaxed);
  return a;
}

/* Node id, or NULL when no node has that id (yet). */
static inline node *node_at(uint32_t id) {
  if (id == 0 || id >= atomic_load_explicit(&next_id, memory_order_acquire)) return NULL;
  node *c = atomic_load_explicit(&chunks[id >> CHUNK_NODES_SHIFT], memory_order_acquire);
  return c ? &c[id & ((1u << CHUNK_NODES_SHIFT) - 1)] : NULL;
}

/* A node's home in the index is the hash of its whole path, not of its
 * (parent, pc) key: the hash of frame pc called from the path hashed `up`
 * (0 for the outermost frame).  It needs the program counters only, not
 * the parent's id, so a stack's new frames are hashed before any of them
 * is looked up, and their slots loaded together (stack_put): where the key
 * would have made each lookup wait for the one before it, one cache miss
 * after the other. */
static inline uint32_t hash_frame(uint32_t up, uintptr_t pc) {
  uint64_t h = (uint64_t)pc * 0x9E3779B97F4A7C15ull ^ (uint64_t)up * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xff51afd7ed558ccdull;
  return (uint32_t)(h ^ (h >> 32));
}

/* The node a slot names: the slot was published (release) after its node,
 * its address and their chunks were written, so an acquire load of the
 * slot sees them all. */
static inline node *slot_node(uint32_t id) {
  node *c = atomic_load_explicit(&chunks[id >> CHUNK_NODES_SHIFT], memory_order_relaxed);
  return &c[id & ((1u << CHUNK_NODES_SHIFT) - 1)];
}

#define HOME UINT32_MAX                      /* (a place to start a probe) the home slot */

#define MISSED_AT(f) ((uint32_t)((f) >> 32))  /* of index_find's answer: the empty slot a miss ended at */

/* Node (parent, pc), whose path hash is h, in ix: its id, with WHOLE
 * where it is a whole stack, in the low half; 0 if none, and then the
 * empty slot the probe ended at in the high half (HOME where none).  A
 * slot whose high bits are h's low 32 - b is checked against its node
 * (two nodes near one home agree there once in 2^(32 - b): 1,024 at the
 * tree's 3 * 2^20 slots).  The probe starts at slot `from` (HOME: the
 * home). */
static uint64_t index_find(stack_index *ix, uint32_t parent, uintptr_t pc, uint32_t h, uint32_t from) {
  const uint64_t none = (uint64_t)HOME << 32;
  if (ix == NULL) return none;
  uint64_t shape = atomic_load_explicit(&ix->shape, memory_order_relaxed);
  uint32_t cap = SHAPE_CAP(shape), b = SHAPE_BITS(shape);
  if (cap == 0) return none;                 /* given back while we looked */
  uint32_t ids = (1u << b) - 1, kept = h << b;
  for (uint32_t i = from == HOME ? index_home(h, cap) : from, probes = 0; probes < cap; probes++) {
    uint32_t k = atomic_load_explicit(&ix->slots[i], memory_order_acquire);
    if (k == 0) return (uint64_t)i << 32;
    if ((k ^ kept) <= ids) {
      node *nd = slot_node(k & ids);
      uint32_t up = atomic_load_explicit(&nd->up, memory_order_relaxed);
      if ((up & ID_MASK) == parent && addr_at(nd->addr) == pc) return (k & ids) | (up & WHOLE);
    }
    if (++i == cap) i = 0;
  }
  return none;
}

/* Puts node id, whose path hash is h, into ix (not there yet), probing
 * from slot `from` (HOME: its home); false when ix is full.  id < cap <=
 * 2^b: an index of cap slots holds fewer nodes. */
static bool index_add(stack_index *ix, uint32_t h, uint32_t id, uint32_t from) {
  uint64_t shape = atomic_load_explicit(&ix->shape, memory_order_relaxed);
  uint32_t cap = SHAPE_CAP(shape), b = SHAPE_BITS(shape);
  for (uint32_t i = from == HOME ? index_home(h, cap) : from, probes = 0; probes < cap; probes++) {
    slot *s = &ix->slots[i];
    if (atomic_load_explicit(s, memory_order_relaxed) == 0) {
      atomic_store_explicit(s, h << b | id, memory_order_release);
      return true;
    }
    if (++i == cap) i = 0;
  }
  return false;
}

static stack_index *index_new(uint32_t cap) {
  uint64_t size = sizeof(stack_index) + sizeof(slot) * (uint64_t)cap;
  stack_index *ix = map(size);
  if (ix == NULL) return NULL;
  uint32_t b = 0;
  while (((uint64_t)1 << b) < cap) b++;
  atomic_store_explicit(&ix->shape, cap | (uint64_t)b << 32, memory_order_relaxed);
  ix->size = size;
  return ix;
}

/* The next size: twice a power of two below INDEX_FINE; from there 3/2
 * of a power of two, or 4/3 of 3 * 2^k, a power of two again; 0 past
 * INDEX_MAX. */
static uint32_t index_next_cap(uint32_t cap) {
  uint64_t next = cap < INDEX_FINE ? (uint64_t)cap * 2
                  : (cap & (cap - 1)) == 0 ? (uint64_t)cap / 2 * 3 : (uint64_t)cap / 3 * 4;
  return next <= INDEX_MAX ? (uint32_t)next : 0;
}

/* Room for one more entry: a new index of the next size (index_next_cap)
 * once this one is three quarters full (under put_lock).  Keeps the old
 * one when no memory is left: it still works, with longer probes, until
 * it is full.
 *
 * A slot holds only the part of its path hash that its home does not
 * give, so the new index is built from the nodes, not from the old slots:
 * in id order (a parent before its children), each node's path hash is
 * its parent's and its address hashed (hash_frame), kept in a scratch
 * array of 4 bytes a node that is given back when done.  Readers without
 * the lock go on using the old index meanwhile. */
#define REBUILD_AHEAD 16

static stack_index *index_room(stack_index *ix) {
  if (ix == NULL) {
    ix = index_new(INDEX_FIRST);
    if (ix) atomic_store_explicit(&index_now, ix, memory_order_release);
    return ix;
  }
  uint64_t slots = SHAPE_CAP(atomic_load_explicit(&ix->shape, memory_order_relaxed));
  if ((index_entries + 1) * 4 <= slots * 3) return ix;
  uint32_t next = index_next_cap((uint32_t)slots);
  stack_index *big = next ? index_new(next) : NULL;
  uint32_t end = atomic_load_explicit(&next_id, memory_order_relaxed);
  size_t scratch = (size_t)end * sizeof(uint32_t);
  uint32_t *ph = big ? map_small(scratch) : NULL;
  if (ph == NULL) {
    if (big) _ta_sys_munmap(big, big->size);
    return index_entries + 1 < slots ? ix : NULL;
  }
  /* ph[0] = 0: the path above the outermost frame.  The homes are at
   * random: each is loaded REBUILD_AHEAD inserts before its own, so that
   * their misses overlap (one after the other, they made the tree's first
   * build a fifth slower).  No reader sees big yet: plain stores. */
  uint32_t b = SHAPE_BITS(atomic_load_explicit(&big->shape, memory_order_relaxed));
  for (uint32_t id = 1; id < end + REBUILD_AHEAD; id++) {
    if (id < end) {
      node *nd = slot_node(id);
      uint32_t h = hash_frame(ph[atomic_load_explicit(&nd->up, memory_order_relaxed) & ID_MASK], addr_at(nd->addr));
      ph[id] = h;
      __builtin_prefetch(&big->slots[index_home(h, next)], 1);
    }
    if (id > REBUILD_AHEAD) {
      uint32_t k = id - REBUILD_AHEAD, h = ph[k], i = index_home(h, next);
      while (atomic_load_explicit(&big->slots[i], memory_order_relaxed) != 0)
        if (++i == next) i = 0;
      atomic_store_explicit(&big->slots[i], h << b | k, memory_order_relaxed);
    }
  }
  _ta_sys_munmap(ph, scratch);
  atomic_store_explicit(&index_now, big, memory_order_release);
  madvise(ix, ix->size, MADV_DONTNEED);      /* readers still on it read zeros: a miss */
  return big;
}

/* A new node, under put_lock; 0 when the depot is full.  It is written
 * before next_id passes it, so every id below next_id names a whole node. */
static uint32_t node_new(uint32_t parent, uintptr_t pc, bool whole) {
  uint32_t id = atomic_load_explicit(&next_id, memory_order_relaxed);
  if ((id >> CHUNK_NODES_SHIFT) >= MAX_CHUNKS || id > ID_MASK - 1) return 0;
  uint32_t a = addr_number(pc);
  if (a == 0) return 0;
  node *c = chunk_get(id >> CHUNK_NODES_SHIFT);
  if (c == NULL) return 0;
  node *nd = &c[id & ((1u << CHUNK_NODES_SHIFT) - 1)];
  nd->addr = a;
  atomic_store_explicit(&nd->up, parent | (whole ? WHOLE : 0), memory_order_relaxed);
  atomic_store_explicit(&next_id, id + 1, memory_order_release);
  if (TA_UNLIKELY(id == HUGE_AFTER)) go_huge();
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

/* A new node (parent, pc) with path hash h, under put_lock, and its slot:
 * the id with WHOLE when `whole`; 0 when the depot is full.  Where a
 * lookup under the lock missed it in index `missed` at the empty slot
 * `at` and the index is still that one, the slot's probe starts there
 * (the first empty slot from its home), not at its home. */
static uint32_t node_add(uint32_t parent, uintptr_t pc, uint32_t h, bool whole, const stack_index *missed,
                         uint32_t at) {
  stack_index *ix = index_room(atomic_load_explicit(&index_now, memory_order_relaxed));
  uint32_t id;
  if (ix == NULL || (id = node_new(parent, pc, whole)) == 0) return 0;
  index_add(ix, h, id, ix == missed ? at : HOME);
  index_entries++;
  if (whole) {
    atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    id |= WHOLE;
  }
  return id;
}

/* The node of frame pc called from the stack `parent`, whose path hash
 * is h, made if missing; `whole`: pc is the innermost frame of a stack
 * being put, which is then counted once.  Returns the id, with WHOLE set
 * when the node is a whole stack; 0 when the depot is full, or when the
 * node is new and the lock may not be taken.
 *
 * held (may be NULL): set when the node was made now, and put_lock is then
 * left held.  No node can name a node made a moment ago as its parent, so
 * while the lock stays held every frame inside a new one is new too: the
 * caller makes them with node_add, without a lookup (two, a miss without
 * the lock and again with it, each probing a run of the index: on
 * mixchurn, whose every batch of 16 operations comes from a new route,
 * most of what a put cost), and releases the lock. */
static uint32_t frame_id(uint32_t parent, uintptr_t pc, uint32_t h, bool whole, bool may_lock, bool *held) {
  stack_index *ix = atomic_load_explicit(&index_now, memory_order_acquire);
  uint64_t f = index_find(ix, parent, pc, h, HOME);
  uint32_t v = (uint32_t)f;
  if (v != 0 && (!whole || (v & WHOLE))) return v;
  if (!put_lock_take(may_lock)) return v;
  /* put meanwhile?  Where the index is still the one that missed, its
   * slots before the empty one the miss ended at are as they were (a slot
   * is only ever filled): look on from there */
  stack_index *now = atomic_load_explicit(&index_now, memory_order_relaxed);
  f = index_find(now, parent, pc, h, v == 0 && now == ix ? MISSED_AT(f) : HOME);
  v = (uint32_t)f;
  if (v != 0) {
    if (whole && !(v & WHOLE)) {
      atomic_fetch_or_explicit(&slot_node(v)->up, WHOLE, memory_order_relaxed);
      atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
      v |= WHOLE;
    }
  } else if ((v = node_add(parent, pc, h, whole, now, MISSED_AT(f))) != 0 && held != NULL) {
    *held = true;
    return v;
  }
  pthread_mutex_unlock(&put_lock);
  return v;
}

/* A thread's path: the frames of the last stack it put, outermost first,
 * and the node of each prefix; and its guess of the next node it will
 * look up.
 *
 * The guess: the node made right after the last one it found, or, when
 * that one was an older node, right after the last of the run of nodes
 * before it.  A program that repeats a phase (a training step, a tree
 * built again) asks for its stacks in the order it first made them, so
 * the node it needs next is usually the next one in the nodes array:
 * checking that node reads the cache line after the one just read, where
 * a lookup is a cache miss in an index of millions of slots, at random
 * (the tree's 2^20 new stacks per build: 3.7M lookups in its first build,
 * a handful in each later one).  A wrong guess costs a read of a node the
 * thread does not need, so guesses are made while they pay: each right
 * one earns credit, a wrong one costs GUESS_COST, and without credit one
 * lookup in GUESS_RETRY tries again. */
#define GUESS_CREDIT_MAX 64
#define GUESS_COST 8
#define GUESS_RETRY 32

typedef struct {
  uint32_t  n;
  uint32_t  last, run;                       /* the last id found; the last of the run it is in or broke */
  int32_t   credit;
  uint32_t  tries;
  uint64_t  lookups;                         /* in the index (for tests) */
  uint32_t  ids[TA_MAX_DEPTH];               /* with WHOLE where known to be whole stacks */
  uint32_t  ph[TA_MAX_DEPTH];                /* the path hash of each prefix */
  uintptr_t pcs[TA_MAX_DEPTH];
} path;

/* Node id if it is (parent, pc) and, when `whole` asks, a whole stack:
 * the id with WHOLE as the node has it; else 0. */
static inline uint32_t node_is(uint32_t id, uint32_t parent, uintptr_t pc, bool whole) {
  node *nd = node_at(id);
  if (nd == NULL) return 0;
  uint32_t up = atomic_load_explicit(&nd->up, memory_order_relaxed);
  if ((up & ID_MASK) != parent || addr_at(nd->addr) != pc) return 0;
  bool w = (up & WHOLE) != 0;
  return whole && !w ? 0 : id | (w ? WHOLE : 0);
}

/* Node (parent, pc) as node_is gives it if it is one p guesses, else 0.
 * Keeps the guesses' credit. */
static inline uint32_t guess(path *p, uint32_t parent, uintptr_t pc, bool whole) {
  if (p->credit <= 0 && ++p->tries % GUESS_RETRY != 0) return 0;
  uint32_t v = node_is(p->last + 1, parent, pc, whole);
  if (v == 0 && p->run != p->last) v = node_is(p->run + 1, parent, pc, whole);
  if (v != 0) {
    if (p->credit < GUESS_CREDIT_MAX) p->credit++;
  } else if (p->credit > 0) {
    p->credit -= GUESS_COST;
  }
  return v;
}

/* Starts loading the index slots of path hashes h[0..n). */
static void index_prefetch(const uint32_t *h, size_t n) {
  stack_index *ix = atomic_load_explicit(&index_now, memory_order_acquire);
  if (ix == NULL) return;
  uint32_t cap = SHAPE_CAP(atomic_load_explicit(&ix->shape, memory_order_relaxed));
  if (cap == 0) return;
  for (size_t i = 0; i < n && i < 16; i++) __builtin_prefetch(&ix->slots[index_home(h[i], cap)]);
}

/* Puts pcs[0..n) (innermost first) starting from what it shares with *p
 * (may be NULL), and leaves it in *p.  A stack that is all in the path
 * (the callers of the last stack: a free in the caller of the function
 * that just allocated) costs no lookup when its node is known to be a
 * whole stack; otherwise the innermost frame is looked up, for its
 * WHOLE bit. */
static uint32_t stack_put(const uintptr_t *pcs, size_t n, path *p, bool may_lock) {
  size_t j = 0;
  uint32_t v = 0, h = 0;
  bool held = false;                         /* put_lock, from the first node made (frame_id) */
  if (p == NULL) {
    for (; j < n; j++) {
      h = hash_frame(h, pcs[n - 1 - j]);
      v = held ? node_add(v & ID_MASK, pcs[n - 1 - j], h, j == n - 1, NULL, HOME)
               : frame_id(v & ID_MASK, pcs[n - 1 - j], h, j == n - 1, may_lock, &held);
      if (v == 0) break;
    }
    if (held) pthread_mutex_unlock(&put_lock);
    return v & ID_MASK;
  }
  size_t same = p->n < n ? p->n : n;
  /* four frames a branch: the shared part is most of the stack */
  while (j + 4 <= same && ((p->pcs[j] ^ pcs[n - 1 - j]) | (p->pcs[j + 1] ^ pcs[n - 2 - j]) |
                           (p->pcs[j + 2] ^ pcs[n - 3 - j]) | (p->pcs[j + 3] ^ pcs[n - 4 - j])) == 0)
    j += 4;
  while (j < same && p->pcs[j] == pcs[n - 1 - j]) j++;
  if (j == n) {
    if (p->ids[n - 1] & WHOLE) return p->ids[n - 1] & ID_MASK;
    j = n - 1;
  }
  if (j > 0) {
    v = p->ids[j - 1];
    h = p->ph[j - 1];
  }
  /* the path hashes of the frames not shared; at the first lookup, the
   * slots of all the frames from there in start loading at once */
  for (size_t i = j; i < n; i++) p->ph[i] = h = hash_frame(h, pcs[n - 1 - i]);
  bool loading = false;
  for (; j < n; j++) {
    uintptr_t pc = pcs[n - 1 - j];
    bool whole = j == n - 1;
    uint32_t parent = v & ID_MASK;
    if (held) {
      v = node_add(parent, pc, p->ph[j], whole, NULL, HOME);
    } else if ((v = guess(p, parent, pc, whole)) == 0) {
      if (!loading && j + 1 < n) {
        index_prefetch(&p->ph[j], n - j);
        loading = true;
      }
      v = frame_id(parent, pc, p->ph[j], whole, may_lock, &held);
      p->lookups++;
    }
    p->pcs[j] = pc;
    p->ids[j] = v;
    uint32_t id = v & ID_MASK;
    if (id == 0) {
      if (held) pthread_mutex_unlock(&put_lock);
      p->n = (uint32_t)j;
      return 0;
    }
    if (id == p->run + 1 || id == p->last + 1) p->run = id;
    p->last = id;
  }
  if (held) pthread_mutex_unlock(&put_lock);
  p->n = (uint32_t)n;
  return v & ID_MASK;
}

/* Each thread's memo of the stacks it put recently: direct-mapped by hash,
 * each entry a full copy of its frames, compared whole before its id is
 * used, so a hit is exact.  A hit reads only the thread's own memory; the
 * depot's index is cold whenever the program's own work (a matrix product
 * between two tensor allocations) has pushed it out of the CPU's caches.
 * Stacks deeper than MEMO_FRAMES go to the depot.  The thread's path is
 * kept here too.
 *
 * The memo is used while it pays: a miss costs a hash of every frame and
 * a copy of them into an entry (a line or four of an array of 72 KB, out
 * of L1), and where stacks do not repeat within 256 puts (the tree's
 * 2^20 stacks, each new in its round) it never answers.  A hit earns
 * MEMO_HIT credit, a miss costs one; without credit one put in
 * MEMO_RETRY tries it (and keeps its stack).  cc1's memo answers a
 * quarter of its puts, which keeps it on. */
#define MEMO_BITS   8
#define MEMO_FRAMES 32
#define MEMO_CREDIT_MAX 256
#define MEMO_HIT   8
#define MEMO_RETRY 16

typedef struct {
  uint32_t hash, id, n, pad;
  uintptr_t pcs[MEMO_FRAMES];
} memo_entry;

struct ta_stack_memo {
  memo_entry e[1u << MEMO_BITS];
  path       path;
  int32_t    credit;
  uint32_t   tries;
  uint64_t   skipped;                 /* puts that did not use the memo (tests) */
};

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

static inline bool same_pcs(const uintptr_t *a, const uintptr_t *b, size_t n) {
  uintptr_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= a[i] ^ b[i];
  return diff == 0;
}

uint32_t _ta_depot_put(const uintptr_t *pcs, size_t n) {
  if (n == 0) return 0;
  if (n > TA_MAX_DEPTH) n = TA_MAX_DEPTH;
  ta_thread *t = _ta_self;
  if (t == NULL) return stack_put(pcs, n, NULL, true);
  /* A call nested in this one (a signal handler that allocates) may find
   * put_lock held by the frame it interrupted: it only looks up. */
  if (t->stack_memo_busy) return stack_put(pcs, n, NULL, false);
  t->stack_memo_busy = 1;
  atomic_signal_fence(memory_order_seq_cst);   /* a nested call (a signal) sees busy */
  if (TA_UNLIKELY(t->stack_memo == NULL)) {
    t->stack_memo = _ta_meta_calloc(1, sizeof *t->stack_memo);
    if (t->stack_memo) t->stack_memo->credit = MEMO_CREDIT_MAX;
  }
  struct ta_stack_memo *m = t->stack_memo;
  uint32_t id;
  bool use = m != NULL && n <= MEMO_FRAMES;
  if (use && m->credit <= 0 && ++m->tries % MEMO_RETRY != 0) {
    use = false;
    m->skipped++;
  }
  if (TA_LIKELY(use)) {
    uint32_t h = hash_pcs(pcs, n);
    memo_entry *e = &m->e[h & ((1u << MEMO_BITS) - 1)];
    if (e->hash == h && e->n == n && same_pcs(e->pcs, pcs, n)) {
      id = e->id;
      m->credit = m->credit > MEMO_CREDIT_MAX - MEMO_HIT ? MEMO_CREDIT_MAX : m->credit + MEMO_HIT;
    } else {
      if (m->credit > 0) m->credit--;
      id = stack_put(pcs, n, &m->path, true);
      e->n = 0;                          /* no entry while it is written */
      memcpy(e->pcs, pcs, n * sizeof *pcs);
      e->hash = h;
      e->id = id;
      e->n = id ? (uint32_t)n : 0;
    }
  } else {
    id = stack_put(pcs, n, m ? &m->path : NULL, true);
  }
  atomic_signal_fence(memory_order_seq_cst);
  t->stack_memo_busy = 0;
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

size_t _ta_depot_get(uint32_t id, uintptr_t *pcs, size_t max) {
  size_t k = 0;
  for (node *nd; k < max && (nd = node_at(id)) != NULL; k++) {
    pcs[k] = addr_at(nd->addr);
    uint32_t parent = atomic_load_explicit(&nd->up, memory_order_relaxed) & ID_MASK;
    if (parent >= id) return k + 1;          /* never: parents come first */
    id = parent;
  }
  return k;
}

size_t _ta_depot_depth(uint32_t id) {         /* (tests) */
  size_t k = 0;
  for (node *nd; (nd = node_at(id)) != NULL; k++) {
    uint32_t parent = atomic_load_explicit(&nd->up, memory_order_relaxed) & ID_MASK;
    if (parent >= id) return k + 1;
    id = parent;
  }
  return k;
}

size_t _ta_depot_count(void) { return atomic_load(&count); }

uint64_t _ta_depot_lookups(void) {
  ta_thread *t = _ta_self;
  return t && t->stack_memo ? t->stack_memo->path.lookups : 0;
}

uint64_t _ta_depot_memo_skipped(void) {
  ta_thread *t = _ta_self;
  return t && t->stack_memo ? t->stack_memo->skipped : 0;
}

size_t _ta_depot_nodes(void) { return atomic_load(&next_id) - 1; }

size_t _ta_depot_addrs(void) { return atomic_load_explicit(&addr_next, memory_order_relaxed) - 1; }

size_t _ta_depot_bytes(size_t *index_bytes) {
  stack_index *ix = atomic_load_explicit(&index_now, memory_order_acquire);
  *index_bytes = ix ? sizeof(slot) * (size_t)SHAPE_CAP(atomic_load_explicit(&ix->shape, memory_order_relaxed)) : 0;
  return _ta_depot_nodes() * sizeof(node);
}

uint32_t _ta_depot_path_hash(uint32_t up, uintptr_t pc) { return hash_frame(up, pc); }

void _ta_depot_each_since(uint64_t *cursor, void (*fn)(uint32_t id, uint32_t parent, uintptr_t pc, void *arg),
                          void *arg) {
  uint32_t id = *cursor < 1 ? 1 : (uint32_t)*cursor;
  uint32_t end = atomic_load_explicit(&next_id, memory_order_acquire);
  for (; id < end; id++) {
    node *nd = node_at(id);
    if (nd == NULL) break;
    fn(id, atomic_load_explicit(&nd->up, memory_order_relaxed) & ID_MASK, addr_at(nd->addr), arg);
  }
  *cursor = id;
}

bool _ta_depot_node(uint32_t id, uint32_t *parent, uintptr_t *pc) {
  if (id == 0 || id >= atomic_load_explicit(&next_id, memory_order_acquire)) return false;
  node *nd = node_at(id);
  if (nd == NULL) return false;
  *parent = atomic_load_explicit(&nd->up, memory_order_relaxed) & ID_MASK;
  *pc = addr_at(nd->addr);
  return true;
}
