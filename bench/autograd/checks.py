#!/usr/bin/python3
"""make bench-checks: what the library's argument checks cost on training
(every tensor, variable, tape, layer and optimizer argument checked with the
ledger, tensor/internal.h and autograd/internal.h): train-lenet built as
usual against the same program built with -DTAGALLOC_NO_ARG_CHECKS, run in
alternating pairs on the same data, steps and seed.  Prints each run's
images per second (wall clock) and CPU seconds (user + system, from the
child's rusage: less moved by other processes on a shared machine), and
the medians of both; the cost is 1 - checked / unchecked images per second,
and checked / unchecked - 1 CPU seconds.

  /usr/bin/python3 bench/autograd/checks.py [--build build] [--nochecks build/nochecks]
                                            [--steps 300] [--reps 5] [--threads 1]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--nochecks", default="build/nochecks")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()
tmp = tempfile.mkdtemp(prefix="bench-checks-")
progs = {}
for name, build in (("checked", a.build), ("unchecked", a.nochecks)):
    progs[name] = os.path.join(tmp, "train-lenet-" + name)
    shutil.copy2(os.path.join(build, "train-lenet"), progs[name])


def rate(prog):
    out = os.path.join(tmp, "out.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    env.pop("TAGALLOC_TRACE", None)
    env.pop("TAGALLOC_FAULT", None)
    child = subprocess.Popen([prog, "--epochs", "1", "--steps", str(a.steps), "--test", "1000", "--seed", "1",
                              "--threads", str(a.threads), "--json", out], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("bench-checks: %s failed: %s" % (prog, err.decode(errors="replace")[-1000:]))
    with open(out) as f:
        return json.load(f)["epochs"][0]["images_per_s"], usage.ru_utime + usage.ru_stime


runs = {"checked": [], "unchecked": []}
cpu = {"checked": [], "unchecked": []}
for i in range(a.reps):
    order = ("checked", "unchecked") if i % 2 == 0 else ("unchecked", "checked")
    for name in order:
        r, c = rate(progs[name])
        runs[name].append(r)
        cpu[name].append(c)
        print("run %d %-9s %8.1f images/s %7.2f CPU s" % (i + 1, name, r, c), flush=True)
med = {k: statistics.median(v) for k, v in runs.items()}
mcpu = {k: statistics.median(v) for k, v in cpu.items()}
print("| train-lenet, %d steps, %d thread(s), %d pairs | images/s (median) | CPU s (median) |"
      % (a.steps, a.threads, a.reps))
print("| --- | --- | --- |")
for k in ("unchecked", "checked"):
    print("| %s | %.1f | %.2f |" % (k, med[k], mcpu[k]))
print("cost of the checks: %.2f%% in images/s, %.2f%% in CPU time (medians)"
      % (100 * (1 - med["checked"] / med["unchecked"]), 100 * (mcpu["checked"] / mcpu["unchecked"] - 1)))
shutil.rmtree(tmp)
