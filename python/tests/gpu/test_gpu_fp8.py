# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""FP8 layers (precision = "fp8", scalar GEMMs; docs/FP8.md) on the GPU:
the output against the float64 definition (python/tests/fp8_reference.py)
on fresh random inputs, the output poisoned before each launch; and the
kernel's quantized copies (the weights, the routed rows of x, the hidden
activation) bit for bit against the NumPy model of the format, with
special values (NaN, infinity, zeros, -0, bf16 subnormals, huge values) in
the inputs. Layers of bench/cases.py's FP8_CASES (python3 -m bench.compile
tests)."""
import os
import sys

import numpy as np
import pytest

from bench import torch_reference
from bench.cases import FP8_CASES, FP8_TRAIN_CASES, MX_CASES
from gpu_layers import forward_layer, fresh_seed, training_artifact, training_layer
from gpu_results import RESULTS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fp8_reference as ref  # noqa: E402  (python/tests)

REL = 1e-2  # as the CPU FP8 layer's test (test_fp8_layer.py)


def _f64(t):
    return t.detach().double().cpu().numpy()


def _shared(c, a):
    """The shared expert's weights (float64), or None."""
    if not c.get("shared_intermediate"):
        return None
    return tuple(_f64(a[n]) for n in ("shared_gate_weights", "shared_up_weights",
                                      "shared_down_weights"))


def _definition(c, a):
    return ref.layer_forward(_f64(a["x"]), a["top_experts"].cpu().numpy(),
                             _f64(a["router_weights"]), _f64(a["gate_weights"]),
                             _f64(a["up_weights"]), _f64(a["down_weights"]), _shared(c, a),
                             c.get("swiglu_limit"), c["precision"])


def _arguments(c, a):
    """The layer's arguments for inputs `a` (the routed weights quantized
    beforehand for a layer compiled with fp8_quantized_weights: a training
    layer's in both layouts)."""
    if not c.get("fp8_quantized_weights"):
        return a
    return torch_reference.quantized_weight_args(a, training=bool(c.get("training")),
                                                 precision=c["precision"])


def _rel(got, want):
    return float(np.abs(got - want).sum() / np.abs(want).sum())


# The layers called with bf16 routed weights (not fp8_quantized_weights).
BF16_WEIGHTS = [n for n, c in FP8_CASES.items() if not c.get("fp8_quantized_weights")]


def _runs():
    """(case, T): each case at its T; a case for any T at 1, 67 and its
    capacity."""
    for name, c in FP8_CASES.items():
        for tokens in ([c["tokens"]] if c["tokens"] else [1, 67, c["max_tokens"]]):
            yield name, tokens


@pytest.mark.parametrize("name,tokens",
                         list(_runs()) + [(n, c["tokens"]) for n, c in MX_CASES.items()])
def test_fp8_forward_matches_its_definition(name, tokens):
    import torch
    c = FP8_CASES.get(name) or MX_CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen, tokens=tokens)
    out = layer(**_arguments(c, a))
    torch.cuda.synchronize()
    got = _f64(out)
    assert not np.isnan(got).any(), f"{name}: NaN in the output (unwritten?)"
    want = _definition(c, a)
    bf16 = torch_reference.forward(a, c["experts"], c.get("swiglu_limit")).cpu().numpy()
    err, err_bf16 = _rel(got, want), _rel(got, bf16)
    RESULTS.append(dict(case=name, T=tokens, H=c["hidden"], I=c["intermediate"],
                        E=c["experts"], k=c["top_k"], rel=err,
                        max=float(np.abs(got - want).max()), ms=float("nan")))
    print(f"{name} at T = {tokens}: against its FP8 definition {err:.2e}, against the "
          f"bf16 layer {err_bf16:.2e}")
    assert err <= REL, f"{name} at T = {tokens}: relative error {err:.3e} > {REL}"
    # The quantization is there: much further from the bf16 layer.
    assert err_bf16 > 2 * err, f"{name} at T = {tokens}"
    # The same bits on a second call.
    assert torch.equal(layer(**_arguments(c, a)), out)


def _specials(a):
    """Special values in x and the gate weights, in whole blocks and single
    elements: a NaN, an infinity, a zero block, -0, bf16 subnormals, huge
    values and exact ties of the rounding."""
    import torch
    x, wg = a["x"], a["gate_weights"]
    x[0, 5] = float("nan")                         # block 0 of token 0: NaN
    x[1, 130] = float("-inf")                      # block 1 of token 1: -inf
    x[2, :128] = 0.0                               # a zero block
    x[2, 128:256] = -0.0                           # a block of -0
    x[3, :128] = 2.0 ** -130                       # bf16 subnormals
    x[3, 7] = -(2.0 ** -128)
    x[4, :128] = torch.linspace(-1e38, 1e38, 128)  # huge
    x[5, :128] = 448.0 * torch.arange(128) / 127   # ties and the saturation
    wg[0, :128, :128] = 0.0
    wg[1, 3, 3] = float("inf")
    wg[2, :128, :128] *= 1e-30


