// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok._runtime: the mok runtime (runtime/include/mok/Runtime/mok_runtime.h)
// for Python. It links the runtime library and nothing of MLIR, so it builds
// on GPU machines without the compiler (python/runtime-ext).
//
// Arrays come in through DLPack (torch, CuPy, NumPy, JAX, ... or a DLPack
// capsule), zero-copy, and become mok_tensors. Every argument error names
// the argument. Errors are mok.MokRuntimeError, with the runtime's message
// (mok_last_error()) and its status name in `.status`.
//
#include "mok/Runtime/mok_runtime.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

PyObject *errorType = nullptr; // mok.MokRuntimeError (owned by the module)

[[noreturn]] void raise(mok_status status, const std::string &message) {
  nb::object error = nb::borrow(errorType)(message);
  error.attr("status") = mok_status_name(status);
  PyErr_SetObject(errorType, error.ptr());
  throw nb::python_error();
}

[[noreturn]] void invalid(const std::string &message) {
  raise(MOK_ERROR_INVALID_ARGUMENT, message);
}

void check(mok_status status) {
  if (status != MOK_OK)
    raise(status, mok_last_error());
}

[[noreturn]] void typeError(const std::string &message) {
  throw nb::type_error(message.c_str());
}

std::string typeName(nb::handle h) { return Py_TYPE(h.ptr())->tp_name; }

/// Argument `name` as an integer in [min, max]: a TypeError naming it for
/// what is not an int (bool included), a MokRuntimeError (invalid
/// argument) for an int out of range. (Typed C++ parameters would make
/// nanobind answer "incompatible function arguments" without naming the
/// argument.)
int64_t intArg(nb::handle value, const std::string &name, int64_t min,
               int64_t max) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    typeError(name + ": expected an int, got " + typeName(value));
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid())
    throw nb::python_error();
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred())
    throw nb::python_error();
  if (overflow || v < min || v > max)
    invalid(name + ": expected an int from " + std::to_string(min) + " to " +
            std::to_string(max) + ", got " +
            nb::cast<std::string>(nb::str(index)));
  return v;
}

/// An unsigned integer that stands for a pointer or a handle (a CUstream, an
/// ncclComm_t): 0 to 2^64 - 1.
uintptr_t addressArg(nb::handle value, const std::string &name) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    typeError(name + ": expected an int (an address), got " + typeName(value));
  nb::object index = nb::steal(PyNumber_Index(value.ptr()));
  if (!index.is_valid())
    throw nb::python_error();
  unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    invalid(name + ": expected an address from 0 to 2^64 - 1, got " +
            nb::cast<std::string>(nb::str(index)));
  }
  return static_cast<uintptr_t>(v);
}

/// Argument `name` as a str (TypeError naming it otherwise).
std::string strArg(nb::handle value, const std::string &name) {
  if (!nb::isinstance<nb::str>(value))
    typeError(name + ": expected a str, got " + typeName(value));
  return nb::cast<std::string>(value);
}

//===----------------------------------------------------------------------===//
// Arrays
//===----------------------------------------------------------------------===//

// DLPack device types (dlpack.h, DLDeviceType).
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10,
              kDLCUDAManaged = 13;

std::string deviceName(int type, int id) {
  switch (type) {
  case kDLCPU:
    return "cpu";
  case kDLCUDA:
    return "cuda:" + std::to_string(id);
  case kDLCUDAHost:
    return "cuda_host (pinned host memory)";
  case kDLCUDAManaged:
    return "cuda_managed (managed memory)";
  case kDLROCM:
    return "rocm:" + std::to_string(id);
  }
  return "DLPack device type " + std::to_string(type) + ":" +
         std::to_string(id);
}

// What an argument's device must be: any (descriptions only), a CUDA array
// on any device (the layer is not loaded yet), or a CUDA array on device n.
constexpr int AnyDevice = -2, AnyCUDA = -1;

void checkDevice(const std::string &name, int type, int id, int want) {
  if (want == AnyDevice || (type == kDLCUDA && (want == AnyCUDA || id == want)))
    return;
  invalid(
      name + ": expected a CUDA array" +
      (want == AnyCUDA ? std::string() : " on device " + std::to_string(want)) +
      ", got " + deviceName(type, id));
}

using Array = nb::ndarray<nb::ro>; // any dtype, shape, layout and device

/// Calls `call` (a method `method` of argument `name`'s producer); a Python
/// error it raises (torch refusing to export a tensor that requires grad, a
/// NumPy dtype DLPack lacks, ...) becomes a TypeError naming the argument,
/// chained to the producer's.
template <typename F>
nb::object producerCall(const std::string &name, const char *method, F call) {
  try {
    return call();
  } catch (nb::python_error &e) {
    std::string what = nb::cast<std::string>(nb::str(e.value()));
    std::string type = typeName(e.value());
    nb::object cause = nb::borrow(e.value()); // the producer's error
    nb::object error = nb::handle(PyExc_TypeError)(
        name + ": its " + method + "() failed (" + type + ": " + what +
        "); expected an array that DLPack can export");
    PyException_SetCause(error.ptr(), cause.release().ptr());
    PyErr_SetObject(PyExc_TypeError, error.ptr());
    throw nb::python_error();
  }
}

/// (device type, device id) from the producer's __dlpack_device__(), which
/// must be a pair of ints (a TypeError naming the argument otherwise).
std::pair<int, int> dlpackDevice(nb::handle obj, const std::string &name) {
  nb::object where = producerCall(name, "__dlpack_device__", [&] {
    return obj.attr("__dlpack_device__")();
  });
  auto bad = [&] {
    typeError(name + ": __dlpack_device__() returned " +
              nb::cast<std::string>(nb::repr(where)) +
              "; expected a (device_type, device_id) pair of ints");
  };
  if (!nb::isinstance<nb::tuple>(where) || nb::len(where) != 2)
    bad();
  nb::tuple pair = nb::borrow<nb::tuple>(where);
  int out[2];
  for (int i = 0; i < 2; ++i) {
    PyObject *v = pair[i].ptr();
    if (PyBool_Check(v) || !PyLong_Check(v))
      bad();
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || n < INT32_MIN || n > INT32_MAX)
      bad();
    out[i] = static_cast<int>(n);
  }
  return {out[0], out[1]};
}

