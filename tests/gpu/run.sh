#!/bin/bash
# Runs every gpu test program under BUILD/tests/gpu; ends with one line
# "gpu: N passed, N failed".  No GPU is needed: the tests run on the host
# backend (and check the fallback to it).
BUILD=${1:-build}
. "$(dirname "$0")/../lib.sh"
for t in "$BUILD"/tests/gpu/test_*; do
  [ -x "$t" ] && [ -f "$t" ] && run_program "$t"
done
finish gpu
