// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "CubinCache.h"

#include "Error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#ifndef MOK_VERSION
#define MOK_VERSION "unknown"
#endif

using namespace mok::runtime;

//===----------------------------------------------------------------------===//
// SHA-256 (FIPS 180-4)
//===----------------------------------------------------------------------===//

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/// Mixes one 64-byte block into `h`.
void compress(uint32_t h[8], const unsigned char *block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(block[4 * i]) << 24 | uint32_t(block[4 * i + 1]) << 16 |
           uint32_t(block[4 * i + 2]) << 8 | uint32_t(block[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5],
           g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) +
                  ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) +
                  ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

} // namespace

std::string mok::runtime::sha256Hex(const void *data, size_t size) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto *p = static_cast<const unsigned char *>(data);
  size_t whole = size / 64 * 64;
  for (size_t i = 0; i < whole; i += 64)
    compress(h, p + i);
  // The tail, a 1 bit, zeros, and the length in bits (big-endian).
  unsigned char last[128] = {};
  size_t tail = size - whole;
  if (tail)
    std::memcpy(last, p + whole, tail);
  last[tail] = 0x80;
  size_t blocks = tail + 1 + 8 <= 64 ? 1 : 2;
  uint64_t bits = static_cast<uint64_t>(size) * 8;
  for (int i = 0; i < 8; ++i)
    last[blocks * 64 - 1 - i] = static_cast<unsigned char>(bits >> (8 * i));
  for (size_t b = 0; b < blocks; ++b)
    compress(h, last + 64 * b);
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (uint32_t word : h)
    for (int shift = 28; shift >= 0; shift -= 4)
      hex += digits[(word >> shift) & 15];
  return hex;
}

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

//===----------------------------------------------------------------------===//
// Where the cache is
//===----------------------------------------------------------------------===//

namespace {
std::mutex directoryMutex;
bool directorySet = false; // by mok_runtime_set_cubin_cache
std::string directoryGiven;
thread_local std::string directoryAnswer; // mok_runtime_cubin_cache's
} // namespace

mok_status mok::runtime::cubinCacheDirectory(std::string &directory) {
  {
    std::lock_guard<std::mutex> lock(directoryMutex);
    if (directorySet) {
      directory = directoryGiven;
      return MOK_OK;
    }
  }
  directory.clear();
  // Off unless asked for: on the H200 (driver 580) the cubins the driver's
  // linker made of the wgmma kernels computed wrong results, where the
  // same PTX loaded by cuModuleLoadDataEx is right (docs/Runtime.md).
  const char *on = std::getenv("MOK_CUBIN_CACHE");
  if (!on || !*on || std::strcmp(on, "1") != 0) {
    if (!on || !*on || std::strcmp(on, "0") == 0)
      return MOK_OK;
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "MOK_CUBIN_CACHE: expected 0 (no cubin cache, the default) or "
              "1, got '"
           << on << "'";
  }
  const char *root = std::getenv("MOK_CACHE_DIR");
  const char *home = std::getenv("HOME");
  if (root && *root)
    directory = std::string(root) + "/cubin";
  else if (home && *home)
    directory = std::string(home) + "/.cache/mok/cubin";
  return MOK_OK;
}

extern "C" mok_status mok_runtime_set_cubin_cache(const char *directory) {
  std::lock_guard<std::mutex> lock(directoryMutex);
  directorySet = directory != nullptr;
  directoryGiven = directory ? directory : "";
  return ok();
}

extern "C" mok_status mok_runtime_cubin_cache(const char **directory) {
  if (!directory)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "directory: is NULL";
  *directory = "";
  std::string d;
  if (mok_status s = cubinCacheDirectory(d))
    return s;
  directoryAnswer = d;
  *directory = directoryAnswer.c_str();
  return ok();
}

//===----------------------------------------------------------------------===//
// Entries
//===----------------------------------------------------------------------===//

const char *mok::runtime::mokVersion() { return MOK_VERSION; }

std::string CubinKey::text() const {
  return std::string("mok cubin cache entry 1\n") + "mok " + mokVersion() +
         "\nchip " + chip + "\ndriver " + std::to_string(driverVersion) +
         "\njit_target " + std::to_string(jitTarget) + "\nptx " + ptxHash +
         "\n";
}

std::string CubinKey::fileName() const {
  std::string t = text();
  return sha256Hex(t.data(), t.size()) + ".cubin";
}

