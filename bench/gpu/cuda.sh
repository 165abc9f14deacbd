#!/bin/bash
# cuda.sh - make bench-gpu's CUDA measurements, after build/bench-gpu
# (bench/gpu/README.md says what each number is):
#   cuda-alloc  BUILD/bench-gpu-cuda-alloc: cudaMalloc and cudaMallocAsync
#               pairs, to set beside bench-gpu's pool column (built where
#               nvcc is found)
#   vs-torch    bench/gpu/vs_torch.py: LeNet-5 images/s, train-lenet
#               --device cuda against PyTorch CUDA (PYTHON, default python3)
#   audit-cost  bench/gpu/audit_cost.sh: a CUDA program bare and under
#               tagalloc run
#
#   bench/gpu/cuda.sh [BUILD]
#
# Each ends PASS, FAIL or SKIP with the reason (a measurement that cannot run
# here is never counted as done); with OUT set, each one's output goes to
# $OUT/bench-gpu-NAME.txt.  Exit status: 1 when one failed (vs-torch fails
# below the 1x target), else 0.
set -u
BUILD=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
failed=0
step() {   # step NAME CMD...
  local name=$1 log rc
  shift
  log=$(mktemp)
  echo "---- $name: $*"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$log" "$OUT/bench-gpu-$name.txt"; fi
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name"
  elif [ "$rc" -eq 77 ]; then
    echo "SKIP $name: $(grep -m1 '^SKIP' "$log" | sed 's/^SKIP[^:]*: *//')"
  else
    echo "FAIL $name: exit $rc"
    failed=1
  fi
  rm -f "$log"
}
if [ -x "$BUILD/bench-gpu-cuda-alloc" ]; then
  step cuda-alloc "$BUILD/bench-gpu-cuda-alloc"
else
  echo "SKIP cuda-alloc: no $BUILD/bench-gpu-cuda-alloc (built with nvcc, which this machine lacks)"
fi
step vs-torch "${PYTHON:-python3}" "$here/vs_torch.py" --build "$BUILD" ${BENCH_GPU_DATA:+--data "$BENCH_GPU_DATA"}
step audit-cost "$here/audit_cost.sh" "$BUILD"
exit $failed
