// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The compiler as a library: parse a moe module, run named pipelines on it,
// print any stage, and JIT-compile it for the host. The Python extension is
// a thin layer over this; so is any C++ embedding of the CPU reference.
//
#ifndef MOK_COMPILER_COMPILER_H
#define MOK_COMPILER_COMPILER_H

#include "mok/Conversion/MoEToPTX/CompileOptions.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mok {

/// A strided view of caller-owned memory, as a memref descriptor describes
/// it: element sizes and strides are in elements.
struct BufferView {
  void *data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

/// A tensor in a function signature: shape (-1 = dynamic), element type
/// ("bf16", "f32", "i32", "i64", ...), the name of the layer operand it is
/// (when it feeds one directly: "x", "top_experts", "gate_weights", ...),
/// and its role in a training signature ("saved:<name>", "cotangent",
/// "gradient_of:<index>"), if any.
struct TensorInfo {
  std::vector<int64_t> shape;
  std::string dtype;
  std::string name;
  std::string role;
};

/// A function of the module: its signature and, when it holds a layer, the
/// routing parameters of the layer's plan.
struct FunctionInfo {
  std::string name;
  std::vector<TensorInfo> args, results;
  bool hasPlan = false;
  int64_t tokens = -1, topK = 0, experts = 0, ep = 0, padding = 0;
  /// With a dynamic token count: the plan's capacity (0: none).
  int64_t maxTokens = 0;
  /// The plan's receive capacity of an expert-parallel rank (0: not given,
  /// the default applies).
  int64_t recvCapacity = 0;
  /// The layer's routed-expert precision: "bf16", "mxfp8" or "fp8".
  std::string precision = "bf16";
};

/// A GPU kernel compiled from a layer: its PTX and the metadata the runtime
/// reads (JSON: kernel name, launch policy, parameters with role, dtype and
/// shape; see docs/Runtime.md).
struct GpuKernel {
  std::string function; ///< the layer function it implements
  std::string kernel;   ///< the entry point in the PTX
  std::string ptx;
  std::string metadata;
};

/// The IR of one step of a GPU compile, as text: "moe" (the input),
/// "training" (after moe-generate-backward, with options.training), "mk"
/// (the megakernel schedules), "gpu" (the kernels in gpu/nvgpu), "llvm"
/// (the kernels in the LLVM dialect, just before PTX emission).
struct Stage {
  std::string name;
  std::string ir;
};

/// The wall time of one part of a GPU compile, in seconds.
struct StepTime {
  std::string name;
  double seconds = 0;
};

/// What a GPU compile is asked for beyond the kernels, and what it reports
/// (Module::compileGPU).
struct GpuCompileRequest {
  /// The layer functions to compile kernels for, by their names after the
  /// training step (with options.training, "<fn>_forward" and
  /// "<fn>_backward"); the other functions that nothing calls are left out
  /// of the compile after that step. Empty: every layer function.
  std::vector<std::string> functions;
  /// The stages to print into `stages`, by name (Stage: "moe", "training",
  /// "mk", "gpu", "llvm"). The "gpu" and "llvm" stages are megabytes on
  /// large layers, and printing them costs more than the steps that make
  /// them; ask for the ones that are read.
  std::vector<std::string> stageNames;
  /// Verify the IR after every pass, as mok-opt does, instead of once,
  /// before the PTX emission: for finding a pass that breaks the IR. The
  /// verifier takes about a third of the lowering to the LLVM dialect on the
  /// large kernels.
  bool verifyEachPass = false;

  /// Out: the stages asked for, in pipeline order.
  std::vector<Stage> stages;
  /// Out: where the time went, in order: each step ("training" with
  /// options.training, "mk", "gpu", "llvm", "ptx"), the PTX step's parts
  /// summed over the kernels, which are emitted in parallel
  /// ("ptx.translate", "ptx.link", "ptx.optimize", "ptx.codegen"), and the
  /// printing of the stages ("print"). Module::parse is not part of it.
  std::vector<StepTime> times;
};

/// A module of the moe dialect (and whatever the pipelines lower it to).
/// Errors are reported by returning false with a message in `error()`, which
/// carries the diagnostics with their locations.
class Module {
public:
  ~Module();
  Module(Module &&) noexcept;
  Module &operator=(Module &&) noexcept;

  /// Parses and verifies `source`; `name` is the buffer name in diagnostics.
  static std::unique_ptr<Module>
  parse(const std::string &source, const std::string &name, std::string &error);

  /// Runs a textual pass pipeline (as given to mok-opt, without
  /// `builtin.module(...)`), e.g. "moe-fuse-layer,moe-generate-backward".
  bool runPipeline(const std::string &pipeline, std::string &error);

  /// The module's IR text.
  std::string print() const;

  /// The functions of the module (func.func), in order.
  std::vector<FunctionInfo> functions() const;

  /// Compiles every fused layer of (a copy of) the module for the GPU, as
  /// `options` say (checked first: CompileOptions::validate); with
  /// options.training, each layer's training forward and backward too
  /// (moe-generate-backward). One GpuKernel a layer function. `stages`, if
  /// given, receives the IR between the steps (Stage: every stage),
  /// printed in this one compile; the PTX is each kernel's.
  bool compileGPU(const CompileOptions &options,
                  std::vector<GpuKernel> &kernels, std::string &error,
                  std::vector<Stage> *stages = nullptr) const;

  /// The same for the functions and with the stages `request` names; its
  /// out fields receive the stages and the times.
  bool compileGPU(const CompileOptions &options,
                  std::vector<GpuKernel> &kernels, std::string &error,
                  GpuCompileRequest &request) const;

private:
  Module();
  struct Impl;
  std::unique_ptr<Impl> impl;
  friend class HostExecutable;
};

/// A module lowered by `moe-to-cpu` and compiled for the host by MLIR's
/// ExecutionEngine. Functions are called through their C interface: every
/// argument is a buffer (inputs first, then outputs, as convert-moe-to-cpu
/// defines).
class HostExecutable {
public:
  ~HostExecutable();

  /// Lowers a copy of `module` to the LLVM dialect (unless it already is)
  /// and JIT-compiles it.
  static std::unique_ptr<HostExecutable> compile(const Module &module,
                                                 std::string &error);

  /// The IR that was compiled (LLVM dialect).
  const std::string &loweredIR() const { return lowered; }

  /// Calls `function` with the buffers; checks their ranks against the
  /// function's signature (shapes and element types are the caller's to
  /// check).
  bool invoke(const std::string &function,
              const std::vector<BufferView> &buffers, std::string &error);

  /// The rank of each argument of `function`, or an empty result with an
  /// error when there is no such function.
  std::vector<int64_t> signature(const std::string &function,
                                 std::string &error) const;

private:
  HostExecutable();
  struct Impl;
  std::unique_ptr<Impl> impl;
  std::string lowered;
};

} // namespace mok

#endif // MOK_COMPILER_COMPILER_H
