#include "eval/tasks.h"

#include <curl/curl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/sse_parser.h"

namespace mxserve::eval {

using nlohmann::json;

Result<TaskKind> parse_task_kind(const std::string& s) {
  if (s == "gsm8k") return TaskKind::kGsm8k;
  if (s == "multiple-choice") return TaskKind::kMultipleChoice;
  return invalid_argument("--task '" + s + "': expected gsm8k or multiple-choice");
}

namespace {

// "1,234.50" -> "1234.5"; "-7" -> "-7"; "" when not a number.
std::string canonical_number(std::string s) {
  std::string t;
  for (char c : s)
    if (c != ',') t += c;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || !std::isfinite(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

const std::regex& number_re() {
  static const std::regex re(R"(-?\d[\d,]*(?:\.\d+)?|-?\.\d+)");
  return re;
}

std::string letter(int i) { return std::string(1, static_cast<char>('A' + i)); }

}  // namespace

Result<std::vector<TaskItem>> load_task_items(const std::string& path, TaskKind kind) {
  std::ifstream in(path);
  if (!in) return not_found("--data " + path + ": cannot open");
  std::vector<TaskItem> items;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    json j = json::parse(line, nullptr, false);
    if (!j.is_object()) return invalid_argument(where + "not a JSON object");
    if (!j.contains("question") || !j["question"].is_string()) return invalid_argument(where + "missing string field 'question'");
    TaskItem it;
    it.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump()) : std::to_string(n);
    const std::string q = j["question"].get<std::string>();
    if (!j.contains("answer")) return invalid_argument(where + "missing field 'answer'");
    const json& a = j["answer"];
    if (kind == TaskKind::kGsm8k) {
      std::string ref = a.is_string() ? a.get<std::string>() : a.is_number() ? a.dump() : "";
      if (auto h = ref.rfind("####"); h != std::string::npos) ref = ref.substr(h + 4);
      ref.erase(0, ref.find_first_not_of(" \t\n"));
      ref.erase(ref.find_last_not_of(" \t\n") + 1);
      it.reference = canonical_number(ref);
      if (it.reference.empty()) return invalid_argument(where + "'answer' has no final number (expected '... #### N' or N)");
      it.prompt = q + "\nSolve the problem step by step, then give the final answer as a number on the last line.";
    } else {
      const char* key = j.contains("choices") ? "choices" : "options";
      if (!j.contains(key) || !j[key].is_array() || j[key].size() < 2 || j[key].size() > 10)
        return invalid_argument(where + "'choices' must be an array of 2 to 10 strings");
      const json& ch = j[key];
      it.n_choices = static_cast<int>(ch.size());
      std::string p = q + "\n";
      for (int i = 0; i < it.n_choices; ++i) {
        if (!ch[i].is_string()) return invalid_argument(where + "choice " + std::to_string(i) + " is not a string");
        p += letter(i) + ". " + ch[i].get<std::string>() + "\n";
      }
      it.prompt = p + "Answer with the letter of the correct option.";
      if (a.is_number_integer()) {
        const int64_t k = a.get<int64_t>();
        if (k < 0 || k >= it.n_choices) return invalid_argument(where + "'answer' index " + a.dump() + " out of range");
        it.reference = letter(static_cast<int>(k));
      } else if (a.is_string() && a.get<std::string>().size() == 1 && a.get<std::string>()[0] >= 'A' &&
                 a.get<std::string>()[0] < 'A' + it.n_choices) {
        it.reference = a.get<std::string>();
      } else {
        return invalid_argument(where + "'answer' must be an option letter or a 0-based index, got " + a.dump());
      }
    }
    items.push_back(std::move(it));
  }
  if (items.empty()) return invalid_argument("--data " + path + ": no items");
  return items;
}

std::optional<std::string> extract_answer(const std::string& response, TaskKind kind, int n_choices) {
  if (kind == TaskKind::kGsm8k) {
    std::string last;
    for (std::sregex_iterator it(response.begin(), response.end(), number_re()), end; it != end; ++it) last = it->str();
    if (last.empty()) return std::nullopt;
    std::string c = canonical_number(last);
    if (c.empty()) return std::nullopt;
    return c;
  }
  const char hi = static_cast<char>('A' + std::max(1, n_choices) - 1);
  const std::string range = std::string("[A-") + hi + "]";
  std::smatch m;
  std::string last;
  // "answer is (B)", "Answer: B", "option C": the letter itself must be a capital (a lowercase "a" is an article).
  const std::regex phrase("(?:[Aa]nswer|ANSWER|[Oo]ption|OPTION)\\s*(?:is|IS|:)?\\s*:?\\s*\\(?(" + range +
                          ")\\)?(?![A-Za-z])");
  for (std::sregex_iterator it(response.begin(), response.end(), phrase), end; it != end; ++it) last = (*it)[1].str();
  if (!last.empty() && last[0] <= hi) return last;
  last.clear();
  const std::regex standalone("(?:^|[^A-Za-z])(" + range + ")(?![A-Za-z])");
  for (std::sregex_iterator it(response.begin(), response.end(), standalone), end; it != end; ++it) last = (*it)[1].str();
  if (last.empty()) return std::nullopt;
  return last;
}

bool answers_match(const std::string& extracted, const std::string& reference, TaskKind kind) {
  if (kind == TaskKind::kMultipleChoice) return extracted == reference;
  const double a = std::strtod(extracted.c_str(), nullptr), b = std::strtod(reference.c_str(), nullptr);
  return std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b));
}

