/* train_lenet.c - LeNet-5 on Fashion-MNIST with autograd on the ledger.
 *
 *   build/train-lenet [--epochs N] [--steps N] [--batch N] [--lr X] [--momentum X] [--optim sgd|adam]
 *                     [--seed N] [--threads N] [--test N] [--data DIR] [--json FILE] [--html FILE]
 *                     [--checkpoint FILE [--checkpoint-every N]] [--resume FILE] [--stop-after N]
 *
 * conv 1->6 5x5 pad 2, relu, maxpool 2; conv 6->16 5x5, relu, maxpool 2;
 * fc 400->120 relu, 120->84 relu, 84->10; cross-entropy; SGD with momentum
 * (or Adam).  The training set is reshuffled in place each epoch and every
 * batch is a zero-copy view of it.  Each epoch's JSON record has its images
 * per second and CPU milliseconds per step (this process's steps of the
 * epoch; null when a --resume ran none).  After each step the tape is reset and no
 * tape block may be live; at exit the ledger's findings are counted (a
 * correct stack has none) and the ledger prints its report.
 *
 * A checkpoint holds the model, the optimizer, the epoch and step, the
 * generator and (as the caller's bytes) the data order, the epoch's partial
 * loss sum and the finished epochs' measurements: a resumed run continues
 * exactly where the saved one was, and its losses are the same bit for bit.
 *
 * --device host|cuda|auto: the same model, initial weights, data order and
 * optimizer on a gpu/ backend (train_common.h): the model is moved there,
 * each batch copied there, and the loop is the same; --checkpoint and
 * --resume copy the device's parameters and optimizer state to host memory
 * for the file and back (autograd/checkpoint.c), and the file is the same
 * as the CPU run's.  --fault
 * gpu-clone-retain reproduces seed 003: the weights are "cloned" into a
 * layer collection that takes a reference to each device buffer and never
 * gives it back; at the end the model lets go, the buffers stay referenced,
 * and the "fix", a purge of the pool, frees only what nothing references
 * (the refused buffers are gpu.purge-referenced; at exit ref.leak and
 * gpu.leak name the clone's line). */
#define TRAIN_PROG "train-lenet"
#include "train_common.h"

#include <math.h>

#include <zlib.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

typedef struct {
  tc_common c;
  int epochs, test;
  float momentum;
  const char *data;
  const char *device;   /* --device host|cuda|auto */
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: train-lenet [--epochs N] [--steps N] [--batch N] [--lr X] [--momentum X] [--optim sgd|adam]\n"
             "                   [--seed N] [--threads N] [--test N] [--data DIR] [--json FILE] [--html FILE]\n"
             "                   [--checkpoint FILE [--checkpoint-every N]] [--resume FILE] [--stop-after N]\n"
             "  --steps N: stop each epoch after N steps; --test N: evaluate on the first N test images\n"
             "  --lr: 0.01 (SGD), 0.001 (Adam); --momentum: SGD's, 0.9\n"
             "  --device host|cuda|auto: train on a gpu/ backend (device memory from the caching pool)\n"
             TC_COMMON_USAGE);
}

static int own_option(void *ctx, const char *a, const char *v) {
  options *o = ctx;
  if (!strcmp(a, "--epochs")) o->epochs = (int)tc_int(a, v, 1, 1000);
  else if (!strcmp(a, "--test")) o->test = (int)tc_int(a, v, 1, 10000);
  else if (!strcmp(a, "--momentum")) o->momentum = tc_float(a, v, 0.0f, 0.999f);
  else if (!strcmp(a, "--data")) o->data = v;
  else if (!strcmp(a, "--device")) {
    if (strcmp(v, "host") && strcmp(v, "cuda") && strcmp(v, "auto")) tc_die("--device wants host, cuda or auto, got '%s'", v);
    o->device = v;
  } else return 0;
  return 1;
}

