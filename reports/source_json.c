/* source_json.c - one process's findings as a JSON object (report.h), from
 * any report_source: the running ledger or a trace read offline.  The text
 * is built in memory and written with write(2).  Strings are escaped; bytes
 * that are not UTF-8 become U+FFFD, so the output is always valid JSON. */
#include "report.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char  *s;
  size_t len, cap;
  bool   oom;
} jbuf;

static void j_put(jbuf *b, const char *s, size_t n) {
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

static void j_lit(jbuf *b, const char *s) { j_put(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3)))
static void j_printf(jbuf *b, const char *fmt, ...) {
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

static void j_str(jbuf *b, const char *s) {
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

static void j_addr(jbuf *b, uint64_t a) { j_printf(b, "\"0x%llx\"", (unsigned long long)a); }

/* ---- stacks and findings ------------------------------------------------------- */

static void j_stack(jbuf *b, const report_source *src, uint32_t stack) {
  const uintptr_t *pcs = NULL;
  size_t n = stack ? src->stack_frames(src->arg, stack, &pcs) : 0;
  j_put(b, "[", 1);
  report_ctx *ctx = n && pcs ? report_source_ctx(src) : NULL;
  bool first = true;
  for (size_t i = 0; pcs && i < n; i++) {
    report_frame fr[REPORT_MAX_INLINE];
    int k = ctx ? report_symbolize(ctx, pcs[i], fr, REPORT_MAX_INLINE) : 0;
    if (k <= 0) {
      memset(fr, 0, sizeof fr[0]);
      fr[0].address = pcs[i];
      k = 1;
    }
    for (int j = 0; j < k; j++) {
      if (!first) j_put(b, ",", 1);
      first = false;
      j_lit(b, "{\"function\":");
      j_str(b, fr[j].function);
      j_lit(b, ",\"file\":");
      j_str(b, fr[j].file);
      if (fr[j].line > 0) j_printf(b, ",\"line\":%d", fr[j].line);
      else j_lit(b, ",\"line\":null");
      j_lit(b, ",\"module\":");
      j_str(b, fr[j].module);
      j_lit(b, ",\"address\":");
      j_addr(b, fr[j].address);
      if (fr[j].module) j_printf(b, ",\"module_offset\":\"0x%llx\"", (unsigned long long)fr[j].module_offset);
      if (fr[j].inlined) j_lit(b, ",\"inlined\":true");
      j_put(b, "}", 1);
    }
  }
  j_put(b, "]", 1);
}

typedef struct {
  jbuf                *b;
  const report_source *src;
  report_suppressions *supp;
  size_t               count, findings;   /* written; leaks and errors among them */
  ta_summary           cut;               /* suppressed leak bytes/blocks, by category */
  uint64_t             cut_unclassified_bytes, cut_unclassified_blocks;
  uint64_t             sup_bytes, sup_blocks;
} jvisit;

static int j_finding(const ta_finding *f, void *arg) {
  jvisit *v = arg;
  jbuf *b = v->b;
  if (!f || !f->kind) return 0;
  if (v->supp && report_suppressed(f, v->src, v->supp)) {
    uint64_t *bytes = NULL, *blocks = NULL;
    if (strcmp(f->kind, "leak.direct") == 0) bytes = &v->cut.direct_bytes, blocks = &v->cut.direct_blocks;
    else if (strcmp(f->kind, "leak.indirect") == 0) bytes = &v->cut.indirect_bytes, blocks = &v->cut.indirect_blocks;
    else if (strcmp(f->kind, "leak.possible") == 0) bytes = &v->cut.possible_bytes, blocks = &v->cut.possible_blocks;
    else if (strcmp(f->kind, "leak.orphan") == 0) bytes = &v->cut.orphan_bytes, blocks = &v->cut.orphan_blocks;
    else if (strcmp(f->kind, "unclassified") == 0) bytes = &v->cut_unclassified_bytes, blocks = &v->cut_unclassified_blocks;
    if (bytes) {
      *bytes += f->bytes;
      *blocks += f->blocks;
      v->sup_bytes += f->bytes;
      v->sup_blocks += f->blocks;
    }
    return 0;
  }
  bool error = !report_kind_is_leak(f->kind);
  if (v->count++) j_put(b, ",", 1);
  if (strcmp(f->kind, "unclassified") != 0) v->findings++;
  j_lit(b, "\n    {\"kind\":");
  j_str(b, f->kind);
  j_printf(b, ",\"bytes\":%llu,\"blocks\":%llu,\"tag\":", (unsigned long long)f->bytes,
           (unsigned long long)f->blocks);
  j_str(b, f->tag != TA_ANY ? report_source_tag(v->src, f->tag) : NULL);
  j_lit(b, ",\"address\":");
  j_addr(b, f->addr);
  j_lit(b, ",\"stack\":");
  j_stack(b, v->src, f->stack);
  if (error || (f->alloc_stack && f->alloc_stack != f->stack)) {
    j_lit(b, ",\"alloc_stack\":");
    j_stack(b, v->src, f->alloc_stack);
  }
  j_lit(b, ",\"free_stack\":");
  j_stack(b, v->src, f->free_stack);
  if (f->aux_stack) {
    j_lit(b, ",\"aux_stack\":");
    j_stack(b, v->src, f->aux_stack);
  }
  if (f->holder) {
    j_lit(b, ",\"holder\":");
    j_addr(b, f->holder);
  }
  if (f->slot) {
    j_lit(b, ",\"slot\":");
    j_str(b, f->slot);
  }
  if (f->detail[0]) {
    char d[sizeof f->detail + 1];
    memcpy(d, f->detail, sizeof f->detail);
    d[sizeof f->detail] = '\0';
    j_lit(b, ",\"detail\":");
    j_str(b, d);
  }
  j_put(b, "}", 1);
  return 0;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

static void j_pair(jbuf *b, const char *name, uint64_t bytes, uint64_t blocks) {
  j_printf(b, "\"%s\":{\"bytes\":%llu,\"blocks\":%llu}", name, (unsigned long long)bytes,
           (unsigned long long)blocks);
}

int report_source_json(int fd, const report_source *src, const report_process_info *info) {
  jbuf fb = { 0 }, b = { 0 };
  jvisit v = { .b = &fb, .src = src,
               .supp = src->suppressions ? src->suppressions : report_suppressions_default() };
  if (v.supp) report_suppressions_reset_used(v.supp);
  src->visit(src->arg, j_finding, &v);
  ta_summary s = src->summary(src->arg);

  j_printf(&b, "{\"pid\":%ld,\"findings_count\":%zu,\"errors\":%llu", src->pid, v.findings,
           (unsigned long long)s.errors);
  if (info && info->ppid >= 0) j_printf(&b, ",\"ppid\":%ld", info->ppid);
  else j_lit(&b, ",\"ppid\":null");
  j_lit(&b, ",\"argv\":");
  if (info && info->argv) {
    j_put(&b, "[", 1);
    for (int i = 0; i < info->argc; i++) {
      if (i) j_put(&b, ",", 1);
      j_str(&b, info->argv[i]);
    }
    j_put(&b, "]", 1);
  } else {
    j_lit(&b, "null");
  }
  if (info && info->exit_code >= 0) j_printf(&b, ",\"exit_code\":%d", info->exit_code);
  else j_lit(&b, ",\"exit_code\":null");
  if (info && info->signal > 0) j_printf(&b, ",\"signal\":%d", info->signal);
  else j_lit(&b, ",\"signal\":null");
  int clean = info && info->clean_exit >= 0 ? info->clean_exit : -1;
  if (clean < 0 && src->unclassified) clean = 0;
  j_lit(&b, clean < 0 ? ",\"clean_exit\":null" : clean ? ",\"clean_exit\":true" : ",\"clean_exit\":false");
  j_lit(&b, ",\"trace\":");
  j_str(&b, info ? info->trace : NULL);

  j_lit(&b, ",\n  \"summary\":{");
  j_pair(&b, "direct", minus(s.direct_bytes, v.cut.direct_bytes), minus(s.direct_blocks, v.cut.direct_blocks));
  j_put(&b, ",", 1);
  j_pair(&b, "indirect", minus(s.indirect_bytes, v.cut.indirect_bytes),
         minus(s.indirect_blocks, v.cut.indirect_blocks));
  j_put(&b, ",", 1);
  j_pair(&b, "possible", minus(s.possible_bytes, v.cut.possible_bytes),
         minus(s.possible_blocks, v.cut.possible_blocks));
  j_put(&b, ",", 1);
  j_pair(&b, "reachable", s.reachable_bytes, s.reachable_blocks);
  j_put(&b, ",", 1);
  j_pair(&b, "orphan", minus(s.orphan_bytes, v.cut.orphan_bytes), minus(s.orphan_blocks, v.cut.orphan_blocks));
  if (src->unclassified) {
    j_put(&b, ",", 1);
    j_pair(&b, "unclassified", minus(src->unclassified_bytes, v.cut_unclassified_bytes),
           minus(src->unclassified_blocks, v.cut_unclassified_blocks));
  }
  j_put(&b, ",", 1);
  j_pair(&b, "suppressed", v.sup_bytes, v.sup_blocks);
  j_printf(&b, ",\"allocs\":%llu,\"frees\":%llu,\"peak_bytes\":%llu,\"errors\":%llu}",
           (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.peak_bytes,
           (unsigned long long)s.errors);

  j_lit(&b, ",\n  \"findings\":[");
  if (fb.s) j_put(&b, fb.s, fb.len);
  j_lit(&b, v.count ? "\n  ]" : "]");

  j_lit(&b, ",\n  \"suppressions\":[");
  size_t nu = v.supp ? report_suppressions_used(v.supp, NULL, 0) : 0;
  report_suppression_use *u = nu ? malloc(nu * sizeof *u) : NULL;
  if (u) {
    nu = report_suppressions_used(v.supp, u, nu);
    for (size_t i = 0; i < nu; i++) {
      j_lit(&b, i ? "," : "");
      j_lit(&b, "{\"type\":");
      j_str(&b, u[i].type);
      j_lit(&b, ",\"pattern\":");
      j_str(&b, u[i].pattern);
      j_printf(&b, ",\"count\":%llu,\"bytes\":%llu}", (unsigned long long)u[i].hits,
               (unsigned long long)u[i].bytes);
    }
    free(u);
  }
  j_lit(&b, "]}");

  int rc = 0;
  if (b.oom || fb.oom) {
    rc = -1;
  } else {
    size_t off = 0;
    while (off < b.len) {
      ssize_t r = write(fd, b.s + off, b.len - off);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        rc = -1;
        break;
      }
      off += (size_t)r;
    }
  }
  free(b.s);
  free(fb.s);
  return rc;
}
