/* trace.c - the trace writer (TAGALLOC_TRACE=path, "%p" becomes the pid).
 *
 * Each thread appends fixed-layout records to its own buffer; a full buffer
 * is written with one write(2) under the file lock, preceded by every node
 * the stack depot gained since the last write (FRAME records), so a stack
 * is always in the file before the first event that names it.  At exit
 * every buffer is written, then the findings, then an END record; on
 * SIGSEGV, SIGBUS, SIGABRT and SIGFPE the buffers are written before the
 * signal goes on.  The format is in TRACE.md.
 *
 * TAGALLOC_TRACE_EVENTS=0 (what `tagalloc run` sets in leaks mode, where no
 * output needs the events) writes an exit-only trace: the header and the
 * command line at open, and at exit the tags, the modules, the stacks, the
 * findings with their refcount balances (REF_SITE), the ledger's summary
 * (SUMMARY) and END; no event.  It is the process's one record of its
 * findings, which `tagalloc run` reads as it reads any trace. */
#include "internal.h"
#include "trace_format.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool _ta_tracing;
static bool exit_only;                   /* TAGALLOC_TRACE_EVENTS=0: the file is open, no events */
static bool exit_known;                  /* _ta_trace_exit_status was called: an EXIT record */
static int exit_code = -1, exit_signal;

typedef struct {
  size_t len, cap;
  size_t pk;                /* offset of the open PACKED record, NO_PK when none */
  uint64_t pk_seq, pk_addr; /* the last event's, for the deltas */
  char data[];
} tbuf;

#define NO_PK SIZE_MAX

static void packed_close(tbuf *b);

static int trace_fd = -1;
static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;   /* file_lock_take, _give */
static uint64_t depot_cursor;
static char stackbuf[1 << 16];            /* under file_lock */
static size_t stacklen;
static tbuf *global_buf;                  /* records not from a thread, under file_lock */

/* file_lock with the thread's cancellation held off (_ta_cancel_off):
 * under it write(2), open(2) and the reads of /proc/self/maps are
 * cancellation points, and a thread that pthread_cancel ended there still
 * held the lock: every other thread hung at its next flush.  reserve()
 * takes the lock and done() gives it back, so the state to restore is
 * kept beside the lock, written and read only by its holder (the lock is
 * not recursive).  Not a __thread variable: in the preload that was a
 * __tls_get_addr call on every traced malloc and free, a call that may
 * itself allocate. */
static int file_cancel_old;               /* under file_lock */

static void file_lock_take(void) {
  int old = _ta_cancel_off();
  pthread_mutex_lock(&file_lock);
  file_cancel_old = old;
}

