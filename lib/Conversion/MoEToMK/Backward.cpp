// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's backward plan: moe.layer_grad as one persistent
// kernel (docs/Backward.md): the routing plan rebuilt, the reverse
// combine, the down dgrad and weight gradients, the SwiGLU backward, the
// gate/up dgrad and weight gradients, the reverse dispatch; with
// recompute, the forward's dispatch and gate/up GEMMs first.
//
#include "KernelPlan.h"

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

namespace {

/// The backward kernel's phases, in order (profiling names them).
SmallVector<StringRef> backwardPhaseNames(LayerGradOp grad, const Sizes &s) {
  SmallVector<StringRef> names = {"plan: count", "plan: scan", "plan: offsets",
                                  "plan: assign"};
  if (grad.recomputes())
    names.append({"recompute: dispatch", "recompute: gate/up"});
  if (s.fp8) // (the weights too, when not given quantized)
    names.append({"quantize d_out, hidden, x", "quantize d_y"});
  else
    names.push_back("reverse combine");
  names.append({"down dgrad + wgrad", "SwiGLU backward"});
  if (s.fp8)
    names.push_back("quantize d_gate/d_up");
  names.append({"gate/up dgrad + wgrads", "reverse dispatch"});
  return names;
}

} // namespace

BackwardMaps mok::moe_to_mk::backwardMapsFor(MLIRContext *ctx, const Sizes &s,
                                             const mk::TargetSupport &support,
                                             bool tensorCores, bool recompute,
                                             bool mayGatherDOut,
                                             bool warpRoles) {
  BackwardMaps m;
  if (!tensorCores || !s.tensorCoreEligible())
    return m;
  // Warp roles: the FP8 backward on wgmma (its routed GEMMs' k-tiles
  // release their own stages, so a group without k-tiles needs no peeled
  // one), with static tokens (the shared expert's weight gradients reduce
  // over them, in bf16).
  m.producer = warpRoles && s.fp8 && !s.mx && !recompute && !s.anyTokens &&
               support.tensorCoreEngine() == mk::Engine::wgmma;
  // The largest tiles the chip's lowering implements for the backward's
  // GEMMs, asked of it with their forms: 128 rows when the expert segments
  // and the weight gradients' M (H, I, I_s) are whole tiles of them, 256
  // columns for the dgrads (one B operand, or concat's two taking turns),
  // and the down dgrad's A gathered from d_out's rows.
  m.engine = support.tensorCoreEngine();
  int64_t tall = sched::kMaxConsumers * sched::kTileM;
  // (`roles` false: the form without warp roles.)
  auto scheduleOf = [&](int64_t tileM, int64_t tileN,
                        int64_t tileK = sched::kTileK, bool roles = true) {
    bool producer = roles && m.producer;
    return mk::GemmScheduleAttr::get(
        ctx, m.engine, {tileM, tileN, tileK}, sched::kStages, producer,
        producer ? sched::producerRegisters(tileM)
                 : SmallVector<int64_t, 2>(),
        /*multicast=*/false);
  };
  mk::GemmForm downWgrad, downDgrad;
  downWgrad.transposeA = downWgrad.transposeB = downWgrad.kGroups = true;
  downWgrad.columns = s.inter;
  downWgrad.groupRows = s.hidden;
  downDgrad.grouped = downDgrad.transposeB = downDgrad.f32Out = true;
  downDgrad.columns = s.inter;
  if (s.mx) {
    // MXFP8 (tcgen05): the block-scaled MMA's 128-row tiles, for the
    // shared expert's bf16 GEMMs too (one tile height a kernel).
    m.tileM = tall;
  } else {
    // (tcgen05 takes 128-row tiles for MXFP8 kernels only.)
    // (The bf16 down wgrad's form without warp roles: with them the
    // kernel is FP8's, whose routed GEMMs check their own forms below.)
    if (s.padding % tall == 0 && m.engine == mk::Engine::wgmma &&
        support.whyNot(downWgrad,
                       scheduleOf(tall, sched::kTileN, sched::kTileK,
                                  /*roles=*/false))
            .empty())
      m.tileM = tall;
    if (support.whyNot(downDgrad, scheduleOf(m.tileM, 2 * sched::kTileN))
            .empty())
      m.storeTileN = 2 * sched::kTileN;
    mk::GemmForm gathered = downDgrad;
    gathered.gathered = true;
    m.gatherDOut =
        mayGatherDOut &&
        support.whyNot(gathered, scheduleOf(m.tileM, m.storeTileN)).empty();
  }
  int64_t next = 0, rc = s.routedCapacity(), h = s.hidden, in = s.inter;
  auto add = [&](TensorMapSpec spec) {
    m.maps.push_back(spec);
    int64_t slot = next;
    next += spec.experts;
    return slot;
  };
  // K-major A boxes of tileM rows; N-major B boxes of 64 x 64 over each
  // [K, N] matrix.
  auto a = [&](StringRef buffer, int64_t rows, int64_t cols) {
    return add(
        TensorMapSpec{buffer.str(), rows, cols, cols, m.tileM, sched::kTileK});
  };
  auto bT = [&](StringRef buffer, int64_t rows, int64_t cols,
                int64_t experts = 1) {
    return add(TensorMapSpec{buffer.str(), rows, cols, cols, sched::kTileK,
                             sched::kTileK, experts});
  };
  // sm_90a: the down dgrad gathers its A rows from d_out (one-row boxes:
  // the runtime checks d_out's alignment with them; never read on the
  // device).
  // FP8: the routed GEMMs read the E4M3 copies, on wgmma in tiles of 128
  // columns and K = 128 (each k-tile one block of scales). The shared
  // expert's stay bf16.
  if (s.fp8) {
    m.gatherDOut = false;
    mk::GemmForm fp8Down;
    fp8Down.grouped = fp8Down.f32Out = fp8Down.fp8 = true;
    fp8Down.mx = s.mx;
    fp8Down.columns = s.inter;
    auto schedule = scheduleOf(m.tileM, sched::kTileN, sched::kTileKFp8);
    if (support.whyNot(fp8Down, schedule).empty()) {
      m.fp8DOut = add(TensorMapSpec{"routed_d_out_q", rc, h, h, m.tileM,
                                    sched::kTileKFp8});
      m.fp8Down = add(TensorMapSpec{"down_qt", in, h, h, sched::kTileN,
                                    sched::kTileKFp8, s.experts});
    }
    mk::GemmForm fp8GateUp;
    fp8GateUp.grouped = fp8GateUp.concat = fp8GateUp.fp8 = true;
    fp8GateUp.mx = s.mx;
    fp8GateUp.bOperands = 2;
    fp8GateUp.columns = s.hidden;
    if (support.whyNot(fp8GateUp, schedule).empty()) {
      auto rows = [&](StringRef buffer) {
        return add(TensorMapSpec{buffer.str(), rc, in, in, m.tileM,
                                 sched::kTileKFp8});
      };
      auto weights = [&](StringRef buffer) { // [E, H, I]: N = H, K = I
        return add(TensorMapSpec{buffer.str(), h, in, in, sched::kTileN,
                                 sched::kTileKFp8, s.experts});
      };
      m.fp8DGate = rows("d_gate_q");
      m.fp8DUp = rows("d_up_q");
      m.fp8GateT = weights("gate_qt");
      m.fp8UpT = weights("up_qt");
    }
    mk::GemmForm fp8Wgrad;
    fp8Wgrad.kGroups = fp8Wgrad.fp8 = true;
    fp8Wgrad.mx = s.mx;
    fp8Wgrad.columns = s.inter;
    fp8Wgrad.groupRows = s.hidden;
    mk::GemmForm fp8WgradGateUp = fp8Wgrad;
    fp8WgradGateUp.columns = s.hidden;
    fp8WgradGateUp.groupRows = s.inter;
    if (support.whyNot(fp8Wgrad, schedule).empty() &&
        support.whyNot(fp8WgradGateUp, schedule).empty()) {
      int64_t padded = (rc + 127) / 128 * 128;
      auto t = [&](StringRef buffer, int64_t rows, int64_t boxRows) {
        return add(TensorMapSpec{buffer.str(), rows, padded, padded, boxRows,
                                 sched::kTileKFp8});
      };
      m.fp8DYT = t("d_y_t", h, m.tileM);
      m.fp8HiddenT = t("hidden_t", in, sched::kTileN);
      m.fp8DGateT = t("d_gate_t", in, m.tileM);
      m.fp8DUpT = t("d_up_t", in, m.tileM);
      m.fp8RoutedXT = t("routed_x_t", h, sched::kTileN);
    }
  }
  if (!s.fp8) {
    m.routedDOut =
        m.gatherDOut
            ? add(TensorMapSpec{"d_out", s.tokens, h, h, 1, sched::kTileK})
            : a("routed_d_out", rc, h);
    m.down = bT("down_weights", h, in, s.experts); // [H = K, I = N]
    m.dGate = a("d_gate", rc, in);
    m.dUp = a("d_up", rc, in);
    m.gate = bT("gate_weights", in, h, s.experts); // [I = K, H = N]
    m.up = bT("up_weights", in, h, s.experts);
  }
  if (s.hasShared()) {
    int64_t t = s.tokens, is = s.sharedInter;
    m.dOut = a("d_out", t, h);
    m.sharedDown = bT("shared_down_weights", h, is);
    m.dSharedGate = a("d_shared_gate", t, is);
    m.dSharedUp = a("d_shared_up", t, is);
    m.sharedGate = bT("shared_gate_weights", is, h);
    m.sharedUp = bT("shared_up_weights", is, h);
  }
  if (!s.fp8) {
    m.dYT = bT("d_y", rc, h);
    m.hiddenT = bT("hidden", rc, in);
    m.dGateT = bT("d_gate", rc, in);
    m.dUpT = bT("d_up", rc, in);
    m.routedXT = bT("routed_x", rc, h);
  }
  if (s.hasShared()) {
    int64_t t = s.tokens, is = s.sharedInter;
    m.dOutT = bT("d_out", t, h);
    m.sharedHiddenT = bT("shared_hidden", t, is);
    m.dSharedGateT = bT("d_shared_gate", t, is);
    m.dSharedUpT = bT("d_shared_up", t, is);
    m.xT = bT("x", t, h);
  }
  if (recompute) {
    auto bK = [&](StringRef buffer, int64_t rows, int64_t cols,
                  int64_t experts = 1) {
      return add(TensorMapSpec{buffer.str(), rows, cols, cols, sched::kTileN,
                               sched::kTileK, experts});
    };
    m.routedX = a("routed_x", rc, h);
    m.gateK = bK("gate_weights", in, h, s.experts); // [I = N, H = K]
    m.upK = bK("up_weights", in, h, s.experts);
    if (s.hasShared()) {
      m.x = a("x", s.tokens, h);
      m.sharedGateK = bK("shared_gate_weights", s.sharedInter, h);
      m.sharedUpK = bK("shared_up_weights", s.sharedInter, h);
    }
  }
  return m;
}