/// `obj` as an array, zero-copy, on the device `device` asks for. A CUDA
/// array is exported with __dlpack__(stream=dlpackStream), the consumer's
/// stream in DLPack's terms (1: the legacy default stream, -1: no
/// synchronization), so that its producer orders pending work before the
/// kernel; a DLPack capsule is taken as it is (its producer synchronized).
Array importArray(nb::handle obj, const std::string &name, int device,
                  int64_t dlpackStream) {
  nb::object source = nb::borrow(obj);
  if (!PyCapsule_CheckExact(obj.ptr()) && nb::hasattr(obj, "__dlpack__") &&
      nb::hasattr(obj, "__dlpack_device__")) {
    auto [type, id] = dlpackDevice(obj, name);
    // Before exporting: a wrong device is the argument's error, not the
    // producer's.
    checkDevice(name, type, id, device);
    if (type == kDLCUDA)
      source = producerCall(name, "__dlpack__", [&] {
        return obj.attr("__dlpack__")("stream"_a = dlpackStream);
      });
  }
  Array a;
  if (!nb::try_cast(source, a, /*convert=*/false))
    typeError(name +
              ": expected a DLPack array (a torch tensor, "
              "a CuPy or NumPy array, a DLPack capsule...)"
              ", got " +
              typeName(obj));
  checkDevice(name, a.device_type(), a.device_id(), device);
  return a;
}

std::string dtypeString(nb::dlpack::dtype t) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
  case nb::dlpack::dtype_code::Int:
    base = "int";
    break;
  case nb::dlpack::dtype_code::UInt:
    base = "uint";
    break;
  case nb::dlpack::dtype_code::Float:
    base = "float";
    break;
  case nb::dlpack::dtype_code::Bfloat:
    base = "bfloat";
    break;
  case nb::dlpack::dtype_code::Complex:
    base = "complex";
    break;
  case nb::dlpack::dtype_code::Bool:
    base = "bool";
    break;
  case nb::dlpack::dtype_code::Float8_E4M3FN:
    return t.lanes == 1 ? "float8_e4m3fn"
                        : "float8_e4m3fnx" + std::to_string(t.lanes);
  default:
    base = "(DLPack type code " + std::to_string(t.code) + ")";
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1)
    s += "x" + std::to_string(t.lanes);
  return s;
}

/// A mok_tensor over `a`'s memory (strides in elements, as DLPack's).
mok_tensor describe(const Array &a, const std::string &name) {
  mok_tensor t{};
  t.data = const_cast<void *>(a.data());
  nb::dlpack::dtype d = a.dtype();
  using code = nb::dlpack::dtype_code;
  if (d.lanes == 1 && d.code == uint8_t(code::Bfloat) && d.bits == 16)
    t.dtype = MOK_DTYPE_BF16;
  else if (d.lanes == 1 && d.code == uint8_t(code::Float) && d.bits == 32)
    t.dtype = MOK_DTYPE_F32;
  else if (d.lanes == 1 && d.code == uint8_t(code::Int) && d.bits == 32)
    t.dtype = MOK_DTYPE_I32;
  else if (d.lanes == 1 && d.code == uint8_t(code::Int) && d.bits == 64)
    t.dtype = MOK_DTYPE_I64;
  else if (d.lanes == 1 && d.code == uint8_t(code::Float8_E4M3FN) &&
           d.bits == 8)
    t.dtype = MOK_DTYPE_F8E4M3;
  else if (d.lanes == 1 && d.code == uint8_t(code::UInt) && d.bits == 8)
    t.dtype = MOK_DTYPE_U8; // (MXFP8's E8M0 scale bytes)
  else
    invalid(name + ": unsupported dtype " + dtypeString(d) +
            " (the runtime takes bfloat16, float32, int32, int64, "
            "float8_e4m3fn and uint8)");
  if (a.ndim() > MOK_MAX_RANK)
    invalid(name + ": rank " + std::to_string(a.ndim()) +
            "; the runtime takes at most " + std::to_string(MOK_MAX_RANK) +
            " dimensions");
  t.rank = static_cast<int32_t>(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = a.shape(i);
    t.strides[i] = a.stride(i);
  }
  return t;
}

/// Named arrays, imported, described, and kept alive for the call.
struct NamedArrays {
  std::vector<std::string> names;
  std::vector<Array> arrays;
  std::vector<mok_tensor> tensors;

  std::vector<mok_named_tensor> named() const {
    std::vector<mok_named_tensor> out;
    for (size_t i = 0; i < names.size(); ++i)
      out.push_back({names[i].c_str(), tensors[i]});
    return out;
  }
};

/// The named tensors of a call (the layer's inputs and its extra outputs:
/// every output but the first, which is `out`): the `inputs` dict, then
/// keyword arguments, in that order (the runtime reports the first wrong
/// one).
NamedArrays collect(nb::handle inputs, const nb::kwargs &named, int device,
                    int64_t dlpackStream) {
  NamedArrays args;
  auto add = [&](nb::handle key, nb::handle value) {
    if (!nb::isinstance<nb::str>(key))
      typeError("inputs: keys are operand names (str), got " + typeName(key));
    std::string name = nb::cast<std::string>(key);
    if (std::find(args.names.begin(), args.names.end(), name) !=
        args.names.end())
      invalid(name + ": given twice (in `inputs` and as a keyword argument)");
    Array a = importArray(value, name, device, dlpackStream);
    args.tensors.push_back(describe(a, name));
    args.names.push_back(name);
    args.arrays.push_back(std::move(a));
  };
  if (!inputs.is_none()) {
    if (!nb::isinstance<nb::dict>(inputs))
      typeError("inputs: expected a dict of arrays by operand name, got " +
                typeName(inputs));
    for (auto [key, value] : nb::borrow<nb::dict>(inputs))
      add(key, value);
  }
  for (auto [key, value] : named)
    add(key, value);
  return args;
}

//===----------------------------------------------------------------------===//
// Weight views
//===----------------------------------------------------------------------===//

/// A mok_expert_weights over arrays it keeps alive (and, for one array per
/// expert, the host pointer table it points into). Not copyable: `w` may
/// point into `table`.
struct WeightView {
  mok_expert_weights w{};
  std::vector<Array> arrays;
  std::vector<void *> table;
  int deviceType = 0, deviceId = 0;

  WeightView() = default;
  WeightView(const WeightView &) = delete;
  WeightView &operator=(const WeightView &) = delete;

