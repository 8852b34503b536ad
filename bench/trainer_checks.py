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


def automodel_backend(dispatcher, precision="bf16"):
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.moe.mok_experts import MoKBackendConfig
    return BackendConfig(attn="sdpa", linear="torch", rms_norm="torch", rope_fusion=False,
                         experts="torch", dispatcher=dispatcher,
                         mok=MoKBackendConfig(precision=precision))


def automodel_mok_experts(config, group, device, precision="bf16"):
    """AutoModel's own GroupedExpertsMoK (from its wheel) driven on one
    rank: its runtime is given the built MoKConfig and `group` directly,
    because GroupedExpertsMoK.init_token_dispatcher (and MoE with
    dispatcher='mok') insist on an EP mesh of 4 to 64 ranks."""
    from nemo_automodel.components.moe import mok_experts
    mok_experts._load_mok_functional()  # what initialize() does first (imports mok)
    experts = mok_experts.GroupedExpertsMoK(config, automodel_backend("mok", precision)).to(device)
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


def automodel_mxfp8_check(tokens=40, dim=256, inter=256, experts=4, topk=2, swiglu_limit=0.0,
                          drop=0.1, seed=0):
    """AutoModel's GroupedExpertsMoK with ``precision: mxfp8`` on the CPU
    target: its own MXFP8 weight cache (mok.ops.mxfp8_quantize, both
    layouts) and its tuples through mok.functional, against mok's
    precision="mxfp8" layer compiled directly and run on the bf16 weights
    (the layer quantizing them itself). Returns {name: (the AutoModel
    module's value, the direct layer's)} as float64 numpy arrays for the
    output and every gradient, which must be bitwise equal; and the same
    for the module with ``precision: bf16`` under "bf16:<name>"."""
    import numpy as np
    import torch

    import mok
    torch.manual_seed(seed)
    config = automodel_config(dim, inter, experts, topk, swiglu_limit)
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, dim, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
    idx = idx.masked_fill(torch.rand(tokens, topk, generator=g) < drop, -1)
    rw = torch.rand(tokens, topk, generator=g)
    d_out = torch.randn(tokens, dim, generator=g).to(torch.bfloat16)
    shared = [(torch.randn(shape, generator=g) * shape[1] ** -0.5).to(torch.bfloat16)
              for shape in ((inter, dim), (inter, dim), (dim, inter))]
    results = {}
    with one_rank_group() as group:
        modules = {p: automodel_mok_experts(config, group, dev, p) for p in ("mxfp8", "bf16")}
        with torch.no_grad():
            for name, p in modules["mxfp8"].named_parameters():
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        modules["bf16"].load_state_dict(modules["mxfp8"].state_dict())
        runs = {}
        for precision, module in modules.items():
            xi = x.clone().requires_grad_(True)
            rwi = rw.clone().requires_grad_(True)
            sh = [w.clone().requires_grad_(True) for w in shared]
            y = module(xi, rwi, idx, *sh)
            y.backward(d_out)
            runs[precision] = {
                "output": y.detach(), "x": xi.grad, "router_weights": rwi.grad,
                "gate_weights": module.routed_gate_weights.grad,
                "up_weights": module.routed_up_weights.grad,
                "down_weights": module.routed_down_weights.grad,
                "shared_gate_weights": sh[0].grad, "shared_up_weights": sh[1].grad,
                "shared_down_weights": sh[2].grad}
        mx = modules["mxfp8"]
        weights = {"gate_weights": mx.routed_gate_weights, "up_weights": mx.routed_up_weights,
                   "down_weights": mx.routed_down_weights}

    def bits(t):
        return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)

    spec = mok.LayerSpec(hidden=dim, intermediate=inter, experts=experts, top_k=topk,
                         padding=32, shared_intermediate=inter, precision="mxfp8",
                         swiglu_limit=swiglu_limit or None)
    layer = mok.compile(spec, target="cpu")
    args = dict(x=bits(x), top_experts=idx.to(torch.int32).numpy(),
                router_weights=rw.numpy(), **{n: bits(w) for n, w in weights.items()},
                shared_gate_weights=bits(shared[0]), shared_up_weights=bits(shared[1]),
                shared_down_weights=bits(shared[2]))
    out, ctx = layer.forward(**args)
    grads = layer.backward(ctx, bits(d_out))
    direct = {"output": out, **grads}

    def as64(v):
        if isinstance(v, torch.Tensor):
            v = bits(v) if v.dtype == torch.bfloat16 else v.detach().numpy()
        return (mok.bf16_to_float32(v) if v.dtype == np.uint16 else v).astype(np.float64)
    for name, want in direct.items():
        results[name] = (as64(runs["mxfp8"][name]), as64(want))
        results["bf16:" + name] = (as64(runs["bf16"][name]), as64(want))
    return results


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


