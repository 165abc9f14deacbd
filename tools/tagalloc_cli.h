/* tagalloc_cli.h - the pieces the `tagalloc` subcommands share
 * (tools/tagalloc.c): messages, output checks, the processes' traces, and
 * the joined JSON document of a run or a report. */
#ifndef TAGALLOC_CLI_H
#define TAGALLOC_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offline.h"
#include "report.h"

#define CLI_EXIT_USAGE 2   /* a bad command line or input: nothing was run */

/* "tagalloc: " + the message + newline on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "tagalloc: warning: " + the message. */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checks that FILE can be written (created or replaced) now, without
 * leaving anything behind; prints "tagalloc: OPT FILE: reason" and returns
 * false when it cannot. */
bool cli_check_output_file(const char *opt, const char *path);
/* The same for a directory that files will be created in; `create` makes a
 * missing one (one level). */
bool cli_check_output_dir(const char *opt, const char *path, bool create);

/* At most one of the n paths (NULL: not asked) is "-", standard output;
 * otherwise "tagalloc: CMD: only one output can be -" and false. */
bool cli_one_stdout(const char *cmd, size_t n, const char *const *paths);
/* An output opened for writing, replaced; "-" is standard output (a
 * duplicate of fd 1, so that closing it closes nothing else).  -1 with errno. */
int cli_open_output(const char *path);

/* getopt_long with the tool's own messages ("tagalloc: CMD: unknown option
 * X (see tagalloc CMD --help)", "--NAME needs a value"); '?' after one. */
struct option;
int cli_getopt(int argc, char **argv, const char *shorts, const struct option *longs, const char *cmd);
/* One warning line for each TAGALLOC_* variable in the environment that
 * names no option, with the closest option when one is near. */
void cli_warn_unknown_env(void);
/* v with a comma between each group of three digits (1,234,567) in buf (28
 * bytes are enough for any v);
 * the signed one with its sign always (+1,024, -3, +0).  Return buf. */
const char *cli_thousands(char *buf, uint64_t v);
const char *cli_signed_thousands(char buf[32], int64_t v);
/* Colour for fd: a terminal, NO_COLOR unset or empty, TERM not "dumb". */
bool cli_color(int fd);

/* The whole file in a NUL-terminated malloc'd buffer; NULL with errno. */
char *cli_read_file(const char *path, size_t *len);
/* Writes all of buf to fd; false on failure. */
bool cli_write_all(int fd, const char *buf, size_t len);

/* One process of a run, or one trace of a report. */
struct report_process;
typedef struct {
  char     *trace;           /* the trace file */
  uint32_t  pid, ppid;
  uint64_t  start_ns;        /* the trace header's; UINT64_MAX when it cannot be read */
  bool      has_header;      /* the trace's header could be read */
  struct report_process *model;   /* run: its process in the run's report model (NULL: left out) */
} cli_proc;

/* Reads pid, ppid and start time from a trace's header; false if unreadable. */
bool cli_trace_header(const char *path, uint32_t *pid, uint32_t *ppid, uint64_t *start_ns);
/* Sorts by start time, then pid. */
void cli_procs_sort(cli_proc *p, size_t n);
void cli_procs_free(cli_proc *p, size_t n);

/* The joined document: {"tool":"tagalloc","version":...,"processes":[ */
bool cli_json_begin(int fd);
bool cli_json_sep(int fd, size_t index);   /* before each object */
bool cli_json_end(int fd);

/* The renderings of a report model (tagalloc_report.c): the joined JSON
 * document into FILE; the HTML page and the folded stacks into the files
 * that are not NULL.  false (after a "tagalloc: OPT FILE: reason" line) when
 * a file could not be written. */
struct report_model;
bool cli_write_json(const char *path, struct report_model *m);
bool cli_write_renderings(struct report_model *m, const char *html, const char *folded, const char *folded_peak);

/* The subcommands: tools/tagalloc_run.c, tools/tagalloc_report.c,
 * tools/tagalloc_diff.c. */
int cmd_run(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_diff(int argc, char **argv);

#endif
