/* Ends by returning from main after the last pointer to a block died deep
 * in a call chain (see ends.h): 100 bytes definitely lost, 50 reachable. */
#include "ends.h"

int main(void) {
  keep_global();
  lose_deep();
  say("returning\n");
  return 0;
}
