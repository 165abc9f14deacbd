/* preload_cuda.c - the device memory of unmodified CUDA programs.
 *
 * Where the allocations are caught.  nvcc links the CUDA runtime statically
 * by default, so cudaMalloc is code inside the program and cannot be
 * interposed.  Every CUDA 12 and 13 runtime, static or shared, reaches the
 * driver the same way: it dlopens libcuda.so.1, takes cuGetProcAddress_v2
 * (or cuGetProcAddress) from that handle with dlsym, and asks it for every
 * other driver function.  So:
 *
 *  - dlopen is interposed, by a trampoline that keeps the caller's return
 *    address (glibc's dlopen reads it: the caller's DT_RUNPATH, its
 *    namespace): for any name but libcuda.so* it jumps to glibc's dlopen as
 *    if it had been called directly.  For libcuda.so* it loads the driver as
 *    asked and then returns the handle of libtagalloc-cuda.so, a library
 *    with no code of its own whose dependencies are this preload and then
 *    libcuda.so.1: dlsym on that handle searches the preload first, so
 *    cuGetProcAddress and the memory functions below are ours, and every
 *    other driver symbol is the driver's.
 *  - cuGetProcAddress(_v2) calls the driver's and swaps the function it
 *    found for our wrapper when it is one of those below: the variant (the
 *    _v2 and _ptsz forms) is the exported symbol the pointer equals, else
 *    the one the version and flags ask for.
 *  - A program linked with -lcuda calls the exported names (cuMemAlloc_v2,
 *    ...), which the preload defines too.
 *
 * Each wrapper calls the driver's function and, when it succeeded, records
 * the block through the ledger's device API (tagalloc.h): allocations with
 * the caller's host stack, in a tag per family:
 *
 *   cuda.malloc   cuMemAlloc_v2, cuMemAllocPitch_v2 (pitch x height bytes)
 *   cuda.managed  cuMemAllocManaged
 *   cuda.host     cuMemHostAlloc, cuMemAllocHost_v2 (pinned host memory)
 *   cuda.async    cuMemAllocAsync, cuMemAllocFromPoolAsync (and _ptsz)
 *   cuda.vmm      cuMemCreate: the handle (its value is the key)
 *   cuda.va       cuMemAddressReserve: reserved, never a leak by itself
 *   cuda.map      cuMemMap: reserved; a leak when its handle was released
 *
 * and frees by cuMemFree_v2, cuMemFreeAsync (and _ptsz), cuMemFreeHost,
 * cuMemRelease, cuMemAddressFree and cuMemUnmap (every mapping in the
 * range).  The device is the current context's (cuMemCreate: the
 * location's); a free looks for the block on the current device first.
 * A failed driver call records nothing, and a free the ledger did not see
 * allocated (memory from before the hook) is let go silently: the driver
 * itself reports bad frees.  An allocation whose first frame outside the
 * runtime is in tagalloc's own CUDA backend (libtagalloc-gpu-cuda.so, gpu/)
 * is not recorded: the backend allocates for its caching pool, which puts
 * every segment and buffer on the program's ledger itself (gpu.segment,
 * gpu.buffer), so one device byte is one record.  (cuBLAS's own
 * allocations, from libcublas, are recorded as any library's.)
 *
 * The stack.  It starts at the first frame outside the preload, the driver
 * (a module named libcuda.so*), a shared runtime (libcudart.so*) and a
 * static runtime's code: a function of the frame's module whose ELF symbol
 * (.symtab, else .dynsym) is one of the runtime's names - cuda followed by
 * a capital (cudaMalloc, ...), the same C++-mangled (the templates of
 * cuda_runtime.h), and the prefixes __cuda, __cudart, cudart, _ZN6cudart
 * and libcudart_static_ (the static runtime's internal functions, in CUDA
 * 13 named libcudart_static_<hash>).  A program stripped of .symtab keeps its static runtime's
 * frames on top; a function of the program's own named cudaXxx is hidden
 * with them.
 *
 * Teardown.  As `compute-sanitizer --leak-check full` does, the device
 * blocks still live when a context is destroyed (cuCtxDestroy_v2: its
 * device) or a device's primary context is reset
 * (cuDevicePrimaryCtxReset_v2, what cudaDeviceReset calls) are gpu.leak
 * findings then (detail "device N, at context teardown"), and are
 * forgotten: the driver freed them.  The rest are gpu.leak at exit.
 *
 * Without a driver (no libcuda.so* ever loaded) nothing here runs but the
 * name check in dlopen.  x86-64 only (the trampoline); elsewhere only the
 * -lcuda path is caught. */
