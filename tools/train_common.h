/* train_common.h - what the training programs (train_lenet.c, train_charlm.c)
 * share: one-line errors, option values, clocks, RSS, the ledger's live bytes
 * by tag as JSON, the in-process HTML report, the common options and
 * --device's backend and pool.
 *
 * Each program defines TRAIN_PROG ("train-lenet") before including this. */
#ifndef TRAIN_COMMON_H
#define TRAIN_COMMON_H

#include "autograd.h"
#include "gpu.h"
#include "model.h"
#include "tagalloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef TRAIN_PROG
#error "define TRAIN_PROG before including train_common.h"
#endif

/* Exit status 2 without the ledger's exit report: the one line that says
 * why (autograd's own, or tc_die's) is all the user sees. */
__attribute__((noreturn)) static inline void tc_fail(void) {
  fflush(stdout);
  fflush(stderr);
  _exit(2);
}

/* One line on stderr, exit status 2. */
__attribute__((format(printf, 1, 2), noreturn)) static inline void tc_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, TRAIN_PROG ": ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  tc_fail();
}

static inline long tc_int(const char *name, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    tc_die("%s wants an integer in %ld..%ld, got '%s'", name, lo, hi, s);
  return v;
}

static inline float tc_float(const char *name, const char *s, float lo, float hi) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi))
    tc_die("%s wants a number in [%g, %g], got '%s'", name, lo, hi, s);
  return v;
}

/* A file the run will write: its folder must exist and be writable, now,
 * rather than after an hour of training. */
static inline void tc_check_output(const char *opt, const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  if (access(dir, W_OK) != 0) tc_die("%s %s: cannot write into %s: %s", opt, path, dir, strerror(errno));
}

static inline double tc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's CPU time (user and system, every thread), in seconds:
 * less moved than tc_now by a loaded machine's time slicing. */
