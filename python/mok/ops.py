# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.ops: the tensor operations NeMo AutoModel's MoK backend calls for
``precision: mxfp8``, and their ``precision="fp8"`` counterpart.

``fp8_quantize(w, normal, transposed)`` is the same for mok's ``"fp8"``
weights (docs/FP8.md): E4M3 data with one f32 scale ``amax / 448`` per
128 x 128 block (1 for a block of zeros, NaN and NaN elements for a block
holding a NaN or an infinity), bit-exact to ``mok.fp8.quantize(w, (128,
128), "f32")``; scales f32 [E, rows / 128, cols / 128]. Its blocks are
square, so the transposed layout is the normal one transposed, values and
scales alike. A weight on an sm_90a or sm_100a device is quantized by
mok's compiled quantizer (the moe.quantize ops of ``fp8_quantizer_ir``,
one kernel for both layouts); others by torch operations.

``mxfp8_quantize(w, normal, transposed)`` quantizes a bf16 routed weight
[E, rows, cols] to MXFP8 (E4M3 data, one E8M0 scale per 32 consecutive
elements of a row), in the normal layout (blocks along ``cols``) and/or the
transposed one (the quantization of ``w.transpose(-1, -2)``: [E, cols,
rows], blocks along ``rows``), with moe.quantize's exact rules
(docs/FP8.md): scale exponent ``e = max(ceil(log2(amax / 448)), -127)``,
stored as the byte ``e + 127``; elements ``E4M3(x * 2^-e)`` rounded to
nearest even; a block holding a NaN or an infinity gets the scale byte
0xFF and NaN elements. It runs where ``w`` is (CPU or CUDA, torch
operations, no compile) and is bit-exact to ``mok.fp8.quantize``.

The layouts are mok's (AutoModel treats them as opaque): values
``torch.float8_e4m3fn`` of the quantized matrix's shape, scales ``uint8``
[E, rows', cols' / 32] in the same row order. mok.functional takes the
tuples in place of the routed weights: ``(values, scales)`` of the normal
layout in ``forward``; in ``backward`` gate and up as ``(values, scales,
values_T, scales_T)`` and down as ``(values_T, scales_T)``.
"""
import atexit
import threading

import torch

from ._compile import compile as _compile
from ._gpu import chip_of, compiles_for

__all__ = ["fp8_kernel_weights", "fp8_quantize", "fp8_quantizer_ir", "mxfp8_dequantize",
           "mxfp8_quantize", "mxfp8_scale_atoms"]

BLOCK = 32
_E4M3_MAX = 448.0


def _quantize_rows(w):
    """(values float8_e4m3fn, scales uint8) of `w` [..., cols], blocks of
    32 along the last dimension."""
    x = w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    finite = torch.isfinite(x).all(dim=-1)
    amax = torch.where(finite, x.abs().amax(dim=-1), torch.zeros((), device=x.device))
    # amax = m * 2^p, m in [0.5, 1): amax / 448 = (2m / 1.75) * 2^(p - 9),
    # so ceil(log2(amax / 448)) = p - 9, plus one where 2m > 1.75.
    mantissa, exponent = torch.frexp(amax)
    e = exponent - 9 + (mantissa > 0.875).to(exponent.dtype)
    e = torch.where(amax == 0, torch.full_like(e, -127), e).clamp(min=-127)
    # x * 2^-e is exact (a power of two; where it would leave f32's normal
    # range the value is far below E4M3's smallest and rounds to zero), and
    # at most 448, so the conversion's one rounding is E4M3's, saturation
    # never needed.
    scaled = torch.ldexp(x, (-e).unsqueeze(-1).to(torch.float32))
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    nan = (torch.signbit(x).to(torch.uint8) << 7) | 0x7F
    codes = torch.where(finite.unsqueeze(-1), codes, nan)
    scales = torch.where(finite, (e + 127).to(torch.uint8),
                         torch.full_like(e, 0xFF, dtype=torch.uint8))
    return codes.reshape(w.shape).view(torch.float8_e4m3fn), scales


def _check_weight(weight, block, why):
    """`weight` a bf16 [E, rows, cols], rows and cols multiples of `block`
    (`why`: what the block is, for the error)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a bf16 tensor [E, rows, cols], got "
                        f"{type(weight).__name__}")
    if weight.dtype != torch.bfloat16 or weight.dim() != 3:
        raise ValueError(f"weight: expected a bf16 tensor [E, rows, cols], got "
                         f"{str(weight.dtype).replace('torch.', '')} of shape "
                         f"{list(weight.shape)}")
    for axis, name in ((1, "rows"), (2, "cols")):
        if weight.shape[axis] % block:
            raise ValueError(f"weight: {name} = {weight.shape[axis]} is not a multiple of "
                             f"{block} ({why})")


