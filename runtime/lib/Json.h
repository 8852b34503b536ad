// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// A small JSON reader for the compiler's kernel metadata (the runtime links
// nothing but libc++ and, at run time, the CUDA driver).
//
#ifndef MOK_RUNTIME_JSON_H
#define MOK_RUNTIME_JSON_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mok::runtime::json {

struct Value {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  /// An integer that a double holds exactly: |number| <= 2^53 (larger ones
  /// are not told apart from their neighbours, and converting one past
  /// int64's range would be undefined).
  bool isInteger() const {
    return kind == Number && number >= -kMaxExact && number <= kMaxExact &&
           number == static_cast<double>(static_cast<int64_t>(number));
  }
  static constexpr double kMaxExact = 9007199254740992.0; // 2^53
  /// The member `key` of an object, or null.
  const Value *get(const std::string &key) const {
    auto it = object.find(key);
    return kind == Object && it != object.end() ? &it->second : nullptr;
  }
};

/// Parses `text`; on failure returns false with "offset N: what" in `error`.
bool parse(const std::string &text, Value &out, std::string &error);

} // namespace mok::runtime::json

#endif // MOK_RUNTIME_JSON_H
