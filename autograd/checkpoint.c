/* checkpoint.c - one file with the model's parameters, the optimizer's state,
 * the training position, the generator's state and the caller's extra bytes
 * (the data order).
 *
 * Layout (little-endian, as this machine writes it):
 *   header, 32 bytes: magic "TAGCKPT\n", u32 version (1), u32 0,
 *                     u64 payload bytes, u32 CRC-32 (zlib) of the payload, u32 0
 *   payload: u64 epoch, u64 step, u64 rng state,
 *            u32 parameter count; per parameter u32 ndim, i64 shape[ndim], f32 data
 *            u32 optimizer kind (0 none, 1 SGD, 2 Adam), u64 steps,
 *            f32 lr, momentum, weight decay, beta1, beta2, eps;
 *            per parameter its first buffer, and for Adam its second (f32)
 *            u64 extra bytes, the bytes
 * Saving writes PATH.tmp, fsyncs it, renames it over PATH and fsyncs the
 * directory: a crash leaves the previous checkpoint whole.
 *
 * A model on a device (ag_layer_to) is saved and loaded as well: each
 * device tensor (parameter, optimizer state) is copied to host memory for
 * the payload, before anything is written, and loading copies the file's
 * values back into the device tensors in place (tensor_copy_), after the
 * whole file has checked out.  The file is the same either way: a
 * checkpoint saved on a device loads on the host and the other way round. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC "TAGCKPT\n"
#define VERSION 1u
#define HDR 32

typedef struct {
  unsigned char *p;
  size_t len, cap;
  bool oom;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (q == NULL) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}
static void put32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put64(buf *b, uint64_t v) { put(b, &v, 8); }
static void putf(buf *b, float v) { put(b, &v, 4); }

/* t's values; a device tensor's copied to host memory first.  False (the
 * tensor library's error) when that copy fails. */
static bool put_floats(buf *b, const tensor *t) {
  if (tensor_device(t) == NULL) {
    put(b, tensor_f32(t), (size_t)t->numel * 4);
    return true;
  }
  tensor *h = tensor_to(t, NULL);
  if (h == NULL) return false;
  put(b, tensor_f32(h), (size_t)h->numel * 4);
  tensor_free(h);
  return true;
}

