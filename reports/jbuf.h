/* jbuf.h - internal to reports/: a growing text buffer for the JSON and HTML
 * renderers, and JSON string escaping that is also safe inside an HTML
 * <script> block (< > & written as \u003c \u003e \u0026; bytes that are
 * not UTF-8 become U+FFFD).
 *
 *   jbuf b = { 0 };
 *   j_lit(&b, "{\"name\":");
 *   j_str(&b, name);                      // "..." escaped, or null for NULL
 *   j_put(&b, "}", 1);
 *   bool ok = j_write(fd, &b);            // false on a failed write or oom
 *   free(b.s);
 */
#ifndef REPORT_JBUF_H
#define REPORT_JBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  char  *s;
  size_t len, cap;
  bool   oom;                    /* an allocation failed: the text is incomplete */
} jbuf;

/* not exported from the shared library and the preload */
#define JBUF_API __attribute__((visibility("hidden")))

JBUF_API void j_put(jbuf *b, const char *s, size_t n);
JBUF_API void j_lit(jbuf *b, const char *s);
JBUF_API void j_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
JBUF_API void j_str(jbuf *b, const char *s);          /* a JSON string, or null */
JBUF_API void j_addr(jbuf *b, uint64_t a);            /* "0x..." */
JBUF_API bool j_write(int fd, const jbuf *b);

#endif
