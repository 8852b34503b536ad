// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What convert-moe-to-mk's forward and backward plans share: the kernel's
// description for the runtime, its gpu.func, and its GEMMs.
//
#include "KernelPlan.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CheckedArithmetic.h"

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

std::string Sizes::whyTooLarge() const {
  // Products and sums that stay empty once one overflows.
  using Size = std::optional<int64_t>;
  auto mul = [](Size a, Size b) -> Size {
    return a && b ? llvm::checkedMul(*a, *b) : std::nullopt;
  };
  auto add = [](Size a, Size b) -> Size {
    return a && b ? llvm::checkedAdd(*a, *b) : std::nullopt;
  };
  // The routes (route_row, 8 bytes each), the routed capacity, the largest
  // rows x columns buffer (fp32 at most: d_hidden_u), the weights and their
  // fp32 gradients, chunk_counts, and the tensor maps (128 bytes each, at
  // most 8 per expert).
  Size routes = mul(tokens, topK);
  Size capacity =
      add(maxRoutes ? Size(maxRoutes) : routes, mul(experts, padding - 1));
  int64_t cols = std::max({hidden, inter, sharedInter});
  Size sizes[] = {mul(routes, 8),
                  capacity,
                  mul(mul(add(capacity, tokens), cols), 4),
                  mul(mul(mul(experts, inter), hidden), 4),
                  mul(mul(sharedInter, hidden), 4),
                  mul(mul(add(routes, 1024), experts), 8),
                  mul(experts, 1024)};
  if (llvm::all_of(sizes, [](Size s) { return s.has_value(); }))
    return "";
  std::string why;
  llvm::raw_string_ostream os(why);
  os << "the layer's buffers are too large for 64-bit sizes (T = " << tokens
     << ", top_k = " << topK << ", E = " << experts << ", padding = " << padding
     << ", H = " << hidden << ", I = " << inter;
  if (hasShared())
    os << ", I_s = " << sharedInter;
  os << ")";
  return why;
}

TokenSize mok::moe_to_mk::callRowsOf(StringRef name, const Sizes &s) {
  // Rows indexed by token (the layer's tensors, the shared expert's), by
  // route (t * k + slot), and by routed row (the plan's segments).
  static const llvm::StringSet<> tokens = {
      "x",           "top_experts",       "router_weights", "out",
      "shared_gate", "shared_up",         "shared_hidden",  "shared_out",
      "d_out",       "d_x",               "d_router_weights",
      "d_shared_hidden_u", "d_shared_gate", "d_shared_up",  "d_shared_x"};
  static const llvm::StringSet<> routed = {
      "routed_x", "gate",         "up",         "hidden",    "routed_y",
      "row_route", "row_expert",  "routed_d_out", "d_y",     "d_hidden_u",
      "d_gate",   "d_up",         "d_routed_x"};
  if (tokens.contains(name))
    return s.tokenRows();
  if (name == "route_row")
    return s.routeRows();
  if (routed.contains(name))
    return s.routedRows();
  return {};
}

SmallVector<Param> mok::moe_to_mk::fp8Weights(MLIRContext *ctx, const Sizes &s,
                                              StringRef role, bool transposed,
                                              StringRef access) {
  Builder b(ctx);
  Type f8 = b.getType<Float8E4M3FNType>(), f32 = b.getF32Type();
  Type e8 = b.getType<Float8E8M0FNUType>();
  int64_t e = s.experts, h = s.hidden, in = s.inter;
  auto weights = [&](int64_t rows, int64_t cols) {
    return MemRefType::get({e, rows, cols}, f8);
  };
  auto scales = [&](int64_t rows, int64_t cols) {
    return s.mx ? MemRefType::get({e, (rows + 127) / 128, cols / 128, 512}, e8)
                : MemRefType::get({e, rows / 128, cols / 128}, f32);
  };
  // gate and up [I, H] and down [H, I], or their transposes.
  int64_t gateRows = transposed ? h : in, gateCols = transposed ? in : h;
  std::string q = transposed ? "_qt" : "_q";
  std::string scale = transposed ? "_scale_t" : "_scale";
  SmallVector<Param> params;
  for (StringRef w : {"gate", "up", "down"}) {
    bool down = w == "down";
    int64_t rows = down ? gateCols : gateRows,
            cols = down ? gateRows : gateCols;
    params.push_back(
        {w.str() + q, role.str(), weights(rows, cols), access.str()});
    params.push_back({w.str() + scale, role.str(), scales(rows, cols)});
  }
  return params;
}

int64_t mok::moe_to_mk::slotCount(ArrayRef<TensorMapSpec> maps) {
  int64_t n = 0;
  for (const TensorMapSpec &m : maps)
    n += m.experts;
  return n;
}

