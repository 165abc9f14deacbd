/* core.c - storages and headers on the ledger, errors, making and freeing.
 *
 * One tensor costs the ledger one "tensor.header" block, one hold
 * (header -> storage, ended by the header's free) and one refcount
 * transition each way; a fresh storage adds one "tensor.storage" block.  Nothing here is per element.
 * Every event has its stack, but the events of one call share one walk:
 * making a header walks the stack twice (its allocation; its acquisition
 * and hold), freeing it twice (its release and, for a pooled storage, the
 * pool's hold; the header's free). */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ta_tag _tensor_tag_storage, _tensor_tag_header, _tensor_tag_pool, _tensor_tag_meta, _tensor_tag_scratch;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_tags(void) {
  _tensor_tag_storage = ta_tag_get("tensor.storage");
  _tensor_tag_header = ta_tag_get("tensor.header");
  _tensor_tag_pool = ta_tag_get("tensor.pool");
  _tensor_tag_meta = ta_tag_get("tensor.pool.meta");
  _tensor_tag_scratch = ta_tag_get("tensor.scratch");
}

void _tensor_init(void) { pthread_once(&init_once, init_tags); }

/* ---- errors ---------------------------------------------------------------- */

static __thread tensor_status last_status;
static __thread char last_message[256];
static tensor_error_fn *handler;
static void *handler_arg;

tensor_status tensor_last_status(void) { return last_status; }
const char *tensor_error(void) { return last_message; }
void tensor_error_clear(void) {
  last_status = TENSOR_OK;
  last_message[0] = '\0';
}

void tensor_error_handler(tensor_error_fn *fn, void *arg) {
  handler = fn;
  handler_arg = arg;
}

tensor_status _tensor_err(tensor_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_message, sizeof last_message, fmt, ap);
  va_end(ap);
  last_status = st;
  if (handler) handler(st, last_message, handler_arg);
  else fprintf(stderr, "tensor: %s\n", last_message);
  return st;
}

/* A count read from a tensor that the ledger filled (a freed header, read
 * in a build without the argument checks) is said to be one
 * (ta_poison_explain), not printed as a number that means nothing. */
const char *_tensor_shape_desc(tensor_dtype dt, int ndim, const int64_t *shape, char *buf) {
  size_t n = (size_t)snprintf(buf, TENSOR_SHAPE_STR, "%s[", dt == TENSOR_I32 ? "i32" : "f32");
  if (ndim < 0 || ndim > TENSOR_MAX_DIMS) {
    snprintf(buf + n, TENSOR_SHAPE_STR - n, "ndim %d%s]", ndim, ta_poison_explain((uint32_t)ndim, 4));
    return buf;
  }
  for (int i = 0; i < ndim && n < TENSOR_SHAPE_STR; i++)
    n += (size_t)snprintf(buf + n, TENSOR_SHAPE_STR - n, i ? ",%lld%s" : "%lld%s", (long long)shape[i],
                          ta_poison_explain((uint64_t)shape[i], 8));
  if (n < TENSOR_SHAPE_STR) snprintf(buf + n, TENSOR_SHAPE_STR - n, "]");
  return buf;
}

const char *_tensor_desc(const tensor *t, char *buf) {
  if (t == NULL) {
    snprintf(buf, TENSOR_SHAPE_STR, "NULL");
    return buf;
  }
  return _tensor_shape_desc(t->dtype, t->ndim, t->shape, buf);
}

char *tensor_shape_str(const tensor *t, char *buf, size_t size) {
  char tmp[TENSOR_SHAPE_STR];
  if (t && !_tensor_live_any("tensor_shape_str", "t", t)) {
    snprintf(buf, size, "(not a live tensor)");
    return buf;
  }
  snprintf(buf, size, "%s", _tensor_desc(t, tmp));
  return buf;
}

/* A NULL input after an error is the chain of calls failing: the first
 * error stays the one reported. */
bool _tensor_arg_null(const char *op, const char *name) {
  if (last_status == TENSOR_OK) _tensor_err(TENSOR_EINVAL, "%s: %s is NULL", op, name);
  return false;
}

bool _tensor_arg_dead(const char *op, const char *name, const tensor *t) {
  _tensor_err(TENSOR_EINVAL, "%s: %s (%p)%s is not a live tensor (freed, or its storage released too often: "
              "see the ledger's finding)", op, name, (const void *)t, ta_poison_explain((uintptr_t)t, 8));
  return false;
}

