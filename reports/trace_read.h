/* trace_read.h - reads a tagalloc trace (TAGALLOC_TRACE=path; format in
 * alloc/TRACE.md): records one by one, or a replayed model of the run.
 *
 *   char err[512];
 *   report_trace *t = report_trace_open("run.trace", err, sizeof err);
 *   if (!t) { fprintf(stderr, "%s\n", err); return 1; }
 *   report_trace_iter it;
 *   report_trace_rec r;
 *   report_trace_iter_init(&it, t);
 *   while (report_trace_next(&it, &r)) {          // only whole, valid records
 *     if (r.type == TR_ALLOC) {
 *       const tr_alloc *a = r.payload;            // 8-byte aligned, r.payload_size >= sizeof *a
 *       ...
 *     }
 *   }
 *   if (it.damaged) fprintf(stderr, "%s\n", it.message);   // one line, names the file
 *   report_trace_close(t);
 *
 *   report_trace_model *m = report_trace_model_load("run.trace", err, sizeof err);
 *   // m->allocs, m->frees, m->peak_live_bytes, m->blocks[0..nblocks) live at
 *   // the end, m->clean_exit, m->findings, ...
 *   report_trace_model_free(m);
 *
 * The reader never reads outside the file, whatever its contents: a record
 * whose size is below the 8-byte header, not a multiple of 8, or past the end
 * of the file, a known record too short for its fixed part, a stack whose
 * frames overrun its record, a FRAME whose parent is not below it, or a
 * string not NUL-terminated inside its record
 * stops the iteration; it.damaged is set with the byte offset of the bad
 * record and the reason.  Everything before it was yielded.  Records of an
 * unknown type are skipped and counted (it.unknown).  A file that ends exactly
 * at a record boundary is not damaged, but it lacks the END record unless the
 * process exited cleanly (model: clean_exit false).
 * This code runs offline; its memory comes from plain malloc.
 */
#ifndef REPORT_TRACE_READ_H
#define REPORT_TRACE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace_format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the file and its records ------------------------------------------- */

/* An open trace: mapped (an iteration holds a window of it in memory, not
 * the whole file), or read whole when it cannot be mapped. */
typedef struct report_trace report_trace;

/* Opens and checks the file header.  NULL on failure, with one line in err
 * (may be NULL), e.g. "TRACE: not a tagalloc trace (bad magic): run.trace" or
 * "TRACE: version 2 is not supported (this reader knows 1): run.trace". */
report_trace *report_trace_open(const char *path, char *err, size_t errlen);
/* The same on bytes in memory; name is used in messages.  The bytes are
 * borrowed when data is 8-byte aligned (keep them alive until close), copied
 * otherwise. */
report_trace *report_trace_open_mem(const void *data, size_t size, const char *name,
                                    char *err, size_t errlen);
/* Lets go of t; a model of report_trace_model_read_records may keep it
 * (and its mapping) until that model is freed. */
void          report_trace_close(report_trace *t);

const tr_file_header *report_trace_header(const report_trace *t);
size_t                report_trace_size(const report_trace *t);   /* bytes of the file */
const char           *report_trace_name(const report_trace *t);

/* One record.  payload points just after the 8-byte record header, inside
 * the file, 8-byte aligned; payload_size = record size - 8 (a multiple of 8).
 * PACKED records are not yielded: each of their events is, as an ALLOC or
 * FREE record whose payload is in the iterator (until the next call) and
 * whose offset is the PACKED record's. */
typedef struct {
  uint8_t     type;          /* TR_* (unknown types are never yielded) */
  const void *payload;
  uint32_t    payload_size;
  uint64_t    offset;        /* file offset of the record header */
} report_trace_rec;

