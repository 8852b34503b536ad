// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Json.h"

#include <cstdlib>

namespace mok::runtime::json {

namespace {
class Parser {
public:
  explicit Parser(const std::string &t) : t(t) {}

  bool document(Value &v) {
    if (!value(v, 0))
      return false;
    skip();
    if (i != t.size())
      return fail("trailing characters after the document");
    return true;
  }
  std::string error;

private:
  const std::string &t;
  size_t i = 0;

  bool fail(const std::string &what) {
    error = "offset " + std::to_string(i) + ": " + what;
    return false;
  }
  void skip() {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r'))
      ++i;
  }
  bool literal(const char *word) {
    size_t n = std::char_traits<char>::length(word);
    if (t.compare(i, n, word) != 0)
      return false;
    i += n;
    return true;
  }
  bool value(Value &v, int depth) {
    if (depth > 64)
      return fail("nesting deeper than 64");
    skip();
    if (i >= t.size())
      return fail("unexpected end of input");
    char c = t[i];
    if (c == '{')
      return object(v, depth);
    if (c == '[')
      return array(v, depth);
    if (c == '"') {
      v.kind = Value::String;
      return string(v.string);
    }
    if (literal("true")) {
      v.kind = Value::Bool;
      v.boolean = true;
      return true;
    }
    if (literal("false")) {
      v.kind = Value::Bool;
      return true;
    }
    if (literal("null")) {
      v.kind = Value::Null;
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
      return number(v);
    return fail(std::string("unexpected character '") + c + "'");
  }
  bool number(Value &v) {
    const char *begin = t.c_str() + i;
    char *end = nullptr;
    v.number = std::strtod(begin, &end);
    if (end == begin)
      return fail("malformed number");
    v.kind = Value::Number;
    i += end - begin;
    return true;
  }
  bool string(std::string &s) {
    ++i; // opening quote
    while (i < t.size() && t[i] != '"') {
      char c = t[i++];
      if (c != '\\') {
        s += c;
        continue;
      }
      if (i >= t.size())
        break;
      char e = t[i++];
      switch (e) {
      case '"': case '\\': case '/': s += e; break;
      case 'n': s += '\n'; break;
      case 't': s += '\t'; break;
      case 'r': s += '\r'; break;
      case 'b': s += '\b'; break;
      case 'f': s += '\f'; break;
      case 'u': {
        if (i + 4 > t.size())
          return fail("truncated \\u escape");
        unsigned code = std::strtoul(t.substr(i, 4).c_str(), nullptr, 16);
        i += 4;
        if (code < 0x80) {
          s += static_cast<char>(code);
        } else if (code < 0x800) {
          s += static_cast<char>(0xC0 | (code >> 6));
          s += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          s += static_cast<char>(0xE0 | (code >> 12));
          s += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (code & 0x3F));
        }
        break;
      }
      default:
        return fail(std::string("unknown escape \\") + e);
      }
    }
    if (i >= t.size())
      return fail("unterminated string");
    ++i; // closing quote
    return true;
  }
  bool array(Value &v, int depth) {
    v.kind = Value::Array;
    ++i;
    skip();
    if (i < t.size() && t[i] == ']') {
      ++i;
      return true;
    }
    while (true) {
      v.array.emplace_back();
      if (!value(v.array.back(), depth + 1))
        return false;
      skip();
      if (i < t.size() && t[i] == ',') {
        ++i;
        continue;
      }
      if (i < t.size() && t[i] == ']') {
        ++i;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  bool object(Value &v, int depth) {
    v.kind = Value::Object;
    ++i;
    skip();
    if (i < t.size() && t[i] == '}') {
      ++i;
      return true;
    }
    while (true) {
      skip();
      if (i >= t.size() || t[i] != '"')
        return fail("expected a member name");
      std::string key;
      if (!string(key))
        return false;
      skip();
      if (i >= t.size() || t[i] != ':')
        return fail("expected ':'");
      ++i;
      if (!value(v.object[key], depth + 1))
        return false;
      skip();
      if (i < t.size() && t[i] == ',') {
        ++i;
        continue;
      }
      if (i < t.size() && t[i] == '}') {
        ++i;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }
};
} // namespace

bool parse(const std::string &text, Value &out, std::string &error) {
  Parser p(text);
  out = Value();
  if (p.document(out))
    return true;
  error = p.error;
  return false;
}

} // namespace mok::runtime::json