bool _tensor_arg_dtype(const char *op, const char *name, const tensor *t) {
  char b[TENSOR_SHAPE_STR];
  _tensor_err(TENSOR_EDTYPE, "%s: %s is %s, want f32", op, name, _tensor_desc(t, b));
  return false;
}

int64_t _tensor_check_shape(const char *op, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TENSOR_MAX_DIMS) {
    _tensor_err(TENSOR_ESHAPE, "%s: %d dimensions (0 to %d allowed)", op, ndim, TENSOR_MAX_DIMS);
    return -1;
  }
  if (ndim > 0 && shape == NULL) {
    _tensor_err(TENSOR_EINVAL, "%s: shape is NULL", op);
    return -1;
  }
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] > 0 && n > (INT64_MAX / 8) / shape[i])) {
      char b[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ESHAPE, "%s: bad shape %s", op, _tensor_shape_desc(TENSOR_F32, ndim, shape, b));
      return -1;
    }
    n *= shape[i];
  }
  return n;
}

/* ---- storage and headers --------------------------------------------------- */

tensor_storage *_tensor_storage_new(ta_tag tag, size_t nbytes) {
  _tensor_init();
  tensor_storage *s = ta_aligned(tag, 64, STORAGE_HDR + nbytes);
  if (s == NULL) {
    _tensor_err(TENSOR_ENOMEM, "out of memory for a storage of %zu bytes", nbytes);
    return NULL;
  }
  memset(s, 0, sizeof *s);
  s->data = (char *)s + STORAGE_HDR;
  s->nbytes = nbytes;
  ta_ref_init(s, 1);
  return s;
}

void _tensor_contig_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= shape[i] > 1 ? shape[i] : 1;
  }
}

tensor *_tensor_header(tensor_storage *s, bool adopt, tensor_dtype dt, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t offset, uint32_t stack) {
  _tensor_init();
  tensor *t = ta_alloc(_tensor_tag_header, sizeof *t);
  if (t == NULL) {
    _tensor_err(TENSOR_ENOMEM, "out of memory for a tensor header");
    return NULL;
  }
  t->ndim = ndim;
  t->dtype = dt;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->strides[i] = strides[i];
    t->numel *= shape[i];
  }
  for (int i = ndim; i < TENSOR_MAX_DIMS; i++) t->shape[i] = 1, t->strides[i] = 0;
  t->offset = offset;
  t->storage = s;
  t->data = (char *)s->data + offset * 4;
  t->scope = 0;
  t->scope_prev = t->scope_next = NULL;
  /* The acquisition and the hold are one event of the caller's: one stack
   * walk for both (the header's allocation took its own in ta_alloc). */
  if (!adopt) {
    if (stack == 0) stack = ta_stack_here();
    ta_ref_acquire_at(s, stack);
    ta_hold_at(t, "storage", s, stack);
  } else if (stack) {
    ta_hold_at(t, "storage", s, stack);
  } else {
    ta_hold(t, "storage", s);
  }
  _tensor_scope_adopt(t);
  return t;
}

void tensor_free(tensor *t) {
  if (t == NULL) return;
  /* a header freed already (free.double) or never one: nothing is freed */
  if (!_tensor_check_block(t, _tensor_tag_header, _tensor_tag_header, TA_CHECK_CALLER | TA_CHECK_FREE, "tensor_free"))
    return;
  _tensor_free(t);
}

void _tensor_free(tensor *t) {
  _tensor_scope_forget(t);
  tensor_storage *s = t->storage;
  /* one stack for the release and, for a pooled storage, the pool's hold */
  uint32_t here = ta_stack_here();
  long n = ta_ref_release_at(s, here);
  /* the seeded bug view-underflow: a view's free gives back one reference
   * too many (a view: a heap storage with another header still on it).
   * After the header's own release, so that this line is the callsite that
   * releases more than it acquired: the finding's headline. */
  if (_tensor_fault(TENSOR_FAULT_VIEW_UNDERFLOW) && s->pool == NULL && n > 0) n = ta_ref_release(s);
  bool pooled = false;
  /* A storage going back to its pool is held by the pool before the
   * header lets go of it, so it is never an orphan in between.  The header's
   * hold on its storage ends with the header: the ledger drops a block's
   * holds when it is freed (an unhold first would only be one more recorded
   * event, with the same orphan check). */
  if (n == 0 && s->pool) pooled = _tensor_pool_put(s, here);
  ta_free(t);
  if (n == 0 && _tensor_on_device(s)) _tensor_devops->release(s);
  if (n == 0 && !pooled) ta_free(s);
}

