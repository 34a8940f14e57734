// Regex subset -> byte DFA (regex.h): a recursive-descent parser to a small AST, Thompson NFA over bytes
// (counted repetitions are copies), subset construction with the writing rules and the character-count
// product in the DFA state, then pruning of states that cannot reach acceptance.
#include "structured/regex.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <tuple>
#include <map>
#include <queue>

#include <nlohmann/json.hpp>

namespace mxserve::structured {
namespace {

constexpr int kMaxRepeat = 1000;
constexpr size_t kMaxNfaStates = 200000;

struct CharSet {
  std::bitset<128> ascii;
  bool non_ascii = false;  // every multi-byte UTF-8 character
};

struct Ast {
  enum Kind { kSet, kBytes, kConcat, kAlt, kRepeat } kind = kConcat;
  CharSet set;              // kSet
  std::string bytes;        // kBytes: one literal character's UTF-8
  std::vector<Ast> kids;    // kConcat, kAlt, kRepeat (one)
  int min = 0, max = -1;    // kRepeat; -1: unbounded
};

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<Ast> parse_all(bool* anchored_start, bool* anchored_end) {
    *anchored_start = !p_.empty() && p_[0] == '^';
    if (*anchored_start) ++i_;
    size_t end = p_.size();
    *anchored_end = end > i_ && p_[end - 1] == '$' && !escaped_at(end - 1);
    if (*anchored_end) p_ = p_.substr(0, end - 1);
    MX_ASSIGN_OR_RETURN(Ast a, alt());
    if (i_ < p_.size()) return fail(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return a;
  }

 private:
  bool escaped_at(size_t pos) const {  // an odd run of backslashes before pos
    size_t n = 0;
    while (pos > n && p_[pos - 1 - n] == '\\') ++n;
    return n % 2 == 1;
  }
  Status fail(const std::string& what) const {
    return invalid_argument(what + " at offset " + std::to_string(i_));
  }
  bool eat(char c) {
    if (i_ < p_.size() && p_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  Result<Ast> alt() {
    Ast a;
    a.kind = Ast::kAlt;
    for (;;) {
      MX_ASSIGN_OR_RETURN(Ast c, concat());
      a.kids.push_back(std::move(c));
      if (!eat('|')) break;
    }
    if (a.kids.size() == 1) return std::move(a.kids[0]);
    return a;
  }

  Result<Ast> concat() {
    Ast c;
    c.kind = Ast::kConcat;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      MX_ASSIGN_OR_RETURN(Ast a, atom());
      MX_ASSIGN_OR_RETURN(a, quantified(std::move(a)));
      c.kids.push_back(std::move(a));
    }
    return c;
  }

  Result<int> number() {
    size_t start = i_;
    int64_t v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) return fail("repetition count above " + std::to_string(kMaxRepeat));
    }
    if (i_ == start) return fail("a repetition '{' without a number");
    return static_cast<int>(v);
  }

  Result<Ast> quantified(Ast a) {
    for (;;) {
      if (i_ >= p_.size()) return a;
      int lo = 0, hi = -1;
      const char q = p_[i_];
      if (q == '*') {
        ++i_;
      } else if (q == '+') {
        ++i_;
        lo = 1;
      } else if (q == '?') {
        ++i_;
        hi = 1;
      } else if (q == '{') {
        ++i_;
        MX_ASSIGN_OR_RETURN(lo, number());
        hi = lo;
        if (eat(',')) {
          hi = -1;
          if (i_ < p_.size() && p_[i_] != '}') {
            MX_ASSIGN_OR_RETURN(hi, number());
          }
        }
        if (!eat('}')) return fail("an unclosed repetition '{'");
        if (hi >= 0 && hi < lo) return fail("a repetition {n,m} with m < n");
      } else {
        return a;
      }
      eat('?');  // lazy: the same language under full-match semantics
      if (i_ < p_.size() && p_[i_] == '+') return fail("a possessive quantifier");
      Ast r;
      r.kind = Ast::kRepeat;
      r.min = lo;
      r.max = hi;
      r.kids.push_back(std::move(a));
      a = std::move(r);
    }
  }

