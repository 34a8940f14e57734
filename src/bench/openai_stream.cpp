// OpenAiStreamReader (see openai_stream.h).
#include "bench/openai_stream.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace mxserve::bench {
namespace {

bool non_empty_string(const nlohmann::json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

size_t skip_ws(std::string_view d, size_t i) {
  while (i < d.size() && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r')) ++i;
  return i;
}

// Position just after `"key"` + optional whitespace + ':' + optional whitespace, or npos.
size_t value_after_key(std::string_view d, std::string_view quoted_key, size_t from) {
  size_t pos = d.find(quoted_key, from);
  while (pos != std::string_view::npos) {
    size_t i = skip_ws(d, pos + quoted_key.size());
    if (i < d.size() && d[i] == ':') return skip_ws(d, i + 1);
    pos = d.find(quoted_key, pos + 1);
  }
  return std::string_view::npos;
}

}  // namespace

FastChunk classify_chunk_fast(std::string_view d) {
  // Inside a JSON string every '"' is escaped, so `"key"` followed by ':' only matches a real key.
  if (d.find("\"usage\"") != std::string_view::npos || d.find("\"error\"") != std::string_view::npos)
    return FastChunk::kNeedsParse;
  const size_t ch = value_after_key(d, "\"choices\"", 0);
  if (ch == std::string_view::npos || ch >= d.size()) return FastChunk::kNeedsParse;
  if (d[ch] != '[') return FastChunk::kNeedsParse;
  const size_t first = skip_ws(d, ch + 1);
  if (first < d.size() && d[first] == ']') return FastChunk::kNotToken;
  if (d.find("\"choices\"", ch) != std::string_view::npos) return FastChunk::kNeedsParse;
  if (d.find("\"index\"", first) != std::string_view::npos) {
    // n > 1 choices: let the full parser look at choices[0] only.
    const size_t second = d.find("\"index\"", d.find("\"index\"", first) + 1);
    if (second != std::string_view::npos) return FastChunk::kNeedsParse;
  }
  for (std::string_view key : {std::string_view("\"content\""), std::string_view("\"text\""),
                               std::string_view("\"reasoning_content\""), std::string_view("\"reasoning\"")}) {
    const size_t v = value_after_key(d, key, first);
    if (v == std::string_view::npos || v >= d.size()) continue;
    if (d[v] == '"' && v + 1 < d.size() && d[v + 1] != '"') return FastChunk::kToken;
    if (d[v] != '"' && d[v] != 'n') return FastChunk::kNeedsParse;  // neither a string nor null
  }
  return FastChunk::kNotToken;
}

void OpenAiStreamReader::feed(const char* p, size_t n, double now_s) {
  sse_.feed(p, n, [&](std::string_view data) { on_event(data, now_s); });
}

void OpenAiStreamReader::on_event(std::string_view data, double now_s) {
  if (data == "[DONE]") {
    rec_->saw_done = true;
    return;
  }
  // Capturing text needs the decoded strings: the full parser sees every event then.
  const FastChunk fast = rec_->capture_text ? FastChunk::kNeedsParse : classify_chunk_fast(data);
  if (fast != FastChunk::kNeedsParse) {
    if (probe_) {
      const size_t v = value_after_key(data, "\"mx_t\"", 0);
      if (v != std::string_view::npos) probe_(probe_ctx_, std::strtoll(data.data() + v, nullptr, 10), now_s);
    }
    if (fast == FastChunk::kToken) on_token(now_s);
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (rec_->error.empty()) rec_->error = "malformed SSE data: " + tokenizer::utf8_lossy(data.substr(0, 120));  // the cut may split a character
    return;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (rec_->error.empty()) {
      const nlohmann::json& err = *e;
      std::string msg = err.is_object() && err.contains("message") && err["message"].is_string()
                            ? err["message"].get<std::string>()
                            : err.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      rec_->error = "stream error: " + tokenizer::utf8_lossy(std::string_view(msg).substr(0, 300));
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
        if (token && rec_->capture_text) {
          if (non_empty_string(*d, "content")) rec_->output_text += (*d)["content"].get_ref<const std::string&>();
          const char* rk = non_empty_string(*d, "reasoning_content") ? "reasoning_content" : "reasoning";
          if (non_empty_string(*d, rk)) rec_->reasoning_text += (*d)[rk].get_ref<const std::string&>();
        }
      } else {
        token = non_empty_string(c0, "text");
        if (token && rec_->capture_text) rec_->output_text += c0["text"].get_ref<const std::string&>();
      }
    }
  }
  if (token) on_token(now_s);
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

void OpenAiStreamReader::on_token(double now_s) {
  if (rec_->first_token_s < 0) {
    rec_->first_token_s = now_s;
  } else {
    rec_->itl_s.push_back(static_cast<float>(now_s - rec_->last_token_s));
  }
  rec_->last_token_s = now_s;
  ++rec_->token_chunks;
}

}  // namespace mxserve::bench
