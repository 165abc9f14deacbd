/* preload_jemalloc.c - how the audited heap's jemalloc is configured.
 *
 * jemalloc gives a freed page back to the system (purges it) once it has
 * been unused for its decay time, 10 s by default, counted in wall time.
 * Under the ledger a program runs 2 to 20 times slower (bench/auditor), so
 * the same decay purges pages the program is about to use again, much as
 * a bare program would see with a decay of 0.5 s to 5 s: every purged page
 * faults in again, and jemalloc's choice between purged and dirty extents
 * then spreads the heap over more pages.  Measured on bench/auditor/tree.c
 * (2^20 nodes built and freed 10 times, `/usr/bin/time -f %M`): jemalloc
 * alone peaks at 37.6 MB with its 10 s and at 64 MB with 0.5 s; under
 * `tagalloc run` it peaked at 150 MB with 10 s and at 120 MB with 60 s or
 * with no purging at all, in less system time.  So the audited heap's
 * pages decay in 60 s: six times jemalloc's own, about the ledger's
 * slowdown, and still a return of a heap that shrank for good within a
 * minute.  The program's own MALLOC_CONF is read after this and wins. */
/* jemalloc's compiled-in options, read by the archive linked into the
 * preload (tools/part.mk) and kept inside it (tools/preload.map); where the
 * preload links libjemalloc.so instead, that one keeps its own. */
const char *malloc_conf = "dirty_decay_ms:60000";
