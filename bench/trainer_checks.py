# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks of mok inside real trainers, run with the trainers' own released
code (installed from PyPI): the CPU tests (python/tests/test_trainers.py)
and the GPU tests (python/tests/gpu/test_gpu_trainers.py) call them with
their device and sizes.

Each check builds the trainer's module twice, once with its native
experts and once with mok, feeds both the same inputs, and measures the
outputs and every gradient against a float64 reference (relative error
sum|got - want| / sum|want|, which must stay within REL_BOUND for mok;
the native path's is reported beside it).
"""
import contextlib
import copy

from bench import torch_reference

REL_BOUND = 1e-2


@contextlib.contextmanager
def one_rank_group():
    """A torch.distributed group of this process alone (gloo), made for the
    check when none is initialized, destroyed after it."""
    import torch.distributed as dist
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# -- NeMo AutoModel ----------------------------------------------------------

def automodel_config(dim=256, inter=256, experts=8, topk=2, swiglu_limit=0.0):
    """An AutoModel MoEConfig within MoK's contract (bf16, H and I
    multiples of 256, one shared expert of the routed experts' size)."""
    import torch
    from nemo_automodel.components.moe.config import MoEConfig
    return MoEConfig(n_routed_experts=experts, n_shared_experts=1, n_activated_experts=topk,
                     n_expert_groups=1, n_limited_groups=1, train_gate=True,
                     gate_bias_update_factor=0.0, aux_loss_coeff=0.0, score_func="softmax",
                     route_scale=1.0, dim=dim, inter_dim=inter, moe_inter_dim=inter,
                     norm_topk_prob=False, swiglu_limit=swiglu_limit, dtype=torch.bfloat16)


def automodel_backend(dispatcher):
    from nemo_automodel.components.models.common import BackendConfig
    return BackendConfig(attn="sdpa", linear="torch", rms_norm="torch", rope_fusion=False,
                         experts="torch", dispatcher=dispatcher)


def automodel_mok_experts(config, group, device):
    """AutoModel's own GroupedExpertsMoK (from its wheel) driven on one
    rank: its runtime is given the built MoKConfig and `group` directly,
    because GroupedExpertsMoK.init_token_dispatcher (and MoE with
    dispatcher='mok') insist on an EP mesh of 4 to 64 ranks."""
    from nemo_automodel.components.moe import mok_experts
    mok_experts._load_mok_functional()  # what initialize() does first (imports mok)
    experts = mok_experts.GroupedExpertsMoK(config, automodel_backend("mok")).to(device)
    experts.runtime.config = experts.runtime.mok_config.build()
    experts.runtime.ep_group = group
    return experts


def automodel_init_parity(seed=1234, device="cpu"):
    """Whether GroupedExpertsMoK.init_weights draws the values
    GroupedExperts' initialization draws from the same seed (its
    state-dict tensors equal the native module's), and its state-dict
    keys are the native module's."""
    import torch
    from nemo_automodel.components.moe.experts import GroupedExperts
    from nemo_automodel.components.moe.layers import _init_weights
    from nemo_automodel.components.moe.mok_experts import GroupedExpertsMoK
    config = automodel_config()
    native = GroupedExperts(config, automodel_backend("torch")).to(device)
    mine = GroupedExpertsMoK(config, automodel_backend("mok")).to(device)
    with torch.no_grad():  # (as AutoModel initializes a model)
        torch.manual_seed(seed)
        _init_weights(native, buffer_device=torch.device(device))
        torch.manual_seed(seed)
        _init_weights(mine, buffer_device=torch.device(device))
    a, b = native.state_dict(), mine.state_dict()
    same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    return sorted(a), sorted(b), same


def automodel_experts_check(device="cpu", tokens=64, dim=256, inter=256, experts=8, topk=2,
                            swiglu_limit=0.0, drop=0.1, seed=0):
    """AutoModel's GroupedExpertsMoK (mok) and its native GroupedExperts +
    shared MLP on the same tokens, routes and weights (loaded through the
    state dict: the keys must match), forward and backward, against a
    float64 reference. `drop`: the fraction of routes set to -1 (no route).
    Returns {"output"|gradient name: (mok rel err, native rel err)}."""
    import torch
    from nemo_automodel.components.moe.experts import GroupedExperts
    from nemo_automodel.components.moe.layers import MLP, _init_weights

    torch.manual_seed(seed)
    config = automodel_config(dim, inter, experts, topk, swiglu_limit)
    dev = torch.device(device)
    native = GroupedExperts(config, automodel_backend("torch")).to(dev)
    shared = MLP(dim, inter, "torch", dtype=torch.bfloat16, swiglu_limit=swiglu_limit).to(dev)
    with torch.no_grad():
        _init_weights(native, buffer_device=dev, init_std=dim ** -0.5)
        _init_weights(shared, buffer_device=dev, init_std=dim ** -0.5)
    with one_rank_group() as group:
        mine = automodel_mok_experts(config, group, dev)
        if sorted(mine.state_dict()) != sorted(native.state_dict()):
            raise AssertionError(f"state-dict keys differ: mok {sorted(mine.state_dict())}, "
                                 f"native {sorted(native.state_dict())}")
        mine.load_state_dict(native.state_dict())
        shared_mine = copy.deepcopy(shared)

        g = torch.Generator().manual_seed(seed + 1)
        x = (torch.randn(tokens, dim, generator=g)).to(torch.bfloat16).to(dev)
        idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
        rw = torch.rand(tokens, topk, generator=g)
        rw = rw / rw.sum(-1, keepdim=True)
        drop_mask = torch.rand(tokens, topk, generator=g) < drop
        idx_mok = idx.masked_fill(drop_mask, -1)
        rw_masked = rw.masked_fill(drop_mask, 0.0)
        d_out = torch.randn(tokens, dim, generator=g).to(torch.bfloat16).to(dev)

        # mok: AutoModel's module, its autograd function, mok.functional.
        x1 = x.clone().requires_grad_(True)
        rw1 = rw.to(dev).clone().requires_grad_(True)
        y1 = mine(x1, rw1, idx_mok.to(dev), shared_mine.gate_proj.weight,
                  shared_mine.up_proj.weight, shared_mine.down_proj.weight)
        y1.backward(d_out)

        # native: GroupedExperts (routes dropped by a zero weight and the
        # token mask cannot drop a single route) + the shared MLP.
        x2 = x.clone().requires_grad_(True)
        rw2 = rw_masked.to(dev).clone().requires_grad_(True)
        mask = torch.ones(tokens, dtype=torch.bool, device=dev)
        y2 = native(x2, mask, rw2, idx.to(dev)) + shared(x2)
        y2.backward(d_out)

    # float64 reference on the bf16 values (bench/torch_reference.py).
    limit = swiglu_limit if swiglu_limit > 0 else None
    a = {"x": x.cpu(), "top_experts": idx_mok, "router_weights": rw_masked,
         "gate_weights": mine.routed_gate_weights.detach().cpu(),
         "up_weights": mine.routed_up_weights.detach().cpu(),
         "down_weights": mine.routed_down_weights.detach().cpu(),
         "shared_gate_weights": shared.gate_proj.weight.detach().cpu(),
         "shared_up_weights": shared.up_proj.weight.detach().cpu(),
         "shared_down_weights": shared.down_proj.weight.detach().cpu()}
    want = torch_reference.forward(a, experts, limit)
    grads = torch_reference.backward(a, d_out.cpu(), experts, limit)
    err = torch_reference.relative_error
    result = {"output": (err(y1.cpu(), want), err(y2.cpu(), want))}

    gu = native.gate_and_up_projs.grad.cpu()  # [E, H, 2I]
    dropped = drop_mask.to(dev)
    pairs = {
        "x": (x1.grad, x2.grad),
        "router_weights": (rw1.grad.masked_fill(dropped, 0.0),
                           rw2.grad.masked_fill(dropped, 0.0)),
        "gate_weights": (mine.routed_gate_weights.grad, gu[..., :inter].transpose(-1, -2)),
        "up_weights": (mine.routed_up_weights.grad, gu[..., inter:].transpose(-1, -2)),
        "down_weights": (mine.routed_down_weights.grad,
                         native.down_projs.grad.transpose(-1, -2)),
        "shared_gate_weights": (shared_mine.gate_proj.weight.grad, shared.gate_proj.weight.grad),
        "shared_up_weights": (shared_mine.up_proj.weight.grad, shared.up_proj.weight.grad),
        "shared_down_weights": (shared_mine.down_proj.weight.grad,
                                shared.down_proj.weight.grad),
    }
    for name, (got_mok, got_native) in pairs.items():
        result[name] = (err(got_mok.cpu(), grads[name]), err(got_native.cpu(), grads[name]))
    return result


def automodel_moe_check(device="cpu", tokens=96, dim=256, inter=256, experts=8, topk=2,
                        seed=0):
    """AutoModel's whole MoE block (its Gate, shared MLP and MoE.forward)
    twice from one initialization: with its native GroupedExperts, and with
    GroupedExpertsMoK in their place (loaded from the native state dict),
    which MoE.forward runs on its mok path (the shared expert's weights
    passed into the fused layer). Returns {name: relative error of the mok
    block against the native one} for the output, x's gradient and every
    parameter's gradient."""
    import torch
    from nemo_automodel.components.moe.layers import MoE
    torch.manual_seed(seed)
    config = automodel_config(dim, inter, experts, topk)
    dev = torch.device(device)
    native = MoE(config, automodel_backend("torch")).to(dev)
    with torch.no_grad():
        native.init_weights(buffer_device=dev, init_std=dim ** -0.5)
    mine = copy.deepcopy(native)
    with one_rank_group() as group:
        mine.experts = automodel_mok_experts(config, group, dev)
        mine.experts.load_state_dict(native.experts.state_dict())
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(2, tokens // 2, dim, generator=g).to(torch.bfloat16).to(dev)
        d_out = torch.randn(x.shape, generator=g).to(torch.bfloat16).to(dev)
        outs, grads = [], []
        for block in (mine, native):
            xi = x.clone().requires_grad_(True)
            y = block(xi)
            y.backward(d_out)
            outs.append(y.detach().cpu())
            grads.append({"x": xi.grad.cpu(), **{
                n: p.grad.cpu() for n, p in block.named_parameters() if p.grad is not None}})
    err = torch_reference.relative_error
    result = {"output": err(outs[0], outs[1].double())}
    mok_grads, native_grads = grads
    # The routed weights' gradients in AutoModel's layouts on both sides.
    mok_grads["experts.gate_and_up_projs"] = torch.cat(
        [mok_grads.pop("experts.routed_gate_weights").transpose(-1, -2),
         mok_grads.pop("experts.routed_up_weights").transpose(-1, -2)], dim=-1)
    mok_grads["experts.down_projs"] = mok_grads.pop("experts.routed_down_weights").transpose(
        -1, -2)
    if sorted(mok_grads) != sorted(native_grads):
        raise AssertionError(f"gradients differ in names: mok {sorted(mok_grads)}, "
                             f"native {sorted(native_grads)}")
    for name in native_grads:
        result[name] = err(mok_grads[name], native_grads[name].double())
    return result


__all__ = ["REL_BOUND", "automodel_experts_check", "automodel_init_parity",
           "automodel_moe_check"]