typedef struct {
  const report_trace *t;
  uint64_t off;              /* offset of the next record */
  uint64_t at;               /* file offset of the last yielded record, or for an event of a
                                PACKED record its own first byte: the events' order in the file */
  uint64_t released;         /* a mapped file's pages below this were given back (madvise) */
  uint64_t records;          /* valid records seen (yielded + unknown) */
  uint64_t unknown;          /* records of unknown type, skipped */
  bool     done;             /* nothing more to yield */
  bool     damaged;          /* stopped at damage (or a truncated tail) */
  uint64_t damage_offset;    /* offset of the damaged record; also = bytes of whole records read */
  char     message[512];     /* one line naming the file: where and why; "" if not damaged */
  bool     skip_packed;      /* set before reading: PACKED records are stepped over whole, their
                                events neither yielded nor checked (counted in packed_skipped) */
  uint64_t packed_skipped;
  /* inside a PACKED record, whose events are yielded one by one as ALLOC
   * and FREE records (payload: pk_ev, valid until the next call) */
  const unsigned char *pk, *pk_end;
  uint64_t pk_off, pk_seq, pk_addr, pk_events;
  uint32_t pk_thread;
  union { tr_alloc a; tr_free f; } pk_ev;
} report_trace_iter;

void report_trace_iter_init(report_trace_iter *it, const report_trace *t);
/* Fills *r with the next valid record of a known type; returns false at the
 * end of the file or at damage (see it->damaged). */
bool report_trace_next(report_trace_iter *it, report_trace_rec *r);

/* Calls fn on each record until fn returns non-zero or the records end.
 * Returns fn's non-zero value, or 0.  st (may be NULL) gets the final
 * iterator state (damage, counts). */
typedef int report_trace_fn(const report_trace_rec *r, void *arg);
int report_trace_each(const report_trace *t, report_trace_fn *fn, void *arg, report_trace_iter *st);

/* The n-th NUL-terminated string after the fixed part of a record of type
 * TR_MODULE, TR_TAG, TR_HOLD, TR_FINDING_EVENT (n = 0) or TR_FINDING (0 kind,
 * 1 slot, 2 detail); NULL for any other.  Valid for a yielded record. */
const char *report_trace_string(const report_trace_rec *r, int n);

/* A record type's name ("ALLOC", ...), "?" for an unknown one. */
const char *report_trace_type_name(unsigned type);

/* ---- the model: the run replayed -------------------------------------- */

typedef struct {
  uint32_t        id;
  uint16_t        n;
  const uint64_t *frames;    /* n return addresses, innermost first */
  uint64_t        offset;    /* file offset of its STACK record, or of the FRAME record of its innermost frame */
} report_trace_stack;

typedef struct {
  uint64_t addr, size, seq;  /* seq: the ledger's sequence number of the allocation */
  uint32_t stack, thread;
  uint16_t tag;
  bool     arena;            /* an arena block: its death at an arena reset is not in
                                the trace (version 1), so it stays "live" here */
} report_trace_block;

typedef struct { uint64_t seq, mark, ns; uint32_t thread; } report_trace_mark;

typedef struct { uint64_t lo, hi, offset; const char *path; } report_trace_module;

typedef struct {             /* a FINDING record: one group, written at a clean exit */
  const char *kind, *slot, *detail;   /* never NULL ("" when empty) */
  uint64_t bytes, blocks, addr, holder;
  uint32_t stack, alloc_stack, free_stack, aux_stack;
  uint16_t tag;
  size_t   site0, nsites;    /* its REF_SITE records: m->ref_sites[site0 .. site0 + nsites) */
} report_trace_finding;

typedef struct {             /* a FINDING_EVENT record: an error as it happened */
  const char *kind;
  uint64_t seq, addr;
  uint32_t stack, thread;
} report_trace_finding_event;

typedef struct report_trace_index report_trace_index;   /* private hash maps */

/* One allocation stack (a callsite), over the whole replay. */
typedef struct {
  uint32_t stack;
  uint16_t tag;                        /* the tag of its first allocation */
  uint64_t allocs, alloc_bytes;        /* ALLOC records (a realloc's new block included) */
  uint64_t frees, freed_bytes;         /* its blocks freed (FREE, or an address reused unseen) */
  uint64_t live_bytes, live_blocks;    /* live at the end of the trace */
  uint64_t peak_bytes, peak_blocks;    /* live at the moment of the process's peak (peak_seq) */
  /* growth across the marks (m->nmarks >= 2): its live bytes at each mark,
   * fitted by least squares against the mark's index (one iteration = the
   * interval between two marks) */
  uint64_t mark_first, mark_last;      /* live bytes at the first and at the last mark */
  double   slope;                      /* bytes per iteration */
  double   r2;                         /* the fit's coefficient of determination (0..1) */
  uint32_t ups, downs;                 /* iterations in which it grew, shrank */
} report_trace_site;

