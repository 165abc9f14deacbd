#!/bin/bash
# Runs the CUDA backend's tests that belong in `make test` (any machine);
# ends with one line "gpu-cuda: N passed, N failed".  The comparison with
# the host backend needs a GPU: gpu/cuda/gpu-check.sh runs it.
BUILD=${1:-build}
. "$(dirname "$0")/../../lib.sh"
export TAGALLOC_GPU_CUDA_LIB=$BUILD/libtagalloc-gpu-cuda.so
run_program "$BUILD/tests/gpu/cuda/test_cuda_load"
finish gpu-cuda
