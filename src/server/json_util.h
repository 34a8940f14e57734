// JSON helpers for untrusted request bodies: a nesting-depth pre-scan (the parser and the chat
// template's tojson must never recurse on attacker-chosen depth), non-throwing parse, and a dump that
// never throws on invalid UTF-8 (it is replaced by U+FFFD).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mxserve::server {

using OrderedJson = nlohmann::ordered_json;

// Maximum bracket nesting of a JSON text ({ and [ outside strings); stops counting past `limit`.
int json_nesting_depth(std::string_view text, int limit);

// Parses an untrusted body; nullopt + error message on failure (truncated JSON, bad UTF-8, too deep).
std::optional<OrderedJson> parse_body(std::string_view text, int max_depth, std::string* error);

std::string dump_json(const nlohmann::json& j);
std::string dump_json(const OrderedJson& j);

// A JSON type name as users write it ("string", "integer", "number", "object", ...).
std::string json_type_name(const OrderedJson& j);

}  // namespace mxserve::server
