/* Ends by exit(5) in a SIGUSR1 handler that runs on a malloc'd alternate
 * signal stack (sigaltstack, SA_ONSTACK).  The roots are both stacks:
 * the alternate one from the handler's frame up (it holds a 77-byte
 * block) and the thread's own from where the signal interrupted it up
 * (main's frame holds a 33-byte block).  In the handler a block's last
 * pointer dies deep in a call chain, leaving copies in the dead part of
 * the alternate stack: that stack is a block of the program's, reachable
 * from a global, but its words below the stack pointer are not read, as
 * memcheck holds them undefined.  (The scan once read from the alternate
 * stack to the end of the thread's own, every mapping between them, and
 * died of SIGBUS.) */
#include <signal.h>
#include "ends.h"

#define ALT_BYTES 65536

static char *g_alt;

static void on_usr1(int sig) {
  (void)sig;
  lose_deep();
  char *volatile held = malloc(77);
  memset(held, 'h', 77);
  say("exiting in the handler\n");
  exit(5);
}

static NOINLINE void run(void) {
  char *volatile mine = malloc(33);
  memset(mine, 'm', 33);
  raise(SIGUSR1);
  escape((const void *)&mine);
}

int main(void) {
  keep_global();
  g_alt = malloc(ALT_BYTES);
  escape(&g_alt);
  stack_t ss = { .ss_sp = g_alt, .ss_size = ALT_BYTES, .ss_flags = 0 };
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_ONSTACK;
  if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0) {
    say("sigaltstack failed\n");
    return 2;
  }
  run();
  say("not reached\n");
  return 0;
}
