// Jinja values (see jinja_value.h).
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer::jinja {

void throw_error(const std::string& message) { throw RenderError{message, 0}; }

const Value* Object::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind) {
    case ValueKind::kUndefined: case ValueKind::kNull: return false;
    case ValueKind::kBool: return b;
    case ValueKind::kInt: return i != 0;
    case ValueKind::kFloat: return f != 0 && !std::isnan(f);
    case ValueKind::kString: return !s.empty();
    case ValueKind::kArray: return !arr->empty();
    case ValueKind::kObject: return !obj->entries.empty();
    case ValueKind::kNamespace: case ValueKind::kFunction: return true;
  }
  return false;
}

std::string format_js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0) return "0";
  if (std::fabs(x) < 1e21 && x == std::floor(x)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", x);
    return buf;
  }
  // Shortest round-trip digits, then JS layout rules.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  int k = static_cast<int>(digits.size());
  int n = exp + 1;
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out.assign("0.");
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += "e";
    out += (n - 1 >= 0 ? '+' : '-');
    out += std::to_string(std::abs(n - 1));
  }
  if (neg) out.insert(out.begin(), '-');
  return out;
}

std::string Value::raw_str() const {
  switch (kind) {
    case ValueKind::kUndefined: return "undefined";
    case ValueKind::kNull: return "null";
    case ValueKind::kBool: return b ? "true" : "false";
    case ValueKind::kInt: return std::to_string(i);
    case ValueKind::kFloat: return format_js_number(f);
    case ValueKind::kString: return s;
    case ValueKind::kArray: {
      // JS Array.prototype.toString: elements' toString() joined by ",".
      std::string out;
      for (size_t k = 0; k < arr->size(); ++k) {
        if (k) out += ',';
        out += (*arr)[k].str();
      }
      return out;
    }
    case ValueKind::kObject: case ValueKind::kNamespace: return "[object Map]";
    default: return str();
  }
}

std::string Value::str() const {
  switch (kind) {
    case ValueKind::kFloat:
      if (f == 0 && std::signbit(f)) return "-0.0";
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 1e21) {
        std::string r = format_js_number(f);
        r += ".0";
        return r;
      }
      return format_js_number(f);
    case ValueKind::kArray: case ValueKind::kObject: case ValueKind::kNamespace:
      return to_json(*this, JsonOptions{}, 0, /*undefined_as_null=*/false);
    case ValueKind::kFunction: return "[function]";
    default: return raw_str();
  }
}

const char* Value::type_name() const {
  switch (kind) {
    case ValueKind::kUndefined: return "undefined";
    case ValueKind::kNull: return "none";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return "string";
    case ValueKind::kArray: return is_tuple ? "tuple" : "list";
    case ValueKind::kObject: return "dict";
    case ValueKind::kNamespace: return "namespace";
    case ValueKind::kFunction: return "function";
  }
  return "?";
}

namespace {
// JSON.stringify of a string, optionally escaping non-ASCII as \uXXXX (UTF-16 units).
std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  size_t p = 0;
  while (p < s.size()) {
    char32_t cp = decode_utf8(s, p);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (cp < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        char32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      append_utf8(out, cp);
    }
  }
  out += "\"";
  return out;
}
}  // namespace

