#!/bin/bash
# ab_train.sh BEFORE_BUILD [AFTER_BUILD] [ROUNDS] - train-lenet images/s and
# train-charlm iterations/s of two builds, interleaved (1 thread), then
# PyTorch's on the same models and data (bench/autograd/lenet_torch.py and
# charlm_torch.py, 1 thread, OpenBLAS held to 1 thread too).  A build dir
# holds train-lenet and train-charlm, e.g. a `git archive` of an older commit
# built with make.
before=${1:?usage: ab_train.sh BEFORE_BUILD [AFTER_BUILD] [ROUNDS]}
after=${2:-build}
rounds=${3:-5}
ref=$(dirname "$0")/../autograd
export OPENBLAS_NUM_THREADS=1
echo "start: $(uptime)"
out=$(mktemp)
for r in $(seq "$rounds"); do
  for d in "$before" "$after"; do
    l=$("$d"/train-lenet --epochs 1 --steps 300 --threads 1 --test 100 2>&1 | grep -o "[0-9]* images/s" | head -1)
    c=$("$d"/train-charlm --iters 1500 --threads 1 --every 1500 --val-batches 5 2>&1 | grep -o "[0-9]* iters/s" | tail -1)
    echo "round $r $d: lenet $l, charlm $c"
  done
  l=$(/usr/bin/python3 "$ref"/lenet_torch.py --epochs 1 --steps 300 --threads 1 --json "$out" 2>&1 | grep -o "[0-9]* images/s" | head -1)
  c=$(/usr/bin/python3 "$ref"/charlm_torch.py --iters 1500 --every 1500 --val-batches 5 --threads 1 --json "$out" 2>&1 | grep -o "[0-9]* iters/s" | tail -1)
  echo "round $r pytorch: lenet $l, charlm $c"
done
rm -f "$out"
echo "end: $(uptime)"
