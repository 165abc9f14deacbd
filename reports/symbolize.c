/* symbolize.c - addresses of the running process to function, file:line and
 * module, with inlined frames, on elfutils libdw (Dwfl over /proc/PID/maps).
 *
 * Runs at report time only: memory comes from plain malloc, one mutex per
 * context serializes libdw (which is not thread-safe per Dwfl).  Results are
 * cached per looked-up address; every string handed out is interned in the
 * context, so frames stay valid while modules come and go. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* dl_iterate_phdr, RTLD_DEFAULT */
#endif
#include "procmaps.h"
#include "report.h"

#include <dlfcn.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <elfutils/libdwelf.h>
#include <dwarf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the context --------------------------------------------------------- */

typedef struct {
  uintptr_t     key;     /* the address looked up (pc - 1 for a return address) */
  uintptr_t     start;   /* load start of the module, 0 when none */
  uint32_t      n;       /* frames; 0 marks an empty slot */
  report_frame *frames;
} cache_entry;

struct report_ctx {
  pthread_mutex_t mu;
  Dwfl           *dwfl;
  Dwfl_Callbacks  callbacks;       /* dwfl keeps a pointer to it */
  char           *debuginfo_path;  /* NULL: the standard path (find_debuginfo assumes it) */
  pid_t           pid;             /* the process the modules were reported for */
  int             offline;         /* another process's modules, reported once */
  report_module  *mods;            /* offline: the modules as given (paths owned) */
  size_t          nmods;
  unsigned long long dl_adds, dl_subs;  /* dl_iterate_phdr's counters at the last report */

  cache_entry    *cache;
  size_t          cache_cap, cache_used;   /* cap: a power of two */

  char          **strs;                    /* interned strings, open addressing */
  size_t          strs_cap, strs_used;

  struct cu_table *cus;                    /* each module's CU ranges (cu_table_of) */
  size_t          ncus;
};

/* ---- C++ demangling, only when libstdc++ is already in the process ------- */

typedef char *demangle_fn(const char *mangled, char *buf, size_t *len, int *status);
static demangle_fn   *demangler;
static pthread_once_t demangler_once = PTHREAD_ONCE_INIT;

static void demangler_find(void) {
  void *sym = dlsym(RTLD_DEFAULT, "__cxa_demangle");
  memcpy(&demangler, &sym, sizeof sym);   /* object pointer to function pointer */
}

/* Offline, the process reading a trace (a C program) may not have libstdc++:
 * load it then, once, to demangle another process's C++ names. */
static demangle_fn   *demangler_loaded;
static pthread_once_t demangler_load_once = PTHREAD_ONCE_INIT;

static void demangler_load(void) {
  pthread_once(&demangler_once, demangler_find);
  if (demangler) return;
  void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
  void *sym = h ? dlsym(h, "__cxa_demangle") : NULL;
  memcpy(&demangler_loaded, &sym, sizeof sym);
}

/* ---- interned strings ---------------------------------------------------- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;           /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int strs_grow(report_ctx *c) {
  size_t ncap = c->strs_cap ? c->strs_cap * 2 : 256;
  char **n = calloc(ncap, sizeof *n);
  if (!n) return -1;
  for (size_t i = 0; i < c->strs_cap; i++) {
    char *s = c->strs[i];
    if (!s) continue;
    size_t j = hash_str(s) & (ncap - 1);
    while (n[j]) j = (j + 1) & (ncap - 1);
    n[j] = s;
  }
  free(c->strs);
  c->strs = n;
  c->strs_cap = ncap;
  return 0;
}

/* The context's copy of s; NULL for NULL (or when memory runs out). */
static const char *intern(report_ctx *c, const char *s) {
  if (!s) return NULL;
  if ((c->strs_used + 1) * 4 > c->strs_cap * 3 && strs_grow(c) != 0) return NULL;
  size_t j = hash_str(s) & (c->strs_cap - 1);
  for (; c->strs[j]; j = (j + 1) & (c->strs_cap - 1))
    if (strcmp(c->strs[j], s) == 0) return c->strs[j];
  char *copy = strdup(s);
  if (!copy) return NULL;
  c->strs[j] = copy;
  c->strs_used++;
  return copy;
}

/* A function name as printed: C++ names demangled. */
static const char *intern_function(report_ctx *c, const char *name) {
  if (!name || !*name) return NULL;
  if (name[0] == '_' && name[1] == 'Z') {
    pthread_once(&demangler_once, demangler_find);
    demangle_fn *dm = demangler ? demangler : demangler_loaded;
    if (dm) {
      int status = -1;
      char *d = dm(name, NULL, NULL, &status);
      if (d && status == 0) {
        const char *r = intern(c, d);
        free(d);
        if (r) return r;
      } else {
        free(d);
      }
    }
  }
  return intern(c, name);
}

/* ---- the address cache ---------------------------------------------------- */

