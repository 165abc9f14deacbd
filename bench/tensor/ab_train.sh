#!/bin/bash
# ab_train.sh BEFORE_BUILD [AFTER_BUILD] [ROUNDS] - train-lenet images/s and
# train-charlm iterations/s of two builds, interleaved (1 thread), then
# PyTorch's (bench/tensor/ref_train.py).  A build dir holds train-lenet and
# train-charlm, e.g. a `git archive` of an older commit built with make.
before=${1:?usage: ab_train.sh BEFORE_BUILD [AFTER_BUILD] [ROUNDS]}
after=${2:-build}
rounds=${3:-5}
echo "start: $(uptime)"
for r in $(seq "$rounds"); do
  for d in "$before" "$after"; do
    l=$("$d"/train-lenet --epochs 1 --steps 300 --threads 1 --test 100 2>&1 | grep -o "[0-9]* images/s" | head -1)
    c=$("$d"/train-charlm --iters 1500 --threads 1 --every 1500 --val-batches 5 2>&1 | grep -o "[0-9]* iters/s" | tail -1)
    echo "round $r $d: lenet $l, charlm $c"
  done
done
/usr/bin/python3 "$(dirname "$0")"/ref_train.py lenet 200
/usr/bin/python3 "$(dirname "$0")"/ref_train.py charlm 2000
echo "end: $(uptime)"