#include "internal.h"   /* the depot, the unwinder, device.c, map.c, meta.c */
#include "preload.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the driver's types (cuda.h's, by ABI: built without the Toolkit) ---- */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemHandle;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long cuuint64_t;
/* CUmemAllocationProp's first fields: type, requestedHandleTypes, location {type, id} */
typedef struct { int type, handle_types, loc_type, loc_id; } cu_prop_head;

#define CU_OK 0
#define CU_NOT_INITIALIZED 3
#define CU_LOCATION_DEVICE 1
#define CU_PROC_PER_THREAD 2     /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
#define CU_V2_SINCE 3020         /* cuMemAlloc & co.: the _v2 forms since CUDA 3.2 */

/* ---- the functions we wrap ------------------------------------------------ */

enum {
  W_ALLOC, W_PITCH, W_MANAGED, W_HOSTALLOC, W_ALLOCHOST, W_ASYNC, W_ASYNC_PTSZ, W_POOL,
  W_POOL_PTSZ, W_FREE, W_FREEASYNC, W_FREEASYNC_PTSZ, W_FREEHOST, W_CREATE, W_RELEASE,
  W_RESERVE, W_ADDRFREE, W_MAP, W_UNMAP, W_CTXDESTROY, W_PRIMARYRESET, W_PROC, W_PROC_V2, W_N
};

typedef struct {
  const char *base;          /* the name cuGetProcAddress is asked for */
  const char *name;          /* the exported symbol of this variant */
  bool        ptsz;          /* the per-thread default stream form */
  bool        v2;            /* the _v2 form of a function that has a v1 */
  void       *wrapper;
  _Atomic(void *) real;
} wrapped;

static wrapped fns[W_N];       /* the table: at the end of the file */

/* ---- the driver ------------------------------------------------------------- */

typedef void *(*dlopen_fn)(const char *, int);
/* Read by the trampoline (hidden: a PC-relative load). */
__attribute__((visibility("hidden"), used)) dlopen_fn _pl_real_dlopen;
static _Atomic(void *) driver;            /* libcuda's handle, once seen */
static atomic_int once_state;             /* init_once: 0, 1 running, 2 done */

static ta_tag tag_malloc, tag_managed, tag_host, tag_async, tag_vmm, tag_va, tag_map;

/* dlsym with the guard raised: what it allocates (dlerror's buffer) is the
 * preload's own, not a block of the program's. */
static void *quiet_dlsym(void *h, const char *name) {
  ta_thread *t = _pl_enter();
  void *p = dlsym(h, name);
  if (t) _pl_leave(t);
  return p;
}

static void *next_dlopen(void) {
  if (_pl_real_dlopen == NULL) {
    void *p = quiet_dlsym(RTLD_NEXT, "dlopen");
    memcpy(&_pl_real_dlopen, &p, sizeof p);
  }
  return (void *)_pl_real_dlopen;
}

/* libcuda's handle: the one dlopen gave, or the driver a -lcuda program
 * linked (NULL: no driver in the process). */
static void *driver_handle(void) {
  void *h = atomic_load(&driver);
  if (h) return h;
  if (next_dlopen() == NULL) return NULL;
  h = _pl_real_dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h) atomic_store(&driver, h);
  return h;
}

static void *driver_sym(const char *name) {
  void *h = driver_handle();
  return h ? quiet_dlsym(h, name) : NULL;
}

static void *real_of(int w) {
  void *p = atomic_load_explicit(&fns[w].real, memory_order_acquire);
  if (p) return p;
  p = driver_sym(fns[w].name);
  if (p == fns[w].wrapper) p = NULL;              /* never ourselves */
  if (p) atomic_store_explicit(&fns[w].real, p, memory_order_release);
  return p;
}

#define REAL(w, type) ((type)real_of(w))

/* ---- state kept beside the ledger: mappings and their handles ------------ */

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static ta_map mappings;                   /* a live mapping's address -> its handle (cuMemMap) */

static void at_exit_mappings(void);
static pthread_mutex_t module_lock;

/* No lock of this file is held across fork (a child may call the driver). */
static void fork_prepare(void) {
  pthread_mutex_lock(&module_lock);
  pthread_mutex_lock(&map_lock);
}
static void fork_release(void) {
  pthread_mutex_unlock(&map_lock);
  pthread_mutex_unlock(&module_lock);
}

static void init_once(void) {
  int zero = 0;
  if (atomic_load(&once_state) == 2) return;
  if (!atomic_compare_exchange_strong(&once_state, &zero, 1)) {
    while (atomic_load(&once_state) != 2) sched_yield();
    return;
  }
  tag_malloc = ta_tag_get("cuda.malloc");
  tag_managed = ta_tag_get("cuda.managed");
  tag_host = ta_tag_get("cuda.host");
  tag_async = ta_tag_get("cuda.async");
  tag_vmm = ta_tag_get("cuda.vmm");
  tag_va = ta_tag_get("cuda.va");
  tag_map = ta_tag_get("cuda.map");
  ta_atexit(at_exit_mappings);
  pthread_atfork(fork_prepare, fork_release, fork_release);
  atomic_store(&once_state, 2);
}

