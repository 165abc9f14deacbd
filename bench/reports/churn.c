/* churn.c - the program of the rendering benchmark (bench/reports/run.sh):
 * N allocation+free pairs (default 5,000,000: 10 million trace events) from
 * 8 callsites of different depths, 100 marks (ta_mark_now from the preload
 * when there is one), a tape that grows every iteration and 1,000 leaks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t ta_mark_now(void) __attribute__((weak));

static void *volatile sink;

__attribute__((noinline)) static void *site(int k, size_t n) {
  switch (k & 7) {
  case 0: return malloc(n);
  case 1: return malloc(n + 8);
  case 2: return calloc(1, n);
  case 3: return malloc(n * 2);
  case 4: return malloc(16);
  case 5: return malloc(n + 64);
  case 6: return malloc(24);
  default: return malloc(n + 1);
  }
}

__attribute__((noinline)) static void *deeper(int k, size_t n, int depth) {
  if (depth > 0) return deeper(k, n, depth - 1);
  return site(k, n);
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 5000000;
  long per = pairs / 100;
  void **tape = NULL;
  size_t ntape = 0;
  for (int it = 0; it < 100; it++) {
    if (ta_mark_now) ta_mark_now();
    for (long i = 0; i < per; i++) {
      void *p = deeper((int)i, 32 + (size_t)(i & 255), (int)(i % 5));
      sink = p;
      free(p);
    }
    void **nt = realloc(tape, (ntape + 1) * sizeof *nt);
    if (!nt) return 1;
    tape = nt;
    tape[ntape++] = malloc(256);
  }
  for (int i = 0; i < 1000; i++) sink = malloc(40);
  sink = tape;
  printf("%ld pairs\n", per * 100);
  return 0;
}