/* (seq, ns) pairs that date the event counter: TIME, MARK and END records
 * and the file header's start_ns at the first event; sorted by seq, ns
 * never decreasing. */
typedef struct { uint64_t seq, ns; } report_trace_anchor;

/* Live bytes over the replay, downsampled into at most
 * REPORT_TRACE_BUCKETS buckets of equal seq ranges: for each bucket, the
 * highest live bytes in it of all tags together (column 0) and of each tag
 * (columns 1..ntags; the tags beyond REPORT_TRACE_TAGS share the last
 * column when other_tags), and the lowest (lows: what a bucket covering
 * many training steps went down to between them). */
#define REPORT_TRACE_BUCKETS 600
#define REPORT_TRACE_TAGS    24
typedef struct {
  size_t    nbuckets;
  size_t    ntags;
  uint16_t *tags;                      /* the tag of each column 1..ntags */
  bool      other_tags;                /* the last column holds the remaining tags */
  uint64_t *seq;                       /* the last seq of each bucket */
  uint64_t *values;                    /* [bucket * (REPORT_TRACE_TAGS + 1) + column] */
  uint64_t *lows;                      /* the same layout: the lowest in the bucket */
} report_trace_timeline;

/* Device memory (DEVICE_ALLOC and DEVICE_FREE records) after one event,
 * replayed in sequence order. */
typedef struct {
  uint64_t seq;
  uint64_t allocated;        /* live device bytes of blocks without TA_DEVICE_RESERVE */
  uint64_t reserved;         /* live device bytes of blocks with it (segments, reservations) */
} report_trace_device_point;

/* How the replay put the events in sequence order. */
typedef enum {
  REPORT_TRACE_FILE_ORDER,   /* they came in order (one thread): replayed as the file was read */
  REPORT_TRACE_MERGED,       /* the threads' streams merged, a window of events each */
  REPORT_TRACE_SORTED,       /* a thread's own order slipped past that window: all sorted */
} report_trace_replay;

typedef struct {
  /* the file */
  uint32_t pid, ppid;
  uint64_t start_ns;
  uint64_t records, unknown_records;
  bool     damaged;
  uint64_t damage_offset;              /* bytes of whole records read when damaged */
  char     damage[512];                /* the one-line message, "" if not damaged */
  /* what was said once */
  char   **tag_names;                  /* by tag id, NULL when no TAG record named it */
  size_t   ntag_names;                 /* length of tag_names (highest id + 1) */
  report_trace_stack *stacks;          /* the STACK records (version 1), in file order; stacks
                                          said by FRAME records are in the private index */
  size_t   nstacks;
  char   **argv;                       /* the COMMAND record's (NULL-terminated; NULL: none) */
  int      argc;
  bool     argv_truncated;             /* the command line was longer than the record */
  report_trace_module *modules;        /* in file order (at open, then new ones at exit) */
  size_t   nmodules;
  /* events */
  uint64_t allocs, frees, reallocs;    /* ALLOC, FREE, REALLOC records (a realloc also writes ALLOC + FREE) */
  uint64_t refs, holds, arena_resets, thread_starts, thread_ends, times;
  uint64_t live_bytes, peak_live_bytes;/* replayed in sequence order; arena blocks count until the end */
  uint64_t unmatched_frees;            /* FREE of an address not live in the replay */
  uint64_t realloc_overlaps;           /* ALLOC of an address already live (previous one dropped) */
  uint64_t late_stacks;                /* events naming a stack id with no STACK record before them */
  report_trace_block *blocks;          /* live at the end, in sequence order */
  size_t   nblocks;
  report_trace_mark *marks;
  size_t   nmarks;
  report_trace_finding_event *finding_events;
  size_t   nfinding_events;
  report_trace_finding *findings;      /* the exit groups, in file order */
  size_t   nfindings;
  tr_ref_site *ref_sites;              /* the REF_SITE records (the ledger's refcount balances) */
  size_t   nref_sites;
  bool     has_summary;                /* a SUMMARY record was read: the ledger's numbers at exit */
  tr_summary summary;
  bool     has_events;                 /* any event record (an exit-only trace has none) */
  bool     events_unread;              /* report_trace_model_read_records stepped over PACKED
                                          records: allocs, frees and late_stacks leave out their
                                          events, which were not checked for damage */
  bool     has_exit;                   /* an EXIT record: how the image ended, as the preload saw it */
  int      exit_code, exit_signal;     /* exit_code -1: no exit (exec, fatal signal); signal 0: none */
  /* the end */
  bool     clean_exit;                 /* an END record was read */
  uint64_t end_seq, end_ns;
  /* the replay, for reports (report_trace_model_read: none until report_trace_model_replay) */
  bool     replayed;                   /* false: blocks, live and peak bytes, sites, timeline,
                                          first_seq and last_seq are zero */
  report_trace_replay replay;
  uint64_t first_seq, last_seq;        /* of the first and the last ALLOC/FREE */
  uint64_t peak_seq;                   /* the ALLOC that reached peak_live_bytes */
  report_trace_site *sites;            /* by allocation stack, in order of first use */
  size_t   nsites;
  report_trace_anchor *anchors;
  size_t   nanchors;
  report_trace_timeline timeline;
  /* device memory, apart from the host's (blocks keyed by tag, device, address) */
  uint64_t device_allocs, device_frees;   /* DEVICE_ALLOC, DEVICE_FREE records */
  uint64_t device_unmatched_frees;        /* DEVICE_FREE of a key not live in the replay */
  uint64_t device_allocated, device_reserved;            /* live at the end */
  uint64_t device_peak_allocated, device_peak_reserved;
  report_trace_device_point *device_points;              /* one per event, in seq order */
  size_t   ndevice_points;
  report_trace_index *index;
} report_trace_model;

