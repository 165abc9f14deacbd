/* tagalloc_report.c - `tagalloc report TRACE... [--json FILE] [--html FILE]
 * [--folded FILE] [--folded-peak FILE] [--suppressions FILE]`: the report of
 * each traced process, symbolized offline from the trace's module records,
 * on stdout, and the other renderings of the same report model; a damaged
 * or truncated trace is read up to the damage, with a warning on stderr. */
#include "tagalloc_cli.h"
#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && cli_json_begin(fd);
  for (size_t i = 0; ok && i < m->nprocs; i++)
    ok = cli_json_sep(fd, i) && report_json_process(fd, m->procs[i]) == 0;
  ok = ok && cli_json_end(fd);
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (!ok) cli_error("--json %s: %s", path, strerror(errno));
  return ok;
}

/* One rendering into path. */
static bool write_one(const char *opt, const char *path, report_model *m, int what) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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

int cmd_report(int argc, char **argv) {
  const char *json = NULL, *html = NULL, *folded = NULL, *folded_peak = NULL, *supp_path = NULL;
  cli_proc *procs = NULL;
  size_t nprocs = 0, cap = 0;
  bool options_done = false;
  int rc = 0;

  const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
  size_t ninputs = 0;
  if (!inputs) return 1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char **dst = NULL;
    const char *name = NULL;
    if (!options_done && strcmp(a, "--") == 0) {
      options_done = true;
      continue;
    }
    if (!options_done && a[0] == '-' && a[1] == '-') {
      const char *eq = strchr(a, '=');
      size_t len = eq ? (size_t)(eq - a) : strlen(a);
      if (len == 6 && strncmp(a, "--json", len) == 0) dst = &json, name = "--json";
      else if (len == 6 && strncmp(a, "--html", len) == 0) dst = &html, name = "--html";
      else if (len == 14 && strncmp(a, "--suppressions", len) == 0) dst = &supp_path, name = "--suppressions";
      else if (len == 8 && strncmp(a, "--folded", len) == 0) dst = &folded, name = "--folded";
      else if (len == 13 && strncmp(a, "--folded-peak", len) == 0) dst = &folded_peak, name = "--folded-peak";
      else {
        cli_error("report: unknown option %s (see tagalloc --help)", a);
        free(inputs);
        return CLI_EXIT_USAGE;
      }
      if (eq) {
        *dst = eq + 1;
      } else if (i + 1 < argc) {
        *dst = argv[++i];
      } else {
        cli_error("report: %s needs a file name", name);
        free(inputs);
        return CLI_EXIT_USAGE;
      }
      continue;
    }
    inputs[ninputs++] = a;
  }
  if (ninputs == 0) {
    cli_error("report: no trace given (usage: tagalloc report TRACE... [--json FILE])");
    free(inputs);
    return CLI_EXIT_USAGE;
  }
  if ((json && !cli_check_output_file("--json", json)) || (html && !cli_check_output_file("--html", html)) ||
      (folded && !cli_check_output_file("--folded", folded)) ||
      (folded_peak && !cli_check_output_file("--folded-peak", folded_peak))) {
    free(inputs);
    return CLI_EXIT_USAGE;
  }
  report_suppressions *supp = NULL;
  if (supp_path) {
    char err[600];
    supp = report_suppressions_load(supp_path, err, sizeof err);
    if (!supp) {
      cli_error("--suppressions %s", err);
      free(inputs);
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
  free(inputs);

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
    report_offline *o = report_offline_open(procs[i].trace, err, sizeof err);
    if (!o) {
      cli_error("%s", err);
      rc = 1;
      continue;
    }
    const report_trace_model *m = report_offline_model(o);
    if (m->damaged)
      cli_warn("%s; the records before it are reported", m->damage);
    report_process_info info = { .ppid = (long)m->ppid, .exit_code = -1,
                                 .clean_exit = m->clean_exit, .trace = procs[i].trace };
    report_process *p = report_model_add_offline(rm, o, supp, &info);
    if (!p) {
      cli_error("%s: out of memory building the report", procs[i].trace);
      rc = 1;
      continue;
    }
    fflush(stdout);
    printf("%s==%" PRIu32 "== tagalloc: process %" PRIu32 " (parent %" PRIu32 "), trace %s: %s\n",
           shown++ ? "\n" : "", m->pid, m->pid, m->ppid, procs[i].trace,
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