void BackwardGemms::onTensorCores(GemmPlan &g,
                                  ArrayRef<int64_t> slots) const {
  if (tc.maps.empty())
    return;
  g.maps.assign(slots.begin(), slots.end());
  g.tensorMaps = frame.buf.lookup("tensor_maps");
  g.tileM = tc.tileM;
  // (FP8 tiles are 128 columns: the partial sums take registers too.)
  g.tileN = g.scales.empty() ? tc.storeTileN : sched::kTileN;
  g.engine = tc.engine;
  g.producer = tc.producer;
  if (tc.producer && !sched::producerRegisters(tc.tileM).empty())
    g.registers = DenseI64ArrayAttr::get(frame.b.getContext(),
                                         sched::producerRegisters(tc.tileM));
}

void BackwardGemms::routedDown(StringRef dOut, bool gathered) {
  llvm::StringMap<Value> &buf = frame.buf;
  if (s.fp8) {
    // d_out's routed E4M3 rows against the transposed down weights
    // ([E, I, H]: K = H), and d_y's and the hidden rows' column blocks
    // (K = the routed rows; docs/FP8.md's backward table).
    GemmPlan g;
    g.role = "down dgrad";
    g.a = buf["routed_d_out_q"];
    g.b = {buf["down_qt"]};
    g.scales = {buf["routed_d_out_scale"], buf["down_scale_t"]};
    g.out = buf["d_hidden_u"];
    g.rowExpert = buf["row_expert"];
    g.offsets = buf["offsets"];
    if (tc.fp8Down >= 0) {
      onTensorCores(g, {tc.fp8DOut, tc.fp8Down});
      g.paddingRows = buf["row_route"];
    }
    frame.gemm(g);
    GemmPlan w;
    w.role = "down weights' gradient";
    w.a = buf["d_y_t"];     // [H, R]: M = H, K = rows
    w.b = {buf["hidden_t"]}; // [I, R]: N = I
    w.scales = {buf["d_y_t_scale"], buf["hidden_t_scale"]};
    w.kOffsets = buf["offsets"];
    w.kCounts = buf["counts"];
    w.out = buf["d_down_weights"];
    w.accumulate = accumulate;
    if (tc.fp8DYT >= 0) {
      onTensorCores(w, {tc.fp8DYT, tc.fp8HiddenT});
    }
    frame.gemm(w);
    return;
  }
  GemmPlan g;
  g.role = "down dgrad";
  g.a = buf[dOut];
  if (gathered) { // the dispatch of d_out fused into the A loads
    g.gatherRows = buf["row_route"];
    g.gatherTopK = s.topK;
  }
  g.b = {buf["down_weights"]}; // [E, H, I]: K = H, N = I
  g.transposeB = true;
  g.out = buf["d_hidden_u"];
  g.rowExpert = buf["row_expert"];
  g.offsets = buf["offsets"];
  if (tc.engine == mk::Engine::wgmma)
    g.paddingRows = buf["row_route"];
  onTensorCores(g, {tc.routedDOut, tc.down});
  frame.gemm(g);
  GemmPlan w;
  w.role = "down weights' gradient";
  w.a = buf["d_y"];      // [R, H]: K = rows, M = H
  w.b = {buf["hidden"]}; // [R, I]: K = rows, N = I
  w.transposeA = w.transposeB = true;
  w.kOffsets = buf["offsets"];
  w.kCounts = buf["counts"]; // past each expert's rows: zero padding
  w.out = buf["d_down_weights"];
  w.accumulate = accumulate;
  onTensorCores(w, {tc.dYT, tc.hiddenT});
  frame.gemm(w);
}