static size_t hash_addr(uintptr_t a, size_t cap) {
  return (size_t)(((uint64_t)a * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static cache_entry *cache_find(report_ctx *c, uintptr_t key) {
  if (!c->cache_cap) return NULL;
  for (size_t j = hash_addr(key, c->cache_cap);; j = (j + 1) & (c->cache_cap - 1)) {
    cache_entry *e = &c->cache[j];
    if (!e->n) return NULL;
    if (e->key == key) return e;
  }
}

static int cache_grow(report_ctx *c) {
  size_t ncap = c->cache_cap ? c->cache_cap * 2 : 1024;
  cache_entry *n = calloc(ncap, sizeof *n);
  if (!n) return -1;
  for (size_t i = 0; i < c->cache_cap; i++) {
    cache_entry *e = &c->cache[i];
    if (!e->n) continue;
    size_t j = hash_addr(e->key, ncap);
    while (n[j].n) j = (j + 1) & (ncap - 1);
    n[j] = *e;
  }
  free(c->cache);
  c->cache = n;
  c->cache_cap = ncap;
  return 0;
}

/* Keeps a copy of frames[0..n) for key; silently skipped without memory. */
static void cache_put(report_ctx *c, uintptr_t key, uintptr_t start,
                      const report_frame *frames, size_t n) {
  if ((c->cache_used + 1) * 4 > c->cache_cap * 3 && cache_grow(c) != 0) return;
  report_frame *copy = malloc(n * sizeof *copy);
  if (!copy) return;
  memcpy(copy, frames, n * sizeof *copy);
  size_t j = hash_addr(key, c->cache_cap);
  while (c->cache[j].n) j = (j + 1) & (c->cache_cap - 1);
  c->cache[j] = (cache_entry){ .key = key, .start = start, .n = (uint32_t)n, .frames = copy };
  c->cache_used++;
}

/* ---- modules -------------------------------------------------------------- */

static int dl_counters_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  unsigned long long *out = arg;
  if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    out[0] = info->dlpi_adds;
    out[1] = info->dlpi_subs;
  }
  return 1;   /* the counters are the same in every entry: stop at the first */
}

static void dl_counters(unsigned long long *adds, unsigned long long *subs) {
  unsigned long long v[2] = { 0, 0 };
  dl_iterate_phdr(dl_counters_cb, v);
  *adds = v[0];
  *subs = v[1];
}

/* (Re-)reads the process's maps; modules still mapped keep their state. */
/* Libraries dlclose()d before the report (the LD_PRELOAD shim tells us):
 * their blocks' stacks still name their functions.  A list that only
 * grows, under its own lock; the paths are copies. */
typedef struct { char *path; uintptr_t base, lo, hi; } unloaded_module;
static pthread_mutex_t unloaded_lock = PTHREAD_MUTEX_INITIALIZER;
static unloaded_module *unloaded;
static size_t nunloaded, cap_unloaded;

void report_module_unloaded(const char *path, uintptr_t base, uintptr_t lo, uintptr_t hi) {
  if (!path || !*path || hi <= lo) return;
  pthread_mutex_lock(&unloaded_lock);
  for (size_t i = 0; i < nunloaded; i++)       /* the same library at the same place again */
    if (unloaded[i].base == base && unloaded[i].lo == lo && strcmp(unloaded[i].path, path) == 0) {
      pthread_mutex_unlock(&unloaded_lock);
      return;
    }
  if (nunloaded == cap_unloaded) {
    size_t cap = cap_unloaded ? cap_unloaded * 2 : 16;
    unloaded_module *v = realloc(unloaded, cap * sizeof *v);
    if (!v) {
      pthread_mutex_unlock(&unloaded_lock);
      return;
    }
    unloaded = v;
    cap_unloaded = cap;
  }
  char *copy = strdup(path);
  if (copy) unloaded[nunloaded++] = (unloaded_module){ copy, base, lo, hi };
  pthread_mutex_unlock(&unloaded_lock);
}

/* The unloaded libraries, reported after the live maps (inside
 * dwfl_report_begin/end), newest first: one whose range a live module or a
 * newer unloaded one holds now is refused by libdw, so an address is named
 * by what is mapped there now, else by the last library that was. */
static void report_unloaded(report_ctx *c) {
  pthread_mutex_lock(&unloaded_lock);
  for (size_t i = nunloaded; i-- > 0;)
    (void)dwfl_report_elf(c->dwfl, unloaded[i].path, unloaded[i].path, -1, unloaded[i].base, false);
  pthread_mutex_unlock(&unloaded_lock);
}

static void cu_tables_clear(report_ctx *c);

/* The span of each loaded object (its first to its last PT_LOAD), from
 * the loader. */
typedef struct { uintptr_t lo, hi; } span;
typedef struct { span *v; size_t n, cap; } span_list;

static int span_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  span_list *l = arg;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if ((a & ~(uintptr_t)4095) < lo) lo = a & ~(uintptr_t)4095;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (hi <= lo) return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    span *v = realloc(l->v, cap * sizeof *v);
    if (v == NULL) return 1;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = (span){ lo, hi };
  return 0;
}

/* The maps' lines kept for libdw, one after the other. */
typedef struct {
  const span_list *spans;
  char *text;
  size_t len, cap;
  bool oom;
} kept_maps;

/* Keeps a line unless it maps a file outside every object. */
static int keep_map(const ta_maps_entry *e, void *arg) {
  kept_maps *k = arg;
  bool keep = !strchr(e->line, '/');
  for (size_t i = 0; i < k->spans->n && !keep; i++)
    keep = e->lo < k->spans->v[i].hi && e->hi > k->spans->v[i].lo;
  if (!keep) return 0;
  if (k->cap - k->len < e->len + 1) {
    size_t cap = k->cap ? k->cap * 2 : 1 << 16;
    while (cap - k->len < e->len + 1) cap *= 2;
    char *t = realloc(k->text, cap);
    if (t == NULL) {
      k->oom = true;
      return 1;
    }
    k->text = t;
    k->cap = cap;
  }
  memcpy(k->text + k->len, e->line, e->len);
  k->text[k->len + e->len] = '\n';
  k->len += e->len + 1;
  return 0;
}

/* The process's modules for libdw: /proc/self/maps less the mappings of
 * files that lie in no loaded object.  libdw's and libunwind's own reading
 * of a library maps its file as well, and dwfl_linux_proc_report takes such
 * a mapping for part of the module when it lies next to the library: the
 * module then starts at the wrong place and none of its addresses has a
 * name (a library dlopen()ed while the exact unwinder ran was all "??").
 * Falls back to dwfl_linux_proc_report when the maps cannot be read. */