DictionaryAttr mok::moe_to_mk::describeKernel(
    MLIRContext *ctx, ArrayRef<Param> params, const Sizes &s, StringRef chip,
    unsigned blockSize, ArrayRef<TensorMapSpec> tensorMaps,
    ArrayRef<StringRef> phases, int64_t cluster) {
  Builder b(ctx);
  SmallVector<Attribute> ps;
  auto callRows = [&](StringRef name) {
    TokenSize rows = callRowsOf(name, s);
    return b.getNamedAttr(
        "call_rows", b.getDenseI64ArrayAttr({rows.scale, rows.offset}));
  };
  for (const Param &p : params) {
    // By value: the call's T, and an expert-parallel rank's rank and the
    // launch's epoch.
    if (p.role == "tokens" || p.role == "rank" || p.role == "epoch") {
      ps.push_back(b.getDictionaryAttr({
          b.getNamedAttr("name", b.getStringAttr(p.name)),
          b.getNamedAttr("role", b.getStringAttr(p.role)),
          b.getNamedAttr("dtype",
                         b.getStringAttr(p.role == "rank" ? "i32" : "i64")),
          b.getNamedAttr("shape", b.getDenseI64ArrayAttr({})),
      }));
      continue;
    }
    std::string dtype;
    llvm::raw_string_ostream(dtype) << p.type.getElementType();
    if (dtype == "i8") // bytes (the symmetric buffer)
      dtype = "u8";
    else if (dtype == "f8E4M3FN") // FP8 values (MOK_DTYPE_F8E4M3)
      dtype = "f8e4m3";
    else if (dtype == "f8E8M0FNU") // MX scales: bytes (e + 127)
      dtype = "u8";
    SmallVector<NamedAttribute> entry = {
        b.getNamedAttr("name", b.getStringAttr(p.name)),
        b.getNamedAttr("role", b.getStringAttr(p.role)),
        b.getNamedAttr("dtype", b.getStringAttr(dtype)),
        b.getNamedAttr("shape", b.getDenseI64ArrayAttr(p.type.getShape())),
    };
    if (callRowsOf(p.name, s).dynamic())
      entry.push_back(callRows(p.name));
    if (p.role == "input")
      entry.push_back(b.getNamedAttr("access", b.getStringAttr(p.access)));
    if (p.accumulate)
      entry.push_back(b.getNamedAttr("accumulate", b.getBoolAttr(true)));
    // What the kernel writes whole (not adding into it) starts on a 16-byte
    // boundary: the runtime refuses other addresses, and the epilogues
    // store 16 bytes at a time with no fallback for unaligned buffers.
    if ((p.role == "output" && !p.accumulate) || p.role == "workspace")
      entry.push_back(
          b.getNamedAttr("align", b.getI64IntegerAttr(kOutputAlignment)));
    ps.push_back(b.getDictionaryAttr(entry));
  }
  int64_t smem =
      tensorMaps.empty() ? 0 : sched::dynamicSharedMemory(chip == "sm_90a");
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("chip", b.getStringAttr(chip)),
      b.getNamedAttr("block", b.getI64IntegerAttr(blockSize)),
      b.getNamedAttr("grid", b.getStringAttr("persistent: one CTA per SM")),
      b.getNamedAttr("cooperative", b.getBoolAttr(true)),
      b.getNamedAttr("dynamic_shared_memory", b.getI64IntegerAttr(smem)),
      b.getNamedAttr("zero_before_first_launch",
                     b.getArrayAttr({b.getStringAttr("grid_barrier")})),
      b.getNamedAttr("params", b.getArrayAttr(ps)),
  };
  // A layer's routed rows (a quantizer kernel has no experts, no rows).
  if (s.experts)
    entries.push_back(b.getNamedAttr("routed_capacity",
                                     b.getI64IntegerAttr(s.routedCapacity())));
  // Any T: the largest T a call may have.
  if (s.anyTokens) {
    entries.push_back(b.getNamedAttr("any_tokens", b.getBoolAttr(true)));
    entries.push_back(
        b.getNamedAttr("max_tokens", b.getI64IntegerAttr(s.tokens)));
  }
  // CTAs per cluster (launched as clusters of that many, grid a multiple).
  if (cluster > 1)
    entries.push_back(b.getNamedAttr("cluster", b.getI64IntegerAttr(cluster)));
  // Entry i covers `experts` consecutive CUtensorMaps in the `tensor_maps`
  // parameter (128 bytes each): of the buffer's dtype (bf16, or FP8 as
  // bytes), 2-D {cols, rows} with a row stride of row_stride elements, box
  // {box_cols, box_rows}, SWIZZLE_128B, no interleave, OOB zero fill; slot
  // e of a per-expert entry views expert e's matrix.
  if (!tensorMaps.empty()) {
    SmallVector<Attribute> maps;
    for (const TensorMapSpec &m : tensorMaps) {
      SmallVector<NamedAttribute> entry = {
          b.getNamedAttr("buffer", b.getStringAttr(m.buffer)),
          b.getNamedAttr("rows", b.getI64IntegerAttr(m.rows)),
          b.getNamedAttr("cols", b.getI64IntegerAttr(m.cols)),
          b.getNamedAttr("row_stride", b.getI64IntegerAttr(m.rowStride)),
          b.getNamedAttr("box_rows", b.getI64IntegerAttr(m.boxRows)),
          b.getNamedAttr("box_cols", b.getI64IntegerAttr(m.boxCols)),
          b.getNamedAttr("experts", b.getI64IntegerAttr(m.experts)),
      };
      // Any T: the map's rows at a call (TMA reads the rows past them as
      // zeros: a buffer's rows past the call's hold stale values).
      if (m.experts == 1 && callRowsOf(m.buffer, s).dynamic())
        entry.push_back(callRows(m.buffer));
      maps.push_back(b.getDictionaryAttr(entry));
    }
    entries.push_back(b.getNamedAttr("tensor_maps", b.getArrayAttr(maps)));
  }
  if (!phases.empty()) {
    SmallVector<Attribute> names;
    for (StringRef n : phases)
      names.push_back(b.getStringAttr(n));
    entries.push_back(b.getNamedAttr("phases", b.getArrayAttr(names)));
  }
  return b.getDictionaryAttr(entries);
}

