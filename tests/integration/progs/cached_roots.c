/* Pointers held in pages of the page cache that this process's page table
 * does not map: a shared anonymous mapping written before a fork (the
 * child's page table starts without its parent's shared pages), and a
 * writable private mapping of a file whose page holds a block's address
 * written to the file with pwrite(2) and never touched through the
 * mapping.  Both mappings are a MiB, so the scan asks which of their pages
 * were touched.  memcheck reads every page of them.
 * Parent: 77 bytes (shared mapping) + 40 bytes (file) still reachable.
 * Child: those two blocks, and 24 bytes of its own held by a global:
 * 141 bytes in 3 blocks still reachable.  Nothing lost. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include "common.h"

#define MIB (1 << 20)
#define FILE_AT 200000               /* the block's address in the file: page 48 */

void **g_shared;
void *g_file;
char *g_child_own;                  /* not static: the store stays at -O2 */

NOINLINE void keep_in_shared(void) {
  g_shared = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_shared == MAP_FAILED) { say("mmap failed\n"); exit(2); }
  g_shared[70000] = malloc(77);      /* page 136 */
}

NOINLINE void keep_in_file(const char *path) {
  void *b = malloc(40);
  uintptr_t v = (uintptr_t)b;
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, MIB) != 0 || pwrite(fd, &v, sizeof v, FILE_AT) != sizeof v) {
    say("file failed\n");
    exit(2);
  }
  g_file = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (g_file == MAP_FAILED) { say("mmap file failed\n"); exit(2); }
  close(fd);
  unlink(path);
}

NOINLINE void child_keep(void) {
  g_child_own = malloc(24);
  memset(g_child_own, 'c', 24);
}

int main(void) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/cached_roots.%d", (int)getpid());
  keep_in_shared();
  keep_in_file(path);
  clobber_stack();
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    child_keep();
    clobber_stack();
    say("child done\n");
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  clobber_stack();
  say("parent done, child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