/* ---- the caller's stack, the runtime's and driver's frames hidden ------------ */

/* tagalloc's CUDA backend (gpu/gpu.h's GPU_CUDA_LIB): its allocations are
 * its pool's, on the program's ledger already. */
#define OWN_BACKEND "libtagalloc-gpu-cuda.so"

typedef struct { uintptr_t lo, hi; } range;
typedef struct {
  uintptr_t base;            /* dli_fbase: the module's load address */
  bool      runtime;         /* the driver or a shared runtime: every frame hidden */
  bool      backend;         /* tagalloc's own CUDA backend (gpu/): its pool records what it allocates */
  range    *fns;             /* the runtime's functions in it, sorted */
  size_t    n;
} module;

#define MAX_MODULES 32
static module modules[MAX_MODULES];
static size_t nmodules;
static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;   /* never held with map_lock */

static bool starts(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* cudaMalloc, cudaFree, ...: "cuda" and a capital. */
static bool cuda_api_name(const char *s) {
  return starts(s, "cuda") && s[4] >= 'A' && s[4] <= 'Z';
}

static bool runtime_name(const char *s) {
  if (cuda_api_name(s) || starts(s, "__cuda") || starts(s, "cudart") || starts(s, "_ZN6cudart") ||
      starts(s, "libcudart_static_"))
    return true;
  if (s[0] == '_' && s[1] == 'Z') {        /* _Z10cudaMallocIfE...: a template of cuda_runtime.h */
    const char *p = s + 2;
    while (*p >= '0' && *p <= '9') p++;
    return p > s + 2 && cuda_api_name(p);
  }
  return false;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static int range_cmp(const void *a, const void *b) {
  const range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The runtime's functions of one ELF file (its symbols, relocated by
 * bias).  Called under the guard: libelf's memory is raw. */
static void module_load(module *m, const char *path, uintptr_t bias) {
  if (elf_version(EV_CURRENT) == EV_NONE) return;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  Elf *e = elf_begin(fd, ELF_C_READ, NULL);
  size_t cap = 0;
  for (int pass = 0; e && pass < 2 && m->n == 0; pass++) {  /* .symtab, else .dynsym */
    Elf_Scn *scn = NULL;
    while ((scn = elf_nextscn(e, scn)) != NULL) {
      GElf_Shdr sh;
      if (gelf_getshdr(scn, &sh) == NULL) continue;
      if (sh.sh_type != (pass == 0 ? SHT_SYMTAB : SHT_DYNSYM) || sh.sh_entsize == 0) continue;
      Elf_Data *d = elf_getdata(scn, NULL);
      size_t count = sh.sh_size / sh.sh_entsize;
      for (size_t i = 0; d && i < count; i++) {
        GElf_Sym s;
        if (gelf_getsym(d, (int)i, &s) == NULL || GELF_ST_TYPE(s.st_info) != STT_FUNC || s.st_value == 0)
          continue;
        const char *name = elf_strptr(e, sh.sh_link, s.st_name);
        if (name == NULL || !runtime_name(name)) continue;
        if (m->n == cap) {
          size_t nc = cap ? cap * 2 : 256;
          range *r = realloc(m->fns, nc * sizeof *r);
          if (r == NULL) break;
          m->fns = r;
          cap = nc;
        }
        m->fns[m->n++] = (range){ bias + s.st_value, bias + s.st_value + (s.st_size ? s.st_size : 1) };
      }
    }
  }
  if (e) elf_end(e);
  close(fd);
  if (m->n > 1) qsort(m->fns, m->n, sizeof *m->fns, range_cmp);
}

/* The module of pc, its runtime functions loaded on first sight (module_lock held). */
static module *module_of(uintptr_t pc) {
  Dl_info info;
  struct link_map *lm = NULL;
  if (!dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP) || lm == NULL) return NULL;
  uintptr_t base = (uintptr_t)info.dli_fbase;
  for (size_t i = 0; i < nmodules; i++)
    if (modules[i].base == base) return &modules[i];
  if (nmodules == MAX_MODULES) return NULL;
  module *m = &modules[nmodules++];
  *m = (module){ .base = base };
  /* the main program's l_name is "": its file is /proc/self/exe */
  const char *path = lm->l_name && lm->l_name[0] ? lm->l_name : "/proc/self/exe";
  const char *b = base_name(info.dli_fname && info.dli_fname[0] ? info.dli_fname : path);
  if (starts(b, "libcuda.so") || starts(b, "libcudart.so")) {
    m->runtime = true;
    return m;
  }
  m->backend = starts(b, OWN_BACKEND);
  module_load(m, path, (uintptr_t)lm->l_addr);
  return m;
}

static bool runtime_frame(uintptr_t pc) {
  if (_pl_own_code(pc)) return true;
  pthread_mutex_lock(&module_lock);
  module *m = module_of(pc);
  bool hidden = false;
  if (m && m->runtime) {
    hidden = true;
  } else if (m && m->n) {
    size_t lo = 0, hi = m->n;               /* the last function starting at or below pc */
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (m->fns[mid].lo <= pc) lo = mid + 1;
      else hi = mid;
    }
    hidden = lo > 0 && pc < m->fns[lo - 1].hi;
  }
  pthread_mutex_unlock(&module_lock);
  return hidden;
}

