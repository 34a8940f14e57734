// Jinja runtime values, modelled on @huggingface/jinja's (so rendering matches it): undefined,
// none, bool, int, float, string, list/tuple, dict (insertion-ordered), namespace, keyword
// arguments, function. Owns conversions to text (str()), JSON (tojson) and truthiness.
// Invariant: arrays and objects are shared (reference semantics, like the JS original).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxserve::tokenizer::jinja {

// Thrown inside the interpreter; ChatTemplate::render turns it into a Status.
struct RenderError {
  std::string message;
  int line = 0;
};
[[noreturn]] void throw_error(const std::string& message);

enum class ValueKind { kUndefined, kNull, kBool, kInt, kFloat, kString, kArray, kObject, kNamespace, kFunction };

struct Value;
struct Env;
using Array = std::vector<Value>;
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};
using Function = std::function<Value(std::vector<Value>& args, Env& caller)>;

struct Value {
  ValueKind kind = ValueKind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;  // object, namespace or keyword arguments
  std::shared_ptr<Function> fn;
  bool is_tuple = false;
  bool is_kwargs = false;

  static Value undefined() { return Value(); }
  static Value null() { Value v; v.kind = ValueKind::kNull; return v; }
  static Value boolean(bool x) { Value v; v.kind = ValueKind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = ValueKind::kInt; v.i = x; return v; }
  static Value floating(double x) { Value v; v.kind = ValueKind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = ValueKind::kString; v.s = std::move(x); return v; }
  static Value array(Array a = {}, bool tuple = false) {
    Value v; v.kind = ValueKind::kArray; v.arr = std::make_shared<Array>(std::move(a)); v.is_tuple = tuple; return v;
  }
  static Value object(Object o = {}, bool kwargs = false) {
    Value v; v.kind = ValueKind::kObject; v.obj = std::make_shared<Object>(std::move(o)); v.is_kwargs = kwargs; return v;
  }
  static Value ns(Object o = {}) { Value v = object(std::move(o)); v.kind = ValueKind::kNamespace; return v; }
  static Value function(Function f) {
    Value v; v.kind = ValueKind::kFunction; v.fn = std::make_shared<Function>(std::move(f)); return v;
  }

  bool is_undefined() const { return kind == ValueKind::kUndefined; }
  bool is_null() const { return kind == ValueKind::kNull; }
  bool is_string() const { return kind == ValueKind::kString; }
  bool is_array() const { return kind == ValueKind::kArray; }
  bool is_object() const { return kind == ValueKind::kObject; }   // includes keyword arguments
  bool is_container() const { return kind == ValueKind::kObject || kind == ValueKind::kNamespace; }
  bool is_number() const { return kind == ValueKind::kInt || kind == ValueKind::kFloat; }
  double number() const { return kind == ValueKind::kInt ? static_cast<double>(i) : kind == ValueKind::kBool ? (b ? 1 : 0) : f; }

  bool truthy() const;
  // What {{ v }} prints (JS RuntimeValue.toString()).
  std::string str() const;
  // What `a ~ b` / `a + "x"` use (JS value.toString(): floats lose a trailing ".0").
  std::string raw_str() const;
  const char* type_name() const;
};

struct JsonOptions {
  int indent = -1;  // < 0: no indentation
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_sep, key_sep;
};
std::string to_json(const Value& v, const JsonOptions& opts, int depth = 0, bool undefined_as_null = true);

// JSON -> Value (integral floats become ints, as in JavaScript).
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// JS-style number formatting (Number.prototype.toString).
std::string format_js_number(double x);

// JS loose equality (==) on the primitive payloads; containers compare by identity.
bool loose_equals(const Value& a, const Value& b);
// JS strict equality (===) on payloads (used by `in` over lists).
bool strict_equals(const Value& a, const Value& b);

}  // namespace mxserve::tokenizer::jinja
