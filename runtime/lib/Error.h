// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_RUNTIME_ERROR_H
#define MOK_RUNTIME_ERROR_H

#include "mok/Runtime/mok_runtime.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace mok::runtime {

/// Records `message` as this thread's last error and returns `status`.
mok_status fail(mok_status status, const std::string &message);

/// An integer printed in hexadecimal (without the 0x).
struct Hex {
  uint64_t value;
};

/// Builds a message with operator<< and records it:
///   return Fail(MOK_ERROR_INVALID_ARGUMENT) << "x: expected ...";
/// Numbers are formatted with to_string/snprintf, not iostreams: a trainer
/// process may hold another libstdc++'s locale facets (seen on the H200
/// machine: after `import numpy`, an ostream << int64_t in this library
/// called a codecvt facet through a mismatched facet id and crashed).
class Fail {
public:
  explicit Fail(mok_status status) : status(status) {}
  Fail &operator<<(const std::string &v) {
    text += v;
    return *this;
  }
  Fail &operator<<(const char *v) {
    text += v ? v : "(null)";
    return *this;
  }
  Fail &operator<<(char v) {
    text += v;
    return *this;
  }
  Fail &operator<<(bool v) {
    text += v ? "true" : "false";
    return *this;
  }
  Fail &operator<<(Hex v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llx",
                  static_cast<unsigned long long>(v.value));
    text += buf;
    return *this;
  }
  template <typename T>
  std::enable_if_t<std::is_arithmetic_v<T>, Fail &> operator<<(T v) {
    if constexpr (std::is_floating_point_v<T>) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
      text += buf;
    } else {
      text += std::to_string(v);
    }
    return *this;
  }
  operator mok_status() const { return fail(status, text); }

private:
  mok_status status;
  std::string text;
};

/// Clears the last error (successful calls do).
mok_status ok();

} // namespace mok::runtime

#endif // MOK_RUNTIME_ERROR_H
