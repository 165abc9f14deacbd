#!/usr/bin/python3
"""bench/auditor/run.py - what `tagalloc run` costs, next to heaptrack,
valgrind memcheck and LeakSanitizer, on own workloads and real programs.

    bench/auditor/run.py [--quick] [--runs N] [--slow-runs N] [--build DIR]
                         [--out FILE] [--only NAME,...] [--configs NAME,...]

Each workload runs bare and under each tool, interleaved: a round runs every
configuration once, in a new shuffled order each round; a cell is the median
over the rounds.  Wall time is measured around fork..wait4; CPU time (user +
sys) and peak RSS come from wait4's rusage, which covers the process and all
the descendants it waited for (ru_maxrss: the largest single process of the
tree).  Every run is checked: exit status and stdout as in the bare run, and
the tool's report present (tagalloc: a report per process and, for the own
workloads, the planted 4242-byte leak from leak_one).  A run that fails a
check is shown as INVALID and not counted; one that runs past --timeout is
killed with its whole process tree.  heaptrack runs with its address space
capped (HEAPTRACK_AS_LIMIT): on mixchurn its interpreter grows until memory
runs out, heaptrack's own limit (HEAPTRACK_OOM_NOTE), and after the first
such run that workload's heaptrack row says so instead of running it again.

Under the table, issue 22's targets, each judged on the medians (judge()):
*ok*, **MISS**, or n/a with the reason (no valid run to judge it by).

BENCH_QUICK=1 or --quick: one round, small sizes, to check the script works.
Writes a markdown table to bench/RESULTS.md (--out).  Run from the repository
root (make bench-auditor does)."""

import argparse
import hashlib
import os
import platform
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBLSAN = "/usr/lib/x86_64-linux-gnu/liblsan.so.0"
LIBJEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
# heaptrack's address space, the interpreter's and the program's (see HEAPTRACK_OOM)
HEAPTRACK_AS_LIMIT = 4 << 30
# Why heaptrack does not finish mixchurn (measured by hand, bench/auditor/README.md):
# the reason a run gets, and the note under the table
HEAPTRACK_OOM = ("heaptrack's own limit: its interpreter ran out of memory (std::bad_alloc) and the program died "
                 "of SIGPIPE on heaptrack's pipe (exit status 141); see the notes")
HEAPTRACK_OOM_NOTE = (
    "heaptrack on mixchurn: heaptrack's own limit, not the bench's. `heaptrack_interpret` keeps a set of "
    "(size, stack) pairs whose hash (the two numbers combined, each hashed to itself) gives many of "
    "mixchurn's pairs the same value: 14,348 distinct pairs in the first 42,006 lines of the raw data of "
    "`mixchurn --ops 20000` hash to 8,087 values. A run of equal values reaches the robin-hood set's probe "
    "limit (4,096) whatever the table's size, so from there on the set doubles its table again and again: by hand "
    "(`heaptrack -o F build/bench/mixchurn --ops 200000`) the interpreter grew to 18.9 GB in 3.5 minutes and "
    "threw std::bad_alloc; mixchurn, writing into heaptrack's pipe, died of SIGPIPE, and heaptrack exited "
    "with its status, 141. The same raw data fed to `heaptrack_interpret` alone fails the same way (at 1 GB "
    "under `ulimit -v`), so the pipe, the output and run.py are not the cause. run.py caps heaptrack's "
    "address space at %d GiB (the failure comes in seconds; the machine keeps its memory), and after the first "
    "such run leaves heaptrack out of that workload's later rounds." % (HEAPTRACK_AS_LIMIT >> 30))
PLANTED = re.compile(r"Direct leak of 4,?242 byte\(s\) in 1 object\(s\)")   # with or without the thousands separator


def sh(cmd, **kw):
    """stdout of a command, or '' when it cannot run."""
    try:
        return subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                              timeout=60, **kw).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---- the git repository of the git workload --------------------------------------

GIT_REPO_VERSION = "2"


def make_git_repo(path, commits):
    """A repository with `commits` commits over 60 files, made with git
    fast-import (deterministic: fixed names and dates)."""
    stamp = os.path.join(path, ".bench-version")
    want = "%s %d\n" % (GIT_REPO_VERSION, commits)
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=path)
    subprocess.run(["git", "init", "-q", "-b", "main", path], check=True, env=env)
    rng = random.Random(42)
    files = {"src/file%02d.c" % i: [] for i in range(60)}
    out = []
    for c in range(commits):
        out.append("commit refs/heads/main\nmark :%d\n" % (c + 1))
        when = 1700000000 + 3600 * c
        out.append("author Bench <bench@example.org> %d +0000\n" % when)
        out.append("committer Bench <bench@example.org> %d +0000\n" % when)
        msg = "change %d: touch a few files\n" % c
        out.append("data %d\n%s" % (len(msg.encode()), msg))
        if c:
            out.append("from :%d\n" % c)
        for name in rng.sample(sorted(files), 4):
            lines = files[name]
            for _ in range(rng.randint(1, 12)):
                lines.insert(rng.randint(0, len(lines)), "int v%d_%d = %d;" % (c, len(lines), rng.randint(0, 1 << 30)))
            if len(lines) > 8 and rng.random() < 0.4:
                del lines[rng.randint(0, len(lines) - 1)]
            data = ("\n".join(lines) + "\n").encode()
            out.append("M 100644 inline %s\ndata %d\n" % (name, len(data)))
            out.append(data.decode() + "\n")
    stream = "".join(out).encode()
    subprocess.run(["git", "-C", path, "fast-import", "--quiet"], input=stream, check=True, env=env)
    subprocess.run(["git", "-C", path, "reset", "-q", "--hard", "main"], check=True, env=env)
    with open(stamp, "w") as f:
        f.write(want)


