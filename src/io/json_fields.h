// JsonFields: typed, validated access to the fields of one JSON object, for config parsers.
// Every error names the source (file) and the field, with the expected and the found value.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::io {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string source) : obj_(object), source_(std::move(source)) {}

  bool has(const std::string& key) const;  // present and not null
  Result<int64_t> get_int(const std::string& key) const;
  Result<int64_t> get_int(const std::string& key, int64_t fallback) const;
  Result<double> get_double(const std::string& key) const;
  Result<double> get_double(const std::string& key, double fallback) const;
  Result<bool> get_bool(const std::string& key, bool fallback) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<std::string> get_string(const std::string& key, const std::string& fallback) const;
  // An integer or a list of integers (e.g. eos_token_id); empty when absent.
  Result<std::vector<int64_t>> get_int_or_list(const std::string& key) const;
  Result<std::vector<std::string>> get_string_list(const std::string& key) const;
  std::optional<JsonFields> object(const std::string& key) const;

  Status error(const std::string& key, const std::string& expected) const;  // "file: field 'k': expected X, found V"
  const std::string& source() const { return source_; }
  const nlohmann::json& json() const { return obj_; }

 private:
  const nlohmann::json& obj_;
  std::string source_;
};

}  // namespace mxserve::io
