#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Bring the build up to date and run every test suite through ctest (lit's
# IR tests, the docs check; GPU tests skip themselves on machines without a
# GPU). Run scripts/setup.sh once first.
#
#   scripts/test.sh [extra ctest arguments]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOK_BUILD_DIR:-$root/build}
if [[ ! -f "$build/build.ninja" ]]; then
  echo "test.sh: no build in $build; run scripts/setup.sh first" >&2
  exit 1
fi
export CCACHE_BASEDIR=$root
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