# ---- workloads and configurations ------------------------------------------------

class Workload:
    def __init__(self, name, argv, desc, kind, lsan_argv=None, outfile=None, procs=1, slow=False,
                 env=None):
        self.name, self.argv, self.desc, self.kind = name, argv, desc, kind
        self.lsan_argv = lsan_argv      # own workloads: the -fsanitize=leak build
        self.outfile = outfile          # a file the program writes (compared by hash)
        self.procs = procs              # processes the auditor reports at least
        self.slow = slow                # valgrind/heaptrack: fewer rounds
        self.env = env or {}


def workloads(build, quick, tmp):
    b = os.path.join(build, "bench")
    own = []
    n = "200000" if quick else "5000000"
    own.append(Workload("churn", [b + "/churn", "--allocs", n], "malloc/free churn 5-12 frames deep, %s allocations"
                        % n, "own", lsan_argv=[b + "/churn-lsan", "--allocs", n], slow=True))
    own.append(Workload("churn-4t", [b + "/churn", "--allocs", n, "--threads", "4"],
                        "the same, split over 4 threads", "own",
                        lsan_argv=[b + "/churn-lsan", "--allocs", n, "--threads", "4"], slow=True))
    m = "200000" if quick else "5000000"
    own.append(Workload("mixchurn", [b + "/mixchurn", "--ops", m],
                        "churn with sizes 8 B-64 KiB skewed small, 80%% short-lived blocks, a 16K-slot long-lived "
                        "pool, 10%% reallocs, 5-13 frames deep through 12 functions, %s operations" % m, "own",
                        lsan_argv=[b + "/mixchurn-lsan", "--ops", m], slow=True))
    own.append(Workload("mixchurn-4t", [b + "/mixchurn", "--ops", m, "--threads", "4"],
                        "the same, split over 4 threads", "own",
                        lsan_argv=[b + "/mixchurn-lsan", "--ops", m, "--threads", "4"], slow=True))
    d, k = ("16", "2") if quick else ("20", "10")
    own.append(Workload("tree", [b + "/tree", "--depth", d, "--iters", k],
                        "binary tree of 2^%s-1 nodes built and freed %s times" % (d, k), "own",
                        lsan_argv=[b + "/tree-lsan", "--depth", d, "--iters", k], slow=True))
    # 12 rounds, about 3.5 s of the bare program's CPU: at 3 rounds (0.5 s)
    # the bare times of one run spread 42% and the default mode's ratio
    # moved 0.99x -> 1.29x between two quiet runs of the same code, more
    # than the whole cost being measured; the start and the exit (the
    # preload, the exit scan, the report) are a fixed ~40 ms a process
    scale = "0.02" if quick else "1.0"
    script = os.path.join(ROOT, "bench/auditor/alloc_heavy.py")
    real = [
        Workload("python3", ["/usr/bin/python3", script, scale],
                 "/usr/bin/python3 bench/auditor/alloc_heavy.py %s (pymalloc, the default)" % scale, "real",
                 slow=not quick),
        Workload("python3-malloc", ["/usr/bin/python3", script, scale],
                 "the same with PYTHONMALLOC=malloc (every object a malloc)", "real", slow=not quick,
                 env={"PYTHONMALLOC": "malloc"}),
    ]
    src = "alloc/map.c" if quick else "alloc/ledger.c"
    obj = os.path.join(tmp, "cc1-out.o")
    # gcc compiles a copy of the sources taken now, so that an edit to the
    # working tree during the run does not change its input (and its
    # object file, which every run is checked against)
    snap = os.path.join(tmp, "cc1-src")
    for d in ("alloc", "reports"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(snap, d),
                        ignore=lambda _, names: [x for x in names if not x.endswith((".c", ".h"))])
    real.append(Workload("cc1", ["/usr/bin/gcc", "-O2", "-std=gnu11", "-D_GNU_SOURCE",
                                 "-I" + os.path.join(snap, "alloc"), "-I" + os.path.join(snap, "reports"), "-c",
                                 os.path.join(snap, src), "-o", obj],
                         "gcc -O2 -c %s (gcc, cc1 and as: 3 processes)" % src, "real", outfile=obj, procs=3,
                         slow=not quick))
    repo = os.path.join(b, "gitrepo")
    real.append(Workload("git", ["/usr/bin/git", "-C", repo, "--no-pager", "log", "--stat"] + (["-n", "30"] if quick else []),
                         "git log --stat on a %d-commit repository (build/bench/gitrepo)" % (60 if quick else 600),
                         "real"))
    return own + real


CONFIGS = ["bare", "jemalloc", "table-only", "tagalloc-exact", "tagalloc-fast", "tagalloc-errors", "tagalloc-full",
           "heaptrack", "memcheck", "lsan-exact",
           "lsan-fast"]