  Result<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) return fail("a bad hex escape");
      const char c = p_[i_++];
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return v;
  }

  // After '\': a class escape into *set (returns true), or a code point into *cp.
  Result<bool> escape(CharSet* set, uint32_t* cp) {
    if (i_ >= p_.size()) return fail("a trailing backslash");
    const char c = p_[i_++];
    auto range = [&](char lo, char hi) {
      for (char x = lo; x <= hi; ++x) set->ascii.set(static_cast<size_t>(x));
    };
    switch (c) {
      case 'd': case 'D': range('0', '9'); break;
      case 'w': case 'W': range('0', '9'); range('a', 'z'); range('A', 'Z'); set->ascii.set('_'); break;
      case 's': case 'S': for (char x : {' ', '\t', '\n', '\r', '\f', '\v'}) set->ascii.set(static_cast<size_t>(x)); break;
      case 'n': *cp = '\n'; return false;
      case 'r': *cp = '\r'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case 'x': { MX_ASSIGN_OR_RETURN(*cp, hex(2)); return false; }
      case 'u': { MX_ASSIGN_OR_RETURN(*cp, hex(4)); return false; }
      case 'b': case 'B': --i_; return fail("a word boundary '\\" + std::string(1, c) + "'");
      case 'p': case 'P': --i_; return fail("a Unicode property escape '\\" + std::string(1, c) + "'");
      case 'k': --i_; return fail("a backreference '\\k'");
      default:
        if (c >= '0' && c <= '9') {
          --i_;
          return fail("a backreference '\\" + std::string(1, c) + "'");
        }
        if (std::isalnum(static_cast<unsigned char>(c))) {
          --i_;
          return fail("an unknown escape '\\" + std::string(1, c) + "'");
        }
        *cp = static_cast<uint8_t>(c);
        return false;
    }
    if (std::isupper(static_cast<unsigned char>(c))) {
      set->ascii.flip();
      set->non_ascii = true;
    }
    return true;
  }

  // One UTF-8 character of the pattern as a code point (the pattern is a JSON string: valid UTF-8).
  uint32_t utf8_char() {
    const auto b0 = static_cast<uint8_t>(p_[i_++]);
    if (b0 < 0x80) return b0;
    const int n = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
    uint32_t cp = b0 & (0x3F >> n);
    for (int k = 0; k < n && i_ < p_.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(p_[i_++]) & 0x3F);
    return cp;
  }

  Result<Ast> literal(uint32_t cp) {
    Ast a;
    if (cp < 0x80) {
      a.kind = Ast::kSet;
      a.set.ascii.set(cp);
    } else {
      a.kind = Ast::kBytes;
      append_utf8(cp, &a.bytes);
    }
    return a;
  }

  Result<Ast> klass() {  // after '['
    const size_t open = i_ - 1;
    CharSet set;
    const bool negated = eat('^');
    bool first = true;
    for (;;) {
      if (i_ >= p_.size()) {
        i_ = open;
        return fail("an unclosed character class '['");
      }
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      uint32_t lo = 0;
      if (eat('\\')) {
        MX_ASSIGN_OR_RETURN(bool is_set, escape(&set, &lo));
        if (is_set) continue;
      } else if (p_[i_] == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        return fail("a POSIX class '[:'");
      } else {
        lo = utf8_char();
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (eat('\\')) {
          CharSet tmp;
          MX_ASSIGN_OR_RETURN(bool is_set, escape(&tmp, &hi));
          if (is_set) return fail("a class escape as a range end");
        } else {
          hi = utf8_char();
        }
        if (hi < lo) return fail("a character range out of order");
      }
      if (hi >= 0x80) return fail("a non-ASCII character in a character class");
      for (uint32_t c = lo; c <= hi; ++c) set.ascii.set(c);
    }
    if (negated) {
      set.ascii.flip();
      set.non_ascii = !set.non_ascii;
    }
    Ast a;
    a.kind = Ast::kSet;
    a.set = set;
    return a;
  }

  Result<Ast> atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (eat('?')) {
        if (eat(':')) {
        } else if ((i_ < p_.size() && p_[i_] == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') ||
                   (i_ + 1 < p_.size() && p_[i_] == 'P' && p_[i_ + 1] == '<')) {
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) return fail("an unclosed group name");
          i_ = close + 1;
        } else if (i_ < p_.size() && (p_[i_] == '=' || p_[i_] == '!' || p_[i_] == '<')) {
          i_ -= 2;
          return fail("a lookaround group '(?" + std::string(1, p_[i_ + 2]) + "'");
        } else {
          i_ -= 2;
          return fail("inline flags or an unknown group '(?'");
        }
      }
      MX_ASSIGN_OR_RETURN(Ast inner, alt());
      if (!eat(')')) return fail("an unclosed group '('");
      return inner;
    }
    if (c == '[') {
      ++i_;
      return klass();
    }
    if (c == '.') {
      ++i_;
      Ast a;
      a.kind = Ast::kSet;
      a.set.ascii.set();
      a.set.ascii.reset('\n');
      a.set.non_ascii = true;
      return a;
    }
    if (c == '\\') {
      ++i_;
      Ast a;
      a.kind = Ast::kSet;
      uint32_t cp = 0;
      MX_ASSIGN_OR_RETURN(bool is_set, escape(&a.set, &cp));
      if (is_set) return a;
      return literal(cp);
    }
    if (c == '^' || c == '$') return fail(std::string("an anchor '") + c + "' inside the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') return fail(std::string("a quantifier '") + c + "' with nothing to repeat");
    return literal(utf8_char());
  }

  std::string_view p_;
  size_t i_ = 0;
};

