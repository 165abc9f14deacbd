/* trace_read.c - the trace reader (see trace_read.h and alloc/TRACE.md).
 *
 * The whole file is mapped (or read, for what cannot be mapped); every
 * record is bounds-checked before anything in it is looked at, so no input
 * makes the reader touch a byte outside the file.  The model replays the
 * allocation events in sequence order (the file holds per-thread buffers in
 * flush order, not in event order: the threads' streams are merged) with
 * open-addressing hash maps.  FRAME records, which come in runs, are read
 * in a loop of their own (frames_rest); a records-only model keeps only
 * where each one is and reads the chain of a stack when it is asked for
 * (lazy_stack). */
#include "trace_read.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct report_trace {
  const unsigned char *data;
  size_t size;
  void *owned;               /* malloc'd bytes to free, or NULL */
  void *map;                 /* mmap'd bytes to unmap, or NULL */
  size_t map_len;
  char *name;
  tr_file_header hdr;
  uint64_t first;            /* offset of the first record (header_size) */
  int refs;                  /* report_trace_close and the models that read its FRAME records lazily */
};

/* ---- open ------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static void trace_free(report_trace *t) {
  if (t == NULL) return;
  if (t->map) munmap(t->map, t->map_len);
  free(t->owned);
  free(t->name);
  free(t);
}

/* Checks the file header of t->data; false with err set when it is bad. */
static bool check_header(report_trace *t, char *err, size_t errlen) {
  const char *name = t->name;
  if (t->size < sizeof(uint64_t)) {
    set_err(err, errlen, "TRACE: not a tagalloc trace (%zu bytes, too short for a header): %s", t->size, name);
    return false;
  }
  uint64_t magic;
  memcpy(&magic, t->data, sizeof magic);
  if (magic != TR_MAGIC) {
    set_err(err, errlen, "TRACE: not a tagalloc trace (bad magic): %s", name);
    return false;
  }
  if (t->size < sizeof(tr_file_header)) {
    set_err(err, errlen, "TRACE: the file header is cut short (%zu of %zu bytes): %s", t->size,
            sizeof(tr_file_header), name);
    return false;
  }
  memcpy(&t->hdr, t->data, sizeof t->hdr);
  if (t->hdr.version != 1 && t->hdr.version != TR_VERSION) {
    set_err(err, errlen, "TRACE: version %" PRIu32 " is not supported (this reader knows 1 and %d): %s",
            t->hdr.version, TR_VERSION, name);
    return false;
  }
  uint32_t hs = t->hdr.header_size;
  if (hs < sizeof(tr_file_header) || hs % 8 != 0 || hs > t->size) {
    set_err(err, errlen, "TRACE: bad file header size %" PRIu32 " (file of %zu bytes): %s", hs, t->size, name);
    return false;
  }
  t->first = hs;
  return true;
}

static report_trace *trace_new(const char *name) {
  report_trace *t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->name = strdup(name ? name : "(memory)");
  if (t->name == NULL) {
    free(t);
    return NULL;
  }
  t->refs = 1;
  return t;
}

report_trace *report_trace_open_mem(const void *data, size_t size, const char *name, char *err,
                                    size_t errlen) {
  report_trace *t = trace_new(name);
  if (t == NULL) {
    set_err(err, errlen, "TRACE: out of memory: %s", name ? name : "(memory)");
    return NULL;
  }
  if (((uintptr_t)data & 7) != 0 && size > 0) {
    t->owned = malloc(size);
    if (t->owned == NULL) {
      set_err(err, errlen, "TRACE: out of memory for %zu bytes: %s", size, t->name);
      trace_free(t);
      return NULL;
    }
    memcpy(t->owned, data, size);
    data = t->owned;
  }
  t->data = data;
  t->size = data ? size : 0;
  if (!check_header(t, err, errlen)) {
    trace_free(t);
    return NULL;
  }
  return t;
}

report_trace *report_trace_open(const char *path, char *err, size_t errlen) {
  report_trace *t = trace_new(path);
  if (t == NULL) {
    set_err(err, errlen, "TRACE: out of memory: %s", path ? path : "(null)");
    return NULL;
  }
  int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) {
    set_err(err, errlen, "TRACE: cannot open (%s): %s", strerror(path ? errno : EINVAL), t->name);
    trace_free(t);
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    /* Mapped, not read: an iteration reads it front to back and lets go of
     * the pages behind it (report_trace_next), so that a pass over a trace
     * of any size holds a window of it, not the whole file. */
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
      t->map = p;
      t->map_len = (size_t)st.st_size;
      t->data = p;
      t->size = (size_t)st.st_size;
    }
  }
  if (t->map == NULL) {                 /* not mappable (a pipe, /proc, empty): read it */
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
      if (buf == NULL) break;
      if (len == cap) {
        unsigned char *nb = realloc(buf, cap * 2);
        if (nb == NULL) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
      }
      ssize_t n = read(fd, buf + len, cap - len);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        set_err(err, errlen, "TRACE: cannot read (%s): %s", strerror(errno), t->name);
        free(buf);
        close(fd);
        trace_free(t);
        return NULL;
      }
      if (n == 0) break;
      len += (size_t)n;
    }
    if (buf == NULL) {
      set_err(err, errlen, "TRACE: out of memory reading: %s", t->name);
      close(fd);
      trace_free(t);
      return NULL;
    }
    t->owned = buf;
    t->data = buf;
    t->size = len;
  }
  close(fd);
  if (!check_header(t, err, errlen)) {
    trace_free(t);
    return NULL;
  }
  return t;
}

void report_trace_close(report_trace *t) {
  if (t && --t->refs == 0) trace_free(t);
}

const tr_file_header *report_trace_header(const report_trace *t) { return &t->hdr; }
size_t report_trace_size(const report_trace *t) { return t->size; }
const char *report_trace_name(const report_trace *t) { return t->name; }

/* ---- records ------------------------------------------------------------------ */

const char *report_trace_type_name(unsigned type) {
  static const char *const names[] = {
    [TR_MODULE] = "MODULE", [TR_STACK] = "STACK", [TR_TAG] = "TAG", [TR_ALLOC] = "ALLOC",
    [TR_FREE] = "FREE", [TR_REALLOC] = "REALLOC", [TR_REF] = "REF", [TR_HOLD] = "HOLD",
    [TR_ARENA_RESET] = "ARENA_RESET", [TR_MARK] = "MARK", [TR_THREAD_START] = "THREAD_START",
    [TR_THREAD_END] = "THREAD_END", [TR_TIME] = "TIME", [TR_FINDING_EVENT] = "FINDING_EVENT",
    [TR_FINDING] = "FINDING", [TR_END] = "END", [TR_PACKED] = "PACKED", [TR_FRAME] = "FRAME",
    [TR_DEVICE_ALLOC] = "DEVICE_ALLOC", [TR_DEVICE_FREE] = "DEVICE_FREE",
    [TR_COMMAND] = "COMMAND", [TR_SUMMARY] = "SUMMARY", [TR_REF_SITE] = "REF_SITE",
    [TR_EXIT] = "EXIT",
  };
  return type < sizeof names / sizeof *names && names[type] ? names[type] : "?";
}

/* The fixed part of a known type and how many strings follow it; -1 for an
 * unknown type. */
static int layout(unsigned type, size_t *fixed) {
  switch (type) {
  case TR_MODULE:        *fixed = sizeof(tr_module); return 1;
  case TR_STACK:         *fixed = sizeof(tr_stack); return 0;
  case TR_FRAME:         *fixed = sizeof(tr_frame); return 0;
  case TR_TAG:           *fixed = sizeof(tr_tag); return 1;
  case TR_ALLOC:         *fixed = sizeof(tr_alloc); return 0;
  case TR_FREE:          *fixed = sizeof(tr_free); return 0;
  case TR_REALLOC:       *fixed = sizeof(tr_realloc); return 0;
  case TR_REF:           *fixed = sizeof(tr_ref); return 0;
  case TR_HOLD:          *fixed = sizeof(tr_hold); return 1;
  case TR_ARENA_RESET:   *fixed = sizeof(tr_arena_reset); return 0;
  case TR_MARK:          *fixed = sizeof(tr_mark); return 0;
  case TR_THREAD_START:
  case TR_THREAD_END:    *fixed = sizeof(tr_thread); return 0;
  case TR_TIME:          *fixed = sizeof(tr_time); return 0;
  case TR_FINDING_EVENT: *fixed = sizeof(tr_finding_event); return 1;
  case TR_FINDING:       *fixed = sizeof(tr_finding); return 3;
  case TR_END:           *fixed = sizeof(tr_end); return 0;
  case TR_EXIT:          *fixed = sizeof(tr_exit); return 0;
  case TR_PACKED:        *fixed = sizeof(tr_packed); return 0;
  case TR_DEVICE_ALLOC:  *fixed = sizeof(tr_device_alloc); return 0;
  case TR_DEVICE_FREE:   *fixed = sizeof(tr_device_free); return 0;
  case TR_COMMAND:       *fixed = sizeof(tr_command); return 0;   /* argc strings, read below */
  case TR_SUMMARY:       *fixed = sizeof(tr_summary); return 0;
  case TR_REF_SITE:      *fixed = sizeof(tr_ref_site); return 0;
  default:               return -1;
  }
}