static bool backend_frame(uintptr_t pc) {
  pthread_mutex_lock(&module_lock);
  module *m = module_of(pc);
  bool own = m && m->backend;
  pthread_mutex_unlock(&module_lock);
  return own;
}

/* The stack of the program's call into the runtime or driver (guard held).
 * *own (may be NULL): the call came from tagalloc's own CUDA backend (its
 * first frame outside the runtime is there). */
static TA_NOINLINE uint32_t caller_stack_own(bool *own) {
  if (own) *own = false;
  if (!_ta_opt.record || _ta_opt.unwind == TA_UNWIND_NONE) return 0;
  uintptr_t pcs[TA_MAX_DEPTH];
  size_t n = _ta_unwind(pcs, TA_MAX_DEPTH, 1, (int)_ta_opt.unwind);
  size_t i = 0;
  while (i < n && runtime_frame(pcs[i] - 1)) i++;   /* pc - 1: inside the call */
  if (own && i < n) *own = backend_frame(pcs[i] - 1);
  if (i == n) i = 0;                        /* nothing but the runtime: keep it all */
  size_t keep = n - i;
  if (keep > (size_t)_ta_opt.depth) keep = (size_t)_ta_opt.depth;
  return keep ? _ta_depot_put(pcs + i, keep) : 0;
}

/* ---- recording ---------------------------------------------------------------- */

typedef CUresult (*ctx_get_device_fn)(CUdevice *);
static int current_device(void) {
  static _Atomic(void *) fn;
  void *f = atomic_load(&fn);
  if (f == NULL) {
    f = driver_sym("cuCtxGetDevice");
    atomic_store(&fn, f);
  }
  CUdevice d = 0;
  ctx_get_device_fn get;
  memcpy(&get, &f, sizeof f);
  if (get == NULL || get(&d) != CU_OK) return 0;
  return d;
}

static TA_NOINLINE void on_alloc(ta_tag *tag, int device, uintptr_t addr, size_t size, unsigned flags) {
  init_once();
  ta_thread *t = _pl_enter();
  if (t == NULL) return;
  bool own;
  uint32_t stack = caller_stack_own(&own);
  /* tagalloc's own backend allocates for its caching pool, which records
   * each segment and buffer in the program's ledger (gpu.segment,
   * gpu.buffer): a cuda.* block of the same memory would count it twice
   * (and call a segment the pool keeps to exit a leak).  Its frees are then
   * of blocks this ledger never saw: let go silently. */
  if (!own) _ta_device_alloc_at(*tag, device, addr, size, flags, stack);
  _pl_leave(t);
}

/* The device of a live block of tag at addr (the current one first), -1: none. */
static int find_device(ta_tag tag, uintptr_t addr) {
  int cur = current_device();
  if (ta_device_size(tag, cur, addr)) return cur;
  for (int d = 0; d < 64; d++)
    if (d != cur && ta_device_size(tag, d, addr)) return d;
  return -1;
}

/* Frees a block of one of the tags (the first that has one live at addr). */
static TA_NOINLINE void on_free(ta_tag *const *tags, size_t ntags, uintptr_t addr) {
  if (atomic_load(&once_state) != 2) return;
  ta_thread *t = _pl_enter();
  if (t == NULL) return;
  for (size_t i = 0; i < ntags; i++) {
    int d = find_device(*tags[i], addr);
    if (d < 0) continue;
    _ta_device_free_at(*tags[i], d, addr, caller_stack_own(NULL));
    break;
  }
  _pl_leave(t);
}

/* ---- mappings (cuMemMap): a leak when their handle was released ----------- */

/* The handle of each live mapping, by the mapping's address (device
 * addresses are one space across devices). */
static void mapping_set(uintptr_t addr, CUmemHandle handle) {
  pthread_mutex_lock(&map_lock);
  if (handle) _ta_map_put(&mappings, addr, (void *)(uintptr_t)handle);
  else _ta_map_del(&mappings, addr);
  pthread_mutex_unlock(&map_lock);
}

