// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "mok/Runtime/mok_runtime.h"

#include "Driver.h"
#include "Error.h"
#include "Module.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

using namespace mok::runtime;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

namespace {
thread_local std::string lastError;
} // namespace

mok_status mok::runtime::fail(mok_status status, const std::string &message) {
  lastError = message;
  return status;
}

mok_status mok::runtime::ok() {
  lastError.clear();
  return MOK_OK;
}

extern "C" const char *mok_last_error(void) { return lastError.c_str(); }

extern "C" const char *mok_status_name(mok_status status) {
  switch (status) {
  case MOK_OK:
    return "MOK_OK";
  case MOK_ERROR_INVALID_ARGUMENT:
    return "MOK_ERROR_INVALID_ARGUMENT";
  case MOK_ERROR_DRIVER_UNAVAILABLE:
    return "MOK_ERROR_DRIVER_UNAVAILABLE";
  case MOK_ERROR_CUDA:
    return "MOK_ERROR_CUDA";
  case MOK_ERROR_UNSUPPORTED:
    return "MOK_ERROR_UNSUPPORTED";
  case MOK_ERROR_OUT_OF_MEMORY:
    return "MOK_ERROR_OUT_OF_MEMORY";
  case MOK_ERROR_BAD_ROUTING:
    return "MOK_ERROR_BAD_ROUTING";
  case MOK_ERROR_TIMEOUT:
    return "MOK_ERROR_TIMEOUT";
  case MOK_ERROR_NCCL:
    return "MOK_ERROR_NCCL";
  case MOK_ERROR_NCCL_UNAVAILABLE:
    return "MOK_ERROR_NCCL_UNAVAILABLE";
  }
  return "MOK_ERROR_(unknown)";
}

//===----------------------------------------------------------------------===//
// Live handles
//===----------------------------------------------------------------------===//

namespace {
struct Registry {
  std::mutex mutex;
  std::unordered_set<const void *> live[4];
};

Registry &registry() {
  // Never destroyed: a layer may be destroyed by another library's static
  // destructor after this one's would have run.
  static Registry *r = new Registry;
  return *r;
}

const char *handleName(HandleKind kind) {
  switch (kind) {
  case HandleKind::Module:
    return "module";
  case HandleKind::Layer:
    return "layer";
  case HandleKind::Comm:
    return "comm";
  case HandleKind::Symmetric:
    return "buffer";
  }
  return "handle";
}

const char *handleType(HandleKind kind) {
  switch (kind) {
  case HandleKind::Module:
    return "mok_module";
  case HandleKind::Layer:
    return "mok_layer";
  case HandleKind::Comm:
    return "mok_comm";
  case HandleKind::Symmetric:
    return "mok_symmetric";
  }
  return "handle";
}

const char *handleMaker(HandleKind kind) {
  switch (kind) {
  case HandleKind::Module:
    return "mok_module_load_ptx";
  case HandleKind::Layer:
    return "mok_layer_create";
  case HandleKind::Comm:
    return "mok_comm_create, mok_comm_adopt or mok_comm_create_local_group";
  case HandleKind::Symmetric:
    return "mok_comm_alloc_symmetric";
  }
  return "mok";
}
} // namespace

void mok::runtime::addHandle(HandleKind kind, const void *handle) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live[static_cast<int>(kind)].insert(handle);
}

bool mok::runtime::removeHandle(HandleKind kind, const void *handle) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.live[static_cast<int>(kind)].erase(handle) == 1;
}

mok_status mok::runtime::checkHandle(HandleKind kind, const void *handle,
                                     const char *name) {
  if (!name)
    name = handleName(kind);
  if (!handle)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << name << ": is NULL";
  Registry &r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.live[static_cast<int>(kind)].count(handle))
      return MOK_OK;
  }
  return Fail(MOK_ERROR_INVALID_ARGUMENT)
         << name << ": 0x"
         << Hex{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle))}
         << " is not a live " << handleType(kind)
         << " (destroyed already, or not made by " << handleMaker(kind) << ")";
}

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

