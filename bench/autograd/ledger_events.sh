#!/bin/bash
# ledger_events.sh - ledger events per training step, by entry point.
#
#   bench/autograd/ledger_events.sh [build/train-charlm | build/train-lenet] [N]
#
# Every call of these ledger entry points is one event: ta_alloc,
# ta_calloc, ta_aligned, ta_free, ta_realloc, ta_ref_init/acquire/release,
# ta_hold, ta_unhold, ta_arena_alloc, ta_arena_reset each record one exact
# stack of their own (in the default TAGALLOC_RECORD=on); the *_at forms
# (ta_ref_acquire_at, ta_ref_release_at, ta_hold_at, ta_unhold_at,
# ta_arena_alloc_at) record a stack the caller took with ta_stack_here for
# several events of one call.  Counted with uprobes (perf probe: root,
# perf installed) on runs of N and 2N steps (train-charlm --iters, train-lenet
# --steps, default N 100 and 20); the difference over N is per step, start-up
# and the end's validation left out.  "stacks" is _ta_stack_capture itself
# (the stack walks: every event without _at, and each ta_stack_here).
set -e
BIN=${1:-build/train-charlm}
case "$(basename "$BIN")" in
  train-charlm) FLAG=--iters; N=${2:-100}; EXTRA=(--every 1000000) ;;
  train-lenet)  FLAG=--steps; N=${2:-20};  EXTRA=(--epochs 1 --test 64) ;;
  *) echo "usage: $0 build/train-charlm|build/train-lenet [N]" >&2; exit 2 ;;
esac
BIN=$(realpath "$BIN")
G=ledger$$
trap 'perf probe -q -d "$G:*" >/dev/null 2>&1 || true' EXIT
EV=
for f in ta_alloc ta_calloc ta_aligned ta_free ta_realloc ta_ref_init ta_ref_acquire ta_ref_release \
         ta_ref_acquire_at ta_ref_release_at ta_hold ta_unhold ta_hold_at ta_unhold_at \
         ta_arena_alloc ta_arena_alloc_at ta_arena_reset _ta_stack_capture; do
  name=${f#_}
  perf probe -q -x "$BIN" -a "$G:${G}_$name=$f" >/dev/null 2>&1 || { echo "$0: cannot probe $f in $BIN" >&2; exit 1; }
  EV="$EV${EV:+,}$G:${G}_$name"
done
count() { perf stat -x, -e "$EV" "$BIN" "${EXTRA[@]}" "$FLAG" "$1" 2>&1 >/dev/null | awk -F, '$3 ~ /:/ {print $3, $1}'; }
a=$(count "$N")
b=$(count $((2 * N)))
paste <(echo "$a") <(echo "$b") | awk -v n="$N" -v g="$G:${G}_" '
  { sub(g, "", $1); d = ($4 - $2) / n; if ($1 == "ta_stack_capture") s = d; else { t += d; if (d) printf "%-18s %7.2f\n", $1, d } }
  END { printf "%-18s %7.2f\n%-18s %7.2f   (per step)\n", "events", t, "stacks", s }'
