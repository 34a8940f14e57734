#include "chat/reasoning_parser.h"

#include "chat/text_scan.h"

namespace mxserve::chat {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningDelta ReasoningParser::feed(std::string_view chunk) {
  pending_.append(chunk);
  ReasoningDelta out;
  for (;;) {
    if (state_ == State::kStart) {
      size_t first = 0;
      while (first < pending_.size() && is_space(pending_[first])) ++first;
      const std::string_view rest = std::string_view(pending_).substr(first);
      if (rest.empty()) return out;  // only whitespace so far: undecided
      if (rest.starts_with(kOpen)) {
        pending_.erase(0, first + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (kOpen.starts_with(rest)) return out;  // "<thi": undecided
      state_ = State::kContent;                  // the turn has no think block
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t end = pending_.find(kClose);
      if (end != std::string::npos) {
        out.reasoning.append(pending_, 0, end);
        pending_.erase(0, end + kClose.size());
        state_ = State::kContent;
        continue;
      }
      const size_t keep = partial_tag_suffix(pending_, kClose);
      out.reasoning.append(pending_, 0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.content += pending_;
    pending_.clear();
    return out;
  }
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (state_ == State::kReasoning) out.reasoning = std::move(pending_);
  else out.content = std::move(pending_);
  pending_.clear();
  return out;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kOpen);
}

}  // namespace mxserve::chat