def _workspace(layer, name):
    import torch
    t = layer.read_workspace(name)
    return t.view(torch.uint8).numpy() if t.dtype == torch.float8_e4m3fn else t.numpy()


def _same_scales(got, want):
    """f32 scales equal bit for bit (NaN's bits included)."""
    return np.array_equal(np.asarray(got, np.float32).view(np.uint32),
                          np.asarray(want, np.float32).view(np.uint32))


@pytest.mark.parametrize("name", BF16_WEIGHTS)
def test_fp8_quantized_copies_are_bit_exact(name):
    import torch
    c = FP8_CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    # A first call on other inputs: the copies checked are the second's.
    tokens = c["tokens"] or c["max_tokens"]
    layer(**torch_reference.make_inputs(c, gen, tokens=tokens))
    a = torch_reference.make_inputs(c, gen, tokens=tokens)
    _specials(a)
    layer(**a)
    torch.cuda.synchronize()
    # The weights: 128 x 128 blocks.
    for w in ("gate", "up", "down"):
        codes, scales = ref.quantize(_f64(a[w + "_weights"]), (128, 128), "f32")
        assert np.array_equal(_workspace(layer, w + "_q"), codes), w
        assert _same_scales(_workspace(layer, w + "_scale"), scales), w
    # The routed rows of x: row r < offsets[E] holds route row_route[r]'s
    # token (a padding row, -1, is zeros), quantized in 1 x 128 blocks.
    offsets = _workspace(layer, "offsets")
    rows = int(offsets[-1])
    row_route = _workspace(layer, "row_route")[:rows]
    x = _f64(a["x"])
    routed = np.where((row_route >= 0)[:, None], x[np.maximum(row_route, 0) // c["top_k"]],
                      0.0)
    codes, scales = ref.quantize(routed, (1, 128), "f32")
    assert np.array_equal(_workspace(layer, "routed_x_q")[:rows], codes)
    assert _same_scales(_workspace(layer, "routed_x_scale")[:, :rows], scales.T)
    # The hidden activation, from the kernel's own bf16 values.
    hidden = layer.read_workspace("hidden")[:rows].double().numpy()
    codes, scales = ref.quantize(hidden, (1, 128), "f32")
    assert np.array_equal(_workspace(layer, "hidden_q")[:rows], codes)
    assert _same_scales(_workspace(layer, "hidden_scale")[:, :rows], scales.T)
    # The special blocks were there: NaN scales for the NaN and infinite
    # blocks, 1 for the zero ones.
    assert np.isnan(_workspace(layer, "routed_x_scale")).any()
    assert (_workspace(layer, "gate_scale")[0, 0, 0] == 1.0)


def _from_atoms(atoms, rows):
    """MX scales [..., rows, cols / 32] from tcgen05's scale-factor atoms
    [..., ceil(rows / 128), cols / 128, 512]: row r's block j of atom column
    cb is byte (r % 32) * 16 + (r % 128) // 32 * 4 + j."""
    *lead, row_atoms, col_atoms, _ = atoms.shape
    r = np.arange(row_atoms * 128)
    offset = ((r % 32) * 16 + (r % 128) // 32 * 4)[:, None] + np.arange(4)  # [R', 4]
    blocks = atoms[..., r // 128, :, :]  # [..., R', col_atoms, 512]
    index = np.broadcast_to(offset[:, None, :], (*blocks.shape[:-1], 4))
    picked = np.take_along_axis(blocks, index, axis=-1)  # [..., R', col_atoms, 4]
    return picked.reshape(*lead, row_atoms * 128, col_atoms * 4)[..., :rows, :]


@pytest.mark.parametrize("name", [n for n, c in MX_CASES.items()
                                  if not c.get("fp8_quantized_weights")])
def test_mxfp8_quantized_copies_are_bit_exact(name):
    """The MX quantizers on the GPU (mk.quantize_rows and
    mk.quantize_weights with E8M0 scales) against the NumPy model of
    moe.quantize's MX rule, codes and scale bytes, with the special values
    of _specials; the scales read back from tcgen05's atom layout."""
    import torch
    c = MX_CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    layer(**torch_reference.make_inputs(c, gen))  # the copies checked are the second call's
    a = torch_reference.make_inputs(c, gen)
    _specials(a)
    layer(**a)
    torch.cuda.synchronize()
    for w in ("gate", "up", "down"):
        weight = _f64(a[w + "_weights"])
        codes, scales = ref.quantize(weight, (1, 32), "e8m0")
        assert np.array_equal(_workspace(layer, w + "_q"), codes), w
        got = _from_atoms(_workspace(layer, w + "_scale").view(np.uint8), weight.shape[1])
        assert np.array_equal(got, scales), w
    offsets = _workspace(layer, "offsets")
    rows = int(offsets[-1])
    row_route = _workspace(layer, "row_route")[:rows]
    x = _f64(a["x"])
    routed = np.where((row_route >= 0)[:, None], x[np.maximum(row_route, 0) // c["top_k"]],
                      0.0)
    hidden = layer.read_workspace("hidden")[:rows].double().numpy()
    for values, source in (("routed_x", routed), ("hidden", hidden)):
        codes, scales = ref.quantize(source, (1, 32), "e8m0")
        assert np.array_equal(_workspace(layer, values + "_q")[:rows], codes), values
        got = _from_atoms(_workspace(layer, values + "_scale").view(np.uint8), rows)
        assert np.array_equal(got, scales), values
    # The special blocks were there: 0xFF for the NaN and infinite blocks,
    # 0 (2^-127) for the zero ones.
    scales = _from_atoms(_workspace(layer, "routed_x_scale").view(np.uint8), rows)
    assert (scales == 0xFF).any() and (scales == 0).any()


@pytest.mark.parametrize("name", [n for n in FP8_CASES
                                  if n.endswith("_wgmma") and n[:-len("_wgmma")] in FP8_CASES])
def test_fp8_wgmma_matches_its_scalar_twin(name):
    """E4M3 wgmma (partial sums a k-tile, added with their scales) against
    the scalar FP8 GEMMs (each element decoded and scaled, summed in k
    order) on the same inputs: the same quantized inputs, bit for bit; the
    hidden activation (bf16, from each engine's own gate/up sums) within
    1e-3, the tensor cores' accumulation order and width. Where a hidden
    value differs by a bf16 rounding and lies near the midpoint of two
    E4M3 values, its FP8 code differs by one (an eighth to a sixteenth of
    the value): at most 1 % of the hidden codes may, and the outputs then
    agree within 5e-3 (each is within REL of the definition, tested
    above)."""
    import torch
    c = FP8_CASES[name]
    wgmma, simt = forward_layer(name), forward_layer(name[:-len("_wgmma")])
    assert "tensor_maps" in wgmma.meta and "tensor_maps" not in simt.meta
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    got, want = _f64(wgmma(**a)), _f64(simt(**a))
    torch.cuda.synchronize()
    # (The routed rows the experts use: the capacity's rest is never
    # written.)
    rows = int(_workspace(simt, "offsets")[-1])
    assert rows == int(_workspace(wgmma, "offsets")[-1])
    for copy in ("gate_q", "down_q", "down_scale"):
        assert np.array_equal(_workspace(wgmma, copy), _workspace(simt, copy)), copy
    assert np.array_equal(_workspace(wgmma, "routed_x_q")[:rows],
                          _workspace(simt, "routed_x_q")[:rows])
    assert _same_scales(_workspace(wgmma, "routed_x_scale")[:, :rows],
                        _workspace(simt, "routed_x_scale")[:, :rows])
    hidden = [layer.read_workspace("hidden")[:rows].double().numpy()
              for layer in (wgmma, simt)]
    h_err = _rel(*hidden)
    h_flips = float((hidden[0] != hidden[1]).mean())
    q_flips = float((_workspace(wgmma, "hidden_q")[:rows]
                     != _workspace(simt, "hidden_q")[:rows]).mean())
    err = _rel(got, want)
    report = (f"{name}: against its scalar twin {err:.2e} (hidden {h_err:.2e}, "
              f"{100 * h_flips:.2f} % of its values and {100 * q_flips:.3f} % of its "
              "FP8 codes differ)")
    print(report)
    assert h_err <= 1e-3 and q_flips <= 1e-2 and err <= 5e-3, report


@pytest.mark.parametrize("name", [n for n, c in FP8_CASES.items() if c.get("warp_specialize")])
def test_fp8_producer_matches_its_twin(name):
    """warp_specialize: a producer warpgroup loads the stages and each
    consumer warpgroup runs its k-tiles unsynchronized with the other, with
    the same MMAs and the same scaling of their partial sums in the same
    order as the layer without a producer. On the H100 a few hidden values
    (1 to 8 of about 600,000, each run deterministic) came out one bf16
    unit in the last place apart, which points at the epilogue's
    instruction sequences rather than the sums (not pinned down): at most
    0.1 % of them may differ, by one ulp, and the outputs within 1e-5."""
    import torch
    c = FP8_CASES[name]
    ws, plain = forward_layer(name), forward_layer(c["twin"])
    # (The producer is a third warpgroup.)
    assert ws.meta["block"] == plain.meta["block"] + 128
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    out, want = ws(**a), plain(**a)
    torch.cuda.synchronize()
    rows = int(_workspace(plain, "offsets")[-1])
    hidden = [layer.read_workspace("hidden")[:rows].view(torch.int16).numpy().astype(np.int32)
              for layer in (ws, plain)]
    apart = np.abs(hidden[0] - hidden[1])
    report = (f"{name}: {100 * float((apart > 0).mean()):.4f} % of the hidden values differ, "
              f"by at most {int(apart.max())} ulp; outputs {_rel(_f64(out), _f64(want)):.2e} "
              "apart")
    print(report)
    assert (apart > 0).mean() <= 1e-3 and apart.max() <= 1, report
    assert _rel(_f64(out), _f64(want)) <= 1e-5, report


def _same_weight_scales(c, got, want):
    """f32 scales bit for bit, or MXFP8's atom bytes."""
    if c["precision"] == "mxfp8":
        return np.array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))
    return _same_scales(got, want)


@pytest.mark.parametrize("name", [n for n in list(FP8_CASES) + list(MX_CASES)
                                  if n.endswith("_given")])
def test_fp8_quantized_weight_inputs_are_the_in_kernel_ones(name):
    """fp8_quantized_weights: the layer called with mok.ops.fp8_quantize's
    weights (MXFP8: mok.ops.mxfp8_quantize's, the scales in atoms) gives
    bitwise the output of its twin that quantizes the bf16 weights itself,
    the same quantized weights in both."""
    import torch
    c = FP8_CASES.get(name) or MX_CASES[name]
    given, itself = forward_layer(name), forward_layer(name[:-len("_given")])
    assert "gate_weights" not in [p["name"] for p in given.inputs]
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    args = _arguments(c, a)
    out, want = given(**args), itself(**a)
    torch.cuda.synchronize()
    # The same quantized weights: mok.ops.fp8_quantize's on the GPU are the
    # kernel's own, bit for bit.
    for w in ("gate", "up", "down"):
        assert np.array_equal(args[w + "_q"].view(torch.uint8).cpu().numpy(),
                              _workspace(itself, w + "_q")), w
        assert _same_weight_scales(c, args[w + "_scale"].cpu().numpy(),
                                   _workspace(itself, w + "_scale")), w
    assert torch.equal(out, want), f"{_rel(_f64(out), _f64(want)):.3e} apart"
    for w in ("gate", "up", "down"):
        assert np.array_equal(_workspace(itself, w + "_q"),
                              args[w + "_q"].view(torch.uint8).cpu().numpy()), w



def _backward_definition(c, a, d_out):
    shared = _shared(c, a)
    return ref.layer_backward(_f64(a["x"]), a["top_experts"].cpu().numpy(),
                              _f64(a["router_weights"]), _f64(a["gate_weights"]),
                              _f64(a["up_weights"]), _f64(a["down_weights"]), _f64(d_out),
                              shared, c.get("swiglu_limit"), c["precision"], c["padding"])


@pytest.mark.parametrize("name", list(FP8_TRAIN_CASES))
def test_fp8_training_step_matches_its_definition(name):
    """The FP8 training forward and backward (docs/FP8.md's backward table:
    d_out per token row, the weights transposed, d_gate and d_up per row for
    the dgrad, d_y, the hidden rows, d_gate, d_up and x's routed rows in
    column blocks of 128 routed rows for the weights' gradients) against
    the float64 definition, each output poisoned first: within 1e-2, and
    every routed gradient more than twice as far from the bf16 layer's.
    main_grads: the fp32 sums added into the main_grad buffers. The same
    bits on a second step."""
    import torch
    c = FP8_TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    tokens = c["tokens"] or 67  # (any T: a call's T below the capacity)
    a = torch_reference.make_inputs(c, gen, tokens=tokens)
    d_out = torch.randn(tokens, c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    want = _backward_definition(c, a, d_out)
    bf16 = torch_reference.backward(a, d_out, c["experts"], c.get("swiglu_limit"))

    def step():
        out, ctx = layer.forward(**_arguments(c, a))
        if not c.get("main_grads"):
            return out, layer.backward(ctx, d_out)
        main = {n: torch.zeros(a[n].shape, dtype=torch.float32, device="cuda")
                for n in want if n.endswith("_weights") and n != "router_weights"}
        grads = layer.backward(ctx, d_out, main_grads=main)
        return out, dict(grads, **main)

    out, grads = step()
    torch.cuda.synchronize()
    err = _rel(_f64(out), _definition(c, a))
    assert err <= REL, f"{name}: the training forward: {err:.3e} from its definition"
    for n, w in want.items():
        got = _f64(grads[n])
        assert not np.isnan(got).any(), f"{name}: NaN in d_{n} (unwritten?)"
        err, err_bf16 = _rel(got, w), _rel(got, _f64(bf16[n]))
        RESULTS.append(dict(case=name + " d_" + n, T=tokens, H=c["hidden"],
                            I=c["intermediate"], E=c["experts"], k=c["top_k"], rel=err,
                            max=float(np.abs(got - w).max()), ms=float("nan")))
        print(f"{name}: d_{n} against its FP8 definition {err:.2e}, against bf16 "
              f"{err_bf16:.2e}")
        assert err <= REL, f"{name}: d_{n}: relative error {err:.3e} > {REL}"
        if not n.startswith("shared"):  # (the shared expert is bf16)
            assert err_bf16 > 2 * err, f"{name}: d_{n}"
    out2, grads2 = step()
    torch.cuda.synchronize()
    assert torch.equal(out, out2)
    for n in want:
        assert torch.equal(grads[n], grads2[n]), f"{name}: d_{n} differs between steps"


@pytest.mark.parametrize("name", [n for n in FP8_TRAIN_CASES if n.endswith("_given")])
def test_fp8_training_with_quantized_weight_inputs_is_the_in_kernel_one(name):
    """A training layer compiled with fp8_quantized_weights, called with
    mok.ops.fp8_quantize's weights in both layouts (MXFP8:
    mok.ops.mxfp8_quantize's, the scales in atoms): the forward's output
    and every gradient bitwise its twin's, which quantizes the bf16 weights
    in its kernels; the transposed copies the same as the twin's
    backward's own."""
    import torch
    c = FP8_TRAIN_CASES[name]
    given, itself = training_layer(name), training_layer(name[:-len("_given")])
    names = given.arg_names
    assert "gate_weights" not in names and {"gate_q", "gate_qt", "down_scale_t"} <= set(names)
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    args = _arguments(c, a)
    out, ctx = given.forward(**args)
    grads = given.backward(ctx, d_out)
    want_out, want_ctx = itself.forward(**a)
    want = itself.backward(want_ctx, d_out)
    torch.cuda.synchronize()
    for w in ("gate", "up", "down"):
        assert np.array_equal(args[w + "_qt"].view(torch.uint8).cpu().numpy(),
                              _workspace(itself._backward, w + "_qt")), w
        assert _same_weight_scales(c, args[w + "_scale_t"].cpu().numpy(),
                                   _workspace(itself._backward, w + "_scale_t")), w
    assert torch.equal(out, want_out), f"{_rel(_f64(out), _f64(want_out)):.3e} apart"
    assert set(grads) == set(want)
    for n in want:
        assert torch.equal(grads[n], want[n]), \
            f"d_{n}: {_rel(_f64(grads[n]), _f64(want[n])):.3e} apart"


def _d_y(d_out, router_weights, row_route, top_k):
    """d_y, d_out's routed rows scaled by their router weights as the
    backward quantizes them (straight from d_out, never stored):
    bf16(w * f32(d_out[t])) for route q = t k + j, zeros for padding rows.
    (A NaN product's sign is the multiply's, which IEEE 754 leaves open:
    x86 keeps the operand's, and torch's bf16 NaN is 0xFFFF.)"""
    import torch
    route = torch.as_tensor(row_route)
    q = route.clamp(min=0)
    w = router_weights.float().cpu().reshape(-1)[q]
    y = (w[:, None] * d_out.float().cpu()[q // top_k]).to(torch.bfloat16)
    return torch.where((route >= 0)[:, None], y, torch.zeros_like(y))


@pytest.mark.parametrize("name", ["train_fp8_shared_clamp", "train_fp8_wide"])
def test_fp8_backward_quantized_copies_are_bit_exact(name):
    """The backward's E4M3 copies: the transposed weights (Q(W) transposed,
    scales too), d_out's rows, and the column blocks of d_y, the hidden
    rows, x's routed rows, d_gate and d_up (stored transposed, padding rows
    and rows past the plan as zeros) bit for bit against the NumPy model,
    with special blocks among them: the forward test's in x and the
    weights, and in d_out a zero column, a tiny one (scales under 2^-90,
    the divided quotients), one with an infinity and one with a NaN. The
    wide case gives the quantizers' warps several blocks each (their
    loops carry the next block's loads); the training forward's routed
    rows of x too."""
    import torch
    c = FP8_TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    _specials(a)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen)
    d_out[:, 0] = 0.0
    d_out[:, 1] *= 2.0 ** -100
    d_out[5, 2] = float("inf")
    d_out[9, 3] = float("nan")
    d_out = d_out.to(torch.bfloat16).cuda()
    out, ctx = layer.forward(**a)
    layer.backward(ctx, d_out)
    torch.cuda.synchronize()
    bwd = layer._backward

    def ws(n):
        return _workspace(bwd, n)
    for w in ("gate", "up", "down"):
        codes, scales = ref.quantize(_f64(a[w + "_weights"]), (128, 128), "f32")
        assert np.array_equal(ws(w + "_qt"), codes.transpose(0, 2, 1)), w
        assert _same_scales(ws(w + "_scale_t"), scales.transpose(0, 2, 1)), w
    codes, scales = ref.quantize(_f64(d_out), (1, 128), "f32")
    assert np.array_equal(ws("d_out_q"), codes)
    assert _same_scales(ws("d_out_scale")[:, :c["tokens"]], scales.T)
    offsets = ws("offsets")
    rows = int(offsets[-1])
    valid = ws("row_route")[:rows] >= 0
    d_y = _d_y(d_out, a["router_weights"], ws("row_route")[:rows], c["top_k"])
    for src in ("d_y", "hidden", "routed_x", "d_gate", "d_up"):
        m = (d_y if src == "d_y" else
             ctx.saved[src] if src in ctx.saved else bwd.read_workspace(src))[:rows]
        m = np.where(valid[:, None], m.double().cpu().numpy(), 0.0)
        codes, scales = ref.quantize(m, (128, 1), "f32")
        got, want = ws(src + "_t")[:, :rows], codes.T
        if src == "d_y":  # a NaN element's code without its sign (_d_y)
            nan = np.isnan(m).T
            got, want = np.where(nan, got & 0x7F, got), np.where(nan, want & 0x7F, want)
        assert np.array_equal(got, want), src
        assert _same_scales(ws(src + "_t_scale")[:rows // 128], scales), src
    # The training forward's routed rows of x (1 x 128 blocks).
    fwd = layer._forward
    routed = np.where(valid[:, None], ctx.saved["routed_x"][:rows].double().cpu().numpy(), 0.0)
    codes, scales = ref.quantize(routed, (1, 128), "f32")
    assert np.array_equal(_workspace(fwd, "routed_x_q")[:rows], codes)
    assert _same_scales(_workspace(fwd, "routed_x_scale")[:, :rows], scales.T)
    d_y_scale = ws("d_y_t_scale")[:rows // 128]
    assert (d_y_scale[:, 0] == 1.0).all() and (d_y_scale[:, 1] < 2.0 ** -90).all()
    assert np.isnan(d_y_scale[:, 2]).any() and np.isnan(d_y_scale[:, 3]).any()


def test_mxfp8_backward_quantized_copies_are_bit_exact():
    """The MXFP8 backward's copies: the weights quantized transposed
    (blocks of 32 along the dgrads' K), d_out's routed rows, and the column
    blocks of 32 routed rows of d_y and the hidden rows (stored transposed,
    padding rows and rows past the plan as zeros), codes and scale bytes
    (read back from the atoms) against the NumPy model."""
    import torch
    name = "train_mx_shared_clamp"
    c = FP8_TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    out, ctx = layer.forward(**a)
    layer.backward(ctx, d_out)
    torch.cuda.synchronize()
    bwd = layer._backward
    for w in ("gate", "up", "down"):
        weight_t = np.swapaxes(_f64(a[w + "_weights"]), -1, -2)
        codes, scales = ref.quantize(weight_t, (1, 32), "e8m0")
        assert np.array_equal(_workspace(bwd, w + "_qt"), codes), w
        got = _from_atoms(_workspace(bwd, w + "_scale_t").view(np.uint8), weight_t.shape[1])
        assert np.array_equal(got, scales), w
    rows = int(_workspace(bwd, "offsets")[-1])
    row_route = _workspace(bwd, "row_route")[:rows]
    routed = np.where((row_route >= 0)[:, None],
                      _f64(d_out)[np.maximum(row_route, 0) // c["top_k"]], 0.0)
    codes, scales = ref.quantize(routed, (1, 32), "e8m0")
    assert np.array_equal(_workspace(bwd, "routed_d_out_q")[:rows], codes)
    got = _from_atoms(_workspace(bwd, "routed_d_out_scale").view(np.uint8), rows)
    assert np.array_equal(got, scales)
    # (The blocks holding routed rows are written; rows past the plan read
    # as zeros in them.)
    padded = _workspace(bwd, "d_y_t").shape[1]
    blocks = (rows + 31) // 32
    d_y = _d_y(d_out, a["router_weights"], row_route, c["top_k"])
    for name_t, src in (("d_y", d_y), ("hidden", ctx.saved["hidden"])):
        src = src[:rows].double().cpu().numpy()
        full = np.zeros((padded, src.shape[1]))
        full[:rows] = np.where((row_route >= 0)[:, None], src, 0.0)
        codes, scales = ref.quantize(full.T, (1, 32), "e8m0")
        assert np.array_equal(_workspace(bwd, name_t + "_t")[:, :rows], codes[:, :rows]), name_t
        got = _from_atoms(_workspace(bwd, name_t + "_t_scale").view(np.uint8), src.shape[1])
        assert np.array_equal(got[:, :blocks], scales[:, :blocks]), name_t


def test_fp8_torch_module_trains_with_the_fp8_kernels():
    """mok.torch.MoELayer with an FP8 spec on the GPU: autograd runs the FP8
    training forward and backward, the parameters' and inputs' gradients
    within 1e-2 of the float64 definition."""
    import torch
    import mok.torch
    from bench.cases import spec_kwargs
    name = "train_fp8_shared_clamp_wgmma"
    c = FP8_TRAIN_CASES[name]
    art = training_artifact(name)
    moe = mok.torch.MoELayer(mok.LayerSpec(**spec_kwargs(c)), target="sm_90a", artifact=art)
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    with torch.no_grad():
        for n, p in moe.named_parameters():
            p.copy_(a[n])
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    x = a["x"].clone().requires_grad_(True)
    rw = a["router_weights"].clone().requires_grad_(True)
    out = moe(x, a["top_experts"], rw)
    out.backward(d_out)
    torch.cuda.synchronize()
    assert _rel(_f64(out), _definition(c, a)) <= REL
    want = _backward_definition(c, a, d_out)
    got = dict(x=x.grad, router_weights=rw.grad)
    got.update((n, p.grad) for n, p in moe.named_parameters())
    assert set(got) == set(want)
    for n, w in want.items():
        err = _rel(_f64(got[n]), w)
        assert err <= REL, f"d_{n}: {err:.3e} from the FP8 definition"


def _train_alike(c, first, second):
    """Two mok.torch modules of case `c` given the same fresh parameters
    and inputs, trained two SGD steps on the same d_out: their outputs and
    every gradient equal bit for bit at each step. Returns the inputs."""
    import torch
    gen = torch.Generator().manual_seed(fresh_seed())
    a = torch_reference.make_inputs(c, gen)
    with torch.no_grad():
        for n, p in first.named_parameters():
            p.copy_(a[n])
            getattr(second, n).copy_(a[n])
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    steps = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (first, second)]
    for step in range(2):
        outs, grads = [], []
        for m in (first, second):
            m.zero_grad()
            out = m(a["x"], a["top_experts"], a["router_weights"])
            out.backward(d_out)
            outs.append(out)
            grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[1]), f"step {step}: the outputs differ"
        for n in grads[1]:
            assert torch.equal(grads[0][n], grads[1][n]), f"step {step}: d_{n} differs"
        for opt in steps:
            opt.step()
    return a


def test_fp8_torch_module_with_quantized_weight_inputs_refreshes_them():
    """mok.torch.MoELayer on a training layer compiled with
    fp8_quantized_weights: the module's bf16 parameters, quantized by the
    layer's wrapper (both layouts) and refreshed after an optimizer step,
    give bitwise the output and gradients of the module whose kernels
    quantize the weights themselves, before and after the step."""
    import torch
    import mok.torch
    from bench.cases import spec_kwargs
    name = "train_fp8_shared_clamp_wgmma_given"
    c = FP8_TRAIN_CASES[name]
    spec = mok.LayerSpec(**spec_kwargs(c))
    given = mok.torch.MoELayer(spec, target="sm_90a", artifact=training_artifact(name))
    itself = mok.torch.MoELayer(spec, target="sm_90a",
                                artifact=training_artifact(name[:-len("_given")]))
    a = _train_alike(c, given, itself)
    assert not torch.equal(given.gate_weights, torch.as_tensor(a["gate_weights"]))


def test_fp8_quantize_kernel_is_the_torch_quantizer_bit_for_bit():
    """mok.ops.fp8_quantize of a CUDA weight runs mok's compiled quantizer
    (moe.quantize, normal and transposed, one kernel; fp8_quantizer_ir):
    bit for bit the torch operations' result on the same weight on the CPU
    (itself bit-exact to the float64 model, test_trainers.py), for fresh
    random blocks of every magnitude with zero, subnormal, NaN and infinite
    blocks, into poisoned out tensors whose addresses it keeps, and for
    one layout alone."""
    import torch
    import mok.ops
    gen = torch.Generator().manual_seed(fresh_seed())
    e, rows, cols = 3, 384, 512
    mag = torch.exp2(torch.randint(-60, 60, (e, rows // 128, 1, cols // 128, 1),
                                   generator=gen).float())
    w = (torch.randn(e, rows // 128, 128, cols // 128, 128, generator=gen) * mag)
    w = w.reshape(e, rows, cols).to(torch.bfloat16)
    w[0, :128, :128] = 0.0                       # a zero block
    w[0, 5, 300] = float("nan")                  # a NaN block
    w[1, 200, 10] = float("-inf")                # an infinite block
    w[2, 130, 140:150] = torch.tensor(1e-40).to(torch.bfloat16)  # subnormals
    w[2, 131, 140] = -0.0
    want = mok.ops.fp8_quantize(w, True, True)   # the CPU: torch operations
    wc = w.cuda()
    before = len(mok.ops._QUANTIZERS)
    out = tuple(torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in want)
    for t in out:
        t.view(torch.uint8).fill_(0x7F)          # poisoned: NaN codes and NaN scales
    ptrs = [t.data_ptr() for t in out]
    got = mok.ops.fp8_quantize(wc, True, True, out=out)
    torch.cuda.synchronize()
    assert len(mok.ops._QUANTIZERS) == before + 1, "the compiled quantizer did not run"
    assert [t.data_ptr() for t in got] == ptrs
    names = ("values", "scales", "values_T", "scales_T")
    for n, a, b in zip(names, got, want):
        a, b = a.cpu().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
        bad = (a != b).nonzero()
        assert len(bad) == 0, f"{n}: {len(bad)} bytes differ, first at {int(bad[0])}"
    # One layout: the kernel of that layout alone.
    v, s, vt, st = mok.ops.fp8_quantize(wc, normal=False, transposed=True)
    assert v is None and s is None
    assert torch.equal(vt.cpu().view(torch.uint8), want[2].view(torch.uint8))
    assert torch.equal(st.cpu().view(torch.int32), want[3].view(torch.int32))


def test_fp8_quantize_kernel_takes_unaligned_weights_and_outs():
    """The compiled quantizer on a weight that does not start on a 16-byte
    boundary (a view into a flat buffer, as trainers keep parameters): its
    scalar form, bitwise the torch quantizer's; an `out` tensor that is not
    16-byte aligned goes to the torch path (the kernel's outputs are), with
    the same bytes."""
    import torch
    import mok.ops
    gen = torch.Generator().manual_seed(fresh_seed())
    shape = (2, 256, 384)
    n = shape[0] * shape[1] * shape[2]
    flat = torch.empty(n + 8, dtype=torch.bfloat16, device="cuda")
    w = flat[1:1 + n].view(shape)                # 2 bytes past a 16-byte boundary
    w.copy_((torch.randn(shape, generator=gen) * 300).to(torch.bfloat16))
    w[1, 7, 9] = float("inf")
    want = mok.ops.fp8_quantize(w.cpu(), True, True)
    got = mok.ops.fp8_quantize(w, True, True)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    before = len(mok.ops._QUANTIZERS)
    raw = torch.empty(shape[0] * shape[1] * shape[2] + 16, dtype=torch.uint8, device="cuda")
    values = raw[1:1 + n].view(torch.float8_e4m3fn).view(shape)
    out = (values, torch.empty_like(got[1]), torch.empty_like(got[2]), torch.empty_like(got[3]))
    mok.ops.fp8_quantize(w, True, True, out=out)
    torch.cuda.synchronize()
    assert len(mok.ops._QUANTIZERS) == before
    for a, b in zip(out, want):
        assert torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def test_fp8_torch_module_compiles_its_fastest_form():
    """mok.torch.MoELayer of an "fp8" spec on sm_90a, compiling its own
    kernels: the training layer with fp8_quantized_weights and
    warp_specialize (the fastest form), the module quantizing its weights
    (Fp8WeightsTrainingLayer): the same outputs and gradients, bit for bit,
    as the module given train_fp8_given_ws's artifact (those options), over
    two SGD steps."""
    import torch
    import mok.torch
    from mok._gpu_train import Fp8WeightsTrainingLayer
    from bench.cases import spec_kwargs
    name = "train_fp8_given_ws"
    c = FP8_TRAIN_CASES[name]
    spec = mok.LayerSpec(**spec_kwargs(c))
    own = mok.torch.MoELayer(spec, target="sm_90a")
    assert isinstance(own.layer, Fp8WeightsTrainingLayer)
    given = mok.torch.MoELayer(spec, target="sm_90a", artifact=training_artifact(name))
    _train_alike(c, own, given)
