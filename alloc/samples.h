/* samples.h - the ledger's timeline without a trace (marks.c): at each mark
 * the time (CLOCK_MONOTONIC) and the live bytes of all tags and of each
 * tag, kept in a bounded series, and the time the ledger started.  The
 * in-process report (reports/ledger_timeline.c) draws the page's timeline
 * from them, as a trace's replay draws it from its events.
 *
 * Bounded: at most TA_SAMPLES samples.  When the series is full, pairs of
 * neighbours merge (the later time, the higher of the highs, the lower of
 * the lows) and each sample from then on covers twice as many marks; so a
 * run of any length keeps between TA_SAMPLES / 2 and TA_SAMPLES evenly
 * spaced samples, about 110 KiB. */
#ifndef TA_SAMPLES_H
#define TA_SAMPLES_H

#include "tagalloc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TA_SAMPLES      256
#define TA_SAMPLE_TAGS  24   /* columns 1..24: tags 1..24; with more tags, column 24 holds tags 24 and up */

typedef struct {
  uint64_t ns;                          /* CLOCK_MONOTONIC at the sample's last mark */
  ta_mark  mark;                        /* the sample's last mark */
  uint64_t marks;                       /* marks it covers */
  /* column 0: all tags; column c: tag c (see TA_SAMPLE_TAGS).  hi: the
   * highest live bytes since the sample before (the ledger's peaks between
   * marks); lo: the lowest at its marks. */
  uint64_t hi[TA_SAMPLE_TAGS + 1], lo[TA_SAMPLE_TAGS + 1];
} ta_sample;

/* _ta_init: the run's start time. */
void     _ta_samples_start(void);
/* CLOCK_MONOTONIC ns when the ledger started (0: not yet). */
uint64_t _ta_samples_start_ns(void);
/* Copies up to max samples, oldest first (a partly filled last one
 * included: TA_SAMPLES + 1 in all at most) into out; returns how many
 * there are (may exceed max).
 * *other_tags: column TA_SAMPLE_TAGS holds several tags. */
size_t   _ta_samples_read(ta_sample *out, size_t max, bool *other_tags);
/* A sample of now (not kept): the live bytes at this moment, hi = lo. */
void     _ta_samples_now(ta_sample *out);

#endif