static CUmemHandle mapping_handle(uintptr_t addr) {
  pthread_mutex_lock(&map_lock);
  CUmemHandle h = (CUmemHandle)(uintptr_t)_ta_map_get(&mappings, addr);
  pthread_mutex_unlock(&map_lock);
  return h;
}

typedef struct { const char *when; size_t found; } map_check;

static void map_check_one(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack,
                          unsigned flags, void *arg) {
  (void)flags;
  map_check *c = arg;
  if (tag != tag_map) return;
  CUmemHandle h = mapping_handle(addr);
  if (h && ta_device_size(tag_vmm, device, (uintptr_t)h)) return;   /* the handle's leak says it */
  char detail[96];
  _ta_snprintf(detail, sizeof detail, "device %d%s: mapped, its handle released", device, c->when);
  ta_finding_add(ta_kind_name(TA_KIND_GPU_LEAK), tag, addr, size, stack, 0, detail);
  c->found++;
}

typedef struct { uintptr_t *v; size_t n, cap; } addr_list;

static void stale_mapping(uintptr_t key, void *value, void *arg) {
  (void)value;
  addr_list *l = arg;
  if (l->n < l->cap) l->v[l->n++] = key;
}

/* Mappings whose record is gone (a context torn down): their handles too. */
static void mappings_prune(void) {
  pthread_mutex_lock(&map_lock);
  addr_list l = { NULL, 0, mappings.n };
  if (l.cap) l.v = _ta_meta_alloc(l.cap * sizeof *l.v);
  if (l.v) _ta_map_each(&mappings, stale_mapping, &l);
  pthread_mutex_unlock(&map_lock);
  for (size_t i = 0; i < l.n; i++) {
    bool live = false;
    for (int d = 0; d < 64 && !live; d++) live = ta_device_size(tag_map, d, l.v[i]) != 0;
    if (!live) mapping_set(l.v[i], 0);
  }
  _ta_meta_free(l.v);
}

/* At exit (ta_atexit, before the ledger's gpu.leak pass). */
static void at_exit_mappings(void) {
  map_check c = { "", 0 };
  ta_device_each(-1, map_check_one, &c);
}

/* A context of device is gone: what it still held is gpu.leak now. */
static void teardown(int device) {
  if (atomic_load(&once_state) != 2 || device < 0) return;
  ta_thread *t = _pl_enter();
  if (t == NULL) return;
  map_check c = { ", at context teardown", 0 };
  ta_device_each(device, map_check_one, &c);
  size_t n = c.found + _ta_device_leaks(device, true);
  mappings_prune();
  if (n)
    _ta_error(TA_EFINDING, "gpu.leak: %zu device block(s) of device %d live at context teardown "
              "(the exit report has the stacks)", n, device);
  _pl_leave(t);
}

/* ---- the wrappers ------------------------------------------------------------------ */

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*hostalloc_fn)(void **, size_t, unsigned);
typedef CUresult (*allochost_fn)(void **, size_t);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*freeasync_fn)(CUdeviceptr, CUstream);
typedef CUresult (*freehost_fn)(void *);
typedef CUresult (*create_fn)(CUmemHandle *, size_t, const void *, unsigned long long);
typedef CUresult (*release_fn)(CUmemHandle);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*addrfree_fn)(CUdeviceptr, size_t);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*ctxdestroy_fn)(CUcontext);
typedef CUresult (*primaryreset_fn)(CUdevice);
typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc_v2_fn)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*ctx_push_fn)(CUcontext);
typedef CUresult (*ctx_pop_fn)(CUcontext *);

static ta_tag *const device_tags[] = { &tag_malloc, &tag_managed, &tag_async };

PL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
  alloc_fn real = REAL(W_ALLOC, alloc_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, bytes);
  if (r == CU_OK && dptr) on_alloc(&tag_malloc, current_device(), (uintptr_t)*dptr, bytes, 0);
  return r;
}

PL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned elem) {
  pitch_fn real = REAL(W_PITCH, pitch_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, pitch, width, height, elem);
  if (r == CU_OK && dptr && pitch)
    on_alloc(&tag_malloc, current_device(), (uintptr_t)*dptr, *pitch * height, 0);
  return r;
}

PL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags) {
  managed_fn real = REAL(W_MANAGED, managed_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, bytes, flags);
  if (r == CU_OK && dptr) on_alloc(&tag_managed, current_device(), (uintptr_t)*dptr, bytes, 0);
  return r;
}

