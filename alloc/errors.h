/* errors.h - the error path and the formatting helpers that never
 * allocate (error.c). */
#ifndef TAGALLOC_ERRORS_H
#define TAGALLOC_ERRORS_H

#include <stddef.h>

/* ---- error.c ------------------------------------------------------------- */

/* printf-like into a stack buffer, then to the handler; never allocates. */
void _ta_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Async-signal-safe formatting helpers (no malloc, no locale). */
int  _ta_snprintf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void _ta_write_all(int fd, const void *buf, size_t n);

#endif
