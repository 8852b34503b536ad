// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok::HostExecutable: a module lowered by moe-to-cpu and JIT-compiled for
// the host by MLIR's ExecutionEngine. Kept apart from Compiler.cpp so that
// tools that only compile for GPUs do not link the JIT.
//
#include "mok/Compiler/Compiler.h"

#include "Context.h"

#include "mok/Conversion/MoEToCPU/MoEToCPU.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/TargetSelect.h"

#include <map>

using namespace mlir;
using namespace mok::detail;

namespace mok {

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
  static std::once_flag nativeTarget;
  std::call_once(nativeTarget, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
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