tensor *_tensor_out(const char *op, tensor_dtype dt, int ndim, const int64_t *shape) {
  if (_tensor_pool_current) return tensor_pool_acquire(_tensor_pool_current, dt, ndim, shape);
  int64_t n = _tensor_check_shape(op, ndim, shape);
  if (n < 0) return NULL;
  _tensor_init();
  tensor_storage *s = _tensor_storage_new(_tensor_tag_storage, (size_t)n * 4);
  if (s == NULL) return NULL;
  int64_t st[TENSOR_MAX_DIMS];
  _tensor_contig_strides(ndim, shape, st);
  tensor *t = _tensor_header(s, true, dt, ndim, shape, st, 0, 0);
  if (t == NULL && ta_ref_release(s) == 0) ta_free(s);
  return t;
}

/* ---- making ---------------------------------------------------------------- */

tensor *tensor_empty(tensor_dtype dtype, int ndim, const int64_t *shape) {
  if (dtype != TENSOR_F32 && dtype != TENSOR_I32) {
    _tensor_err(TENSOR_EDTYPE, "tensor_empty: unknown dtype %d", (int)dtype);
    return NULL;
  }
  return _tensor_out("tensor_empty", dtype, ndim, shape);
}

tensor *tensor_zeros(tensor_dtype dtype, int ndim, const int64_t *shape) {
  tensor *t = tensor_empty(dtype, ndim, shape);
  if (t) memset(t->data, 0, (size_t)t->numel * 4);
  return t;
}

tensor *tensor_full(int ndim, const int64_t *shape, float value) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  if (t) {
    float *p = t->data;
    for (int64_t i = 0; i < t->numel; i++) p[i] = value;
  }
  return t;
}

tensor *tensor_from_f32(const float *src, int ndim, const int64_t *shape) {
  if (src == NULL) {
    _tensor_err(TENSOR_EINVAL, "tensor_from_f32: src is NULL");
    return NULL;
  }
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  if (t) memcpy(t->data, src, (size_t)t->numel * 4);
  return t;
}

tensor *tensor_from_i32(const int32_t *src, int ndim, const int64_t *shape) {
  if (src == NULL) {
    _tensor_err(TENSOR_EINVAL, "tensor_from_i32: src is NULL");
    return NULL;
  }
  tensor *t = tensor_empty(TENSOR_I32, ndim, shape);
  if (t) memcpy(t->data, src, (size_t)t->numel * 4);
  return t;
}

tensor *tensor_arange(int64_t n) {
  tensor *t = tensor_empty(TENSOR_F32, 1, &n);
  if (t) {
    float *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = (float)i;
  }
  return t;
}

tensor *tensor_scalar(float value) { return tensor_full(0, NULL, value); }

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

tensor *tensor_randn(int ndim, const int64_t *shape, float std, uint64_t seed) {
  tensor *t = tensor_empty(TENSOR_F32, ndim, shape);
  if (t == NULL) return NULL;
  float *p = t->data;
  uint64_t s = seed;
  for (int64_t i = 0; i < t->numel; i += 2) {
    double u1 = ((splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);   /* (0, 1] */
    double u2 = (splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
    double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    p[i] = (float)(std * r * cos(th));
    if (i + 1 < t->numel) p[i + 1] = (float)(std * r * sin(th));
  }
  return t;
}

/* ---- facts ----------------------------------------------------------------- */

int tensor_is_contiguous(const tensor *t) {
  if (!_tensor_arg_any("tensor_is_contiguous", "t", t)) return 0;
  return _tensor_contig(t);
}

int _tensor_contig(const tensor *t) {
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (t->strides[i] != st) return 0;
    st *= t->shape[i];
  }
  return 1;
}

int tensor_same_shape(const tensor *a, const tensor *b) {
  if (!_tensor_arg_any("tensor_same_shape", "a", a) || (b != a && !_tensor_arg_any("tensor_same_shape", "b", b)))
    return 0;
  return _tensor_same_shape(a, b);
}

int _tensor_same_shape(const tensor *a, const tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

size_t tensor_nbytes(const tensor *t) {
  if (t == NULL || !_tensor_live_any("tensor_nbytes", "t", t)) return 0;
  return (size_t)t->numel * 4;
}

static int64_t offset_of(const tensor *t, const int64_t *index, const char *op) {
  int64_t off = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i]) {
      char b[TENSOR_SHAPE_STR];
      _tensor_err(TENSOR_ERANGE, "%s: index %lld out of range for axis %d of %s", op,
                  (long long)index[i], i, _tensor_desc(t, b));
      return -1;
    }
    off += index[i] * t->strides[i];
  }
  return off;
}

