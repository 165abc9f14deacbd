/* Ends by exit(5) inside a SIGUSR1 handler that the program raised: the
 * handler's frame, live at exit, holds the only pointer to a 77-byte
 * block: still reachable (the roots start at the handler's frame, the
 * caller of exit, not at the caller of raise under it). */
#include <signal.h>
#include <stdlib.h>
#include "common.h"

static void on_usr1(int sig) {
  char *volatile held = malloc(77);
  memset(held, 1, 77);
  (void)sig;
  say("exiting in the handler\n");
  exit(5);
}

int main(void) {
  signal(SIGUSR1, on_usr1);
  clobber_stack();
  raise(SIGUSR1);
  say("not reached\n");
  return 0;
}
