// Matcher (matcher.h): the byte-level transition function of every node kind, and the arena upkeep.
#include "structured/matcher.h"

#include <algorithm>
#include <unordered_map>

#include "core/check.h"
#include "core/hash.h"
#include "structured/matcher_phases.h"

namespace mxserve::structured {
using namespace phases;  // NOLINT: the phase names are this file's vocabulary
namespace {

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

namespace raw_lexer {
int next(int c, uint8_t x) {
  if (c == 0 && x < 0x80) return (x >= 0x20 || x == '\t' || x == '\n' || x == '\r') ? 0 : -1;
  const int n = string_lexer::next(c, x);
  return n >= 0 && n < 8 ? n : -1;
}
}  // namespace raw_lexer

namespace {

// Raw text delimiters: the state is (literal p, l bytes of it matched), the longest suffix of the text
// that is a prefix of a delimiter. Returns the state after x, or sets *complete to the literal that x
// completes (-1: none). A literal ending at x is a suffix of (tracked text + x), so none is missed.
int32_t delimiter_step(const std::vector<std::string>& lits, int32_t state, uint8_t x, int* complete) {
  const int p = state >> 8, l = state & 255;
  std::string text = lits[p].substr(0, static_cast<size_t>(l));
  text += static_cast<char>(x);
  *complete = -1;
  for (size_t q = 0; q < lits.size(); ++q)
    if (text.size() >= lits[q].size() && text.compare(text.size() - lits[q].size(), lits[q].size(), lits[q]) == 0) {
      if (q > 0 || *complete < 0) *complete = static_cast<int>(q);  // a forbidden literal wins
    }
  if (*complete >= 0) return 0;
  for (size_t k = text.size(); k > 0; --k)
    for (size_t q = 0; q < lits.size(); ++q)
      if (lits[q].size() > k && lits[q].compare(0, k, text, text.size() - k, k) == 0)
        return static_cast<int32_t>(q << 8 | k);
  return 0;
}

}  // namespace

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
  if (n.kind == NodeKind::kDfaText) f.phase = 1;
  step(push(f), x, out);
}

int32_t Matcher::child_done(int32_t parent) {
  Frame p = frames_[parent];
  p.ws = 0;
  if (p.node < 0) {
    p.phase = kRootDone;
    return push(p);
  }
  const Node& n = g_->nodes[p.node];
  switch (n.kind) {
    case NodeKind::kSequence:  // the last item done: the sequence is done (no frame waits for nothing)
      if (++p.a == static_cast<int32_t>(n.alts.size())) return child_done(p.parent);
      return push(p);
    case NodeKind::kRepeat:
      if (++p.a == n.max_items) return child_done(p.parent);
      return push(p);
    case NodeKind::kTagObject:
      p.phase = kTagBetween;
      if (n.ordered) p.a = p.b + 1;
      else p.a = static_cast<int32_t>(static_cast<uint32_t>(p.a) | (1u << p.b));
      return push(p);
    default:
      p.phase = kAfterValue;
      if (n.kind == NodeKind::kObject) p.a = p.b + 1;
      else if (n.kind == NodeKind::kArray) p.a += 1;
      return push(p);
  }
}

bool Matcher::may_complete(const Frame& f) const {
  if (f.node < 0) return false;
  const Node& n = g_->nodes[f.node];
  if (n.kind == NodeKind::kInteger || (n.kind == NodeKind::kNumber && n.bounded))
    return (f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac) && bounds::complete(n, prefix_of(f));
  if (n.kind == NodeKind::kNumber)
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExpDigits;
  if (n.kind == NodeKind::kDfaText) return f.phase == 1 && g_->dfas[n.dfa]->accept[f.c];
  if (n.kind == NodeKind::kLiterals) return f.c > 0 && static_cast<int32_t>(n.literals[f.a].size()) == f.c;
  if (n.kind == NodeKind::kRepeat) return f.a >= n.min_items;
  return false;
}

int Matcher::string_next(int c, uint8_t x) const {
  if (!g_->tag_safe_strings) return string_lexer::next(c, x);
  constexpr int kAfterLt = 8;  // '<' seen: '/' may not follow
  if (c == kAfterLt) {
    if (x == '/') return -1;
    c = 0;
  }
  const int n = string_lexer::next(c, x);
  return n == 0 && x == '<' ? kAfterLt : n;
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
      if (g_->leading_ws) ws_or([&] { start(g_->root, top, 0, x, out); });
      else start(g_->root, top, 0, x, out);
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
        nf.a = 0;
        emit(nf);
        return;
      }
      if (n.dfa >= 0) {  // pattern / format: unescaped bytes through the automaton (a = characters)
        if (x == '"') {
          if (g_->dfas[n.dfa]->accept[f.c]) out->push_back(child_done(f.parent));
          return;
        }
        const int32_t t = g_->dfas[n.dfa]->step(f.c, x);
        if (t < 0) return;
        nf.c = t;
        emit(nf);
        return;
      }
      const bool char_starts = f.c == 0 || f.c == 8;  // between characters (8: after '<' in tag-safe strings)
      if (char_starts && x != '"' && n.max_len >= 0 && f.a >= n.max_len) return;
      const int c = string_next(f.c, x);
      if (c < 0) return;
      if (c == string_lexer::kStringEnd) {
        if (f.a >= n.min_len) out->push_back(child_done(f.parent));
        return;
      }
      nf.c = c;
      if (char_starts) ++nf.a;
      emit(nf);
      return;
    }
    case NodeKind::kDfaText: {  // phase 1 always (set by start); c = the automaton state
      const int32_t t = g_->dfas[n.dfa]->step(f.c, x);
      if (t < 0) return;
      Frame nf = f;
      nf.c = t;
      emit(nf);
      return;
    }
    case NodeKind::kNumber:
    case NodeKind::kInteger: {
      const bool integer = n.kind == NodeKind::kInteger;
      if (integer || n.bounded) {  // the digit automaton of the bounds (number_bounds.h)
        bounds::Prefix p = prefix_of(f);
        Frame nf = f;
        uint8_t phase = f.phase;
        if (x == '-' && f.phase == kNumStart) {
          p.neg = true;
          phase = kNumMinus;
        } else if (x == '.' && !integer && (f.phase == kNumZero || f.phase == kNumInt)) {
          p.dot = true;
          phase = kNumDot;
        } else if (is_digit(x) && (f.phase == kNumStart || f.phase == kNumMinus || f.phase == kNumInt)) {
          if (p.int_digits >= bounds::kMaxDigits) return;
          p.m = p.m * 10 + (x - '0');
          ++p.int_digits;
          phase = (p.int_digits == 1 && x == '0') ? kNumZero : kNumInt;
        } else if (is_digit(x) && (f.phase == kNumDot || f.phase == kNumFrac)) {
          if (p.int_digits + p.frac_digits >= bounds::kMaxTotalDigits) return;
          p.m = p.m * 10 + (x - '0');
          ++p.frac_digits;
          phase = kNumFrac;
        } else {
          return;
        }
        if (!bounds::feasible(n, p)) return;
        store_prefix(p, &nf);
        nf.phase = phase;
        emit(nf);
        return;
      }
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
            const int c = string_next(f.c, x);
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
    case NodeKind::kSequence:  // a is the next item; this frame is its parent
      start(n.alts[f.a], top, f.depth, x, out);
      return;
    case NodeKind::kRepeat:
      if (n.max_items < 0 || f.a < n.max_items) start(n.item, top, f.depth, x, out);
      return;
    case NodeKind::kRawText: {  // a: characters written (a partly matched delimiter included)
      const int c = raw_lexer::next(f.c, x);
      if (c < 0) return;
      int complete = -1;
      const int32_t delim = delimiter_step(n.literals, f.b, x, &complete);
      if (complete == 0 && f.a - (f.b & 255) >= n.min_len) out->push_back(child_done(f.parent));  // the terminator
      if (complete >= 0) return;  // (or a forbidden literal: dead)
      Frame nf = f;
      nf.c = c;
      nf.b = delim;
      if (f.c == 0) ++nf.a;
      if (n.max_len >= 0 && nf.a - (delim & 255) > n.max_len) return;
      emit(nf);
      return;
    }
    case NodeKind::kTagObject:
      step_tag_object(top, f, n, x, out);
      return;
    case NodeKind::kAnyOf:
      MX_CHECK_MSG(false, "an anyOf node never has a frame");
  }
}