float tensor_get(const tensor *t, const int64_t *index) {
  if (!_tensor_arg("tensor_get", "t", t)) return NAN;
  int64_t off = offset_of(t, index, "tensor_get");
  if (off < 0 && t->ndim) return NAN;
  return t->dtype == TENSOR_F32 ? ((float *)t->data)[off] : (float)((int32_t *)t->data)[off];
}

void tensor_set(tensor *t, const int64_t *index, float v) {
  if (!_tensor_arg("tensor_set", "t", t)) return;
  int64_t off = offset_of(t, index, "tensor_set");
  if (off < 0 && t->ndim) return;
  if (t->dtype == TENSOR_F32) ((float *)t->data)[off] = v;
  else ((int32_t *)t->data)[off] = (int32_t)v;
}

float tensor_item(const tensor *t) {
  bool bad, dev = _tensor_dev_dispatch("tensor_item", t, NULL, &bad);
  if (bad || (!dev && !_tensor_arg("tensor_item", "t", t))) return NAN;
  if (t->numel != 1) {
    char b[TENSOR_SHAPE_STR];
    _tensor_err(TENSOR_ESHAPE, "tensor_item: %s has %lld elements%s, want 1", _tensor_desc(t, b),
                (long long)t->numel, ta_poison_explain((uint64_t)t->numel, 8));
    return NAN;
  }
  float v;
  if (dev) return _tensor_devops->item("tensor_item", t, &v) == TENSOR_OK ? v : NAN;
  return t->dtype == TENSOR_F32 ? *(float *)t->data : (float)*(int32_t *)t->data;
}

long tensor_storage_refs(const tensor *t) {
  if (t == NULL || !_tensor_live_any("tensor_storage_refs", "t", t)) return -1;
  return ta_ref_count(t->storage);
}
const void *tensor_storage_block(const tensor *t) {
  if (t == NULL || !_tensor_live_any("tensor_storage_block", "t", t)) return NULL;
  return t->storage;
}
size_t tensor_storage_bytes(const tensor *t) {
  if (t == NULL || !_tensor_live_any("tensor_storage_bytes", "t", t)) return 0;
  return t->storage->nbytes;
}

/* ---- devices ------------------------------------------------------------------ */

const struct _tensor_devops *_tensor_devops;

static void device_desc(const tensor *t, char *buf, size_t len) {
  if (_tensor_on_device(t->storage) && _tensor_devops) _tensor_devops->name(t->storage->device, buf, len);
  else snprintf(buf, len, "the host");
}

bool _tensor_arg_device(const char *op, const char *name, const tensor *t) {
  char b[TENSOR_SHAPE_STR], d[64];
  device_desc(t, d, sizeof d);
  _tensor_err(TENSOR_EINVAL, "%s: %s is %s on %s; this op runs on host tensors only (tensor_to(%s, NULL) first)",
              op, name, _tensor_desc(t, b), d, name);
  return false;
}

tensor_status _tensor_dev_mixed(const char *op, const tensor *a, const tensor *b) {
  char da[64], db[64];
  device_desc(a, da, sizeof da);
  device_desc(b, db, sizeof db);
  return _tensor_err(TENSOR_EINVAL, "%s: the inputs are on different devices (%s and %s): tensor_to one of them first",
                     op, da, db);
}

gpu_pool *tensor_device(const tensor *t) {
  if (t == NULL || !_tensor_live_any("tensor_device", "t", t)) return NULL;
  return _tensor_on_device(t->storage) ? t->storage->device : NULL;
}

/* ---- seeded bugs ---------------------------------------------------------------- */

static const char *const fault_names[TENSOR_FAULT_COUNT] = {
  "none", "reshape-dummy", "slice-dummy", "view-underflow", "tape-stack-inputs", "arena-early-reset",
  "params-in-arena", "scope-escape", "pool-double-release", "optimizer-state-leak", "tape-no-shrink",
  "gpu-clone-retain",
};
int _tensor_fault_id = -1;   /* -1: not read from the environment yet */