static inline double tc_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline long tc_rss_bytes(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

/* The highest RSS of the run so far (VmHWM), in bytes. */
static inline long tc_peak_rss_bytes(void) {
  char line[256];
  long kb = 0;
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

/* ---- the ledger's live bytes by tag -------------------------------------------- */

typedef struct {
  uint64_t bytes[TA_MAX_TAGS], blocks[TA_MAX_TAGS];
} tc_tag_live;

static inline void tc_tag_visit(const void *p, size_t size, ta_tag tag, uint32_t stack, void *arg) {
  (void)p;
  (void)stack;
  tc_tag_live *t = arg;
  if (tag < TA_MAX_TAGS) {
    t->bytes[tag] += size;
    t->blocks[tag]++;
  }
}

/* Every live block of the ledger, summed by tag (one walk of the live table). */
static inline void tc_tag_live_now(tc_tag_live *t) {
  memset(t, 0, sizeof *t);
  ta_live_since(0, TA_ANY, tc_tag_visit, t);
}

static inline uint64_t tc_tag_live_total(const tc_tag_live *t) {
  uint64_t s = 0;
  for (int i = 0; i < TA_MAX_TAGS; i++) s += t->bytes[i];
  return s;
}

/* {"tensor.storage": 123, ...}: the tags with live blocks. */
/* A result file written whole or not at all: into PATH.tmp, renamed over
 * PATH when complete. */
typedef struct { FILE *f; const char *path; char tmp[4200]; } tc_out;

static inline FILE *tc_out_open(tc_out *o, const char *path) {
  o->path = path;
  snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path);
  o->f = fopen(o->tmp, "w");
  if (o->f == NULL) tc_die("cannot write %s: %s", o->tmp, strerror(errno));
  return o->f;
}

static inline void tc_out_commit(tc_out *o) {
  if (fclose(o->f) != 0 || rename(o->tmp, o->path) != 0) tc_die("cannot write %s: %s", o->path, strerror(errno));
}

static inline void tc_tag_live_json(FILE *f, const tc_tag_live *t) {
  fputc('{', f);
  int first = 1;
  for (int i = 1; i < TA_MAX_TAGS; i++) {
    if (!t->blocks[i]) continue;
    fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", ta_tag_name((ta_tag)i), (unsigned long long)t->bytes[i]);
    first = 0;
  }
  fputc('}', f);
}

/* ---- tape blocks left live after an iteration ------------------------------------ */

/* A mark every TC_MARK_EVERY iterations: each one, so that the page of a
 * trace draws the training steps (the one before is freed, so the ledger
 * keeps no record per iteration); after each iteration the tape blocks made
 * since it that are still live (none, for a correct stack).  An iteration's
 * births stay within the ledger's ring of recent births, so the count needs
 * no walk of the live table. */
#define TC_MARK_EVERY 1
typedef struct {
  ta_mark mark;
  ta_tag tag;
  uint64_t iters, leaks;
} tc_tape_check;

static inline void tc_tape_check_begin(tc_tape_check *c) {
  if (c->iters++ % TC_MARK_EVERY == 0) {
    if (c->mark) ta_mark_free(c->mark);
    c->mark = ta_mark_now();
  }
}

/* After ag_tape_reset. */
static inline void tc_tape_check_end(tc_tape_check *c) { c->leaks += ta_since(c->mark, c->tag).live_blocks; }

/* ---- the HTML report of this process ---------------------------------------------- */

/* The ledger's findings of the running process as the self-contained page
 * of reports/ (header, totals by kind, findings with symbolized stacks),
 * with the live bytes by tag the ledger sampled at each mark (one per
 * training step) as its timeline.  The flame graphs come from a trace: run
 * with TAGALLOC_TRACE=FILE and render it with `tagalloc report FILE --html`.
 * Returns 0, or -1 with errno's message printed. */
static inline int tc_write_html(const char *path, int argc, char **argv) {
  report_process_info info = { .ppid = (long)getppid(), .argv = (const char *const *)argv, .argc = argc,
                               .exit_code = -1, .clean_exit = -1 };
  report_model *m = report_model_new();
  if (m == NULL || report_model_add_ledger(m, &info) == NULL) {
    report_model_free(m);
    fprintf(stderr, TRAIN_PROG ": --html %s: out of memory building the report\n", path);
    return -1;
  }
  report_model_set_argv(m, argv, argc);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int rc = fd < 0 ? -1 : report_html_write(fd, m);
  if (fd >= 0 && close(fd) != 0) rc = -1;
  if (rc == 0 && rename(tmp, path) != 0) rc = -1;
  if (rc != 0) {
    fprintf(stderr, TRAIN_PROG ": --html %s: %s\n", path, strerror(errno));
    if (fd >= 0) unlink(tmp);
  }
  report_model_free(m);
  return rc;
}

/* ---- the options both programs take --------------------------------------------- */

typedef struct {
  int steps, batch, threads, checkpoint_every, stop_after;
  float lr;
  int lr_set, adam;
  uint64_t seed;
  const char *checkpoint, *resume, *json, *html;
  const char *fault;
} tc_common;

/* Takes option a (value v) when it is a common one: 1, else 0. */
static inline int tc_common_option(tc_common *c, const char *a, const char *v) {
  if (!strcmp(a, "--steps")) c->steps = (int)tc_int(a, v, 1, 100000000);
  else if (!strcmp(a, "--batch")) c->batch = (int)tc_int(a, v, 1, 60000);
  else if (!strcmp(a, "--threads")) c->threads = (int)tc_int(a, v, 1, 16);
  else if (!strcmp(a, "--seed")) c->seed = (uint64_t)tc_int(a, v, 0, 2147483647);
  else if (!strcmp(a, "--lr")) c->lr = tc_float(a, v, 1e-7f, 10.0f), c->lr_set = 1;
  else if (!strcmp(a, "--checkpoint")) c->checkpoint = v;
  else if (!strcmp(a, "--checkpoint-every")) c->checkpoint_every = (int)tc_int(a, v, 1, 100000000);
  else if (!strcmp(a, "--stop-after")) c->stop_after = (int)tc_int(a, v, 1, 100000000);
  else if (!strcmp(a, "--resume")) c->resume = v;
  else if (!strcmp(a, "--json")) c->json = v;
  else if (!strcmp(a, "--html")) c->html = v;
  else if (!strcmp(a, "--fault")) c->fault = v;
  else if (!strcmp(a, "--optim")) {
    if (!strcmp(v, "sgd")) c->adam = 0;
    else if (!strcmp(v, "adam")) c->adam = 1;
    else tc_die("--optim wants sgd or adam, got '%s'", v);
  } else return 0;
  return 1;
}

/* The command line: --help prints usage(stdout) and exits; every option
 * takes a value; the common ones fill c, the program's own go to own(ctx,
 * name, value), which returns 0 for an option it does not know. */
static inline void tc_parse_args(int argc, char **argv, tc_common *c, void (*usage)(FILE *),
                                 int (*own)(void *ctx, const char *a, const char *v), void *ctx) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (strncmp(a, "--", 2) != 0) tc_die("unexpected argument '%s'", a);
    if (i + 1 >= argc) tc_die("%s needs a value", a);
    const char *v = argv[++i];
    if (!tc_common_option(c, a, v) && !own(ctx, a, v)) tc_die("unknown option '%s' (see --help)", a);
  }
}

static inline void tc_quiet_error(tensor_status st, const char *message, void *arg) {
  (void)st;
  (void)message;
  (void)arg;
}

