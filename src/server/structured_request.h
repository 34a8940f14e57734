// The structured-output request fields: OpenAI's `response_format` and vLLM's `guided_json`,
// `guided_choice`, `guided_regex`, `guided_grammar` and `structured_outputs`. Each is either compiled
// into a structured::Grammar (enforced during decoding) or a 400 naming the field -- never accepted and
// ignored. Schema errors name the schema keyword (docs/server.md, "Structured output").
#pragma once

#include <memory>
#include <optional>

#include "server/api_error.h"
#include "server/json_util.h"
#include "structured/grammar.h"

namespace mxserve::server {

// The field names this file handles (the request schema's list of known fields).
const std::vector<std::string>& structured_output_fields();

// Sets *grammar when the body asks for structured output (at most one of the fields may).
std::optional<ApiError> parse_structured_output(const OrderedJson& body, std::shared_ptr<const structured::Grammar>* grammar);

}  // namespace mxserve::server
