#!/usr/bin/env python3
"""vs_torch.py - LeNet-5 training images/s: build/train-lenet --device cuda
against PyTorch on CUDA, in the same run (make bench-gpu, make gpu-check).

  python3 bench/gpu/vs_torch.py [--build DIR] [--device cuda|host] [--steps N]
                                [--runs N] [--batch N] [--data DIR] [--json FILE]

Both sides do the same work a step: upload a batch of 28x28 images and their
labels from host memory, LeNet-5 forward (conv 1->6 5x5 pad 2, relu, maxpool
2; conv 6->16 5x5, relu, maxpool 2; fc 400->120 relu, 120->84 relu, 84->10),
cross-entropy, backward, SGD with momentum 0.9 (lr 0.01), then read the
loss back to the host (a synchronization), as train-lenet does.  An epoch is
--steps steps at --batch; the first epoch is the warm-up (device start,
cuBLAS/cuDNN plans, the caching allocators' first segments) and is not
counted; the next --runs epochs are timed (train-lenet's own per-epoch
images/s, which excludes its evaluation; PyTorch: perf_counter between two
torch.cuda.synchronize()), and each side's figure is the median of its runs.
PyTorch runs with torch.backends.cudnn.benchmark = True.

The data: Fashion-MNIST from --data DIR where its four IDX files are there,
else synthetic IDX files of the same shape (random pixels and labels;
the speed does not depend on the values), written to a temporary folder.

--device host compares train-lenet --device host with PyTorch on the CPU
(one thread each): the same path without a GPU, for testing this script.

Exit status: 0 the ratio tagalloc/PyTorch is at least 1 (the target);
1 it is below; 2 a program failed or its output could not be read;
77 SKIP (printed with the reason): no PyTorch, or no CUDA device for it.
"""
import argparse
import gzip
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(reason):
    print(f"SKIP vs-torch: {reason}")
    sys.exit(SKIP)


def fail(reason):
    print(f"vs-torch: {reason}", file=sys.stderr)
    sys.exit(2)


def write_idx(path, dims, payload):
    magic = 0x800 | len(dims)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims))
        f.write(payload)


def synthetic_data(folder, n_train, n_test, seed=1):
    rng = random.Random(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), (n, 28, 28), rng.randbytes(n * 784))
        write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), (n,),
                  bytes(rng.randrange(10) for _ in range(n)))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8 or raw[0:2] != b"\0\0" or raw[2] != 8:
        fail(f"{path}: not an IDX file of unsigned bytes")
    nd = raw[3]
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    return dims, raw[4 + 4 * nd:]


EPOCH_RE = re.compile(r"^epoch (\d+): .* ([0-9.]+) images/s,", re.M)


def run_train_lenet(prog, device, data, steps, runs, batch):
    cmd = [prog, "--device", device, "--epochs", str(runs + 1), "--steps", str(steps), "--batch", str(batch),
           "--test", "1000", "--data", data]
    print("vs-torch: " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:])
        fail(f"{prog} exited with status {p.returncode}")
    rates = {int(e): float(r) for e, r in EPOCH_RE.findall(p.stdout)}
    if sorted(rates) != list(range(1, runs + 2)):
        print(p.stdout[-3000:])
        fail(f"{prog}: want an 'epoch N: ... images/s' line for epochs 1..{runs + 1}, found {sorted(rates)}")
    return [rates[e] for e in range(2, runs + 2)]


def run_torch(torch, device, data, steps, runs, batch):
    nn = torch.nn
    dims, px = read_idx(os.path.join(data, "train-images-idx3-ubyte.gz"))
    _, lb = read_idx(os.path.join(data, "train-labels-idx1-ubyte.gz"))
    n = min(dims[0], steps * batch)
    # Host tensors, as train-lenet keeps its data set: each step uploads a slice.
    x_all = torch.frombuffer(bytearray(px[:n * 784]), dtype=torch.uint8).reshape(n, 1, 28, 28).float().div_(255.0)
    y_all = torch.frombuffer(bytearray(lb[:n]), dtype=torch.uint8).long()
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    nb = (n + batch - 1) // batch
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def epoch():
        images = 0
        for i in range(min(steps, nb)):
            lo, hi = i * batch, min(i * batch + batch, n)
            images += hi - lo
            xb, yb = x_all[lo:hi].to(dev), y_all[lo:hi].to(dev)
            loss = lossf(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
        return images

    epoch()   # warm-up, not timed
    rates = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        images = epoch()
        sync()
        rates.append(images / (time.perf_counter() - t0))
    return rates


def main():
    ap = argparse.ArgumentParser(description="LeNet-5 training images/s: train-lenet against PyTorch")
    ap.add_argument("--build", default="build", help="the build folder with train-lenet (default build)")
    ap.add_argument("--device", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--steps", type=int, default=300, help="steps an epoch (default 300)")
    ap.add_argument("--runs", type=int, default=5, help="timed epochs after the warm-up one (default 5)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    if a.steps < 1 or a.runs < 1 or a.batch < 1:
        fail("--steps, --runs and --batch want positive numbers")
    try:
        import torch
    except ImportError as e:
        skip(f"no PyTorch for {sys.executable} ({e})")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            skip(f"PyTorch {torch.__version__} finds no CUDA device (torch.version.cuda {torch.version.cuda})")
        torch.backends.cudnn.benchmark = True
        card = torch.cuda.get_device_name(0)
    else:
        torch.set_num_threads(1)
        card = "host (one CPU thread each)"
    prog = os.path.join(a.build, "train-lenet")
    if not os.access(prog, os.X_OK):
        fail(f"no {prog} (make {prog})")
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        names = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
        if not all(os.path.exists(os.path.join(data, f)) for f in names):
            print(f"vs-torch: no Fashion-MNIST in {data}: synthetic data of the same shape")
            data = tmp
            synthetic_data(data, a.steps * a.batch, 1000)
        ours = run_train_lenet(prog, a.device, data, a.steps, a.runs, a.batch)
        try:
            theirs = run_torch(torch, a.device, data, a.steps, a.runs, a.batch)
        except (RuntimeError, OSError) as e:   # 2, not 1 (below the target)
            fail(f"the PyTorch run failed: {e}")
    mo, mt = statistics.median(ours), statistics.median(theirs)
    ratio = mo / mt
    print(f"card: {card}; PyTorch {torch.__version__}, cudnn.benchmark "
          f"{torch.backends.cudnn.benchmark if a.device == 'cuda' else 'n/a'}")
    print(f"LeNet-5, batch {a.batch}, {a.steps} steps an epoch, median of {a.runs} epochs after one of warm-up:")
    print(f"  train-lenet --device {a.device}: {mo:.0f} images/s  (runs: {', '.join(f'{r:.0f}' for r in ours)})")
    print(f"  PyTorch ({a.device}):        {mt:.0f} images/s  (runs: {', '.join(f'{r:.0f}' for r in theirs)})")
    met = ratio >= 1.0
    print(f"  ratio train-lenet / PyTorch: {ratio:.2f}x: {'>= 1x, the target is met' if met else 'below the 1x target'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"card": card, "device": a.device, "torch": torch.__version__, "batch": a.batch,
                       "steps": a.steps, "train_lenet_images_per_s": ours, "torch_images_per_s": theirs,
                       "median_train_lenet": mo, "median_torch": mt, "ratio": ratio, "target_met": met}, f, indent=1)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
