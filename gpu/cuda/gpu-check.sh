#!/bin/bash
# gpu-check.sh - the checks that need a GPU, in one run of a few minutes
# (`make gpu-check`).  For a machine with an NVIDIA GPU, its driver,
# compute-sanitizer and PyTorch, which may lack this project's Debian
# packages: it runs from a build made elsewhere and carried there.
#
#   gpu/cuda/gpu-check.sh [BUILD]     BUILD: the build folder (default build)
#   gpu/cuda/gpu-check.sh --bundle BUILD FILE...
#                                     (make gpu-bundle) copies the shared
#                                     libraries FILEs need, but glibc's, into
#                                     BUILD/gpu-libs, to be carried with them
#
# What it runs, each under a time limit, each ending PASS, FAIL or SKIP
# with the reason (a check that cannot run is never counted as passed):
#   card          nvidia-smi: the card, its driver and memory
#   load          test_cuda_load --require-device: the CUDA backend's object
#                 opens device 0, and a round trip through it works
#   compare       test_cuda_compare: every kernel of the CUDA backend against
#                 the host backend, value by value (tolerances in its header)
#   memcheck      test_cuda_compare under compute-sanitizer memcheck
#                 (--leak-check full)
#   bench-gpu     build/bench-gpu (make bench-gpu's program) with TAGALLOC_GPU=cuda,
#                 where this checkout has it; its output also in
#                 $OUT/gpu-check-bench.txt
#   cuda-alloc    build/bench-gpu-cuda-alloc (bench/gpu/cuda_alloc.cu, built
#                 here with nvcc if missing): cudaMalloc and cudaMallocAsync
#                 alloc+free pairs, beside bench-gpu's pool column
#   train-lenet   build/train-lenet --device cuda, 3 epochs on Fashion-MNIST
#                 (GPU_CHECK_DATA=DIR, default the Debian package's folder):
#                 at least 86% test accuracy
#   train-charlm  build/train-charlm --device cuda, 500 iterations on README.md:
#                 it runs, and the ledger finds nothing (its exit status)
#   gpu-audit     tests/cuda/gpu-audit.sh, where the checkout has it:
#                 tagalloc run on CUDA programs built with the static and the
#                 shared runtime, each leaking one block of each kind
#                 (compute-sanitizer is the oracle)
#   vs-torch      bench/gpu/vs_torch.py: LeNet-5 training images/s of
#                 train-lenet --device cuda against PyTorch CUDA (python3);
#                 fails below the 1x target
#   audit-cost    bench/gpu/audit_cost.sh: a CUDA program with many
#                 cudaMalloc/cudaFree and launches, bare and under tagalloc run
#                 (the last three's output also in $OUT/gpu-check-NAME.txt)
#   racecheck, synccheck, initcheck
#                 test_cuda_compare under compute-sanitizer's other tools
#   more checks   every executable tests/*/gpu-check-*.sh the checkout has
#                 (other parts' checks that need a GPU), given BUILD
# The summary (one line per check) goes to stdout and, when OUT is set, to
# $OUT/gpu-check-summary.txt, with the whole log in $OUT/gpu-check.log.
#
# Libraries: a program whose shared libraries are missing here (jemalloc,
# OpenBLAS, libdw ... on a machine without the project's packages) gets
# them from BUILD/gpu-libs, which `make gpu-bundle` fills on the build
# machine: only the missing ones are taken from there.  cuBLAS is the
# toolkit's (/usr/local/cuda/lib64) or, failing that, PyTorch's
# (site-packages/nvidia/cu*/lib or nvidia/cublas/lib).
#
# Exit status: 0 when nothing failed and something passed; 1 when a check
# failed; 2 when nothing could run (every check a SKIP).
set -u
if [ "${1:-}" = --bundle ]; then
  BUILD=$2
  shift 2
  mkdir -p "$BUILD/gpu-libs"
  ldd "$@" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | libresolv.so.* | libutil.so.*) ;;
    *) cp -L "$lib" "$BUILD/gpu-libs/" ;;
    esac
  done
  echo "gpu-bundle: $(ls "$BUILD/gpu-libs" | wc -l) libraries in $BUILD/gpu-libs ($(du -sh "$BUILD/gpu-libs" | cut -f1));" \
    "carry them with $*"
  exit 0
fi
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
LIMIT=${GPU_CHECK_LIMIT:-150}                        # seconds per check at most
END=$(($(date +%s) + ${GPU_CHECK_BUDGET:-540}))      # and all of them within 9 minutes
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOG=$WORK/gpu-check.log
SUMMARY=$WORK/gpu-check-summary.txt
: >"$LOG"
: >"$SUMMARY"
passed=0
failed=0
skipped=0