extern "C" const char *mok_dtype_name(mok_dtype dtype) {
  switch (dtype) {
  case MOK_DTYPE_BF16:
    return "bf16";
  case MOK_DTYPE_F32:
    return "f32";
  case MOK_DTYPE_I32:
    return "i32";
  case MOK_DTYPE_I64:
    return "i64";
  case MOK_DTYPE_U8:
    return "u8";
  case MOK_DTYPE_F8E4M3:
    return "f8e4m3";
  }
  return "(unknown dtype)";
}

extern "C" size_t mok_dtype_size(mok_dtype dtype) {
  switch (dtype) {
  case MOK_DTYPE_BF16:
    return 2;
  case MOK_DTYPE_F32:
  case MOK_DTYPE_I32:
    return 4;
  case MOK_DTYPE_I64:
    return 8;
  case MOK_DTYPE_U8:
  case MOK_DTYPE_F8E4M3:
    return 1;
  }
  return 0;
}

extern "C" mok_tensor mok_tensor_contiguous(void *data, mok_dtype dtype,
                                            int32_t rank,
                                            const int64_t *shape) {
  mok_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  int64_t stride = 1;
  for (int32_t d = rank - 1; d >= 0 && d < MOK_MAX_RANK; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

static std::string shapeString(const int64_t *shape, int32_t rank) {
  std::string s = "[";
  for (int32_t d = 0; d < rank; ++d) {
    if (d)
      s += ", ";
    s += shape[d] < 0 ? std::string("*") : std::to_string(shape[d]);
  }
  return s + "]";
}

static std::string describe(const mok_tensor &t) {
  int32_t rank = t.rank < 0 ? 0 : (t.rank > MOK_MAX_RANK ? MOK_MAX_RANK : t.rank);
  return std::string(mok_dtype_name(t.dtype)) + " " + shapeString(t.shape, rank);
}

mok_status mok::runtime::checkTensor(const mok_tensor *t, const char *name,
                                     mok_dtype dtype, int32_t rank,
                                     const int64_t *shape, bool tma) {
  std::string n = name ? name : "tensor";
  std::string want =
      std::string(mok_dtype_name(dtype)) + " " + shapeString(shape, rank);
  if (!t)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << n << ": is NULL; expected " << want;
  if (!t->data)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": data is NULL; expected " << want;
  if (t->dtype != dtype)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": expected dtype " << mok_dtype_name(dtype) << ", got "
           << describe(*t);
  if (t->rank != rank)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": expected rank " << rank << " (" << want << "), got rank "
           << t->rank;
  for (int32_t d = 0; d < rank; ++d)
    if (t->shape[d] < 0 || (shape[d] >= 0 && t->shape[d] != shape[d]))
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << n << ": expected shape " << shapeString(shape, rank) << ", got "
             << shapeString(t->shape, rank);
  if (rank > 0 && t->shape[rank - 1] > 1 && t->strides[rank - 1] != 1)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": the innermost dimension must be contiguous (stride 1), "
           << "got stride " << t->strides[rank - 1];
  size_t elt = mok_dtype_size(dtype);
  size_t align = tma ? 16 : elt;
  if (reinterpret_cast<uintptr_t>(t->data) % align)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": data must be " << align << "-byte aligned, got address 0x"
           << Hex{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t->data))};
  if (tma)
    for (int32_t d = 0; d + 1 < rank; ++d)
      if (t->shape[d] > 1 && (t->strides[d] * elt) % 16)
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << n << ": the stride of dimension " << d
               << " must be a multiple of 16 bytes, got " << t->strides[d]
               << " elements";
  return ok();
}

extern "C" mok_status mok_tensor_check(const mok_tensor *t, const char *name,
                                       mok_dtype dtype, int32_t rank,
                                       const int64_t *shape) {
  return checkTensor(t, name, dtype, rank, shape, /*tma=*/true);
}

