// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The PTX step of moe-to-ptx: every kernel module (gpu.module with an NVVM
// target) to a gpu.binary holding its PTX, the modules in parallel.
//
// It does what gpu-module-to-binary does with format=isa (MLIR's NVVM
// serializer: translation to LLVM IR, libdevice linked where called, LLVM's
// O3 pipeline, the NVPTX back end at CodeGenOptLevel::Aggressive), with
// three differences:
//  - the O3 pipeline runs without the SLP vectorizer (see optimizeModule):
//    on the layers' kernels the PTX is the same byte for byte, and the
//    optimizer takes a fifth to a third less time;
//  - the kernel modules are serialized in parallel, on the context's
//    threads (a training compile has two large ones, the training forward
//    and the backward);
//  - the object carries no LLVMIRToISATimeInMs property (a time stamp that
//    made two compiles of one layer differ).
// It is not declared in Passes.td: it is internal to the pipeline, and it
// takes a pointer for its timings, which no textual option can carry.
//
#include "mok/Conversion/MoEToPTX/MoEToPTX.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Threading.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Target/LLVM/NVVM/Utils.h"

#include "llvm/IR/Module.h"
#include "llvm/Passes/OptimizationLevel.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Target/TargetMachine.h"

#include <chrono>

using namespace mlir;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// One kernel module's PTX and how long its parts took.
struct ModulePTX {
  SmallVector<char, 0> ptx;
  mok::PTXEmissionTimes times;
};

/// MLIR's NVVM serialization (SerializeGPUModuleBase: translation,
/// libdevice, optimization), timed, with the PTX text as the object.
class PTXSerializer : public NVVM::SerializeGPUModuleBase {
public:
  PTXSerializer(gpu::GPUModuleOp module, NVVM::NVVMTargetAttr target,
                const gpu::TargetOptions &options, ModulePTX &out)
      : SerializeGPUModuleBase(*module, target, options), out(out) {}

protected:
  /// LLVM's default pipeline at the target's level (O3), timed: MLIR's
  /// (ModuleToObject::optimizeModule) less the SLP vectorizer. The
  /// kernels have nothing for it to pair (their bf16 pairs and wide loads
  /// and stores are vector operations already): it changed nothing in them
  /// and took 20-39 % of O3's time. Without it the PTX of every example
  /// layer, forward and training, sm_90a and sm_100a, is the same byte for
  /// byte. The back end runs at the same level, as MLIR's sets it.
  LogicalResult optimizeModule(llvm::Module &module, int optLevel) override {
    Clock::time_point start = Clock::now();
    std::optional<llvm::OptimizationLevel> level;
    switch (optLevel) {
    case 0: level = llvm::OptimizationLevel::O0; break;
    case 1: level = llvm::OptimizationLevel::O1; break;
    case 2: level = llvm::OptimizationLevel::O2; break;
    case 3: level = llvm::OptimizationLevel::O3; break;
    }
    if (!level)
      return getOperation().emitError()
             << "the NVVM target's optimization level O must be 0 to 3, not "
             << optLevel;
    FailureOr<llvm::TargetMachine *> machine = getOrCreateTargetMachine();
    if (failed(machine))
      return getOperation().emitError()
             << "no LLVM target machine for " << triple << " (" << chip << ")";
    (*machine)->setOptLevel(static_cast<llvm::CodeGenOptLevel>(optLevel));

    llvm::PipelineTuningOptions tuning;
    tuning.LoopUnrolling = true;
    tuning.LoopInterleaving = true;
    tuning.LoopVectorization = true;
    tuning.SLPVectorization = false;
    llvm::PassBuilder builder(*machine, tuning);
    llvm::LoopAnalysisManager loops;
    llvm::FunctionAnalysisManager functions;
    llvm::CGSCCAnalysisManager sccs;
    llvm::ModuleAnalysisManager modules;
    builder.registerModuleAnalyses(modules);
    builder.registerCGSCCAnalyses(sccs);
    builder.registerFunctionAnalyses(functions);
    builder.registerLoopAnalyses(loops);
    builder.crossRegisterProxies(loops, functions, sccs, modules);
    llvm::ModulePassManager pipeline =
        builder.buildPerModuleDefaultPipeline(*level);
    pipeline.run(module, modules);
    out.times.optimize += secondsSince(start);
    return success();
  }

  /// The PTX text.
  FailureOr<SmallVector<char, 0>>
  moduleToObject(llvm::Module &module) override {
    Clock::time_point start = Clock::now();
    FailureOr<llvm::TargetMachine *> machine = getOrCreateTargetMachine();
    if (failed(machine))
      return getOperation().emitError()
             << "no LLVM target machine for " << triple << " (" << chip << ")";
    FailureOr<SmallString<0>> ptx = translateModuleToISA(
        module, **machine, [&] { return getOperation().emitError(); });
    if (failed(ptx))
      return failure();
    out.times.codegen += secondsSince(start);
    return SmallVector<char, 0>(ptx->begin(), ptx->end());
  }

private:
  ModulePTX &out;
};

