#!/usr/bin/env bash
# Lower gemm_sm90.mlir and gemm_sm90_nmajor.mlir to PTX with MLIR 22 (Debian
# /usr/lib/llvm-22), extract the PTX into gemm_sm90.ptx / gemm_sm90_nmajor.ptx
# and check each with ptxas for sm_90a. Runs on the dev box (no GPU needed).
# Usage: scripts/probe/build_ptx.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")"
L=/usr/lib/llvm-22/bin
CUDA=${CUDA_HOME:-/usr/local/cuda}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

# The K-major probe, the N-major-B one (the backward's dgrad operands) and the
# M-major-A, N-major-B one (its wgrad operands).
for probe in gemm_sm90 gemm_sm90_nmajor gemm_sm90_mnmajor; do
"$L/mlir-opt" $probe.mlir --mlir-print-op-on-diagnostic=false \
  --nvvm-attach-target="chip=sm_90a features=+ptx80 O=3" \
  --convert-nvgpu-to-nvvm \
  --convert-scf-to-cf \
  --expand-strided-metadata \
  --lower-affine \
  --convert-gpu-to-nvvm="use-bare-ptr-memref-call-conv=1" \
  --convert-nvvm-to-llvm \
  --reconcile-unrealized-casts \
  --gpu-module-to-binary="format=isa toolkit=$CUDA" \
  -o "$TMP/out.mlir"

# gpu.binary ... assembly = "<escaped PTX>": MLIR escapes bytes as \XX (hex) and '\' as '\\'.
python3 - "$TMP/out.mlir" $probe.ptx <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r'assembly = "((?:[^"\\]|\\.)*)"', text)
if not m:
    sys.exit("no assembly = \"...\" in mlir-opt output")
ptx = re.sub(r'\\([0-9A-Fa-f]{2}|\\)',
             lambda g: '\\' if g.group(1) == '\\' else chr(int(g.group(1), 16)), m.group(1))
open(sys.argv[2], 'w').write(ptx)
PY
echo "wrote $(pwd)/$probe.ptx ($(wc -l < $probe.ptx) lines)"

"$CUDA/bin/ptxas" -arch=sm_90a -v $probe.ptx -o "$TMP/$probe.cubin"
echo "ptxas OK (sm_90a)"
grep -c 'wgmma.mma_async' $probe.ptx | sed 's/^/wgmma.mma_async instructions: /'
grep -o 'wgmma.mma_async[.a-z0-9]*' $probe.ptx | sort | uniq -c
done
