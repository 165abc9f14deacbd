#!/usr/bin/python3
"""LeNet-5 on Fashion-MNIST in PyTorch: the reference of train-lenet.

Same model (conv 1->6 5x5 pad 2, relu, maxpool 2; conv 6->16 5x5, relu,
maxpool 2; fc 400->120 relu, 120->84 relu, 84->10), PyTorch's default init
(the scheme train-lenet copies), cross-entropy, SGD lr 0.01 momentum 0.9,
batch 64, the training set reshuffled each epoch, --steps N per epoch, the
whole test set after each epoch.  Writes the same JSON keys as train-lenet
--json.  Images per second count the training steps only (as train-lenet).
"""
import argparse, gzip, json, os, resource, sys, time

import numpy as np
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--steps", type=int, default=0)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--momentum", type=float, default=0.9)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--json", required=True)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)


def idx(name, dims):
    with gzip.open(os.path.join(a.data, name), "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)


def load(prefix):
    x = idx(prefix + "-images-idx3-ubyte.gz", 3).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    y = idx(prefix + "-labels-idx1-ubyte.gz", 1).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


xtr, ytr = load("train")
xte, yte = load("t10k")
net = nn.Sequential(
    nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
lossf = nn.CrossEntropyLoss()
nb = (len(xtr) + a.batch - 1) // a.batch
steps = a.steps if 0 < a.steps < nb else nb
epochs = []
for e in range(1, a.epochs + 1):
    perm = torch.from_numpy(rng.permutation(len(xtr)))
    xs, ys = xtr[perm], ytr[perm]          # reshuffled, outside the timed steps as in train-lenet
    t0 = time.perf_counter()
    total, images = 0.0, 0
    net.train()
    for i in range(steps):
        xb, yb = xs[i * a.batch:(i + 1) * a.batch], ys[i * a.batch:(i + 1) * a.batch]
        loss = lossf(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
        images += len(xb)
    secs = time.perf_counter() - t0
    with torch.no_grad():
        correct = sum(int((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum()) for i in range(0, len(xte), 1000))
    epochs.append({"epoch": e, "train_loss": total / steps, "test_accuracy": correct / len(xte),
                   "images_per_s": images / secs, "seconds": secs,
                   "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    print(f"epoch {e}: train loss {total / steps:.4f}, test accuracy {100 * correct / len(xte):.2f}%, "
          f"{images / secs:.0f} images/s", file=sys.stderr)
with open(a.json, "w") as f:
    json.dump({"model": "lenet5", "impl": "pytorch " + torch.__version__, "threads": a.threads, "epochs": epochs}, f)
