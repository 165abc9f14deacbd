#!/bin/bash
# The rendering benchmark of issue 4: bench/reports/churn.c makes
# 2 x PAIRS allocation events (default PAIRS = 5,000,000: 10 million
# events); its tagalloc trace is rendered as text, text + JSON, text + HTML
# and all three by `tagalloc report`, and its heaptrack file by
# heaptrack_print (heaptrack's own text report), RUNS times each (default
# 5).  Prints the median wall and CPU (user + sys) seconds of each and the
# ratio to heaptrack_print's; the target is a ratio of at most 0.5.  Also
# checks that the HTML page stays under 5 MB.
#   bench/reports/run.sh BUILD_DIR [PAIRS] [RUNS]
set -eu
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [PAIRS] [RUNS]" >&2; exit 2; }
build=$1
pairs=${2:-5000000}
runs=${3:-5}
out=$build/bench-reports
mkdir -p "$out"
command -v heaptrack_print >/dev/null || { echo "bench-reports: heaptrack is not installed (make bench-deps)" >&2; exit 1; }
cc -O1 -g -fno-omit-frame-pointer bench/reports/churn.c -o "$out/churn"
echo "bench-reports: tracing $out/churn $pairs under tagalloc and under heaptrack ..."
"$build/tagalloc" run --trace "$out/churn.trace" -- "$out/churn" "$pairs" > /dev/null 2>&1
rm -f "$out"/churn.heaptrack.*
heaptrack -o "$out/churn.heaptrack" "$out/churn" "$pairs" > /dev/null 2>&1
ht=$(ls "$out"/churn.heaptrack.* | head -1)
"$build/tagalloc" report "$out/churn.trace" --json "$out/churn.json" --html "$out/churn.html" > "$out/churn.txt"
events=$(grep -o '"allocs":[0-9]*,"frees":[0-9]*' "$out/churn.json" | head -1 | tr -cd '0-9,' |
         awk -F, '{print $1 + $2}')
echo "tagalloc trace: $(du -h "$out/churn.trace" | cut -f1), $events allocation events; heaptrack file: $(du -h "$ht" | cut -f1)"

# median wall and CPU seconds of RUNS runs of a command
measure() {
  local name=$1
  shift
  : > "$out/times.$name"
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%e %U %S" -o "$out/time.1" "$@" > /dev/null 2>&1
    tail -1 "$out/time.1" >> "$out/times.$name"
  done
  local m=$(( (runs + 1) / 2 ))
  echo "$(awk '{print $1}' "$out/times.$name" | sort -g | sed -n "${m}p") $(awk '{print $2 + $3}' "$out/times.$name" | sort -g | sed -n "${m}p")"
}

printf '%-34s %10s %10s %12s %12s\n' "renderer" "wall s" "CPU s" "wall ratio" "CPU ratio"
read -r hw hc <<< "$(measure heaptrack heaptrack_print "$ht")"
printf '%-34s %10s %10s %12s %12s\n' "heaptrack_print (text)" "$hw" "$hc" "1.00" "1.00"
for case in text json html all; do
  case $case in
    text) args=() ;;
    json) args=(--json "$out/bench.json") ;;
    html) args=(--html "$out/bench.html") ;;
    all)  args=(--json "$out/bench.json" --html "$out/bench.html") ;;
  esac
  read -r w c <<< "$(measure "$case" "$build/tagalloc" report "$out/churn.trace" "${args[@]}")"
  printf '%-34s %10s %10s %12s %12s\n' "tagalloc report ($case)" "$w" "$c" \
    "$(awk -v a="$w" -v b="$hw" 'BEGIN {printf "%.2f", a / b}')" "$(awk -v a="$c" -v b="$hc" 'BEGIN {printf "%.2f", a / b}')"
done
size=$(wc -c < "$out/churn.html")
echo "HTML page of $events events: $size bytes ($([ "$size" -lt 5000000 ] && echo "under" || echo "OVER") the 5 MB bound)"
if [ -f tests/browser/node_modules/playwright-core/package.json ] && [ -x /usr/bin/chromium ]; then
  node tests/browser/check_report.js "$out/churn.html" "$out/churn.png" data main | grep 'page ready' |
    sed 's/^ */HTML page opened in Chromium: /'
fi
echo "(medians of $runs runs on $(nproc) CPU(s); ratio = tagalloc / heaptrack_print, target <= 0.50)"
