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
  /// given, receives the IR between the steps (Stage), printed in this one
  /// compile; the PTX is each kernel's.
  bool compileGPU(const CompileOptions &options,
                  std::vector<GpuKernel> &kernels, std::string &error,
                  std::vector<Stage> *stages = nullptr) const;

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
