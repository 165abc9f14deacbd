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

# train-lenet: a few steps end to end (the JSON keys scripts rely on, no
# findings, nothing live on the tape), and a bad option refused in one line.
check() {   # name, then the command that must succeed
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "PASS $name"
  else failed=$((failed + 1)); failures+=("$name"); echo "FAIL $name"; fi
}
lenet_probe() {
  local dir out
  dir=$(mktemp -d)
  out=$("$BUILD"/train-lenet --epochs 2 --steps 3 --test 200 --seed 3 --json "$dir/run.json" 2>&1)
  local rc=$?
  local ok=1
  [ $rc -eq 0 ] || { echo "    exit $rc"; ok=0; }
  grep -q 'ledger findings: 0$' <<<"$out" || { echo "    findings:"; ok=0; }
  grep -q 'tape blocks live after steps 0' <<<"$out" || ok=0
  for k in '"epochs"' '"epoch": 2' '"train_loss"' '"test_accuracy"' '"images_per_s"' '"seconds"' '"rss_bytes"'; do
    grep -q "$k" "$dir/run.json" 2>/dev/null || { echo "    no $k in the JSON"; ok=0; }
  done
  [ $ok -eq 1 ] || sed 's/^/    /' <<<"$out" | tail -n 20
  rm -rf "$dir"
  [ $ok -eq 1 ]
}
lenet_bad_input() {
  local out
  out=$("$BUILD"/train-lenet --batch 0 2>&1)
  [ $? -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q -- "--batch wants an integer" <<<"$out" || return 1
  out=$("$BUILD"/train-lenet --data /nonexistent 2>&1)
  [ $? -eq 2 ] && grep -q "cannot open /nonexistent/train-images-idx3-ubyte.gz" <<<"$out"
}
if [ -x "$BUILD"/train-lenet ]; then
  check "train-lenet (2 epochs of 3 steps)" lenet_probe
  check "train-lenet bad input" lenet_bad_input
fi

[ $failed -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
echo "autograd: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