static void file_lock_give(void) {
  int old = file_cancel_old;
  pthread_mutex_unlock(&file_lock);
  _ta_cancel_restore(old);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void raw_write(const void *p, size_t n) {
  if (trace_fd >= 0) _ta_write_all(trace_fd, p, n);
}

static void frame_out(uint32_t id, uint32_t parent, uintptr_t pc, void *arg) {
  (void)arg;
  size_t size = sizeof(tr_header) + sizeof(tr_frame);
  if (stacklen + size > sizeof stackbuf) {
    raw_write(stackbuf, stacklen);
    stacklen = 0;
  }
  tr_header *h = (tr_header *)(stackbuf + stacklen);
  *h = (tr_header){ .size = (uint32_t)size, .type = TR_FRAME };
  *(tr_frame *)(h + 1) = (tr_frame){ .id = id, .parent = parent, .pc = pc };
  stacklen += size;
}

/* Writes the new stacks, then buf; file_lock is held. */
static void flush_locked(tbuf *b) {
  if (trace_fd < 0) {
    if (b) b->len = 0;
    return;
  }
  _ta_depot_each_since(&depot_cursor, frame_out, NULL);
  if (stacklen) {
    raw_write(stackbuf, stacklen);
    stacklen = 0;
  }
  packed_close(b);
  if (b && b->len) {
    raw_write(b->data, b->len);
    b->len = 0;
  }
}

static tbuf *tbuf_new(void) {
  size_t cap = (size_t)_ta_opt.trace_buffer;
  tbuf *b = _ta_meta_alloc(sizeof *b + cap);
  if (b) {
    b->len = 0;
    b->cap = cap;
    b->pk = NO_PK;
  }
  return b;
}

/* Ends b's open PACKED record: zero bytes to a multiple of 8, its size set.
 * (The buffer keeps 8 bytes of room past an open record for this.) */
static void packed_close(tbuf *b) {
  if (b == NULL || b->pk == NO_PK) return;
  while (b->len % 8) b->data[b->len++] = 0;
  tr_header *h = (tr_header *)(b->data + b->pk);
  h->size = (uint32_t)(b->len - b->pk);
  b->pk = NO_PK;
}

/* Room for a record of `size` bytes in t's buffer (or the global one). */
static void *reserve(ta_thread *t, uint8_t type, size_t size, bool *global) {
  size = (size + 7) & ~(size_t)7;
  tbuf *b = t ? t->trace : NULL;
  *global = false;
  if (t && b == NULL) b = t->trace = tbuf_new();
  packed_close(b);
  /* A record that would not fit a fresh buffer after its TIME record goes
   * to the shared buffer. */
  if (b == NULL || size + 2 * sizeof(tr_header) + sizeof(tr_time) > b->cap) {
    file_lock_take();
    *global = true;
    if (global_buf == NULL) global_buf = tbuf_new();
    b = global_buf;
    if (b == NULL || size + sizeof(tr_header) > b->cap) {   /* too big for any buffer */
      file_lock_give();
      return NULL;
    }
    if (b->len + sizeof(tr_header) + size > b->cap) flush_locked(b);
  } else if (b->len + sizeof(tr_header) + size > b->cap) {
    file_lock_take();
    flush_locked(b);
    /* a time record starts every buffer: the reader's clock */
    tr_header *h = (tr_header *)(b->data + b->len);
    *h = (tr_header){ .size = sizeof *h + sizeof(tr_time), .type = TR_TIME };
    tr_time *tm = (tr_time *)(h + 1);
    tm->seq = _ta_seq_now();
    tm->ns = now_ns();
    b->len += h->size;
    file_lock_give();
  }
  tr_header *h = (tr_header *)(b->data + b->len);
  h->size = (uint32_t)(sizeof *h + size);
  h->type = type;
  memset(h->pad, 0, sizeof h->pad);
  b->len += h->size;
  memset(h + 1, 0, size);
  return h + 1;
}

static void done(bool global) {
  if (global) file_lock_give();
}

static void flush_global(void) {
  file_lock_take();
  if (global_buf) flush_locked(global_buf);
  file_lock_give();
}

static size_t str_room(const char *s) { return s ? strlen(s) + 1 : 1; }

static void put_str(char *dst, const char *s) {
  size_t n = str_room(s);
  if (s) memcpy(dst, s, n); else dst[0] = '\0';
}

/* ---- records -------------------------------------------------------------- */

/* ALLOC and FREE, the bulk of a trace, go into PACKED records: about 10
 * bytes an event instead of 40 to 48 (a 10-million-event trace was 382 MB
 * and took longer to read than to render). */

/* Where t's next packed event goes (TR_PK_EVENT_MAX bytes of room, and 8
 * more for packed_close), opening a PACKED record when t's buffer has none
 * open at its end; NULL when t has no buffer of its own (then the event is
 * written unpacked). */
static unsigned char *packed_tail(ta_thread *t) {
  tbuf *b = t->trace;
  if (TA_LIKELY(b != NULL && b->pk != NO_PK && b->len + TR_PK_EVENT_MAX + 8 <= b->cap))
    return (unsigned char *)b->data + b->len;
  bool g;
  tr_packed *r = reserve(t, TR_PACKED, sizeof *r + TR_PK_EVENT_MAX + 8, &g);
  if (r == NULL || g) {
    done(g);
    return NULL;
  }
  b = t->trace;
  b->len -= TR_PK_EVENT_MAX + 8;      /* the room stays free, the record open */
  r->thread = t->id;
  b->pk = (size_t)((char *)r - sizeof(tr_header) - b->data);
  b->pk_seq = 0;
  b->pk_addr = 0;
  return (unsigned char *)b->data + b->len;
}

static inline unsigned char *put_uv(unsigned char *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  *p++ = (unsigned char)v;
  return p;
}

/* The same varint without a loop, for the address delta and the stack id,
 * which take several bytes and a different number from one event to the
 * next: PDEP spreads v's 7-bit groups over the bytes of a word, the
 * continuation bits (by the index of v's highest bit, from a table) go on
 * all but the last, and the word is stored whole (the bytes past the
 * varint are overwritten by the next one or by packed_close's padding:
 * the room of an open record, TR_PK_EVENT_MAX + 8 bytes, holds an 8-byte
 * store at any varint of an event).  About ten instructions and no branch
 * on the length, where the loop takes six a byte; the sequence delta,
 * size and tag, one or two bytes mostly, keep the loop.  mixchurn, 200,000
 * operations, full mode: 83 -> 74 instructions an ALLOC or FREE event.
 * Only where the CPU has BMI2 (pk_pdep, set at open); values of 2^56 and
 * up, which no address delta of a 48-bit address space reaches, take the
 * loop. */
static bool pk_pdep;
static uint8_t uv_len[64];       /* by the index of v's highest bit: the varint's bytes */
static uint64_t uv_cont[64];     /* and its continuation bits */

static void uv_tables(void) {
  for (unsigned b = 0; b < 64; b++) {
    unsigned n = b / 7 + 1;
    uv_len[b] = (uint8_t)n;
    uv_cont[b] = n > 8 ? 0 : ((1ull << (8 * (n - 1))) - 1) & 0x8080808080808080ull;
  }
}

static inline unsigned char *put_uv_flat(unsigned char *p, uint64_t v, bool pdep) {
#if defined(__x86_64__)
  if (pdep && TA_LIKELY(v >> 56 == 0)) {
    uint64_t x;
    __asm__("pdepq %2, %1, %0" : "=r"(x) : "r"(v), "r"(0x7f7f7f7f7f7f7f7full));
    unsigned b = 63 - (unsigned)__builtin_clzll(v | 1);
    x |= uv_cont[b];
    memcpy(p, &x, sizeof x);
    return p + uv_len[b];                                   /* 1 to 8 bytes */
  }
#endif
  (void)pdep;
  return put_uv(p, v);
}

static inline unsigned char *put_sv(unsigned char *p, uint64_t delta, bool pdep) {   /* zigzag */
  int64_t d = (int64_t)delta;
  return put_uv_flat(p, ((uint64_t)d << 1) ^ (uint64_t)(d >> 63), pdep);
}

static inline unsigned char *put_head(tbuf *b, unsigned char *p, int kind, uint64_t seq, uintptr_t addr,
                                      bool pdep) {
  *p++ = (unsigned char)kind;
  int64_t ds = (int64_t)(seq - b->pk_seq);                /* 1 byte: one thread's next event */
  p = put_uv(p, ((uint64_t)ds << 1) ^ (uint64_t)(ds >> 63));
  p = put_sv(p, (uint64_t)addr - b->pk_addr, pdep);
  b->pk_seq = seq;
  b->pk_addr = addr;
  return p;
}

/* The events themselves, into the open PACKED record at p. */
static inline __attribute__((always_inline)) void pk_alloc(tbuf *b, unsigned char *p, uintptr_t addr,
                                                           uint64_t size, ta_tag tag, uint32_t stack,
                                                           uint64_t seq, int arena, bool pdep) {
  unsigned char *q = put_head(b, p, TR_PK_ALLOC | (arena ? TR_PK_ARENA : 0), seq, addr, pdep);
  q = put_uv(q, size);
  q = put_uv_flat(q, stack, pdep);
  q = put_uv(q, (uint16_t)tag);
  if (arena) q = put_uv(q, (uint8_t)arena);
  b->len += (size_t)(q - p);
}

static inline __attribute__((always_inline)) void pk_free(tbuf *b, unsigned char *p, uintptr_t addr,
                                                          uint32_t stack, uint64_t seq, bool pdep) {
  unsigned char *q = put_head(b, p, TR_PK_FREE, seq, addr, pdep);
  q = put_uv_flat(q, stack, pdep);
  b->len += (size_t)(q - p);
}

/* t's open PACKED record's end when it has room for one more event, else
 * NULL.  _ta_trace_alloc and _ta_trace_free test this and encode inline:
 * one event in a record already open is the path of every malloc and free
 * while tracing, and with the rest of the work (opening a record, a flush,
 * an unpacked event) in a function of its own they save no register and
 * call nothing (churn, 200,000 allocations, errors mode without the
 * quarantine, callgrind: 117 instructions an event before, 91 after). */
static inline unsigned char *packed_room(const tbuf *b) {
  if (TA_LIKELY(b != NULL && b->pk != NO_PK && b->len + TR_PK_EVENT_MAX + 8 <= b->cap))
    return (unsigned char *)b->data + b->len;
  return NULL;
}

static TA_NOINLINE void trace_alloc_slow(ta_thread *t, uintptr_t addr, uint64_t size, ta_tag tag, uint32_t stack,
                                         uint64_t seq, int arena) {
  unsigned char *p = t ? packed_tail(t) : NULL;
  if (p) {
    pk_alloc(t->trace, p, addr, size, tag, stack, seq, arena, false);
    return;
  }
  bool g;
  tr_alloc *r = reserve(t, TR_ALLOC, sizeof *r, &g);
  if (r) *r = (tr_alloc){ seq, addr, size, stack, (uint16_t)tag, (uint8_t)arena, 0, t ? t->id : 0 };
  done(g);
}

static TA_NOINLINE void trace_free_slow(ta_thread *t, uintptr_t addr, uint32_t stack, uint64_t seq) {
  unsigned char *p = t ? packed_tail(t) : NULL;
  if (p) {
    pk_free(t->trace, p, addr, stack, seq, false);
    return;
  }
  bool g;
  tr_free *r = reserve(t, TR_FREE, sizeof *r, &g);
  if (r) *r = (tr_free){ seq, addr, stack, t ? t->id : 0 };
  done(g);
}

void _ta_trace_alloc(ta_thread *t, uintptr_t addr, uint64_t size, ta_tag tag, uint32_t stack,
                     uint64_t seq, int arena) {
  tbuf *b = t ? t->trace : NULL;
  unsigned char *p = packed_room(b);
  if (TA_LIKELY(p != NULL)) {
    if (TA_LIKELY(pk_pdep)) pk_alloc(b, p, addr, size, tag, stack, seq, arena, true);
    else pk_alloc(b, p, addr, size, tag, stack, seq, arena, false);
  } else {
    trace_alloc_slow(t, addr, size, tag, stack, seq, arena);
  }
}

void _ta_trace_free(ta_thread *t, uintptr_t addr, uint32_t stack, uint64_t seq) {
  tbuf *b = t ? t->trace : NULL;
  unsigned char *p = packed_room(b);
  if (TA_LIKELY(p != NULL)) {
    if (TA_LIKELY(pk_pdep)) pk_free(b, p, addr, stack, seq, true);
    else pk_free(b, p, addr, stack, seq, false);
  } else {
    trace_free_slow(t, addr, stack, seq);
  }
}

void _ta_trace_device_alloc(ta_thread *t, int device, uintptr_t addr, uint64_t size, ta_tag tag,
                            uint32_t stack, unsigned flags, uint64_t seq) {
  bool g;
  tr_device_alloc *r = reserve(t, TR_DEVICE_ALLOC, sizeof *r, &g);
  if (r) *r = (tr_device_alloc){ seq, addr, size, stack, t ? t->id : 0, (uint16_t)tag, 0, device, flags, 0 };
  done(g);
}

void _ta_trace_device_free(ta_thread *t, int device, uintptr_t addr, ta_tag tag, uint32_t stack,
                           uint64_t seq) {
  bool g;
  tr_device_free *r = reserve(t, TR_DEVICE_FREE, sizeof *r, &g);
  if (r) *r = (tr_device_free){ seq, addr, stack, t ? t->id : 0, (uint16_t)tag, 0, device };
  done(g);
}

void _ta_trace_realloc(ta_thread *t, uintptr_t old, uintptr_t addr, uint64_t size, uint32_t stack,
                       uint64_t seq) {
  bool g;
  tr_realloc *r = reserve(t, TR_REALLOC, sizeof *r, &g);
  if (r) *r = (tr_realloc){ seq, old, addr, size, stack, t->id };
  done(g);
}

void _ta_trace_ref(ta_thread *t, uintptr_t obj, int delta, long count, uint32_t stack, uint64_t seq) {
  bool g;
  tr_ref *r = reserve(t, TR_REF, sizeof *r, &g);
  if (r) *r = (tr_ref){ seq, obj, count, delta, stack, t->id, 0 };
  done(g);
}

void _ta_trace_hold(ta_thread *t, uintptr_t holder, const char *slot, uintptr_t ptr, uint32_t stack,
                    uint64_t seq) {
  bool g;
  tr_hold *r = reserve(t, TR_HOLD, sizeof *r + str_room(slot), &g);
  if (r) {
    *r = (tr_hold){ seq, holder, ptr, stack, t->id };
    put_str((char *)(r + 1), slot);
  }
  done(g);
}

void _ta_trace_arena_reset(ta_thread *t, uintptr_t arena, uint64_t gen, uint32_t stack, uint64_t seq) {
  bool g;
  tr_arena_reset *r = reserve(t, TR_ARENA_RESET, sizeof *r, &g);
  if (r) *r = (tr_arena_reset){ seq, arena, gen, stack, t->id };
  done(g);
}

void _ta_trace_mark(ta_thread *t, uint64_t mark, uint64_t seq) {
  bool g;
  tr_mark *r = reserve(t, TR_MARK, sizeof *r, &g);
  if (r) *r = (tr_mark){ seq, mark, now_ns(), t->id, 0 };
  done(g);
}

void _ta_trace_tag(ta_tag tag, const char *name) {
  if (!_ta_tracing) return;
  bool g;
  tr_tag *r = reserve(NULL, TR_TAG, sizeof *r + str_room(name), &g);
  if (r) {
    r->id = tag;
    put_str((char *)(r + 1), name);
  }
  done(g);
  flush_global();       /* tags are few: write them now, a SIGKILL keeps them */
}

void _ta_trace_finding(const char *kind, uintptr_t addr, uint32_t stack, uint64_t seq) {
  bool g;
  ta_thread *t = _ta_self;
  tr_finding_event *r = reserve(t, TR_FINDING_EVENT, sizeof *r + str_room(kind), &g);
  if (r) {
    *r = (tr_finding_event){ seq, addr, stack, t ? t->id : 0 };
    put_str((char *)(r + 1), kind);
  }
  done(g);
}

void _ta_trace_thread_start(ta_thread *t) {
  if (!_ta_tracing) return;
  bool g;
  tr_thread *r = reserve(t, TR_THREAD_START, sizeof *r, &g);
  if (r) *r = (tr_thread){ _ta_seq_now(), t->id, (uint32_t)t->tid };
  done(g);
}

void _ta_trace_thread_exit(ta_thread *t) {
  tbuf *b = t->trace;
  if (!_ta_tracing) return;
  bool g;
  tr_thread *r = reserve(t, TR_THREAD_END, sizeof *r, &g);
  if (r) *r = (tr_thread){ _ta_seq_now(), t->id, (uint32_t)t->tid };
  done(g);
  b = t->trace;
  file_lock_take();
  flush_locked(b);
  t->trace = NULL;
  file_lock_give();
  _ta_meta_free(b);
}

/* ---- modules ---------------------------------------------------------------- */

/* Writes the executable mappings of /proc/self/maps: the reader symbolizes
 * offline with them.  Only mappings not written before. */
static uintptr_t modules_seen[1024];
static size_t nseen;

static int write_module(const ta_maps_entry *e, void *arg) {
  (void)arg;
  if (e->perms[2] != 'x' || e->path[0] != '/') return 0;
  for (size_t k = 0; k < nseen; k++)
    if (modules_seen[k] == e->lo) return 0;
  if (nseen < 1024) modules_seen[nseen++] = e->lo;
  bool g;
  tr_module *r = reserve(NULL, TR_MODULE, sizeof *r + str_room(e->path), &g);
  if (r) {
    *r = (tr_module){ e->lo, e->hi, e->offset };
    put_str((char *)(r + 1), e->path);
  }
  done(g);
  return 0;
}

static void write_modules(void) {
  _ta_maps_each(write_module, NULL);
}

/* For the preload's dlclose: the mappings of a library about to be unloaded
 * go into the trace while they are still there.  write_modules' state has
 * no lock of its own: callers are serialized here (open and close run
 * alone). */
void _ta_trace_modules(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  if (trace_fd < 0) return;
  pthread_mutex_lock(&lock);
  write_modules();
  flush_global();
  pthread_mutex_unlock(&lock);
}

/* ---- findings at exit --------------------------------------------------------- */

/* A FINDING, then its refcount balance by callsite (REF_SITE records, the
 * ledger's own: a reader without the REF events has them all the same). */
/* An exit-only trace writes the frames of the stacks its findings name,
 * not the whole depot (the tree's 2 million nodes were 90 MB of FRAME
 * records that no report of that trace reads).  Each node once, outermost
 * first, as the reader wants a parent before its child; written marks a
 * node id's bit. */
static uint8_t *written;
static size_t written_bits;

static void stack_frames_out(uint32_t id) {
  uint32_t chain[TA_MAX_DEPTH + 1];
  uintptr_t pcs[TA_MAX_DEPTH + 1];
  uint32_t parents[TA_MAX_DEPTH + 1];
  size_t n = 0;
  while (id != 0 && n < TA_MAX_DEPTH + 1) {
    if (id < written_bits && (written[id >> 3] & (1u << (id & 7)))) break;
    uint32_t up;
    uintptr_t pc;
    if (!_ta_depot_node(id, &up, &pc)) break;
    chain[n] = id, parents[n] = up, pcs[n] = pc, n++;
    id = up;
  }
  while (n-- > 0) {
    frame_out(chain[n], parents[n], pcs[n], NULL);
    if (chain[n] < written_bits) written[chain[n] >> 3] |= (uint8_t)(1u << (chain[n] & 7));
  }
}

static int finding_out(const ta_finding *f, void *arg) {
  (void)arg;
  bool g;
  if (exit_only) {
    file_lock_take();
    uint32_t ids[] = { f->stack, f->alloc_stack, f->free_stack, f->aux_stack };
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) stack_frames_out(ids[i]);
    for (size_t i = 0; i < f->nsites; i++) stack_frames_out(f->sites[i].stack);
    file_lock_give();
  }
  size_t extra = str_room(f->kind) + str_room(f->slot) + str_room(f->detail);
  tr_finding *r = reserve(NULL, TR_FINDING, sizeof *r + extra, &g);
  if (r) {
    *r = (tr_finding){ f->bytes, f->blocks, f->addr, f->holder, f->stack, f->alloc_stack,
                       f->free_stack, f->aux_stack, (uint16_t)f->tag, 0, 0 };
    char *s = (char *)(r + 1);
    put_str(s, f->kind);
    s += str_room(f->kind);
    put_str(s, f->slot);
    s += str_room(f->slot);
    put_str(s, f->detail);
  }
  done(g);
  for (size_t i = 0; i < f->nsites; i++) {
    const ta_ref_site *site = &f->sites[i];
    tr_ref_site *rs = reserve(NULL, TR_REF_SITE, sizeof *rs, &g);
    if (rs)
      *rs = (tr_ref_site){ site->transitions, site->balance, site->stack, site->paired, site->delta,
                           site->extra };
    done(g);
  }
  return 0;
}

