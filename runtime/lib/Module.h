// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_RUNTIME_MODULE_H
#define MOK_RUNTIME_MODULE_H

#include "Driver.h"

#include "mok/Runtime/mok_runtime.h"

/// A loaded PTX module, in its device's primary context.
struct mok_module_s {
  const mok::runtime::Driver *driver = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
};

namespace mok::runtime {
/// The driver, or MOK_ERROR_DRIVER_UNAVAILABLE with the reason recorded.
mok_status driverOrFail(const Driver *&d);

/// mok_tensor_check with TMA's rules (16-byte data and outer strides) or,
/// for tensors read element by element, alignment to the element size only.
mok_status checkTensor(const mok_tensor *t, const char *name, mok_dtype dtype,
                       int32_t rank, const int64_t *shape, bool tma);

/// mok_ep_group_check's argument checks (not NULL, 0 <= rank < size, a
/// communicator for size > 1), without refusing size > 1: the caller says
/// why it cannot run one.
mok_status checkEpGroup(const mok_ep_group *g);
} // namespace mok::runtime

#endif // MOK_RUNTIME_MODULE_H
