#!/usr/bin/env python3
"""The checks of gpu-audit.sh, on a machine with a GPU.

Usage: gpu_check.py BUILD_DIR COMPUTE_SANITIZER PROGRAM...
       gpu_check.py --help

Each PROGRAM (gpu_leaks.cu built by nvcc) prints "LEAK function bytes tag"
for the one block of each kind it leaks.  Checked:
  - under `tagalloc run --json`: exactly those gpu.leak groups, one block
    each, with their bytes and tag, the function on top, detail "device 0";
  - the same with argument "reset" (cudaDeviceReset), the detail saying
    "at context teardown";
  - under `compute-sanitizer --leak-check full PROGRAM reset`: every leak it
    reports has the size of a declared one (the oracle), and each declared
    leak is listed with whether the sanitizer saw it.
Prints PASS/FAIL lines, a table per program, the wall times bare and under
tagalloc, and "N passed, N failed" (tally.py, shared with check.py; exit 1
on a failure, 77 when the program finds no device).  check.py runs the
paths that need no device (--help, the usage, SKIP, a FAIL) everywhere.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from tally import finish, result

BUILD = SANITIZER = TAGALLOC = None


def declared(stdout):
    leaks = {}
    for line in stdout.splitlines():
        w = line.split()
        if len(w) == 4 and w[0] == "LEAK":
            leaks[w[1]] = (int(w[2]), w[3])
    return leaks


def audited(prog, args):
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "out.json")
        t0 = time.monotonic()
        r = subprocess.run([TAGALLOC, "run", "--json", js, "--", prog, *args], capture_output=True,
                           text=True, timeout=300)
        dt = time.monotonic() - t0
        doc = json.load(open(js)) if os.path.exists(js) else None
    return r, doc, dt


def check_findings(name, doc, want, teardown):
    problems = []
    if doc is None or len(doc["processes"]) != 1:
        result(name, ["no JSON document, or not one process"])
        return
    seen = set()
    for f in doc["processes"][0]["findings"]:
        if f["kind"] != "gpu.leak":
            continue
        top = f["stack"][0] if f["stack"] else {}
        fn = (top.get("function") or "?").split("(")[0]
        if fn not in want:
            problems.append(f"a gpu.leak not declared: {f['bytes']} B [{f['tag']}] at {fn} "
                            f"({top.get('file')}:{top.get('line')}), detail {f.get('detail')!r}")
            continue
        seen.add(fn)
        nbytes, tag = want[fn]
        detail = "device 0" + (", at context teardown" if teardown else "")
        if fn == "leak_map":
            detail += ": mapped, its handle released"
        if (f["bytes"], f["blocks"], f["tag"], f.get("detail", "")) != (nbytes, 1, tag, detail):
            problems.append(f"{fn}: {f['bytes']} B in {f['blocks']} [{f['tag']}] {f.get('detail')!r}, "
                            f"expected {nbytes} B in 1 [{tag}] {detail!r}")
    for fn in want:
        if fn not in seen:
            problems.append(f"no gpu.leak at {fn}")
    result(name, problems)
    return seen


def check_program(prog):
    """The checks of one PROGRAM; exits 77 when it finds no device."""
    base = os.path.basename(prog)
    t0 = time.monotonic()
    bare = subprocess.run([prog], capture_output=True, text=True, timeout=300)
    bare_s = time.monotonic() - t0
    if bare.returncode == 77:
        print(f"SKIP gpu-audit: {base} finds no CUDA device")
        sys.exit(77)
    want = declared(bare.stdout)
    if bare.returncode != 0 or "DONE" not in bare.stdout or len(want) != 9:
        result(f"{base} bare", [f"exit {bare.returncode}, stdout {bare.stdout!r}, stderr {bare.stderr[-500:]!r}"])
        return
    r, doc, audit_s = audited(prog, [])
    if r.returncode != 0 or declared(r.stdout) != want:
        result(f"{base} under tagalloc", [f"exit {r.returncode}, stdout {r.stdout!r}"])
    found = check_findings(f"{base}: gpu.leak at exit", doc, want, False) or set()
    r, doc, _ = audited(prog, ["reset"])
    check_findings(f"{base}: gpu.leak at cudaDeviceReset", doc, declared(r.stdout) or want, True)

    san = subprocess.run([SANITIZER, "--leak-check", "full", prog, "reset"], capture_output=True, text=True,
                         timeout=600)
    text = san.stdout + san.stderr
    sizes = [int(s.replace(",", "")) for s in re.findall(r"Leaked ([\d,]+) bytes", text)]
    by_size = {}
    for fn, (nbytes, _) in want.items():
        by_size.setdefault(nbytes, []).append(fn)
    problems = []
    for s in sizes:
        if s not in by_size:
            problems.append(f"compute-sanitizer reports a {s}-byte leak the program did not declare")
    if not sizes:
        problems.append("compute-sanitizer reported no leak at all: "
                        + (text.strip().splitlines() or ["(no output)"])[-1])
    print(f"    {base}: {'function':<16} {'bytes':>10} {'tag':<13} tagalloc compute-sanitizer")
    for fn, (nbytes, tag) in sorted(want.items(), key=lambda kv: kv[1][0]):
        print(f"    {base}: {fn:<16} {nbytes:>10} {tag:<13} {'yes' if fn in found else 'NO':<8} "
              f"{'yes' if nbytes in sizes else 'no'}")
    missed = [s for s in sizes if s in by_size and not any(fn in found for fn in by_size[s])]
    for s in missed:
        problems.append(f"compute-sanitizer's {s}-byte leak is not among tagalloc's gpu.leak")
    result(f"{base}: compute-sanitizer --leak-check full agrees", problems)
    print(f"    {base}: wall time bare {bare_s:.2f} s, under tagalloc run {audit_s:.2f} s")


def main(argv):
    global BUILD, SANITIZER, TAGALLOC
    if len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) < 4:
        print("usage: gpu_check.py BUILD_DIR COMPUTE_SANITIZER PROGRAM...", file=sys.stderr)
        return 2
    BUILD, SANITIZER = argv[1], argv[2]
    TAGALLOC = os.path.join(BUILD, "tagalloc")
    for prog in argv[3:]:
        check_program(prog)
    finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
