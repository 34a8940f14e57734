// OpenAiStreamReader (see openai_stream.h).
#include "bench/openai_stream.h"

#include <nlohmann/json.hpp>

namespace mxserve::bench {
namespace {

bool non_empty_string(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

}  // namespace

void OpenAiStreamReader::feed(const char* p, size_t n, double now_s) {
  sse_.feed(p, n, [&](std::string_view data) { on_event(data, now_s); });
}

void OpenAiStreamReader::on_event(std::string_view data, double now_s) {
  if (data == "[DONE]") {
    rec_->saw_done = true;
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (rec_->error.empty()) rec_->error = "malformed SSE data: " + std::string(data.substr(0, 120));
    return;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (rec_->error.empty()) {
      const nlohmann::json& err = *e;
      std::string msg = err.is_object() && err.contains("message") && err["message"].is_string()
                            ? err["message"].get<std::string>()
                            : err.dump();
      rec_->error = "stream error: " + msg.substr(0, 300);
    }
    return;
  }
  if (probe_) {
    if (auto t = j.find("mx_t"); t != j.end() && t->is_number_integer()) probe_(probe_ctx_, t->get<int64_t>(), now_s);
  }
  bool token = false;
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const nlohmann::json& c0 = (*ch)[0];
    if (c0.is_object()) {
      if (auto d = c0.find("delta"); d != c0.end() && d->is_object()) {
        token = non_empty_string(*d, "content") || non_empty_string(*d, "reasoning_content") ||
                non_empty_string(*d, "reasoning");
      } else {
        token = non_empty_string(c0, "text");
      }
    }
  }
  if (token) {
    if (rec_->first_token_s < 0) {
      rec_->first_token_s = now_s;
    } else {
      rec_->itl_s.push_back(static_cast<float>(now_s - rec_->last_token_s));
    }
    rec_->last_token_s = now_s;
    ++rec_->token_chunks;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    const nlohmann::json& us = *u;
    if (us.contains("completion_tokens") && us["completion_tokens"].is_number_integer())
      rec_->output_tokens = us["completion_tokens"].get<int64_t>();
    if (us.contains("prompt_tokens") && us["prompt_tokens"].is_number_integer())
      rec_->prompt_tokens = us["prompt_tokens"].get<int64_t>();
    if (auto d = us.find("prompt_tokens_details"); d != us.end() && d->is_object()) {
      if (d->contains("cached_tokens") && (*d)["cached_tokens"].is_number_integer())
        rec_->cached_tokens = (*d)["cached_tokens"].get<int64_t>();
    }
  }
}

}  // namespace mxserve::bench
