#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Runs GPU test files as N pytest processes side by side on the one GPU
# (the tests are dominated by host-side float64 references and driver
# loads, so shards overlap well), each on every N-th test, and prints one
# summary line "N passed, N failed" over all shards plus the failures.
#   bash scripts/gpu/pytest_shards.sh [-n SHARDS] [-o LOGDIR] FILE_OR_DIR...
# Default 4 shards, logs in $OUT or /tmp/pytest-shards (shard<i>.log).
# Exit status 0 only when every shard passed. Run from the repository root
# with PYTHONPATH and MOK_GPU_ARTIFACTS set as for pytest.
set -uo pipefail
shards=4
logs=${OUT:-/tmp/pytest-shards}
while getopts "n:o:" opt; do
  case $opt in
    n) shards=$OPTARG ;;
    o) logs=$OPTARG ;;
    *) echo "usage: pytest_shards.sh [-n SHARDS] [-o LOGDIR] FILE_OR_DIR..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -eq 0 || ! $shards =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: pytest_shards.sh [-n SHARDS>=1] [-o LOGDIR] FILE_OR_DIR..." >&2
  exit 2
fi
mkdir -p "$logs"
mapfile -t ids < <(python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep "::")
if [[ ${#ids[@]} -eq 0 ]]; then
  echo "pytest_shards.sh: no tests collected from $*" >&2
  exit 1
fi
pids=()
for ((s = 0; s < shards; ++s)); do
  mine=()
  for ((i = s; i < ${#ids[@]}; i += shards)); do mine+=("${ids[i]}"); done
  [[ ${#mine[@]} -eq 0 ]] && continue
  python3 -m pytest -v -p no:cacheprovider --durations=10 "${mine[@]}" > "$logs/shard$s.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
passed=$(cat "$logs"/shard*.log | grep -cE " PASSED( |$)")
failed=$(cat "$logs"/shard*.log | grep -cE " (FAILED|ERROR)( |$)")
skipped=$(cat "$logs"/shard*.log | grep -cE " SKIPPED( |$)")
grep -h -E "^(FAILED|ERROR) " "$logs"/shard*.log | sort -u
echo "$passed passed, $failed failed, $skipped skipped (${#ids[@]} tests in $shards shards; logs in $logs)"
exit $status
