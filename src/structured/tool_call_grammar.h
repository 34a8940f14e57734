// Tool-call grammars: tool_choice "required" / a named function as a Grammar, so the model must write
// one or more tag-delimited calls (GLM: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
// </tool_call>, with the layout's newlines in ToolCallSyntax) -- NAME one of the request's tools, each
// key a property of that tool's parameters (at most once, any order; every required one before the
// close), each value conforming to the property's schema: raw text for a plain string parameter (an
// enum / const of strings: exactly one of them), JSON for the others (strings in it may not contain
// "</", which JSON writes "<\/"). An optional reasoning block may come first. Nothing follows the
// last call: the request ends (EOS) there.
// This module knows no model: the caller (server/chat_output) supplies the literal syntax and which
// parameters are raw strings (its output parser's rule), so the grammar accepts exactly what the
// parser turns into valid calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace mxserve::structured {

struct ToolCallSyntax {
  std::string call_open;     // before NAME, e.g. "\n<tool_call>"
  std::string after_name;    // e.g. "\n"
  std::string key_open;      // "<arg_key>"
  std::string key_to_value;  // after the key, before the value: "</arg_key>\n<arg_value>"
  std::string value_close;   // "</arg_value>"
  std::string after_value;   // e.g. "\n"
  std::string call_close;    // "</tool_call>"
  std::string think_open;    // an optional reasoning block: e.g. "\n<think>"
  std::string think_close;   // "</think>"
};

// How the turn may start: straight with a call, with an optional think block, or inside one the prompt
// opened (the text up to think_close is reasoning).
enum class ReasoningPrefix { kNone, kOptional, kOpen };

struct ToolArg {
  std::string key;
  nlohmann::ordered_json schema;  // the property's schema
  bool raw_string = false;        // the parser keeps the raw text (else it parses JSON)
  bool required = false;
};

struct ToolSpec {
  std::string name;
  std::string field;                  // for errors: "tools[2].function.parameters"
  nlohmann::ordered_json parameters;  // the whole parameters schema ($ref resolves against it)
  std::vector<ToolArg> args;          // in declared order
};

struct ToolCallGrammarRequest {
  ToolCallSyntax syntax;
  std::vector<ToolSpec> tools;  // non-empty
  int64_t max_calls = -1;       // -1: unbounded; 1: exactly one call
  ReasoningPrefix reasoning = ReasoningPrefix::kNone;
};

// Errors (kInvalidArgument) name the field: a required property the syntax cannot write (a key with '<'
// or edge whitespace), a schema keyword the compiler does not support or a schema it rejects (the same
// rules as response_format, also on raw-string values: "unsupported keyword 'uniqueItems' at
// tools[0].function.parameters/properties/q"), an enum with no string for a raw string. *ignored lists the
// optional properties left out because they cannot be written as keys. The grammar has
// close_within_budget set (GrammarConstraint closes the calls within max_tokens).
Result<std::shared_ptr<const Grammar>> compile_tool_calls(const ToolCallGrammarRequest& request,
                                                          std::vector<std::string>* ignored);

}  // namespace mxserve::structured
