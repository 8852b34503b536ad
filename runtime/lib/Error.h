// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_RUNTIME_ERROR_H
#define MOK_RUNTIME_ERROR_H

#include "mok/Runtime/mok_runtime.h"

#include <sstream>
#include <string>

namespace mok::runtime {

/// Records `message` as this thread's last error and returns `status`.
mok_status fail(mok_status status, const std::string &message);

/// Builds a message with operator<< and records it:
///   return Fail(MOK_ERROR_INVALID_ARGUMENT) << "x: expected ...";
class Fail {
public:
  explicit Fail(mok_status status) : status(status) {}
  template <typename T> Fail &operator<<(const T &v) {
    os << v;
    return *this;
  }
  operator mok_status() const { return fail(status, os.str()); }

private:
  mok_status status;
  std::ostringstream os;
};

/// Clears the last error (successful calls do).
mok_status ok();

} // namespace mok::runtime

#endif // MOK_RUNTIME_ERROR_H
