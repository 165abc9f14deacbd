/* Blocks whose only pointers lie in memory the program took without mmap:
 * past the break (sbrk, as an allocator of a program's own does) and in a
 * System V shared memory segment (shmat).  A second segment, detached
 * (shmdt) with its pointer, is no root any more.
 * Reachable: 11 (break) + 33 (segment) bytes in 2 blocks; lost: 55 bytes
 * (the detached segment's). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/shm.h>
#include <unistd.h>
#include "common.h"

void **g_brk, **g_shm;

static void **attach(void) {
  int id = shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0600);
  if (id < 0) { say("shmget failed\n"); exit(2); }
  void **s = shmat(id, NULL, 0);
  shmctl(id, IPC_RMID, NULL);             /* gone once detached (and at exit) */
  if (s == (void **)-1) { say("shmat failed\n"); exit(2); }
  return s;
}

NOINLINE void keep_past_break(void) {
  g_brk = sbrk(1 << 16);
  if (g_brk == (void **)-1) { say("sbrk failed\n"); exit(2); }
  g_brk[100] = malloc(11);
}

NOINLINE void keep_in_segment(void) {
  g_shm = attach();
  g_shm[200] = malloc(33);
}

NOINLINE void lose_with_segment(void) {
  void **s = attach();
  s[300] = malloc(55);
  shmdt(s);
}

int main(void) {
  keep_past_break();
  keep_in_segment();
  lose_with_segment();
  clobber_stack();
  say("kept\n");
  return 0;
}
