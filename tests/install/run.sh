#!/bin/bash
# `make install` into a temporary prefix, then what a user does with it: the
# installed `tagalloc run` finds its preload and audits a program; a program
# builds with `pkg-config --cflags --libs tagalloc` and runs on the installed
# library; each man page renders without a warning; `make uninstall` leaves
# nothing behind; the same install under DESTDIR puts every file below it.
# Ends with "N passed, N failed".
#   tests/install/run.sh BUILD_DIR
set -u
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tagalloc-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
pass=0
fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; for l in "$@"; do printf '    %s\n' "$l"; done; fail=$((fail + 1)); }
expect() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1" "expected: $2" "got:      $3"; fi; }
make=${MAKE:-make}

if ! "$make" -s -C "$root" BUILD="$build" install PREFIX="$prefix" > "$tmp/install.log" 2>&1; then
  bad "make install PREFIX=$prefix" "$(tail -20 "$tmp/install.log")"
  echo "$pass passed, $fail failed"
  exit 1
fi
want="bin/tagalloc
include/tagalloc/autograd.h
include/tagalloc/gpu.h
include/tagalloc/tagalloc.h
include/tagalloc/tensor.h
lib/libtagalloc-autograd.a
lib/libtagalloc-gpu.a
lib/libtagalloc-tensor.a
lib/libtagalloc.a
lib/libtagalloc.so
lib/pkgconfig/tagalloc.pc
lib/tagalloc/libtagalloc-cuda.so
lib/tagalloc/libtagalloc-preload.so
share/man/man1/tagalloc-diff.1
share/man/man1/tagalloc-report.1
share/man/man1/tagalloc-run.1
share/man/man1/tagalloc.1
share/man/man7/tagalloc.7"
expect "make install: the files" "$want" "$(cd "$prefix" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)"

# the installed tool, away from the build folder: it finds its preload
cd "$tmp"
# device memory from the installed headers and libraries: the host backend's
# pool, a relu on the device, the values back
cat > dev.c <<'EOC'
#include <stdio.h>
#include "gpu.h"
int main(void) {
  float h[4] = { -1, 2, -3, 4 };
  gpu_pool *pool = gpu_pool_default();
  const gpu_backend *b = gpu_backend_get();
  if (pool == NULL || b == NULL) return 1;
  float *x = gpu_pool_alloc(pool, sizeof h, NULL);
  b->memcpy_h2d(x, h, sizeof h, NULL);
  b->relu(x, x, 4, NULL);
  b->memcpy_d2h(h, x, sizeof h, NULL);
  b->stream_synchronize(NULL);
  gpu_pool_free(pool, x);
  printf("%s %g %g %g %g\n", b->name, h[0], h[1], h[2], h[3]);
  return 0;
}
EOC
if cc -o dev dev.c $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags tagalloc) \
     "$prefix/lib/libtagalloc-gpu.a" "$prefix/lib/libtagalloc.a" -ljemalloc -lunwind -ldw -lelf -lopenblas -ldl -lpthread -lm \
     2> cc.err; then
  expect "device memory from the installed gpu.h and libtagalloc-gpu.a" "host 0 2 0 4" "$(TAGALLOC_GPU=host ./dev 2>&1 | grep -v '^==')"
else
  bad "device memory from the installed gpu.h and libtagalloc-gpu.a: cannot build" "$(head -5 cc.err)"
fi
cat > leak.c <<'EOC'
#include <stdlib.h>
int main(void) { void *volatile p = malloc(4321); p = 0; return 0; }
EOC
cc -g -O0 -o leak leak.c
env -u TAGALLOC_PRELOAD "$prefix/bin/tagalloc" run -q --json - -- ./leak > out.json 2> err; rc=$?
got=$(python3 -c 'import json; print(json.load(open("out.json"))["processes"][0]["summary"]["direct"]["bytes"])' 2>&1)
expect "installed tagalloc run finds its preload and reports the leak" "0 4321 ." "$rc $got .$(cat err)"
expect "installed tagalloc --version" "tagalloc $(sed -n 's/^#define TA_VERSION "\(.*\)"/\1/p' "$root/alloc/tagalloc.h")" \
  "$("$prefix/bin/tagalloc" --version)"

