/* One 64 MiB leak, every page touched.
 *
 * (Under memcheck, run.sh --valgrind passes --aspace-minaddr=0x100000000:
 * memcheck otherwise places big blocks at low addresses, where a 64 MiB
 * block covers ordinary integers that live in memory - ld.so's ELF hashes of
 * symbol versions, AT_HWCAP in the auxiliary vector - and memcheck takes
 * them for interior pointers: "possibly lost".  The truth is "definitely
 * lost", and tagalloc's blocks live at jemalloc's high addresses.) */
#include <stdlib.h>
#include "common.h"

NOINLINE void leak_64mib(void) {
  char *p = malloc((size_t)64 << 20);
  for (size_t i = 0; i < ((size_t)64 << 20); i += 4096) p[i] = (char)i;
  escape(p);
}

int main(void) {
  leak_64mib();
  clobber_stack();
  say("leaked 64 MiB\n");
  return 0;
}
