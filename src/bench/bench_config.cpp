// `mxserve bench` flag parsing (see bench_config.h).
#include "bench/bench_config.h"

#include "core/nearest_name.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace mxserve::bench {
namespace {

Status bad(const std::string& flag, const std::string& value, const std::string& why) {
  return invalid_argument(flag + " " + value + ": " + why);
}

Result<double> parse_double(const std::string& flag, const std::string& v) {
  if (v == "inf" || v == "Inf" || v == "infinity") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || std::isnan(d)) return bad(flag, v, "not a number");
  return d;
}

Result<int64_t> parse_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size()) return bad(flag, v, "not an integer");
  return static_cast<int64_t>(x);
}

// "5s", "500ms", "2m", "1h" or a plain number of seconds.
Result<double> parse_seconds(const std::string& flag, const std::string& v) {
  double scale = 1;
  std::string num = v;
  auto ends = [&](const char* s) {
    const std::string suf(s);
    return num.size() > suf.size() && num.compare(num.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (ends("ms")) { scale = 1e-3; num.resize(num.size() - 2); }
  else if (ends("s")) { num.resize(num.size() - 1); }
  else if (ends("m")) { scale = 60; num.resize(num.size() - 1); }
  else if (ends("h")) { scale = 3600; num.resize(num.size() - 1); }
  char* end = nullptr;
  const double d = std::strtod(num.c_str(), &end);
  if (num.empty() || end != num.c_str() + num.size() || !(d >= 0) || std::isinf(d))
    return bad(flag, v, "expected a duration such as 5s, 500ms, 10m");
  return d * scale;
}

Result<std::vector<double>> parse_rate_list(const std::string& flag, const std::string& v) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    const std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto d = parse_double(flag, item);
    if (!d.is_ok()) return bad(flag, v, "'" + item + "' is not a rate");
    if (!(*d > 0)) return bad(flag, v, "rates must be > 0");
    out.push_back(*d);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

const std::set<std::string> kBoolFlags = {"--find-knee", "--no-ignore-eos", "--ignore-eos", "--no-progress",
                                          "--disable-tqdm", "--help", "-h", "--no-server-metrics", "--save-requests"};
const std::map<std::string, std::string> kAliases = {
    {"--random-input-len", "--input-len"},   {"--random-output-len", "--output-len"},
    {"--random-range-ratio", "--range-ratio"}, {"--dataset-path", "--dataset"},
    {"--num-prompts", "--num-requests"},     {"--disable-tqdm", "--no-progress"},
    {"-h", "--help"}};
const std::set<std::string> kValueFlags = {
    "--base-url", "--host", "--port", "--model", "--tokenizer", "--corpus", "--api-key", "--endpoint",
    "--workload", "--input-len", "--output-len", "--range-ratio", "--cache-hit-rate", "--num-prefix-groups",
    "--dataset", "--seed", "--temperature", "--extra-body", "--request-rate", "--arrival", "--burstiness",
    "--max-concurrency", "--num-requests", "--duration", "--warmup-requests", "--ready-timeout", "--request-timeout", "--sweep",
    "--slo-ttft-p95", "--min-success", "--knee-tolerance", "--knee-max-bisections", "--gpus",
    "--gpu-hour-price", "--compare-price", "--compare-gpus", "--compare-throughput", "--output-json",
    "--plot-prefix", "--http-client", "--trace", "--session-rate", "--num-sessions"};

}  // namespace

Status parse_knee_flag(const std::string& flag, const std::string& value, KneeCriteria* c) {
  if (flag == "--slo-ttft-p95") {
    MX_ASSIGN_OR_RETURN(c->slo_ttft_p95_s, parse_seconds(flag, value));
    if (!(c->slo_ttft_p95_s > 0)) return bad(flag, value, "must be > 0");
  } else if (flag == "--min-success") {
    MX_ASSIGN_OR_RETURN(c->min_success, parse_double(flag, value));
    if (c->min_success < 0 || c->min_success > 1) return bad(flag, value, "must be in [0, 1]");
  } else {
    return invalid_argument(flag + ": not a knee flag");
  }
  return Status::ok();
}

std::string bench_usage() {
  return R"(usage: mxserve bench trace-gen ...   (writes a synthetic agent trace; see mxserve bench trace-gen --help)
       mxserve bench judge FILE.json ...  (the knee rule again on a saved run; see mxserve bench judge --help)
       mxserve bench --base-url http://HOST:PORT [--model NAME] --tokenizer PATH
                     [--endpoint chat|completions] --workload random|shared-prefix|single-stream|file|trace
                     (--request-rate R | --sweep R1,R2,... | --max-concurrency C)
                     (--num-requests N | --duration 60s) [--output-json FILE]
A load generator for OpenAI-compatible servers (mxserve, vLLM, sglang, llama.cpp). docs/bench.md.

server:    --base-url URL (or --host H --port P)  --model NAME (default: first of /v1/models)
           --endpoint chat|completions (chat)  --api-key KEY ($OPENAI_API_KEY)
           --request-timeout 600s  --extra-body JSON  --temperature T  --no-ignore-eos
           --http-client auto|native|curl (auto: native epoll client for http://, libcurl for https://)
workload:  --workload random|shared-prefix|single-stream|file|trace (random)
           --tokenizer PATH (tokenizer.json or model dir; builtin:words for test servers only)
           --input-len N (1024)  --output-len N (128)  --range-ratio r (0: exact; [L(1-r), L(1+r)])
           --cache-hit-rate h (0.6)  --num-prefix-groups G (16)       (shared-prefix)
           --dataset FILE.jsonl ({"prompt"|"messages", "output_len"?} per line)   (file)
           --corpus FILE (default: embedded Brown corpus extract)  --seed N (0)
trace:     --workload trace --trace FILE.jsonl (multi-turn agent sessions; `mxserve bench trace-gen` writes one)
           --max-concurrency C (sessions at once) and/or --session-rate R (session arrivals/s)
           [--num-sessions N (default: the file's sessions)] [--duration 10m (no session starts after)]
arrivals:  --request-rate R (req/s, 'inf' = all at once)  --arrival poisson|constant|gamma (poisson)
           --burstiness k (gamma shape; 1 = Poisson)  --max-concurrency C (closed loop without a rate)
           --num-requests N | --duration 60s (per rate point)  --warmup-requests W (excluded)
           --ready-timeout S (300: wait while GET /health answers 503, the server loading)
sweeps:    --sweep 0.5,1,1.5,2,2.25,2.4  --find-knee --slo-ttft-p95 5s [--min-success 0.99]
           [--knee-tolerance 0.05] [--knee-max-bisections 8]
cost:      --gpus N  --gpu-hour-price USD  --compare-price USD [--compare-gpus N]
           [--compare-throughput TOK_S]
output:    --output-json FILE  --plot-prefix PATH (default: FILE without .json)  --no-progress
           --no-server-metrics (do not read spec-decode / prefix-cache counters from GET /metrics)
           --save-requests (per-request records in the JSON: times, tokens, status, error)
)";
}

Result<BenchConfig> parse_bench_args(int argc, char** argv, bool* help) {
  BenchConfig c;
  *help = false;
  std::map<std::string, std::string> v;
  std::set<std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (auto it = kAliases.find(a); it != kAliases.end()) a = it->second;
    if (kBoolFlags.count(a) || a == "--no-progress" || a == "--help") {
      if (has_value) return invalid_argument(a + " takes no value (got '" + value + "')");
      flags.insert(a);
      continue;
    }
    if (!kValueFlags.count(a)) {
      std::set<std::string> known = kValueFlags;
      known.insert(kBoolFlags.begin(), kBoolFlags.end());
      for (const auto& [alias, name] : kAliases) known.insert(alias);
      known.erase("-h");
      const std::string near = nearest_name(a, known);
      return invalid_argument("unknown flag " + a + " (" + (near.empty() ? "" : "did you mean " + near + "? ") +
                              "`mxserve bench --help` lists the flags)");
    }
    if (!has_value) {
      if (i + 1 >= argc) return invalid_argument(a + ": missing value");
      value = argv[++i];
    }
    v[a] = value;
  }
  if (flags.count("--help")) {
    *help = true;
    return c;
  }
  auto has = [&](const char* f) { return v.count(f) > 0; };

  if (has("--base-url")) c.base_url = v["--base-url"];
  if (has("--host") || has("--port"))
    c.base_url = "http://" + (has("--host") ? v["--host"] : std::string("127.0.0.1")) + ":" +
                 (has("--port") ? v["--port"] : std::string("8000"));
  while (!c.base_url.empty() && c.base_url.back() == '/') c.base_url.pop_back();
  if (c.base_url.rfind("http://", 0) != 0 && c.base_url.rfind("https://", 0) != 0)
    return bad("--base-url", c.base_url, "must start with http:// or https://");
  if (c.base_url.size() > 3 && c.base_url.compare(c.base_url.size() - 3, 3, "/v1") == 0) c.base_url.resize(c.base_url.size() - 3);
  if (has("--model")) c.model = v["--model"];
  if (has("--tokenizer")) c.tokenizer = v["--tokenizer"];
  if (has("--corpus")) c.corpus = v["--corpus"];
  if (has("--api-key")) c.api_key = v["--api-key"];
  else if (const char* k = std::getenv("OPENAI_API_KEY")) c.api_key = k;
  if (has("--endpoint")) {
    const std::string& e = v["--endpoint"];
    if (e == "chat") c.endpoint = Endpoint::kChat;
    else if (e == "completions") c.endpoint = Endpoint::kCompletions;
    else return bad("--endpoint", e, "expected chat or completions");
  }
  if (has("--workload")) { MX_ASSIGN_OR_RETURN(c.workload.kind, parse_workload_kind(v["--workload"])); }
  const bool single = c.workload.kind == WorkloadKind::kSingleStream;
  if (single) {
    c.workload.input_len = 10000;
    c.workload.output_len = 1500;
  }
  if (has("--input-len")) { MX_ASSIGN_OR_RETURN(c.workload.input_len, parse_int("--input-len", v["--input-len"])); }
  if (has("--output-len")) { MX_ASSIGN_OR_RETURN(c.workload.output_len, parse_int("--output-len", v["--output-len"])); }
  if (c.workload.input_len < 1) return bad("--input-len", std::to_string(c.workload.input_len), "must be >= 1");
  if (c.workload.output_len < 1) return bad("--output-len", std::to_string(c.workload.output_len), "must be >= 1");
  if (has("--range-ratio")) { MX_ASSIGN_OR_RETURN(c.workload.range_ratio, parse_double("--range-ratio", v["--range-ratio"])); }
  if (c.workload.range_ratio < 0 || c.workload.range_ratio >= 1)
    return bad("--range-ratio", v["--range-ratio"], "must be in [0, 1)");
  if (has("--cache-hit-rate")) { MX_ASSIGN_OR_RETURN(c.workload.cache_hit_rate, parse_double("--cache-hit-rate", v["--cache-hit-rate"])); }
  if (c.workload.cache_hit_rate < 0 || c.workload.cache_hit_rate >= 1)
    return bad("--cache-hit-rate", v["--cache-hit-rate"], "must be in [0, 1)");
  if (has("--num-prefix-groups")) {
    MX_ASSIGN_OR_RETURN(int64_t g, parse_int("--num-prefix-groups", v["--num-prefix-groups"]));
    if (g < 1 || g > 1'000'000) return bad("--num-prefix-groups", v["--num-prefix-groups"], "must be in [1, 1e6]");
    c.workload.num_groups = static_cast<int>(g);
  }
  if (has("--trace") && !has("--workload")) c.workload.kind = WorkloadKind::kTrace;
  const bool trace = c.workload.kind == WorkloadKind::kTrace;
  if (has("--trace")) c.trace_file = v["--trace"];
  if (trace && c.trace_file.empty()) return invalid_argument("--workload trace needs --trace FILE.jsonl");
  if (!trace && !c.trace_file.empty()) return bad("--trace", c.trace_file, "applies to --workload trace only");
  for (const char* f : {"--session-rate", "--num-sessions"})
    if (!trace && has(f)) return bad(f, v[f], "applies to --workload trace only");
  if (has("--session-rate")) {
    MX_ASSIGN_OR_RETURN(c.session_rate, parse_double("--session-rate", v["--session-rate"]));
    if (!(c.session_rate > 0) || std::isinf(c.session_rate))
      return bad("--session-rate", v["--session-rate"], "must be a finite number > 0 (sessions per second)");
  }
  if (has("--num-sessions")) {
    MX_ASSIGN_OR_RETURN(c.num_sessions, parse_int("--num-sessions", v["--num-sessions"]));
    if (c.num_sessions < 1 || c.num_sessions > 10'000'000) return bad("--num-sessions", v["--num-sessions"], "must be in [1, 1e7]");
  }
  if (trace) {
    for (const char* f : {"--request-rate", "--sweep", "--num-requests", "--dataset", "--input-len", "--output-len",
                          "--range-ratio", "--cache-hit-rate", "--num-prefix-groups"})
      if (has(f)) return bad(f, v[f], "does not apply to --workload trace (sessions come from --trace; load from "
                                      "--max-concurrency / --session-rate, count from --num-sessions)");
    if (flags.count("--find-knee")) return invalid_argument("--find-knee does not apply to --workload trace");
    if (has("--warmup-requests") && v["--warmup-requests"] != "0")
      return bad("--warmup-requests", v["--warmup-requests"], "--workload trace has no warm-up requests");
  }
  if (has("--dataset")) c.workload.file = v["--dataset"];
  if (c.workload.kind == WorkloadKind::kFile && c.workload.file.empty())
    return invalid_argument("--workload file needs --dataset FILE.jsonl");
  if (has("--seed")) {
    MX_ASSIGN_OR_RETURN(int64_t s, parse_int("--seed", v["--seed"]));
    c.workload.seed = static_cast<uint64_t>(s);
    c.arrival.seed = static_cast<uint64_t>(s);
  }
  // ignore_eos is on by default (fixed output lengths); --ignore-eos says so explicitly, and both at once
  // is a contradiction, not a silent last-one-wins.
  if (flags.count("--no-ignore-eos") && flags.count("--ignore-eos"))
    return invalid_argument("--ignore-eos and --no-ignore-eos contradict each other: give one");
  c.ignore_eos = flags.count("--ignore-eos") || !flags.count("--no-ignore-eos");
  if (has("--temperature")) { MX_ASSIGN_OR_RETURN(c.temperature, parse_double("--temperature", v["--temperature"])); }
  if (has("--extra-body")) {
    c.extra_body = v["--extra-body"];
    auto j = nlohmann::json::parse(c.extra_body, nullptr, false);
    if (!j.is_object()) return bad("--extra-body", c.extra_body, "must be a JSON object");
  }

  if (has("--arrival")) { MX_ASSIGN_OR_RETURN(c.arrival.kind, parse_arrival_kind(v["--arrival"])); }
  if (has("--burstiness")) {
    MX_ASSIGN_OR_RETURN(c.arrival.burstiness, parse_double("--burstiness", v["--burstiness"]));
    if (!(c.arrival.burstiness > 0) || std::isinf(c.arrival.burstiness))
      return bad("--burstiness", v["--burstiness"], "must be a finite number > 0");
    if (!has("--arrival")) c.arrival.kind = ArrivalKind::kGamma;
    else if (c.arrival.kind != ArrivalKind::kGamma)
      return bad("--burstiness", v["--burstiness"], "applies to --arrival gamma only");
  }
  if (has("--request-rate") && has("--sweep")) return invalid_argument("--request-rate and --sweep: give one of them");
  if (has("--request-rate")) { MX_ASSIGN_OR_RETURN(c.rates, parse_rate_list("--request-rate", v["--request-rate"])); }
  if (c.rates.size() > 1) return bad("--request-rate", v["--request-rate"], "one rate; use --sweep for a list");
  if (has("--sweep")) { MX_ASSIGN_OR_RETURN(c.rates, parse_rate_list("--sweep", v["--sweep"])); }
  if (has("--max-concurrency")) {
    MX_ASSIGN_OR_RETURN(c.max_concurrency, parse_int("--max-concurrency", v["--max-concurrency"]));
    if (c.max_concurrency < 1) return bad("--max-concurrency", v["--max-concurrency"], "must be >= 1");
  }
  if (has("--num-requests")) {
    MX_ASSIGN_OR_RETURN(c.num_requests, parse_int("--num-requests", v["--num-requests"]));
    if (c.num_requests < 1) return bad("--num-requests", v["--num-requests"], "must be >= 1");
  }
  if (has("--duration")) {
    MX_ASSIGN_OR_RETURN(c.duration_s, parse_seconds("--duration", v["--duration"]));
    if (!(c.duration_s > 0)) return bad("--duration", v["--duration"], "must be > 0");
  }
  if (has("--ready-timeout")) {
    MX_ASSIGN_OR_RETURN(c.ready_timeout_s, parse_seconds("--ready-timeout", v["--ready-timeout"]));
    if (c.ready_timeout_s < 0) return bad("--ready-timeout", v["--ready-timeout"], "must be >= 0");
  }
  if (has("--warmup-requests")) {
    MX_ASSIGN_OR_RETURN(c.warmup_requests, parse_int("--warmup-requests", v["--warmup-requests"]));
    if (c.warmup_requests < 0) return bad("--warmup-requests", v["--warmup-requests"], "must be >= 0");
  }
  if (has("--request-timeout")) {
    MX_ASSIGN_OR_RETURN(c.request_timeout_s, parse_seconds("--request-timeout", v["--request-timeout"]));
    if (!(c.request_timeout_s > 0)) return bad("--request-timeout", v["--request-timeout"], "must be > 0");
  }
  if (has("--http-client")) { MX_ASSIGN_OR_RETURN(c.http_client, parse_http_client_kind(v["--http-client"])); }
  c.find_knee = flags.count("--find-knee") > 0;
  for (const char* f : {"--slo-ttft-p95", "--min-success"})
    if (has(f)) MX_RETURN_IF_ERROR(parse_knee_flag(f, v[f], &c.knee));
  if (has("--knee-tolerance")) {
    MX_ASSIGN_OR_RETURN(c.knee_tolerance, parse_double("--knee-tolerance", v["--knee-tolerance"]));
    if (!(c.knee_tolerance > 0) || std::isinf(c.knee_tolerance)) return bad("--knee-tolerance", v["--knee-tolerance"], "must be > 0");
  }
  if (has("--knee-max-bisections")) {
    MX_ASSIGN_OR_RETURN(int64_t b, parse_int("--knee-max-bisections", v["--knee-max-bisections"]));
    if (b < 0 || b > 30) return bad("--knee-max-bisections", v["--knee-max-bisections"], "must be in [0, 30]");
    c.knee_max_bisections = static_cast<int>(b);
  }
  if (has("--gpus")) {
    MX_ASSIGN_OR_RETURN(int64_t g, parse_int("--gpus", v["--gpus"]));
    if (g < 1 || g > 100000) return bad("--gpus", v["--gpus"], "must be >= 1");
    c.gpus = static_cast<int>(g);
  }
  auto price = [&](const char* f, double* out) -> Status {
    if (!has(f)) return Status::ok();
    MX_ASSIGN_OR_RETURN(*out, parse_double(f, v[f]));
    if (!(*out > 0) || std::isinf(*out)) return bad(f, v[f], "must be a positive number");
    return Status::ok();
  };
  MX_RETURN_IF_ERROR(price("--gpu-hour-price", &c.cost.gpu_hour_price));
  MX_RETURN_IF_ERROR(price("--compare-price", &c.cost.compare_price));
  MX_RETURN_IF_ERROR(price("--compare-throughput", &c.cost.compare_throughput));
  if (has("--compare-gpus")) {
    MX_ASSIGN_OR_RETURN(int64_t g, parse_int("--compare-gpus", v["--compare-gpus"]));
    if (g < 1) return bad("--compare-gpus", v["--compare-gpus"], "must be >= 1");
    c.cost.compare_gpus = static_cast<int>(g);
  }
  if (c.cost.gpu_hour_price > 0 && c.gpus == 0)
    return invalid_argument("--gpu-hour-price needs --gpus N (the GPUs the server runs on)");
  if (c.cost.compare_price > 0 && c.cost.gpu_hour_price == 0)
    return invalid_argument("--compare-price needs --gpu-hour-price (the price it is compared with)");
  if (c.cost.compare_gpus == 0) c.cost.compare_gpus = c.gpus;
  if (has("--output-json")) c.output_json = v["--output-json"];
  if (has("--plot-prefix")) c.plot_prefix = v["--plot-prefix"];
  if (c.plot_prefix.empty() && !c.output_json.empty()) {
    c.plot_prefix = c.output_json;
    if (c.plot_prefix.size() > 5 && c.plot_prefix.compare(c.plot_prefix.size() - 5, 5, ".json") == 0)
      c.plot_prefix.resize(c.plot_prefix.size() - 5);
  }
  c.progress = !flags.count("--no-progress");
  c.scrape_server_metrics = !flags.count("--no-server-metrics");
  c.save_requests = flags.count("--save-requests") > 0;

  // Load shape and stop conditions.
  if (single) {
    if (!c.rates.empty()) return invalid_argument("--workload single-stream sends one request at a time; drop --request-rate/--sweep");
    if (c.max_concurrency > 1) return bad("--max-concurrency", v["--max-concurrency"], "single-stream runs at concurrency 1");
    c.max_concurrency = 1;
    if (c.num_requests < 0 && c.duration_s <= 0) c.num_requests = 5;
  }
  if (trace) {
    c.warmup_requests = 0;
    if (c.session_rate <= 0 && c.max_concurrency == 0)
      return invalid_argument("give a load: --max-concurrency C (sessions at once) and/or --session-rate R");
    return c;
  }
  if (c.find_knee) {
    if (c.rates.empty()) {
      if (c.max_concurrency > 0) return invalid_argument("--find-knee searches a request rate: drop --max-concurrency");
      c.rates = {0.5, 1, 1.5, 2, 2.25, 2.4};
    }
    for (double r : c.rates)
      if (std::isinf(r)) return invalid_argument("--find-knee: the grid needs finite rates");
  }
  if (c.rates.empty() && c.max_concurrency == 0)
    return invalid_argument("give a load: --request-rate R, --sweep R1,R2,... or --max-concurrency C");
  if (c.num_requests < 0 && c.duration_s <= 0) return invalid_argument("give a stop condition: --num-requests N or --duration 60s");
  for (double r : c.rates)
    if (std::isinf(r) && c.num_requests < 0) return invalid_argument("--request-rate inf needs --num-requests");
  return c;
}

}  // namespace mxserve::bench
