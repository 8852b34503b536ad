# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.torch (the autograd bridge and module) on the CPU target, against the
CPU layer it wraps (bitwise: the bridge adds no arithmetic), the float64
reference (relative error <= 1e-2, mok-brief §5) and a plain-PyTorch layer's
autograd. Skipped where torch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mok  # noqa: E402
import mok.torch  # noqa: E402
import reference  # noqa: E402
from cpu_results import seed_for  # noqa: E402

REL_BOUND = 1e-2
WEIGHTS = ("gate_weights", "up_weights", "down_weights")
SHARED = ("shared_gate_weights", "shared_up_weights", "shared_down_weights")

# A shared expert, the clamp, -1 routes and zero router weights at once.
SPEC = mok.LayerSpec(hidden=32, intermediate=16, experts=6, top_k=3, shared_intermediate=8,
                     swiglu_limit=1.0, padding=8)
T = 29


def _inputs(seed_name, spec=SPEC, tokens=T):
    g = torch.Generator().manual_seed(seed_for(seed_name))
    top = torch.stack([torch.randperm(spec.experts, generator=g)[:spec.top_k]
                       for _ in range(tokens)]).int() if tokens \
        else torch.zeros(0, spec.top_k, dtype=torch.int32)
    top[torch.rand(top.shape, generator=g) < 0.2] = -1
    rw = torch.softmax(torch.randn(tokens, spec.top_k, generator=g), 1)
    rw[torch.rand(rw.shape, generator=g) < 0.2] = 0.0
    x = torch.randn(tokens, spec.hidden, generator=g).bfloat16()
    d_out = torch.randn(tokens, spec.hidden, generator=g).bfloat16()
    return x, top, rw, d_out


def _module(recompute=False, seed_name="weights", **kw):
    torch.manual_seed(seed_for(seed_name))
    return mok.torch.MoELayer(SPEC, recompute=recompute, **kw)


def _run(moe, x, top, rw, d_out):
    """Forward + backward through the module: (out, {name: grad})."""
    moe.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    rw = rw.clone().requires_grad_()
    out = moe(x, top, rw)
    out.backward(d_out)
    grads = {"x": x.grad, "router_weights": rw.grad}
    grads.update({n: getattr(moe, n).grad for n in WEIGHTS + SHARED})
    return out, grads


def _arrays(moe, x, top, rw):
    np_ = lambda t: t.detach().contiguous().view(torch.int16).numpy().view(np.uint16) \
        if t.dtype == torch.bfloat16 else t.detach().numpy()
    args = dict(x=np_(x), top_experts=np_(top), router_weights=np_(rw))
    args.update({n: np_(getattr(moe, n)) for n in WEIGHTS + SHARED})
    return args


def _f64(t):
    return t.detach().double().numpy()


def test_bridge_is_the_cpu_layer_bitwise():
    x, top, rw, d_out = _inputs("torch-bitwise")
    moe = _module()
    out, grads = _run(moe, x, top, rw, d_out)
    layer = moe.layer
    args = _arrays(moe, x, top, rw)
    ref_out, ctx = layer.forward(**args)
    ref_grads = layer.backward(ctx, d_out.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), ref_out)
    for name, ref in ref_grads.items():
        got = grads[name]
        got = got.view(torch.int16).numpy().view(np.uint16) if got.dtype == torch.bfloat16 \
            else got.numpy()
        assert np.array_equal(got, ref), f"d_{name} differs from the CPU layer's"
    assert set(ref_grads) == set(grads)


