/* For dlopen_fini: a library whose destructor, run by ld.so at exit, frees
 * the block its first global holds and drops its second global's pointer
 * without freeing that block. */
#include <stdlib.h>
#include <string.h>

static char *g_freed_at_exit;
char *g_dropped_at_exit;               /* not static: the store stays at -O2 */

__attribute__((noinline)) void fini_setup(void) {
  g_freed_at_exit = malloc(300);
  memset(g_freed_at_exit, 'f', 300);
  g_dropped_at_exit = malloc(200);
  memset(g_dropped_at_exit, 'd', 200);
}

__attribute__((destructor)) static void fini_cleanup(void) {
  free(g_freed_at_exit);
  g_freed_at_exit = NULL;
  g_dropped_at_exit = NULL;
}