static void report_live_modules(report_ctx *c) {
  span_list spans = { 0 };
  dl_iterate_phdr(span_cb, &spans);
  kept_maps k = { .spans = &spans };
  bool ok = spans.n > 0 && _ta_maps_each(keep_map, &k) == 0 && !k.oom;
  if (ok) {
    FILE *f = k.len ? fmemopen(k.text, k.len, "r") : NULL;
    ok = f != NULL;
    if (f) {
      (void)dwfl_linux_proc_maps_report(c->dwfl, f);
      fclose(f);
    }
  }
  if (!ok) (void)dwfl_linux_proc_report(c->dwfl, c->pid);
  free(k.text);
  free(spans.v);
}

static void report_modules(report_ctx *c) {
  c->pid = getpid();
  dl_counters(&c->dl_adds, &c->dl_subs);
  cu_tables_clear(c);                      /* modules may go: no pointer to them is kept */
  dwfl_report_begin(c->dwfl);
  report_live_modules(c);
  report_unloaded(c);
  dwfl_report_end(c->dwfl, NULL, NULL);
}

/* dwfl_addrmodule, but only a module whose range holds addr: libdw 0.188
 * can answer with the module before an unreported gap (where a library
 * dlopen()ed since the last report now lives). */
static Dwfl_Module *addrmodule(Dwfl *dwfl, uintptr_t addr) {
  Dwfl_Module *m = dwfl_addrmodule(dwfl, addr);
  Dwarf_Addr lo = 0, hi = 0;
  if (m && dwfl_module_info(m, NULL, &lo, &hi, NULL, NULL, NULL, NULL) &&
      (addr < lo || addr >= hi))
    return NULL;
  return m;
}

/* A module for addr, reporting the maps once more when the dynamic linker
 * has loaded or unloaded something since the last report (or after fork). */
static Dwfl_Module *module_of(report_ctx *c, uintptr_t addr) {
  Dwfl_Module *m = addrmodule(c->dwfl, addr);
  if (m || c->offline) return m;
  unsigned long long adds, subs;
  dl_counters(&adds, &subs);
  if (adds == c->dl_adds && subs == c->dl_subs && getpid() == c->pid) return NULL;
  report_modules(c);
  return addrmodule(c->dwfl, addr);
}

/* ---- debug files: the local ones, and debuginfod only when it is configured -- */

/* dwfl_standard_find_debuginfo, when it finds no local debug file for a
 * module with a build ID, asks the debuginfod client, and libdw 0.188 then
 * dlopen()s libdebuginfod whether or not a server is configured: libcurl,
 * GnuTLS, Kerberos, LDAP and 20 more libraries, their constructors, ~8 MB
 * of memory and 15-30 ms in every process that symbolizes one frame of a
 * program without debug information - for nothing, as the client asks no
 * server and reads no cache when DEBUGINFOD_URLS is unset or empty (as at
 * the preload's exit report: __libc_freeres has cleared the environment;
 * getenv here sees what the client would see).  So then the standard
 * search runs only when one of the files it would open exists (the
 * candidates below are a superset of its build-ID and debuglink paths);
 * otherwise the answer is its own: nothing, errno 0. */

static bool debuginfod_configured(void) {
  const char *u = getenv("DEBUGINFOD_URLS");
  return u && *u;
}

static bool file_exists(const char *path) { return access(path, F_OK) == 0; }

/* DIR/SUB/NAME (either of DIR and SUB may be NULL) exists. */
static bool exists3(const char *dir, const char *sub, const char *name) {
  char buf[4096];
  int n = snprintf(buf, sizeof buf, "%s%s%s%s%s", dir ? dir : "", dir ? "/" : "", sub ? sub : "",
                   sub ? "/" : "", name);
  return n <= 0 || (size_t)n >= sizeof buf || file_exists(buf);   /* too long: let libdw look */
}

/* libdwfl's debug path (the contexts here never set another). */
#define DEBUG_PATH ":.debug:/usr/lib/debug"

/* Any file the debuglink search of file_name (find_debuginfo_in_path in
 * libdwfl) would try, for each element of the debug path: "" the file's
 * directory, "/abs" abs/D for each tail D of the file's directory and abs
 * itself, "rel" the file's directory/rel; the debuglink name, or
 * BASENAME.debug and (but in the file's own directory) BASENAME without one. */
static bool debuglink_candidate(const char *file_name, const char *link) {
  if (!file_name) return false;
  const char *base = strrchr(file_name, '/');
  base = base ? base + 1 : file_name;
  char dirbuf[4096];
  const char *dir = NULL;
  if (base != file_name) {
    size_t n = (size_t)(base - 1 - file_name);
    if (n >= sizeof dirbuf) return true;
    memcpy(dirbuf, file_name, n);
    dirbuf[n] = '\0';
    dir = dirbuf;
  }
  char linkbuf[1024];
  int nnames = 1;
  if (!link) {   /* a made-up name: the basename is tried too (not beside the file) */
    if (snprintf(linkbuf, sizeof linkbuf, "%s.debug", base) >= (int)sizeof linkbuf) return true;
    link = linkbuf;
    nnames = 2;
  }
  const char *names[2] = { link, base };
  char copy[] = DEBUG_PATH;
  char *rest = copy, *e;
  while ((e = strsep(&rest, ":")) != NULL) {
    if (*e == '+' || *e == '-') e++;
    for (int k = 0; k < nnames; k++) {
      if (*e == '\0') {
        if (k == 0 && exists3(dir, NULL, names[k])) return true;
      } else if (*e == '/') {
        if (exists3(e, NULL, names[k])) return true;
        for (const char *sub = dir; sub; sub = strchr(sub, '/')) {
          if (*sub == '/') sub++;
          if (*sub && exists3(e, sub, names[k])) return true;
        }
      } else if (exists3(dir, e, names[k])) {
        return true;
      }
    }
  }
  return false;
}

