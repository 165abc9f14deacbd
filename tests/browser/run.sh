#!/bin/sh
# The browser test of the HTML report: Debian's chromium, driven headless by
# playwright-core (installed into tests/browser/node_modules from
# package-lock.json on first use), opens generated reports and checks
# the findings table, an expanded stack, the timeline, the flame graphs and
# that nothing the program controls can run (tests/browser/check_report.js).
# Screenshots go to BUILD/browser/*.png.
#   tests/browser/run.sh BUILD_DIR
set -eu
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$1
here=$(cd "$(dirname "$0")" && pwd)
out=$build/browser
mkdir -p "$out"
[ -x /usr/bin/chromium ] || { echo "browser test: /usr/bin/chromium is missing (make deps installs it)" >&2; exit 1; }
command -v node >/dev/null || { echo "browser test: node is missing (make deps installs nodejs)" >&2; exit 1; }
if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  echo "browser test: installing playwright-core into tests/browser/node_modules"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
failed=0
run() {   # NAME PAGE ROWS FUNCTION [--xss]
  name=$1
  shift
  echo "== $name"
  if node "$here/check_report.js" "$@"; then echo "PASS browser $name"; else echo "FAIL browser $name"; failed=$((failed + 1)); fi
}
no_markup() {   # PAGE: nothing program-controlled as raw markup in the file
  if grep -q -e '<img' -e '</script><script>' "$1"; then
    echo "FAIL browser $(basename "$1"): raw markup from the program in the file"
    failed=$((failed + 1))
  else
    echo "PASS browser $(basename "$1"): no raw markup from the program in the file"
  fi
}

# 1. the golden test's synthetic trace: exact rows
"$build/tagalloc" report tests/reports/traces/leaks.trace --html "$out/leaks.html" > /dev/null
run leaks "$out/leaks.html" "$out/leaks.png" 6 'app+0x1910'

# 2. tag, slot, detail and module names that are HTML and script
"$build/tagalloc" report tests/reports/traces/xss.trace --html "$out/xss.html" > /dev/null
run xss-trace "$out/xss.html" "$out/xss.png" 2 '<img src=x onerror=' --xss
no_markup "$out/xss.html"

# 3. a real program under `tagalloc run`: its source file, its C++ template
#    symbols and its argument are HTML
src="$out/<img src=x onerror=alert(1)>.cc"
cp "$here/leaky.cc" "$src"
g++ -g -O1 -fno-omit-frame-pointer "$src" -o "$out/leaky"
"$build/tagalloc" run --html "$out/leaky.html" -- "$out/leaky" '<img src=x onerror=alert(2)>' 2> "$out/leaky.stderr" \
  || { echo "FAIL browser leaky: tagalloc run failed (see $out/leaky.stderr)"; failed=$((failed + 1)); }
run leaky "$out/leaky.html" "$out/leaky.png" data 'make_leak<std::pair<int, char>' --xss
no_markup "$out/leaky.html"

# 4. fork and exec: a legend that tells the images apart, a leak through an
#    allocator wrapper named by its caller, and the same page from the kept
#    traces, which name the program (their COMMAND records)
cc -g -O0 "$here/forkexec.c" -o "$out/forkexec"
rm -rf "$out/forkexec.traces"
"$build/tagalloc" run -q --trace "$out/forkexec.traces/" --html "$out/forkexec.html" -- "$out/forkexec" \
  || { echo "FAIL browser forkexec: tagalloc run failed"; failed=$((failed + 1)); }
run forkexec "$out/forkexec.html" "$out/forkexec.png" 1 make_node --top 'make_node forkexec.c' --cmd "$out/forkexec"
"$build/tagalloc" report -q "$out/forkexec.traces" --html "$out/forkexec-traces.html"
run forkexec-traces "$out/forkexec-traces.html" "$out/forkexec-traces.png" 1 make_node --top make_node --cmd "$out/forkexec"

# 5. nothing leaked: the flame graph opens on the bytes live at the peak
cc -g -O0 "$here/../cli/progs/held.c" -o "$out/held"
"$build/tagalloc" run -q --html "$out/held.html" -- "$out/held" --no-leak
run held "$out/held.html" "$out/held.png" 0 main --cmd "$out/held"

# 6. the demo pages: make demo (one epoch cut to 120 steps here) and make demo-bugs
root=$(cd "$here/../.." && pwd)
if make -s -C "$root" BUILD="$(cd "$build" && pwd)" demo DEMO_ARGS="--epochs 1 --steps 120 --test 500" > "$out/demo.log" 2>&1; then
  run demo "$build/lenet-report.html" "$out/demo.png" 0 main --cmd "$(cd "$build" && pwd)/train-lenet" --demo
else
  echo "FAIL browser demo: make demo failed (see $out/demo.log)"; failed=$((failed + 1))
fi
if make -s -C "$root" BUILD="$(cd "$build" && pwd)" demo-bugs > "$out/demo-bugs.log" 2>&1; then
  run demo-bugs "$build/demo-bugs.html" "$out/demo-bugs.png" data tensor_new --cmd "$(cd "$build" && pwd)/demo"
else
  echo "FAIL browser demo-bugs: make demo-bugs failed (see $out/demo-bugs.log)"; failed=$((failed + 1))
fi
# 7. a page rendered in the process, without a trace: train-lenet --html,
# 12 steps (a mark each), its timeline from the ledger's samples
if "$build/train-lenet" --epochs 2 --steps 6 --test 200 --seed 3 --html "$out/lenet-inproc.html" > "$out/lenet-inproc.log" 2>&1; then
  run lenet-inproc "$out/lenet-inproc.html" "$out/lenet-inproc.png" 0 main --cmd "$build/train-lenet" --marks 12
else
  echo "FAIL browser lenet-inproc: train-lenet failed (see $out/lenet-inproc.log)"; failed=$((failed + 1))
fi

[ "$failed" = 0 ] && echo "browser test: all passed (screenshots in $out)" || echo "browser test: $failed failed"
[ "$failed" = 0 ]
