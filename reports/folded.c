/* folded.c - folded stacks (model.h): "outer;...;inner bytes", one line per
 * stack, for flamegraph.pl and speedscope.  The weights are the model's:
 * the leaked groups' bytes by allocation stack (REPORT_FOLDED_LEAKED), or
 * each allocation stack's live bytes at its process's peak
 * (REPORT_FOLDED_PEAK).  Lines are sorted by weight, heaviest first; two
 * stacks that fold to the same text are one line.  A ';' in a frame's name
 * (never in C, rare in C++) becomes ':' so the line still splits right. */
#include "jbuf.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char    *text;
  uint64_t value;
} line;

static int by_value(const void *a, const void *b) {
  const line *x = a, *y = b;
  if (x->value != y->value) return x->value < y->value ? 1 : -1;
  return strcmp(x->text, y->text);
}

static int by_text(const void *a, const void *b) { return strcmp(((const line *)a)->text, ((const line *)b)->text); }

static void put_name(jbuf *b, const char *s) {
  for (; *s; s++) {
    char c = *s == ';' ? ':' : *s == '\n' ? ' ' : *s;
    j_put(b, &c, 1);
  }
}

int report_folded_write(int fd, report_model *m, report_folded_what what) {
  line *v = NULL;
  size_t n = 0, cap = 0;
  bool oom = false;
  for (size_t pi = 0; pi < m->nprocs && !oom; pi++) {
    report_process *p = m->procs[pi];
    size_t k = what == REPORT_FOLDED_LEAKED ? p->ngroups : p->tm ? p->tm->nsites : 0;
    for (size_t i = 0; i < k && !oom; i++) {
      uint32_t stack;
      uint64_t value;
      if (what == REPORT_FOLDED_LEAKED) {
        if (!ta_kind_is_leak(p->groups[i].kind)) continue;
        stack = p->groups[i].stack;
        value = p->groups[i].bytes;
      } else {
        stack = p->tm->sites[i].stack;
        value = p->tm->sites[i].peak_bytes;
      }
      if (!value) continue;
      jbuf b = { 0 };
      if (m->nprocs > 1) j_printf(&b, "[pid %ld]", p->pid);
      const report_mstack *st = report_process_stack(p, stack);
      if (!st || !st->nframes) {
        j_lit(&b, b.len ? ";<no stack recorded>" : "<no stack recorded>");
      } else {
        for (size_t f = st->nframes; f-- > 0;) {
          char buf[128];
          if (b.len) j_put(&b, ";", 1);
          put_name(&b, report_frame_label(&st->frames[f], buf, sizeof buf));
        }
      }
      if (!b.oom && n == cap) {
        size_t nc = cap ? cap * 2 : 256;
        line *nv = realloc(v, nc * sizeof *nv);
        if (nv) v = nv, cap = nc;
        else b.oom = true;
      }
      if (b.oom) {
        free(b.s);
        oom = true;
        break;
      }
      v[n++] = (line){ b.s, value };
    }
  }
  /* the same text twice: one line */
  if (!oom && n > 1) {
    qsort(v, n, sizeof *v, by_text);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
      if (w && strcmp(v[w - 1].text, v[i].text) == 0) {
        v[w - 1].value += v[i].value;
        free(v[i].text);
      } else {
        v[w++] = v[i];
      }
    }
    n = w;
    qsort(v, n, sizeof *v, by_value);
  }
  jbuf out = { 0 };
  for (size_t i = 0; i < n; i++) {
    if (!oom) {
      j_lit(&out, v[i].text);
      j_printf(&out, " %llu\n", (unsigned long long)v[i].value);
    }
    free(v[i].text);
  }
  free(v);
  int rc = !oom && j_write(fd, &out) ? 0 : -1;
  free(out.s);
  return rc;
}
