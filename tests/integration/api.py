"""The ledger's C API under `tagalloc run` (itest.py runs these checks).

progs/ta_api.c is linked with build/libtagalloc.so and, separately, with
build/libtagalloc.a, and each is run under `tagalloc run --json`: a correct
program, so its one process entry must have zero findings, no leak of any
kind, status 0, and stdout "ok 1 live 0".  With the shared library the
ta_* calls are the preload's (it comes first), and the ledger's own
allocations (libdw's, when a stack's unwind rule is read) must not become
blocks of the program's; with the static library the program has a ledger
of its own beside the preload's.
"""
import json
import os
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIBS = ["-ljemalloc", "-lunwind", "-ldw", "-lelf", "-lpthread", "-ldl", "-lm"]


def build_api(build_dir):
    """BUILD/itest/ta_api_so and ta_api_a; {} when a library is missing."""
    src = os.path.join(HERE, "progs", "ta_api.c")
    inc = ["-I", os.path.join(ROOT, "alloc"), "-I", os.path.join(HERE, "progs")]
    so, a = os.path.join(build_dir, "libtagalloc.so"), os.path.join(build_dir, "libtagalloc.a")
    out = {}
    d = os.path.join(build_dir, "itest")
    cc = os.environ.get("ITEST_CC", "cc")
    flags = ["-g", "-O0", "-w", "-pthread", "-fomit-frame-pointer", "-std=gnu11"]
    for kind, lib, cmd in (
            ("so", so, ["-L", build_dir, "-ltagalloc", "-Wl,-rpath," + os.path.abspath(build_dir)]),
            ("a", a, ["-Wl,-u,report_text_write", a] + LIBS)):
        if not os.path.exists(lib):
            continue
        target = os.path.join(d, "ta_api_" + kind)
        r = subprocess.run([cc] + flags + inc + ["-o", target, src] + cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"BUILD FAILED {target}:\n{r.stderr}")
        out[kind] = target
    return out


def api_tasks(Result, run, tagalloc, build_dir, tmp, timeout):
    tasks = []
    for kind, prog in build_api(build_dir).items():
        def t(kind=kind, prog=prog):
            res = Result("ta_api", f"linked with libtagalloc.{kind}")
            t0 = time.time()
            jf = os.path.join(tmp, f"ta_api.{kind}.json")
            r = run([tagalloc, "run", "--json", jf, "--", prog], timeout)
            res.secs = time.time() - t0
            if r.status != 0:
                res.problems.append(f"status {r.status}, expected 0")
            if r.stdout != b"ok 1 live 0\n":
                res.problems.append(f"stdout {r.stdout!r}, expected b'ok 1 live 0\\n'")
            try:
                procs = json.load(open(jf)).get("processes") or []
            except (OSError, ValueError) as e:
                res.problems.append(f"JSON: {e}")
                return res
            if len(procs) != 1:
                res.problems.append(f"{len(procs)} process entries, expected 1")
            for p in procs:
                f = p.get("findings") or []
                if f or p.get("findings_count") or p.get("errors"):
                    first = [(x.get("kind"), (x.get("stack") or [{}])[0].get("function")) for x in f[:6]]
                    res.problems.append(f"{len(f)} finding(s), expected none: {first}")
                s = p.get("summary") or {}
                for k in ("direct", "indirect", "possible", "orphan"):
                    got = ((s.get(k) or {}).get("bytes"), (s.get(k) or {}).get("blocks"))
                    if got != (0, 0):
                        res.problems.append(f"{k}: {got}, expected (0, 0)")
            return res
        tasks.append(("ta_api", t))
    return tasks
