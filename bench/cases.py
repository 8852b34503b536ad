# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The layers the GPU tests run: compiled where the compiler is
(`python3 -m bench.compile tests DIR`), run on the GPU machine by
python/tests/gpu."""

CASES = {
    # Qwen3-30B-A3B-like sizes, skewed (Zipf) routing: ragged expert loads,
    # many experts without tokens.
    "qwen3_ragged": dict(tokens=300, hidden=2048, intermediate=768, experts=128,
                         top_k=8, padding=128, routing="zipf"),
    # DeepSeek-V3-like sizes on one GPU (32 experts), shared expert.
    "dsv3_shared": dict(tokens=256, hidden=7168, intermediate=2048, experts=32,
                        top_k=8, padding=128, shared_intermediate=2048),
    # top-1 with an active clamp; T not a multiple of any tile.
    "top1_clamp": dict(tokens=129, hidden=1024, intermediate=512, experts=8,
                       top_k=1, padding=64, swiglu_limit=0.5),
    # top-2 with -1 routes and zero router weights.
    "top2_no_route": dict(tokens=200, hidden=512, intermediate=256, experts=16,
                          top_k=2, padding=16, drop=0.3, zero=0.2),
    # 64 experts, only 3 used.
    "idle_experts": dict(tokens=64, hidden=512, intermediate=256, experts=64,
                         top_k=2, padding=8, used=[3, 17, 60]),
    # shared expert with a clamp, top-4, int64 ids, no padding.
    "shared_clamp_i64": dict(tokens=100, hidden=1024, intermediate=512, experts=8,
                             top_k=4, padding=1, shared_intermediate=512,
                             swiglu_limit=1.0, expert_id_dtype="int64"),
    # Qwen sizes on the tensor-core path with an active clamp, top-2, -1
    # routes, zero router weights, padding 64 (one tile), T = 257.
    "qwen3_top2_clamp": dict(tokens=257, hidden=2048, intermediate=768, experts=128,
                             top_k=2, padding=64, swiglu_limit=0.75, drop=0.1,
                             zero=0.25),
    # one token, top-8.
    "one_token_top8": dict(tokens=1, hidden=256, intermediate=128, experts=8,
                           top_k=8, padding=32),
    # Tensor-core GEMMs with fewer k-tiles than stages (H = 192: 3 k-tiles
    # for gate/up, I = 128: 2 for down), a shared expert (two GEMMs in one
    # barrier interval): the prologue and the next task's early loads
    # cover the whole K.
    "short_k": dict(tokens=160, hidden=192, intermediate=128, experts=4, top_k=2,
                    padding=128, shared_intermediate=128),
    # A small layer with a shared expert and mok.compile's defaults (padding
    # 1: the SIMT plan), the layer compute-sanitizer first ran on.
    "small_shared": dict(tokens=300, hidden=512, intermediate=256, experts=8, top_k=2,
                         shared_intermediate=256),
}

# The tensor-core cases again with warp-specialized GEMMs (a TMA producer
# warpgroup; mok.compile(..., warp_specialize=True)): 128-row tiles with
# setmaxnreg (qwen3_ragged; dsv3_shared, two GEMMs in one barrier interval)
# and 64-row tiles (top1_clamp, qwen3_top2_clamp).
for _name in ("qwen3_ragged", "dsv3_shared", "top1_clamp", "qwen3_top2_clamp"):
    CASES["ws_" + _name] = dict(CASES[_name], warp_specialize=True)
# The default sm_90a plan fuses the dispatch into the gate/up GEMM (A rows
# copied from x by cp.async, 16 bytes a thread at a time; padding rows and
# -1 routes, qwen3_top2_clamp, copy zeros); these keep the dispatch copy
# (mok.compile(..., fuse_dispatch=False)), as warp roles do unless asked.
for _name in ("qwen3_ragged", "dsv3_shared", "top1_clamp", "qwen3_top2_clamp", "short_k"):
    CASES["copy_" + _name] = dict(CASES[_name], fuse_dispatch=False)
# Warp roles with the dispatch fused (both asked for): the producer
# warpgroup copies the rows, completing on the stages' full barriers;
# 128-row tiles with setmaxnreg (qwen3_ragged, dsv3_shared), 64-row tiles
# (top1_clamp; qwen3_top2_clamp with -1 routes), K shorter than the ring.
for _name in ("qwen3_ragged", "dsv3_shared", "top1_clamp", "qwen3_top2_clamp", "short_k"):
    CASES["wsf_" + _name] = dict(CASES[_name], warp_specialize=True, fuse_dispatch=True)
# Clusters of 2 CTAs sharing weight boxes (mok.compile(..., multicast=True)):
# gathered and TMA-loaded A, 128- and 64-row tiles, a K shorter than the
# stage ring (short_k), and task counts that leave the last pair one task
# (its second CTA runs a copy that stores nothing).
for _name in ("qwen3_ragged", "dsv3_shared", "top1_clamp", "qwen3_top2_clamp", "short_k"):
    CASES["mc_" + _name] = dict(CASES[_name], multicast=True)
CASES["mc_copy_dsv3_shared"] = dict(CASES["dsv3_shared"], multicast=True,
                                    fuse_dispatch=False)
del _name

# Training (docs/Backward.md): the training forward, which saves the
# backward context, and the backward, against float64 autograd. Nine
# layers of CASES: clamps, -1 routes and zero router weights (top2_no_route,
# qwen3_top2_clamp), idle experts, shared experts, int64 ids, one token,
# ragged Zipf routing; three again with recompute (no context saved,
# backward recomputes gate/up); and train_shared_tall below (nine layers).
TRAIN_CASES = {"train_" + n: dict(CASES[n], training=True)
               for n in ("top1_clamp", "top2_no_route", "idle_experts", "shared_clamp_i64",
                         "qwen3_top2_clamp", "one_token_top8", "short_k", "qwen3_ragged",
                         "small_shared")}
for _name in ("top2_no_route", "shared_clamp_i64", "qwen3_top2_clamp"):
    TRAIN_CASES["recompute_" + _name] = dict(CASES[_name], training=True, recompute=True)
# 128-row tiles on every tensor-core GEMM of the backward, with a shared
# expert (its weight gradients' K = T = 200, a ragged last k-tile), a clamp
# and -1 routes.
TRAIN_CASES["train_shared_tall"] = dict(tokens=200, hidden=1024, intermediate=256,
                                        experts=16, top_k=4, padding=128,
                                        shared_intermediate=256, swiglu_limit=1.0,
                                        drop=0.1, training=True)
# I = 640: 80 16-byte pieces a row, so the SwiGLU backward's lanes load 3
# pieces at a time and the row's last round is partial (80 % 96); a shared
# expert of I = 384 (48 pieces: 2 a lane, partial too).
TRAIN_CASES["train_partial_pieces"] = dict(tokens=180, hidden=512, intermediate=640,
                                           experts=8, top_k=2, padding=64,
                                           shared_intermediate=384, swiglu_limit=7.0,
                                           drop=0.05, training=True)
# The training forward's GEMMs with a producer warpgroup (warp_specialize;
# the backward's run without one): 128-row tiles, a shared expert, a clamp
# and -1 routes.
TRAIN_CASES["train_ws_shared_tall"] = dict(TRAIN_CASES["train_shared_tall"],
                                           warp_specialize=True)
del _name
# Megatron-Core's gradient accumulation in the backward kernel
# (mok.compile(..., main_grads=True): main_grad += dW, unrounded fp32):
# wgmma with 128-row tiles and a shared expert, wgmma on ragged Qwen3
# routing, and the simt plan.
MAIN_GRAD_CASES = {"maingrad_" + n[len("train_"):]: dict(TRAIN_CASES[n], main_grads=True)
                   for n in ("train_shared_tall", "train_qwen3_ragged", "train_top2_no_route")}
# And with recompute (no context saved; the backward recomputes gate/up),
# on wgmma with a clamp and -1 routes: mok.torch's default on sm_90a with
# accumulate_main_grad=True, recompute=True.
MAIN_GRAD_CASES["maingrad_recompute_qwen3_top2_clamp"] = dict(
    TRAIN_CASES["recompute_qwen3_top2_clamp"], main_grads=True)

# Bounded grid barriers (mok.compile(..., barrier_timeout_ms=...), a
# debugging mode): the SIMT and the wgmma plan, run by the hang tests
# (python/tests/gpu/test_gpu_hangs.py) on a grid too large to be resident.
for _name in ("top2_no_route", "top1_clamp"):
    CASES["timeout_" + _name] = dict(CASES[_name], barrier_timeout_ms=200)
del _name

# Any token count (LayerSpec(tokens=None, max_tokens=C)): every case above
# (forward, training, main_grad; the bounded-barrier ones aside) again as one
# layer for every T up to a capacity C = its T + 37 (no tile's multiple), run
# by python/tests/gpu/test_gpu_any_tokens.py at several T: 1, 67 (a multiple
# of no tile), the case's own T and C.
ANY_TOKENS_EXTRA = 37


def _any_tokens(case):
    return dict(case, tokens=None, max_tokens=case["tokens"] + ANY_TOKENS_EXTRA,
                fixed_tokens=case["tokens"])


ANY_TOKENS_CASES = {"anyt_" + n: _any_tokens(c)
                    for table in (CASES, TRAIN_CASES, MAIN_GRAD_CASES)
                    for n, c in table.items() if not n.startswith("timeout_")}


def call_tokens(case):
    """The token counts test_gpu_any_tokens.py runs an any-T case at."""
    cap = case["max_tokens"]
    return sorted({1, min(67, cap), case["fixed_tokens"], cap})


# Expert parallelism (ep = N): one rank's layer, run by
# python/tests/gpu/test_gpu_expert_parallel.py as N instances in one process
# on the one GPU (a local group: each kernel on its own stream, 1/N of the
# multiprocessors each), against the ep = 1 layer over all E experts (its
# twin "<name>-ep1", compiled with ep = 1) and float64. `tokens` is each
# rank's T (`rank_tokens` gives each rank's own for a layer for any T).
EP_CASES = {
    # Tensor-core GEMMs, a shared expert, 4 ranks of 8 experts.
    "ep4_shared": dict(tokens=200, hidden=1024, intermediate=512, experts=32, top_k=4,
                       padding=64, shared_intermediate=512, ep=4),
    # 2 ranks, skewed (Zipf) routing, -1 routes and zero weights, top-8.
    "ep2_skewed": dict(tokens=300, hidden=2048, intermediate=768, experts=16, top_k=8,
                       padding=128, routing="zipf", drop=0.2, zero=0.1, ep=2),
    # 8 ranks of 2 experts; only rank 0..5's experts used: ranks 6 and 7
    # receive nothing.
    "ep8_idle_ranks": dict(tokens=64, hidden=256, intermediate=128, experts=16, top_k=2,
                           padding=64, used=list(range(12)), ep=8),
    # Scalar GEMMs (H = 96 fits no tile), a clamp, int64 ids.
    "ep4_simt_clamp": dict(tokens=50, hidden=96, intermediate=48, experts=8, top_k=2,
                           padding=8, swiglu_limit=1.0, expert_id_dtype="int64", ep=4),
    # Any T: each rank its own T (1, 67, the capacity, 20).
    "ep4_any_tokens": dict(tokens=None, max_tokens=128, rank_tokens=[1, 67, 128, 20],
                           hidden=512, intermediate=256, experts=16, top_k=2, padding=64,
                           shared_intermediate=256, ep=4),
    # A receive capacity below what skewed routing sends one rank: refused
    # by name on every rank.
    "ep2_capacity": dict(tokens=64, hidden=256, intermediate=128, experts=8, top_k=2,
                         padding=64, used=[0, 1], ep=2, recv_capacity=40),
}

# Expert-parallel training (forward with the saved context, backward): run
# by test_gpu_expert_parallel.py as a group like EP_CASES, against the
# ep = 1 training layer over every rank's tokens concatenated ("-ep1": T =
# ep * tokens), whose weight gradients' rows [r*E/ep, (r+1)*E/ep) are rank
# r's, and against float64.
EP_TRAIN_CASES = {
    # Tensor-core GEMMs, a shared expert, 4 ranks of 4 experts.
    "train_ep4_shared": dict(tokens=64, hidden=512, intermediate=256, experts=16, top_k=4,
                             padding=64, shared_intermediate=256, ep=4, training=True),
    # Scalar GEMMs, a clamp, -1 routes, 2 ranks.
    "train_ep2_simt": dict(tokens=40, hidden=96, intermediate=48, experts=8, top_k=2,
                           padding=8, swiglu_limit=1.0, drop=0.2, ep=2, training=True),
    # main_grad += dW for the local experts, skewed routing.
    "maingrad_ep2": dict(tokens=64, hidden=512, intermediate=256, experts=8, top_k=2,
                         padding=64, routing="zipf", ep=2, training=True, main_grads=True),
}


def ep_train_twin(case):
    """The spec fields of an EP training case's ep = 1 twin: all E experts
    and every rank's tokens."""
    spec = ep1_twin(case)
    spec["tokens"] = case["tokens"] * case["ep"]
    return spec


