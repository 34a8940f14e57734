// Tokenizer facade (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

namespace {
Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<json> parse_json(std::string_view text, const std::string& what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(what + " is not valid JSON");
  return j;
}

// bos_token / eos_token: a string or {"content": ...} (AddedToken form).
std::optional<std::string> token_field(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}
}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  MX_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto r = from_json_text(text);
  if (!r.is_ok()) return r.status().with_context("loading " + path);
  return r;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  MX_ASSIGN_OR_RETURN(std::string text, read_file((fs::path(dir) / "tokenizer.json").string()));
  std::string config_text;
  fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    MX_ASSIGN_OR_RETURN(config_text, read_file(config_path.string()));
  }
  auto r = from_json_text(text, config_text);
  if (!r.is_ok()) return r.status().with_context("loading " + dir);
  fs::path tmpl = fs::path(dir) / "chat_template.jinja";
  if (r.value()->chat_template_.empty() && fs::exists(tmpl)) {
    MX_ASSIGN_OR_RETURN(r.value()->chat_template_, read_file(tmpl.string()));
  }
  return r;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view tokenizer_json,
                                                             std::string_view config_json) {
  // Component loaders check types where it matters; a wrong-typed optional field that slips
  // through surfaces as a JSON exception, reported here instead of escaping the boundary.
  try {
    return from_json_text_unchecked(tokenizer_json, config_json);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("malformed tokenizer JSON: ") + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text_unchecked(std::string_view tokenizer_json,
                                                                       std::string_view config_json) {
  MX_ASSIGN_OR_RETURN(json j, parse_json(tokenizer_json, "tokenizer.json"));
  if (!j.is_object()) return invalid_argument("tokenizer.json: top level is not an object");
  if (!j.contains("model")) return invalid_argument("tokenizer.json: missing 'model'");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto field = [&](const char* k) { return j.contains(k) ? j[k] : json(); };
  MX_ASSIGN_OR_RETURN(t->normalizer_, Normalizer::from_json(field("normalizer")));
  MX_ASSIGN_OR_RETURN(t->pre_tokenizer_, PreTokenizer::from_json(field("pre_tokenizer")));
  bool byte_level = t->pre_tokenizer_ && t->pre_tokenizer_->ends_with_byte_level();
  if (t->pre_tokenizer_ && t->pre_tokenizer_->has_inner_byte_level())
    return unsupported("pre_tokenizer: ByteLevel must be the last step of a Sequence");
  MX_ASSIGN_OR_RETURN(t->model_, BpeModel::from_json(j["model"], byte_level));
  t->added_ = std::make_unique<AddedVocab>();
  MX_RETURN_IF_ERROR(t->added_->load(field("added_tokens")));
  MX_ASSIGN_OR_RETURN(t->post_processor_, PostProcessor::from_json(field("post_processor")));
  MX_ASSIGN_OR_RETURN(t->decoder_, Decoder::from_json(field("decoder")));
  t->vocab_size_ = t->model_->max_id() + 1;
  for (const AddedToken& a : t->added_->tokens()) t->vocab_size_ = std::max(t->vocab_size_, a.id + 1);
  if (!config_json.empty()) {
    MX_ASSIGN_OR_RETURN(json c, parse_json(config_json, "tokenizer_config.json"));
    MX_RETURN_IF_ERROR(t->apply_config(c));
  }
  return t;
}

Status Tokenizer::apply_config(const json& config) {
  if (!config.is_object()) return invalid_argument("tokenizer_config.json: top level is not an object");
  config_ = config;
  if (config.contains("chat_template")) {
    const json& ct = config["chat_template"];
    if (ct.is_string()) {
      chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const json& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          chat_template_ = e["template"].get<std::string>();
    }
  }
  bos_token_ = token_field(config, "bos_token");
  eos_token_ = token_field(config, "eos_token");
  return Status::ok();
}

void Tokenizer::set_cache_enabled(bool on) { model_->set_cache_enabled(on); }

Status Tokenizer::encode_normalized(std::string_view text, bool first_section, std::vector<int32_t>& out) const {
  thread_local std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  pieces.clear();
  pieces.push_back(text);
  if (pre_tokenizer_) MX_RETURN_IF_ERROR(pre_tokenizer_->apply(pieces, PreTokenizeContext{&arena, first_section}));
  for (std::string_view p : pieces) MX_RETURN_IF_ERROR(model_->encode_word(p, out));
  return Status::ok();
}

Status Tokenizer::encode_section(std::string_view text, bool first_section, std::vector<int32_t>& out) const {
  std::string normalized;
  std::string_view view = text;
  if (normalizer_) {
    normalized.assign(text);
    MX_RETURN_IF_ERROR(normalizer_->normalize(normalized));
    view = normalized;
  }
  if (view.empty()) return Status::ok();
  if (!added_->has_normalized_tokens()) return encode_normalized(view, first_section, out);
  std::vector<Segment> segs;
  added_->split(view, /*normalized_class=*/true, segs);
  for (const Segment& s : segs) {
    if (s.token_id >= 0) {
      out.push_back(s.token_id);
    } else {
      MX_RETURN_IF_ERROR(encode_normalized(s.text, first_section && s.text.data() == view.data(), out));
    }
  }
  return Status::ok();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (text.size() > kMaxInputBytes)
    return invalid_argument("input of " + std::to_string(text.size()) + " bytes exceeds the tokenizer limit of " +
                            std::to_string(kMaxInputBytes) + " bytes");
  size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    return invalid_argument("input is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Segment> segs;
  added_->split(text, /*normalized_class=*/false, segs);
  for (const Segment& s : segs) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
    } else {
      MX_RETURN_IF_ERROR(encode_section(s.text, s.text.data() == text.data(), ids));
    }
  }
  if (add_special_tokens && post_processor_) post_processor_->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = added_->by_id(id)) {
      if (skip_special_tokens && a->special) continue;
      tokens.push_back(a->content);
      continue;
    }
    if (const std::string* t = model_->id_to_token(id)) tokens.push_back(*t);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
  }
  return utf8_lossy(out);
}

int32_t Tokenizer::vocab_size() const { return vocab_size_; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_->token_to_id(token)) return id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = added_->by_id(id)) return a->content;
  if (const std::string* t = model_->id_to_token(id)) return *t;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  std::vector<std::string> tokens;
  if (const AddedToken* a = added_->by_id(id)) {
    if (a->special) return std::nullopt;
    tokens.push_back(a->content);
  } else if (const std::string* t = model_->id_to_token(id)) {
    tokens.push_back(*t);
  } else {
    return std::nullopt;
  }
  if (decoder_) decoder_->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = added_->by_id(id);
  return a != nullptr && a->special;
}

}  // namespace mxserve::tokenizer