/* ---- decompressed copies of compressed debug files ------------------------ */

/* Distributions ship debug files with their .debug_* sections compressed
 * (SHF_COMPRESSED, zlib), and libdw inflates every one of them when it opens
 * one: for libc6-dbg's libc.so.6 ~10 MB of memory and ~70 ms, in every
 * audited process whose report names a frame in libc (nearly all: main is
 * called from there).  So a debug file found by build ID is decompressed
 * once into a cache directory, named by its build ID, and that copy is what
 * libdw maps from then on: nothing to inflate, and only the pages read are
 * resident.  The DWARF is the same bytes, the reports the same.  The copy
 * is used only while the original is still there (a report names no more
 * than it would without the cache), and only when its build ID matches.
 *
 * TAGALLOC_DEBUG_CACHE: the directory; "", "0", "off" or "no": no cache.
 * By default $XDG_CACHE_HOME/tagalloc/debug, or ~/.cache/tagalloc/debug.
 * Read at load: at the exit report __libc_freeres has cleared the
 * environment. */
static char debug_cache[PATH_MAX];

__attribute__((constructor)) static void debug_cache_init(void) {
  const char *d = getenv("TAGALLOC_DEBUG_CACHE"), *x;
  int n = -1;
  if (d) {
    if (*d && strcmp(d, "0") != 0 && strcmp(d, "off") != 0 && strcmp(d, "no") != 0)
      n = snprintf(debug_cache, sizeof debug_cache, "%s", d);
  } else if ((x = getenv("XDG_CACHE_HOME")) && x[0] == '/') {
    n = snprintf(debug_cache, sizeof debug_cache, "%s/tagalloc/debug", x);
  } else if ((x = getenv("HOME")) && x[0] == '/') {
    n = snprintf(debug_cache, sizeof debug_cache, "%s/.cache/tagalloc/debug", x);
  }
  if (n <= 0 || (size_t)n + 160 >= sizeof debug_cache) debug_cache[0] = '\0';
}

static bool build_id_is(Elf *e, const unsigned char *bits, int len) {
  const void *id = NULL;
  ssize_t n = dwelf_elf_gnu_build_id(e, &id);
  return n == len && memcmp(id, bits, (size_t)len) == 0;
}

static bool has_compressed(Elf *e) {
  for (Elf_Scn *s = NULL; (s = elf_nextscn(e, s));) {
    GElf_Shdr sh;
    if (gelf_getshdr(s, &sh) && (sh.sh_flags & SHF_COMPRESSED)) return true;
  }
  return false;
}

/* mkdir -p */
static bool make_dirs(const char *dir) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", dir);
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) return false;
    if (!c) return true;
    *p = c;
  }
}

/* oe with its compressed sections inflated, written to path (a temporary
 * file renamed: a reader sees the whole copy or none). */
static bool write_decompressed(Elf *oe, const char *path) {
  char tmp[sizeof debug_cache + 200];
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  Elf *ne = elf_begin(fd, ELF_C_WRITE, NULL);
  GElf_Ehdr eh;
  size_t phnum = 0, shstrndx = 0;
  bool ok = ne && gelf_getehdr(oe, &eh) && gelf_newehdr(ne, gelf_getclass(oe)) &&
            elf_getphdrnum(oe, &phnum) == 0 && elf_getshdrstrndx(oe, &shstrndx) == 0 &&
            shstrndx < SHN_LORESERVE;
  if (ok && phnum) {
    ok = gelf_newphdr(ne, phnum) != NULL;
    for (size_t i = 0; ok && i < phnum; i++) {
      GElf_Phdr ph;
      ok = gelf_getphdr(oe, (int)i, &ph) && gelf_update_phdr(ne, (int)i, &ph);
    }
  }
  for (Elf_Scn *s = NULL; ok && (s = elf_nextscn(oe, s));) {
    GElf_Shdr sh;
    ok = gelf_getshdr(s, &sh) != NULL;
    if (ok && (sh.sh_flags & SHF_COMPRESSED)) ok = elf_compress(s, 0, 0) >= 0 && gelf_getshdr(s, &sh);
    Elf_Scn *n = ok ? elf_newscn(ne) : NULL;
    ok = n != NULL;
    for (Elf_Data *d = NULL; ok && (d = elf_getdata(s, d));) {
      Elf_Data *nd = elf_newdata(n);
      ok = nd != NULL;
      if (ok) *nd = *d;
    }
    ok = ok && gelf_update_shdr(n, &sh);
  }
  if (ok) {
    eh.e_shstrndx = (GElf_Half)shstrndx;
    ok = gelf_update_ehdr(ne, &eh) && elf_update(ne, ELF_C_WRITE) >= 0;
  }
  if (ne) elf_end(ne);
  if (close(fd) != 0) ok = false;
  if (ok && rename(tmp, path) == 0) return true;
  unlink(tmp);
  return false;
}

/* The cached copy of the debug file orig (found by its build ID bits):
 * an open descriptor and its name, made now if there is none; -1 when
 * there is no cache, orig is not compressed, or anything fails. */
