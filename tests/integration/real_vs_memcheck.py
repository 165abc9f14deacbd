#!/usr/bin/env python3
"""The real programs of real.py (its cases, the fast ones real.sh runs, and
its more_cases) under `tagalloc run` and under valgrind
memcheck, side by side: each process's four numbers (definitely, indirectly,
possibly lost, still reachable: bytes/blocks) from both tools, and a mark
where they differ, then a count of the rows of each mark.  A measurement,
not a test: some differences are the programs' own (see
tests/integration/README.md, "Real programs against memcheck").  memcheck
makes this slow (about ten minutes on 2 cores).

A row is one process under both tools: the two runs' pids differ, so a
process is paired with the one that has the paired parent and the same
command line (pair()), from the root down, and printed indented under its
parent.  tagalloc reports an image that calls exec; memcheck does not, and
the row says so (test_real_vs_memcheck.py tests the pairing).

Usage: real_vs_memcheck.py BUILD_DIR [NAME...]
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import real   # beside this file: the cases

KINDS = ("definitely lost", "indirectly lost", "possibly lost", "still reachable")


class Proc:
    """One process entry of either tool: its pid and parent's pid (of that
    tool's run: the two runs' pids differ), its command line, its four
    numbers, and whether it is an image that called exec (tagalloc only:
    memcheck has no entry for one)."""

    def __init__(self, pid, ppid, argv, nums, execs=False):
        self.pid, self.ppid, self.argv, self.nums, self.execs = pid, ppid, list(argv), nums, execs

    @property
    def image(self):
        return os.path.basename(str(self.argv[0])) if self.argv else "?"

    @property
    def command(self):
        """What both tools record of a command line alike: the image's
        basename (memcheck names the file exec'd, tagalloc argv[0]) and the
        arguments."""
        return (self.image,) + tuple(str(a) for a in self.argv[1:])

    def __repr__(self):
        return f"Proc({self.pid}, {self.ppid}, {self.argv!r}{', execs' if self.execs else ''})"


def tagalloc_procs(tagalloc, argv, cwd, env, wd):
    jf = os.path.join(wd, "tagalloc.json")
    subprocess.run([tagalloc, "run", "--json", jf, "--"] + argv, cwd=cwd, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    with open(jf) as f:
        entries = json.load(f)["processes"]
    out = []
    for i, p in enumerate(entries):
        s = p["summary"]
        nums = tuple((s[k]["bytes"], s[k]["blocks"]) for k in ("direct", "indirect", "possible", "reachable"))
        # an image that called exec: no exit status and no signal, and a
        # later entry of the same pid (the image it exec'd)
        execs = (p.get("exit_code") is None and p.get("signal") is None
                 and any(q["pid"] == p["pid"] for q in entries[i + 1:]))
        out.append(Proc(p["pid"], p.get("ppid"), p.get("argv") or [], nums, execs))
    return out


def split_command(text):
    """memcheck's "Command:" line as argv: it escapes a space (and the
    shell's other special characters) in an argument with a backslash."""
    return [re.sub(r"\\(.)", r"\1", t) for t in re.findall(r"(?:\\.|[^ \\])+", text)]


def memcheck_log(text, pid):
    """A Proc from one memcheck log, or None when it has no command line."""
    m = re.search(r"^==\d+== Command: (.*)$", text, re.M)
    if not m:
        return None
    pp = re.search(r"^==\d+== Parent PID: (\d+)", text, re.M)
    nums = []
    for k in KINDS:
        mm = re.search(k + r": ([\d,]+) bytes in ([\d,]+) blocks", text)
        nums.append((int(mm.group(1).replace(",", "")), int(mm.group(2).replace(",", ""))) if mm else (0, 0))
    return Proc(pid, int(pp.group(1)) if pp else None, split_command(m.group(1)), tuple(nums))


def memcheck_procs(argv, cwd, env, wd):
    subprocess.run(["valgrind", "--leak-check=full", "--trace-children=yes", "--log-file=" + wd + "/vg.%p"] + argv,
                   cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    out = []
    for f in sorted(glob.glob(os.path.join(wd, "vg.*")), key=lambda x: int(x.rsplit(".", 1)[1])):
        with open(f) as fh:
            p = memcheck_log(fh.read(), int(f.rsplit(".", 1)[1]))
        if p:
            out.append(p)
    return out


def _tree(procs):
    """Roots and children of one tool's processes, each list in start order
    (pid order; an image that called exec before the image it exec'd).  A
    process's parent is the last image of its parent's pid: the one memcheck
    reports."""
    last = {}
    for p in procs:
        last[p.pid] = p
    kids = {id(p): [] for p in procs}
    roots = []
    for p in procs:
        parent = last.get(p.ppid)
        if parent is None or parent is p:
            roots.append(p)
        else:
            kids[id(parent)].append(p)
    order = {id(p): (p.pid, i) for i, p in enumerate(procs)}
    for v in list(kids.values()) + [roots]:
        v.sort(key=lambda p: order[id(p)])
    return roots, kids


def _match(a, b):
    """Pairs of two sibling lists: first by the same command line, then by
    the same image, each in start order; then what is left on each side
    alone."""
    pairs = []
    a, b = list(a), list(b)
    for key in (lambda p: p.command, lambda p: p.image):
        rest_a = []
        for x in a:
            y = next((y for y in b if key(y) == key(x)), None)
            if y is None:
                rest_a.append(x)
            else:
                b.remove(y)
                pairs.append((x, y))
        a = rest_a
    pairs += [(x, None) for x in a] + [(None, y) for y in b]
    return pairs


def pair(ta, vg):
    """tagalloc's processes against memcheck's, as (tagalloc Proc or None,
    memcheck Proc or None, depth) rows in process-tree order: a process is
    paired with the one of the same parent (the parents paired first, from
    the roots down) and command line, in start order.  The two runs' pids
    differ, and memcheck has no entry for an image that calls exec, so
    neither the pids nor the order of all processes of one name pair them.
    tagalloc's images that called exec come out alone (with None)."""
    ta_roots, ta_kids = _tree([p for p in ta if not p.execs])
    vg_roots, vg_kids = _tree(vg)
    execs = {}
    for p in ta:
        if p.execs:
            execs.setdefault(p.pid, []).append(p)
    rows = []

    def walk(pairs, depth):
        for x, y in pairs:
            for e in execs.pop(x.pid, []) if x is not None else []:
                rows.append((e, None, depth))   # memcheck reports no image that calls exec
            rows.append((x, y, depth))
            walk(_match(ta_kids[id(x)] if x is not None else [], vg_kids[id(y)] if y is not None else []),
                 depth + 1)

    walk(_match(ta_roots, vg_roots), 0)
    for pid in sorted(execs):   # an exec'ing image whose successor has no entry
        rows += [(e, None, 0) for e in execs[pid]]
    return rows


def mark(x, y):
    """How a row compares: same, lost same (definitely, indirectly and
    possibly lost), DIFFERS, or why one side has no entry."""
    if x is not None and y is None and x.execs:
        return "exec (memcheck: no entry)"
    if x is None or y is None:
        return "DIFFERS"
    if x.nums == y.nums:
        return "same"
    return "lost same" if x.nums[:3] == y.nums[:3] else "DIFFERS"


def fmt(nums):
    return "  ".join(f"{b}/{n}" for b, n in nums) if nums else "(no entry)"


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    tagalloc = os.path.join(os.path.abspath(argv[0]), "tagalloc")
    names = argv[1:]
    tmp = tempfile.mkdtemp(prefix="real-vs-memcheck.")
    counts = {}
    programs = 0
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
            runs.append(tagalloc_procs(tagalloc, args, d, env, wd) if tool == "tagalloc"
                        else memcheck_procs(args, d, env, wd))
        programs += 1
        print(f"== {c.name}")
        for x, y, depth in pair(*runs):
            m = mark(x, y)
            counts[m] = counts.get(m, 0) + 1
            image = "  " * depth + (x or y).image
            print(f"  {image:<14} tagalloc {fmt(x and x.nums):<60} memcheck {fmt(y and y.nums):<60} {m}",
                  flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    rows = sum(counts.values())
    print(f"{programs} programs, {rows} process rows: {counts.get('same', 0)} the same, "
          f"{counts.get('lost same', 0)} lost the same (reachable differs), "
          f"{counts.get('exec (memcheck: no entry)', 0)} images that call exec (memcheck: no entry), "
          f"{counts.get('DIFFERS', 0)} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