/* Reads the whole file and replays it.  NULL only when the file cannot be
 * opened or its header is bad (err as report_trace_open); damage is not a
 * failure: the model holds what came before it (damaged, damage).  The
 * replay's memory is the model's (live blocks, sites) and a window of
 * events per thread: a trace of several threads is replayed by merging
 * their streams in the mapped file, not by sorting all its events. */
report_trace_model *report_trace_model_load(const char *path, char *err, size_t errlen);
report_trace_model *report_trace_model_build(const report_trace *t);
/* The records alone: a model with everything said once, the counts, the
 * marks and anchors, the device series and the findings, but its events
 * not replayed (replayed false): what a report of a clean exit that has
 * the ledger's SUMMARY needs when it renders no timeline, peak or
 * callsite.  report_trace_model_replay(m, t), with the trace it was read
 * from still open, replays them then (as report_trace_model_build would
 * have); 0, or -1 when out of memory (m is then to be freed). */
report_trace_model *report_trace_model_read(const report_trace *t);
int                 report_trace_model_replay(report_trace_model *m, const report_trace *t);
/* Less again: the records but not the ALLOC and FREE events packed in
 * PACKED records, which are stepped over unread (events_unread).  For a
 * caller that needs the events only when the records say so (no clean
 * exit, no SUMMARY, marks): it reads the trace again with
 * report_trace_model_read then.  Not to be replayed: report_trace_model_replay
 * of such a model returns -1.  Its FRAME records are only marked said
 * (late_stacks counts as ever) and read on the first
 * report_trace_model_stack, when the trace owns its bytes (a file, or
 * report_trace_open_mem's copy of an unaligned buffer): the model then
 * holds the trace until it is freed, and report_trace_close may come
 * first.  A clean exit's report that needs no stack reads none. */
report_trace_model *report_trace_model_read_records(const report_trace *t);
void                report_trace_model_free(report_trace_model *m);

const char               *report_trace_model_tag(const report_trace_model *m, uint32_t tag);   /* NULL: unnamed */
const report_trace_stack *report_trace_model_stack(const report_trace_model *m, uint32_t id);  /* NULL: unknown */
const report_trace_block *report_trace_model_block(const report_trace_model *m, uint64_t addr);/* NULL: not live */
/* The time of event counter value seq, CLOCK_MONOTONIC ns, interpolated
 * between the anchors (extrapolated at the average rate past the last). */
uint64_t report_trace_model_ns(const report_trace_model *m, uint64_t seq);
/* The site of an allocation stack; NULL when no ALLOC named it. */
const report_trace_site *report_trace_model_site(const report_trace_model *m, uint32_t stack);

/* The first exit finding group of kind, NULL if none; with *count the number of groups. */
const report_trace_finding *report_trace_model_finding(const report_trace_model *m, const char *kind,
                                                       size_t *count);

#ifdef __cplusplus
}
#endif
#endif
