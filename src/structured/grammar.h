// Grammar: the compiled form of a structured-output request (a JSON schema, "any JSON object", a list of
// literal choices, or tag-delimited tool calls: tool_call_grammar.h) as a graph of nodes over bytes,
// walked by the Matcher (matcher.h).
// Owns: the node kinds and the compilers from JSON schema / choices. Does not own matching state.
// Invariants: every node is productive (it matches at least one byte string), so a matcher state that
// is alive can always be completed; no node matches the empty string (a sequence's items each consume a
// byte before the next starts); unsupported schema keywords are compile errors naming the keyword
// (lenient mode, used for tool schemas, records them instead: the grammar is then looser, never tighter).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "structured/regex.h"

namespace mxserve::structured {

constexpr int64_t kMaxSafeInteger = 9007199254740991;  // 2^53 - 1

enum class NodeKind : uint8_t {
  kObject,     // properties in declared order; optional ones may be skipped; no other keys
  kAnyObject,  // any keys (free strings), every value `item`
  kArray,      // items `item`, min_items..max_items
  kString,     // a JSON string: min_len..max_len characters; with `dfa`, its unescaped bytes match dfas[dfa]
  kNumber,     // JSON number; with `bounded`, no exponent and a value in [lo, hi] (exclusive ends per flags)
  kInteger,    // JSON integer (no fraction, no exponent), always bounded: [int_lo, int_hi] (default JSON's
               // safe range +-(2^53-1)), a multiple of multiple_of when > 1
  kLiterals,   // exactly one of `literals` (byte strings, sorted, unique)
  kAnyOf,      // one of `alts` (no frame of its own: the matcher forks)
  kSequence,   // `alts` in order
  kRepeat,     // `item` min_items..max_items times (min_items >= 1), nothing between
  kRawText,    // raw UTF-8 text up to and including literals[0] (the terminator); no literals[1..] inside.
               // Every literal starts with '<' (the token mask's fast path relies on it)
  kDfaText,    // raw text matching dfas[dfa] (a tool-call string value with pattern / format)
  kTagObject,  // tagged key/value pairs then literals[0] (the close): props[j].key is the literal written
               // before value j; each property at most once, in any order (in declared order when
               // `ordered`: more than 32 properties); the close only once every required one was written
};

struct Property {
  std::string key;     // the key as it appears in the output: its JSON encoding with the quotes
  int32_t value = -1;  // node
  bool required = false;
};

struct Node {
  NodeKind kind = NodeKind::kString;
  std::vector<Property> props;        // kObject, kTagObject
  int32_t item = -1;                  // kArray: items; kAnyObject: values; kRepeat: the repeated node
  int64_t min_items = 0;              // kArray, kRepeat
  int64_t max_items = -1;             // kArray, kRepeat; -1: unbounded
  std::vector<std::string> literals;  // kLiterals; kRawText: terminator, forbidden...; kTagObject: close
  std::vector<int32_t> alts;          // kAnyOf: alternatives; kSequence: items
  bool ordered = false;               // kTagObject
  int64_t min_len = 0, max_len = -1;  // kString, kRawText: characters (a \u escape counts as one)
  int32_t dfa = -1;                   // kString, kDfaText: index into Grammar::dfas
  bool bounded = false;               // kNumber
  bool lo_excl = false, hi_excl = false;                           // kNumber
  long double lo = 0, hi = 0;                                      // kNumber
  int64_t int_lo = -kMaxSafeInteger, int_hi = kMaxSafeInteger;     // kInteger
  int64_t multiple_of = 1;                                         // kInteger
  int64_t min_bytes = 0;              // the fewest bytes of a match (computed by finalize)
  std::array<uint64_t, 4> first{};    // bytes a match can start with (computed by finalize)
  bool first_has(uint8_t b) const { return (first[b >> 6] >> (b & 63)) & 1; }
};

struct Grammar {
  std::vector<Node> nodes;
  std::vector<std::shared_ptr<const ByteDfa>> dfas;  // pattern / format automata (regex.h)
  int32_t root = -1;
  bool json = true;      // JSON text: whitespace (at most kMaxWhitespace bytes) allowed between tokens
  bool leading_ws = true;  // with json: whitespace allowed before the root value
  bool tag_safe_strings = false;  // JSON strings may not contain "</" (write "<\/"): tool-call values
  bool close_within_budget = false;  // the constraint keeps enough of max_tokens to complete (tool calls)
  std::string describe;  // for logs: "json_schema", "json_object", "choice(3)"
  static constexpr int kMaxWhitespace = 1;  // per gap; keeps output length bounded
  static constexpr int kMaxIntDigits = 18, kMaxFracDigits = 16, kMaxExpDigits = 3;
  // Computes first-byte sets and checks productivity (an empty enum / anyOf is an error) and the
  // shape rules of the tool-call kinds.
  Status finalize();
  // Node::min_bytes of every node, given each number node's (-1: none); called by finalize.
  void compute_min_bytes(const std::vector<int64_t>& number_bytes);
  int32_t add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int32_t>(nodes.size()) - 1;
  }
};

struct SchemaOptions {
  bool lenient = false;                      // unsupported keywords are recorded in `ignored`, not errors
  std::vector<std::string>* ignored = nullptr;  // "keyword at path", once per occurrence
};
// Compiles `schema` into nodes of *g (not finalized); $ref resolves against `root`. Returns the node.
Result<int32_t> add_json_schema(Grammar* g, const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema,
                                const std::string& path, const SchemaOptions& options);

// A raw-text string value (a tool-call argument the parser keeps as text) under a string schema's
// minLength / maxLength / pattern / format. Without pattern / format it is kRawText ending at
// terminators[0] (terminators[1..] forbidden inside); with one it is kDfaText and *needs_terminator is
// set (the caller appends terminators[0]: the automaton never writes "</").
Result<int32_t> add_raw_string(Grammar* g, const nlohmann::ordered_json& schema, const std::vector<std::string>& terminators,
                               bool* needs_terminator, const std::string& path);

// Compiles a JSON schema (subset; docs/server.md "Structured output"). Errors are kInvalidArgument whose
// message names the keyword and its JSON-pointer-ish path, e.g. "unsupported keyword 'pattern' at
// /properties/name". Properties are generated in the schema's key order. Absent or true `additionalProperties` generate no extra keys (strict mode).
Result<std::shared_ptr<const Grammar>> compile_json_schema(const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> any_json_object_grammar();
// The output is exactly one of `choices` (raw text, not JSON). Errors: empty list, empty or duplicate strings.
Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices);

// The schema keywords compile_json_schema understands (for docs and error messages).
const std::vector<std::string>& supported_schema_keywords();

}  // namespace mxserve::structured