struct EmitPTXPass
    : public PassWrapper<EmitPTXPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(EmitPTXPass)

  EmitPTXPass(std::string toolkit, mok::PTXEmissionTimes *times)
      : toolkit(std::move(toolkit)), times(times) {}

  StringRef getArgument() const final { return "mok-emit-ptx"; }
  StringRef getDescription() const final {
    return "Kernel modules (NVVM targets) to gpu.binary ops holding PTX";
  }
  void getDependentDialects(DialectRegistry &registry) const override {
    registry.insert<gpu::GPUDialect, NVVM::NVVMDialect>();
  }

  void runOnOperation() override {
    SmallVector<gpu::GPUModuleOp> kernels(
        getOperation().getOps<gpu::GPUModuleOp>());
    // Every (module, target) pair is serialized on its own.
    struct Job {
      gpu::GPUModuleOp module;
      NVVM::NVVMTargetAttr target;
      size_t size; // operations in the module
      ModulePTX result;
    };
    SmallVector<Job> jobs;
    for (gpu::GPUModuleOp module : kernels) {
      ArrayAttr targets = module.getTargetsAttr();
      if (!targets || targets.empty()) {
        module.emitError("the kernel module has no target to emit PTX for");
        return signalPassFailure();
      }
      for (Attribute t : targets) {
        auto nvvm = dyn_cast<NVVM::NVVMTargetAttr>(t);
        if (!nvvm) {
          module.emitError() << "PTX is emitted for NVVM targets only, not "
                             << t;
          return signalPassFailure();
        }
        size_t size = 0;
        module->walk([&](Operation *) { ++size; });
        jobs.push_back({module, nvvm, size, {}});
      }
    }
    // The largest first: the threads take the jobs in order, and a large
    // module started last would finish alone.
    llvm::stable_sort(jobs,
                      [](const Job &a, const Job &b) { return a.size > b.size; });
    NVVM::SerializeGPUModuleBase::init();
    LogicalResult serialized = failableParallelForEach(
        &getContext(), jobs, [&](Job &job) -> LogicalResult {
          Clock::time_point start = Clock::now(), translated, linked;
          auto afterTranslation = [&](llvm::Module &) {
            translated = Clock::now();
          };
          auto afterLinking = [&](llvm::Module &) { linked = Clock::now(); };
          gpu::TargetOptions options(
              toolkit, {}, {}, {}, gpu::CompilationTarget::Assembly, {},
              afterTranslation, afterLinking);
          PTXSerializer serializer(job.module, job.target, options,
                                   job.result);
          std::optional<SmallVector<char, 0>> ptx = serializer.run();
          if (!ptx)
            return job.module.emitError("PTX emission failed");
          job.result.ptx = std::move(*ptx);
          auto seconds = [](Clock::time_point a, Clock::time_point b) {
            return std::chrono::duration<double>(b - a).count();
          };
          job.result.times.translate = seconds(start, translated);
          job.result.times.link = seconds(translated, linked);
          return success();
        });
    if (failed(serialized))
      return signalPassFailure();

    // The binaries replace the modules, in order, on this thread.
    Builder attrs(&getContext());
    for (gpu::GPUModuleOp module : kernels) {
      SmallVector<Attribute> objects;
      for (Job &job : jobs) {
        if (job.module != module)
          continue;
        objects.push_back(gpu::ObjectAttr::get(
            &getContext(), job.target, gpu::CompilationTarget::Assembly,
            attrs.getStringAttr(
                StringRef(job.result.ptx.data(), job.result.ptx.size())),
            attrs.getDictionaryAttr(attrs.getNamedAttr(
                "O", attrs.getI32IntegerAttr(job.target.getO()))),
            /*kernels=*/nullptr));
        if (times) {
          times->translate += job.result.times.translate;
          times->link += job.result.times.link;
          times->optimize += job.result.times.optimize;
          times->codegen += job.result.times.codegen;
        }
      }
      OpBuilder builder(module);
      builder.setInsertionPointAfter(module);
      gpu::BinaryOp::create(builder, module.getLoc(), module.getName(),
                            module.getOffloadingHandlerAttr(),
                            builder.getArrayAttr(objects));
      module->erase();
    }
  }

  std::string toolkit;
  mok::PTXEmissionTimes *times;
};

} // namespace

std::unique_ptr<Pass> mok::createEmitPTXPass(const std::string &toolkit,
                                             PTXEmissionTimes *times) {
  return std::make_unique<EmitPTXPass>(toolkit, times);
}
