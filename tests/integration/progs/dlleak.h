/* dlleak.h - for the programs that dlopen libdlleak.so: calls its two
 * functions through the handle (lib_leak_buffer, then lib_make_cache) and
 * returns what the second returns, or -1 when dlsym fails. */
#ifndef TAGALLOC_ITEST_DLLEAK_H
#define TAGALLOC_ITEST_DLLEAK_H
#include <dlfcn.h>

static __attribute__((noinline, unused)) int dlleak_run(void *h) {
  void (*leak)(void) = (void (*)(void))dlsym(h, "lib_leak_buffer");
  int (*cache)(void) = (int (*)(void))dlsym(h, "lib_make_cache");
  if (!leak || !cache) return -1;
  leak();
  return cache();
}

#endif
