#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# The GPU run, on a machine with a CUDA GPU, nvcc, cmake, torch and no MLIR.
# The compiler comes along as the self-contained static binary built on a
# development machine (MOK_CMAKE_ARGS=-DMOK_BUILD_STATIC_TOOLS=ON):
#   mkdir -p carry-tools && strip -o carry-tools/mok-compile-static build/bin/mok-compile-static
#   xz -9 -f carry-tools/mok-compile-static
# Then, from the repository root on the GPU machine (with carry-tools/):
#   bash scripts/gpu/run_h200.sh
# It builds the runtime and the Python runtime extension (no MLIR), runs the
# runtime's host tests, compiles the test layers there with the carried
# compiler, runs the extension's checks and the GPU tests (dense weights and
# weight views) against a float64 reference, and prints a summary table
# last.
# Without carry-tools/, it uses layers compiled beforehand into
# gpu-artifacts/ (python3 -m bench.compile tests gpu-artifacts).
#   bash scripts/gpu/run_h200.sh --bench
# also runs the forward benchmark after the tests (python3 -m bench.compile
# shapes with the carried compiler, or bench-artifacts/ compiled
# beforehand; their SASS checked for HGMMA and their ptxas report for
# spills, scripts/gpu/sass_check.sh; then bench.moe_forward, JSON + PNG in
# $OUT or /tmp/bench), its tables last. MOK_BENCH_SHAPES="a b ..." limits
# the benchmark to those shapes (bench/shapes.py; default the forward
# ones), e.g. to keep a call under the GPU machine's 10 minutes.
#   bash scripts/gpu/run_h200.sh --bench-training
# runs the tests, then the training benchmark instead (bench.compile
# --training, then bench.moe_training: forward + backward against PyTorch
# autograd; MOK_BENCH_SHAPES default "dsv3-shard qwen3-30b").
# MOK_GPU_TESTS="file ..." runs those GPU test files instead of all of
# python/tests/gpu (all of them take about 4.5 minutes; with
# --bench-training, e.g. MOK_GPU_TESTS="python/tests/gpu/
# test_gpu_backward.py python/tests/gpu/test_gpu_torch.py" keeps the call
# well inside the GPU machine's 10 minutes).
#   bash scripts/gpu/run_h200.sh --bench-peers
# runs no GPU tests: mok's training layers of the peers' shapes (routed
# experts only: MOK_BENCH_SHAPES default "dsv3-routed qwen3-30b"; compiled
# here with the carried compiler, or bench-artifacts/ from `python3 -m
# bench.compile shapes bench-artifacts --training --plain-only dsv3-routed
# qwen3-30b`) timed forward and forward + backward beside the open-source
# MoE kernels and PyTorch, in one process (bench.peers; JSON + PNG in $OUT
# or /tmp/bench). The peers come as .peers/ (a copy of the peers folder:
# peer_bench.py and its wheels in whl/, optionally SonicMoE's sonic_pack/;
# git-ignored, carried), installed here into /tmp/site. MOK_PEERS="a,b"
# picks the peers (default: bench.peers's).
set -uo pipefail
bench=0
training=0
peers=0
case "${1:-}" in
  --bench) bench=1 ;;
  --bench-training) bench=1; training=1 ;;
  --bench-peers) peers=1 ;;
  "") ;;
  *) echo "usage: bash scripts/gpu/run_h200.sh [--bench | --bench-training | --bench-peers]" >&2
     exit 2 ;;
esac
start=$(date +%s)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
if (( peers )) && [[ ! -f .peers/peer_bench.py ]]; then
  echo "run_h200.sh: --bench-peers needs .peers/peer_bench.py (copy the peers folder to" \
       ".peers/ and name it in the device call's carry)" >&2
  exit 2
