# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok: a compiler for fused Mixture-of-Experts layers.

    import mok
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=8, top_k=2)
    layer = mok.compile(spec, target="cpu")
    out, ctx = layer.forward(x=..., top_experts=..., router_weights=..., ...)
    grads = layer.backward(ctx, d_out)

bf16 arrays are NumPy ``uint16`` arrays of bf16 bit patterns (or
``ml_dtypes.bfloat16`` arrays when that package is installed); ``to_bf16``
and ``bf16_to_float32`` convert. torch is not needed; ``import mok.torch``
(which needs it) gives the layer as a PyTorch autograd function and module.

``mok.compile(layer, target, options=None, **option_keywords)`` takes a
``mok.CompileOptions`` (or its fields as keywords) and returns a
``mok.Artifact``: ``target``, ``options``, ``stages`` (the IR of each step),
``save(directory)``, ``load(device=None)``. On the CPU it is a
``CompiledLayer``; on a GPU (torch tensors, ``target="sm_90a"``) a
``GpuArtifact`` of the inference kernel, or with ``training=True`` a
``GpuTrainingArtifact`` of the training forward and backward kernels, whose
``load()`` is a ``GpuTrainingLayer`` with the same forward/backward contract.
A spec with ``ep=N > 1`` compiles on the CPU to a ``CompiledGroupLayer``,
which runs the N ranks of an expert-parallel group in one process
(``run_group``, ``forward_group``, ``backward_group``; docs/ExpertParallel.md).

Expert parallelism: ``mok.Communicator`` (from an NCCL unique id, adopted
from a torch.distributed process group, or a local group of ranks on one
GPU) is what a layer compiled for ``ep > 1`` is bound to
(``GpuArtifact.load(comm=...)``, ``GpuLayer.bind_comm``).
"""
from ._artifact import Artifact, Stages
from ._bf16 import bf16_to_float32, to_bf16
from ._comm import Communicator, load_nccl, nccl_library
from ._compile import compile
from ._gpu import ERROR_CHECKS, GpuArtifact, GpuLayer, MokRuntimeError, set_error_checks
from ._gpu_train import GpuTrainingArtifact, GpuTrainingLayer
from ._layer import CompiledGroupLayer, CompiledLayer, Context, Exchange, Gradients
from ._options import CompileOptions
from ._spec import LayerSpec
from ._version import __version__

__all__ = [
    "Artifact",
    "CompileOptions",
    "CompiledGroupLayer",
    "CompiledLayer",
    "Communicator",
    "GpuArtifact",
    "GpuLayer",
    "GpuTrainingArtifact",
    "GpuTrainingLayer",
    "MokRuntimeError",
    "Context",
    "ERROR_CHECKS",
    "Exchange",
    "Gradients",
    "LayerSpec",
    "Stages",
    "bf16_to_float32",
    "compile",
    "load_nccl",
    "nccl_library",
    "set_error_checks",
    "to_bf16",
]
