/* grow.c - a long trace with marks: ITERS iterations (argv[1]) of CHURN
 * (argv[2]) blocks allocated and freed, and one 1,000-byte block kept per
 * iteration (a site that grows: leak.growth).  For the test that a report
 * of a trace holds a window of it, not the whole file. */
#include "tagalloc.h"

#include <stdlib.h>

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 100, churn = argc > 2 ? atoi(argv[2]) : 40000;
  void **keep = malloc(sizeof *keep * (size_t)iters);
  for (int i = 0; i < iters; i++) {
    for (int k = 0; k < churn; k++) {
      void *volatile p = malloc(64 + (size_t)(k & 255));
      free(p);
    }
    keep[i] = malloc(1000);
    ta_mark_now();
  }
  free(keep);   /* the kept blocks leak */
  return 0;
}