void _ta_trace_exit_status(int code, int sig) {
  exit_known = true;
  exit_code = code;
  exit_signal = sig;
}

/* The ledger's summary at exit: the numbers the process's own report
 * prints, so that every report of the trace prints them too. */
static void summary_out(void) {
  ta_summary s = ta_summary_get();
  bool g;
  tr_summary *r = reserve(NULL, TR_SUMMARY, sizeof *r, &g);
  if (r)
    *r = (tr_summary){ s.direct_bytes, s.direct_blocks, s.indirect_bytes, s.indirect_blocks,
                       s.possible_bytes, s.possible_blocks, s.reachable_bytes, s.reachable_blocks,
                       s.orphan_bytes, s.orphan_blocks, s.allocs, s.frees, s.live_bytes, s.peak_bytes,
                       s.errors };
  done(g);
}

/* ---- open, close, signals ------------------------------------------------------ */

static struct sigaction old_actions[32];
static const int fatal_signals[] = { SIGSEGV, SIGBUS, SIGABRT, SIGFPE };

static void flush_thread(ta_thread *t, void *arg) {
  (void)arg;
  if (t->trace) flush_locked(t->trace);
}

void _ta_trace_flush_all_signal(void) {
  if (trace_fd < 0) return;
  /* Best effort: a thread may be mid-record; the reader stops at damage. */
  if (pthread_mutex_trylock(&file_lock) != 0) return;
  flush_locked(global_buf);
  _ta_thread_each_try(flush_thread, NULL);
  pthread_mutex_unlock(&file_lock);
}

