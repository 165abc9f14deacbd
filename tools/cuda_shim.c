/* cuda_shim.c - libtagalloc-cuda.so: what the preload hands a CUDA runtime
 * that dlopens libcuda.so.1 (tools/preload_cuda.c).
 *
 * It has no code: its dependencies are libtagalloc-preload.so, then
 * libcuda.so.1, in that order.  dlsym on its handle searches it, then
 * them: cuGetProcAddress(_v2) and the memory functions the preload wraps
 * are found in the preload, every other driver symbol in the driver. */
const char tagalloc_cuda_shim[] = "tagalloc: the CUDA driver, audited";