void BackwardGemms::sharedDown() {
  llvm::StringMap<Value> &buf = frame.buf;
  GemmPlan g;
  g.role = "shared down dgrad";
  g.a = buf["d_out"];
  g.b = {buf["shared_down_weights"]}; // [H, I_s]
  g.transposeB = true;
  g.out = buf["d_shared_hidden_u"];
  onTensorCores(g, {tc.dOut, tc.sharedDown});
  frame.gemm(g);
  GemmPlan w;
  w.role = "shared down weights' gradient";
  w.a = buf["d_out"];
  w.b = {buf["shared_hidden"]};
  w.transposeA = w.transposeB = true;
  w.out = buf["d_shared_down_weights"];
  w.accumulate = accumulate;
  onTensorCores(w, {tc.dOutT, tc.sharedHiddenT});
  frame.gemm(w);
}

void BackwardGemms::gateUp(bool shared) {
  llvm::StringMap<Value> &buf = frame.buf;
  auto dgrad = [&](StringRef dg, StringRef du, StringRef wg, StringRef wu,
                   StringRef out, bool grouped, ArrayRef<int64_t> slots) {
    GemmPlan g;
    g.role = grouped ? "gate/up dgrad" : "shared gate/up dgrad";
    g.a = buf[dg];
    g.a2 = buf[du];
    g.b = {buf[wg], buf[wu]}; // [(E,) I, H]: K = I, N = H
    g.transposeB = true;
    g.out = buf[out];
    if (grouped) {
      g.rowExpert = buf["row_expert"];
      g.offsets = buf["offsets"];
      // No padding skip (row_route as `padding`), unlike the down dgrad:
      // on the H200 the second k-loop slowed this GEMM's phase (qwen3-30b
      // 1.41 -> 1.52 ms, dsv3-shard 7.35 -> 7.75 ms), as it slowed the
      // forward's gate/up GEMM.
    }
    onTensorCores(g, slots);
    frame.gemm(g);
  };
  auto wgrad = [&](StringRef dAct, StringRef xs, StringRef out, bool grouped,
                   ArrayRef<int64_t> slots) {
    GemmPlan w;
    w.role = out;
    w.a = buf[dAct]; // [K, I]
    w.b = {buf[xs]}; // [K, H]
    w.transposeA = w.transposeB = true;
    if (grouped) {
      w.kOffsets = buf["offsets"];
      w.kCounts = buf["counts"];
    }
    w.out = buf[out];
    w.accumulate = accumulate;
    onTensorCores(w, slots);
    frame.gemm(w);
  };
  if (s.fp8) {
    // The E4M3 rows of d_gate and d_up against the transposed gate and up
    // weights ([E, H, I]: K = I), both K-loops into one accumulator; the
    // weights' gradients from the column blocks.
    GemmPlan g;
    g.role = "gate/up dgrad";
    g.a = buf["d_gate_q"];
    g.a2 = buf["d_up_q"];
    g.b = {buf["gate_qt"], buf["up_qt"]};
    g.scales = {buf["d_gate_scale"], buf["d_up_scale"], buf["gate_scale_t"],
                buf["up_scale_t"]};
    g.out = buf["d_routed_x"];
    g.rowExpert = buf["row_expert"];
    g.offsets = buf["offsets"];
    if (tc.fp8DGate >= 0) { // maps: a, b_0, b_1, a2
      onTensorCores(g, {tc.fp8DGate, tc.fp8GateT, tc.fp8UpT, tc.fp8DUp});
    }
    frame.gemm(g);
    for (StringRef w : {"gate", "up"}) {
      GemmPlan wg;
      wg.role = w == "gate" ? "d_gate_weights" : "d_up_weights";
      wg.a = buf[("d_" + w + "_t").str()];
      wg.b = {buf["routed_x_t"]};
      wg.scales = {buf[("d_" + w + "_t_scale").str()],
                   buf["routed_x_t_scale"]};
      wg.kOffsets = buf["offsets"];
      wg.kCounts = buf["counts"];
      wg.out = buf[("d_" + w + "_weights").str()];
      wg.accumulate = accumulate;
      if (tc.fp8DGateT >= 0) {
        onTensorCores(wg, {w == "gate" ? tc.fp8DGateT : tc.fp8DUpT,
                           tc.fp8RoutedXT});
      }
      frame.gemm(wg);
    }
  } else {
    dgrad("d_gate", "d_up", "gate_weights", "up_weights", "d_routed_x", true,
          {tc.dGate, tc.gate, tc.up, tc.dUp});
    wgrad("d_gate", "routed_x", "d_gate_weights", true,
          {tc.dGateT, tc.routedXT});
    wgrad("d_up", "routed_x", "d_up_weights", true, {tc.dUpT, tc.routedXT});
  }
  if (shared) {
    dgrad("d_shared_gate", "d_shared_up", "shared_gate_weights",
          "shared_up_weights", "d_shared_x", false,
          {tc.dSharedGate, tc.sharedGate, tc.sharedUp, tc.dSharedUp});
    wgrad("d_shared_gate", "x", "d_shared_gate_weights", false,
          {tc.dSharedGateT, tc.xT});
    wgrad("d_shared_up", "x", "d_shared_up_weights", false,
          {tc.dSharedUpT, tc.xT});
  }
}