static void on_fatal(int sig, siginfo_t *si, void *ctx) {
  (void)si;
  (void)ctx;
  _ta_trace_flush_all_signal();
  /* Let the signal go on: the previous action, which runs when we return
   * (a fault re-executes; a raised signal is raised again). */
  sigaction(sig, &old_actions[sig], NULL);
  if (old_actions[sig].sa_handler == SIG_DFL || old_actions[sig].sa_handler == SIG_IGN) raise(sig);
  else if (old_actions[sig].sa_flags & SA_SIGINFO) old_actions[sig].sa_sigaction(sig, si, ctx);
  else old_actions[sig].sa_handler(sig);
}

static void open_file(void);

/* The TAG records of every named tag. */
static void write_tags(void) {
  for (uint32_t i = 1; i < TA_MAX_TAGS; i++) {
    const char *name = ta_tag_name(i);
    if (strcmp(name, "?") == 0) break;
    bool g;
    tr_tag *r = reserve(NULL, TR_TAG, sizeof *r + str_room(name), &g);
    if (r) {
      r->id = i;
      put_str((char *)(r + 1), name);
    }
    done(g);
  }
}

int _ta_trace_fd(void) { return trace_fd; }

void _ta_trace_open(void) {
  if (_ta_opt.trace == NULL) return;
  exit_only = !_ta_opt.trace_events;
#if defined(__x86_64__)
  __builtin_cpu_init();   /* may run in a constructor, before libgcc's own */
  pk_pdep = __builtin_cpu_supports("bmi2");
  if (pk_pdep) uv_tables();
#endif
  open_file();
  if (trace_fd < 0 || exit_only) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESETHAND;
  for (size_t i = 0; i < sizeof fatal_signals / sizeof *fatal_signals; i++)
    sigaction(fatal_signals[i], &sa, &old_actions[fatal_signals[i]]);
}