Interval wilson_interval(int64_t correct, int64_t n, double z) {
  if (n <= 0) return {0, 1};
  const double p = static_cast<double>(correct) / n, z2 = z * z, nn = static_cast<double>(n);
  const double denom = 1 + z2 / nn;
  const double center = (p + z2 / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / denom;
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

namespace {

struct Transfer {
  bench::SseParser sse;
  std::string content, error, raw;  // raw: a non-200 body (for the error message)
  long status = 0;
  CURL* curl = nullptr;
};

size_t on_body(char* p, size_t s, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const size_t len = s * n;
  if (t->status == 0) curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->status);
  if (t->status != 200) {
    if (t->raw.size() < 4096) t->raw.append(p, len);
    return len;
  }
  t->sse.feed(p, len, [&](std::string_view data) {
    if (data == "[DONE]") return;
    json j = json::parse(data.begin(), data.end(), nullptr, false);
    if (!j.is_object()) {
      if (t->error.empty()) t->error = "unparseable stream event: " + std::string(data.substr(0, 200));
      return;
    }
    if (j.contains("error")) {
      if (t->error.empty()) t->error = "stream error: " + j["error"].dump();
      return;
    }
    if (!j.contains("choices") || !j["choices"].is_array()) return;
    for (const auto& c : j["choices"]) {
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") && c["delta"]["content"].is_string())
        t->content += c["delta"]["content"].get<std::string>();
      else if (c.contains("text") && c["text"].is_string())
        t->content += c["text"].get<std::string>();
    }
  });
  return len;
}

TaskResult request_one(const TaskItem& item, const TaskClientOptions& o) {
  TaskResult r;
  json body = {{"model", o.model},
               {"messages", json::array({{{"role", "user"}, {"content", item.prompt}}})},
               {"max_tokens", o.max_tokens},
               {"temperature", o.temperature},
               {"stream", true}};
  const std::string payload = body.dump();
  Transfer t;
  t.curl = curl_easy_init();
  if (!t.curl) return {"", "curl_easy_init failed", 0};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!o.api_key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + o.api_key).c_str());
  const std::string url = o.base_url + "/v1/chat/completions";
  curl_easy_setopt(t.curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(t.curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(t.curl, CURLOPT_POSTFIELDS, payload.c_str());
  curl_easy_setopt(t.curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  curl_easy_setopt(t.curl, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(t.curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(t.curl, CURLOPT_TIMEOUT_MS, static_cast<long>(o.timeout_s * 1000));
  curl_easy_setopt(t.curl, CURLOPT_NOSIGNAL, 1L);
  const auto t0 = std::chrono::steady_clock::now();
  const CURLcode rc = curl_easy_perform(t.curl);
  r.latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (t.status == 0) curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &t.status);
  curl_easy_cleanup(t.curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) r.error = "POST " + url + ": " + curl_easy_strerror(rc);
  else if (t.status != 200) r.error = "HTTP " + std::to_string(t.status) + ": " + t.raw.substr(0, 300);
  else r.error = t.error;
  r.response = std::move(t.content);
  return r;
}

}  // namespace

std::vector<TaskResult> run_task_requests(const std::vector<TaskItem>& items, const TaskClientOptions& o,
                                          bool show_progress) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  std::vector<TaskResult> results(items.size());
  std::atomic<size_t> next{0}, done{0};
  std::mutex print_mu;
  auto worker = [&] {
    for (size_t i = next++; i < items.size(); i = next++) {
      results[i] = request_one(items[i], o);
      const size_t d = ++done;
      if (show_progress && (d % 10 == 0 || d == items.size())) {
        std::lock_guard<std::mutex> lock(print_mu);
        if (isatty(STDERR_FILENO) == 1) {  // a terminal: one line rewritten; a pipe or a log: full lines
          std::fprintf(stderr, "\r%zu/%zu items", d, items.size());
          if (d == items.size()) std::fprintf(stderr, "\n");
        } else if (d * 10 / items.size() != (d - 1) * 10 / items.size() || d == items.size()) {
          std::fprintf(stderr, "%zu/%zu items\n", d, items.size());
        }
      }
    }
  };
  std::vector<std::thread> threads;
  const int n = std::max(1, std::min<int>(o.concurrency, static_cast<int>(items.size())));
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace mxserve::eval