//===----------------------------------------------------------------------===//
// Weight views
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_weights_from_tensor(const mok_tensor *t,
                                              const char *name,
                                              mok_expert_weights *out) {
  int64_t any[3] = {-1, -1, -1};
  if (!t)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << (name ? name : "weights") << ": is NULL";
  if (mok_status s = mok_tensor_check(t, name, t->dtype, 3, any))
    return s;
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  *out = mok_expert_weights{};
  out->layout = MOK_WEIGHTS_STRIDED;
  out->dtype = t->dtype;
  out->experts = t->shape[0];
  out->rows = t->shape[1];
  out->cols = t->shape[2];
  out->base = t->data;
  out->expert_stride = t->strides[0];
  out->row_stride = t->strides[1];
  return ok();
}

extern "C" mok_status mok_weights_split_fc1(const mok_tensor *fc1,
                                            const char *name,
                                            mok_expert_weights *gate,
                                            mok_expert_weights *up) {
  std::string n = name ? name : "fc1";
  mok_expert_weights all;
  if (mok_status s = mok_weights_from_tensor(fc1, n.c_str(), &all))
    return s;
  if (all.rows % 2)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": a fused FC1 [E, 2*I, H] needs an even row count, got "
           << all.rows;
  if (!gate || !up)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "gate/up: is NULL";
  *gate = all;
  gate->rows = all.rows / 2;
  *up = *gate;
  size_t elt = mok_dtype_size(all.dtype);
  up->base = static_cast<char *>(all.base) + gate->rows * all.row_stride * elt;
  return ok();
}

extern "C" mok_status mok_weights_per_expert(void *const *pointers,
                                             int64_t experts, int64_t rows,
                                             int64_t cols, int64_t rowStride,
                                             mok_dtype dtype, const char *name,
                                             mok_expert_weights *out) {
  std::string n = name ? name : "weights";
  if (!pointers)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": the pointer table is NULL";
  if (experts < 1 || rows < 1 || cols < 1)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": experts, rows and cols must be positive, got [" << experts
           << ", " << rows << ", " << cols << "]";
  if (rowStride < cols)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": row_stride " << rowStride << " is less than cols " << cols;
  size_t elt = mok_dtype_size(dtype);
  if (!elt)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << n << ": unknown dtype";
  if ((rowStride * elt) % 16)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": row_stride must be a multiple of 16 bytes, got "
           << rowStride << " elements";
  for (int64_t e = 0; e < experts; ++e) {
    uintptr_t p = reinterpret_cast<uintptr_t>(pointers[e]);
    if (!p || p % 16)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << n << ": expert " << e << "'s pointer must be non-NULL and "
             << "16-byte aligned, got 0x" << Hex{static_cast<uint64_t>(p)};
  }
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  *out = mok_expert_weights{};
  out->layout = MOK_WEIGHTS_PER_EXPERT;
  out->dtype = dtype;
  out->experts = experts;
  out->rows = rows;
  out->cols = cols;
  out->row_stride = rowStride;
  out->expert_pointers = pointers;
  return ok();
}

extern "C" mok_status mok_weights_element_address(const mok_expert_weights *w,
                                                  int64_t expert, int64_t row,
                                                  int64_t col,
                                                  uintptr_t *address) {
  if (!w || !address)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "weights/address: is NULL";
  if (expert < 0 || expert >= w->experts || row < 0 || row >= w->rows ||
      col < 0 || col >= w->cols)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "element (" << expert << ", " << row << ", " << col
           << ") is outside [" << w->experts << ", " << w->rows << ", "
           << w->cols << "]";
  size_t elt = mok_dtype_size(w->dtype);
  uintptr_t base =
      w->layout == MOK_WEIGHTS_PER_EXPERT
          ? reinterpret_cast<uintptr_t>(w->expert_pointers[expert])
          : reinterpret_cast<uintptr_t>(w->base) + expert * w->expert_stride * elt;
  *address = base + (row * w->row_stride + col) * elt;
  return ok();
}