void Matcher::step_tag_object(int32_t top, const Frame& f, const Node& n, uint8_t x, std::vector<int32_t>* out) {
  const std::string& close = n.literals[0];
  const int32_t n_props = static_cast<int32_t>(n.props.size());
  const auto used = static_cast<uint32_t>(f.a);
  Frame nf = f;
  auto close_done = [&](int32_t matched) {
    if (matched == static_cast<int32_t>(close.size())) {
      out->push_back(child_done(f.parent));
    } else {
      nf.phase = kTagClose;
      nf.c = matched;
      out->push_back(push(nf));
    }
  };
  auto key_done = [&](int32_t j, int32_t matched) {
    nf.b = j;
    nf.c = matched;
    nf.phase = matched == static_cast<int32_t>(n.props[j].key.size()) ? kTagValue : kTagKey;
    out->push_back(push(nf));
  };
  switch (f.phase) {
    case kTagBetween: {
      bool required_left = false;
      for (int32_t j = n.ordered ? f.a : 0; j < n_props; ++j) {
        const bool written = !n.ordered && ((used >> j) & 1u);
        if (written) continue;
        if (static_cast<uint8_t>(n.props[j].key[0]) == x) key_done(j, 1);
        if (n.props[j].required) {
          required_left = true;
          if (n.ordered) break;  // a required property cannot be skipped
        }
      }
      if (!required_left && static_cast<uint8_t>(close[0]) == x) close_done(1);
      return;
    }
    case kTagKey:
      if (static_cast<uint8_t>(n.props[f.b].key[f.c]) == x) key_done(f.b, f.c + 1);
      return;
    case kTagValue:
      start(n.props[f.b].value, top, f.depth, x, out);
      return;
    case kTagClose:
      if (static_cast<uint8_t>(close[f.c]) == x) close_done(f.c + 1);
      return;
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
    int mode = -1;
    const Node& nd = g_->nodes[f.node];
    if (k == NodeKind::kRawText && f.b == 0 && f.c < 8 && nd.max_len < 0) mode = 8 + f.c;
    const bool free_string = k == NodeKind::kString && nd.dfa < 0 && nd.max_len < 0;  // length bounds need the walk
    const bool in_string = (free_string && f.phase == 1) || (k == NodeKind::kAnyObject && f.phase == kKey);
    if (in_string && f.c < 8) mode = g_->tag_safe_strings ? 16 + f.c : f.c;
    if (mode < 0 || (u >= 0 && mode != u)) return -1;
    u = mode;
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
