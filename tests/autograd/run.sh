#!/bin/bash
# Runs every autograd test program under BUILD/tests/autograd; ends with one line
# "autograd: N passed, N failed".
BUILD=${1:-build}
. "$(dirname "$0")/../lib.sh"
for t in "$BUILD"/tests/autograd/test_*; do
  [ -x "$t" ] && [ -f "$t" ] && run_program "$t"
done

# train-lenet: a few steps end to end (the JSON keys scripts rely on, no
# findings, nothing live on the tape, the --html page's timeline), and a bad
# option refused in one line.
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
  # the page's timeline, from the ledger's samples: 12 steps, a mark each
  local tl
  tl=$(python3 "$(dirname "$0")/check_timeline.py" "$dir/run.html" 12 \
       tensor.storage,tensor.pool,tensor.scratch,autograd.param,autograd.tape 2>&1) || { echo "    $tl"; ok=0; }
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
# train-charlm: 300 iterations with a point every 100 (the JSON keys, no
# findings, nothing live on the tape, the loss going down), the same run
# stopped after 150 iterations and resumed (the same points bit for bit), bad input.
points() { grep -o '"iter": [0-9]*, "train_loss": [-0-9.e]*, "val_loss": [-0-9.e]*' "$1"; }
charlm_probe() {
  local dir=$LENET_DIR out ok=1
  out=$("$BUILD"/train-charlm --iters 300 --every 100 --val-batches 4 --seed 2 --json "$dir/lm.json" 2>&1)
  [ $? -eq 0 ] || { echo "    exit $?"; ok=0; }
  grep -q 'ledger findings: 0$' <<<"$out" || ok=0
  grep -q 'iter 300: .*tape blocks live after iterations 0$' <<<"$out" || ok=0
  for k in '"points"' '"iter": 100' '"iter": 300' '"train_loss"' '"val_loss"' '"iters_per_s"' '"rss_bytes"' \
           '"ledger_live_bytes": [1-9]' '"ledger_live_by_tag": {'; do
    grep -q "$k" "$dir/lm.json" 2>/dev/null || { echo "    no $k in the JSON"; ok=0; }
  done
  # the validation loss falls from the first point to the last
  local v1 v3
  v1=$(points "$dir/lm.json" | sed -n 1p | sed 's/.*"val_loss": //')
  v3=$(points "$dir/lm.json" | sed -n 3p | sed 's/.*"val_loss": //')
  awk -v a="$v1" -v b="$v3" 'BEGIN { exit !(b < a && a < 4.8) }' || { echo "    val loss $v1 -> $v3"; ok=0; }
  [ $ok -eq 1 ] || sed 's/^/    /' <<<"$out" | tail -n 20
  [ $ok -eq 1 ]
}
charlm_resume() {
  local dir=$LENET_DIR out ok=1
  out=$("$BUILD"/train-charlm --iters 300 --every 100 --val-batches 4 --seed 2 --checkpoint "$dir/lm.ck" \
        --checkpoint-every 40 --stop-after 150 2>&1)
  [ $? -eq 0 ] && grep -q "stopped after 150 iterations (--stop-after), saved in $dir/lm.ck" <<<"$out" || { sed 's/^/    /' <<<"$out" | tail -n 5; return 1; }
  out=$("$BUILD"/train-charlm --iters 300 --every 100 --val-batches 4 --resume "$dir/lm.ck" --json "$dir/lm2.json" 2>&1)
  [ $? -eq 0 ] && grep -q "resumed from $dir/lm.ck at iteration 150" <<<"$out" || { sed 's/^/    /' <<<"$out" | tail -n 5; return 1; }
  if [ "$(points "$dir/lm.json")" != "$(points "$dir/lm2.json")" ]; then
    echo "    uninterrupted:"; points "$dir/lm.json" | sed 's/^/      /'
    echo "    resumed:"; points "$dir/lm2.json" | sed 's/^/      /'
    ok=0
  fi
  [ "$(points "$dir/lm2.json" | wc -l)" -eq 3 ] || ok=0
  # the same bytes as one --text file resume; one byte changed is another text, refused in one line
  local f files=()
  for f in $(LC_ALL=C ls /usr/share/games/fortunes); do
    case $f in *.dat|*.u8) continue ;; esac
    [ -f "/usr/share/games/fortunes/$f" ] && files+=("/usr/share/games/fortunes/$f")
  done
  cat "${files[@]}" >"$dir/all.txt"
  out=$("$BUILD"/train-charlm --iters 160 --every 100 --val-batches 4 --text "$dir/all.txt" --resume "$dir/lm.ck" 2>&1)
  [ $? -eq 0 ] || { echo "    the same text as one file:"; sed 's/^/    /' <<<"$out" | tail -n 3; ok=0; }
  printf 'b' | dd of="$dir/all.txt" bs=1 seek=1000 conv=notrunc status=none
  out=$("$BUILD"/train-charlm --text "$dir/all.txt" --resume "$dir/lm.ck" 2>&1 >/dev/null)
  [ $? -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "lm.ck: saved on another text" <<<"$out" || { echo "    $out"; ok=0; }
  [ $ok -eq 1 ]
}
charlm_bad_input() {
  local out
  out=$("$BUILD"/train-charlm --text /nonexistent 2>&1)
  [ $? -eq 2 ] && [ "$out" = "train-charlm: cannot open /nonexistent: No such file or directory" ] || return 1
  out=$("$BUILD"/train-charlm --every 0 2>&1)
  [ $? -eq 2 ] && [ "$out" = "train-charlm: --every wants an integer in 1..100000000, got '0'" ] || return 1
  printf 'abc' >"$LENET_DIR/tiny.txt"
  out=$("$BUILD"/train-charlm --text "$LENET_DIR/tiny.txt" 2>&1)
  [ $? -eq 2 ] && [ "$out" = "train-charlm: $LENET_DIR/tiny.txt: 3 bytes of text, too few for a context of 8" ]
}
if [ -x "$BUILD"/train-charlm ] && [ -d /usr/share/games/fortunes ]; then
  check "train-charlm (300 iterations, --json)" charlm_probe
  check "train-charlm interrupted and resumed: the same points bit for bit" charlm_resume
  check "train-charlm bad input" charlm_bad_input