PL_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags) {
  hostalloc_fn real = REAL(W_HOSTALLOC, hostalloc_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(pp, bytes, flags);
  if (r == CU_OK && pp) on_alloc(&tag_host, current_device(), (uintptr_t)*pp, bytes, 0);
  return r;
}

PL_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytes) {
  allochost_fn real = REAL(W_ALLOCHOST, allochost_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(pp, bytes);
  if (r == CU_OK && pp) on_alloc(&tag_host, current_device(), (uintptr_t)*pp, bytes, 0);
  return r;
}

static CUresult alloc_async(int w, CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  async_fn real = REAL(w, async_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, bytes, stream);
  if (r == CU_OK && dptr) on_alloc(&tag_async, current_device(), (uintptr_t)*dptr, bytes, 0);
  return r;
}

PL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  return alloc_async(W_ASYNC, dptr, bytes, stream);
}

PL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  return alloc_async(W_ASYNC_PTSZ, dptr, bytes, stream);
}

static CUresult alloc_pool(int w, CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  pool_fn real = REAL(w, pool_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, bytes, pool, stream);
  if (r == CU_OK && dptr) on_alloc(&tag_async, current_device(), (uintptr_t)*dptr, bytes, 0);
  return r;
}

PL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                           CUstream stream) {
  return alloc_pool(W_POOL, dptr, bytes, pool, stream);
}

PL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                                CUstream stream) {
  return alloc_pool(W_POOL_PTSZ, dptr, bytes, pool, stream);
}

PL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  free_fn real = REAL(W_FREE, free_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr);
  if (r == CU_OK && dptr) on_free(device_tags, 3, (uintptr_t)dptr);
  return r;
}

static CUresult free_async(int w, CUdeviceptr dptr, CUstream stream) {
  freeasync_fn real = REAL(w, freeasync_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dptr, stream);
  if (r == CU_OK && dptr) on_free(device_tags, 3, (uintptr_t)dptr);
  return r;
}

PL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return free_async(W_FREEASYNC, dptr, stream);
}

PL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return free_async(W_FREEASYNC_PTSZ, dptr, stream);
}

