/* select.c - choosing the backend (TAGALLOC_GPU), loading the CUDA backend's
 * shared object, and the small helpers every backend shares (status names,
 * conv and pool geometry). */
#include "internal.h"

#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *gpu_status_name(gpu_status s) {
  switch (s) {
  case GPU_OK: return "GPU_OK";
  case GPU_ENOMEM: return "GPU_ENOMEM";
  case GPU_EINVAL: return "GPU_EINVAL";
  case GPU_ENOTREADY: return "GPU_ENOTREADY";
  case GPU_ENODRIVER: return "GPU_ENODRIVER";
  case GPU_ENODEVICE: return "GPU_ENODEVICE";
  case GPU_EBACKEND: return "GPU_EBACKEND";
  }
  return "?";
}

gpu_status gpu_conv2d_init(gpu_conv2d *p, int n, int c, int h, int w, int o, int kh, int kw, int stride, int pad) {
  if (p == NULL || n < 0 || c < 1 || h < 1 || w < 1 || o < 1 || kh < 1 || kw < 1 || stride < 1 || pad < 0 ||
      h + 2 * pad < kh || w + 2 * pad < kw)
    return GPU_EINVAL;
  *p = (gpu_conv2d){ .n = n, .c = c, .h = h, .w = w, .o = o, .kh = kh, .kw = kw, .stride = stride, .pad = pad };
  p->oh = (h + 2 * pad - kh) / stride + 1;
  p->ow = (w + 2 * pad - kw) / stride + 1;
  return GPU_OK;
}

gpu_status gpu_pool2d_init(gpu_pool2d *p, int n, int c, int h, int w, int k, int stride) {
  if (p == NULL || n < 0 || c < 1 || h < 1 || w < 1 || k < 1 || stride < 1 || h < k || w < k) return GPU_EINVAL;
  *p = (gpu_pool2d){ .n = n, .c = c, .h = h, .w = w, .k = k, .stride = stride };
  p->oh = (h - k) / stride + 1;
  p->ow = (w - k) / stride + 1;
  return GPU_OK;
}

bool _gpu_parse_size(const char *s, size_t *out) {
  char *end;
  if (s == NULL || !isdigit((unsigned char)*s)) return false;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K': shift = 10; end++; break;
  case 'M': shift = 20; end++; break;
  case 'G': shift = 30; end++; break;
  case 'T': shift = 40; end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != 0 || v > (ULLONG_MAX >> shift)) return false;
  *out = (size_t)(v << shift);
  return true;
}

/* ---- the CUDA backend's shared object ------------------------------------------------ */

/* dir of path (up to the last '/') + GPU_CUDA_LIB into buf; false if none. */
static bool beside(const char *path, char *buf, size_t len) {
  const char *slash = path ? strrchr(path, '/') : NULL;
  if (slash == NULL) return false;
  int n = snprintf(buf, len, "%.*s/%s", (int)(slash - path), path, GPU_CUDA_LIB);
  return n > 0 && (size_t)n < len;
}

static void *cuda_open(char *why, size_t why_len) {
  char path[PATH_MAX + 64], exe[PATH_MAX];
  const char *env = getenv("TAGALLOC_GPU_CUDA_LIB");
  if (env && *env) {
    void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) snprintf(why, why_len, "TAGALLOC_GPU_CUDA_LIB=%s: %s", env, dlerror());
    return h;
  }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    if (beside(exe, path, sizeof path) && access(path, F_OK) == 0) {
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h == NULL) snprintf(why, why_len, "%s: %s", path, dlerror());
      return h;
    }
  }
  Dl_info info;
  if (dladdr((void *)cuda_open, &info) && info.dli_fname && beside(info.dli_fname, path, sizeof path) &&
      access(path, F_OK) == 0) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) snprintf(why, why_len, "%s: %s", path, dlerror());
    return h;
  }
  void *h = dlopen(GPU_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) snprintf(why, why_len, "%s: not found beside the program, nor on the library path", GPU_CUDA_LIB);
  return h;
}