say() { echo "$*" | tee -a "$LOG"; }
result() {   # result PASS|FAIL|SKIP NAME [REASON]
  local line="$1 $2${3:+: $3}"
  say "$line"
  echo "$line" >>"$SUMMARY"
  case $1 in
  PASS) passed=$((passed + 1)) ;;
  FAIL) failed=$((failed + 1)) ;;
  *) skipped=$((skipped + 1)) ;;
  esac
}
# run NAME CMD...: runs CMD under the time limit, its output in the log (and
# its tail on screen when it fails); exit 77 is a SKIP, its "SKIP:" line the
# reason.
run() {
  local name=$1 out rc t0 t1 limit
  shift
  out=$WORK/$name.out
  t0=$(date +%s)
  limit=$((END - t0))
  [ $limit -gt "$LIMIT" ] && limit=$LIMIT
  if [ $limit -lt 15 ]; then
    result SKIP "$name" "the time budget (GPU_CHECK_BUDGET) is spent"
    return
  fi
  say "---- $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s)
  cat "$out" >>"$LOG"
  if [ $rc -eq 0 ]; then
    result PASS "$name" "$((t1 - t0)) s"
  elif [ $rc -eq 77 ]; then
    result SKIP "$name" "$(grep -m1 '^SKIP' "$out" | sed 's/^SKIP[^:]*: *//')"
  else
    tail -n 30 "$out"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && result FAIL "$name" "over the ${LIMIT} s limit" ||
      result FAIL "$name" "exit $rc"
  fi
}

finish() {
  say "---- summary"
  cat "$SUMMARY"
  echo "gpu-check: $passed passed, $failed failed, $skipped skipped" | tee -a "$LOG" "$SUMMARY"
  if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then
    cp "$SUMMARY" "$LOG" "$OUT"/
  fi
  [ $failed -gt 0 ] && exit 1
  [ $passed -eq 0 ] && exit 2
  exit 0
}

# ---- the card ----------------------------------------------------------------------
say "gpu-check at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') on $(uname -n), $(date -u '+%F %T') UTC"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  result SKIP card "no nvidia-smi: no NVIDIA driver here"
  for c in load compare memcheck bench-gpu cuda-alloc train-lenet train-charlm gpu-audit vs-torch audit-cost \
    racecheck synccheck initcheck; do
    result SKIP $c "no GPU"
  done
  finish
fi
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader >"$WORK/card" 2>&1; then
  cat "$WORK/card"
  result SKIP card "nvidia-smi finds no GPU: $(head -n1 "$WORK/card")"
  for c in load compare memcheck bench-gpu cuda-alloc train-lenet train-charlm gpu-audit vs-torch audit-cost \
    racecheck synccheck initcheck; do
    result SKIP $c "no GPU"
  done
  finish
fi
say "card: $(cat "$WORK/card")"
nvidia-smi >>"$LOG" 2>&1
result PASS card "$(head -n1 "$WORK/card")"

# ---- what runs: built here, or carried with its libraries ------------------------------
CUDA_LIB=$BUILD/libtagalloc-gpu-cuda.so
LOAD=$BUILD/tests/gpu/cuda/test_cuda_load
COMPARE=$BUILD/tests/gpu/cuda/test_cuda_compare
if [ ! -x "$LOAD" ] || [ ! -x "$COMPARE" ] || [ ! -f "$CUDA_LIB" ]; then
  say "building the CUDA backend and its tests (make -j$(nproc) $CUDA_LIB $LOAD $COMPARE)"
  make -j"$(nproc)" BUILD="$BUILD" "$CUDA_LIB" "$LOAD" "$COMPARE" >>"$LOG" 2>&1 ||
    say "the build failed (a machine without the project's packages needs a build carried from one that has them: make gpu-bundle there)"
fi

