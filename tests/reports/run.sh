#!/bin/bash
# Golden-file tests of the report renderers: each stored trace of
# tests/reports/traces/ (made by tests/reports/mktrace.c) rendered by
# `tagalloc report` as text, JSON, folded stacks (leaked, and live at the
# peak) must equal tests/reports/expected/ byte for byte; then the HTML page
# (bounded, escaped), `tagalloc diff` (exact output and exit status) and the
# one-line errors for bad inputs.  Ends with "N passed, N failed".
#   tests/reports/run.sh BUILD_DIR            check
#   tests/reports/run.sh BUILD_DIR --update   rewrite the expected files
set -u
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--update]" >&2; exit 2; }
build=$1
update=${2:-}
ta=$build/tagalloc
dir=tests/reports
exp=$dir/expected
out=$build/tests/reports/out
mkdir -p "$out" "$exp"
pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }

# Compares out/F with expected/F (or writes it with --update).
same() {
  local f=$1
  sed -i "s#$out/#OUT/#g" "$out/$f"   # the same expected files for any BUILD_DIR
  if [ "$update" = --update ]; then cp "$out/$f" "$exp/$f"; ok "$f (updated)"; return; fi
  if cmp -s "$out/$f" "$exp/$f"; then ok "$f"; else bad "$f" "$(diff "$exp/$f" "$out/$f" | head -20)"; fi
}

for t in leaks killed truncated xss base new threads threads-cut threads2; do
  "$ta" report "$dir/traces/$t.trace" --json "$out/$t.json" --folded "$out/$t.folded" \
    --folded-peak "$out/$t.peak.folded" --html "$out/$t.html" > "$out/$t.txt" 2> "$out/$t.err"
  echo "exit $?" >> "$out/$t.err"
  for f in txt err json folded peak.folded; do same "$t.$f"; done
  # the page: one file, nothing loaded from outside, program strings escaped
  size=$(wc -c < "$out/$t.html")
  if [ "$size" -lt 200000 ] && ! grep -q -e '<img' -e '</script><script>' -e 'src="http' -e "src='http" "$out/$t.html" &&
     [ "$(grep -c '<script' "$out/$t.html")" = 2 ]; then
    ok "$t.html: $size bytes, self-contained, no markup from the trace"
  else
    bad "$t.html: $size bytes, or markup from the trace, or not 2 script blocks"
  fi
done
if grep -q 'u003cimg src=x onerror=' "$out/xss.html"; then ok "xss.html: the tag name is in the data as \\u003cimg"; else bad "xss.html: the tag name is not in the data escaped"; fi

# The text alone, and the leaked folded stacks alone: a clean exit with the
# ledger's SUMMARY and fewer than 3 marks is not replayed
# (reports/offline.c); each is the same as with the outputs that replay it.
for t in leaks killed truncated xss base new threads threads-cut threads2; do
  "$ta" report "$dir/traces/$t.trace" > "$out/$t.text-only.txt" 2> /dev/null
  if cmp -s "$out/$t.text-only.txt" "$exp/$t.txt"; then ok "$t: the text alone is the same"
  else bad "$t: the text alone differs" "$(diff "$exp/$t.txt" "$out/$t.text-only.txt" | head -10)"; fi
  "$ta" report -q "$dir/traces/$t.trace" --folded "$out/$t.folded-only.folded" 2> /dev/null
  if cmp -s "$out/$t.folded-only.folded" "$exp/$t.folded"; then ok "$t: the leaked folded stacks alone are the same"
  else bad "$t: the leaked folded stacks alone differ" "$(diff "$exp/$t.folded" "$out/$t.folded-only.folded" | head -10)"; fi
done

# The report model's numbers, the same in every rendering.
lj=$out/leaks.json
check_num() {   # WHAT EXPECTED GOT
  if [ "$2" = "$3" ]; then ok "$1 = $2"; else bad "$1" "expected $2, got $3"; fi
}
check_num "leaks: leak.growth slope" '"slope":64.000,"iterations":4,"first":0,"last":256' \
  "$(grep -o '"slope":[0-9.]*,"iterations":[0-9]*,"first":[0-9]*,"last":[0-9]*' "$lj")"
# 5: the leak.growth group is a warning, not counted (the exit status follows findings_count)
check_num "leaks: findings_count" 5 "$(grep -o '"findings_count":[0-9]*' "$lj" | cut -d: -f2)"
check_num "leaks: leaked bytes in folded" 1144 "$(awk '{s += $NF} END {print s}' "$out/leaks.folded")"
check_num "leaks: live bytes at the peak in folded" 5560 "$(awk '{s += $NF} END {print s}' "$out/leaks.peak.folded")"
check_num "leaks: peak_bytes in JSON" 5560 "$(grep -o '"peak_bytes":[0-9]*' "$lj" | head -1 | cut -d: -f2)"

# diff: traces, JSON reports, exit status
diffrun() {   # NAME EXPECTED_STATUS ARGS...
  local name=$1 want=$2
  shift 2
  "$ta" diff "$@" > "$out/$name" 2>&1
  local rc=$?
  echo "exit $rc" >> "$out/$name"
  same "$name"
  [ "$rc" = "$want" ] && ok "$name: exit $want" || bad "$name: exit $rc, expected $want"
}
diffrun diff-traces.txt 1 "$dir/traces/base.trace" "$dir/traces/new.trace" --fail-on-increase
diffrun diff-back.txt 0 "$dir/traces/new.trace" "$dir/traces/base.trace" --fail-on-increase
diffrun diff-same.txt 0 "$dir/traces/base.trace" "$dir/traces/base.trace" --fail-on-increase
diffrun diff-noflag.txt 0 "$dir/traces/base.trace" "$dir/traces/new.trace"
diffrun diff-json.txt 1 "$out/base.json" "$out/new.json" --fail-on-increase
diffrun diff-mixed.txt 1 "$dir/traces/base.trace" "$out/new.json" --fail-on-increase
printf 'not json\n' > "$out/bad.txt"
diffrun diff-bad.txt 2 "$out/bad.txt" "$dir/traces/new.trace"
printf '{"processes":[1,' > "$out/cut.json"
diffrun diff-cut.txt 2 "$dir/traces/base.trace" "$out/cut.json"

# bad inputs: one line naming the input and the reason
err1=$("$ta" report "$out/bad.txt" 2>&1 > /dev/null)
check_num "report of a non-trace" "tagalloc: TRACE: not a tagalloc trace (bad magic): $out/bad.txt" "$err1"
err2=$("$ta" report "$dir/traces/leaks.trace" --html /nonexistent/dir/x.html 2>&1 > /dev/null)
check_num "--html into a missing directory" "tagalloc: --html /nonexistent/dir/x.html: cannot create: No such file or directory" "$err2"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
