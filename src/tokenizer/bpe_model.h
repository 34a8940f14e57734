// BpeModel: the BPE "model" section of tokenizer.json -- vocab, merges (both "a b" strings and
// ["a","b"] pairs), ignore_merges, byte_fallback, unk/fuse_unk, subword prefix/suffix.
// Owns: turning one pre-tokenized word into ids. In byte-level mode (the pre-tokenizer ends with
// ByteLevel) words are raw UTF-8 bytes and the vocab is translated out of the GPT-2 alphabet at
// load time, so no per-word remapping happens at encode time.
// Invariant: merge (a, b) -> (rank, merged id) where a, b and a+b are all vocab entries.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map (a, b) -> (rank, merged id); the BPE inner loop's only lookup.
class MergeTable {
 public:
  void build(const std::vector<std::array<int32_t, 4>>& merges);  // {a, b, rank, new_id}
  // Returns false when (a, b) is not a merge.
  bool find(int32_t a, int32_t b, int32_t& rank, int32_t& new_id) const {
    if (mask_ == 0) return false;
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        new_id = s.new_id;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, new_id = 0;
  };
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20); }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

class BpeModel {
 public:
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, bool byte_level);

  // Appends the ids of one word. Fails only when a symbol is unknown and no unk token exists.
  Status encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // Token strings in the tokenizer.json representation (GPT-2 alphabet for byte-level models).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_level() const { return byte_level_; }
  void set_cache_enabled(bool on) { cache_enabled_ = on; }

 private:
  void merge_symbols(std::vector<int32_t>& syms) const;
  Status initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;

  StringIdMap vocab_;                      // tokenizer.json representation
  std::vector<std::string> id_to_token_;   // "" for holes
  StringIdMap word_vocab_;                 // representation of words (raw bytes in byte mode)
  std::array<int32_t, 256> byte_ids_{};    // byte mode: id of each single byte, -1 if absent
  std::array<int32_t, 256> fallback_ids_{};  // <0xXX> tokens for byte_fallback, -1 if absent
  MergeTable merges_;
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  // Word -> ids cache for short words. Guarded by try_lock: a busy cache is skipped, never waited on.
  bool cache_enabled_ = true;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace mxserve::tokenizer