static int cached_debug(const char *orig, const unsigned char *bits, int len, const char *hex,
                        char **name_out) {
  if (!debug_cache[0]) return -1;
  char path[sizeof debug_cache + 144];
  snprintf(path, sizeof path, "%s/%s.debug", debug_cache, hex);
  elf_version(EV_CURRENT);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int in = open(orig, O_RDONLY | O_CLOEXEC);
    if (in < 0) return -1;
    Elf *oe = elf_begin(in, ELF_C_READ, NULL);
    bool ok = oe && elf_kind(oe) == ELF_K_ELF && build_id_is(oe, bits, len) && has_compressed(oe) &&
              make_dirs(debug_cache) && write_decompressed(oe, path);
    if (oe) elf_end(oe);
    close(in);
    if (!ok || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return -1;
  }
  Elf *e = elf_begin(fd, ELF_C_READ_MMAP, NULL);
  bool ok = e && elf_kind(e) == ELF_K_ELF && build_id_is(e, bits, len);
  if (e) elf_end(e);
  char *name = ok ? strdup(path) : NULL;
  if (!name) {
    close(fd);
    return -1;
  }
  *name_out = name;
  return fd;
}

/* dwfl_standard_find_debuginfo, but a debug file found by build ID comes
 * from the cache of decompressed copies, and without the debuginfod client
 * when no server is configured (see above). */
static int find_debuginfo(Dwfl_Module *mod, void **userdata, const char *modname, GElf_Addr base,
                          const char *file_name, const char *debuglink_file, GElf_Word debuglink_crc,
                          char **debuginfo_file_name) {
  const char *debugfile = NULL;
  const unsigned char *bits = NULL;
  GElf_Addr vaddr;
  int bits_len = dwfl_module_build_id(mod, &bits, &vaddr);
  dwfl_module_info(mod, NULL, NULL, NULL, NULL, NULL, NULL, &debugfile);
  /* a debug file's alternate (dwz) file, a module without a build ID (the
   * client is not asked then), or a server to ask: libdw's search as is */
  if (debugfile || bits_len <= 0 || bits_len > 64) goto standard;
  bool debuginfod = debuginfod_configured();

  /* by build ID: DIR/.build-id/xx/rest.debug for each absolute DIR */
  char hex[2 * 64 + 1];
  for (int i = 0; i < bits_len; i++) snprintf(hex + 2 * i, 3, "%02x", bits[i]);
  char copy[] = DEBUG_PATH;
  char *rest = copy, *e;
  while ((e = strsep(&rest, ":")) != NULL) {
    if (*e == '+' || *e == '-') e++;
    if (*e != '/') continue;
    char name[256];
    snprintf(name, sizeof name, "%s/.build-id/%.2s/%s.debug", e, hex, hex + 2);
    if (file_exists(name)) {
      int fd = cached_debug(name, bits, bits_len, hex, debuginfo_file_name);
      if (fd >= 0) return fd;
      goto standard;
    }
  }
  if (debuginfod) goto standard;
  /* by debuglink, for the file's name and the name it links to */
  if (debuglink_candidate(file_name, debuglink_file)) goto standard;
  if (file_name) {
    char *canon = realpath(file_name, NULL);
    bool other = canon && strcmp(canon, file_name) != 0 && debuglink_candidate(canon, debuglink_file);
    free(canon);
    if (other) goto standard;
  }
  errno = 0;
  return -1;

standard:
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                      debuglink_crc, debuginfo_file_name);
}

