// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOETYPES_TD
#define MOK_DIALECT_MOE_IR_MOETYPES_TD

include "mok/Dialect/MoE/IR/MoEDialect.td"
include "mlir/IR/AttrTypeBase.td"

class MoE_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<MoE_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def MoE_PlanType : MoE_Type<"Plan", "plan"> {
  let summary = "a routing plan: which routed row goes to which local expert";
  let description = [{
    The value produced by `moe.plan` and read by the ops that move rows
    between tokens and experts. At run time it holds, for this rank, the
    number of routes per local expert, each expert's padded row offset and
    the map from routed rows back to `(source rank, token, k)`. Its type
    carries the static facts every consumer is checked against:

    * `tokens` — `T`, the rank's token count (`?` when dynamic);
    * `top_k` — routes per token, `1 <= top_k <= experts`;
    * `experts` — the global expert count `E`;
    * `ep` — the expert-parallel group size; `E % ep == 0`, and each rank
      owns `E / ep` consecutive experts;
    * `padding` — each local expert's row segment is padded to a multiple of
      this (a power of two; `1` means no padding);
    * `max_tokens` (optional, only with `tokens = ?`) — the capacity: the
      largest T a call may have. The GPU targets size their kernels' buffers
      for it and need it for a dynamic T; a call with more tokens is an
      error, never an overrun. Absent (printed so) when 0.
    * `recv_capacity` (optional, only with `ep > 1`) — the receive capacity
      `C`: the most routes one rank's experts may receive in one call, from
      all ranks together (`docs/ExpertParallel.md`). The GPU targets size
      the receive and routed buffers for it; routing past it is an error
      named after the rank, never an overrun. Absent (printed so) when 0:
      the most that can be sent, `ep * T * min(top_k, experts / ep)` with
      `T` the tokens or `max_tokens`.

    ```mlir
    !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>
    !moe.plan<tokens = ?, top_k = 8, experts = 256, ep = 8, padding = 128, max_tokens = 8192>
    !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128, recv_capacity = 65536>
    ```
  }];
  let parameters = (ins "int64_t":$tokens, "int64_t":$topK,
                        "int64_t":$experts, "int64_t":$ep, "int64_t":$padding,
                        DefaultValuedParameter<"int64_t", "0">:$maxTokens,
                        DefaultValuedParameter<"int64_t", "0">:$recvCapacity);
  let assemblyFormat = [{
    `<` `tokens` `=` custom<DynamicDim>($tokens) `,` `top_k` `=` $topK `,`
        `experts` `=` $experts `,` `ep` `=` $ep `,`
        custom<PaddingAndCapacities>($padding, $maxTokens, $recvCapacity)
  }];
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Experts owned by one rank: `experts / ep`.
    int64_t getLocalExperts() const { return getExperts() / getEp(); }
    bool hasStaticTokens() const {
      return !::mlir::ShapedType::isDynamic(getTokens());
    }
    /// The receive capacity of a rank (ep > 1): recv_capacity, or by
    /// default the most routes that can be sent to one rank; 0 when the
    /// token count is dynamic without a capacity (no bound).
    int64_t getReceiveCapacity() const {
      if (getRecvCapacity())
        return getRecvCapacity();
      int64_t t = hasStaticTokens() ? getTokens() : getMaxTokens();
      return getEp() * t * std::min(getTopK(), getLocalExperts());
    }
  }];
}

#endif // MOK_DIALECT_MOE_IR_MOETYPES_TD
