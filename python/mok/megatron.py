# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.megatron: mok as Megatron-Core's MoE megakernel backend.

    from mok.megatron import MoKMegakernel
    backend = MoKMegakernel(config, ep_group, routed_experts, shared_experts,
                            num_local_experts)
    out = backend(hidden_states, probs, routing_map)

The contract of the seeds' ``MegakernelBackend``: Megatron-Core owns
routing, parameters, DDP, the optimizer and the checkpoint format; the
backend replaces dispatch, the routed and shared expert MLPs and combine.

- `config`: the layer's TransformerConfig (gated_linear_unit, SiLU,
  add_bias_linear=False, bf16 parameters; moe_ffn_hidden_size and
  moe_shared_expert_intermediate_size are the experts' sizes).
- `routed_experts`: Megatron's module of the rank's local experts, whose
  per-expert ``linear_fc1.weight`` [2I, H] (gate rows first) and
  ``linear_fc2.weight`` [H, I] are read in place: a SequentialMLP
  (``local_experts[i]``) or a TEGroupedMLP (``linear_fc1.weight{i}``,
  ``linear_fc2.weight{i}``).
- `shared_experts`: a SharedExpertMLP without its output gate (or None).
- `ep_group`: the expert-parallel process group (None or one rank; more
  ranks bind the GPU kernels to its NCCL communicator, see
  docs/ExpertParallel.md).

``forward(hidden_states [..., H], probs [T, E], routing_map [T, E] bool)``
turns the dense routing map into fixed-width routes (each token's experts
in increasing order, padded with -1 to moe_router_topk) and the router
weights into their probs (gradients flow back into `probs`), and returns
the MoE output in hidden_states' shape.

Parameters stay the native modules' (no copies held, nothing registered
here: the state dicts carry no aliases, and ``sharded_state_dict`` is
empty). Gradients land where Megatron expects them: in ``param.main_grad``
when the parameter has one and config.gradient_accumulation_fusion is set
(then ``param.grad_added_to_main_grad = True`` and a zero gradient is
returned so that gradient hooks still fire), else in ``param.grad``.

``use_mok(moe_layer)`` puts the backend into a Megatron-Core MoELayer:
its router still routes (aux losses included), mok runs the rest.

On the CPU target the per-expert weights are stacked into the layer's
[E, I, H] arrays each call (the CPU target is the executable reference);
on the GPU the kernels read them through per-expert weight views (layers
on the tensor-core path: H a multiple of 64, I and the shared I of 128;
other sizes get stacked copies each call).