# -- Hugging Face transformers -------------------------------------------------

def qwen3_moe_config(hidden=64, moe_inter=32, experts=8, topk=2, layers=2, vocab=128):
    """A small Qwen3-MoE config (no download): every layer sparse."""
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                          moe_intermediate_size=moe_inter, num_experts=experts,
                          num_experts_per_tok=topk, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2,
                          head_dim=hidden // 4, decoder_sparse_step=1, mlp_only_layers=[],
                          max_position_embeddings=256, norm_topk_prob=True,
                          output_router_logits=False, tie_word_embeddings=False)


def _hf_pair(cfg, device, seed):
    """Two copies of one random initialization of the causal LM of `cfg`
    (bf16): (with transformers' grouped_mm experts, with mok's)."""
    import torch
    import mok.hf  # noqa: F401  (registers "mok")
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    # (each model its own config: from_config sets the implementation on it)
    native = AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                              experts_implementation="grouped_mm",
                                              dtype=torch.bfloat16).to(device)
    mine = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), experts_implementation="mok",
                                            dtype=torch.bfloat16).to(device)
    if (native.config._experts_implementation, mine.config._experts_implementation) != (
            "grouped_mm", "mok"):
        raise AssertionError("the models' experts implementations are not grouped_mm and mok")
    mine.load_state_dict(native.state_dict())
    return native, mine


def qwen3_moe_pair(device="cpu", seed=0, **config):
    """Two copies of one random-initialised Qwen3-MoE causal LM (bf16),
    one with transformers' own grouped_mm experts, one with mok's."""
    return _hf_pair(qwen3_moe_config(**config), device, seed)


def hf_qwen3_check(device="cpu", batch=2, seq=24, seed=0, **config):
    """Logits and every parameter's gradient of the mok model against the
    grouped_mm model (same weights, same tokens), both measured against
    the model in float64 (eager experts). Returns {name: (mok rel err,
    grouped_mm rel err)} for "logits" and each parameter."""
    native, mine = qwen3_moe_pair(device, seed, **config)
    return _hf_model_check(native, mine, device, batch, seq, seed)


def deepseek_v3_pair(device="cpu", seed=0, hidden=64, moe_inter=32, experts=8, topk=2,
                     layers=2, vocab=128):
    """Two copies of one random-initialised DeepSeek-V3 causal LM (bf16,
    every layer MoE, one shared expert): grouped_mm experts, and mok's with
    the shared expert fused (mok.hf.fuse_shared_experts)."""
    import mok.hf
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                           moe_intermediate_size=moe_inter, n_routed_experts=experts,
                           n_shared_experts=1, num_experts_per_tok=topk, n_group=1,
                           topk_group=1, first_k_dense_replace=0, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
                           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                           v_head_dim=16, max_position_embeddings=256, rope_scaling=None,
                           tie_word_embeddings=False)
    native, mine = _hf_pair(cfg, device, seed)
    fused = mok.hf.fuse_shared_experts(mine)
    if len(fused) != layers:
        raise AssertionError(f"fused the shared experts of {fused}, expected {layers} blocks")
    return native, mine


def hf_deepseek_v3_check(device="cpu", batch=2, seq=24, seed=0, **config):
    """hf_qwen3_check on DeepSeek-V3 with the shared experts fused into
    mok's layers."""
    native, mine = deepseek_v3_pair(device, seed, **config)
    return _hf_model_check(native, mine, device, batch, seq, seed)


