#include "cli/runs.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace mxserve::cli {
namespace {

bool parse_whole_int(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = x;
  return true;
}

bool parse_whole_double(const std::string& v, double* out) {
  if (v.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(x)) return false;
  *out = x;
  return true;
}

}  // namespace

Result<std::vector<GenerateRun>> parse_runs(const std::string& text, const runtime::SpecConfig& base) {
  std::vector<GenerateRun> runs;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ';')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    GenerateRun r;
    r.spec = base;
    r.spec.simulate_acceptance.reset();
    std::stringstream fields(item);
    std::string f;
    while (std::getline(fields, f, ',')) {
      f.erase(0, f.find_first_not_of(" "));
      f.erase(f.find_last_not_of(" ") + 1);
      const auto eq = f.find('=');
      if (eq == std::string::npos) return invalid_argument("--runs: field '" + f + "' is not key=value");
      const std::string k = f.substr(0, eq), v = f.substr(eq + 1);
      // Strict numbers: the whole value must parse ("b=3x" and "n=1e99" are errors, never 3 or a wrap).
      int64_t iv = 0;
      double dv = 0;
      const bool is_int = parse_whole_int(v, &iv), is_num = parse_whole_double(v, &dv);
      if (k == "a") {
        if (!is_num) return invalid_argument("--runs: '" + f + "': not a number");
        r.spec.simulate_acceptance = dv;
        continue;
      }
      if (k != "b" && k != "n" && k != "adaptive" && k != "p" && k != "k" && k != "m")
        return invalid_argument("--runs: unknown key '" + k + "' (b, n, a, adaptive, p, k, m)");
      if (!is_int) return invalid_argument("--runs: '" + f + "': not an integer");
      if (k == "adaptive" && iv != 0 && iv != 1) return invalid_argument("--runs: '" + f + "': adaptive is 0 or 1");
      if (k == "b") r.batch = iv;
      else if (k == "n") r.spec.num_steps = static_cast<int32_t>(std::clamp<int64_t>(iv, -1, 1 << 20));
      else if (k == "adaptive") r.spec.adaptive = iv == 1;
      else if (k == "p") r.prompt_len = iv;
      else if (k == "k") r.spec.topk = static_cast<int32_t>(std::clamp<int64_t>(iv, -1, 1 << 20));
      else r.spec.num_draft_tokens = static_cast<int32_t>(std::clamp<int64_t>(iv, -1, 1 << 20));
    }
    if (r.batch < 1 || r.spec.num_steps < 0 || r.spec.num_steps > 16 || r.prompt_len < 0)
      return invalid_argument("--runs: '" + item + "': need b >= 1, n in [0, 16], p >= 0");
    if (r.spec.topk < 1 || r.spec.topk > 16) return invalid_argument("--runs: '" + item + "': k must be in [1, 16]");
    if (r.spec.tree()) {  // tree mode: m defaults to 1 + min(n * k, capacity), as the flag does
      const int32_t cap = r.spec.tree_capacity(r.spec.num_steps);
      if (r.spec.num_draft_tokens <= 0) r.spec.num_draft_tokens = std::min(cap, r.spec.num_steps * r.spec.topk) + 1;
      if (r.spec.num_steps > 0 &&
          (r.spec.num_draft_tokens < 2 || r.spec.num_draft_tokens - 1 > runtime::SpecConfig::kMaxTreeNodes ||
           r.spec.num_draft_tokens - 1 > cap || (r.spec.num_steps - 1) * r.spec.topk > runtime::SpecConfig::kMaxTreeNodes))
        return invalid_argument("--runs: '" + item + "': tree needs 2 <= m <= min(65, 1 + k + (n-1)k^2), (n-1)k <= 64");
    } else {
      r.spec.num_draft_tokens = 0;
    }
    if (r.spec.simulate_acceptance && !(*r.spec.simulate_acceptance >= 1.0 && *r.spec.simulate_acceptance <= r.spec.num_steps + 1.0))
      return invalid_argument("--runs: '" + item + "': a must be in [1, n + 1]");
    runs.push_back(r);
  }
  if (runs.empty()) return invalid_argument("--runs: no runs");
  return runs;
}

}  // namespace mxserve::cli