  std::string device() const { return deviceName(deviceType, deviceId); }
};

nb::object own(std::unique_ptr<WeightView> v) {
  return nb::cast(v.release(), nb::rv_policy::take_ownership);
}

/// Views are built with __dlpack__(stream=-1): no synchronization; the
/// weights must be ready, in stream order, before a forward reads them.
constexpr int64_t NoSync = -1;

std::unique_ptr<WeightView> weightsFromTensor(nb::handle array,
                                              const std::string &name) {
  auto v = std::make_unique<WeightView>();
  Array a = importArray(array, name, AnyDevice, NoSync);
  mok_tensor t = describe(a, name);
  check(mok_weights_from_tensor(&t, name.c_str(), &v->w));
  v->deviceType = a.device_type();
  v->deviceId = a.device_id();
  v->arrays.push_back(std::move(a));
  return v;
}

nb::tuple weightsSplitFC1(nb::handle array, const std::string &name) {
  auto gate = std::make_unique<WeightView>();
  auto up = std::make_unique<WeightView>();
  Array a = importArray(array, name, AnyDevice, NoSync);
  mok_tensor t = describe(a, name);
  check(mok_weights_split_fc1(&t, name.c_str(), &gate->w, &up->w));
  for (WeightView *v : {gate.get(), up.get()}) {
    v->deviceType = a.device_type();
    v->deviceId = a.device_id();
    v->arrays.push_back(a);
  }
  return nb::make_tuple(own(std::move(gate)), own(std::move(up)));
}

std::unique_ptr<WeightView> weightsPerExpert(nb::handle list,
                                             const std::string &name) {
  if (!nb::isinstance<nb::list>(list) && !nb::isinstance<nb::tuple>(list))
    typeError(name +
              ": expected a list of per-expert [rows, "
              "cols] arrays, got " +
              typeName(list));
  nb::sequence arrays = nb::borrow<nb::sequence>(list);
  size_t experts = nb::len(arrays);
  if (!experts)
    invalid(name + ": expected one [rows, cols] array per expert, got an "
                   "empty list");
  auto v = std::make_unique<WeightView>();
  mok_tensor first{};
  for (size_t e = 0; e < experts; ++e) {
    std::string n = name + "[" + std::to_string(e) + "]";
    Array a = importArray(arrays[e], n, AnyDevice, NoSync);
    mok_tensor t = describe(a, n);
    if (t.rank != 2)
      invalid(n + ": expected a [rows, cols] array, got rank " +
              std::to_string(t.rank));
    if (t.shape[1] > 1 && t.strides[1] != 1)
      invalid(n +
              ": the innermost dimension must be contiguous (stride 1), "
              "got stride " +
              std::to_string(t.strides[1]));
    if (e == 0) {
      first = t;
      v->deviceType = a.device_type();
      v->deviceId = a.device_id();
    } else {
      std::string first0 = name + "[0]";
      if (a.device_type() != v->deviceType || a.device_id() != v->deviceId)
        invalid(n + ": on " + deviceName(a.device_type(), a.device_id()) +
                ", but " + first0 + " is on " + v->device());
      if (t.dtype != first.dtype)
        invalid(n + ": dtype " + mok_dtype_name(t.dtype) + ", but " + first0 +
                " is " + mok_dtype_name(first.dtype));
      if (t.shape[0] != first.shape[0] || t.shape[1] != first.shape[1])
        invalid(n + ": expected [rows, cols] = [" +
                std::to_string(first.shape[0]) + ", " +
                std::to_string(first.shape[1]) + "] as " + first0 + ", got [" +
                std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) +
                "]");
      if (t.shape[0] > 1 && t.strides[0] != first.strides[0])
        invalid(n + ": row stride " + std::to_string(t.strides[0]) +
                " differs from " + first0 + "'s " +
                std::to_string(first.strides[0]) +
                " (a view has one row stride)");
    }
    v->table.push_back(t.data);
    v->arrays.push_back(std::move(a));
  }
  check(mok_weights_per_expert(v->table.data(), static_cast<int64_t>(experts),
                               first.shape[0], first.shape[1], first.strides[0],
                               first.dtype, name.c_str(), &v->w));
  return v;
}

//===----------------------------------------------------------------------===//
// Communicators and symmetric buffers
//===----------------------------------------------------------------------===//

/// A runtime call that may wait for other ranks (or NCCL's bootstrap):
/// made without the GIL, so that ranks that are threads of one process
/// (tests, the stand-in NCCL) can meet; its error message read on this
/// thread before Python runs again.
template <typename F> void checkWithoutGil(F call) {
  mok_status status;
  std::string message;
  {
    nb::gil_scoped_release release;
    status = call();
    if (status != MOK_OK)
      message = mok_last_error();
  }
  if (status != MOK_OK)
    raise(status, message);
}

struct Comm {
  mok_comm handle = nullptr;

  Comm() = default;
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;
  // Layers and buffers hold a reference to the Python object of their
  // communicator, so none is bound or live by the time this runs.
  ~Comm() {
    if (handle)
      mok_comm_destroy(handle);
  }

  mok_comm live() const {
    if (!handle)
      invalid("comm: destroyed (destroy() was called)");
    return handle;
  }

  void destroy() {
    if (!handle)
      return;
    mok_comm h = handle;
    checkWithoutGil([&] { return mok_comm_destroy(h); });
    handle = nullptr;
  }

  int query(mok_status (*get)(mok_comm, int *)) const {
    int v = 0;
    check(get(live(), &v));
    return v;
  }
};

struct Symmetric {
  mok_symmetric handle = nullptr;
  // A buffer of the caller's (freed here, its communicator kept alive by
  // `keeper`), or a layer's exchange buffer (`owned` false: the layer frees
  // it; `keeper` is the layer).
  bool owned = true;
  nb::object keeper;

  Symmetric() = default;
  Symmetric(const Symmetric &) = delete;
  Symmetric &operator=(const Symmetric &) = delete;
  ~Symmetric() {
    if (owned && handle)
      mok_symmetric_free(handle);
  }

  mok_symmetric live() const {
    if (!handle)
      invalid("buffer: freed (free() was called)");
    return handle;
  }

  mok_symmetric_info info() const {
    mok_symmetric_info i{};
    check(mok_symmetric_get_info(live(), &i));
    return i;
  }

