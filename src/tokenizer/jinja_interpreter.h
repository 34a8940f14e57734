// Jinja interpreter: walks the AST with @huggingface/jinja's evaluation rules (scoping: for
// loops get one scope shared by all iterations, macros see the caller's scope; output: none and
// undefined print nothing; operators as in runtime.ts). Owns nothing across renders.
// Invariant: errors surface as RenderError carrying the line of the innermost failing node;
// recursion (macros, nesting) is bounded so a hostile template cannot overflow the stack.
#pragma once

#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

namespace mxserve::tokenizer::jinja {

class Interpreter {
 public:
  static constexpr int kMaxDepth = 400;
  static constexpr size_t kMaxOutputBytes = size_t{256} << 20;

  std::string render(const Node& program, Env& globals);

 private:
  Value eval(const Node& n, Env& env);
  Value eval_inner(const Node& n, Env& env);
  std::string block(const NodeList& stmts, Env& env);
  Value binary(const Node& n, Env& env);
  Value member(const Node& n, Env& env);
  Value call(const Node& n, Env& env);
  Value filter(const Value& operand, const Node& f, Env& env);
  std::string for_loop(const Node& n, Env& env);
  void set_statement(const Node& n, Env& env);
  Value define_macro(const Node& n, Env& env);
  void eval_args(const NodeList& args, Env& env, std::vector<Value>& pos, Object& kw);

  int depth_ = 0;
};

}  // namespace mxserve::tokenizer::jinja
