// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_RUNTIME_MODULE_H
#define MOK_RUNTIME_MODULE_H

#include "Driver.h"

#include "mok/Runtime/mok_runtime.h"

#include <string>

/// A loaded module, in its device's primary context.
struct mok_module_s {
  const mok::runtime::Driver *driver = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  // Where its machine code came from (mok_module_load_source).
  mok_load_source source = MOK_LOAD_NONE;
  std::string loadDetail;
};

namespace mok::runtime {
/// The driver, or MOK_ERROR_DRIVER_UNAVAILABLE with the reason recorded.
mok_status driverOrFail(const Driver *&d);

/// mok_tensor_check with TMA's rules (16-byte data and outer strides) or,
/// for tensors read element by element, alignment to the element size only.
mok_status checkTensor(const mok_tensor *t, const char *name, mok_dtype dtype,
                       int32_t rank, const int64_t *shape, bool tma);

/// mok_ep_group_check's checks (not NULL, 0 <= rank < size, a
/// communicator for size > 1), without clearing the last error.
mok_status checkEpGroup(const mok_ep_group *g);

/// The kinds of handle the C API gives out.
enum class HandleKind { Module, Layer, Comm, Symmetric };

/// The registry of live handles: every mok_module, mok_layer, mok_comm and
/// mok_symmetric made and not yet destroyed. Entry points look a handle up before they touch it,
/// so a destroyed or forged one is refused by name instead of dereferenced.
/// (An address freed by a destroy may be reused by a later create: the old
/// handle then names the new object. The registry catches a use after
/// destroy until that happens, not ownership mistakes in general.)
void addHandle(HandleKind kind, const void *handle);
/// Forgets `handle`; false if it was not live.
bool removeHandle(HandleKind kind, const void *handle);
/// MOK_OK for a live handle; else MOK_ERROR_INVALID_ARGUMENT naming it
/// ("layer: is NULL", "layer: 0x... is not a live mok_layer ..."), the
/// argument called `name` (default: the kind's usual name).
mok_status checkHandle(HandleKind kind, const void *handle,
                       const char *name = nullptr);

/// Unloads a live module and releases its context, without the handle
/// check of mok_module_destroy and without touching mok_last_error (for
/// cleanup after a recorded failure).
void destroyModule(mok_module module);
} // namespace mok::runtime

#endif // MOK_RUNTIME_MODULE_H