gpu::GPUFuncOp mok::moe_to_mk::createKernel(OpBuilder &b, ModuleOp module,
                                            func::FuncOp func, Operation *layer,
                                            StringRef suffix,
                                            ArrayRef<Param> params,
                                            unsigned block,
                                            DictionaryAttr description) {
  b.setInsertionPointToEnd(module.getBody());
  std::string name = func.getSymName().str();
  auto gpuModule =
      gpu::GPUModuleOp::create(b, layer->getLoc(), name + "_kernels");
  b.setInsertionPointToEnd(gpuModule.getBody());
  SmallVector<Type> argTypes;
  for (const Param &p : params)
    argTypes.push_back(p.role == "tokens" || p.role == "epoch"
                           ? Type(b.getI64Type())
                       : p.role == "rank" ? Type(b.getI32Type())
                                          : Type(p.type));
  auto kernel = gpu::GPUFuncOp::create(b, layer->getLoc(), name + suffix.str(),
                                       b.getFunctionType(argTypes, {}));
  kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  kernel.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({static_cast<int32_t>(block), 1, 1}));
  // Persistent: one CTA per SM. Said to ptxas (.minnctapersm 1), whose
  // default is to aim for more CTAs per SM and so fewer registers (on
  // sm_100a it capped a layer at 80 registers and spilled).
  kernel->setAttr("nvvm.minctasm", b.getI32IntegerAttr(1));
  kernel->setAttr("mok.kernel", description);
  b.setInsertionPointToStart(&kernel.getBody().front());
  return kernel;
}

void ScheduleBuilder::gemm(const GemmPlan &g) {
  bool tc = !g.maps.empty();
  MLIRContext *ctx = b.getContext();
  mk::GemmScheduleAttr schedule =
      tc ? mk::GemmScheduleAttr::get(
               ctx, g.engine,
               {g.tileM, g.tileN, sched::tileK(/*fp8=*/!g.scales.empty())},
               sched::kStages,
               g.producer,
               g.producer && g.registers ? g.registers.asArrayRef()
                                         : ArrayRef<int64_t>(),
               g.multicast)
         : mk::GemmScheduleAttr::get(ctx, mk::Engine::simt);
  auto op = mk::GemmOp::create(
      b, loc, g.epilogue, g.a, g.b, g.out, g.rowExpert, g.offsets,
      tc ? g.tensorMaps : Value(), g.gatherRows, tc ? g.paddingRows : Value(),
      g.a2, g.kOffsets, g.kCounts, g.saves, g.scales,
      // (Any T: a GEMM over token rows reads the call's T.)
      g.rowExpert || g.kOffsets ? Value() : tokens, schedule, g.limit,
      tc ? b.getDenseI64ArrayAttr(g.maps) : DenseI64ArrayAttr(),
      g.gatherRows ? b.getI64IntegerAttr(g.gatherTopK) : IntegerAttr(),
      g.transposeA, g.transposeB, g.accumulate);
  // The plan asks the chip's lowering about every GEMM before it goes on:
  // a GEMM it does not implement is the planner's error, reported here
  // rather than by convert-mk-to-gpu.
  if (std::string why = support.whyNot(mk::GemmForm::of(op), schedule);
      !why.empty()) {
    op.emitError() << "convert-moe-to-mk: the planned " << g.role
                   << " GEMM is not implemented on " << support.chip() << ": "
                   << why;
    status = failure();
  }
}
