# tests/lib.sh - what the test runners share (sourced by tests/run-tests.sh,
# tests/tensor/run.sh, tests/autograd/run.sh).
#
#   run_program T     runs test program T (under memcheck when VALGRIND is
#                     set), prints "PASS T (N tests)" or "FAIL T (exit RC)"
#                     with the tail of its output, and counts it
#   check NAME CMD... a check that passes when CMD succeeds
#   finish [LABEL]    prints the failures and "[LABEL: ]N passed, N failed";
#                     its status is 0 when nothing failed and something passed
passed=0
failed=0
failures=()
_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

run_program() {
  local t=$1 log rc
  log=$(mktemp)
  if [ -n "${VALGRIND:-}" ]; then
    # --aspace-minaddr: blocks above 4 GiB, as jemalloc places them natively
    # (low, a 64 MiB block covers ordinary integers: "possibly lost").
    valgrind -q --error-exitcode=99 --leak-check=no --aspace-minaddr=0x100000000 \
      --suppressions="$_lib_dir/valgrind.supp" "$t" >"$log" 2>&1
  else
    "$t" >"$log" 2>&1
  fi
  rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $t ($(grep -c '^\[       OK \]' "$log") tests)"
  else
    failed=$((failed + 1))
    failures+=("$t")
    echo "FAIL $t (exit $rc)"
    tail -n 40 "$log" | sed 's/^/    /'
  fi
  rm -f "$log"
}

check() {
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "PASS $name"
  else failed=$((failed + 1)); failures+=("$name"); echo "FAIL $name"; fi
}

finish() {
  [ $failed -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
  echo "${1:+$1: }$passed passed, $failed failed"
  [ $failed -eq 0 ] && [ $passed -gt 0 ]
}
