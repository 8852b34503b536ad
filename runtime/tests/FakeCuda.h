// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What the stand-in NCCL (FakeNccl.cpp) shares with the stand-in driver
// (FakeCuda.cpp), built into the same library: its allocations are "device"
// memory the driver's copies and memsets accept, and it reads the device
// whose context the calling thread made current. FOR TESTS ONLY.
//
#ifndef MOK_RUNTIME_TESTS_FAKE_CUDA_H
#define MOK_RUNTIME_TESTS_FAKE_CUDA_H

#include <cstddef>
#include <cstdint>

namespace mok_fake {

/// Makes [base, base + bytes) device memory that NCCL owns (cuMemFree of it
/// is a bad release); false if `base` is registered already.
bool addNcclMemory(uintptr_t base, size_t bytes);
/// Forgets NCCL memory at `base`; false if there is none.
bool removeNcclMemory(uintptr_t base);
/// Whether [p, p + bytes) lies in one live allocation.
bool isDeviceMemory(uintptr_t p, size_t bytes);
/// The device of the context current on this thread (cuCtxSetCurrent), -1
/// without one.
int currentDevice();
void setCurrentDevice(int device);

} // namespace mok_fake

#endif // MOK_RUNTIME_TESTS_FAKE_CUDA_H