PL_EXPORT CUresult cuMemFreeHost(void *p) {
  freehost_fn real = REAL(W_FREEHOST, freehost_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(p);
  static ta_tag *const host[] = { &tag_host };
  if (r == CU_OK && p) on_free(host, 1, (uintptr_t)p);
  return r;
}

PL_EXPORT CUresult cuMemCreate(CUmemHandle *handle, size_t size, const void *prop, unsigned long long flags) {
  create_fn real = REAL(W_CREATE, create_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(handle, size, prop, flags);
  if (r == CU_OK && handle) {
    int device = -1;
    if (prop) {
      cu_prop_head head;
      memcpy(&head, prop, sizeof head);
      if (head.loc_type == CU_LOCATION_DEVICE) device = head.loc_id;
    }
    on_alloc(&tag_vmm, device >= 0 ? device : current_device(), (uintptr_t)*handle, size, 0);
  }
  return r;
}

PL_EXPORT CUresult cuMemRelease(CUmemHandle handle) {
  release_fn real = REAL(W_RELEASE, release_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(handle);
  static ta_tag *const vmm[] = { &tag_vmm };
  if (r == CU_OK && handle) on_free(vmm, 1, (uintptr_t)handle);
  return r;
}

PL_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                       unsigned long long flags) {
  reserve_fn real = REAL(W_RESERVE, reserve_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(ptr, size, align, addr, flags);
  if (r == CU_OK && ptr) on_alloc(&tag_va, current_device(), (uintptr_t)*ptr, size, TA_DEVICE_RESERVE);
  return r;
}

PL_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  addrfree_fn real = REAL(W_ADDRFREE, addrfree_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(ptr, size);
  static ta_tag *const va[] = { &tag_va };
  if (r == CU_OK && ptr) on_free(va, 1, (uintptr_t)ptr);
  return r;
}

PL_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemHandle handle,
                            unsigned long long flags) {
  map_fn real = REAL(W_MAP, map_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(ptr, size, offset, handle, flags);
  if (r == CU_OK && ptr) {
    init_once();
    int device = find_device(tag_vmm, (uintptr_t)handle);    /* the handle's memory */
    mapping_set((uintptr_t)ptr, handle);
    on_alloc(&tag_map, device >= 0 ? device : current_device(), (uintptr_t)ptr, size, TA_DEVICE_RESERVE);
  }
  return r;
}

typedef struct { uintptr_t lo, hi; uintptr_t found[64]; int device[64]; size_t n; } unmap_walk;

static void unmap_visit(int device, uintptr_t addr, size_t size, ta_tag tag, uint32_t stack,
                        unsigned flags, void *arg) {
  (void)size, (void)stack, (void)flags;
  unmap_walk *w = arg;
  if (tag != tag_map || addr < w->lo || addr >= w->hi || w->n == 64) return;
  w->found[w->n] = addr;
  w->device[w->n++] = device;
}

PL_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  unmap_fn real = REAL(W_UNMAP, unmap_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(ptr, size);
  if (r != CU_OK || atomic_load(&once_state) != 2) return r;
  ta_thread *t = _pl_enter();
  if (t == NULL) return r;
  unmap_walk w = { .lo = (uintptr_t)ptr, .hi = (uintptr_t)ptr + size };
  ta_device_each(-1, unmap_visit, &w);               /* every mapping in the range */
  uint32_t stack = w.n ? caller_stack_own(NULL) : 0;
  for (size_t i = 0; i < w.n; i++) {
    _ta_device_free_at(tag_map, w.device[i], w.found[i], stack);
    mapping_set(w.found[i], 0);
  }
  _pl_leave(t);
  return r;
}

/* The device of a context: made current for the question, then put back. */
static int context_device(CUcontext ctx) {
  ctx_push_fn push = (ctx_push_fn)driver_sym("cuCtxPushCurrent_v2");
  ctx_pop_fn pop = (ctx_pop_fn)driver_sym("cuCtxPopCurrent_v2");
  if (ctx == NULL || push == NULL || pop == NULL || push(ctx) != CU_OK) return -1;
  int d = current_device();
  CUcontext was;
  pop(&was);
  return d;
}

PL_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  ctxdestroy_fn real = REAL(W_CTXDESTROY, ctxdestroy_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  int device = atomic_load(&once_state) == 2 ? context_device(ctx) : -1;
  CUresult r = real(ctx);
  if (r == CU_OK) teardown(device);
  return r;
}

PL_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  primaryreset_fn real = REAL(W_PRIMARYRESET, primaryreset_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(dev);
  if (r == CU_OK) teardown(dev);
  return r;
}

/* ---- cuGetProcAddress -------------------------------------------------------------- */

/* The wrapper to hand out for what the driver found for base (fn), or fn.
 * The variant is the exported symbol fn is; else the one the version and
 * flags ask for (the per-thread form when asked and there is one, else the
 * default form: a function without a _ptsz form is the same in both
 * modes); none (a v1 form, asked for by a version before 3.2): fn. */
static void *wrap(const char *base, void *fn, int version, cuuint64_t flags) {
  int pick = -1, exact = -1, plain = -1;
  bool ptsz = (flags & CU_PROC_PER_THREAD) != 0;
  for (int w = 0; w < W_N; w++) {
    if (strcmp(fns[w].base, base) != 0) continue;
    if (fn == fns[w].wrapper) return fn;            /* the driver handed out ours */
    if (driver_sym(fns[w].name) == fn) { pick = w; break; }
    if (fns[w].v2 && version < CU_V2_SINCE) continue;
    if (fns[w].ptsz == ptsz) exact = w;
    else if (!fns[w].ptsz) plain = w;
  }
  if (pick < 0) pick = exact >= 0 ? exact : plain;
  if (pick < 0) return fn;
  /* The wrapper calls the first function the driver gave for its variant
   * (or the exported one); another pointer for the same variant is the
   * same function. */
  void *expected = NULL;
  atomic_compare_exchange_strong(&fns[pick].real, &expected, fn);
  init_once();
  return fns[pick].wrapper;
}

PL_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  proc_fn real = REAL(W_PROC, proc_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags);
  if (r == CU_OK && symbol && pfn && *pfn) *pfn = wrap(symbol, *pfn, version, flags);
  return r;
}

PL_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       int *status) {
  proc_v2_fn real = REAL(W_PROC_V2, proc_v2_fn);
  if (real == NULL) return CU_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CU_OK && symbol && pfn && *pfn) *pfn = wrap(symbol, *pfn, version, flags);
  return r;
}

