// Post-processor implementations (see post_processor.h).
#include "tokenizer/post_processor.h"

#include <string>

namespace mxserve::tokenizer {

using nlohmann::json;

namespace {

// Template: a list of fixed id runs with one slot for the sequence.
class TemplatePostProcessor final : public PostProcessor {
 public:
  TemplatePostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> s) : steps_(std::move(s)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps_) s->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

Result<int32_t> pair_id(const json& j, const char* field) {
  // "cls": ["<s>", 0]
  if (!j.contains(field) || !j[field].is_array() || j[field].size() != 2 || !j[field][1].is_number_integer())
    return invalid_argument(std::string("post_processor: '") + field + "' must be [token, id]");
  return static_cast<int32_t>(j[field][1].get<int64_t>());
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> PostProcessor::from_json(const json& j) {
  using Ptr = std::unique_ptr<PostProcessor>;
  if (j.is_null()) return Ptr();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("post_processor: expected an object with a string 'type'");
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return Ptr();  // only trims offsets; ids are unchanged
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    MX_ASSIGN_OR_RETURN(int32_t cls, pair_id(j, "cls"));
    MX_ASSIGN_OR_RETURN(int32_t sep, pair_id(j, "sep"));
    return Ptr(new TemplatePostProcessor({cls}, {sep}));
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array())
      return invalid_argument("post_processor TemplateProcessing: missing array 'single'");
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (const json& item : j["single"]) {
      if (item.contains("Sequence")) {
        if (seen_sequence) return unsupported("post_processor TemplateProcessing: more than one sequence slot");
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string())
        return invalid_argument("post_processor TemplateProcessing: item is neither Sequence nor SpecialToken");
      std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array())
        return invalid_argument("post_processor TemplateProcessing: special token '" + name + "' has no ids");
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return invalid_argument("post_processor TemplateProcessing: non-integer id");
        (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    return Ptr(new TemplatePostProcessor(std::move(before), std::move(after)));
  }
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      return invalid_argument("post_processor Sequence: missing array 'processors'");
    std::vector<Ptr> steps;
    for (const json& s : j["processors"]) {
      MX_ASSIGN_OR_RETURN(auto p, PostProcessor::from_json(s));
      if (p) steps.push_back(std::move(p));
    }
    return Ptr(new SequencePostProcessor(std::move(steps)));
  }
  return unsupported("post_processor type '" + type + "' is not supported");
}

}  // namespace mxserve::tokenizer