const char *tensor_fault_name(tensor_fault f) {
  return (unsigned)f < TENSOR_FAULT_COUNT ? fault_names[f] : NULL;
}

tensor_status tensor_fault_set(const char *name) {
  if (name == NULL || !*name) name = "none";
  for (int i = 0; i < TENSOR_FAULT_COUNT; i++)
    if (strcmp(name, fault_names[i]) == 0) {
      _tensor_fault_id = i;
      return TENSOR_OK;
    }
  char list[512];
  size_t n = 0;
  for (int i = 1; i < TENSOR_FAULT_COUNT && n < sizeof list; i++)
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i > 1 ? ", " : "", fault_names[i]);
  return _tensor_err(TENSOR_EINVAL, "unknown fault '%s' (known: %s)", name, list);
}

tensor_fault tensor_fault_get(void) {
  if (_tensor_fault_id < 0) {
    const char *e = getenv("TAGALLOC_FAULT");
    _tensor_fault_id = 0;
    if (e && *e && tensor_fault_set(e) != TENSOR_OK) _tensor_fault_id = 0;
  }
  return (tensor_fault)_tensor_fault_id;
}

/* ---- threads ------------------------------------------------------------------ */

static int n_threads = 1;

void tensor_set_threads(int n) {
  if (n < 1) return;
  n_threads = n > TENSOR_MAX_THREADS ? TENSOR_MAX_THREADS : n;
  openblas_set_num_threads(n);
}

int _tensor_threads(void) { return n_threads; }

typedef struct {
  void (*fn)(void *ctx, int64_t lo, int64_t hi, int part);
  void *ctx;
  int64_t lo, hi;
} par_job;

/* Workers made on first use and kept (a thread per call would cost more
 * than the work: the ledger sets up and drains each thread's state).  One
 * parallel loop at a time; a second caller meanwhile runs its loop alone. */
static pthread_mutex_t par_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t par_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t par_go = PTHREAD_COND_INITIALIZER, par_done = PTHREAD_COND_INITIALIZER;
static par_job par_jobs[TENSOR_MAX_THREADS];
static int par_workers, par_parts, par_pending;
static uint64_t par_gen;

static void *par_worker(void *arg) {
  int me = (int)(intptr_t)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&par_lock);
  for (;;) {
    while (par_gen == seen) pthread_cond_wait(&par_go, &par_lock);
    seen = par_gen;
    if (me >= par_parts) continue;
    par_job j = par_jobs[me];
    pthread_mutex_unlock(&par_lock);
    j.fn(j.ctx, j.lo, j.hi, me);
    pthread_mutex_lock(&par_lock);
    if (--par_pending == 0) pthread_cond_signal(&par_done);
  }
  return NULL;
}

int _tensor_parallel(int64_t n, int parts, void (*fn)(void *ctx, int64_t lo, int64_t hi, int part), void *ctx) {
  if (parts > n) parts = (int)(n > 0 ? n : 1);
  if (parts > TENSOR_MAX_THREADS) parts = TENSOR_MAX_THREADS;
  if (parts <= 1 || pthread_mutex_trylock(&par_busy) != 0) {
    fn(ctx, 0, n, 0);
    return 1;
  }
  pthread_mutex_lock(&par_lock);
  while (par_workers < parts - 1) {
    pthread_t th;
    if (pthread_create(&th, NULL, par_worker, (void *)(intptr_t)(par_workers + 1)) != 0) break;
    pthread_detach(th);
    par_workers++;
  }
  if (parts > par_workers + 1) parts = par_workers + 1;
  for (int p = 0; p < parts; p++) par_jobs[p] = (par_job){ fn, ctx, n * p / parts, n * (p + 1) / parts };
  par_parts = parts;
  par_pending = parts - 1;
  par_gen++;
  pthread_cond_broadcast(&par_go);
  pthread_mutex_unlock(&par_lock);
  fn(ctx, par_jobs[0].lo, par_jobs[0].hi, 0);
  pthread_mutex_lock(&par_lock);
  while (par_pending > 0) pthread_cond_wait(&par_done, &par_lock);
  pthread_mutex_unlock(&par_lock);
  pthread_mutex_unlock(&par_busy);
  return parts;
}
