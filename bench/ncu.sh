#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Nsight Compute on one launch of each named shape's mok kernel (compiled
# by `python3 -m bench.compile shapes ARTIFACTS`), e.g. the default and the
# warp-specialized GEMMs side by side:
#   bash bench/ncu.sh /tmp/b dsv3-shard dsv3-shard-ws
# Writes OUT/ncu-<shape>.csv (OUT defaults to /tmp) and prints the
# tensor-pipe, issue-stall and memory lines of each.
# With --source first, it samples warp stalls per SASS instruction
# instead (SourceCounters) and writes OUT/ncu-src-<shape>.csv (address,
# instruction, samples by stall reason): where the warps wait.
#   bash bench/ncu.sh --source /tmp/b dsv3-shard
set -euo pipefail
source_mode=0
if [[ ${1:-} == --source ]]; then source_mode=1; shift; fi
if (( $# < 2 )); then
  echo "usage: bash bench/ncu.sh [--source] ARTIFACTS SHAPE..." >&2
  exit 2
fi
artifacts=$(cd "$1" && pwd) || exit 2
shift
out=$(cd "${OUT:-/tmp}" && pwd) || exit 2
# python3 -m bench.ncu_forward from the repository root (the bench package).
cd "$(dirname "$0")/.." || exit 1
for shape in "$@"; do
  if (( source_mode )); then
    rm -f "$out/ncu-src-$shape.ncu-rep"
    timeout 300 ncu --kernel-name regex:'_forward$' --launch-skip 2 --launch-count 1 \
        --section SourceCounters --section WarpStateStats -o "$out/ncu-src-$shape" \
        python3 -m bench.ncu_forward "$artifacts" "$shape" > "$out/ncu-src-$shape.err" 2>&1 &&
      ncu -i "$out/ncu-src-$shape.ncu-rep" --page source --print-source sass --csv \
        > "$out/ncu-src-$shape.csv" 2>>"$out/ncu-src-$shape.err" ||
      { echo "ncu --source failed for $shape:"; tail -5 "$out/ncu-src-$shape.err"; continue; }
    rm -f "$out/ncu-src-$shape.ncu-rep"
    echo "== $shape: $(( $(wc -l < "$out/ncu-src-$shape.csv") - 2 )) SASS lines in $out/ncu-src-$shape.csv"
    continue
  fi
  # --kernel-name keeps ncu to the mok kernel; skip the first forwards'
  # launches (module load, warm-up), catch a later one.
  timeout 300 ncu --kernel-name regex:'_forward$' --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --csv --page details \
      python3 -m bench.ncu_forward "$artifacts" "$shape" > "$out/ncu-$shape.csv" 2>"$out/ncu-$shape.err" ||
    { echo "ncu failed for $shape:"; tail -5 "$out/ncu-$shape.err"; continue; }
  echo "== $shape"
  grep -E '"(Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Duration|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued Instruction|L2 Hit Rate|Registers Per Thread)"' \
      "$out/ncu-$shape.csv" | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' || true
done