def _layouts(weight, normal, transposed, scales_of):
    """(dtype, shape) of each of the four results (None: not asked for);
    `scales_of(e, rows, cols)`: the (dtype, shape) of the scales of values
    [e, rows, cols]."""
    e, rows, cols = weight.shape
    f8 = torch.float8_e4m3fn
    return ([(f8, [e, rows, cols]), scales_of(e, rows, cols)] if normal else
            [None, None]) + ([(f8, [e, cols, rows]), scales_of(e, cols, rows)]
                             if transposed else [None, None])


def _check_call(weight, normal, transposed, out, block, why, scales_of):
    """A quantizer's arguments, each error naming its argument."""
    _check_weight(weight, block, why)
    for name, flag in (("normal", normal), ("transposed", transposed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected True or False, got {flag!r}")
    if not (normal or transposed):
        raise ValueError("normal, transposed: both False; ask for at least one layout")
    if out is not None:
        _check_out(out, weight, _layouts(weight, normal, transposed, scales_of))


def _into(out, result):
    """`result`, or with `out` its tensors' bytes written into out's."""
    if out is None:
        return result
    for dst, src in zip(out, result):
        if src is None:
            continue
        if dst.dtype == src.dtype:
            # (A size-1 dimension may carry any stride, which a byte view
            # refuses: the transposed scales of a weight of 128 rows.)
            dst.copy_(src)
        else:
            dst.view(torch.uint8).copy_(src.view(torch.uint8))
    return tuple(out)


def _check_out(out, weight, layouts):
    names = ("values", "scales", "values_T", "scales_T")
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise TypeError("out: expected a tuple of 4 (values, scales, values_T, scales_T), "
                        "as the quantizer returns")
    for name, t, layout in zip(names, out, layouts):
        if layout is None:
            continue
        dtype, shape = layout
        if (not isinstance(t, torch.Tensor) or t.dtype != dtype or list(t.shape) != shape
                or not t.is_contiguous()):
            got = (f"{str(t.dtype).replace('torch.', '')} of shape {list(t.shape)}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"out: {name}: expected a contiguous "
                             f"{str(dtype).replace('torch.', '')} tensor of shape {shape}, "
                             f"got {got}")
        if t.device != weight.device:
            raise ValueError(f"out: {name}: on {t.device}, the weight on {weight.device}")


def mxfp8_quantize(weight, normal=True, transposed=False, *, out=None):
    """(values, scales, values_T, scales_T) of the bf16 routed weight
    `weight` [E, rows, cols]: the normal layout (values float8_e4m3fn
    [E, rows, cols], scales uint8 [E, rows, cols / 32]) if `normal`, the
    transposed one (values [E, cols, rows], scales [E, cols, rows / 32])
    if `transposed`; None for a layout not asked for. Nothing of `weight`
    is modified.

    `out`: the tuple of an earlier call (or tensors of its dtypes and
    shapes): the layouts asked for are written into it in place and it is
    returned, so the quantized weights keep their addresses when they are
    refreshed after an optimizer step. That refresh is device work only
    (no host synchronization), and so may be captured into a CUDA graph."""
    _check_call(weight, normal, transposed, out, BLOCK,
                "an MXFP8 block is 32 elements, along cols in the normal layout and "
                "along rows in the transposed one",
                lambda e, rows, cols: (torch.uint8, [e, rows, cols // BLOCK]))
    with torch.no_grad():
        result = (None, None)
        if normal:
            result = _quantize_rows(weight.contiguous())
        result += (_quantize_rows(weight.transpose(-1, -2).contiguous()) if transposed
                   else (None, None))
        return _into(out, result)


def mxfp8_scale_atoms(scales, *, out=None):
    """The E8M0 scales of mxfp8_quantize ([E, rows, cols / 32] uint8, one
    byte a 32-block of a row) in tcgen05's scale-factor layout, as mok's
    MXFP8 GPU layers compiled with fp8_quantized_weights take them: uint8
    [E, rows / 128, cols / 128, 512], row r's byte of block j (of the 4 in
    its 128 columns) at (r % 32) * 16 + (r % 128) // 32 * 4 + j of its
    atom (rows and cols multiples of 128). `out`: a tensor of that shape
    written in place and returned (device work only)."""
    if (not isinstance(scales, torch.Tensor) or scales.dtype != torch.uint8
            or scales.dim() != 3 or scales.shape[1] % 128 or scales.shape[2] % 4):
        got = (f"{scales.dtype} of shape {list(scales.shape)}"
               if isinstance(scales, torch.Tensor) else type(scales).__name__)
        raise ValueError(f"scales: expected MXFP8 scales uint8 [E, rows, cols / 32] with rows "
                         f"and cols multiples of 128, got {got}")
    e, rows, blocks = scales.shape
    # [E, rows/128, 4 (r % 128 // 32), 32 (r % 32), cols/128, 4 (j)] ->
    # [E, rows/128, cols/128, 32, 4, 4]: byte (r % 32) * 16 + (r % 128 // 32) * 4 + j.
    atoms = (scales.reshape(e, rows // 128, 4, 32, blocks // 4, 4)
             .permute(0, 1, 4, 3, 2, 5).reshape(e, rows // 128, blocks // 4, 512))
    if out is None:
        return atoms.contiguous()
    want = [e, rows // 128, blocks // 4, 512]
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.uint8
            or list(out.shape) != want or out.device != scales.device):
        raise ValueError(f"out: expected a uint8 tensor of shape {want} on {scales.device}")
    return out.copy_(atoms)


FP8_BLOCK = 128


def _quantize_blocks(w):
    """(values float8_e4m3fn, scales float32 [E, rows / 128, cols / 128])
    of `w` [E, rows, cols], 128 x 128 blocks, f32 scales. Few passes over
    the weight, on views of its own layout (no permuted copies): the block
    maxima, the quotients, the codes."""
    e, rows, cols = w.shape
    b = FP8_BLOCK
    x = w.view(e, rows // b, b, cols // b, b)  # block (i, j): x[:, i, :, j, :]
    # amax = max |x| of a block, from its largest and smallest values (exact
    # in bf16): NaN if it holds a NaN (amax and maximum propagate them),
    # +inf if an infinity; finite otherwise.
    amax = torch.maximum(x.amax(dim=(2, 4)), -x.amin(dim=(2, 4))).float()
    finite = amax < float("inf")
    # s = f32(amax / 448) (an IEEE division), 1 for a block of zeros. The
    # divisor is a tensor: CUDA torch turns a division by a Python number
    # into a multiplication by its reciprocal, which can differ in the last
    # bit.
    s = torch.where(amax == 0, torch.ones_like(amax),
                    amax / torch.full_like(amax, _E4M3_MAX))
    # E4M3(f32(x / s)): the quotient of x (bf16, promoted exactly) and s
    # rounded once to f32, then to E4M3 to nearest even; clamped first, as
    # torch's conversion gives NaN past 448 where the definition saturates
    # (a quotient at most a rounding above 448, which rounds to 448 either
    # way).
    q = x / s[:, :, None, :, None]
    q.clamp_(-_E4M3_MAX, _E4M3_MAX)
    codes = q.to(torch.float8_e4m3fn).view(torch.uint8)
    del q
    # A block that is not finite: 0x7F with each element's sign.
    nan = (torch.signbit(x).view(torch.uint8) << 7) | 0x7F
    codes = torch.where(finite[:, :, None, :, None], codes, nan)
    scales = torch.where(finite, s, torch.full_like(s, float("nan")))
    return codes.view(torch.float8_e4m3fn).reshape(e, rows, cols), scales


# The compiled quantizers, loaded: {(shape, normal, transposed, device): layer}.
_QUANTIZERS = {}
_QUANTIZERS_LOCK = threading.Lock()
atexit.register(_QUANTIZERS.clear)  # (before the runtime extension's teardown)


def fp8_quantizer_ir(shape, normal=True, transposed=False, function="fp8_quantize"):
    """The moe IR of fp8_quantize for a bf16 weight of `shape` [E, rows,
    cols]: `function`, whose moe.quantize ops (128 x 128 blocks, f32
    scales; with `transpose` for the transposed layout) the GPU targets
    compile into one kernel (docs/FP8.md)."""
    b = FP8_BLOCK
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                       for d in shape)):
        raise ValueError(f"shape: expected [E, rows, cols], three positive ints, got {shape!r}")
    e, rows, cols = shape
    for name, size in (("rows", rows), ("cols", cols)):
        if size % b:
            raise ValueError(f"shape: {name} = {size} is not a multiple of {b} (an fp8 "
                             "weight block is 128 x 128)")
    for name, flag in (("normal", normal), ("transposed", transposed)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected True or False, got {flag!r}")
    if not (normal or transposed):
        raise ValueError("normal, transposed: both False; ask for at least one layout")
    if not isinstance(function, str) or not function.isidentifier():
        raise ValueError(f"function: expected a function name (an identifier), got "
                         f"{function!r}")
    w = f"tensor<{e}x{rows}x{cols}xbf16>"
    layouts = ([("", rows, cols)] if normal else []) + \
        ([(", transpose", cols, rows)] if transposed else [])
    types, body, results = [], [], []
    for i, (attr, r, c) in enumerate(layouts):
        vt = f"tensor<{e}x{r}x{c}xf8E4M3FN>"
        st = f"tensor<{e}x{r // b}x{c // b}xf32>"
        body.append(f"  %q{i}, %s{i} = moe.quantize %w {{block = array<i64: {b}, {b}>{attr}}}"
                    f" : {w} -> {vt}, {st}")
        types += [vt, st]
        results += [f"%q{i}", f"%s{i}"]
    return (f"func.func @{function}(%w: {w}) -> ({', '.join(types)}) {{\n"
            + "\n".join(body)
            + f"\n  return {', '.join(results)} : {', '.join(types)}\n}}\n")


def _fp8_quantize_compiled(weight, normal, transposed, out):
    """fp8_quantize on a CUDA weight: mok's compiled quantizer kernel
    (compiled once a shape, from the on-disk cache after), writing into
    `out` when given."""
    device = weight.device
    key = (tuple(weight.shape), normal, transposed, device)
    with _QUANTIZERS_LOCK:
        layer = _QUANTIZERS.get(key)
        if layer is None:
            art = _compile(fp8_quantizer_ir(tuple(weight.shape), normal, transposed),
                           target=chip_of(device), function="fp8_quantize")
            layer = _QUANTIZERS[key] = art.load(device=device.index)
    names = ("values", "scales", "values_t", "scales_t")
    asked = (normal, normal, transposed, transposed)
    outputs = None
    if out is not None:
        outputs = {n: t for n, t, a in zip(names, out, asked) if a}
    with torch.no_grad():
        got = layer(weight.contiguous(), outputs=outputs)
    if out is not None:  # (as _into: the caller's tuple, the asked layouts written)
        return tuple(out)
    return tuple(got[n] if a else None for n, a in zip(names, asked))


def fp8_quantize(weight, normal=True, transposed=False, *, out=None):
    """(values, scales, values_T, scales_T) of the bf16 routed weight
    `weight` [E, rows, cols] in mok's "fp8" format: the normal layout
    (values float8_e4m3fn [E, rows, cols], scales float32 [E, rows / 128,
    cols / 128]) if `normal`, the transposed one (the quantization of
    ``weight.transpose(-1, -2)``: values [E, cols, rows], scales [E, cols /
    128, rows / 128]) if `transposed`; None for a layout not asked for.
    Bit-exact to ``mok.fp8.quantize(w, (128, 128), "f32")``; runs where
    `weight` is: on an sm_90a or sm_100a device as mok's compiled
    quantizer (one kernel for both layouts, compiled for the weight's
    shape at the first call and cached on disk as mok.compile's layers
    are; fp8_quantizer_ir is its IR), on the CPU and other devices (and
    for an `out` tensor not 16-byte aligned or requiring grad) as torch
    operations. `out`: as for
    mxfp8_quantize, the tuple of an earlier call, refreshed in place
    (addresses kept; device work only, so a CUDA graph may capture it once
    the kernel is loaded)."""
    b = FP8_BLOCK
    _check_call(weight, normal, transposed, out, b, "an fp8 weight block is 128 x 128",
                lambda e, rows, cols: (torch.float32, [e, rows // b, cols // b]))
    if (weight.is_cuda and compiles_for(weight.device)
            and _kernel_takes(out, (normal, normal, transposed, transposed))):
        return _fp8_quantize_compiled(weight, normal, transposed, out)
    return _fp8_quantize_torch(weight, normal, transposed, out)


def _kernel_takes(out, asked):
    """Whether the compiled quantizer can write into `out` (checked by
    _check_out), the layouts `asked` of its four: each tensor 16-byte
    aligned (the kernel's outputs start on a 16-byte boundary) and not
    requiring grad; otherwise fp8_quantize takes the torch path, which
    writes anywhere."""
    return out is None or all(
        t.data_ptr() % 16 == 0 and not t.requires_grad for t, a in zip(out, asked) if a)


def _fp8_quantize_torch(weight, normal, transposed, out):
    """fp8_quantize as torch operations (its CPU form; on CUDA the
    baseline bench.fp8_refresh times the compiled quantizer against)."""
    with torch.no_grad():
        values, scales = _quantize_blocks(weight.contiguous())
        result = (values, scales) if normal else (None, None)
        # Square blocks: the transposed weight's blocks are the transposed
        # blocks, with the same amax.
        result += ((values.transpose(-1, -2).contiguous(),
                    scales.transpose(-1, -2).contiguous()) if transposed else (None, None))
        return _into(out, result)


def fp8_kernel_weights(weight, precision="fp8", normal=True, transposed=False, *, out=None):
    """(values, scales, values_T, scales_T) of the bf16 routed weight
    `weight` as mok's kernels compiled with fp8_quantized_weights take them
    (gate_q, gate_scale, gate_qt, gate_scale_t, ...): fp8_quantize's for
    precision "fp8"; for "mxfp8" mxfp8_quantize's with the scales in
    tcgen05's atoms (mxfp8_scale_atoms). `out`: the tuple of an earlier
    call, refreshed in place (device work only)."""
    if precision == "fp8":
        return fp8_quantize(weight, normal, transposed, out=out)
    if precision != "mxfp8":
        raise ValueError(f"precision: expected 'fp8' or 'mxfp8', got {precision!r}")
    v, s, vt, st = mxfp8_quantize(weight, normal, transposed)
    result = (v, None if s is None else mxfp8_scale_atoms(s),
              vt, None if st is None else mxfp8_scale_atoms(st))
    if out is not None:
        for i, (dst, src) in enumerate(zip(out, result)):
            if src is not None and (not isinstance(dst, torch.Tensor) or dst.dtype != src.dtype
                                    or dst.shape != src.shape or dst.device != src.device):
                raise ValueError(f"out: element {i}: expected a {src.dtype} tensor of shape "
                                 f"{list(src.shape)} on {src.device}")
    return _into(out, result)


def mxfp8_dequantize(values, scales, name="weight"):
    """bf16 [..., rows, cols] of MXFP8 `values` (float8_e4m3fn) and their
    `scales` (uint8 [..., rows, cols / 32]): each element value * 2^(s -
    127) multiplied in f32, rounded to bf16 (moe.dequantize's rule; a NaN
    scale byte 0xFF gives NaN). For every block whose scale exponent s -
    127 is at least -124 (amax above about 1e-35) the product is exact in
    bf16, and quantizing the result again dequantizes to the same values
    (its scale one lower, the codes doubled, where a block's largest value
    rounded down to 224 * 2^e). `name` names the tuple in errors."""
    if not isinstance(values, torch.Tensor) or values.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name}: expected MXFP8 values (a float8_e4m3fn tensor), got "
                        f"{getattr(values, 'dtype', type(values).__name__)}")
    if values.dim() < 2 or values.shape[-1] % BLOCK:
        raise ValueError(f"{name}: MXFP8 values of shape {list(values.shape)}: expected "
                         f"[..., rows, cols] with cols a multiple of {BLOCK}")
    want = [*values.shape[:-1], values.shape[-1] // BLOCK]
    if (not isinstance(scales, torch.Tensor) or scales.dtype != torch.uint8
            or list(scales.shape) != want):
        got = (f"{str(scales.dtype).replace('torch.', '')} of shape {list(scales.shape)}"
               if isinstance(scales, torch.Tensor) else type(scales).__name__)
        raise ValueError(f"{name}: expected MXFP8 scales uint8 {want} beside values of shape "
                         f"{list(values.shape)}, got {got}")
    if scales.device != values.device:
        raise ValueError(f"{name}: scales on {scales.device}, values on {values.device}")
    with torch.no_grad():
        v = values.float().reshape(*want, BLOCK)
        s = scales.to(torch.int32) - 127
        w = torch.ldexp(v, s.unsqueeze(-1).to(torch.float32)).to(torch.bfloat16)
        # A NaN scale: bf16's quiet NaN 0x7FC0, as moe.dequantize gives.
        nan = torch.full_like(w.view(torch.int16), 0x7FC0)
        bits = torch.where((scales == 0xFF).unsqueeze(-1), nan, w.view(torch.int16))
        return bits.view(torch.bfloat16).reshape(values.shape)
