# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.hf: mok as an experts implementation of Hugging Face transformers
(5.x) MoE models.

    import mok.hf                      # registers "mok" with transformers
    model = AutoModelForCausalLM.from_config(config, experts_implementation="mok",
                                             dtype=torch.bfloat16)
    # or model.set_experts_implementation("mok") on a loaded model

Every transformers experts module made with ``@use_experts_implementation``
whose experts are bias-free SwiGLU (``gate_up_proj`` [E, 2I, H] with the
gate rows first, ``down_proj`` [E, H, I], ``hidden_act`` "silu"): Qwen3-MoE,
Qwen2-MoE, Mixtral, DeepSeek-V3 and the others of that form. The module's
own parameters are used in place: on the GPU the kernels read the gate and
up halves of ``gate_up_proj`` through weight views (no copy a step), and
the gradients land in the parameters' ``.grad`` (``gate_up_proj``'s as one
[E, 2I, H] tensor). Any token count a call (a layer compiled for any T,
cached per shape); bf16 activations and weights.

Refused by name (ValueError naming the module's attribute): experts with
biases, interleaved or transposed layouts, non-gated experts, activations
other than SiLU, weights or activations not in bf16, and transformers'
own expert parallelism (``_is_expert_parallel``; mok's expert parallelism
is mok.torch.MoELayer(process_group=...)). The shared expert of models
that have one stays the model's module (transformers calls it outside the
experts module); it is not fused into mok's layer here.

CPU tensors run mok's CPU target (the executable reference; the gate and
up halves are copied into contiguous arrays there); CUDA tensors on an
sm_90a or sm_100a device run the GPU kernels.
"""
import atexit
import threading

import torch

from ._compile import compile as _compile
from ._spec import DEFAULT_MAX_TOKENS, LayerSpec
from .functional import _chip
from .torch import _run_backward, _run_forward

__all__ = ["experts_forward", "register"]

NAME = "mok"


def register():
    """Registers mok's experts forward as transformers' "mok" experts
    implementation (done on import; idempotent)."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(NAME, experts_forward)


_LAYERS = {}
atexit.register(_LAYERS.clear)  # (before the extension's teardown)
_LOCK = threading.Lock()


def _capacity(tokens):
    return max(DEFAULT_MAX_TOKENS, 1 << max(tokens - 1, 0).bit_length())


def _layer(spec, device):
    """The compiled layer of `spec` on `device`, compiled on first use and
    shared by every experts module of that shape there (they run in the
    model's order, on one stream)."""
    key = (spec, str(device))
    with _LOCK:
        layer = _LAYERS.get(key)
    if layer is not None:
        return layer
    if device.type == "cpu":
        layer = _compile(spec, target="cpu")
    else:
        layer = _compile(spec, target=_chip(device), training=True).load(device.index)
    with _LOCK:
        _LAYERS[key] = layer
    return layer


