/* train_charlm.c - a character-level language model with autograd on the
 * ledger.
 *
 *   build/train-charlm [--iters N] [--text FILE] [--batch N] [--lr X] [--optim adam|sgd] [--seed N]
 *                      [--threads N] [--every N] [--val-batches N] [--json FILE] [--html FILE]
 *                      [--checkpoint FILE [--checkpoint-every N]] [--resume FILE] [--stop-after N]
 *
 * The text: the files of Debian's fortunes package (/usr/share/games/fortunes,
 * every regular file but the .dat and .u8 indexes, in name order, joined), or
 * --text FILE, read as bytes; the vocabulary is the bytes that occur.  The
 * first 90% trains, the last 10% validates.  Model: the previous 8 bytes ->
 * embedding 64 each -> [512] -> linear 256, tanh -> linear to the vocabulary;
 * cross-entropy on the next byte; Adam lr 1e-3, batch 64 (windows drawn at
 * random from the training part).  The validation loss is the mean over a
 * fixed set of held-out batches (windows evenly spaced over the last 10%).
 *
 * A point every --every (1000) iterations and at the end: the mean training
 * loss since the previous point, the validation loss, iterations per second,
 * CPU milliseconds per iteration (of this process's iterations since the
 * previous point; null for points a --resume read back), RSS and the
 * ledger's live bytes (by tag).  After each iteration no tape
 * block may be live; at exit the ledger's findings are counted.
 *
 * --device host|cuda|auto: the same model, initial weights, windows and
 * optimizer on a gpu/ backend (train_common.h): the model is moved there,
 * each batch of windows copied there, and the loop is the same;
 * --checkpoint and --resume copy the device's parameters and optimizer
 * state to host memory for the file and back (autograd/checkpoint.c). */
#define TRAIN_PROG "train-charlm"
#include "train_common.h"

#include <math.h>

#include <dirent.h>
#include <sys/stat.h>
#include <zlib.h>

#define DEFAULT_TEXT "/usr/share/games/fortunes"
#define CTX 8
#define EMBED 64
#define HIDDEN 256

typedef struct {
  tc_common c;
  int iters, every, val_batches;
  const char *text;
  const char *device;   /* --device host|cuda|auto  */
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: train-charlm [--iters N] [--text FILE] [--batch N] [--lr X] [--optim adam|sgd] [--seed N]\n"
             "                    [--threads N] [--every N] [--val-batches N] [--json FILE] [--html FILE]\n"
             "                    [--checkpoint FILE [--checkpoint-every N]] [--resume FILE] [--stop-after N]\n"
             "  --iters N: 10000; --steps N: the same, a cap for quick probes; --every N: a point every N (1000)\n"
             "  --val-batches N: held-out batches of the validation loss (50); --lr: 0.001 (Adam), 0.01 (SGD,\n"
             "  momentum 0.9); --text FILE: instead of " DEFAULT_TEXT "\n"
             "  --device host|cuda|auto: train on a gpu/ backend (device memory from the caching pool)\n"
             TC_COMMON_USAGE);
}

static int own_option(void *ctx, const char *a, const char *v) {
  options *o = ctx;
  if (!strcmp(a, "--iters")) o->iters = (int)tc_int(a, v, 1, 100000000);
  else if (!strcmp(a, "--every")) o->every = (int)tc_int(a, v, 1, 100000000);
  else if (!strcmp(a, "--val-batches")) o->val_batches = (int)tc_int(a, v, 1, 10000);
  else if (!strcmp(a, "--text")) o->text = v;
  else if (!strcmp(a, "--device")) {
    if (strcmp(v, "host") && strcmp(v, "cuda") && strcmp(v, "auto")) tc_die("--device wants host, cuda or auto, got '%s'", v);
    o->device = v;
  } else return 0;
  return 1;
}

