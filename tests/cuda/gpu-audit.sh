#!/bin/bash
# The real-GPU check of `tagalloc run` on CUDA programs (make gpu-check
# calls it; make test checks the same paths against a stand-in driver, see
# run.sh).  Builds tests/cuda/gpu_leaks.cu with nvcc twice, against the
# static runtime (nvcc's default) and the shared one (-cudart shared), and
# checks each (gpu_check.py): the program declares the one block of each
# kind it leaks; `tagalloc run --json` must report exactly those as
# gpu.leak (bytes, tag, the leaking function on top), at exit and, after
# cudaDeviceReset, at context teardown; `compute-sanitizer --leak-check
# full` is the oracle: every leak it reports must be one of them.
#
#   tests/cuda/gpu-audit.sh BUILD_DIR
#
# Exit status: 0 passed, 1 failed, 77 skipped (no nvcc, no GPU, no
# compute-sanitizer: one SKIP line says which).  Takes about a minute.
set -u
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
out=$build/cuda-gpu
mkdir -p "$out"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "SKIP gpu-audit: no nvcc (set NVCC, or put the CUDA Toolkit's bin on PATH)"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP gpu-audit: no GPU (nvidia-smi -L failed)"; exit 77; }
cudadir=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
sanitizer=$(command -v compute-sanitizer || echo "$cudadir/bin/compute-sanitizer")
[ -x "$sanitizer" ] || { echo "SKIP gpu-audit: no compute-sanitizer (the oracle)"; exit 77; }
[ -x "$build/tagalloc" ] && [ -f "$build/libtagalloc-cuda.so" ] ||
  { echo "FAIL gpu-audit: $build/tagalloc or $build/libtagalloc-cuda.so is missing (make first)"; exit 1; }
flags="-g -O1 -lineinfo -Xcompiler -fno-omit-frame-pointer"
"$nvcc" $flags -o "$out/gpu_leaks_static" "$here/gpu_leaks.cu" ||
  { echo "FAIL gpu-audit: nvcc (static cudart)"; exit 1; }
"$nvcc" $flags -cudart shared -Xlinker -rpath -Xlinker "$cudadir/lib64" \
  -o "$out/gpu_leaks_shared" "$here/gpu_leaks.cu" || { echo "FAIL gpu-audit: nvcc (shared cudart)"; exit 1; }
py=$(command -v python3)
exec "$py" "$here/gpu_check.py" "$build" "$sanitizer" "$out/gpu_leaks_static" "$out/gpu_leaks_shared"