// Thompson NFA over bytes.
struct Nfa {
  struct State {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // (byte, target)
    std::vector<int32_t> eps;
  };
  std::vector<State> states;
  int32_t add() {
    states.emplace_back();
    return static_cast<int32_t>(states.size()) - 1;
  }
  void range(int32_t from, int32_t to, uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) states[from].edges.emplace_back(static_cast<uint8_t>(b), to);
  }
};

class NfaBuilder {
 public:
  explicit NfaBuilder(Nfa* nfa) : n_(nfa) {}
  // Adds `a` between from and to.
  Status emit(const Ast& a, int32_t from, int32_t to) {
    if (n_->states.size() > kMaxNfaStates) return invalid_argument("the pattern is too large (repetitions expand to over " + std::to_string(kMaxNfaStates) + " states)");
    switch (a.kind) {
      case Ast::kSet:
        for (size_t b = 0; b < 128; ++b)
          if (a.set.ascii.test(b)) n_->states[from].edges.emplace_back(static_cast<uint8_t>(b), to);
        if (a.set.non_ascii) any_multibyte(from, to);
        return Status::ok();
      case Ast::kBytes: {
        int32_t cur = from;
        for (size_t k = 0; k < a.bytes.size(); ++k) {
          const int32_t nxt = k + 1 == a.bytes.size() ? to : n_->add();
          n_->states[cur].edges.emplace_back(static_cast<uint8_t>(a.bytes[k]), nxt);
          cur = nxt;
        }
        return Status::ok();
      }
      case Ast::kConcat: {
        int32_t cur = from;
        for (size_t k = 0; k < a.kids.size(); ++k) {
          const int32_t nxt = k + 1 == a.kids.size() ? to : n_->add();
          MX_RETURN_IF_ERROR(emit(a.kids[k], cur, nxt));
          cur = nxt;
        }
        if (a.kids.empty()) n_->states[from].eps.push_back(to);
        return Status::ok();
      }
      case Ast::kAlt:
        for (const Ast& k : a.kids) MX_RETURN_IF_ERROR(emit(k, from, to));
        return Status::ok();
      case Ast::kRepeat: {
        int32_t cur = from;
        for (int k = 0; k < a.min; ++k) {
          const int32_t nxt = n_->add();
          MX_RETURN_IF_ERROR(emit(a.kids[0], cur, nxt));
          cur = nxt;
        }
        if (a.max < 0) {  // a loop: cur -> body -> cur
          const int32_t body_end = n_->add();
          MX_RETURN_IF_ERROR(emit(a.kids[0], cur, body_end));
          n_->states[body_end].eps.push_back(cur);
          n_->states[cur].eps.push_back(to);
          return Status::ok();
        }
        for (int k = a.min; k < a.max; ++k) {
          const int32_t nxt = n_->add();
          n_->states[cur].eps.push_back(to);
          MX_RETURN_IF_ERROR(emit(a.kids[0], cur, nxt));
          cur = nxt;
        }
        n_->states[cur].eps.push_back(to);
        return Status::ok();
      }
    }
    return Status::ok();
  }