static options parse(int argc, char **argv) {
  options o = { .c = { .batch = 64, .threads = 1, .lr = 1e-3f, .seed = 1, .adam = 1 }, .iters = 10000,
                .every = 1000, .val_batches = 50 };
  tc_parse_args(argc, argv, &o.c, usage, own_option, &o);
  if (o.c.steps && o.c.steps < o.iters) o.iters = o.c.steps;
  if (!o.c.adam && !o.c.lr_set) o.c.lr = 0.01f;
  tc_common_check(&o.c);
  /* two seeded bugs live in train-lenet's own code, not in the libraries */
  tensor_fault f = tensor_fault_get();
  if (f == TENSOR_FAULT_SCOPE_ESCAPE || f == TENSOR_FAULT_GPU_CLONE_RETAIN)
    tc_die("--fault %s: a seeded bug of train-lenet's code; train-charlm has no code for it", tensor_fault_name(f));
  return o;
}

/* ---- the text ----------------------------------------------------------------- */

typedef struct {
  unsigned char *p;
  size_t n, cap;
} bytes;

static void append_file(bytes *b, const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) tc_die("cannot open %s: %s", path, strerror(errno));
  for (;;) {
    if (b->cap - b->n < 65536) {
      size_t cap = b->cap ? b->cap * 2 : 1 << 20;
      unsigned char *q = realloc(b->p, cap);
      if (q == NULL) tc_die("out of memory reading %s", path);
      b->p = q;
      b->cap = cap;
    }
    size_t r = fread(b->p + b->n, 1, b->cap - b->n, f);
    b->n += r;
    if (r == 0) break;
  }
  if (ferror(f)) tc_die("cannot read %s: %s", path, strerror(errno));
  fclose(f);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* --text FILE, or every regular file of DIR but *.dat and *.u8, in name order. */
static bytes read_text(const char *path, int *nfiles) {
  bytes b = { 0 };
  struct stat st;
  *nfiles = 0;
  if (stat(path, &st) != 0)
    tc_die("cannot open %s: %s%s", path, strerror(errno),
           strcmp(path, DEFAULT_TEXT) ? "" : " (install Debian's fortunes package, or give --text FILE)");
  if (!S_ISDIR(st.st_mode)) {
    append_file(&b, path);
    *nfiles = 1;
    return b;
  }
  DIR *d = opendir(path);
  if (d == NULL) tc_die("cannot open %s: %s", path, strerror(errno));
  char **names = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8")) continue;
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, e->d_name);
    if (stat(full, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    char **q = realloc(names, (n + 1) * sizeof *q);
    if (q == NULL || (q[n] = strdup(full)) == NULL) tc_die("out of memory listing %s", path);
    names = q;
    n++;
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    append_file(&b, names[i]);
    free(names[i]);
  }
  free(names);
  *nfiles = (int)n;
  return b;
}

/* ---- batches ------------------------------------------------------------------- */

/* Fills x [B,CTX] and y [B] with the windows starting at pos[0..B). */
static void fill(tensor *x, tensor *y, const int32_t *ids, const int64_t *pos, int64_t B) {
  int32_t *xp = tensor_i32(x), *yp = tensor_i32(y);
  for (int64_t b = 0; b < B; b++) {
    memcpy(xp + b * CTX, ids + pos[b], CTX * sizeof *xp);
    yp[b] = ids[pos[b] + CTX];
  }
}

/* The mean loss over the held-out batches; dev: the model's device (the
 * batches are copied there). */
static double validate(ag_layer *net, const tensor *vx, const tensor *vy, int64_t B, gpu_pool *dev) {
  double sum = 0;
  int64_t nb = tensor_batch_count(vx, B);
  ag_no_grad_begin();
  for (int64_t i = 0; i < nb; i++) {
    tensor *xb = tensor_batch(vx, i, B), *yb = tensor_batch(vy, i, B);
    tensor *xd = dev ? tc_to_device(xb, dev) : NULL, *yd = dev ? tc_to_device(yb, dev) : NULL;
    ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(dev ? xd : xb)), dev ? yd : yb);
    if (loss == NULL) {
      tc_step_failed("validation batch", (long long)i + 1);
      tc_free_if_live(xb);
      tc_free_if_live(yb);
      tensor_free(xd);
      tensor_free(yd);
      ag_tape_reset(ag_tape_current());
      ag_no_grad_end();
      return NAN;
    }
    sum += tensor_item(loss->value);
    tensor_free(xb);
    tensor_free(yb);
    tensor_free(xd);
    tensor_free(yd);
    ag_tape_reset(ag_tape_current());
  }
  ag_no_grad_end();
  return sum / (double)nb;
}

