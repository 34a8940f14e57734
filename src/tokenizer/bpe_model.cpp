// BPE model (see bpe_model.h).
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <queue>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

namespace {
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 20000;
constexpr size_t kNaiveMergeLimit = 48;  // symbols; above this the heap algorithm is used

// Maps a GPT-2-alphabet string to raw bytes; false when a char is not in the alphabet.
bool from_byte_alphabet(std::string_view s, std::string& out) {
  out.clear();
  size_t p = 0;
  while (p < s.size()) {
    int b = unicode_to_byte(decode_utf8(s, p));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}
}  // namespace

void MergeTable::build(const std::vector<std::array<int32_t, 4>>& merges) {
  size_t cap = 16;
  while (cap < merges.size() * 2 + 1) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (const auto& m : merges) {
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m[0])) << 32) | static_cast<uint32_t>(m[1]);
    size_t i = hash(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == key) continue;  // duplicate merge: the first (lowest rank) wins
    slots_[i] = Slot{key, m[2], m[3]};
  }
}

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const json& model, bool byte_level) {
  if (!model.is_object()) return invalid_argument("model: expected an object");
  std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") return unsupported("model type '" + type + "' is not supported (only BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return invalid_argument("model: missing object 'vocab'");
  if (!model.contains("merges") || !model["merges"].is_array())
    return invalid_argument("model: missing array 'merges'");
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    return unsupported("model: BPE dropout is not supported");

  auto m = std::make_unique<BpeModel>();
  m->byte_level_ = byte_level;
  auto get_bool = [&](const char* k) { return model.contains(k) && model[k].is_boolean() && model[k].get<bool>(); };
  auto get_str = [&](const char* k) {
    return model.contains(k) && model[k].is_string() ? model[k].get<std::string>() : std::string();
  };
  m->ignore_merges_ = get_bool("ignore_merges");
  m->byte_fallback_ = get_bool("byte_fallback");
  m->fuse_unk_ = get_bool("fuse_unk");
  m->continuing_subword_prefix_ = get_str("continuing_subword_prefix");
  m->end_of_word_suffix_ = get_str("end_of_word_suffix");
  if (byte_level && (!m->continuing_subword_prefix_.empty() || !m->end_of_word_suffix_.empty()))
    return unsupported("model: subword prefix/suffix with a ByteLevel pre-tokenizer");

  const json& vocab = model["vocab"];
  m->vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) return invalid_argument("model: vocab id for '" + it.key() + "' is not an integer");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX / 2) return invalid_argument("model: vocab id out of range for '" + it.key() + "'");
    m->vocab_.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : m->vocab_) m->id_to_token_[id] = tok;

  m->byte_ids_.fill(-1);
  m->fallback_ids_.fill(-1);
  if (byte_level) {
    std::string raw;
    m->word_vocab_.reserve(m->vocab_.size());
    for (const auto& [tok, id] : m->vocab_) {
      if (!from_byte_alphabet(tok, raw)) continue;  // e.g. special tokens stored in the vocab
      m->word_vocab_.emplace(raw, id);
      if (raw.size() == 1) m->byte_ids_[static_cast<unsigned char>(raw[0])] = id;
    }
  } else {
    m->word_vocab_ = m->vocab_;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = m->vocab_.find(std::string_view(name));
      if (it != m->vocab_.end()) m->fallback_ids_[b] = it->second;
    }
  }

  std::string unk = get_str("unk_token");
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) return invalid_argument("model: unk_token '" + unk + "' is not in the vocab");
    m->unk_id_ = it->second;
  }

  const json& merges = model["merges"];
  std::vector<std::array<int32_t, 4>> table;
  table.reserve(merges.size());
  std::string a, b, ra, rb;
  const std::string& prefix = m->continuing_subword_prefix_;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& e = merges[rank];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return invalid_argument("model: merge '" + s + "' has no space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return invalid_argument("model: merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    // The merged token drops b's continuing-subword prefix.
    std::string merged = a + (!prefix.empty() && b.rfind(prefix, 0) == 0 ? b.substr(prefix.size()) : b);
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), im = m->vocab_.find(merged);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || im == m->vocab_.end())
      return invalid_argument("model: merge '" + a + " " + b + "' uses a token missing from the vocab");
    table.push_back({ia->second, ib->second, static_cast<int32_t>(rank), im->second});
  }
  m->merges_.build(table);
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || id_to_token_[id].empty()) return nullptr;
  return &id_to_token_[id];
}

