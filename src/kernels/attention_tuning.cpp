#include "kernels/attention_tuning.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json_fields.h"

namespace mxserve::kernels {

std::string attention_tuning_file_name(const AttentionTuningKey& key) {
  std::string slug;
  for (char c : key.gpu) {
    if (std::isalnum(static_cast<unsigned char>(c))) slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!slug.empty() && slug.back() != '_') slug += '_';
  }
  while (!slug.empty() && slug.back() == '_') slug.pop_back();
  if (slug.empty()) slug = "gpu";
  return slug + "_" + key.shape_label() + ".json";
}

std::string attention_tune_command(const AttentionTuningKey& key) {
  return "mxserve tune-attention --heads " + std::to_string(key.n_heads) + " --kv-heads " +
         std::to_string(key.n_kv_heads) + " --head-dim " + std::to_string(key.head_dim) + " --kv-cache-dtype " +
         key.kv_dtype + " --out configs/attention/" + attention_tuning_file_name(key);
}

std::string describe(const AttentionTuningKey& key) { return "'" + key.gpu + "' " + key.shape_label(); }

namespace {

Result<std::vector<int64_t>> ascending_axis(const nlohmann::json& j, const io::JsonFields& f, const std::string& key) {
  if (!f.has(key) || !j.at(key).is_array() || j.at(key).empty())
    return f.error(key, "a non-empty ascending list of positive integers");
  std::vector<int64_t> axis;
  for (const auto& v : j.at(key)) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || (!axis.empty() && v.get<int64_t>() <= axis.back()))
      return f.error(key, "a non-empty ascending list of positive integers (at " + v.dump() + ")");
    axis.push_back(v.get<int64_t>());
  }
  return axis;
}

// A [rows][contexts] matrix of numbers; `check` validates one cell (returns an empty string when fine).
template <typename T, typename Check>
Status read_grid(const nlohmann::json& j, const std::string& source, const std::string& key, size_t n_rows,
                 size_t n_ctx, std::vector<T>* out, Check check) {
  const std::string what = source + ": field '" + key + "'";
  if (!j.contains(key) || !j.at(key).is_array() || j.at(key).size() != n_rows)
    return invalid_argument(what + ": expected " + std::to_string(n_rows) + " lists (one per rows bucket)");
  for (size_t r = 0; r < n_rows; ++r) {
    const auto& row = j.at(key)[r];
    if (!row.is_array() || row.size() != n_ctx)
      return invalid_argument(what + "[" + std::to_string(r) + "]: expected " + std::to_string(n_ctx) +
                              " numbers (one per context bucket), found " + row.dump().substr(0, 80));
    for (size_t c = 0; c < n_ctx; ++c) {
      const std::string bad = row[c].is_number() ? check(row[c]) : std::string("a number");
      if (!bad.empty())
        return invalid_argument(what + "[" + std::to_string(r) + "][" + std::to_string(c) + "]: expected " + bad +
                                ", found " + row[c].dump());
      out->push_back(row[c].get<T>());
    }
  }
  return Status::ok();
}

}  // namespace

