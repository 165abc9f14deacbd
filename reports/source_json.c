/* source_json.c - one process's findings as a JSON object (report.h), from
 * any report_source: the running ledger or a trace read offline.  The text
 * is built in memory and written with write(2).  Strings are escaped; bytes
 * that are not UTF-8 become U+FFFD, so the output is always valid JSON. */
#include "jbuf.h"
#include "model.h"
#include "report.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- stacks and findings ------------------------------------------------------- */

static void j_stack(jbuf *b, report_process *p, uint32_t stack) {
  const report_mstack *st = report_process_stack(p, stack);
  j_put(b, "[", 1);
  for (size_t i = 0; st && i < st->nframes; i++) {
    const report_mframe *f = &st->frames[i];
    if (i) j_put(b, ",", 1);
    j_lit(b, "{\"function\":");
    j_str(b, f->function);
    j_lit(b, ",\"file\":");
    j_str(b, f->file);
    if (f->line > 0) j_printf(b, ",\"line\":%d", f->line);
    else j_lit(b, ",\"line\":null");
    j_lit(b, ",\"module\":");
    j_str(b, f->module);
    j_lit(b, ",\"address\":");
    j_addr(b, f->address);
    if (f->module) j_printf(b, ",\"module_offset\":\"0x%llx\"", (unsigned long long)f->module_offset);
    if (f->inlined) j_lit(b, ",\"inlined\":true");
    j_put(b, "}", 1);
  }
  j_put(b, "]", 1);
}

static void j_finding(jbuf *b, report_process *p, const report_group *f) {
  bool error = ta_kind_is_error(f->kind);
  j_lit(b, "\n    {\"kind\":");
  j_str(b, f->kind);
  j_printf(b, ",\"bytes\":%llu,\"blocks\":%llu,\"tag\":", (unsigned long long)f->bytes,
           (unsigned long long)f->blocks);
  j_str(b, f->tag_name);
  j_lit(b, ",\"address\":");
  j_addr(b, f->addr);
  j_lit(b, ",\"stack\":");
  j_stack(b, p, f->stack);
  if (error || (f->alloc_stack && f->alloc_stack != f->stack)) {
    j_lit(b, ",\"alloc_stack\":");
    j_stack(b, p, f->alloc_stack);
  }
  j_lit(b, ",\"free_stack\":");
  j_stack(b, p, f->free_stack);
  if (f->aux_stack) {
    j_lit(b, ",\"aux_stack\":");
    j_stack(b, p, f->aux_stack);
  }
  if (f->holder) {
    j_lit(b, ",\"holder\":");
    j_addr(b, f->holder);
  }
  if (f->slot) {
    j_lit(b, ",\"slot\":");
    j_str(b, f->slot);
  }
  if (ta_kind_of(f->kind) == TA_KIND_LEAK_GROWTH)
    j_printf(b, ",\"slope\":%.3f,\"iterations\":%zu,\"first\":%llu,\"last\":%llu", f->slope, f->iterations,
             (unsigned long long)f->growth_first, (unsigned long long)f->growth_last);
  if (f->detail[0]) {
    j_lit(b, ",\"detail\":");
    j_str(b, f->detail);
  }
  if (f->nsites) {   /* the balance by callsite (ta_ref_balance): "paired" indexes this list */
    j_lit(b, ",\"ref_sites\":[");
    for (size_t i = 0; i < f->nsites; i++) {
      const ta_ref_site *st = &f->sites[i];
      j_printf(b, "%s{\"kind\":\"%s\",\"transitions\":%llu", i ? "," : "", st->delta > 0 ? "acquire" : "release",
               (unsigned long long)st->transitions);
      if (st->delta > 0) j_printf(b, ",\"balance\":%lld", (long long)st->balance);
      else if (st->paired < f->nsites) j_printf(b, ",\"paired\":%u", (unsigned)st->paired);
      else j_lit(b, ",\"paired\":null");
      j_lit(b, st->extra ? ",\"extra\":true,\"stack\":" : ",\"extra\":false,\"stack\":");
      j_stack(b, p, st->stack);
      j_put(b, "}", 1);
    }
    j_put(b, "]", 1);
  }
  j_put(b, "}", 1);
}

static void j_pair(jbuf *b, const char *name, uint64_t bytes, uint64_t blocks) {
  j_printf(b, "\"%s\":{\"bytes\":%llu,\"blocks\":%llu}", name, (unsigned long long)bytes,
           (unsigned long long)blocks);
}

/* "callsites": what a trace says of each allocation site (tagalloc diff). */
static void j_callsites(jbuf *b, const report_process *p) {
  j_lit(b, ",\n  \"callsites\":[");
  for (size_t i = 0; i < p->ncallsites; i++) {
    const report_callsite *c = &p->callsites[i];
    j_lit(b, i ? ",\n    {\"key\":" : "\n    {\"key\":");
    j_str(b, c->key);
    j_lit(b, ",\"function\":");
    j_str(b, c->function);
    j_lit(b, ",\"file\":");
    j_str(b, c->file);
    if (c->line > 0) j_printf(b, ",\"line\":%d", c->line);
    else j_lit(b, ",\"line\":null");
    j_printf(b, ",\"allocs\":%llu,\"bytes\":%llu,\"leaked_bytes\":%llu,\"leaked_blocks\":%llu,\"peak_bytes\":%llu}",
             (unsigned long long)c->allocs, (unsigned long long)c->bytes, (unsigned long long)c->leaked_bytes,
             (unsigned long long)c->leaked_blocks, (unsigned long long)c->peak_bytes);
  }
  j_lit(b, p->ncallsites ? "\n  ]" : "]");
}

