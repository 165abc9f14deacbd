/* host.c - the host backend's device memory, streams and events.
 *
 * Device memory is one address range of its own: a mapping of
 * TAGALLOC_GPU_HOST_MEM bytes (default 8 GiB) reserved PROT_NONE at the
 * first allocation, whose pages are made readable and writable when they
 * are allocated and given back (MADV_DONTNEED, PROT_NONE again) when they
 * are freed.  So a device pointer is never a host heap pointer, a freed
 * device block faults when touched, and the capacity is a hard limit that
 * tests can lower to force the pool out of memory.
 *
 *   range  [base ........................................ base + capacity)
 *           | alloc'd | free | alloc'd ... |    never touched (PROT_NONE) |
 *
 * Allocations are page-multiples, first fit over a sorted list of free
 * extents, merged with their neighbours on free; a sorted list of the live
 * extents validates frees and pointers passed to the kernels.  Both lists
 * are short (the pool asks for segments of megabytes), so they are arrays.
 *
 * Streams and events are synchronous: every op has completed when its call
 * returns, so an event is complete as soon as it is recorded. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- errors ---------------------------------------------------------------- */

static __thread char host_msg[256];

gpu_status _gpu_host_fail(gpu_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(host_msg, sizeof host_msg, fmt, ap);
  va_end(ap);
  return st;
}

static const char *host_last_error(void) { return host_msg; }

/* ---- the address range ------------------------------------------------------ */

typedef struct {
  size_t off, len;
} extent;

typedef struct {
  extent *v;
  size_t  n, cap;
} extent_list;

static struct {
  pthread_mutex_t lock;
  char           *base;       /* NULL until the first allocation */
  size_t          capacity;
  size_t          used;       /* bytes in live extents */
  size_t          page;
  extent_list     free, live; /* sorted by offset */
  bool            failed;     /* the reservation failed once: it is not tried again */
} R = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool list_insert(extent_list *l, size_t at, extent e) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    extent *v = realloc(l->v, cap * sizeof *v);
    if (v == NULL) return false;
    l->v = v;
    l->cap = cap;
  }
  memmove(l->v + at + 1, l->v + at, (l->n - at) * sizeof *l->v);
  l->v[at] = e;
  l->n++;
  return true;
}

static void list_remove(extent_list *l, size_t at) {
  memmove(l->v + at, l->v + at + 1, (l->n - at - 1) * sizeof *l->v);
  l->n--;
}

