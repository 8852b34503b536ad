// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What the runtime checks of a cubin given by the caller before the driver
// reads it (docs/Runtime.md, "Loading: cubins and the driver's JIT cache").
//
#ifndef MOK_RUNTIME_CUBIN_H
#define MOK_RUNTIME_CUBIN_H

#include <cstddef>
#include <string>

namespace mok::runtime {

/// Whether `size` bytes at `image` look like a CUDA cubin: a 64-bit
/// little-endian ELF for the CUDA machine whose header, program headers
/// and sections all lie inside the `size` bytes (the driver takes no size:
/// it reads as far as the headers say). Else false with the reason.
bool checkCubin(const void *image, size_t size, std::string &why);

} // namespace mok::runtime

#endif // MOK_RUNTIME_CUBIN_H