static wrapped fns[W_N] = {
  [W_ALLOC]          = { "cuMemAlloc", "cuMemAlloc_v2", false, true, (void *)cuMemAlloc_v2, NULL },
  [W_PITCH]          = { "cuMemAllocPitch", "cuMemAllocPitch_v2", false, true, (void *)cuMemAllocPitch_v2, NULL },
  [W_MANAGED]        = { "cuMemAllocManaged", "cuMemAllocManaged", false, false, (void *)cuMemAllocManaged, NULL },
  [W_HOSTALLOC]      = { "cuMemHostAlloc", "cuMemHostAlloc", false, false, (void *)cuMemHostAlloc, NULL },
  [W_ALLOCHOST]      = { "cuMemAllocHost", "cuMemAllocHost_v2", false, true, (void *)cuMemAllocHost_v2, NULL },
  [W_ASYNC]          = { "cuMemAllocAsync", "cuMemAllocAsync", false, false, (void *)cuMemAllocAsync, NULL },
  [W_ASYNC_PTSZ]     = { "cuMemAllocAsync", "cuMemAllocAsync_ptsz", true, false, (void *)cuMemAllocAsync_ptsz, NULL },
  [W_POOL]           = { "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", false, false,
                         (void *)cuMemAllocFromPoolAsync, NULL },
  [W_POOL_PTSZ]      = { "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", true, false,
                         (void *)cuMemAllocFromPoolAsync_ptsz, NULL },
  [W_FREE]           = { "cuMemFree", "cuMemFree_v2", false, true, (void *)cuMemFree_v2, NULL },
  [W_FREEASYNC]      = { "cuMemFreeAsync", "cuMemFreeAsync", false, false, (void *)cuMemFreeAsync, NULL },
  [W_FREEASYNC_PTSZ] = { "cuMemFreeAsync", "cuMemFreeAsync_ptsz", true, false, (void *)cuMemFreeAsync_ptsz, NULL },
  [W_FREEHOST]       = { "cuMemFreeHost", "cuMemFreeHost", false, false, (void *)cuMemFreeHost, NULL },
  [W_CREATE]         = { "cuMemCreate", "cuMemCreate", false, false, (void *)cuMemCreate, NULL },
  [W_RELEASE]        = { "cuMemRelease", "cuMemRelease", false, false, (void *)cuMemRelease, NULL },
  [W_RESERVE]        = { "cuMemAddressReserve", "cuMemAddressReserve", false, false, (void *)cuMemAddressReserve, NULL },
  [W_ADDRFREE]       = { "cuMemAddressFree", "cuMemAddressFree", false, false, (void *)cuMemAddressFree, NULL },
  [W_MAP]            = { "cuMemMap", "cuMemMap", false, false, (void *)cuMemMap, NULL },
  [W_UNMAP]          = { "cuMemUnmap", "cuMemUnmap", false, false, (void *)cuMemUnmap, NULL },
  [W_CTXDESTROY]     = { "cuCtxDestroy", "cuCtxDestroy_v2", false, true, (void *)cuCtxDestroy_v2, NULL },
  [W_PRIMARYRESET]   = { "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", false, true,
                         (void *)cuDevicePrimaryCtxReset_v2, NULL },
  [W_PROC]           = { "cuGetProcAddress", "cuGetProcAddress", false, false, (void *)cuGetProcAddress, NULL },
  [W_PROC_V2]        = { "cuGetProcAddress", "cuGetProcAddress_v2", false, true, (void *)cuGetProcAddress_v2, NULL },
};

/* ---- dlopen ------------------------------------------------------------------------- */

/* libcuda.so, libcuda.so.1, libcuda.so.580.65.06 (not libcudart.so). */
static bool driver_name(const char *file) {
  return file && starts(base_name(file), "libcuda.so");
}

/* libtagalloc-cuda.so, beside this preload. */
static bool shim_path(char *out, size_t n) {
  Dl_info info;
  if (!dladdr((void *)shim_path, &info) || info.dli_fname == NULL) return false;
  const char *slash = strrchr(info.dli_fname, '/');
  static const char name[] = "libtagalloc-cuda.so";
  size_t dir = slash ? (size_t)(slash - info.dli_fname + 1) : 0;
  if (dir + sizeof name > n) return false;
  memcpy(out, info.dli_fname, dir);
  memcpy(out + dir, name, sizeof name);
  return true;
}

/* The trampoline's question: NULL lets glibc's dlopen run as called; else
 * the handle to return. */
__attribute__((visibility("hidden"), used)) void *_pl_cuda_dlopen(const char *file, int flags) {
  next_dlopen();
  if (!driver_name(file)) return NULL;
  void *h = _pl_real_dlopen(file, flags);
  if (h == NULL) return NULL;                       /* glibc's dlopen says why */
  void *none = NULL;
  atomic_compare_exchange_strong(&driver, &none, h);
  char path[4096];
  void *shim = shim_path(path, sizeof path) ? _pl_real_dlopen(path, flags & ~RTLD_NOLOAD) : NULL;
  if (shim == NULL) {
    _ta_error(TA_EINVAL, "%s: cannot load %s (%s): the program's device memory is not audited",
              file, path, dlerror());
    return h;
  }
  return shim;
}

#if defined(__x86_64__)
/* dlopen(file, flags): asks _pl_cuda_dlopen, and when it says NULL jumps
 * to glibc's dlopen with the caller's return address still on top. */
__asm__(".text\n"
        ".globl dlopen\n"
        ".type dlopen, @function\n"
        "dlopen:\n"
        "  endbr64\n"
        "  push %rdi\n"
        "  push %rsi\n"
        "  sub $8, %rsp\n"
        "  call _pl_cuda_dlopen\n"
        "  add $8, %rsp\n"
        "  pop %rsi\n"
        "  pop %rdi\n"
        "  test %rax, %rax\n"
        "  jnz 1f\n"
        "  jmp *_pl_real_dlopen(%rip)\n"
        "1:\n"
        "  ret\n"
        ".size dlopen, .-dlopen\n");
#endif
