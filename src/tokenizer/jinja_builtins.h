// Jinja built-ins with @huggingface/jinja semantics: filters, tests, members of values (string
// and dict methods), and globals (namespace, range, raise_exception, strftime_now, true/false/
// none). Owns no state. Errors are thrown as RenderError (see jinja_value.h).
#pragma once

#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace mxserve::tokenizer::jinja {

struct Env {
  std::vector<std::pair<std::string, Value>> vars;
  Env* parent = nullptr;
  explicit Env(Env* p = nullptr) : parent(p) {}
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value v);
  bool has_own(const std::string& name) const;
};

void install_globals(Env& env);

// `operand | name` (called = false) or `operand | name(args...)` (called = true).
Value apply_filter(const std::string& name, const Value& operand, std::vector<Value>& args, Object& kwargs,
                   bool called);
bool apply_test(const std::string& name, const Value& operand);
// obj.prop / obj[prop] (not slices).
Value get_member(const Value& obj, const Value& prop);
// Python-style slice of a list or string.
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace mxserve::tokenizer::jinja
