/* internal.h - what gpu/'s files share (never included outside gpu/).
 * Prototypes grouped by the file that defines them. */
#ifndef TAGALLOC_GPU_INTERNAL_H
#define TAGALLOC_GPU_INTERNAL_H

#include "gpu.h"

#include <stdarg.h>
#include <stdbool.h>

/* ---- select.c ---------------------------------------------------------- */
/* Parses a byte count with an optional K/M/G suffix ("512M"); false when s
 * is not one. */
bool _gpu_parse_size(const char *s, size_t *out);

/* ---- host.c: the host backend's device memory, streams and events ------ */
/* Sets this thread's host-backend message (last_error) and returns st. */
gpu_status _gpu_host_fail(gpu_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* true when [p, p + bytes) lies in memory the host backend handed out. */
bool _gpu_host_owns(const void *p, size_t bytes);
/* The capacity TAGALLOC_GPU_HOST_MEM sets (default GPU_HOST_DEFAULT_MEM). */
size_t _gpu_host_capacity(void);

/* ---- host_ops.c: the host backend's kernels (their entries in the table) - */
void _gpu_host_ops_fill(gpu_backend *b);

#endif
