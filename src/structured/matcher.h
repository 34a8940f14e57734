// Matcher: the incremental state of one output against a Grammar, advanced byte by byte. The state is a
// set of stacks (a pushdown automaton run nondeterministically: anyOf, optional properties and
// "this number may end here" fork it). Stacks are chains of immutable Frames in an arena, shared by
// their tails, so a step creates only the frames it changes and a trial step (the token-mask walk) is
// undone by truncating the arena (mark / release).
// Invariant: every stack in the state is alive -- it can be completed (the grammar's nodes are all
// productive) -- so a non-empty state never dead-ends. accept() is all-or-nothing.
// Not thread-safe; one per request (clone for speculation).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace mxserve::structured {

struct Frame {
  int32_t parent = -1;  // frame index; -1: none (the root frame)
  int32_t node = -1;    // grammar node; -1: the root frame
  uint8_t phase = 0;
  uint8_t ws = 0;       // whitespace bytes consumed in the current gap
  uint16_t depth = 0;   // container nesting
  int32_t a = 0, b = 0, c = 0;  // per kind: property index / item count / literal range / lexer state
  bool operator==(const Frame&) const = default;
};

class Matcher {
 public:
  static constexpr size_t kMaxStacks = 256;   // beyond this a fork keeps the first ones (still sound)
  static constexpr uint16_t kMaxDepth = 100;  // containers nested deeper are not started

  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Consumes `bytes`; false (state unchanged) when the grammar does not allow them.
  bool accept(std::string_view bytes);
  // True when the output so far is a complete document.
  bool can_end();
  // True when nothing more can follow (complete and no continuation).
  bool finished();
  const Grammar& grammar() const { return *g_; }

  // --- the token-mask walk (mask.cpp) ---
  const std::vector<int32_t>& tops() const { return tops_; }
  size_t mark() const { return frames_.size(); }
  void release(size_t mark) { frames_.resize(mark); }
  // out = every stack of `tops` advanced by byte x (frames appended to the arena; release() undoes).
  void advance(std::span<const int32_t> tops, uint8_t x, std::vector<int32_t>* out);
  bool can_end(std::span<const int32_t> tops);
  // The plain-text mode of a state, or -1. Mode u in [0, 8): every stack's top is inside a free JSON
  // string (no escape or '<' pending) with UTF-8 decoder state u (mode 16 + u in tag-safe grammars).
  // Mode 8 + u: every top is inside raw text (kRawText) with no delimiter partly matched, decoder state
  // u. Such a state accepts any run of that mode's plain bytes (token_index.h).
  int string_mode(std::span<const int32_t> tops) const;

  // --- closing (matcher_closing.cpp) ---
  // The fewest bytes that complete the output from the current state (0 when it can end), and one
  // byte string of that length that does; nullopt when the state is empty.
  std::optional<int64_t> min_finish_bytes();
  std::optional<std::string> shortest_completion();

 private:
  int32_t push(const Frame& f);
  void step(int32_t top, uint8_t x, std::vector<int32_t>* out);
  void start(int32_t node, int32_t parent, uint16_t depth, uint8_t x, std::vector<int32_t>* out);
  int32_t child_done(int32_t parent);  // the parent frame once its current child value has ended
  int string_next(int c, uint8_t x) const;  // string_lexer::next, with the tag-safe rule
  void step_tag_object(int32_t top, const Frame& f, const Node& n, uint8_t x, std::vector<int32_t>* out);
  bool may_complete(const Frame& f) const;
  int64_t own_rem(const Frame& f) const;      // fewest bytes that finish frame f's node from its state
  int64_t stack_finish(int32_t top);          // fewest bytes that finish the whole stack
  int64_t min_finish(std::span<const int32_t> tops);
  bool stack_can_end(int32_t top);
  void compact();

  std::shared_ptr<const Grammar> g_;
  std::vector<Frame> frames_;
  std::vector<int32_t> tops_;
};

// The JSON string lexer shared by values and free keys. State c: 0..7 UTF-8 decoder states (0: between
// characters), kEscape after '\', kHex4..kHex1 inside \uXXXX. Returns the next state, kStringEnd for
// the closing quote, or -1 (not allowed).
namespace string_lexer {
constexpr int kEscape = 16, kHex4 = 17, kHex1 = 20, kStringEnd = 99;
int next(int c, uint8_t x);
}  // namespace string_lexer

// Raw text (kRawText): valid UTF-8, any ASCII byte from 0x20 plus tab, newline and carriage return.
// State c: the UTF-8 decoder states 0..7 of string_lexer. Returns the next state or -1.
namespace raw_lexer {
int next(int c, uint8_t x);
}  // namespace raw_lexer

}  // namespace mxserve::structured
