#!/usr/bin/env python3
"""real_vs_memcheck.py's pairing of tagalloc's process entries with
memcheck's, on constructed processes (no tool runs): `make
test-bench-scripts` runs it.

The case is the "bash script" case's shape: a shell whose forked child
execs `sort`, then a subshell (forked, no exec) that loses a block, then a
second `sort`.  tagalloc reports the child's image that called exec (an
entry with no exit status, its pid reported again for `sort`); memcheck
does not, so its shell entries are one fewer, and pairing the entries of
one name in start order put the subshell against the exec'ing image.  The
two runs' pids differ, as two runs' do.  Prints PASS/FAIL lines and ends
with "N passed, N failed".
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_vs_memcheck import Proc, mark, memcheck_log, pair, split_command  # noqa: E402

ZERO = ((0, 0),) * 4
SUB = ((64, 1), (0, 0), (0, 0), (0, 0))          # the subshell's lost block
SH = ((0, 0), (0, 0), (0, 0), (1200, 12))        # the shell's reachable blocks
SORT = ((0, 0), (0, 0), (0, 0), (96, 2))


def tagalloc_side():
    bash = ["bash", "/tmp/w/s.sh"]
    return [Proc(100, 90, bash, SH),
            Proc(101, 100, bash, ZERO, execs=True),     # forked, then exec sort
            Proc(101, 100, ["sort", "-n"], SORT),
            Proc(102, 100, bash, SUB),                  # ( ... ): a subshell
            Proc(103, 100, bash, ZERO, execs=True),
            Proc(103, 100, ["sort", "-r"], SORT)]


def memcheck_side():
    bash = ["/usr/bin/bash", "/tmp/w/s.sh"]
    return [Proc(5000, 4990, bash, SH),
            Proc(5003, 5000, ["/usr/bin/sort", "-n"], SORT),
            Proc(5010, 5000, bash, SUB),
            Proc(5011, 5000, ["/usr/bin/sort", "-r"], SORT)]


def pids(rows):
    return [(x and x.pid, y and y.pid, d) for x, y, d in rows]


def checks():
    """(name, got, expected) of each check."""
    rows = pair(tagalloc_side(), memcheck_side())
    yield ("pairs by parent and command line", pids(rows),
           [(100, 5000, 0), (101, None, 1), (101, 5003, 1), (102, 5010, 1), (103, None, 1), (103, 5011, 1)])
    yield ("marks", [mark(x, y) for x, y, _ in rows],
           ["same", "exec (memcheck: no entry)", "same", "same", "exec (memcheck: no entry)", "same"])
    # the same processes in another order of pids, and a shell child that
    # tagalloc has and memcheck has not: it stays alone, the rest pair
    ta = tagalloc_side() + [Proc(104, 100, ["bash", "/tmp/w/s.sh"], ZERO)]
    vg = list(reversed(memcheck_side()))
    yield ("order of entries and an extra child", pids(pair(ta, vg)),
           [(100, 5000, 0), (101, None, 1), (101, 5003, 1), (102, 5010, 1), (103, None, 1), (103, 5011, 1),
            (104, None, 1)])
    # a grandchild pairs under its own parent: `sort` under the subshell is
    # not taken for the shell's `sort` of the same command line
    ta = [Proc(10, 1, ["sh", "-c", "x"], ZERO), Proc(11, 10, ["sh", "-c", "x"], ZERO),
          Proc(12, 11, ["sort"], SORT), Proc(13, 10, ["sort"], ZERO)]
    vg = [Proc(70, 2, ["/bin/sh", "-c", "x"], ZERO), Proc(71, 70, ["/bin/sort"], ZERO),
          Proc(72, 70, ["/bin/sh", "-c", "x"], ZERO), Proc(73, 72, ["/bin/sort"], SORT)]
    yield ("a grandchild under its parent", pids(pair(ta, vg)),
           [(10, 70, 0), (11, 72, 1), (12, 73, 2), (13, 71, 1)])
    yield ("memcheck's escaped command line", split_command(r"bash -c ls\ /\ \>/dev/null;\ (echo\ hi) a\\b"),
           ["bash", "-c", "ls / >/dev/null; (echo hi)", "a\\b"])
    log = ("==5003== Memcheck, a memory error detector\n"
           "==5003== Command: /usr/bin/sort -n\n==5003== Parent PID: 5000\n==5003== \n"
           "==5003==    definitely lost: 1,024 bytes in 2 blocks\n"
           "==5003==      possibly lost: 0 bytes in 0 blocks\n"
           "==5003==    still reachable: 96 bytes in 2 blocks\n")
    p = memcheck_log(log, 5003)
    yield ("memcheck's log", (p.pid, p.ppid, p.command, p.nums),
           (5003, 5000, ("sort", "-n"), ((1024, 2), (0, 0), (0, 0), (96, 2))))


def main():
    passed = failed = 0
    for name, got, want in checks():
        if got == want:
            passed += 1
            print(f"PASS pairing: {name}")
        else:
            failed += 1
            print(f"FAIL pairing: {name}\n    got      {got}\n    expected {want}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
