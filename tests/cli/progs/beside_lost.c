/* beside_lost.c - a 40-byte block whose record (the 16 bytes before it,
 * alloc/beside.h) is written, then lost: the exit scan still counts it, a
 * direct leak of its 48 usable bytes (jemalloc's 64-byte block less the
 * record), with no stack, the record that held it being gone. */
#include <stdlib.h>

int main(void) {
  char *volatile a = malloc(40);
  a[-3] = 9;
  a = NULL;
  return 0;
}
