/* offline.h - a trace (alloc/TRACE.md) read after the run, as a
 * report_source: what `tagalloc report` renders.
 *
 *   char err[512];
 *   report_offline *o = report_offline_open("run.trace", err, sizeof err);
 *   if (!o) { fprintf(stderr, "tagalloc: %s\n", err); return 1; }
 *   const report_trace_model *m = report_offline_model(o);
 *   if (m->damaged) fprintf(stderr, "tagalloc: warning: %s\n", m->damage);
 *   report_text_render(1, report_offline_source(o));
 *   report_offline_free(o);
 *
 * Stacks and tags come from the trace's STACK and TAG records; addresses
 * are symbolized offline from its MODULE records (report_ctx_new_offline).
 * A trace with an END record (a clean exit) gives the exit scan's FINDING
 * groups in the ledger's order, and a summary: the leak categories summed
 * from the groups, errors from their occurrences, "still reachable" as the
 * blocks live at the end minus the leaked ones.  A trace without END (a
 * crash, a kill, _exit, a damaged tail) gives its FINDING_EVENTs grouped by
 * (kind, stack, alloc stack, free stack, tag), with the block's size and its
 * allocation and free stacks found by replaying the trace, then the blocks
 * still live grouped by allocation stack and tag as kind "unclassified",
 * largest first: never leaks.  This code runs offline; memory comes from
 * plain malloc. */
#ifndef REPORT_OFFLINE_H
#define REPORT_OFFLINE_H

#include "report.h"
#include "trace_read.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct report_offline report_offline;

/* Reads the trace and prepares its findings and symbolizer.  NULL only when
 * the file cannot be read or its header is bad (err: one line naming the
 * file); damage is not a failure: the model says where (damaged, damage). */
report_offline *report_offline_open(const char *path, char *err, size_t errlen);
/* The same for a report that needs less: without REPORT_OFFLINE_EVENTS
 * (what the text report and the leaked folded stacks need), a trace of a
 * clean exit with the ledger's SUMMARY and fewer than 3 marks is not
 * replayed (its model's replayed is false: no blocks, sites, timeline or
 * callsites), which is most of the time it takes.  JSON, HTML, the folded
 * stacks at the peak and diff need REPORT_OFFLINE_EVENTS. */
#define REPORT_OFFLINE_EVENTS 1u
/* And without REPORT_OFFLINE_EVENTS, REPORT_OFFLINE_RECORDS_FIRST reads
 * the records first with the PACKED events stepped over, and the events
 * only when the records say the replay is needed (as above): the trace of
 * a clean exit is then read in a fraction of the time (its events are
 * most of it), but damage inside its events goes unseen.  For the traces
 * `tagalloc run` has just watched its processes write. */
#define REPORT_OFFLINE_RECORDS_FIRST 2u
report_offline *report_offline_open_for(const char *path, unsigned needs, char *err, size_t errlen);
void            report_offline_free(report_offline *o);

/* The source to render; set its `suppressions` to apply a file. */
report_source            *report_offline_source(report_offline *o);
const report_trace_model *report_offline_model(const report_offline *o);
const char               *report_offline_path(const report_offline *o);

#ifdef __cplusplus
}
#endif
#endif
