// Matcher (matcher.h): the byte-level transition function of every node kind, and the arena upkeep.
#include "structured/matcher.h"

#include <algorithm>
#include <unordered_map>

#include "core/check.h"
#include "core/hash.h"

namespace mxserve::structured {
namespace {

// Container phases (objects and arrays).
enum : uint8_t {
  kOpen = 0,        // expects '{' / '['
  kAfterOpen = 1,   // ws; a key / an item, or the close
  kKey = 2,         // object: inside the key
  kAfterKey = 3,    // object: expects ':'
  kAfterColon = 4,  // object: ws; the value (b = property index while it runs)
  kAfterValue = 5,  // ws; ',' or the close
  kAfterComma = 6,  // ws; a key / an item
};
// Root frame phases.
enum : uint8_t { kRootValue = 0, kRootDone = 1 };
// Number phases.
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumExp, kNumExpSign, kNumExpDigits };

bool is_ws(uint8_t x) { return x == ' ' || x == '\n'; }
bool is_digit(uint8_t x) { return x >= '0' && x <= '9'; }
bool is_hex(uint8_t x) { return is_digit(x) || (x >= 'a' && x <= 'f') || (x >= 'A' && x <= 'F'); }

}  // namespace

namespace string_lexer {
int next(int c, uint8_t x) {
  if (c == 0) {
    if (x == '"') return kStringEnd;
    if (x == '\\') return kEscape;
    if (x < 0x20) return -1;
    if (x < 0x80) return 0;
    if (x >= 0xC2 && x <= 0xDF) return 1;
    if (x == 0xE0) return 4;
    if (x == 0xED) return 5;
    if (x >= 0xE1 && x <= 0xEF) return 2;
    if (x == 0xF0) return 6;
    if (x >= 0xF1 && x <= 0xF3) return 3;
    if (x == 0xF4) return 7;
    return -1;
  }
  switch (c) {
    case 1: return x >= 0x80 && x <= 0xBF ? 0 : -1;
    case 2: return x >= 0x80 && x <= 0xBF ? 1 : -1;
    case 3: return x >= 0x80 && x <= 0xBF ? 2 : -1;
    case 4: return x >= 0xA0 && x <= 0xBF ? 1 : -1;
    case 5: return x >= 0x80 && x <= 0x9F ? 1 : -1;
    case 6: return x >= 0x90 && x <= 0xBF ? 2 : -1;
    case 7: return x >= 0x80 && x <= 0x8F ? 2 : -1;
    case kEscape:
      if (x == 'u') return kHex4;
      return (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' || x == 't') ? 0 : -1;
    default:
      if (c >= kHex4 && c <= kHex1) return is_hex(x) ? (c == kHex1 ? 0 : c + 1) : -1;
      return -1;
  }
}
}  // namespace string_lexer

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  frames_.push_back(Frame{});  // the root frame: node -1, phase kRootValue
  tops_ = {0};
}

int32_t Matcher::push(const Frame& f) {
  frames_.push_back(f);
  return static_cast<int32_t>(frames_.size()) - 1;
}

void Matcher::start(int32_t node, int32_t parent, uint16_t depth, uint8_t x, std::vector<int32_t>* out) {
  const Node& n = g_->nodes[node];
  if (!n.first_has(x)) return;
  if (n.kind == NodeKind::kAnyOf) {
    for (int32_t alt : n.alts) start(alt, parent, depth, x, out);
    return;
  }
  const bool container = n.kind == NodeKind::kObject || n.kind == NodeKind::kAnyObject || n.kind == NodeKind::kArray;
  if (container && depth >= kMaxDepth) return;
  Frame f;
  f.parent = parent;
  f.node = node;
  f.depth = static_cast<uint16_t>(depth + (container ? 1 : 0));
  if (n.kind == NodeKind::kLiterals) f.b = static_cast<int32_t>(n.literals.size());
  step(push(f), x, out);
}

int32_t Matcher::child_done(int32_t parent) {
  Frame p = frames_[parent];
  p.ws = 0;
  if (p.node < 0) {
    p.phase = kRootDone;
  } else {
    const NodeKind k = g_->nodes[p.node].kind;
    p.phase = kAfterValue;
    if (k == NodeKind::kObject) p.a = p.b + 1;
    else if (k == NodeKind::kArray) p.a += 1;
  }
  return push(p);
}

