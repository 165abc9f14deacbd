#!/bin/bash
# Runs every autograd test program under BUILD/tests/autograd; ends with one line
# "autograd: N passed, N failed".
BUILD=${1:-build}
passed=0
failed=0
failures=()
for t in "$BUILD"/tests/autograd/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  log=$(mktemp)
  "$t" >"$log" 2>&1
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
done
[ $failed -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
echo "autograd: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