  std::vector<uint64_t> peers() const {
    mok_symmetric_info i = info();
    std::vector<uint64_t> entries(static_cast<size_t>(i.ranks));
    mok_symmetric h = handle;
    checkWithoutGil(
        [&] { return mok_symmetric_read_peers(h, entries.data(), entries.size()); });
    return entries;
  }

  void free() {
    if (!handle)
      return;
    if (!owned)
      invalid("buffer: a layer's exchange buffer (unbind the layer instead)");
    check(mok_symmetric_free(handle));
    handle = nullptr;
    keeper = nb::object();
  }
};

/// The 128 bytes of a unique id from `value` (bytes), named in errors.
mok_unique_id uniqueIdArg(nb::handle value) {
  if (!nb::isinstance<nb::bytes>(value))
    typeError("unique_id: expected bytes (" +
              std::to_string(MOK_UNIQUE_ID_BYTES) +
              ", from unique_id()), got " + typeName(value));
  nb::bytes b = nb::borrow<nb::bytes>(value);
  if (b.size() != MOK_UNIQUE_ID_BYTES)
    invalid("unique_id: expected " + std::to_string(MOK_UNIQUE_ID_BYTES) +
            " bytes, got " + std::to_string(b.size()));
  mok_unique_id id;
  std::memcpy(id.bytes, b.c_str(), MOK_UNIQUE_ID_BYTES);
  return id;
}

//===----------------------------------------------------------------------===//
// Layers
//===----------------------------------------------------------------------===//

struct Layer {
  mok_layer handle = nullptr;
  int device = -1; // after load
  // The bound views (WeightView objects), which keep their arrays alive
  // while bound. Unbinding or rebinding drops the reference at once, without
  // waiting for forwards in flight that still read the arrays (documented in
  // bind_weights/unbind_weights).
  std::map<std::string, nb::object> bound;
  // The bound communicator (a Comm) and the buffer given with it (a
  // Symmetric), referenced while bound.
  nb::object boundComm, boundBuffer;

  explicit Layer(const std::string &metadata) {
    check(mok_layer_create(metadata.c_str(), &handle));
  }
  ~Layer() { mok_layer_destroy(handle); }
  Layer(const Layer &) = delete;
  Layer &operator=(const Layer &) = delete;

  std::vector<std::string> inputNames() const {
    std::vector<std::string> names;
    for (int i = 0, n = mok_layer_input_count(handle); i < n; ++i)
      names.push_back(mok_layer_input_name(handle, i));
    return names;
  }

  std::vector<std::string> outputNames() const {
    std::vector<std::string> names;
    for (int i = 0, n = mok_layer_output_count(handle); i < n; ++i)
      names.push_back(mok_layer_output_name(handle, i));
    return names;
  }

  /// The device arrays must be on: the layer's once loaded, else any GPU.
  int arrayDevice() const { return device >= 0 ? device : AnyCUDA; }

  void checkArgs(nb::handle inputs, nb::handle out, const nb::kwargs &named) {
    // Descriptions only (no driver); the device too once loaded.
    int want = device >= 0 ? device : AnyDevice;
    NamedArrays args = collect(inputs, named, want, NoSync);
    Array o = importArray(out, "out", want, NoSync);
    mok_tensor ot = describe(o, "out");
    std::vector<mok_named_tensor> n = args.named();
    check(mok_layer_check(handle, n.data(), n.size(), &ot));
  }

  void load(nb::handle deviceArg, nb::handle ptxArg, nb::handle cubinArg) {
    int dev = static_cast<int>(intArg(deviceArg, "device", 0, INT32_MAX));
    // PTX may be None only beside a cubin.
    std::string ptx;
    if (!ptxArg.is_none() || cubinArg.is_none())
      ptx = strArg(ptxArg, "ptx");
    std::string cubin;
    if (!cubinArg.is_none()) {
      if (!nb::isinstance<nb::bytes>(cubinArg))
        typeError("cubin: expected bytes (a cubin) or None, got " +
                  typeName(cubinArg));
      nb::bytes b = nb::borrow<nb::bytes>(cubinArg);
      cubin.assign(b.c_str(), b.size());
    }
    for (auto &[name, view] : bound) {
      const WeightView &v = nb::cast<const WeightView &>(view);
      checkDevice(name + " (bound weight view)", v.deviceType, v.deviceId, dev);
    }
    check(mok_layer_load_image(handle, dev, ptxArg.is_none() ? nullptr : ptx.c_str(),
                               cubinArg.is_none() ? nullptr : cubin.data(), cubin.size()));
    device = dev;
  }

  /// (how the module was loaded, the runtime's sentence about it).
  nb::tuple loadSource() const {
    mok_load_source source = MOK_LOAD_NONE;
    const char *detail = nullptr;
    check(mok_layer_load_source(handle, &source, &detail));
    const char *name = source == MOK_LOAD_CUBIN ? "cubin"
                       : source == MOK_LOAD_PTX ? "ptx"
                                                : "none";
    return nb::make_tuple(name, detail ? detail : "");
  }

  nb::object forward(nb::handle inputs, nb::handle out, nb::handle streamArg,
                     const nb::kwargs &named) {
    uintptr_t stream = addressArg(streamArg, "stream");
    // DLPack spells the legacy default stream 1 (0 is not a valid value).
    int64_t dlpackStream = stream ? static_cast<int64_t>(stream) : 1;
    NamedArrays args = collect(inputs, named, arrayDevice(), dlpackStream);
    Array o = importArray(out, "out", arrayDevice(), dlpackStream);
    mok_tensor ot = describe(o, "out");
    if (device < 0)
      invalid("layer: not loaded (call load(device, ptx) first)");
    std::vector<mok_named_tensor> n = args.named();
    check(mok_layer_forward(handle, n.data(), n.size(), &ot,
                            reinterpret_cast<void *>(stream)));
    return nb::borrow(out);
  }

  void bindWeights(nb::handle nameArg, nb::handle view) {
    std::string name = strArg(nameArg, "name");
    if (view.is_none())
      return unbindWeights(nameArg);
    WeightView *v = nullptr;
    if (!nb::try_cast(view, v) || !v)
      typeError(name +
                ": expected a WeightView (weights_from_tensor, "
                "weights_split_fc1, weights_per_expert), got " +
                typeName(view));
    if (device >= 0)
      checkDevice(name, v->deviceType, v->deviceId, device);
    // A refused view leaves the previous binding, in the runtime and here.
    check(mok_layer_bind_weights(handle, name.c_str(), &v->w));
    bound[name] = nb::borrow(view);
  }

