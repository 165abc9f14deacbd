#!/usr/bin/python3
"""ref.py - the reference side of bench/tensor: numpy sgemm and PyTorch CPU
conv2d (forward, and the backward products dL/dx, dL/dw, dL/db) at the
sizes bench_tensor.c measures, with THREADS threads; with 1 thread also
tanh, sigmoid, exp, softmax, cross-entropy and 2x2 max pooling.  Prints one line per
cell, "name median_seconds", for bench_tensor.c to read.

    /usr/bin/python3 bench/tensor/ref.py THREADS REPS

OPENBLAS_NUM_THREADS must be set by the caller (numpy reads it at import).
"""
import sys
import time

import numpy as np
import torch

threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
print("versions numpy-%s,torch-%s" % (np.__version__, torch.__version__), flush=True)


def median_time(fn, reps, inner=1):
    fn()                                   # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ts.append((time.perf_counter() - t0) / inner)
    ts.sort()
    return ts[len(ts) // 2]


rng = np.random.RandomState(0)
for n in (256, 512, 1024):
    a = rng.randn(n, n).astype(np.float32)
    b = rng.randn(n, n).astype(np.float32)
    c = np.empty((n, n), np.float32)
    inner = max(1, (1024 // n) ** 3 // 2)
    print("sgemm%d %.9f" % (n, median_time(lambda: np.matmul(a, b, out=c), reps, inner)), flush=True)

F = torch.nn.functional
for name, (xs, ws, pad) in {"conv1": ((64, 1, 28, 28), (6, 1, 5, 5), 2),
                            "conv2": ((64, 6, 14, 14), (16, 6, 5, 5), 0)}.items():
    x = torch.randn(*xs)
    w = torch.randn(*ws) * 0.1
    bias = torch.randn(ws[0])
    with torch.no_grad():
        y = F.conv2d(x, w, bias, 1, pad)
        dy = torch.randn_like(y)
        print("%s_fwd %.9f" % (name, median_time(lambda: F.conv2d(x, w, bias, 1, pad), reps, 5)), flush=True)

        def backward():
            return torch.ops.aten.convolution_backward(dy, x, w, [ws[0]], [1, 1], [pad, pad], [1, 1], False,
                                                       [0, 0], 1, [True, True, True])
        print("%s_bwd %.9f" % (name, median_time(backward, reps, 5)), flush=True)

# elementwise and row ops (bench_tensor.c's N_EW cells), 1 thread only
if threads == 1:
    with torch.no_grad():
        h = torch.randn(64, 256) * 2
        lg = torch.randn(64, 114) * 3
        lab = torch.arange(64) * 7 % 114
        p = torch.randn(64, 6, 28, 28)
        cells = {"tanh": lambda: torch.tanh(h), "sigmoid": lambda: torch.sigmoid(h), "exp": lambda: torch.exp(h),
                 "softmax": lambda: torch.softmax(lg, 1), "cross_entropy": lambda: F.cross_entropy(lg, lab),
                 "max_pool2d": lambda: F.max_pool2d(p, 2, 2, return_indices=True)}
        for name, fn in cells.items():
            print("%s %.9f" % (name, median_time(fn, reps, 20)), flush=True)
