/* test_cuda_load.c - libtagalloc-gpu-cuda.so loads everywhere, and its init
 * tells the truth about the machine:
 *   - the object loads (dlopen) with no driver, exports gpu_cuda_backend,
 *     and its table is complete (abi, name, every entry set);
 *   - before init, entries refuse (GPU_EINVAL, "before init"), and a bad
 *     argument is GPU_EINVAL before anything else;
 *   - init(0) gives what the driver itself says, asked directly through
 *     libcuda.so.1 (the oracle, independent of the CUDA runtime): no
 *     libcuda.so.1 -> GPU_ENODRIVER and "no usable CUDA driver
 *     (cudaErrorInsufficientDriver ...)"; cuInit failing with
 *     CUDA_ERROR_NO_DEVICE or a count of 0 -> GPU_ENODEVICE; a device ->
 *     GPU_OK, its name, and a round trip through device memory and a kernel,
 *     from this thread and from a second one.
 *
 *   test_cuda_load [--require-device] [LIB]
 *       LIB: the object (default: $TAGALLOC_GPU_CUDA_LIB, else
 *       build/libtagalloc-gpu-cuda.so); --require-device (gpu-check, on a
 *       machine whose nvidia-smi shows a card): init must succeed, whatever
 *       the oracle says */
#include "cuda_test.h"
#include "gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The status's name; the test links nothing of the project's (gpu/ too
 * would pull the ledger's libraries in), so it names them itself. */
static const char *status_str(gpu_status s) {
  static const char *names[] = { "GPU_OK", "GPU_ENOMEM", "GPU_EINVAL", "GPU_ENOTREADY",
                                 "GPU_ENODRIVER", "GPU_ENODEVICE", "GPU_EBACKEND" };
  return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

/* What the driver says, asked without the CUDA runtime. */
typedef enum { DRV_NONE, DRV_NO_DEVICE, DRV_BROKEN, DRV_DEVICE } driver_state;

static driver_state driver_oracle(char *why, size_t len) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cu == NULL) {
    snprintf(why, len, "libcuda.so.1 does not load: %s", dlerror());
    return DRV_NONE;
  }
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(cu, "cuInit");
  int (*cu_count)(int *) = (int (*)(int *))dlsym(cu, "cuDeviceGetCount");
  if (cu_init == NULL || cu_count == NULL) {
    snprintf(why, len, "libcuda.so.1 lacks cuInit or cuDeviceGetCount");
    return DRV_BROKEN;
  }
  int r = cu_init(0), n = 0;
  if (r == 100) {   /* CUDA_ERROR_NO_DEVICE */
    snprintf(why, len, "cuInit: CUDA_ERROR_NO_DEVICE");
    return DRV_NO_DEVICE;
  }
  if (r != 0) {
    snprintf(why, len, "cuInit failed with CUresult %d", r);
    return DRV_BROKEN;
  }
  r = cu_count(&n);
  snprintf(why, len, "cuDeviceGetCount: %d (CUresult %d)", n, r);
  return r != 0 ? DRV_BROKEN : n > 0 ? DRV_DEVICE : DRV_NO_DEVICE;
}

static const gpu_backend *load(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
  if (h == NULL) return NULL;
  gpu_cuda_backend_fn *get = (gpu_cuda_backend_fn *)dlsym(h, GPU_CUDA_SYMBOL);
  CHECK(get != NULL, "%s does not export %s", path, GPU_CUDA_SYMBOL);
  if (get == NULL) return NULL;
  /* exactly one symbol of the object's own: the runtime's stay local */
  CHECK(dlsym(h, "cudaMalloc") == NULL || dlsym(RTLD_DEFAULT, "cudaMalloc") == dlsym(h, "cudaMalloc"),
        "%s exports cudaMalloc (the static runtime is not local)", path);
  const char *why = "unset";
  const gpu_backend *b = get(&why);
  CHECK(b != NULL, "gpu_cuda_backend returned NULL: %s", why ? why : "(no reason)");
  CHECK(why == NULL, "gpu_cuda_backend set why to \"%s\" with a table", why ? why : "");
  return b;
}

