/* beside.c - the records beside their blocks (alloc/beside.h), as a
 * program sees them in the default mode: a write just before a small block
 * (line 17) changes its record, which its free (line 18) finds and reports
 * as heap.overflow, and the program goes on; a live block written past its
 * end is found at exit; malloc_usable_size says the bytes asked for, with
 * the record beside the block (100) or in the table (5000). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

static char *volatile keep;

int main(void) {
  char *volatile u = malloc(32);
  char *volatile v = malloc(100);
  char *volatile w = malloc(5000);
  u[-1] = 7;                                   /* before the block */
  free(u);
  keep = malloc(40);
  keep[40] = 1;                                /* past the end, found at exit */
  printf("%zu %zu\n", malloc_usable_size(v), malloc_usable_size(w));
  free(v);
  free(w);
  return 0;
}
