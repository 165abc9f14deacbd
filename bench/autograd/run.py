#!/usr/bin/python3
"""make bench-autograd: train-lenet and train-charlm against the same models in
PyTorch (lenet_torch.py, charlm_torch.py), at 1 and 2 threads, in one run;
then the ledger's own cost (TAGALLOC_RECORD=off, counting only, against the
default, recording every stack), in alternating pairs.  Prints markdown.

  /usr/bin/python3 bench/autograd/run.py [--build build] [--threads 1,2] [--lenet-epochs 3]
                                         [--lenet-steps 300] [--charlm-iters 2000] [--reps 5]
                                         [--only charlm|lenet] [--pairs N] [--blas-too] [--unfused-too]
                                         [--cpu-time] [--ledger-only]

--only runs one of the two models (and its ledger cost); --pairs N runs
each model N times alternating with PyTorch (ours, PyTorch, ours, ...) and
takes the medians over all their epochs or points; --blas-too adds a run
of train-charlm with TENSOR_GEMM=blas (every product in OpenBLAS, not
tensor/gemm_small.c) to each round, --unfused-too one with AG_FUSE=off (the
embedding, flatten and linear layers as three ops, not
tensor_embedding_linear).  --cpu-time adds, per round, a run of
N/10 charlm iterations of each side and reports CPU milliseconds per
iteration from the difference (startup and one validation cancel): on a
loaded machine this is less moved by time slicing than iterations/s.

The ledger's cost: --reps N (5) alternating pairs of each program
with TAGALLOC_RECORD=off and the default, 1 thread; each is compared by its
rate (images or iterations per second) and by the CPU milliseconds per step
the program measures itself (its training steps only: no start-up, no
test or validation); the cost is the ratio of the medians.  --ledger-only
runs only that part.

Throughputs are the medians over a run's epochs (LeNet) or its points
(charlm, one every 1000 iterations); peak RSS is the child's ru_maxrss.
OPENBLAS_NUM_THREADS is set to the thread count for both implementations;
train-* get --threads N, the PyTorch scripts torch.set_num_threads(N).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--threads", default="1,2")
p.add_argument("--lenet-epochs", type=int, default=3)
p.add_argument("--lenet-steps", type=int, default=300)
p.add_argument("--charlm-iters", type=int, default=2000)
p.add_argument("--reps", type=int, default=5,
               help="alternating pairs (TAGALLOC_RECORD=off, default) for the ledger's cost")
p.add_argument("--only", choices=["charlm", "lenet"])
p.add_argument("--pairs", type=int, default=1)
p.add_argument("--cpu-time", action="store_true",
               help="charlm also as CPU ms per iteration: (CPU of N iterations - CPU of N/10) / (0.9 N), each side")
p.add_argument("--blas-too", action="store_true",
               help="charlm also with TENSOR_GEMM=blas (OpenBLAS for every product), in the same rotation")
p.add_argument("--unfused-too", action="store_true",
               help="charlm also with AG_FUSE=off (embedding, flatten, linear as three ops), in the same rotation")
p.add_argument("--ledger-only", action="store_true", help="only the ledger's cost")
a = p.parse_args()
tmp = tempfile.mkdtemp(prefix="bench-autograd-")
# Copies of the programs: a rebuild of the build folder during the run
# (a shared tree) must not change or remove what is measured.
for prog in ("train-lenet", "train-charlm"):
    shutil.copy2(os.path.join(a.build, prog), os.path.join(tmp, prog))


def run(cmd, threads, env_extra=None):
    """Runs cmd; returns (its JSON, its peak RSS in bytes)."""
    out = os.path.join(tmp, "out.json")
    if os.path.exists(out):
        os.unlink(out)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), **(env_extra or {}))
    env.pop("TAGALLOC_TRACE", None)
    child = subprocess.Popen(cmd + ["--json", out], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit("bench-autograd: %s failed (%d): %s" % (" ".join(cmd), child.returncode,
                                                         err.decode(errors="replace")[-2000:]))
    with open(out) as f:
        d = json.load(f)
    d["_cpu_s"] = usage.ru_utime + usage.ru_stime   # the child's CPU time, startup included
    return d, usage.ru_maxrss * 1024


def lenet(ours, threads, epochs, steps, env=None):
    if ours:
        cmd = [os.path.join(tmp, "train-lenet"), "--threads", str(threads)]
    else:
        cmd = [PY, os.path.join(HERE, "lenet_torch.py"), "--threads", str(threads)]
    return run(cmd + ["--epochs", str(epochs), "--steps", str(steps)], threads, env)


def charlm(ours, threads, iters, env=None):
    if ours:
        cmd = [os.path.join(tmp, "train-charlm"), "--threads", str(threads)]
    else:
        cmd = [PY, os.path.join(HERE, "charlm_torch.py"), "--threads", str(threads)]
    return run(cmd + ["--iters", str(iters), "--every", "1000"], threads, env)


def med(xs):
    return statistics.median(xs)


def mib(b):
    return "%.0f MiB" % (b / 1048576)


start = time.time()
rows = []
for t in ([] if a.ledger_only else [int(x) for x in a.threads.split(",")]):
    if a.only != "charlm":
        print("bench-autograd: %d thread(s): LeNet-5 ..." % t, file=sys.stderr, flush=True)
        los, lts = [], []
        for _ in range(a.pairs):
            lo, lo_rss = lenet(True, t, a.lenet_epochs, a.lenet_steps)
            lt, lt_rss = lenet(False, t, a.lenet_epochs, a.lenet_steps)
            los.append(lo)
            lts.append(lt)
        ips_o = med([e["images_per_s"] for d in los for e in d["epochs"]])
        ips_t = med([e["images_per_s"] for d in lts for e in d["epochs"]])
        acc = lambda d: " / ".join("%.2f" % (100 * e["test_accuracy"]) for e in d["epochs"])
        rows += [
            ("LeNet-5 training images/s (median of %d epochs)" % (a.lenet_epochs * a.pairs), t, "%.0f" % ips_o,
             "%.0f" % ips_t, "%.2fx" % (ips_o / ips_t), ">= 1.5x"),
            ("LeNet-5 test accuracy % after each epoch", t, acc(lo), acc(lt), "", ""),
            ("LeNet-5 peak RSS", t, mib(lo_rss), mib(lt_rss), "%.2fx" % (lo_rss / lt_rss), "< 1x"),
        ]
    if a.only != "lenet":
        print("bench-autograd: %d thread(s): charlm ..." % t, file=sys.stderr, flush=True)
        cos, cts, cbs, cus = [], [], [], []
        for _ in range(a.pairs):
            co, co_rss = charlm(True, t, a.charlm_iters)
            ct, ct_rss = charlm(False, t, a.charlm_iters)
            cos.append(co)
            cts.append(ct)
            if a.blas_too:
                cbs.append(charlm(True, t, a.charlm_iters, {"TENSOR_GEMM": "blas"})[0])
            if a.unfused_too:
                cus.append(charlm(True, t, a.charlm_iters, {"AG_FUSE": "off"})[0])
            if a.cpu_time:
                short = a.charlm_iters // 10
                for side, d, env in ((True, co, None), (False, ct, None),
                                     (True, cbs[-1] if a.blas_too else None, {"TENSOR_GEMM": "blas"}),
                                     (True, cus[-1] if a.unfused_too else None, {"AG_FUSE": "off"})):
                    if d is None:
                        continue
                    s_short, _ = charlm(side, t, short, env)
                    d["_cpu_ms_per_iter"] = 1e3 * (d["_cpu_s"] - s_short["_cpu_s"]) / (a.charlm_iters - short)
        its_o = med([q["iters_per_s"] for d in cos for q in d["points"]])
        its_t = med([q["iters_per_s"] for d in cts for q in d["points"]])
        rows += [
            ("charlm iterations/s (median of %d points)" % (len(co["points"]) * a.pairs), t, "%.0f" % its_o,
             "%.0f" % its_t, "%.2fx" % (its_o / its_t), ">= 3x"),
        ] + ([
            ("charlm iterations/s with TENSOR_GEMM=blas (median of %d points)" % (len(co["points"]) * a.pairs), t,
             "%.0f" % med([q["iters_per_s"] for d in cbs for q in d["points"]]), "%.0f" % its_t,
             "%.2fx" % (med([q["iters_per_s"] for d in cbs for q in d["points"]]) / its_t), ""),
        ] if a.blas_too else []) + ([
            ("charlm iterations/s with AG_FUSE=off (median of %d points)" % (len(co["points"]) * a.pairs), t,
             "%.0f" % med([q["iters_per_s"] for d in cus for q in d["points"]]), "%.0f" % its_t,
             "%.2fx" % (med([q["iters_per_s"] for d in cus for q in d["points"]]) / its_t), ""),
        ] if a.unfused_too else []) + ([
            ("charlm CPU ms per iteration (median of %d rounds)" % a.pairs, t,
             "%.3f" % med([d["_cpu_ms_per_iter"] for d in cos]), "%.3f" % med([d["_cpu_ms_per_iter"] for d in cts]),
             "%.2fx" % (med([d["_cpu_ms_per_iter"] for d in cts]) / med([d["_cpu_ms_per_iter"] for d in cos])),
             ">= 3x"),
        ] if a.cpu_time else []) + ([
            ("charlm CPU ms per iteration with TENSOR_GEMM=blas (median of %d rounds)" % a.pairs, t,
             "%.3f" % med([d["_cpu_ms_per_iter"] for d in cbs]), "%.3f" % med([d["_cpu_ms_per_iter"] for d in cts]),
             "%.2fx" % (med([d["_cpu_ms_per_iter"] for d in cts]) / med([d["_cpu_ms_per_iter"] for d in cbs])), ""),
        ] if a.cpu_time and a.blas_too else []) + ([
            ("charlm CPU ms per iteration with AG_FUSE=off (median of %d rounds)" % a.pairs, t,
             "%.3f" % med([d["_cpu_ms_per_iter"] for d in cus]), "%.3f" % med([d["_cpu_ms_per_iter"] for d in cts]),
             "%.2fx" % (med([d["_cpu_ms_per_iter"] for d in cts]) / med([d["_cpu_ms_per_iter"] for d in cus])), ""),
        ] if a.cpu_time and a.unfused_too else []) + [
            ("charlm val loss after %d iterations" % a.charlm_iters, t, "%.4f" % co["points"][-1]["val_loss"],
             "%.4f" % ct["points"][-1]["val_loss"], "", ""),
            ("charlm peak RSS", t, mib(co_rss), mib(ct_rss), "%.2fx" % (co_rss / ct_rss), "< 1x"),
        ]

if rows:
    impl = (lts if a.only != "charlm" else cts)[-1]["impl"]
    print("| workload | threads | train-* (ours) | PyTorch %s | ours / PyTorch | target |" % impl.split()[-1])
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print("| %s | %d | %s | %s | %s | %s |" % r)
    print(flush=True)
print("bench-autograd: the ledger's cost (%d alternating pairs, 1 thread) ..." % a.reps, file=sys.stderr,
      flush=True)
# per program: [off, on], each a list of (rate, CPU ms per step)
cost = {n: ([], []) for n in ("lenet", "charlm") if a.only in (None, n)}
for r in range(a.reps):
    for name in cost:
        order = [0, 1] if r % 2 == 0 else [1, 0]   # off first, then on first: neither always runs second
        for k in order:
            env = {"TAGALLOC_RECORD": "off"} if k == 0 else {}
            if name == "lenet":
                d, _ = lenet(True, 1, 1, a.lenet_steps, env)
                e = d["epochs"][0]
                cost[name][k].append((e["images_per_s"], e["cpu_ms_per_step"]))
            else:
                d, _ = charlm(True, 1, 1000, env)
                q = d["points"][0]
                cost[name][k].append((q["iters_per_s"], q["cpu_ms_per_iter"]))

print("| ledger cost (1 thread) | counting only (`TAGALLOC_RECORD=off`) | recording (default) | cost | target |")
print("| --- | ---: | ---: | ---: | --- |")
for name, unit in (("lenet", ("LeNet-5 images/s, 1 epoch of %d steps" % a.lenet_steps, "LeNet-5 CPU ms per step")),
                   ("charlm", ("charlm iterations/s, 1000 iterations", "charlm CPU ms per iteration"))):
    if name not in cost:
        continue
    off = med([x[0] for x in cost[name][0]])
    on = med([x[0] for x in cost[name][1]])
    print("| %s (median of %d) | %.0f | %.0f | %+.1f%% | < 3%% |" % (unit[0], a.reps, off, on, 100 * (off / on - 1)))
    off = med([x[1] for x in cost[name][0]])
    on = med([x[1] for x in cost[name][1]])
    print("| %s (median of %d) | %.3f | %.3f | %+.1f%% | < 3%% |" % (unit[1], a.reps, off, on, 100 * (on / off - 1)))
print()
print("(%.0f s; LeNet-5: %d epochs of %d steps of batch 64, the whole test set after each; charlm: %d iterations)"
      % (time.time() - start, a.lenet_epochs, a.lenet_steps, a.charlm_iters))
