/* train_lenet.c - LeNet-5 on Fashion-MNIST with autograd on the ledger.
 *
 *   build/train-lenet [--epochs N] [--steps N] [--batch N] [--lr X] [--momentum X]
 *                     [--seed N] [--threads N] [--test N] [--data DIR] [--json FILE]
 *
 * conv 1->6 5x5 pad 2, relu, maxpool 2; conv 6->16 5x5, relu, maxpool 2;
 * fc 400->120 relu, 120->84 relu, 84->10; cross-entropy; SGD with momentum.
 * The training set is reshuffled in place each epoch and every batch is a
 * zero-copy view of it.  After each step the tape is reset and no tape block
 * may be live; at exit the ledger's findings are counted (a correct stack
 * has none) and the ledger prints its report. */
#include "autograd.h"
#include "tagalloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct {
  int epochs, steps, batch, threads, test;
  float lr, momentum;
  uint64_t seed;
  const char *data, *json;
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: train-lenet [--epochs N] [--steps N] [--batch N] [--lr X] [--momentum X] [--seed N]\n"
             "                   [--threads N] [--test N] [--data DIR] [--json FILE]\n"
             "  --steps N: stop each epoch after N steps; --test N: evaluate on the first N test images\n");
}

static void die(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "train-lenet: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  exit(2);
}

static long parse_int(const char *name, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    char range[64];
    snprintf(range, sizeof range, "%ld..%ld", lo, hi);
    fprintf(stderr, "train-lenet: %s wants an integer in %s, got '%s'\n", name, range, s);
    exit(2);
  }
  return v;
}

static float parse_float(const char *name, const char *s, float lo, float hi) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    fprintf(stderr, "train-lenet: %s wants a number in [%g, %g], got '%s'\n", name, lo, hi, s);
    exit(2);
  }
  return v;
}

static options parse(int argc, char **argv) {
  options o = { .epochs = 3, .steps = 0, .batch = 64, .threads = 1, .lr = 0.01f, .momentum = 0.9f, .seed = 1,
                .data = DEFAULT_DATA, .json = NULL };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (strncmp(a, "--", 2) != 0) die("unexpected argument '%s'%s", a, "");
    if (i + 1 >= argc) die("%s needs a value%s", a, "");
    const char *v = argv[++i];
    if (!strcmp(a, "--epochs")) o.epochs = (int)parse_int(a, v, 1, 1000);
    else if (!strcmp(a, "--steps")) o.steps = (int)parse_int(a, v, 1, 1000000);
    else if (!strcmp(a, "--batch")) o.batch = (int)parse_int(a, v, 1, 60000);
    else if (!strcmp(a, "--test")) o.test = (int)parse_int(a, v, 1, 10000);
    else if (!strcmp(a, "--threads")) o.threads = (int)parse_int(a, v, 1, 16);
    else if (!strcmp(a, "--seed")) o.seed = (uint64_t)parse_int(a, v, 0, 2147483647);
    else if (!strcmp(a, "--lr")) o.lr = parse_float(a, v, 1e-7f, 10.0f);
    else if (!strcmp(a, "--momentum")) o.momentum = parse_float(a, v, 0.0f, 0.999f);
    else if (!strcmp(a, "--data")) o.data = v;
    else if (!strcmp(a, "--json")) o.json = v;
    else die("unknown option '%s'%s (see --help)", a, "");
  }
  return o;
}

/* ---- IDX files (gzip) --------------------------------------------------------- */

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads DIR/NAME: magic 0x0801 (labels, [n]) or 0x0803 (images, [n,28,28]);
 * returns the bytes (malloc) and sets *n. */
static unsigned char *read_idx(const char *dir, const char *name, int want_dims, int64_t *n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  gzFile f = gzopen(path, "rb");
  if (f == NULL) die("cannot open %s: %s (install dataset-fashion-mnist, or give --data DIR)", path, strerror(errno));
  unsigned char hdr[16];
  int hn = 4 + 4 * want_dims;
  if (gzread(f, hdr, (unsigned)hn) != hn || be32(hdr) != (uint32_t)(0x800 | want_dims))
    die("%s is not an IDX file of %s", path, want_dims == 1 ? "labels" : "images");
  *n = be32(hdr + 4);
  size_t per = want_dims == 3 ? (size_t)be32(hdr + 8) * be32(hdr + 12) : 1;
  if (want_dims == 3 && per != 28 * 28) die("%s: images are not 28x28%s", path, "");
  size_t total = (size_t)*n * per;
  unsigned char *buf = malloc(total ? total : 1);
  if (buf == NULL) die("out of memory reading %s%s", path, "");
  size_t got = 0;
  while (got < total) {
    int r = gzread(f, buf + got, (unsigned)(total - got > (1u << 30) ? (1u << 30) : total - got));
    if (r <= 0) die("%s: truncated or damaged (gzip)%s", path, "");
    got += (size_t)r;
  }
  gzclose(f);
  return buf;
}