static options parse(int argc, char **argv) {
  options o = { .c = { .batch = 64, .threads = 1, .lr = 0.01f, .seed = 1 }, .epochs = 3, .momentum = 0.9f,
                .data = DEFAULT_DATA };
  tc_parse_args(argc, argv, &o.c, usage, own_option, &o);
  if (o.c.adam && !o.c.lr_set) o.c.lr = 1e-3f;
  tc_common_check(&o.c);
  if (tensor_fault_get() == TENSOR_FAULT_GPU_CLONE_RETAIN && !o.device)
    tc_die("--fault gpu-clone-retain needs --device (it clones the device model's weights)");
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
  if (f == NULL) tc_die("cannot open %s: %s (install dataset-fashion-mnist, or give --data DIR)", path, strerror(errno));
  unsigned char hdr[16];
  int hn = 4 + 4 * want_dims;
  if (gzread(f, hdr, (unsigned)hn) != hn || be32(hdr) != (uint32_t)(0x800 | want_dims))
    tc_die("%s is not an IDX file of %s", path, want_dims == 1 ? "labels" : "images");
  *n = be32(hdr + 4);
  size_t per = want_dims == 3 ? (size_t)be32(hdr + 8) * be32(hdr + 12) : 1;
  if (want_dims == 3 && per != 28 * 28) tc_die("%s: images are not 28x28", path);
  size_t total = (size_t)*n * per;
  unsigned char *buf = malloc(total ? total : 1);
  if (buf == NULL) tc_die("out of memory reading %s", path);
  size_t got = 0;
  while (got < total) {
    int r = gzread(f, buf + got, (unsigned)(total - got > (1u << 30) ? (1u << 30) : total - got));
    if (r <= 0) tc_die("%s: truncated or damaged (gzip)", path);
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
  if (n != nl) tc_die("%s: images and labels differ in count", dir);
  dataset d = { .n = n };
  d.x = tensor_empty(TENSOR_F32, TS(n, 1, 28, 28));
  d.y = tensor_empty(TENSOR_I32, TS(n));
  if (d.x == NULL || d.y == NULL) tc_die("out of memory for %s", prefix);
  float *x = tensor_f32(d.x);
  for (int64_t i = 0; i < n * 784; i++) x[i] = (float)px[i] * (1.0f / 255.0f);
  for (int64_t i = 0; i < n; i++) {
    if (lb[i] > 9) tc_die("%s: a label out of range 0..9", lname);
    tensor_i32(d.y)[i] = lb[i];
  }
  free(px);
  free(lb);
  return d;
}

/* New row i = old row perm[i], in place (by cycles); order follows. */
static void permute(dataset *d, int32_t *order, const int64_t *perm) {
  int64_t n = d->n;
  unsigned char *done = calloc((size_t)n, 1);
  int32_t *old = malloc((size_t)n * sizeof *old);
  if (done == NULL || old == NULL) tc_die("out of memory reordering the data");
  memcpy(old, order, (size_t)n * sizeof *old);
  float *x = tensor_f32(d->x), row[784];
  int32_t *y = tensor_i32(d->y);
  for (int64_t s = 0; s < n; s++) {
    order[s] = old[perm[s]];
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
  free(old);
  free(done);
}

/* Reshuffles the rows of d (Fisher-Yates order from r). */
static void shuffle(dataset *d, int32_t *order, ag_rng *r) {
  int64_t n = d->n;
  int64_t *perm = malloc((size_t)n * sizeof *perm);
  if (perm == NULL) tc_die("out of memory shuffling");
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)ag_rng_below(r, (uint64_t)i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  permute(d, order, perm);
  free(perm);
}

/* Batch i: views made in a scope of their own and escaped to the caller
 * (the seeded bug scope-escape forgets the images' escape: the scope frees
 * them as this returns, and the step uses them after). */
static void next_batch(const dataset *d, int64_t i, int64_t batch, tensor **xb, tensor **yb) {
  TENSOR_SCOPE_AUTO;
  *xb = tensor_batch(d->x, i, batch);
  *yb = tensor_batch(d->y, i, batch);
  if (tensor_fault_get() != TENSOR_FAULT_SCOPE_ESCAPE) tensor_escape(*xb);
  tensor_escape(*yb);
}

/* The test accuracy; dev: the model's device (the batches are copied there,
 * the predictions back). */
static double evaluate(ag_layer *net, const dataset *test, gpu_pool *dev) {
  int64_t correct = 0, B = 1000;
  ag_no_grad_begin();
  for (int64_t i = 0; i < tensor_batch_count(test->x, B); i++) {
    tensor *xb = tensor_batch(test->x, i, B), *yb = tensor_batch(test->y, i, B);
    tensor *xd = dev ? tc_to_device(xb, dev) : NULL;
    ag_var *logits = ag_layer_forward(net, ag_input(xd ? xd : xb));
    tensor *pred = logits ? tensor_argmax(logits->value, 1, 0) : NULL;
    tensor_free(xd);
    if (pred && dev) {
      tensor *h = tensor_to(pred, NULL);
      tensor_free(pred);
      pred = h;
    }
    if (pred == NULL) {
      tc_step_failed("evaluation batch", (long long)i + 1);
      tc_free_if_live(xb);
      tc_free_if_live(yb);
      ag_tape_reset(ag_tape_current());
      ag_no_grad_end();
      return NAN;
    }
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
  tc_tag_live by_tag;
} epoch_stats;

/* cpu_ms[i]: epoch i's CPU ms per step, NAN when not measured here */
static void write_json(const char *path, const epoch_stats *s, const double *cpu_ms, int n, const options *o) {
  tc_out out;
  FILE *f = tc_out_open(&out, path);
  fprintf(f, "{\"model\": \"lenet5\", \"optim\": \"%s\", \"batch\": %d, \"lr\": %g, \"momentum\": %g, "
             "\"threads\": %d, \"seed\": %llu,\n \"epochs\": [",
          o->c.adam ? "adam" : "sgd", o->c.batch, o->c.lr, o->momentum, o->c.threads,
          (unsigned long long)o->c.seed);
  for (int i = 0; i < n; i++) {
    char cpu[32] = "null";
    if (cpu_ms[i] == cpu_ms[i]) snprintf(cpu, sizeof cpu, "%.4f", cpu_ms[i]);
    fprintf(f, "%s\n  {\"epoch\": %d, \"train_loss\": %.17g, \"test_accuracy\": %.4f, \"images_per_s\": %.1f, "
               "\"seconds\": %.3f, \"cpu_ms_per_step\": %s, \"rss_bytes\": %ld, \"ledger_live_bytes\": %llu, "
               "\"ledger_live_by_tag\": ",
            i ? "," : "", s[i].epoch, s[i].train_loss, s[i].accuracy, s[i].images_per_s, s[i].seconds, cpu, s[i].rss,
            (unsigned long long)s[i].ledger_live);
    tc_tag_live_json(f, &s[i].by_tag);
    fputc('}', f);
  }
  fprintf(f, "\n]}\n");
  tc_out_commit(&out);
}

/* Seed 003 (--fault gpu-clone-retain): the weights cloned into a layer
 * collection that takes a reference to each device buffer and never gives
 * it back. */
typedef struct {
  void *w[16];
} clones;

__attribute__((noinline)) static clones *clone_retain(ag_layer *net) {
  ag_var *ps[16];
  size_t n = ag_layer_params(net, ps, 16);
  clones *c = ta_calloc(ta_tag_get("gpu.clones"), 1, sizeof *c);
  if (c == NULL || n > 16) tc_die("--fault gpu-clone-retain: out of memory");
  for (size_t i = 0; i < n; i++) {
    char slot[32];
    snprintf(slot, sizeof slot, "weight%zu", i);
    c->w[i] = ps[i]->value->data;   /* the parameter's device buffer */
    ta_hold(c, slot, c->w[i]);
    ta_ref_acquire(c->w[i]);   /* the bug: a reference the collection never releases */
  }
  return c;
}

/* ---- checkpoints: the caller's bytes --------------------------------------------- */

#define RESUME_MAGIC 0x4c454e35u   /* "LEN5" */

typedef struct {
  uint32_t magic;
  int32_t batch, steps, nstats;
  int64_t n, images;
  double loss_sum, seconds;
} resume_head;   /* then nstats epoch_stats, then n int32: the data order */

static void save(const options *o, ag_layer *net, ag_optim *opt, int epoch, int64_t step, ag_rng rng,
                 const resume_head *h, const epoch_stats *stats, const int32_t *order) {
  size_t len = sizeof *h + (size_t)h->nstats * sizeof *stats + (size_t)h->n * sizeof *order;
  unsigned char *x = malloc(len);
  if (x == NULL) tc_die("out of memory saving %s", o->c.checkpoint);
  memcpy(x, h, sizeof *h);
  memcpy(x + sizeof *h, stats, (size_t)h->nstats * sizeof *stats);
  memcpy(x + sizeof *h + (size_t)h->nstats * sizeof *stats, order, (size_t)h->n * sizeof *order);
  ag_ckpt_state st = { .epoch = (uint64_t)epoch, .step = (uint64_t)step, .rng = rng };
  if (ag_checkpoint_save(o->c.checkpoint, net, opt, &st, x, len) != 0) tc_fail();   /* autograd said why */
  free(x);
}

int main(int argc, char **argv) {
  options o = parse(argc, argv);
  tensor_set_threads(o.c.threads);
  double t0 = tc_now();
  dataset train = load(o.data, "train"), test = load(o.data, "t10k");
  if (o.test > 0 && o.test < test.n) {   /* the first N test images: views, no copy */
    tensor *x = tensor_slice(test.x, 0, 0, o.test, 1), *y = tensor_slice(test.y, 0, 0, o.test, 1);
    tensor_free(test.x);
    tensor_free(test.y);
    test = (dataset){ .x = x, .y = y, .n = o.test };
  }
  printf("train-lenet: %lld training and %lld test images from %s (%.1f s), batch %d, %s lr %g, momentum %g, "
         "%d thread%s\n",
         (long long)train.n, (long long)test.n, o.data, tc_now() - t0, o.c.batch, o.c.adam ? "Adam" : "SGD",
         o.c.lr, o.momentum, o.c.threads, o.c.threads > 1 ? "s" : "");
  fflush(stdout);

  ag_rng rng = ag_rng_new(o.c.seed);
  ag_tape *tape = ag_tape_new(0);
  if (tape == NULL) tc_die("cannot make the tape: %s", ag_error());
  ag_tape_use(tape);   /* (params-in-arena: the model is made while the tape is in use) */
  ag_layer *net = ag_sequential(
      (ag_layer *[]){ ag_conv2d_layer(1, 6, 5, 1, 2, &rng), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_conv2d_layer(6, 16, 5, 1, 0, &rng), ag_relu_layer(), ag_max_pool2d_layer(2, 2),
                      ag_flatten_layer(), ag_linear(400, 120, &rng), ag_relu_layer(), ag_linear(120, 84, &rng),
                      ag_relu_layer(), ag_linear(84, 10, &rng) },
      12);
  if (net == NULL) tc_die("cannot build the model: %s", ag_error());
  gpu_pool *dev = o.device ? tc_device_pool(o.device) : NULL;
  if (dev && ag_layer_to(net, dev) != 0) tc_die("moving the model to the device: %s", ag_error());
  clones *cloned = dev && tensor_fault_get() == TENSOR_FAULT_GPU_CLONE_RETAIN ? clone_retain(net) : NULL;
  ag_optim *opt = o.c.adam ? ag_adam_new(net, o.c.lr, 0.9f, 0.999f, 1e-8f, 0.0f)
                           : ag_sgd_new(net, o.c.lr, o.momentum, 0.0f);
  if (opt == NULL) tc_die("cannot build the model: %s", ag_error());
  /* Results and gradients come from a pool: after the first steps no op
   * allocates data, and memory stays flat. */
  tensor_pool *pool = tensor_pool_new();
  tensor_pool_use(pool);

  int64_t nb = tensor_batch_count(train.x, o.c.batch);
  int64_t steps = o.c.steps > 0 && o.c.steps < nb ? o.c.steps : nb;
  int32_t *order = malloc((size_t)train.n * sizeof *order);
  epoch_stats *stats = calloc((size_t)o.epochs, sizeof *stats);
  double *cpu_ms = malloc((size_t)o.epochs * sizeof *cpu_ms);   /* not in checkpoints: this process's */
  if (order == NULL || stats == NULL || cpu_ms == NULL) tc_die("out of memory");
  for (int i = 0; i < o.epochs; i++) cpu_ms[i] = NAN;
  for (int64_t i = 0; i < train.n; i++) order[i] = (int32_t)i;

  /* Where the run starts: epoch 1 step 0, or where the checkpoint was. */
  int first_epoch = 1;
  int64_t resume_step = 0;
  resume_head h = { .magic = RESUME_MAGIC, .batch = o.c.batch, .steps = (int32_t)steps, .n = train.n };
  if (o.c.resume) {
    ag_ckpt_state st;
    void *x = NULL;
    size_t len = 0;
    if (ag_checkpoint_load(o.c.resume, net, opt, &st, &x, &len) != 0) tc_fail();   /* autograd said why */
    resume_head got;
    if (len < sizeof got) tc_die("%s: not a train-lenet checkpoint", o.c.resume);
    memcpy(&got, x, sizeof got);
    if (got.magic != RESUME_MAGIC || got.nstats < 0 || got.n != train.n ||
        len != sizeof got + (size_t)got.nstats * sizeof *stats + (size_t)got.n * sizeof *order)
      tc_die("%s: not a train-lenet checkpoint of this data", o.c.resume);
    if (got.batch != o.c.batch || got.steps != steps)
      tc_die("%s: saved with --batch %d and %d steps per epoch, this run has --batch %d and %lld", o.c.resume,
             got.batch, got.steps, o.c.batch, (long long)steps);
    if (got.nstats >= o.epochs || st.epoch < 1 || st.epoch > (uint64_t)o.epochs || st.step > (uint64_t)steps)
      tc_die("%s: saved at epoch %llu step %llu: nothing left to do in %d epochs", o.c.resume,
             (unsigned long long)st.epoch, (unsigned long long)st.step, o.epochs);
    memcpy(stats, (unsigned char *)x + sizeof got, (size_t)got.nstats * sizeof *stats);
    const int32_t *saved = (const int32_t *)((unsigned char *)x + sizeof got + (size_t)got.nstats * sizeof *stats);
    int64_t *perm = malloc((size_t)train.n * sizeof *perm);
    unsigned char *seen = calloc((size_t)train.n, 1);
    if (perm == NULL || seen == NULL) tc_die("out of memory");
    for (int64_t i = 0; i < train.n; i++) {
      int32_t k;
      memcpy(&k, saved + i, sizeof k);
      if (k < 0 || k >= train.n || seen[k]) tc_die("%s: the data order is not a permutation", o.c.resume);
      seen[k] = 1;
      perm[i] = k;
    }
    permute(&train, order, perm);
    free(perm);
    free(seen);
    free(x);
    h = got;
    rng = st.rng;
    /* a finished epoch (evaluated: it has its measurements) starts the next */
    if (got.nstats == (int32_t)st.epoch) {
      first_epoch = (int)st.epoch + 1;
      h.images = 0;
      h.loss_sum = h.seconds = 0;
      h.steps = (int32_t)steps;
      resume_step = 0;
    } else {
      first_epoch = (int)st.epoch;
      resume_step = (int64_t)st.step;
    }
    printf("train-lenet: resumed from %s at epoch %d step %lld\n", o.c.resume, first_epoch, (long long)resume_step);
  }

  tc_tape_check tc = { .tag = ag_tape_tag() };
  int tty = isatty(STDOUT_FILENO);
    int64_t done_here = 0;   /* steps run by this process (--stop-after) */
  int stopped = 0, failed = 0;
  for (int e = first_epoch; e <= o.epochs && !stopped && !failed; e++) {
    int64_t i0 = e == first_epoch ? resume_step : 0;
    if (i0 == 0) {
      shuffle(&train, order, &rng);
      h.images = 0;
      h.loss_sum = h.seconds = 0;
    }
    double start = tc_now(), cpu_start = tc_cpu_now(), cpu_s = 0;
    int64_t cpu_steps = 0;
    for (int64_t i = i0; i < steps; i++) {
      tc_tape_check_begin(&tc);
      tensor *xb, *yb;
      next_batch(&train, i, o.c.batch, &xb, &yb);
      tensor *xd = dev ? tc_to_device(xb, dev) : NULL, *yd = dev ? tc_to_device(yb, dev) : NULL;
      ag_var *loss = ag_cross_entropy(ag_layer_forward(net, ag_input(dev ? xd : xb)), dev ? yd : yb);
      float l = loss ? tensor_item(loss->value) : 0;   /* (from a device: the step's one synchronization) */
      if (dev && !(l == l) && loss) tc_die("step %lld: the loss is NaN", (long long)i + 1);
      /* the seeded bug arena-early-reset: the tape reset before backward */
      if (loss && tensor_fault_get() == TENSOR_FAULT_ARENA_EARLY_RESET) ag_tape_reset(tape);
      ag_optim_zero_grad(opt);
      if (loss == NULL || ag_backward(loss) != 0) {
        tc_step_failed(loss ? "backward of step" : "step", (long long)i + 1);
        tc_free_if_live(xb);
        tc_free_if_live(yb);
        tensor_free(xd);
        tensor_free(yd);
        ag_tape_reset(tape);
        failed = 1;
        break;
      }
      ag_optim_step(opt);
      h.images += xb->shape[0];
      tensor_free(xb);
      tensor_free(yb);
      tensor_free(xd);
      tensor_free(yd);
      ag_tape_reset(tape);
      tc_tape_check_end(&tc);
      h.loss_sum += l;
      done_here++;
      cpu_steps++;
      int64_t global = (int64_t)(e - 1) * steps + i + 1;
      stopped = o.c.stop_after && done_here == o.c.stop_after && !(e == o.epochs && i + 1 == steps);
      if (o.c.checkpoint && ((o.c.checkpoint_every && global % o.c.checkpoint_every == 0) || stopped)) {
        h.seconds += tc_now() - start;
        cpu_s += tc_cpu_now() - cpu_start;
        start = tc_now();
        cpu_start = tc_cpu_now();
        h.nstats = e - 1;
        save(&o, net, opt, e, i + 1, rng, &h, stats, order);
      }
      if ((i + 1) % 100 == 0 || i + 1 == steps || stopped) {
        double el = h.seconds + tc_now() - start, rate = (double)h.images / el;
        printf("%sepoch %d step %lld/%lld loss %.4f (mean %.4f) %.0f img/s eta %.0f s%s", tty ? "\r" : "", e,
               (long long)(i + 1), (long long)steps, l, h.loss_sum / (double)(i + 1), rate,
               (double)(steps - i - 1) * (double)o.c.batch / rate, tty ? "   " : "\n");
        fflush(stdout);
      }
      if (stopped) break;
    }
    if (failed) break;
    if (stopped) {
      printf("%strain-lenet: stopped after %lld steps (--stop-after)%s%s\n", tty ? "\n" : "", (long long)done_here,
             o.c.checkpoint ? ", saved in " : "", o.c.checkpoint ? o.c.checkpoint : "");
      break;
    }
    h.seconds += tc_now() - start;
    cpu_s += tc_cpu_now() - cpu_start;
    if (cpu_steps) cpu_ms[e - 1] = 1e3 * cpu_s / (double)cpu_steps;
    double acc = evaluate(net, &test, dev);
    char devline[200] = "";
    if (dev) tc_device_line(dev, devline, sizeof devline);
    epoch_stats *s = &stats[e - 1];
    *s = (epoch_stats){ .epoch = e, .train_loss = h.loss_sum / (double)steps, .accuracy = acc,
                        .images_per_s = (double)h.images / h.seconds, .seconds = h.seconds, .rss = tc_rss_bytes() };
    tc_tag_live_now(&s->by_tag);
    s->ledger_live = tc_tag_live_total(&s->by_tag);
    printf("%sepoch %d: train loss %.4f, test accuracy %.2f%%, %.0f images/s, %.1f s, rss %.1f MiB, "
           "ledger live %.1f MiB, tape blocks live after steps %llu%s%s\n",
           tty ? "\r" : "", e, s->train_loss, 100 * acc, s->images_per_s, h.seconds, (double)s->rss / 1048576.0,
           (double)s->ledger_live / 1048576.0, (unsigned long long)tc.leaks, dev ? ", " : "", devline);
    fflush(stdout);
    if (o.c.json) write_json(o.c.json, stats, cpu_ms, e, &o);
    if (o.c.checkpoint && e == o.epochs) {   /* the end of the run */
      h.nstats = e;
      save(&o, net, opt, e, steps, rng, &h, stats, order);
    }
  }

  tensor_pool_use(NULL);
  ag_tape_use(NULL);
  ag_optim_free(opt);
  ag_layer_free(net);
  ag_tape_free(tape);
  if (cloned) {
    /* The "fix" of seed 003: purge the pool.  The clones' buffers are still
     * referenced: the purge refuses them and reports each. */
    size_t back = gpu_pool_purge(dev);
    printf("train-lenet: the purge returned %zu bytes to the device and refused the buffers still referenced\n",
           back);
  } else if (dev) {
    gpu_pool_empty_cache(dev);
    gpu_pool_destroy(dev);
  }
  tensor_pool_free(pool);
  tensor_free(train.x);
  tensor_free(train.y);
  tensor_free(test.x);
  tensor_free(test.y);
  free(stats);
  free(cpu_ms);
  free(order);
  ta_scan();
  size_t findings = ta_findings_count(NULL);
  int html_failed = o.c.html && tc_write_html(o.c.html, argc, argv) != 0;
  printf("train-lenet: %.1f s in all; ledger findings: %zu%s\n", tc_now() - t0, findings,
         tc.leaks ? " (and tape blocks left live after a step)" : "");
  if (o.c.html && !html_failed) printf("train-lenet: the ledger's report is in %s\n", o.c.html);
  return findings || tc.leaks || html_failed ? 1 : 0;
}
