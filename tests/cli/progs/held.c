/* held.c - leaks 1,234,567 bytes in one block and holds 3,000,000 bytes in
 * three blocks that stay reachable until exit (tests/cli/run.sh). */
#include <stdlib.h>
#include <string.h>

static char *kept[3];

int main(int argc, char **argv) {
  for (int i = 0; i < 3; i++) {
    kept[i] = malloc(1000000);
    memset(kept[i], i, 4096);
  }
  if (argc > 1 && strcmp(argv[1], "--no-leak") == 0) return 0;
  char *lost = malloc(1234567);
  memset(lost, 7, 16);
  lost = NULL;
  return 0;
}
