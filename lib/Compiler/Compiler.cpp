// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "mok/Compiler/Compiler.h"

#include "mok/Conversion/MoEToCPU/MoEToCPU.h"
#include "mok/Conversion/MoEToGPU/MoEToGPU.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"
#include "mok/InitAllDialects.h"
#include "mok/InitAllPasses.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"

#include <map>
#include <mutex>

using namespace mlir;

namespace {
/// Passes and pipelines are registered once per process, for parsing
/// pipeline strings.
void registerOnce() {
  static std::once_flag flag;
  std::call_once(flag, [] {
    mok::registerAllPasses();
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

/// Collects every diagnostic reported while it lives, as text with locations.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext *ctx)
      : handler(ctx, [this](Diagnostic &diag) {
          llvm::raw_string_ostream os(text);
          os << location(diag.getLocation()) << ": " << severity(diag) << diag
             << "\n";
          for (Diagnostic &note : diag.getNotes())
            os << location(note.getLocation()) << ": note: " << note << "\n";
          return success();
        }) {}
  std::string take(const char *fallback) {
    return text.empty() ? std::string(fallback) : std::move(text);
  }

private:
  /// file:line:col, as compilers print it, when the location has one.
  static std::string location(Location loc) {
    std::string s;
    llvm::raw_string_ostream os(s);
    if (auto flc = dyn_cast<FileLineColLoc>(loc))
      os << flc.getFilename().getValue() << ":" << flc.getLine() << ":"
         << flc.getColumn();
    else if (auto fused = dyn_cast<FusedLoc>(loc);
             fused && !fused.getLocations().empty())
      return location(fused.getLocations().front());
    else
      os << loc;
    return s;
  }
  static const char *severity(Diagnostic &d) {
    switch (d.getSeverity()) {
    case DiagnosticSeverity::Error:
      return "error: ";
    case DiagnosticSeverity::Warning:
      return "warning: ";
    case DiagnosticSeverity::Remark:
      return "remark: ";
    default:
      return "note: ";
    }
  }
  std::string text;
  ScopedDiagnosticHandler handler;
};

std::unique_ptr<MLIRContext> makeContext() {
  DialectRegistry registry;
  mok::registerAllDialects(registry);
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  auto ctx = std::make_unique<MLIRContext>(registry);
  ctx->loadAllAvailableDialects();
  // Diagnostics name their op, not the whole module.
  ctx->printOpOnDiagnostic(false);
  return ctx;
}
} // namespace

namespace mok {

struct Module::Impl {
  std::unique_ptr<MLIRContext> ctx;
  OwningOpRef<ModuleOp> module;
};

Module::Module() : impl(std::make_unique<Impl>()) {}
Module::~Module() = default;
Module::Module(Module &&) noexcept = default;
Module &Module::operator=(Module &&) noexcept = default;

std::unique_ptr<Module> Module::parse(const std::string &source,
                                      const std::string &name,
                                      std::string &error) {
  registerOnce();
  std::unique_ptr<Module> m(new Module());
  m->impl->ctx = makeContext();
  DiagnosticCollector diags(m->impl->ctx.get());
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(source, name), llvm::SMLoc());
  m->impl->module = parseSourceFile<ModuleOp>(sourceMgr, m->impl->ctx.get());
  if (!m->impl->module) {
    error = diags.take("failed to parse the module");
    return nullptr;
  }
  return m;
}

bool Module::runPipeline(const std::string &pipeline, std::string &error) {
  DiagnosticCollector diags(impl->ctx.get());
  PassManager pm(impl->ctx.get());
  std::string parseError;
  llvm::raw_string_ostream errOs(parseError);
  if (failed(parsePassPipeline(pipeline, pm, errOs))) {
    error = "invalid pass pipeline '" + pipeline + "': " + parseError;
    return false;
  }
  if (failed(pm.run(*impl->module))) {
    error = diags.take("pass pipeline failed");
    return false;
  }
  return true;
}

std::string Module::print() const {
  std::string s;
  llvm::raw_string_ostream os(s);
  impl->module->print(os);
  return s;
}

static TensorInfo tensorInfo(Type type) {
  TensorInfo info;
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped) {
    llvm::raw_string_ostream(info.dtype) << type;
    return info;
  }
  for (int64_t d : shaped.getShape())
    info.shape.push_back(ShapedType::isDynamic(d) ? -1 : d);
  llvm::raw_string_ostream(info.dtype) << shaped.getElementType();
  return info;
}

static std::string roleOf(DictionaryAttr attrs) {
  if (!attrs)
    return "";
  if (auto saved = attrs.getAs<StringAttr>("moe.saved"))
    return ("saved:" + saved.getValue()).str();
  if (attrs.get("moe.cotangent"))
    return "cotangent";
  if (auto of = attrs.getAs<IntegerAttr>("moe.gradient_of"))
    return "gradient_of:" + std::to_string(of.getInt());
  return "";
}

std::vector<FunctionInfo> Module::functions() const {
  std::vector<FunctionInfo> out;
  for (auto func : impl->module->getOps<func::FuncOp>()) {
    FunctionInfo info;
    info.name = func.getSymName().str();
    for (auto [i, t] : llvm::enumerate(func.getArgumentTypes())) {
      info.args.push_back(tensorInfo(t));
      info.args.back().role = roleOf(func.getArgAttrDict(i));
    }
    for (auto [i, t] : llvm::enumerate(func.getResultTypes())) {
      info.results.push_back(tensorInfo(t));
      info.results.back().role = roleOf(func.getResultAttrDict(i));
    }
    // Name the arguments after the layer operands they feed, and take the
    // routing parameters from the layer's plan.
    auto nameArgs = [&](auto layer, moe::PlanType plan) {
      auto name = [&](Value v, const char *n) {
        if (auto arg = dyn_cast<BlockArgument>(v);
            arg && arg.getOwner()->isEntryBlock() &&
            arg.getParentRegion() == &func.getBody())
          info.args[arg.getArgNumber()].name = n;
      };
      name(layer.getX(), "x");
      name(layer.getTopExperts(), "top_experts");
      name(layer.getRouterWeights(), "router_weights");
      name(layer.getGateWeights(), "gate_weights");
      name(layer.getUpWeights(), "up_weights");
      name(layer.getDownWeights(), "down_weights");
      if (layer.hasSharedExpert()) {
        name(layer.getSharedWeights()[0], "shared_gate_weights");
        name(layer.getSharedWeights()[1], "shared_up_weights");
        name(layer.getSharedWeights()[2], "shared_down_weights");
      }
      info.hasPlan = true;
      info.tokens = plan.hasStaticTokens() ? plan.getTokens() : -1;
      info.topK = plan.getTopK();
      info.experts = plan.getExperts();
      info.ep = plan.getEp();
      info.padding = plan.getPadding();
    };
    func.walk([&](moe::LayerOp l) { nameArgs(l, l.getPlanType()); });
    func.walk([&](moe::LayerGradOp g) {
      nameArgs(g, g.getPlanType());
      if (auto arg = dyn_cast<BlockArgument>(g.getDOut()))
        info.args[arg.getArgNumber()].name = "d_out";
    });
    for (TensorInfo &arg : info.args)
      if (arg.name.empty() && arg.role.rfind("saved:", 0) == 0)
        arg.name = arg.role.substr(6);
    out.push_back(std::move(info));
  }
  return out;
}

/// Strings, integers, booleans, arrays and dictionaries of the `mok.kernel`
/// description as JSON (e.g. the tensor_maps entries).
static llvm::json::Value toJson(Attribute a) {
  if (auto s = dyn_cast<StringAttr>(a))
    return s.getValue().str();
  if (auto b = dyn_cast<BoolAttr>(a)) // before IntegerAttr: a BoolAttr is one
    return b.getValue();
  if (auto i = dyn_cast<IntegerAttr>(a))
    return i.getInt();
  if (auto arr = dyn_cast<DenseI64ArrayAttr>(a)) {
    llvm::json::Array items;
    for (int64_t v : arr.asArrayRef())
      items.push_back(v);
    return items;
  }
  if (auto arr = dyn_cast<ArrayAttr>(a)) {
    llvm::json::Array items;
    for (Attribute e : arr)
      items.push_back(toJson(e));
    return items;
  }
  if (auto dict = dyn_cast<DictionaryAttr>(a)) {
    llvm::json::Object o;
    for (NamedAttribute n : dict)
      o[n.getName().getValue()] = toJson(n.getValue());
    return o;
  }
  return nullptr;
}

/// The runtime's view of a kernel, from its `mok.kernel` attribute.
static std::string metadataJson(gpu::GPUFuncOp func, StringRef function) {
  auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel");
  llvm::json::Object root;
  root["mok_metadata_version"] = 1;
  root["function"] = function.str();
  root["kernel"] = func.getName().str();
  for (NamedAttribute a : desc) {
    StringRef key = a.getName().getValue();
    if (key == "params")
      continue;
    if (auto s = dyn_cast<StringAttr>(a.getValue()))
      root[key] = s.getValue().str();
    else if (auto b = dyn_cast<BoolAttr>(a.getValue())) // before IntegerAttr
      root[key] = b.getValue();
    else if (auto i = dyn_cast<IntegerAttr>(a.getValue()))
      root[key] = i.getInt();
    else if (auto arr = dyn_cast<ArrayAttr>(a.getValue()))
      root[key] = toJson(arr);
  }
  llvm::json::Array params;
  for (Attribute p : cast<ArrayAttr>(desc.get("params"))) {
    auto d = cast<DictionaryAttr>(p);
    llvm::json::Array shape;
    for (int64_t v : cast<DenseI64ArrayAttr>(d.get("shape")).asArrayRef())
      shape.push_back(v);
    params.push_back(llvm::json::Object{
        {"name", cast<StringAttr>(d.get("name")).getValue().str()},
        {"role", cast<StringAttr>(d.get("role")).getValue().str()},
        {"dtype", cast<StringAttr>(d.get("dtype")).getValue().str()},
        {"shape", std::move(shape)}});
  }
  root["params"] = std::move(params);
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root)));
  return s;
}