 private:
  void any_multibyte(int32_t from, int32_t to) {  // every valid 2..4-byte UTF-8 sequence
    const int32_t c1 = n_->add(), c2 = n_->add(), c3 = n_->add();
    n_->range(c1, to, 0x80, 0xBF);
    n_->range(c2, c1, 0x80, 0xBF);
    n_->range(c3, c2, 0x80, 0xBF);
    n_->range(from, c1, 0xC2, 0xDF);
    const int32_t e0 = n_->add(), ed = n_->add(), f0 = n_->add(), f4 = n_->add();
    n_->range(from, e0, 0xE0, 0xE0);
    n_->range(e0, c1, 0xA0, 0xBF);
    n_->range(from, c2, 0xE1, 0xEC);
    n_->range(from, c2, 0xEE, 0xEF);
    n_->range(from, ed, 0xED, 0xED);
    n_->range(ed, c1, 0x80, 0x9F);
    n_->range(from, f0, 0xF0, 0xF0);
    n_->range(f0, c2, 0x90, 0xBF);
    n_->range(from, c3, 0xF1, 0xF3);
    n_->range(from, f4, 0xF4, 0xF4);
    n_->range(f4, c2, 0x80, 0x8F);
  }
  Nfa* n_;
};

bool byte_writable(uint8_t b, RegexOptions::Text text) {
  if (text == RegexOptions::Text::kJsonString) return b >= 0x20 && b != '"' && b != '\\';
  return b >= 0x20 || b == '\t' || b == '\n' || b == '\r';
}

}  // namespace

