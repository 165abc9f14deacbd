/* hold.c - declared pointer holds.
 *
 * ta_hold(H, "slot", P) says: block H keeps P in its field "slot" beyond the
 * current call.  The ledger checks P when the hold is declared (a stack
 * address, a freed block, a reset arena), marks the hold dangling when its
 * target is freed, and notices when a live block loses its last hold (the
 * dummy buffer whose pointer a view overwrote): such a block is an orphan,
 * and if it is still live at exit it is leak.orphan, reported with the stack
 * where it lost its last hold.
 *
 * Tables, all under one lock (holds are per object, not per byte):
 *   by_holder: holder -> list of its holds
 *   by_target: target block -> list of holds pointing at it
 *   orphans:   block -> where it lost its last hold */
#include "internal.h"

#include <string.h>

enum { T_EXTERNAL, T_BLOCK, T_ARENA };

typedef struct hold {
  uintptr_t holder;
  char *slot;
  uintptr_t ptr;
  uintptr_t target;          /* T_BLOCK: the block's start */
  int kind;
  uint64_t arena_gen;        /* T_ARENA: the generation at declaration */
  uint32_t stack;            /* where declared */
  bool dangling, reported;
  uint32_t free_stack;       /* where the target was freed or reset */
  uint32_t target_alloc;     /* the target's allocation stack */
  uint64_t target_size;
  ta_tag target_tag;
  struct hold *next_h;                      /* the holder's list */
  struct hold *next_t, *prev_t;             /* the target's list */
} hold;

typedef struct {
  uint32_t stack;
  uintptr_t holder;
  char *slot;
} orphan;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ta_map by_holder, by_target, orphans;

static void orphan_forget(uintptr_t target) {
  orphan *o = _ta_map_del(&orphans, target);
  if (o) {
    _ta_meta_free(o->slot);
    _ta_meta_free(o);
  }
}

/* Unlinks h from its target's list; the target may become an orphan. */
static void target_unlink(hold *h, uint32_t stack) {
  if (h->kind != T_BLOCK || h->target == 0) return;
  if (h->prev_t) h->prev_t->next_t = h->next_t;
  else if (h->next_t) _ta_map_put(&by_target, h->target, h->next_t);
  else _ta_map_del(&by_target, h->target);
  if (h->next_t) h->next_t->prev_t = h->prev_t;
  h->next_t = h->prev_t = NULL;
  if (h->dangling || _ta_map_get(&by_target, h->target)) return;
  ta_block b;
  if (!_ta_block_get(h->target, &b) || b.state != TA_LIVE) return;
  orphan *o = _ta_meta_calloc(1, sizeof *o);
  if (o == NULL) return;
  o->stack = stack;
  o->holder = h->holder;
  o->slot = _ta_meta_strdup(h->slot);
  orphan_forget(h->target);
  if (!_ta_map_put(&orphans, h->target, o)) {
    _ta_meta_free(o->slot);
    _ta_meta_free(o);
  }
}

static void hold_destroy(hold *h) {
  _ta_meta_free(h->slot);
  _ta_meta_free(h);
}

/* Removes holder's hold in slot; returns whether there was one. */
static bool hold_drop(uintptr_t holder, const char *slot, uint32_t stack) {
  hold *head = _ta_map_get(&by_holder, holder), *prev = NULL;
  for (hold *h = head; h; prev = h, h = h->next_h) {
    if (strcmp(h->slot, slot) != 0) continue;
    if (prev) prev->next_h = h->next_h;
    else if (h->next_h) _ta_map_put(&by_holder, holder, h->next_h);
    else _ta_map_del(&by_holder, holder);
    target_unlink(h, stack);
    hold_destroy(h);
    return true;
  }
  return false;
}

static void report(const char *kind, const hold *h, uint32_t stack, const char *detail) {
  ta_error_info e = { .kind = kind, .bytes = h->target_size, .tag = h->target_tag, .stack = stack,
                      .alloc_stack = h->target_alloc, .free_stack = h->free_stack,
                      .aux_stack = h->stack, .addr = h->ptr, .holder = h->holder,
                      .slot = h->slot, .detail = detail };
  _ta_finding_error(&e);
}