fi
log=${OUT:-/tmp}/gpu-run.log
: > "$log"
status=0
step() { printf '\n== %s\n' "$*" | tee -a "$log"; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"

step "runtime + Python runtime extension: build (cmake, no MLIR)"
# python/runtime-ext into build-gpu/ (the mok package in build-gpu/python).
bash scripts/gpu/build_ext.sh "$log" || exit 1

step "runtime: host tests"
./build-gpu/runtime/mok-runtime-host-test 2>&1 | tail -3 | tee -a "$log" || status=1

export PYTHONPATH=$root/build-gpu/python
export MOK_GPU_ARTIFACTS=$root/gpu-artifacts
source scripts/gpu/carried_compiler.sh
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
commit=${MOK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

if (( peers )); then
  artifacts=$root/bench-artifacts
  read -ra shapes <<< "${MOK_BENCH_SHAPES:-dsv3-routed qwen3-30b}"
  if [[ -n ${MOK_COMPILER:-} ]]; then
    step "peers benchmark: the carried static mok-compile compiles the training layers here"
    artifacts=/tmp/bench-artifacts-here
    rm -rf "$artifacts"
    python3 -m bench.compile shapes "$artifacts" --training --plain-only "${shapes[@]}" 2>&1 |
      tee -a "$log" | tail -3
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "compiling on this machine failed"; exit 1; }
  fi
  step "peers benchmark: the peers' wheels into /tmp/site"
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/whl/*.whl 2>&1 |
    tee -a "$log" | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "installing the peers' wheels failed"; exit 1; }
  if [[ -d .peers/sonic_pack ]]; then
    # Optional (53 MiB): SonicMoE's wheels and the CUTLASS DSL libraries.
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/sonic_pack/*.whl \
      2>&1 | tee -a "$log" | tail -3
    for libs in .peers/sonic_pack/*.tar.xz; do
      [[ -f $libs ]] && tar -xJf "$libs" -C /tmp/site
    done
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/site PYTHONUNBUFFERED=1
  step "peers benchmark: mok's layers loaded in parallel ($artifacts)"
  timeout 200 python3 scripts/gpu/warm_jit.py "$artifacts" 2>&1 | tee -a "$log" | tail -3
  left=$(( ${MOK_TOTAL_S:-570} - ($(date +%s) - start) ))
  step "peers benchmark: mok, PyTorch and the peers, same run ($artifacts; $left s left)"
  # No peer's first call (its compile and autotune) starts in the last
  # 120 s, which leave room for the timings; the step is bounded by the time
  # left (the JSON is written after each shape).
  if (( left < 180 )); then
    echo "run_h200.sh: $left s left, too few for the peers benchmark"
    exit 1
  fi
  timeout "$left" python3 -m bench.peers --artifacts "$artifacts" --shapes "${shapes[@]}" \
      --peer-bench .peers/peer_bench.py ${MOK_PEERS:+--peers "$MOK_PEERS"} \
      --budget-s $(( left - 120 )) --out "${OUT:-/tmp/bench}" --commit "$commit" 2>&1 |
    tee -a "$log" | tail -40
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  exit $status
fi

if [[ -n ${MOK_COMPILER:-} ]]; then
  step "compiler: the carried static mok-compile compiles the test layers here"
  export MOK_GPU_ARTIFACTS=/tmp/gpu-artifacts-here
  rm -rf "$MOK_GPU_ARTIFACTS"
  python3 -m bench.compile tests "$MOK_GPU_ARTIFACTS" 2>&1 | tee -a "$log" | tail -3
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "compiling on this machine failed"; exit 1; }
fi

if python3 -c "import numpy" 2>/dev/null; then
  step "runtime extension: argument checks and weight views (no kernel runs)"
  python3 -m pytest -q -p no:cacheprovider python/tests/test_runtime_ext.py 2>&1 | tee -a "$log" | tail -5
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

# The driver compiles each layer's PTX when it loads it, seconds for a
# megakernel; several processes load every test layer once first, so that
# the tests find the machine code in the JIT cache.
step "JIT cache: the test layers loaded in parallel ($MOK_GPU_ARTIFACTS)"
timeout 300 python3 scripts/gpu/warm_jit.py "$MOK_GPU_ARTIFACTS" 2>&1 | tee -a "$log" | tail -3
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

step "GPU tests (${MOK_GPU_TESTS:-python/tests/gpu}; $MOK_GPU_ARTIFACTS)"
# A kernel that hangs must not eat the machine's time: bounded.
# shellcheck disable=SC2086
timeout "${MOK_GPU_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider ${MOK_GPU_TESTS:-python/tests/gpu} 2>&1 | tee -a "$log" | tail -25 || status=1
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

if (( training )); then
  artifacts=$root/bench-artifacts
  shapes=${MOK_BENCH_SHAPES:-dsv3-shard qwen3-30b}
  if [[ -n ${MOK_COMPILER:-} ]]; then
    step "training benchmark: compiling the shapes here (plain and profile=True)"
    artifacts=/tmp/bench-artifacts-here
    rm -rf "$artifacts"
    # shellcheck disable=SC2086
    python3 -m bench.compile shapes "$artifacts" --training $shapes 2>&1 | tee -a "$log" | tail -2
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  step "training benchmark: mok forward + backward against PyTorch autograd, same run ($artifacts)"
  # shellcheck disable=SC2086
  timeout "${MOK_GPU_TIMEOUT:-420}" python3 -m bench.moe_training --artifacts "$artifacts" \
      --out "${OUT:-/tmp/bench}" --shapes $shapes --commit "$commit" 2>&1 |
    tee -a "$log" | tail -70
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  exit $status
fi

if (( bench )); then
  artifacts=$root/bench-artifacts
  if [[ -n ${MOK_COMPILER:-} ]]; then
    step "benchmark: compiling the shapes here (plain and profile=True)"
    artifacts=/tmp/bench-artifacts-here
    rm -rf "$artifacts"
    # shellcheck disable=SC2086
    python3 -m bench.compile shapes "$artifacts" ${MOK_BENCH_SHAPES:-} 2>&1 | tee -a "$log" | tail -2
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  step "benchmark: the kernels' SASS (HGMMA) and ptxas report (registers, spills)"
  bash scripts/gpu/sass_check.sh "$artifacts" 2>&1 | tee -a "$log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  step "benchmark: mok against plain PyTorch, same run ($artifacts)"
  # shellcheck disable=SC2086
  timeout "${MOK_GPU_TIMEOUT:-420}" python3 -m bench.moe_forward --artifacts "$artifacts" \
      --out "${OUT:-/tmp/bench}" ${MOK_BENCH_SHAPES:+--shapes $MOK_BENCH_SHAPES} \
      --commit "$commit" 2>&1 |
    tee -a "$log" | tail -16
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
exit $status