namespace {

/// The backward kernel's parameters: `moe.layer_grad`'s operands (the saved
/// context by the names of moe.layer's results), its results (`d_` and the
/// operand's name), then the workspace.
SmallVector<Param> backwardParamsFor(LayerGradOp grad, const Sizes &s,
                                     bool profile, ArrayRef<TensorMapSpec> maps,
                                     bool gatherDOut) {
  Builder tb(grad.getContext());
  Type bf16 = tb.getBF16Type(), f32 = tb.getF32Type(), i64 = tb.getI64Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  int64_t rc = s.routedCapacity(), t = s.tokens;
  SmallVector<Param> params;
  std::pair<StringRef, Value> operands[] = {
      {"d_out", grad.getDOut()},
      {"x", grad.getX()},
      {"top_experts", grad.getTopExperts()},
      {"router_weights", grad.getRouterWeights()}};
  for (auto [name, v] : operands)
    params.push_back({name.str(), "input", s.bufferType(v)});
  // With tensor-core GEMMs (maps), the kernel reads the weights only
  // through their tensor maps, as the forward does: the runtime may bind
  // weight views to them. (FP8: the routed weights are read by the
  // quantizer, through pointers; the GEMMs read its copies.)
  std::string access = maps.empty() ? "pointer" : "tensor_maps";
  static const StringRef weightNames[] = {
      "gate_weights",        "up_weights",        "down_weights",
      "shared_gate_weights", "shared_up_weights", "shared_down_weights"};
  for (auto [name, w] : llvm::zip(weightNames, grad.getWeights())) {
    bool routed = !name.starts_with("shared_");
    if (routed && s.fp8WeightInputs)
      continue;
    params.push_back({name.str(), "input", s.bufferType(w),
                      s.fp8 && routed ? "pointer" : access});
  }
  // Given the routed weights quantized: the training forward's inputs,
  // both layouts (the forward reads the normal one, the dgrads here the
  // transposed one).
  if (s.fp8WeightInputs) {
    params.append(fp8Weights(tb.getContext(), s, "input", false));
    params.append(fp8Weights(tb.getContext(), s, "input", true));
  }
  static const StringRef savedNames[] = {
      "routed_x",    "gate",      "up",           "hidden",
      "shared_gate", "shared_up", "shared_hidden"};
  // The context's routed rows (dynamic in moe.layer_grad) have the plan's
  // capacity, as the training forward's outputs do.
  for (size_t i = 0; i < grad.getSaved().size(); ++i) {
    int64_t rows = i < 4 ? rc : t;
    int64_t cols = i == 0 ? s.hidden : i < 4 ? s.inter : s.sharedInter;
    params.push_back({savedNames[i].str(), "input", ty({rows, cols}, bf16)});
  }
  params.push_back({"d_x", "output", s.bufferType(grad.getDX())});
  params.push_back(
      {"d_router_weights", "output", s.bufferType(grad.getDRouterWeights())});
  // With main_grads, the weights' gradients are fp32 outputs the kernel
  // adds into (the main_grad buffers themselves: main_grad + dW in place).
  for (auto [name, g] : llvm::zip(weightNames, grad.getWeightGradients())) {
    params.push_back({("d_" + name).str(), "output", s.bufferType(g)});
    params.back().accumulate = grad.accumulatesMainGrads();
  }
  params.push_back({"counts", "workspace", ty({s.experts}, i64)});
  params.push_back(
      {"chunk_counts", "workspace", ty({s.chunks(), s.experts}, i64)});
  params.push_back({"offsets", "workspace", ty({s.experts + 1}, i64)});
  params.push_back({"route_row", "workspace", ty({t * s.topK}, i64)});
  params.push_back({"row_route", "workspace", ty({rc}, i64)});
  params.push_back({"row_expert", "workspace", ty({rc}, i64)});
  if (grad.recomputes()) {
    params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
    for (StringRef name : {"gate", "up", "hidden"})
      params.push_back({name.str(), "workspace", ty({rc, s.inter}, bf16)});
    if (s.hasShared())
      for (StringRef name : {"shared_gate", "shared_up", "shared_hidden"})
        params.push_back(
            {name.str(), "workspace", ty({t, s.sharedInter}, bf16)});
  }
  // d_out's routed rows, unscaled (the simt down dgrad's A; the wgmma one
  // gathers them itself) and scaled by the router weight (d_y, the down
  // weights' gradient's A; FP8 quantizes its column blocks from d_out).
  if (!gatherDOut && (!s.fp8 || s.mx))
    params.push_back({"routed_d_out", "workspace", ty({rc, s.hidden}, bf16)});
  if (!s.fp8)
    params.push_back({"d_y", "workspace", ty({rc, s.hidden}, bf16)});
  params.push_back({"d_hidden_u", "workspace", ty({rc, s.inter}, f32)});
  params.push_back({"d_gate", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"d_up", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"d_routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  if (s.hasShared()) {
    params.push_back(
        {"d_shared_hidden_u", "workspace", ty({t, s.sharedInter}, f32)});
    params.push_back(
        {"d_shared_gate", "workspace", ty({t, s.sharedInter}, bf16)});
    params.push_back(
        {"d_shared_up", "workspace", ty({t, s.sharedInter}, bf16)});
    params.push_back({"d_shared_x", "workspace", ty({t, s.hidden}, bf16)});
  }
  // FP8 (docs/FP8.md's backward table): d_out's 1 x 128 row blocks (and
  // their routed copies), the weights transposed (K-major for the dgrads),
  // d_gate's and d_up's row blocks, and the column blocks of d_y, the
  // hidden rows, d_gate, d_up and the routed rows of x, stored transposed
  // for the weight gradients (R' = R rounded up to 128).
  if (s.fp8) {
    Type f8 = tb.getType<Float8E4M3FNType>();
    Type e8 = tb.getType<Float8E8M0FNUType>();
    int64_t e = s.experts, h = s.hidden, in = s.inter, w = s.scaleWidth();
    int64_t padded = (rc + 127) / 128 * 128;
    // Scales of a matrix [rows, cols] blocked along cols: f32 [cols/128,
    // S] (row blocks, `rowScales`), or MXFP8's E8M0 atoms [ceil(rows/128),
    // cols/128, 512]. (The weights': fp8Weights.)
    auto atoms = [&](int64_t rows, int64_t cols) {
      return ty({(rows + 127) / 128, cols / 128, 512}, e8);
    };
    auto rowScales = [&](int64_t rows, int64_t cols, int64_t width) {
      return s.mx ? atoms(rows, cols) : ty({cols / 128, width}, f32);
    };
    // (MXFP8: d_out's routed bf16 rows are quantized, not its token rows
    // dispatched quantized: the scale atoms hold 128 routed rows.)
    if (!s.mx) {
      params.push_back({"d_out_q", "workspace", ty({t, h}, f8)});
      params.push_back({"d_out_scale", "workspace",
                        ty({h / 128, (t + 3) / 4 * 4}, f32)});
    }
    params.push_back({"routed_d_out_q", "workspace", ty({rc, h}, f8)});
    params.push_back(
        {"routed_d_out_scale", "workspace", rowScales(rc, h, w)});
    if (!s.fp8WeightInputs)
      params.append(fp8Weights(tb.getContext(), s, "workspace", true));
    for (StringRef name : {"d_gate", "d_up"}) {
      params.push_back({(name + "_q").str(), "workspace", ty({rc, in}, f8)});
      params.push_back(
          {(name + "_scale").str(), "workspace", rowScales(rc, in, w)});
    }
    for (auto [name, cols] : {std::pair<StringRef, int64_t>{"d_y", h},
                              {"hidden", in},
                              {"routed_x", h},
                              {"d_gate", in},
                              {"d_up", in}}) {
      params.push_back(
          {(name + "_t").str(), "workspace", ty({cols, padded}, f8)});
      params.push_back({(name + "_t_scale").str(), "workspace",
                        s.mx ? atoms(cols, padded)
                             : ty({padded / 128, cols}, f32)});
    }
  }
  params.push_back({"grid_barrier", "workspace", ty({2}, tb.getI32Type())});
  // The kernel's report to the runtime (mk.check_routes, bounded grid
  // barriers): host memory the runtime zeroes and reads after the call.
  params.push_back({"status", "status", ty({8}, tb.getI32Type())});
  // Any T: the call's token count, by value.
  if (s.anyTokens)
    params.push_back({"tokens", "tokens", MemRefType()});
  if (profile)
    for (StringRef name : {"phase_clock", "phase_cycles"})
      params.push_back(
          {name.str(), "workspace",
           ty({static_cast<int64_t>(backwardPhaseNames(grad, s).size()) + 1},
              i64)});
  if (!maps.empty())
    params.push_back(
        {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
  return params;
}

/// Emits the backward's schedule (docs/Backward.md) into `func`.
LogicalResult emitBackwardSchedule(OpBuilder &b, LayerGradOp grad,
                                   const Sizes &s, ArrayRef<Param> params,
                                   gpu::GPUFuncOp func, int64_t phases,
                                   const BackwardMaps &tc,
                                   const mk::TargetSupport &support,
                                   unsigned timeoutMs) {
  Location loc = grad.getLoc();
  ScheduleBuilder frame(b, loc, params, func, support, timeoutMs);
  llvm::StringMap<Value> &buf = frame.buf;
  Value clock = frame.clock;
  auto barrier = [&] { frame.barrier(); };
  FloatAttr limit = grad.getSwigluLimitAttr();
  bool shared = s.hasShared();

  // The plan, rebuilt from top_experts: deterministic, so every routed row
  // is where the forward left it.
  frame.plan(s);
  auto gather = [&](StringRef from, StringRef into, Value scale) {
    mk::GatherOp::create(b, loc, buf[from], buf["row_route"], buf["offsets"],
                         buf[into], scale, /*xScales=*/Value(),
                         /*routedScales=*/Value(), s.topK);
  };

  // The GEMMs on tensor cores when the plan has maps for them.
  BackwardGemms gemms{frame, tc, s, grad.accumulatesMainGrads()};
  auto onTensorCores = [&](GemmPlan &g, ArrayRef<int64_t> slots) {
    gemms.onTensorCores(g, slots);
  };
  // Recompute: the forward's dispatch and gate/up GEMMs, storing the
  // activation's inputs as the training forward does.
  if (grad.recomputes()) {
    gather("x", "routed_x", Value());
    barrier();
    GemmPlan g;
    g.role = "recomputed routed gate/up";
    g.epilogue = mk::Epilogue::swiglu;
    g.a = buf["routed_x"];
    g.b = {buf["gate_weights"], buf["up_weights"]};
    g.out = buf["hidden"];
    g.rowExpert = buf["row_expert"];
    g.offsets = buf["offsets"];
    g.saves = {buf["gate"], buf["up"]};
    g.limit = limit;
    onTensorCores(g, {tc.routedX, tc.gateK, tc.upK});
    g.tileN = sched::kTileN;
    frame.gemm(g);
    if (shared) {
      GemmPlan sg;
      sg.role = "recomputed shared gate/up";
      sg.epilogue = mk::Epilogue::swiglu;
      sg.a = buf["x"];
      sg.b = {buf["shared_gate_weights"], buf["shared_up_weights"]};
      sg.out = buf["shared_hidden"];
      sg.saves = {buf["shared_gate"], buf["shared_up"]};
      sg.limit = limit;
      onTensorCores(sg, {tc.x, tc.sharedGateK, tc.sharedUpK});
      sg.tileN = sched::kTileN;
      frame.gemm(sg);
    }
    barrier();
  }

  // Reverse combine: d_out's routed rows scaled (and, for a simt down
  // dgrad, unscaled).
  bool gathersDOut = tc.gatherDOut;
  if (!gathersDOut && (!s.fp8 || s.mx))
    gather("d_out", "routed_d_out", Value());
  if (!s.fp8)
    gather("d_out", "d_y", buf["router_weights"]);
  // FP8: what reads only the inputs and the context is quantized first:
  // d_out's rows, the weights transposed, and the column blocks of the
  // hidden rows and x's routed rows. Then d_out's E4M3 rows are
  // dispatched, and d_y's column blocks quantized straight from d_out and
  // the router weights (d_y, k times d_out's rows, is never stored).
  auto columns = [&](StringRef name, StringRef from = {},
                     Value routerWeights = {}) {
    mk::QuantizeColumnsOp::create(
        b, loc, buf[from.empty() ? name : from], buf[(name + "_t").str()],
        buf[(name + "_t_scale").str()], buf["row_route"], buf["offsets"],
        routerWeights);
  };
  if (s.fp8) {
    if (!s.mx)
      mk::QuantizeRowsOp::create(b, loc, buf["d_out"], buf["d_out_q"],
                                 buf["d_out_scale"], frame.tokens,
                                 /*offsets=*/Value());
    for (StringRef w : {"gate", "up", "down"})
      if (!s.fp8WeightInputs)
        mk::QuantizeWeightsOp::create(b, loc, buf[(w + "_weights").str()],
                                    buf[(w + "_qt").str()],
                                    buf[(w + "_scale_t").str()],
                                    /*transposed=*/true);
    columns("hidden");
    columns("routed_x");
    barrier();
    if (s.mx) // the routed bf16 rows, quantized
      mk::QuantizeRowsOp::create(b, loc, buf["routed_d_out"],
                                 buf["routed_d_out_q"],
                                 buf["routed_d_out_scale"], /*tokens=*/Value(),
                                 buf["offsets"]);
    else
      mk::GatherOp::create(b, loc, buf["d_out_q"], buf["row_route"],
                           buf["offsets"], buf["routed_d_out_q"],
                           /*scale=*/Value(), buf["d_out_scale"],
                           buf["routed_d_out_scale"], s.topK);
    columns("d_y", "d_out", buf["router_weights"]);
  }
  barrier();

  // Down dgrad (fp32, unscaled) and the down weights' gradients.
  gemms.routedDown(gathersDOut ? "d_out" : "routed_d_out", gathersDOut);
  if (shared)
    gemms.sharedDown();
  barrier();

  // SwiGLU backward and the router weights' gradient.
  mk::SwigluGradOp::create(
      b, loc, buf["d_hidden_u"], buf["gate"], buf["up"], buf["hidden"],
      buf["d_gate"], buf["d_up"], buf["row_route"], buf["route_row"],
      buf["router_weights"], buf["offsets"], buf["d_router_weights"],
      frame.tokens, limit);
  if (shared)
    mk::SwigluGradOp::create(
        b, loc, buf["d_shared_hidden_u"], buf["shared_gate"], buf["shared_up"],
        buf["shared_hidden"], buf["d_shared_gate"], buf["d_shared_up"], Value(),
        Value(), Value(), Value(), Value(), frame.tokens, limit);
  barrier();
  // FP8: d_gate's and d_up's row blocks (the dgrad) and column blocks (the
  // weights' gradients).
  if (s.fp8) {
    for (StringRef name : {"d_gate", "d_up"}) {
      mk::QuantizeRowsOp::create(b, loc, buf[name], buf[(name + "_q").str()],
                                 buf[(name + "_scale").str()],
                                 /*tokens=*/Value(), buf["offsets"]);
      columns(name);
    }
    barrier();
  }

  // The gate/up dgrad (both K-loops into one accumulator) and the gate and
  // up weights' gradients.
  gemms.gateUp(shared);
  barrier();

  // Reverse dispatch: each token sums its routed rows' d_x, in route order.
  mk::CombineOp::create(b, loc, buf["d_routed_x"], buf["route_row"],
                        /*router_weights=*/Value(),
                        shared ? buf["d_shared_x"] : Value(), buf["d_x"],
                        frame.tokens, /*poison=*/Value());
  if (clock)
    barrier();
  assert((!clock || frame.stamps == phases + 1) &&
         "backwardPhaseNames() must name every phase");
  (void)phases;
  gpu::ReturnOp::create(b, loc);
  return frame.status;
}

} // namespace

LogicalResult mok::moe_to_mk::planBackward(ModuleOp module, func::FuncOp func,
                                           LayerGradOp grad,
                                           const PlanOptions &options) {
  MLIRContext *ctx = module.getContext();
  const mk::TargetSupport &support = options.support;
  Sizes s = sizesOf(grad);
  std::optional<StringRef> precision = grad.getPrecision();
  s.fp8 = precision == StringRef("fp8") || precision == StringRef("mxfp8");
  s.mx = precision == StringRef("mxfp8");
  s.fp8WeightInputs = s.fp8 && options.fp8QuantizedWeights;
  SmallVector<StringRef> phases = backwardPhaseNames(grad, s);
  if (options.exchanges(grad.getPlanType()))
    return planBackwardEP(module, func, grad, options);
  BackwardMaps tc =
      backwardMapsFor(ctx, s, support, options.tensorCores, grad.recomputes(),
                      /*mayGatherDOut=*/true, options.warpSpecialize);
  SmallVector<Param> params =
      backwardParamsFor(grad, s, options.profile, tc.maps, tc.gatherDOut);
  unsigned block = tc.maps.empty() ? options.blockSize
                   : tc.producer   ? sched::producerBlock(tc.tileM)
                                   : sched::kBlock;
  OpBuilder b(ctx);
  gpu::GPUFuncOp kernel = createKernel(
      b, module, func, grad, "_backward", params, block,
      describeKernel(ctx, params, s, support.chip(), block, tc.maps,
                     options.profile ? ArrayRef<StringRef>(phases)
                                     : ArrayRef<StringRef>(),
                     /*cluster=*/1));
  return emitBackwardSchedule(b, grad, s, params, kernel,
                              static_cast<int64_t>(phases.size()), tc, support,
                              options.barrierTimeoutMs);
}
