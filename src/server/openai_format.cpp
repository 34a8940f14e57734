#include "server/openai_format.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

#include "server/chat_output.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;

OJ token_bytes(const std::string& s) {
  OJ b = OJ::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

OJ finish_value(const std::string& reason) { return reason.empty() ? OJ(nullptr) : OJ(reason); }

const char* object_name(ApiKind k, bool chunk) {
  if (k == ApiKind::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

}  // namespace

std::string make_response_id(ApiKind kind) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const uint64_t x = (salt << 20) ^ counter.fetch_add(1) ^
                     static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(x));
  return std::string(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + buf;
}

OJ usage_json(const UsageTotals& u) {
  OJ j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = OJ{{"cached_tokens", u.cached_tokens}};
  return j;
}

OJ logprobs_json(ApiKind kind, const std::vector<TokenLogprob>& lps, const tokenizer::Tokenizer& tok, size_t offset) {
  auto text_of = [&](int32_t id) {
    const int32_t one[1] = {id};
    return tok.decode(std::span<const int32_t>(one, 1), false);
  };
  if (kind == ApiKind::kChat) {
    OJ content = OJ::array();
    for (const auto& lp : lps) {
      const std::string t = text_of(lp.token);
      OJ top = OJ::array();
      for (const auto& alt : lp.top) {
        const std::string at = text_of(alt.token);
        top.push_back(OJ{{"token", at}, {"logprob", alt.logprob}, {"bytes", token_bytes(at)}});
      }
      content.push_back(OJ{{"token", t}, {"logprob", lp.logprob}, {"bytes", token_bytes(t)}, {"top_logprobs", top}});
    }
    return OJ{{"content", content}};
  }
  OJ tokens = OJ::array(), token_logprobs = OJ::array(), top_logprobs = OJ::array(), offsets = OJ::array();
  for (const auto& lp : lps) {
    const std::string t = text_of(lp.token);
    tokens.push_back(t);
    token_logprobs.push_back(lp.has_logprob ? OJ(lp.logprob) : OJ(nullptr));
    OJ top = OJ::object();
    for (const auto& alt : lp.top) top[text_of(alt.token)] = alt.logprob;
    top_logprobs.push_back(lp.has_logprob ? top : OJ(nullptr));
    offsets.push_back(offset);
    offset += t.size();
  }
  return OJ{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
            {"text_offset", offsets}};
}

OJ prompt_logprobs_json(const std::vector<runtime::PromptLogprob>& lps, const tokenizer::Tokenizer& tok) {
  auto text_of = [&](int32_t id) {
    const int32_t one[1] = {id};
    return tok.decode(std::span<const int32_t>(one, 1), false);
  };
  OJ arr = OJ::array();
  arr.push_back(nullptr);  // the first prompt token has no context
  for (const auto& p : lps) {
    OJ pos = OJ::object();
    pos[std::to_string(p.token)] = OJ{{"logprob", p.logprob}, {"rank", p.rank}, {"decoded_token", text_of(p.token)}};
    for (size_t i = 0; i < p.top.size(); ++i) {
      const std::string key = std::to_string(p.top[i].token);
      if (pos.contains(key)) continue;
      pos[key] = OJ{{"logprob", p.top[i].logprob}, {"rank", static_cast<int64_t>(i) + 1},
                    {"decoded_token", text_of(p.top[i].token)}};
    }
    arr.push_back(std::move(pos));
  }
  return arr;
}

OJ stream_chunk(const ResponseMeta& m, const ChoiceDelta& d, bool first, const OJ& logprobs) {
  OJ choice;
  choice["index"] = d.index;
  if (m.kind == ApiKind::kChat) {
    OJ delta = OJ::object();
    if (first) delta["role"] = "assistant";
    if (!d.text.empty() || first) delta["content"] = d.text;
    choice["delta"] = delta;
  } else {
    choice["text"] = d.text;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_value(d.finish_reason);
  OJ j;
  j["id"] = m.id;
  j["object"] = object_name(m.kind, true);
  j["created"] = m.created;
  j["model"] = m.model;
  j["choices"] = OJ::array({choice});
  return j;
}

OJ usage_chunk(const ResponseMeta& m, const UsageTotals& u) {
  OJ j;
  j["id"] = m.id;
  j["object"] = object_name(m.kind, true);
  j["created"] = m.created;
  j["model"] = m.model;
  j["choices"] = OJ::array();
  j["usage"] = usage_json(u);
  return j;
}

OJ full_response(const ResponseMeta& m, const std::vector<FinishedChoice>& choices, const UsageTotals& u) {
  OJ arr = OJ::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    OJ c;
    c["index"] = i;
    if (m.kind == ApiKind::kChat) {
      c["message"] = OJ{{"role", "assistant"}, {"content", choices[i].text}};
      if (choices[i].parsed)
        ChoiceOutput::fill_message(choices[i].text, choices[i].reasoning_content, choices[i].tool_calls, &c["message"]);
    } else {
      c["text"] = choices[i].text;
    }
    c["logprobs"] = choices[i].logprobs;
    c["finish_reason"] = finish_value(choices[i].finish_reason);
    if (!choices[i].prompt_logprobs.is_null()) c["prompt_logprobs"] = choices[i].prompt_logprobs;
    arr.push_back(std::move(c));
  }
  OJ j;
  j["id"] = m.id;
  j["object"] = object_name(m.kind, false);
  j["created"] = m.created;
  j["model"] = m.model;
  j["choices"] = arr;
  j["usage"] = usage_json(u);
  return j;
}

}  // namespace mxserve::server
