// Jinja parser (see jinja_parser.h). Recursive descent; errors are thrown internally as
// ParseError and returned as Status by parse().
#include "tokenizer/jinja_parser.h"

#include <set>
#include <stdexcept>

namespace mxserve::tokenizer::jinja {
namespace {

struct ParseError {
  StatusCode code;
  std::string message;
};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  static constexpr int kMaxDepth = 200;
  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~Depth() { --p.depth_; }
  };

  NodePtr program() {
    auto p = std::make_unique<Node>(NodeKind::kProgram, 1);
    while (cur_ < t_.size()) p->body.push_back(any());
    return p;
  }

 private:
  [[noreturn]] void fail(const std::string& m, StatusCode code = StatusCode::kInvalidArgument) const {
    int line = cur_ < t_.size() ? t_[cur_].line : (t_.empty() ? 1 : t_.back().line);
    throw ParseError{code, "template " + std::string(code == StatusCode::kUnsupported ? "uses " : "syntax error: ") +
                               m + " at line " + std::to_string(line)};
  }
  const Token& peek(size_t k = 0) const {
    if (cur_ + k >= t_.size()) fail("unexpected end of template");
    return t_[cur_ + k];
  }
  bool is(TokType type, size_t k = 0) const { return cur_ + k < t_.size() && t_[cur_ + k].type == type; }
  bool is_ident(const char* name, size_t k = 0) const {
    return is(TokType::kIdentifier, k) && t_[cur_ + k].value == name;
  }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(TokType::kOpenStatement) || !is(TokType::kIdentifier, 1)) return false;
    for (const char* n : names)
      if (t_[cur_ + 1].value == n) return true;
    return false;
  }
  const Token& expect(TokType type, const char* what) {
    if (!is(type)) fail(std::string("expected ") + what + (cur_ < t_.size() ? ", got '" + t_[cur_].value + "'" : ""));
    return t_[cur_++];
  }
  void expect_ident(const char* name) {
    if (!is_ident(name)) fail(std::string("expected '") + name + "'");
    ++cur_;
  }
  NodePtr node(NodeKind k) const { return std::make_unique<Node>(k, cur_ < t_.size() ? t_[cur_].line : 0); }

  NodePtr any() {
    const Token& tok = peek();
    switch (tok.type) {
      case TokType::kComment: {
        auto n = node(NodeKind::kComment);
        ++cur_;
        return n;
      }
      case TokType::kText: {
        auto n = node(NodeKind::kStrLit);
        n->str = tok.value;
        ++cur_;
        return n;
      }
      case TokType::kOpenStatement: return statement();
      case TokType::kOpenExpression: {
        ++cur_;
        auto e = expression();
        expect(TokType::kCloseExpression, "'}}'");
        return e;
      }
      default: fail("unexpected '" + tok.value + "'");
    }
  }

  NodeList block_until(std::initializer_list<const char*> ends) {
    NodeList body;
    while (!is_statement(ends)) {
      if (cur_ >= t_.size()) {
        std::string names;
        for (const char* e : ends) names += std::string(names.empty() ? "" : " or ") + "'{% " + e + " %}'";
        fail("unclosed block: expected " + names);
      }
      body.push_back(any());
    }
    return body;
  }
  void end_tag(const char* name) {
    expect(TokType::kOpenStatement, "'{%'");
    expect_ident(name);
    expect(TokType::kCloseStatement, "'%}'");
  }

  NodePtr statement() {
    Depth guard(*this);
    expect(TokType::kOpenStatement, "'{%'");
    if (!is(TokType::kIdentifier)) fail("expected a statement name");
    const std::string name = peek().value;
    ++cur_;
    if (name == "set") return set_statement();
    if (name == "if") {
      auto n = if_statement();
      end_tag("endif");
      return n;
    }
    if (name == "for") {
      auto n = for_statement();
      end_tag("endfor");
      return n;
    }
    if (name == "macro") {
      auto n = node(NodeKind::kMacro);
      if (!is(TokType::kIdentifier)) fail("expected a macro name");
      n->str = peek().value;
      ++cur_;
      n->args = arg_list(true);
      expect(TokType::kCloseStatement, "'%}'");
      n->body = block_until({"endmacro"});
      end_tag("endmacro");
      collect_identifiers(n->body, n->referenced);
      return n;
    }
    if (name == "break" || name == "continue") {
      auto n = node(name == "break" ? NodeKind::kBreak : NodeKind::kContinue);
      expect(TokType::kCloseStatement, "'%}'");
      return n;
    }
    if (name == "filter") {
      auto n = node(NodeKind::kFilterStatement);
      n->a = filter_ref();
      expect(TokType::kCloseStatement, "'%}'");
      n->body = block_until({"endfilter"});
      end_tag("endfilter");
      return n;
    }
    if (name == "generation" || name == "endgeneration") {  // training markers: render nothing
      auto n = node(NodeKind::kComment);
      expect(TokType::kCloseStatement, "'%}'");
      return n;
    }
    --cur_;
    fail("unsupported Jinja statement '{% " + name + " %}'", StatusCode::kUnsupported);
  }

  static void collect_identifiers(const NodeList& list, std::vector<std::string>& out) {
    for (const auto& n : list) collect_identifiers(n.get(), out);
  }
  static void collect_identifiers(const Node* n, std::vector<std::string>& out) {
    if (n == nullptr) return;
    if (n->kind == NodeKind::kIdentifier) out.push_back(n->str);
    collect_identifiers(n->a.get(), out);
    collect_identifiers(n->b.get(), out);
    collect_identifiers(n->c.get(), out);
    collect_identifiers(n->args, out);
    collect_identifiers(n->body, out);
    collect_identifiers(n->alt, out);
  }

  NodePtr set_statement() {
    auto n = node(NodeKind::kSet);
    n->a = expression_sequence(false);
    if (is(TokType::kEquals)) {
      ++cur_;
      n->b = expression_sequence(false);
    } else {
      expect(TokType::kCloseStatement, "'%}'");
      n->body = block_until({"endset"});
      expect(TokType::kOpenStatement, "'{%'");
      expect_ident("endset");
    }
    expect(TokType::kCloseStatement, "'%}'");
    return n;
  }

  NodePtr if_statement() {
    auto n = node(NodeKind::kIf);
    n->a = expression();
    expect(TokType::kCloseStatement, "'%}'");
    n->body = block_until({"elif", "else", "endif"});
    if (is_statement({"elif"})) {
      cur_ += 2;
      n->alt.push_back(if_statement());
    } else if (is_statement({"else"})) {
      cur_ += 2;
      expect(TokType::kCloseStatement, "'%}'");
      n->alt = block_until({"endif"});
    }
    return n;
  }

  NodePtr for_statement() {
    auto n = node(NodeKind::kFor);
    n->a = expression_sequence(true);
    if (n->a->kind != NodeKind::kIdentifier && n->a->kind != NodeKind::kTupleLit)
      fail("expected an identifier or tuple as the loop variable");
    if (!is_ident("in")) fail("expected 'in' after the loop variable");
    ++cur_;
    n->b = expression();
    expect(TokType::kCloseStatement, "'%}'");
    n->body = block_until({"endfor", "else"});
    if (is_statement({"else"})) {
      cur_ += 2;
      expect(TokType::kCloseStatement, "'%}'");
      n->alt = block_until({"endfor"});
    }
    return n;
  }

  NodePtr expression_sequence(bool primary) {
    NodeList items;
    int line = cur_ < t_.size() ? t_[cur_].line : 0;
    items.push_back(primary ? primary_expr() : expression());
    bool is_tuple = is(TokType::kComma);
    while (is_tuple) {
      ++cur_;
      items.push_back(primary ? primary_expr() : expression());
      if (!is(TokType::kComma)) break;
    }
    if (!is_tuple) return std::move(items[0]);
    auto t = std::make_unique<Node>(NodeKind::kTupleLit, line);
    t->args = std::move(items);
    return t;
  }

  NodePtr expression() {
    Depth guard(*this);
    auto a = or_expr();
    if (is_ident("if")) {
      ++cur_;
      auto test = or_expr();
      if (is_ident("else")) {
        ++cur_;
        auto n = std::make_unique<Node>(NodeKind::kTernary, a->line);
        n->a = std::move(test);
        n->b = std::move(a);
        n->c = expression();
        return n;
      }
      auto n = std::make_unique<Node>(NodeKind::kSelect, a->line);
      n->a = std::move(a);
      n->b = std::move(test);
      return n;
    }
    return a;
  }

  NodePtr binary(NodePtr l, const std::string& op, NodePtr r) {
    auto n = std::make_unique<Node>(NodeKind::kBinary, l->line);
    n->str = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodePtr or_expr() {
    auto l = and_expr();
    while (is_ident("or")) {
      ++cur_;
      l = binary(std::move(l), "or", and_expr());
    }
    return l;
  }
  NodePtr and_expr() {
    auto l = not_expr();
    while (is_ident("and")) {
      ++cur_;
      l = binary(std::move(l), "and", not_expr());
    }
    return l;
  }
  NodePtr not_expr() {
    Depth guard(*this);
    if (is_ident("not")) {
      auto n = node(NodeKind::kUnary);
      n->str = "not";
      ++cur_;
      n->a = not_expr();
      return n;
    }
    return comparison();
  }
  NodePtr comparison() {
    auto l = additive();
    while (true) {
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (is_ident("in")) {
        op = "in";
        ++cur_;
      } else if (is(TokType::kComparison)) {
        op = peek().value;
        ++cur_;
      } else {
        break;
      }
      l = binary(std::move(l), op, additive());
    }
    return l;
  }
  NodePtr additive() {
    auto l = multiplicative();
    while (is(TokType::kAdditive)) {
      std::string op = peek().value;
      ++cur_;
      l = binary(std::move(l), op, multiplicative());
    }
    return l;
  }
  NodePtr multiplicative() {
    auto l = power();
    while (is(TokType::kMultiplicative)) {
      std::string op = peek().value;
      ++cur_;
      l = binary(std::move(l), op, power());
    }
    return l;
  }
  NodePtr power() {
    auto l = test_expr();
    while (is(TokType::kExponent)) {
      ++cur_;
      l = binary(std::move(l), "**", test_expr());
    }
    return l;
  }
  NodePtr test_expr() {
    auto operand = filter_expr();
    while (is_ident("is")) {
      ++cur_;
      bool negate = is_ident("not");
      if (negate) ++cur_;
      if (!is(TokType::kIdentifier)) fail("expected a test name after 'is'");
      std::string name = peek().value;
      if (name == "none" || name == "true" || name == "false") name = name;  // literal-named tests
      if (!is_supported_test(name)) fail("unsupported Jinja test '" + name + "'", StatusCode::kUnsupported);
      auto n = node(NodeKind::kTest);
      ++cur_;
      n->str = name;
      n->flag = negate;
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr filter_ref() {
    if (!is(TokType::kIdentifier)) fail("expected a filter name");
    auto id = node(NodeKind::kIdentifier);
    id->str = peek().value;
    if (!is_supported_filter(id->str)) fail("unsupported Jinja filter '" + id->str + "'", StatusCode::kUnsupported);
    ++cur_;
    if (is(TokType::kOpenParen)) return call_expr(std::move(id));
    return id;
  }
  NodePtr filter_expr() {
    auto operand = unary_sign();
    while (is(TokType::kPipe)) {
      ++cur_;
      auto n = std::make_unique<Node>(NodeKind::kFilter, operand->line);
      n->b = filter_ref();
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr unary_sign() {
    Depth guard(*this);
    if ((is(TokType::kUnary) || is(TokType::kAdditive)) && (peek().value == "-" || peek().value == "+")) {
      auto n = node(NodeKind::kUnary);
      n->str = peek().value;
      ++cur_;
      n->a = unary_sign();
      return n;
    }
    auto m = member(primary_expr());
    if (is(TokType::kOpenParen)) return call_expr(std::move(m));
    return m;
  }
  NodePtr call_expr(NodePtr callee) {
    Depth guard(*this);
    auto n = std::make_unique<Node>(NodeKind::kCall, callee->line);
    n->a = std::move(callee);
    n->args = arg_list(false);
    NodePtr e = member(std::move(n));
    if (is(TokType::kOpenParen)) e = call_expr(std::move(e));
    return e;
  }
  NodeList arg_list(bool parameters) {
    expect(TokType::kOpenParen, "'('");
    NodeList args;
    std::set<std::string> names;
    bool saw_kw = false;
    while (!is(TokType::kCloseParen)) {
      if (cur_ >= t_.size()) fail("unterminated argument list");
      if (is(TokType::kExponent) || (is(TokType::kMultiplicative) && peek().value == "*")) {
        if (parameters) fail("argument unpacking is not allowed in parameter declarations");
        bool kw = is(TokType::kExponent);
        auto n = node(kw ? NodeKind::kKwSpread : NodeKind::kSpread);
        ++cur_;
        n->a = expression();
        args.push_back(std::move(n));
        if (is(TokType::kComma)) ++cur_;
        continue;
      }
      NodePtr arg = expression();
      if (is(TokType::kEquals)) {
        ++cur_;
        if (arg->kind != NodeKind::kIdentifier) fail("expected an identifier before '='");
        auto kw = std::make_unique<Node>(NodeKind::kKwArg, arg->line);
        kw->str = arg->str;
        kw->a = expression();
        arg = std::move(kw);
      }
      if (parameters) {
        if (arg->kind != NodeKind::kIdentifier && arg->kind != NodeKind::kKwArg)
          fail("expected an identifier for a parameter declaration");
        if (!names.insert(arg->str).second) fail("duplicate parameter name '" + arg->str + "'");
      }
      if (arg->kind == NodeKind::kKwArg) saw_kw = true;
      else if (saw_kw) fail(parameters ? "non-default argument follows default argument" : "positional argument after keyword argument");
      args.push_back(std::move(arg));
      if (is(TokType::kComma)) ++cur_;
    }
    ++cur_;
    return args;
  }
  NodePtr member(NodePtr object) {
    while (is(TokType::kDot) || is(TokType::kOpenSquare)) {
      bool computed = is(TokType::kOpenSquare);
      ++cur_;
      auto n = std::make_unique<Node>(NodeKind::kMember, object->line);
      n->flag = computed;
      if (computed) {
        n->b = subscript();
        expect(TokType::kCloseSquare, "']'");
      } else {
        n->b = primary_expr();
        if (n->b->kind != NodeKind::kIdentifier && n->b->kind != NodeKind::kIntLit)
          fail("expected an identifier or integer after '.'");
      }
      n->a = std::move(object);
      object = std::move(n);
    }
    return object;
  }
  NodePtr subscript() {
    NodeList parts;
    std::vector<bool> present;
    bool is_slice = false;
    auto slice = node(NodeKind::kSlice);
    NodePtr slots[3];
    size_t idx = 0;
    bool any = false;
    while (!is(TokType::kCloseSquare)) {
      if (cur_ >= t_.size()) fail("unterminated subscript");
      if (is(TokType::kColon)) {
        ++cur_;
        is_slice = true;
        ++idx;
        any = true;
      } else {
        if (idx >= 3) fail("expected 0-3 arguments for slice expression");
        slots[idx] = expression();
        any = true;
        if (is(TokType::kColon)) {
          ++cur_;
          is_slice = true;
          ++idx;
        }
      }
      if (idx > 3) fail("expected 0-3 arguments for slice expression");
    }
    if (!any) fail("expected at least one argument for a subscript");
    if (!is_slice) return std::move(slots[0]);
    slice->a = std::move(slots[0]);
    slice->b = std::move(slots[1]);
    slice->c = std::move(slots[2]);
    return slice;
  }
  NodePtr primary_expr() {
    const Token& tok = peek();
    switch (tok.type) {
      case TokType::kNumeric: {
        auto n = node(tok.value.find('.') != std::string::npos ? NodeKind::kFloatLit : NodeKind::kIntLit);
        try {
          if (n->kind == NodeKind::kFloatLit) n->float_val = std::stod(tok.value);
          else n->int_val = std::stoll(tok.value);
        } catch (const std::exception&) {
          fail("numeric literal out of range '" + tok.value + "'");
        }
        ++cur_;
        return n;
      }
      case TokType::kString: {
        auto n = node(NodeKind::kStrLit);
        n->str = tok.value;
        ++cur_;
        while (is(TokType::kString)) n->str += t_[cur_++].value;
        return n;
      }
      case TokType::kIdentifier: {
        auto n = node(NodeKind::kIdentifier);
        n->str = tok.value;
        ++cur_;
        return n;
      }
      case TokType::kOpenParen: {
        ++cur_;
        auto e = expression_sequence(false);
        expect(TokType::kCloseParen, "')'");
        return e;
      }
      case TokType::kOpenSquare: {
        auto n = node(NodeKind::kArrayLit);
        ++cur_;
        while (!is(TokType::kCloseSquare)) {
          if (cur_ >= t_.size()) fail("unterminated list literal");
          n->args.push_back(expression());
          if (is(TokType::kComma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      case TokType::kOpenCurly: {
        auto n = node(NodeKind::kObjectLit);
        ++cur_;
        while (!is(TokType::kCloseCurly)) {
          if (cur_ >= t_.size()) fail("unterminated dict literal");
          n->args.push_back(expression());
          expect(TokType::kColon, "':' in dict literal");
          n->args.push_back(expression());
          if (is(TokType::kComma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      default: fail("unexpected '" + tok.value + "'");
    }
  }

  const std::vector<Token>& t_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<NodePtr> parse(const std::vector<Token>& tokens) {
  try {
    Parser p(tokens);
    return p.program();
  } catch (const ParseError& e) {
    return Status(e.code, e.message);
  }
}

}  // namespace mxserve::tokenizer::jinja
