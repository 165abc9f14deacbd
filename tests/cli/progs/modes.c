/* What each --check mode catches (tests/cli/run.sh): 1,600 writes after
 * free, 10 double frees, 5 frees of an interior pointer, 4 writes past a
 * block's end and 3 leaked blocks.  The quarantine reports each write
 * when the block leaves it; the 64 KiB frees push the 64-byte blocks out. */
#include <stdlib.h>

static void *volatile keep;

int main(void) {
  for (int i = 0; i < 1600; i++) {       /* a multiple of TAGALLOC_QUARANTINE_SAMPLE (16) */
    char *volatile p = malloc(64);
    free(p);
    p[0] = 1;                            /* byte 0 of the freed block */
  }
  for (int i = 0; i < 2000; i++) free(malloc(64 << 10));   /* push them out of a 1 MiB quarantine */
  for (int i = 0; i < 10; i++) {
    void *volatile p = malloc(48);
    free(p);
    free(p);
  }
  char *volatile in = malloc(32);
  for (int i = 0; i < 5; i++) free(in + 8);   /* NOLINT: the bad free tested */
  free(in);
  for (int i = 0; i < 4; i++) {
    char *volatile p = malloc(20);
    p[20] = 1;
    free(p);
  }
  for (int i = 0; i < 3; i++) keep = malloc(100);
  keep = NULL;
  return 0;
}
