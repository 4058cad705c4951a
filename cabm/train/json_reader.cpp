#include "cabm/train/json_reader.h"

#include "cabm/core/error.h"

namespace cabm {

JsonReader::JsonReader(const nlohmann::json& object, std::string where, std::string prefix)
    : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {
  if (!object_.is_object())
    throw Error(fmt::format("{}: '{}': {} is not a JSON object", where_,
                            prefix_.empty() ? "the document" : prefix_.substr(0, prefix_.size() - 1),
                            object_.type_name()));
}

std::string JsonReader::name(const std::string& key) const {
  return fmt::format("{}: '{}{}'", where_, prefix_, key);
}

bool JsonReader::has(const std::string& key) const {
  return object_.contains(key);
}

const nlohmann::json& JsonReader::at(const std::string& key) const {
  const auto it = object_.find(key);
  if (it == object_.end()) throw Error(name(key) + ": missing");
  return *it;
}

void JsonReader::wrong_type(const std::string& key, const char* expected) const {
  throw Error(
      fmt::format("{}: {} {} is not {}", name(key), at(key).type_name(), at(key).dump().substr(0, 40), expected));
}

int64_t JsonReader::integer(const std::string& key, int64_t min, int64_t max) const {
  const nlohmann::json& v = at(key);
  if (v.is_number_unsigned()) return checked_integer(v.get<uint64_t>(), min, max, name(key));
  if (v.is_number_integer()) return checked_integer(v.get<int64_t>(), min, max, name(key));
  throw_not_integer(v.dump(), min, max, name(key));  // 4.3e+39, 1.5, "7", null, ...
}

uint64_t JsonReader::unsigned_integer(const std::string& key) const {
  const nlohmann::json& v = at(key);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  throw_not_unsigned(v.dump(), std::numeric_limits<uint64_t>::max(), name(key));
}

double JsonReader::real(const std::string& key, const RealRange& range) const {
  const nlohmann::json& v = at(key);
  if (!v.is_number()) wrong_type(key, "a number");
  return checked_real(v.get<double>(), range, name(key));
}

bool JsonReader::boolean(const std::string& key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_boolean()) wrong_type(key, "true or false");
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_string()) wrong_type(key, "a string");
  return v.get<std::string>();
}

JsonReader JsonReader::object(const std::string& key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_object()) wrong_type(key, "an object");
  return JsonReader(v, where_, prefix_ + key + ".");
}

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string text = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t close = text.find("] ");
    if (close != std::string::npos) text = text.substr(close + 2);
  }
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace cabm
