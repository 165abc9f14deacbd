/* tagalloc_report.c - `tagalloc report TRACE... [--json FILE] [--html FILE]
 * [--folded FILE] [--folded-peak FILE] [--suppressions FILE]`: the report of
 * each traced process, symbolized offline from the trace's module records,
 * on stdout, and the other renderings of the same report model; a damaged
 * or truncated trace is read up to the damage, with a warning on stderr.
 * The text alone of a clean exit does not replay the trace's events
 * (report_offline_open_for). */
#include "tagalloc_cli.h"
#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool add_proc(cli_proc **v, size_t *n, size_t *cap, const char *trace) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    cli_proc *p = realloc(*v, c * sizeof *p);
    if (!p) return false;
    *v = p;
    *cap = c;
  }
  cli_proc *p = &(*v)[(*n)++];
  memset(p, 0, sizeof *p);
  p->trace = strdup(trace);
  p->start_ns = UINT64_MAX;
  p->has_header = cli_trace_header(trace, &p->pid, &p->ppid, &p->start_ns);
  return p->trace != NULL;
}

/* The *.trace files of a directory, by start time. */
static bool add_dir(cli_proc **v, size_t *n, size_t *cap, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    cli_error("%s: %s", dir, strerror(errno));
    return false;
  }
  size_t first = *n;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!ends_with(e->d_name, ".trace")) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (!add_proc(v, n, cap, path)) break;
  }
  closedir(d);
  if (*n == first) cli_warn("%s: no *.trace files in the directory", dir);
  cli_procs_sort(*v + first, *n - first);
  return true;
}

bool cli_write_json(const char *path, report_model *m) {
  int fd = cli_open_output(path);
  bool ok = fd >= 0 && cli_json_begin(fd);
  for (size_t i = 0; ok && i < m->nprocs; i++)
    ok = cli_json_sep(fd, i) && report_json_process(fd, m->procs[i]) == 0;
  ok = ok && cli_json_end(fd);
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (!ok) cli_error("--json %s: %s", path, strerror(errno));
  return ok;
}

/* One rendering into path ("-": standard output). */
static bool write_one(const char *opt, const char *path, report_model *m, int what) {
  int fd = cli_open_output(path);
  bool ok = fd >= 0;
  if (ok) {
    if (what < 0) ok = report_html_write(fd, m) == 0;
    else ok = report_folded_write(fd, m, (report_folded_what)what) == 0;
  }
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (!ok) cli_error("%s %s: %s", opt, path, strerror(errno ? errno : EIO));
  return ok;
}

bool cli_write_renderings(report_model *m, const char *html, const char *folded, const char *folded_peak) {
  bool ok = true;
  if (html) ok &= write_one("--html", html, m, -1);
  if (folded) ok &= write_one("--folded", folded, m, REPORT_FOLDED_LEAKED);
  if (folded_peak) ok &= write_one("--folded-peak", folded_peak, m, REPORT_FOLDED_PEAK);
  return ok;
}

static void report_usage(FILE *f) {
  fputs("usage: tagalloc report [OPTIONS] TRACE|DIR...\n"
        "Renders traces (TAGALLOC_TRACE=path, or tagalloc run --trace) after the run,\n"
        "symbolized offline from the modules the trace records; a directory stands for the\n"
        "*.trace files in it.  Each process's report goes to standard output.\n"
        "\n"
        "  --json FILE            one JSON document (as run's), with each process's callsites\n"
        "  --html FILE            one self-contained HTML page: findings, timeline, flame graphs\n"
        "  --folded FILE          leaked bytes by stack, folded (frame;frame;frame bytes)\n"
        "  --folded-peak FILE     live bytes at the peak by stack, folded\n"
        "                         (FILE - : standard output, for one of these four; the text\n"
        "                         report is then left out)\n"
        "  --suppressions FILE    leak:PATTERN and tag:PATTERN lines (LeakSanitizer's format)\n"
        "  -q, --quiet            no text report (the outputs above are still written)\n"
        "  -h, --help             this help\n"
        "\n"
        "Exit status: 0, or 1 when a trace could not be read or an output not written;\n"
        "2 for a bad command line.  See tagalloc-report(1).\n", f);
}

