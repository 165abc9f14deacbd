#!/bin/bash
# audit_cost.sh - the audit's cost on a CUDA program (make bench-gpu,
# make gpu-check): bench/gpu/audit_load.cu (many cudaMalloc/cudaFree and
# kernel launches, nothing left allocated), built with nvcc (the static
# runtime, nvcc's default), run bare and under `BUILD/tagalloc run`, each
# RUNS times in turn; prints the medians of the wall times and their ratio.
#
#   bench/gpu/audit_cost.sh [BUILD] [RUNS] [ITERS]   (defaults build 5 5000)
#
# Exit status: 0 measured, and tagalloc run found nothing (exit 0); 1 a run
# failed or tagalloc is not built; 77 SKIP with the reason (no nvcc, no GPU).
set -u
BUILD=${1:-build}
RUNS=${2:-5}
ITERS=${3:-5000}
here=$(cd "$(dirname "$0")" && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "SKIP audit-cost: no nvcc (set NVCC, or put the CUDA Toolkit's bin on PATH)"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP audit-cost: no GPU (nvidia-smi -L failed)"; exit 77; }
[ -x "$BUILD/tagalloc" ] && [ -f "$BUILD/libtagalloc-cuda.so" ] ||
  { echo "FAIL audit-cost: $BUILD/tagalloc or $BUILD/libtagalloc-cuda.so is missing (make first)"; exit 1; }
prog=$BUILD/bench-gpu-audit-load
if [ ! -x "$prog" ] || [ "$here/audit_load.cu" -nt "$prog" ]; then
  "$nvcc" -O2 -g -Xcompiler -fno-omit-frame-pointer -o "$prog" "$here/audit_load.cu" ||
    { echo "FAIL audit-cost: nvcc $here/audit_load.cu"; exit 1; }
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timed() {   # timed CMD...: the wall time in seconds on stdout; fails with the program
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  if [ $rc -eq 77 ]; then
    grep -m1 '^SKIP' "$out" >&2
    exit 77
  elif [ $rc -ne 0 ]; then
    tail -n 20 "$out" >&2
    echo "FAIL audit-cost: $* exited with status $rc" >&2
    exit 1
  fi
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
timed "$prog" --iters 100 >/dev/null   # warm-up: the driver's first start
bare=()
audited=()
for ((r = 0; r < RUNS; r++)); do
  t=$(timed "$prog" --iters "$ITERS") || exit
  bare+=("$t")
  t=$(timed "$BUILD/tagalloc" run -- "$prog" --iters "$ITERS") || exit
  audited+=("$t")
done
mb=$(printf '%s\n' "${bare[@]}" | median)
ma=$(printf '%s\n' "${audited[@]}" | median)
echo "audit-cost: $prog --iters $ITERS ($((3 * ITERS + 1)) cudaMalloc/cudaFree pairs, $((3 * ITERS)) launches)"
echo "  bare:               median $(printf '%.3f' "$mb") s  (runs: ${bare[*]/%/ s})"
echo "  under tagalloc run: median $(printf '%.3f' "$ma") s  (runs: ${audited[*]/%/ s})"
awk -v a="$ma" -v b="$mb" 'BEGIN { printf "  ratio audited / bare: %.2fx\n", a / b }'