# the installed tool on a CUDA program (the stand-in driver of tests/cuda,
# the runtime linked statically): the preload hands the runtime the
# installed libtagalloc-cuda.so, so the device memory left is found
cuda=$root/tests/cuda
if cc -O1 -g -std=gnu11 -D_GNU_SOURCE -I"$cuda" -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic \
     -o libcuda.so.1 "$cuda/libcuda_standin.c" -lpthread 2> err &&
   cc -O1 -g -std=gnu11 -D_GNU_SOURCE -I"$cuda" -o static_rt "$cuda/workload.c" "$cuda/rt.c" -ldl 2>> err; then
  env -u TAGALLOC_PRELOAD LD_LIBRARY_PATH="$tmp" "$prefix/bin/tagalloc" run -q --json cuda.json -- ./static_rt > /dev/null 2> err
  got=$(python3 -c 'import json; g = [f["bytes"] for f in json.load(open("cuda.json"))["processes"][0]["findings"] if f["kind"] == "gpu.leak"]; print(len(g), sum(g))' 2>&1)
  expect "installed tagalloc run audits a CUDA program's device memory" "11 6344528 ." "$got .$(cat err)"
else
  bad "the stand-in CUDA driver and program build" "$(cat err)"
fi

# a program built with pkg-config against the installed library
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(echo $(pkg-config --cflags --libs tagalloc 2>&1))
expect "pkg-config --cflags --libs tagalloc" "-I$prefix/include/tagalloc -L$prefix/lib -ltagalloc" "$flags"
if cc -o uses_ledger "$here/uses_ledger.c" $flags 2> err; then
  got=$(LD_LIBRARY_PATH=$prefix/lib TAGALLOC_REPORT=0 ./uses_ledger 2>&1)
  expect "the program runs on the installed library" "allocs 2 live 1 bytes 200" "$got"
  expect "it is linked to the installed library" "$prefix/lib/libtagalloc.so" \
    "$(LD_LIBRARY_PATH=$prefix/lib ldd ./uses_ledger | sed -n 's/^\tlibtagalloc.so => \(.*\) (.*/\1/p')"
else
  bad "a program builds with pkg-config" "$(cat err)"
fi

# each man page renders, without a warning from man or groff
for page in "$prefix"/share/man/man1/*.1 "$prefix"/share/man/man7/*.7; do
  MANWIDTH=80 man --warnings -l "$page" > page.txt 2> err
  name=$(basename "$page")
  if [ ! -s err ] && [ "$(wc -l < page.txt)" -gt 20 ]; then ok "man -l $name renders without warnings"
  else bad "man -l $name" "$(head -5 err)" "$(wc -l < page.txt) lines"; fi
done
MANPATH=$prefix/share/man man -w tagalloc-run > where 2> err
expect "man finds tagalloc-run(1) in the prefix" "$prefix/share/man/man1/tagalloc-run.1" "$(cat where)"

# uninstall leaves nothing
"$make" -s -C "$root" BUILD="$build" uninstall PREFIX="$prefix" > "$tmp/uninstall.log" 2>&1
expect "make uninstall removes every file" "" "$(cd "$prefix" && find . -type f)"

# DESTDIR: the same files below it, the .pc naming the final prefix
"$make" -s -C "$root" BUILD="$build" install PREFIX=/opt/tagalloc DESTDIR="$tmp/stage" > "$tmp/install2.log" 2>&1
expect "make install DESTDIR=... PREFIX=/opt/tagalloc" "$want" \
  "$(cd "$tmp/stage/opt/tagalloc" 2>/dev/null && find . -type f | sed 's|^\./||' | LC_ALL=C sort)"
expect "the staged .pc names the final prefix" "prefix=/opt/tagalloc" "$(grep '^prefix=' "$tmp/stage/opt/tagalloc/lib/pkgconfig/tagalloc.pc")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