# FP8 layers (precision = "fp8", scalar GEMMs: docs/FP8.md), run by
# python/tests/gpu/test_gpu_fp8.py against their float64 definition
# (python/tests/fp8_reference.py), and their in-kernel quantizers bit for bit.
FP8_CASES = {
    # A shared expert (bf16) with a clamp, -1 routes.
    "fp8_shared_clamp": dict(tokens=100, hidden=256, intermediate=256, experts=4, top_k=2,
                             padding=128, shared_intermediate=128, swiglu_limit=1.0,
                             drop=0.1, precision="fp8", tensor_cores=False),
    # Skewed (Zipf) routing over 8 experts, H of three blocks.
    "fp8_skewed": dict(tokens=160, hidden=384, intermediate=128, experts=8, top_k=2,
                       padding=128, routing="zipf", precision="fp8", tensor_cores=False),
}
# The same layers on E4M3 wgmma (sm_90a's tensor cores), "<name>_wgmma":
# against the definition, and against their scalar twins on the same
# inputs; and larger ones.
for _name in list(FP8_CASES):
    FP8_CASES[_name + "_wgmma"] = dict(FP8_CASES[_name], tensor_cores=True)
# The quantized routed weights as inputs (fp8_quantized_weights, made by
# mok.ops.fp8_quantize): bitwise the layer that quantizes them itself.
FP8_CASES["fp8_shared_clamp_wgmma_given"] = dict(FP8_CASES["fp8_shared_clamp_wgmma"],
                                                 fp8_quantized_weights=True)