/* The index of the first extent with off >= off. */
static size_t list_lower(const extent_list *l, size_t off) {
  size_t lo = 0, hi = l->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (l->v[mid].off < off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

size_t _gpu_host_capacity(void) {
  const char *s = getenv("TAGALLOC_GPU_HOST_MEM");
  size_t v;
  if (s == NULL || *s == 0) return GPU_HOST_DEFAULT_MEM;
  if (!_gpu_parse_size(s, &v) || v < ((size_t)1 << 20) || v > ((size_t)1 << 46)) {
    fprintf(stderr, "tagalloc: gpu: TAGALLOC_GPU_HOST_MEM=%s: not a size from 1M to 64T (K/M/G/T suffixes); "
                    "using %zuG\n", s, GPU_HOST_DEFAULT_MEM >> 30);
    return GPU_HOST_DEFAULT_MEM;
  }
  return v;
}

/* With R.lock held. */
static bool range_reserve(void) {
  if (R.base) return true;
  if (R.failed) return false;
  R.page = (size_t)sysconf(_SC_PAGESIZE);
  R.capacity = _gpu_host_capacity() / R.page * R.page;
  void *p = mmap(NULL, R.capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    R.failed = true;
    return false;
  }
  R.base = p;
  if (!list_insert(&R.free, 0, (extent){ 0, R.capacity })) {
    munmap(p, R.capacity);
    R.base = NULL;
    R.failed = true;
    return false;
  }
  return true;
}

static gpu_status host_alloc(void **ptr, size_t bytes) {
  if (ptr == NULL) return _gpu_host_fail(GPU_EINVAL, "alloc: NULL result pointer");
  *ptr = NULL;
  if (bytes == 0) return _gpu_host_fail(GPU_EINVAL, "alloc: 0 bytes");
  pthread_mutex_lock(&R.lock);
  gpu_status st = GPU_OK;
  if (!range_reserve()) {
    st = _gpu_host_fail(GPU_ENOMEM, "alloc: cannot reserve %zu bytes of address space: %s", _gpu_host_capacity(),
                        strerror(errno));
    goto out;
  }
  size_t len = (bytes + R.page - 1) / R.page * R.page;
  if (len < bytes || len > R.capacity - R.used) {
    st = _gpu_host_fail(GPU_ENOMEM, "alloc: %zu bytes: out of device memory (%zu of %zu in use)", bytes, R.used,
                        R.capacity);
    goto out;
  }
  size_t i = 0;
  while (i < R.free.n && R.free.v[i].len < len) i++;
  if (i == R.free.n) {
    st = _gpu_host_fail(GPU_ENOMEM, "alloc: %zu bytes: no free range that large (%zu of %zu in use)", bytes,
                        R.used, R.capacity);
    goto out;
  }
  size_t off = R.free.v[i].off;
  if (mprotect(R.base + off, len, PROT_READ | PROT_WRITE) != 0) {
    st = _gpu_host_fail(GPU_ENOMEM, "alloc: %zu bytes: mprotect: %s", bytes, strerror(errno));
    goto out;
  }
  if (!list_insert(&R.live, list_lower(&R.live, off), (extent){ off, len })) {
    mprotect(R.base + off, len, PROT_NONE);
    st = _gpu_host_fail(GPU_ENOMEM, "alloc: out of host memory for the extent list");
    goto out;
  }
  if (R.free.v[i].len == len) list_remove(&R.free, i);
  else {
    R.free.v[i].off += len;
    R.free.v[i].len -= len;
  }
  R.used += len;
  *ptr = R.base + off;
out:
  pthread_mutex_unlock(&R.lock);
  return st;
}

static gpu_status host_free(void *ptr) {
  if (ptr == NULL) return GPU_OK;
  pthread_mutex_lock(&R.lock);
  gpu_status st = GPU_OK;
  char *p = ptr;
  size_t off = (size_t)(p - R.base), at = 0;
  if (R.base == NULL || p < R.base || off >= R.capacity || (at = list_lower(&R.live, off)) == R.live.n ||
      R.live.v[at].off != off) {
    st = _gpu_host_fail(GPU_EINVAL, "free: %p is not a live device allocation", ptr);
    goto out;
  }
  size_t len = R.live.v[at].len;
  /* The pages go back to the system and fault if touched again. */
  madvise(p, len, MADV_DONTNEED);
  mprotect(p, len, PROT_NONE);
  /* Merge into the free list with the neighbours. */
  size_t j = list_lower(&R.free, off);
  bool left = j > 0 && R.free.v[j - 1].off + R.free.v[j - 1].len == off;
  bool right = j < R.free.n && off + len == R.free.v[j].off;
  if (left && right) {
    R.free.v[j - 1].len += len + R.free.v[j].len;
    list_remove(&R.free, j);
  } else if (left) {
    R.free.v[j - 1].len += len;
  } else if (right) {
    R.free.v[j].off = off;
    R.free.v[j].len += len;
  } else if (!list_insert(&R.free, j, (extent){ off, len })) {
    /* Out of host memory for the list: the range is lost, not corrupted. */
    st = _gpu_host_fail(GPU_EBACKEND, "free: out of host memory for the extent list: %zu bytes lost", len);
  }
  list_remove(&R.live, at);
  R.used -= len;
out:
  pthread_mutex_unlock(&R.lock);
  return st;
}

bool _gpu_host_owns(const void *ptr, size_t bytes) {
  const char *p = ptr;
  bool ok = false;
  pthread_mutex_lock(&R.lock);
  if (R.base && p >= R.base && (size_t)(p - R.base) < R.capacity) {
    size_t off = (size_t)(p - R.base);
    size_t at = list_lower(&R.live, off + 1);   /* the first extent beyond off */
    if (at > 0) {
      const extent *e = &R.live.v[at - 1];
      ok = off >= e->off && bytes <= e->len - (off - e->off);
    }
  }
  pthread_mutex_unlock(&R.lock);
  return ok;
}

static gpu_status host_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  pthread_mutex_lock(&R.lock);
  size_t cap = R.base ? R.capacity : _gpu_host_capacity();
  if (free_bytes) *free_bytes = cap - R.used;
  if (total_bytes) *total_bytes = cap;
  pthread_mutex_unlock(&R.lock);
  return GPU_OK;
}

/* ---- copies ------------------------------------------------------------------ */

static gpu_status host_memcpy_h2d(void *dst, const void *src, size_t bytes, gpu_stream s) {
  (void)s;
  if (bytes == 0) return GPU_OK;
  if (src == NULL) return _gpu_host_fail(GPU_EINVAL, "memcpy_h2d: NULL source");
  if (!_gpu_host_owns(dst, bytes))
    return _gpu_host_fail(GPU_EINVAL, "memcpy_h2d: destination %p (%zu bytes) is not device memory", dst, bytes);
  memcpy(dst, src, bytes);
  return GPU_OK;
}

static gpu_status host_memcpy_d2h(void *dst, const void *src, size_t bytes, gpu_stream s) {
  (void)s;
  if (bytes == 0) return GPU_OK;
  if (dst == NULL) return _gpu_host_fail(GPU_EINVAL, "memcpy_d2h: NULL destination");
  if (!_gpu_host_owns(src, bytes))
    return _gpu_host_fail(GPU_EINVAL, "memcpy_d2h: source %p (%zu bytes) is not device memory", src, bytes);
  memcpy(dst, src, bytes);
  return GPU_OK;
}

static gpu_status host_memcpy_d2d(void *dst, const void *src, size_t bytes, gpu_stream s) {
  (void)s;
  if (bytes == 0) return GPU_OK;
  if (!_gpu_host_owns(dst, bytes) || !_gpu_host_owns(src, bytes))
    return _gpu_host_fail(GPU_EINVAL, "memcpy_d2d: %p <- %p (%zu bytes): not device memory", dst, src, bytes);
  memmove(dst, src, bytes);
  return GPU_OK;
}

static gpu_status host_memset(void *dst, int byte, size_t bytes, gpu_stream s) {
  (void)s;
  if (bytes == 0) return GPU_OK;
  if (!_gpu_host_owns(dst, bytes))
    return _gpu_host_fail(GPU_EINVAL, "memset: %p (%zu bytes) is not device memory", dst, bytes);
  memset(dst, byte, bytes);
  return GPU_OK;
}

/* ---- streams and events --------------------------------------------------------- */

#define STREAM_MAGIC 0x5354524du   /* "STRM" */
#define EVENT_MAGIC  0x45564e54u   /* "EVNT" */

struct gpu_stream_s {
  uint32_t magic;
};
struct gpu_event_s {
  uint32_t magic;
  uint64_t records;   /* times recorded; the work before each is done at once */
};

static gpu_status stream_check(gpu_stream s, const char *op) {
  if (s != NULL && s->magic != STREAM_MAGIC) return _gpu_host_fail(GPU_EINVAL, "%s: %p is not a stream", op, (void *)s);
  return GPU_OK;
}

static gpu_status event_check(gpu_event e, const char *op) {
  if (e == NULL || e->magic != EVENT_MAGIC) return _gpu_host_fail(GPU_EINVAL, "%s: %p is not an event", op, (void *)e);
  return GPU_OK;
}

static gpu_status host_stream_create(gpu_stream *s) {
  if (s == NULL) return _gpu_host_fail(GPU_EINVAL, "stream_create: NULL result pointer");
  *s = calloc(1, sizeof **s);
  if (*s == NULL) return _gpu_host_fail(GPU_ENOMEM, "stream_create: out of host memory");
  (*s)->magic = STREAM_MAGIC;
  return GPU_OK;
}

static gpu_status host_stream_destroy(gpu_stream s) {
  if (s == NULL) return _gpu_host_fail(GPU_EINVAL, "stream_destroy: the default stream cannot be destroyed");
  gpu_status st = stream_check(s, "stream_destroy");
  if (st) return st;
  s->magic = 0;
  free(s);
  return GPU_OK;
}

static gpu_status host_stream_synchronize(gpu_stream s) { return stream_check(s, "stream_synchronize"); }

static gpu_status host_stream_wait_event(gpu_stream s, gpu_event e) {
  gpu_status st = stream_check(s, "stream_wait_event");
  return st ? st : event_check(e, "stream_wait_event");
}

static gpu_status host_event_create(gpu_event *e) {
  if (e == NULL) return _gpu_host_fail(GPU_EINVAL, "event_create: NULL result pointer");
  *e = calloc(1, sizeof **e);
  if (*e == NULL) return _gpu_host_fail(GPU_ENOMEM, "event_create: out of host memory");
  (*e)->magic = EVENT_MAGIC;
  return GPU_OK;
}

static gpu_status host_event_record(gpu_event e, gpu_stream s) {
  gpu_status st = event_check(e, "event_record");
  if (st == GPU_OK) st = stream_check(s, "event_record");
  if (st == GPU_OK) e->records++;
  return st;
}

static gpu_status host_event_query(gpu_event e) { return event_check(e, "event_query"); }
static gpu_status host_event_synchronize(gpu_event e) { return event_check(e, "event_synchronize"); }

static gpu_status host_event_destroy(gpu_event e) {
  gpu_status st = event_check(e, "event_destroy");
  if (st) return st;
  e->magic = 0;
  free(e);
  return GPU_OK;
}

static gpu_status host_device_synchronize(void) { return GPU_OK; }

/* ---- life ------------------------------------------------------------------------- */

static gpu_status host_init(int device) {
  if (device != 0) return _gpu_host_fail(GPU_ENODEVICE, "init: the host backend has device 0 only (asked for %d)", device);
  return GPU_OK;
}

/* Device memory stays reserved for the life of the process: blocks still
 * out are the caller's, and unmapping under them would turn a leak report
 * into a crash. */
static void host_shutdown(void) {}

static const char *host_device_name(void) { return "host"; }
static int host_ledger_device(void) { return GPU_HOST_DEVICE; }

/* OpenBLAS needs no workspace from the device. */
static size_t host_blas_workspace_size(void) { return 0; }
static gpu_status host_set_blas_workspace(void *ws, size_t bytes) {
  (void)ws, (void)bytes;
  return GPU_OK;
}

static gpu_backend host_table;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void host_table_fill(void) {
  gpu_backend *b = &host_table;
  b->abi = GPU_BACKEND_ABI;
  b->name = "host";
  b->init = host_init;
  b->shutdown = host_shutdown;
  b->last_error = host_last_error;
  b->device_name = host_device_name;
  b->ledger_device = host_ledger_device;
  b->alloc = host_alloc;
  b->free = host_free;
  b->mem_get_info = host_mem_get_info;
  b->memcpy_h2d = host_memcpy_h2d;
  b->memcpy_d2h = host_memcpy_d2h;
  b->memcpy_d2d = host_memcpy_d2d;
  b->memset = host_memset;
  b->stream_create = host_stream_create;
  b->stream_destroy = host_stream_destroy;
  b->stream_synchronize = host_stream_synchronize;
  b->stream_wait_event = host_stream_wait_event;
  b->event_create = host_event_create;
  b->event_record = host_event_record;
  b->event_query = host_event_query;
  b->event_synchronize = host_event_synchronize;
  b->event_destroy = host_event_destroy;
  b->device_synchronize = host_device_synchronize;
  b->blas_workspace_size = host_blas_workspace_size;
  b->set_blas_workspace = host_set_blas_workspace;
  _gpu_host_ops_fill(b);
}

const gpu_backend *gpu_backend_host(void) {
  pthread_once(&host_once, host_table_fill);
  return &host_table;
}
