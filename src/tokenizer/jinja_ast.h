// Jinja AST for chat templates: one Node type with a kind tag (statements and expressions).
// Owns nothing but the tree; the parser builds it, the interpreter walks it.
// Invariant: `line` is the 1-based source line the node started on (used in every error).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mxserve::tokenizer::jinja {

enum class NodeKind {
  // Statements
  kProgram, kIf, kFor, kSet, kMacro, kFilterStatement, kBreak, kContinue, kComment,
  // Expressions
  kIntLit, kFloatLit, kStrLit, kArrayLit, kTupleLit, kObjectLit, kIdentifier, kMember, kCall,
  kUnary, kBinary, kFilter, kTest, kSelect, kTernary, kSlice, kKwArg, kSpread, kKwSpread,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string str;      // identifier / string literal / operator / test name
  int64_t int_val = 0;
  double float_val = 0;
  bool flag = false;    // Member: computed; Test: negated
  // Children, by kind:
  //  If: a=test, body, alt | For: a=loopvar, b=iterable, body, alt | Set: a=target, b=value|null, body
  //  Macro: str=name, args, body | FilterStatement: a=filter, body
  //  Member: a=object, b=property | Call: a=callee, args | Unary: a | Binary: a, b
  //  Filter: a=operand, b=filter (Identifier or Call) | Test: a=operand, str=test
  //  Select: a=value, b=test | Ternary: a=cond, b=true, c=false | Slice: a,b,c (nullable)
  //  KwArg: str=key, a=value | Spread / KwSpread: a | Array/Tuple: args | Object: args (k,v,k,v...)
  NodePtr a, b, c;
  NodeList args, body, alt;
  std::vector<std::string> referenced;  // Macro: identifiers used in the body (kwargs/varargs)

  Node(NodeKind k, int l) : kind(k), line(l) {}
};

}  // namespace mxserve::tokenizer::jinja