fi
if [ -x "$BUILD"/train-lenet ]; then
  check "train-lenet (2 epochs of 6 steps, --json, --html)" lenet_probe
  check "train-lenet interrupted and resumed: the same losses bit for bit" lenet_resume
  check "train-lenet bad input" lenet_bad_input
fi

# The seeded bugs (tensor_fault_set; TAGALLOC_FAULT here, --fault on the
# command line): each run of at most 10 steps must report exactly its kind
# (and, listed after the frame count, exactly the groups of what the same
# bug leads to), with the fault site's function and file among the top
# frames of the named stack of every group
# (check_fault.py reads the report model in the --html page); without a
# fault, no finding at all.  Each check fails when its detection is off.
CHECK_FAULT="$(dirname "$0")/check_fault.py"
CLI=${AUTOGRAD_TEST_CLI:-$BUILD/tagalloc}
lenet_fault() {
  local fault=$1 page="$LENET_DIR/fault-$1.html" out
  shift
  TAGALLOC_FAULT=$fault "$BUILD"/train-lenet --epochs 1 --steps 10 --test 100 --seed 3 --html "$page" \
    >/dev/null 2>"$LENET_DIR/fault.err"
  [ $? -eq 1 ] || { echo "    exit status not 1"; tail -5 "$LENET_DIR/fault.err" | sed 's/^/    /'; return 1; }
  out=$("$CHECK_FAULT" "$page" "$@") || { echo "    $out"; return 1; }
  ! grep -q "ref.leak\|hold.dangling" "$LENET_DIR/fault.err" || { echo "    an exit-only finding"; return 1; }
}
# scope-escape and gpu-clone-retain live in train-lenet's code: train-charlm
# says so and exits 2 rather than run clean with the bug "on".
charlm_foreign_faults() {
  local f out
  for f in scope-escape gpu-clone-retain; do
    out=$("$BUILD"/train-charlm --iters 5 --fault "$f" 2>&1 >/dev/null) && return 1
    [ $? -eq 2 ] || return 1
    case "$out" in *"--fault $f: a seeded bug of train-lenet's code; train-charlm has no code for it"*) ;; *) echo "    $out"; return 1 ;; esac
  done
}
lenet_no_fault() {
  local page="$LENET_DIR/fault-none.html" out
  "$BUILD"/train-lenet --epochs 1 --steps 10 --test 100 --seed 3 --html "$page" >/dev/null 2>&1 || return 1
  out=$("$CHECK_FAULT" "$page" none) || { echo "    $out"; return 1; }
}
lenet_optimizer_state_leak() {
  local page="$LENET_DIR/fault-osl.html" out
  rm -f "$LENET_DIR/osl.ck"
  "$BUILD"/train-lenet --epochs 1 --steps 6 --test 100 --seed 3 --checkpoint "$LENET_DIR/osl.ck" --stop-after 3 \
    >/dev/null 2>&1 || return 1
  "$BUILD"/train-lenet --epochs 1 --steps 6 --test 100 --seed 3 --resume "$LENET_DIR/osl.ck" \
    --fault optimizer-state-leak --html "$page" >/dev/null 2>&1
  [ $? -eq 1 ] || return 1
  # the old state's headers are orphaned; the storages they own (made by
  # the first optim_new) are lost with them: one group of each
  out=$("$CHECK_FAULT" "$page" leak.orphan aux_stack ag_checkpoint_load autograd/checkpoint.c 3 \
    "leak.indirect=1@stack+optim_new+autograd/optim.c+5") \
    || { echo "    $out"; return 1; }
}
# tape-no-shrink is memory that grows while it stays reachable: leak.growth
# comes from a trace (a mark per step), rendered by `tagalloc report`
# (BUILD's, or $AUTOGRAD_TEST_CLI); the run itself exits 0 (growth is a
# warning), and without the fault the same trace has no finding.
tape_no_shrink() {
  local prog=$1 fault=$2 trace="$LENET_DIR/tns-$1-$2.trace" page="$LENET_DIR/tns-$1-$2.html" out
  local args=(--epochs 1 --steps 40 --test 100 --seed 3)
  [ "$prog" = train-charlm ] && args=(--iters 40 --every 40 --val-batches 2 --seed 2)
  rm -f "$trace"
  TAGALLOC_TRACE=$trace "$BUILD/$prog" "${args[@]}" --fault "$fault" \
    >/dev/null 2>"$LENET_DIR/tns.err" || { echo "    $prog failed"; tail -3 "$LENET_DIR/tns.err"; return 1; }
  "$CLI" report "$trace" --html "$page" >/dev/null 2>&1 || { echo "    $CLI report failed"; return 1; }
  if [ "$fault" = none ]; then
    out=$("$CHECK_FAULT" "$page" none) || { echo "    $out"; return 1; }
  else
    out=$("$CHECK_FAULT" "$page" leak.growth stack tape_index_push autograd/tape.c) || { echo "    $out"; return 1; }
  fi
}
charlm_fault() {
  local fault=$1 page="$LENET_DIR/cfault-$1.html" out
  shift
  "$BUILD"/train-charlm --iters 20 --every 20 --val-batches 2 --seed 2 --fault "$fault" --html "$page" \
    >/dev/null 2>"$LENET_DIR/cfault.err"
  [ $? -eq 1 ] || { echo "    exit status not 1"; tail -5 "$LENET_DIR/cfault.err" | sed 's/^/    /'; return 1; }
  out=$("$CHECK_FAULT" "$page" "$@") || { echo "    $out"; return 1; }
}
if [ -x "$BUILD"/train-lenet ]; then
  check "fault reshape-dummy: leak.orphan from tensor_reshape" lenet_fault reshape-dummy leak.orphan stack tensor_reshape tensor/view.c
  check "fault slice-dummy: leak.orphan from tensor_slice" lenet_fault slice-dummy leak.orphan stack tensor_slice tensor/view.c
  # the headline of ref.underflow is the extra release: the fault's own line
  VU_LINE=$(grep -n "TENSOR_FAULT_VIEW_UNDERFLOW" "$(dirname "$0")/../../tensor/core.c" | cut -d: -f1)
  check "fault view-underflow: ref.underflow headed by the extra release (tensor/core.c:$VU_LINE)" \
    lenet_fault view-underflow ref.underflow stack _tensor_free "tensor/core.c:$VU_LINE" 1
  check "fault tape-stack-inputs: hold.stack in _ag_result" lenet_fault tape-stack-inputs hold.stack stack _ag_result autograd/tape.c
  check "fault arena-early-reset: arena.after-reset in main" lenet_fault arena-early-reset arena.after-reset stack main tools/train_lenet.c
  # params-in-arena: the reset that kills the parameters also ends their
  # holds on their value and gradient, which nothing frees since (the dead
  # parameter cannot be freed): LeNet's 10 parameters leave 20 headers
  # orphaned at ag_tape_reset and their 20 storages indirectly lost
  check "fault params-in-arena: arena.after-reset, made in ag_param_new; 20 orphaned at ag_tape_reset" \
    lenet_fault params-in-arena arena.after-reset alloc_stack ag_param_new autograd/tape.c 3 \
    "leak.orphan=20@aux_stack+ag_tape_reset+autograd/tape.c+3,leak.indirect=20"
  check "fault scope-escape: use.after-free in main" lenet_fault scope-escape use.after-free stack main tools/train_lenet.c
  check "fault pool-double-release: free.double in ag_backward" lenet_fault pool-double-release free.double stack ag_backward autograd/tape.c
  check "fault optimizer-state-leak: leak.orphan, orphaned in ag_checkpoint_load" lenet_optimizer_state_leak
  check "fault tape-no-shrink: leak.growth at tape_index_push (trace, 40 steps)" tape_no_shrink train-lenet tape-no-shrink
  check "no fault: no finding in the trace of 40 steps" tape_no_shrink train-lenet none
  check "no fault: no finding" lenet_no_fault
fi
if [ -x "$BUILD"/train-charlm ] && [ -d /usr/share/games/fortunes ]; then
  check "train-charlm fault reshape-dummy" charlm_fault reshape-dummy leak.orphan stack tensor_reshape tensor/view.c
  check "train-charlm fault tape-stack-inputs" charlm_fault tape-stack-inputs hold.stack stack _ag_result autograd/tape.c
  check "train-charlm fault arena-early-reset" charlm_fault arena-early-reset arena.after-reset stack main tools/train_charlm.c
  check "train-charlm fault pool-double-release" charlm_fault pool-double-release free.double stack ag_backward autograd/tape.c
  check "train-charlm fault tape-no-shrink (trace, 40 iterations)" tape_no_shrink train-charlm tape-no-shrink
  check "train-charlm no fault: no finding in the trace of 40 iterations" tape_no_shrink train-charlm none
  check "train-charlm refuses train-lenet's own seeded bugs (scope-escape, gpu-clone-retain)" charlm_foreign_faults
fi

finish autograd
