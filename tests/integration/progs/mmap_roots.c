/* Pointers kept in memory the program mapped itself (as Python keeps its
 * objects in mmap'd arenas): a block pointed to from an anonymous mapping is
 * still reachable; one whose only pointer sat in a mapping that was
 * unmapped is lost; a mapping moved by mremap still holds its pointer; a
 * read-only file mapping is no root.
 * Reachable: 100 (anonymous) + 200 (after mremap) = 300 bytes in 2 blocks.
 * Lost: 48 bytes (its mapping unmapped) + 24 bytes (pointer only in a
 * read-only mapping of a file) in 2 blocks. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "common.h"

static void **g_region;          /* the mapping itself is reachable from here */
static void **g_moved;

static void **map_page(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { say("mmap failed\n"); exit(2); }
  return p;
}

NOINLINE void keep_in_mapping(void) { g_region[0] = malloc(100); }

NOINLINE void lose_with_mapping(void) {
  void **r = map_page(4096);
  r[3] = malloc(48);
  munmap(r, 4096);
}

NOINLINE void keep_across_mremap(void) {
  void **r = map_page(4096);
  r[1] = malloc(200);
  g_moved = mremap(r, 4096, 1 << 20, MREMAP_MAYMOVE);
  if (g_moved == MAP_FAILED) { say("mremap failed\n"); exit(2); }
  escape(g_moved);
}

NOINLINE void lose_behind_readonly(const char *path) {
  void *b = malloc(24);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  uintptr_t v = (uintptr_t)b;
  if (fd < 0 || write(fd, &v, sizeof v) != sizeof v) { say("write failed\n"); exit(2); }
  void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
  if (ro == MAP_FAILED) { say("mmap file failed\n"); exit(2); }
  close(fd);
  unlink(path);
  escape(ro);
}

int main(void) {
  g_region = map_page(1 << 16);
  keep_in_mapping();
  lose_with_mapping();
  keep_across_mremap();
  char path[64];
  snprintf(path, sizeof path, "/tmp/mmap_roots.%d", (int)getpid());
  lose_behind_readonly(path);
  clobber_stack();
  say("mapped\n");
  return 0;
}
