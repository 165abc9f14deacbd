/* jbuf.c - a growing text buffer and JSON string escaping (jbuf.h). */
#include "jbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>


void j_put(jbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void j_lit(jbuf *b, const char *s) { j_put(b, s, strlen(s)); }

void j_printf(jbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  j_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* The length of the UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t k;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) k = 2, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) k = 3, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) k = 4, min = 0x10000;
  else return 0;
  if (k > n) return 0;
  unsigned v = c & (0xFF >> (k + 1));
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  return k;
}

void j_str(jbuf *b, const char *s) {
  if (!s) {
    j_lit(b, "null");
    return;
  }
  j_put(b, "\"", 1);
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n) {
    unsigned c = *p;
    if (c == '"' || c == '\\') {
      char e[2] = { '\\', (char)c };
      j_put(b, e, 2);
      p++, n--;
    } else if (c == '<' || c == '>' || c == '&') {
      /* escaped, so the JSON can sit inside an HTML <script> (C++ names
       * have < and >): the same string to a JSON reader */
      j_printf(b, "\\u%04x", c);
      p++, n--;
    } else if (c < 0x20) {
      const char *e = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
      if (e) j_lit(b, e);
      else j_printf(b, "\\u%04x", c);
      p++, n--;
    } else {
      size_t k = utf8_len(p, n);
      if (k == 0) {
        j_lit(b, "\\ufffd");
        k = 1;
      } else {
        j_put(b, (const char *)p, k);
      }
      p += k, n -= k;
    }
  }
  j_put(b, "\"", 1);
}

void j_addr(jbuf *b, uint64_t a) { j_printf(b, "\"0x%llx\"", (unsigned long long)a); }


bool j_write(int fd, const jbuf *b) {
  if (b->oom) return false;
  size_t off = 0;
  while (off < b->len) {
    ssize_t r = write(fd, b->s + off, b->len - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += (size_t)r;
  }
  return true;
}
