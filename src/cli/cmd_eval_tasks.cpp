// `mxserve eval tasks`: accuracy of any OpenAI-compatible server on a question-answer dataset (eval/tasks.h):
// prints accuracy with its 95% Wilson interval and writes one JSONL record per item (--output).
// Items whose request failed count as wrong and are reported apart (a server that fails is not accurate).
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/http_get.h"
#include "cli/eval_common.h"
#include "eval/tasks.h"

namespace mxserve::cli {
namespace {

// The first model id of GET /v1/models.
Result<std::string> first_model(const std::string& base, const std::string& key) {
  MX_ASSIGN_OR_RETURN(auto r, bench::http_get(base + "/v1/models", key, 10000));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status == 200 && j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].contains("id") && j["data"][0]["id"].is_string())
    return j["data"][0]["id"].get<std::string>();
  return invalid_argument("GET " + base + "/v1/models (HTTP " + std::to_string(r.status) +
                          ") named no model: pass --model NAME");
}

}  // namespace

int eval_tasks(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--base-url", "--data", "--task", "--model", "--api-key", "--concurrency",
                                       "--max-tokens", "--temperature", "--timeout", "--output", "--json", "--limit"},
                          {"--no-progress"});
  if (!args.is_ok()) return eval_fail(args.status());
  if (!args->has("--base-url") || !args->has("--data") || !args->has("--task") || !args->positional().empty())
    return eval_fail(invalid_argument("usage: mxserve eval tasks --base-url URL --data FILE.jsonl --task gsm8k|multiple-choice "
                                      "[--model NAME] [--concurrency C] [--max-tokens N] [--temperature T] [--limit N] "
                                      "[--output FILE.jsonl] [--json FILE]"));
  auto kind = eval::parse_task_kind(*args->get("--task"));
  if (!kind.is_ok()) return eval_fail(kind.status());
  auto items = eval::load_task_items(*args->get("--data"), *kind);
  if (!items.is_ok()) return eval_fail(items.status());
  eval::TaskClientOptions o;
  o.base_url = *args->get("--base-url");
  while (!o.base_url.empty() && o.base_url.back() == '/') o.base_url.pop_back();
  if (o.base_url.size() > 3 && o.base_url.substr(o.base_url.size() - 3) == "/v1") o.base_url.resize(o.base_url.size() - 3);
  o.api_key = args->get_or("--api-key", "");
  auto conc = args->get_int("--concurrency", 8);
  auto max_tokens = args->get_int("--max-tokens", *kind == eval::TaskKind::kGsm8k ? 512 : 64);
  auto temp = args->get_double("--temperature", 0.0);
  auto timeout = args->get_double("--timeout", 600.0);
  auto limit = args->get_int("--limit", 0);
  if (!conc.is_ok()) return eval_fail(conc.status());
  if (!max_tokens.is_ok()) return eval_fail(max_tokens.status());
  if (!temp.is_ok()) return eval_fail(temp.status());
  if (!timeout.is_ok()) return eval_fail(timeout.status());
  if (!limit.is_ok()) return eval_fail(limit.status());
  if (*conc < 1 || *conc > 1024) return eval_fail(invalid_argument("--concurrency must be in [1, 1024]"));
  if (*max_tokens < 1) return eval_fail(invalid_argument("--max-tokens must be positive"));
  if (*limit > 0 && static_cast<int64_t>(items->size()) > *limit) items->resize(static_cast<size_t>(*limit));
  o.concurrency = static_cast<int>(*conc);
  o.max_tokens = static_cast<int>(*max_tokens);
  o.temperature = *temp;
  o.timeout_s = *timeout;
  if (args->has("--model")) {
    o.model = args->get_or("--model", "");
  } else {
    auto m = first_model(o.base_url, o.api_key);
    if (!m.is_ok()) return eval_fail(m.status());
    o.model = *m;
  }
  std::ofstream out;
  if (args->has("--output")) {
    out.open(args->get_or("--output", ""));
    if (!out) return eval_fail(invalid_argument("--output " + args->get_or("--output", "") + ": cannot write"));
  }
  const auto results = eval::run_task_requests(*items, o, !args->has("--no-progress"));
  int64_t correct = 0, errors = 0, unanswered = 0;
  for (size_t i = 0; i < items->size(); ++i) {
    const auto& it = (*items)[i];
    const auto& r = results[i];
    std::optional<std::string> got;
    if (r.error.empty()) got = eval::extract_answer(r.response, *kind, it.n_choices);
    const bool ok = got && eval::answers_match(*got, it.reference, *kind);
    correct += ok;
    errors += !r.error.empty();
    unanswered += r.error.empty() && !got;
    if (out) {
      nlohmann::ordered_json rec = {{"index", i}, {"id", it.id}, {"reference", it.reference},
                                    {"extracted", got ? nlohmann::ordered_json(*got) : nlohmann::ordered_json()},
                                    {"correct", ok}, {"response", r.response}, {"error", r.error},
                                    {"latency_s", r.latency_s}, {"prompt", it.prompt}};
      out << rec.dump() << "\n";
    }
  }
  const int64_t n = static_cast<int64_t>(items->size());
  const auto ci = eval::wilson_interval(correct, n);
  std::printf("%s on %s (%s, model %s): accuracy %.2f%% (%lld/%lld), 95%% CI [%.2f%%, %.2f%%]; "
              "%lld without an answer, %lld failed requests\n",
              args->get_or("--task", "").c_str(), args->get_or("--data", "").c_str(), o.base_url.c_str(), o.model.c_str(),
              100.0 * correct / n, static_cast<long long>(correct), static_cast<long long>(n), 100 * ci.lo, 100 * ci.hi,
              static_cast<long long>(unanswered), static_cast<long long>(errors));
  if (errors) {
    for (size_t i = 0; i < results.size(); ++i)
      if (!results[i].error.empty()) {
        std::fprintf(stderr, "first failed request (item %zu): %s\n", i, results[i].error.c_str());
        break;
      }
  }
  if (args->has("--json")) {
    nlohmann::ordered_json j = {{"task", args->get_or("--task", "")}, {"data", args->get_or("--data", "")},
                                {"base_url", o.base_url}, {"model", o.model}, {"items", n}, {"correct", correct},
                                {"accuracy", static_cast<double>(correct) / n}, {"ci95", {ci.lo, ci.hi}},
                                {"unanswered", unanswered}, {"failed_requests", errors}};
    std::ofstream f(args->get_or("--json", ""));
    if (!f) return eval_fail(invalid_argument("--json: cannot write " + args->get_or("--json", "")));
    f << j.dump(1) << "\n";
  }
  return errors == n ? 1 : 0;
}

}  // namespace mxserve::cli