bool Module::compileGPU(const std::string &chip, const std::string &toolkit,
                        std::vector<GpuKernel> &kernels,
                        std::string &error) const {
  DiagnosticCollector diags(impl->ctx.get());
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>((*impl->module)->clone());
  PassManager toKernels(impl->ctx.get());
  buildMoEToGPUPipeline(toKernels, chip);
  if (failed(toKernels.run(*copy))) {
    error = diags.take("lowering to GPU kernels failed");
    return false;
  }
  std::map<std::string, GpuKernel> byModule;
  for (auto gm : copy->getOps<gpu::GPUModuleOp>())
    for (auto func : gm.getOps<gpu::GPUFuncOp>()) {
      if (!func->hasAttr("mok.kernel"))
        continue;
      GpuKernel k;
      k.kernel = func.getName().str();
      StringRef module = gm.getName();
      k.function = module.drop_back(strlen("_kernels")).str();
      k.metadata = metadataJson(func, k.function);
      byModule[module.str()] = std::move(k);
    }
  if (byModule.empty()) {
    error = "no fused forward MoE layer to compile for the GPU";
    return false;
  }
  PassManager toPTX(impl->ctx.get());
  buildGPUToPTXPipeline(toPTX, chip, toolkit);
  if (failed(toPTX.run(*copy))) {
    error = diags.take("PTX emission failed");
    return false;
  }
  for (auto bin : copy->getOps<gpu::BinaryOp>()) {
    auto it = byModule.find(bin.getName().str());
    if (it == byModule.end())
      continue;
    for (Attribute o : bin.getObjects())
      it->second.ptx = cast<gpu::ObjectAttr>(o).getObject().getValue().str();
    kernels.push_back(std::move(it->second));
  }
  return true;
}

