#include "io/json_fields.h"

#include <cmath>

namespace mxserve::io {

bool JsonFields::has(const std::string& key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

Status JsonFields::error(const std::string& key, const std::string& expected) const {
  auto it = obj_.find(key);
  const std::string found = it == obj_.end() ? "nothing (field missing)" : it->dump();
  return invalid_argument(source_ + ": field '" + key + "': expected " + expected + ", found " + found);
}

Result<int64_t> JsonFields::get_int(const std::string& key) const {
  if (!has(key)) return error(key, "an integer");
  const auto& v = obj_.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  return error(key, "an integer");
}

Result<int64_t> JsonFields::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : Result<int64_t>(fallback);
}

Result<double> JsonFields::get_double(const std::string& key) const {
  if (!has(key) || !obj_.at(key).is_number()) return error(key, "a number");
  return obj_.at(key).get<double>();
}

Result<double> JsonFields::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : Result<double>(fallback);
}

Result<bool> JsonFields::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!obj_.at(key).is_boolean()) return error(key, "true or false");
  return obj_.at(key).get<bool>();
}

Result<std::string> JsonFields::get_string(const std::string& key) const {
  if (!has(key) || !obj_.at(key).is_string()) return error(key, "a string");
  return obj_.at(key).get<std::string>();
}

Result<std::string> JsonFields::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : Result<std::string>(fallback);
}

Result<std::vector<int64_t>> JsonFields::get_int_or_list(const std::string& key) const {
  std::vector<int64_t> out;
  if (!has(key)) return out;
  const auto& v = obj_.at(key);
  if (v.is_number_integer()) {
    out.push_back(v.get<int64_t>());
    return out;
  }
  if (!v.is_array()) return error(key, "an integer or a list of integers");
  for (const auto& x : v) {
    if (!x.is_number_integer()) return error(key, "an integer or a list of integers");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

Result<std::vector<std::string>> JsonFields::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key) || !obj_.at(key).is_array()) return error(key, "a list of strings");
  for (const auto& x : obj_.at(key)) {
    if (!x.is_string()) return error(key, "a list of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

std::optional<JsonFields> JsonFields::object(const std::string& key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || !it->is_object()) return std::nullopt;
  return JsonFields(*it, source_ + ": " + key);
}

}  // namespace mxserve::io
