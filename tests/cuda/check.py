#!/usr/bin/env python3
"""Checks `tagalloc run` on the CUDA test programs (run.sh builds them).

Usage: check.py BUILD_DIR OUT_DIR

Each program runs bare, then under `BUILD_DIR/tagalloc run --json` with
LD_LIBRARY_PATH at OUT_DIR (the stand-in driver): the same exit status and
stdout, and exactly the findings expected: one gpu.leak group per kind of
device memory (workload.c), with its bytes, tag, detail and the leaking
function and file in the top frame; nothing else.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BUILD, OUT = sys.argv[1], sys.argv[2]
TAGALLOC = os.path.join(BUILD, "tagalloc")
ENV = dict(os.environ, LD_LIBRARY_PATH=OUT)
ENV.pop("LD_PRELOAD", None)

# function -> (bytes, tag, detail suffix)
LEAKS = {
    "leak_malloc": (1000, "cuda.malloc", ""),
    "leak_pitch": (3072, "cuda.malloc", ""),
    "leak_managed": (4000, "cuda.managed", ""),
    "leak_hostalloc": (5000, "cuda.host", ""),
    "leak_allochost": (6000, "cuda.host", ""),
    "leak_async": (7000, "cuda.async", ""),
    "leak_async_ptsz": (8000, "cuda.async", ""),
    "leak_pool": (9000, "cuda.async", ""),
    "leak_pool_ptsz": (10000, "cuda.async", ""),
    "leak_vmm": (2 << 20, "cuda.vmm", ""),
    "leak_map": (4 << 20, "cuda.map", ": mapped, its handle released"),
}

passed = failed = 0


def leaked_lines():
    """function -> the line of workload.c marked LEAKED inside it."""
    out, fn = {}, None
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "workload.c")) as f:
        for no, line in enumerate(f, 1):
            m = re.match(r"NOIPA void (\w+)\(", line)
            if m:
                fn = m.group(1)
            if "/* LEAKED */" in line:
                out[fn] = no
    return out


LINES = leaked_lines()


def result(name, problems):
    global passed, failed
    if problems:
        failed += 1
        print(f"FAIL {name}")
        for p in problems:
            print(f"    {p}")
    else:
        passed += 1
        print(f"PASS {name}")


def run(prog, args, extra=(), env=ENV):
    """(bare result, audited result, the JSON document or None)."""
    cmd = [os.path.join(OUT, prog)] + list(args)
    bare = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "out.json")
        audited = subprocess.run([TAGALLOC, "run", "--json", js, *extra, "--"] + cmd, env=env,
                                 capture_output=True, text=True, timeout=120)
        doc = None
        if os.path.exists(js):
            with open(js) as f:
                doc = json.load(f)
    return bare, audited, doc


def same_run(bare, audited, problems, exit_code=None):
    if bare.returncode != 0:
        problems.append(f"bare run exited {bare.returncode}: {bare.stderr.strip()}")
    want = bare.returncode if exit_code is None else exit_code
    if audited.returncode != want:
        problems.append(f"exit {audited.returncode} under tagalloc, expected {want}")
    if audited.stdout != bare.stdout:
        problems.append(f"stdout differs: {audited.stdout!r} vs {bare.stdout!r}")


def check_workload(prog, args=(), teardown=False, extra_leaks=None, extra=(), doc=None, name=None,
                   exit_code=None):
    name = name or " ".join([prog, *args, *extra])
    problems = []
    if doc is None:
        bare, audited, doc = run(prog, args, extra)
        same_run(bare, audited, problems, exit_code)
    if doc is None:
        result(name, problems + ["no JSON document"])
        return
    procs = doc["processes"]
    if len(procs) != 1:
        result(name, problems + [f"{len(procs)} processes"])
        return
    p = procs[0]
    want = dict(LEAKS)
    want.update(extra_leaks or {})
    seen = set()
    for f in p["findings"]:
        top = f["stack"][0] if f["stack"] else {}
        fn = top.get("function")
        if f["kind"] != "gpu.leak" or fn not in want:
            problems.append(f"unexpected finding {f['kind']} {f['bytes']} B at {fn}")
            continue
        if fn in seen:
            problems.append(f"{fn}: a second group")
        seen.add(fn)
        nbytes, tag, suffix = want[fn]
        device = 1 if fn == "leak_in_context" else 0
        when = ", at context teardown" if teardown or fn == "leak_in_context" else ""
        detail = f"device {device}{when}{suffix}"
        if (f["bytes"], f["blocks"], f["tag"]) != (nbytes, 1, tag):
            problems.append(f"{fn}: {f['bytes']} B in {f['blocks']} block(s) [{f['tag']}], "
                            f"expected {nbytes} B in 1 [{tag}]")
        if f.get("detail", "") != detail:
            problems.append(f"{fn}: detail {f.get('detail')!r}, expected {detail!r}")
        if not (top.get("file") or "").endswith("tests/cuda/workload.c") or top.get("line") != LINES[fn]:
            problems.append(f"{fn}: top frame at {top.get('file')}:{top.get('line')}, "
                            f"expected workload.c:{LINES[fn]}")
    for fn in want:
        if fn not in seen:
            problems.append(f"no gpu.leak at {fn}")
    s = p["summary"]
    if s["direct"]["blocks"] or s["indirect"]["blocks"] or s["possible"]["blocks"]:
        problems.append(f"host leaks: {s}")
    result(name, problems)


def check_nocuda():
    problems = []
    env = dict(ENV)                        # no driver anywhere
    env.pop("LD_LIBRARY_PATH")
    bare, audited, doc = run("nocuda", [], env=env)
    same_run(bare, audited, problems)
    for line in ("plain_twice(21) = 42\n", "libcuda.so.1: not found\n"):
        if line not in bare.stdout:
            problems.append(f"bare stdout lacks {line!r}: {bare.stdout!r}")
    if doc is None:
        problems.append("no JSON document")
    else:
        fs = doc["processes"][0]["findings"]
        got = [(f["kind"], f["bytes"], f["blocks"], f["stack"][0]["function"]) for f in fs]
        if got != [("leak.direct", 77, 1, "leak77")]:
            problems.append(f"findings {got}, expected one 77-byte leak.direct in leak77")
        tags = {f["tag"] for f in fs}
        if any(t.startswith("cuda.") for t in tags):
            problems.append(f"cuda tags without a driver: {tags}")
    result("nocuda", problems)


def check_trace(prog, args=()):
    """The same findings from the trace (tagalloc report), and the HTML
    page's device series: what is live at the end, allocated and reserved
    (nothing after a reset: the teardown freed it all)."""
    problems = []
    reset = "reset" in args
    name = " ".join([prog, *args])
    with tempfile.TemporaryDirectory() as tmp:
        traces = os.path.join(tmp, "traces")
        audited = subprocess.run([TAGALLOC, "run", "--trace", traces, "--", os.path.join(OUT, prog), *args],
                                 env=ENV, capture_output=True, text=True, timeout=120)
        if audited.returncode != 0:
            problems.append(f"run --trace exited {audited.returncode}")
        js, page = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.html")
        rep = subprocess.run([TAGALLOC, "report", traces, "--json", js, "--html", page],
                             capture_output=True, text=True, timeout=120)
        if rep.returncode != 0 or not os.path.exists(js):
            result(f"{name} (report of its trace)", problems + [f"report failed: {rep.stderr.strip()}"])
            return
        with open(js) as f:
            doc = json.load(f)
        with open(page) as f:
            html = f.read()
    check_workload(prog, doc=doc, teardown=reset, name=f"{name} (report of its trace)")
    m = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.S)
    data = json.loads(m.group(1)) if m else {}
    series = {s["name"]: s for s in data.get("timeline", {}).get("series", []) if s.get("device")}
    # live at the end: every leak but the mapping (reserved), and the
    # mapping and its address reservation (4 MiB each)
    allocated = sum(v[0] for k, v in LEAKS.items() if k != "leak_map")
    want = {"device: allocated": 0 if reset else allocated, "device: reserved": 0 if reset else 8 << 20}
    for k, v in want.items():
        got = series.get(k, {}).get("y", [None])[-1]
        if got != v:
            problems.append(f"HTML series {k!r} ends at {got}, expected {v}")
    result(f"{name} (HTML device series)", problems)


check_workload("static_rt")
check_trace("static_rt")
check_trace("static_rt", ("reset",))
check_workload("static_rt", extra=("--unwind", "fast"))
check_workload("static_rt", ("reset",), teardown=True)
check_workload("shared_rt")
check_workload("direct")
check_workload("direct", extra=("--error-exitcode", "42"), exit_code=42)   # gpu.leak is a problem
check_workload("direct", ("reset",), teardown=True)
check_workload("direct", ("ctx",), extra_leaks={"leak_in_context": (1234, "cuda.malloc", "")})
check_nocuda()


def check_own_backend():
    """tagalloc's own CUDA backend (a stand-in named libtagalloc-gpu-cuda.so):
    its allocations are its pool's to record, not the preload's; the
    program's own leak is found as ever."""
    problems = []
    bare, audited, doc = run("own_backend", [])
    same_run(bare, audited, problems)
    if doc is None:
        result("own_backend", problems + ["no JSON document"])
        return
    fs = doc["processes"][0]["findings"]
    got = [(f["kind"], f["bytes"], f["tag"], f["stack"][0].get("function") if f["stack"] else None) for f in fs]
    if got != [("gpu.leak", 1000, "cuda.malloc", "leak_malloc")]:
        problems.append(f"findings {got}, expected the program's 1000-byte gpu.leak in leak_malloc alone "
                        "(the backend's 2 MiB segment is its pool's)")
    result("own_backend: the backend's own allocations are not recorded twice", problems)


check_own_backend()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