int report_json_process(int fd, report_process *p) {
  jbuf b = { 0 };
  const ta_summary s = p->summary;

  j_printf(&b, "{\"pid\":%ld,\"findings_count\":%zu,\"errors\":%llu,\"loss_records\":%llu", p->pid,
           p->findings_count, (unsigned long long)s.errors, (unsigned long long)p->loss_records);
  if (p->ppid >= 0) j_printf(&b, ",\"ppid\":%ld", p->ppid);
  else j_lit(&b, ",\"ppid\":null");
  j_lit(&b, ",\"argv\":");
  if (p->argv) {
    j_put(&b, "[", 1);
    for (int i = 0; i < p->argc; i++) {
      if (i) j_put(&b, ",", 1);
      j_str(&b, p->argv[i]);
    }
    j_put(&b, "]", 1);
  } else {
    j_lit(&b, "null");
  }
  if (p->exit_code >= 0) j_printf(&b, ",\"exit_code\":%d", p->exit_code);
  else j_lit(&b, ",\"exit_code\":null");
  if (p->signal > 0) j_printf(&b, ",\"signal\":%d", p->signal);   /* the number; its name below */
  else j_lit(&b, ",\"signal\":null");
  const char *abbrev = p->signal > 0 ? sigabbrev_np(p->signal) : NULL;   /* "INT" */
  if (abbrev) j_printf(&b, ",\"signal_name\":\"SIG%s\"", abbrev);
  else j_lit(&b, ",\"signal_name\":null");
  j_lit(&b, p->clean_exit < 0 ? ",\"clean_exit\":null" : p->clean_exit ? ",\"clean_exit\":true" : ",\"clean_exit\":false");
  j_lit(&b, ",\"trace\":");
  j_str(&b, p->trace);

  j_lit(&b, ",\n  \"summary\":{");
  j_pair(&b, "direct", s.direct_bytes, s.direct_blocks);
  j_put(&b, ",", 1);
  j_pair(&b, "indirect", s.indirect_bytes, s.indirect_blocks);
  j_put(&b, ",", 1);
  j_pair(&b, "possible", s.possible_bytes, s.possible_blocks);
  j_put(&b, ",", 1);
  j_pair(&b, "reachable", s.reachable_bytes, s.reachable_blocks);
  j_put(&b, ",", 1);
  j_pair(&b, "orphan", s.orphan_bytes, s.orphan_blocks);
  if (p->unclassified) {
    j_put(&b, ",", 1);
    j_pair(&b, "unclassified", p->unclassified_bytes, p->unclassified_blocks);
  }
  j_put(&b, ",", 1);
  j_pair(&b, "suppressed", p->suppressed_bytes, p->suppressed_blocks);
  j_printf(&b, ",\"allocs\":%llu,\"frees\":%llu,\"peak_bytes\":%llu,\"errors\":%llu}",
           (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.peak_bytes,
           (unsigned long long)s.errors);

  j_lit(&b, ",\n  \"findings\":[");
  for (size_t i = 0; i < p->ngroups; i++) {
    if (i) j_put(&b, ",", 1);
    j_finding(&b, p, &p->groups[i]);
  }
  j_lit(&b, p->ngroups ? "\n  ]" : "]");

  j_lit(&b, ",\n  \"suppressions\":[");
  for (size_t i = 0; i < p->nsuppressions_used; i++) {
    const report_suppression_use *u = &p->suppressions_used[i];
    j_lit(&b, i ? "," : "");
    j_lit(&b, "{\"type\":");
    j_str(&b, u->type);
    j_lit(&b, ",\"pattern\":");
    j_str(&b, u->pattern);
    j_printf(&b, ",\"count\":%llu,\"bytes\":%llu}", (unsigned long long)u->hits, (unsigned long long)u->bytes);
  }
  j_lit(&b, "]");
  if (p->tm) j_callsites(&b, p);
  j_lit(&b, "}");

  int rc = 0;
  if (b.oom) {
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
  return rc;
}

char *report_json_groups(report_process *p, const char *kind, size_t *len) {
  jbuf b = { 0 };
  size_t k = 0;
  for (size_t i = 0; i < p->ngroups; i++) {
    if (strcmp(p->groups[i].kind, kind) != 0) continue;
    if (k++) j_put(&b, ",", 1);
    j_finding(&b, p, &p->groups[i]);
  }
  if (b.oom || k == 0) {
    free(b.s);
    return NULL;
  }
  *len = b.len;
  return b.s;
}

int report_source_json(int fd, const report_source *src, const report_process_info *info) {
  report_process *p = report_process_new(src, info);
  if (!p) return -1;
  int rc = report_json_process(fd, p);
  report_process_free(p);
  return rc;
}
