/* procmaps.h - the one reader of /proc/self/maps, for the ledger (the
 * scan's readable mappings, the trace's modules, the stacks of threads it
 * never met) and the symbolizer (the modules it reports to libdw).
 *
 *   static int each(const ta_maps_entry *e, void *arg) {
 *     if (e->perms[2] == 'x' && e->path[0] == '/') ...;   // an executable file mapping
 *     return 0;                                            // nonzero: stop
 *   }
 *   if (_ta_maps_each(each, &state) < 0) ...;              // the maps could not be read
 *
 * It allocates nothing (its buffers are on the caller's stack, about 8 KiB)
 * and takes no lock, so the allocator may call it anywhere: inside malloc,
 * at fork, in a signal handler on the guard's alternate stack. */
#ifndef TAGALLOC_PROCMAPS_H
#define TAGALLOC_PROCMAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest line kept whole: a path of PATH_MAX and the fields before it;
 * a longer line is cut (its path too). */
#define TA_MAPS_LINE 4224

/* One line of /proc/self/maps:
 * "7f12a0000000-7f12a0021000 r-xp 00001000 08:01 1234   /usr/lib/libc.so.6" */
typedef struct {
  uintptr_t   lo, hi;     /* the mapping [lo, hi) */
  char        perms[5];   /* "r-xp": read, write, execute, p(rivate) or s(hared) */
  uint64_t    offset;     /* of lo in the file */
  const char *path;       /* "/usr/lib/libc.so.6", "[heap]", "[stack]", or "" (anonymous) */
  const char *line;       /* the whole line, without its newline */
  size_t      len;        /* strlen(line) */
} ta_maps_entry;

/* Called for each line in order (the kernel lists mappings by address);
 * e and its strings live until it returns.  Nonzero stops the walk. */
typedef int ta_maps_fn(const ta_maps_entry *e, void *arg);

/* Parses one line (NUL-terminated, no newline) into e; e->path and e->line
 * point into it.  False when it does not have the shape above. */
bool _ta_maps_parse(const char *line, ta_maps_entry *e);

/* Walks /proc/self/maps: -1 when it cannot be opened, else 0, or the
 * nonzero value fn stopped with.  Lines that do not parse are skipped. */
int _ta_maps_each(ta_maps_fn *fn, void *arg);

#endif