/* Checks what the options ask for before anything is loaded. */
static inline void tc_common_check(const tc_common *c) {
  if (c->checkpoint_every && !c->checkpoint) tc_die("--checkpoint-every needs --checkpoint FILE");
  if (c->json) tc_check_output("--json", c->json);
  if (c->html) tc_check_output("--html", c->html);
  if (c->checkpoint) tc_check_output("--checkpoint", c->checkpoint);
  if (c->resume && access(c->resume, R_OK) != 0) tc_die("--resume %s: %s", c->resume, strerror(errno));
  if (c->fault) {
    tensor_error_handler(tc_quiet_error, NULL);
    tensor_status st = tensor_fault_set(c->fault);
    tensor_error_handler(NULL, NULL);
    if (st != TENSOR_OK) tc_die("--fault %s: %s", c->fault, tensor_error());
  }
  if (tensor_fault_get() != TENSOR_FAULT_NONE)
    fprintf(stderr, TRAIN_PROG ": the seeded bug %s is on (--fault or TAGALLOC_FAULT)\n",
            tensor_fault_name(tensor_fault_get()));
}

/* ---- a step that failed ------------------------------------------------------------ */

/* A step failed.  After a ledger finding (a misuse the library refused,
 * or a seeded bug) the run stops and ends as usual, with the ledger's
 * report; otherwise the one line that says why, exit status 2. */
static inline void tc_step_failed(const char *what, long long step) {
  if (ta_findings_count(NULL) == 0) tc_die("%s failed: %s%s", what, tensor_error(), ag_error());
  fprintf(stderr, TRAIN_PROG ": %s %lld failed after the ledger's finding: stopping the run\n", what, step);
}

/* t, when the ledger says it is still a live tensor (else the finding is
 * made and t left alone): for freeing what a failed step made. */
static inline void tc_free_if_live(tensor *t) {
  if (t && tensor_storage_block(t)) tensor_free(t);
}

/* ---- --device host|cuda|auto ---------------------------------------------------
 * The model is moved to the device (ag_layer_to) and each batch copied there
 * (tensor_to): autograd's ops, backward and optimizer run on the device's
 * tensors, whose memory comes from a gpu/ caching pool (gpu.segment and
 * gpu.buffer on the ledger). */

/* The pool over the backend --device WORD selects, initialised; dies with
 * one line when it cannot run.  auto's note, if any, goes to stderr. */
static inline gpu_pool *tc_device_pool(const char *word) {
  char why[640], note[640];
  const gpu_backend *b = gpu_backend_select(word, why, sizeof why, note, sizeof note);
  if (note[0]) fprintf(stderr, "%s\n", note);
  if (b == NULL) tc_die("--device %s: %s", word, why);
  gpu_pool *p = gpu_pool_new(b, NULL);
  if (p == NULL) tc_die("--device %s: cannot make the pool: %s", word, gpu_pool_error());
  printf(TRAIN_PROG ": on device %s (%s)\n", b->name, b->device_name());
  return p;
}

/* t copied to the device; dies with the tensor library's message when it
 * cannot. */
static inline tensor *tc_to_device(const tensor *t, gpu_pool *dev) {
  tensor *d = tensor_to(t, dev);
  if (d == NULL) tc_die("copying a batch to the device: %s", tensor_error());
  return d;
}

/* The pool after a point of the run, one line. */
static inline void tc_device_line(gpu_pool *p, char *buf, size_t len) {
  gpu_stats st;
  gpu_pool_stats(p, &st);
  snprintf(buf, len, "device: %.1f MiB reserved, %lld of %lld requests from the cache, %lld device allocations",
           (double)st.reserved_bytes[GPU_STAT_ALL].current / 1048576.0, (long long)st.num_hits,
           (long long)st.num_requests, (long long)st.num_device_alloc);
}

#define TC_COMMON_USAGE                                                                                   \
  "  --batch N, --lr X, --seed N, --threads N, --optim sgd|adam\n"                                        \
  "  --checkpoint FILE: saved every --checkpoint-every N steps and at the end; --resume FILE continues it\n" \
  "  --stop-after N: stop after N steps in all (saving the checkpoint), as an interrupted run would\n"     \
  "  --json FILE: the measurements; --html FILE: the ledger's report of the run\n"                         \
  "  --fault NAME: a seeded memory bug on (reshape-dummy, slice-dummy, view-underflow, tape-stack-inputs,\n" \
  "    arena-early-reset, params-in-arena, scope-escape, pool-double-release, optimizer-state-leak,\n"    \
  "    tape-no-shrink, gpu-clone-retain: train-lenet --device only)\n"

#endif
