// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok::Module: parse, run pipelines, describe functions, compile for GPUs.
//
#include "mok/Compiler/Compiler.h"

#include "Context.h"

#include "mok/Conversion/MoEToPTX/MoEToPTX.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"

#include <chrono>
#include <cstring>
#include <map>

using namespace mlir;
using namespace mok::detail;

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
      info.maxTokens = plan.getMaxTokens();
      info.recvCapacity = plan.getRecvCapacity();
    };
    func.walk([&](moe::LayerOp l) {
      nameArgs(l, l.getPlanType());
      if (std::optional<StringRef> p = l.getPrecision())
        info.precision = p->str();
    });
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
  // Version 2: params' "access" and tensor maps' "experts"; version 3:
  // "cluster"; version 4: a kernel for any token count ("any_tokens", the
  // "tokens" parameter, "call_rows"); version 5: params' "align", which
  // an older runtime would not enforce (docs/Runtime.md).
  auto anyTokens = desc.getAs<BoolAttr>("any_tokens");
  bool aligns = llvm::any_of(
      cast<ArrayAttr>(desc.get("params")), [](Attribute p) {
        return cast<DictionaryAttr>(p).get("align") != nullptr;
      });
  root["mok_metadata_version"] =
      aligns ? 5 : anyTokens && anyTokens.getValue() ? 4 : 3;
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
    llvm::json::Object param{
        {"name", cast<StringAttr>(d.get("name")).getValue().str()},
        {"role", cast<StringAttr>(d.get("role")).getValue().str()},
        {"dtype", cast<StringAttr>(d.get("dtype")).getValue().str()},
        {"shape", std::move(shape)}};
    if (auto access = d.getAs<StringAttr>("access"))
      param["access"] = access.getValue().str();
    if (auto accumulate = d.getAs<BoolAttr>("accumulate"))
      param["accumulate"] = accumulate.getValue();
    if (auto rows = d.getAs<DenseI64ArrayAttr>("call_rows"))
      param["call_rows"] = toJson(rows);
    if (auto align = d.getAs<IntegerAttr>("align"))
      param["align"] = align.getInt();
    params.push_back(std::move(param));
  }
  root["params"] = std::move(params);
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root)));
  return s;
}

/// Erases the functions of `module` that are not in `names` and that
/// nothing calls; an error when a name has no function.
static bool keepFunctions(ModuleOp module,
                          const std::vector<std::string> &names,
                          std::string &error) {
  for (const std::string &name : names) {
    if (module.lookupSymbol<func::FuncOp>(name))
      continue;
    error = "no function @" + name + " to compile; the module has";
    for (auto func : module.getOps<func::FuncOp>())
      error += " @" + func.getSymName().str();
    return false;
  }
  for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
    if (!llvm::is_contained(names, func.getSymName()) &&
        SymbolTable::symbolKnownUseEmpty(func, module))
      func.erase();
  return true;
}

/// Every stage a GPU compile can print, in pipeline order.
static constexpr StringLiteral kStageNames[] = {"moe", "training", "mk", "gpu",
                                                "llvm"};

bool Module::compileGPU(const CompileOptions &options,
                        std::vector<GpuKernel> &kernels, std::string &error,
                        std::vector<Stage> *stages) const {
  GpuCompileRequest request;
  if (stages)
    request.stageNames.assign(std::begin(kStageNames), std::end(kStageNames));
  if (!compileGPU(options, kernels, error, request))
    return false;
  if (stages)
    for (Stage &s : request.stages)
      stages->push_back(std::move(s));
  return true;
}

bool Module::compileGPU(const CompileOptions &options,
                        std::vector<GpuKernel> &kernels, std::string &error,
                        GpuCompileRequest &request) const {
  using Clock = std::chrono::steady_clock;
  auto secondsSince = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  if (std::string why = options.validate(); !why.empty()) {
    error = "invalid compile options: " + why;
    return false;
  }
  for (const std::string &name : request.stageNames)
    if (!llvm::is_contained(kStageNames, name)) {
      error = "unknown stage '" + name +
              "'; expected moe, training, mk, gpu or llvm";
      return false;
    }
  DiagnosticCollector diags(impl->ctx.get());
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>((*impl->module)->clone());
  double printing = 0;
  auto print = [&](const char *name) {
    if (!llvm::is_contained(request.stageNames, name))
      return;
    Clock::time_point start = Clock::now();
    std::string ir;
    llvm::raw_string_ostream os(ir);
    copy->print(os);
    request.stages.push_back({name, std::move(ir)});
    printing += secondsSince(start);
  };
  PTXEmissionTimes ptx;
  // Runs one step on the copy; prints the IR it leaves, if asked to.
  auto step = [&](PTXStep s, const char *failure) {
    Clock::time_point start = Clock::now();
    PassManager pm(impl->ctx.get());
    pm.enableVerifier(request.verifyEachPass);
    buildPTXStep(pm, s, options, &ptx);
    if (failed(pm.run(*copy))) {
      error = diags.take(failure);
      return false;
    }
    // The IR the NVPTX back end gets is verified, once.
    if (s == PTXStep::LLVM && failed(verify(*copy))) {
      error = diags.take("lowering to the LLVM dialect left invalid IR");
      return false;
    }
    request.times.push_back({stageName(s), secondsSince(start)});
    if (s != PTXStep::PTX)
      print(stageName(s));
    return true;
  };
  print("moe");
  if (options.training &&
      !step(PTXStep::Training, "deriving the training functions failed"))
    return false;
  if (!request.functions.empty() &&
      !keepFunctions(*copy, request.functions, error))
    return false;
  for (PTXStep s : {PTXStep::MK, PTXStep::GPU})
    if (!step(s, "lowering to GPU kernels failed"))
      return false;
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
    error = "no fused MoE layer or quantizer function to compile for the GPU";
    return false;
  }
  for (PTXStep s : {PTXStep::LLVM, PTXStep::PTX})
    if (!step(s, "PTX emission failed"))
      return false;
  for (auto bin : copy->getOps<gpu::BinaryOp>()) {
    auto it = byModule.find(bin.getName().str());
    if (it == byModule.end())
      continue;
    for (Attribute o : bin.getObjects())
      it->second.ptx = cast<gpu::ObjectAttr>(o).getObject().getValue().str();
    kernels.push_back(std::move(it->second));
  }
  request.times.push_back({"ptx.translate", ptx.translate});
  request.times.push_back({"ptx.link", ptx.link});
  request.times.push_back({"ptx.optimize", ptx.optimize});
  request.times.push_back({"ptx.codegen", ptx.codegen});
  request.times.push_back({"print", printing});
  return true;
}

} // namespace mok