extern "C" mok_status mok_weights_check(const mok_expert_weights *w,
                                        const char *name, mok_dtype dtype,
                                        int64_t experts, int64_t rows,
                                        int64_t cols) {
  std::string n = name ? name : "weights";
  if (!w)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << n << ": is NULL";
  if (w->layout != MOK_WEIGHTS_STRIDED && w->layout != MOK_WEIGHTS_PER_EXPERT)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": unknown layout " << static_cast<int>(w->layout);
  if (w->dtype != dtype)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": expected dtype " << mok_dtype_name(dtype) << ", got "
           << mok_dtype_name(w->dtype);
  int64_t want[3] = {experts, rows, cols}, got[3] = {w->experts, w->rows, w->cols};
  for (int d = 0; d < 3; ++d)
    if (want[d] >= 0 && got[d] != want[d])
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << n << ": expected [E, rows, cols] = " << shapeString(want, 3)
             << ", got " << shapeString(got, 3);
  return ok();
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

mok_status mok::runtime::checkEpGroup(const mok_ep_group *g) {
  if (!g)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "ep_group: is NULL";
  if (g->size < 1 || g->rank < 0 || g->rank >= g->size)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ep_group: expected 0 <= rank < size, got rank " << g->rank
           << " of size " << g->size;
  if (g->size > 1 && !g->nccl_comm)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ep_group: expert parallelism (size " << g->size
           << ") needs an NCCL communicator, got nccl_comm NULL";
  return MOK_OK;
}

extern "C" mok_status mok_ep_group_check(const mok_ep_group *g) {
  if (mok_status s = checkEpGroup(g))
    return s;
  return ok();
}

//===----------------------------------------------------------------------===//
// Driver, modules, launches
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_driver_probe(int *available, int *deviceCount) {
  if (!available || !deviceCount)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "available/device_count: is NULL";
  *available = 0;
  *deviceCount = 0;
  std::string why;
  const Driver *d = loadDriver(why);
  if (!d) {
    fail(MOK_OK, why); // not an error of the call: the answer is "none"
    return MOK_OK;
  }
  int count = 0;
  if (CUresult r = d->deviceGetCount(&count); r != CUDA_SUCCESS) {
    fail(MOK_OK, "cuDeviceGetCount failed: " + d->describe(r));
    return MOK_OK;
  }
  *available = count > 0;
  *deviceCount = count;
  return ok();
}

mok_status mok::runtime::driverOrFail(const Driver *&d) {
  std::string why;
  d = loadDriver(why);
  if (!d)
    return fail(MOK_ERROR_DRIVER_UNAVAILABLE, why);
  return MOK_OK;
}

// mok_module_load_ptx and mok_module_load_image: ModuleLoad.cpp.

void mok::runtime::destroyModule(mok_module m) {
  if (!m || !removeHandle(HandleKind::Module, m))
    return;
  // Errors are ignored: there is nothing left to undo, and the module's
  // host memory goes either way.
  m->driver->ctxSetCurrent(m->context);
  m->driver->moduleUnload(m->module);
  m->driver->primaryCtxRelease(m->device);
  delete m;
}

extern "C" void mok_module_destroy(mok_module m) {
  if (!m) {
    ok();
    return;
  }
  if (mok_status s = checkHandle(HandleKind::Module, m)) {
    (void)s; // recorded: a second destroy, or not a module, is harmless
    return;
  }
  destroyModule(m);
  ok();
}

extern "C" mok_status mok_device_sm_count(int device, int *count) {
  if (!count)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "count: is NULL";
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  CUdevice dev;
  if (CUresult r = d->deviceGet(&dev, device); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_INVALID_DEVICE)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "device: " << device << " is not a device (" << d->describe(r)
             << ")";
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGet: " << d->describe(r);
  }
  if (CUresult r = d->deviceGetAttribute(
          count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGetAttribute: " << d->describe(r);
  return ok();
}

/// `kernel` of `m`, with `dynamicSmem` bytes of dynamic shared memory opted
/// into (above 48 KiB), the module's context current.
static mok_status kernelOf(mok_module m, const char *kernel,
                           uint32_t dynamicSmem, CUfunction &f) {
  const Driver *d = m->driver;
  if (CUresult r = d->ctxSetCurrent(m->context); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  if (CUresult r = d->moduleGetFunction(&f, m->module, kernel); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NOT_FOUND)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "kernel: no kernel named '" << kernel << "' in the module ("
             << d->describe(r) << ")";
    return Fail(MOK_ERROR_CUDA) << "cuModuleGetFunction for '" << kernel
                                << "': " << d->describe(r);
  }
  if (dynamicSmem > 48 * 1024)
    if (CUresult r = d->funcSetAttribute(
            f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamicSmem);
        r != CUDA_SUCCESS)
      return Fail(MOK_ERROR_CUDA)
             << "dynamic_smem: " << dynamicSmem
             << " bytes refused by the device: " << d->describe(r);
  return ok();
}

/// The cluster sizes a launch takes: CUDA's portable ones.
static mok_status checkCluster(uint32_t cluster) {
  if (cluster < 1 || cluster > 8)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "cluster: expected 1 to 8 CTAs a cluster, got " << cluster;
  return ok();
}

/// The launch attribute of clusters of `cluster` CTAs along x.
static CUlaunchAttribute clusterDimension(uint32_t cluster) {
  CUlaunchAttribute attr = {};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = cluster;
  attr.value.clusterDim.y = 1;
  attr.value.clusterDim.z = 1;
  return attr;
}

extern "C" mok_status mok_module_launch(mok_module m, const char *kernel,
                                        const uint32_t grid[3],
                                        const uint32_t block[3],
                                        uint32_t dynamicSmem, void *stream,
                                        void **params, uint32_t flags) {
  return mok_module_launch_clusters(m, kernel, grid, block, /*cluster=*/1,
                                    dynamicSmem, stream, params, flags);
}

extern "C" mok_status
mok_module_launch_clusters(mok_module m, const char *kernel,
                           const uint32_t grid[3], const uint32_t block[3],
                           uint32_t cluster, uint32_t dynamicSmem, void *stream,
                           void **params, uint32_t flags) {
  // The arguments first, the module last (what needs no module is checked
  // without one).
  if (!kernel || !grid || !block)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "kernel/grid/block: is NULL";
  if (mok_status s = checkCluster(cluster))
    return s;
  if (grid[0] % cluster)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "grid: grid[0] = " << grid[0]
           << " is not a multiple of the cluster's " << cluster << " CTAs";
  if (flags & ~uint32_t(MOK_LAUNCH_COOPERATIVE))
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "flags: unknown bits 0x"
                                            << Hex{static_cast<uint64_t>(flags)};
  if (mok_status s = checkHandle(HandleKind::Module, m))
    return s;
  const Driver *d = m->driver;
  CUfunction f;
  if (mok_status s = kernelOf(m, kernel, dynamicSmem, f))
    return s;
  bool cooperative = flags & MOK_LAUNCH_COOPERATIVE;
  CUresult r;
  if (cluster == 1) {
    r = cooperative
            ? d->launchCooperativeKernel(f, grid[0], grid[1], grid[2], block[0],
                                         block[1], block[2], dynamicSmem,
                                         static_cast<CUstream>(stream), params)
            : d->launchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                              block[2], dynamicSmem,
                              static_cast<CUstream>(stream), params, nullptr);
  } else {
    CUlaunchAttribute attrs[2] = {clusterDimension(cluster), {}};
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[1].value.cooperative = 1;
    CUlaunchConfig config = {};
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = block[0];
    config.blockDimY = block[1];
    config.blockDimZ = block[2];
    config.sharedMemBytes = dynamicSmem;
    config.hStream = static_cast<CUstream>(stream);
    config.attrs = attrs;
    config.numAttrs = cooperative ? 2 : 1;
    r = d->launchKernelEx(&config, f, params, nullptr);
  }
  if (r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "launching '" << kernel << "' failed: " << d->describe(r)
           << (cooperative ? " (a cooperative grid must fit on the device at "
                             "once)"
                           : "");
  return ok();
}

extern "C" mok_status
mok_module_max_active_clusters(mok_module m, const char *kernel, uint32_t block,
                               uint32_t cluster, uint32_t dynamicSmem,
                               int *count) {
  if (!kernel || !count)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "kernel/count: is NULL";
  if (mok_status s = checkCluster(cluster))
    return s;
  if (block < 1 || block > 1024)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "block: expected 1 to 1024 threads, got " << block;
  if (mok_status s = checkHandle(HandleKind::Module, m))
    return s;
  const Driver *d = m->driver;
  CUfunction f;
  if (mok_status s = kernelOf(m, kernel, dynamicSmem, f))
    return s;
  CUlaunchAttribute attr = clusterDimension(cluster);
  CUlaunchConfig config = {};
  // The grid must hold whole clusters; the count does not depend on it.
  config.gridDimX = cluster;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = block;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = dynamicSmem;
  config.attrs = &attr;
  config.numAttrs = 1;
  if (CUresult r = d->occupancyMaxActiveClusters(count, f, &config);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuOccupancyMaxActiveClusters for '"
                                << kernel << "': " << d->describe(r);
  return ok();
}

extern "C" mok_status mok_module_max_active_blocks(mok_module m,
                                                   const char *kernel,
                                                   uint32_t block,
                                                   uint32_t dynamicSmem,
                                                   int *perMultiprocessor) {
  if (!kernel || !perMultiprocessor)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "kernel/per_multiprocessor: is NULL";
  if (block < 1 || block > 1024)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "block: expected 1 to 1024 threads, got " << block;
  if (!m)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "module: is NULL";
  const Driver *d = m->driver;
  CUfunction f;
  if (mok_status s = kernelOf(m, kernel, dynamicSmem, f))
    return s;
  if (CUresult r = d->occupancyMaxActiveBlocksPerMultiprocessor(
          perMultiprocessor, f, static_cast<int>(block), dynamicSmem);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "cuOccupancyMaxActiveBlocksPerMultiprocessor for '" << kernel
           << "': " << d->describe(r);
  return ok();
}

extern "C" mok_status mok_tma_descriptor_2d(void *descriptor, void *data,
                                            int64_t rows, int64_t cols,
                                            int64_t rowStride,
                                            uint32_t boxRows,
                                            uint32_t boxCols) {
  return mok_tma_descriptor_2d_typed(descriptor, data, MOK_DTYPE_BF16, rows,
                                     cols, rowStride, boxRows, boxCols);
}

extern "C" mok_status
mok_tma_descriptor_2d_typed(void *descriptor, void *data, mok_dtype dtype,
                            int64_t rows, int64_t cols, int64_t rowStride,
                            uint32_t boxRows, uint32_t boxCols) {
  if (!descriptor || !data)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "descriptor/data: is NULL";
  // FP8 travels as bytes: TMA moves it unchanged, and the tensor cores
  // read it as E4M3.
  CUtensorMapDataType type;
  if (dtype == MOK_DTYPE_BF16)
    type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else if (dtype == MOK_DTYPE_F8E4M3)
    type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  else
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "dtype: expected bf16 or f8e4m3, got " << mok_dtype_name(dtype);
  int64_t elt = static_cast<int64_t>(mok_dtype_size(dtype));
  if (rows < 1 || cols < 1 || rowStride < cols)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "expected rows, cols >= 1 and row_stride >= cols, got [" << rows
           << ", " << cols << "] with row_stride " << rowStride;
  if (reinterpret_cast<uintptr_t>(data) % 16 || (rowStride * elt) % 16)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "data and row_stride must be 16-byte aligned for TMA";
  if (boxCols * elt > 128 || boxRows > 256 || !boxRows || !boxCols)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "box [" << boxRows << ", " << boxCols
           << "] must have at most 256 rows and 128 bytes a row (128B "
              "swizzle), "
           << 128 / elt << " " << mok_dtype_name(dtype) << " elements";
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols),
                        static_cast<cuuint64_t>(rows)};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(rowStride * elt)};
  cuuint32_t box[2] = {boxCols, boxRows};
  cuuint32_t elementStrides[2] = {1, 1};
  if (CUresult r = d->tensorMapEncodeTiled(
          static_cast<CUtensorMap *>(descriptor), type, 2, data, dims,
          strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "cuTensorMapEncodeTiled: " << d->describe(r);
  return ok();
}