def _hf_model_check(native, mine, device, batch, seq, seed, router_scale=30.0):
    import torch
    # Decisive routers: at the initial scale (std 0.02) the router's top-k
    # is nearly a tie on many tokens, and bf16 rounding in the layers
    # before a router (any implementation's) flips such choices against
    # float64, which then measures the flip, not the experts.
    with torch.no_grad():
        for model in (native, mine):
            for layer in model.model.layers:
                layer.mlp.gate.weight.mul_(router_scale)
    ref = copy.deepcopy(native).double()
    ref.set_experts_implementation("eager")
    models = (("mok", mine), ("grouped_mm", native), ("float64", ref))
    routes, chosen = {}, {}

    def recorder(name, index):
        def hook(module, args):
            routes[name, index] = args[1].sort(dim=1).values
            if name == "grouped_mm":
                chosen[index] = args[1].detach().clone()
        return hook

    def forced(index):
        # The float64 router's output with the bf16 model's top-k (its
        # weights are float64's own probabilities of those experts, as
        # transformers' TopKRouter computes them, so the router's gradient
        # is float64's): routes that bf16 rounding flips near a tie would
        # otherwise measure the flip (a whole expert's output on a token),
        # not the experts.
        def hook(module, args, output):
            logits = output[0]
            top = chosen[index].to(logits.device)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1).gather(1, top)
            if module.norm_topk_prob:
                probs = probs / probs.sum(dim=-1, keepdim=True)
            return logits, probs.to(logits.dtype), top
        return hook

    hooks = [layer.mlp.experts.register_forward_pre_hook(recorder(name, i))
             for name, model in models for i, layer in enumerate(model.model.layers)]
    # transformers' TopKRouter (Qwen3-MoE and its kin: softmax, top-k,
    # optional renormalization) takes the bf16 routes in float64; other
    # routers (DeepSeek-V3's grouped sigmoid) are compared as they route.
    force = all(type(layer.mlp.gate).__name__.endswith("TopKRouter")
                and hasattr(layer.mlp.gate, "norm_topk_prob") for layer in ref.model.layers)
    if force:
        hooks += [layer.mlp.gate.register_forward_hook(forced(i))
                  for i, layer in enumerate(ref.model.layers)]
    g = torch.Generator().manual_seed(seed + 1)
    vocab = native.config.vocab_size
    # Tokens whose routes are the same in the compared models: mok's and
    # grouped_mm's (both bf16; the first layer's are equal by construction,
    # a later layer's input differs by the experts' rounding), and
    # float64's where its routes are not the bf16 ones (above). Where a
    # router's top-k is within rounding of a tie, the models may route a
    # token differently, and the comparison then measures that flip, not
    # the experts. Such draws are redrawn (a few at most; the count is
    # returned as "redraws").
    against = ("grouped_mm",) if force else ("grouped_mm", "float64")
    for redraws in range(8):
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        labels = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        runs = {}
        for model in (mine, native, ref):
            model.zero_grad(set_to_none=True)
        for name, model in models:
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
            runs[name] = (out.logits.detach().double().cpu(),
                          {n: p.grad.double().cpu() for n, p in model.named_parameters()
                           if p.grad is not None})
        layers = range(len(ref.model.layers))
        if all(torch.equal(routes["mok", i].cpu(), routes[name, i].cpu())
               for name in against for i in layers) and all(
                   torch.equal(routes["grouped_mm", i].cpu(), routes["float64", i].cpu())
                   for i in layers):
            break
    else:
        raise AssertionError("every draw of tokens had a route flip between the models")
    for h in hooks:
        h.remove()
    results = {"redraws": (redraws, redraws)}
    err = torch_reference.relative_error
    want_logits, want_grads = runs["float64"]
    results["logits"] = (err(runs["mok"][0], want_logits),
                         err(runs["grouped_mm"][0], want_logits))
    if sorted(runs["mok"][1]) != sorted(want_grads):
        raise AssertionError("the mok model's parameters with gradients differ: "
                             f"{sorted(set(runs['mok'][1]) ^ set(want_grads))}")
    for n, want in want_grads.items():
        results[n] = (err(runs["mok"][1][n], want), err(runs["grouped_mm"][1][n], want))
    return results