bool Matcher::may_complete(const Frame& f) const {
  if (f.node < 0) return false;
  const Node& n = g_->nodes[f.node];
  if (n.kind == NodeKind::kNumber || n.kind == NodeKind::kInteger)
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExpDigits;
  if (n.kind == NodeKind::kLiterals) return f.c > 0 && static_cast<int32_t>(n.literals[f.a].size()) == f.c;
  return false;
}

void Matcher::step(int32_t top, uint8_t x, std::vector<int32_t>* out) {
  const Frame f = frames_[top];  // a copy: push() may reallocate
  auto emit = [&](Frame nf) { out->push_back(push(nf)); };
  auto ws_or = [&](auto&& otherwise) {
    if (g_->json && is_ws(x) && f.ws < Grammar::kMaxWhitespace) {
      Frame nf = f;
      ++nf.ws;
      emit(nf);
      return;
    }
    otherwise();
  };
  if (f.node < 0) {  // the root frame
    if (f.phase == kRootValue) {
      ws_or([&] { start(g_->root, top, 0, x, out); });
    }
    return;
  }
  const Node& n = g_->nodes[f.node];
  if (may_complete(f)) step(child_done(f.parent), x, out);  // the value may end before x
  switch (n.kind) {
    case NodeKind::kString: {
      Frame nf = f;
      if (f.phase == 0) {
        if (x != '"') return;
        nf.phase = 1;
        nf.c = 0;
        emit(nf);
        return;
      }
      const int c = string_lexer::next(f.c, x);
      if (c < 0) return;
      if (c == string_lexer::kStringEnd) {
        out->push_back(child_done(f.parent));
        return;
      }
      nf.c = c;
      emit(nf);
      return;
    }
    case NodeKind::kNumber:
    case NodeKind::kInteger: {
      const bool integer = n.kind == NodeKind::kInteger;
      Frame nf = f;
      auto go = [&](uint8_t phase, int32_t digits) {
        nf.phase = phase;
        nf.c = digits;
        emit(nf);
      };
      switch (f.phase) {
        case kNumStart:
          if (x == '-') return go(kNumMinus, 0);
          [[fallthrough]];
        case kNumMinus:
          if (x == '0') return go(kNumZero, 1);
          if (x >= '1' && x <= '9') return go(kNumInt, 1);
          return;
        case kNumZero:
        case kNumInt:
          if (f.phase == kNumInt && is_digit(x) && f.c < Grammar::kMaxIntDigits) return go(kNumInt, f.c + 1);
          if (!integer && x == '.') return go(kNumDot, 0);
          if (!integer && (x == 'e' || x == 'E')) return go(kNumExp, 0);
          return;
        case kNumDot:
          if (is_digit(x)) return go(kNumFrac, 1);
          return;
        case kNumFrac:
          if (is_digit(x) && f.c < Grammar::kMaxFracDigits) return go(kNumFrac, f.c + 1);
          if (x == 'e' || x == 'E') return go(kNumExp, 0);
          return;
        case kNumExp:
          if (x == '+' || x == '-') return go(kNumExpSign, 0);
          [[fallthrough]];
        case kNumExpSign:
          if (is_digit(x)) return go(kNumExpDigits, 1);
          return;
        case kNumExpDigits:
          if (is_digit(x) && f.c < Grammar::kMaxExpDigits) return go(kNumExpDigits, f.c + 1);
          return;
      }
      return;
    }
    case NodeKind::kLiterals: {
      // [a, b): the literals sharing the first c bytes matched so far; sorted, so the ones whose byte c
      // is x are contiguous (a literal of length c, if any, comes first).
      const auto& lits = n.literals;
      int32_t lo = f.a + ((static_cast<int32_t>(lits[f.a].size()) == f.c) ? 1 : 0);
      auto byte_at = [&](int32_t i) { return static_cast<uint8_t>(lits[i][f.c]); };
      auto first = std::partition_point(lits.begin() + lo, lits.begin() + f.b,
                                        [&](const std::string& s) { return static_cast<uint8_t>(s[f.c]) < x; });
      const int32_t nlo = static_cast<int32_t>(first - lits.begin());
      if (nlo >= f.b || byte_at(nlo) != x) return;
      auto last = std::partition_point(lits.begin() + nlo, lits.begin() + f.b,
                                       [&](const std::string& s) { return static_cast<uint8_t>(s[f.c]) == x; });
      const int32_t nhi = static_cast<int32_t>(last - lits.begin());
      Frame nf = f;
      nf.a = nlo;
      nf.b = nhi;
      nf.c = f.c + 1;
      if (nhi - nlo == 1 && static_cast<int32_t>(lits[nlo].size()) == nf.c) {
        out->push_back(child_done(f.parent));  // exactly one literal, fully matched
        return;
      }
      emit(nf);
      return;
    }
    case NodeKind::kArray: {
      Frame nf = f;
      nf.ws = 0;
      auto start_item = [&](uint8_t waiting_phase) {
        nf.phase = waiting_phase;  // the parent waits in this phase; child_done moves it to kAfterValue
        const int32_t parent = push(nf);
        start(n.item, parent, f.depth, x, out);
      };
      switch (f.phase) {
        case kOpen:
          if (x == '[') {
            nf.phase = kAfterOpen;
            nf.a = 0;
            emit(nf);
          }
          return;
        case kAfterOpen:
          return ws_or([&] {
            if (x == ']' && n.min_items == 0) out->push_back(child_done(f.parent));
            else if (n.max_items != 0) start_item(kAfterOpen);
          });
        case kAfterValue:
          return ws_or([&] {
            if (x == ',' && (n.max_items < 0 || f.a < n.max_items)) {
              nf.phase = kAfterComma;
              emit(nf);
            } else if (x == ']' && f.a >= n.min_items) {
              out->push_back(child_done(f.parent));
            }
          });
        case kAfterComma:
          return ws_or([&] { start_item(kAfterComma); });
      }
      return;
    }
    case NodeKind::kObject:
    case NodeKind::kAnyObject: {
      const bool free_keys = n.kind == NodeKind::kAnyObject;
      const int32_t n_props = static_cast<int32_t>(n.props.size());
      auto required_left = [&](int32_t from) {
        for (int32_t j = from; j < n_props; ++j)
          if (n.props[j].required) return true;
        return false;
      };
      Frame nf = f;
      nf.ws = 0;
      auto open_key = [&]() {  // x == '"': one stack per candidate property (declared order)
        if (free_keys) {
          nf.phase = kKey;
          nf.c = 0;
          emit(nf);
          return;
        }
        for (int32_t j = f.a; j < n_props; ++j) {
          nf.phase = kKey;
          nf.b = j;
          nf.c = 1;
          emit(nf);
          if (n.props[j].required) break;
        }
      };
      auto can_close = [&]() { return free_keys || !required_left(f.a); };
      switch (f.phase) {
        case kOpen:
          if (x == '{') {
            nf.phase = kAfterOpen;
            nf.a = 0;
            emit(nf);
          }
          return;
        case kAfterOpen:
          return ws_or([&] {
            if (x == '"' && (free_keys || n_props > 0)) open_key();
            else if (x == '}' && can_close()) out->push_back(child_done(f.parent));
          });
        case kKey: {
          if (free_keys) {
            const int c = string_lexer::next(f.c, x);
            if (c < 0) return;
            nf.phase = c == string_lexer::kStringEnd ? kAfterKey : kKey;
            nf.c = c == string_lexer::kStringEnd ? 0 : c;
            emit(nf);
            return;
          }
          const std::string& key = n.props[f.b].key;
          if (static_cast<uint8_t>(key[f.c]) != x) return;
          nf.c = f.c + 1;
          if (nf.c == static_cast<int32_t>(key.size())) nf.phase = kAfterKey;
          emit(nf);
          return;
        }
        case kAfterKey:
          if (x == ':') {
            nf.phase = kAfterColon;
            emit(nf);
          }
          return;
        case kAfterColon:
          return ws_or([&] {
            const int32_t parent = push(nf);
            start(free_keys ? n.item : n.props[f.b].value, parent, f.depth, x, out);
          });
        case kAfterValue:
          return ws_or([&] {
            if (x == ',' && (free_keys || f.a < n_props)) {
              nf.phase = kAfterComma;
              emit(nf);
            } else if (x == '}' && can_close()) {
              out->push_back(child_done(f.parent));
            }
          });
        case kAfterComma:
          return ws_or([&] {
            if (x == '"') open_key();
          });
      }
      return;
    }
    case NodeKind::kAnyOf:
      MX_CHECK_MSG(false, "an anyOf node never has a frame");
  }
}

