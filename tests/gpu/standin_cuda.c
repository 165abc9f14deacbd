/* standin_cuda.c - a stand-in for libtagalloc-gpu-cuda.so, built by the
 * tests: exports gpu_cuda_backend as the real one does, and fails or
 * succeeds as STANDIN_MODE says, so the loader's every path is exercised on
 * a machine without CUDA:
 *   nodriver  returns NULL, the reason a CUDA runtime gives without a driver
 *   nodevice  a table whose init says there is no device
 *   abi       a table of another version
 *   ok        a table whose init succeeds (name "standin") */
#include "gpu.h"

#include <stdlib.h>
#include <string.h>

static const char *mode(void) {
  const char *m = getenv("STANDIN_MODE");
  return m ? m : "ok";
}

static gpu_status standin_init(int device) {
  (void)device;
  return strcmp(mode(), "nodevice") == 0 ? GPU_ENODEVICE : GPU_OK;
}

static const char *standin_last_error(void) {
  return strcmp(mode(), "nodevice") == 0 ? "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected"
                                         : "";
}

static gpu_backend table = { .abi = GPU_BACKEND_ABI, .name = "standin", .init = standin_init,
                             .last_error = standin_last_error };

const gpu_backend *gpu_cuda_backend(const char **why) {
  if (strcmp(mode(), "nodriver") == 0) {
    *why = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
    return NULL;
  }
  table.abi = strcmp(mode(), "abi") == 0 ? GPU_BACKEND_ABI + 1 : GPU_BACKEND_ABI;
  return &table;
}