static void test_table(const gpu_backend *b) {
  CHECK(b->abi == GPU_BACKEND_ABI, "abi %d, want %d", b->abi, GPU_BACKEND_ABI);
  CHECK(b->name && strcmp(b->name, "cuda") == 0, "name \"%s\", want \"cuda\"", b->name ? b->name : "(null)");
  /* every entry after the name: function pointers, each one set */
  size_t first = offsetof(gpu_backend, init), n = (sizeof *b - first) / sizeof(void (*)(void));
  CHECK(n >= 60, "the table has %zu entries, want the 60 or more of gpu.h", n);
  for (size_t i = 0; i < n; i++) {
    void (*fp)(void);
    memcpy(&fp, (const char *)b + first + i * sizeof fp, sizeof fp);
    CHECK(fp != NULL, "entry %zu of the table (after init) is NULL", i);
  }
  test_end("table_complete");
}

static void test_before_init(const gpu_backend *b) {
  void *p = (void *)1;
  CHECK(b->alloc(&p, 4096) == GPU_EINVAL, "alloc before init: not GPU_EINVAL");
  CHECK(p == NULL, "alloc before init left *ptr %p, want NULL", p);
  CHECK(strstr(b->last_error(), "before init") != NULL, "alloc before init says \"%s\"", b->last_error());
  /* the argument check comes first: a negative count is named */
  CHECK(b->fill(NULL, 0.0f, -1, NULL) == GPU_EINVAL, "fill of -1 elements: not GPU_EINVAL");
  CHECK(strcmp(b->last_error(), "cuda fill: n -1: want >= 0") == 0, "fill of -1 elements says \"%s\"",
        b->last_error());
  CHECK(b->fill(NULL, 0.0f, 0, NULL) == GPU_OK, "fill of 0 elements: not GPU_OK");
  test_end("entries_before_init");
}

/* Another thread's calls: it starts with no current device of its own. */
static void *other_thread(void *arg) {
  const gpu_backend *b = arg;
  static float back[256];
  void *d = NULL;
  int ok = b->alloc(&d, sizeof back) == GPU_OK && b->fill(d, 2.5f, 256, NULL) == GPU_OK &&
           b->memcpy_d2h(back, d, sizeof back, NULL) == GPU_OK && b->stream_synchronize(NULL) == GPU_OK &&
           b->free(d) == GPU_OK;
  if (!ok) printf("the second thread: %s\n", b->last_error());   /* its own, thread-local */
  for (int i = 0; ok && i < 256; i++) ok = back[i] == 2.5f;
  return ok ? (void *)1 : NULL;
}

