#!/bin/bash
# Runs every test program under BUILD/tests (unit, misuse, stress) and ends
# with one line "N passed, N failed".  VALGRIND=1 runs each under memcheck.
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
for dir in unit misuse stress; do
  for t in "$BUILD"/tests/$dir/*; do
    [ -x "$t" ] && [ -f "$t" ] && run_program "$t"
  done
done
finish
