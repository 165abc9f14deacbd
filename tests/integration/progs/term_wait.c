/* For the termination-signal tests (tests/integration/signals.py; no
 * .expect: they send the signal).  Loses BLOCKS blocks of SIZE bytes,
 * says "ready", then waits for a signal.
 *
 *   term_wait            the default action: the signal ends it
 *   term_wait handler    its own SIGINT/SIGTERM handler sets a flag; main
 *                        says "handled" and returns 3
 *   term_wait big N      also keeps N blocks of 16 bytes reachable (a
 *                        longer exit scan) */
#include <signal.h>
#include <stdlib.h>
#include "common.h"

#define BLOCKS 100
#define SIZE 1000

static volatile sig_atomic_t got;
static void **kept;

static void on_signal(int sig) { got = sig; }

NOINLINE void lose_one(void) {
  char *p = malloc(SIZE);
  memset(p, 'x', SIZE);
  escape(p);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "handler") == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  if (argc > 2 && strcmp(argv[1], "big") == 0) {
    long n = atol(argv[2]);
    kept = malloc((size_t)n * sizeof *kept);
    for (long i = 0; i < n; i++) kept[i] = malloc(16);
  }
  for (int i = 0; i < BLOCKS; i++) lose_one();
  clobber_stack();
  say("ready\n");
  while (!got) pause();
  say("handled\n");
  return 3;
}