report_ctx *report_ctx_new(void) {
  report_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->callbacks.find_elf = dwfl_linux_proc_find_elf;
  c->callbacks.find_debuginfo = find_debuginfo;
  c->callbacks.debuginfo_path = &c->debuginfo_path;
  c->dwfl = dwfl_begin(&c->callbacks);
  if (!c->dwfl) {
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  report_modules(c);
  return c;
}

/* ---- offline: another process's modules ---------------------------------- */

/* The load bias of the ELF file fd when the mapping [lo, ...) maps it from
 * file offset `offset`: the PT_LOAD that this mapping holds (preferring an
 * executable one) says which virtual address `offset` has.  False when the
 * file is not an ELF file or no segment fits. */
static int elf_bias(int fd, uint64_t lo, uint64_t hi, uint64_t offset, GElf_Addr *bias) {
  Elf *elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
  if (!elf) return 0;
  int found = 0;
  size_t phnum = 0;
  if (elf_kind(elf) == ELF_K_ELF && elf_getphdrnum(elf, &phnum) == 0) {
    for (int pass = 0; pass < 2 && !found; pass++) {
      for (size_t i = 0; i < phnum; i++) {
        GElf_Phdr mem, *ph = gelf_getphdr(elf, (int)i, &mem);
        if (!ph || ph->p_type != PT_LOAD) continue;
        if (pass == 0 && !(ph->p_flags & PF_X)) continue;
        /* the segment starts in this mapping's first page... */
        if (ph->p_offset < offset || ph->p_offset - offset >= hi - lo) continue;
        if (ph->p_offset - offset >= 0x10000) continue;
        *bias = (GElf_Addr)(lo + (ph->p_offset - offset) - ph->p_vaddr);
        found = 1;
        break;
      }
    }
    if (!found) {   /* ...or the mapping starts inside it */
      for (size_t i = 0; i < phnum && !found; i++) {
        GElf_Phdr mem, *ph = gelf_getphdr(elf, (int)i, &mem);
        if (!ph || ph->p_type != PT_LOAD) continue;
        if (offset < ph->p_offset || offset >= ph->p_offset + ph->p_filesz) continue;
        *bias = (GElf_Addr)(lo - (ph->p_vaddr + (offset - ph->p_offset)));
        found = 1;
      }
    }
  }
  elf_end(elf);
  return found;
}

/* path without a trailing " (deleted)", in buf. */
static const char *module_file(const char *path, char *buf, size_t len) {
  static const char deleted[] = " (deleted)";
  size_t n = strlen(path), d = sizeof deleted - 1;
  if (n > d && strcmp(path + n - d, deleted) == 0 && n - d < len) {
    memcpy(buf, path, n - d);
    buf[n - d] = '\0';
    return buf;
  }
  return path;
}

report_ctx *report_ctx_new_offline(const report_module *mods, size_t n) {
  report_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->offline = 1;
  c->callbacks.find_elf = dwfl_build_id_find_elf;
  c->callbacks.find_debuginfo = find_debuginfo;
  c->callbacks.section_address = dwfl_offline_section_address;
  c->callbacks.debuginfo_path = &c->debuginfo_path;
  c->dwfl = dwfl_begin(&c->callbacks);
  if (!c->dwfl) {
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  pthread_once(&demangler_load_once, demangler_load);
  elf_version(EV_CURRENT);
  c->mods = calloc(n ? n : 1, sizeof *c->mods);
  GElf_Addr *biases = calloc(n ? n : 1, sizeof *biases);
  dwfl_report_begin(c->dwfl);
  for (size_t i = 0; c->mods && biases && i < n; i++) {
    const report_module *m = &mods[i];
    if (!m->path || m->hi <= m->lo) continue;
    report_module *k = &c->mods[c->nmods];
    *k = *m;
    k->path = intern(c, m->path);
    if (!k->path) continue;
    c->nmods++;
    char buf[4096];
    const char *file = module_file(m->path, buf, sizeof buf);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    GElf_Addr bias = 0;
    int ok = elf_bias(fd, m->lo, m->hi, m->offset, &bias);
    close(fd);
    if (!ok) continue;
    /* one report per file and bias: several mappings of one module */
    int dup = 0;
    for (size_t j = 0; j + 1 < c->nmods && !dup; j++)
      dup = biases[j] == bias && strcmp(c->mods[j].path, k->path) == 0;
    biases[c->nmods - 1] = bias;
    if (dup) continue;
    /* a module overlapping one reported before (an address reused after a
     * dlclose) is refused by libdw: the first one keeps the range */
    (void)dwfl_report_elf(c->dwfl, k->path, file, -1, bias, true);
  }
  dwfl_report_end(c->dwfl, NULL, NULL);
  free(biases);
  return c;
}

/* Offline, for an address libdw has no module for: the module as given. */
static const report_module *given_module(const report_ctx *c, uintptr_t addr) {
  for (size_t i = 0; i < c->nmods; i++)
    if (addr >= c->mods[i].lo && addr < c->mods[i].hi) return &c->mods[i];
  return NULL;
}

void report_ctx_free(report_ctx *c) {
  if (!c) return;
  cu_tables_clear(c);
  dwfl_end(c->dwfl);
  free(c->mods);
  for (size_t i = 0; i < c->cache_cap; i++) free(c->cache[i].frames);
  free(c->cache);
  for (size_t i = 0; i < c->strs_cap; i++) free(c->strs[i]);
  free(c->strs);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ---- DWARF ---------------------------------------------------------------- */

/* The name of a subprogram or inlined subroutine: the linkage name when there
 * is one (C++, to demangle), else DW_AT_name; both through abstract origins. */
static const char *die_function_name(Dwarf_Die *die) {
  Dwarf_Attribute a;
  const char *n = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &a));
  if (!n) n = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &a));
  if (!n) n = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &a));
  return n;
}

static int die_udata(Dwarf_Die *die, unsigned int name, Dwarf_Word *out) {
  Dwarf_Attribute a;
  return dwarf_formudata(dwarf_attr(die, name, &a), out);
}

/* The call site of an inlined subroutine: file, line, column. */
static void die_call_site(Dwarf_Die *die, Dwarf_Die *fallback_cu,
                          const char **file, int *line, int *column) {
  Dwarf_Word v;
  *file = NULL;
  *line = die_udata(die, DW_AT_call_line, &v) == 0 ? (int)v : 0;
  *column = die_udata(die, DW_AT_call_column, &v) == 0 ? (int)v : 0;
  if (die_udata(die, DW_AT_call_file, &v) != 0) return;
  Dwarf_Die cu_mem, *cu = dwarf_diecu(die, &cu_mem, NULL, NULL);
  Dwarf_Files *files;
  size_t nfiles;
  if (!cu || dwarf_getsrcfiles(cu, &files, &nfiles) != 0) {
    cu = fallback_cu;
    if (!cu || dwarf_getsrcfiles(cu, &files, &nfiles) != 0) return;
  }
  if (v < nfiles) *file = dwarf_filesrc(files, v, NULL, NULL);
}

/* ---- the compilation unit of an address ----------------------------------
 *
 * libdw finds it with dwarf_getaranges, which reads every unit's header
 * once per module: in libc's debug file (2,063 units over 5.8 MB) the first
 * lookup took 12 ms and 8 MB of RSS, in every process that reported a
 * stack through __libc_start_main.  Each module's .debug_aranges (one
 * range list per unit, 99 KB for libc) names the unit's offset directly;
 * read here once per module into a sorted table (0.1 ms), it leaves libdw
 * only the units on the way to the one we need (dwarf_offdie).  Anything
 * this table does not answer (no .debug_aranges, another byte order, an
 * address outside every range) goes to libdw as before. */

typedef struct { Dwarf_Addr lo, hi; Dwarf_Off cu; } cu_range;

struct cu_table {
  Dwfl_Module *mod;
  Dwarf       *dw;
  Dwarf_Addr   bias;
  cu_range    *r;                /* sorted by lo; NULL: no table (libdw decides) */
  size_t       n;
};

static void cu_tables_clear(report_ctx *c) {
  for (size_t i = 0; i < c->ncus; i++) free(c->cus[i].r);
  free(c->cus);
  c->cus = NULL;
  c->ncus = 0;
}

