#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Fuzz mok's front ends under AddressSanitizer and UndefinedBehaviorSanitizer:
# configure and build mok-opt and mok-compile with MOK_SANITIZE=address,undefined
# (only those two targets), then run scripts/fuzz-mok-opt.py against them over
# the seeds (every .mlir file under examples/ and test/). Exits non-zero on a
# crash, a fatal error, a sanitizer report or a hang; the failing inputs are
# written to $MOK_FUZZ_OUT. docs/Reliability.md has the long run's numbers.
#
#   scripts/fuzz.sh                          # 30 s
#   scripts/fuzz.sh --duration 3600 -j 2     # fuzzer arguments go through
#
# Environment:
#   MOK_ASAN_BUILD_DIR  the sanitizer build (default: build-asan)
#   MOK_JOBS            compile jobs for the build (default: nproc)
#   MOK_FUZZ_OUT        where failing inputs go (default: <build>/fuzz-failures)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOK_ASAN_BUILD_DIR:-$root/build-asan}
llvm=/usr/lib/llvm-22
out=${MOK_FUZZ_OUT:-$build/fuzz-failures}

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMLIR_DIR=$llvm/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=$llvm/bin/lit \
    -DMOK_SANITIZE=address,undefined >/dev/null
fi
export CCACHE_BASEDIR=$root
cmake --build "$build" -j "${MOK_JOBS:-$(nproc)}" --target mok-opt mok-compile

# A sanitized process is several times slower than the release build: allow
# 2 s per mutant in a batch before it is bisected, 5 minutes for one input
# before it is a hang.
exec python3 "$root/scripts/fuzz-mok-opt.py" \
  --mok-opt "$build/bin/mok-opt" --mok-compile "$build/bin/mok-compile" \
  --timeout 2 --hang-timeout 300 --keep-going --out-dir "$out" \
  --duration 30 --count 0 "$@"
