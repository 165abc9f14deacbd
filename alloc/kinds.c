/* kinds.c - the table of finding kinds (see kinds.h).  Nothing here is on a
 * hot path: findings are rare, and renderers look a kind up once a group. */
#include "kinds.h"

#include <string.h>

const ta_kind_info ta_kinds[TA_KIND_COUNT] = {
  [TA_KIND_USE_AFTER_FREE]       = { "use.after-free",       TA_CLASS_ERROR, NULL },
  [TA_KIND_HEAP_OVERFLOW]        = { "heap.overflow",        TA_CLASS_ERROR, NULL },
  [TA_KIND_FREE_DOUBLE]          = { "free.double",          TA_CLASS_ERROR, NULL },
  [TA_KIND_FREE_INVALID]         = { "free.invalid",         TA_CLASS_ERROR, NULL },
  [TA_KIND_ARENA_AFTER_RESET]    = { "arena.after-reset",    TA_CLASS_ERROR, NULL },
  [TA_KIND_REF_UNDERFLOW]        = { "ref.underflow",        TA_CLASS_ERROR, NULL },
  [TA_KIND_HOLD_DANGLING]        = { "hold.dangling",        TA_CLASS_ERROR, NULL },
  [TA_KIND_HOLD_STACK]           = { "hold.stack",           TA_CLASS_ERROR, NULL },
  [TA_KIND_GPU_PURGE_REFERENCED] = { "gpu.purge-referenced", TA_CLASS_ERROR, NULL },
  [TA_KIND_LEAK_DIRECT]          = { "leak.direct",          TA_CLASS_LEAK,  "Direct leak" },
  [TA_KIND_LEAK_ORPHAN]          = { "leak.orphan",          TA_CLASS_LEAK,  "Orphaned leak" },
  [TA_KIND_GPU_LEAK]             = { "gpu.leak",             TA_CLASS_LEAK,  "GPU leak" },
  [TA_KIND_LEAK_INDIRECT]        = { "leak.indirect",        TA_CLASS_LEAK,  "Indirect leak" },
  [TA_KIND_REF_LEAK]             = { "ref.leak",             TA_CLASS_LEAK,  NULL },
  [TA_KIND_GPU_POOL_RETAINED]    = { "gpu.pool-retained",    TA_CLASS_LEAK,  "GPU memory retained by the pool" },
  [TA_KIND_LEAK_POSSIBLE]        = { "leak.possible",        TA_CLASS_LEAK,  "Possible leak" },
  [TA_KIND_LEAK_GROWTH]          = { "leak.growth",          TA_CLASS_HELD,  NULL },
  [TA_KIND_UNCLASSIFIED]         = { "unclassified",         TA_CLASS_HELD,  NULL },
};

ta_kind ta_kind_of(const char *name) {
  if (name)
    for (int k = 0; k < TA_KIND_COUNT; k++)
      if (strcmp(name, ta_kinds[k].name) == 0) return (ta_kind)k;
  return TA_KIND_UNKNOWN;
}

const char *ta_kind_name(ta_kind k) {
  return (unsigned)k < TA_KIND_COUNT ? ta_kinds[k].name : "unknown";
}

ta_kind_class ta_kind_class_of(const char *name) {
  ta_kind k = ta_kind_of(name);
  if (k != TA_KIND_UNKNOWN) return ta_kinds[k].kclass;
  if (!name) return TA_CLASS_ERROR;
  size_t n = strlen(name);
  if (strncmp(name, "leak.", 5) == 0 || (n >= 5 && strcmp(name + n - 5, ".leak") == 0)) return TA_CLASS_LEAK;
  return TA_CLASS_ERROR;
}

int ta_kind_rank(const char *name) {
  ta_kind k = ta_kind_of(name);
  if (k != TA_KIND_UNKNOWN) return (int)k;
  /* an unknown kind ranks with the last kind of its class */
  return ta_kind_class_of(name) == TA_CLASS_LEAK ? TA_KIND_LEAK_POSSIBLE : TA_KIND_GPU_PURGE_REFERENCED;
}

const char *ta_kind_title(const char *name) {
  ta_kind k = ta_kind_of(name);
  return k != TA_KIND_UNKNOWN ? ta_kinds[k].title : NULL;
}

bool ta_kind_is_leak(const char *name) { return ta_kind_class_of(name) == TA_CLASS_LEAK; }
bool ta_kind_is_error(const char *name) { return ta_kind_class_of(name) == TA_CLASS_ERROR; }
bool ta_kind_is_held(const char *name) { return ta_kind_class_of(name) == TA_CLASS_HELD; }
