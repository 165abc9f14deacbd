#!/bin/sh
# Installs the Debian packages tagalloc needs, when any is missing.
set -e
PKGS="build-essential pkg-config libjemalloc-dev libunwind-dev libdw-dev libelf-dev libcmocka-dev zlib1g-dev valgrind"
missing=""
for p in $PKGS; do
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
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
