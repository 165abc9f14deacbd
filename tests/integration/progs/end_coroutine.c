/* Ends by exit(5) in a coroutine: a context made with makecontext on a
 * malloc'd stack, entered with swapcontext.  The roots are the
 * coroutine's stack (a block, reachable from a global) from its frame up
 * (it holds a 77-byte block) and the thread's own stack, where main waits
 * in swapcontext holding a 33-byte block.  A block's last pointer died
 * deep in the coroutine's calls: the copies lie in the dead part of its
 * stack, which is not read (memcheck holds those words undefined). */
#include <ucontext.h>
#include "ends.h"

#define CO_BYTES 65536

static char *g_co;
static ucontext_t main_ctx, co_ctx;

static void co_main(void) {
  lose_deep();
  char *volatile held = malloc(77);
  memset(held, 'h', 77);
  say("exiting in the coroutine\n");
  exit(5);
}

static NOINLINE void run(void) {
  char *volatile mine = malloc(33);
  memset(mine, 'm', 33);
  swapcontext(&main_ctx, &co_ctx);
  escape((const void *)&mine);
}

int main(void) {
  keep_global();
  g_co = malloc(CO_BYTES);
  escape(&g_co);
  if (getcontext(&co_ctx) != 0) {
    say("getcontext failed\n");
    return 2;
  }
  co_ctx.uc_stack.ss_sp = g_co;
  co_ctx.uc_stack.ss_size = CO_BYTES;
  co_ctx.uc_link = &main_ctx;
  makecontext(&co_ctx, co_main, 0);
  run();
  say("not reached\n");
  return 0;
}
