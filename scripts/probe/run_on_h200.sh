#!/usr/bin/env bash
# Run on the H200 from the repo root:   bash scripts/probe/run_on_h200.sh [seed]
# Needs only nvcc + the driver; the PTX (scripts/probe/gemm_sm90.ptx) was made by build_ptx.sh.
set -euo pipefail
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
BIN=$(mktemp -d)/mok_probe_harness
"$NVCC" -O2 -std=c++17 scripts/probe/harness.cu -o "$BIN" -lcuda
timeout 120 "$BIN" scripts/probe/gemm_sm90.ptx "$@"