typedef struct {
  int64_t iter;
  double train_loss, val_loss, iters_per_s;
  long rss;
  uint64_t ledger_live;
  tc_tag_live by_tag;
} point;

/* cpu_ms[i]: point i's CPU ms per iteration, NAN when not measured here */
static void write_json(const char *path, const point *p, const double *cpu_ms, int n, const options *o, int vocab,
                       size_t text_bytes) {
  tc_out out;
  FILE *f = tc_out_open(&out, path);
  fprintf(f, "{\"model\": \"charlm\", \"context\": %d, \"embedding\": %d, \"hidden\": %d, \"vocab\": %d, "
             "\"text_bytes\": %zu, \"optim\": \"%s\", \"batch\": %d, \"lr\": %g, \"threads\": %d, \"seed\": %llu,\n"
             " \"points\": [",
          CTX, EMBED, HIDDEN, vocab, text_bytes, o->c.adam ? "adam" : "sgd", o->c.batch, o->c.lr, o->c.threads,
          (unsigned long long)o->c.seed);
  for (int i = 0; i < n; i++) {
    char cpu[32] = "null";
    if (cpu_ms[i] == cpu_ms[i]) snprintf(cpu, sizeof cpu, "%.4f", cpu_ms[i]);
    fprintf(f, "%s\n  {\"iter\": %lld, \"train_loss\": %.17g, \"val_loss\": %.17g, \"iters_per_s\": %.1f, "
               "\"cpu_ms_per_iter\": %s, \"rss_bytes\": %ld, \"ledger_live_bytes\": %llu, \"ledger_live_by_tag\": ",
            i ? "," : "", (long long)p[i].iter, p[i].train_loss, p[i].val_loss, p[i].iters_per_s, cpu, p[i].rss,
            (unsigned long long)p[i].ledger_live);
    tc_tag_live_json(f, &p[i].by_tag);
    fputc('}', f);
  }
  fprintf(f, "\n]}\n");
  tc_out_commit(&out);
}

/* ---- checkpoints: the caller's bytes ---------------------------------------------- */

#define RESUME_MAGIC 0x43484c4du   /* "CHLM" */

typedef struct {
  uint32_t magic, text_crc;
  int32_t batch, vocab, every, npoints;
  int64_t text_bytes, since;     /* iterations since the latest point */
  double loss_sum, seconds;      /* of those */
} resume_head;   /* then npoints points */

