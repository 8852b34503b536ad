// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Cubin.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

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
constexpr uint16_t kSectionIndexInHeader0 = 0xffff; // SHN_XINDEX

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

//===----------------------------------------------------------------------===//
// Dynamic shared memory's alignment
//===----------------------------------------------------------------------===//

namespace {

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

/// N of one PTX statement (comments blanked, no terminator) when it is an
/// `.extern .shared` declaration with `.align N`; else 0.
uint64_t externSharedAlignment(const std::string &statement) {
  std::vector<std::string> words;
  for (size_t i = 0; i < statement.size();) {
    while (i < statement.size() && isSpace(statement[i]))
      ++i;
    size_t start = i;
    while (i < statement.size() && !isSpace(statement[i]))
      ++i;
    if (i > start)
      words.push_back(statement.substr(start, i - start));
  }
  bool isExtern = false, isShared = false;
  uint64_t alignment = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    isExtern |= words[i] == ".extern";
    isShared |= words[i] == ".shared";
    if (words[i] == ".align" && i + 1 < words.size()) {
      char *end = nullptr;
      unsigned long long n = std::strtoull(words[i + 1].c_str(), &end, 0);
      if (end && !*end)
        alignment = n;
    }
  }
  return isExtern && isShared ? alignment : 0;
}

} // namespace

uint64_t mok::runtime::ptxDynamicSharedAlignment(const char *ptx) {
  if (!ptx || !std::strstr(ptx, ".extern"))
    return 0;
  uint64_t largest = 0;
  // Statements end at ';' and at braces; comments and strings are blanked.
  std::string statement;
  auto finish = [&] {
    if (statement.find(".extern") != std::string::npos) {
      uint64_t n = externSharedAlignment(statement);
      largest = n > largest ? n : largest;
    }
    statement.clear();
  };
  for (const char *p = ptx; *p; ++p) {
    if (p[0] == '/' && p[1] == '/') {
      p += std::strcspn(p, "\n");
      if (!*p)
        break;
      statement += ' ';
    } else if (p[0] == '/' && p[1] == '*') {
      const char *end = std::strstr(p + 2, "*/");
      if (!end)
        break;
      p = end + 1;
      statement += ' ';
    } else if (*p == '"') {
      const char *end = std::strchr(p + 1, '"');
      if (!end)
        break;
      p = end;
      statement += ' ';
    } else if (*p == ';' || *p == '{' || *p == '}') {
      finish();
    } else {
      statement += *p;
    }
  }
  finish();
  return largest;
}

bool mok::runtime::checkDynamicSharedAlignment(const void *image, size_t size,
                                               uint64_t alignment,
                                               std::string &why) {
  if (alignment <= 16)
    return true;
  const auto *p = static_cast<const unsigned char *>(image);
  uint64_t shoff = field<uint64_t>(p, 40);
  uint16_t shentsize = field<uint16_t>(p, 58);
  uint64_t shnum = field<uint16_t>(p, 60);
  uint64_t names = field<uint16_t>(p, 62); // e_shstrndx
  if (!shoff || shentsize < 64 || !inside(shoff, 1, shentsize, size))
    return true; // no sections: no static shared memory
  const unsigned char *header0 = p + shoff;
  if (shnum == 0)
    shnum = field<uint64_t>(header0, 32);
  if (names == kSectionIndexInHeader0)
    names = field<uint32_t>(header0, 40);
  if (names == 0 || names >= shnum || !inside(shoff, shnum, shentsize, size))
    return true; // no section names to find the kernels' sections by
  const unsigned char *namesHeader = p + shoff + names * shentsize;
  uint64_t namesAt = field<uint64_t>(namesHeader, 24);
  uint64_t namesSize = field<uint64_t>(namesHeader, 32);
  if (field<uint32_t>(namesHeader, 4) == kSectionNoBits ||
      !inside(namesAt, 1, namesSize, size))
    return true;
  const char *table = reinterpret_cast<const char *>(p + namesAt);
  const char kPrefix[] = ".nv.shared.";
  const char kReserved[] = ".nv.shared.reserved.";
  for (uint64_t i = 1; i < shnum; ++i) {
    const unsigned char *sh = p + shoff + i * shentsize;
    uint32_t nameAt = field<uint32_t>(sh, 0);
    if (nameAt >= namesSize)
      continue;
    const char *name = table + nameAt;
    const void *end = std::memchr(name, 0, namesSize - nameAt);
    if (!end) // not terminated inside the table
      continue;
    size_t length = static_cast<size_t>(static_cast<const char *>(end) - name);
    if (length <= sizeof kPrefix - 1 ||
        std::strncmp(name, kPrefix, sizeof kPrefix - 1) != 0 ||
        std::strncmp(name, kReserved, sizeof kReserved - 1) == 0)
      continue;
    uint64_t staticBytes = field<uint64_t>(sh, 32);
    if (staticBytes % alignment == 0)
      continue;
    why = "kernel " + std::string(name + sizeof kPrefix - 1, name + length) +
          "'s dynamic shared memory would start at byte " +
          std::to_string(staticBytes) + ", not on the " +
          std::to_string(alignment) +
          "-byte boundary its PTX declares (a cubin linked from relocatable "
          "code?)";
    return false;
  }
  return true;
}