# Any token count (tokens=None): run at several T up to max_tokens.
FP8_CASES["fp8_wgmma_any_tokens"] = dict(tokens=None, max_tokens=160, hidden=256,
                                         intermediate=256, experts=4, top_k=2, padding=128,
                                         shared_intermediate=128, precision="fp8")
FP8_CASES["fp8_wgmma_top4"] = dict(tokens=300, hidden=1024, intermediate=512, experts=16,
                                   top_k=4, padding=128, shared_intermediate=256,
                                   routing="zipf", drop=0.1, precision="fp8")
# With a producer warpgroup (warp_specialize): each consumer warpgroup
# waits for its k-tiles and hands back their stages on its own, so one's
# partial-sum scaling runs beside the other's MMAs. The same MMAs and
# scaling in the same order as their "twin".
FP8_CASES["fp8_shared_clamp_ws"] = dict(FP8_CASES["fp8_shared_clamp_wgmma"],
                                        warp_specialize=True, twin="fp8_shared_clamp_wgmma")
FP8_CASES["fp8_top4_ws"] = dict(FP8_CASES["fp8_wgmma_top4"], warp_specialize=True,
                                twin="fp8_wgmma_top4")

# MXFP8 layers (precision = "mxfp8": 1 x 32 blocks with E8M0 scales in
# tcgen05's scale-factor atoms; docs/FP8.md) on sm_90a's scalar GEMMs, the
# GPU MXFP8 path that runs here (tcgen05's block-scaled MMA is sm_100a's):
# against their definition, and their quantizers bit for bit.
MX_CASES = {
    "mx_shared_clamp": dict(tokens=100, hidden=256, intermediate=256, experts=4, top_k=2,
                            padding=32, shared_intermediate=128, swiglu_limit=1.0,
                            drop=0.1, precision="mxfp8", tensor_cores=False),
    "mx_skewed": dict(tokens=160, hidden=384, intermediate=128, experts=8, top_k=2,
                      padding=32, routing="zipf", precision="mxfp8", tensor_cores=False),
}
# Given its weights quantized (mok.ops.mxfp8_quantize, the scales in atoms):
# bitwise the layer that quantizes them itself.
MX_CASES["mx_shared_clamp_given"] = dict(MX_CASES["mx_shared_clamp"],
                                         fp8_quantized_weights=True)

