#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# compute-sanitizer over mok's GPU kernels, on the GPU machine, in one call
# of its 10 minutes: memcheck, racecheck, synccheck and initcheck, each over
# the same layers, one process per layer and tool (a synccheck or memcheck
# error ends the process's CUDA context, so a shared process would leave
# the later layers unchecked), SANITIZE_JOBS (default 14) at once.
# scripts/gpu/sanitize_run.py runs the forward of an inference layer, the
# training forward and the backward of a training layer. Only mok's kernels
# are checked (--kernel-name kns=moe_layer), not torch's.
#
# From the repository root, with the layers compiled beforehand (python3 -m
# bench.compile tests gpu-artifacts) and the runtime extension built
# (scripts/gpu/build_ext.sh, or run_h200.sh first):
#   bash scripts/gpu/sanitize.sh [CASE ...]
# Without cases, SANITIZE_CASES below: small layers that take every code
# path (SIMT and wgmma GEMMs, 64- and 128-row tiles, warp roles, fused and
# copied dispatch, clusters with multicast, shared experts, clamps, -1
# routes, int64 ids, training forward and backward, recompute, main_grads,
# bad routing, the FP8 forward on both engines).
# Writes $OUT/sanitize.md (the table: layer x tool -> errors) and
# $OUT/sanitize-logs.tar.xz (each process's output); exits non-zero on any
# error, a failed call, or a process that did not end in SANITIZE_TIMEOUT
# seconds (default 240).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
out=${OUT:-/tmp/sanitize}
mkdir -p "$out"
logs=$(mktemp -d /tmp/sanitize-logs.XXXXXX)
SANITIZE_CASES=(
  small_shared top2_no_route shared_clamp_i64 one_token_top8 idle_experts qwen3_ragged
  top1_clamp short_k qwen3_top2_clamp copy_short_k copy_top1_clamp
  ws_top1_clamp wsf_short_k wsf_top1_clamp mc_short_k mc_top1_clamp
  train_small_shared train_top2_no_route train_shared_clamp_i64 train_one_token_top8
  train_top1_clamp train_short_k train_shared_tall train_partial_pieces
  recompute_top2_no_route recompute_qwen3_top2_clamp
  maingrad_top2_no_route maingrad_shared_tall
  bad_routing:top2_no_route bad_routing:top1_clamp bad_routing:train_small_shared
  bad_routing:train_shared_tall
  fp8_shared_clamp fp8_shared_clamp_wgmma fp8_skewed_wgmma
  train_fp8_shared_clamp_wgmma train_fp8_skewed_wgmma
)
if (( $# )); then cases=("$@"); else cases=("${SANITIZE_CASES[@]}"); fi
export PYTHONPATH=${PYTHONPATH:-$root/build-gpu/python}
export MOK_GPU_ARTIFACTS=${MOK_GPU_ARTIFACTS:-$root/gpu-artifacts}
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
tools=(memcheck racecheck synccheck initcheck)
seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
echo "sanitize: ${#cases[@]} layers x ${#tools[@]} tools, seed $seed, $("$sanitizer" --version | tail -1)"
one() {  # tool case
  local tool=$1 c=$2 extra=()
  case $tool in
    racecheck) extra=(--racecheck-report hazard) ;;
  esac
  timeout "${SANITIZE_TIMEOUT:-240}" "$sanitizer" --tool "$tool" "${extra[@]}" \
      --kernel-name kns=moe_layer --print-limit 50 --show-backtrace device \
      python3 scripts/gpu/sanitize_run.py --seed "$seed" --artifacts "$MOK_GPU_ARTIFACTS" "$c" \
      > "$logs/$tool.${c//:/-}.log" 2>&1
  echo "exit $?" >> "$logs/$tool.${c//:/-}.log"
}
export -f one
export sanitizer seed logs
start=$(date +%s)
for c in "${cases[@]}"; do for tool in "${tools[@]}"; do echo "$tool $c"; done; done |
  xargs -P "${SANITIZE_JOBS:-14}" -L 1 bash -c 'one "$0" "$1"'
status=0
{
  echo "| layer | $(IFS='|'; echo "${tools[*]}" | sed 's/|/ | /g') |"
  echo "|---|$(printf -- '---|%.0s' "${tools[@]}")"
  for c in "${cases[@]}"; do
    row="| $c |"
    for tool in "${tools[@]}"; do
      log=$logs/$tool.${c//:/-}.log
      # "ERROR SUMMARY: N error(s)"; racecheck: "RACECHECK SUMMARY: N
      # hazards displayed (E errors, W warnings)".
      n=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -1)
      if [[ $tool == racecheck ]]; then
        n=$(sed -n 's/^========= RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p' "$log" | tail -1)
      fi
      cell=${n:-?}
      if ! grep -q "^sanitize_run: .* ok" "$log"; then cell="$cell (call failed)"; fi
      if grep -q "^exit 124" "$log"; then cell="timed out"; fi
      [[ $cell == 0 ]] || status=1
      row+=" $cell |"
    done
    echo "$row"
  done
} > "$out/sanitize.md"
echo "sanitize: $(( $(date +%s) - start )) s" | tee -a "$out/sanitize.md"
tar -C "$logs" -cJf "$out/sanitize-logs.tar.xz" .
cat "$out/sanitize.md"
if (( status )); then
  for log in "$logs"/*.log; do
    if ! grep -q "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$log" ||
       ! grep -q "^sanitize_run: .* ok" "$log"; then
      echo "== $(basename "$log" .log): first reports"
      grep -m 12 "^=========\|^sanitize_run" "$log"
    fi
  done | head -150
fi
exit $status