/* ta_hold and ta_hold_at: the hold, declared at stack. */
static void hold_declare(void *holder, const char *slot, const void *ptr, uint32_t stack) {
  ta_thread *t = _ta_thread();
  uintptr_t hp = (uintptr_t)holder, p = (uintptr_t)ptr;
  if (holder == NULL || slot == NULL) {
    _ta_error(TA_EINVAL, "ta_hold: holder and slot must not be NULL");
    return;
  }
  if (_ta_tracing) _ta_trace_hold(t, hp, slot, p, stack, _ta_seq_take(t, false));

  hold *h = _ta_meta_calloc(1, sizeof *h);
  if (h == NULL || (h->slot = _ta_meta_strdup(slot)) == NULL) {
    _ta_meta_free(h);
    _ta_error(TA_ENOMEM, "out of memory for a hold");
    return;
  }
  h->holder = hp;
  h->ptr = p;
  h->stack = stack;
  h->kind = T_EXTERNAL;

  /* Classify the pointer before taking the lock: the block table and the
   * arenas have locks of their own. */
  const char *bad = NULL, *detail = NULL;
  char buf[96];
  ta_block b;
  uint64_t gen = 0;
  bool live = false;
  ta_tag atag = TA_ANY;
  uint32_t reset_stack = 0;
  if (p == 0) {
    /* a NULL pointer drops the hold */
  } else if (_ta_addr_on_stack(p)) {
    bad = ta_kind_name(TA_KIND_HOLD_STACK);
    _ta_snprintf(buf, sizeof buf, "slot \"%s\" of %p points into a thread's stack", slot, holder);
    detail = buf;
  } else if (_ta_block_get(p, &b) || (!_ta_arena_lookup(p, &gen, &live, &atag, &reset_stack) &&
                                      _ta_block_find(p, &b))) {
    h->target = b.addr;
    h->target_alloc = b.stack;
    h->target_size = b.size;
    h->target_tag = b.tag;
    if (b.state == TA_LIVE) {
      h->kind = T_BLOCK;
    } else {
      bad = ta_kind_name(TA_KIND_HOLD_DANGLING);
      h->free_stack = b.free_stack;
      detail = "the pointer is to a freed block";
    }
  } else if (gen || live || reset_stack) {   /* arena memory: before the slow stack search */
    h->target_tag = atag;
    if (!live) {
      bad = ta_kind_name(TA_KIND_ARENA_AFTER_RESET);
      h->free_stack = reset_stack;
      detail = "the pointer is to arena memory reset since";
    } else {
      h->kind = T_ARENA;
      h->arena_gen = gen;
    }
  } else if (_ta_addr_on_unknown_stack(p)) {
    bad = ta_kind_name(TA_KIND_HOLD_STACK);
    _ta_snprintf(buf, sizeof buf, "slot \"%s\" of %p points into a thread's stack", slot, holder);
    detail = buf;
  }

  pthread_mutex_lock(&lock);
  hold_drop(hp, slot, stack);
  if (p == 0) {
    pthread_mutex_unlock(&lock);
    hold_destroy(h);
    return;
  }
  if (bad) h->reported = true;
  h->next_h = _ta_map_get(&by_holder, hp);
  _ta_map_put(&by_holder, hp, h);
  if (h->kind == T_BLOCK) {
    hold *first = _ta_map_get(&by_target, h->target);
    h->next_t = first;
    if (first) first->prev_t = h;
    _ta_map_put(&by_target, h->target, h);
    orphan_forget(h->target);
  }
  pthread_mutex_unlock(&lock);
  _ta_block_flag(hp, TA_F_HOLD);
  if (h->kind == T_BLOCK) _ta_block_flag(h->target, TA_F_HOLD);
  if (bad) report(bad, h, stack, detail);
}

TA_NOINLINE void ta_hold(void *holder, const char *slot, const void *ptr) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  hold_declare(holder, slot, ptr, stack);
}

void ta_hold_at(void *holder, const char *slot, const void *ptr, uint32_t stack) {
  _ta_ensure();
  hold_declare(holder, slot, ptr, stack);
}

static void hold_end(void *holder, const char *slot, uint32_t stack) {
  ta_thread *t = _ta_thread();
  if (holder == NULL || slot == NULL) return;
  if (_ta_tracing) _ta_trace_hold(t, (uintptr_t)holder, slot, 0, stack, _ta_seq_take(t, false));
  pthread_mutex_lock(&lock);
  hold_drop((uintptr_t)holder, slot, stack);
  pthread_mutex_unlock(&lock);
}

TA_NOINLINE void ta_unhold(void *holder, const char *slot) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  hold_end(holder, slot, stack);
}

