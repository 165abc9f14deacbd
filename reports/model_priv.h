/* model_priv.h - what the two halves of the report model share: the
 * process (reports/process.c: a source's findings, suppressions, totals,
 * stacks symbolized on demand; what the LD_PRELOAD shim's exit report
 * needs) and what a trace adds (reports/model.c: growth, callsites, the
 * model of several processes; the command-line tool's).  Private to
 * reports/. */
#ifndef REPORT_MODEL_PRIV_H
#define REPORT_MODEL_PRIV_H

#include "model.h"

typedef struct report_chunk {
  struct report_chunk *next;
  size_t               used, cap;
  char                 data[];
} report_chunk;

typedef struct {                 /* strings and small copies, freed together */
  report_chunk *head;
} report_pool;

void *report_pool_alloc(report_pool *p, size_t n);
char *report_pool_str(report_pool *p, const char *s);
void  report_pool_free(report_pool *p);

/* A copy of argv[0..argc), NULL-terminated; NULL when out of memory. */
char **report_argv_copy(char *const *argv, int argc);
void   report_argv_free(char **v, int argc);

/* A new group at the end of p's (zeroed); NULL when out of memory. */
report_group *report_group_push(report_process *p);
/* p's suppressions used, copied from supp into p's memory. */
bool report_process_copy_used(report_process *p, report_suppressions *supp);
/* Per-kind totals, findings_count and loss_records, from p's groups. */
bool report_process_count(report_process *p);
/* Room for one more process in m; false when out of memory (model.c). */
bool _report_model_reserve(report_model *m);
/* Appends p, its room reserved, and widens m's span of time to p's. */
void _report_model_push(report_model *m, report_process *p);

typedef struct {
  report_pool     mem;
  report_mstack **stacks;        /* open addressing by id; NULL: empty */
  size_t          cap, n;
  size_t          gcap;
  /* what the process owns besides (model.c: its offline source), freed
   * with it */
  void          (*release)(void *arg);
  void           *release_arg;
} report_proc_priv;

#endif