/* The command line, from /proc/self/cmdline: a COMMAND record.  No
 * allocation (a stack buffer; a longer line is cut at an argument). */
static void write_command(void) {
  char buf[4096];
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  size_t len = 0;
  bool truncated = false;
  for (;;) {
    if (len == sizeof buf) {
      char probe;
      truncated = read(fd, &probe, 1) > 0;
      break;
    }
    ssize_t n = read(fd, buf + len, sizeof buf - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fd);
  if (truncated || (len && buf[len - 1] != '\0')) {   /* keep whole arguments only */
    truncated = true;
    while (len && buf[len - 1] != '\0') len--;
  }
  uint32_t argc = 0;
  for (size_t i = 0; i < len; i++) argc += buf[i] == '\0';
  if (!argc) return;
  bool g;
  tr_command *r = reserve(NULL, TR_COMMAND, sizeof *r + len, &g);
  if (r) {
    *r = (tr_command){ argc, truncated };
    memcpy(r + 1, buf, len);
  }
  done(g);
}

/* Opens the trace file ("%p": the pid), writes its header, command line,
 * tags, modules. */
static void open_file(void) {
  const char *path = _ta_opt.trace;
  char full[4096];
  size_t o = 0;
  for (const char *p = path; *p && o < sizeof full - 24; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)_ta_snprintf(full + o, sizeof full - o, "%d", (int)getpid());
      p++;
    } else {
      full[o++] = *p;
    }
  }
  full[o] = '\0';
  trace_fd = open(full, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (trace_fd < 0) {
    _ta_error(TA_EINVAL, "cannot write the trace %s: %s", full, strerror(errno));
    return;
  }
  int high = fcntl(trace_fd, F_DUPFD_CLOEXEC, 1000);   /* out of a dup2's way (the preload spares it a closefrom) */
  if (high >= 0) {
    close(trace_fd);
    trace_fd = high;
  }
  tr_file_header fh = { .magic = TR_MAGIC, .version = TR_VERSION, .header_size = sizeof fh,
                        .pid = (uint32_t)getpid(), .ppid = (uint32_t)getppid(),
                        .start_ns = now_ns() };
  raw_write(&fh, sizeof fh);
  write_command();
  if (exit_only) {          /* the rest at exit (_ta_trace_close) */
    flush_global();
    return;
  }
  _ta_tracing = true;
  write_tags();
  write_modules();
  flush_global();
}

