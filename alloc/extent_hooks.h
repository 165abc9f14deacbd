/* extent_hooks.h - jemalloc extent hooks shared by the arenas whose extents
 * the ledger carves from ranges of its own (meta.c: the ledger's memory;
 * tools/preload_raw.c: the preload's raw memory).  Such extents are never
 * given back, decommitted or purged: jemalloc retains and reuses them.
 * Each arena brings its own alloc (and merge, where it has mappings of
 * more than one kind). */
#ifndef TAGALLOC_EXTENT_HOOKS_H
#define TAGALLOC_EXTENT_HOOKS_H

#include <jemalloc/jemalloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Takes size bytes aligned to alignment (at least a page) from the bump
 * range [*bump, end); its start, or 0 when the range has no room. */
uintptr_t _ta_extent_carve(_Atomic uintptr_t *bump, uintptr_t end, size_t size, size_t alignment);

bool _ta_extent_keep(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind);
void _ta_extent_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind);
bool _ta_extent_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind);
bool _ta_extent_optout(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind);
bool _ta_extent_split(extent_hooks_t *h, void *addr, size_t size, size_t a, size_t b, bool committed,
                      unsigned ind);
bool _ta_extent_merge(extent_hooks_t *h, void *a, size_t asize, void *b, size_t bsize, bool committed,
                      unsigned ind);

#endif