At ep > 1 every rank must compile the same layer: token counts of up to
8192 a rank share one; above that the capacity is the next power of two,
and ranks whose counts fall in different powers of two would wait for
each other (pad the ranks' tokens alike).
"""
import atexit
import threading
import types
import weakref

import torch

from ._comm import Communicator
from ._compile import compile as _compile
from ._spec import LayerSpec
from .functional import _capacity, _chip, _reads_views
from .torch import _run_backward, _run_forward

__all__ = ["MoKMegakernel", "routes_from_routing_map", "use_mok"]


def routes_from_routing_map(probs, routing_map, topk):
    """(top_experts int64 [T, topk], router_weights f32 [T, topk]) from
    Megatron's dense `probs` and boolean `routing_map` [T, E]: each token's
    routed experts in increasing order, padded with -1 (weight 0). More
    than `topk` experts on a token is a ValueError."""
    if routing_map.dtype != torch.bool or routing_map.dim() != 2:
        raise ValueError(f"routing_map: expected a bool tensor [T, E], got {routing_map.dtype} "
                         f"of shape {list(routing_map.shape)}")
    if list(probs.shape) != list(routing_map.shape):
        raise ValueError(f"probs: expected shape {list(routing_map.shape)} (routing_map's), "
                         f"got {list(probs.shape)}")
    tokens, experts = routing_map.shape
    k = min(topk, experts)
    # Rank routed experts by -id (so topk returns them in increasing order),
    # unrouted ones below every routed one.
    ids = torch.arange(experts, device=routing_map.device)
    score = torch.where(routing_map, experts - ids, torch.zeros_like(ids))
    top_score, top = torch.topk(score, k, dim=1)
    routed = top_score > 0
    top = torch.where(routed, top, torch.full_like(top, -1))
    weights = probs.gather(1, top.clamp(min=0)).float() * routed
    if k < topk:
        pad = topk - k
        top = torch.cat([top, top.new_full((tokens, pad), -1)], 1)
        weights = torch.cat([weights, weights.new_zeros(tokens, pad)], 1)
    return top, weights


def _expert_weights(routed):
    """[(fc1 [2I, H], fc2 [H, I])] of a SequentialMLP's or TEGroupedMLP's
    local experts."""
    if hasattr(routed, "local_experts"):
        return [(e.linear_fc1.weight, e.linear_fc2.weight) for e in routed.local_experts]
    fc1, fc2 = getattr(routed, "linear_fc1", None), getattr(routed, "linear_fc2", None)
    count = getattr(fc1, "num_gemms", None)
    if count is not None:
        return [(getattr(fc1, f"weight{i}"), getattr(fc2, f"weight{i}")) for i in range(count)]
    raise TypeError(f"routed_experts: expected Megatron's SequentialMLP or TEGroupedMLP, got "
                    f"{type(routed).__name__} (GroupedMLP's fused weights are not supported)")


_LAYERS = {}
atexit.register(_LAYERS.clear)  # (before the extension's teardown)
_LOCK = threading.Lock()


class MoKMegakernel(torch.nn.Module):
    """Megatron-Core's MoE megakernel backend run by mok (module docstring)."""

    def __init__(self, config, ep_group, routed_experts, shared_experts, num_local_experts):
        super().__init__()
        bad = []
        if not getattr(config, "gated_linear_unit", False):
            bad.append("gated_linear_unit=False (mok's experts are SwiGLU)")
        act = getattr(config, "activation_func", None)
        if act not in (torch.nn.functional.silu,):
            bad.append(f"activation_func={getattr(act, '__name__', act)} (expected F.silu)")
        if getattr(config, "add_bias_linear", False):
            bad.append("add_bias_linear=True (mok's experts have no bias)")
        if getattr(config, "moe_apply_probs_on_input", False):
            bad.append("moe_apply_probs_on_input=True")
        if getattr(config, "moe_shared_expert_gate", False):
            bad.append("moe_shared_expert_gate=True (no shared-expert output gate in mok)")
        if bad:
            raise ValueError("config: mok cannot run this MoE layer: " + "; ".join(bad))
        self.config = config
        self.topk = config.moe_router_topk
        experts = config.num_moe_experts
        weights = _expert_weights(routed_experts)
        if len(weights) != num_local_experts:
            raise ValueError(f"num_local_experts: {num_local_experts}, but routed_experts holds "
                             f"{len(weights)}")
        ep = 1 if ep_group is None else torch.distributed.get_world_size(ep_group)
        if experts != num_local_experts * ep:
            raise ValueError(f"config.num_moe_experts = {experts} is not num_local_experts "
                             f"({num_local_experts}) x the EP group's {ep} ranks")
        fc1, fc2 = weights[0]
        inter, hidden = fc2.shape[1], fc2.shape[0]
        for i, (w1, w2) in enumerate(weights):
            for name, w, shape in ((f"expert {i} linear_fc1.weight", w1, [2 * inter, hidden]),
                                   (f"expert {i} linear_fc2.weight", w2, [hidden, inter])):
                if list(w.shape) != shape or w.dtype != torch.bfloat16:
                    raise ValueError(f"routed_experts: {name}: expected a bfloat16 tensor of "
                                     f"shape {shape}, got {w.dtype} of shape {list(w.shape)} "
                                     "(tensor parallelism of the experts is not supported)")
        shared = None
        if shared_experts is not None:
            if getattr(shared_experts, "use_shared_expert_gate", False):
                raise ValueError("shared_experts: has an output gate (moe_shared_expert_gate), "
                                 "which mok's layer does not have")
            s1, s2 = shared_experts.linear_fc1.weight, shared_experts.linear_fc2.weight
            sinter = s2.shape[1]
            if list(s1.shape) != [2 * sinter, hidden] or list(s2.shape) != [hidden, sinter] \
                    or s1.dtype != torch.bfloat16 or s2.dtype != torch.bfloat16:
                raise ValueError(f"shared_experts: expected bf16 linear_fc1.weight [2Is, "
                                 f"{hidden}] and linear_fc2.weight [{hidden}, Is], got "
                                 f"{list(s1.shape)} and {list(s2.shape)}")
            shared = (s1, s2)
        # Not registered (plain tuples): the parameters stay the native
        # modules', and this module's state dicts hold no aliases.
        self._routed = tuple(weights)
        self._shared = shared
        self._ep_group = ep_group
        self.num_local_experts = num_local_experts
        self.hidden, self.inter = hidden, inter
        self.shared_inter = None if shared is None else shared[1].shape[1]

    # -- the seeds' contract ---------------------------------------------
    @property
    def routed_fc1_parameters(self):
        return tuple(w1 for w1, _ in self._routed)

    @property
    def routed_fc2_parameters(self):
        return tuple(w2 for _, w2 in self._routed)

    @property
    def autograd_routed_parameters(self):
        return self.routed_fc1_parameters + self.routed_fc2_parameters

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {}  # the native expert modules own every checkpoint shard

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        return  # no aliases

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        return  # nothing of its own to load

    def _layer(self, tokens, device, ids_dtype):
        gpu = device.type == "cuda"
        ep = 1 if self._ep_group is None else torch.distributed.get_world_size(self._ep_group)
        cap = _capacity(tokens) if gpu else None
        spec = LayerSpec(hidden=self.hidden, intermediate=self.inter,
                         experts=self.num_local_experts * ep, top_k=self.topk,
                         shared_intermediate=self.shared_inter, padding=128 if gpu else 1,
                         ep=ep, expert_id_dtype="int64", max_tokens=cap)
        key = (spec, str(device), id(self._ep_group))
        with _LOCK:
            entry = _LAYERS.get(key)
        # (a group's id may be reused once it is gone: the layer must be the
        # one bound to this group)
        layer = entry[1] if entry is not None and entry[0]() is self._ep_group else None
        if layer is None:
            if gpu:
                comm = Communicator.adopt(self._ep_group, device.index) if ep > 1 else None
                layer = _compile(spec, target=_chip(device), training=True).load(
                    device.index, comm=comm)
            else:
                if ep > 1:
                    raise ValueError("ep_group: expert parallelism across processes runs on "
                                     "the GPU targets; the CPU target takes one rank")
                layer = _compile(spec, target="cpu")
            group = self._ep_group
            with _LOCK:
                _LAYERS[key] = (weakref.ref(group) if group is not None else (lambda: None),
                                layer)
        return layer

    def forward(self, hidden_states, probs, routing_map):
        shape = hidden_states.shape
        if shape[-1] != self.hidden or hidden_states.dtype != torch.bfloat16:
            raise ValueError(f"hidden_states: expected a bfloat16 tensor [..., {self.hidden}], "
                             f"got {hidden_states.dtype} of shape {list(shape)}")
        x = hidden_states.reshape(-1, self.hidden)
        if routing_map.shape[0] != x.shape[0]:
            raise ValueError(f"routing_map: {routing_map.shape[0]} rows for {x.shape[0]} tokens "
                             f"(hidden_states {list(shape)})")
        top, weights = routes_from_routing_map(probs, routing_map, self.topk)
        layer = self._layer(x.shape[0], x.device, top.dtype)
        params = [w for pair in self._routed for w in pair]
        if self._shared is not None:
            params += list(self._shared)
        out = _MegatronMoE.apply(self, layer, x, top, weights, *params)
        return out.reshape(shape)


def _add_to_main_grad(config, param, grad):
    """Adds `grad` where Megatron wants it; returns what autograd gets."""
    main = getattr(param, "main_grad", None)
    if main is not None and getattr(config, "gradient_accumulation_fusion", False):
        main.add_(grad.view(main.shape))
        param.grad_added_to_main_grad = True
        return torch.zeros_like(param)
    return grad.to(param.dtype).view(param.shape)


class _MegatronMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend, layer, x, top, weights, *params):
        e = backend.num_local_experts
        inter = backend.inter
        routed = [params[2 * i: 2 * i + 2] for i in range(e)]
        shared = params[2 * e:]
        ctx.backend, ctx.layer, ctx.gpu = backend, layer, x.device.type == "cuda"
        if not ctx.gpu:
            values = [x, top, weights,
                      torch.stack([w1[:inter] for w1, _ in routed]),
                      torch.stack([w1[inter:] for w1, _ in routed]),
                      torch.stack([w2 for _, w2 in routed])]
            if shared:
                s = backend.shared_inter
                values += [shared[0][:s], shared[0][s:], shared[1]]
            out, *saved = _run_forward(layer, list(layer.arg_names), values)
            ctx.save_for_backward(*values, *saved)
            return out
        kwargs = dict(x=x.detach(), top_experts=top, router_weights=weights.detach())
        if _reads_views(layer):
            _bind_routed(layer, routed, inter)
        else:  # a layer off the tensor-core path reads dense weights
            kwargs.update(
                gate_weights=torch.stack([w1.detach()[:inter] for w1, _ in routed]),
                up_weights=torch.stack([w1.detach()[inter:] for w1, _ in routed]),
                down_weights=torch.stack([w2.detach() for _, w2 in routed]))
        if shared:
            s = backend.shared_inter
            kwargs.update(shared_gate_weights=shared[0][:s].detach(),
                          shared_up_weights=shared[0][s:].detach(),
                          shared_down_weights=shared[1].detach())
        out, context = layer.forward(**kwargs)
        ctx.save_for_backward(*params, *context.tensors())
        ctx.params = len(params)
        return out

    @staticmethod
    def backward(ctx, d_out):
        backend, layer = ctx.backend, ctx.layer
        saved = ctx.saved_tensors
        e = backend.num_local_experts
        d_out = d_out.contiguous()
        if not ctx.gpu:
            g = _run_backward(layer, list(layer.arg_names), d_out, list(saved), {})
        else:
            params = saved[:ctx.params]
            if _reads_views(layer):
                _bind_routed(layer, [params[2 * i: 2 * i + 2] for i in range(e)],
                             backend.inter)
            g = layer.backward(layer.context_from_tensors(list(saved[ctx.params:])), d_out)
        routed = backend._routed
        grads = []
        for i, (w1, w2) in enumerate(routed):
            d1 = torch.cat([g["gate_weights"][i], g["up_weights"][i]], 0)
            grads += [_add_to_main_grad(backend.config, w1, d1),
                      _add_to_main_grad(backend.config, w2, g["down_weights"][i])]
        if backend._shared is not None:
            s1, s2 = backend._shared
            d1 = torch.cat([g["shared_gate_weights"], g["shared_up_weights"]], 0)
            grads += [_add_to_main_grad(backend.config, s1, d1),
                      _add_to_main_grad(backend.config, s2, g["shared_down_weights"])]
        return (None, None, g["x"], None, g["router_weights"], *grads)