static void drop_thread_buffer(ta_thread *t, void *arg) {
  (void)arg;
  if (t->trace) ((tbuf *)t->trace)->len = 0;
}

/* fork(): the child must not write the parent's buffers or file.  With "%p"
 * in the path it gets a trace of its own (every stack written again);
 * otherwise it traces nothing. */
void _ta_trace_fork(int phase) {
  if (phase == TA_FORK_PREPARE) {
    pthread_mutex_lock(&file_lock);
    return;
  }
  if (phase == TA_FORK_CHILD && trace_fd >= 0) {
    _ta_tracing = false;
    close(trace_fd);
    trace_fd = -1;
    stacklen = 0;
    depot_cursor = 0;
    nseen = 0;
    exit_known = false;
    if (global_buf) global_buf->len = 0;
    /* the registry is locked by the ledger's fork handler: walk it as is */
    ta_thread *self = _ta_self;
    if (self) drop_thread_buffer(self, NULL);
    pthread_mutex_unlock(&file_lock);
    if (_ta_opt.trace && strstr(_ta_opt.trace, "%p")) open_file();
    return;
  }
  pthread_mutex_unlock(&file_lock);
}

void _ta_trace_close(void) {
  if (!_ta_tracing && !(exit_only && trace_fd >= 0)) return;
  if (exit_only) {
    write_tags();
    /* no FRAME record but the findings' (stack_frames_out) */
    file_lock_take();
    uint64_t all = _ta_depot_nodes() + 1;
    written_bits = all + 1;
    written = _ta_meta_alloc((written_bits + 7) / 8);
    if (written == NULL) written_bits = 0;
    else memset(written, 0, (written_bits + 7) / 8);
    if (written == NULL) _ta_depot_each_since(&depot_cursor, frame_out, NULL);   /* all of them, as before */
    else depot_cursor = UINT32_MAX;
    file_lock_give();
  }
  write_modules();
  ta_findings_visit(finding_out, NULL);
  if (written) {
    _ta_meta_free(written);
    written = NULL;
    written_bits = 0;
  }
  summary_out();
  bool g;
  if (exit_known) {
    tr_exit *x = reserve(NULL, TR_EXIT, sizeof *x, &g);
    if (x) *x = (tr_exit){ exit_code, exit_signal };
    done(g);
  }
  tr_end *r = reserve(NULL, TR_END, sizeof *r, &g);
  if (r) { r->seq = _ta_seq_now(); r->ns = now_ns(); }
  done(g);
  file_lock_take();
  _ta_thread_each(flush_thread, NULL);
  flush_locked(global_buf);
  _ta_tracing = false;
  close(trace_fd);
  trace_fd = -1;
  file_lock_give();
}
