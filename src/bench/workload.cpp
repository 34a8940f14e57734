// Workload generators (see workload.h for the shared-prefix formula).
#include "bench/workload.h"

#include <cmath>
#include <fstream>

#include "tokenizer/utf8.h"

namespace mxserve::bench {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(a) ^ b) ^ c); }

// Uniform integer in [lo, hi].
int64_t uniform_int(uint64_t h, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + static_cast<int64_t>(h % static_cast<uint64_t>(hi - lo + 1));
}

class RandomWorkload : public Workload {
 public:
  RandomWorkload(WorkloadConfig c, const TokenCodec& codec, const TokenCorpus& corpus)
      : c_(std::move(c)), codec_(codec), corpus_(corpus) {}
  Result<Prompt> prompt(uint64_t stream, uint64_t i) const override {
    const double r = c_.range_ratio;
    const int64_t in = std::max<int64_t>(1, uniform_int(hash3(c_.seed, stream, 2 * i),
        static_cast<int64_t>(std::floor(c_.input_len * (1 - r))), static_cast<int64_t>(std::ceil(c_.input_len * (1 + r)))));
    const int64_t out = std::max<int64_t>(1, uniform_int(hash3(c_.seed, stream, 2 * i + 1),
        static_cast<int64_t>(std::floor(c_.output_len * (1 - r))), static_cast<int64_t>(std::ceil(c_.output_len * (1 + r)))));
    MX_ASSIGN_OR_RETURN(FittedText t, fit_prompt(codec_, corpus_, {}, hash3(c_.seed ^ 0x51, stream, i), in));
    Prompt p;
    p.text = std::move(t.text);
    p.input_tokens = t.tokens;
    p.output_len = out;
    return p;
  }
  int64_t default_warmup() const override { return 0; }
  nlohmann::json describe() const override {
    return {{"workload", "random"}, {"input_len", c_.input_len}, {"output_len", c_.output_len},
            {"range_ratio", c_.range_ratio}, {"range_semantics", "uniform in [floor(L(1-r)), ceil(L(1+r))] (vLLM)"}};
  }

 private:
  WorkloadConfig c_;
  const TokenCodec& codec_;
  const TokenCorpus& corpus_;
};

class SharedPrefixWorkload : public Workload {
 public:
  SharedPrefixWorkload(WorkloadConfig c, const TokenCodec& codec, const TokenCorpus& corpus)
      : c_(std::move(c)), codec_(codec), corpus_(corpus) {
    prefix_len_ = std::llround(c_.cache_hit_rate * static_cast<double>(c_.input_len));
    for (int g = 0; g < c_.num_groups; ++g)
      prefixes_.push_back(corpus_.slice(hash3(c_.seed ^ 0xabc, 0xffff, g), static_cast<size_t>(prefix_len_)));
  }
  Result<Prompt> prompt(uint64_t stream, uint64_t i) const override {
    const int g = i < static_cast<uint64_t>(c_.num_groups)
                      ? static_cast<int>(i)
                      : static_cast<int>(hash3(c_.seed ^ 0x77, stream, i) % static_cast<uint64_t>(c_.num_groups));
    MX_ASSIGN_OR_RETURN(FittedText t,
                        fit_prompt(codec_, corpus_, prefixes_[g], hash3(c_.seed ^ 0x99, stream, i), c_.input_len));
    Prompt p;
    p.text = std::move(t.text);
    p.input_tokens = t.tokens;
    p.output_len = c_.output_len;
    p.group = g;
    p.prefix_tokens = prefix_len_;
    return p;
  }
  int64_t default_warmup() const override { return c_.num_groups; }
  nlohmann::json describe() const override {
    return {{"workload", "shared-prefix"}, {"input_len", c_.input_len}, {"output_len", c_.output_len},
            {"target_cache_hit_rate", c_.cache_hit_rate}, {"num_groups", c_.num_groups},
            {"prefix_tokens", prefix_len_}, {"unique_suffix_tokens", c_.input_len - prefix_len_},
            {"expected_hit_rate_warm", static_cast<double>(prefix_len_) / static_cast<double>(c_.input_len)}};
  }

