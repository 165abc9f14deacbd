#!/bin/bash
# test_scripts.sh - make test-bench-gpu-scripts: the paths of bench-gpu's CUDA
# scripts that run without a GPU, with stand-ins for what is missing:
#   vs_torch.py    no PyTorch (a torch that fails to import) -> SKIP, 77;
#                  a torch without CUDA -> SKIP naming it, 77
#   audit_cost.sh  no nvcc -> SKIP, 77; a stand-in nvidia-smi and nvcc whose
#                  "program" runs: the medians and ratio lines, 0; the same
#                  program exiting 3 -> FAIL, 1; exiting 77 -> SKIP, 77;
#                  no tagalloc in BUILD -> FAIL, 1
#   BUILD: the build folder with tagalloc and libtagalloc-cuda.so.
set -u
BUILD=$(cd "${1:-build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
check() {   # check NAME WANT_RC GREP_PATTERN CMD...
  local name=$1 want=$2 pat=$3 rc
  shift 3
  "$@" >"$t/out" 2>&1
  rc=$?
  if [ "$rc" -eq "$want" ] && grep -q -E -- "$pat" "$t/out"; then
    echo "PASS $name"
  else
    echo "FAIL $name: exit $rc (want $want), output (want /$pat/):"
    sed 's/^/    /' "$t/out"
    fails=$((fails + 1))
  fi
}
mkdir -p "$t/noimport/torch" "$t/nocuda/torch" "$t/bin" "$t/build"
echo 'raise ImportError("a stand-in that does not import")' >"$t/noimport/torch/__init__.py"
cat >"$t/nocuda/torch/__init__.py" <<'PY'
__version__ = "0.0-standin"
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return False
PY
check vs-torch-no-torch 77 '^SKIP vs-torch: no PyTorch' env PYTHONPATH="$t/noimport" "$py" "$here/vs_torch.py" --build "$BUILD"
check vs-torch-no-cuda 77 '^SKIP vs-torch: PyTorch 0.0-standin finds no CUDA device' \
  env PYTHONPATH="$t/nocuda" "$py" "$here/vs_torch.py" --build "$BUILD"
check vs-torch-bad-args 2 'want positive' env PYTHONPATH="$t/nocuda" "$py" "$here/vs_torch.py" --steps 0

check audit-cost-no-nvcc 77 '^SKIP audit-cost: no nvcc' env NVCC="$t/none" "$here/audit_cost.sh" "$BUILD"
printf '#!/bin/sh\nexit 0\n' >"$t/bin/nvidia-smi"
cat >"$t/bin/nvcc" <<'SH'
#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
printf '#!/bin/sh\nsleep 0.02\n[ "${STANDIN_RC:-0}" = 77 ] && echo "SKIP stand-in: no device"\nexit ${STANDIN_RC:-0}\n' >"$out"
chmod +x "$out"
SH
chmod +x "$t/bin/nvidia-smi" "$t/bin/nvcc"
ln -s "$BUILD/tagalloc" "$t/build/tagalloc"
ln -s "$BUILD/libtagalloc-cuda.so" "$t/build/libtagalloc-cuda.so"
export PATH="$t/bin:$PATH" NVCC="$t/bin/nvcc"
check audit-cost-measures 0 '^  ratio audited / bare: [0-9]+\.[0-9]{2}x$' "$here/audit_cost.sh" "$t/build" 3 100
check audit-cost-medians 0 '^  bare: +median 0\.[0-9]{3} s  \(runs: [0-9.]+ s [0-9.]+ s [0-9.]+ s\)' \
  "$here/audit_cost.sh" "$t/build" 3 100
check audit-cost-program-fails 1 '^FAIL audit-cost: .* exited with status 3' env STANDIN_RC=3 "$here/audit_cost.sh" "$t/build" 1 10
check audit-cost-program-skips 77 '^SKIP stand-in: no device' env STANDIN_RC=77 "$here/audit_cost.sh" "$t/build" 1 10
rm "$t/build/tagalloc"
check audit-cost-no-tagalloc 1 '^FAIL audit-cost: .*tagalloc or .* is missing' "$here/audit_cost.sh" "$t/build" 1 10
[ $fails -eq 0 ] && echo "bench-gpu scripts: all passed" || echo "bench-gpu scripts: $fails failed"
[ $fails -eq 0 ]
