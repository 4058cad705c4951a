// Checked reads from a JSON object read from a file (a checkpoint's state.json): every number
// is narrowed through cabm/core/checked.h, so that 4.3e39, 1.5, -1 or "7" where a count belongs
// is one error naming the file and the key path, never an undefined float → int conversion or
// the JSON library's raw message.
//   {where}: '{path}': '4.3e+39' is not an integer in [1, 1099511627776]
//   {where}: '{path}': missing
#pragma once

#include "cabm/core/checked.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace cabm {

class JsonReader {
 public:
  // `object` must outlive the reader. `where` names the file; `prefix` the path to `object`
  // inside it ("config." for the "config" member), for messages.
  JsonReader(const nlohmann::json& object, std::string where, std::string prefix = "");

  bool has(const std::string& key) const;
  const nlohmann::json& at(const std::string& key) const;  // throws "... is missing"

  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  uint64_t unsigned_integer(const std::string& key) const;  // 0 .. 2^64 − 1
  double real(const std::string& key, const RealRange& range = {}) const;
  bool boolean(const std::string& key) const;
  std::string string(const std::string& key) const;
  JsonReader object(const std::string& key) const;  // a nested object, its keys prefixed "key."

  // "{where}: '{prefix}{key}'": the start of a message about that key.
  std::string name(const std::string& key) const;
  const std::string& where() const { return where_; }

 private:
  [[noreturn]] void wrong_type(const std::string& key, const char* expected) const;

  const nlohmann::json& object_;
  std::string where_, prefix_;
};

// A parse error of nlohmann::json as one line without the library's "[json.exception...]"
// prefix: "syntax error while parsing value - invalid literal; last read: 'x' (line 3,
// column 5)".
std::string json_error_text(const nlohmann::json::exception& e);

}  // namespace cabm
