/* A program that uses stdio and the locale like real programs do: printf
 * (stdout's buffer is malloc'd by libc), fopen/fclose, setlocale(LC_ALL, "")
 * and strerror.  memcheck frees libc's own blocks at exit (__libc_freeres),
 * so it reports nothing still reachable; one 24-byte leak of the program's. */
#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"

NOINLINE void leak_line(void) { char *p = malloc(24); strcpy(p, "a line of text"); escape(p); }

int main(void) {
  setlocale(LC_ALL, "");
  printf("%s %d\n", "stdio", 42);
  FILE *f = fopen("/proc/self/status", "r");
  char buf[256];
  if (f && fgets(buf, sizeof buf, f)) printf("first: %.4s\n", buf);
  if (f) fclose(f);
  printf("%s\n", strerror(ENOENT));
  leak_line();
  clobber_stack();
  return 0;
}
