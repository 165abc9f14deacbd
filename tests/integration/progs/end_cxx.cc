// Ends by returning from main after the last pointer to a new int[25] died
// deep in a call chain: 100 bytes definitely lost, 50 reachable (ends.h).
#include "ends.h"

static NOINLINE int spread_ints(int *p, int depth) {
  int *volatile slots[16];
  for (int i = 0; i < 16; i++) slots[i] = p;
  int r = depth > 0 ? spread_ints(p, depth - 1) : 0;
  escape((const void *)slots);
  return r + (slots[depth & 15] != nullptr);
}

static NOINLINE void lose_ints(void) {
  int *p = new int[25];
  for (int i = 0; i < 25; i++) p[i] = i;
  spread_ints(p, 64);
}

int main() {
  keep_global();
  lose_ints();
  say("returning\n");
  return 0;
}
