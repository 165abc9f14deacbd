/* attrs.h - the compiler hints every file of the ledger and the preload
 * uses. */
#ifndef TAGALLOC_ATTRS_H
#define TAGALLOC_ATTRS_H

#define TA_LIKELY(x)   __builtin_expect(!!(x), 1)
#define TA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TA_NOINLINE    __attribute__((noinline))
#define TA_HIDDEN      __attribute__((visibility("hidden")))

#endif