typedef struct {
  tensor *x;   /* f32 [n,1,28,28], pixels / 255 */
  tensor *y;   /* i32 [n] */
  int64_t n;
} dataset;

static dataset load(const char *dir, const char *prefix) {
  char iname[64], lname[64];
  snprintf(iname, sizeof iname, "%s-images-idx3-ubyte.gz", prefix);
  snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte.gz", prefix);
  int64_t n, nl;
  unsigned char *px = read_idx(dir, iname, 3, &n), *lb = read_idx(dir, lname, 1, &nl);
  if (n != nl) die("%s: images and labels differ in count%s", dir, "");
  dataset d = { .n = n };
  d.x = tensor_empty(TENSOR_F32, TS(n, 1, 28, 28));
  d.y = tensor_empty(TENSOR_I32, TS(n));
  if (d.x == NULL || d.y == NULL) die("out of memory for %s%s", prefix, "");
  float *x = tensor_f32(d.x);
  for (int64_t i = 0; i < n * 784; i++) x[i] = (float)px[i] * (1.0f / 255.0f);
  for (int64_t i = 0; i < n; i++) {
    if (lb[i] > 9) die("%s: a label out of range 0..9%s", lname, "");
    tensor_i32(d.y)[i] = lb[i];
  }
  free(px);
  free(lb);
  return d;
}

/* Shuffles the rows of d in place (Fisher-Yates order, applied by cycles). */
static void shuffle(dataset *d, ag_rng *r) {
  int64_t n = d->n;
  int64_t *perm = malloc((size_t)n * sizeof *perm);
  unsigned char *done = calloc((size_t)n, 1);
  if (perm == NULL || done == NULL) die("out of memory shuffling%s%s", "", "");
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)ag_rng_below(r, (uint64_t)i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  /* new row i = old row perm[i] */
  float *x = tensor_f32(d->x), row[784];
  int32_t *y = tensor_i32(d->y);
  for (int64_t s = 0; s < n; s++) {
    if (done[s]) continue;
    memcpy(row, x + s * 784, sizeof row);
    int32_t lab = y[s];
    int64_t i = s;
    while (perm[i] != s) {
      memcpy(x + i * 784, x + perm[i] * 784, sizeof row);
      y[i] = y[perm[i]];
      done[i] = 1;
      i = perm[i];
    }
    memcpy(x + i * 784, row, sizeof row);
    y[i] = lab;
    done[i] = 1;
  }
  free(perm);
  free(done);
}

