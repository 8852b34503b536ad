// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok._mok: the compiler library for Python. Deliberately small: parse, run
// pipelines, print stages, JIT for the host, call with NumPy buffers. The
// user-facing API (specs, argument checks, autograd later) is Python in
// mok/.
//
#include "mok/Compiler/Compiler.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace {

/// Errors of the compiler: bad IR, failing passes. A ValueError, since the
/// input is what is wrong.
[[noreturn]] void raise(const std::string &message) {
  throw nb::value_error(message.c_str());
}

std::unique_ptr<mok::Module> parse(const std::string &source,
                                   const std::string &name) {
  std::string error;
  auto m = mok::Module::parse(source, name, error);
  if (!m)
    raise(error);
  return m;
}

void runPipeline(mok::Module &m, const std::string &pipeline) {
  std::string error;
  if (!m.runPipeline(pipeline, error))
    raise(error);
}

/// The kernels, the IR stages asked for by name (`stages`: True for every
/// stage, False for none, or a list of stage names), and where the time went
/// ([(part, seconds)], GpuCompileRequest::times).
std::tuple<std::vector<mok::GpuKernel>, std::map<std::string, std::string>,
           std::vector<std::pair<std::string, double>>>
compileGPU(const mok::Module &m, const mok::CompileOptions &options,
           nb::handle stages, const std::vector<std::string> &functions,
           bool verifyEach) {
  mok::GpuCompileRequest request;
  request.functions = functions;
  request.verifyEachPass = verifyEach;
  if (nb::isinstance<nb::bool_>(stages)) {
    if (nb::cast<bool>(stages))
      request.stageNames = {"moe", "training", "mk", "gpu", "llvm"};
  } else if (!nb::try_cast(stages, request.stageNames)) {
    throw nb::type_error("stages: expected True, False or a list of stage "
                         "names ('moe', 'training', 'mk', 'gpu', 'llvm')");
  }
  std::string error;
  std::vector<mok::GpuKernel> kernels;
  if (!m.compileGPU(options, kernels, error, request))
    raise(error);
  std::map<std::string, std::string> byName;
  for (mok::Stage &s : request.stages)
    byName[s.name] = std::move(s.ir);
  std::vector<std::pair<std::string, double>> times;
  for (const mok::StepTime &t : request.times)
    times.emplace_back(t.name, t.seconds);
  return {std::move(kernels), std::move(byName), std::move(times)};
}

std::unique_ptr<mok::HostExecutable> compileHost(const mok::Module &m) {
  std::string error;
  auto exe = mok::HostExecutable::compile(m, error);
  if (!exe)
    raise(error);
  return exe;
}

// Inputs are only read: read-only arrays are taken (a NumPy array with
// writeable=False, or over bytes). Outputs must be writable.
using Input = nb::ndarray<nb::ro, nb::device::cpu>;
using Output = nb::ndarray<nb::numpy, nb::device::cpu>;

/// The buffer view of array #i of `function`, which must be C-contiguous.
template <typename A>
mok::BufferView bufferView(const A &a, size_t i, const std::string &function) {
  mok::BufferView v;
  v.data = const_cast<void *>(static_cast<const void *>(a.data()));
  int64_t expected = 1;
  // (An empty array has no element to lay out: its strides are whatever
  // the producer chose, e.g. zero.)
  bool empty = a.size() == 0;
  for (size_t d = a.ndim(); d-- > 0;) {
    // Contiguity keeps the calling convention simple; the Python layer
    // makes arrays contiguous or names the offending argument first.
    if (!empty && a.shape(d) > 1 && a.stride(d) != expected)
      raise("buffer #" + std::to_string(i) + " of '" + function +
            "' is not C-contiguous");
    expected *= a.shape(d);
  }
  for (size_t d = 0; d < a.ndim(); ++d) {
    v.sizes.push_back(a.shape(d));
    v.strides.push_back(a.stride(d));
  }
  return v;
}

void invoke(mok::HostExecutable &exe, const std::string &function,
            const std::vector<Input> &inputs,
            const std::vector<Output> &outputs) {
  std::vector<mok::BufferView> views;
  for (size_t i = 0; i < inputs.size(); ++i)
    views.push_back(bufferView(inputs[i], i, function));
  for (size_t i = 0; i < outputs.size(); ++i)
    views.push_back(bufferView(outputs[i], inputs.size() + i, function));
  std::string error;
  bool ok;
  {
    // The compiled code touches only the buffers: let other Python threads
    // run meanwhile.
    nb::gil_scoped_release release;
    ok = exe.invoke(function, views, error);
  }
  if (!ok)
    raise(error);
}

} // namespace