 private:
  WorkloadConfig c_;
  const TokenCodec& codec_;
  const TokenCorpus& corpus_;
  int64_t prefix_len_ = 0;
  std::vector<std::vector<int32_t>> prefixes_;
};

// Artificial Analysis method: a unique prompt per request (a nonce first, so no prefix can hit).
class SingleStreamWorkload : public Workload {
 public:
  SingleStreamWorkload(WorkloadConfig c, const TokenCodec& codec, const TokenCorpus& corpus)
      : c_(std::move(c)), codec_(codec), corpus_(corpus) {}
  Result<Prompt> prompt(uint64_t stream, uint64_t i) const override {
    char nonce[64];
    std::snprintf(nonce, sizeof nonce, "Session %016llx.", static_cast<unsigned long long>(hash3(c_.seed, stream, i)));
    MX_ASSIGN_OR_RETURN(std::vector<int32_t> prefix, codec_.encode(nonce));
    MX_ASSIGN_OR_RETURN(FittedText t, fit_prompt(codec_, corpus_, prefix, hash3(c_.seed ^ 0x33, stream, i), c_.input_len));
    Prompt p;
    p.text = std::move(t.text);
    p.input_tokens = t.tokens;
    p.output_len = c_.output_len;
    return p;
  }
  int64_t default_warmup() const override { return 1; }
  nlohmann::json describe() const override {
    return {{"workload", "single-stream"}, {"input_len", c_.input_len}, {"output_len", c_.output_len},
            {"method", "Artificial Analysis: one request at a time, unique prompt, output speed after first token"}};
  }

 private:
  WorkloadConfig c_;
  const TokenCodec& codec_;
  const TokenCorpus& corpus_;
};

class FileWorkload : public Workload {
 public:
  FileWorkload(WorkloadConfig c, std::vector<Prompt> rows) : c_(std::move(c)), rows_(std::move(rows)) {}
  Result<Prompt> prompt(uint64_t, uint64_t i) const override { return rows_[i % rows_.size()]; }
  int64_t default_warmup() const override { return 0; }
  nlohmann::json describe() const override {
    return {{"workload", "file"}, {"file", c_.file}, {"rows", rows_.size()}, {"default_output_len", c_.output_len}};
  }

 private:
  WorkloadConfig c_;
  std::vector<Prompt> rows_;
};

Result<std::vector<Prompt>> read_jsonl(const WorkloadConfig& c, const TokenCodec* codec) {
  std::ifstream in(c.file);
  if (!in) return not_found("--dataset " + c.file + ": cannot open file");
  std::vector<Prompt> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = c.file + ":" + std::to_string(line_no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return invalid_argument(where + ": not a JSON object");
    Prompt p;
    p.output_len = c.output_len;
    for (const char* key : {"output_len", "max_tokens", "output_tokens"}) {
      if (j.contains(key)) {
        if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
          return invalid_argument(where + ": '" + key + "' must be a positive integer");
        p.output_len = j[key].get<int64_t>();
      }
    }
    if (j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
      if (codec) {
        MX_ASSIGN_OR_RETURN(auto ids, codec->encode(p.text));
        p.input_tokens = static_cast<int64_t>(ids.size());
      }
    } else if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty()) {
      p.messages = j["messages"];
    } else {
      return invalid_argument(where + ": needs a string 'prompt' or a non-empty 'messages' array");
    }
    rows.push_back(std::move(p));
  }
  if (rows.empty()) return invalid_argument("--dataset " + c.file + ": no prompts in file");
  return rows;
}

}  // namespace

Result<WorkloadKind> parse_workload_kind(const std::string& name) {
  if (name == "random") return WorkloadKind::kRandom;
  if (name == "shared-prefix") return WorkloadKind::kSharedPrefix;
  if (name == "single-stream") return WorkloadKind::kSingleStream;
  if (name == "file") return WorkloadKind::kFile;
  if (name == "trace") return WorkloadKind::kTrace;
  return invalid_argument("--workload " + name + ": expected random, shared-prefix, single-stream, file or trace");
}