  void unbindWeights(nb::handle nameArg) {
    std::string name = strArg(nameArg, "name");
    check(mok_layer_bind_weights(handle, name.c_str(), nullptr));
    bound.erase(name);
  }

  /// What the kernels reported since the last take (mok_layer_take_report):
  /// None, or raises MokRuntimeError (MOK_ERROR_BAD_ROUTING /
  /// MOK_ERROR_TIMEOUT) naming the route or the barrier. `wait`: after
  /// synchronizing `stream` (without the GIL).
  void takeReport(uintptr_t stream, bool wait) {
    mok_status status;
    std::string message;
    {
      nb::gil_scoped_release release;
      status = mok_layer_take_report(handle, reinterpret_cast<void *>(stream),
                                     wait ? 1 : 0, nullptr);
      if (status != MOK_OK)
        message = mok_last_error();
    }
    if (status != MOK_OK)
      raise(status, message);
  }

  /// The workspace buffer `name`, copied to host memory after the runtime
  /// checked the name (before the loaded-ness, as the runtime orders them).
  /// Synchronous; the caller synchronizes the stream the layer ran on.
  nb::bytes readWorkspace(nb::handle nameArg) {
    std::string name = strArg(nameArg, "name");
    size_t size = 0;
    check(mok_layer_workspace_size(handle, name.c_str(), &size));
    if (device < 0)
      invalid("layer: not loaded (call load(device, ptx) first)");
    PyObject *raw = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(size));
    if (!raw)
      throw nb::python_error();
    nb::bytes data = nb::steal<nb::bytes>(raw);
    mok_status status;
    std::string message;
    {
      // The copy waits for the device: let other Python threads run. The
      // bytes object is not shared yet, so filling it without the GIL is
      // safe.
      nb::gil_scoped_release release;
      status = mok_layer_read_workspace(handle, name.c_str(),
                                        PyBytes_AS_STRING(raw), size);
      if (status != MOK_OK)
        message = mok_last_error(); // this thread's, read before Python runs
    }
    if (status != MOK_OK)
      raise(status, message);
    return data;
  }

  /// The expert-parallel group (size 1 only: a larger one is bound as a
  /// communicator, bind_comm). `ncclComm` is an ncclComm_t as an integer
  /// (0: none).
  void setEpGroup(nb::handle sizeArg, nb::handle rankArg, nb::handle commArg) {
    mok_ep_group group{
        static_cast<int32_t>(intArg(sizeArg, "size", INT32_MIN, INT32_MAX)),
        static_cast<int32_t>(intArg(rankArg, "rank", INT32_MIN, INT32_MAX)),
        reinterpret_cast<void *>(addressArg(commArg, "nccl_comm"))};
    check(mok_layer_set_ep_group(handle, &group));
  }

  nb::tuple epGroup() const {
    mok_ep_group group{};
    check(mok_layer_ep_group(handle, &group));
    return nb::make_tuple(group.size, group.rank,
                          reinterpret_cast<uintptr_t>(group.nccl_comm));
  }

  int32_t epSize() const {
    int32_t size = 0;
    check(mok_layer_ep_size(handle, &size));
    return size;
  }

  /// Binds (or, with both None, unbinds) a communicator and optionally a
  /// symmetric buffer of it (mok_layer_bind_comm; collective for NCCL).
  void bindComm(nb::handle commArg, nb::handle bufferArg) {
    mok_comm c = nullptr;
    mok_symmetric b = nullptr;
    nb::object commObject = nb::borrow(commArg);
    if (!commArg.is_none()) {
      Comm *cp = nullptr;
      if (!nb::try_cast(commArg, cp) || !cp)
        typeError("comm: expected a Comm (or None), got " + typeName(commArg));
      c = cp->live();
    }
    if (!bufferArg.is_none()) {
      Symmetric *sp = nullptr;
      if (!nb::try_cast(bufferArg, sp) || !sp)
        typeError("buffer: expected a Symmetric buffer (Comm.alloc_symmetric) "
                  "or None, got " + typeName(bufferArg));
      b = sp->live();
      if (commArg.is_none())
        commObject = sp->keeper;
    }
    mok_layer h = handle;
    checkWithoutGil([&] { return mok_layer_bind_comm(h, c, b); });
    if (!c && !b) {
      boundComm = nb::object();
      boundBuffer = nb::object();
      return;
    }
    boundComm = commObject;
    // A new buffer replaces the old; binding the comm alone keeps the one
    // bound (the runtime does too).
    if (b)
      boundBuffer = nb::borrow(bufferArg);
    else {
      mok_symmetric current = nullptr;
      check(mok_layer_comm(handle, nullptr, &current));
      if (!boundBuffer.is_valid() ||
          nb::cast<const Symmetric &>(boundBuffer).handle != current)
        boundBuffer = nb::object();
    }
  }

  nb::dict boundWeights() const {
    nb::dict d;
    for (const auto &[name, view] : bound)
      d[name.c_str()] = view;
    return d;
  }
};

} // namespace