CONFIG_LABEL = {
    "bare": "bare",
    "jemalloc": "jemalloc alone (floor)",
    "table-only": "preload, live table only (floor)",
    "tagalloc-exact": "tagalloc run (default: --check=leaks, exact)",
    "tagalloc-fast": "tagalloc run --unwind fast (leaks)",
    "tagalloc-errors": "tagalloc run --check=errors",
    "tagalloc-full": "tagalloc run --check=full",
    "heaptrack": "heaptrack",
    "memcheck": "valgrind memcheck",
    "lsan-exact": "LSan, exact stacks",
    "lsan-fast": "LSan, fast stacks",
}


def command(cfg, w, build, tmp, seq):
    """argv and extra environment of workload w under configuration cfg."""
    env = dict(w.env)
    if cfg == "bare":
        return w.argv, env
    if cfg == "jemalloc":
        env["LD_PRELOAD"] = LIBJEMALLOC   # the allocator under the ledger, alone
        return w.argv, env
    if cfg == "table-only":
        # the preload with what can be turned off turned off: no stacks, no
        # quarantine, no trace; the live table, the counts and the exit scan
        env.update({"LD_PRELOAD": os.path.join(build, "libtagalloc-preload.so"), "TAGALLOC_RECORD": "0",
                    "TAGALLOC_QUARANTINE": "0"})
        return w.argv, env
    if cfg == "tagalloc-exact":
        return [os.path.join(build, "tagalloc"), "run", "--"] + w.argv, env
    if cfg == "tagalloc-fast":
        return [os.path.join(build, "tagalloc"), "run", "--unwind", "fast", "--"] + w.argv, env
    if cfg in ("tagalloc-errors", "tagalloc-full"):
        return [os.path.join(build, "tagalloc"), "run", "--check=" + cfg.split("-")[1], "--"] + w.argv, env
    if cfg == "heaptrack":
        return ["heaptrack", "-o", os.path.join(tmp, "ht.%d" % seq)] + w.argv, env
    if cfg == "memcheck":
        return ["valgrind", "--leak-check=full", "--trace-children=yes",
                "--log-file=" + os.path.join(tmp, "vg.%d.%%p.log" % seq)] + w.argv, env
    if cfg.startswith("lsan"):
        opts = "exitcode=0" + (":fast_unwind_on_malloc=0" if cfg == "lsan-exact" else "")
        env["LSAN_OPTIONS"] = opts
        if w.lsan_argv:
            return w.lsan_argv, env
        env["LD_PRELOAD"] = LIBLSAN   # a real program: the runtime preloaded
        return w.argv, env
    raise ValueError(cfg)


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TAGALLOC_") and k not in ("LD_PRELOAD", "LSAN_OPTIONS", "ASAN_OPTIONS",
                                                          "PYTHONMALLOC", "GIT_PAGER", "PAGER")}
    env["LC_ALL"] = "C"
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


def strip_heaptrack(out):
    """The program's stdout without heaptrack's (which adds its own lines)."""
    start = "starting application, this might take some time...\n"
    i = out.find(start)
    if i >= 0:
        out = out[i + len(start):]
    j = out.find("Heaptrack finished!")
    if j >= 0:
        out = out[:j]
    return out


def run_once(cfg, w, build, tmp, seq, base_env, timeout):
    argv, extra = command(cfg, w, build, tmp, seq)
    env = dict(base_env, **extra)
    outp, errp = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    # Through /usr/bin/time for the peak RSS: a child forked from this
    # (large) Python process and exec'ing would count the Python image it
    # was forked from in its ru_maxrss; time(1)'s child is forked from time.
    rssf = os.path.join(tmp, "rss")
    if os.path.exists(rssf):
        os.unlink(rssf)
    argv = ["/usr/bin/time", "-f", "%M", "-o", rssf] + argv
    if w.outfile and os.path.exists(w.outfile):
        os.unlink(w.outfile)
    # heaptrack's interpreter can grow until the machine has no memory left
    # (HEAPTRACK_OOM): its address space is capped, the program's with it
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (HEAPTRACK_AS_LIMIT, HEAPTRACK_AS_LIMIT))) \
        if cfg == "heaptrack" else None
    with open(outp, "wb") as fo, open(errp, "wb") as fe:
        t0 = time.perf_counter()
        # a session of its own, so that a timeout ends the whole tree: killing
        # time(1) alone left the tool and the program running, writing into
        # the next runs' stdout and stderr files
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, env=env, cwd=ROOT,
                             start_new_session=True, preexec_fn=limit)
        deadline = t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(p.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.002)
        t1 = time.perf_counter()
        p.returncode = os.waitstatus_to_exitcode(status)
    out = open(outp, "rb").read().decode(errors="replace")
    err = open(errp, "rb").read().decode(errors="replace")
    try:
        rss_kb = int(open(rssf).read().split()[-1])
    except (OSError, ValueError, IndexError):
        rss_kb = ru.ru_maxrss
    r = {"wall": t1 - t0, "cpu": ru.ru_utime + ru.ru_stime, "rss_kb": rss_kb, "rc": p.returncode,
         "timed_out": t1 > deadline}
    if cfg == "heaptrack":
        out = strip_heaptrack(out)
    r["stdout"] = out
    r["stderr"] = err
    r["outhash"] = None
    if w.outfile and os.path.exists(w.outfile):
        r["outhash"] = hashlib.sha256(open(w.outfile, "rb").read()).hexdigest()
    vg = ""
    if cfg == "memcheck":
        for f in sorted(os.listdir(tmp)):
            if f.startswith("vg.%d." % seq):
                vg += open(os.path.join(tmp, f), errors="replace").read()
                os.unlink(os.path.join(tmp, f))
    r["vglog"] = vg
    if cfg == "heaptrack":
        ht = [f for f in os.listdir(tmp) if f.startswith("ht.%d." % seq) or f == "ht.%d.zst" % seq]
        r["ht_files"] = len(ht)
        for f in ht:
            os.unlink(os.path.join(tmp, f))
    return r


