/* sites.c - allocations from two functions, for `tagalloc diff`
 * (tests/cli/run.sh builds it as is, with a comment line added above
 * make_table, in another folder, and with one more allocation). */
#include <stdlib.h>

static void *volatile sink;

static void make_table(int n) {
  for (int i = 0; i < n; i++) {
    sink = malloc(64);
    free(sink);
  }
}

static void make_buffer(void) {
  sink = malloc(4096);
  free(sink);
}

int main(void) {
  make_table(10);
  make_buffer();
  return 0;
}