def test_gradients_match_float64_reference():
    x, top, rw, d_out = _inputs("torch-reference")
    moe = _module()
    out, grads = _run(moe, x, top, rw, d_out)
    w = {n: _f64(getattr(moe, n)) for n in WEIGHTS + SHARED}
    pos = (_f64(x), top.numpy(), _f64(rw), w["gate_weights"], w["up_weights"],
           w["down_weights"])
    shared = [w[n] for n in SHARED]
    ref_out = reference.forward(*pos, shared, SPEC.swiglu_limit)
    ref = reference.backward(*pos, _f64(d_out), shared, SPEC.swiglu_limit)
    for name, got, want in [("out", out, ref_out)] + [(f"d_{n}", grads[n], ref[n]) for n in ref]:
        got = _f64(got)
        assert not np.isnan(got).any(), name
        rel = np.abs(got - want).sum() / np.abs(want).sum()
        assert rel <= REL_BOUND, f"{name}: relative error {rel:.3e} > {REL_BOUND}"
    # Routes without an expert get no router-weight gradient; zero-weight
    # routes do get one (<d_out, y> does not depend on the weight).
    assert torch.all(grads["router_weights"][top < 0] == 0)
    zero = (rw == 0) & (top >= 0)
    assert zero.any() and torch.any(grads["router_weights"][zero] != 0)


def _torch_layer(moe, x, top, rw, limit):
    """The same layer in plain PyTorch, f32 math with gate/up rounded to bf16
    as mok rounds them: autograd's gradients."""
    def mlp(a, wg, wu, wd):
        g, u = (a @ wg.float().T).bfloat16().float(), (a @ wu.float().T).bfloat16().float()
        g, u = torch.clamp(g, max=limit), torch.clamp(u, -limit, limit)
        return (g * torch.sigmoid(g) * u) @ wd.float().T
    xf = x.float()
    out = mlp(xf, moe.shared_gate_weights, moe.shared_up_weights, moe.shared_down_weights)
    for t in range(x.shape[0]):
        for j in range(top.shape[1]):
            e = int(top[t, j])
            if e >= 0:
                out[t] = out[t] + rw[t, j] * mlp(xf[t:t + 1], moe.gate_weights[e],
                                                 moe.up_weights[e], moe.down_weights[e])[0]
    return out


def test_gradients_match_pytorch_autograd():
    x, top, rw, d_out = _inputs("torch-autograd")
    moe = _module()
    _, grads = _run(moe, x, top, rw, d_out)
    moe.zero_grad(set_to_none=True)
    xr, rwr = x.clone().requires_grad_(), rw.clone().requires_grad_()
    _torch_layer(moe, xr, top, rwr, SPEC.swiglu_limit).backward(d_out.float())
    want = {"x": xr.grad, "router_weights": rwr.grad}
    want.update({n: getattr(moe, n).grad for n in WEIGHTS + SHARED})
    for name, w in want.items():
        got, w = _f64(grads[name]), _f64(w)
        rel = np.abs(got - w).sum() / np.abs(w).sum()
        assert rel <= REL_BOUND, f"d_{name}: relative error {rel:.3e} against autograd"


def test_recompute_gives_the_same_gradients_bitwise():
    x, top, rw, d_out = _inputs("torch-recompute")
    saved, recomputed = _module(), _module(recompute=True)
    assert not saved.layer.recomputes and recomputed.layer.recomputes
    out_a, a = _run(saved, x, top, rw, d_out)
    out_b, b = _run(recomputed, x, top, rw, d_out)
    assert torch.equal(out_a, out_b)
    for name in a:
        assert torch.equal(a[name], b[name]), f"d_{name}"


def test_context_goes_through_save_for_backward():
    """Every context tensor is packed by saved-tensor hooks (what activation
    checkpointing and offloading use), and backward works from the unpacked
    copies: the inputs (3 + 6 weights) plus, without recompute, the
    context's 7 saved tensors."""
    x, top, rw, d_out = _inputs("torch-hooks")
    for recompute, expected in ((False, 9 + 7), (True, 9)):
        moe = _module(recompute=recompute)
        _, direct = _run(moe, x, top, rw, d_out)
        moe.zero_grad(set_to_none=True)
        packed = []

        def pack(t):
            packed.append(tuple(t.shape))
            return t.clone()  # backward works from these copies

        def unpack(t):
            unpacked.append(t)
            return t

        unpacked = []
        xh = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = moe(xh, top, rw.clone().requires_grad_())
        assert len(packed) == expected, (recompute, packed)
        out.backward(d_out)
        assert len(unpacked) == expected
        assert torch.equal(xh.grad, direct["x"])
        for name in WEIGHTS + SHARED:
            assert torch.equal(getattr(moe, name).grad, direct[name]), name


