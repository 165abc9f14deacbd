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
# The losses and accuracies of a --json file, one epoch a line (the
# measurements of time and memory left out).
losses() { grep -o '"epoch": [0-9]*, "train_loss": [-0-9.e]*, "test_accuracy": [0-9.]*' "$1"; }
LENET_DIR=$(mktemp -d)
trap 'rm -rf "$LENET_DIR"' EXIT
lenet_probe() {
  local dir=$LENET_DIR out
  out=$("$BUILD"/train-lenet --epochs 2 --steps 6 --test 200 --seed 3 --json "$dir/run.json" --html "$dir/run.html" 2>&1)
  local rc=$?
  local ok=1
  [ $rc -eq 0 ] || { echo "    exit $rc"; ok=0; }
  grep -q 'ledger findings: 0$' <<<"$out" || { echo "    findings:"; ok=0; }
  grep -q 'tape blocks live after steps 0' <<<"$out" || ok=0
  for k in '"epochs"' '"epoch": 2' '"train_loss"' '"test_accuracy"' '"images_per_s"' '"seconds"' '"rss_bytes"' \
           '"ledger_live_by_tag": {"tensor.storage": [1-9]' '"autograd.param": [1-9]'; do
    grep -q "$k" "$dir/run.json" 2>/dev/null || { echo "    no $k in the JSON"; ok=0; }
  done
  [ "$(losses "$dir/run.json" | wc -l)" -eq 2 ] || { echo "    not 2 epochs of losses"; ok=0; }
  grep -q '"argv":\["[^"]*train-lenet","--epochs","2"' "$dir/run.html" 2>/dev/null || { echo "    no HTML report"; ok=0; }
  [ $ok -eq 1 ] || sed 's/^/    /' <<<"$out" | tail -n 20
  [ $ok -eq 1 ]
}
# Interrupted after 8 steps (epoch 2, step 2; checkpoints every 3 steps and at
# the stop), then resumed: the same losses and accuracies, bit for bit, as the
# uninterrupted run of lenet_probe.
lenet_resume() {
  local dir=$LENET_DIR out ok=1
  out=$("$BUILD"/train-lenet --epochs 2 --steps 6 --test 200 --seed 3 --checkpoint "$dir/ck" \
        --checkpoint-every 3 --stop-after 8 --json "$dir/cut.json" 2>&1)
  [ $? -eq 0 ] && grep -q "stopped after 8 steps (--stop-after), saved in $dir/ck" <<<"$out" || { echo "    the cut run:"; sed 's/^/    /' <<<"$out" | tail -n 5; return 1; }
  [ "$(losses "$dir/cut.json" | wc -l)" -eq 1 ] || { echo "    the cut run has not 1 epoch"; ok=0; }
  out=$("$BUILD"/train-lenet --epochs 2 --steps 6 --test 200 --seed 3 --resume "$dir/ck" --json "$dir/resumed.json" 2>&1)
  [ $? -eq 0 ] && grep -q "resumed from $dir/ck at epoch 2 step 2" <<<"$out" || { echo "    the resumed run:"; sed 's/^/    /' <<<"$out" | tail -n 5; return 1; }
  grep -q 'ledger findings: 0$' <<<"$out" || ok=0
  if [ "$(losses "$dir/run.json")" != "$(losses "$dir/resumed.json")" ]; then
    echo "    uninterrupted:"; losses "$dir/run.json" | sed 's/^/      /'
    echo "    resumed:"; losses "$dir/resumed.json" | sed 's/^/      /'
    ok=0
  fi
  # a checkpoint of another optimizer is refused in one line
  out=$("$BUILD"/train-lenet --epochs 2 --steps 6 --optim adam --resume "$dir/ck" 2>&1 >/dev/null)
  [ $? -eq 2 ] && [ "$out" = "autograd: refusing checkpoint $dir/ck: the file holds SGD state, the optimizer is Adam" ] || { echo "    adam on an SGD file: $out"; ok=0; }
  [ $ok -eq 1 ]
}
lenet_bad_input() {
  local out
  out=$("$BUILD"/train-lenet --batch 0 2>&1)
  [ $? -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q -- "--batch wants an integer" <<<"$out" || return 1
  out=$("$BUILD"/train-lenet --data /nonexistent 2>&1)
  [ $? -eq 2 ] && grep -q "cannot open /nonexistent/train-images-idx3-ubyte.gz" <<<"$out" || return 1
  out=$("$BUILD"/train-lenet --optim rmsprop 2>&1)
  [ $? -eq 2 ] && [ "$out" = "train-lenet: --optim wants sgd or adam, got 'rmsprop'" ] || return 1
  out=$("$BUILD"/train-lenet --resume /nonexistent.ckpt 2>&1)
  [ $? -eq 2 ] && [ "$out" = "train-lenet: --resume /nonexistent.ckpt: No such file or directory" ]
}
if [ -x "$BUILD"/train-lenet ]; then
  check "train-lenet (2 epochs of 6 steps, --json, --html)" lenet_probe
  check "train-lenet interrupted and resumed: the same losses bit for bit" lenet_resume
  check "train-lenet bad input" lenet_bad_input
fi

[ $failed -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
echo "autograd: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
