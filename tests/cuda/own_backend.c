/* own_backend.c - tagalloc's own CUDA backend under `tagalloc run`.
 *
 * Built with -DBACKEND (and rt.c, the stand-in static runtime, as the real
 * backend links cudart statically) into a shared object named
 * libtagalloc-gpu-cuda.so: own_backend_segment allocates device memory as
 * the backend does for its caching pool.  Built without, the program: it
 * loads that object from backend/ beside itself, has it allocate a segment
 * it keeps to exit (as a pool keeps its cache), frees another one through
 * it, and leaks one allocation of its own (its own static runtime).  Under
 * the preload only the program's own allocation is recorded (check.py):
 * the backend's memory is its pool's to record, on the program's ledger
 * (gpu.segment), and is not counted twice. */
#include "rt.h"

#include <stdio.h>

#define NOIPA __attribute__((noipa))

#ifdef BACKEND
__attribute__((visibility("default"))) int own_backend_segment(size_t n, CUdeviceptr *p) { return cudaMalloc(p, n); }
__attribute__((visibility("default"))) int own_backend_free(CUdeviceptr p) { return cudaFree(p); }
#else
#include <dlfcn.h>
#include <string.h>

NOIPA void leak_malloc(void) {
  CUdeviceptr p;
  if (cudaMalloc(&p, 1000) != 0) fprintf(stderr, "own_backend: cudaMalloc failed\n");   /* LEAKED */
}

int main(int argc, char **argv) {
  (void)argc;
  char path[4096];
  const char *slash = strrchr(argv[0], '/');
  snprintf(path, sizeof path, "%.*s/backend/libtagalloc-gpu-cuda.so", slash ? (int)(slash - argv[0]) : 1,
           slash ? argv[0] : ".");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "own_backend: %s\n", dlerror());
    return 1;
  }
  int (*segment)(size_t, CUdeviceptr *), (*release)(CUdeviceptr);
  *(void **)&segment = dlsym(h, "own_backend_segment");
  *(void **)&release = dlsym(h, "own_backend_free");
  CUdeviceptr kept, freed;
  if (segment == NULL || release == NULL || segment(2 << 20, &kept) != 0 || segment(20 << 20, &freed) != 0 ||
      release(freed) != 0) {
    fprintf(stderr, "own_backend: the backend's allocations failed\n");
    return 1;
  }
  leak_malloc();
  printf("own backend: a segment kept\n");
  return 0;
}
#endif