static void save(const options *o, ag_layer *net, ag_optim *opt, int64_t iter, ag_rng rng, const resume_head *h,
                 const point *pts) {
  size_t len = sizeof *h + (size_t)h->npoints * sizeof *pts;
  unsigned char *x = malloc(len);
  if (x == NULL) tc_die("out of memory saving %s", o->c.checkpoint);
  memcpy(x, h, sizeof *h);
  memcpy(x + sizeof *h, pts, (size_t)h->npoints * sizeof *pts);
  ag_ckpt_state st = { .epoch = 1, .step = (uint64_t)iter, .rng = rng };
  if (ag_checkpoint_save(o->c.checkpoint, net, opt, &st, x, len) != 0) tc_fail();   /* autograd said why */
  free(x);
}

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  tensor_set_threads(o.c.threads);
  double t0 = tc_now();
  const char *source = o.text ? o.text : DEFAULT_TEXT;
  int nfiles;
  bytes text = read_text(source, &nfiles);
  const int64_t B = o.c.batch;
  size_t ntrain = text.n - text.n / 10;
  if (text.n < 10 * (CTX + 1) || ntrain < (size_t)CTX + 2)
    tc_die("%s: %zu bytes of text, too few for a context of %d", source, text.n, CTX);
  /* the vocabulary: the bytes that occur, in byte order */
  int id_of[256], vocab = 0;
  unsigned char seen[256] = { 0 };
  for (size_t i = 0; i < text.n; i++) seen[text.p[i]] = 1;
  for (int c = 0; c < 256; c++) id_of[c] = seen[c] ? vocab++ : -1;
  int32_t *ids = malloc(text.n * sizeof *ids);
  if (ids == NULL) tc_die("out of memory for the text");
  for (size_t i = 0; i < text.n; i++) ids[i] = id_of[text.p[i]];
  uint32_t crc = (uint32_t)crc32(0L, text.p, (uInt)0);
  for (size_t i = 0; i < text.n; i += 1u << 30)
    crc = (uint32_t)crc32(crc, text.p + i, (uInt)(text.n - i < (1u << 30) ? text.n - i : (1u << 30)));
  free(text.p);

  /* the held-out windows: val_batches * B, evenly spaced over the last 10% */
  int64_t nval = (int64_t)o.val_batches * B, vwin = (int64_t)(text.n - ntrain) - CTX;
  if (vwin < 1) tc_die("%s: the held-out part is shorter than the context", source);
  tensor *vx = tensor_empty(TENSOR_I32, TS(nval, CTX)), *vy = tensor_empty(TENSOR_I32, TS(nval));
  tensor *xb = tensor_empty(TENSOR_I32, TS(B, CTX)), *yb = tensor_empty(TENSOR_I32, TS(B));
  int64_t *pos = malloc((size_t)(nval > B ? nval : B) * sizeof *pos);
  if (vx == NULL || vy == NULL || xb == NULL || yb == NULL || pos == NULL) tc_die("out of memory");
  for (int64_t j = 0; j < nval; j++) pos[j] = (int64_t)ntrain + j * vwin / nval;
  fill(vx, vy, ids, pos, nval);
  printf("train-charlm: %zu bytes of text from %s (%d file%s, %.1f s), vocabulary %d, %zu training bytes, "
         "validation %lld windows; batch %lld, %s lr %g, %d thread%s\n",
         text.n, source, nfiles, nfiles == 1 ? "" : "s", tc_now() - t0, vocab, ntrain, (long long)nval,
         (long long)B, o.c.adam ? "Adam" : "SGD", o.c.lr, o.c.threads, o.c.threads > 1 ? "s" : "");
  fflush(stdout);

  ag_rng rng = ag_rng_new(o.c.seed);
  ag_tape *tape = ag_tape_new(0);
  if (tape == NULL) tc_die("cannot make the tape: %s", ag_error());
  ag_tape_use(tape);   /* (params-in-arena: the model is made while the tape is in use) */
  ag_layer *net = ag_sequential((ag_layer *[]){ ag_embedding_layer(vocab, EMBED, &rng), ag_flatten_layer(),
                                                ag_linear(CTX * EMBED, HIDDEN, &rng), ag_tanh_layer(),
                                                ag_linear(HIDDEN, vocab, &rng) },
                                5);
  if (net == NULL) tc_die("cannot build the model: %s", ag_error());
  gpu_pool *dev = o.device ? tc_device_pool(o.device) : NULL;
  if (dev && ag_layer_to(net, dev) != 0) tc_die("moving the model to the device: %s", ag_error());
  ag_optim *opt = o.c.adam ? ag_adam_new(net, o.c.lr, 0.9f, 0.999f, 1e-8f, 0.0f) : ag_sgd_new(net, o.c.lr, 0.9f, 0.0f);
  if (opt == NULL) tc_die("cannot build the model: %s", ag_error());
  ag_tape_use(tape);
  tensor_pool *pool = tensor_pool_new();
  tensor_pool_use(pool);

  int maxpoints = o.iters / o.every + 2;
  point *pts = calloc((size_t)maxpoints, sizeof *pts);
  double *cpu_ms = malloc((size_t)maxpoints * sizeof *cpu_ms);   /* not in checkpoints: this process's */
  if (pts == NULL || cpu_ms == NULL) tc_die("out of memory");
  for (int i = 0; i < maxpoints; i++) cpu_ms[i] = NAN;
  resume_head h = { .magic = RESUME_MAGIC, .text_crc = crc, .batch = (int32_t)B, .vocab = vocab,
                    .every = o.every, .text_bytes = (int64_t)text.n };
  int64_t first = 0;
  if (o.c.resume) {
    ag_ckpt_state st;
    void *x = NULL;
    size_t len = 0;
    if (ag_checkpoint_load(o.c.resume, net, opt, &st, &x, &len) != 0) tc_fail();   /* autograd said why */
    resume_head got;
    if (len < sizeof got) tc_die("%s: not a train-charlm checkpoint", o.c.resume);
    memcpy(&got, x, sizeof got);
    if (got.magic != RESUME_MAGIC || got.npoints < 0 || len != sizeof got + (size_t)got.npoints * sizeof *pts)
      tc_die("%s: not a train-charlm checkpoint", o.c.resume);
    if (got.text_crc != crc || got.text_bytes != (int64_t)text.n)
      tc_die("%s: saved on another text (%lld bytes, CRC %08x; this one %zu bytes, CRC %08x)", o.c.resume,
             (long long)got.text_bytes, got.text_crc, text.n, crc);
    if (got.batch != B || got.every != o.every)
      tc_die("%s: saved with --batch %d --every %d, this run has --batch %lld --every %d", o.c.resume, got.batch,
             got.every, (long long)B, o.every);
    if (st.step >= (uint64_t)o.iters || got.npoints >= maxpoints)
      tc_die("%s: saved at iteration %llu: nothing left to do in %d", o.c.resume, (unsigned long long)st.step,
             o.iters);
    memcpy(pts, (unsigned char *)x + sizeof got, (size_t)got.npoints * sizeof *pts);
    free(x);
    h = got;
    rng = st.rng;
    first = (int64_t)st.step;
    printf("train-charlm: resumed from %s at iteration %lld\n", o.c.resume, (long long)first);
  }

  tc_tape_check tc = { .tag = ag_tape_tag() };
  int tty = isatty(STDOUT_FILENO);
  int64_t done_here = 0, cpu_iters = 0;
  double start = tc_now(), cpu_s = 0, cpu_start = tc_cpu_now();
  for (int64_t it = first; it < o.iters; it++) {
    tc_tape_check_begin(&tc);
    for (int64_t b = 0; b < B; b++) pos[b] = (int64_t)ag_rng_below(&rng, ntrain - CTX);
    fill(xb, yb, ids, pos, B);
    tensor *xd = dev ? tc_to_device(xb, dev) : NULL, *yd = dev ? tc_to_device(yb, dev) : NULL;
    ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(dev ? xd : xb)), dev ? yd : yb);
    float l = loss ? tensor_item(loss->value) : 0;   /* (from a device: the iteration's one synchronization) */
    /* the seeded bug arena-early-reset: the tape reset before backward */
    if (loss && tensor_fault_get() == TENSOR_FAULT_ARENA_EARLY_RESET) ag_tape_reset(tape);
    ag_optim_zero_grad(opt);
    if (loss == NULL || ag_backward(loss) != 0) {
      tc_step_failed(loss ? "backward of iteration" : "iteration", (long long)it + 1);
      ag_tape_reset(tape);
      tensor_free(xd);
      tensor_free(yd);
      break;
    }
    ag_optim_step(opt);
    ag_tape_reset(tape);
    tensor_free(xd);
    tensor_free(yd);
    tc_tape_check_end(&tc);
    h.loss_sum += l;
    h.since++;
    done_here++;
    cpu_iters++;
    int64_t done = it + 1;
    int stopped = o.c.stop_after && done_here == o.c.stop_after && done < o.iters;
    if (done % o.every == 0 || done == o.iters) {
      h.seconds += tc_now() - start;
      cpu_s += tc_cpu_now() - cpu_start;
      cpu_ms[h.npoints] = 1e3 * cpu_s / (double)cpu_iters;
      point *p = &pts[h.npoints++];
      *p = (point){ .iter = done, .train_loss = h.loss_sum / (double)h.since,
                    .iters_per_s = (double)h.since / h.seconds };
      p->val_loss = validate(net, vx, vy, B, dev);
      char devline[200] = "";
      if (dev) tc_device_line(dev, devline, sizeof devline);
      p->rss = tc_rss_bytes();
      tc_tag_live_now(&p->by_tag);
      p->ledger_live = tc_tag_live_total(&p->by_tag);
      printf("%siter %lld: train loss %.4f, val loss %.4f, %.0f iters/s, rss %.1f MiB, ledger live %.2f MiB, "
             "tape blocks live after iterations %llu%s%s\n",
             tty ? "\r" : "", (long long)done, p->train_loss, p->val_loss, p->iters_per_s,
             (double)p->rss / 1048576.0, (double)p->ledger_live / 1048576.0, (unsigned long long)tc.leaks,
             dev ? ", " : "", devline);
      fflush(stdout);
      if (o.c.json) write_json(o.c.json, pts, cpu_ms, h.npoints, &o, vocab, text.n);
      h.loss_sum = h.seconds = 0;
      h.since = 0;
      cpu_s = 0;
      cpu_iters = 0;
      start = tc_now();
      cpu_start = tc_cpu_now();
    } else if (tty && done % 100 == 0) {
      double rate = (double)h.since / (h.seconds + tc_now() - start);
      printf("\riter %lld/%d loss %.4f %.0f iters/s eta %.0f s   ", (long long)done, o.iters, l, rate,
             (double)(o.iters - done) / rate);
      fflush(stdout);
    }
    if (o.c.checkpoint && ((o.c.checkpoint_every && done % o.c.checkpoint_every == 0) || stopped || done == o.iters)) {
      double now = tc_now(), cpu_now = tc_cpu_now();
      h.seconds += now - start;
      cpu_s += cpu_now - cpu_start;
      save(&o, net, opt, done, rng, &h, pts);
      start = tc_now();
      cpu_start = tc_cpu_now();
    }
    if (stopped) {
      printf("%strain-charlm: stopped after %lld iterations (--stop-after)%s%s\n", tty ? "\n" : "",
             (long long)done_here, o.c.checkpoint ? ", saved in " : "", o.c.checkpoint ? o.c.checkpoint : "");
      break;
    }
  }

  tensor_pool_use(NULL);
  ag_tape_use(NULL);
  ag_optim_free(opt);
  ag_layer_free(net);
  ag_tape_free(tape);
  if (dev) {
    gpu_pool_empty_cache(dev);
    gpu_pool_destroy(dev);
  }
  tensor_pool_free(pool);
  tensor_free(vx);
  tensor_free(vy);
  tensor_free(xb);
  tensor_free(yb);
  free(pos);
  free(ids);
  free(pts);
  free(cpu_ms);
  ta_scan();
  size_t findings = ta_findings_count(NULL);
  int html_failed = o.c.html && tc_write_html(o.c.html, argc, argv) != 0;
  printf("train-charlm: %.1f s in all, peak rss %.1f MiB; ledger findings: %zu%s\n", tc_now() - t0,
         (double)tc_peak_rss_bytes() / 1048576.0, findings,
         tc.leaks ? " (and tape blocks left live after an iteration)" : "");
  if (o.c.html && !html_failed) printf("train-charlm: the ledger's report is in %s\n", o.c.html);
  return findings || tc.leaks || html_failed ? 1 : 0;
}
