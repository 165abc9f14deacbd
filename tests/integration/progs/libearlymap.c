/* For early_map: a library whose constructor maps a region before any
 * allocation.  The program's libraries are initialized before the
 * auditor's preload, and the ledger starts at the first allocation. */
#include <stddef.h>
#include <sys/mman.h>

void **early_region;                   /* MAP_FAILED when the mapping failed */
void **early_gone;                     /* mapped and unmapped again: no root */

__attribute__((constructor)) static void early_map_region(void) {
  early_region = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  early_gone = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (early_gone != MAP_FAILED) munmap(early_gone, 1 << 16);
}
