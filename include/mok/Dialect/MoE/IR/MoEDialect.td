// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOEDIALECT_TD
#define MOK_DIALECT_MOE_IR_MOEDIALECT_TD

include "mlir/IR/OpBase.td"

def MoE_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::mok::moe";
  let summary = "Mixture-of-Experts layers: routing, dispatch, grouped SwiGLU experts, combine";
  let description = [{
    The `moe` dialect describes one Mixture-of-Experts layer of a transformer
    at the tensor level, as the program of **one expert-parallel rank**:

    * `moe.plan` turns the router's top-k expert ids into a routing plan;
    * `moe.dispatch` gathers the routed token rows, grouped by local expert;
    * `moe.expert_swiglu` runs every local expert's gate and up projections
      and the (optionally clamped) SwiGLU activation;
    * `moe.expert_down` runs every local expert's down projection;
    * `moe.shared_expert` runs the dense shared expert on all local tokens;
    * `moe.combine` returns routed rows to their tokens and sums them,
      weighted by the router weights, onto the shared expert's output;
    * `moe.layer` is the whole forward layer as one op, as produced by
      `--moe-fuse-layer`; it is what the GPU lowering turns into one
      megakernel.

    Semantics, for token `t` with routes `(e[t,k], w[t,k])` and optional clamp
    `L` (`swiglu_limit`):

    ```
    g = x W_g[e]^T,  u = x W_u[e]^T          fp32 accumulate, bf16 result
    g' = min(g, L),  u' = clamp(u, -L, L)    no clamp when L is absent
    h = silu(g') * u'                        fp32 math, bf16 result
    y[t,k] = h W_d[e]^T                      bf16
    out[t] = bf16(f32(shared(x[t])) + sum_k w[t,k] * f32(y[t,k]))
    ```

    Router weights are applied in the combine only; there is no bias. An
    expert id of `-1` means "no route": the route contributes nothing.

    Shapes (one rank): `x : [T, H] bf16`, `top_experts : [T, k] i32|i64`
    holding *global* expert ids in `[0, E)`, `router_weights : [T, k] f32`,
    routed weights `W_g, W_u : [E/ep, I, H]` and `W_d : [E/ep, H, I]` (the
    rank's local experts), shared weights `[I_s, H]`, `[I_s, H]`, `[H, I_s]`.
    Only the token count `T` may be dynamic (`?`); the routed row count
    between dispatch and combine is data-dependent and always dynamic.
  }];
  let useDefaultTypePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypes();
  }];
}

class MoE_Op<string mnemonic, list<Trait> traits = []>
    : Op<MoE_Dialect, mnemonic, traits>;

#endif // MOK_DIALECT_MOE_IR_MOEDIALECT_TD