def test_activation_checkpointing():
    x, top, rw, d_out = _inputs("torch-checkpoint")
    moe = _module()
    _, plain = _run(moe, x, top, rw, d_out)
    moe.zero_grad(set_to_none=True)
    xc = x.clone().requires_grad_()
    from torch.utils.checkpoint import checkpoint
    out = checkpoint(moe, xc, top, rw, use_reentrant=False)
    out.backward(d_out)
    assert torch.equal(xc.grad, plain["x"])
    assert torch.equal(moe.down_weights.grad, plain["down_weights"])


def test_main_grad_accumulates_in_fp32():
    x, top, rw, d_out = _inputs("torch-main-grad")
    moe = _module()
    _, plain = _run(moe, x, top, rw, d_out)
    acc = _module(accumulate_main_grad=True)
    for name in WEIGHTS + SHARED:
        p = getattr(acc, name)
        p.main_grad = torch.full(p.shape, 0.5, dtype=torch.float32)
    for _ in range(2):
        _, grads = _run(acc, x, top, rw, d_out)
    for name in WEIGHTS + SHARED:
        p = getattr(acc, name)
        # The weight's gradient is a zero placeholder (hooks still fire);
        # main_grad got the bf16 dW widened, twice, in order.
        assert p.grad_added_to_main_grad and torch.equal(grads[name], torch.zeros_like(p))
        g = plain[name].float()
        want = (torch.full(p.shape, 0.5) + g) + g
        assert torch.equal(p.main_grad, want), name
    # x and router_weights still get their gradients.
    assert torch.equal(grads["x"], plain["x"])
    assert torch.equal(grads["router_weights"], plain["router_weights"])


def test_errors_name_the_argument():
    x, top, rw, _ = _inputs("torch-errors")
    moe = _module()
    with pytest.raises(TypeError, match=r"x: expected a torch.bfloat16 tensor of shape "
                                         r"\[T, 32\], got torch.float32 of shape \[29, 32\]"):
        moe(x.float(), top, rw)
    with pytest.raises(TypeError, match=r"top_experts: expected a torch.int32 tensor of shape "
                                        r"\[T, 3\], got torch.int64"):
        moe(x, top.long(), rw)
    with pytest.raises(ValueError, match=r"router_weights.*\[29, 3\]"):
        moe(x, top, rw[:, :2].contiguous())
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got ndarray"):
        moe(x.float().numpy(), top, rw)
    acc = _module(accumulate_main_grad=True)
    with pytest.raises(ValueError, match="gate_weights: accumulate_main_grad needs a float32"):
        acc(x, top, rw)
    with pytest.raises(TypeError, match="spec: expected a mok.LayerSpec"):
        mok.torch.MoELayer("spec")
    with pytest.raises(ValueError, match="main_grads: 'x' is not a weight"):
        mok.torch.MoEFunction.apply(moe.layer, {"x": torch.zeros(1)}, x, top, rw,
                                    *[getattr(moe, n) for n in WEIGHTS + SHARED])


def test_inference_under_no_grad_and_no_double_backward():
    x, top, rw, d_out = _inputs("torch-no-grad")
    moe = _module()
    with torch.no_grad():
        inference = moe(x, top, rw)
    assert inference.grad_fn is None
    out = moe(x, top, rw)
    assert torch.equal(inference, out.detach())
    xg = x.clone().requires_grad_()
    out = moe(xg, top, rw)
    (gx,) = torch.autograd.grad(out, xg, d_out, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiated once|once_differentiable|"
                                           "does not require grad"):
        gx.float().sum().backward()


def test_any_token_count():
    moe = _module()
    for tokens in (0, 1, 7, 40):
        x, top, rw, d_out = _inputs(f"torch-tokens-{tokens}", tokens=tokens)
        out, grads = _run(moe, x, top, rw, d_out)
        assert out.shape == (tokens, SPEC.hidden) and grads["x"].shape == x.shape


