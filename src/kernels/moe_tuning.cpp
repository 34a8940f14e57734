#include "kernels/moe_tuning.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/logging.h"
#include "io/json_fields.h"

namespace mxserve::kernels {

// ---- key ----
std::string MoeTuningKey::shape_label() const {
  return "E" + std::to_string(experts) + "_H" + std::to_string(hidden) + "_I" + std::to_string(inter) + "_K" +
         std::to_string(top_k) + "_" + dtype;
}

std::string MoeTuningKey::describe() const { return "'" + gpu + "' " + shape_label(); }

std::string MoeTuningKey::file_name() const {
  std::string slug;
  for (char c : gpu) {
    if (std::isalnum(static_cast<unsigned char>(c))) slug += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!slug.empty() && slug.back() != '_') slug += '_';
  }
  while (!slug.empty() && slug.back() == '_') slug.pop_back();
  if (slug.empty()) slug = "gpu";
  return slug + "_" + shape_label() + ".json";
}

std::string MoeTuningKey::tune_command() const {
  return "mxserve tune-moe --experts " + std::to_string(experts) + " --hidden " + std::to_string(hidden) +
         " --inter " + std::to_string(inter) + " --top-k " + std::to_string(top_k) + " --dtype " + dtype +
         " --out configs/moe/" + file_name();
}

bool MoeTuningKey::operator<(const MoeTuningKey& o) const {
  return std::tie(gpu, experts, hidden, inter, top_k, dtype) <
         std::tie(o.gpu, o.experts, o.hidden, o.inter, o.top_k, o.dtype);
}

// ---- reader ----
namespace {

Result<int64_t> positive_int(const io::JsonFields& f, const std::string& key) {
  MX_ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
  if (v <= 0) return f.error(key, "a positive integer");
  return v;
}

Result<std::string> nonempty_string(const io::JsonFields& f, const std::string& key) {
  MX_ASSIGN_OR_RETURN(std::string v, f.get_string(key));
  if (v.empty()) return f.error(key, "a non-empty string");
  return v;
}

}  // namespace

Result<MoeTuningTable> parse_moe_tuning_table(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object, found " + j.dump().substr(0, 80));
  const io::JsonFields f(j, source);
  MoeTuningTable t;
  t.source = source;
  MX_ASSIGN_OR_RETURN(std::string format, f.get_string("format"));
  if (format != kMoeTuningFormat) return f.error("format", std::string("\"") + kMoeTuningFormat + "\"");
  MX_ASSIGN_OR_RETURN(t.key.gpu, nonempty_string(f, "gpu"));
  MX_ASSIGN_OR_RETURN(t.key.experts, positive_int(f, "experts"));
  MX_ASSIGN_OR_RETURN(t.key.hidden, positive_int(f, "hidden"));
  MX_ASSIGN_OR_RETURN(t.key.inter, positive_int(f, "inter"));
  MX_ASSIGN_OR_RETURN(t.key.top_k, positive_int(f, "top_k"));
  if (t.key.top_k > t.key.experts) return f.error("top_k", "at most experts (" + std::to_string(t.key.experts) + ")");
  MX_ASSIGN_OR_RETURN(t.key.dtype, f.get_string("dtype"));
  if (t.key.dtype != "mxfp4") return f.error("dtype", "\"mxfp4\" (the only tuned expert format)");
  MX_ASSIGN_OR_RETURN(t.command, f.get_string("command", ""));
  if (!f.has("entries") || !j.at("entries").is_array()) return f.error("entries", "a list of objects");
  std::set<int64_t> seen;
  const auto& entries = j.at("entries");
  if (entries.size() > static_cast<size_t>(kMoeMaxBuckets))
    return invalid_argument(source + ": field 'entries': expected at most " + std::to_string(kMoeMaxBuckets) +
                            " buckets, found " + std::to_string(entries.size()));
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string where = source + ": entries[" + std::to_string(i) + "]";
    if (!entries[i].is_object()) return invalid_argument(where + ": expected an object, found " + entries[i].dump());
    const io::JsonFields e(entries[i], where);
    MoeTuningEntry en;
    MX_ASSIGN_OR_RETURN(en.m, positive_int(e, "m"));
    if (en.m > kMoeMaxBucketM) return e.error("m", "a token count at most " + std::to_string(kMoeMaxBucketM));
    MX_ASSIGN_OR_RETURN(en.gate_up, nonempty_string(e, "gate_up"));
    MX_ASSIGN_OR_RETURN(en.down, nonempty_string(e, "down"));
    MX_ASSIGN_OR_RETURN(en.us, e.get_double("us"));
    if (!(en.us >= 0) || !std::isfinite(en.us)) return e.error("us", "a finite number >= 0");
    if (!seen.insert(en.m).second) return e.error("m", "a bucket not listed before (duplicate)");
    t.entries.push_back(std::move(en));
  }
  std::sort(t.entries.begin(), t.entries.end(), [](const auto& a, const auto& b) { return a.m < b.m; });
  return t;
}

Result<MoeTuningTable> read_moe_tuning_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the MoE tuning table");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_moe_tuning_table(ss.str(), path);
}

// ---- bucket rule ----
MoeRegime moe_regime(int64_t m) {
  if (m <= kMoeDecodeMaxM) return MoeRegime::kDecode;
  if (m >= kMoePrefillMinM) return MoeRegime::kPrefill;
  return MoeRegime::kBetween;
}

