/* fuzz_trace.c - libFuzzer target of the trace reader (reports/trace_read.c):
 * any bytes as a trace: open, every record and its strings, the replayed
 * model (sites, timeline, growth, time anchors, the stacks of live blocks), and the records read
 * alone then replayed, which must give the same replay, and the records read
 * with the events stepped over, which must give the same records, and from
 * bytes the trace owns the same stacks, read on demand.  `make fuzz` runs it for
 * FUZZ_SECONDS (600) with the corpus of tests/reports/fuzz-corpus/. */
#include "trace_read.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Stack id of the whole model w and of the lazy one l: both unknown, or
 * the same frames from the same record. */
static void same_stack(const report_trace_model *w, const report_trace_model *l, uint32_t id) {
  const report_trace_stack *a = report_trace_model_stack(w, id), *b = report_trace_model_stack(l, id);
  if (!a != !b) __builtin_trap();
  if (!a) return;
  if (a->id != b->id || a->n != b->n || a->offset != b->offset) __builtin_trap();
  for (size_t k = 0; k < a->n; k++)
    if (a->frames[k] != b->frames[k]) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512];
  report_trace *t = report_trace_open_mem(data, size, "fuzz", err, sizeof err);
  if (!t) return 0;
  report_trace_iter it;
  report_trace_rec r;
  size_t sum = 0;
  report_trace_iter_init(&it, t);
  while (report_trace_next(&it, &r)) {
    for (int n = 0; n < 3; n++) {
      const char *s = report_trace_string(&r, n);
      if (s) sum += strlen(s);
    }
    sum += strlen(report_trace_type_name(r.type));
  }
  report_trace_model *m = report_trace_model_build(t);
  if (m) {
    for (size_t i = 0; i < m->nsites; i++) sum += report_trace_model_site(m, m->sites[i].stack) != NULL;
    for (size_t i = 0; i < m->timeline.nbuckets; i++) sum += (size_t)report_trace_model_ns(m, m->timeline.seq[i]);
    sum += (size_t)report_trace_model_ns(m, m->peak_seq);
    for (size_t i = 0; i < m->nblocks; i++) {
      sum += report_trace_model_block(m, m->blocks[i].addr) != NULL;
      const report_trace_stack *s = report_trace_model_stack(m, m->blocks[i].stack);   /* FRAME chains */
      for (size_t k = 0; s && k < s->n; k++) sum += (size_t)s->frames[k];
    }
    for (size_t i = 0; i < m->ntag_names; i++) sum += report_trace_model_tag(m, (uint32_t)i) != NULL;
    /* the records alone, replayed after: the same replay (the merge's
     * cursors over damaged files included) */
    report_trace_model *l = report_trace_model_read(t);
    if (l && report_trace_model_replay(l, t) == 0) {
      if (l->live_bytes != m->live_bytes || l->peak_live_bytes != m->peak_live_bytes ||
          l->peak_seq != m->peak_seq || l->nblocks != m->nblocks || l->nsites != m->nsites ||
          l->unmatched_frees != m->unmatched_frees || l->realloc_overlaps != m->realloc_overlaps ||
          l->allocs != m->allocs || l->frees != m->frees || l->damaged != m->damaged)
        __builtin_trap();
      for (size_t i = 0; i < m->nblocks; i++)
        if (l->blocks[i].addr != m->blocks[i].addr || l->blocks[i].size != m->blocks[i].size ||
            l->blocks[i].seq != m->blocks[i].seq || l->blocks[i].stack != m->blocks[i].stack)
          __builtin_trap();
    }
    report_trace_model_free(l);
    /* the records with the PACKED records stepped over: the same records
     * up to any damage (damage inside the events is not seen), and never
     * replayed */
    /* the same records from bytes the trace owns (an unaligned copy): its
     * FRAME records read when a stack is asked for, after the trace was
     * closed, each stack the whole read's */
    uint8_t *copy = !m->damaged && size ? malloc(size + 1) : NULL;
    if (copy) {
      memcpy(copy + 1, data, size);
      report_trace *tc = report_trace_open_mem(copy + 1, size, "fuzz", err, sizeof err);
      report_trace_model *lz = tc ? report_trace_model_read_records(tc) : NULL;
      report_trace_close(tc);
      free(copy);
      if (lz) {
        if (lz->late_stacks != m->late_stacks && !lz->events_unread) __builtin_trap();
        for (uint32_t id = 0; id < 64; id++) same_stack(m, lz, id);
        for (size_t i = 0; i < m->nblocks; i++) same_stack(m, lz, m->blocks[i].stack);
        for (size_t i = 0; i < m->nfindings && i < lz->nfindings; i++) {
          const report_trace_finding *f = &m->findings[i];
          same_stack(m, lz, f->stack);
          same_stack(m, lz, f->alloc_stack);
          same_stack(m, lz, f->free_stack);
          same_stack(m, lz, f->aux_stack);
        }
      }
      report_trace_model_free(lz);
    }
    report_trace_model *rec = report_trace_model_read_records(t);
    if (rec && !m->damaged) {
      if (rec->nfindings != m->nfindings || rec->nmarks != m->nmarks || rec->clean_exit != m->clean_exit ||
          rec->has_summary != m->has_summary || rec->reallocs != m->reallocs || rec->damaged ||
          rec->has_events != m->has_events ||
          /* stepped over, the packed events are not counted; ALLOC and
           * FREE records beside them (a thread with no buffer) are */
          (rec->events_unread ? rec->allocs > m->allocs || rec->frees > m->frees
                              : rec->allocs != m->allocs || rec->frees != m->frees) ||
          report_trace_model_replay(rec, t) != (rec->events_unread ? -1 : 0))
        __builtin_trap();
    }
    report_trace_model_free(rec);
    report_trace_model_free(m);
  }
  report_trace_close(t);
  return sum == (size_t)-1;
}