bool mok::runtime::prepareCacheDirectory(const std::string &directory,
                                         std::string &why) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    why = "cannot create " + directory + ": " + ec.message();
    return false;
  }
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    why = directory + " is not writable: " + std::strerror(errno);
    return false;
  }
  return true;
}

namespace {
/// An entry's head after the key: "size N\nsha256 HEX\n\n".
std::string sizeAndSum(size_t size, const std::string &sum) {
  return "size " + std::to_string(size) + "\nsha256 " + sum + "\n\n";
}

// No cubin is this large; a file that says so is not an entry.
constexpr size_t kMaxEntry = size_t(1) << 30;
} // namespace

bool mok::runtime::readCubin(const std::string &directory, const CubinKey &key,
                             std::vector<char> &image, std::string &why) {
  why.clear();
  std::string path = directory + "/" + key.fileName();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT)
      why = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  std::vector<char> bytes;
  bool readAll = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                 static_cast<uint64_t>(st.st_size) <= kMaxEntry;
  if (readAll) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      got += static_cast<size_t>(n);
    }
    readAll = got == bytes.size();
  }
  close(fd);
  auto corrupt = [&](const char *what) {
    why = path + " " + what;
    return false;
  };
  if (!readAll)
    return corrupt("could not be read whole");
  std::string head = key.text();
  if (bytes.size() < head.size() ||
      std::memcmp(bytes.data(), head.data(), head.size()) != 0)
    return corrupt("is not an entry for this PTX, chip and driver");
  // "size N\nsha256 HEX\n\n" follows; parse N, then check the rest.
  const char *p = bytes.data() + head.size();
  const char *end = bytes.data() + bytes.size();
  const char *sizeEnd = static_cast<const char *>(
      std::memchr(p, '\n', static_cast<size_t>(end - p)));
  if (end - p < 5 || std::memcmp(p, "size ", 5) != 0 || !sizeEnd)
    return corrupt("has no size");
  std::string number(p + 5, sizeEnd);
  char *numberEnd = nullptr;
  unsigned long long size = std::strtoull(number.c_str(), &numberEnd, 10);
  if (number.empty() || *numberEnd || size > kMaxEntry)
    return corrupt("has no size");
  size_t headEnd = static_cast<size_t>(sizeEnd + 1 - bytes.data()) + 7 + 64 + 2;
  if (bytes.size() < headEnd ||
      bytes.size() - headEnd != static_cast<size_t>(size))
    return corrupt("is truncated (or has bytes past its size)");
  std::string sum = sha256Hex(bytes.data() + headEnd, size);
  std::string expected = sizeAndSum(size, sum);
  if (std::memcmp(p, expected.data(), expected.size()) != 0)
    return corrupt("does not match its checksum");
  std::string notCubin;
  if (!checkCubin(bytes.data() + headEnd, size, notCubin))
    return corrupt(("holds no cubin (" + notCubin + ")").c_str());
  image.assign(bytes.begin() + static_cast<std::ptrdiff_t>(headEnd),
               bytes.end());
  return true;
}

bool mok::runtime::writeCubin(const std::string &directory, const CubinKey &key,
                              const std::vector<char> &image,
                              std::string &why) {
  static std::atomic<unsigned> counter{0};
  std::string name = key.fileName();
  std::string path = directory + "/" + name;
  std::string temporary = directory + "/." + name + "." +
                          std::to_string(getpid()) + "." +
                          std::to_string(counter.fetch_add(1)) + ".tmp";
  std::string sum = sha256Hex(image.data(), image.size());
  std::string head = key.text() + sizeAndSum(image.size(), sum);
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                0644);
  if (fd < 0) {
    why = "cannot write " + temporary + ": " + std::strerror(errno);
    return false;
  }
  bool written = true;
  using Part = std::pair<const char *, size_t>;
  for (const Part &part : {Part(head.data(), head.size()),
                           Part(image.data(), image.size())}) {
    size_t done = 0;
    while (written && done < part.second) {
      ssize_t n = write(fd, part.first + done, part.second - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        why = "cannot write " + temporary + ": " +
              std::strerror(n < 0 ? errno : ENOSPC);
        written = false;
      } else {
        done += static_cast<size_t>(n);
      }
    }
  }
  if (close(fd) != 0 && written) {
    why = "cannot write " + temporary + ": " + std::strerror(errno);
    written = false;
  }
  if (written && rename(temporary.c_str(), path.c_str()) != 0) {
    why = "cannot rename " + temporary + " to " + path + ": " +
          std::strerror(errno);
    written = false;
  }
  if (!written)
    unlink(temporary.c_str());
  return written;
}
