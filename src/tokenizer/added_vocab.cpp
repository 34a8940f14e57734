// Added-token matching (see added_vocab.h).
#include "tokenizer/added_vocab.h"

#include <unicode/uchar.h>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

Status AddedVocab::load(const json& added) {
  tokens_.clear();
  for (auto& t : tries_) {
    t.nodes.assign(1, Trie::Node{});
    std::fill(std::begin(t.first_byte), std::end(t.first_byte), false);
  }
  if (added.is_null()) return Status::ok();
  if (!added.is_array()) return invalid_argument("added_tokens: expected an array");
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      return invalid_argument("added_tokens: each entry needs integer 'id' and string 'content'");
    AddedToken t;
    t.content = a["content"].get<std::string>();
    int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX / 2) return invalid_argument("added_tokens: id out of range for '" + t.content + "'");
    if (t.content.empty()) return invalid_argument("added_tokens: empty content for id " + std::to_string(id));
    if (!is_valid_utf8(t.content)) return invalid_argument("added_tokens: content is not valid UTF-8");
    t.id = static_cast<int32_t>(id);
    auto flag = [&](const char* k) { return a.contains(k) && a[k].is_boolean() && a[k].get<bool>(); };
    t.special = flag("special");
    t.lstrip = flag("lstrip");
    t.rstrip = flag("rstrip");
    t.single_word = flag("single_word");
    // HF default: normalized unless special.
    t.normalized = a.contains("normalized") && a["normalized"].is_boolean() ? a["normalized"].get<bool>() : !t.special;
    if (by_content_.count(t.content)) continue;
    by_content_[t.content] = t.id;
    by_id_[t.id] = tokens_.size();
    tokens_.push_back(t);
    insert(tries_[t.normalized ? 1 : 0], static_cast<int32_t>(tokens_.size() - 1));
  }
  return Status::ok();
}

void AddedVocab::insert(Trie& t, int32_t index) {
  const std::string& s = tokens_[index].content;
  int32_t node = 0;
  t.first_byte[static_cast<unsigned char>(s[0])] = true;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    auto it = t.nodes[node].next.find(c);
    if (it == t.nodes[node].next.end()) {
      t.nodes.push_back(Trie::Node{});
      int32_t nn = static_cast<int32_t>(t.nodes.size() - 1);
      t.nodes[node].next[c] = nn;
      node = nn;
    } else {
      node = it->second;
    }
  }
  t.nodes[node].token = index;
}

namespace {
bool is_word_cp(char32_t cp) { return cp == '_' || u_isalnum(static_cast<UChar32>(cp)) || u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC); }
}  // namespace

bool AddedVocab::word_char_before(std::string_view text, size_t pos) const {
  if (pos == 0) return false;
  size_t s = pos - 1;
  while (s > 0 && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
  return is_word_cp(decode_utf8(text, s));
}

bool AddedVocab::word_char_after(std::string_view text, size_t pos) const {
  if (pos >= text.size()) return false;
  return is_word_cp(decode_utf8(text, pos));
}

void AddedVocab::split(std::string_view text, bool normalized_class, std::vector<Segment>& out) const {
  const Trie& t = tries_[normalized_class ? 1 : 0];
  size_t seg_start = 0;
  size_t i = 0;
  const size_t n = text.size();
  if (t.nodes.size() <= 1) {
    if (n > 0) out.push_back({text, -1});
    return;
  }
  while (i < n) {
    if (!t.first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest match starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < n; ++j) {
      auto it = t.nodes[node].next.find(static_cast<unsigned char>(text[j]));
      if (it == t.nodes[node].next.end()) break;
      node = it->second;
      if (t.nodes[node].token >= 0) {
        const AddedToken& tok = tokens_[t.nodes[node].token];
        if (!tok.single_word || (!word_char_before(text, i) && !word_char_after(text, j + 1))) {
          best = t.nodes[node].token;
          best_end = j + 1;
        }
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    size_t ms = i, me = best_end;
    if (tok.lstrip) {
      while (ms > seg_start) {
        size_t s = ms - 1;
        while (s > seg_start && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t p = s;
        if (!is_unicode_whitespace(decode_utf8(text, p))) break;
        ms = s;
      }
    }
    if (tok.rstrip) {
      while (me < n) {
        size_t p = me;
        if (!is_unicode_whitespace(decode_utf8(text, p))) break;
        me = p;
      }
    }
    if (ms > seg_start) out.push_back({text.substr(seg_start, ms - seg_start), -1});
    out.push_back({std::string_view(), tok.id});
    seg_start = me;
    i = me;
  }
  if (seg_start < n) out.push_back({text.substr(seg_start), -1});
}

std::optional<int32_t> AddedVocab::token_to_id(std::string_view s) const {
  auto it = by_content_.find(std::string(s));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace mxserve::tokenizer
