#!/bin/bash
# Real programs under the auditor: python3, perl, git, gcc (cc1 and as through
# exec), node, make and sort, each run bare and under
# `BUILD_DIR/tagalloc run --json`; output, files written and exit status must
# be identical.  Prints what each process leaks as a table.  A program that is
# not installed is skipped.  Ends with "N passed, N failed, N skipped".
#
#   tests/integration/real.sh BUILD_DIR [NAME...]
set -u
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [NAME...]" >&2; exit 2; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
exec "$py" "$here/real.py" "$@"
