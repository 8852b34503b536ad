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
up halves of ``gate_up_proj`` through weight views (no copy a step; layers
on the tensor-core path, H a multiple of 64 and I of 128, while smaller
ones get dense copies each call), and
the gradients land in the parameters' ``.grad`` (``gate_up_proj``'s as one
[E, 2I, H] tensor). Any token count a call (a layer compiled for any T,
cached per shape); bf16 activations and weights.

Refused by name (ValueError naming the module's attribute): experts with
biases, interleaved or transposed layouts, non-gated experts, activations
other than SiLU, weights or activations not in bf16, and transformers'
own expert parallelism (``_is_expert_parallel``; mok's expert parallelism
is mok.torch.MoELayer(process_group=...)).

Shared experts: transformers calls a model's shared expert outside the
experts module. ``mok.hf.fuse_shared_experts(model)`` fuses it into the
experts' mok layer (one kernel for routed and shared experts) for the
blocks of DeepSeek-V3's form (the shared expert added ungated on the
block's input); a gated shared expert (Qwen2-MoE's) stays the model's.

CPU tensors run mok's CPU target (the executable reference; the gate and
up halves are copied into contiguous arrays there); CUDA tensors on an
sm_90a or sm_100a device run the GPU kernels.
"""
import atexit
import inspect
import threading
import types

import torch

from ._compile import compile as _compile
from ._spec import LayerSpec
from .functional import _capacity, _chip, _reads_views
from .torch import _run_backward, _run_forward

__all__ = ["experts_forward", "fuse_shared_experts", "register", "unfuse_shared_experts"]

NAME = "mok"


def register():
    """Registers mok's experts forward as transformers' "mok" experts
    implementation (done on import; idempotent)."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(NAME, experts_forward)


_LAYERS = {}
atexit.register(_LAYERS.clear)  # (before the extension's teardown)
_LOCK = threading.Lock()


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
    shared = []
    fused = getattr(self, "_mok_shared", None)  # (fuse_shared_experts)
    if fused is not None:
        mlp = fused[0]
        shared = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
        for attr, t in zip(("gate_proj", "up_proj", "down_proj"), shared):
            if t.dtype != torch.bfloat16 or t.device != x.device:
                raise ValueError(f"{name}: the fused shared expert's {attr}.weight is "
                                 f"{t.dtype} on {t.device}; expected bf16 on {x.device}")
    gpu = x.device.type == "cuda"
    if tokens == 0:  # no layer to compile or call
        out = x.new_zeros(x.shape)
        return out + 0 * (x.sum() + top_k_weights.sum() + self.gate_up_proj.sum()
                          + self.down_proj.sum() + sum(w.sum() for w in shared))
    spec = LayerSpec(hidden=h, intermediate=inter, experts=e, top_k=k, tokens=None,
                     shared_intermediate=shared[0].shape[0] if shared else None,
                     padding=128 if gpu else 1,
                     expert_id_dtype="int64" if top_k_index.dtype == torch.int64 else "int32",
                     max_tokens=_capacity(tokens) if gpu else None)
    layer = _layer(spec, x.device)
    return _HfExperts.apply(layer, x.contiguous(), top_k_index.contiguous(),
                            top_k_weights.float().contiguous(), self.gate_up_proj,
                            self.down_proj, *shared)


class _HfExperts(torch.autograd.Function):
    """(layer, x, top, router weights f32, gate_up_proj, down_proj) -> out;
    the backward gives x's, the router weights' and both parameters'
    gradients (gate_up_proj's as one [E, 2I, H] tensor)."""

    @staticmethod
    def forward(ctx, layer, x, top, rw, gate_up, down, *shared):
        inter = gate_up.shape[1] // 2
        ctx.layer, ctx.shared = layer, len(shared)
        if x.device.type == "cpu":  # (T = 0 included: _run_forward calls no layer)
            ctx.kind = "cpu"
            values = [x, top, rw, gate_up[:, :inter], gate_up[:, inter:], down, *shared]
            out, *saved = _run_forward(layer, list(layer.arg_names), values)
            ctx.save_for_backward(x, top, rw, gate_up, down, *shared, *saved)
            return out
        ctx.kind = "gpu"
        kwargs = dict(x=x.detach(), top_experts=top, router_weights=rw.detach())
        if _reads_views(layer):
            layer.bind_fc1(gate_up.detach())  # the gate and up halves, in place
        else:  # a layer off the tensor-core path reads dense weights
            kwargs.update(gate_weights=gate_up.detach()[:, :inter].contiguous(),
                          up_weights=gate_up.detach()[:, inter:].contiguous())
        kwargs["down_weights"] = down.detach()
        if shared:
            kwargs.update(shared_gate_weights=shared[0].detach(),
                          shared_up_weights=shared[1].detach(),
                          shared_down_weights=shared[2].detach())
        out, context = layer.forward(**kwargs)
        ctx.save_for_backward(gate_up, *context.tensors())
        return out

    @staticmethod
    def backward(ctx, d_out):
        layer, saved = ctx.layer, ctx.saved_tensors
        d_out = d_out.contiguous()
        if ctx.kind == "cpu":
            n = 5 + ctx.shared
            x, top, rw, gate_up, down = saved[:5]
            inter = gate_up.shape[1] // 2
            values = [x, top, rw, gate_up[:, :inter], gate_up[:, inter:], down, *saved[5:n]]
            g = _run_backward(layer, list(layer.arg_names), d_out, [*values, *saved[n:]], {})
        else:
            if _reads_views(layer):
                layer.bind_fc1(saved[0].detach())  # (another module may have bound its own)
            g = layer.backward(layer.context_from_tensors(list(saved[1:])), d_out)
        d_gu = torch.cat([g["gate_weights"], g["up_weights"]], dim=1)
        shared = [g[n] for n in ("shared_gate_weights", "shared_up_weights",
                                 "shared_down_weights")] if ctx.shared else []
        return (None, g["x"], None, g["router_weights"], d_gu, g["down_weights"], *shared)


