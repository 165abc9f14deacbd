#!/bin/bash
# The CUDA backend's tests that belong in `make test` (any machine); ends
# with one line "gpu-cuda: N passed, N failed".
#   run.sh BUILD cuda     the backend was built: test_cuda_load checks that
#                         init says what the driver says (no driver here:
#                         "no usable CUDA driver")
#   run.sh BUILD nocuda   no nvcc: only the comparison's self-test
# The comparison with the host backend on a GPU is gpu/cuda/gpu-check.sh's.
BUILD=${1:-build}
. "$(dirname "$0")/../../lib.sh"
# The comparison's self-test (it takes an argument: a check, its output
# shown when it fails).
self_test() {
  local log rc
  log=$(mktemp)
  "$BUILD/tests/gpu/cuda/test_cuda_compare" --self-test >"$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || tail -n 40 "$log" | sed 's/^/    /'
  rm -f "$log"
  return $rc
}
check "$BUILD/tests/gpu/cuda/test_cuda_compare --self-test" self_test
if [ "${2:-cuda}" = cuda ]; then
  export TAGALLOC_GPU_CUDA_LIB=$BUILD/libtagalloc-gpu-cuda.so
  run_program "$BUILD/tests/gpu/cuda/test_cuda_load"
  # The comparison through gpu/'s loader: on a GPU it runs and must pass;
  # without a driver (test_cuda_load checked that init says so) the loader
  # must give exactly that reason, and the comparison is a SKIP, said so.
  compare() {
    local out rc
    out=$("$BUILD/tests/gpu/cuda/test_cuda_compare" 2>&1)
    rc=$?
    if [ $rc -eq 77 ]; then
      echo "SKIP cuda vs host comparison: ${out#SKIP: }"
      [[ $out == "SKIP: the CUDA backend cannot run here: no usable CUDA driver (cudaErrorInsufficientDriver"* ||
         $out == "SKIP: the CUDA backend cannot run here: no CUDA device"* ]] && return 0
    fi
    [ $rc -eq 0 ] && return 0
    echo "$out" | tail -n 40 | sed 's/^/    /'
    return 1
  }
  check "$BUILD/tests/gpu/cuda/test_cuda_compare via gpu/'s loader (compares on a GPU, else names why not)" compare
  # auto without a driver: one line, the backend's reason said once
  auto_line() {
    local out
    out=$(TAGALLOC_GPU=auto "$BUILD/train-charlm" --device auto --iters 1 --every 1 --val-batches 1 2>&1 >/dev/null |
          grep '^tagalloc: gpu:')
    if [ -z "$out" ]; then return 0; fi           # a GPU: no line
    [[ $out == "tagalloc: gpu: no usable CUDA driver (cudaErrorInsufficientDriver"*"): using the host backend" ||
       $out == "tagalloc: gpu: no CUDA device ("*"): using the host backend" ||
       $out == "tagalloc: gpu: no usable CUDA driver or device ("*"): using the host backend" ]] &&
      [[ $out != *"device (no usable"* && $out != *"device (no CUDA device"* ]] && return 0
    echo "    $out"
    return 1
  }
  [ -x "$BUILD/train-charlm" ] && [ -d /usr/share/games/fortunes ] &&
    check "TAGALLOC_GPU=auto without a driver: one line naming the reason once" auto_line
else
  echo "SKIP test_cuda_load: no nvcc (/usr/local/cuda/bin/nvcc, or on PATH): the CUDA backend is not built"
fi
finish gpu-cuda
