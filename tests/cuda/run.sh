#!/bin/bash
# `tagalloc run` on CUDA programs, without a GPU: builds the stand-in
# driver (libcuda_standin.c as libcuda.so.1), the stand-in runtime (rt.c,
# static in a program and as libcudart.so.13), the three driver callers
# (workload.c: static runtime, shared runtime, -lcuda), a program
# without the driver (nocuda.c) and one that loads a stand-in of
# tagalloc's own CUDA backend (own_backend.c) into BUILD_DIR/cuda-test/, then runs them
# bare and under BUILD_DIR/tagalloc run --json and checks the findings
# exactly (check.py).  Ends with "N passed, N failed".
#
#   tests/cuda/run.sh BUILD_DIR
set -eu
# what full checking finds (tagalloc run's default is --check=leaks; tests/cli tests the modes)
export TAGALLOC_CHECK=full
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
out=$build/cuda-test
mkdir -p "$out/plain"
cc=${CC:-cc}
flags="-O1 -g -fno-omit-frame-pointer -Wall -Wextra -std=gnu11 -D_GNU_SOURCE -I$here"
set -x
$cc $flags -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -o "$out/libcuda.so.1" \
  "$here/libcuda_standin.c" -lpthread
ln -sf libcuda.so.1 "$out/libcuda.so"
$cc $flags -fPIC -shared -Wl,-soname,libcudart.so.13 -o "$out/libcudart.so.13" "$here/rt.c" -ldl
$cc $flags -o "$out/static_rt" "$here/workload.c" "$here/rt.c" -ldl
$cc $flags -o "$out/shared_rt" "$here/workload.c" "$out/libcudart.so.13"
$cc $flags -DDIRECT -o "$out/direct" "$here/workload.c" -L"$out" -lcuda
$cc $flags -fPIC -shared -o "$out/plain/libplain.so" "$here/plain.c"
mkdir -p "$out/backend"
$cc $flags -DBACKEND -fPIC -shared -fvisibility=hidden -Wl,-Bsymbolic -o "$out/backend/libtagalloc-gpu-cuda.so" \
  "$here/own_backend.c" "$here/rt.c" -ldl
$cc $flags -o "$out/own_backend" "$here/own_backend.c" "$here/rt.c" -ldl
$cc $flags -o "$out/nocuda" "$here/nocuda.c" -Wl,--enable-new-dtags,-rpath,'$ORIGIN/plain' -ldl
{ set +x; } 2>/dev/null
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
exec "$py" "$here/check.py" "$build" "$out"
