/* Built as libdlleak.so and dlopen'ed by dlopen_leak: lib_leak_buffer()
 * leaks 77 bytes; lib_make_cache() keeps 33 bytes in the library's own
 * global, which becomes lost when dlclose unmaps the library's data. */
#include <stdlib.h>
#include <string.h>

static char *lib_cache;

__attribute__((noinline)) void lib_leak_buffer(void) {
  char *p = malloc(77);
  memset(p, 7, 77);
  __asm__ volatile("" : : "g"(p) : "memory");
}

__attribute__((noinline)) int lib_make_cache(void) {
  lib_cache = malloc(33);
  memset(lib_cache, 3, 33);
  return lib_cache[0];
}