NB_MODULE(_runtime, m) {
  m.doc() = "The mok runtime (mok_runtime.h): compiled layers, weight views, "
            "the CUDA driver probe. Arrays through DLPack, zero-copy.";

  errorType = PyErr_NewExceptionWithDoc(
      "mok.MokRuntimeError",
      "A failing runtime call or a refused argument; the message names the "
      "argument (or the driver call), `status` is the mok_status name.",
      PyExc_RuntimeError, nullptr);
  if (!errorType)
    throw nb::python_error();
  m.attr("MokRuntimeError") = nb::steal(errorType);

  m.attr("API_VERSION") = MOK_RUNTIME_API_VERSION;
  m.attr("MAX_RANK") = MOK_MAX_RANK;

  m.def(
      "driver_probe",
      []() {
        int available = 0, count = 0;
        check(mok_driver_probe(&available, &count));
        std::string reason = available ? "" : mok_last_error();
        return nb::make_tuple(bool(available), count, reason);
      },
      "(available, device_count, reason): whether the CUDA driver loads "
      "($MOK_CUDA_DRIVER, default libcuda.so.1) and how many devices it "
      "sees; `reason` says why not when unavailable.");
  m.def(
      "device_sm_count",
      [](nb::handle device) {
        int count = 0;
        check(mok_device_sm_count(
            static_cast<int>(intArg(device, "device", INT32_MIN, INT32_MAX)),
            &count));
        return count;
      },
      "device"_a.none(), "The number of multiprocessors of CUDA `device`.");

  nb::class_<WeightView>(m, "WeightView",
                         "One routed projection of every local expert, "
                         "[E, rows, cols], over arrays it keeps alive (no "
                         "copy). Made by weights_from_tensor, "
                         "weights_split_fc1 and weights_per_expert.")
      .def_prop_ro("layout",
                   [](const WeightView &v) {
                     return v.w.layout == MOK_WEIGHTS_PER_EXPERT ? "per_expert"
                                                                 : "strided";
                   })
      .def_prop_ro(
          "dtype",
          [](const WeightView &v) { return mok_dtype_name(v.w.dtype); })
      .def_prop_ro("experts", [](const WeightView &v) { return v.w.experts; })
      .def_prop_ro("rows", [](const WeightView &v) { return v.w.rows; })
      .def_prop_ro("cols", [](const WeightView &v) { return v.w.cols; })
      .def_prop_ro(
          "row_stride", [](const WeightView &v) { return v.w.row_stride; },
          "Elements between rows.")
      .def_prop_ro(
          "expert_stride",
          [](const WeightView &v) -> nb::object {
            if (v.w.layout == MOK_WEIGHTS_PER_EXPERT)
              return nb::none();
            return nb::int_(v.w.expert_stride);
          },
          "Elements between experts (None for one array per expert).")
      .def_prop_ro("device", &WeightView::device,
                   "Where the arrays are: 'cuda:0', 'cpu', ...")
      .def(
          "element_address",
          [](const WeightView &v, nb::handle expert, nb::handle row,
             nb::handle col) {
            uintptr_t address = 0;
            check(mok_weights_element_address(
                &v.w, intArg(expert, "expert", INT64_MIN, INT64_MAX),
                intArg(row, "row", INT64_MIN, INT64_MAX),
                intArg(col, "col", INT64_MIN, INT64_MAX), &address));
            return address;
          },
          "expert"_a.none(), "row"_a.none(), "col"_a.none(),
          "The address of element (expert, row, col).")
      .def("__repr__", [](const WeightView &v) {
        return "WeightView(" +
               std::string(v.w.layout == MOK_WEIGHTS_PER_EXPERT ? "per_expert"
                                                                : "strided") +
               " " + mok_dtype_name(v.w.dtype) + " [" +
               std::to_string(v.w.experts) + ", " + std::to_string(v.w.rows) +
               ", " + std::to_string(v.w.cols) + "] on " + v.device() + ")";
      });

  m.def("weights_from_tensor",
        [](nb::handle array, nb::handle name) {
          return weightsFromTensor(array, strArg(name, "name"));
        },
        "array"_a.none(),
        "name"_a.none() = "weights",
        "A view of one [E, rows, cols] array (cols contiguous). `name` is "
        "used in error messages.");
  m.def("weights_split_fc1",
        [](nb::handle fc1, nb::handle name) {
          return weightsSplitFC1(fc1, strArg(name, "name"));
        },
        "fc1"_a.none(), "name"_a.none() = "fc1",
        "(gate, up) views of a fused FC1 array [E, 2*I, H]: gate is rows "
        "[0, I) of each expert, up rows [I, 2I).");
  m.def("weights_per_expert",
        [](nb::handle arrays, nb::handle name) {
          return weightsPerExpert(arrays, strArg(name, "name"));
        },
        "arrays"_a.none(),
        "name"_a.none() = "weights",
        "A view over one [rows, cols] array per expert (a list), with one "
        "row stride; the host pointer table is built here.");

  m.attr("UNIQUE_ID_BYTES") = MOK_UNIQUE_ID_BYTES;
  m.def(
      "nccl_load",
      [](nb::handle library) {
        std::string path;
        if (!library.is_none())
          path = strArg(library, "library");
        int version = 0;
        const char *file = nullptr;
        checkWithoutGil([&] {
          return mok_nccl_load(library.is_none() ? nullptr : path.c_str(),
                               &version, &file);
        });
        return nb::make_tuple(version, std::string(file ? file : ""));
      },
      "library"_a.none() = nb::none(),
      "Loads NCCL (once a process; `library` names its file, None: "
      "$MOK_NCCL_LIBRARY, else libnccl.so.2) and returns (NCCL_VERSION_CODE, "
      "the file it was loaded from). MokRuntimeError "
      "(MOK_ERROR_NCCL_UNAVAILABLE) naming the file and why when it cannot "
      "be loaded or is older than 2.28; another file than the one loaded is "
      "refused.");

  nb::class_<Comm>(m, "Comm",
                   "A communicator (mok_comm): NCCL's, made from a unique id "
                   "or adopted, or one rank of a local group (one GPU, no "
                   "NCCL). Layers and symmetric buffers keep it alive.")
      .def_static(
          "unique_id",
          []() {
            mok_unique_id id;
            checkWithoutGil([&] { return mok_comm_get_unique_id(&id); });
            return nb::bytes(id.bytes, MOK_UNIQUE_ID_BYTES);
          },
          "A new NCCL unique id (128 bytes), made on the rank that starts "
          "the group and sent to the others by the trainer.")
      .def_static(
          "create",
          [](nb::handle idArg, nb::handle nranks, nb::handle rank,
             nb::handle device) {
            mok_unique_id id = uniqueIdArg(idArg);
            int n = static_cast<int>(intArg(nranks, "nranks", INT32_MIN, INT32_MAX));
            int r = static_cast<int>(intArg(rank, "rank", INT32_MIN, INT32_MAX));
            int d = static_cast<int>(intArg(device, "device", INT32_MIN, INT32_MAX));
            auto c = std::make_unique<Comm>();
            checkWithoutGil(
                [&] { return mok_comm_create(&id, n, r, d, &c->handle); });
            return c;
          },
          "unique_id"_a.none(), "nranks"_a.none(), "rank"_a.none(),
          "device"_a.none(),
          "Rank `rank` of a communicator of `nranks` on CUDA `device` "
          "(ncclCommInitRank: returns when every rank has called it).")
      .def_static(
          "adopt",
          [](nb::handle ncclComm, nb::handle device) {
            uintptr_t raw = addressArg(ncclComm, "nccl_comm");
            int d = static_cast<int>(intArg(device, "device", INT32_MIN, INT32_MAX));
            auto c = std::make_unique<Comm>();
            checkWithoutGil([&] {
              return mok_comm_adopt(reinterpret_cast<void *>(raw), d, &c->handle);
            });
            return c;
          },
          "nccl_comm"_a.none(), "device"_a.none() = -1,
          "A communicator over an existing ncclComm_t (an int), which stays "
          "its owner's (destroy() does not destroy it). `device`: -1 for the "
          "communicator's own.")
      .def_static(
          "local_group",
          [](nb::handle nArg, nb::handle device) {
            int n = static_cast<int>(intArg(nArg, "n", INT32_MIN, INT32_MAX));
            int d = static_cast<int>(intArg(device, "device", INT32_MIN, INT32_MAX));
            std::vector<mok_comm> handles(n > 0 && n <= 1024 ? n : 0);
            check(mok_comm_create_local_group(n, d, handles.data()));
            nb::list out;
            for (mok_comm h : handles) {
              auto c = std::make_unique<Comm>();
              c->handle = h;
              out.append(nb::cast(c.release(), nb::rv_policy::take_ownership));
            }
            return out;
          },
          "n"_a.none(), "device"_a.none(),
          "The n communicators (ranks 0 to n-1) of a local group on CUDA "
          "`device`, without NCCL: symmetric buffers are device "
          "allocations, paired by allocation order.")
      .def_prop_ro("size", [](const Comm &c) { return c.query(mok_comm_size); })
      .def_prop_ro("rank", [](const Comm &c) { return c.query(mok_comm_rank); })
      .def_prop_ro("device",
                   [](const Comm &c) { return c.query(mok_comm_device); })
      .def_prop_ro(
          "nccl_comm",
          [](const Comm &c) {
            void *p = nullptr;
            check(mok_comm_nccl(c.live(), &p));
            return reinterpret_cast<uintptr_t>(p);
          },
          "The ncclComm_t as an int (0 for a local group's).")
      .def_prop_ro("destroyed", [](const Comm &c) { return !c.handle; })
      .def(
          "alloc_symmetric",
          [](nb::handle self, nb::handle bytesArg) {
            Comm &c = nb::cast<Comm &>(self);
            size_t bytes = static_cast<size_t>(
                intArg(bytesArg, "bytes", 1, int64_t(1) << 46));
            mok_comm h = c.live();
            auto s = std::make_unique<Symmetric>();
            checkWithoutGil(
                [&] { return mok_comm_alloc_symmetric(h, bytes, &s->handle); });
            s->keeper = nb::borrow(self);
            return s;
          },
          "bytes"_a.none(),
          "A zeroed symmetric buffer of `bytes` on every rank (collective: "
          "every rank, the same size, in the same order).")
      .def("destroy", &Comm::destroy,
           "Destroys the communicator now (an NCCL one mok made is finalized "
           "and destroyed); refused while a layer is bound to it or a "
           "buffer of it is live.");

  nb::class_<Symmetric>(m, "Symmetric",
                        "A symmetric buffer (mok_symmetric) and its peer "
                        "table.")
      .def_prop_ro("address", [](const Symmetric &s) {
        return reinterpret_cast<uintptr_t>(s.info().address);
      }, "This rank's buffer (a device address).")
      .def_prop_ro("bytes", [](const Symmetric &s) { return s.info().bytes; })
      .def_prop_ro("peer_table", [](const Symmetric &s) {
        return reinterpret_cast<uintptr_t>(s.info().peer_table);
      }, "The peer table's device address: ranks uint64.")
      .def_prop_ro("ranks", [](const Symmetric &s) { return s.info().ranks; })
      .def_prop_ro("rank", [](const Symmetric &s) { return s.info().rank; })
      .def_prop_ro("complete",
                   [](const Symmetric &s) { return bool(s.info().complete); },
                   "False while a local group's peer table waits for ranks.")
      .def_prop_ro("freed", [](const Symmetric &s) { return !s.handle; })
      .def("peers", &Symmetric::peers,
           "The peer table, read back from the device: entry i is rank i's "
           "buffer as this rank's kernels address it.")
      .def("free", &Symmetric::free,
           "Frees the buffer now (on every rank); refused for a layer's.");

  nb::class_<Layer>(m, "Layer",
                    "A compiled layer (mok_layer): create from the metadata "
                    "(no driver needed), load on a device, run forwards.")
      .def(
          "__init__",
          [](Layer *self, nb::handle json) {
            std::string metadata = strArg(json, "metadata_json");
            new (self) Layer(metadata);
          },
          "metadata_json"_a.none())
      .def_prop_ro("input_names", &Layer::inputNames,
                   "The layer's inputs, in the kernel's order.")
      .def_prop_ro("output_names", &Layer::outputNames,
                   "The layer's outputs, in the kernel's order: the first is "
                   "`out` of check and forward, the others (extra outputs) "
                   "are passed by name with the inputs.")
      .def_prop_ro(
          "device",
          [](const Layer &l) -> nb::object {
            if (l.device < 0)
              return nb::none();
            return nb::int_(l.device);
          },
          "The CUDA device it is loaded on (None before load).")
      .def_prop_ro("bound_weights", &Layer::boundWeights,
                   "The bound weight views, by operand name.")
      .def("check", &Layer::checkArgs, "inputs"_a.none() = nb::none(), nb::kw_only(),
           "out"_a.none(), "named"_a,
           "Checks the operands (a dict and/or keyword arguments: every "
           "input and every extra output, output_names[1:]) and `out` (the "
           "first output) against the metadata as forward would, without "
           "the driver; arrays may be on any device until the layer is "
           "loaded.")
      .def("load", &Layer::load, "device"_a.none(), "ptx"_a.none(),
           "cubin"_a.none() = nb::none(),
           "Loads the layer's module on CUDA `device` and allocates the "
           "workspace: `cubin` (bytes) when the driver takes it for the "
           "device, else `ptx` (a str; None only beside a cubin) through the "
           "driver's JIT and its JIT cache (mok_layer_load_image).")
      .def_prop_ro("load_source", &Layer::loadSource,
                   "(source, detail): how the module was loaded, \"cubin\" "
                   "(the one given), \"ptx\" (compiled by the driver, or "
                   "taken from its JIT cache) or \"none\" (not loaded), and "
                   "the runtime's sentence saying so.")
      .def("forward", &Layer::forward, "inputs"_a.none() = nb::none(), nb::kw_only(),
           "out"_a.none(), "stream"_a.none() = 0, "named"_a,
           "Checks and launches on `stream` (a CUstream handle as an int, 0 "
           "= the legacy default stream), asynchronously; returns `out`. "
           "Operands (the inputs and the extra outputs, written in place) as "
           "a dict and/or keyword arguments, CUDA arrays on the layer's "
           "device.")
      .def("bind_weights", &Layer::bindWeights, "name"_a.none(), "view"_a.none(),
           "Binds a WeightView to the routed weight operand `name` "
           "(gate_weights, up_weights, down_weights): forwards then take it "
           "from the view and refuse it among the operands. None unbinds. "
           "The layer keeps the view (and its arrays) referenced while "
           "bound; replacing or unbinding it drops that reference at once, "
           "as unbind_weights says.")
      .def("unbind_weights", &Layer::unbindWeights, "name"_a.none(),
           "Unbinds `name` (nothing happens if it is not bound). The layer "
           "drops its reference to the view at once, without waiting for "
           "forwards in flight: the device memory must stay valid (not "
           "freed or reused) until the last forward that reads it has "
           "finished on the GPU: keep a reference, or synchronize the "
           "forwards' stream first. (torch's caching allocator reuses freed "
           "memory in the order of the stream it was allocated on, so "
           "forwards on that stream need neither.)")
      .def("set_ep_group", &Layer::setEpGroup, "size"_a.none() = 1, "rank"_a.none() = 0,
           "nccl_comm"_a.none() = 0,
           "Sets the expert-parallel group of size 1 the layer runs in: "
           "(1, 0, nccl_comm) with an ncclComm_t as an int (0 = none). The "
           "default is (1, 0, 0). Checked by the runtime: 0 <= rank < size, "
           "a communicator for size > 1; size > 1 is refused by name (a "
           "layer joins a larger group through bind_comm), and so is a size "
           "other than the compiled one (ep_size). A refused group leaves "
           "the previous one. No driver needed.")
      .def_prop_ro("ep_group", &Layer::epGroup,
                   "(size, rank, nccl_comm) of the layer's expert-parallel "
                   "group: the bound Comm's, else (1, 0, 0) or what "
                   "set_ep_group set.")
      .def_prop_ro("ep_size", &Layer::epSize,
                   "The expert-parallel size the layer was compiled for (the "
                   "metadata's \"ep\"; 1 without it).")
      .def_prop_ro("symmetric_bytes", [](const Layer &l) {
             size_t bytes = 0;
             check(mok_layer_symmetric_bytes(l.handle, &bytes));
             return bytes;
           },
           "The bytes of symmetric exchange buffer each rank needs (0 for "
           "ep = 1).")
      .def("bind_comm", &Layer::bindComm, "comm"_a.none() = nb::none(),
           "buffer"_a.none() = nb::none(),
           "Binds the layer to a Comm of its ep (mok_layer_bind_comm): its "
           "exchange buffer is `buffer` (a Symmetric of that Comm, of at "
           "least symmetric_bytes, zeroed here) or one the layer allocates. "
           "Collective for an NCCL communicator. Both None unbind.")
      .def_prop_ro("comm", [](const Layer &l) {
             return l.boundComm.is_valid() ? l.boundComm : nb::none();
           }, "The bound Comm, or None.")
      .def_prop_ro("exchange", [](nb::handle self) -> nb::object {
             Layer &l = nb::cast<Layer &>(self);
             mok_symmetric b = nullptr;
             check(mok_layer_comm(l.handle, nullptr, &b));
             if (!b)
               return nb::none();
             if (l.boundBuffer.is_valid())
               return l.boundBuffer;
             auto s = std::make_unique<Symmetric>();
             s->handle = b;
             s->owned = false;
             s->keeper = nb::borrow(self);
             return nb::cast(s.release(), nb::rv_policy::take_ownership);
           },
           "The exchange buffer (a Symmetric), or None.")
      .def_prop_ro("epoch", [](const Layer &l) {
             uint64_t epoch = 0;
             check(mok_layer_epoch(l.handle, &epoch));
             return epoch;
           },
           "The epoch the last forward passed its kernel (0: none since "
           "binding); each forward passes the next.")
      .def("workspace_size", [](const Layer &l, nb::handle nameArg) {
             std::string name = strArg(nameArg, "name");
             size_t size = 0;
             check(mok_layer_workspace_size(l.handle, name.c_str(), &size));
             return size;
           }, "name"_a.none(),
           "The size in bytes of the workspace buffer `name` (a metadata "
           "param of role \"workspace\"); no driver needed.")
      .def("take_report", &Layer::takeReport, "stream"_a = 0,
           "wait"_a = true,
           "Raises MokRuntimeError if the layer's kernels reported something "
           "since the last take: expert ids outside [-1, E) "
           "(MOK_ERROR_BAD_ROUTING; the kernels dropped those routes) or a "
           "bounded grid barrier that timed out (MOK_ERROR_TIMEOUT). `wait`: "
           "synchronize `stream` first; else only finished launches count.")
      .def("set_grid", [](Layer &l, uint32_t ctas) {
             check(mok_layer_set_grid(l.handle, ctas));
           }, "ctas"_a,
           "The grid of the next forwards, in CTAs (0: one a "
           "multiprocessor). Refused above what can be resident at once.")
      .def_prop_ro("grid", [](const Layer &l) {
             uint32_t ctas = 0, most = 0;
             check(mok_layer_grid(l.handle, &ctas, &most));
             return nb::make_tuple(ctas, most);
           },
           "(the grid the next forward launches, the most CTAs that can be "
           "resident at once; 0 before load).")
      .def("read_workspace", &Layer::readWorkspace, "name"_a.none(),
           "A copy of the workspace buffer `name` (role \"workspace\", e.g. "
           "a profiling kernel's \"phase_clock\") as bytes, synchronously. "
           "The copy is ordered only against the legacy default stream: "
           "synchronize the stream the layer ran on first.");
}