void Matcher::advance(std::span<const int32_t> tops, uint8_t x, std::vector<int32_t>* out) {
  out->clear();
  for (int32_t t : tops) {
    step(t, x, out);
    if (out->size() > kMaxStacks) out->resize(kMaxStacks);
  }
}

bool Matcher::stack_can_end(int32_t top) {
  for (;;) {
    const Frame f = frames_[top];  // a copy: child_done() may reallocate
    if (f.node < 0) return f.phase == kRootDone;
    if (!may_complete(f)) return false;
    top = child_done(f.parent);
  }
}

bool Matcher::can_end(std::span<const int32_t> tops) {
  const size_t m = mark();
  bool any = false;
  for (int32_t t : tops) any = any || stack_can_end(t);
  release(m);
  return any;
}

bool Matcher::can_end() { return can_end(tops_); }

bool Matcher::finished() {
  if (!can_end()) return false;
  // Complete, and no byte continues it.
  const size_t m = mark();
  std::vector<int32_t> next;
  bool cont = false;
  for (int b = 0; b < 256 && !cont; ++b) {
    advance(tops_, static_cast<uint8_t>(b), &next);
    cont = !next.empty();
    release(m);
  }
  return !cont;
}

int Matcher::string_mode(std::span<const int32_t> tops) const {
  int u = -1;
  for (int32_t t : tops) {
    const Frame& f = frames_[t];
    if (f.node < 0) return -1;
    const NodeKind k = g_->nodes[f.node].kind;
    const bool in_string = (k == NodeKind::kString && f.phase == 1) || (k == NodeKind::kAnyObject && f.phase == kKey);
    if (!in_string || f.c >= 8 || (u >= 0 && f.c != u)) return -1;
    u = f.c;
  }
  return u;
}