def check(cfg, w, r, ref):
    """Why run r is not valid, or None."""
    if r["timed_out"]:
        return "timed out"
    if cfg == "heaptrack" and "std::bad_alloc" in r["stderr"]:
        return HEAPTRACK_OOM
    if r["rc"] != ref["rc"]:
        if r["rc"] < 0:
            return "killed by signal %d (bare: exit %s)" % (-r["rc"], ref["rc"])
        return "exit status %s, bare %s" % (r["rc"], ref["rc"])
    if r["stdout"] != ref["stdout"]:
        return "stdout differs from the bare run's"
    if w.outfile and r["outhash"] != ref["outhash"]:
        return "%s differs from the bare run's" % os.path.basename(w.outfile)
    err = r["stderr"]
    if cfg.startswith("tagalloc"):
        heads = len(re.findall(r"^==\d+== tagalloc: .*\(parent \d+\)$", err, re.M))
        if heads < w.procs:
            return "%d tagalloc report(s), expected at least %d" % (heads, w.procs)
        if w.kind == "own" and (not PLANTED.search(err) or "leak_one" not in err):
            return "the planted leak (4242 bytes from leak_one) is not in the report"
        if "tagalloc: warning" in err or "tagalloc: error" in err:
            m = re.search(r"tagalloc: (warning|error).*", err)
            return "tagalloc said: " + m.group(0)[:120]
    elif cfg == "table-only":
        if w.kind == "own" and not PLANTED.search(err):   # no stacks: no leak_one
            return "the planted leak (4242 bytes) is not in the report"
    elif cfg == "memcheck":
        if "ERROR SUMMARY" not in r["vglog"]:
            return "no valgrind log"
        if w.kind == "own" and not re.search(r"4,242 bytes in 1 blocks are definitely lost", r["vglog"]):
            return "the planted leak is not in valgrind's log"
    elif cfg == "heaptrack":
        if "heaptrack stats" not in err or not r.get("ht_files"):
            return "heaptrack wrote no data"
        if w.procs > 1:
            # heaptrack does not follow exec: gcc's cc1 and as run untraced,
            # and its numbers would be the driver's alone.
            m = re.search(r"allocations:\s+(\d+)", err)
            return "traced the first process only (%s allocations): heaptrack does not follow exec" % (
                m.group(1) if m else "?")
    elif cfg.startswith("lsan"):
        # LSan's own false negative (a stale copy of the pointer somewhere it
        # scans) does not make the timing wrong: counted apart, not invalid.
        if w.kind == "own" and "4242 byte(s)" not in err:
            r["missed"] = True
    return None