def test_training_example_runs_and_agrees(tmp_path):
    """examples/train_tiny_moe.py, a few steps: the mok and plain-PyTorch
    models start from one initialization (equal first losses) and stay
    within bf16 noise of each other."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_tiny_moe.py")
    spec = importlib.util.spec_from_file_location("train_tiny_moe", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "6", "--out", str(tmp_path)])
    a, b = result["losses"]["mok"], result["losses"]["pytorch"]
    assert len(a) == len(b) == 6 and all(np.isfinite(a + b))
    assert abs(a[0] - b[0]) < 1e-3, (a[0], b[0])
    assert result["max_abs_diff"] < 0.05 and a[-1] < a[0]
    assert (tmp_path / "train_tiny_moe.json").exists()
    # The first step's gradients of every parameter (router, norms, head,
    # experts) agree between the two models: the check with power (a
    # missing router-weight gradient or a scaled one fails it).
    for name, rel in result["first_step_grad_rel_err"].items():
        assert rel <= REL_BOUND, f"{name}: {rel:.3e}"


def test_gpu_target_arguments_are_checked_before_compiling():
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2)
    with pytest.raises(ValueError, match="target: expected 'cpu', 'sm_90a' or 'sm_100a'"):
        mok.torch.MoELayer(spec, target="sm_80")
    with pytest.raises(ValueError, match="artifact: only GPU targets take a compiled artifact"):
        mok.torch.MoELayer(spec, artifact=object())
    fixed = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=8)
    with pytest.raises(TypeError, match="artifact: expected a mok.GpuTrainingArtifact"):
        mok.torch.MoELayer(fixed, target="sm_90a", artifact="x")
    with pytest.raises(TypeError, match="layer: expected a mok.GpuTrainingLayer"):
        mok.torch.GpuMoEFunction.apply(object(), {}, torch.zeros(1), torch.zeros(1),
                                       torch.zeros(1))


class _FakeLoaded:
    """Stands for a loaded GpuTrainingLayer (no GPU here): what MoELayer
    reads of it."""
    arg_names = ["x", "top_experts", "router_weights"] + list(WEIGHTS)
    device = torch.device("cpu")

    def __init__(self, artifact, device):
        self.artifact, self.loaded_on = artifact, device


def _training_artifact(ptx="// forward"):
    return mok.GpuTrainingArtifact(mok.GpuArtifact(ptx, {"function": "f_forward"}),
                                   mok.GpuArtifact("// backward", {"function": "f_backward"}))


def test_gpu_modules_of_one_kernel_share_the_loaded_layer(monkeypatch):
    """MoELayer(share_layer=True, the default): one loaded layer (one
    workspace, one JIT compile) per kernels and device while a module holds
    it; share_layer=False, other kernels or another device load their own."""
    import gc
    loads = []

    def load(artifact, device=None, poison_outputs=False):
        loads.append(device)
        return _FakeLoaded(artifact, device)

    monkeypatch.setattr(mok.GpuTrainingArtifact, "load", load)
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=8)

    def make(artifact, **kw):
        return mok.torch.MoELayer(spec, target="sm_90a", artifact=artifact, **kw)

    a = make(_training_artifact(), device=0)
    b = make(_training_artifact(), device="cuda:0")  # equal kernels, another object
    assert b.layer is a.layer and loads == [0]
    assert make(_training_artifact(), device=1).layer is not a.layer
    assert make(_training_artifact("// other"), device=0).layer is not a.layer
    assert make(_training_artifact(), device=0, share_layer=False).layer is not a.layer
    assert loads == [0, 1, 0, 0]
    # The parameters are each module's own.
    assert a.gate_weights is not b.gate_weights
    # The layer goes with its last module; the next module loads again.
    del a, b
    gc.collect()
    make(_training_artifact(), device=0)
    assert loads == [0, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="device: expected a CUDA device, got 'cpu'"):
        make(_training_artifact(), device="cpu")


def test_fuse_main_grad_picks_the_kernel_that_adds(monkeypatch):
    """accumulate_main_grad on sm_90a compiles the layer with main_grads=True
    (the kernel adds) unless fuse_main_grad=False; on sm_100a, or with an
    artifact compiled without main_grads, bf16 dW is added after the kernel
    unless fuse_main_grad=True asks for the kernel; misuse is refused by
    name before compiling."""
    compiled = []

    def fake_compile(spec, target="cpu", training=False, recompute=False, cache_dir=None,
                     main_grads=False):
        compiled.append((target, training, main_grads))
        return _training_artifact()

    monkeypatch.setattr(mok.torch, "_compile", fake_compile)
    monkeypatch.setattr(mok.GpuTrainingArtifact, "load",
                        lambda artifact, device=None, poison_outputs=False:
                        _FakeLoaded(artifact, device))
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=8)
    mok.torch.MoELayer(spec, target="sm_90a", device=0, accumulate_main_grad=True,
                       recompute=True)
    mok.torch.MoELayer(spec, target="sm_90a", device=0, accumulate_main_grad=True,
                       recompute=True, fuse_main_grad=True)
    mok.torch.MoELayer(spec, target="sm_90a", device=0, accumulate_main_grad=True,
                       recompute=True, fuse_main_grad=False)
    mok.torch.MoELayer(spec, target="sm_90a", device=0, recompute=True)
    mok.torch.MoELayer(spec, target="sm_100a", device=0, accumulate_main_grad=True,
                       recompute=True)
    mok.torch.MoELayer(spec, target="sm_100a", device=0, accumulate_main_grad=True,
                       recompute=True, fuse_main_grad=True)
    assert compiled == [("sm_90a", True, True), ("sm_90a", True, True),
                        ("sm_90a", True, False), ("sm_90a", True, False),
                        ("sm_100a", True, False), ("sm_100a", True, True)]
    # An artifact without main_grads: added after the kernel, by default.
    moe = mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=_training_artifact(),
                             accumulate_main_grad=True)
    assert not moe.layer.artifact.main_grads
    with pytest.raises(ValueError, match="fuse_main_grad: needs accumulate_main_grad=True"):
        mok.torch.MoELayer(spec, target="sm_90a", fuse_main_grad=True)
    with pytest.raises(ValueError, match="fuse_main_grad: the kernel adds into main_grad on "
                       "GPU targets only, not on target 'cpu'"):
        mok.torch.MoELayer(spec, accumulate_main_grad=True, fuse_main_grad=True)
    # An artifact compiled with main_grads: its kernel adds, by default;
    # False (the add after the kernel) cannot be had from it.
    adding = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward"}),
        mok.GpuArtifact("// backward", {"function": "f_backward", "params": [
            {"name": "d_gate_weights", "role": "output", "dtype": "f32",
             "shape": [4, 32, 64], "accumulate": True}]}))
    moe = mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=adding,
                             accumulate_main_grad=True)
    assert moe.layer.artifact.main_grads
    with pytest.raises(ValueError, match="fuse_main_grad: False asks for bf16 dW added after "
                       "the kernel, but artifact was compiled with main_grads=True"):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=adding,
                           accumulate_main_grad=True, fuse_main_grad=False)
    # An artifact of another chip than the module's target.
    hopper = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward", "chip": "sm_90a"}),
        mok.GpuArtifact("// backward", {"function": "f_backward", "chip": "sm_90a"}))
    with pytest.raises(ValueError, match="artifact: compiled for sm_90a, the module's target "
                       "is 'sm_100a'"):
        mok.torch.MoELayer(spec, target="sm_100a", device=0, artifact=hopper)
    with pytest.raises(ValueError, match="artifact: compiled without main_grads"):
        mok.torch.MoELayer(spec, target="sm_90a", artifact=_training_artifact(),
                           accumulate_main_grad=True, fuse_main_grad=True)
    # FP8 kernels that take their weights quantized (fp8_quantized_weights).
    given = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward", "chip": "sm_90a", "params": [
            {"name": "gate_q", "role": "input", "dtype": "f8e4m3", "shape": [4, 32, 64]}]}),
        mok.GpuArtifact("// backward", {"function": "f_backward", "chip": "sm_90a"}))
    with pytest.raises(ValueError, match="inference_artifact: not with an artifact compiled "
                       "with fp8_quantized_weights=True"):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=given,
                           inference_artifact=mok.GpuArtifact("// inference", {"function": "f"}))
    # (An FP8 layer that quantizes its weights itself has gate_q as a
    # workspace: accepted.)
    itself = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward", "chip": "sm_90a", "params": [
            {"name": "gate_q", "role": "workspace", "dtype": "f8e4m3", "shape": [4, 32, 64]}]}),
        mok.GpuArtifact("// backward", {"function": "f_backward", "chip": "sm_90a"}))
    assert mok.torch.MoELayer(spec, target="sm_90a", device=0,
                              artifact=itself).layer.artifact is itself
    assert len(compiled) == 6


def test_inference_artifact_is_checked_before_loading(monkeypatch):
    """MoELayer(inference_artifact=): a GpuArtifact whose inputs and output
    are the training forward's, loaded for no_grad forwards; anything else,
    or without a GPU artifact= to go with, is refused by name."""
    loads = []

    def load(artifact, device=None, ep_group=None, poison_outputs=False):
        loads.append(artifact)
        return _FakeLoaded(artifact, device)

    monkeypatch.setattr(mok.GpuTrainingArtifact, "load", load)
    monkeypatch.setattr(mok.GpuArtifact, "load", load)
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=8)

    def params(tokens=8):
        return [{"name": "x", "role": "input", "dtype": "bf16", "shape": [tokens, 64]},
                {"name": "out", "role": "output", "dtype": "bf16", "shape": [tokens, 64]}]

    training = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward", "params": params()}),
        mok.GpuArtifact("// backward", {"function": "f_backward"}))
    inference = mok.GpuArtifact("// inference", {"function": "f", "params": params()})
    moe = mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=training,
                             inference_artifact=inference)
    assert moe._infer.artifact is inference and moe.layer.artifact is training
    with pytest.raises(TypeError, match="inference_artifact: expected a mok.GpuArtifact"):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=training,
                           inference_artifact=training)
    hopper = {"function": "f", "chip": "sm_90a", "params": params()}
    with pytest.raises(ValueError, match="inference_artifact: compiled for sm_90a, the "
                       "training layer for None"):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=training,
                           inference_artifact=mok.GpuArtifact("// hopper", hopper))
    other = mok.GpuArtifact("// other", {"function": "f", "params": params(tokens=16)})
    with pytest.raises(ValueError, match=r"inference_artifact: its inputs and output .* "
                       r"are not the training layer's"):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=training,
                           inference_artifact=other)
    with pytest.raises(ValueError, match="inference_artifact: goes with a GPU target's "
                       "artifact="):
        mok.torch.MoELayer(spec, target="sm_90a", device=0, inference_artifact=inference)
    with pytest.raises(ValueError, match="inference_artifact: goes with a GPU target's "
                       "artifact="):
        mok.torch.MoELayer(spec, inference_artifact=inference)
    del moe  # (no module holds the shared layers: any load would show)
    import gc
    gc.collect()
    broken = mok.GpuArtifact("// broken", {"function": "f", "params": [{"name": "x"}]})
    for bad, error, match in (
            (other, ValueError, "inference_artifact: its inputs"),
            (training, TypeError, "inference_artifact: expected a mok.GpuArtifact"),
            (mok.GpuArtifact("// hopper", hopper), ValueError,
             "inference_artifact: compiled for sm_90a"),
            (broken, ValueError, "inference_artifact: its metadata's params are malformed")):
        with pytest.raises(error, match=match):
            mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=training,
                               inference_artifact=bad)
    assert loads == [training, inference]


def test_expert_parallel_module_needs_its_group():
    """ep > 1: the module is one rank's part, so it needs the group's
    process group (NCCL) on a GPU target; the CPU target runs a group in
    one process instead (mok.compile -> CompiledGroupLayer)."""
    spec = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, ep=2)
    with pytest.raises(ValueError, match=r"spec.ep: 2 > 1 needs the process_group of its 2 "
                                         r"ranks"):
        mok.torch.MoELayer(spec)
    with pytest.raises(ValueError, match=r"process_group: expert parallelism across processes "
                                         r"runs on the GPU targets"):
        mok.torch.MoELayer(spec, process_group=object())
