#!/usr/bin/python3
"""run.py's judging and checking on constructed runs (no tool runs): `make
test-bench-scripts` runs it.  Each check prints PASS or FAIL with what it
got and expected; ends with "N passed, N failed"."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

CONFIGS = ["bare", "jemalloc", "tagalloc-exact", "tagalloc-full", "heaptrack", "lsan-fast"]


def cells(**walls):
    """A workload's cells: cfg=(wall s, rss KB), or a string for a cell
    heaptrack cannot run, or None for a configuration with no valid run."""
    out = {}
    for cfg in CONFIGS:
        v = walls.get(cfg.replace("-", "_"))
        c = {"wall": [], "cpu": [], "rss": [], "bad": []}
        if isinstance(v, tuple):
            c["wall"], c["cpu"], c["rss"] = [v[0]], [v[0]], [v[1]]
        elif isinstance(v, str):
            c["na"] = v
        elif cfg in walls:
            c["bad"].append("exit status 139, bare 0")
        out[cfg] = c
    return out


def verdicts(results, w):
    return [(j["cfg"], j["target"], j["verdict"]) for j in run.judge(results, w)]


def checks():
    mix = run.Workload("mixchurn", [], "", "own")
    tree = run.Workload("tree", [], "", "own")
    git = run.Workload("git", [], "", "real")
    pym = run.Workload("python3-malloc", [], "", "real")
    results = {
        # default 2.4x (met), full 4.2x (missed); heaptrack could not run it
        "mixchurn": cells(bare=(1.0, 5000), jemalloc=(0.8, 8000), tagalloc_exact=(2.4, 20000),
                          tagalloc_full=(4.2, 30000), heaptrack=run.HEAPTRACK_OOM, lsan_fast=(2.0, 30000)),
        # the tree: LSan's time is the target; RSS against 3x jemalloc's
        "tree": cells(bare=(1.0, 33000), jemalloc=(0.5, 36000), tagalloc_exact=(6.0, 109000),
                      tagalloc_full=(9.0, 200000), heaptrack=(12.0, 200000), lsan_fast=(6.5, 280000)),
        # git: slower than heaptrack, RSS one KB over 1.5x jemalloc + 8 MB
        "git": cells(bare=(0.2, 8000), jemalloc=(0.2, 10000), tagalloc_exact=(0.25, 15000 + 8192 + 1),
                     tagalloc_full=(0.3, 18000), heaptrack=(0.24, 140000), lsan_fast=None),
        # a real program with no target of its time: RSS and heaptrack only
        "python3-malloc": cells(bare=(0.4, 40000), jemalloc=(0.3, 40000), tagalloc_exact=(1.2, 68192),
                                tagalloc_full=(1.5, 70000), heaptrack=(1.4, 120000)),
    }
    ok, miss = "*ok*", "**MISS**"
    yield ("mixchurn's targets", verdicts(results, mix), [
        ("tagalloc-exact", "default wall <= 2.5x bare", ok),
        ("tagalloc-full", "full wall <= 4.0x bare", miss),
        ("tagalloc-exact", "default wall < heaptrack's", "n/a: " + run.HEAPTRACK_OOM)])
    yield ("the tree's targets", verdicts(results, tree), [
        ("tagalloc-exact", "default wall <= LSan fast stacks'", ok),
        ("tagalloc-exact", "default wall < heaptrack's", ok),
        ("tagalloc-exact", "default peak RSS <= 3x jemalloc alone's", miss)])
    yield ("git's targets", verdicts(results, git), [
        ("tagalloc-exact", "default wall <= 1.3x bare", ok),
        ("tagalloc-full", "full wall <= 1.6x bare", ok),
        ("tagalloc-exact", "default wall < heaptrack's", miss),
        ("tagalloc-exact", "default peak RSS <= 1.5x jemalloc alone's + 8 MB", miss)])
    yield ("python3-malloc's targets", verdicts(results, pym), [
        ("tagalloc-exact", "default wall < heaptrack's", ok),
        ("tagalloc-exact", "default peak RSS <= 1.5x jemalloc alone's + 8 MB", ok)])
    # the tree without an LSan run: not judged ok or missed, and says why
    results["tree"]["lsan-fast"] = {"wall": [], "cpu": [], "rss": [], "bad": ["exit status 4, bare 0"]}
    yield ("a target with no run to judge it", verdicts(results, tree)[0],
           ("tagalloc-exact", "default wall <= LSan fast stacks'",
            "n/a: no valid run of lsan-fast (exit status 4, bare 0)"))
    # heaptrack's interpreter out of memory: its own limit, before the exit status
    ref = {"rc": 0, "stdout": "sum 1\n"}
    r = {"timed_out": False, "rc": 141, "stdout": "", "stderr": "terminate called after throwing an instance of "
         "'std::bad_alloc'\n  what():  std::bad_alloc\n", "outhash": None}
    yield ("heaptrack's bad_alloc", run.check("heaptrack", mix, r, ref), run.HEAPTRACK_OOM)
    r["stderr"] = ""
    yield ("another exit status", run.check("heaptrack", mix, r, ref), "exit status 141, bare 0")
    # every workload and configuration has its row, one that never ran too
    results["git"]["tagalloc-full"] = {"wall": [], "cpu": [], "rss": [], "bad": []}
    meta = {"command": "run.py", "date": "d", "cpu": "c", "cores": "2", "kernel": "k", "mem": "m", "load0": "0",
            "load1": "0", "busy": False, "versions": [], "commit": "abc", "dirty": "", "runs": 1, "slow_runs": 1,
            "invalid": [], "notes": [], "quick": False}
    text = run.render(results, [mix, tree, git, pym], CONFIGS, meta, {})
    big, targets = text.split("Targets (issue 22), on the medians above:")
    rows = [line.split(" | ")[:2] for line in big.splitlines() if line.startswith("| ") and " | " in line]
    yield ("git's rows", [r[1] for r in rows if r[0] == "| git"], [run.CONFIG_LABEL[c] for c in CONFIGS])
    yield ("git's targets under the table", [line for line in targets.splitlines() if line.startswith("| git |")], [
        "| git | default wall <= 1.3x bare | 1.25x | *ok* |",
        "| git | full wall <= 1.6x bare |  | n/a: tagalloc-full not run |",
        "| git | default wall < heaptrack's | 0.250 s vs 0.240 s | **MISS** |",
        "| git | default peak RSS <= 1.5x jemalloc alone's + 8 MB | 22.6 MB, limit 22.6 MB | **MISS** |"])
    yield ("a configuration that never ran", [line for line in text.splitlines()
                                              if line.startswith("| git | tagalloc run --check=full")],
           ["| git | tagalloc run --check=full | 0 | not run | | | | | | | | no round ran it |"])
    yield ("heaptrack's limit in the notes", run.HEAPTRACK_OOM_NOTE in text, True)


def main():
    passed = failed = 0
    for name, got, want in checks():
        if got == want:
            passed += 1
            print("PASS run.py: %s" % name)
        else:
            failed += 1
            print("FAIL run.py: %s\n    got      %r\n    expected %r" % (name, got, want))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
