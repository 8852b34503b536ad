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
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
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

std::vector<mok::GpuKernel>
compileGPU(const mok::Module &m, const std::string &chip,
           const std::string &toolkit, bool profile, bool warpSpecialize,
           std::optional<bool> fuseDispatch, bool multicast) {
  std::string error;
  std::vector<mok::GpuKernel> kernels;
  if (!m.compileGPU(chip, toolkit, kernels, error, profile, warpSpecialize,
                    fuseDispatch, multicast))
    raise(error);
  return kernels;
}

std::unique_ptr<mok::HostExecutable> compileHost(const mok::Module &m) {
  std::string error;
  auto exe = mok::HostExecutable::compile(m, error);
  if (!exe)
    raise(error);
  return exe;
}

using Array = nb::ndarray<nb::numpy, nb::device::cpu>;

void invoke(mok::HostExecutable &exe, const std::string &function,
            std::vector<Array> arrays) {
  std::vector<mok::BufferView> views;
  for (size_t i = 0; i < arrays.size(); ++i) {
    Array &a = arrays[i];
    mok::BufferView v;
    v.data = a.data();
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
    views.push_back(std::move(v));
  }
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
      .def_ro("top_k", &mok::FunctionInfo::topK)
      .def_ro("experts", &mok::FunctionInfo::experts)
      .def_ro("ep", &mok::FunctionInfo::ep)
      .def_ro("padding", &mok::FunctionInfo::padding);

  nb::class_<mok::GpuKernel>(m, "GpuKernel")
      .def_ro("function", &mok::GpuKernel::function)
      .def_ro("kernel", &mok::GpuKernel::kernel)
      .def_ro("ptx", &mok::GpuKernel::ptx)
      .def_ro("metadata", &mok::GpuKernel::metadata);

  nb::class_<mok::Module>(m, "Module")
      .def_static("parse", &parse, nb::arg("source"),
                  nb::arg("name") = "<string>",
                  "Parse and verify moe IR; ValueError with located "
                  "diagnostics on failure.")
      .def("run_pipeline", &runPipeline, nb::arg("pipeline"),
           "Run a pass pipeline, e.g. 'moe-fuse-layer'.")
      .def("functions", &mok::Module::functions,
           "The func.func signatures, with layer operand names and roles.")
      .def("compile_gpu", &compileGPU, nb::arg("chip"), nb::arg("toolkit"),
           nb::arg("profile") = false, nb::arg("warp_specialize") = false,
           nb::arg("fuse_dispatch") = nb::none(), nb::arg("multicast") = false,
           "PTX and runtime metadata of every fused forward layer (profile: "
           "kernels that time their phases; warp_specialize: sm_90a GEMMs "
           "with a TMA producer warpgroup; multicast: sm_90a clusters of 2 "
           "CTAs sharing weight boxes).")
      .def("__str__", &mok::Module::print);

  nb::class_<mok::HostExecutable>(m, "HostExecutable")
      .def_static("compile", &compileHost, nb::arg("module"),
                  "Lower with moe-to-cpu and JIT-compile for the host.")
      .def_prop_ro("lowered_ir", &mok::HostExecutable::loweredIR)
      .def("invoke", &invoke, nb::arg("function"), nb::arg("buffers"),
           "Call a lowered function with C-contiguous NumPy buffers "
           "(inputs, then outputs).");
}
