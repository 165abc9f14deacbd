/* common.h - helpers for the integration programs.
 *
 * The programs write their output with write(2), never through stdio's
 * buffer: stdout's buffer is a malloc'd block of libc's that valgrind frees
 * at exit (freeres) and an auditor sees as reachable, which would blur the
 * exact numbers the programs are about.  Every leaking function is noinline
 * and every block escapes through an asm barrier, so no compiler flag can
 * optimise a leak away.  clobber_stack() wipes the dead stack below the
 * caller, so no stale copy of a lost pointer survives in a dead frame that a
 * conservative scan (valgrind's or tagalloc's) might read. */
#ifndef ITEST_COMMON_H
#define ITEST_COMMON_H
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone, used))

/* The compiler must assume p is stored somewhere and read back. */
static inline __attribute__((unused)) void escape(const void *p) {
  __asm__ volatile("" : : "g"(p) : "memory");
}

static __attribute__((unused)) void say(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 1) n = sizeof buf - 1;
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(1, p, (size_t)n);
    if (w <= 0) break;
    p += w;
    n -= (int)w;
  }
}

/* Into the directory of the program (argv[0]), where its libraries are,
 * so that dlopen("./libNAME.so") names each with a path of a fixed length
 * (ld.so's blocks for a library hold its name).  0 on success. */
static __attribute__((unused)) int chdir_to_program(const char *argv0) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", argv0);
  char *slash = strrchr(dir, '/');
  if (!slash) return 0;
  *slash = '\0';
  return chdir(dir);
}

static NOINLINE __attribute__((unused)) void clobber_stack(void) {
  volatile char pad[64 * 1024];
  for (size_t i = 0; i < sizeof pad; i++) pad[i] = 0;
}
#endif