const gpu_backend *gpu_backend_cuda(gpu_status *status, char *why, size_t why_len) {
  gpu_status dummy;
  char scratch[8];
  if (status == NULL) status = &dummy;
  if (why == NULL || why_len == 0) {
    why = scratch;
    why_len = sizeof scratch;
  }
  why[0] = 0;
  *status = GPU_EBACKEND;   /* no shared object: no CUDA backend */
  void *h = cuda_open(why, why_len);
  if (h == NULL) return NULL;
  gpu_cuda_backend_fn *fn;
  *(void **)&fn = dlsym(h, GPU_CUDA_SYMBOL);
  if (fn == NULL) {
    snprintf(why, why_len, "%s: no symbol %s", GPU_CUDA_LIB, GPU_CUDA_SYMBOL);
    *status = GPU_EBACKEND;
    return NULL;   /* the handle stays open: dlclose of a CUDA library at run time is unsafe */
  }
  const char *reason = NULL;
  const gpu_backend *b = fn(&reason);
  if (b == NULL) {   /* it loads, but finds no runtime or driver it can use */
    *status = GPU_ENODRIVER;
    snprintf(why, why_len, "%s", reason ? reason : "the CUDA backend gave no reason");
    return NULL;
  }
  if (b->abi != GPU_BACKEND_ABI) {
    snprintf(why, why_len, "%s: backend table version %d, this program wants %d (rebuild both)", GPU_CUDA_LIB,
             b->abi, GPU_BACKEND_ABI);
    *status = GPU_EBACKEND;
    return NULL;
  }
  gpu_status st = b->init(0);
  if (st != GPU_OK) {
    snprintf(why, why_len, "%s", b->last_error ? b->last_error() : gpu_status_name(st));
    *status = st;
    return NULL;
  }
  *status = GPU_OK;
  return b;
}

const gpu_backend *gpu_backend_select(const char *word, char *why, size_t why_len, char *note, size_t note_len) {
  char scratch[8];
  if (why == NULL || why_len == 0) {
    why = scratch;
    why_len = sizeof scratch;
  }
  why[0] = 0;
  if (note && note_len) note[0] = 0;
  if (word == NULL || *word == 0) word = "auto";
  bool want_cuda = strcmp(word, "cuda") == 0, automatic = strcmp(word, "auto") == 0;
  if (strcmp(word, "host") == 0 || want_cuda || automatic) {
    if (!strcmp(word, "host")) goto host;
    gpu_status st;
    char cwhy[512];
    const gpu_backend *b = gpu_backend_cuda(&st, cwhy, sizeof cwhy);
    if (b) return b;
    if (want_cuda) {
      snprintf(why, why_len, "TAGALLOC_GPU=cuda: the CUDA backend cannot run: %s", cwhy);
      return NULL;
    }
    /* the real backend's reason already says "no usable CUDA driver (...)"
     * or "no CUDA device (...)": not said twice */
    if (note && note_len && (strncmp(cwhy, "no usable CUDA", 14) == 0 || strncmp(cwhy, "no CUDA device", 14) == 0))
      snprintf(note, note_len, "tagalloc: gpu: %s: using the host backend", cwhy);
    else if (note && note_len)
      snprintf(note, note_len, "tagalloc: gpu: %s (%s): using the host backend",
               st == GPU_ENODRIVER || st == GPU_ENODEVICE ? "no usable CUDA driver or device" : "no CUDA backend",
               cwhy);
  host:;
    const gpu_backend *h = gpu_backend_host();
    gpu_status hs = h->init(0);
    if (hs != GPU_OK) {
      snprintf(why, why_len, "the host backend cannot start: %s", h->last_error());
      return NULL;
    }
    return h;
  }
  snprintf(why, why_len, "TAGALLOC_GPU=%s: not cuda, host or auto", word);
  return NULL;
}

static const gpu_backend *selected;
static pthread_once_t select_once = PTHREAD_ONCE_INIT;

static void select_now(void) {
  char why[640], note[640];
  const char *word = getenv("TAGALLOC_GPU");
  selected = gpu_backend_select(word, why, sizeof why, note, sizeof note);
  if (selected == NULL && word && strcmp(word, "cuda") && strcmp(word, "host") && strcmp(word, "auto") && *word) {
    /* A word we do not know: say so, and go on as auto does. */
    fprintf(stderr, "tagalloc: gpu: %s; using auto\n", why);
    selected = gpu_backend_select("auto", why, sizeof why, note, sizeof note);
  }
  if (note[0]) fprintf(stderr, "%s\n", note);
  if (selected == NULL) fprintf(stderr, "tagalloc: gpu: %s\n", why);
}

const gpu_backend *gpu_backend_get(void) {
  pthread_once(&select_once, select_now);
  return selected;
}