static int range_cmp(const void *a, const void *b) {
  const cu_range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static uint64_t get_uint(const unsigned char *p, size_t size) {
  if (size == 8) { uint64_t v; memcpy(&v, p, 8); return v; }
  if (size == 4) { uint32_t v; memcpy(&v, p, 4); return v; }
  uint16_t v; memcpy(&v, p, 2); return v;
}

/* The ranges of .debug_aranges (DWARF 2-5 layout: per unit a header, then
 * (address, length) pairs aligned to twice the address size, ended by
 * (0, 0)), in the host's byte order only.  False: none usable. */
static bool read_aranges(Dwarf *dw, cu_range **out, size_t *nout) {
  Elf *elf = dwarf_getelf(dw);
  size_t shstr;
  if (!elf || elf_getshdrstrndx(elf, &shstr) != 0) return false;
  const char *ident = elf_getident(elf, NULL);
  const unsigned char host = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
  if (!ident || (unsigned char)ident[EI_DATA] != host) return false;
  Elf_Data *data = NULL;
  for (Elf_Scn *scn = NULL; (scn = elf_nextscn(elf, scn)) != NULL;) {
    GElf_Shdr sh;
    const char *name;
    if (!gelf_getshdr(scn, &sh) || !(name = elf_strptr(elf, shstr, sh.sh_name))) continue;
    if (strcmp(name, ".debug_aranges") != 0) continue;
    if ((sh.sh_flags & SHF_COMPRESSED) && elf_compress(scn, 0, 0) < 0) return false;
    data = elf_getdata(scn, NULL);
    break;
  }
  if (!data || !data->d_buf || data->d_size == 0) return false;
  const unsigned char *p = data->d_buf, *end = p + data->d_size;
  cu_range *r = NULL;
  size_t n = 0, cap = 0;
  while ((size_t)(end - p) >= 4) {
    const unsigned char *set = p;
    uint64_t len = get_uint(p, 4);
    size_t offsize = 4;
    p += 4;
    if (len == 0xffffffffu) {
      if ((size_t)(end - p) < 8) break;
      len = get_uint(p, 8);
      offsize = 8;
      p += 8;
    }
    if (len > (uint64_t)(end - p)) break;
    const unsigned char *next = p + len;
    if ((size_t)(next - p) < 2 + offsize + 2) break;
    uint16_t version = (uint16_t)get_uint(p, 2);
    uint64_t cu = get_uint(p + 2, offsize);
    uint8_t asize = p[2 + offsize], ssize = p[3 + offsize];
    p = next;
    if (version != 2 || ssize != 0 || (asize != 4 && asize != 8)) continue;
    size_t at = (offsize == 8 ? 12 : 4) + 2 + offsize + 2;   /* the header */
    at = (at + 2u * asize - 1) / (2u * asize) * (2u * asize);
    for (const unsigned char *q = set + at; q + 2u * asize <= next; q += 2u * asize) {
      uint64_t lo = get_uint(q, asize), l = get_uint(q + asize, asize);
      if (lo == 0 && l == 0) break;
      if (l == 0) continue;
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 1024;
        cu_range *g = realloc(r, ncap * sizeof *g);
        if (!g) { free(r); return false; }
        r = g;
        cap = ncap;
      }
      r[n++] = (cu_range){ lo, lo + l, cu };
    }
  }
  if (n == 0) { free(r); return false; }
  qsort(r, n, sizeof *r, range_cmp);
  *out = r;
  *nout = n;
  return true;
}

int report_cu_aranges = 1;

static struct cu_table *cu_table_of(report_ctx *c, Dwfl_Module *mod) {
  for (size_t i = 0; i < c->ncus; i++)
    if (c->cus[i].mod == mod) return &c->cus[i];
  struct cu_table *g = realloc(c->cus, (c->ncus + 1) * sizeof *g);
  if (!g) return NULL;
  c->cus = g;
  struct cu_table *t = &c->cus[c->ncus++];
  memset(t, 0, sizeof *t);
  t->mod = mod;
  t->dw = dwfl_module_getdwarf(mod, &t->bias);
  if (!report_cu_aranges || (t->dw && !read_aranges(t->dw, &t->r, &t->n))) t->r = NULL;
  return t;
}

/* The unit holding addr from the module's .debug_aranges, into *die. */
static bool cu_from_aranges(report_ctx *c, Dwfl_Module *mod, Dwarf_Addr addr, Dwarf_Die *die,
                            Dwarf_Addr *bias) {
  struct cu_table *t = cu_table_of(c, mod);
  if (!t || !t->r) return false;
  Dwarf_Addr a = addr - t->bias;
  size_t lo = 0, hi = t->n;                  /* the last range starting at or below a */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->r[mid].lo <= a) lo = mid + 1; else hi = mid;
  }
  if (lo == 0 || a >= t->r[lo - 1].hi) return false;
  Dwarf_Off off = t->r[lo - 1].cu, next;
  size_t hsize;
  if (dwarf_next_unit(t->dw, off, &next, &hsize, NULL, NULL, NULL, NULL, NULL, NULL) != 0) return false;
  if (!dwarf_offdie(t->dw, off + hsize, die) || dwarf_haspc(die, a) <= 0) return false;
  *bias = t->bias;
  return true;
}

/* The compilation unit holding addr, by libdw.  libdw before 0.191 finds
 * CUs through .debug_aranges only, which clang does not emit: scan the CUs
 * then. */
static Dwarf_Die *cu_of(Dwfl_Module *mod, Dwarf_Addr addr, Dwarf_Addr *bias) {
  Dwarf_Die *cu = dwfl_module_addrdie(mod, addr, bias);
  if (cu) return cu;
  Dwarf_Addr b = 0;
  for (cu = dwfl_module_nextcu(mod, NULL, &b); cu; cu = dwfl_module_nextcu(mod, cu, &b)) {
    if (dwarf_haspc(cu, addr - b) > 0) {
      *bias = b;
      return cu;
    }
  }
  return NULL;
}