Result<AttentionSplitTable> parse_attention_tuning_table(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object");
  const io::JsonFields f(j, source);
  AttentionSplitTable t;
  t.source = source;
  MX_ASSIGN_OR_RETURN(std::string format, f.get_string("format"));
  if (format != kAttentionTuningFormat) return f.error("format", std::string("\"") + kAttentionTuningFormat + "\"");
  MX_ASSIGN_OR_RETURN(t.key.gpu, f.get_string("gpu"));
  if (t.key.gpu.empty()) return f.error("gpu", "a non-empty device name");
  MX_ASSIGN_OR_RETURN(t.key.kv_dtype, f.get_string("kv_cache_dtype"));
  if (t.key.kv_dtype != "bf16" && t.key.kv_dtype != "fp8_e4m3") return f.error("kv_cache_dtype", "\"bf16\" or \"fp8_e4m3\"");
  for (auto [key, dst] : {std::pair<const char*, int32_t*>{"n_heads", &t.key.n_heads},
                          {"n_kv_heads", &t.key.n_kv_heads}, {"head_dim", &t.key.head_dim}}) {
    MX_ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
    if (v <= 0 || v > 4096) return f.error(key, "a positive integer <= 4096");
    *dst = static_cast<int32_t>(v);
  }
  if (t.key.n_heads % t.key.n_kv_heads != 0) return f.error("n_heads", "a multiple of n_kv_heads");
  MX_ASSIGN_OR_RETURN(std::string status, f.get_string("status"));
  if (status != "tuned" && status != "untuned") return f.error("status", "\"tuned\" or \"untuned\"");
  t.tuned = status == "tuned";
  MX_ASSIGN_OR_RETURN(t.command, f.get_string("command", ""));
  MX_ASSIGN_OR_RETURN(t.rows, ascending_axis(j, f, "rows"));
  MX_ASSIGN_OR_RETURN(t.contexts, ascending_axis(j, f, "contexts"));
  MX_RETURN_IF_ERROR(read_grid<int32_t>(j, source, "n_splits", t.rows.size(), t.contexts.size(), &t.n_splits,
                                        [](const nlohmann::json& v) {
                                          return v.is_number_integer() && v.get<int64_t>() >= 1 &&
                                                         v.get<int64_t>() <= kAttentionMaxSplits
                                                     ? std::string()
                                                     : "an integer in [1, " + std::to_string(kAttentionMaxSplits) + "]";
                                        }));
  MX_RETURN_IF_ERROR(read_grid<double>(j, source, "us", t.rows.size(), t.contexts.size(), &t.us,
                                       [](const nlohmann::json& v) {
                                         const double x = v.get<double>();
                                         return std::isfinite(x) && x >= 0 ? std::string() : std::string("a time >= 0");
                                       }));
  return t;
}

Result<AttentionSplitTable> read_attention_tuning_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the attention tuning table");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_attention_tuning_table(ss.str(), path);
}

std::string attention_tuning_json(const AttentionSplitTable& t) {
  nlohmann::ordered_json j;
  j["format"] = kAttentionTuningFormat;
  j["gpu"] = t.key.gpu;
  j["kv_cache_dtype"] = t.key.kv_dtype;
  j["n_heads"] = t.key.n_heads;
  j["n_kv_heads"] = t.key.n_kv_heads;
  j["head_dim"] = t.key.head_dim;
  j["status"] = t.tuned ? "tuned" : "untuned";
  j["command"] = t.command;
  j["rows"] = t.rows;
  j["contexts"] = t.contexts;
  nlohmann::ordered_json splits = nlohmann::ordered_json::array(), us = nlohmann::ordered_json::array();
  const size_t nc = t.contexts.size();
  for (size_t r = 0; r < t.rows.size(); ++r) {
    splits.push_back(std::vector<int32_t>(t.n_splits.begin() + r * nc, t.n_splits.begin() + (r + 1) * nc));
    std::vector<double> row;
    for (size_t c = 0; c < nc; ++c) row.push_back(std::round(t.us[r * nc + c] * 10) / 10);
    us.push_back(row);
  }
  j["n_splits"] = splits;
  j["us"] = us;
  return j.dump(1) + "\n";
}

Result<std::vector<AttentionSplitTable>> parse_embedded_attention_tables(const std::vector<EmbeddedAttentionTable>& files) {
  std::vector<AttentionSplitTable> tables;
  for (const auto& f : files) {
    MX_ASSIGN_OR_RETURN(AttentionSplitTable t, parse_attention_tuning_table(std::string(f.text, f.size),
                                                                             std::string("embedded:") + f.name));
    for (const auto& o : tables)
      if (o.key == t.key)
        return invalid_argument("two attention tuning tables for " + describe(t.key) + ": " + o.source + " and " +
                                t.source);
    tables.push_back(std::move(t));
  }
  return tables;
}

const AttentionSplitTable* find_attention_split_table(const AttentionTuningKey& key) {
  static const std::vector<AttentionSplitTable>* tables = [] {
    auto parsed = parse_embedded_attention_tables(embedded_attention_tables());
    MX_CHECK_MSG(parsed.is_ok(), "embedded attention tuning tables (configs/attention): " << parsed.status().to_string());
    return new std::vector<AttentionSplitTable>(std::move(parsed).value());
  }();
  for (const auto& t : *tables)
    if (t.key == key) return &t;
  return nullptr;
}

}  // namespace mxserve::kernels
