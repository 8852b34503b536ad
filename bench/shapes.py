# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Benchmark shapes (bf16 but for the -fp8 ones, EP = 1, one GPU). Compiled by bench.compile (on
a development machine, or on the GPU machine with the carried compiler),
timed on the GPU machine (bench.moe_forward, bench.moe_training,
bench.peers)."""

SHAPES = {
    "dsv3-shard": dict(tokens=4096, hidden=7168, intermediate=2048, experts=32, top_k=8,
                       shared_intermediate=2048, padding=128, routing="uniform"),
    "qwen3-30b": dict(tokens=8192, hidden=2048, intermediate=768, experts=128, top_k=8,
                      padding=128, routing="uniform"),
    "qwen3-30b-skewed": dict(tokens=8192, hidden=2048, intermediate=768, experts=128,
                             top_k=8, padding=128, routing="zipf"),
    "small-top2": dict(tokens=2048, hidden=1024, intermediate=512, experts=16, top_k=2,
                       padding=128, routing="uniform"),
}

# The two target shapes again with warp-specialized GEMMs (a TMA producer
# warpgroup; mok.compile(..., warp_specialize=True)), timed side by side.
for _name in ("dsv3-shard", "qwen3-30b"):
    SHAPES[_name + "-ws"] = dict(SHAPES[_name], warp_specialize=True)
# And with the dispatch copy (fuse_dispatch=False; the default fuses it
# into the gate/up GEMM on sm_90a).
for _name in ("dsv3-shard", "qwen3-30b"):
    SHAPES[_name + "-copy"] = dict(SHAPES[_name], fuse_dispatch=False)
# And in clusters of 2 CTAs sharing weight boxes (multicast=True).
for _name in ("dsv3-shard", "qwen3-30b"):
    SHAPES[_name + "-mc"] = dict(SHAPES[_name], multicast=True)
# And in FP8 (precision="fp8": E4M3 wgmma with f32 block scales, the
# weights quantized in the kernel; docs/FP8.md), timed against mok's bf16
# layer of the same shape in the same run.
# "-fp8w": the same with the weights quantized beforehand, as a trainer
# does once per optimizer step (fp8_quantized_weights; mok.ops.fp8_quantize,
# not timed).
# "-fp8ws": "-fp8w" with a producer warpgroup (warp_specialize).
for _name in ("dsv3-shard", "qwen3-30b"):
    SHAPES[_name + "-fp8"] = dict(SHAPES[_name], precision="fp8")
    SHAPES[_name + "-fp8w"] = dict(SHAPES[_name + "-fp8"], fp8_quantized_weights=True)
    SHAPES[_name + "-fp8ws"] = dict(SHAPES[_name + "-fp8w"], warp_specialize=True)
del _name
# The forward benchmark's shapes (bench.moe_forward's and bench.compile's
# default): all of the above.
FORWARD_SHAPES = tuple(SHAPES)

# The peers' shapes (bench.peers): routed experts only, uniform routing, no
# clamp, as the open-source kernels compute. qwen3-30b is one of them; the
# DeepSeek-V3 shard without its shared expert is the other.
SHAPES["dsv3-routed"] = {k: v for k, v in SHAPES["dsv3-shard"].items()
                         if k != "shared_intermediate"}
PEER_SHAPES = ("dsv3-routed", "qwen3-30b")
# The same routed experts in FP8 (given weights, a producer warpgroup): the
# FP8 GEMMs without the shared expert's bf16 ones beside them.
SHAPES["dsv3-routed-fp8ws"] = dict(SHAPES["dsv3-routed"], precision="fp8",
                                   fp8_quantized_weights=True, warp_specialize=True)