int ag_checkpoint_save(const char *path, ag_layer *model, const ag_optim *opt, const ag_ckpt_state *st,
                       const void *extra, size_t extra_len) {
  if (path == NULL || model == NULL || st == NULL) {
    _ag_err("ag_checkpoint_save: path, model and state are required");
    return -1;
  }
  if (!_ag_live("ag_checkpoint_save", model, _ag_tag_layer, _ag_tag_layer, 0) ||
      (opt && !_ag_live("ag_checkpoint_save", opt, _ag_tag_optim, _ag_tag_optim, 0)))
    return -1;
  size_t n = ag_layer_params(model, NULL, 0);
  ag_var **ps = calloc(n ? n : 1, sizeof *ps);
  buf b = { 0 };
  if (ps == NULL) goto oom;
  ag_layer_params(model, ps, n);
  if (opt && opt->n != n) {
    free(ps);
    _ag_err("ag_checkpoint_save: the optimizer has %zu parameters, the model %zu", opt->n, n);
    return -1;
  }
  bool copied = true;   /* every device tensor copied to host memory */
  put64(&b, st->epoch);
  put64(&b, st->step);
  put64(&b, st->rng.s);
  put32(&b, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    const tensor *t = ps[i]->value;
    put32(&b, (uint32_t)t->ndim);
    put(&b, t->shape, (size_t)t->ndim * 8);
    copied = copied && put_floats(&b, t);
  }
  put32(&b, opt == NULL ? 0 : opt->kind == O_SGD ? 1 : 2);
  if (opt) {
    put64(&b, opt->steps);
    float f[6] = { opt->lr, opt->momentum, opt->weight_decay, opt->beta1, opt->beta2, opt->eps };
    for (int i = 0; i < 6; i++) putf(&b, f[i]);
    for (size_t i = 0; i < n; i++) copied = copied && put_floats(&b, opt->m[i]);
    if (opt->kind == O_ADAM)
      for (size_t i = 0; i < n; i++) copied = copied && put_floats(&b, opt->v[i]);
  }
  put64(&b, extra_len);
  if (extra_len) put(&b, extra, extra_len);
  free(ps);
  if (!copied) {   /* nothing written: the previous checkpoint stays */
    free(b.p);
    _ag_err("ag_checkpoint_save: cannot copy the device's tensors to host memory for %s: %s", path, tensor_error());
    return -1;
  }
  if (b.oom) goto oom;

  unsigned char hdr[HDR] = { 0 };
  memcpy(hdr, MAGIC, 8);
  uint32_t version = VERSION, crc = (uint32_t)crc32(0L, b.p, (uInt)0);
  for (size_t off = 0; off < b.len;) {   /* crc32 takes at most 4 GiB at a time */
    size_t chunk = b.len - off > (1u << 30) ? (1u << 30) : b.len - off;
    crc = (uint32_t)crc32(crc, b.p + off, (uInt)chunk);
    off += chunk;
  }
  uint64_t plen = b.len;
  memcpy(hdr + 8, &version, 4);
  memcpy(hdr + 16, &plen, 8);
  memcpy(hdr + 24, &crc, 4);

  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(b.p);
    _ag_err("ag_checkpoint_save: cannot create %s: %s", tmp, strerror(errno));
    return -1;
  }
  bool ok = true;
  const unsigned char *parts[2] = { hdr, b.p };
  size_t lens[2] = { HDR, b.len };
  for (int k = 0; k < 2 && ok; k++)
    for (size_t off = 0; off < lens[k] && ok;) {
      ssize_t w = write(fd, parts[k] + off, lens[k] - off);
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      if (ok) off += (size_t)w;
    }
  int err = ok ? 0 : errno;
  if (ok && fsync(fd) != 0) ok = false, err = errno;
  if (close(fd) != 0 && ok) ok = false, err = errno;
  free(b.p);
  if (!ok || rename(tmp, path) != 0) {
    if (ok) err = errno;
    unlink(tmp);
    _ag_err("ag_checkpoint_save: cannot write %s: %s", path, strerror(err));
    return -1;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);   /* the rename itself is durable */
    close(dfd);
  }
  return 0;
oom:
  free(ps);
  free(b.p);
  _ag_err("ag_checkpoint_save: out of memory");
  return -1;
}

/* ---- loading ------------------------------------------------------------------ */

typedef struct {
  const unsigned char *p;
  size_t len, off;
} reader;

static bool get(reader *r, void *dst, size_t n) {
  if (r->len - r->off < n) return false;
  memcpy(dst, r->p + r->off, n);
  r->off += n;
  return true;
}