def _check_module(module):
    """The module's (E, I, H), or a ValueError naming what mok cannot run."""
    name = type(module).__name__
    for attr, want, what in (("has_gate", True, "gated (SwiGLU) experts"),
                             ("has_bias", False, "bias-free experts"),
                             ("is_transposed", False, "gate_up_proj [E, 2I, H], "
                                                      "down_proj [E, H, I] (not transposed)"),
                             ("is_concatenated", True, "the gate and up rows concatenated "
                                                       "(not interleaved)")):
        if getattr(module, attr, want) != want:
            raise ValueError(f"{name}.{attr} = {getattr(module, attr)!r}: mok's experts "
                             f"implementation runs {what}")
    if getattr(module, "_is_expert_parallel", False):
        raise ValueError(f"{name}._is_expert_parallel: transformers' expert parallelism is "
                         "not supported by the mok experts implementation; use "
                         "mok.torch.MoELayer(process_group=...) for mok's")
    act = getattr(getattr(module, "config", None), "hidden_act", None)
    if act not in ("silu", "swish"):
        raise ValueError(f"{name}: config.hidden_act = {act!r}; mok's experts are SwiGLU "
                         "(silu)")
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        raise ValueError(f"{name}: expected gate_up_proj and down_proj parameters")
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[1] % 2:
        raise ValueError(f"{name}.gate_up_proj: expected [E, 2I, H] and down_proj [E, H, I], "
                         f"got {list(gate_up.shape)} and {list(down.shape)}")
    e, i2, h = gate_up.shape
    if list(down.shape) != [e, h, i2 // 2]:
        raise ValueError(f"{name}.down_proj: expected shape {[e, h, i2 // 2]} (from "
                         f"gate_up_proj {list(gate_up.shape)}), got {list(down.shape)}")
    for attr, t in (("gate_up_proj", gate_up), ("down_proj", down)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}.{attr}: mok runs bf16 experts; got {t.dtype} (load the "
                             "model with dtype=torch.bfloat16)")
    return e, i2 // 2, h


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward signature: hidden_states [S, H],
    top_k_index [S, k], top_k_weights [S, k] -> [S, H] (the router-weighted
    sum of the routed experts' outputs)."""
    e, inter, h = _check_module(self)
    name = type(self).__name__
    x = hidden_states
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != h \
            or x.dtype != torch.bfloat16:
        got = (f"{x.dtype} of shape {list(x.shape)}" if isinstance(x, torch.Tensor)
               else type(x).__name__)
        raise ValueError(f"{name}: hidden_states: expected a bfloat16 tensor of shape "
                         f"[S, {h}], got {got}")
    tokens, k = x.shape[0], top_k_index.shape[-1]
    if list(top_k_index.shape) != [tokens, k] or top_k_index.dtype not in (torch.int32,
                                                                            torch.int64):
        raise ValueError(f"{name}: top_k_index: expected an int64 tensor of shape "
                         f"[{tokens}, k], got {top_k_index.dtype} of shape "
                         f"{list(top_k_index.shape)}")
    if list(top_k_weights.shape) != [tokens, k] or not top_k_weights.is_floating_point():
        raise ValueError(f"{name}: top_k_weights: expected a float tensor of shape "
                         f"[{tokens}, {k}], got {top_k_weights.dtype} of shape "
                         f"{list(top_k_weights.shape)}")
    for arg, t in (("top_k_index", top_k_index), ("top_k_weights", top_k_weights),
                   ("gate_up_proj", self.gate_up_proj), ("down_proj", self.down_proj)):
        if t.device != x.device:
            raise ValueError(f"{name}: {arg} is on {t.device}, hidden_states on {x.device}")
    gpu = x.device.type == "cuda"
    spec = LayerSpec(hidden=h, intermediate=inter, experts=e, top_k=k, tokens=None,
                     padding=128 if gpu else 1,
                     expert_id_dtype="int64" if top_k_index.dtype == torch.int64 else "int32",
                     max_tokens=_capacity(tokens) if gpu else None)
    layer = _layer(spec, x.device)
    return _HfExperts.apply(layer, x, top_k_index, top_k_weights.float(), self.gate_up_proj,
                            self.down_proj)


class _HfExperts(torch.autograd.Function):
    """(layer, x, top, router weights f32, gate_up_proj, down_proj) -> out;
    the backward gives x's, the router weights' and both parameters'
    gradients (gate_up_proj's as one [E, 2I, H] tensor)."""

    @staticmethod
    def forward(ctx, layer, x, top, rw, gate_up, down):
        inter = gate_up.shape[1] // 2
        ctx.layer = layer
        if x.device.type == "cpu":  # (T = 0 included: _run_forward calls no layer)
            ctx.kind = "cpu"
            values = [x, top, rw, gate_up[:, :inter], gate_up[:, inter:], down]
            out, *saved = _run_forward(layer, list(layer.arg_names), values)
            ctx.save_for_backward(x, top, rw, gate_up, down, *saved)
            return out
        if x.shape[0] == 0:  # no kernel; zero gradients
            ctx.kind = "empty"
            ctx.save_for_backward(x, rw, gate_up, down)
            return torch.empty_like(x)
        ctx.kind = "gpu"
        layer.bind_fc1(gate_up.detach())  # the gate and up halves, in place
        out, context = layer.forward(x=x.detach(), top_experts=top, router_weights=rw.detach(),
                                     down_weights=down.detach())
        ctx.save_for_backward(gate_up, *context.tensors())
        return out

    @staticmethod
    def backward(ctx, d_out):
        layer, saved = ctx.layer, ctx.saved_tensors
        if ctx.kind == "empty":
            return (None, *[torch.zeros_like(t) if i != 1 else None
                            for i, t in enumerate([saved[0], None, *saved[1:]])])
        d_out = d_out.contiguous()
        if ctx.kind == "cpu":
            x, top, rw, gate_up, down = saved[:5]
            inter = gate_up.shape[1] // 2
            values = [x, top, rw, gate_up[:, :inter], gate_up[:, inter:], down]
            g = _run_backward(layer, list(layer.arg_names), d_out, [*values, *saved[5:]], {})
        else:
            layer.bind_fc1(saved[0].detach())  # (another module may have bound its own)
            g = layer.backward(layer.context_from_tensors(list(saved[1:])), d_out)
        d_gu = torch.cat([g["gate_weights"], g["up_weights"]], dim=1)
        return None, g["x"], None, g["router_weights"], d_gu, g["down_weights"]


try:
    register()
except ImportError as e:  # pragma: no cover - transformers is what this module is for
    raise ImportError("mok.hf: needs transformers 5 (transformers.integrations.moe."
                      f"ExpertsInterface): {e}") from None
