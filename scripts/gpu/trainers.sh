#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# On the GPU machine (offline): install the trainers' released wheels
# carried in trainer-wheels/ (fetched on a machine with PyPI by
#   pip download --no-deps -d trainer-wheels transformers==5.18.0 \
#       nemo-automodel==0.7.0 megatron-core==0.16.1
# ), then run the trainer GPU tests and the transformers decoder-layer
# benchmark. Expects the extension built (scripts/gpu/build_ext.sh) and
# PYTHONPATH set to build-gpu/python and the checkout. $1: output folder.
set -uo pipefail
out=${1:-trainer-out}
mkdir -p "$out"
python3 -m pip install -q --no-deps trainer-wheels/*.whl 2>&1 | tail -3
# (an import failure here is fatal: the tests would only skip)
python3 -c "import transformers, nemo_automodel.components.moe.mok_experts, megatron.core.transformer.moe.moe_layer; print('transformers', transformers.__version__)" || exit 1
status=0
python3 -m pytest -q -s python/tests/gpu/test_gpu_trainers.py > "$out/trainers.log" 2>&1 || status=1
tail -40 "$out/trainers.log"
python3 -m bench.hf_decoder --out "$out" 2>&1 | tail -3 || status=1
python3 -m bench.hf_training --device cuda "$out" 2>&1 | tail -3 || status=1
exit $status