def rss_program_only(w, build, tmp, base_env):
    """The peak RSS of the program alone under `tagalloc run` (exact): the
    program runs under /usr/bin/time inside the run, so the tagalloc parent
    is left out.  KB, or None."""
    f = os.path.join(tmp, "time-rss")
    argv = [os.path.join(build, "tagalloc"), "run", "--", "/usr/bin/time", "-f", "%M", "-o", f] + w.argv
    env = dict(base_env, **w.env)
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                   cwd=ROOT)
    try:
        return int(open(f).read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


# ---- the table -------------------------------------------------------------------

def med(v):
    return statistics.median(v) if v else None


def spread(v):
    if len(v) < 3:
        return None
    q = statistics.quantiles(v, n=4)
    return (q[2] - q[0]) / statistics.median(v)


def fmt_s(x):
    return "-" if x is None else ("%.3f" % x if x < 10 else "%.1f" % x)


def fmt_x(x):
    return "-" if x is None else ("%.2fx" % x if x < 10 else "%.1fx" % x)


# Issue 22's targets.  Wall time to the bare program's, (default mode, full
# checking); "lsan-fast": LSan's fast-stack time on the same workload.
TIME_TARGETS = {"churn": (2.5, 4.0), "mixchurn": (2.5, 4.0), "churn-4t": (3.0, 5.0), "mixchurn-4t": (3.0, 5.0),
                "tree": ("lsan-fast", None), "python3": (1.2, 1.5), "cc1": (1.5, 2.0), "git": (1.3, 1.6)}
# Peak RSS in default mode against jemalloc alone's: (factor, MB on top), the
# tree's, and every real program's.
RSS_TREE = (3.0, 0)
RSS_REAL = (1.5, 8)


def ok_miss(met):
    return "*ok*" if met else "**MISS**"


def judge(results, w, quick=False):
    """Issue 22's targets on workload w, each a dict: cfg (the row it is
    judged on), col ("time" or "rss"), target (what it asks), measured, and
    verdict (*ok*, **MISS**, or n/a with the reason).  quick: the run left
    some configurations out (--quick)."""
    cells = results[w.name]

    def wall(cfg):
        c = cells.get(cfg)
        return med(c["wall"]) if c and c["wall"] else None

    def rss(cfg):
        c = cells.get(cfg)
        return med(c["rss"]) if c and c["rss"] else None

    def why_none(cfg):
        c = cells.get(cfg)
        if c is None:
            return "n/a: %s not run (--configs)" % cfg
        if c.get("na"):
            return "n/a: " + c["na"]
        if not c["bad"]:
            return "n/a: %s not run" % cfg + (" (left out by --quick)" if quick else "")
        return "n/a: no valid run of %s (%s)" % (cfg, c["bad"][0])

    out = []
    bare = wall("bare")
    t = TIME_TARGETS.get(w.name)
    for i, cfg in enumerate(("tagalloc-exact", "tagalloc-full")):
        if t is None or t[i] is None:
            continue
        j = {"cfg": cfg, "col": "time", "measured": "", "verdict": ""}
        x = wall(cfg)
        if t[i] == "lsan-fast":
            lsan = wall("lsan-fast")
            j["target"] = "%s wall <= LSan fast stacks'" % ("default" if i == 0 else "full")
            if x is None or lsan is None:
                j["verdict"] = why_none(cfg if x is None else "lsan-fast")
            else:
                j["measured"] = "%s s vs %s s (%s vs %s)" % (fmt_s(x), fmt_s(lsan), fmt_x(x / bare), fmt_x(lsan / bare))
                j["verdict"] = ok_miss(x <= lsan)
        else:
            j["target"] = "%s wall <= %.1fx bare" % ("default" if i == 0 else "full", t[i])
            if x is None or bare is None:
                j["verdict"] = why_none(cfg if x is None else "bare")
            else:
                j["measured"] = fmt_x(x / bare)
                j["verdict"] = ok_miss(x / bare <= t[i])
        out.append(j)
    # less wall time than heaptrack, on every workload
    j = {"cfg": "tagalloc-exact", "col": "time", "target": "default wall < heaptrack's", "measured": ""}
    x, ht = wall("tagalloc-exact"), wall("heaptrack")
    if x is None or ht is None:
        j["verdict"] = why_none("tagalloc-exact" if x is None else "heaptrack")
    else:
        j["measured"] = "%s s vs %s s" % (fmt_s(x), fmt_s(ht))
        j["verdict"] = ok_miss(x < ht)
    out.append(j)
    rt = RSS_TREE if w.name == "tree" else RSS_REAL if w.kind == "real" else None
    if rt is not None:
        f, add = rt
        j = {"cfg": "tagalloc-exact", "col": "rss", "measured": "",
             "target": "default peak RSS <= %gx jemalloc alone's%s" % (f, " + %d MB" % add if add else "")}
        x, je = rss("tagalloc-exact"), rss("jemalloc")
        if x is None or je is None:
            j["verdict"] = why_none("tagalloc-exact" if x is None else "jemalloc")
        else:
            limit = f * je + add * 1024
            j["measured"] = "%.1f MB, limit %.1f MB" % (x / 1024.0, limit / 1024.0)
            j["verdict"] = ok_miss(x <= limit)
        out.append(j)
    return out


def short(j):
    """A target's verdict for the big table's columns."""
    v = j["verdict"]
    t = j["target"].split(" ", 1)[1]   # without the mode: the row says it
    return "%s %s" % (t, v if not v.startswith("n/a") else "n/a")


def render(results, wls, configs, meta, rss_check):
    L = []
    L.append("# bench/auditor: what `tagalloc run` costs\n")
    L.append("Generated by `%s` on %s.\n" % (meta["command"], meta["date"]))
    L.append("- Machine: %s, %s CPU(s) (`lscpu`), Linux %s, %s." % (meta["cpu"], meta["cores"], meta["kernel"],
                                                                 meta["mem"]))
    if meta.get("fault_us"):
        L.append("- First touch of a fresh page (a page fault): %s us, median of 5 (`build/bench/pagefault`); "
                 "every page the auditor makes a program touch costs that once." % meta["fault_us"])
    L.append("- Load average (`uptime`): at the start %s; at the end %s.%s" % (
        meta["load0"], meta["load1"], " **The machine was shared while this ran: the timings are noisy.**"
        if meta["busy"] else ""))
    L.append("- Versions: %s." % "; ".join(meta["versions"]))
    L.append("- tagalloc: commit %s%s." % (meta["commit"], meta["dirty"]))
    L.append("- Rounds: %s (a round runs every configuration once, in a shuffled order); valgrind, heaptrack and LSan with exact "
             "stacks on the workloads marked * ran only the first %s round(s) (too slow for more). Cells are medians." %
             (meta["runs"], meta["slow_runs"]))
    L.append("")
    L.append("Issue 22's targets are judged under the table (\"Targets\") and in its target columns, on the "
             "medians: *ok*, **MISS**, or n/a with the reason.\n")
    judged = {w.name: judge(results, w, meta.get("quick")) for w in wls}
    L.append("| workload | configuration | runs | wall s | x bare | target | cpu s | x bare | peak RSS MB | x bare "
             "| RSS target | spread |")
    L.append("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for w in wls:
        base = results[w.name].get("bare", {})
        bw, bc, br = med(base.get("wall", [])), med(base.get("cpu", [])), med(base.get("rss", []))
        for cfg in configs:
            cell = results[w.name].get(cfg)
            if cell is None:
                continue
            name = w.name + ("*" if w.slow else "")
            if cell.get("na"):
                L.append("| %s | %s | - | n/a | | | | | | | | %s |" % (name, CONFIG_LABEL[cfg], cell["na"]))
                continue
            ok = cell["wall"]
            if not ok and not cell["bad"]:   # every workload and configuration asked for has its row
                L.append("| %s | %s | 0 | not run | | | | | | | | %s |" % (
                    name, CONFIG_LABEL[cfg], "left out by --quick" if meta.get("quick") else "no round ran it"))
                continue
            if not ok:
                L.append("| %s | %s | 0 | INVALID | | | | | | | | %s |" % (name, CONFIG_LABEL[cfg],
                                                                         cell["bad"][0] if cell["bad"] else ""))
                continue
            wm, cm, rm = med(cell["wall"]), med(cell["cpu"]), med(cell["rss"])
            xr = wm / bw if bw else None
            xc = cm / bc if bc else None
            xm = rm / br if br else None
            mine = [j for j in judged[w.name] if j["cfg"] == cfg]
            tcol = "; ".join(short(j) for j in mine if j["col"] == "time")
            rcol = "; ".join(short(j) for j in mine if j["col"] == "rss")
            sp = spread(cell["wall"])
            runs = "%d" % len(cell["wall"]) + ("" if not cell["bad"] else " (+%d invalid)" % len(cell["bad"]))
            if cell.get("missed"):
                rcol = "missed the planted leak in %d run(s)" % cell["missed"]
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s | %s | %s |" % (
                name, CONFIG_LABEL[cfg], runs, fmt_s(wm), "" if cfg == "bare" else fmt_x(xr), tcol, fmt_s(cm),
                "" if cfg == "bare" else fmt_x(xc), rm / 1024.0, "" if cfg == "bare" else fmt_x(xm), rcol,
                "-" if sp is None else "%.0f%%" % (100 * sp)))
    L.append("")
    L.append("Targets (issue 22), on the medians above:\n")
    L.append("| workload | target | measured | met |")
    L.append("| --- | --- | --- | --- |")
    for w in wls:
        for j in judged[w.name]:
            L.append("| %s | %s | %s | %s |" % (w.name, j["target"], j["measured"], j["verdict"]))
    L.append("")
    L.append("Workloads:\n")
    for w in wls:
        L.append("- **%s**: %s. `%s`%s" % (w.name, w.desc, " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT)
                                                                     else a for a in w.argv),
                                          "" if not w.env else " with " + " ".join("%s=%s" % kv for kv in w.env.items())))
    L.append("")
    L.append("Notes:\n")
    L.append("- The own workloads (`bench/auditor/churn.c`, `mixchurn.c`, `tree.c`) are built with `-O2 -g "
             "-fno-omit-frame-pointer` (frame pointers on, for `--unwind fast`); the LSan rows run the same "
             "sources built with `-fsanitize=leak`. LSan on the real programs is `LD_PRELOAD=%s` (the runtime "
             "preloaded into the unmodified program). LSan exact stacks: "
             "`LSAN_OPTIONS=fast_unwind_on_malloc=0`; fast: its default. `exitcode=0` in both, so that the exit "
             "status stays the program's." % LIBLSAN)
    L.append("- valgrind: `valgrind --leak-check=full --trace-children=yes --log-file=...` (children traced, as "
             "`tagalloc run` follows exec: gcc's cc1 and as). heaptrack: `heaptrack -o FILE PROG`, recording "
             "only (no analysis afterwards). heaptrack does not follow exec: under it gcc's driver is traced and "
             "cc1 and as run untraced, so its gcc runs are INVALID (its data count the driver's few hundred "
             "allocations, not cc1's 518,000); heaptrack on cc1 itself is in bench/auditor/README.md.")
    L.append("- The two floor rows measure what no setting of the auditor goes below. *jemalloc alone*: "
             "`LD_PRELOAD=%s`, the allocator the ledger puts blocks in, without the ledger. *preload, live "
             "table only*: `LD_PRELOAD=build/libtagalloc-preload.so TAGALLOC_RECORD=0 TAGALLOC_QUARANTINE=0` "
             "without `tagalloc run` and without a trace: no stacks, no quarantine, no trace, only the "
             "interposition, the live table of blocks, the counts by tag and the exit scan and report: the least "
             "the ledger does to find leaks." % LIBJEMALLOC)
    L.append("- Wall time: fork to wait4 of the tool's process (the whole tree: `tagalloc run` waits for every "
             "process of the program, writes the reports and exits). cpu s: user + sys of the whole tree (wait4 "
             "rusage). spread: (p75 - p25) / median of the wall times.")
    L.append("- Peak RSS: `/usr/bin/time -f %M` around the tool's process: its child's wait4 `ru_maxrss`, the largest "
             "of the process and every descendant it waited for (the largest single process, not a sum; not "
             "measured from the runner's own fork, whose pre-exec Python image would count). For `tagalloc run` that is the "
             "program (or the largest of its processes), not the tagalloc parent, whose own peak is small; "
             "checked once per workload by running the program under `/usr/bin/time -f %M` inside "
             "`tagalloc run` (the parent left out):")
    for w in wls:
        if w.name in rss_check:
            ro, rw = rss_check[w.name]
            L.append("  - %s: program alone %s MB, wait4 of the whole run %s MB" % (
                w.name, "?" if ro is None else "%.1f" % (ro / 1024.0), "?" if rw is None else "%.1f" % (rw / 1024.0)))
    L.append("- Every run is checked: exit status and stdout as in the bare run (gcc: the object file byte for "
             "byte), and each tool's report present: `tagalloc run` one report per process (at least %s for gcc) "
             "and, on the own workloads, the planted leak (4242 bytes from `leak_one`); valgrind its log with "
             "the planted leak; heaptrack its data file, from every process of the program. LSan's report of the planted leak is checked too, but a miss (LSan found a stale copy of the pointer) is only counted, in the RSS target column. A run that fails is INVALID and "
             "left out of the medians." % 3)
    L.append("- LSan on a real program is its runtime preloaded; where that breaks the program (a row INVALID, "
             "with the reason: an exit status or a signal the bare run does not have), LSan does not apply to it "
             "short of rebuilding the program with `-fsanitize=leak`.")
    if any(c.get("na") == HEAPTRACK_OOM for w in wls for c in results[w.name].values()):
        L.append("- " + HEAPTRACK_OOM_NOTE)
    for note in meta["notes"]:
        L.append("- " + note)
    if meta["invalid"]:
        L.append("- Invalid runs:")
        for line in meta["invalid"][:20]:
            L.append("  - " + line)
        if len(meta["invalid"]) > 20:
            L.append("  - ... and %d more (run.py's stderr lists each)" % (len(meta["invalid"]) - 20))
    L.append("")
    L.append("Regenerate: `%s` (or `make bench-auditor`; `BENCH_QUICK=1 make bench-auditor` for a quick check). "
             "Run it on a quiet machine." % meta["command"])
    return "\n".join(L) + "\n"


