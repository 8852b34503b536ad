#!/usr/bin/env bash
# Run on the H200 from the repo root:   bash scripts/probe/run_on_h200.sh [seed]
# Needs only nvcc + the driver; the PTX (scripts/probe/gemm_sm90.ptx,
# gemm_sm90_nmajor.ptx, gemm_sm90_mnmajor.ptx) was made by build_ptx.sh. Runs
# the three probes (A and B K-major; B N-major; A M-major and B N-major);
# fails if any does.
set -euo pipefail
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
BIN=$(mktemp -d)/mok_probe_harness
"$NVCC" -O2 -std=c++17 scripts/probe/harness.cu -o "$BIN" -lcuda
status=0
for ptx in scripts/probe/gemm_sm90.ptx scripts/probe/gemm_sm90_nmajor.ptx \
           scripts/probe/gemm_sm90_mnmajor.ptx; do
  timeout 120 "$BIN" "$ptx" "$@" || status=1
done
exit $status
