#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Builds the runtime and the Python runtime extension (python/runtime-ext:
# libmok_runtime.so, its host test and the mok package with mok._runtime,
# nanobind, for this python3) into build-gpu/, with cmake and no MLIR; the
# GPU machine's scripts (run_h200.sh, ab.sh) share it. From the
# repository root:
#   bash scripts/gpu/build_ext.sh [LOG]
# cmake's output goes to LOG (appended; default /dev/null); on failure the
# script says so, prints LOG's tail and exits 1.
set -uo pipefail
log=${1:-/dev/null}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
if [[ -f build-gpu/CMakeCache.txt ]] &&
   ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$root/python/runtime-ext$" build-gpu/CMakeCache.txt; then
  rm -rf build-gpu  # configured from another source folder (runtime/ alone, before)
fi
if ! { cmake -S python/runtime-ext -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DPython_EXECUTABLE="$(command -v python3)" >>"$log" 2>&1 &&
        cmake --build build-gpu >>"$log" 2>&1; }; then
  echo "runtime / extension build failed (needs nanobind and Python headers)"
  [[ $log != /dev/null ]] && tail -30 "$log"
  exit 1
fi
