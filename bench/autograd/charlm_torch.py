#!/usr/bin/python3
"""The character-level model of train-charlm in PyTorch.

Same text (the fortunes files but *.dat and *.u8, in name order, joined, as
bytes; or --text FILE), the same vocabulary (the bytes that occur), the same
split (the last 10% held out) and the same validation set (val_batches * batch
windows evenly spaced over the held-out part); the same model (embedding 64 of
the previous 8 bytes, linear 512->256, tanh, linear 256->vocab), PyTorch's
default init (which train-charlm copies), Adam lr 1e-3, batch 64 windows drawn
at random from the training part.  A point every --every iterations and at
the end, with the keys of train-charlm --json.
"""
import argparse, json, os, resource, sys, time

import numpy as np
import torch
import torch.nn as nn

CTX = 8
p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=10000)
p.add_argument("--every", type=int, default=1000)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--val-batches", type=int, default=50)
p.add_argument("--text", default="/usr/share/games/fortunes")
p.add_argument("--json", required=True)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)

if os.path.isdir(a.text):
    names = sorted(n for n in os.listdir(a.text)
                   if not n.startswith(".") and not n.endswith(".dat") and not n.endswith(".u8")
                   and os.path.isfile(os.path.join(a.text, n)))
    raw = b"".join(open(os.path.join(a.text, n), "rb").read() for n in names)
else:
    raw = open(a.text, "rb").read()
text = np.frombuffer(raw, dtype=np.uint8)
present = np.zeros(256, dtype=bool)
present[text] = True
id_of = np.cumsum(present) - 1
vocab = int(present.sum())
ids = torch.from_numpy(id_of[text].astype(np.int64))
ntrain = len(text) - len(text) // 10
nval = a.val_batches * a.batch
vwin = len(text) - ntrain - CTX
vpos = ntrain + (np.arange(nval, dtype=np.int64) * vwin) // nval
offs = torch.arange(CTX)
vx = ids[torch.from_numpy(vpos)[:, None] + offs]
vy = ids[torch.from_numpy(vpos) + CTX]

net = nn.Sequential(nn.Embedding(vocab, 64), nn.Flatten(), nn.Linear(CTX * 64, 256), nn.Tanh(),
                    nn.Linear(256, vocab))
opt = torch.optim.Adam(net.parameters(), lr=a.lr)
lossf = nn.CrossEntropyLoss()


def validate():
    with torch.no_grad():
        return sum(float(lossf(net(vx[i:i + a.batch]), vy[i:i + a.batch]))
                   for i in range(0, nval, a.batch)) / a.val_batches


points, total, since, secs = [], 0.0, 0, 0.0
t0 = time.perf_counter()
for it in range(1, a.iters + 1):
    pos = torch.from_numpy(rng.integers(0, ntrain - CTX, a.batch))
    xb, yb = ids[pos[:, None] + offs], ids[pos + CTX]
    loss = lossf(net(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss.item()
    since += 1
    if it % a.every == 0 or it == a.iters:
        secs += time.perf_counter() - t0
        pt = {"iter": it, "train_loss": total / since, "val_loss": validate(), "iters_per_s": since / secs,
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        points.append(pt)
        print(f"iter {it}: train loss {pt['train_loss']:.4f}, val loss {pt['val_loss']:.4f}, "
              f"{pt['iters_per_s']:.0f} iters/s", file=sys.stderr)
        total, since, secs = 0.0, 0, 0.0
        t0 = time.perf_counter()
with open(a.json, "w") as f:
    json.dump({"model": "charlm", "impl": "pytorch " + torch.__version__, "vocab": vocab, "threads": a.threads,
               "points": points}, f)