# The libraries a program misses here, from BUILD/gpu-libs, as links in a
# folder of their own (so nothing else this machine has is displaced).
LIBDIR=$WORK/libs
mkdir -p "$LIBDIR"
missing_libs() {
  for round in 1 2 3 4; do
    local missing
    missing=$(LD_LIBRARY_PATH=$LIBDIR ldd "$@" 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] && return 0
    for m in $missing; do
      if [ -e "$BUILD/gpu-libs/$m" ]; then
        ln -sf "$(cd "$BUILD/gpu-libs" && pwd)/$m" "$LIBDIR/$m"
      else
        say "missing library $m, not in $BUILD/gpu-libs either (make gpu-bundle on the build machine)"
        return 1
      fi
    done
  done
}
present=()
for f in "$CUDA_LIB" "$LOAD" "$COMPARE"; do [ -e "$f" ] && present+=("$f"); done
[ ${#present[@]} -gt 0 ] && missing_libs "${present[@]}"
[ -n "$(ls -A "$LIBDIR")" ] && say "taken from $BUILD/gpu-libs: $(ls "$LIBDIR" | tr '\n' ' ')"

# cuBLAS: the backend opens libcublas.so.<major> on the loader's path, then
# in the toolkit it was built with; else PyTorch's copy, named here.
if [ -z "${TAGALLOC_GPU_CUBLAS:-}" ] && command -v python3 >/dev/null 2>&1; then
  major=$(grep -a -o -m1 'libcublas\.so\.[0-9][0-9]*' "$CUDA_LIB" 2>/dev/null | head -n1)
  if [ -n "$major" ] && ! ldconfig -p 2>/dev/null | grep -q "$major " && [ ! -e "/usr/local/cuda/lib64/$major" ]; then
    site=$(python3 -c 'import sys; print(" ".join(p for p in sys.path if p.endswith("-packages")))' 2>/dev/null)
    for d in $site; do
      for c in "$d"/nvidia/cu*/lib/"$major" "$d"/nvidia/cublas/lib/"$major"; do
        [ -e "$c" ] && export TAGALLOC_GPU_CUBLAS=$c && break 2
      done
    done
    say "cuBLAS: ${TAGALLOC_GPU_CUBLAS:-$major not found on this machine}"
  fi
fi

export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TAGALLOC_GPU_CUDA_LIB=$ROOT/$CUDA_LIB
[ "${CUDA_LIB#/}" != "$CUDA_LIB" ] && export TAGALLOC_GPU_CUDA_LIB=$CUDA_LIB

# ---- the backend's tests ------------------------------------------------------------------
if [ -x "$LOAD" ] && [ -f "$CUDA_LIB" ]; then
  run load "$LOAD" --require-device "$TAGALLOC_GPU_CUDA_LIB"
else
  result FAIL load "no $LOAD or $CUDA_LIB (built with nvcc; carry them, or run where they build)"
fi
if [ -x "$COMPARE" ]; then
  run compare "$COMPARE"
else
  result FAIL compare "no $COMPARE"
fi

# ---- the comparison under compute-sanitizer: memcheck first, the other
# tools after the benchmark and the training run (they are the slowest)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n1)
sanitize() {   # sanitize TOOL [OPTIONS...]
  local tool=$1
  shift
  if [ -z "$SAN" ]; then
    result SKIP "$tool" "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
  elif [ ! -x "$COMPARE" ]; then
    result SKIP "$tool" "no $COMPARE to run"
  else
    run "$tool" "$SAN" --tool "$tool" "$@" --error-exitcode 99 "$COMPARE"
  fi
}
[ -n "$SAN" ] && say "compute-sanitizer: $SAN ($("$SAN" --version 2>/dev/null | tail -n1))"
sanitize memcheck --leak-check full

# ---- the benchmark: bench-gpu's program on the CUDA backend ------------------------------------------
# (built here if missing and buildable; its output kept whole in $OUT)
BENCH=$BUILD/bench-gpu
if ! make -n bench-gpu >/dev/null 2>&1; then
  result SKIP bench-gpu "this checkout has no bench-gpu target"
else
  [ -x "$BENCH" ] || make -j"$(nproc)" BUILD="$BUILD" "$BENCH" >>"$LOG" 2>&1
  if [ ! -x "$BENCH" ]; then
    result FAIL bench-gpu "no $BENCH, and it does not build here (carry it: make gpu-bundle)"
  else
    missing_libs "$BENCH"
    run bench-gpu env TAGALLOC_GPU=cuda "$BENCH"
    [ -n "${OUT:-}" ] && [ -d "${OUT}" ] && [ -f "$WORK/bench-gpu.out" ] && cp "$WORK/bench-gpu.out" "$OUT/gpu-check-bench.txt"
  fi
fi
keep_out() {   # keep_out NAME: the check's whole output in $OUT/gpu-check-NAME.txt
  [ -n "${OUT:-}" ] && [ -d "${OUT}" ] && [ -f "$WORK/$1.out" ] && cp "$WORK/$1.out" "$OUT/gpu-check-$1.txt"
}

# ---- the CUDA runtime's allocators, beside the pool's cached pair --------------------------------
ALLOC=$BUILD/bench-gpu-cuda-alloc
if [ ! -f bench/gpu/cuda_alloc.cu ]; then
  result SKIP cuda-alloc "this checkout has no bench/gpu/cuda_alloc.cu"
else
  [ -x "$ALLOC" ] || make BUILD="$BUILD" "$ALLOC" >>"$LOG" 2>&1
  if [ ! -x "$ALLOC" ]; then
    result FAIL cuda-alloc "no $ALLOC, and it does not build here (nvcc; or carry it: make gpu-bundle)"
  else
    run cuda-alloc "$ALLOC"
    keep_out cuda-alloc
  fi
fi

# ---- LeNet-5 trained on the CUDA backend: 3 epochs, at least 86% -----------------------------------
LENET=$BUILD/train-lenet
DATA=${GPU_CHECK_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -x "$LENET" ]; then
  result SKIP train-lenet "no $LENET (make gpu-bundle carries it)"
elif [ ! -e "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -e "$DATA/train-images-idx3-ubyte" ]; then
  result SKIP train-lenet "no Fashion-MNIST in $DATA (GPU_CHECK_DATA=DIR names a folder of its IDX files)"
else
  missing_libs "$LENET"
  cat >"$WORK/lenet.sh" <<EOS
#!/bin/bash
set -o pipefail
"$LENET" --device cuda --epochs 3 --data "$DATA" 2>&1 | tee "$WORK/lenet.txt" || exit
acc=\$(grep -o 'epoch 3: .*test accuracy [0-9.]*%' "$WORK/lenet.txt" | grep -o '[0-9.]*%\$' | tr -d %)
echo "train-lenet: test accuracy after 3 epochs \${acc:-?}% (want >= 86%)"
awk -v a="\${acc:-0}" 'BEGIN { exit !(a >= 86) }'
EOS
  chmod +x "$WORK/lenet.sh"
  run train-lenet "$WORK/lenet.sh"
fi

# ---- the character model on the CUDA backend: 500 iterations on this
# checkout's README (its embedding, tanh and Adam kernels in a real loop;
# the program's exit status counts the ledger's findings) ---------------------------------------------
CHARLM=$BUILD/train-charlm
if [ ! -x "$CHARLM" ]; then
  result SKIP train-charlm "no $CHARLM (make gpu-bundle carries it)"
else
  missing_libs "$CHARLM"
  run train-charlm "$CHARLM" --device cuda --iters 500 --every 250 --val-batches 10 --text README.md
fi

# ---- tagalloc run on real CUDA programs (tests/cuda/gpu-audit.sh: built here
# with nvcc against the static and the shared runtime, compute-sanitizer the
# oracle) -------------------------------------------------------------------------------------------
if [ -x tests/cuda/gpu-audit.sh ]; then
  audit_bins=()
  for f in "$BUILD"/tagalloc "$BUILD"/libtagalloc-*.so; do [ -e "$f" ] && audit_bins+=("$f"); done
  [ ${#audit_bins[@]} -gt 0 ] && missing_libs "${audit_bins[@]}"
  run gpu-audit tests/cuda/gpu-audit.sh "$BUILD"
else
  result SKIP gpu-audit "this checkout has no tests/cuda/gpu-audit.sh"
fi

# ---- LeNet-5 images/s against PyTorch CUDA (bench/gpu/vs_torch.py: synthetic data
# of Fashion-MNIST's shape where $DATA lacks it) ----------------------------------------------------
if [ ! -f bench/gpu/vs_torch.py ]; then
  result SKIP vs-torch "this checkout has no bench/gpu/vs_torch.py"
elif ! command -v python3 >/dev/null 2>&1; then
  result SKIP vs-torch "no python3 here"
elif [ ! -x "$LENET" ]; then
  result FAIL vs-torch "no $LENET (make gpu-bundle carries it)"
else
  missing_libs "$LENET"
  json=()
  [ -n "${OUT:-}" ] && [ -d "${OUT}" ] && json=(--json "$OUT/gpu-check-vs-torch.json")
  run vs-torch python3 bench/gpu/vs_torch.py --build "$BUILD" --data "$DATA" ${json[@]+"${json[@]}"}
  keep_out vs-torch
fi

# ---- the audit's cost on a CUDA program (bench/gpu/audit_cost.sh) ------------------------------------
if [ -x bench/gpu/audit_cost.sh ]; then
  run audit-cost bench/gpu/audit_cost.sh "$BUILD"
  keep_out audit-cost
else
  result SKIP audit-cost "this checkout has no bench/gpu/audit_cost.sh"
fi

# ---- the other compute-sanitizer tools ------------------------------------------------------------------
sanitize racecheck
sanitize synccheck
sanitize initcheck

# ---- other parts' GPU checks ------------------------------------------------------------------------
for s in tests/*/gpu-check-*.sh; do
  [ -x "$s" ] || continue
  run "$(basename "$s" .sh)" "$s" "$BUILD"
done

finish
