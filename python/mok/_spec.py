# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A MoE layer described by its sizes; turned into moe IR for the compiler."""
from dataclasses import dataclass
from typing import Optional
import math


# The largest size (and routed row count) a layer may have.
MAX_SIZE = 2**31 - 1

# The capacity of a GPU layer compiled for any token count (tokens=None)
# when LayerSpec.max_tokens is not given.
DEFAULT_MAX_TOKENS = 8192


def _positive_finite(v):
    """Whether `v` is an int or float > 0 that a float holds finitely."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        v = float(v)
    except OverflowError:  # an int past the largest float
        return False
    return v > 0 and math.isfinite(v)


@dataclass(frozen=True)
class LayerSpec:
    """One MoE layer (one expert-parallel rank).

    hidden, intermediate: H and I of the routed experts.
    experts: global routed expert count E; top_k routes per token.
    tokens: T, or None to compile for any token count.
    max_tokens: with tokens=None, the capacity: the largest T a call may
    have (a GPU layer's buffers are sized for it; a call with more tokens
    is refused by name). None: DEFAULT_MAX_TOKENS (8192) on the GPU
    targets, no bound on the CPU target.
    shared_intermediate: I of the shared expert, or None for no shared expert.
    swiglu_limit: clamp of the SwiGLU, or None for no clamp.
    padding: each expert's rows are padded to a multiple of this (power of 2).
    ep: expert-parallel group size N: each rank holds E/N local experts
    (docs/ExpertParallel.md). The CPU target runs a group of N ranks in
    one process; the GPU targets compile one rank's kernels (forward, and
    with training=True the training forward and backward), loaded with a
    communicator of N ranks.
    expert_id_dtype: "int32" or "int64", the dtype of top_experts.
    recv_capacity (ep > 1): the most routes one rank's experts may receive
    in one call, from all ranks together; it sizes a rank's receive
    buffers (docs/ExpertParallel.md), and routing past it is an error
    naming it. None: as many as can be sent, ep * T * min(top_k, E/ep)
    with T the fixed token count or max_tokens (no bound on the CPU target
    when neither is given).

    precision: the routed experts' arithmetic: "bf16" (the default), or FP8
    with block-scaled E4M3 operands, "mxfp8" (E8M0 scales over 1 x 32
    blocks) or "fp8" (f32 scales: 1 x 128 activations, 128 x 128 weights),
    as moe.layer's `precision` defines it (docs/FP8.md); the padding must
    then be a multiple of 32 ("mxfp8") or 128 ("fp8"). FP8 layers run on
    the CPU target (forward and backward) for now.

    Every size is at most 2**31 - 1 (MAX_SIZE), and so is the routed row
    count tokens*top_k + (experts/ep)*(padding - 1) (its part without
    tokens when tokens is None): the compiler's index arithmetic wraps past
    that. A field out of range is a ValueError naming it.
    """
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    tokens: Optional[int] = None
    shared_intermediate: Optional[int] = None
    swiglu_limit: Optional[float] = None
    padding: int = 1
    ep: int = 1
    expert_id_dtype: str = "int32"
    max_tokens: Optional[int] = None
    recv_capacity: Optional[int] = None
    precision: str = "bf16"

    def __post_init__(self):
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SIZE:
                raise ValueError(f"LayerSpec.{name}: expected a positive int up to "
                                 f"{MAX_SIZE}, got {v!r}")
        for name in ("hidden", "intermediate", "experts", "top_k", "padding", "ep"):
            positive(name)
        if self.shared_intermediate is not None:
            positive("shared_intermediate")
        if self.tokens is not None and (not isinstance(self.tokens, int)
                                        or isinstance(self.tokens, bool)
                                        or not 0 <= self.tokens <= MAX_SIZE):
            raise ValueError(f"LayerSpec.tokens: expected None or an int from 0 to "
                             f"{MAX_SIZE}, got {self.tokens!r}")
        if self.max_tokens is not None:
            positive("max_tokens")
            if self.tokens is not None:
                raise ValueError(f"LayerSpec.max_tokens: the capacity of a layer for any "
                                 f"token count (tokens=None); tokens = {self.tokens} is "
                                 f"fixed, got max_tokens = {self.max_tokens}")
        if self.top_k > self.experts:
            raise ValueError(f"LayerSpec.top_k: expected at most experts = {self.experts}, "
                             f"got {self.top_k}")
        if self.experts % self.ep:
            raise ValueError(f"LayerSpec.ep: experts = {self.experts} must be divisible "
                             f"by ep, got {self.ep}")
        if self.padding & (self.padding - 1):
            raise ValueError(f"LayerSpec.padding: expected a power of two, got {self.padding}")
        tokens = self.tokens or self.max_tokens or 0
        which = "tokens" if self.tokens is not None or self.max_tokens is None else "max_tokens"
        if tokens * self.top_k > MAX_SIZE:
            raise ValueError(f"LayerSpec.{which}: {which}*top_k = {tokens}*{self.top_k} "
                             f"routes exceed {MAX_SIZE}")
        rows = tokens * self.top_k + self.local_experts * (self.padding - 1)
        if rows > MAX_SIZE:
            raise ValueError(f"LayerSpec.padding: the routed rows, tokens*top_k + "
                             f"(experts/ep)*(padding - 1) = {rows}, exceed {MAX_SIZE}")
        if self.swiglu_limit is not None and not _positive_finite(self.swiglu_limit):
            raise ValueError("LayerSpec.swiglu_limit: expected None or a positive "
                             f"finite number, got {self.swiglu_limit!r}")
        if self.expert_id_dtype not in ("int32", "int64"):
            raise ValueError("LayerSpec.expert_id_dtype: expected 'int32' or 'int64', "
                             f"got {self.expert_id_dtype!r}")
        if self.precision not in ("bf16", "mxfp8", "fp8"):
            raise ValueError("LayerSpec.precision: expected 'bf16', 'mxfp8' or 'fp8', "
                             f"got {self.precision!r}")
        if self.precision != "bf16":
            block = 32 if self.precision == "mxfp8" else 128
            for name in ("hidden", "intermediate"):
                if getattr(self, name) % block:
                    raise ValueError(f"LayerSpec.{name}: precision {self.precision!r} needs "
                                     f"a multiple of its block size {block}, got "
                                     f"{getattr(self, name)}")
            if self.padding % block:
                raise ValueError(f"LayerSpec.padding: precision {self.precision!r} trains "
                                 f"with blocks of {block} routed rows, which the padding "
                                 f"keeps inside an expert's rows: expected a multiple of "
                                 f"{block}, got {self.padding}")
        if self.recv_capacity is not None:
            positive("recv_capacity")
            if self.ep == 1:
                raise ValueError(f"LayerSpec.recv_capacity: the receive capacity of an "
                                 f"expert-parallel rank (ep > 1); ep = 1, got "
                                 f"recv_capacity = {self.recv_capacity}")
            rows = self.recv_capacity + self.local_experts * (self.padding - 1)
            if rows > MAX_SIZE:
                raise ValueError(f"LayerSpec.recv_capacity: the routed rows it allows, "
                                 f"recv_capacity + (experts/ep)*(padding - 1) = {rows}, "
                                 f"exceed {MAX_SIZE}")

    @property
    def local_experts(self):
        return self.experts // self.ep

    def to_mlir(self, name="moe_layer"):
        """The layer as a function of one fused moe.layer."""
        t = "?" if self.tokens is None else str(self.tokens)
        h, i, e, k = self.hidden, self.intermediate, self.local_experts, self.top_k
        ids = "i32" if self.expert_id_dtype == "int32" else "i64"
        args = [("x", f"tensor<{t}x{h}xbf16>"),
                ("top_experts", f"tensor<{t}x{k}x{ids}>"),
                ("router_weights", f"tensor<{t}x{k}xf32>"),
                ("gate", f"tensor<{e}x{i}x{h}xbf16>"),
                ("up", f"tensor<{e}x{i}x{h}xbf16>"),
                ("down", f"tensor<{e}x{h}x{i}xbf16>")]
        shared = ""
        if self.shared_intermediate is not None:
            s = self.shared_intermediate
            args += [("shared_gate", f"tensor<{s}x{h}xbf16>"),
                     ("shared_up", f"tensor<{s}x{h}xbf16>"),
                     ("shared_down", f"tensor<{h}x{s}xbf16>")]
            shared = " shared(%shared_gate, %shared_up, %shared_down)"
        entries = []
        if self.swiglu_limit is not None:
            entries.append(f"swiglu_limit = {float(self.swiglu_limit):.9e} : f32")
        if self.precision != "bf16":
            entries.append(f'precision = "{self.precision}"')
        attrs = f" {{{', '.join(entries)}}}" if entries else ""
        out = f"tensor<{t}x{h}xbf16>"
        signature = ", ".join(f"%{n}: {ty}" for n, ty in args)
        types = ", ".join(ty for _, ty in args)
        capacity = (f", max_tokens = {self.max_tokens}" if self.max_tokens is not None
                    else "")
        if self.recv_capacity is not None:
            capacity += f", recv_capacity = {self.recv_capacity}"
        plan = (f"!moe.plan<tokens = {t}, top_k = {k}, experts = {self.experts}, "
                f"ep = {self.ep}, padding = {self.padding}{capacity}>")
        return (
            f"func.func @{name}({signature}) -> {out} {{\n"
            f"  %out = moe.layer %x, %top_experts, %router_weights, gate %gate, "
            f"up %up, down %down{shared}\n"
            f"      plan {plan}{attrs}\n"
            f"      : ({types}) -> {out}\n"
            f"  return %out : {out}\n"
            f"}}\n")
