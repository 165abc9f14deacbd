#!/usr/bin/env python3
"""The real programs of real.py (its cases, the fast ones real.sh runs, and
its more_cases) under `tagalloc run` and under valgrind
memcheck, side by side: each process's four numbers (definitely, indirectly,
possibly lost, still reachable: bytes/blocks) from both tools, and a mark
where they differ.  A measurement, not a test: some differences are the
programs' own (see tests/integration/README.md, "Real programs against
memcheck").  memcheck makes this slow (a minute or two).

Usage: real_vs_memcheck.py BUILD_DIR [NAME...]
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import real   # beside this file: the cases

KINDS = ("definitely lost", "indirectly lost", "possibly lost", "still reachable")


def tagalloc_numbers(tagalloc, argv, cwd, env, wd):
    jf = os.path.join(wd, "tagalloc.json")
    subprocess.run([tagalloc, "run", "--json", jf, "--"] + argv, cwd=cwd, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    out = {}
    with open(jf) as f:
        for p in json.load(f)["processes"]:
            s = p["summary"]
            nums = tuple((s[k]["bytes"], s[k]["blocks"]) for k in ("direct", "indirect", "possible", "reachable"))
            out.setdefault(os.path.basename(str(p["argv"][0])), []).append(nums)
    return out


def memcheck_numbers(argv, cwd, env, wd):
    subprocess.run(["valgrind", "--leak-check=full", "--trace-children=yes", "--log-file=" + wd + "/vg.%p"] + argv,
                   cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    out = {}
    for f in sorted(glob.glob(os.path.join(wd, "vg.*")), key=lambda x: int(x.rsplit(".", 1)[1])):
        with open(f) as fh:
            t = fh.read()
        m = re.search(r"Command: (\S+)", t)
        if not m:
            continue
        nums = []
        for k in KINDS:
            mm = re.search(k + r": ([\d,]+) bytes in ([\d,]+) blocks", t)
            nums.append((int(mm.group(1).replace(",", "")), int(mm.group(2).replace(",", ""))) if mm else (0, 0))
        out.setdefault(os.path.basename(m.group(1)), []).append(tuple(nums))
    return out


def fmt(nums):
    return "  ".join(f"{b}/{n}" for b, n in nums) if nums else "(no entry)"


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    tagalloc = os.path.join(os.path.abspath(argv[0]), "tagalloc")
    names = argv[1:]
    tmp = tempfile.mkdtemp(prefix="real-vs-memcheck.")
    for c in real.cases(tmp) + real.more_cases(tmp):
        if not c.argv or (names and not any(n in c.name for n in names)):
            continue
        wd = tempfile.mkdtemp(prefix="case.", dir=tmp)
        if c.setup:
            c.setup(wd)
        args = [a.replace("@WD@", wd) for a in c.argv]
        env = dict(os.environ, LC_ALL="C", PYTHONHASHSEED="0", HOME=wd, GIT_CONFIG_NOSYSTEM="1")
        runs = []
        for tool in ("tagalloc", "memcheck"):
            d = os.path.join(wd, tool)
            os.makedirs(d)
            runs.append(tagalloc_numbers(tagalloc, args, d, env, wd) if tool == "tagalloc"
                        else memcheck_numbers(args, d, env, wd))
        print(f"== {c.name}")
        ta, vg = runs
        for image in sorted(set(ta) | set(vg)):
            a, b = ta.get(image, []), vg.get(image, [])
            for i in range(max(len(a), len(b))):
                x = a[i] if i < len(a) else None
                y = b[i] if i < len(b) else None
                lost_same = x is not None and y is not None and x[:3] == y[:3]
                mark = "same" if x == y else ("lost same" if lost_same else "DIFFERS")
                print(f"  {image:<10} tagalloc {fmt(x):<60} memcheck {fmt(y):<60} {mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