const char* moe_regime_name(MoeRegime r) {
  switch (r) {
    case MoeRegime::kDecode: return "decode";
    case MoeRegime::kBetween: return "between";
    case MoeRegime::kPrefill: return "prefill";
  }
  return "?";
}

int select_moe_bucket(const MoeTuningTable& t, int64_t m) {
  if (m <= 0) return -1;
  const MoeRegime r = moe_regime(m);
  // Log distance |ln b - ln m| compared exactly: the ratio max(b, m) / min(b, m) as a fraction.
  int best = -1;
  __int128 best_num = 0, best_den = 1;
  for (size_t i = 0; i < t.entries.size(); ++i) {  // sorted by m: a tie keeps the smaller bucket
    const int64_t b = t.entries[i].m;
    if (moe_regime(b) != r) continue;
    const __int128 num = std::max(b, m), den = std::min(b, m);
    if (best < 0 || num * best_den < best_num * den) {
      best = static_cast<int>(i);
      best_num = num;
      best_den = den;
    }
  }
  return best;
}

// ---- sets ----
Status MoeTuningSet::add_tables(std::vector<MoeTuningTable> tables) {
  std::map<MoeTuningKey, std::string> batch;
  for (const auto& t : tables) {
    auto [it, fresh] = batch.emplace(t.key, t.source);
    if (!fresh)
      return invalid_argument("two MoE tuning tables for " + t.key.describe() + ": " + it->second + " and " + t.source);
  }
  for (auto& t : tables) {
    auto it = tables_.find(t.key);
    if (it != tables_.end()) {
      MX_LOG(kInfo) << "MoE tuning: " << t.source << " overrides " << it->second.source << " for " << t.key.describe();
    }
    tables_[t.key] = std::move(t);
  }
  return Status::ok();
}

Status MoeTuningSet::add_embedded(const std::vector<EmbeddedMoeTable>& files) {
  std::vector<MoeTuningTable> tables;
  for (const auto& f : files) {
    MX_ASSIGN_OR_RETURN(MoeTuningTable t,
                        parse_moe_tuning_table(std::string(f.text, f.size), std::string("embedded:") + f.name));
    tables.push_back(std::move(t));
  }
  return add_tables(std::move(tables));
}

Status MoeTuningSet::add_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("--moe-tuning-dir " + dir + ": not a directory");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  if (ec) return not_found("--moe-tuning-dir " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    MX_LOG(kWarn) << "--moe-tuning-dir " << dir << ": no *.json tables in it";
  }
  std::vector<MoeTuningTable> tables;
  for (const auto& p : files) {
    MX_ASSIGN_OR_RETURN(MoeTuningTable t, read_moe_tuning_file(p));
    tables.push_back(std::move(t));
  }
  return add_tables(std::move(tables));
}

const MoeTuningTable* MoeTuningSet::find(const MoeTuningKey& key) const {
  auto it = tables_.find(key);
  return it == tables_.end() ? nullptr : &it->second;
}

std::vector<const MoeTuningTable*> MoeTuningSet::all() const {
  std::vector<const MoeTuningTable*> out;
  for (const auto& [k, t] : tables_) out.push_back(&t);
  return out;
}

std::mutex& global_moe_tuning_mutex() {
  static std::mutex m;
  return m;
}

MoeTuningSet& global_moe_tuning() {
  static MoeTuningSet* set = [] {
    auto* s = new MoeTuningSet();
    const Status st = s->add_embedded(embedded_moe_tables());
    MX_CHECK_MSG(st.is_ok(), "embedded MoE tuning tables (configs/moe): " << st.to_string());
    return s;
  }();
  return *set;
}

Status add_global_moe_tuning_dir(const std::string& dir) {
  MoeTuningSet& set = global_moe_tuning();
  std::lock_guard<std::mutex> lock(global_moe_tuning_mutex());
  return set.add_dir(dir);
}

// What a catalog's index returns for a retired variant name (moe_tuning.h; kMoeMxfp4RetiredVariant).
constexpr int kMoeVariantRetired = -2;

Status validate_moe_tuning(const MoeTuningSet& set, const std::function<int(int, const std::string&)>& index) {
  for (const MoeTuningTable* t : set.all()) {
    for (size_t i = 0; i < t->entries.size(); ++i) {
      const auto& e = t->entries[i];
      const std::pair<int, const std::string*> names[] = {{0, &e.gate_up}, {1, &e.down}};
      for (const auto& [gemm, name] : names) {
        const int id = index(gemm, *name);
        if (id == kMoeVariantRetired)
          return invalid_argument(t->source + ": entries[" + std::to_string(i) + "] (m " + std::to_string(e.m) +
                                  "): " + (gemm == 0 ? "gate_up" : "down") + " kernel variant '" + *name +
                                  "' was retired (no tuned table or rule picked it; docs/cuda.md); re-tune: " +
                                  t->key.tune_command());
        if (id < 0)
          return invalid_argument(t->source + ": entries[" + std::to_string(i) + "] (m " + std::to_string(e.m) +
                                  "): unknown " + (gemm == 0 ? "gate_up" : "down") + " kernel variant '" + *name +
                                  "' (not compiled into this binary; re-run: " + t->key.tune_command() + ")");
      }
    }
  }
  return Status::ok();
}

}  // namespace mxserve::kernels