int ag_checkpoint_load(const char *path, ag_layer *model, ag_optim *opt, ag_ckpt_state *st, void **extra,
                       size_t *extra_len) {
  if (extra) *extra = NULL;
  if (extra_len) *extra_len = 0;
  if (path == NULL || model == NULL || st == NULL) {
    _ag_err("ag_checkpoint_load: path, model and state are required");
    return -1;
  }
  if (!_ag_live("ag_checkpoint_load", model, _ag_tag_layer, _ag_tag_layer, 0) ||
      (opt && !_ag_live("ag_checkpoint_load", opt, _ag_tag_optim, _ag_tag_optim, 0)))
    return -1;
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    _ag_err("cannot open checkpoint %s: %s", path, strerror(errno));
    return -1;
  }
  unsigned char hdr[HDR];
  unsigned char *data = NULL;
  ag_var **ps = NULL;
  const char *why = NULL;
  char whybuf[256];
  uint32_t version, crc;
  uint64_t plen;
  if (fread(hdr, 1, HDR, f) != HDR || memcmp(hdr, MAGIC, 8) != 0) {
    why = "not a tagalloc checkpoint (bad magic)";
    goto bad;
  }
  memcpy(&version, hdr + 8, 4);
  memcpy(&plen, hdr + 16, 8);
  memcpy(&crc, hdr + 24, 4);
  if (version != VERSION) {
    snprintf(whybuf, sizeof whybuf, "format version %u, this build reads version %u", version, VERSION);
    why = whybuf;
    goto bad;
  }
  if (plen > ((uint64_t)1 << 40) || (data = malloc(plen ? plen : 1)) == NULL || fread(data, 1, plen, f) != plen ||
      fgetc(f) != EOF) {
    why = "truncated, or longer than its header says";
    goto bad;
  }
  uint32_t got = (uint32_t)crc32(0L, data, 0);
  for (size_t off = 0; off < plen;) {
    size_t chunk = plen - off > (1u << 30) ? (1u << 30) : plen - off;
    got = (uint32_t)crc32(got, data + off, (uInt)chunk);
    off += chunk;
  }
  if (got != crc) {
    why = "checksum mismatch (the file is damaged)";
    goto bad;
  }
  reader r = { data, plen, 0 };
  uint64_t epoch, step, rng;
  uint32_t np;
  size_t n = ag_layer_params(model, NULL, 0);
  if (!get(&r, &epoch, 8) || !get(&r, &step, 8) || !get(&r, &rng, 8) || !get(&r, &np, 4)) goto short_payload;
  if (np != n) {
    snprintf(whybuf, sizeof whybuf, "%u parameters in the file, %zu in the model", np, n);
    why = whybuf;
    goto bad;
  }
  ps = calloc(n ? n : 1, sizeof *ps);
  if (ps == NULL) {
    why = "out of memory";
    goto bad;
  }
  ag_layer_params(model, ps, n);
  /* Shapes first, nothing changed until the whole file checks out. */
  size_t start = r.off;
  for (size_t i = 0; i < n; i++) {
    uint32_t nd;
    int64_t shape[TENSOR_MAX_DIMS];
    const tensor *t = ps[i]->value;
    if (!get(&r, &nd, 4) || nd > TENSOR_MAX_DIMS || !get(&r, shape, nd * 8)) goto short_payload;
    if ((int)nd != t->ndim || memcmp(shape, t->shape, nd * 8) != 0) {
      char b1[96];
      snprintf(whybuf, sizeof whybuf, "parameter %zu has another shape in the file than the model's %s", i,
               tensor_shape_str(t, b1, sizeof b1));
      why = whybuf;
      goto bad;
    }
    if (r.len - r.off < (size_t)t->numel * 4) goto short_payload;
    r.off += (size_t)t->numel * 4;
  }
  uint32_t kind;
  uint64_t osteps = 0;
  float hp[6];
  if (!get(&r, &kind, 4) || kind > 2) goto short_payload;
  int want = opt == NULL ? 0 : opt->kind == O_SGD ? 1 : 2;
  if (opt && (int)kind != want) {
    snprintf(whybuf, sizeof whybuf, "the file holds %s state, the optimizer is %s",
             kind == 0 ? "no optimizer" : kind == 1 ? "SGD" : "Adam", want == 1 ? "SGD" : "Adam");
    why = whybuf;
    goto bad;
  }
  size_t state_at = 0;
  if (kind) {
    if (!get(&r, &osteps, 8)) goto short_payload;
    for (int i = 0; i < 6; i++)
      if (!get(&r, &hp[i], 4)) goto short_payload;
    state_at = r.off;
    size_t floats = 0;
    for (size_t i = 0; i < n; i++) floats += (size_t)ps[i]->value->numel;
    size_t bytes = floats * 4 * (kind == 2 ? 2 : 1);
    if (r.len - r.off < bytes) goto short_payload;
    r.off += bytes;
  }
  uint64_t xlen;
  if (!get(&r, &xlen, 8) || r.len - r.off != xlen) goto short_payload;
  size_t extra_at = r.off;

  if (extra && xlen) {
    *extra = malloc(xlen);
    if (*extra == NULL) {
      why = "out of memory for the extra bytes";
      goto bad;
    }
    memcpy(*extra, data + extra_at, xlen);
  }

  /* All good: load.  Each tensor the file fills, and where its values
   * are; the optimizer's seeded bug first (it makes the state anew). */
  if (opt && kind && tensor_fault_get() == TENSOR_FAULT_OPTIMIZER_STATE_LEAK)
    /* the seeded bug: the state made anew for the loaded values, the old
     * never freed (the optimizer's hold moves to the new: the old is
     * orphaned here) */
    for (size_t i = 0; i < n; i++) {
      tensor *old = opt->m[i];
      tensor *fresh = tensor_device(old) ? tensor_clone(old) : tensor_zeros(TENSOR_F32, old->ndim, old->shape);
      if (fresh == NULL) break;
      opt->m[i] = fresh;
      _ag_optim_hold(opt, "m", opt->m, i, fresh);
    }
  size_t nslots = n * (opt && kind ? (kind == 2 ? 3 : 2) : 1);
  tensor **dst = calloc(nslots ? nslots : 1, sizeof *dst);
  const unsigned char **src = calloc(nslots ? nslots : 1, sizeof *src);
  tensor **staged = calloc(nslots ? nslots : 1, sizeof *staged);   /* device tensors' values in host memory */
  if (dst == NULL || src == NULL || staged == NULL) {
    free(dst), free(src), free(staged);
    why = "out of memory";
    goto bad_extra;
  }
  size_t k = 0, off = start;
  for (size_t i = 0; i < n; i++, k++) {
    dst[k] = ps[i]->value;
    off += 4 + (size_t)dst[k]->ndim * 8;
    src[k] = data + off;
    off += (size_t)dst[k]->numel * 4;
  }
  if (opt && kind) {
    off = state_at;
    for (int w = 0; w < (kind == 2 ? 2 : 1); w++)
      for (size_t i = 0; i < n; i++, k++) {
        dst[k] = w == 0 ? opt->m[i] : opt->v[i];
        src[k] = data + off;
        off += (size_t)dst[k]->numel * 4;
      }
  }
  /* Every host copy of a device tensor's values first: running out of
   * memory here changes nothing.  (The payload's floats are 4-aligned.) */
  bool dev_ok = true;
  for (k = 0; k < nslots && dev_ok; k++)
    if (tensor_device(dst[k]) != NULL)
      dev_ok = (staged[k] = tensor_from_f32((const float *)(const void *)src[k], dst[k]->ndim, dst[k]->shape)) != NULL;
  if (!dev_ok) {
    for (k = 0; k < nslots; k++) tensor_free(staged[k]);
    free(dst), free(src), free(staged);
    snprintf(whybuf, sizeof whybuf, "no host memory to stage the device's values: %s", tensor_error());
    why = whybuf;
    goto bad_extra;
  }
  size_t failed = nslots;
  for (k = 0; k < nslots; k++) {
    if (staged[k] == NULL) memcpy(tensor_f32(dst[k]), src[k], (size_t)dst[k]->numel * 4);
    else if (failed == nslots && tensor_copy_(dst[k], staged[k]) != TENSOR_OK) failed = k;
    tensor_free(staged[k]);
  }
  free(dst), free(src), free(staged);
  if (failed < nslots) {
    /* the device refused a copy: what came before it is loaded, the rest not */
    snprintf(whybuf, sizeof whybuf, "copying tensor %zu of %zu to the device failed (the model is partly loaded): %s",
             failed, nslots, tensor_error());
    why = whybuf;
    goto bad_extra;
  }
  if (opt && kind) {
    opt->steps = osteps;
    opt->lr = hp[0];
    opt->momentum = hp[1];
    opt->weight_decay = hp[2];
    opt->beta1 = hp[3];
    opt->beta2 = hp[4];
    opt->eps = hp[5];
  }
  st->epoch = epoch;
  st->step = step;
  st->rng.s = rng;
  if (extra_len) *extra_len = xlen;
  free(ps);
  free(data);
  fclose(f);
  return 0;
short_payload:
  why = "its payload ends early or holds a bad count (damaged or foreign)";
  goto bad;
bad_extra:
  if (extra) {
    free(*extra);
    *extra = NULL;
  }
bad:
  free(ps);
  free(data);
  fclose(f);
  _ag_err("refusing checkpoint %s: %s", path, why);
  return -1;
}
