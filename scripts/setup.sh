#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# From a fresh Debian 12 machine (CUDA 13 at /usr/local/cuda) to a built mok,
# then the main job on a shipped example. Idempotent: a second run installs
# nothing and rebuilds only what changed.
#
#   scripts/setup.sh
#
# Environment:
#   MOK_BUILD_DIR    build directory (default: build)
#   MOK_CMAKE_ARGS   extra CMake arguments, e.g. -DMOK_BUILD_STATIC_TOOLS=ON
#   MOK_WITH_TORCH   1: also install torch (2.11, PyPI's wheel with its CUDA
#                    libraries, about 4.7 GB) for mok.torch's tests; CI sets it
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOK_BUILD_DIR:-$root/build}
llvm=/usr/lib/llvm-22

say() { printf '\n== %s\n' "$*"; }

# --- 1. System packages (Debian's LLVM/MLIR 22 and the build tools) --------
packages=(libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
          libzstd-dev ccache cmake ninja-build g++ python3 python3-dev python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    "${missing[@]}" >/dev/null
else
  say "system packages present"
fi
if [[ ! -x /usr/local/cuda/bin/ptxas ]]; then
  echo "note: /usr/local/cuda/bin/ptxas not found; the ptxas-checked tests will be skipped" >&2
fi

# --- 2. Python packages (the mok package's build and tests) -----------------
py=$(command -v python3)
pip_packages=(numpy pytest nanobind)
if ! "$py" -c 'import numpy, pytest, nanobind' 2>/dev/null; then
  say "installing ${pip_packages[*]} for $py"
  # Debian's own python3 is "externally managed"; pyenv/venv ones are not.
  "$py" -m pip install -q "${pip_packages[@]}" 2>/dev/null ||
    "$py" -m pip install -q --break-system-packages "${pip_packages[@]}"
else
  say "python packages present"
fi

# mok.torch's tests (python/tests/test_torch.py) need torch; without it they
# are skipped. The same major version as the GPU machine's (docs/Building.md).
if [[ ${MOK_WITH_TORCH:-0} == 1 ]] && ! "$py" -c 'import torch' 2>/dev/null; then
  say "installing torch 2.11 for $py (mok.torch's tests)"
  "$py" -m pip install -q "torch==2.11.*" 2>/dev/null ||
    "$py" -m pip install -q --break-system-packages "torch==2.11.*"
fi

# The trainers whose own released code the trainer tests run against mok
# (python/tests/test_trainers.py; docs/Trainers.md): NeMo AutoModel and
# Megatron-Core without their dependencies (their MoE modules import with
# torch and transformers alone), and the transformers release AutoModel
# 0.7.0 pins, with its own small dependencies. Skipped without torch.
trainers=("transformers==5.18.0" "nemo-automodel==0.7.0" "megatron-core==0.16.1")
if [[ ${MOK_WITH_TORCH:-0} == 1 ]] && ! "$py" - "${trainers[@]}" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
for want in sys.argv[1:]:
    name, version = want.split("==")
    assert m.version(name) == version
PY
then
  say "installing ${trainers[*]} for $py (the trainer tests)"
  pipi() { "$py" -m pip install -q "$@" 2>/dev/null ||
             "$py" -m pip install -q --break-system-packages "$@"; }
  pipi "${trainers[0]}"
  pipi --no-deps "${trainers[1]}" "${trainers[2]}"
fi

# --- 2b. cuobjdump + nvdisasm (the SASS tests) ------------------------------
# The CUDA install here has ptxas but not cuobjdump/nvdisasm; NVIDIA's wheels
# of the two (5 MB) let the lit SASS test check that every wgmma survives
# into the machine code (HGMMA) on machines without a GPU (docs/Building.md).
sass_tools=$build/tools
if ! command -v cuobjdump >/dev/null && [[ ! -x /usr/local/cuda/bin/cuobjdump ]] &&
   [[ ! -x $sass_tools/nvidia/cu13/bin/cuobjdump ]]; then
  say "installing cuobjdump and nvdisasm into $sass_tools"
  "$py" -m pip install -q --no-deps --target "$sass_tools" \
      nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 ||
    echo "note: cuobjdump not installed; the SASS tests will be skipped" >&2
fi

# --- 3. Configure and build -------------------------------------------------
# (CMakeLists.txt runs ccache keyed on paths relative to the checkout, so
# fresh clones (CI) hit the cache of earlier builds on the same machine.)
say "configuring $build"
# shellcheck disable=SC2086
cmake -G Ninja -S "$root" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DMLIR_DIR=$llvm/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=$llvm/bin/lit \
  -DPython_EXECUTABLE="$py" \
  ${MOK_CMAKE_ARGS:-} >/dev/null
say "building"
cmake --build "$build" -j "$(nproc)"

# --- 4. The main job on shipped examples -----------------------------------
say "main job: $build/bin/mok-opt examples/deepseek-v3.mlir --moe-fuse-layer"
"$build/bin/mok-opt" "$root/examples/deepseek-v3.mlir" --moe-fuse-layer
ptx_dir=$build/out
for chip in sm_90a sm_100a; do
  say "main job: examples/dsv3-shard.mlir -> PTX for $chip ($ptx_dir/$chip)"
  "$build/bin/mok-opt" "$root/examples/dsv3-shard.mlir" --moe-to-ptx=chip=$chip |
    "$py" "$root/scripts/extract-ptx.py" "$ptx_dir/$chip"
  if [[ -x /usr/local/cuda/bin/ptxas ]]; then
    for f in "$ptx_dir/$chip"/*.ptx; do
      /usr/local/cuda/bin/ptxas -arch=$chip "$f" -o "${f%.ptx}.cubin"
      echo "ptxas -arch=$chip accepted $(basename "$f")"
    done
  fi
done
say "main job, CPU: the same layer (smaller) compiled and run from Python"
PYTHONPATH=$build/python "$py" "$root/examples/run_cpu_layer.py"
say "done; run the tests with scripts/test.sh"
echo "Python: PYTHONPATH=$build/python uses this build's package; pip install $root"
echo "installs it (docs/Building.md)"
