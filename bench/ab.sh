#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Times kernel variants against each other in one session on the GPU
# machine: rounds of every variant in turn (so that the GPU's clock and
# power state fall on all of them alike; round r starts at the r-th
# variant, so that no variant always runs first), each timed with the PyTorch
# baseline and the matmul ceiling by bench/moe_forward.py. A variant is a
# folder of compiled shapes (bench/prepare.py, or `mok-compile X.mlir
# --chip sm_90a [--profile] -o DIR/SHAPE[-profile]` with another compiler
# build); JSON per round and variant in $OUT/ab/NAME-ROUND (or /tmp/ab).
#
#   bash bench/ab.sh ROUNDS "SHAPE..." NAME=DIR [NAME=DIR...]
#
# e.g. bash bench/ab.sh 2 "dsv3-shard qwen3-30b" old=/tmp/old new=/tmp/new
# (PYTHONPATH must reach the mok runtime extension, build-gpu/python.)
set -euo pipefail
if (( $# < 3 )); then
  sed -n '3,16p' "$0" >&2
  exit 2
fi
rounds=$1 shapes=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp}/ab
for spec in "$@"; do
  [[ $spec == *=* && -d ${spec#*=} ]] || { echo "ab.sh: '$spec' is not NAME=DIR with DIR a folder" >&2; exit 2; }
done
specs=("$@")
n=${#specs[@]}
for (( r = 1; r <= rounds; ++r )); do
  for (( i = 0; i < n; ++i )); do
    spec=${specs[(r - 1 + i) % n]}
    name=${spec%%=*} dir=${spec#*=}
    echo "== round $r: $name ($dir)"
    # shellcheck disable=SC2086
    python3 "$root/bench/moe_forward.py" --artifacts "$dir" --shapes $shapes \
        --out "$out/$name-$r" --commit "$name" --budget "${AB_BUDGET:-1.5}" 2>&1 |
      grep -E "^(shape|$(echo $shapes | tr ' ' '|')) " || true
  done
done