bool Matcher::accept(std::string_view bytes) {
  const size_t m = mark();
  std::vector<int32_t> cur = tops_, next;
  for (char ch : bytes) {
    advance(cur, static_cast<uint8_t>(ch), &next);
    if (next.empty()) {
      release(m);
      return false;
    }
    cur.swap(next);
  }
  tops_ = std::move(cur);
  compact();
  return true;
}

// Copies the frames reachable from the tops into a fresh arena, merging identical chains (hash-consing),
// so the arena stays the size of the live stacks and equal stacks collapse into one.
void Matcher::compact() {
  struct FrameHash {
    size_t operator()(const Frame& f) const {
      uint64_t h = mix64(static_cast<uint64_t>(f.parent) * 31 + static_cast<uint64_t>(f.node));
      h = mix64(h ^ (uint64_t{f.phase} << 8 | f.ws | uint64_t{f.depth} << 16));
      h = mix64(h ^ static_cast<uint32_t>(f.a) ^ (static_cast<uint64_t>(static_cast<uint32_t>(f.b)) << 32));
      return mix64(h ^ static_cast<uint32_t>(f.c));
    }
  };
  std::vector<Frame> fresh;
  std::unordered_map<Frame, int32_t, FrameHash> interned;
  std::vector<int32_t> memo(frames_.size(), -1);
  // Iterative: walk each chain up to the first already-copied frame, then copy downwards.
  std::vector<int32_t> chain;
  auto copy = [&](int32_t idx) {
    chain.clear();
    for (int32_t i = idx; i >= 0 && memo[i] < 0; i = frames_[i].parent) chain.push_back(i);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Frame f = frames_[*it];
      f.parent = f.parent < 0 ? -1 : memo[f.parent];
      auto [pos, inserted] = interned.try_emplace(f, static_cast<int32_t>(fresh.size()));
      if (inserted) fresh.push_back(f);
      memo[*it] = pos->second;
    }
    return memo[idx];
  };
  std::vector<int32_t> tops;
  for (int32_t t : tops_) tops.push_back(copy(t));
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  frames_ = std::move(fresh);
  tops_ = std::move(tops);
}

}  // namespace mxserve::structured
