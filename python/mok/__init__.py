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

On a GPU (torch tensors): ``mok.compile(spec, target="sm_90a")`` is the
inference kernel (``GpuArtifact``); with ``training=True`` the training
forward and backward kernels (``GpuTrainingArtifact``, whose ``load()`` is a
``GpuTrainingLayer`` with the same forward/backward contract).
"""
from ._bf16 import bf16_to_float32, to_bf16
from ._gpu import GpuArtifact, GpuLayer, MokRuntimeError, __version__
from ._gpu_train import GpuTrainingArtifact, GpuTrainingLayer
from ._layer import CompiledLayer, Context, Gradients, compile
from ._spec import LayerSpec

__all__ = [
    "CompiledLayer",
    "GpuArtifact",
    "GpuLayer",
    "GpuTrainingArtifact",
    "GpuTrainingLayer",
    "MokRuntimeError",
    "Context",
    "Gradients",
    "LayerSpec",
    "bf16_to_float32",
    "compile",
    "to_bf16",
]