def _adds_shared_on_input(block):
    """Whether `block`'s forward adds ``self.shared_experts(residuals)``,
    ungated, to the experts' output on its own input (DeepSeek-V3's form)."""
    try:
        source = inspect.getsource(type(block).forward)
    except (OSError, TypeError):
        return False
    return ("residuals = hidden_states" in source
            and "hidden_states + self.shared_experts(residuals)" in source
            and "gate" not in source.split("self.shared_experts(residuals)")[1][:40])


def _check_shared_mlp(name, mlp):
    for attr in ("gate_proj", "up_proj", "down_proj"):
        lin = getattr(mlp, attr, None)
        if not isinstance(lin, torch.nn.Linear) or lin.bias is not None:
            raise ValueError(f"{name}.shared_experts.{attr}: expected a bias-free nn.Linear, "
                             f"got {type(lin).__name__}")
    act = getattr(mlp, "act_fn", None)
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        raise ValueError(f"{name}.shared_experts.act_fn: mok's shared expert is SwiGLU "
                         f"(SiLU); got {type(act).__name__}")


def _fused_shared_forward(self, *args, **kwargs):
    """The forward of a shared expert fused into its experts module's mok
    layer: its output is already in the experts' output."""
    owner = self._mok_fused_into[0]
    if getattr(owner.config, "_experts_implementation", None) != NAME:
        raise RuntimeError(f"{type(self).__name__}: this shared expert was fused into mok's "
                           "layer by mok.hf.fuse_shared_experts, but the experts module now "
                           f"runs {owner.config._experts_implementation!r}; call "
                           "mok.hf.unfuse_shared_experts(model) before switching")
    return 0


def fuse_shared_experts(model):
    """Fuses each MoE block's shared expert into its experts module's mok
    layer (one kernel for both), for blocks that add
    ``self.shared_experts(residuals)`` ungated to the experts' output on
    the block's input (DeepSeek-V3, GLM-4-MoE, dots1 and the like) and
    whose shared expert is a bias-free SiLU MLP (gate_proj, up_proj,
    down_proj). The parameters stay where they are (state dicts unchanged);
    the shared module's forward then returns 0 while its experts module
    runs "mok", and raises if that changes. Returns the names of the fused
    blocks; blocks of another form are left as they are."""
    fused = []
    for name, block in model.named_modules():
        shared, experts = getattr(block, "shared_experts", None), getattr(block, "experts",
                                                                          None)
        if shared is None or experts is None or not hasattr(experts, "gate_up_proj"):
            continue
        if not _adds_shared_on_input(block):
            continue
        _check_shared_mlp(name, shared)
        experts._mok_shared = (shared,)  # (a tuple: not registered as a submodule)
        shared._mok_fused_into = (experts,)
        shared.forward = types.MethodType(_fused_shared_forward, shared)
        fused.append(name)
    return fused


def unfuse_shared_experts(model):
    """Undoes fuse_shared_experts: the shared experts run their own forward
    again. Returns the names of the blocks unfused."""
    done = []
    for name, block in model.named_modules():
        shared, experts = getattr(block, "shared_experts", None), getattr(block, "experts",
                                                                          None)
        if shared is not None and "_mok_fused_into" in shared.__dict__:
            del shared.forward, shared._mok_fused_into
            experts.__dict__.pop("_mok_shared", None)
            done.append(name)
    return done


try:
    register()
except ImportError as e:  # pragma: no cover - transformers is what this module is for
    raise ImportError("mok.hf: needs transformers 5 (transformers.integrations.moe."
                      f"ExpertsInterface): {e}") from None