Status BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  syms.clear();
  auto push_unk = [&]() -> Status {
    if (!unk_id_) return invalid_argument("BPE: a symbol is not in the vocab and the model has no unk_token");
    if (fuse_unk_ && !syms.empty() && syms.back() == *unk_id_) return Status::ok();
    syms.push_back(*unk_id_);
    return Status::ok();
  };
  if (byte_level_) {
    for (char c : word) {
      int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id < 0) {
        MX_RETURN_IF_ERROR(push_unk());
      } else {
        syms.push_back(id);
      }
    }
    return Status::ok();
  }
  size_t pos = 0;
  std::string key;
  while (pos < word.size()) {
    size_t start = pos;
    pos += utf8_seq_len(static_cast<unsigned char>(word[pos]));
    if (pos > word.size()) pos = word.size();
    key.clear();
    if (start > 0) key += continuing_subword_prefix_;
    key.append(word.substr(start, pos - start));
    if (pos == word.size()) key += end_of_word_suffix_;
    auto it = word_vocab_.find(key);
    if (it != word_vocab_.end()) {
      syms.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = start; k < pos; ++k) all = all && fallback_ids_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        for (size_t k = start; k < pos; ++k) syms.push_back(fallback_ids_[static_cast<unsigned char>(word[k])]);
        continue;
      }
    }
    MX_RETURN_IF_ERROR(push_unk());
  }
  return Status::ok();
}

void BpeModel::merge_symbols(std::vector<int32_t>& syms) const {
  const size_t n = syms.size();
  if (n < 2) return;
  int32_t rank, new_id;
  if (n <= kNaiveMergeLimit) {
    // ranks[i] describes the pair (syms[i], syms[i+1]); INT_MAX when it is not a merge.
    std::array<int32_t, kNaiveMergeLimit> ranks, ids;
    size_t len = n;
    for (size_t i = 0; i + 1 < len; ++i) {
      if (merges_.find(syms[i], syms[i + 1], rank, new_id)) {
        ranks[i] = rank;
        ids[i] = new_id;
      } else {
        ranks[i] = INT32_MAX;
      }
    }
    while (len > 1) {
      size_t best = 0;
      int32_t best_rank = INT32_MAX;
      for (size_t i = 0; i + 1 < len; ++i)
        if (ranks[i] < best_rank) best_rank = ranks[i], best = i;
      if (best_rank == INT32_MAX) break;
      syms[best] = ids[best];
      for (size_t i = best + 1; i + 1 < len; ++i) {
        syms[i] = syms[i + 1];
        ranks[i] = ranks[i + 1];
        ids[i] = ids[i + 1];
      }
      --len;
      auto refresh = [&](size_t i) {
        if (i + 1 >= len) return;
        if (merges_.find(syms[i], syms[i + 1], rank, new_id)) {
          ranks[i] = rank;
          ids[i] = new_id;
        } else {
          ranks[i] = INT32_MAX;
        }
      };
      if (best > 0) refresh(best - 1);
      refresh(best);
    }
    syms.resize(len);
    return;
  }
  // Heap algorithm over a linked list of symbols; entries are validated when popped.
  struct Entry {
    int32_t rank;
    int32_t pos;
    int32_t left, right, new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    int32_t j = next[i];
    if (j < 0) return;
    if (merges_.find(syms[i], syms[j], rank, new_id)) heap.push({rank, i, syms[i], syms[j], new_id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    int32_t i = e.pos;
    if (!alive[i] || syms[i] != e.left) continue;
    int32_t j = next[i];
    if (j < 0 || syms[j] != e.right) continue;
    syms[i] = e.new_id;
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

Status BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return Status::ok();
  if (ignore_merges_) {
    auto it = word_vocab_.find(word);
    if (it != word_vocab_.end()) {
      out.push_back(it->second);
      return Status::ok();
    }
  }
  const bool cacheable = cache_enabled_ && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return Status::ok();
      }
    }
  }
  thread_local std::vector<int32_t> syms;
  MX_RETURN_IF_ERROR(initial_symbols(word, syms));
  merge_symbols(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (cache_.size() >= kCacheCapacity) cache_.clear();
      cache_.emplace(std::string(word), syms);
    }
  }
  return Status::ok();
}

}  // namespace mxserve::tokenizer