def hf_experts_check(device="cpu", tokens=37, seed=0, drop=0.0, **config):
    """One Qwen3-MoE experts module (transformers' class, its parameters)
    run with mok and with grouped_mm on the same hidden states and routes,
    forward and backward, against float64. Returns {name: (mok rel err,
    grouped_mm rel err)} for the output, x, the router weights, gate_up_proj
    and down_proj."""
    import torch
    native, mine = qwen3_moe_pair(device, seed, **config)
    experts = {"mok": mine.model.layers[0].mlp.experts,
               "grouped_mm": native.model.layers[0].mlp.experts}
    e, i2, h = experts["mok"].gate_up_proj.shape
    k = native.config.num_experts_per_tok
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    top = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    rw = torch.softmax(torch.randn(tokens, k, generator=g), -1).to(torch.bfloat16)
    d_out = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    runs = {}
    for name, module in experts.items():
        xi = x.clone().to(device).requires_grad_(True)
        wi = rw.clone().to(device).requires_grad_(True)
        out = module(xi, top.to(device), wi)
        out.backward(d_out.to(device))
        runs[name] = {"output": out.detach().cpu(), "x": xi.grad.cpu(),
                      "router_weights": wi.grad.cpu(),
                      "gate_up_proj": module.gate_up_proj.grad.cpu(),
                      "down_proj": module.down_proj.grad.cpu()}
    gu = experts["grouped_mm"].gate_up_proj.detach().cpu()
    a = {"x": x, "top_experts": top, "router_weights": rw.float(),
         "gate_weights": gu[:, :i2 // 2], "up_weights": gu[:, i2 // 2:],
         "down_weights": experts["grouped_mm"].down_proj.detach().cpu()}
    want = {"output": torch_reference.forward(a, e)}
    grads = torch_reference.backward(a, d_out, e)
    want.update(x=grads["x"], router_weights=grads["router_weights"],
                gate_up_proj=torch.cat([grads["gate_weights"], grads["up_weights"]], 1),
                down_proj=grads["down_weights"])
    err = torch_reference.relative_error
    return {n: (err(runs["mok"][n], w), err(runs["grouped_mm"][n], w))
            for n, w in want.items()}


def toy_corpus(vocab, batch, seq, steps, seed=0):
    """A fixed toy corpus: `steps` batches of sequences that follow a
    random (fixed) permutation of the vocabulary from a random start, so a
    model can learn it and the loss falls."""
    import torch
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randperm(vocab, generator=g)
    batches = []
    for _ in range(steps):
        seqs = torch.empty(batch, seq, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(1, seq):
            seqs[:, t] = nxt[seqs[:, t - 1]]
        batches.append(seqs)
    return batches


def hf_qwen3_training(device="cpu", steps=50, batch=8, seq=32, lr=2e-3, log_every=5, seed=0,
                      **config):
    """`steps` AdamW steps of the mok and the grouped_mm Qwen3-MoE from one
    initialization on the toy corpus. Returns {"step": [...], "mok": [...],
    "grouped_mm": [...]}: the losses at every `log_every`-th step (and the
    first and last)."""
    import torch
    native, mine = qwen3_moe_pair(device, seed, **config)
    data = toy_corpus(native.config.vocab_size, batch, seq, steps, seed + 7)
    curves = {"step": [], "mok": [], "grouped_mm": []}
    opts = {name: torch.optim.AdamW(model.parameters(), lr=lr)
            for name, model in (("mok", mine), ("grouped_mm", native))}
    for step, ids in enumerate(data, 1):
        ids = ids.to(device)
        logged = step == 1 or step == steps or step % log_every == 0
        if logged:
            curves["step"].append(step)
        for name, model in (("mok", mine), ("grouped_mm", native)):
            opts[name].zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opts[name].step()
            if logged:
                curves[name].append(loss.item())
    return curves


# -- Megatron-Core -------------------------------------------------------------

@contextlib.contextmanager
def megatron_one_rank():
    """Megatron-Core's parallel state on one rank (gloo): its
    ProcessGroupCollection, the EP group."""
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    with one_rank_group():
        ps.initialize_model_parallel(1, 1)
        try:
            yield ProcessGroupCollection.use_mpu_process_groups()
        finally:
            ps.destroy_model_parallel()


def megatron_check(device="cpu", tokens=40, hidden=64, inter=32, shared_inter=48, experts=8,
                   topk=2, seed=0, main_grad=False):
    """Megatron-Core's own SequentialMLP + SharedExpertMLP (permute,
    experts, unpermute with its moe_utils) against mok.megatron's
    MoKMegakernel on copies of the same modules, forward and backward,
    both against float64. `main_grad`: the mok side's parameters carry a
    main_grad (fp32; "bf16" for bf16 ones) with
    config.gradient_accumulation_fusion. Returns
    ({name: (mok rel err, native rel err)}, the backend)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_utils import permute, unpermute
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mok.megatron import MoKMegakernel
    dev = torch.device(device)
    with megatron_one_rank() as pgc:
        cfg = TransformerConfig(
            num_layers=1, hidden_size=hidden, num_attention_heads=4, ffn_hidden_size=4 * hidden,
            moe_ffn_hidden_size=inter, num_moe_experts=experts, moe_router_topk=topk,
            moe_shared_expert_intermediate_size=shared_inter, gated_linear_unit=True,
            activation_func=F.silu, add_bias_linear=False, bf16=True,
            params_dtype=torch.bfloat16, use_cpu_initialization=True)
        subm = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
        torch.manual_seed(seed)
        routed = SequentialMLP(experts, cfg, subm, pg_collection=pgc).to(dev)
        shared = SharedExpertMLP(cfg, subm, gate=False, pg_collection=pgc).to(dev)
        with torch.no_grad():
            for p in list(routed.parameters()) + list(shared.parameters()):
                p.copy_(torch.randn(p.shape) * p.shape[1] ** -0.5)
        # (copies by construction: the modules hold process groups)
        routed_m = SequentialMLP(experts, cfg, subm, pg_collection=pgc).to(dev)
        shared_m = SharedExpertMLP(cfg, subm, gate=False, pg_collection=pgc).to(dev)
        routed_m.load_state_dict(routed.state_dict())
        shared_m.load_state_dict(shared.state_dict())
        cfg_m = copy.copy(cfg)
        if main_grad:
            cfg_m.gradient_accumulation_fusion = True
            dtype = torch.bfloat16 if main_grad == "bf16" else torch.float32
            for p in list(routed_m.parameters()) + list(shared_m.parameters()):
                p.main_grad = torch.zeros(p.shape, dtype=dtype, device=dev)
        backend = MoKMegakernel(cfg_m, pgc.ep, routed_m, shared_m, experts)

        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(dev)
        logits = torch.randn(tokens, experts, generator=g)
        val, idx = torch.topk(logits, topk, dim=1)
        routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, idx, True)
        probs = torch.zeros(tokens, experts).scatter(1, idx, torch.softmax(val, -1))
        routing_map[0] = False  # a token routed nowhere
        probs[0] = 0.0
        routing_map, probs = routing_map.to(dev), probs.to(dev)
        d_out = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(dev)

        x1, p1 = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        y1 = backend(x1, p1, routing_map)
        y1.backward(d_out)

        x2, p2 = x.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        permuted, permuted_probs, order = permute(x2, routing_map, probs=p2)
        out, _ = routed(permuted, routing_map.sum(0).cpu(), permuted_probs)
        y2 = unpermute(out, order, x2.shape, routing_map=routing_map) + shared(x2)
        y2.backward(d_out)

    def stacked(module, grads):
        rows = [(e.linear_fc1.weight, e.linear_fc2.weight) for e in module.local_experts]
        get = (lambda p: p.main_grad) if grads == "main" else (lambda p: p.grad)
        return (torch.stack([get(a) for a, _ in rows]).cpu(),
                torch.stack([get(b) for _, b in rows]).cpu())

    fc1 = torch.stack([e.linear_fc1.weight.detach() for e in routed.local_experts]).cpu()
    fc2 = torch.stack([e.linear_fc2.weight.detach() for e in routed.local_experts]).cpu()
    s1, s2 = shared.linear_fc1.weight.detach().cpu(), shared.linear_fc2.weight.detach().cpu()
    a = {"x": x.cpu(), "top_experts": idx.masked_fill(~routing_map.cpu().gather(1, idx), -1),
         "router_weights": probs.cpu().gather(1, idx).float(),
         "gate_weights": fc1[:, :inter], "up_weights": fc1[:, inter:], "down_weights": fc2,
         "shared_gate_weights": s1[:shared_inter], "shared_up_weights": s1[shared_inter:],
         "shared_down_weights": s2}
    want = torch_reference.forward(a, experts)
    grads = torch_reference.backward(a, d_out.cpu(), experts)
    d_probs = torch.zeros(tokens, experts, dtype=torch.float64).scatter(
        1, idx, grads["router_weights"]) * routing_map.cpu()
    err = torch_reference.relative_error
    mine1, mine2 = stacked(routed_m, "main" if main_grad else "grad")
    nat1, nat2 = stacked(routed, "grad")
    sh_mine = ((shared_m.linear_fc1.weight.main_grad, shared_m.linear_fc2.weight.main_grad)
               if main_grad else (shared_m.linear_fc1.weight.grad, shared_m.linear_fc2.weight.grad))
    pairs = {
        "output": (y1, y2, want), "x": (x1.grad, x2.grad, grads["x"]),
        "probs": (p1.grad * routing_map, p2.grad * routing_map, d_probs),
        "routed linear_fc1": (mine1, nat1, torch.cat([grads["gate_weights"],
                                                      grads["up_weights"]], 1)),
        "routed linear_fc2": (mine2, nat2, grads["down_weights"]),
        "shared linear_fc1": (sh_mine[0], shared.linear_fc1.weight.grad,
                              torch.cat([grads["shared_gate_weights"],
                                         grads["shared_up_weights"]], 0)),
        "shared linear_fc2": (sh_mine[1], shared.linear_fc2.weight.grad,
                              grads["shared_down_weights"]),
    }
    result = {n: (err(m.detach().cpu(), w), err(v.detach().cpu(), w))
              for n, (m, v, w) in pairs.items()}
    return result, backend, routed_m


def megatron_moe_layer_check(device="cuda", tokens=256, hidden=256, inter=128,
                             shared_inter=256, experts=16, topk=4, seed=0, backward=True):
    """Megatron-Core's own MoELayer (its router, allgather token dispatcher,
    SequentialMLP and SharedExpertMLP, built from its local GPT layer
    spec) against a copy of it running mok (mok.megatron.use_mok), forward
    and backward from the same hidden states. Megatron's router needs CUDA.
    Returns {name: relative error of the mok layer against the native one}
    for the output and (`backward`) the input's and every parameter's
    gradient.

    Megatron-Core 0.16.1's router_gating_linear tests `te_general_gemm is
    not None` in its forward and backward, but defines te_general_gemm only
    when Transformer Engine imports: without TE every router call raises
    NameError. Without TE the check sets it to None, the value that code
    tests for, so Megatron's own torch.mm path runs."""
    import torch
    import megatron.core.transformer.moe.moe_utils as moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mok.megatron import use_mok
    dev = torch.device(device)
    with megatron_one_rank() as pgc:
        cfg = TransformerConfig(
            num_layers=1, hidden_size=hidden, num_attention_heads=4, ffn_hidden_size=4 * hidden,
            moe_ffn_hidden_size=inter, num_moe_experts=experts, moe_router_topk=topk,
            moe_shared_expert_intermediate_size=shared_inter, gated_linear_unit=True,
            activation_func=F.silu, add_bias_linear=False, bf16=True,
            params_dtype=torch.bfloat16, moe_token_dispatcher_type="allgather",
            moe_router_dtype="fp32", use_cpu_initialization=True)
        spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False).submodules.mlp
        torch.manual_seed(seed)
        native = build_module(spec, config=cfg, pg_collection=pgc).to(dev)
        mine = build_module(spec, config=cfg, pg_collection=pgc).to(dev)
        with torch.no_grad():
            for p in native.parameters():
                p.copy_(torch.randn(p.shape) * p.shape[-1] ** -0.5)
        mine.load_state_dict(native.state_dict())
        use_mok(mine)
        if sorted(mine.state_dict()) != sorted(native.state_dict()):
            raise AssertionError("use_mok changed the MoE layer's state-dict keys")
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(tokens // 2, 2, hidden, generator=g).to(torch.bfloat16).to(dev)
        d_out = torch.randn(x.shape, generator=g).to(torch.bfloat16).to(dev)
        outs = {}
        for name, layer in (("mok", mine), ("native", native)):
            xi = x.clone().requires_grad_(True)
            out, bias = layer(xi)
            assert bias is None
            outs[name] = {"output": out.detach()}
            if backward:
                out.backward(d_out)
                outs[name].update(x=xi.grad, **{n: p.grad for n, p in layer.named_parameters()})
    err = torch_reference.relative_error
    return {n: err(outs["mok"][n].cpu(), outs["native"][n].double().cpu())
            for n in outs["native"]}


__all__ = ["REL_BOUND", "automodel_experts_check", "automodel_init_parity",
           "automodel_moe_check", "automodel_mxfp8_check", "deepseek_v3_pair", "hf_deepseek_v3_check", "hf_experts_check", "hf_qwen3_check", "hf_qwen3_training", "qwen3_moe_pair",
           "megatron_check", "megatron_moe_layer_check", "toy_corpus"]