void ta_unhold_at(void *holder, const char *slot, uint32_t stack) {
  _ta_ensure();
  hold_end(holder, slot, stack);
}

/* Is h bad now?  Sets free_stack for an arena hold. */
static bool hold_bad(hold *h) {
  if (h->dangling) return true;
  if (h->kind != T_ARENA) return false;
  uint64_t gen = 0;
  bool live = false;
  ta_tag tag;
  uint32_t reset_stack = 0;
  if (_ta_arena_lookup(h->ptr, &gen, &live, &tag, &reset_stack) && gen == h->arena_gen && live)
    return false;
  h->dangling = true;
  h->free_stack = reset_stack;
  return true;
}

TA_NOINLINE size_t ta_hold_check(const void *holder) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  hold *bad[16];
  size_t nbad = 0, total = 0;
  pthread_mutex_lock(&lock);
  for (hold *h = _ta_map_get(&by_holder, (uintptr_t)holder); h; h = h->next_h) {
    if (!hold_bad(h)) continue;
    total++;
    if (nbad < 16) {
      hold *c = _ta_meta_alloc(sizeof *c);
      if (c) {
        *c = *h;
        c->slot = _ta_meta_strdup(h->slot);
        bad[nbad++] = c;
      }
    }
    h->reported = true;
  }
  pthread_mutex_unlock(&lock);
  for (size_t i = 0; i < nbad; i++) {
    report(ta_kind_name(TA_KIND_HOLD_DANGLING), bad[i], stack,
           bad[i]->kind == T_ARENA ? "the arena was reset since the hold" : "the target was freed while held");
    hold_destroy(bad[i]);
  }
  return total;
}

void _ta_hold_on_free(uintptr_t a, size_t size, uint32_t free_stack) {
  (void)size;
  pthread_mutex_lock(&lock);
  /* As a holder: its holds end with it. */
  hold *h = _ta_map_del(&by_holder, a);
  while (h) {
    hold *next = h->next_h;
    target_unlink(h, free_stack);
    hold_destroy(h);
    h = next;
  }
  /* As a target: its holders now hold a dangling pointer. */
  for (hold *t = _ta_map_del(&by_target, a); t;) {
    hold *next = t->next_t;
    t->dangling = true;
    t->free_stack = free_stack;
    t->next_t = t->prev_t = NULL;
    t->kind = T_EXTERNAL;
    t = next;
  }
  orphan_forget(a);
  pthread_mutex_unlock(&lock);
}

static void exit_visit(uintptr_t key, void *value, void *arg) {
  (void)key;
  hold ***list = arg;
  for (hold *h = value; h; h = h->next_h) {
    if (!hold_bad(h) || h->reported) continue;
    h->reported = true;
    hold *c = _ta_meta_alloc(sizeof *c);
    if (c == NULL) continue;
    *c = *h;
    c->slot = _ta_meta_strdup(h->slot);
    c->next_h = **list;
    **list = c;
  }
}

void _ta_hold_exit(void) {
  hold *bad = NULL, **list = &bad;
  pthread_mutex_lock(&lock);
  _ta_map_each(&by_holder, exit_visit, &list);
  pthread_mutex_unlock(&lock);
  while (bad) {
    hold *next = bad->next_h;
    report(ta_kind_name(TA_KIND_HOLD_DANGLING), bad, bad->free_stack,
           bad->kind == T_ARENA ? "the arena was reset while held, and the hold lasted to exit"
                                : "the target was freed while held, and the hold lasted to exit");
    hold_destroy(bad);
    bad = next;
  }
}

size_t _ta_hold_count_to(uintptr_t a) {
  size_t n = 0;
  pthread_mutex_lock(&lock);
  for (hold *h = _ta_map_get(&by_target, a); h; h = h->next_t)
    if (!h->dangling) n++;
  pthread_mutex_unlock(&lock);
  return n;
}

bool _ta_hold_is_orphan(uintptr_t a, uint32_t *stack, uintptr_t *holder, const char **slot) {
  pthread_mutex_lock(&lock);
  orphan *o = _ta_map_get(&orphans, a);
  if (o) {
    *stack = o->stack;
    *holder = o->holder;
    *slot = o->slot;      /* stays valid: orphans are forgotten only on free */
  }
  pthread_mutex_unlock(&lock);
  return o != NULL;
}

void _ta_hold_fork(int phase) {
  if (phase == TA_FORK_PREPARE) pthread_mutex_lock(&lock);
  else pthread_mutex_unlock(&lock);
}
