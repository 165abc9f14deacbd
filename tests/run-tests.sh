#!/bin/bash
# Runs every test program under BUILD/tests (unit, misuse, stress) and ends
# with one line "N passed, N failed".  VALGRIND=1 runs each under memcheck.
BUILD=${1:-build}
passed=0
failed=0
failures=()
run() {
  local t=$1 log
  log=$(mktemp)
  if [ -n "${VALGRIND:-}" ]; then
    # --aspace-minaddr: blocks above 4 GiB, as jemalloc places them natively
    # (low, a 64 MiB block covers ordinary integers: "possibly lost").
    valgrind -q --error-exitcode=99 --leak-check=no --aspace-minaddr=0x100000000 \
      --suppressions="$(dirname "$0")/valgrind.supp" "$t" >"$log" 2>&1
  else
    "$t" >"$log" 2>&1
  fi
  local rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $t"
  else
    failed=$((failed + 1))
    failures+=("$t")
    echo "FAIL $t (exit $rc)"
    tail -n 40 "$log" | sed 's/^/    /'
  fi
  rm -f "$log"
}
for dir in unit misuse stress; do
  for t in "$BUILD"/tests/$dir/*; do
    [ -x "$t" ] && [ -f "$t" ] && run "$t"
  done
done
[ $failed -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
