/* procmaps.c - the one reader of /proc/self/maps (see procmaps.h).  open,
 * read and close only: no stdio (it allocates), no lock, buffers on the
 * stack. */
#include "procmaps.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* A hex number at *p; false when there is none.  Moves *p past it. */
static bool hex(const char **p, uint64_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  for (;; s++) {
    int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
    if (d < 0) break;
    v = v << 4 | (uint64_t)d;
  }
  if (s == *p) return false;
  *p = s;
  *out = v;
  return true;
}

/* Past one field and the spaces after it. */
static const char *skip_field(const char *p) {
  while (*p && *p != ' ') p++;
  while (*p == ' ') p++;
  return p;
}

bool _ta_maps_parse(const char *line, ta_maps_entry *e) {
  const char *p = line;
  uint64_t lo, hi, off;
  if (!hex(&p, &lo) || *p++ != '-' || !hex(&p, &hi) || *p++ != ' ') return false;
  for (int i = 0; i < 4; i++)
    if (!p[i] || p[i] == ' ') return false;
  memcpy(e->perms, p, 4);
  e->perms[4] = '\0';
  p += 4;
  if (*p++ != ' ' || !hex(&p, &off) || *p++ != ' ') return false;
  p = skip_field(p);   /* dev */
  p = skip_field(p);   /* inode; then the path, spaces and all, or nothing */
  e->lo = (uintptr_t)lo;
  e->hi = (uintptr_t)hi;
  e->offset = off;
  e->path = p;
  e->line = line;
  e->len = strlen(line);
  return true;
}

int _ta_maps_each(ta_maps_fn *fn, void *arg) {
  int fd;
  do fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  char buf[4096], line[TA_MAPS_LINE];
  size_t ll = 0;
  int stop = 0;
  while (!stop) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n && !stop; i++) {
      if (buf[i] != '\n') {
        if (ll < sizeof line - 1) line[ll++] = buf[i];
        continue;
      }
      line[ll] = '\0';
      ll = 0;
      ta_maps_entry e;
      if (_ta_maps_parse(line, &e)) stop = fn(&e, arg);
    }
  }
  close(fd);
  return stop;
}