# FP8 training layers: the forward saving the bf16 context, and the
# backward with every routed GEMM on operands quantized along its reduction
# (docs/FP8.md's backward table), against fp8_reference.layer_backward.
FP8_TRAIN_CASES = {
    "train_fp8_shared_clamp": dict(FP8_CASES["fp8_shared_clamp"], training=True),
    "train_fp8_skewed": dict(FP8_CASES["fp8_skewed"], training=True, main_grads=True),
    "train_fp8_shared_clamp_wgmma": dict(FP8_CASES["fp8_shared_clamp_wgmma"], training=True),
    "train_fp8_skewed_wgmma": dict(FP8_CASES["fp8_skewed_wgmma"], training=True,
                                   main_grads=True),
    # Given the routed weights quantized, both layouts (mok.ops.fp8_quantize):
    # bitwise the layer that quantizes them itself.
    "train_fp8_shared_clamp_wgmma_given": dict(FP8_CASES["fp8_shared_clamp_wgmma_given"],
                                               training=True),
    # The same with a producer warpgroup in the training forward.
    "train_fp8_given_ws": dict(FP8_CASES["fp8_shared_clamp_wgmma_given"], training=True,
                               warp_specialize=True),
    # Wide enough that the quantizers' warps take several blocks each (x's
    # routed rows: 3000+ rows x 2048 columns), so that their loops carry a
    # block's loads to the next iteration; with a producer in the forward.
    "train_fp8_wide": dict(tokens=800, hidden=2048, intermediate=512, experts=8, top_k=4,
                           padding=128, routing="zipf", precision="fp8", training=True,
                           warp_specialize=True),
    # Any T (tokens=None): run at 67 of its 160.
    "train_fp8_any_tokens": dict(FP8_CASES["fp8_wgmma_any_tokens"], training=True),
    # MXFP8 training layers on scalar GEMMs (the backward's weights
    # transposed and column blocks of 32 routed rows, E8M0 atoms).
    "train_mx_shared_clamp": dict(MX_CASES["mx_shared_clamp"], training=True),
    "train_mx_skewed": dict(MX_CASES["mx_skewed"], training=True, main_grads=True),
    "train_mx_shared_clamp_given": dict(MX_CASES["mx_shared_clamp_given"], training=True),
}

