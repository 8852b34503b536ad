#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# What the compiled kernels are on the chip: assembles each layer's PTX in
# ARTIFACTS (python3 -m bench.compile's folders, shapes or tests, one per
# layer) for sm_90a and prints, per layer, the wgmma
# instructions in the SASS (HGMMA for bf16, QGMMA for FP8: any *GMMA, from
# cuobjdump --dump-sass), the
# registers and the spill bytes (ptxas -v):
#   bash scripts/gpu/sass_check.sh /tmp/bench-artifacts-here
# Fails if a sm_90a layer whose PTX has wgmma has no GMMA in its SASS,
# if a layer spills, or if ptxas warns (layers without tensor-core GEMMs,
# e.g. some of the test layers, show "-").
# Needs ptxas and cuobjdump (CUDA toolkit); profiling kernels are skipped.
set -uo pipefail
artifacts=${1:?usage: bash scripts/gpu/sass_check.sh ARTIFACTS}
cuda=${CUDA_HOME:-/usr/local/cuda}
ptxas=$cuda/bin/ptxas cuobjdump=$cuda/bin/cuobjdump
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0 seen=0
printf '%-22s %6s %9s %12s %11s\n' layer GMMA registers "spill st (B)" "spill ld (B)"
for ptx in "$artifacts"/*/*.ptx; do
  layer=$(basename "$(dirname "$ptx")")
  [[ $layer == *-profile ]] && continue
  grep -q '^\.target sm_90a' "$ptx" || continue
  seen=1
  if ! "$ptxas" -arch=sm_90a -v -o "$work/k.cubin" "$ptx" 2> "$work/v.txt"; then
    echo "$layer: ptxas failed"; cat "$work/v.txt"; status=1; continue
  fi
  hgmma=-
  if grep -q 'wgmma.mma_async' "$ptx"; then
    hgmma=$("$cuobjdump" --dump-sass "$work/k.cubin" | grep -cE '[A-Z]GMMA\.')
    (( hgmma > 0 )) || status=1
  fi
  regs=$(grep -o 'Used [0-9]* registers' "$work/v.txt" | awk '{print $2}' | sort -n | tail -1)
  stores=$(grep -o '[0-9]* bytes spill stores' "$work/v.txt" | awk '{s += $1} END {print s + 0}')
  loads=$(grep -o '[0-9]* bytes spill loads' "$work/v.txt" | awk '{s += $1} END {print s + 0}')
  printf '%-22s %6s %9s %12s %11s\n' "$layer" "$hgmma" "$regs" "$stores" "$loads"
  if grep -qi 'warning' "$work/v.txt"; then
    echo "$layer: ptxas warns:"; grep -i warning "$work/v.txt"; status=1
  fi
  if (( stores > 0 || loads > 0 )); then status=1; fi
done
(( seen )) || { echo "no sm_90a layer under $artifacts"; status=1; }
exit $status
