// Jinja parser: tokens -> AST, with @huggingface/jinja's grammar and precedence. Statements:
// set (incl. block set and namespace attributes), if/elif/else, for (tuple targets, inline
// filter, else), macro, filter blocks, break, continue, comments. Anything else (include,
// extends, block, call, raw, with, import ...) is an Unsupported error naming it and its line.
// Filters and tests are checked against the supported lists here, so a template using one we
// lack fails at parse time, not halfway through a request.
#pragma once

#include <vector>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace mxserve::tokenizer::jinja {

Result<NodePtr> parse(const std::vector<Token>& tokens);

// Names the interpreter implements (jinja_builtins.cpp).
bool is_supported_filter(const std::string& name);
bool is_supported_test(const std::string& name);

}  // namespace mxserve::tokenizer::jinja
