#!/bin/bash
# Integration tests of the auditor: builds tests/integration/progs/ into
# BUILD_DIR/itest/ and runs each program bare and under
# `BUILD_DIR/tagalloc run --json` (exact stacks, then --unwind fast), comparing
# the JSON with progs/NAME.expect exactly, and the exit status and stdout with
# the bare run.  Ends with "N passed, N failed".
#
#   tests/integration/run.sh BUILD_DIR [NAME...]              against tagalloc
#   tests/integration/run.sh BUILD_DIR --valgrind [NAME...]   against memcheck
#
# --valgrind proves the .expect files: memcheck's definitely/indirectly/
# possibly lost and still reachable numbers, its error kinds and allocating
# functions must be the expected ones.  See tests/integration/README.md.
set -u
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [--valgrind] [NAME...]" >&2; exit 2; }
# Debian's python3 when there is one (a pyenv shim on PATH works too).
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
exec "$py" "$here/itest.py" "$@"
