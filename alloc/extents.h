/* extents.h - the ledger's own mappings and the program's (extents.c),
 * and mmap/munmap as system calls. */
#ifndef TAGALLOC_EXTENTS_H
#define TAGALLOC_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

/* ---- extents.c: the ledger's own mappings ------------------------------------ */

/* Mappings the ledger made for itself (the preload's raw arena records its
 * region here too): never scanned. */
/* mmap and munmap as system calls: the ledger never calls the libc symbols,
 * which the preload interposes to record the program's mappings. */
void  *_ta_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off);
int    _ta_sys_munmap(void *p, size_t len);
void  *_ta_mmap(size_t len);            /* read-write, recorded as the ledger's */
void   _ta_munmap(void *p, size_t len);
void   _ta_own_range(uintptr_t lo, uintptr_t hi);   /* a mapping made elsewhere, ours */
size_t _ta_own_ranges(uintptr_t *lo, uintptr_t *hi, size_t max);
/* Mappings the program made (the preload records its mmap, munmap, mremap):
 * roots of the scan, clipped to what is readable and resident. */
void   _ta_program_map(uintptr_t lo, uintptr_t hi);
void   _ta_program_unmap(uintptr_t lo, uintptr_t hi);
size_t _ta_program_maps(uintptr_t *lo, uintptr_t *hi, size_t max);
size_t _ta_program_maps_count(void);
void   _ta_extents_fork(int phase);

#endif
