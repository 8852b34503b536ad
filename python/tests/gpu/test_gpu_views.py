# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Weight views on the GPU (GpuLayer.bind_weights / bind_fc1 over the runtime
extension): a tensor-core layer run with dense weights, with gate and up
bound to the halves of a fused FC1 tensor, and with one allocation per
expert for all three weights — each against the float64 reference with the
output poisoned (NaN) before the launch, and the three bitwise equal: the
same kernel and tiles, only where the per-expert tensor maps point differs.
Needs the artifacts of python3 -m bench.compile tests (MOK_GPU_ARTIFACTS),
compiled by a compiler whose tensor-core kernels read the routed weights
through per-expert tensor maps (metadata "access": "tensor_maps").
"""
import os

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES
from gpu_results import RESULTS

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2
ROUTED = ("gate_weights", "up_weights", "down_weights")
# Cases on the tensor-core path: H % 64 == 0, I % 128 == 0, padding % 64 == 0.
VIEW_CASES = ["top1_clamp", "qwen3_top2_clamp"]


def _artifact(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    art = mok.GpuArtifact.from_files(path)
    access = {p["name"]: p.get("access", "pointer") for p in art.metadata["params"]}
    by_pointer = [n for n in ROUTED if access.get(n) != "tensor_maps"]
    if by_pointer:
        pytest.fail(f"{path}.json: {', '.join(by_pointer)} not read through tensor maps "
                    f"only (no \"access\": \"tensor_maps\"): compiled by a compiler "
                    f"without per-expert weight tensor maps, or not a tensor-core layer")
    return art


def _compare(label, c, got, ref):
    import torch
    assert not torch.isnan(got).any(), f"{label}: NaN in the output (unwritten?)"
    diff = (got.double() - ref).abs()
    rel = (diff.sum() / ref.abs().sum()).item()
    RESULTS.append(dict(case=label, T=c["tokens"], H=c["hidden"], I=c["intermediate"],
                        E=c["experts"], k=c["top_k"], rel=rel, max=diff.max().item(), ms=0.0))
    assert rel <= REL_BOUND, f"{label}: relative error {rel:.3e} > {REL_BOUND}"


def _reference(c, args):
    return torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))


def _per_expert(t, pad=0):
    """One allocation per expert (made in reverse order, so that the experts
    are not evenly spaced), rows padded by `pad` NaN columns: a kernel that
    read past a row, or assumed one stride, would show it."""
    import torch
    rows, cols = t.shape[1:]
    experts = [None] * t.shape[0]
    for e in reversed(range(t.shape[0])):
        storage = torch.full((rows, cols + pad), float("nan"), dtype=t.dtype, device=t.device)
        storage[:, :cols] = t[e]
        experts[e] = storage[:, :cols]
    return experts


@pytest.mark.parametrize("name", VIEW_CASES)
def test_weight_views_match_dense_weights(name):
    import torch
    c = CASES[name]
    art = _artifact(name)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    args = torch_reference.make_inputs(c, gen)
    ref = _reference(c, args)
    rest = {k: v for k, v in args.items() if k not in ROUTED}
    layer = art.load(poison_outputs=True)

    dense = layer(**args)
    _compare(f"dense {name}", c, dense, ref)

    # Fused FC1 [E, 2I, H]: gate is rows [0, I) of each expert, up [I, 2I).
    fc1 = torch.cat([args["gate_weights"], args["up_weights"]], dim=1)
    layer.bind_fc1(fc1)
    assert layer.bound_weights == ("gate_weights", "up_weights")
    fused = layer(down_weights=args["down_weights"], **rest)
    _compare(f"fc1 {name}", c, fused, ref)

    # One allocation per expert for all three weights; up's rows padded.
    layer.unbind_weights()
    separate = {w: _per_expert(args[w], pad=64 if w == "up_weights" else 0) for w in ROUTED}
    for w in ROUTED:
        layer.bind_weights(w, separate[w])
    assert layer.bound_weights == ROUTED
    per_expert = layer(**rest)
    _compare(f"per-expert {name}", c, per_expert, ref)

    assert torch.equal(fused, dense), f"{name}: fused FC1 views differ from dense weights"
    assert torch.equal(per_expert, dense), f"{name}: per-expert views differ from dense weights"
    # The kernel reads the bound storage itself, not a copy.
    for t in separate["down_weights"]:
        t.zero_()
    assert (layer(**rest) == 0).all()


def test_a_bound_operand_is_not_passed_again():
    import torch
    name = "top1_clamp"
    c = CASES[name]
    layer = _artifact(name).load(poison_outputs=True)
    args = torch_reference.make_inputs(c, torch.Generator().manual_seed(5))
    expected = layer(**args)
    # A parameter (requires_grad) binds as well: the view takes its storage.
    layer.bind_weights("down_weights", torch.nn.Parameter(args["down_weights"]))
    with pytest.raises(TypeError, match="down_weights: is bound to a weight view"):
        layer(**args)
    rest = {k: v for k, v in args.items() if k != "down_weights"}
    assert torch.equal(layer(**rest), expected)
    # The runtime refuses it as well, below GpuLayer's check.
    out = torch.full_like(expected, float("nan"))
    with pytest.raises(mok.MokRuntimeError, match="'down_weights' is bound as a weight view"):
        layer._layer.forward(args, out=out,
                             stream=torch.cuda.current_stream().cuda_stream)
    layer.unbind_weights("down_weights")
    assert torch.equal(layer(**args), expected)


def test_weight_view_argument_errors():
    import torch
    name = "top1_clamp"
    c = CASES[name]
    E, I, H = c["experts"], c["intermediate"], c["hidden"]
    layer = _artifact(name).load(poison_outputs=True)
    args = torch_reference.make_inputs(c, torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=rf"gate_weights: expected {E} per-expert tensors"):
        layer.bind_weights("gate_weights", [args["gate_weights"][0]])
    with pytest.raises(ValueError, match=r"up_weights\[1\]: expected shape"):
        layer.bind_weights("up_weights", [args["up_weights"][0], args["down_weights"][0]]
                           + list(args["up_weights"][2:]))
    with pytest.raises(ValueError, match=rf"fc1: expected shape \[{E}, {2 * I}, {H}\]"):
        layer.bind_fc1(args["gate_weights"])
    with pytest.raises(ValueError, match="gate_weights: expected a tensor on cuda:0, got cpu"):
        layer.bind_weights("gate_weights", args["gate_weights"].cpu())
    with pytest.raises(TypeError, match="down_weights: expected dtype torch.bfloat16"):
        layer.bind_weights("down_weights", args["down_weights"].float())
    with pytest.raises(ValueError, match="x: only the routed weights"):
        layer.bind_weights("x", args["x"])
    # A row stride that TMA cannot take (not a multiple of 16 bytes).
    odd = torch.zeros(E, I, H + 4, dtype=torch.bfloat16, device="cuda")[:, :, :H]
    with pytest.raises(mok.MokRuntimeError, match="gate_weights"):
        layer.bind_weights("gate_weights", odd)
    assert layer.bound_weights == ()
    # A layer on the scalar path reads the weights by pointer: no views.
    scalar = _scalar_layer()
    s = CASES["one_token_top8"]
    w = torch.zeros(s["experts"], s["intermediate"], s["hidden"], dtype=torch.bfloat16,
                    device="cuda")
    with pytest.raises(mok.MokRuntimeError, match="'gate_weights'.*by pointer"):
        scalar.bind_weights("gate_weights", w)


def _scalar_layer():
    path = os.path.join(ARTIFACTS, "one_token_top8", "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path).load(poison_outputs=True)


def test_views_in_a_cuda_graph():
    """Capture a forward with FC1 bound, then update the weights in place (as
    an optimizer step does) and replay: the graph reads the new values."""
    import torch
    name = "top1_clamp"
    c = CASES[name]
    layer = _artifact(name).load(poison_outputs=True)
    static = torch_reference.make_inputs(c, torch.Generator().manual_seed(7))
    fc1 = torch.cat([static["gate_weights"], static["up_weights"]], dim=1)
    layer.bind_fc1(fc1)
    rest = {k: v for k, v in static.items() if k not in ("gate_weights", "up_weights")}
    layer(**rest)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(**rest)
    for seed in (8, 9):
        fresh = torch_reference.make_inputs(c, torch.Generator().manual_seed(seed))
        fc1.copy_(torch.cat([fresh["gate_weights"], fresh["up_weights"]], dim=1))
        for k in rest:
            rest[k].copy_(fresh[k])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _compare(f"graph fc1 {name} {seed}", c, out, _reference(c, fresh))
