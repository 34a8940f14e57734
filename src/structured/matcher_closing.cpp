// Matcher closing (matcher.h): the fewest bytes that complete the output from the current state, and a
// shortest completion. Each frame's remaining cost comes from its phase and the nodes' min_bytes
// (Grammar::compute_min_bytes); a stack's cost is its top frame's plus, up the chain, each parent's cost
// once its child is done. The completion is built greedily: at each step a byte that lowers the cost by
// exactly one (the costs are exact, so one exists while the cost is positive).
#include <algorithm>

#include "structured/matcher.h"
#include "structured/matcher_phases.h"

namespace mxserve::structured {
using namespace phases;  // NOLINT

namespace {

// Bytes that finish the UTF-8 character / escape in progress in string lexer state c.
int64_t pending_bytes(int c) {
  switch (c) {
    case 1: return 1;
    case 2: case 4: case 5: return 2;
    case 3: case 6: case 7: return 3;
    case string_lexer::kEscape: return 1;
    default:
      if (c >= string_lexer::kHex4 && c <= string_lexer::kHex1) return string_lexer::kHex1 - c + 1;
      return 0;  // between characters (0, or 8: after '<' in tag-safe strings)
  }
}

}  // namespace

int64_t Matcher::own_rem(const Frame& f) const {
  const Node& n = g_->nodes[f.node];
  auto mb = [&](int32_t i) { return g_->nodes[i].min_bytes; };
  switch (n.kind) {
    case NodeKind::kString:
      if (f.phase == 0) return n.min_bytes;
      if (n.dfa >= 0) return g_->dfas[n.dfa]->dist[f.c] + 1;
      return pending_bytes(f.c) + std::max<int64_t>(0, n.min_len - f.a) + 1;
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      if (n.kind == NodeKind::kInteger || n.bounded) {
        if (f.phase == kNumStart) return n.min_bytes;
        const int r = bounds::min_more_bytes(n, prefix_of(f));
        return r < 0 ? (int64_t{1} << 40) : r;
      }
      switch (f.phase) {
        case kNumZero: case kNumInt: case kNumFrac: case kNumExpDigits: return 0;
        default: return 1;
      }
    case NodeKind::kLiterals: {
      int64_t best = int64_t{1} << 40;
      for (int32_t i = f.a; i < f.b; ++i) best = std::min<int64_t>(best, static_cast<int64_t>(n.literals[i].size()) - f.c);
      return best;
    }
    case NodeKind::kArray: {
      const int64_t item = 1 + mb(n.item);  // ',' and an item
      switch (f.phase) {
        case kOpen: return n.min_bytes;
        case kAfterOpen: return n.min_items == 0 ? 1 : n.min_items * item;  // the first has no ',': ']' instead
        case kAfterValue: return std::max<int64_t>(0, n.min_items - f.a) * item + 1;
        default: return mb(n.item) + std::max<int64_t>(0, n.min_items - f.a - 1) * item + 1;  // kAfterComma
      }
    }
    case NodeKind::kAnyObject:
      switch (f.phase) {
        case kOpen: return n.min_bytes;
        case kAfterOpen: case kAfterValue: return 1;
        case kKey: return pending_bytes(f.c) + 1 + 1 + mb(n.item) + 1;
        case kAfterKey: return 1 + mb(n.item) + 1;
        case kAfterColon: return mb(n.item) + 1;
        default: return 2 + 1 + mb(n.item) + 1;  // kAfterComma: "":V}
      }
    case NodeKind::kObject: {
      const auto n_props = static_cast<int32_t>(n.props.size());
      auto prop = [&](int32_t j) { return static_cast<int64_t>(n.props[j].key.size()) + 1 + mb(n.props[j].value); };
      auto after = [&](int32_t j) {  // ',' + each required property from j, then '}'
        int64_t sum = 1;
        for (int32_t i = j; i < n_props; ++i)
          if (n.props[i].required) sum += 1 + prop(i);
        return sum;
      };
      auto first_key = [&](int32_t from) {  // a key must come now: the cheapest candidate
        int64_t best = int64_t{1} << 40;
        for (int32_t j = from; j < n_props; ++j) {
          best = std::min(best, prop(j) + after(j + 1));
          if (n.props[j].required) break;
        }
        return best;
      };
      switch (f.phase) {
        case kOpen: return n.min_bytes;
        case kAfterOpen: {
          bool any_required = false;
          for (const Property& p : n.props) any_required = any_required || p.required;
          return any_required ? first_key(0) : 1;
        }
        case kKey: return static_cast<int64_t>(n.props[f.b].key.size()) - f.c + 1 + mb(n.props[f.b].value) + after(f.b + 1);
        case kAfterKey: return 1 + mb(n.props[f.b].value) + after(f.b + 1);
        case kAfterColon: return mb(n.props[f.b].value) + after(f.b + 1);
        case kAfterValue: return after(f.a);
        default: return first_key(f.a);  // kAfterComma
      }
    }
    case NodeKind::kSequence: {
      int64_t sum = 0;
      for (size_t i = static_cast<size_t>(f.a); i < n.alts.size(); ++i) sum += mb(n.alts[i]);
      return sum;
    }
    case NodeKind::kRepeat: return std::max<int64_t>(0, n.min_items - f.a) * mb(n.item);
    case NodeKind::kRawText: {
      const int p = f.b >> 8, l = f.b & 255;
      const auto close = static_cast<int64_t>(n.literals[0].size());
      if (p == 0 && l > 0 && f.a - l >= n.min_len) return close - l;
      return pending_bytes(f.c) + std::max<int64_t>(0, n.min_len - f.a) + close;
    }
    case NodeKind::kDfaText: return g_->dfas[n.dfa]->dist[f.c];
    case NodeKind::kTagObject: {
      const auto n_props = static_cast<int32_t>(n.props.size());
      const auto used = static_cast<uint32_t>(f.a);
      auto rest = [&](int32_t skip) {  // unwritten required properties (but `skip`), then the close
        int64_t sum = static_cast<int64_t>(n.literals[0].size());
        for (int32_t i = n.ordered ? f.a : 0; i < n_props; ++i) {
          if (i == skip || !n.props[i].required || (!n.ordered && ((used >> i) & 1u))) continue;
          sum += static_cast<int64_t>(n.props[i].key.size()) + mb(n.props[i].value);
        }
        return sum;
      };
      switch (f.phase) {
        case kTagBetween: return rest(-1);
        case kTagKey: return static_cast<int64_t>(n.props[f.b].key.size()) - f.c + mb(n.props[f.b].value) + rest(f.b);
        case kTagValue: return mb(n.props[f.b].value) + rest(f.b);
        default: return static_cast<int64_t>(n.literals[0].size()) - f.c;  // kTagClose
      }
    }
    case NodeKind::kAnyOf: break;
  }
  return int64_t{1} << 40;
}

int64_t Matcher::stack_finish(int32_t top) {
  int64_t total = 0;
  for (;;) {
    const Frame f = frames_[top];  // a copy: child_done() may reallocate
    if (f.node < 0) return total + (f.phase == kRootDone ? 0 : g_->nodes[g_->root].min_bytes);
    total += own_rem(f);
    top = child_done(f.parent);
  }
}

int64_t Matcher::min_finish(std::span<const int32_t> tops) {
  const size_t m = mark();
  int64_t best = int64_t{1} << 40;
  for (int32_t t : tops) best = std::min(best, stack_finish(t));
  release(m);
  return best;
}

std::optional<int64_t> Matcher::min_finish_bytes() {
  if (tops_.empty()) return std::nullopt;
  return min_finish(tops_);
}

std::optional<std::string> Matcher::shortest_completion() {
  if (tops_.empty()) return std::nullopt;
  const size_t m = mark();
  std::vector<int32_t> cur = tops_, next, best_next;
  int64_t cost = min_finish(cur);
  std::string out;
  const int64_t limit = cost + 64;
  while (cost > 0 && static_cast<int64_t>(out.size()) < limit) {
    int best_byte = -1;
    int64_t best_cost = int64_t{1} << 41;
    for (int b = 0; b < 256 && best_cost != cost - 1; ++b) {
      const size_t before = mark();
      advance(cur, static_cast<uint8_t>(b), &next);
      const int64_t c = next.empty() ? (int64_t{1} << 41) : min_finish(next);
      if (c < best_cost) {
        best_cost = c;
        best_byte = b;
        best_next = next;  // frames stay: released only when the whole walk ends
      } else {
        release(before);
      }
    }
    if (best_byte < 0) break;
    out += static_cast<char>(best_byte);
    cur = best_next;
    cost = best_cost;
  }
  const bool ok = cost == 0 && can_end(cur);
  release(m);
  if (!ok) return std::nullopt;
  return out;
}

}  // namespace mxserve::structured
