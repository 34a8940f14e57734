// Jinja lexer for chat templates. Owns: the preprocessing transformers applies (drop one
// trailing newline, lstrip_blocks, trim_blocks) and tokenization with whitespace control
// ({%- -%} {{- -}} {#- -#}), following @huggingface/jinja's lexer so output matches byte for byte.
// Invariant: every token carries the 1-based line of the original source it came from.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mxserve::tokenizer::jinja {

enum class TokType {
  kText, kNumeric, kString, kIdentifier, kEquals, kOpenParen, kCloseParen, kOpenStatement,
  kCloseStatement, kOpenExpression, kCloseExpression, kOpenSquare, kCloseSquare, kOpenCurly,
  kCloseCurly, kComma, kDot, kColon, kPipe, kAdditive, kMultiplicative, kExponent, kComparison,
  kUnary, kComment,
};

struct Token {
  TokType type;
  std::string value;
  int line;
};

Result<std::vector<Token>> tokenize(std::string_view source);

// Whitespace as JavaScript's \s / trim() see it (Unicode White_Space minus U+0085, plus U+FEFF).
bool is_js_space(char32_t cp);

}  // namespace mxserve::tokenizer::jinja