NB_MODULE(_mok, m) {
  m.doc() = "mok's compiler library (internal; use the mok package)";

  nb::class_<mok::TensorInfo>(m, "TensorInfo")
      .def_ro("shape", &mok::TensorInfo::shape)
      .def_ro("dtype", &mok::TensorInfo::dtype)
      .def_ro("name", &mok::TensorInfo::name)
      .def_ro("role", &mok::TensorInfo::role);
  nb::class_<mok::FunctionInfo>(m, "FunctionInfo")
      .def_ro("name", &mok::FunctionInfo::name)
      .def_ro("args", &mok::FunctionInfo::args)
      .def_ro("results", &mok::FunctionInfo::results)
      .def_ro("has_plan", &mok::FunctionInfo::hasPlan)
      .def_ro("tokens", &mok::FunctionInfo::tokens)
      .def_ro("max_tokens", &mok::FunctionInfo::maxTokens)
      .def_ro("recv_capacity", &mok::FunctionInfo::recvCapacity)
      .def_ro("top_k", &mok::FunctionInfo::topK)
      .def_ro("experts", &mok::FunctionInfo::experts)
      .def_ro("ep", &mok::FunctionInfo::ep)
      .def_ro("precision", &mok::FunctionInfo::precision)
      .def_ro("padding", &mok::FunctionInfo::padding);

  nb::class_<mok::GpuKernel>(m, "GpuKernel")
      .def_ro("function", &mok::GpuKernel::function)
      .def_ro("kernel", &mok::GpuKernel::kernel)
      .def_ro("ptx", &mok::GpuKernel::ptx)
      .def_ro("metadata", &mok::GpuKernel::metadata);

  // mok::CompileOptions, its fields named as mok.CompileOptions' (and the
  // dispatch by its name), so that the Python layer sets them by name.
  nb::class_<mok::CompileOptions>(m, "CompileOptions")
      .def(nb::init<>())
      .def_rw("chip", &mok::CompileOptions::chip)
      .def_rw("toolkit", &mok::CompileOptions::toolkit)
      .def_rw("tensor_cores", &mok::CompileOptions::tensorCores)
      .def_rw("profile", &mok::CompileOptions::profile)
      .def_rw("warp_specialize", &mok::CompileOptions::warpSpecialize)
      .def_prop_rw(
          "dispatch",
          [](const mok::CompileOptions &o) {
            return std::string(mok::toString(o.dispatch));
          },
          [](mok::CompileOptions &o, const std::string &name) {
            std::optional<mok::Dispatch> d = mok::parseDispatch(name);
            if (!d)
              raise("dispatch: expected 'auto', 'fused' or 'copy', got '" +
                    name + "'");
            o.dispatch = *d;
          })
      .def_rw("multicast", &mok::CompileOptions::multicast)
      .def_rw("self_exchange", &mok::CompileOptions::selfExchange)
      .def_rw("fp8_quantized_weights", &mok::CompileOptions::fp8QuantizedWeights)
      .def_rw("training", &mok::CompileOptions::training)
      .def_rw("recompute", &mok::CompileOptions::recompute)
      .def_rw("main_grads", &mok::CompileOptions::mainGrads)
      .def_rw("barrier_timeout_ms", &mok::CompileOptions::barrierTimeoutMs)
      .def("validate", &mok::CompileOptions::validate,
           "'' when the options can be compiled, else why not, naming them.");

  nb::class_<mok::Module>(m, "Module")
      .def_static("parse", &parse, nb::arg("source"),
                  nb::arg("name") = "<string>",
                  "Parse and verify moe IR; ValueError with located "
                  "diagnostics on failure.")
      .def("run_pipeline", &runPipeline, nb::arg("pipeline"),
           "Run a pass pipeline, e.g. 'moe-fuse-layer'.")
      .def("functions", &mok::Module::functions,
           "The func.func signatures, with layer operand names and roles.")
      .def("compile_gpu", &compileGPU, nb::arg("options"),
           nb::arg("stages") = false,
           nb::arg("functions") = std::vector<std::string>(),
           nb::arg("verify_each") = false,
           "(kernels, stages, times): the PTX and runtime metadata of every "
           "fused layer, compiled with `options` (a CompileOptions: "
           "ValueError naming what it refuses); the IR after each step by "
           "name, for stages=True ('moe', 'training', 'mk', 'gpu', 'llvm') "
           "or those a list names; and [(part, seconds)], where the time "
           "went. functions: the layer functions to compile (after the "
           "training step: '<fn>_forward', '<fn>_backward'); default all. "
           "verify_each: verify the IR after every pass, not once before "
           "the PTX emission.")
      .def("__str__", &mok::Module::print);

  nb::class_<mok::HostExecutable>(m, "HostExecutable")
      .def_static("compile", &compileHost, nb::arg("module"),
                  "Lower with moe-to-cpu and JIT-compile for the host.")
      .def_prop_ro("lowered_ir", &mok::HostExecutable::loweredIR)
      .def("invoke", &invoke, nb::arg("function"), nb::arg("inputs"),
           nb::arg("outputs"),
           "Call a lowered function with C-contiguous CPU arrays: the "
           "inputs (read only; read-only arrays are taken) and the outputs "
           "(writable NumPy arrays).");
}