struct HostExecutable::Impl {
  std::unique_ptr<MLIRContext> ctx;
  OwningOpRef<ModuleOp> module;
  std::unique_ptr<ExecutionEngine> engine;
  std::map<std::string, std::vector<int64_t>> ranks; // per C-interface function
};

HostExecutable::HostExecutable() : impl(std::make_unique<Impl>()) {}
HostExecutable::~HostExecutable() = default;

std::unique_ptr<HostExecutable> HostExecutable::compile(const Module &module,
                                                        std::string &error) {
  registerOnce();
  std::unique_ptr<HostExecutable> exe(new HostExecutable());
  Impl &impl = *exe->impl;
  // A private context: the executable outlives any further change to
  // `module` and may be used from another thread.
  impl.ctx = makeContext();
  DiagnosticCollector diags(impl.ctx.get());
  impl.module = parseSourceString<ModuleOp>(module.print(), impl.ctx.get());
  if (!impl.module) {
    error = diags.take("failed to copy the module");
    return nullptr;
  }

  PassManager toLoops(impl.ctx.get());
  toLoops.addPass(createConvertMoEToCPU());
  if (failed(toLoops.run(*impl.module))) {
    error = diags.take("convert-moe-to-cpu failed");
    return nullptr;
  }
  for (auto func : impl.module->getOps<func::FuncOp>()) {
    if (!func->hasAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName()))
      continue;
    std::vector<int64_t> ranks;
    for (Type t : func.getArgumentTypes())
      ranks.push_back(cast<MemRefType>(t).getRank());
    impl.ranks[func.getSymName().str()] = std::move(ranks);
  }
  PassManager toLLVM(impl.ctx.get());
  buildHostLoopsToLLVMPipeline(toLLVM);
  if (failed(toLLVM.run(*impl.module))) {
    error = diags.take("lowering to the LLVM dialect failed");
    return nullptr;
  }
  exe->lowered.clear();
  {
    llvm::raw_string_ostream os(exe->lowered);
    impl.module->print(os);
  }

  ExecutionEngineOptions options;
  auto transformer = makeOptimizingTransformer(/*optLevel=*/2, 0, nullptr);
  options.transformer = transformer;
  auto engine = ExecutionEngine::create(*impl.module, options);
  if (!engine) {
    error = "JIT compilation failed: " + llvm::toString(engine.takeError());
    return nullptr;
  }
  impl.engine = std::move(*engine);
  return exe;
}