/* A device: memory, copies, a kernel, an event, the name. */
static void test_device(const gpu_backend *b) {
  const char *name = b->device_name();
  CHECK(name && name[0] && strstr(name, "not initialised") == NULL, "device name \"%s\"", name ? name : "(null)");
  CHECK(b->ledger_device() == 0, "ledger device %d, want 0", b->ledger_device());
  size_t fr = 0, tot = 0;
  CHECK(b->mem_get_info(&fr, &tot) == GPU_OK && tot > 0 && fr <= tot, "mem_get_info: %s (free %zu, total %zu)",
        b->last_error(), fr, tot);
  float host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (float)(i - 500);
  void *d = NULL;
  gpu_event e = NULL;
  CHECK(b->alloc(&d, sizeof host) == GPU_OK && d != NULL, "alloc: %s", b->last_error());
  CHECK(b->event_create(&e) == GPU_OK, "event_create: %s", b->last_error());
  if (d && e) {
    CHECK(b->memcpy_h2d(d, host, sizeof host, NULL) == GPU_OK, "h2d: %s", b->last_error());
    CHECK(b->relu(d, d, 1000, NULL) == GPU_OK, "relu: %s", b->last_error());
    CHECK(b->memcpy_d2h(back, d, sizeof back, NULL) == GPU_OK, "d2h: %s", b->last_error());
    CHECK(b->event_record(e, NULL) == GPU_OK, "event_record: %s", b->last_error());
    CHECK(b->event_synchronize(e) == GPU_OK, "event_synchronize: %s", b->last_error());
    CHECK(b->event_query(e) == GPU_OK, "event_query after its work completed: %s", b->last_error());
    int bad = 0;
    for (int i = 0; i < 1000; i++) bad += back[i] != (i > 500 ? (float)(i - 500) : 0.0f);
    CHECK(bad == 0, "relu on the device: %d of 1000 values wrong", bad);
  }
  if (e) CHECK(b->event_destroy(e) == GPU_OK, "event_destroy: %s", b->last_error());
  if (d) CHECK(b->free(d) == GPU_OK, "free: %s", b->last_error());
  /* more than the card has: GPU_ENOMEM, and the backend goes on */
  void *huge = NULL;
  CHECK(b->alloc(&huge, (size_t)1 << 50) == GPU_ENOMEM, "alloc of 1 PiB: not GPU_ENOMEM (%s)", b->last_error());
  CHECK(b->alloc(&d, 256) == GPU_OK && b->free(d) == GPU_OK, "alloc after an ENOMEM: %s", b->last_error());
  pthread_t t;
  void *ok = NULL;
  CHECK(pthread_create(&t, NULL, other_thread, (void *)b) == 0 && pthread_join(t, &ok) == 0 && ok != NULL,
        "a second thread's alloc, fill, copy and free failed, or its values are wrong");
  test_end("device_round_trip");
}

int main(int argc, char **argv) {
  bool require = argc > 1 && strcmp(argv[1], "--require-device") == 0;
  if (require) argc--, argv++;
  const char *path = argc > 1 ? argv[1] : getenv("TAGALLOC_GPU_CUDA_LIB");
  if (path == NULL || path[0] == '\0') path = "build/" GPU_CUDA_LIB;
  setvbuf(stdout, NULL, _IOLBF, 0);
  const gpu_backend *b = load(path);
  test_end("load_without_init");
  if (b == NULL) return tests_finish();
  test_table(b);
  test_before_init(b);

  char why[256];
  driver_state drv = driver_oracle(why, sizeof why);
  printf("driver: %s\n", why);
  gpu_status st = b->init(0);
  const char *msg = b->last_error();
  printf("init(0): %s%s%s\n", status_str(st), st ? ": " : "", st ? msg : "");
  switch (drv) {
  case DRV_NONE:
    CHECK(st == GPU_ENODRIVER, "no libcuda.so.1: init is %s, want GPU_ENODRIVER", status_str(st));
    CHECK(strncmp(msg, "no usable CUDA driver (cudaErrorInsufficientDriver", 50) == 0,
          "no libcuda.so.1: init says \"%s\"", msg);
    break;
  case DRV_NO_DEVICE:
    CHECK(st == GPU_ENODEVICE, "a driver, no device: init is %s, want GPU_ENODEVICE", status_str(st));
    break;
  case DRV_BROKEN:
    CHECK(st == GPU_ENODRIVER || st == GPU_ENODEVICE || st == GPU_EBACKEND,
          "a driver that fails (%s): init is %s, want a failure", why, status_str(st));
    break;
  case DRV_DEVICE:
    CHECK(st == GPU_OK, "a device: init is %s (%s), want GPU_OK", status_str(st), msg);
    break;
  }
  if (require) CHECK(st == GPU_OK, "--require-device: init is %s (%s), want GPU_OK", status_str(st), msg);
  /* a failed init changes nothing: the next call says the same */
  if (st != GPU_OK) CHECK(b->init(0) == st, "a second init differs from the first");
  test_end("init_matches_the_driver");
  if (st == GPU_OK) {
    CHECK(b->init(0) == GPU_OK, "a second init after success: %s", b->last_error());
    test_device(b);
    b->shutdown();
  }
  return tests_finish();
}
