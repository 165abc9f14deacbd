/* nocuda.c - a program without the CUDA driver: the auditor's dlopen
 * must behave as glibc's.  It dlopens libplain.so by its bare name, found
 * only through this program's DT_RUNPATH ($ORIGIN/plain): a dlopen wrapper
 * that called glibc's from its own code would search the wrong RUNPATH.
 * It dlopens libcuda.so.1 too, which is not there (LD_LIBRARY_PATH has no
 * driver): NULL and dlerror's message, as without the auditor.  It leaks
 * one 77-byte block from leak77 (a host leak, reported as always). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile sink;

__attribute__((noipa)) static void leak77(void) {
  sink = malloc(77);
  sink = NULL;
}

/* No stale copy of the block's address is left on the dead stack. */
__attribute__((noipa)) static void scribble(void) {
  char buf[16384];
  memset(buf, 0, sizeof buf);
  __asm__ volatile("" : : "r"(buf) : "memory");
}

int main(void) {
  void *h = dlopen("libplain.so", RTLD_NOW);
  if (h == NULL) {
    printf("libplain.so: %s\n", dlerror());
    return 1;
  }
  int (*plain)(int) = (int (*)(int))dlsym(h, "plain_twice");
  printf("plain_twice(21) = %d\n", plain ? plain(21) : -1);
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  const char *err = cu ? NULL : dlerror();
  printf("libcuda.so.1: %s\n", cu ? "loaded" : (err && strstr(err, "libcuda.so.1") ? "not found" : "?"));
  leak77();
  scribble();
  return 0;
}