int cmd_report(int argc, char **argv) {
  const char *json = NULL, *html = NULL, *folded = NULL, *folded_peak = NULL, *supp_path = NULL;
  cli_proc *procs = NULL;
  size_t nprocs = 0, cap = 0;
  bool quiet = false;
  int rc = 0;
  enum { OPT_JSON = 256, OPT_HTML, OPT_FOLDED, OPT_FOLDED_PEAK, OPT_SUPP };
  static const struct option longs[] = {
    { "json", required_argument, NULL, OPT_JSON },
    { "html", required_argument, NULL, OPT_HTML },
    { "folded", required_argument, NULL, OPT_FOLDED },
    { "folded-peak", required_argument, NULL, OPT_FOLDED_PEAK },
    { "suppressions", required_argument, NULL, OPT_SUPP },
    { "quiet", no_argument, NULL, 'q' },
    { "help", no_argument, NULL, 'h' },
    { 0, 0, 0, 0 },
  };
  int c;
  while ((c = cli_getopt(argc, argv, "qh", longs, "report")) != -1) {
    switch (c) {
    case OPT_JSON: json = optarg; break;
    case OPT_HTML: html = optarg; break;
    case OPT_FOLDED: folded = optarg; break;
    case OPT_FOLDED_PEAK: folded_peak = optarg; break;
    case OPT_SUPP: supp_path = optarg; break;
    case 'q': quiet = true; break;
    case 'h':
      report_usage(stdout);
      return 0;
    default:
      return CLI_EXIT_USAGE;
    }
  }
  const char **inputs = (const char **)argv + optind;
  size_t ninputs = (size_t)(argc - optind);
  if (!cli_one_stdout("report", 4, (const char *[]){ json, html, folded, folded_peak })) return CLI_EXIT_USAGE;
  /* an output on standard output: the text report would be mixed into it */
  const char *outs[] = { json, html, folded, folded_peak };
  for (size_t i = 0; i < 4; i++) quiet |= outs[i] && strcmp(outs[i], "-") == 0;
  if (ninputs == 0) {
    cli_error("report: no trace given (usage: tagalloc report [OPTIONS] TRACE|DIR...)");
    return CLI_EXIT_USAGE;
  }
  if ((json && !cli_check_output_file("--json", json)) || (html && !cli_check_output_file("--html", html)) ||
      (folded && !cli_check_output_file("--folded", folded)) ||
      (folded_peak && !cli_check_output_file("--folded-peak", folded_peak))) {
    return CLI_EXIT_USAGE;
  }
  report_suppressions *supp = NULL;
  if (supp_path) {
    char err[600];
    supp = report_suppressions_load(supp_path, err, sizeof err);
    if (!supp) {
      cli_error("--suppressions %s", err);
      return CLI_EXIT_USAGE;
    }
  }

  for (size_t i = 0; i < ninputs; i++) {
    struct stat st;
    if (stat(inputs[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      if (!add_dir(&procs, &nprocs, &cap, inputs[i])) rc = 1;
    } else if (!add_proc(&procs, &nprocs, &cap, inputs[i])) {
      cli_error("out of memory");
      rc = 1;
      break;
    }
  }

  report_model *rm = report_model_new();
  if (!rm) {
    cli_error("out of memory");
    cli_procs_free(procs, nprocs);
    report_suppressions_free(supp);
    return 1;
  }
  size_t shown = 0;
  for (size_t i = 0; i < nprocs; i++) {
    char err[600];
    report_offline *o = report_offline_open_for(procs[i].trace, json || html || folded_peak ? REPORT_OFFLINE_EVENTS : 0,
                                                err, sizeof err);
    if (!o) {
      cli_error("%s", err);
      rc = 1;
      continue;
    }
    const report_trace_model *m = report_offline_model(o);
    if (m->damaged)
      cli_warn("%s; the records before it are reported", m->damage);
    report_process_info info = { .ppid = (long)m->ppid,
                                 .exit_code = m->has_exit ? m->exit_code : -1,
                                 .signal = m->has_exit ? m->exit_signal : 0,
                                 .clean_exit = m->clean_exit && !(m->has_exit && m->exit_signal),
                                 .trace = procs[i].trace };
    report_process *p = report_model_add_offline(rm, o, supp, &info);
    if (!p) {
      cli_error("%s: out of memory building the report", procs[i].trace);
      rc = 1;
      continue;
    }
    if (quiet) continue;
    fflush(stdout);
    printf("%s==%" PRIu32 "== tagalloc: process %" PRIu32, shown++ ? "\n" : "", m->pid, m->pid);
    for (int a = 0; a < m->argc && a < 16; a++)   /* the command line its trace recorded */
      printf("%s%s", a ? " " : ": ", m->argv[a]);
    if (m->argc > 16 || m->argv_truncated) printf(" ...");
    printf(" (parent %" PRIu32 "), trace %s: %s\n", m->ppid, procs[i].trace,
           m->clean_exit ? "exited cleanly"
                         : "no clean exit (no END record: killed, crashed, _exit or cut short)");
    fflush(stdout);
    report_text_process(STDOUT_FILENO, p);
  }
  if (json && !cli_write_json(json, rm)) rc = 1;
  if (!cli_write_renderings(rm, html, folded, folded_peak)) rc = 1;
  report_model_free(rm);
  cli_procs_free(procs, nprocs);
  report_suppressions_free(supp);
  return rc;
}
