/* check.c - the pointer checks: ta_check (is this pointer into live
 * memory?) and ta_check_block / ta_check_tag (is it a live block of this
 * tag?), with the finding that says what it points to instead. */
#include "internal.h"

/* ---- pointer checks ---------------------------------------------------------- */

TA_NOINLINE int ta_check(const void *ptr) {
  _ta_ensure();
  uint32_t stack = _ta_stack_capture(1);
  uintptr_t p = (uintptr_t)ptr;
  ta_block b;
  uint64_t gen;
  bool live = false;
  ta_tag atag;
  uint32_t reset_stack = 0;
  bool found = _ta_block_get(p, &b);
  if (!found && _ta_arena_lookup(p, &gen, &live, &atag, &reset_stack)) {
    if (live) return 1;
    uintptr_t daddr = 0;
    uint64_t dsize = 0;
    uint32_t dstack = 0;
    _ta_arena_dead_block(p, &daddr, &dsize, &dstack);
    ta_error_info e = { .kind = ta_kind_name(TA_KIND_ARENA_AFTER_RESET), .bytes = dsize, .tag = atag, .stack = stack,
                        .alloc_stack = dstack, .free_stack = reset_stack, .addr = p,
                        .detail = "a pointer into arena memory reset since" };
    _ta_finding_error(&e);
    return 0;
  }
  if (!found) found = _ta_block_find(p, &b);
  if (!found) return 0;                      /* not the ledger's memory */
  if (b.state == TA_LIVE) return 1;
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "a pointer at offset %zu of a freed %zu-byte block",
               (size_t)(p - b.addr), (size_t)b.size);
  ta_error_info e = { .kind = ta_kind_name(TA_KIND_USE_AFTER_FREE), .bytes = b.size, .tag = b.tag, .stack = stack,
                      .alloc_stack = b.stack, .free_stack = b.free_stack, .addr = p,
                      .detail = detail };
  _ta_finding_error(&e);
  return 0;
}

/* ---- argument checks (ta_check_block) ------------------------------------------ */

/* The finding for a p that failed check_fast; skip: frames of the ledger
 * and the caller's to leave out of its stack. */
static TA_NOINLINE void check_report(uintptr_t p, ta_tag tag, unsigned flags, const char *what, size_t skip) {
  uint32_t stack = _ta_stack_capture(skip);
  char detail[96];
  const char *w = what ? what : "a pointer";
  const char *want = tag == TA_ANY ? "block" : ta_tag_name(tag);
  ta_block b;
  bool found = _ta_block_get(p, &b);
  /* a refcounted object freed, too big for the quarantine or out of it:
   * its refcount record is still kept */
  if ((flags & TA_CHECK_REF) && !(found && b.state == TA_LIVE) && _ta_ref_is_dead(p)) {
    _ta_snprintf(detail, sizeof detail, "%s: a refcounted block freed while still referenced", w);
    _ta_ref_report_dead(p, stack, detail);
    return;
  }
  if (found && b.state == TA_FREED) {
    if (flags & TA_CHECK_REF) {
      _ta_snprintf(detail, sizeof detail, "%s: its %s was freed while still referenced", w, ta_tag_name(b.tag));
      _ta_ref_report_dead(p, stack, detail);
      return;
    }
    _ta_snprintf(detail, sizeof detail, "%s: a freed %s (%zu bytes)", w, ta_tag_name(b.tag), (size_t)b.size);
    ta_error_info e = { .kind = ta_kind_name((flags & TA_CHECK_FREE) ? TA_KIND_FREE_DOUBLE : TA_KIND_USE_AFTER_FREE),
                        .bytes = b.size, .tag = b.tag, .stack = stack, .alloc_stack = b.stack, .free_stack = b.free_stack,
                        .addr = p, .detail = detail };
    _ta_finding_error(&e);
    return;
  }
  uint64_t gen;
  bool live = false;
  ta_tag atag = TA_ANY;
  uint32_t reset_stack = 0;
  uintptr_t daddr = 0;
  uint64_t dsize = 0;
  uint32_t dstack = 0;
  bool in_arena = _ta_arena_lookup(p, &gen, &live, &atag, &reset_stack);
  bool dead = _ta_arena_dead_block(p, &daddr, &dsize, &dstack);
  if ((in_arena && !(found && b.state == TA_LIVE)) || (!found && dead)) {
    if (dead) _ta_snprintf(detail, sizeof detail, "%s: a %s of an arena generation reset since", w,
                           ta_tag_name(atag != TA_ANY ? atag : tag));
    else _ta_snprintf(detail, sizeof detail, "%s: not a block of the arena's current generation", w);
    ta_error_info e = { .kind = ta_kind_name(TA_KIND_ARENA_AFTER_RESET), .bytes = dsize,
                        .tag = atag != TA_ANY ? atag : tag, .stack = stack, .alloc_stack = dstack,
                        .free_stack = reset_stack, .addr = p,
                        .detail = detail };
    _ta_finding_error(&e);
    _ta_arena_retire(p);
    return;
  }
  const char *kind = ta_kind_name((flags & TA_CHECK_FREE) ? TA_KIND_FREE_INVALID : TA_KIND_USE_AFTER_FREE);
  if (found)   /* live, another tag: the memory was handed out again */
    _ta_snprintf(detail, sizeof detail, "%s: want a live %s, found a %s (freed, reused)", w, want,
                 ta_tag_name(b.tag));
  else
    _ta_snprintf(detail, sizeof detail, "%s: want a live %s, found no block (freed long ago?)", w, want);
  ta_error_info e = { .kind = kind, .bytes = found ? b.size : 0, .tag = found ? b.tag : tag, .stack = stack,
                      .alloc_stack = found ? b.stack : 0, .addr = p, .detail = detail };
  _ta_finding_error(&e);
}

TA_NOINLINE int ta_check_block(const void *ptr, ta_tag tag, ta_tag alt, unsigned flags, const char *what) {
  _ta_ensure();
  uintptr_t p = (uintptr_t)ptr;
  if (TA_LIKELY(_ta_block_check(p, tag, alt))) return 1;
  check_report(p, tag, flags, what, (flags & TA_CHECK_CALLER) ? 3 : 2);
  __asm__ volatile("" ::: "memory");     /* keep this frame: no tail call above */
  return 0;
}

TA_NOINLINE int ta_check_tag(const void *ptr, ta_tag tag) {
  _ta_ensure();
  uintptr_t p = (uintptr_t)ptr;
  if (TA_LIKELY(_ta_block_check(p, tag, tag))) return 1;
  check_report(p, tag, 0, NULL, 2);
  __asm__ volatile("" ::: "memory");
  return 0;
}