def _bind_routed(layer, routed, inter):
    """Binds the GPU layer's routed weights to per-expert views of the
    native parameters (no copies)."""
    layer.bind_weights("gate_weights", [w1.detach()[:inter] for w1, _ in routed])
    layer.bind_weights("up_weights", [w1.detach()[inter:] for w1, _ in routed])
    layer.bind_weights("down_weights", [w2.detach() for _, w2 in routed])



def _mok_moe_forward(self, hidden_states, intermediate_tensors=None, padding_mask=None):
    """MoELayer.forward with mok: the layer's router, then MoKMegakernel
    (dispatch, routed and shared experts, combine). Returns (output, None)
    as MoELayer does."""
    if intermediate_tensors is not None:
        raise ValueError("intermediate_tensors: a partial CUDA-graph capture of the MoE layer "
                         "(cuda_graph_scope moe_router/moe_preprocess) is not supported with "
                         "mok; capture the whole layer")
    if padding_mask is not None:
        padding_mask = padding_mask.transpose(0, 1).bool()
    probs, routing_map = self.route(hidden_states, padding_mask)
    return self._mok_backend[0](hidden_states, probs, routing_map), None


def use_mok(moe_layer):
    """Runs Megatron-Core MoELayer `moe_layer` through a MoKMegakernel over
    its own experts and shared experts: its router routes, mok runs
    dispatch, the expert MLPs and combine in one kernel. The parameters and
    the state dicts stay the layer's. Returns the backend. Refused by name:
    MoE latent projections, moe_layer_recompute, and whatever
    MoKMegakernel refuses."""
    cfg = moe_layer.config
    if getattr(cfg, "moe_latent_size", None):
        raise ValueError("moe_layer: config.moe_latent_size (latent projections around the "
                         "experts) is not supported by mok")
    if getattr(moe_layer, "moe_layer_recompute", False):
        raise ValueError("moe_layer: recompute of the MoE layer (recompute_modules 'moe') is "
                         "not supported with mok; the mok backward recomputes nothing")
    shared = moe_layer.shared_experts if getattr(moe_layer, "use_shared_expert", False) else None
    backend = MoKMegakernel(cfg, getattr(moe_layer, "ep_group", None), moe_layer.experts,
                            shared, moe_layer.num_local_experts)
    moe_layer._mok_backend = (backend,)  # (a tuple: not registered, no state-dict aliases)
    moe_layer.forward = types.MethodType(_mok_moe_forward, moe_layer)
    return backend
