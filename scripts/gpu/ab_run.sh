#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# One device call that measures compiled variants of the training layers
# against each other and PyTorch autograd, on the GPU machine, from the
# repository root:
#   bash scripts/gpu/ab_run.sh [--tests DIR] NAME=DIR NAME=DIR ...
# Each DIR holds a variant's training layers (bench/prepare.py DIR sm_90a
# --training dsv3-shard qwen3-30b, from that variant's compiler); the first
# is the baseline. --tests DIR also runs the backward GPU tests on DIR's
# test layers (scripts/gpu/prepare_artifacts.py DIR, from the variant's
# compiler). Carry every DIR (the device's `carry`).
#
# The order is the one that keeps a broken variant cheap: build the
# runtime extension; load every layer once in parallel (warm_jit.py: the
# driver's JIT compile of a megakernel takes seconds, in series otherwise);
# a smoke run of every variant with a short time limit (a kernel that hangs
# is stopped within AB_SMOKE_S seconds, not at the call's end); the tests;
# then bench/ab_training.py with AB_ROUNDS rounds (default 2) in the time
# left (AB_TOTAL_S, default 570). Output unbuffered; the A/B's lines also
# in $OUT/ab.txt and the tests' in $OUT/tests.txt.
set -uo pipefail
tests=""
if [[ ${1:-} == --tests ]]; then
  tests=${2:?--tests needs a folder}
  shift 2
fi
if (( $# < 1 )); then
  echo "usage: bash scripts/gpu/ab_run.sh [--tests DIR] NAME=DIR [NAME=DIR ...]" >&2
  exit 2
fi
dirs=()
for v in "$@"; do
  if [[ $v != *=* ]]; then
    echo "ab_run.sh: '$v' is not NAME=DIR" >&2
    exit 2
  fi
  d=${v#*=}
  if [[ ! -d $d ]]; then
    echo "ab_run.sh: '$d' (of $v) is not a folder" >&2
    exit 2
  fi
  dirs+=("$d")
done
if [[ -n $tests && ! -d $tests ]]; then
  echo "ab_run.sh: --tests '$tests' is not a folder" >&2
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
say "built"

warm=("${dirs[@]}")
[[ -n $tests ]] && warm+=("$tests")
timeout 200 python3 scripts/gpu/warm_jit.py "${warm[@]}" 2>&1 | tail -1
say "JIT cache warm"

status=0
timeout "${AB_SMOKE_S:-120}" python3 bench/ab_training.py "$@" --rounds 1 --budget 0.05 \
    > "$out/smoke.txt" 2>&1
rc=$?
if (( rc != 0 )); then
  echo "ab_run.sh: the smoke run failed (rc $rc; 124: a kernel hung):"
  tail -20 "$out/smoke.txt"
  exit 1
fi
say "smoke run passed"

if [[ -n $tests ]]; then
  MOK_GPU_ARTIFACTS=$(cd "$tests" && pwd) timeout "${AB_TESTS_S:-240}" python3 -m pytest -q \
      -p no:cacheprovider python/tests/gpu/test_gpu_backward.py > "$out/tests.txt" 2>&1 ||
    status=1
  grep -E "passed|failed|FAILED|Error" "$out/tests.txt" | tail -20
  say "tests"
fi

left=$(( total - $(elapsed) ))
if (( left < 60 )); then
  echo "ab_run.sh: $left s left, too few for the A/B"
  exit 1
fi
timeout "$left" python3 bench/ab_training.py "$@" --rounds "${AB_ROUNDS:-2}" 2>&1 |
  tee "$out/ab.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
say "done"
exit $status
