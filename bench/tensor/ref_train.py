#!/usr/bin/python3
"""ref_train.py - PyTorch CPU's training speed on the two models that
tools/train_lenet.c and tools/train_charlm.c train, with 1 thread, on random
data of the same shapes (the speed does not depend on the values):

  lenet:  LeNet-5 (conv 1->6 5x5 pad 2, relu, maxpool 2, conv 6->16 5x5, relu,
          maxpool 2, linear 400-120-84-10 with relu), batch 64, SGD momentum
          0.9, cross-entropy: images/s
  charlm: embedding 114 x 64, context 8 -> linear 512-256, tanh, linear
          256-114, batch 64, Adam 1e-3, cross-entropy: iterations/s

    /usr/bin/python3 bench/tensor/ref_train.py [lenet|charlm] [STEPS]
"""
import sys
import time

import torch
import torch.nn as nn

torch.set_num_threads(1)
which = sys.argv[1] if len(sys.argv) > 1 else "lenet"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
torch.manual_seed(0)
if which == "lenet":
    net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                        nn.ReLU(), nn.Linear(84, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    X, Y = torch.randn(100, 64, 1, 28, 28), torch.randint(0, 10, (100, 64))
else:
    V = 114
    net = nn.Sequential(nn.Embedding(V, 64), nn.Flatten(), nn.Linear(512, 256), nn.Tanh(), nn.Linear(256, V))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    X, Y = torch.randint(0, V, (100, 64, 8)), torch.randint(0, V, (100, 64))
loss_fn = nn.CrossEntropyLoss()


def step(i):
    opt.zero_grad()
    loss_fn(net(X[i % 100]), Y[i % 100]).backward()
    opt.step()


for i in range(20):
    step(i)
t0 = time.perf_counter()
for i in range(steps):
    step(i)
dt = time.perf_counter() - t0
if which == "lenet":
    print("torch lenet: %.0f images/s" % (steps * 64 / dt))
else:
    print("torch charlm: %.0f iterations/s" % (steps / dt))