SPEC_FIELDS = ("tokens", "hidden", "intermediate", "experts", "top_k", "padding",
               "shared_intermediate", "swiglu_limit", "expert_id_dtype", "max_tokens",
               "ep", "recv_capacity", "precision")


def ep1_twin(case):
    """The spec fields of an EP case's ep = 1 twin: all E experts, a rank's
    tokens (any T: the capacity)."""
    spec = {k: v for k, v in spec_kwargs(case).items() if k not in ("ep", "recv_capacity")}
    return spec


def spec_kwargs(case):
    return {k: v for k, v in case.items() if k in SPEC_FIELDS}


def compile_kwargs(case):
    """mok.compile's options of a case (besides the spec and target)."""
    kwargs = {"warp_specialize": case.get("warp_specialize", False),
              "fuse_dispatch": case.get("fuse_dispatch"),
              "multicast": case.get("multicast", False)}
    if case.get("training"):
        kwargs.update(training=True, recompute=case.get("recompute", False))
    if case.get("main_grads"):
        kwargs.update(main_grads=True)
    if case.get("barrier_timeout_ms"):
        kwargs.update(barrier_timeout_ms=case["barrier_timeout_ms"])
    if case.get("tensor_cores") is False:
        kwargs.update(tensor_cores=False)
    if case.get("fp8_quantized_weights"):
        kwargs.update(fp8_quantized_weights=True)
    return kwargs
