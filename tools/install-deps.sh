#!/bin/sh
# Installs the Debian packages tagalloc needs, when any is missing.
#   tools/install-deps.sh          what building and `make test` need
#   tools/install-deps.sh bench    that, and what `make bench` compares against
# The package names live in tools/deps/*.txt (# comments), one file per part
# of the project; tools/deps/bench-*.txt are for benchmarks only.  PKG/CMD
# stands for PKG unless the command CMD is already on PATH (npm comes with
# NodeSource's nodejs, and Debian's npm cannot be installed beside it).
set -e
here=$(dirname "$0")/deps
files=$(ls "$here"/*.txt | grep -v '/bench-')
[ "${1:-}" = bench ] && files="$files $(ls "$here"/bench-*.txt 2>/dev/null)"
PKGS=$(cat $files | sed 's/#.*//' | tr -s ' \t' '\n' | sed '/^$/d' | sort -u)
missing=""
for p in $PKGS; do
  case $p in
    */*) command -v "${p#*/}" >/dev/null 2>&1 && continue
         p=${p%%/*} ;;
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  echo "deps: all installed"
  exit 0
fi
echo "deps: installing$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
