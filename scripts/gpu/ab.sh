#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# One device call that measures compiled variants of mok's layers against
# each other and PyTorch, on the GPU machine, from the repository root:
#   bash scripts/gpu/ab.sh [--forward] [--tests DIR] NAME=DIR NAME=DIR ...
# Each DIR holds a variant's training layers (python3 -m bench.compile
# shapes DIR --training dsv3-shard qwen3-30b, from that variant's
# compiler), or with --forward its forward layers (... shapes DIR SHAPE...);
# the first is the baseline. --tests DIR also runs the backward GPU tests
# (--forward: the forward ones) on DIR's test layers (python3 -m
# bench.compile tests DIR, from the variant's compiler). Carry every DIR
# (the device's `carry`). AB_SHAPES="a b" times those shapes (default
# dsv3-shard qwen3-30b). The -fp8w shapes compile mok's FP8 weight
# quantizer at their first call: carry carry-tools/mok-compile-static.xz
# (as for run_h200.sh) for them.
#
# The order is the one that keeps a broken variant cheap: build the
# runtime extension; load every layer once in parallel (warm_jit.py: the
# driver's JIT compile of a megakernel takes seconds, in series otherwise);
# a smoke run of every variant with a short time limit (a kernel that hangs
# is stopped within AB_SMOKE_S seconds, not at the call's end); the tests;
# then python3 -m bench.ab with AB_ROUNDS rounds (default 2) in the time
# left (AB_TOTAL_S, default 570). Output unbuffered; the A/B's lines also
# in $OUT/ab.txt and the tests' in $OUT/tests.txt.
set -uo pipefail
tests=""
mode=()
while [[ ${1:-} == --* ]]; do
  case $1 in
    --forward) mode=(--forward); shift ;;
    --tests) tests=${2:?--tests needs a folder}; shift 2 ;;
    *) echo "ab.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if (( $# < 1 )); then
  echo "usage: bash scripts/gpu/ab.sh [--forward] [--tests DIR] NAME=DIR [NAME=DIR ...]" >&2
  exit 2
fi
dirs=()
for v in "$@"; do
  if [[ $v != *=* ]]; then
    echo "ab.sh: '$v' is not NAME=DIR" >&2
    exit 2
  fi
  d=${v#*=}
  if [[ ! -d $d ]]; then
    echo "ab.sh: '$d' (of $v) is not a folder" >&2
    exit 2
  fi
  dirs+=("$d")
done
if [[ -n $tests && ! -d $tests ]]; then
  echo "ab.sh: --tests '$tests' is not a folder" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
out=${OUT:-/tmp}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "[$(elapsed) s] $*"; }
total=${AB_TOTAL_S:-570}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
bash scripts/gpu/build_ext.sh "$out/build-ext.log" || exit 1
export PYTHONPATH=$root/build-gpu/python PYTHONUNBUFFERED=1
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
source scripts/gpu/carried_compiler.sh
say "built"

warm=("${dirs[@]}")
[[ -n $tests ]] && warm+=("$tests")
timeout 200 python3 scripts/gpu/warm_jit.py "${warm[@]}" 2>&1 | tail -1
say "JIT cache warm"

status=0
read -ra shapes <<< "${AB_SHAPES:-dsv3-shard qwen3-30b}"
timeout "${AB_SMOKE_S:-120}" python3 -m bench.ab "${mode[@]}" "$@" --shapes "${shapes[@]}" \
    --rounds 1 --budget 0.05 --out "$out/smoke" > "$out/smoke.txt" 2>&1
rc=$?
if (( rc != 0 )); then
  echo "ab.sh: the smoke run failed (rc $rc; 124: a kernel hung):"
  tail -20 "$out/smoke.txt"
  exit 1
fi
say "smoke run passed"

if [[ -n $tests ]]; then
  kind=backward
  (( ${#mode[@]} )) && kind=forward
  MOK_GPU_ARTIFACTS=$(cd "$tests" && pwd) timeout "${AB_TESTS_S:-240}" python3 -m pytest -q \
      -p no:cacheprovider "python/tests/gpu/test_gpu_${kind}.py" > "$out/tests.txt" 2>&1 ||
    status=1
  grep -E "passed|failed|FAILED|Error" "$out/tests.txt" | tail -20
  say "tests"
fi

left=$(( total - $(elapsed) ))
if (( left < 60 )); then
  echo "ab.sh: $left s left, too few for the A/B"
  exit 1
fi
timeout "$left" python3 -m bench.ab "${mode[@]}" "$@" --shapes "${shapes[@]}" \
    --rounds "${AB_ROUNDS:-2}" --out "$out" 2>&1 |
  tee "$out/ab.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
say "done"
exit $status
