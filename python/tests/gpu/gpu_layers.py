# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU tests' compiled test layers (bench/cases.py, compiled by
`python3 -m bench.compile tests` into MOK_GPU_ARTIFACTS), loaded with every
output they allocate poisoned (NaN), and fresh seeds."""
import os

import pytest

import mok

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")


def fresh_seed():
    return int.from_bytes(os.urandom(4), "little")


def forward_artifact(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path)


def forward_layer(name):
    return forward_artifact(name).load(poison_outputs=True)


def training_artifact(name):
    directory = os.path.join(ARTIFACTS, name)
    if not os.path.exists(os.path.join(directory, "moe_layer_backward.ptx")):
        pytest.fail(f"{directory}/moe_layer_backward.ptx is missing: run "
                    "python3 -m bench.compile tests")
    return mok.GpuTrainingArtifact.from_files(directory)


def training_layer(name):
    return training_artifact(name).load(poison_outputs=True)