def machine_meta(args, build):
    lscpu = sh(["lscpu"])
    cpu = re.search(r"Model name:\s*(.*)", lscpu)
    cores = re.search(r"^CPU\(s\):\s*(\d+)", lscpu, re.M)
    mem = sh("free -g | awk '/Mem:/ {print $2}'")
    vers = []
    for name, cmd in [("valgrind", ["valgrind", "--version"]), ("heaptrack", ["heaptrack", "--version"]),
                      ("gcc", "gcc --version | head -1"), ("python3", ["/usr/bin/python3", "--version"]),
                      ("git", ["git", "--version"]), ("glibc", "ldd --version | head -1")]:
        v = sh(cmd)
        vers.append(v if v else name + " missing")
    commit = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    if not commit and os.path.exists(os.path.join(ROOT, ".bench-commit")):   # an exported tree (git archive)
        commit = open(os.path.join(ROOT, ".bench-commit")).read().strip() + " (exported tree)"
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "alloc", "tools", "reports"])
    probe = os.path.join(build, "bench", "pagefault")
    fault_us = sh([probe]) if os.access(probe, os.X_OK) else ""
    return {
        "fault_us": fault_us,
        "cpu": cpu.group(1).strip() if cpu else platform.processor(),
        "cores": cores.group(1) if cores else str(os.cpu_count()),
        "kernel": platform.release(),
        "mem": "%s GiB RAM" % mem if mem else "",
        "versions": vers,
        "commit": commit or "?",
        "dirty": " (with uncommitted changes in alloc/, tools/ or reports/)" if dirty else "",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK", "") not in ("", "0"))
    ap.add_argument("--runs", type=int, default=None, help="rounds (default 5, quick 1)")
    ap.add_argument("--slow-runs", type=int, default=None,
                    help="rounds of valgrind and heaptrack on the big workloads (default 3)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/RESULTS.md"))
    ap.add_argument("--only", default="", help="workloads, comma-separated")
    ap.add_argument("--configs", default="", help="configurations, comma-separated: " + ",".join(CONFIGS))
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--note", action="append", default=[], help="a line for the notes of RESULTS.md")
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 5)
    slow_runs = min(runs, args.slow_runs or (1 if args.quick else 3))
    build = os.path.abspath(args.build)
    configs = [c for c in CONFIGS if not args.configs or c in args.configs.split(",")]
    if "jemalloc" in configs and not os.path.exists(LIBJEMALLOC):
        configs.remove("jemalloc")
        print("run.py: %s not found: no jemalloc row" % LIBJEMALLOC, file=sys.stderr)
    if "bare" not in configs:
        configs.insert(0, "bare")
    # this run's own scratch directory: two runs at once must not share files
    os.makedirs(os.path.join(build, "bench", "tmp"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="run.", dir=os.path.join(build, "bench", "tmp"))
    for f in ["tagalloc", "libtagalloc-preload.so", "bench/churn", "bench/tree", "bench/mixchurn", "bench/churn-lsan",
              "bench/tree-lsan", "bench/mixchurn-lsan"]:
        if not os.path.exists(os.path.join(build, f)):
            sys.exit("run.py: %s/%s is missing: run `make bench-auditor`" % (build, f))
    missing = [t for t in ("heaptrack", "valgrind") if not shutil.which(t)]
    if missing or not os.path.exists("/usr/bin/time"):
        sys.exit("run.py: missing %s: run `make bench-deps` (tools/deps/bench-auditor.txt)"
                 % ", ".join(missing + ([] if os.path.exists("/usr/bin/time") else ["/usr/bin/time"])))
    make_git_repo(os.path.join(build, "bench", "gitrepo"), 60 if args.quick else 600)
    wls = workloads(build, args.quick, tmp)
    if args.only:
        wls = [w for w in wls if w.name in args.only.split(",")]
    elif args.quick:
        wls = [w for w in wls if w.name not in ("python3-malloc", "churn-4t", "mixchurn-4t")]
    base_env = clean_env()
    meta = machine_meta(args, build)
    meta["load0"] = loadavg()
    cmdline = "bench/auditor/run.py" + "".join(" " + a for a in sys.argv[1:])
    if args.quick and "--quick" not in sys.argv:
        cmdline = "BENCH_QUICK=1 " + cmdline
    meta["command"] = cmdline
    meta["runs"], meta["slow_runs"] = runs, slow_runs
    meta["invalid"] = []
    meta["notes"] = args.note
    meta["quick"] = args.quick

    results = {w.name: {c: {"wall": [], "cpu": [], "rss": [], "bad": []} for c in configs} for w in wls}
    refs = {}
    seq = 0
    rng = random.Random()
    t_start = time.time()
    for w in wls:
        # the reference: one bare run before the timed rounds (its output)
        refs[w.name] = run_once("bare", w, build, tmp, seq, base_env, args.timeout)
        seq += 1
        ref = refs[w.name]
        if ref["rc"] != 0 or ref["timed_out"]:
            sys.exit("run.py: %s fails bare (exit %s): %s" % (w.name, ref["rc"], ref["stderr"][-400:]))
    for rnd in range(runs):
        for w in wls:
            order = [c for c in configs
                     if not (w.slow and c in ("memcheck", "heaptrack", "lsan-exact") and rnd >= slow_runs)
                     and not results[w.name][c].get("na")]
            if args.quick and w.kind == "real" and w.name != "git":
                # quick: valgrind and heaptrack on churn, tree and git only
                order = [c for c in order if c not in ("memcheck", "heaptrack")]
            rng.shuffle(order)
            for cfg in order:
                r = run_once(cfg, w, build, tmp, seq, base_env, args.timeout)
                seq += 1
                why = check(cfg, w, r, refs[w.name])
                cell = results[w.name][cfg]
                if why == HEAPTRACK_OOM:
                    # heaptrack cannot run it: said once, not timed again
                    cell["na"] = why
                    print("run.py: %s / %s: %s" % (w.name, cfg, why), file=sys.stderr)
                    continue
                if why:
                    cell["bad"].append(why)
                    meta["invalid"].append("%s / %s, round %d: %s" % (w.name, cfg, rnd + 1, why))
                    print("run.py: INVALID %s / %s: %s" % (w.name, cfg, why), file=sys.stderr)
                    if os.environ.get("BENCH_DEBUG"):
                        print(r["stderr"][-2000:], file=sys.stderr)
                    continue
                cell["missed"] = cell.get("missed", 0) + bool(r.get("missed"))
                cell["wall"].append(r["wall"])
                cell["cpu"].append(r["cpu"])
                cell["rss"].append(r["rss_kb"])
                print("  %-15s %-15s round %d: %7.3f s  %7.1f MB" % (w.name, cfg, rnd + 1, r["wall"],
                                                                    r["rss_kb"] / 1024.0), file=sys.stderr)
        print("run.py: round %d/%d done (%.0f s)" % (rnd + 1, runs, time.time() - t_start), file=sys.stderr)
    rss_check = {}
    if "tagalloc-exact" in configs:
        for w in wls:
            rss_check[w.name] = (rss_program_only(w, build, tmp, base_env),
                                 med(results[w.name]["tagalloc-exact"]["rss"]))
    meta["load1"] = loadavg()
    # the commit and its state as the run began (the build it timed), not as
    # it ended: an edit made while it ran is not in what was measured
    meta.update(machine_meta(args, build) | {k: meta[k] for k in ("load0", "load1", "command", "runs", "slow_runs",
                                                                     "invalid", "date", "commit", "dirty")})
    try:
        meta["busy"] = max(float(meta["load0"].split()[0]), float(meta["load1"].split()[0])) > 0.5
    except ValueError:
        meta["busy"] = False
    text = render(results, wls, configs, meta, rss_check)
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)
    shutil.rmtree(tmp, ignore_errors=True)
    print("run.py: wrote %s (%.0f s)" % (args.out, time.time() - t_start), file=sys.stderr)
    # A comparison tool that cannot run a program (LSan's runtime preloaded
    # into cc1 or git breaks them) is that tool's limit, listed under the
    # table; only a failing run of tagalloc's own fails the bench.
    ours = [line for line in meta["invalid"] if " / tagalloc" in line or " / table-only" in line]
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