Result<std::shared_ptr<const ByteDfa>> compile_regex(std::string_view pattern, const RegexOptions& o) {
  const std::string quoted = nlohmann::json(std::string(pattern)).dump();
  auto where = [&](const Status& s) { return invalid_argument("pattern " + quoted + ": " + s.message()); };
  bool anchored_start = false, anchored_end = false;
  Parser parser(pattern);
  auto ast = parser.parse_all(&anchored_start, &anchored_end);
  if (!ast.is_ok()) return where(ast.status());
  // Unanchored ends: any characters before / after (JSON Schema search semantics).
  Ast any;
  any.kind = Ast::kRepeat;
  any.min = 0;
  any.max = -1;
  Ast anychar;
  anychar.kind = Ast::kSet;
  anychar.set.ascii.set();
  anychar.set.non_ascii = true;
  any.kids.push_back(anychar);
  Ast whole;
  whole.kind = Ast::kConcat;
  if (!anchored_start) whole.kids.push_back(any);
  whole.kids.push_back(std::move(*ast));
  if (!anchored_end) whole.kids.push_back(any);

  Nfa nfa;
  const int32_t start = nfa.add(), final_state = nfa.add();
  if (Status s = NfaBuilder(&nfa).emit(whole, start, final_state); !s.is_ok()) return where(s);

  // Subset construction. A DFA state: (sorted NFA closure, characters written, last byte was '<').
  const int64_t count_cap = o.max_chars >= 0 ? o.max_chars : o.min_chars;  // saturates beyond min when unbounded
  struct Key {
    std::vector<int32_t> set;
    int64_t count;
    bool lt;
    bool operator<(const Key& k) const { return std::tie(set, count, lt) < std::tie(k.set, k.count, k.lt); }
  };
  auto closure = [&](std::vector<int32_t> seeds) {
    std::vector<char> seen(nfa.states.size(), 0);
    std::vector<int32_t> out;
    while (!seeds.empty()) {
      const int32_t s = seeds.back();
      seeds.pop_back();
      if (seen[s]) continue;
      seen[s] = 1;
      out.push_back(s);
      for (int32_t e : nfa.states[s].eps) seeds.push_back(e);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  auto dfa = std::make_shared<ByteDfa>();
  std::map<Key, int32_t> ids;
  std::vector<Key> keys;
  auto intern = [&](Key k) -> int32_t {
    auto it = ids.find(k);
    if (it != ids.end()) return it->second;
    const auto id = static_cast<int32_t>(keys.size());
    ids.emplace(k, id);
    keys.push_back(std::move(k));
    return id;
  };
  intern(Key{closure({start}), 0, false});
  for (size_t s = 0; s < keys.size(); ++s) {
    if (static_cast<int64_t>(keys.size()) > o.max_states)
      return invalid_argument("pattern " + quoted + " (with its length bounds) needs over " + std::to_string(o.max_states) +
                              " automaton states; simplify it or lower maxLength");
    const Key k = keys[s];  // a copy: intern() may grow keys
    dfa->next.resize((s + 1) * 256, -1);
    dfa->accept.push_back(std::binary_search(k.set.begin(), k.set.end(), final_state) && k.count >= o.min_chars);
    std::array<std::vector<int32_t>, 256> targets;
    for (int32_t ns : k.set)
      for (const auto& [b, t] : nfa.states[ns].edges) targets[b].push_back(t);
    for (int b = 0; b < 256; ++b) {
      if (targets[b].empty() || !byte_writable(static_cast<uint8_t>(b), o.text)) continue;
      if (o.no_close_tag && k.lt && b == '/') continue;
      int64_t count = k.count;
      if ((b & 0xC0) != 0x80) {  // a character starts
        if (o.max_chars >= 0 && count >= o.max_chars) continue;
        count = std::min(count + 1, std::max<int64_t>(count_cap, 0));  // saturates at the cap
      }
      const int32_t t = intern(Key{closure(targets[b]), count, o.no_close_tag && b == '<'});
      dfa->next[s * 256 + static_cast<size_t>(b)] = t;
    }
  }
  const auto n = static_cast<int32_t>(keys.size());
  dfa->n_states = n;
  dfa->next.resize(static_cast<size_t>(n) * 256, -1);
  // Distances to acceptance (reverse BFS); unreachable-to-accept states are dead: no edge enters them.
  std::vector<std::vector<int32_t>> rev(static_cast<size_t>(n));
  for (int32_t s = 0; s < n; ++s)
    for (int b = 0; b < 256; ++b)
      if (int32_t t = dfa->step(s, static_cast<uint8_t>(b)); t >= 0) rev[t].push_back(s);
  dfa->dist.assign(static_cast<size_t>(n), -1);
  std::queue<int32_t> q;
  for (int32_t s = 0; s < n; ++s)
    if (dfa->accept[s]) {
      dfa->dist[s] = 0;
      q.push(s);
    }
  while (!q.empty()) {
    const int32_t t = q.front();
    q.pop();
    for (int32_t s : rev[t])
      if (dfa->dist[s] < 0) {
        dfa->dist[s] = dfa->dist[t] + 1;
        q.push(s);
      }
  }
  for (auto& t : dfa->next)
    if (t >= 0 && dfa->dist[t] < 0) t = -1;
  if (dfa->dist[0] < 0)
    return invalid_argument("pattern " + quoted + " matches no string that can be written here (with the length bounds, " +
                            std::string(o.text == RegexOptions::Text::kJsonString ? "and without escapes: '\"', '\\\\' and control characters are not generated)" : "in raw text)"));
  return std::shared_ptr<const ByteDfa>(dfa);
}

std::string format_pattern(std::string_view format) {
  // Days per month; February 29 only in leap years (divisible by 4, centuries only by 400).
  static const std::string date =
      "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
      "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)";
  static const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "T" + time + "$";
  if (format == "uuid") return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  if (format == "ipv4") {
    const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    return "^(" + octet + "\\.){3}" + octet + "$";
  }
  if (format == "email") return "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}$";
  return {};
}

}  // namespace mxserve::structured
