/* ledger_timeline.c - the running process's page without a trace: its
 * report process (report_source_ledger) with a timeline drawn from the
 * ledger's samples at marks (alloc/samples.h), in the shape a trace's
 * replay gives (report_trace_model's timeline, anchors and marks), so that
 * html.c draws both the same way.
 *
 * The points: the ledger's start (nothing live), one per sample (the
 * highest live bytes of each tag since the point before, the lowest at its
 * marks), and now.  The anchors date point i as seq i. */
#include "model_priv.h"
#include "samples.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void release_model(void *tm) { report_trace_model_free(tm); }

/* The model of the samples; NULL when out of memory. */
static report_trace_model *samples_model(void) {
  report_trace_model *tm = calloc(1, sizeof *tm);
  ta_sample *s = malloc((TA_SAMPLES + 3) * sizeof *s);   /* the start, the kept, the pending, now */
  if (!tm || !s) {
    free(tm);
    free(s);
    return NULL;
  }
  bool other = false;
  memset(&s[0], 0, sizeof s[0]);
  size_t n = _ta_samples_read(s + 1, TA_SAMPLES + 1, &other);
  if (n > TA_SAMPLES + 1) n = TA_SAMPLES + 1;   /* cannot be: at most TA_SAMPLES kept and one pending */
  _ta_samples_now(&s[n + 1]);
  n += 2;
  tm->pid = (uint32_t)getpid();
  tm->start_ns = _ta_samples_start_ns();
  s[0].ns = tm->start_ns;
  if (s[n - 1].ns < tm->start_ns) s[n - 1].ns = tm->start_ns;
  tm->end_ns = s[n - 1].ns;
  tm->clean_exit = true;

  /* the columns: every tag with bytes (all 24 when the last holds several) */
  uint16_t tags[TA_SAMPLE_TAGS];
  size_t ntags = 0;
  for (size_t c = 1; c <= TA_SAMPLE_TAGS; c++) {
    bool used = other;
    for (size_t i = 0; i < n && !used; i++) used = s[i].hi[c] != 0;
    if (used) tags[ntags++] = (uint16_t)c;
  }
  report_trace_timeline *tl = &tm->timeline;
  size_t stride = REPORT_TRACE_TAGS + 1;
  tl->tags = malloc((ntags ? ntags : 1) * sizeof *tl->tags);
  tl->seq = malloc(n * sizeof *tl->seq);
  tl->values = calloc(n * stride, sizeof *tl->values);
  tl->lows = calloc(n * stride, sizeof *tl->lows);
  tm->anchors = malloc(n * sizeof *tm->anchors);
  tm->marks = malloc(n * sizeof *tm->marks);
  tm->tag_names = calloc(TA_SAMPLE_TAGS + 1, sizeof *tm->tag_names);
  if (!tl->tags || !tl->seq || !tl->values || !tl->lows || !tm->anchors || !tm->marks || !tm->tag_names) {
    free(s);
    report_trace_model_free(tm);
    return NULL;
  }
  tm->ntag_names = TA_SAMPLE_TAGS + 1;
  for (size_t k = 0; k < ntags; k++) {
    tm->tag_names[tags[k]] = strdup(ta_tag_name(tags[k]));
    if (!tm->tag_names[tags[k]]) {
      free(s);
      report_trace_model_free(tm);
      return NULL;
    }
  }
  memcpy(tl->tags, tags, ntags * sizeof *tags);
  tl->ntags = ntags;
  tl->other_tags = other;
  tl->nbuckets = n;
  for (size_t i = 0; i < n; i++) {
    uint64_t ns = s[i].ns > tm->start_ns ? s[i].ns : tm->start_ns;
    if (i && ns < tm->anchors[i - 1].ns) ns = tm->anchors[i - 1].ns;
    tm->anchors[i] = (report_trace_anchor){ i, ns };
    tl->seq[i] = i;
    tl->values[i * stride] = s[i].hi[0];
    tl->lows[i * stride] = s[i].lo[0];
    for (size_t k = 0; k < ntags; k++) {
      tl->values[i * stride + 1 + k] = s[i].hi[tags[k]];
      tl->lows[i * stride + 1 + k] = s[i].lo[tags[k]];
    }
    if (s[i].hi[0] > tm->peak_live_bytes) {
      tm->peak_live_bytes = s[i].hi[0];
      tm->peak_seq = i;
    }
    if (s[i].mark) tm->marks[tm->nmarks++] = (report_trace_mark){ .seq = i, .mark = s[i].mark, .ns = ns };
  }
  tm->nanchors = n;
  tm->first_seq = 0;
  tm->last_seq = tm->end_seq = n - 1;
  tm->live_bytes = s[n - 1].hi[0];
  free(s);
  return tm;
}

report_process *report_model_add_ledger(report_model *m, const report_process_info *info) {
  report_source src;
  report_source_ledger(&src);
  report_trace_model *tm = samples_model();
  report_process *p = tm ? report_process_new(&src, info) : NULL;
  if (!p || !_report_model_reserve(m)) {
    report_process_free(p);
    report_trace_model_free(tm);
    return NULL;
  }
  report_proc_priv *pv = p->priv;
  pv->release = release_model;
  pv->release_arg = tm;
  p->tm = tm;
  p->start_ns = tm->start_ns;
  p->end_ns = tm->end_ns;
  _report_model_push(m, p);
  return p;
}