/* Symbolizes addr (already adjusted) into fr[0..REPORT_MAX_INLINE); returns
 * the number of frames (>= 1) and the module's load start. */
static size_t lookup(report_ctx *c, uintptr_t addr, report_frame *fr, uintptr_t *start_out) {
  memset(fr, 0, sizeof *fr);
  *start_out = 0;
  Dwfl_Module *mod = module_of(c, addr);
  if (!mod) {
    const report_module *g = c->offline ? given_module(c, addr) : NULL;
    if (g) {   /* its file is gone or unreadable: the path and the offset */
      fr[0].module = g->path;
      *start_out = (uintptr_t)(g->lo - g->offset);   /* as if the file were mapped whole */
    }
    return 1;
  }

  Dwarf_Addr start = 0;
  const char *mname = dwfl_module_info(mod, NULL, &start, NULL, NULL, NULL, NULL, NULL);
  const char *module = intern(c, mname);
  *start_out = (uintptr_t)start;

  Dwarf_Addr bias = 0;
  Dwarf_Die cu_mem;
  bool from_aranges = cu_from_aranges(c, mod, addr, &cu_mem, &bias);
  Dwarf_Die *cu = from_aranges ? &cu_mem : cu_of(mod, addr, &bias);

  /* The innermost source location: the line table (of the unit when we
   * found it: dwfl_module_getsrc would look it up with libdw's aranges). */
  const char *file = NULL;
  int line = 0, column = 0;
  Dwarf_Line *l = NULL;
  Dwfl_Line *dl = from_aranges ? NULL : dwfl_module_getsrc(mod, addr);
  if (dl) {
    Dwarf_Addr lbias;
    l = dwfl_dwarf_line(dl, &lbias);
    if (!l) file = dwfl_lineinfo(dl, NULL, &line, &column, NULL, NULL);
  } else if (cu) {
    l = dwarf_getsrc_die(cu, addr - bias);
  }
  if (l) {
    file = dwarf_linesrc(l, NULL, NULL);
    if (dwarf_lineno(l, &line) != 0) line = 0;
    if (dwarf_linecol(l, &column) != 0) column = 0;
  }

  /* The chain of inlined subroutines up to the subprogram, innermost first;
   * each one's caller is at its DW_AT_call_file/line. */
  size_t n = 0;
  Dwarf_Die *scopes = NULL;
  int nscopes = cu ? dwarf_getscopes(cu, addr - bias, &scopes) : 0;
  if (nscopes > 0) {
    /* Past an inlined subroutine, dwarf_getscopes goes on with the scopes of
     * its abstract origin; the scopes that really contain the innermost one
     * (the callers) come from dwarf_getscopes_die, as eu-addr2line -i does. */
    Dwarf_Die inner = scopes[0];
    free(scopes);
    scopes = NULL;
    nscopes = dwarf_getscopes_die(&inner, &scopes);
  }
  for (int i = 0; i < nscopes && n < REPORT_MAX_INLINE; i++) {
    int tag = dwarf_tag(&scopes[i]);
    if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram &&
        tag != DW_TAG_entry_point)
      continue;
    report_frame *f = &fr[n++];
    memset(f, 0, sizeof *f);
    f->function = intern_function(c, die_function_name(&scopes[i]));
    int decl = 0;   /* through DW_AT_abstract_origin for an inlined one */
    f->decl_line = dwarf_decl_line(&scopes[i], &decl) == 0 && decl > 0 ? decl : 0;
    f->file = intern(c, file);
    f->line = line;
    f->column = column;
    f->module = module;
    if (tag != DW_TAG_inlined_subroutine) break;
    f->inlined = 1;
    die_call_site(&scopes[i], cu, &file, &line, &column);
  }
  free(scopes);

  if (n == 0) {   /* no DWARF scope: the symbol table and the line table */
    fr[0].file = intern(c, file);
    fr[0].line = line;
    fr[0].column = column;
    fr[0].module = module;
    n = 1;
  }
  report_frame *outer = &fr[n - 1];
  if (!outer->function && !outer->inlined)
    outer->function = intern_function(c, dwfl_module_addrname(mod, addr));
  return n;
}

static int symbolize(report_ctx *c, uintptr_t pc, uintptr_t key, report_frame *out, size_t max_out) {
  if (!c || !out || max_out == 0) return 0;
  report_frame tmp[REPORT_MAX_INLINE];
  const report_frame *frames;
  size_t n;
  uintptr_t start;
  pthread_mutex_lock(&c->mu);
  cache_entry *e = cache_find(c, key);
  if (e) {
    frames = e->frames;
    n = e->n;
    start = e->start;
  } else {
    n = lookup(c, key, tmp, &start);
    if (tmp[0].module) cache_put(c, key, start, tmp, n);   /* a miss may be a module loaded later */
    frames = tmp;
  }
  if (n > max_out) n = max_out;
  for (size_t i = 0; i < n; i++) {
    out[i] = frames[i];
    out[i].address = pc;
    out[i].module_offset = out[i].module ? pc - start : 0;
  }
  pthread_mutex_unlock(&c->mu);
  return (int)n;
}

int report_symbolize(report_ctx *c, uintptr_t pc, report_frame *out, size_t max_out) {
  return symbolize(c, pc, pc ? pc - 1 : 0, out, max_out);
}

int report_symbolize_exact(report_ctx *c, uintptr_t addr, report_frame *out, size_t max_out) {
  return symbolize(c, addr, addr, out, max_out);
}