std::string to_json(const Value& v, const JsonOptions& o, int depth, bool undefined_as_null) {
  if (depth > 256) throw_error("tojson: value nested too deeply");
  std::string item_sep = o.has_separators ? o.item_sep : (o.indent > 0 ? "," : ", ");
  std::string key_sep = o.has_separators ? o.key_sep : ": ";
  switch (v.kind) {
    case ValueKind::kNull: return "null";
    case ValueKind::kUndefined: return undefined_as_null ? "null" : "undefined";
    case ValueKind::kBool: return v.b ? "true" : "false";
    case ValueKind::kInt: return std::to_string(v.i);
    case ValueKind::kFloat: return std::isfinite(v.f) ? format_js_number(v.f) : "null";
    case ValueKind::kString: return json_string(v.s, o.ensure_ascii);
    case ValueKind::kArray: case ValueKind::kObject: case ValueKind::kNamespace: {
      std::string ind = o.indent > 0 ? std::string(o.indent, ' ') : "";
      std::string base = "\n";
      for (int k = 0; k < depth; ++k) base += ind;
      std::string child = base + ind;
      std::vector<std::string> parts;
      if (v.kind == ValueKind::kArray) {
        for (const Value& x : *v.arr) parts.push_back(to_json(x, o, depth + 1, undefined_as_null));
        if (o.indent > 0 && !parts.empty()) {
          std::string s = "[" + child;
          for (size_t k = 0; k < parts.size(); ++k) s += (k ? item_sep + child : "") + parts[k];
          return s + base + "]";
        }
        std::string s = "[";
        for (size_t k = 0; k < parts.size(); ++k) s += (k ? item_sep : "") + parts[k];
        return s + "]";
      }
      auto entries = v.obj->entries;
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [k, x] : entries) {
        std::string e = json_string(k, o.ensure_ascii) + key_sep + to_json(x, o, depth + 1, undefined_as_null);
        parts.push_back(o.indent > 0 ? child + e : e);
      }
      std::string s = "{";
      for (size_t k = 0; k < parts.size(); ++k) s += (k ? item_sep : "") + parts[k];
      return s + (o.indent > 0 && !parts.empty() ? base : "") + "}";
    }
    case ValueKind::kFunction: throw_error("cannot convert a function to JSON");
  }
  return "null";
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) throw_error("template input nested more than 256 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::null();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::integer(static_cast<int64_t>(u)) : Value::floating(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: {
      double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9007199254740992.0) return Value::integer(static_cast<int64_t>(d));
      return Value::floating(d);
    }
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      if (!is_valid_utf8(s)) throw_error("template input contains a string that is not valid UTF-8");
      return Value::string(s);
    }
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& x : j) a.push_back(from_json(x, depth + 1));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!is_valid_utf8(it.key())) throw_error("template input contains a key that is not valid UTF-8");
        o.entries.emplace_back(it.key(), from_json(it.value(), depth + 1));
      }
      return Value::object(std::move(o));
    }
    default: return Value::undefined();
  }
}

bool strict_equals(const Value& a, const Value& b) {
  bool an = a.kind == ValueKind::kInt || a.kind == ValueKind::kFloat;
  bool bn = b.kind == ValueKind::kInt || b.kind == ValueKind::kFloat;
  if (an && bn) return a.number() == b.number();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case ValueKind::kUndefined: case ValueKind::kNull: return true;
    case ValueKind::kBool: return a.b == b.b;
    case ValueKind::kString: return a.s == b.s;
    case ValueKind::kArray: return a.arr == b.arr;
    case ValueKind::kObject: case ValueKind::kNamespace: return a.obj == b.obj;
    case ValueKind::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

bool loose_equals(const Value& a, const Value& b) {
  auto nullish = [](const Value& v) { return v.kind == ValueKind::kNull || v.kind == ValueKind::kUndefined; };
  if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
  auto numeric = [](const Value& v) {
    return v.kind == ValueKind::kInt || v.kind == ValueKind::kFloat || v.kind == ValueKind::kBool;
  };
  if (numeric(a) && numeric(b)) return a.number() == b.number();
  if ((a.is_string() && numeric(b)) || (numeric(a) && b.is_string())) {
    const Value& s = a.is_string() ? a : b;
    const Value& n = a.is_string() ? b : a;
    std::string t = s.s;
    t.erase(0, t.find_first_not_of(" \t\n\r"));
    t.erase(t.find_last_not_of(" \t\n\r") + 1);
    if (t.empty()) return n.number() == 0;
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    return end != nullptr && *end == '\0' && d == n.number();
  }
  return strict_equals(a, b);
}

}  // namespace mxserve::tokenizer::jinja
