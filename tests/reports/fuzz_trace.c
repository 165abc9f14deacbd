/* fuzz_trace.c - libFuzzer target of the trace reader (reports/trace_read.c):
 * any bytes as a trace: open, every record and its strings, the replayed
 * model (sites, timeline, growth, time anchors, the stacks of live blocks), and the records read
 * alone then replayed, which must give the same replay, and the records read
 * with the events stepped over, which must give the same records.  `make fuzz` runs it for
 * FUZZ_SECONDS (600) with the corpus of tests/reports/fuzz-corpus/. */
#include "trace_read.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    report_trace_model *rec = report_trace_model_read_records(t);
    if (rec && !m->damaged) {
      if (rec->nfindings != m->nfindings || rec->nmarks != m->nmarks || rec->clean_exit != m->clean_exit ||
          rec->has_summary != m->has_summary || rec->reallocs != m->reallocs || rec->damaged ||
          rec->has_events != m->has_events || (rec->events_unread && (rec->allocs || rec->frees)) ||
          report_trace_model_replay(rec, t) != (rec->events_unread ? -1 : 0))
        __builtin_trap();
    }
    report_trace_model_free(rec);
    report_trace_model_free(m);
  }
  report_trace_close(t);
  return sum == (size_t)-1;
}
