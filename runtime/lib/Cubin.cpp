// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Cubin.h"

#include <cstdint>
#include <cstring>

using namespace mok::runtime;

//===----------------------------------------------------------------------===//
// Cubins (ELF)
//===----------------------------------------------------------------------===//

namespace {

template <typename T> T field(const unsigned char *p, size_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof v); // ELF's little-endian, as the host
  return v;
}

/// Whether [offset, offset + count * each) lies inside `size` bytes.
bool inside(uint64_t offset, uint64_t count, uint64_t each, uint64_t size) {
  uint64_t bytes, end;
  return !__builtin_mul_overflow(count, each, &bytes) &&
         !__builtin_add_overflow(offset, bytes, &end) && end <= size;
}

constexpr uint16_t kElfMachineCuda = 190; // EM_CUDA
constexpr uint32_t kSectionNoBits = 8;    // SHT_NOBITS: no bytes in the file

} // namespace

bool mok::runtime::checkCubin(const void *image, size_t size,
                              std::string &why) {
  const auto *p = static_cast<const unsigned char *>(image);
  if (size < 64 || std::memcmp(p, "\x7f" "ELF", 4) != 0) {
    why = "not an ELF image";
    return false;
  }
  if (p[4] != 2 || p[5] != 1) {
    why = "not a 64-bit little-endian ELF image";
    return false;
  }
  if (field<uint16_t>(p, 18) != kElfMachineCuda) {
    why = "an ELF image for machine " + std::to_string(field<uint16_t>(p, 18)) +
          ", not for CUDA (" + std::to_string(kElfMachineCuda) + ")";
    return false;
  }
  uint64_t phoff = field<uint64_t>(p, 32), shoff = field<uint64_t>(p, 40);
  uint16_t phentsize = field<uint16_t>(p, 54), phnum = field<uint16_t>(p, 56);
  uint16_t shentsize = field<uint16_t>(p, 58);
  uint64_t shnum = field<uint16_t>(p, 60);
  auto truncated = [&](const std::string &what) {
    why = "truncated: its " + what + " end past its " + std::to_string(size) +
          " bytes";
    return false;
  };
  if (phnum) {
    if (phentsize < 56 || !inside(phoff, phnum, phentsize, size))
      return truncated("program headers");
    for (uint64_t i = 0; i < phnum; ++i) {
      const unsigned char *ph = p + phoff + i * phentsize;
      if (!inside(field<uint64_t>(ph, 8), 1, field<uint64_t>(ph, 32), size))
        return truncated("segments");
    }
  }
  if (shoff) {
    if (shentsize < 64 || !inside(shoff, 1, shentsize, size))
      return truncated("section headers");
    if (shnum == 0) // more sections than e_shnum holds: section 0 says
      shnum = field<uint64_t>(p + shoff, 32);
    if (!inside(shoff, shnum, shentsize, size))
      return truncated("section headers");
    for (uint64_t i = 0; i < shnum; ++i) {
      const unsigned char *sh = p + shoff + i * shentsize;
      if (field<uint32_t>(sh, 4) != kSectionNoBits &&
          !inside(field<uint64_t>(sh, 24), 1, field<uint64_t>(sh, 32), size))
        return truncated("sections");
    }
  }
  return true;
}
