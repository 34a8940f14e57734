// Decoder implementations (see decoder.h).
#include "tokenizer/decoder.h"

#include <cstdlib>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) {
      std::string bytes;
      size_t p = 0;
      bool ok = true;
      while (p < t.size()) {
        int b = unicode_to_byte(decode_utf8(t, p));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      all += ok ? bytes : t;  // tokens outside the byte alphabet (added tokens) pass through
    }
    tokens.assign(1, std::move(all));
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (const std::string& t : tokens) {
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') {
        const std::string hex = t.substr(3, 2);
        char* end = nullptr;
        long v = std::strtol(hex.c_str(), &end, 16);
        if (end == hex.c_str() + 2) {
          pending.push_back(static_cast<char>(v));
          continue;
        }
      }
      flush();
      out.push_back(t);
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0;
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0; ++k) b += content_.size();
      size_t e = t.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return;
    for (auto& t : tokens) {
      std::string out;
      size_t prev = 0;
      for (size_t p = t.find(from_); p != std::string::npos; p = t.find(from_, prev)) {
        out.append(t, prev, p - prev);
        out += to_;
        prev = p + from_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string repl, bool prepend) : repl_(std::move(repl)), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t prev = 0;
      for (size_t p = t.find(repl_); p != std::string::npos; p = t.find(repl_, prev)) {
        out.append(t, prev, p - prev);
        out += ' ';
        prev = p + repl_.size();
      }
      out.append(t, prev, std::string::npos);
      if (i == 0 && prepend_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string repl_;
  bool prepend_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string repl = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t prev = 0;
      for (size_t p = suffix_.empty() ? std::string::npos : t.find(suffix_); p != std::string::npos;
           p = t.find(suffix_, prev)) {
        out.append(t, prev, p - prev);
        out += repl;
        prev = p + suffix_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> s) : steps_(std::move(s)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

Result<std::unique_ptr<Decoder>> Decoder::from_json(const json& j) {
  using Ptr = std::unique_ptr<Decoder>;
  if (j.is_null()) return Ptr();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("decoder: expected an object with a string 'type'");
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return Ptr(new ByteLevelDecoder());
  if (type == "ByteFallback") return Ptr(new ByteFallbackDecoder());
  if (type == "Fuse") return Ptr(new FuseDecoder());
  if (type == "Strip") {
    if (!j.contains("content") || !j["content"].is_string()) return invalid_argument("decoder Strip: missing 'content'");
    return Ptr(new StripDecoder(j["content"].get<std::string>(), j.value("start", 0u), j.value("stop", 0u)));
  }
  if (type == "Replace") {
    if (!j.contains("pattern") || !j["pattern"].is_object() || !j["pattern"].contains("String") ||
        !j["pattern"]["String"].is_string() || !j.contains("content") || !j["content"].is_string())
      return unsupported("decoder Replace: only {\"String\": ...} patterns are supported");
    return Ptr(new ReplaceDecoder(j["pattern"]["String"].get<std::string>(), j["content"].get<std::string>()));
  }
  if (type == "Metaspace") {
    std::string repl = j.value("replacement", std::string("\xE2\x96\x81"));
    bool prepend = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      prepend = j["prepend_scheme"].get<std::string>() != "never";
    else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean())
      prepend = j["add_prefix_space"].get<bool>();
    if (repl.empty()) return invalid_argument("decoder Metaspace: empty replacement");
    return Ptr(new MetaspaceDecoder(repl, prepend));
  }
  if (type == "BPEDecoder") return Ptr(new BpeSuffixDecoder(j.value("suffix", std::string("</w>"))));
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array())
      return invalid_argument("decoder Sequence: missing array 'decoders'");
    std::vector<Ptr> steps;
    for (const json& s : j["decoders"]) {
      MX_ASSIGN_OR_RETURN(auto d, Decoder::from_json(s));
      if (d) steps.push_back(std::move(d));
    }
    return Ptr(new SequenceDecoder(std::move(steps)));
  }
  return unsupported("decoder type '" + type + "' is not supported");
}

}  // namespace mxserve::tokenizer