const char* workload_kind_name(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kRandom: return "random";
    case WorkloadKind::kSharedPrefix: return "shared-prefix";
    case WorkloadKind::kSingleStream: return "single-stream";
    case WorkloadKind::kFile: return "file";
    case WorkloadKind::kTrace: return "trace";
  }
  return "?";
}

Result<FittedText> fit_prompt(const TokenCodec& codec, const TokenCorpus& corpus, const std::vector<int32_t>& prefix,
                              uint64_t offset, int64_t target) {
  const int64_t plen = static_cast<int64_t>(prefix.size());
  int64_t m = std::max<int64_t>(0, target - plen);
  FittedText best;
  int64_t best_err = -1;
  for (int iter = 0; iter < 6; ++iter) {
    std::vector<int32_t> ids = prefix;
    std::vector<int32_t> body = corpus.slice(offset, static_cast<size_t>(m));
    ids.insert(ids.end(), body.begin(), body.end());
    // A corpus slice may start or end inside a multi-byte character (byte-level BPE tokens of 0x80..0xBF): the
    // request body is JSON, so such bytes become U+FFFD here (and are counted as the server will count them).
    std::string text = tokenizer::utf8_lossy(codec.decode(ids));
    MX_ASSIGN_OR_RETURN(auto re, codec.encode(text));
    const int64_t n = static_cast<int64_t>(re.size());
    const int64_t err = std::llabs(n - target);
    if (best_err < 0 || err < best_err) {
      best_err = err;
      best.text = std::move(text);
      best.tokens = n;
    }
    if (n == target) break;
    m = std::max<int64_t>(0, m + (target - n));
  }
  return best;
}

Result<std::unique_ptr<Workload>> make_workload(const WorkloadConfig& c, const TokenCodec* codec,
                                                const TokenCorpus* corpus) {
  if (c.kind == WorkloadKind::kFile) {
    MX_ASSIGN_OR_RETURN(auto rows, read_jsonl(c, codec));
    return std::unique_ptr<Workload>(std::make_unique<FileWorkload>(c, std::move(rows)));
  }
  if (c.kind == WorkloadKind::kTrace)
    return invalid_argument("--workload trace replays sessions (trace_workload.h), not per-request prompts");
  if (!codec || !corpus)
    return invalid_argument(std::string("--workload ") + workload_kind_name(c.kind) +
                            " builds prompts of exact token counts and needs --tokenizer");
  if (c.input_len < 1) return invalid_argument("--input-len " + std::to_string(c.input_len) + ": must be >= 1");
  if (c.output_len < 1) return invalid_argument("--output-len " + std::to_string(c.output_len) + ": must be >= 1");
  switch (c.kind) {
    case WorkloadKind::kRandom:
      if (c.range_ratio < 0 || c.range_ratio >= 1)
        return invalid_argument("--range-ratio " + std::to_string(c.range_ratio) + ": must be in [0, 1)");
      return std::unique_ptr<Workload>(std::make_unique<RandomWorkload>(c, *codec, *corpus));
    case WorkloadKind::kSharedPrefix:
      if (c.cache_hit_rate < 0 || c.cache_hit_rate >= 1)
        return invalid_argument("--cache-hit-rate " + std::to_string(c.cache_hit_rate) + ": must be in [0, 1)");
      if (c.num_groups < 1) return invalid_argument("--num-prefix-groups " + std::to_string(c.num_groups) + ": must be >= 1");
      return std::unique_ptr<Workload>(std::make_unique<SharedPrefixWorkload>(c, *codec, *corpus));
    case WorkloadKind::kSingleStream:
      return std::unique_ptr<Workload>(std::make_unique<SingleStreamWorkload>(c, *codec, *corpus));
    case WorkloadKind::kFile:
    case WorkloadKind::kTrace: break;
  }
  return internal_error("unreachable workload kind");
}

}  // namespace mxserve::bench
