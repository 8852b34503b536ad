# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The property tests of test_api_properties.py on the GPU: generated wrong
arguments to a loaded layer's forward — dtypes, shapes, devices, strides,
aliasing of out and the inputs, types — each a named error with nothing
launched (the layer's forward count and a poisoned out unchanged), and the
valid variants (inputs sharing memory, views into larger tensors, a given
out) bitwise the result of plain tensors. Operands one element off a
16-byte boundary run in a process of their own: refused by name, or the
same result, never a CUDA error. Seeded as properties.py says."""
import os
import subprocess
import sys
import textwrap

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES as LAYERS
from properties import CASES, expect, generator, succeed, where

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
NAMES = ["one_token_top8", "top1_clamp", "shared_clamp_i64"]


def _load(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path).load()


def _mutate(g, torch, layer, args, ref):
    """(kind, arguments, out or None, names of the error or None when the
    call is valid)."""
    name = g.choice(list(args))
    t = args[name]
    a, out = dict(args), None
    kind = g.choice(["dtype", "shape", "cpu", "meta", "other-gpu", "noncontiguous",
                     "expanded", "numpy", "type", "out-alias", "out-partial", "out-dtype",
                     "out-shape", "out-cpu", "out-strided", "out-grad", "share", "rows",
                     "out-given"])
    if kind == "dtype":
        a[name] = t.to(g.choice([d for d in (torch.float32, torch.float16, torch.int64,
                                             torch.int32, torch.bfloat16, torch.float64)
                                 if d != t.dtype]))
        return kind, a, out, [f"{name}: expected dtype"]
    if kind == "shape":
        shape = list(t.shape)
        shape[g.randrange(len(shape))] += g.choice([1, 8])
        a[name] = torch.zeros(shape, dtype=t.dtype, device=t.device)
        return kind, a, out, [f"{name}: expected shape"]
    if kind == "cpu":
        a[name] = t.cpu()
        return kind, a, out, [f"{name}: expected a tensor on cuda:0, got cpu"]
    if kind == "meta":
        a[name] = t.to("meta")
        return kind, a, out, [f"{name}: expected a tensor on cuda:0, got meta"]
    if kind == "other-gpu":
        if torch.cuda.device_count() < 2:
            return kind, a, out, None
        a[name] = t.to("cuda:1")
        return kind, a, out, [f"{name}: expected a tensor on cuda:0, got cuda:1"]
    if kind == "noncontiguous":
        if t.shape[-1] < 2:
            return kind, a, out, None
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        a[name] = wide[..., ::2]
        a[name].copy_(t)
        return kind, a, out, [f"{name}: the innermost dimension must be contiguous"]
    if kind == "expanded":
        if t.shape[0] < 2:
            return kind, a, out, None
        a[name] = t[:1].expand(*t.shape)
        return kind, a, out, [f"{name}: expected a dense row-major tensor"]
    if kind == "numpy":
        a[name] = t.float().cpu().numpy()
        return kind, a, out, [f"{name}: expected dtype", f"{name}: expected a tensor on"]
    if kind == "type":
        a[name] = g.choice([None, [1, 2], 3, "x"])
        return kind, a, out, [f"{name}: expected a torch.Tensor"]
    shape, bf16 = list(ref.shape), torch.bfloat16
    if kind == "out-alias":
        if list(args["x"].shape) != shape:
            return kind, a, out, None
        return kind, a, args["x"], ["out: overlaps the input x"]
    if kind == "out-partial":
        # x and out as rows of one allocation, overlapping by one row.
        rows = shape[0]
        both = torch.zeros(2 * rows - 1 if rows > 1 else 1, shape[1], dtype=bf16,
                           device="cuda")
        a["x"] = both[:rows]
        a["x"].copy_(args["x"])
        return kind, a, both[rows - 1:], ["out: overlaps the input x", "out: expected shape"]
    if kind == "out-dtype":
        return kind, a, torch.zeros(shape, device="cuda"), ["out: expected dtype"]
    if kind == "out-shape":
        return kind, a, torch.zeros(shape[0] + 1, shape[1], dtype=bf16, device="cuda"), \
            ["out: expected shape"]
    if kind == "out-cpu":
        return kind, a, torch.zeros(shape, dtype=bf16), ["out: expected a tensor on cuda:0"]
    if kind == "out-strided":
        return kind, a, torch.zeros(shape[1], shape[0], dtype=bf16, device="cuda").t(), \
            ["out: expected a contiguous tensor"] if shape[0] > 1 and shape[1] > 1 else None
    if kind == "out-grad":
        return kind, a, torch.zeros(shape, dtype=bf16, device="cuda", requires_grad=True), \
            ["out: must not require grad"]
    if kind == "share":
        # gate and up given one tensor: only read, so allowed.
        a["up_weights"] = a["gate_weights"]
        return kind, a, out, None
    if kind == "rows":
        # Rows of a larger tensor (a storage offset, 16-byte aligned).
        big = torch.zeros(t.shape[0] + 16, *t.shape[1:], dtype=t.dtype, device=t.device)
        a[name] = big[8:8 + t.shape[0]]
        a[name].copy_(t)
        return kind, a, out, None
    return kind, a, torch.full(shape, float("nan"), dtype=bf16, device="cuda"), None


@pytest.mark.parametrize("name", NAMES)
def test_forward_arguments(name):
    import torch
    g = generator(f"gpu-forward-{name}")
    layer = _load(name)
    args = torch_reference.make_inputs(LAYERS[name], torch.Generator().manual_seed(11))
    ref = layer(**args)
    torch.cuda.synchronize()
    for case in range(CASES // 2):
        kind, a, out, names = _mutate(g, torch, layer, args, ref)
        label = f"{where('gpu-forward-' + name, case)} {kind}"
        if names is None:
            if kind == "share":  # the reference: two tensors with these values
                want = layer(**dict(a, up_weights=a["gate_weights"].clone()))
            else:
                want = ref
            got = succeed(label, lambda: layer(**a, out=out) if out is not None
                          else layer(**a))
            torch.cuda.synchronize()
            assert torch.equal(got, want), f"{label}: a different result"
            continue
        poison = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        forwards = layer._forwards
        expect(label, lambda: layer(**a, out=out if out is not None else poison), names,
               (TypeError, ValueError, mok.MokRuntimeError))
        torch.cuda.synchronize()
        assert layer._forwards == forwards, f"{label}: launched"
        assert torch.isnan(poison).all(), f"{label}: the output was written"


_MISALIGNED = textwrap.dedent('''
    import json, os, sys, torch, mok
    from bench import torch_reference
    from bench.cases import CASES
    name, operand = sys.argv[1], sys.argv[2]
    path = os.path.join(os.environ["MOK_GPU_ARTIFACTS"], name, "moe_layer")
    layer = mok.GpuArtifact.from_files(path).load(poison_outputs=True)
    args = torch_reference.make_inputs(CASES[name], torch.Generator().manual_seed(2))
    ref = layer(**args)
    t = args[operand]
    flat = torch.zeros(t.numel() + 1, dtype=t.dtype, device="cuda")
    shifted = flat[1:].view(t.shape)  # one element past a 16-byte boundary
    shifted.copy_(t)
    try:
        out = layer(**dict(args, **{operand: shifted}))
        torch.cuda.synchronize()
        print(json.dumps({"result": "ran", "same": bool(torch.equal(out, ref))}))
    except (TypeError, ValueError, mok.MokRuntimeError) as e:
        print(json.dumps({"result": "refused", "message": str(e)}))
''')


@pytest.mark.parametrize("name", ["one_token_top8", "top1_clamp"])
def test_operands_off_16_byte_boundaries(name):
    """Each operand one element off a 16-byte boundary (aligned to its
    element, as the runtime requires of operands read by pointer): refused
    by name, or run with the aligned result — a kernel that loads 16 bytes
    at a time from it must not fault."""
    import json
    import torch
    args = torch_reference.make_inputs(LAYERS[name], torch.Generator().manual_seed(2))
    env = dict(os.environ, MOK_GPU_ARTIFACTS=os.path.abspath(ARTIFACTS),
               PYTHONPATH=os.pathsep.join(sys.path))
    for operand in args:
        proc = subprocess.run([sys.executable, "-c", _MISALIGNED, name, operand],
                              capture_output=True, text=True, env=env, timeout=300)
        label = f"{name}: {operand} one element off"
        assert proc.returncode == 0, f"{label}: {proc.stderr[-3000:]}"
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{label}: {report}")
        if report["result"] == "refused":
            assert report["message"].startswith(f"{operand}:"), f"{label}: {report}"
        else:
            assert report["same"], f"{label}: a different result"
