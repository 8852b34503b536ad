// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The cubin cache: machine code the driver compiled from a layer's PTX,
// kept on disk so that the next process loads it without a JIT
// (docs/Runtime.md, "Loading: cubins and the cubin cache"). One file an
// entry, named by a hash of everything that decides the code (the PTX, the
// chip, the driver's version, mok's version, the JIT target); each entry
// repeats that key and carries its size and checksum, so a corrupt,
// truncated or colliding entry is found and ignored, never loaded.
//
#ifndef MOK_RUNTIME_CUBINCACHE_H
#define MOK_RUNTIME_CUBINCACHE_H

#include "mok/Runtime/mok_runtime.h"

#include <cstddef>
#include <string>
#include <vector>

namespace mok::runtime {

/// The SHA-256 of `size` bytes at `data`, as 64 lowercase hex digits.
std::string sha256Hex(const void *data, size_t size);

/// Whether `size` bytes at `image` look like a CUDA cubin: a 64-bit
/// little-endian ELF for the CUDA machine whose header, program headers
/// and sections all lie inside the `size` bytes (the driver takes no size:
/// it reads as far as the headers say). Else false with the reason.
bool checkCubin(const void *image, size_t size, std::string &why);

/// The directory of the cubin cache: the one mok_runtime_set_cubin_cache
/// set, else with $MOK_CUBIN_CACHE=1 $MOK_CACHE_DIR/cubin, else
/// $HOME/.cache/mok/cubin; "" when caching is off (the default, set so,
/// $MOK_CUBIN_CACHE unset or 0, or no HOME). Fails
/// (MOK_ERROR_INVALID_ARGUMENT) for a $MOK_CUBIN_CACHE other than 0 or 1.
mok_status cubinCacheDirectory(std::string &directory);

/// One entry's identity: what decides the machine code the driver makes
/// from a PTX.
struct CubinKey {
  std::string ptxHash; // sha256Hex of the PTX
  std::string chip;    // "sm_90"
  int driverVersion = 0;
  unsigned jitTarget = 0; // the CU_JIT_TARGET given (0: the context's)

  /// The text stored at the head of the entry (and hashed for its name).
  std::string text() const;
  /// The entry's file name: the hash of text() with ".cubin".
  std::string fileName() const;
};

/// Creates `directory` (and its parents) and checks that files can be
/// written there; false with the reason if not.
bool prepareCacheDirectory(const std::string &directory, std::string &why);

/// The cubin stored for `key` in `directory`. False with `why` empty when
/// there is none; false with the reason when the file exists but is not a
/// whole entry for this key (truncated, corrupt, another key's, not a
/// cubin): the caller ignores it, and a later store replaces it.
bool readCubin(const std::string &directory, const CubinKey &key,
               std::vector<char> &image, std::string &why);

/// Stores `image` for `key` in `directory`, atomically (written to a
/// temporary file of its own, then renamed over the entry's name); false
/// with the reason when that fails (the temporary file is removed).
bool writeCubin(const std::string &directory, const CubinKey &key,
                const std::vector<char> &image, std::string &why);

/// The version of mok the runtime was built from (the key's part that
/// changes when the runtime's JIT settings may have).
const char *mokVersion();

} // namespace mok::runtime

#endif // MOK_RUNTIME_CUBINCACHE_H