/* ---- measuring ------------------------------------------------------------------ */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_bytes(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

static double evaluate(ag_layer *net, const dataset *test) {
  int64_t correct = 0, B = 1000;
  ag_no_grad_begin();
  for (int64_t i = 0; i < tensor_batch_count(test->x, B); i++) {
    tensor *xb = tensor_batch(test->x, i, B), *yb = tensor_batch(test->y, i, B);
    ag_var *logits = ag_layer_forward(net, ag_input(xb));
    tensor *pred = logits ? tensor_argmax(logits->value, 1, 0) : NULL;
    if (pred == NULL) die("evaluation failed: %s%s", tensor_error(), ag_error());
    for (int64_t k = 0; k < yb->numel; k++) correct += tensor_i32(pred)[k] == tensor_i32(yb)[k];
    tensor_free(pred);
    tensor_free(xb);
    tensor_free(yb);
    ag_tape_reset(ag_tape_current());
  }
  ag_no_grad_end();
  return (double)correct / (double)test->n;
}

typedef struct {
  int epoch;
  double train_loss, accuracy, images_per_s, seconds;
  long rss;
  uint64_t ledger_live;
} epoch_stats;

static void write_json(const char *path, const epoch_stats *s, int n, const options *o) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) die("cannot write %s: %s", tmp, strerror(errno));
  fprintf(f, "{\"model\": \"lenet5\", \"batch\": %d, \"lr\": %g, \"momentum\": %g, \"threads\": %d, \"seed\": %llu,\n"
             " \"epochs\": [",
          o->batch, o->lr, o->momentum, o->threads, (unsigned long long)o->seed);
  for (int i = 0; i < n; i++)
    fprintf(f, "%s\n  {\"epoch\": %d, \"train_loss\": %.6f, \"test_accuracy\": %.4f, \"images_per_s\": %.1f, "
               "\"seconds\": %.3f, \"rss_bytes\": %ld, \"ledger_live_bytes\": %llu}",
            i ? "," : "", s[i].epoch, s[i].train_loss, s[i].accuracy, s[i].images_per_s, s[i].seconds, s[i].rss,
            (unsigned long long)s[i].ledger_live);
  fprintf(f, "\n]}\n");
  if (fclose(f) != 0 || rename(tmp, path) != 0) die("cannot write %s: %s", path, strerror(errno));
}

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  tensor_set_threads(o.threads);
  double t0 = now();
  dataset train = load(o.data, "train"), test = load(o.data, "t10k");
  if (o.test > 0 && o.test < test.n) {   /* the first N test images: views, no copy */
    tensor *x = tensor_slice(test.x, 0, 0, o.test, 1), *y = tensor_slice(test.y, 0, 0, o.test, 1);
    tensor_free(test.x);
    tensor_free(test.y);
    test = (dataset){ .x = x, .y = y, .n = o.test };
  }
  printf("train-lenet: %lld training and %lld test images from %s (%.1f s), batch %d, lr %g, momentum %g, "
         "%d thread%s\n",
         (long long)train.n, (long long)test.n, o.data, now() - t0, o.batch, o.lr, o.momentum, o.threads,
         o.threads > 1 ? "s" : "");
  fflush(stdout);

  ag_rng rng = ag_rng_new(o.seed);
  ag_layer *net = ag_sequential(
      (ag_layer *[]){ ag_conv2d_layer(1, 6, 5, 1, 2, &rng), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_conv2d_layer(6, 16, 5, 1, 0, &rng), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_flatten_layer(), ag_linear(400, 120, &rng), ag_relu_layer(), ag_linear(120, 84, &rng),
                      ag_relu_layer(), ag_linear(84, 10, &rng) },
      12);
  ag_optim *opt = net ? ag_sgd_new(net, o.lr, o.momentum, 0.0f) : NULL;
  ag_tape *tape = ag_tape_new(0);
  if (opt == NULL || tape == NULL) die("cannot build the model: %s%s", ag_error(), "");
  ag_tape_use(tape);
  /* Results and gradients come from a pool: after the first steps no op
   * allocates data, and memory stays flat. */
  tensor_pool *pool = tensor_pool_new();
  tensor_pool_use(pool);

  ta_tag tape_tag = ag_tape_tag();
  int tty = isatty(STDOUT_FILENO);
  int64_t nb = tensor_batch_count(train.x, o.batch);
  int64_t steps = o.steps > 0 && o.steps < nb ? o.steps : nb;
  epoch_stats *stats = calloc((size_t)o.epochs, sizeof *stats);
  uint64_t tape_leaks = 0;
  for (int e = 1; e <= o.epochs; e++) {
    shuffle(&train, &rng);
    double start = now(), loss_sum = 0;
    int64_t images = 0;
    for (int64_t i = 0; i < steps; i++) {
      ta_mark m = ta_mark_now();
      tensor *xb = tensor_batch(train.x, i, o.batch), *yb = tensor_batch(train.y, i, o.batch);
      ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(xb)), yb);
      if (loss == NULL) die("step failed: %s%s", tensor_error(), ag_error());
      float l = tensor_item(loss->value);
      ag_optim_zero_grad(opt);
      if (ag_backward(loss) != 0) die("backward failed: %s%s", ag_error(), "");
      ag_optim_step(opt);
      images += xb->shape[0];
      tensor_free(xb);
      tensor_free(yb);
      ag_tape_reset(tape);
      tape_leaks += ta_since(m, tape_tag).live_blocks;
      loss_sum += l;
      if ((i + 1) % 100 == 0 || i + 1 == steps) {
        double el = now() - start, rate = (double)images / el;
        printf("%sepoch %d step %lld/%lld loss %.4f (mean %.4f) %.0f img/s eta %.0f s%s", tty ? "\r" : "", e,
               (long long)(i + 1), (long long)steps, l, loss_sum / (double)(i + 1), rate,
               (double)(steps - i - 1) * (double)o.batch / rate, tty ? "   " : "\n");
        fflush(stdout);
      }
    }
    double secs = now() - start;
    double acc = evaluate(net, &test);
    epoch_stats *s = &stats[e - 1];
    *s = (epoch_stats){ .epoch = e, .train_loss = loss_sum / (double)steps, .accuracy = acc,
                        .images_per_s = (double)images / secs, .seconds = secs, .rss = rss_bytes(),
                        .ledger_live = ta_summary_get().live_bytes };
    printf("%sepoch %d: train loss %.4f, test accuracy %.2f%%, %.0f images/s, %.1f s, rss %.1f MiB, "
           "ledger live %.1f MiB, tape blocks live after steps %llu\n",
           tty ? "\r" : "", e, s->train_loss, 100 * acc, s->images_per_s, secs, (double)s->rss / 1048576.0,
           (double)s->ledger_live / 1048576.0, (unsigned long long)tape_leaks);
    fflush(stdout);
    if (o.json) write_json(o.json, stats, e, &o);
  }

  tensor_pool_use(NULL);
  ag_tape_use(NULL);
  ag_tape_free(tape);
  ag_optim_free(opt);
  ag_layer_free(net);
  tensor_pool_free(pool);
  tensor_free(train.x);
  tensor_free(train.y);
  tensor_free(test.x);
  tensor_free(test.y);
  free(stats);
  ta_scan();
  size_t findings = ta_findings_count(NULL);
  printf("train-lenet: %.1f s in all; ledger findings: %zu%s\n", now() - t0, findings,
         tape_leaks ? " (and tape blocks left live after a step)" : "");
  return findings || tape_leaks ? 1 : 0;
}
