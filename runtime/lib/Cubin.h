// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What the runtime checks of a cubin given by the caller before the driver
// reads it (docs/Runtime.md, "Loading: cubins and the driver's JIT cache").
//
#ifndef MOK_RUNTIME_CUBIN_H
#define MOK_RUNTIME_CUBIN_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace mok::runtime {

/// Whether `size` bytes at `image` look like a CUDA cubin: a 64-bit
/// little-endian ELF for the CUDA machine whose header, program headers
/// and sections all lie inside the `size` bytes (the driver takes no size:
/// it reads as far as the headers say). Else false with the reason.
bool checkCubin(const void *image, size_t size, std::string &why);

/// The alignment `ptx` declares for its dynamic shared memory: the largest
/// N of its `.extern .shared .align N` declarations (outside comments); 0
/// when it declares none with an alignment.
uint64_t ptxDynamicSharedAlignment(const char *ptx);

/// Whether every kernel of a cubin (`size` bytes that checkCubin accepted)
/// starts its dynamic shared memory on an `alignment`-byte boundary. The
/// dynamic shared memory starts right after the kernel's static shared
/// memory, the section `.nv.shared.<kernel>`, so that section's size must
/// be a multiple of `alignment`: ptxas pads it so when it compiles the
/// whole program, and a cubin linked from relocatable code (ptxas -c,
/// nvlink; the driver's cuLink*) is padded to 16 bytes only. Alignments of
/// 16 bytes or less are always met. Else false with the reason, naming the
/// kernel and the byte its dynamic shared memory would start at.
bool checkDynamicSharedAlignment(const void *image, size_t size,
                                 uint64_t alignment, std::string &why);

} // namespace mok::runtime

#endif // MOK_RUNTIME_CUBIN_H