static bool damage(report_trace_iter *it, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool damage(report_trace_iter *it, uint64_t off, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  it->done = true;
  it->damaged = true;
  it->damage_offset = off;
  snprintf(it->message, sizeof it->message,
           "TRACE: damaged at byte %" PRIu64 ": %s (%" PRIu64 " whole records before it): %s",
           off, why, it->records, it->t->name);
  return false;
}

void report_trace_iter_init(report_trace_iter *it, const report_trace *t) {
  memset(it, 0, sizeof *it);
  it->t = t;
  it->off = t->first;
}

static inline bool get_uv(const unsigned char **p, const unsigned char *end, uint64_t *v) {
  if (__builtin_expect(*p < end && !(**p & 0x80), 1)) {   /* one byte: most deltas, sizes, stacks and tags */
    *v = *(*p)++;
    return true;
  }
  uint64_t x = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    unsigned char c = *(*p)++;
    x |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

static inline bool get_sv(const unsigned char **p, const unsigned char *end, uint64_t *v) {
  uint64_t z;
  if (!get_uv(p, end, &z)) return false;
  *v = (z >> 1) ^ (uint64_t)-(int64_t)(z & 1);
  return true;
}

/* The next event of the open PACKED record into r; false at its end (or
 * at damage, then it->done). */
static bool packed_next(report_trace_iter *it, report_trace_rec *r) {
  const unsigned char *p = it->pk, *end = it->pk_end;
  if (p == end || *p == 0) {                         /* the end, or the zero padding */
    it->pk = NULL;
    it->records++;
    return false;
  }
  unsigned kind = *p++;
  uint64_t ds, da, size = 0, stack = 0, tag = 0, arena = 0;
  bool known = kind == TR_PK_FREE || kind == TR_PK_ALLOC || kind == (TR_PK_ALLOC | TR_PK_ARENA);
  bool ok = known && get_sv(&p, end, &ds) && get_sv(&p, end, &da);
  if (ok && kind & TR_PK_ALLOC)
    ok = get_uv(&p, end, &size) && get_uv(&p, end, &stack) && get_uv(&p, end, &tag) &&
         (!(kind & TR_PK_ARENA) || get_uv(&p, end, &arena));
  else if (ok)
    ok = get_uv(&p, end, &stack);
  if (!ok || stack > UINT32_MAX || tag > UINT16_MAX || arena > UINT8_MAX) {
    size_t at = (size_t)(it->pk - (it->t->data + it->pk_off));
    it->pk = NULL;
    it->records++;                                   /* its events before were whole */
    damage(it, it->pk_off, "event %" PRIu64 " of a PACKED record (at byte %zu of it) is %s",
           it->pk_events, at,
           ok ? "out of range" : known ? "cut short" : "of an unknown kind");
    return false;
  }
  it->at = (uint64_t)(it->pk - it->t->data);
  it->pk = p;
  it->pk_events++;
  it->pk_seq += ds;
  it->pk_addr += da;
  if (kind & TR_PK_ALLOC) {
    it->pk_ev.a = (tr_alloc){ it->pk_seq, it->pk_addr, size, (uint32_t)stack, (uint16_t)tag,
                              (uint8_t)arena, 0, it->pk_thread };
    r->type = TR_ALLOC;
    r->payload_size = sizeof(tr_alloc);
  } else {
    it->pk_ev.f = (tr_free){ it->pk_seq, it->pk_addr, (uint32_t)stack, it->pk_thread };
    r->type = TR_FREE;
    r->payload_size = sizeof(tr_free);
  }
  r->payload = &it->pk_ev;
  r->offset = it->pk_off;
  return true;
}

/* The mapped pages of the records before off are done with: they are
 * given back (a clean page of a private file mapping comes back from the
 * file if a reader looks again: the model keeps pointers to strings and
 * STACK frames in it, and may).  Every READ_WINDOW bytes. */
#define READ_WINDOW (4u << 20)
static void release_behind(report_trace_iter *it, uint64_t off) {
  const report_trace *t = it->t;
  uint64_t page = 4096, lo = it->released & ~(page - 1), hi = off & ~(page - 1);
  if (hi > lo) madvise((char *)t->map + lo, hi - lo, MADV_DONTNEED);
  it->released = hi;
}

bool report_trace_next(report_trace_iter *it, report_trace_rec *r) {
  const report_trace *t = it->t;
  while (!it->done) {
    if (it->pk) {
      if (packed_next(it, r)) return true;
      continue;
    }
    uint64_t off = it->off, left = t->size - off;
    if (t->map && off - it->released >= READ_WINDOW) release_behind(it, off);
    if (left == 0) {
      it->done = true;
      return false;
    }
    if (left < sizeof(tr_header))
      return damage(it, off, "the file ends inside a record header (%" PRIu64 " of %zu bytes)", left,
                    sizeof(tr_header));
    tr_header h;
    memcpy(&h, t->data + off, sizeof h);
    /* the file is read once, front to back: ask for the bytes ahead (the
     * hardware's prefetcher stops at page boundaries) */
    if (left > 2048) __builtin_prefetch(t->data + off + 2048);
#define tn report_trace_type_name(h.type)
    if (h.size < sizeof(tr_header))
      return damage(it, off, "record size %" PRIu32 " is smaller than its %zu-byte header (type %u %s)",
                    h.size, sizeof(tr_header), h.type, tn);
    if (h.size % 8 != 0)
      return damage(it, off, "record size %" PRIu32 " is not a multiple of 8 (type %u %s)", h.size, h.type, tn);
    if (h.size > left)
      return damage(it, off, "a %" PRIu32 "-byte record (type %u %s) runs past the end of the file "
                    "(%" PRIu64 " bytes left): truncated", h.size, h.type, tn, left);
    const unsigned char *p = t->data + off + sizeof h;
    size_t psize = h.size - sizeof h, fixed = 0;
    int nstr = layout(h.type, &fixed);
    if (nstr < 0) {                     /* unknown: skip it */
      it->unknown++;
      it->records++;
      it->off += h.size;
      continue;
    }
    if (psize < fixed)
      return damage(it, off, "a %s record of %zu payload bytes, shorter than its %zu-byte fixed part",
                    tn, psize, fixed);
    if (h.type == TR_STACK) {
      tr_stack s;
      memcpy(&s, p, sizeof s);
      if ((size_t)s.n * sizeof(uint64_t) > psize - fixed)
        return damage(it, off, "a STACK record of %u frames needs %zu bytes, has %zu", s.n,
                      fixed + (size_t)s.n * sizeof(uint64_t), psize);
    }
    if (h.type == TR_FRAME) {
      tr_frame f;
      memcpy(&f, p, sizeof f);
      if (f.id == 0 || f.parent >= f.id)
        return damage(it, off, "a FRAME record of stack %" PRIu32 " names parent %" PRIu32
                      ", which is not below it", f.id, f.parent);
    }
    size_t at = fixed;
    for (int i = 0; i < nstr; i++) {
      const unsigned char *z = at < psize ? memchr(p + at, 0, psize - at) : NULL;
      if (z == NULL)
        return damage(it, off, "a %s record whose string %d is not NUL-terminated inside the record", tn, i);
      at = (size_t)(z - p) + 1;
    }
#undef tn
    it->off += h.size;
    if (h.type == TR_PACKED && it->skip_packed) {   /* stepped over: its events are not read */
      it->records++;
      it->packed_skipped++;
      continue;
    }
    if (h.type == TR_PACKED) {          /* its events come next; it counts when they are read */
      tr_packed pk;
      memcpy(&pk, p, sizeof pk);
      it->pk = p + sizeof pk;
      it->pk_end = p + psize;
      it->pk_off = off;
      it->pk_seq = it->pk_addr = it->pk_events = 0;
      it->pk_thread = pk.thread;
      continue;
    }
    it->records++;
    it->at = off;
    r->type = h.type;
    r->payload = p;
    r->payload_size = (uint32_t)psize;
    r->offset = off;
    return true;
  }
  return false;
}

int report_trace_each(const report_trace *t, report_trace_fn *fn, void *arg, report_trace_iter *st) {
  report_trace_iter local, *it = st ? st : &local;
  report_trace_iter_init(it, t);
  report_trace_rec r;
  int rc = 0;
  while (rc == 0 && report_trace_next(it, &r)) rc = fn(&r, arg);
  return rc;
}

const char *report_trace_string(const report_trace_rec *r, int n) {
  size_t fixed;
  int nstr = layout(r->type, &fixed);
  if (nstr <= 0 || n < 0 || n >= nstr) return NULL;
  const char *p = r->payload;
  size_t at = fixed;
  for (int i = 0; ; i++) {
    if (at >= r->payload_size) return NULL;
    const char *z = memchr(p + at, 0, r->payload_size - at);
    if (z == NULL) return NULL;
    if (i == n) return p + at;
    at = (size_t)(z - p) + 1;
  }
}

/* ---- the model: hash maps ------------------------------------------------------- */

/* uint64 key -> size_t value; linear probing, backward-shift deletion.
 * A slot is empty when its stored value is 0 (values are kept +1). */
typedef struct {
  uint64_t *keys;
  size_t *vals;
  size_t cap, n;
} u64map;

static inline size_t hash64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (size_t)x;
}

static bool map_grow(u64map *m) {
  size_t ncap = m->cap ? m->cap * 2 : 64;
  uint64_t *nk = calloc(ncap, sizeof *nk);
  size_t *nv = calloc(ncap, sizeof *nv);
  if (nk == NULL || nv == NULL) {
    free(nk);
    free(nv);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (m->vals[i] == 0) continue;
    size_t j = hash64(m->keys[i]) & (ncap - 1);
    while (nv[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return true;
}

static bool map_get(const u64map *m, uint64_t key, size_t *val) {
  if (m->cap == 0) return false;
  for (size_t j = hash64(key) & (m->cap - 1); m->vals[j]; j = (j + 1) & (m->cap - 1))
    if (m->keys[j] == key) {
      *val = m->vals[j] - 1;
      return true;
    }
  return false;
}

/* Sets key to val (replacing). */
static bool map_put(u64map *m, uint64_t key, size_t val) {
  if ((m->n + 1) * 2 > m->cap && !map_grow(m)) return false;
  size_t j = hash64(key) & (m->cap - 1);
  while (m->vals[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  if (m->vals[j] == 0) m->n++;
  m->keys[j] = key;
  m->vals[j] = val + 1;
  return true;
}

static void map_del(u64map *m, uint64_t key) {
  if (m->cap == 0) return;
  size_t mask = m->cap - 1, j = hash64(key) & mask;
  while (m->vals[j] && m->keys[j] != key) j = (j + 1) & mask;
  if (m->vals[j] == 0) return;
  /* backward shift: move later members of the cluster into the hole */
  size_t hole = j;
  for (size_t k = (j + 1) & mask; m->vals[k]; k = (k + 1) & mask) {
    size_t home = hash64(m->keys[k]) & mask;
    /* k may move to hole if home is not in (hole, k] cyclically */
    bool stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
    if (stays) continue;
    m->keys[hole] = m->keys[k];
    m->vals[hole] = m->vals[k];
    hole = k;
  }
  m->vals[hole] = 0;
  m->n--;
}

static void map_free(u64map *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* A FRAME record: stack id is pc, then the frames of stack parent. */
typedef struct { uint32_t parent, depth; uint64_t pc, offset; } frame_node;

struct report_trace_index {
  u64map stacks;     /* id -> index in m->stacks */
  uint32_t *frame_at;/* id -> index in fnodes + 1 (0: none), for the ids below nframe_at */
  size_t nframe_at;
  u64map frames;     /* id -> index in fnodes, for the others */
  frame_node *fnodes;
  size_t nfnodes, cap_fnodes;
  u64map made;       /* id -> index in madev: stacks put together from FRAME records */
  report_trace_stack **madev;
  size_t nmade, cap_made;
  u64map blocks;     /* addr -> index in m->blocks */
  u64map sites;      /* stack id -> index in m->sites */
  /* report_trace_model_read_records: a FRAME record is read when a stack
   * that has its node is asked for, from this trace (a reference held);
   * NULL when the nodes were read with the rest (fnodes) */
  report_trace *lazy;
  uint64_t *lazy_off;  /* id -> offset of the FRAME record that said it (0: none), ids below nlazy_off */
  size_t nlazy_off;
  u64map lazy_large;   /* the same for the ids of 2^22 and up */
  /* for a replay after the records were read (report_trace_model_replay) */
  struct span *spans;
  size_t nspans;
  uint64_t nevents, records;
  bool in_order;     /* the events came in increasing seq order */
};

/* ---- the model: building -------------------------------------------------------- */

/* The FRAME node of stack id.  The depot numbers its nodes from 1 up, so
 * the ids of a trace are dense: an array indexed by id holds them in 4
 * bytes each (a trace of 1.3 million nodes spent 64 MB and most of its
 * reading time in the hash map); an id far beyond the nodes seen (a
 * damaged or hand-made file) goes to the map. */
static bool frame_get(const report_trace_index *ix, uint32_t id, size_t *i) {
  if (id < ix->nframe_at && ix->frame_at[id]) {
    *i = ix->frame_at[id] - 1;
    return true;
  }
  return map_get(&ix->frames, id, i);
}

static bool frame_put(report_trace_index *ix, uint32_t id, size_t i) {
  if (id >= ix->nframe_at && (id < (1u << 22) || id / 2 < ix->nfnodes)) {
    size_t n = ix->nframe_at ? ix->nframe_at : 4096;
    while (n <= id) n *= 2;
    uint32_t *na = realloc(ix->frame_at, n * sizeof *na);
    if (na == NULL) return false;
    memset(na + ix->nframe_at, 0, (n - ix->nframe_at) * sizeof *na);
    ix->frame_at = na;
    ix->nframe_at = n;
  }
  if (id < ix->nframe_at && i < UINT32_MAX) {
    ix->frame_at[id] = (uint32_t)i + 1;
    return true;
  }
  return map_put(&ix->frames, id, i);
}

/* A growable array: push returns the new element (zeroed) or NULL. */
static void *push(void **arr, size_t *n, size_t *cap, size_t elem) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 16;
    void *na = realloc(*arr, ncap * elem);
    if (na == NULL) return NULL;
    *arr = na;
    *cap = ncap;
  }
  void *e = (char *)*arr + *n * elem;
  memset(e, 0, elem);
  (*n)++;
  return e;
}
#define PUSH(arr, n, cap) ((__typeof__(arr))push((void **)&(arr), &(n), &(cap), sizeof *(arr)))

typedef struct {              /* an allocation event, replayed in seq order */
  uint64_t seq, order;        /* order: position in the file, to keep ties stable */
  uint64_t addr, size;
  uint32_t stack, thread;
  uint16_t tag;
  uint8_t  arena;
  bool     is_free;
  bool     is_mark;
} ev;

static int ev_cmp(const void *a, const void *b) {
  const ev *x = a, *y = b;
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

typedef struct {
  report_trace_model *m;
  ev *evs;
  size_t nevs, capevs;
  size_t cap_stacks, cap_modules, cap_marks, cap_fevents, cap_findings, cap_anchors, cap_ref_sites;
  bool oom;
  bool unsorted;               /* ALLOC/FREE/MARK not in increasing seq order in the file */
  bool lean;                   /* the records only: the events are not replayed as they are read */
  bool lazy;                   /* FRAME records only marked said, with their offsets (index->lazy_off) */
  uint64_t prev;               /* lean: seq of the previous event */
  uint64_t nevents;
  struct replayer *r;          /* the replay while the file is read */
  uint64_t *known;             /* bitmap of the stack ids below 2^22 that have a STACK or FRAME record */
  size_t nknown;               /* words */
  struct dev_ev *devs;         /* DEVICE_ALLOC and DEVICE_FREE, replayed after the file */
  size_t ndevs, capdevs;
  struct span *spans;          /* each thread's events: where they are in the file (the merge) */
  size_t nspans, cap_spans, last_span;
  u64map span_of;              /* thread -> index in spans */
} builder;

/* The records that hold one thread's ALLOC, FREE and MARK events lie
 * between first and last (record offsets) in the file. */
typedef struct span { uint32_t thread; uint64_t first, last; } span;

/* An event of thread at the record at off: its thread's span grows. */
static void span_note(builder *b, uint32_t thread, uint64_t off) {
  size_t i = b->last_span;
  if (i < b->nspans && b->spans[i].thread == thread) {
    b->spans[i].last = off;
    return;
  }
  if (!map_get(&b->span_of, thread, &i)) {
    span *s = PUSH(b->spans, b->nspans, b->cap_spans);
    if (s == NULL || !map_put(&b->span_of, thread, b->nspans - 1)) {
      b->oom = true;
      return;
    }
    *s = (span){ thread, off, off };
    i = b->nspans - 1;
  }
  b->spans[i].last = off;
  b->last_span = i;
}

typedef struct replayer replayer;
static void stream_event(builder *b, const ev *e);
static void device_event(builder *b, const report_trace_rec *r);
static bool record_event(const report_trace_rec *r, uint64_t order, ev *e);

static void add_anchor(builder *b, uint64_t seq, uint64_t ns) {
  report_trace_model *m = b->m;
  report_trace_anchor *a = PUSH(m->anchors, m->nanchors, b->cap_anchors);
  if (a == NULL) b->oom = true;
  else *a = (report_trace_anchor){ seq, ns };
}

static char *dupstr(builder *b, const char *s) {
  char *d = strdup(s ? s : "");
  if (d == NULL) b->oom = true;
  return d;
}

static void check_stack(builder *b, uint32_t stack) {
  size_t i;
  if (stack == 0) return;
  if (stack < (1u << 22)) {
    if (stack / 64 >= b->nknown || !(b->known[stack / 64] >> (stack % 64) & 1)) b->m->late_stacks++;
  } else if (!map_get(&b->m->index->stacks, stack, &i) && !frame_get(b->m->index, stack, &i) &&
             !map_get(&b->m->index->lazy_large, stack, &i)) {
    b->m->late_stacks++;
  }
}

/* A record the model only counts: one more, and its stack checked (the
 * uint32_t at stack_offset in the payload). */
static void count_record(builder *b, uint64_t *count, const void *payload, size_t stack_offset) {
  uint32_t stack;
  memcpy(&stack, (const char *)payload + stack_offset, sizeof stack);
  (*count)++;
  check_stack(b, stack);
}

/* An ALLOC or FREE record as an event. */
static bool record_event(const report_trace_rec *r, uint64_t order, ev *e) {
  if (r->type == TR_ALLOC) {
    tr_alloc x;
    memcpy(&x, r->payload, sizeof x);
    *e = (ev){ x.seq, order, x.addr, x.size, x.stack, x.thread, x.tag, x.arena, false, false };
    return true;
  }
  if (r->type == TR_FREE) {
    tr_free x;
    memcpy(&x, r->payload, sizeof x);
    *e = (ev){ .seq = x.seq, .order = order, .addr = x.addr, .stack = x.stack, .thread = x.thread,
               .is_free = true };
    return true;
  }
  if (r->type == TR_MARK) {
    tr_mark x;
    memcpy(&x, r->payload, sizeof x);
    *e = (ev){ .seq = x.seq, .order = order, .thread = x.thread, .is_mark = true };
    return true;
  }
  return false;
}

/* Has a STACK or FRAME record said stack id already? */
static bool stack_said(const report_trace_model *m, uint32_t id) {
  size_t i;
  return map_get(&m->index->stacks, id, &i) || frame_get(m->index, id, &i);
}

static inline bool id_known(const builder *b, uint32_t id) {
  return id / 64 < b->nknown && (b->known[id / 64] >> (id % 64) & 1);
}

/* Has a STACK or FRAME record said stack id, in a lazy pass (its FRAME
 * records only marked)? */
static bool id_said(const builder *b, uint32_t id) {
  size_t i;
  if (id < (1u << 22)) return id_known(b, id);
  return stack_said(b->m, id) || map_get(&b->m->index->lazy_large, id, &i);
}

/* Marks stack id as said (check_stack's bitmap of the small ids). */
static bool set_known(builder *b, uint32_t id) {
  if (id >= (1u << 22)) return true;
  if (id / 64 >= b->nknown) {
    size_t n = b->nknown ? b->nknown : 64;
    while (n <= id / 64) n *= 2;
    uint64_t *nk = realloc(b->known, n * sizeof *nk);
    if (nk == NULL) return false;
    memset(nk + b->nknown, 0, (n - b->nknown) * sizeof *nk);
    b->known = nk;
    b->nknown = n;
  }
  b->known[id / 64] |= 1ull << (id % 64);
  return true;
}

/* A lazy pass's FRAME record of stack id, at offset off: unless the id was
 * said before, marked said and its offset kept; the record is read when a
 * stack is asked for (lazy_stack).  False when out of memory. */
static inline bool frame_mark(builder *b, uint32_t id, uint64_t off) {
  report_trace_index *ix = b->m->index;
  if (id >= (1u << 22)) return id_said(b, id) || map_put(&ix->lazy_large, id, off);
  if (id / 64 < b->nknown) {
    uint64_t bit = 1ull << (id % 64);
    if (b->known[id / 64] & bit) return true;
    b->known[id / 64] |= bit;
  } else if (!set_known(b, id)) {
    return false;
  }
  if (id >= ix->nlazy_off) {
    size_t n = ix->nlazy_off ? ix->nlazy_off : 4096;
    while (n <= id) n *= 2;
    uint64_t *na = realloc(ix->lazy_off, n * sizeof *na);
    if (na == NULL) return false;
    memset(na + ix->nlazy_off, 0, (n - ix->nlazy_off) * sizeof *na);
    ix->lazy_off = na;
    ix->nlazy_off = n;
  }
  ix->lazy_off[id] = off;
  return true;
}

/* FRAME record x, at offset off, said stack x->id: its node, unless the id
 * was said before by a STACK or FRAME record (the first one stays).  The
 * bulk of a trace's records besides the events (mixchurn's 1M operations:
 * 309,613 of them), so the common case (a small id, its parent said
 * before, the arrays large enough) is a few loads and stores; false when
 * out of memory. */
static inline bool frame_said(builder *b, const tr_frame *x, uint64_t off) {
  report_trace_index *ix = b->m->index;
  uint32_t id = x->id;
  if (id < (1u << 22)) {                 /* the known bitmap holds every small id said */
    if (id / 64 < b->nknown && (b->known[id / 64] >> (id % 64) & 1)) return true;
  } else if (stack_said(b->m, id)) {
    return true;
  }
  uint32_t depth = 1;
  size_t pi;
  if (x->parent != 0 && frame_get(ix, x->parent, &pi)) depth = ix->fnodes[pi].depth + 1;
  if (ix->nfnodes == ix->cap_fnodes) {
    size_t ncap = ix->cap_fnodes ? ix->cap_fnodes * 2 : 1024;
    frame_node *nf = realloc(ix->fnodes, ncap * sizeof *nf);
    if (nf == NULL) return false;
    ix->fnodes = nf;
    ix->cap_fnodes = ncap;
  }
  size_t i = ix->nfnodes++;
  ix->fnodes[i] = (frame_node){ x->parent, depth, x->pc, off };
  if (id < ix->nframe_at && i < UINT32_MAX) ix->frame_at[id] = (uint32_t)i + 1;
  else if (!frame_put(ix, id, i)) return false;
  if (id < (1u << 22) && id / 64 < b->nknown) b->known[id / 64] |= 1ull << (id % 64);
  else if (!set_known(b, id)) return false;
  return true;
}

/* The FRAME records right after the one just read, read here without the
 * round through report_trace_next and on_record: the writer puts the
 * depot's new nodes in one run before each buffer.  Each is checked as
 * report_trace_next checks a FRAME record (whole, its parent below it);
 * at the first record that is not such a 24-byte FRAME, or at the read
 * window's end (where report_trace_next gives mapped pages back), it
 * stops, and report_trace_next goes on from there (and reports damage as
 * it would have).  False when out of memory. */
static bool frames_rest(report_trace_iter *it, builder *b) {
  const report_trace *t = it->t;
  const unsigned char *d = t->data;
  const size_t rec = sizeof(tr_header) + sizeof(tr_frame);
  uint64_t off = it->off, stop = t->size;
  if (t->map && it->released + READ_WINDOW < stop) stop = it->released + READ_WINDOW;
  while (off < stop && t->size - off >= rec) {
    tr_header h;
    tr_frame f;
    memcpy(&h, d + off, sizeof h);
    if (h.size != rec || h.type != TR_FRAME) break;
    memcpy(&f, d + off + sizeof h, sizeof f);
    if (f.id == 0 || f.parent >= f.id) break;
    if (b->lazy ? !frame_mark(b, f.id, off) : !frame_said(b, &f, off)) {
      b->oom = true;
      return false;
    }
    it->at = off;
    it->records++;
    off += rec;
    if ((off & 2047) == 0) __builtin_prefetch(d + off + 2048);
  }
  it->off = off;
  return true;
}

static int on_record(const report_trace_rec *r, void *arg) {
  builder *b = arg;
  report_trace_model *m = b->m;
  const void *p = r->payload;
  switch (r->type) {
  case TR_COMMAND: {   /* the first one is the process's (an image that execs opens a new trace) */
    tr_command x;
    memcpy(&x, p, sizeof x);
    if (m->argv) return 0;
    const char *s = (const char *)p + sizeof x, *end = (const char *)p + r->payload_size;
    size_t n = 0;
    for (const char *q = s; q < end && n < x.argc; q++) n += *q == '\0';
    if (n == 0) return 0;
    m->argv = calloc(n + 1, sizeof *m->argv);
    if (m->argv == NULL) break;
    for (size_t i = 0; i < n; i++) {   /* each NUL-terminated inside the payload (counted above) */
      if ((m->argv[i] = dupstr(b, s)) == NULL) break;
      m->argc = (int)i + 1;
      s += strlen(s) + 1;
    }
    m->argv_truncated = x.truncated != 0 || n < x.argc;
    return b->oom;
  }
  case TR_MODULE: {
    tr_module x;
    memcpy(&x, p, sizeof x);
    report_trace_module *e = PUSH(m->modules, m->nmodules, b->cap_modules);
    if (e == NULL) break;
    *e = (report_trace_module){ x.lo, x.hi, x.offset, dupstr(b, report_trace_string(r, 0)) };
    return b->oom;
  }
  case TR_STACK: {
    tr_stack x;
    memcpy(&x, p, sizeof x);
    if (b->lazy ? id_said(b, x.id) : stack_said(m, x.id)) return 0;   /* said before: keep the first */
    uint64_t *frames = NULL;
    if (x.n) {
      frames = malloc((size_t)x.n * sizeof *frames);
      if (frames == NULL) break;
      memcpy(frames, (const char *)p + sizeof x, (size_t)x.n * sizeof *frames);
    }
    report_trace_stack *e = PUSH(m->stacks, m->nstacks, b->cap_stacks);
    if (e == NULL) {
      free(frames);
      break;
    }
    *e = (report_trace_stack){ x.id, x.n, frames, r->offset };
    if (!map_put(&m->index->stacks, x.id, m->nstacks - 1) || !set_known(b, x.id)) break;
    return 0;
  }
  case TR_FRAME: {
    tr_frame x;
    memcpy(&x, p, sizeof x);
    if (b->lazy ? !frame_mark(b, x.id, r->offset) : !frame_said(b, &x, r->offset)) break;
    return 0;
  }
  case TR_TAG: {
    tr_tag x;
    memcpy(&x, p, sizeof x);
    if (x.id > UINT16_MAX) return 0;                         /* events name tags in 16 bits */
    if (x.id >= m->ntag_names) {
      size_t n = (size_t)x.id + 1;
      char **nt = realloc(m->tag_names, n * sizeof *nt);
      if (nt == NULL) break;
      memset(nt + m->ntag_names, 0, (n - m->ntag_names) * sizeof *nt);
      m->tag_names = nt;
      m->ntag_names = n;
    }
    free(m->tag_names[x.id]);
    m->tag_names[x.id] = dupstr(b, report_trace_string(r, 0));
    return b->oom;
  }
  case TR_ALLOC: {
    tr_alloc x;
    memcpy(&x, p, sizeof x);
    m->allocs++;
    check_stack(b, x.stack);
    ev e;
    record_event(r, 0, &e);
    span_note(b, e.thread, r->offset);
    stream_event(b, &e);
    return b->oom;
  }
  case TR_FREE: {
    tr_free x;
    memcpy(&x, p, sizeof x);
    m->frees++;
    check_stack(b, x.stack);
    ev e;
    record_event(r, 0, &e);
    span_note(b, e.thread, r->offset);
    stream_event(b, &e);
    return b->oom;
  }
  case TR_REALLOC:     count_record(b, &m->reallocs, p, offsetof(tr_realloc, stack)); return 0;
  case TR_REF:         count_record(b, &m->refs, p, offsetof(tr_ref, stack)); return 0;
  case TR_HOLD:        count_record(b, &m->holds, p, offsetof(tr_hold, stack)); return 0;
  case TR_ARENA_RESET: count_record(b, &m->arena_resets, p, offsetof(tr_arena_reset, stack)); return 0;
  case TR_MARK: {
    tr_mark x;
    memcpy(&x, p, sizeof x);
    report_trace_mark *e = PUSH(m->marks, m->nmarks, b->cap_marks);
    if (e == NULL) break;
    *e = (report_trace_mark){ x.seq, x.mark, x.ns, x.thread };
    add_anchor(b, x.seq, x.ns);
    ev me;
    record_event(r, 0, &me);
    span_note(b, me.thread, r->offset);
    stream_event(b, &me);
    return b->oom;
  }
  case TR_THREAD_START: m->thread_starts++; return 0;
  case TR_THREAD_END:   m->thread_ends++; return 0;
  case TR_TIME: {
    tr_time x;
    memcpy(&x, p, sizeof x);
    m->times++;
    add_anchor(b, x.seq, x.ns);
    return b->oom;
  }
  case TR_FINDING_EVENT: {
    tr_finding_event x;
    memcpy(&x, p, sizeof x);
    check_stack(b, x.stack);
    report_trace_finding_event *e = PUSH(m->finding_events, m->nfinding_events, b->cap_fevents);
    if (e == NULL) break;
    *e = (report_trace_finding_event){ dupstr(b, report_trace_string(r, 0)), x.seq, x.addr, x.stack, x.thread };
    return b->oom;
  }
  case TR_FINDING: {
    tr_finding x;
    memcpy(&x, p, sizeof x);
    report_trace_finding *e = PUSH(m->findings, m->nfindings, b->cap_findings);
    if (e == NULL) break;
    e->kind = dupstr(b, report_trace_string(r, 0));
    e->slot = dupstr(b, report_trace_string(r, 1));
    e->detail = dupstr(b, report_trace_string(r, 2));
    e->bytes = x.bytes;
    e->blocks = x.blocks;
    e->addr = x.addr;
    e->holder = x.holder;
    e->stack = x.stack;
    e->alloc_stack = x.alloc_stack;
    e->free_stack = x.free_stack;
    e->aux_stack = x.aux_stack;
    e->tag = x.tag;
    e->site0 = m->nref_sites;
    e->nsites = 0;
    return b->oom;
  }
  case TR_REF_SITE: {   /* belongs to the FINDING before it */
    if (m->nfindings == 0) return false;
    tr_ref_site *e = PUSH(m->ref_sites, m->nref_sites, b->cap_ref_sites);
    if (e == NULL) break;
    memcpy(e, p, sizeof *e);
    m->findings[m->nfindings - 1].nsites++;
    return b->oom;
  }
  case TR_EXIT: {
    tr_exit x;
    memcpy(&x, p, sizeof x);
    m->has_exit = true;
    m->exit_code = x.exit_code;
    m->exit_signal = x.signal;
    return false;
  }
  case TR_SUMMARY:
    memcpy(&m->summary, p, sizeof m->summary);
    m->has_summary = true;
    return false;
  case TR_DEVICE_ALLOC:
  case TR_DEVICE_FREE:
    device_event(b, r);
    return b->oom;
  case TR_END: {
    tr_end x;
    memcpy(&x, p, sizeof x);
    m->clean_exit = true;
    m->end_seq = x.seq;
    m->end_ns = x.ns;
    add_anchor(b, x.seq, x.ns);
    return b->oom;
  }
  default:
    return 0;
  }
  b->oom = true;
  return 1;
}

/* Replays the allocation events in sequence order: live blocks and peak,
 * and for reports the sites (per allocation stack), the timeline and the
 * growth of each site across the marks.  The replay runs while the file is
 * read, as long as ALLOC, FREE and MARK come in increasing seq order (one
 * thread); at the first one out of order it is dropped, and a second pass
 * merges the threads' streams (replay_merged), or, when a thread's own
 * order slips too far for that, collects every event, sorts and replays
 * them (replay_sorted). */
typedef struct {
  report_trace_block b;
  uint32_t site;
  bool     alive;
} slot;

typedef struct {                 /* a site's live bytes sampled at the marks, summed lazily */
  uint64_t v;                    /* live bytes now */
  size_t   from;                 /* v holds for the marks from this index on */
  uint64_t last_sampled;         /* the value at the latest mark sampled */
  bool     sampled;
  double   sy, sxy, syy;
} growth;

/* The marks in [from, to) saw the value v. */
static void growth_span(report_trace_site *s, growth *g, size_t from, size_t to) {
  if (to <= from) return;
  double c = (double)(to - from), v = (double)g->v;
  g->sy += v * c;
  g->sxy += v * ((double)from + (double)to - 1.0) * c / 2.0;
  g->syy += v * v * c;
  if (from == 0) s->mark_first = g->v;
  if (g->sampled && g->v > g->last_sampled) s->ups++;
  if (g->sampled && g->v < g->last_sampled) s->downs++;
  g->last_sampled = g->v;
  g->sampled = true;
}

static void growth_set(report_trace_site *s, growth *g, uint64_t v, size_t passed) {
  growth_span(s, g, g->from, passed);
  g->from = passed;
  g->v = v;
}

static int mark_cmp(const void *a, const void *b) {
  const report_trace_mark *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int anchor_cmp(const void *a, const void *b) {
  const report_trace_anchor *x = a, *y = b;
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  return x->ns < y->ns ? -1 : x->ns > y->ns;
}

/* The anchors by seq (a total order: sorting again gives the same), their
 * times made never to decrease. */
static void anchors_sort(report_trace_model *m) {
  if (m->nanchors > 1) qsort(m->anchors, m->nanchors, sizeof *m->anchors, anchor_cmp);
  for (size_t i = 1; i < m->nanchors; i++)
    if (m->anchors[i].ns < m->anchors[i - 1].ns) m->anchors[i].ns = m->anchors[i - 1].ns;
}

/* The timeline: buckets of 2^shift seq values each, from the first event;
 * when the events outgrow REPORT_TRACE_BUCKETS buckets, pairs merge (the
 * highest of the two) and the buckets double. */
typedef struct {
  report_trace_timeline *t;
  uint16_t *col_of;              /* tag -> column (0: none yet) */
  uint64_t *live;                /* live bytes per column, now */
  size_t    cols;                /* REPORT_TRACE_TAGS + 1 */
  size_t    bucket;              /* the current bucket, SIZE_MAX before the first event */
  uint64_t  first;
  unsigned  shift;
} timeline_fill;

static size_t tl_column(timeline_fill *f, uint16_t tag) {
  if (f->col_of[tag]) return f->col_of[tag];
  report_trace_timeline *t = f->t;
  if (t->ntags < REPORT_TRACE_TAGS) {
    t->tags[t->ntags++] = tag;
    f->col_of[tag] = (uint16_t)t->ntags;
  } else {
    t->other_tags = true;
    f->col_of[tag] = REPORT_TRACE_TAGS;
  }
  return f->col_of[tag];
}

static void tl_advance(timeline_fill *f, uint64_t seq) {
  uint64_t *v = f->t->values, *lo = f->t->lows;
  size_t cols = f->cols;
  if (f->bucket == SIZE_MAX) {
    f->first = seq;
    f->bucket = 0;
    memcpy(v, f->live, cols * sizeof *v);
    memcpy(lo, f->live, cols * sizeof *lo);
    return;
  }
  uint64_t d = seq - f->first;
  uint64_t b = f->shift < 64 ? d >> f->shift : 0;
  if (b == f->bucket) return;
  while (b >= REPORT_TRACE_BUCKETS) {     /* merge pairs */
    for (size_t j = 0; j <= f->bucket / 2; j++) {
      uint64_t *to = &v[j * cols], *x = &v[2 * j * cols];
      if (2 * j + 1 <= f->bucket) {
        const uint64_t *y = &v[(2 * j + 1) * cols];
        for (size_t c = 0; c < cols; c++) to[c] = x[c] > y[c] ? x[c] : y[c];
        uint64_t *lt = &lo[j * cols];
        const uint64_t *lx = &lo[2 * j * cols], *ly = &lo[(2 * j + 1) * cols];
        for (size_t c = 0; c < cols; c++) lt[c] = lx[c] < ly[c] ? lx[c] : ly[c];
      } else if (j) {
        memcpy(to, x, cols * sizeof *to);
        memcpy(&lo[j * cols], &lo[2 * j * cols], cols * sizeof *lo);
      }
    }
    f->bucket /= 2;
    f->shift++;
    b = f->shift < 64 ? d >> f->shift : 0;
  }
  for (size_t i = f->bucket + 1; i <= b; i++) {
    memcpy(&v[i * cols], f->live, cols * sizeof *v);
    memcpy(&lo[i * cols], f->live, cols * sizeof *lo);
  }
  f->bucket = (size_t)b;
}

static void tl_change(timeline_fill *f, uint16_t tag, uint64_t size, bool add) {
  size_t c = tl_column(f, tag);
  uint64_t *row = &f->t->values[f->bucket * f->cols];
  if (add) {
    f->live[0] += size;
    f->live[c] += size;
    if (f->live[0] > row[0]) row[0] = f->live[0];
    if (f->live[c] > row[c]) row[c] = f->live[c];
  } else {
    uint64_t *low = &f->t->lows[f->bucket * f->cols];
    f->live[0] -= size;
    f->live[c] -= size;
    if (f->live[0] < low[0]) low[0] = f->live[0];
    if (f->live[c] < low[c]) low[c] = f->live[c];
  }
}

typedef struct {                 /* a site's live bytes at the peak, kept lazily */
  uint64_t changed;              /* seq of its last change */
  uint64_t snap_bytes, snap_blocks;   /* its value at the latest peak before that change */
  uint64_t snap_peak;            /* which peak (seq) the snapshot is of */
  bool     snapped;
} at_peak;

#define REPLAY_DIRECT (1u << 22)

struct replayer {
  builder      *b;
  slot         *pool;            /* live blocks; freed slots are reused */
  size_t        npool, cap;
  uint32_t     *free_slots;
  size_t        nfree, capfree;
  u64map        live;            /* addr -> index in pool */
  growth       *gr;
  at_peak      *pk;
  size_t        cap_gr, cap_sites;
  uint32_t     *site_of;         /* stack id -> site + 1, for ids below REPLAY_DIRECT */
  size_t        nsite_of;
  size_t        passed;          /* marks so far */
  bool          started;
  uint64_t      prev;            /* seq of the previous event */
  timeline_fill tf;
  bool          ok;
};

static size_t site_index(replayer *r, uint32_t stack, uint16_t tag) {
  report_trace_model *m = r->b->m;
  size_t si;
  if (stack < r->nsite_of && r->site_of[stack]) return r->site_of[stack] - 1;
  if (stack >= REPLAY_DIRECT && map_get(&m->index->sites, stack, &si)) return si;
  report_trace_site *ns = PUSH(m->sites, m->nsites, r->cap_sites);
  if (ns == NULL || !map_put(&m->index->sites, stack, m->nsites - 1)) return SIZE_MAX;
  si = m->nsites - 1;
  ns->stack = stack;
  ns->tag = tag;
  if (m->nsites > r->cap_gr) {
    size_t nc = r->cap_gr ? r->cap_gr * 2 : 64;
    growth *ng = realloc(r->gr, nc * sizeof *ng);
    if (ng) r->gr = ng;
    at_peak *np = ng ? realloc(r->pk, nc * sizeof *np) : NULL;
    if (np) r->pk = np;
    if (!ng || !np) return SIZE_MAX;
    memset(r->gr + r->cap_gr, 0, (nc - r->cap_gr) * sizeof *r->gr);
    memset(r->pk + r->cap_gr, 0, (nc - r->cap_gr) * sizeof *r->pk);
    r->cap_gr = nc;
  }
  if (stack < REPLAY_DIRECT && stack >= r->nsite_of) {
    size_t n = r->nsite_of ? r->nsite_of : 1024;
    while (n <= stack) n *= 2;
    uint32_t *ns2 = realloc(r->site_of, n * sizeof *ns2);
    if (!ns2) return SIZE_MAX;
    memset(ns2 + r->nsite_of, 0, (n - r->nsite_of) * sizeof *ns2);
    r->site_of = ns2;
    r->nsite_of = n;
  }
  if (stack < REPLAY_DIRECT) r->site_of[stack] = (uint32_t)si + 1;
  return si;
}

/* Before a site changes at seq: if a peak came since its last change, its
 * value then is its value now. */
static void peak_touch(replayer *r, size_t si, uint64_t seq) {
  report_trace_model *m = r->b->m;
  at_peak *p = &r->pk[si];
  if (m->peak_live_bytes && (!p->snapped || p->snap_peak != m->peak_seq) && p->changed <= m->peak_seq) {
    p->snap_bytes = m->sites[si].live_bytes;
    p->snap_blocks = m->sites[si].live_blocks;
    p->snap_peak = m->peak_seq;
    p->snapped = true;
  }
  p->changed = seq;
}

static bool replay_init(replayer *r, builder *b) {
  report_trace_model *m = b->m;
  memset(r, 0, sizeof *r);
  r->b = b;
  r->tf.t = &m->timeline;
  r->tf.bucket = SIZE_MAX;
  r->tf.cols = REPORT_TRACE_TAGS + 1;
  report_trace_timeline *t = &m->timeline;
  t->tags = calloc(REPORT_TRACE_TAGS, sizeof *t->tags);
  t->values = calloc((size_t)REPORT_TRACE_BUCKETS * r->tf.cols, sizeof *t->values);
  t->lows = calloc((size_t)REPORT_TRACE_BUCKETS * r->tf.cols, sizeof *t->lows);
  r->tf.col_of = calloc((size_t)UINT16_MAX + 1, sizeof *r->tf.col_of);
  r->tf.live = calloc(r->tf.cols, sizeof *r->tf.live);
  r->ok = t->tags && t->values && t->lows && r->tf.col_of && r->tf.live;
  return r->ok;
}

static void replay_free(replayer *r) {
  map_free(&r->live);
  free(r->tf.col_of);
  free(r->tf.live);
  free(r->site_of);
  free(r->free_slots);
  free(r->gr);
  free(r->pk);
  free(r->pool);
  memset(r, 0, sizeof *r);
}

/* Forgets what a replay put in the model, for a new one. */
static bool replay_restart(replayer *r, builder *b) {
  report_trace_model *m = b->m;
  replay_free(r);
  m->live_bytes = m->peak_live_bytes = m->peak_seq = 0;
  m->unmatched_frees = m->realloc_overlaps = 0;
  m->first_seq = m->last_seq = 0;
  free(m->sites);
  m->sites = NULL;
  m->nsites = 0;
  map_free(&m->index->sites);
  free(m->timeline.tags);
  free(m->timeline.values);
  free(m->timeline.lows);
  memset(&m->timeline, 0, sizeof m->timeline);
  return replay_init(r, b);
}

static void replay_event(replayer *r, const ev *e) {
  report_trace_model *m = r->b->m;
  if (!r->started) m->first_seq = e->seq;
  r->started = true;
  m->last_seq = e->seq;
  tl_advance(&r->tf, e->seq);
  if (e->is_mark) {
    r->passed++;
    return;
  }
  size_t at;
  bool found = map_get(&r->live, e->addr, &at);
  if (found) {                   /* a free, or the previous block there died unseen */
    slot *d = &r->pool[at];
    size_t si = d->site;
    report_trace_site *s = &m->sites[si];
    peak_touch(r, si, e->seq);
    d->alive = false;
    m->live_bytes -= d->b.size;
    s->frees++;
    s->freed_bytes += d->b.size;
    s->live_bytes -= d->b.size;
    s->live_blocks--;
    growth_set(s, &r->gr[si], s->live_bytes, r->passed);
    tl_change(&r->tf, d->b.tag, d->b.size, false);
    map_del(&r->live, e->addr);
    if (r->nfree == r->capfree) {
      size_t nc = r->capfree ? r->capfree * 2 : 1024;
      uint32_t *nf = realloc(r->free_slots, nc * sizeof *nf);
      if (!nf) {
        r->ok = false;
        return;
      }
      r->free_slots = nf;
      r->capfree = nc;
    }
    r->free_slots[r->nfree++] = (uint32_t)at;
    if (e->is_free) return;
    m->realloc_overlaps++;
  } else if (e->is_free) {
    m->unmatched_frees++;
    return;
  }
  size_t si = site_index(r, e->stack, e->tag);
  if (si == SIZE_MAX) {
    r->ok = false;
    return;
  }
  size_t idx;
  if (r->nfree) {
    idx = r->free_slots[--r->nfree];
  } else {
    if (r->npool >= UINT32_MAX || !PUSH(r->pool, r->npool, r->cap)) {
      r->ok = false;
      return;
    }
    idx = r->npool - 1;
  }
  slot *sl = &r->pool[idx];
  if (!map_put(&r->live, e->addr, idx)) {
    r->ok = false;
    return;
  }
  sl->b = (report_trace_block){ e->addr, e->size, e->seq, e->stack, e->thread, e->tag, e->arena != 0 };
  sl->site = (uint32_t)si;
  sl->alive = true;
  report_trace_site *site = &m->sites[si];
  peak_touch(r, si, e->seq);
  site->allocs++;
  site->alloc_bytes += e->size;
  site->live_bytes += e->size;
  site->live_blocks++;
  m->live_bytes += e->size;
  tl_change(&r->tf, e->tag, e->size, true);
  if (m->live_bytes > m->peak_live_bytes) {
    m->peak_live_bytes = m->live_bytes;
    m->peak_seq = e->seq;
  }
  growth_set(site, &r->gr[si], site->live_bytes, r->passed);
}

/* An event as the file is read: replayed at once while the events come in
 * order; the first one out of order drops that replay (a second pass
 * collects and sorts them). */
static void stream_event(builder *b, const ev *e) {
  b->nevents++;
  if (b->unsorted) return;
  if (b->lean) {
    if (b->nevents > 1 && e->seq <= b->prev) b->unsorted = true;
    b->prev = e->seq;
    return;
  }
  replayer *r = b->r;
  if (r->started && e->seq <= r->prev) {
    b->unsorted = true;
    return;
  }
  r->prev = e->seq;
  replay_event(r, e);
  if (!r->ok) b->oom = true;
}

static int by_seq_block(const void *a, const void *b) {
  const report_trace_block *x = a, *y = b;
  /* Threads' TSC sequence numbers can tie: then by thread and address, so
   * that the order (and every report listing blocks) is the same each time. */
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static bool replay_end(replayer *r) {
  builder *b = r->b;
  report_trace_model *m = b->m;
  bool ok = r->ok;
  if (ok) {
    /* the timeline's buckets */
    report_trace_timeline *t = &m->timeline;
    if (r->started) {
      t->nbuckets = r->tf.bucket + 1;
      t->seq = calloc(t->nbuckets, sizeof *t->seq);
      if (!t->seq) ok = false;
      for (size_t i = 0; ok && i < t->nbuckets; i++) {
        unsigned __int128 end = (unsigned __int128)r->tf.first + ((unsigned __int128)(i + 1) << r->tf.shift) - 1;
        t->seq[i] = end > m->last_seq || i + 1 == t->nbuckets ? m->last_seq : (uint64_t)end;
      }
      add_anchor(b, m->first_seq, m->start_ns);
    }
    anchors_sort(m);
    /* each site's live bytes at the peak, and its growth across the marks */
    size_t nmarks = r->passed;
    double n = (double)nmarks, sx = n * (n - 1) / 2, sxx = (n - 1) * n * (2 * n - 1) / 6;
    double dx = n * sxx - sx * sx;
    for (size_t i = 0; i < m->nsites; i++) {
      report_trace_site *s = &m->sites[i];
      const at_peak *p = &r->pk[i];
      if (m->peak_live_bytes && p->changed <= m->peak_seq) {
        s->peak_bytes = s->live_bytes;
        s->peak_blocks = s->live_blocks;
      } else if (m->peak_live_bytes && p->snapped && p->snap_peak == m->peak_seq) {
        s->peak_bytes = p->snap_bytes;
        s->peak_blocks = p->snap_blocks;
      }
      if (nmarks >= 2) {
        growth *g = &r->gr[i];
        growth_span(s, g, g->from, nmarks);
        s->mark_last = g->last_sampled;
        double dxy = n * g->sxy - sx * g->sy, dy = n * g->syy - g->sy * g->sy;
        s->slope = dx > 0 ? dxy / dx : 0;
        s->r2 = dx > 0 && dy > 0 ? dxy * dxy / (dx * dy) : 0;
      } else {
        s->ups = s->downs = 0;
        s->mark_first = 0;
      }
    }
    size_t nb = 0;
    for (size_t i = 0; i < r->npool; i++) nb += r->pool[i].alive;
    m->blocks = malloc((nb ? nb : 1) * sizeof *m->blocks);
    if (m->blocks == NULL) ok = false;
    for (size_t i = 0; ok && i < r->npool; i++)
      if (r->pool[i].alive) m->blocks[m->nblocks++] = r->pool[i].b;
    if (ok && m->nblocks > 1) qsort(m->blocks, m->nblocks, sizeof *m->blocks, by_seq_block);
    for (size_t i = 0; ok && i < m->nblocks; i++)
      if (!map_put(&m->index->blocks, m->blocks[i].addr, i)) ok = false;
  }
  replay_free(r);
  return ok;
}

/* Second pass over an unsorted file: the events collected to be sorted. */
static int on_event_collect(const report_trace_rec *rec, void *arg) {
  builder *b = arg;
  ev e;
  if (!record_event(rec, b->nevs, &e)) return 0;
  ev *d = PUSH(b->evs, b->nevs, b->capevs);
  if (d == NULL) {
    b->oom = true;
    return 1;
  }
  *d = e;
  d->order = b->nevs - 1;
  return 0;
}

/* After the first pass: the events of an unsorted file sorted and replayed. */
static bool replay_sorted(builder *b, const report_trace *t, uint64_t records) {
  if (!replay_restart(b->r, b)) return false;
  b->capevs = (size_t)b->nevents;
  b->evs = malloc((b->capevs ? b->capevs : 1) * sizeof *b->evs);
  if (!b->evs) return false;
  report_trace_iter it;
  report_trace_rec rec;
  report_trace_iter_init(&it, t);
  while (!b->oom && it.records < records && report_trace_next(&it, &rec))
    if (on_event_collect(&rec, b)) break;
  if (b->oom) return false;
  if (b->nevs > 1) qsort(b->evs, b->nevs, sizeof *b->evs, ev_cmp);
  for (size_t i = 0; i < b->nevs && b->r->ok; i++) replay_event(b->r, &b->evs[i]);
  return b->r->ok;
}

/* ---- the replay of several threads: a merge ------------------------------------- */

/* Each thread appends its events to a buffer of its own, in the order of
 * their sequence numbers, and the writer (alloc/trace.c) writes a full
 * buffer whole: the file holds each thread's events in order, the threads'
 * buffers interleaved in flush order.  A thread's last buffer may come at
 * the very end of the file (the main thread's, written at exit), so the
 * replay reads every thread's events with a cursor of its own, from the
 * first record that holds one to the last (spans), skipping the other
 * threads' PACKED records unread, and merges the streams by (seq, place in
 * the file): the order of the sort it replaces, in memory of a window of
 * events per thread rather than of every event of the trace.
 *
 * Within a thread the order can still slip: a signal handler that
 * allocates between the ledger's numbering of an event and its write, or
 * the events of no registered thread (thread 0), numbered by several
 * threads and written under the file lock.  Each stream keeps its next
 * MERGE_WINDOW events sorted, which puts back any event at most that many
 * places early; an event that comes after one with a later number was
 * already replayed makes the merge give up, and the trace is sorted whole
 * (replay_sorted) as before. */
#define MERGE_WINDOW 64

typedef struct {
  report_trace_iter it;
  uint32_t thread;
  uint64_t last;               /* offset of its last record with an event */
  ev      *win;                /* its next events, sorted: a ring of MERGE_WINDOW from head */
  size_t   head, n;
} stream;

static inline bool ev_before(const ev *x, const ev *y) {
  return x->seq != y->seq ? x->seq < y->seq : x->order < y->order;
}

/* The next event of s's thread into e; false at the end of its span. */
static bool stream_read(stream *s, ev *e) {
  report_trace_iter *it = &s->it;
  const report_trace *t = it->t;
  report_trace_rec r;
  for (;;) {
    if (it->pk == NULL) {
      if (it->done || it->off > s->last) return false;
      /* another thread's PACKED record: skipped without decoding it (the
       * first pass checked every record up to s->last) */
      uint64_t off = it->off, left = t->size - off;
      if (left >= sizeof(tr_header) + sizeof(tr_packed)) {
        tr_header h;
        tr_packed pk;
        memcpy(&h, t->data + off, sizeof h);
        memcpy(&pk, t->data + off + sizeof h, sizeof pk);
        if (h.type == TR_PACKED && pk.thread != s->thread && h.size % 8 == 0 &&
            h.size >= sizeof h + sizeof pk && h.size <= left) {
          it->off += h.size;
          it->records++;
          continue;
        }
      }
    }
    if (!report_trace_next(it, &r)) return false;
    if (record_event(&r, it->at, e) && e->thread == s->thread) return true;
  }
}

/* Puts e in s's window, in order; false when an event after it in order
 * was replayed already (*last, when any). */
static bool window_put(stream *s, const ev *e, const ev *last) {
  if (last && ev_before(e, last)) return false;
  size_t at = s->n;
  while (at > 0 && ev_before(e, &s->win[(s->head + at - 1) % MERGE_WINDOW])) {
    s->win[(s->head + at) % MERGE_WINDOW] = s->win[(s->head + at - 1) % MERGE_WINDOW];
    at--;
  }
  s->win[(s->head + at) % MERGE_WINDOW] = *e;
  s->n++;
  return true;
}

static inline const ev *stream_head(const stream *s) { return &s->win[s->head]; }

static void heap_down(stream **h, size_t n, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    if (l < n && ev_before(stream_head(h[l]), stream_head(h[m]))) m = l;
    if (l + 1 < n && ev_before(stream_head(h[l + 1]), stream_head(h[m]))) m = l + 1;
    if (m == i) return;
    stream *x = h[i];
    h[i] = h[m];
    h[m] = x;
    i = m;
  }
}

/* Replays the events of b's threads merged in order: 1 done, 0 an event
 * out of order beyond the window (nothing usable replayed), -1 out of
 * memory. */
static int replay_merged(builder *b, const report_trace *t) {
  if (!replay_restart(b->r, b)) return -1;
  size_t k = b->nspans;
  stream *ss = calloc(k ? k : 1, sizeof *ss);
  stream **heap = calloc(k ? k : 1, sizeof *heap);
  ev *wins = malloc((k ? k : 1) * MERGE_WINDOW * sizeof *wins);
  int rc = ss && heap && wins ? 1 : -1;
  size_t nh = 0;
  ev e, last;
  for (size_t i = 0; rc == 1 && i < k; i++) {
    stream *s = &ss[i];
    report_trace_iter_init(&s->it, t);
    s->it.off = b->spans[i].first;
    s->it.released = b->spans[i].first & ~(uint64_t)4095;
    s->thread = b->spans[i].thread;
    s->last = b->spans[i].last;
    s->win = wins + i * MERGE_WINDOW;
    while (rc == 1 && s->n < MERGE_WINDOW && stream_read(s, &e))
      if (!window_put(s, &e, NULL)) rc = 0;
    if (s->n) heap[nh++] = s;
  }
  for (size_t i = nh / 2; rc == 1 && i-- > 0;) heap_down(heap, nh, i);
  while (rc == 1 && nh > 0) {
    stream *s = heap[0];
    last = *stream_head(s);
    s->head = (s->head + 1) % MERGE_WINDOW;
    s->n--;
    replay_event(b->r, &last);
    if (!b->r->ok) {
      rc = -1;
      break;
    }
    if (stream_read(s, &e) && !window_put(s, &e, &last)) rc = 0;
    if (s->n == 0) heap[0] = heap[--nh];
    heap_down(heap, nh, 0);
  }
  free(wins);
  free(heap);
  free(ss);
  return rc;
}

uint64_t report_trace_model_ns(const report_trace_model *m, uint64_t seq) {
  const report_trace_anchor *a = m->anchors;
  size_t n = m->nanchors;
  if (n == 0) return m->start_ns;
  if (seq <= a[0].seq) return a[0].ns;
  size_t lo = 0, hi = n - 1;
  if (seq >= a[hi].seq) {
    if (n < 2 || a[hi].seq == a[0].seq) return a[hi].ns;
    double rate = (double)(a[hi].ns - a[0].ns) / (double)(a[hi].seq - a[0].seq);
    double extra = rate * (double)(seq - a[hi].seq);
    if (extra >= (double)(UINT64_MAX - a[hi].ns)) return UINT64_MAX;   /* saturate */
    return a[hi].ns + (uint64_t)extra;
  }
  while (hi - lo > 1) {          /* a[lo].seq <= seq < a[hi].seq */
    size_t mid = lo + (hi - lo) / 2;
    if (a[mid].seq <= seq) lo = mid;
    else hi = mid;
  }
  uint64_t ds = a[hi].seq - a[lo].seq;
  return a[lo].ns + (uint64_t)((unsigned __int128)(a[hi].ns - a[lo].ns) * (seq - a[lo].seq) / ds);
}

const report_trace_site *report_trace_model_site(const report_trace_model *m, uint32_t stack) {
  size_t i;
  return map_get(&m->index->sites, stack, &i) ? &m->sites[i] : NULL;
}

/* ---- device memory ------------------------------------------------------------ */

typedef struct dev_ev {
  uint64_t seq, order, addr, size;
  uint32_t stack, flags;
  int32_t  device;
  uint16_t tag;
  bool     is_free;
} dev_ev;

static void device_event(builder *b, const report_trace_rec *r) {
  report_trace_model *m = b->m;
  dev_ev *e = PUSH(b->devs, b->ndevs, b->capdevs);
  if (e == NULL) {
    b->oom = true;
    return;
  }
  if (r->type == TR_DEVICE_ALLOC) {
    tr_device_alloc x;
    memcpy(&x, r->payload, sizeof x);
    *e = (dev_ev){ x.seq, b->ndevs, x.addr, x.size, x.stack, x.flags, x.device, x.tag, false };
    m->device_allocs++;
  } else {
    tr_device_free x;
    memcpy(&x, r->payload, sizeof x);
    *e = (dev_ev){ .seq = x.seq, .order = b->ndevs, .addr = x.addr, .stack = x.stack, .device = x.device,
                   .tag = x.tag, .is_free = true };
    m->device_frees++;
  }
  check_stack(b, e->stack);
}

static int dev_cmp(const void *a, const void *b) {
  const dev_ev *x = a, *y = b;
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* A device block's key: its address (device addresses fit 48 bits), device
 * and tag (the ledger's fit 8 bits each). */
static uint64_t dev_key(const dev_ev *e) {
  return (e->addr & 0xffffffffffffull) | (uint64_t)((uint32_t)e->device & 0xff) << 48 |
         (uint64_t)(e->tag & 0xff) << 56;
}

/* Replays the device events in seq order: the points of the two series. */
static bool device_replay(builder *b) {
  report_trace_model *m = b->m;
  if (b->ndevs == 0) return true;
  qsort(b->devs, b->ndevs, sizeof *b->devs, dev_cmp);
  m->device_points = calloc(b->ndevs, sizeof *m->device_points);
  if (m->device_points == NULL) return false;
  u64map live = { 0 };
  bool ok = true;
  uint64_t alloc = 0, reserved = 0;
  for (size_t i = 0; ok && i < b->ndevs; i++) {
    const dev_ev *e = &b->devs[i];
    uint64_t key = dev_key(e);
    size_t at;
    bool found = map_get(&live, key, &at);
    if (found) {                               /* freed, or allocated again while live */
      const dev_ev *old = &b->devs[at];
      *(old->flags & TR_DEVICE_RESERVE ? &reserved : &alloc) -= old->size;
      map_del(&live, key);
    }
    if (!e->is_free) {
      *(e->flags & TR_DEVICE_RESERVE ? &reserved : &alloc) += e->size;
      ok = map_put(&live, key, i);
    } else if (!found) {
      m->device_unmatched_frees++;
    }
    if (alloc > m->device_peak_allocated) m->device_peak_allocated = alloc;
    if (reserved > m->device_peak_reserved) m->device_peak_reserved = reserved;
    m->device_points[m->ndevice_points++] = (report_trace_device_point){ e->seq, alloc, reserved };
  }
  m->device_allocated = alloc;
  m->device_reserved = reserved;
  map_free(&live);
  return ok;
}

/* The rest of the PACKED record it is in, once no event of it is to be
 * replayed as the file is read (lean, or the events came out of order):
 * each event checked as report_trace_next checks it, counted, its stack
 * checked (late_stacks) and its order noted, without the round of
 * on_record.  The record's first event went through on_record, which
 * noted its span. */
static void packed_rest(report_trace_iter *it, builder *b) {
  report_trace_model *m = b->m;
  report_trace_rec r;
  uint64_t prev = b->prev, n = 0;
  bool unsorted = b->unsorted;
  while (it->pk && packed_next(it, &r)) {
    uint64_t seq;
    if (r.type == TR_ALLOC) {
      m->allocs++;
      seq = it->pk_ev.a.seq;
      check_stack(b, it->pk_ev.a.stack);
    } else {
      m->frees++;
      seq = it->pk_ev.f.seq;
      check_stack(b, it->pk_ev.f.stack);
    }
    if (seq <= prev) unsorted = true;
    prev = seq;
    n++;
  }
  b->nevents += n;
  b->prev = prev;
  b->unsorted = unsorted;
}

/* Reads every record of t into a new model; replays the events too unless
 * lean (then report_trace_model_replay may, later). */
static report_trace_model *model_read(const report_trace *t, bool lean, bool records_only) {
  report_trace_model *m = calloc(1, sizeof *m);
  if (m == NULL) return NULL;
  m->index = calloc(1, sizeof *m->index);
  if (m->index == NULL) {
    free(m);
    return NULL;
  }
  const tr_file_header *h = report_trace_header(t);
  m->pid = h->pid;
  m->ppid = h->ppid;
  m->start_ns = h->start_ns;
  replayer r;
  /* records only, from bytes the trace owns (a mapped or read file, not a
   * caller's buffer it borrows): the FRAME records wait for a stack to be
   * asked for, and then only its chain.  A clean exit's report asks for
   * the stacks of its findings, if any (mixchurn at 1M operations: one
   * leak, 309,613 FRAME records; the tool's process 63.1M -> 41.6M
   * instructions). */
  bool lazy = records_only && (t->map || t->owned);
  builder b = { .m = m, .r = &r, .lean = lean, .lazy = lazy };
  if (!lean && !replay_init(&r, &b)) {
    free(b.known);
    replay_free(&r);
    report_trace_model_free(m);
    return NULL;
  }
  report_trace_iter it;
  report_trace_rec rec;
  report_trace_iter_init(&it, t);
  it.skip_packed = records_only;
  while (report_trace_next(&it, &rec)) {
    if (on_record(&rec, &b)) break;
    if (rec.type == TR_FRAME && !frames_rest(&it, &b)) break;
    if (it.pk && (b.lean || b.unsorted)) packed_rest(&it, &b);
  }
  free(b.known);
  if (lazy && !b.oom) {
    m->index->lazy = (report_trace *)t;
    m->index->lazy->refs++;
  }
  m->records = it.records;
  m->unknown_records = it.unknown;
  m->damaged = it.damaged;
  m->damage_offset = it.damage_offset;
  memcpy(m->damage, it.message, sizeof m->damage);
  if (m->nmarks > 1) qsort(m->marks, m->nmarks, sizeof *m->marks, mark_cmp);
  bool ok = !b.oom;
  if (lean) {
    anchors_sort(m);
    report_trace_index *ix = m->index;
    ix->spans = b.spans;
    ix->nspans = b.nspans;
    ix->nevents = b.nevents;
    ix->records = it.records;
    ix->in_order = !b.unsorted;
    b.spans = NULL;
  } else {
    if (ok && b.unsorted) {
      int merged = replay_merged(&b, t);
      m->replay = merged > 0 ? REPORT_TRACE_MERGED : REPORT_TRACE_SORTED;
      ok = merged > 0 || (merged == 0 && replay_sorted(&b, t, it.records));
    }
    ok = replay_end(&r) && ok;
    m->replayed = true;
  }
  ok = ok && device_replay(&b);
  free(b.evs);
  free(b.devs);
  free(b.spans);
  map_free(&b.span_of);
  if (!ok) {
    report_trace_model_free(m);
    return NULL;
  }
  m->events_unread = it.packed_skipped > 0;
  m->has_events = m->allocs || m->frees || m->refs || m->holds || m->arena_resets || m->nmarks ||
                  m->thread_starts || m->device_allocs || m->nfinding_events || m->events_unread;
  return m;
}

report_trace_model *report_trace_model_build(const report_trace *t) { return model_read(t, false, false); }
report_trace_model *report_trace_model_read(const report_trace *t) { return model_read(t, true, false); }
report_trace_model *report_trace_model_read_records(const report_trace *t) { return model_read(t, true, true); }

int report_trace_model_replay(report_trace_model *m, const report_trace *t) {
  if (m->replayed) return 0;
  if (m->events_unread) return -1;               /* its events were never read: read it whole */
  report_trace_index *ix = m->index;
  replayer r;
  /* the anchors read with the records are grown from here: their array is
   * full as far as this builder knows (a capacity of 0 with anchors in it
   * wrote past their end) */
  builder b = { .m = m, .r = &r, .spans = ix->spans, .nspans = ix->nspans, .nevents = ix->nevents,
                .cap_anchors = m->nanchors };
  bool ok = replay_init(&r, &b);
  if (ok) {
    int merged = replay_merged(&b, t);
    m->replay = merged == 0 ? REPORT_TRACE_SORTED : ix->in_order ? REPORT_TRACE_FILE_ORDER : REPORT_TRACE_MERGED;
    ok = merged > 0 || (merged == 0 && replay_sorted(&b, t, ix->records));
  }
  ok = replay_end(&r) && ok;
  free(b.evs);
  if (!ok) return -1;
  m->replayed = true;
  return 0;
}

report_trace_model *report_trace_model_load(const char *path, char *err, size_t errlen) {
  report_trace *t = report_trace_open(path, err, errlen);
  if (t == NULL) return NULL;
  report_trace_model *m = report_trace_model_build(t);
  if (m == NULL) set_err(err, errlen, "TRACE: out of memory building the model: %s", path);
  report_trace_close(t);
  return m;
}

void report_trace_model_free(report_trace_model *m) {
  if (m == NULL) return;
  for (int i = 0; i < m->argc; i++) free(m->argv[i]);
  free(m->argv);
  for (size_t i = 0; i < m->ntag_names; i++) free(m->tag_names[i]);
  free(m->tag_names);
  for (size_t i = 0; i < m->nstacks; i++) free((void *)m->stacks[i].frames);
  free(m->stacks);
  for (size_t i = 0; i < m->nmodules; i++) free((void *)m->modules[i].path);
  free(m->modules);
  free(m->blocks);
  free(m->marks);
  free(m->sites);
  free(m->anchors);
  free(m->timeline.tags);
  free(m->timeline.seq);
  free(m->timeline.values);
  free(m->device_points);
  free(m->timeline.lows);
  for (size_t i = 0; i < m->nfinding_events; i++) free((void *)m->finding_events[i].kind);
  free(m->finding_events);
  for (size_t i = 0; i < m->nfindings; i++) {
    free((void *)m->findings[i].kind);
    free((void *)m->findings[i].slot);
    free((void *)m->findings[i].detail);
  }
  free(m->findings);
  free(m->ref_sites);
  if (m->index) {
    for (size_t i = 0; i < m->index->nmade; i++) {
      free((void *)m->index->madev[i]->frames);
      free(m->index->madev[i]);
    }
    free(m->index->madev);
    map_free(&m->index->made);
    free(m->index->fnodes);
    free(m->index->frame_at);
    map_free(&m->index->frames);
    map_free(&m->index->stacks);
    map_free(&m->index->blocks);
    map_free(&m->index->sites);
    free(m->index->spans);
    report_trace_close(m->index->lazy);
    free(m->index->lazy_off);
    map_free(&m->index->lazy_large);
    free(m->index);
  }
  free(m);
}

const char *report_trace_model_tag(const report_trace_model *m, uint32_t tag) {
  return tag < m->ntag_names ? m->tag_names[tag] : NULL;
}

/* Stacks said by FRAME records are put together on first use, from the
 * frame of the id out through its parents, and kept (each on its own, so
 * what was returned before stays where it is). */

/* The node of stack id in a lazy model: the FRAME record that said it
 * first (its offset kept by frame_mark), read from the trace. */
static bool lazy_node(const report_trace_index *ix, uint32_t id, uint32_t *parent, uint64_t *pc, uint64_t *off) {
  size_t v;
  uint64_t o = 0;
  if (id < ix->nlazy_off) o = ix->lazy_off[id];
  else if (id >= (1u << 22) && map_get(&ix->lazy_large, id, &v)) o = v;
  if (o == 0) return false;
  tr_frame f;
  memcpy(&f, ix->lazy->data + o + sizeof(tr_header), sizeof f);
  *parent = f.parent;
  *pc = f.pc;
  *off = o;
  return true;
}

#define FRAME_CHAIN_MAX 4096

/* Stack id of a lazy model, from its FRAME records, exactly as a whole
 * read (frame_said, then the walk below) puts it together: its depth
 * counts the parents each said before its child, as the whole read's
 * depth did when it read the child, and the frames follow every parent
 * said anywhere, up to that depth. */
static bool lazy_stack(const report_trace_index *ix, uint32_t id, report_trace_stack *st) {
  uint32_t parent, up;
  uint64_t pc, off, upc, uoff;
  if (!lazy_node(ix, id, &parent, &pc, &off)) return false;
  size_t n = 1;
  for (uint32_t at = parent; n < FRAME_CHAIN_MAX && at != 0; at = up, off = uoff, n++)
    if (!lazy_node(ix, at, &up, &upc, &uoff) || uoff >= off) break;
  uint64_t *frames = malloc(n * sizeof *frames);
  if (frames == NULL) return false;
  size_t k = 0;
  lazy_node(ix, id, &parent, &pc, &off);
  *st = (report_trace_stack){ .id = id, .offset = off };
  for (; k < n; k++) {
    frames[k] = pc;
    if (parent == 0 || !lazy_node(ix, parent, &parent, &pc, &uoff)) {   /* the outermost, or a parent never said */
      k++;
      break;
    }
  }
  st->n = (uint16_t)k;
  st->frames = frames;
  return true;
}

const report_trace_stack *report_trace_model_stack(const report_trace_model *m, uint32_t id) {
  report_trace_index *ix = m->index;
  size_t i;
  if (map_get(&ix->stacks, id, &i)) return &m->stacks[i];
  if (map_get(&ix->made, id, &i)) return ix->madev[i];
  report_trace_stack *st = malloc(sizeof *st);
  if (st == NULL) return NULL;
  if (ix->lazy) {
    if (!lazy_stack(ix, id, st)) {
      free(st);
      return NULL;
    }
  } else {
    if (!frame_get(ix, id, &i)) {
      free(st);
      return NULL;
    }
    uint32_t depth = ix->fnodes[i].depth;
    size_t n = depth < FRAME_CHAIN_MAX ? depth : FRAME_CHAIN_MAX;
    uint64_t *frames = malloc(n * sizeof *frames);
    if (frames == NULL) {
      free(st);
      return NULL;
    }
    *st = (report_trace_stack){ .id = id, .frames = frames, .offset = ix->fnodes[i].offset };
    size_t k = 0;
    for (size_t at = i; k < n; k++) {
      frames[k] = ix->fnodes[at].pc;
      uint32_t parent = ix->fnodes[at].parent;
      if (parent == 0 || !frame_get(ix, parent, &at)) {   /* the outermost, or a parent never said */
        k++;
        break;
      }
    }
    st->n = (uint16_t)k;
  }
  report_trace_stack **slot = PUSH(ix->madev, ix->nmade, ix->cap_made);
  if (slot == NULL || !map_put(&ix->made, id, ix->nmade - 1)) {
    if (slot) ix->nmade--;
    free((void *)st->frames);
    free(st);
    return NULL;
  }
  *slot = st;
  return st;
}

const report_trace_block *report_trace_model_block(const report_trace_model *m, uint64_t addr) {
  size_t i;
  return map_get(&m->index->blocks, addr, &i) ? &m->blocks[i] : NULL;
}

const report_trace_finding *report_trace_model_finding(const report_trace_model *m, const char *kind,
                                                       size_t *count) {
  const report_trace_finding *first = NULL;
  size_t n = 0;
  for (size_t i = 0; i < m->nfindings; i++) {
    if (kind && strcmp(m->findings[i].kind, kind) != 0) continue;
    if (first == NULL) first = &m->findings[i];
    n++;
  }
  if (count) *count = n;
  return first;
}
