#!/bin/bash
# The command line's conventions (tests/cli): --help and --version, - as
# standard output, --quiet, colour only on a terminal, the warning for an
# unknown TAGALLOC_ variable, --skip, the roll-up of a run with several
# processes, thousands separators and the still-reachable line, symbolized
# assertion stacks, `tagalloc diff` keys that survive an added line and
# another build folder, one report model behind the text, --json, --html and
# `tagalloc report` of a run (agree.py), the preload's exports and its own
# calls bound inside it, its jemalloc's decay.  Ends with "N passed, N failed".
#   tests/cli/run.sh BUILD_DIR
set -u
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ta=$build/tagalloc
pre=$build/libtagalloc-preload.so
tmp=$(mktemp -d "$build/cli-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; for l in "$@"; do printf '    %s\n' "$l"; done; fail=$((fail + 1)); }
# expect NAME WANT GOT: exact equality
expect() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1" "expected: $2" "got:      $3"; fi; }
# has NAME FILE TEXT: FILE contains the line part TEXT (fixed string)
has() { if grep -qF -- "$3" "$2"; then ok "$1"; else bad "$1" "no \"$3\" in:" "$(head -c 1500 "$2")"; fi; }
hasnt() { if ! grep -qF -- "$3" "$2"; then ok "$1"; else bad "$1" "\"$3\" should not be in:" "$(head -c 1500 "$2")"; fi; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)

cc -g -O0 -o "$tmp/held" "$here/progs/held.c" || { echo "FAIL cannot build held.c"; exit 1; }
held=$tmp/held
cd "$tmp"

# ---- --version, --help, bad options ------------------------------------------------
"$ta" --version > out 2> err; rc=$?
expect "--version: exit 0, version on stdout" "0 tagalloc $(sed -n 's/^#define TA_VERSION "\(.*\)"/\1/p' "$root/alloc/tagalloc.h")" "$rc $(cat out)"
for c in run report diff; do
  "$ta" $c --help > out 2> err; rc=$?
  expect "$c --help: exit 0, usage on stdout, nothing on stderr" "0 usage: tagalloc $c ." "$rc $(head -1 out | cut -d' ' -f1-3) .$(cat err)"
done
"$ta" --help > out 2> err; rc=$?
expect "--help: exit 0" "0 usage: tagalloc run" "$rc $(head -1 out | cut -d' ' -f1-3)"
"$ta" report --frobnicate x.trace > out 2> err; rc=$?
expect "report: an unknown option, exit 2" "2 tagalloc: report: unknown or ambiguous option --frobnicate (see tagalloc report --help)" "$rc $(cat err)"
"$ta" run --json > out 2> err; rc=$?
expect "run --json without a value, exit 2" "2 tagalloc: run: --json needs a value" "$rc $(cat err)"
"$ta" diff --fail-on-increase=yes a b > out 2> err; rc=$?
expect "diff: a flag given a value, exit 2" "2 tagalloc: diff: --fail-on-increase takes no value" "$rc $(cat err)"
"$ta" run --json - --html - -- "$held" > out 2> err; rc=$?
expect "run: two outputs on standard output, exit 2" "2 tagalloc: run: only one output can be - (standard output)" "$rc $(cat err)"

# ---- - is standard output; --quiet; the text's numbers ------------------------------------
"$ta" run -q --json - -- "$held" > out 2> err; rc=$?
got=$("$py" -c 'import json,sys; d=json.load(open("out")); p=d["processes"][0]; print(len(d["processes"]), p["summary"]["direct"]["bytes"], p["summary"]["reachable"]["bytes"])' 2>&1)
expect "run --json -: the document on stdout" "1 1234567 3000000" "$got"
expect "run -q: nothing on stderr, no file named -" "0 . absent" "$rc .$(cat err) $([ -e ./- ] && echo present || echo absent)"
"$ta" run -- "$held" > out 2> err
has "text: thousands separators in a finding" err "Direct leak of 1,234,567 byte(s) in 1 object(s) allocated from:"
has "text: thousands separators in the summary" err "   still reachable: 3,000,000 bytes in 3 blocks"
hasnt "text: no colour when stderr is no terminal" err $'\033['
"$ta" run -- "$held" --no-leak > out 2> err
pid=$(sed -n 's/^==\([0-9]*\)== tagalloc: no leaks, no errors.*/\1/p' err)
has "text: the still-reachable line when nothing leaked" err "==$pid== tagalloc: still reachable at exit: 3,000,000 bytes in 3 blocks (not leaks: pointers to them remain)"

# The tool reads a clean exit's trace by its records, and the FRAME
# records only when something asks for a stack (reports/trace_read.c): a
# leak: suppression and --folded, in full mode, still see the leak's stack
printf 'leak:main\n' > main.supp
"$ta" run -q --check=full --suppressions main.supp --error-exitcode 9 -- "$held" > out 2> err; rc=$?
expect "full mode: a leak: suppression matches the leak's stack (exit 0, not 9)" "0" "$rc"
"$ta" run -q --check=full --folded - -- "$held" > out 2> err
expect "full mode: --folded has the leak's stack" "main 1234567" "$(grep -oE '[^;]+ [0-9]+$' out)"

# report: --folded - is the file's content, --html - the page, -q no text
"$ta" run -q --trace t.trace -- "$held" > /dev/null 2>&1
"$ta" report -q t.trace --folded f.folded > out 2> err
"$ta" report t.trace --folded - > out2 2> err2
if [ -s f.folded ] && cmp -s f.folded out2 && [ ! -s out ]; then ok "report --folded - writes the folded stacks (and no text) on stdout"
else bad "report --folded -" "$(head -3 out2)" "$(head -3 out)"; fi
"$ta" report t.trace --html - > out 2> err
expect "report --html -: the page on stdout" "<!DOCTYPE html>" "$(head -c 15 out)"
"$ta" report --json - t.trace > out 2> err
got=$("$py" -c 'import json; d=json.load(open("out")); print(d["processes"][0]["summary"]["direct"]["bytes"])' 2>&1)
expect "report --json -: the document on stdout" "1234567" "$got"
got=$("$py" -c 'import json; print(json.load(open("out"))["processes"][0]["argv"])' 2>&1)
expect "report: the command line from the trace's COMMAND record" "['$held']" "$got"
"$ta" report t.trace > out 2> err
expect "report: the process's header names its command" "==PID== tagalloc: process PID: $held (parent" \
  "$(head -1 out | sed 's/^==[0-9]*==/==PID==/; s/process [0-9]*/process PID/; s/ (parent.*/ (parent/')"

# ---- colour: on a terminal only, never with NO_COLOR ---------------------------------------
if command -v script > /dev/null; then
  script -qec "'$ta' run -- '$held'" /dev/null > tty.out 2>&1
  has "colour on a terminal" tty.out $'\033[1;31m=='
  NO_COLOR=1 script -qec "'$ta' run -- '$held'" /dev/null > tty.out 2>&1
  hasnt "no colour with NO_COLOR on a terminal" tty.out $'\033['
else
  echo "SKIP colour: script(1) is not installed"
fi

# ---- an unknown TAGALLOC_ variable -----------------------------------------------------------
TAGALLOC_DEPHT=4 TAGALLOC_SKIP= TAGALLOC_DEBUG_CACHE=off "$ta" run -q -- "$held" --no-leak > out 2> err
expect "run: one warning for a misspelt variable" \
  "tagalloc: warning: TAGALLOC_DEPHT is not an option (did you mean TAGALLOC_DEPTH?); ignored" "$(cat err)"
TAGALLOC_REPROT=1 TAGALLOC_WHATEVER_ELSE=1 TAGALLOC_REPORT=0 LD_PRELOAD=$pre "$held" --no-leak > out 2> err
expect "the preload without run: one line per unknown variable" \
  "tagalloc: TAGALLOC_REPROT is not an option (did you mean TAGALLOC_REPORT?); ignored
tagalloc: TAGALLOC_WHATEVER_ELSE is not an option; ignored" "$(sort err)"
TAGALLOC_GPU=host TAGALLOC_GPU_CUDA_LIB=/x TAGALLOC_GPU_HOST_MEM=1G TAGALLOC_GPU_MAX_SPLIT=1M TAGALLOC_GPU_CUBLAS=/x \
  TAGALLOC_FAULT=none TAGALLOC_REPORT=0 LD_PRELOAD=$pre "$held" --no-leak > out 2> err
expect "the variables gpu/ and the training stack read are no unknown ones" "" "$(cat err)"

# ---- --skip: an exec'd program matching the glob is not audited --------------------------------
names() { "$py" -c 'import json,os; print(" ".join(sorted(os.path.basename(p["argv"][0]) for p in json.load(open("'"$1"'"))["processes"] if p.get("argv"))))' 2>&1; }
"$ta" run -q --json all.json -- /bin/sh -c "ls / > /dev/null; '$held' --no-leak" > /dev/null 2>&1
expect "without --skip every process is audited" "held ls sh" "$(names all.json)"
"$ta" run -q --json skip.json --skip 'he?d' -- /bin/sh -c "ls / > /dev/null; '$held' --no-leak" > /dev/null 2>&1
expect "--skip by name (glob)" "ls sh" "$(names skip.json)"
"$ta" run -q --json skip2.json --skip '/usr/*/ls' --skip '*/held' -- /bin/sh -c "ls / > /dev/null; '$held' --no-leak" > /dev/null 2>&1
expect "--skip by path, twice" "sh" "$(names skip2.json)"
"$ta" run --skip a,b -- /bin/true > out 2> err; rc=$?
expect "--skip with a comma, exit 2" "2 tagalloc: run: --skip a,b: one pattern per --skip (no comma)" "$rc $(cat err)"

# ---- the roll-up ------------------------------------------------------------------------------
"$ta" run -- /bin/sh -c "'$held'; '$held' --no-leak; '$held' --no-leak" > out 2> err
has "roll-up: its header" err "==tagalloc== 4 processes of /bin/sh:"
has "roll-up: the totals" err "  total: 1,234,567 bytes leaked in 1 blocks, 0 error(s)"
has "roll-up: the total's end" err "; 1 of 4 processes with leaks or errors"
got=$(sed -n '/==tagalloc== 4 processes/,$p' err | grep -c ' exit 0$')
expect "roll-up: one line per process" "4" "$got"
"$ta" run -- /bin/sh -c "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do '$held' --no-leak; done" > out 2> err
got=$(sed -n '/==tagalloc== 21 processes/,$p' err)
expect "roll-up: many clean processes fit on a line" "4" "$(printf '%s\n' "$got" | wc -l)"
has "roll-up: grouped by program" err "  ... 21 more process(es) with no leaks and no errors: sh x1, held x20"
"$ta" run -q -- /bin/sh -c "'$held'; '$held'" > out 2> err
expect "run -q: no roll-up either" "" "$(cat err)"
"$ta" run -- "$held" > out 2> err
hasnt "one process: no roll-up" err "==tagalloc=="

# errors mode: every process writes its events, but the text and the roll-up
# come from each trace's FINDING and SUMMARY records, its events not replayed
# (reports/offline.c) unless an output shows them: the roll-up is the same
# with --json, which replays them
rollup_of() { sed -n '/==tagalloc== 3 processes/,$p' "$1" | sed -E 's/^ +[0-9]+  /  PID  /'; }
"$ta" run --check=errors -- /bin/sh -c "'$held'; '$held' --no-leak" > out 2> err
"$ta" run --check=errors --json errors.json -- /bin/sh -c "'$held'; '$held' --no-leak" > out 2> err2
has "errors mode roll-up: the totals" err "  total: 1,234,567 bytes leaked in 1 blocks, 0 error(s), "
expect "errors mode roll-up: the same without the replay as with it" "$(rollup_of err2)" "$(rollup_of err)"
expect "errors mode roll-up: a line per process" "6" "$(rollup_of err | wc -l)"

# ---- symbolized stacks from the assertion macros -----------------------------------------------
if cc -g -O0 -D_GNU_SOURCE -I"$root/alloc" -o assert_live "$here/progs/assert_live.c" \
     -Wl,-u,report_text_write "$build/libtagalloc.a" -ljemalloc -lunwind -ldw -lelf -lpthread -ldl -lm 2> err; then
  { ./assert_live > out 2> err; } 2> /dev/null; rc=$?
  has "TA_ASSERT_NO_LEAKS_SINCE aborts with the failing line" err "assert_live.c:15: tagalloc assertion failed: live blocks since mark"
  has "TA_ASSERT_NO_LEAKS_SINCE: the stack symbolized" err "in forgotten_block $here/progs/assert_live.c:8 ("
  expect "TA_ASSERT_NO_LEAKS_SINCE: SIGABRT" "134" "$rc"
else
  bad "assert_live.c builds" "$(cat err)"
fi

# ---- diff: keys that survive an added line and another folder -------------------------------------
mkdir -p a b/src c
cp "$here/progs/sites.c" a/sites.c
sed 's|^static void make_table(int n) {|/* one more comment line */\n&|' "$here/progs/sites.c" > b/src/sites.c
sed 's|make_table(10);|make_table(11);|' "$here/progs/sites.c" > c/sites.c
(cd a && cc -g -O0 -o sites sites.c) && (cd b && cc -g -O0 -o sites src/sites.c) && (cd c && cc -g -O0 -o sites sites.c) ||
  bad "sites.c builds"
for v in a b c; do "$ta" run -q --trace $v.trace -- ./$v/sites > /dev/null 2>&1; done
"$ta" report -q a.trace --json a.json
got=$("$py" -c 'import json; print(sorted(c["key"] for c in json.load(open("a.json"))["processes"][0]["callsites"] if "sites.c" in c["key"]))' 2>&1)
expect "callsite keys: function, file name, line offset" "['make_buffer sites.c:+1', 'make_table sites.c:+2']" "$got"
"$ta" diff --fail-on-increase a.trace b.trace > out 2> err; rc=$?
expect "diff: a comment line and another folder give no change" "0 tagalloc diff: a.trace -> b.trace:" "$rc $(head -1 out | cut -d' ' -f1-5)"
has "diff: nothing changed" out "callsite(s), 0 changed"
"$ta" diff --fail-on-increase a.trace c.trace > out 2> err; rc=$?
expect "diff: one more allocation fails --fail-on-increase" "1" "$rc"
has "diff: the callsite that grew" out "+1 (10 -> 11)            +64 (640 -> 704)"
has "diff: its key" out "make_table sites.c:+2"
"$ta" diff --fail-on-increase a.json b.trace > out 2> err; rc=$?
expect "diff: a report --json against a trace" "0" "$rc"

# diff reads JSON with libjansson: a bad escape is an error, a surrogate pair a character
printf '{"processes":[{"callsites":[{"key":"f \\uZZZZ","allocs":1}]}]}' > badesc.json
"$ta" diff badesc.json badesc.json > out 2> err; rc=$?
expect "diff: a bad \\u escape is refused" "2 tagalloc: diff: badesc.json: not a tagalloc JSON report:" "$rc $(cut -d' ' -f1-8 err)"
printf '{"processes":[{"callsites":[{"key":"f \\ud83d\\ude00","allocs":1,"bytes":8}]}]}' > pair.json
printf '{"processes":[{"callsites":[{"key":"f \xf0\x9f\x98\x80","allocs":2,"bytes":16}]}]}' > utf8.json
"$ta" diff pair.json utf8.json > out 2> err; rc=$?
expect "diff: a surrogate pair is the same callsite as its UTF-8" "0 tagalloc diff: pair.json -> utf8.json: 1 callsite(s), 1 changed" "$rc $(head -1 out)"

# ---- --check: what each mode catches, exactly -------------------------------------------------
# progs/modes.c: 1,600 writes after free, 10 double frees, 5 interior frees,
# 4 overflows, 3 leaks.  leaks (the default) misses the writes after free and
# keeps no free stack but a finding's (an overflow found at a free); errors quarantines one freed block in 16 (100 of the
# 1,600 writes); full all of them.
# kinds FILE: "kind:blocks:free_stack ..." of the one process, by kind
kinds() { "$py" -c 'import json; p=json.load(open("'"$1"'")); p=p["processes"][0] if "processes" in p else p; print(" ".join("%s:%d:%d" % (f["kind"], f["blocks"], bool(f.get("free_stack"))) for f in sorted(p["findings"], key=lambda f: f["kind"])))' 2>&1; }
# traced MODE-OPTIONS...: does the audited process trace its events?  (Every
# process writes a trace, its one record of its findings; the events only
# where an output or the mode needs them.)
traced() { "$ta" run -q "$@" -- env | grep -c '^TAGALLOC_TRACE_EVENTS=1'; }
if cc -g -O0 -Wno-free-nonheap-object -o modes "$here/progs/modes.c"; then
  "$ta" run -q --json m.json -- ./modes 2> err; rc=$?
  expect "--check: the default is leaks (no use after free, no free stacks, no trace)" \
    "0 free.double:10:0 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0" "$rc $(kinds m.json)"
  expect "--check: trace events in leaks mode only for --trace, --html, --folded-peak; always in errors and full" \
    "0 1 1 1 0 1 1" "$(traced) $(traced --trace t.trace) $(traced --html h.html) $(traced --folded-peak -) $(traced --folded -) $(traced --check=errors) $(traced --check=full)"
  "$ta" run -q --check errors --json m.json -- ./modes 2> err; rc=$?
  expect "--check=errors: one write after free in 16, free stacks" \
    "0 free.double:10:1 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0 use.after-free:100:1" "$rc $(kinds m.json)"
  TAGALLOC_QUARANTINE_SAMPLE=4 "$ta" run -q --check=errors --json m.json -- ./modes 2> err; rc=$?
  expect "--check=errors, TAGALLOC_QUARANTINE_SAMPLE=4: one in 4" \
    "0 free.double:10:1 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0 use.after-free:400:1" "$rc $(kinds m.json)"
  TAGALLOC_CHECK=full "$ta" run -q --json m.json -- ./modes 2> err; rc=$?
  expect "TAGALLOC_CHECK=full: every write after free" \
    "0 free.double:10:1 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0 use.after-free:1600:1" "$rc $(kinds m.json)"
  TAGALLOC_CHECK=full "$ta" run -q --check=leaks --json m.json -- ./modes 2> err; rc=$?
  expect "--check wins over TAGALLOC_CHECK" \
    "0 free.double:10:0 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0" "$rc $(kinds m.json)"
  LD_PRELOAD=$pre TAGALLOC_TRACE=m.trace TAGALLOC_REPORT=0 ./modes 2> err; rc=$?
  "$ta" report -q --json m.json m.trace
  expect "the preload alone: full" \
    "0 free.double:10:1 free.invalid:5:0 heap.overflow:4:1 leak.direct:3:0 use.after-free:1600:1" "$rc $(kinds m.json)"
else
  bad "cannot build modes.c"
fi
# progs/overflow_free.c: an overflow found at the free on line 13.  Every
# mode, with and without --guard, says so and shows that free's stack (leaks
# mode takes the stack when the free finds the damage; --guard's check of the
# slack before its guard page did not set the free stack).
if cc -g -O0 -o overflow_free "$here/progs/overflow_free.c"; then
  got=""
  for g in "" --guard; do
    for m in leaks full; do
      "$ta" run $g --check=$m -- ./overflow_free > out 2> err
      got="$got $(grep -A1 -e 'found at its free:' -e 'accessed at' err | grep -oE 'found at its free:|accessed at: not seen|accessed at:|overflow_free.c:[0-9]+' | tr '\n' ' ')"
    done
  done
  expect "heap.overflow found at a free names the free, in leaks and full mode, with and without --guard" \
    " found at its free: overflow_free.c:13  found at its free: overflow_free.c:13  found at its free: overflow_free.c:13  found at its free: overflow_free.c:13 " "$got"
else
  bad "cannot build overflow_free.c"
fi
# progs/beside.c: in the default mode a small block's record is the 16
# bytes before it (alloc/beside.h).  A write there is found at the block's
# free (line 18) as heap.overflow, the program goes on; a live block's
# written pad is found at exit; malloc_usable_size says the bytes asked
# for.  With TAGALLOC_BESIDE=0 the records are in the table: the write
# before the block lands in jemalloc's block before it, unseen.
if cc -g -O0 -o beside "$here/progs/beside.c"; then
  "$ta" run -q --json b.json -- ./beside > out 2> err; rc=$?
  expect "records beside blocks: a write before a block is found at its free, a written pad at exit" \
    "0 100 5000 heap.overflow:1:1 heap.overflow:1:0" "$rc $(cat out) $(kinds b.json)"
  "$ta" run -- ./beside > out 2> err
  expect "records beside blocks: the free that found the written record is named" \
    "found at its free: beside.c:18" "$(grep -A1 'found at its free:' err | grep -oE 'found at its free:|beside.c:[0-9]+' | tr '\n' ' ' | sed 's/ $//')"
  has "records beside blocks: the report says what was written" err "wrote the 16 bytes before the block (its record): an underflow, or the block before overflowed"
  TAGALLOC_BESIDE=0 "$ta" run -q --json b.json -- ./beside > out 2> err; rc=$?
  expect "TAGALLOC_BESIDE=0: the records in the table, the write before the block unseen" \
    "0 100 5000 heap.overflow:1:0" "$rc $(cat out) $(kinds b.json)"
else
  bad "cannot build beside.c"
fi
# progs/beside_lost.c: a block whose record was written and which is
# then lost is still a leak to the exit scan (of jemalloc's size, no stack).
if cc -g -O0 -o beside_lost "$here/progs/beside_lost.c"; then
  "$ta" run -- ./beside_lost > out 2> err; rc=$?
  expect "records beside blocks: a lost block whose record was written is still a leak" \
    "0 Direct leak of 48 byte(s) in 1 object(s) allocated from: <no stack recorded> definitely lost: 48 bytes in 1 blocks" \
    "$rc $(grep -A1 '^Direct leak' err | sed 's/^ *//' | tr '\n' ' ')$(grep -o 'definitely lost: .*' err)"
else
  bad "cannot build beside_lost.c"
fi
# progs/beside_threads.c: four threads make blocks with their records
# beside them and free each other's, then leak 100 blocks of 1,300 bytes:
# the exit scan finds exactly those (lost or still reachable from a stale
# copy), with no finding of a bad free.
if cc -g -O2 -pthread -o beside_threads "$here/progs/beside_threads.c"; then
  got=""
  for b in 1 0; do
    TAGALLOC_BESIDE=$b "$ta" run -q --json bt.json -- ./beside_threads > out 2> err; rc=$?
    got="$got $rc $("$py" -c 'import json; p=json.load(open("bt.json")); p=p["processes"][0] if "processes" in p else p; s=p["summary"]; k=("direct","indirect","possible","reachable"); print(sum(s[x]["blocks"] for x in k), sum(s[x]["bytes"] for x in k), s["allocs"]-s["frees"], s["errors"])' 2>&1)"
  done
  expect "records beside blocks, 4 threads freeing each other's: 100 blocks, 1,300 bytes left, no error (TAGALLOC_BESIDE on, off)" \
    " 0 100 1300 100 0 0 100 1300 100 0" "$got"
else
  bad "cannot build beside_threads.c"
fi
# An exit-only trace (leaks mode, no output needing events) holds the
# frames of its findings' stacks, not the whole depot: bench/auditor/tree.c
# at depth 12 makes thousands of distinct stacks and leaks one block.
if cc -O2 -g -fno-omit-frame-pointer -o tree "$here/../../bench/auditor/tree.c"; then
  rm -f eo.trace
  TAGALLOC_TRACE_EVENTS=0 TAGALLOC_CHECK=leaks TAGALLOC_TRACE=eo.trace TAGALLOC_REPORT=0 LD_PRELOAD=$pre \
    ./tree --depth 12 --iters 1 > /dev/null 2>&1
  "$ta" report -q --json eo.json eo.trace 2> err
  got=$("$py" -c 'import json; p=json.load(open("eo.json"))["processes"][0]; print(" ".join("%s:%d:%s" % (f["kind"], f["blocks"], ">".join(x.get("function","?") for x in f["stack"][:2])) for f in p["findings"]))' 2>&1)
  expect "exit-only trace: the findings' frames only (under 16 KB), the leak's stack whole" \
    "1 leak.direct:1:leak_one>main" "$([ "$(stat -c %s eo.trace)" -lt 16384 ] && echo 1 || stat -c %s eo.trace) $got"
else
  bad "cannot build bench/auditor/tree.c"
fi
"$ta" run --check=some -- true > out 2> err; rc=$?
expect "--check: a bad mode is a usage error" "2 tagalloc: run: --check some: expected leaks, errors or full" "$rc $(cat err)"

# ---- one model behind every rendering -----------------------------------------------------------
# progs/agree.c: two groups of direct leaks, an indirect leak, a double free,
# an invalid free.  The process's own text report, run's --json, --html and
# --folded, and `tagalloc report`'s JSON and text of the kept trace: the same
# findings (kind, bytes, blocks, top frame), the same error and loss-record
# counts, the same leaked bytes by frame.
if cc -g -O0 -Wno-free-nonheap-object -o agree "$here/progs/agree.c"; then
  "$ta" run --json ag.json --html ag.html --folded ag.folded --trace ag.trace -- ./agree 2> ag-run.txt
  "$ta" report --json ag-rep.json ag.trace > ag-rep.txt 2>&1
  expect "run's text, --json, --html, --folded and report of the trace agree, finding by finding" \
    "agree: 6 findings, 2 errors, 3 loss records" \
    "$("$py" "$here/agree.py" ag-run.txt ag.json ag.html ag-rep.json ag-rep.txt ag.folded 2>&1)"
  # the same without a kept trace (an exit-only trace): the same JSON
  "$ta" run -q --json ag2.json -- ./agree 2> /dev/null
  expect "run --json from an exit-only trace: the same findings" \
    "$("$py" -c 'import json; p=json.load(open("ag.json"))["processes"][0]; print([(f["kind"], f["bytes"], f["blocks"]) for f in p["findings"]], p["errors"], p["loss_records"], p["summary"])')" \
    "$("$py" -c 'import json; p=json.load(open("ag2.json"))["processes"][0]; print([(f["kind"], f["bytes"], f["blocks"]) for f in p["findings"]], p["errors"], p["loss_records"], p["summary"])')"
else
  bad "cannot build agree.c"
fi

# ---- a process killed before its report, in leaks mode ------------------------------------------
# Its exit-only trace has the header and the command line: the JSON lists it
# (killed by SIGKILL, nothing counted) and the text says what to add.
printf '#include <signal.h>\n#include <stdlib.h>\nint main(void) { void *volatile p = malloc(100); (void)p; raise(SIGKILL); return 0; }\n' > killed.c
if cc -O0 -o killed killed.c; then
  "$ta" run --json k.json -- ./killed > out 2> err
  expect "killed in leaks mode: in the JSON, without findings" "SIGKILL False 0" \
    "$("$py" -c 'import json; p=json.load(open("k.json"))["processes"][0]; print(p["signal_name"], p["clean_exit"], len(p["findings"]))')"
  has "killed in leaks mode: the text says what to add" err "without its exit report (its trace has no events: run with --trace to see what was live)"
else
  bad "cannot build killed.c"
fi

# ---- a process killed before its report, in full mode -----------------------------------------
# tagalloc run reads each trace's records first and its events only when the
# records ask for them: a killed process has no END record, so its events are
# read and replayed, and the blocks it kept are in the text.
printf '#include <signal.h>\n#include <stdlib.h>\nstatic void *volatile keep[50];\nint main(void) {\n  for (int i = 0; i < 50; i++) keep[i] = malloc(100);\n  for (int i = 0; i < 100000; i++) free(malloc(64));\n  raise(SIGKILL);\n  return 0;\n}\n' > killed_full.c
if cc -O0 -o killed_full killed_full.c; then
  "$ta" run --check=full -- ./killed_full > out 2> err
  has "killed in full mode: the text from its events" err "Unclassified: 5,000 byte(s) in 50 object(s) live at the end"
else
  bad "cannot build killed_full.c"
fi

# ---- a report holds a window of its trace, not the whole file -------------------------------------
# progs/grow.c: 120 iterations of 40,000 blocks made and freed (a trace of
# about 55 MB) and a site that grows.  tagalloc report of it finds the growth
# with a peak RSS under a quarter of the trace's size (it was the size of the
# trace plus the model).
if cc -g -O0 -I"$root/alloc" -o grow "$here/progs/grow.c" -L"$build" -ltagalloc -Wl,-rpath,"$build"; then
  "$ta" run -q --trace grow.trace -- ./grow 120 40000 2> /dev/null
  got=$("$py" - "$ta" grow.trace <<'PY'
import json, os, resource, subprocess, sys
ta, trace = sys.argv[1:3]
subprocess.run([ta, "report", "-q", "--json", "grow.json", trace], check=True)
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
size_kib = os.path.getsize(trace) // 1024
p = json.load(open("grow.json"))["processes"][0]
growth = [f for f in p["findings"] if f["kind"] == "leak.growth"]
print("growth", len(growth), growth[0]["bytes"] if growth else 0,
      "bounded" if size_kib > 40000 and peak_kib * 4 < size_kib else f"peak {peak_kib} KiB for a {size_kib} KiB trace")
PY
)
  expect "report: the growth of a 55 MB trace, in a quarter of its size" "growth 1 120000 bounded" "$got"
else
  bad "cannot build grow.c"
fi

# ---- the page: one row per headline of ref.underflow ----------------------------------------------
# progs/underflow.c: two objects released once too often in drop_ref, from
# two callers.  The JSON keeps the ledger's two groups; the page's table
# shows one row (blocks 2, the second object under it).
if cc -g -O0 -I"$root/alloc" -o underflow "$here/progs/underflow.c" -Wl,-u,report_text_write \
     "$build/libtagalloc.a" -ljemalloc -lunwind -ldw -lelf -lpthread -ldl -lm; then
  TAGALLOC_TRACE=uf.trace TAGALLOC_REPORT=0 ./underflow 2> /dev/null
  "$ta" report -q --json uf.json --html uf.html uf.trace
  got=$("$py" - <<'PY'
import json, re
j = json.load(open("uf.json"))["processes"][0]["findings"]
page = open("uf.html").read()
d = json.loads(re.search(r'<script type="application/json" id="tagalloc-data">(.*?)</script>', page, re.S).group(1))
rows = [f for f in d["findings"] if f["kind"] == "ref.underflow"]
print(sum(f["kind"] == "ref.underflow" for f in j), len(rows), [(f["blocks"], f.get("groups"), len(f.get("others", []))) for f in rows])
PY
)
  expect "html: ref.underflow groups under one headline are one row" "2 1 [(2, 2, 1)]" "$got"
else
  bad "cannot build underflow.c"
fi

# ---- a program linked with libtagalloc.a: one report ---------------------------------------------
# Its own copy of the ledger records nothing (malloc is the preload's): the
# preload's report is the process's, and the copy's "no leaks" would repeat it.
printf '#include "tagalloc.h"\n#include <stdlib.h>\nint main(void) { void *volatile p = malloc(10); free(p); ta_mark_now(); return 0; }\n' > linked.c
if cc -g -O0 -I"$root/alloc" -o linked linked.c -Wl,-u,report_text_write "$build/libtagalloc.a" \
     -ljemalloc -lunwind -ldw -lelf -lpthread -ldl -lm; then
  "$ta" run -- ./linked > out 2> err
  expect "libtagalloc.a under run: one \"no leaks\" line" "1" "$(grep -c 'no leaks, no errors' err)"
  ./linked > out 2> err
  expect "libtagalloc.a alone: its own report" "1" "$(grep -c 'no leaks, no errors' err)"
else
  bad "cannot build a program linked with libtagalloc.a"
fi

# ---- the preload links only its own stderr report --------------------------------------------
# No renderer of traces in it (trace reader, JSON, HTML, folded stacks), and
# no report_* symbol exported: a program that links libtagalloc keeps its own.
expect "the preload exports no report_* function" "0" \
  "$(nm -D --defined-only "$pre" | grep -c ' report_')"
expect "the preload has no trace reader, JSON, HTML or folded renderer" "" \
  "$(nm "$pre" | grep -oE ' (report_trace_open|report_offline_open|report_json_process|report_html_write|report_folded_write|report_model_add_offline)$')"

# ---- the preload binds its own calls (tools/preload.dyn) ------------------------------------
# Its _ta_*, _pl_* and ta_* functions are exported but called directly,
# never through its PLT; the API it interposes (free here) stays preemptible.
expect "the preload calls none of its own functions through the PLT" "0" \
  "$(objdump -d "$pre" | grep -cE 'call.*<(_ta_|_pl_|ta_)[^>]*@plt>')"
expect "the preload's free stays preemptible" "yes" \
  "$(objdump -d "$pre" | grep -qE 'call.*<free@plt>' && echo yes)"
expect "the preload still exports ta_mark_now and _ta_init" "2" \
  "$(nm -D --defined-only "$pre" | grep -cE ' (ta_mark_now|_ta_init)$')"

# ---- the audited heap's jemalloc decays in 60 s (tools/preload_jemalloc.c) --------------------
# jemalloc's stats at exit name the option in force; the program's MALLOC_CONF wins.  Only
# where the preload links jemalloc's archive (a libjemalloc.so keeps its own options).
if ldd "$pre" | grep -q libjemalloc; then
  ok "jemalloc's decay: the preload links libjemalloc.so, nothing to check"
else
  expect "the audited heap's pages decay in 60 s" "opt.dirty_decay_ms: 60000" \
    "$(LD_PRELOAD="$pre" MALLOC_CONF=stats_print:true /bin/true 2>&1 | grep -o 'opt.dirty_decay_ms: [0-9-]*')"
  expect "the program's MALLOC_CONF sets the decay" "opt.dirty_decay_ms: 5000" \
    "$(LD_PRELOAD="$pre" MALLOC_CONF=stats_print:true,dirty_decay_ms:5000 /bin/true 2>&1 | grep -o 'opt.dirty_decay_ms: [0-9-]*')"
  expect "jemalloc's malloc_conf stays inside the preload" "0" \
    "$(nm -D --defined-only "$pre" | grep -cw malloc_conf)"
fi

# ---- every option of the table is documented ------------------------------------------------
missing=
for n in $(grep -o '{ "[a-z_]*", *OPT_' "$root/alloc/options.c" | sed 's/{ "\([a-z_]*\)".*/\1/'); do
  v=TAGALLOC_$(echo "$n" | tr a-z A-Z)
  grep -q "| \`$v\` |" "$root/README.md" || missing="$missing README:$v"
  grep -q "^\.BR\? $v" "$root/man/tagalloc.7" || missing="$missing tagalloc.7:$v"
done
expect "every option in README's table and in tagalloc(7)" "" "$missing"

# ---- every finding kind of the table is documented ------------------------------------------
# (alloc/kinds.c's table; an entry of tagalloc(7)'s FINDING KINDS is a .B or .BR line naming
# it, one of ARCHITECTURE.md's table a row whose first cell names it)
missing=
kinds_man=$(sed -n '/^\.SH FINDING KINDS/,/^\.SH /p' "$root/man/tagalloc.7" | grep '^\.BR\? ')
for k in $(sed -n 's/^ *\[TA_KIND_[A-Z_]*\] *= { "\([a-z.-]*\)".*/\1/p' "$root/alloc/kinds.c"); do
  printf '%s\n' "$kinds_man" | grep -qwF -- "$k" || missing="$missing tagalloc.7:$k"
  grep '^| `' "$root/docs/ARCHITECTURE.md" | cut -d'|' -f2 | grep -qF "\`$k\`" \
    || missing="$missing ARCHITECTURE.md:$k"
done
[ -n "$(sed -n 's/^ *\[TA_KIND_[A-Z_]*\] *= { "\([a-z.-]*\)".*/\1/p' "$root/alloc/kinds.c")" ] \
  || missing="no kinds read from alloc/kinds.c"
expect "every finding kind in tagalloc(7) and docs/ARCHITECTURE.md" "" "$missing"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