std::vector<int64_t> HostExecutable::signature(const std::string &function,
                                               std::string &error) const {
  auto it = impl->ranks.find(function);
  if (it == impl->ranks.end()) {
    error = "no MoE function named '" + function + "' in the module";
    return {};
  }
  return it->second;
}

bool HostExecutable::invoke(const std::string &function,
                            const std::vector<BufferView> &buffers,
                            std::string &error) {
  std::vector<int64_t> ranks = signature(function, error);
  if (ranks.empty() && !error.empty())
    return false;
  if (ranks.size() != buffers.size()) {
    error = "'" + function + "' takes " + std::to_string(ranks.size()) +
            " buffers, got " + std::to_string(buffers.size());
    return false;
  }
  // One memref descriptor per buffer: {allocated, aligned, offset,
  // sizes[rank], strides[rank]}, all 64-bit.
  std::vector<std::vector<int64_t>> descriptors(buffers.size());
  std::vector<void *> descriptorPtrs(buffers.size());
  std::vector<void *> args(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferView &b = buffers[i];
    if ((int64_t)b.sizes.size() != ranks[i] ||
        b.strides.size() != b.sizes.size()) {
      error = "buffer #" + std::to_string(i) + " of '" + function +
              "' must have rank " + std::to_string(ranks[i]) + ", got " +
              std::to_string(b.sizes.size());
      return false;
    }
    auto &d = descriptors[i];
    d.push_back(reinterpret_cast<int64_t>(b.data));
    d.push_back(reinterpret_cast<int64_t>(b.data));
    d.push_back(0);
    d.insert(d.end(), b.sizes.begin(), b.sizes.end());
    d.insert(d.end(), b.strides.begin(), b.strides.end());
    descriptorPtrs[i] = d.data();
    args[i] = &descriptorPtrs[i];
  }
  if (llvm::Error err =
          impl->engine->invokePacked("_mlir_ciface_" + function, args)) {
    error = "calling '" + function + "' failed: " + llvm::toString(std::move(err));
    return false;
  }
  return true;
}

} // namespace mok
