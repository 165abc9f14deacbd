#!/bin/bash
# Runs every tensor test program under BUILD/tests/tensor; ends with one line
# "tensor: N passed, N failed".
BUILD=${1:-build}
. "$(dirname "$0")/../lib.sh"
for t in "$BUILD"/tests/tensor/test_*; do
  [ -x "$t" ] && [ -f "$t" ] && run_program "$t"
done
finish tensor
