/* error.c - the one error path.  Formats into a stack buffer with its own
 * small printf (async-signal-safe: no malloc, no locale, no stdio) and hands
 * the message to the registered handler, by default a write(2) to stderr. */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

void _ta_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  int saved = errno;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    p += w;
    n -= (size_t)w;
  }
  errno = saved;
}

typedef struct { char *buf; size_t n, len; } outbuf;

static void put_c(outbuf *o, char c) {
  if (o->len + 1 < o->n) o->buf[o->len] = c;
  o->len++;
}

static void put_s(outbuf *o, const char *s, int width, bool left) {
  size_t len = strlen(s);
  if (!left)
    for (int i = (int)len; i < width; i++) put_c(o, ' ');
  for (size_t i = 0; i < len; i++) put_c(o, s[i]);
  if (left)
    for (int i = (int)len; i < width; i++) put_c(o, ' ');
}

static void put_u(outbuf *o, unsigned long long v, unsigned base, int width, char pad, bool neg) {
  char tmp[32];
  int i = 0;
  do {
    unsigned d = (unsigned)(v % base);
    tmp[i++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
    v /= base;
  } while (v);
  if (neg) tmp[i++] = '-';
  for (int k = i; k < width; k++) put_c(o, pad);
  while (i--) put_c(o, tmp[i]);
}

static int vformat(char *buf, size_t n, const char *fmt, va_list ap) {
  outbuf o = { buf, n, 0 };
  for (const char *f = fmt; *f; f++) {
    if (*f != '%') { put_c(&o, *f); continue; }
    f++;
    bool left = false;
    char pad = ' ';
    if (*f == '-') { left = true; f++; }
    if (*f == '0') { pad = '0'; f++; }
    int width = 0;
    while (*f >= '0' && *f <= '9') width = width * 10 + (*f++ - '0');
    int lng = 0;
    bool size = false;
    while (*f == 'l') { lng++; f++; }
    if (*f == 'z') { size = true; f++; }
    switch (*f) {
      case 's': { const char *s = va_arg(ap, const char *); put_s(&o, s ? s : "(null)", width, left); break; }
      case 'c': put_c(&o, (char)va_arg(ap, int)); break;
      case '%': put_c(&o, '%'); break;
      case 'p': {
        uintptr_t p = (uintptr_t)va_arg(ap, void *);
        put_c(&o, '0'); put_c(&o, 'x');
        put_u(&o, p, 16, 0, '0', false);
        break;
      }
      case 'd': case 'i': {
        long long v = size ? (long long)va_arg(ap, ssize_t)
                    : lng ? va_arg(ap, long) : va_arg(ap, int);
        put_u(&o, v < 0 ? -(unsigned long long)v : (unsigned long long)v, 10, width, pad, v < 0);
        break;
      }
      case 'u': case 'x': {
        unsigned long long v = size ? va_arg(ap, size_t)
                             : lng == 2 ? va_arg(ap, unsigned long long)
                             : lng ? va_arg(ap, unsigned long) : va_arg(ap, unsigned);
        put_u(&o, v, *f == 'x' ? 16 : 10, width, pad, false);
        break;
      }
      default: put_c(&o, '%'); if (*f) put_c(&o, *f); else f--; break;
    }
  }
  if (n) buf[o.len < n ? o.len : n - 1] = '\0';
  return (int)o.len;
}

int _ta_snprintf(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vformat(buf, n, fmt, ap);
  va_end(ap);
  return r;
}

static ta_error_fn *error_fn;
static void *error_arg;

void ta_error_handler(ta_error_fn *fn, void *arg) {
  error_arg = arg;
  error_fn = fn;
}

void _ta_error(int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vformat(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ta_error_fn *fn = error_fn;
  if (fn) {
    fn(code, msg, error_arg);
    return;
  }
  char line[600];
  int len = _ta_snprintf(line, sizeof line, "tagalloc: %s\n", msg);
  _ta_write_all(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
}
