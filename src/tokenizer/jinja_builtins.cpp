// Jinja built-ins (see jinja_builtins.h). Follows @huggingface/jinja 0.5.x runtime.ts, except
// strip/lstrip/rstrip with a `chars` argument, which strip those characters (Python semantics;
// the JS runtime ignores the argument) -- see docs/tokenizer.md.
#include "tokenizer/jinja_builtins.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer::jinja {

Value Env::lookup(const std::string& name) const {
  for (const Env* e = this; e != nullptr; e = e->parent)
    for (const auto& [k, v] : e->vars)
      if (k == name) return v;
  return Value::undefined();
}
void Env::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}
bool Env::has_own(const std::string& name) const {
  for (const auto& [k, v] : vars)
    if (k == name) return true;
  return false;
}

namespace {

std::vector<char32_t> code_points(const std::string& s) {
  std::vector<char32_t> out;
  size_t p = 0;
  while (p < s.size()) out.push_back(decode_utf8(s, p));
  return out;
}
std::string from_code_points(const std::vector<char32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) append_utf8(out, cps[k]);
  return out;
}
size_t utf16_length(const std::string& s) {
  size_t n = 0;
  for (char32_t cp : code_points(s)) n += cp >= 0x10000 ? 2 : 1;
  return n;
}
std::string case_map(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) u.toUpper(icu::Locale::getRoot());
  else u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}
// Strips JS whitespace (no chars) or any of `chars` from either end.
std::string strip(const std::string& s, bool left, bool right, const Value* chars) {
  std::vector<char32_t> cps = code_points(s);
  std::vector<char32_t> set;
  if (chars != nullptr) set = code_points(chars->s);
  auto strip_it = [&](char32_t c) {
    return chars == nullptr ? is_js_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}
bool is_word_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

const Value* kwarg(const Object& kw, const char* name) { return kw.find(name); }
const Value* arg_or_kw(std::vector<Value>& args, size_t i, const Object& kw, const char* name) {
  if (i < args.size()) return &args[i];
  return kw.find(name);
}

Value string_method(const std::string& self, const std::string& name) {
  auto fn = [&](auto body) { return Value::function(body); };
  if (name == "length") return Value::integer(static_cast<int64_t>(utf16_length(self)));
  std::string s = self;
  if (name == "upper") return fn([s](std::vector<Value>&, Env&) { return Value::string(case_map(s, true)); });
  if (name == "lower") return fn([s](std::vector<Value>&, Env&) { return Value::string(case_map(s, false)); });
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return fn([s, l, r](std::vector<Value>& a, Env&) {
      const Value* chars = !a.empty() && a[0].is_string() ? &a[0] : nullptr;
      return Value::string(strip(s, l, r, chars));
    });
  }
  if (name == "title")
    return fn([s](std::vector<Value>&, Env&) {
      std::string out = s;
      for (size_t k = 0; k < out.size(); ++k)
        if (is_word_byte(out[k]) && (k == 0 || !is_word_byte(out[k - 1]))) out[k] = static_cast<char>(std::toupper(out[k]));
      return Value::string(out);
    });
  if (name == "capitalize")
    return fn([s](std::vector<Value>&, Env&) {
      if (s.empty()) return Value::string(s);
      size_t p = 0;
      decode_utf8(s, p);
      return Value::string(case_map(s.substr(0, p), true) + s.substr(p));
    });
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return fn([s, starts, name](std::vector<Value>& a, Env&) {
      if (a.empty()) throw_error(name + "() requires at least one argument");
      auto test = [&](const std::string& p) {
        return starts ? s.rfind(p, 0) == 0 : (s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0);
      };
      if (a[0].is_string()) return Value::boolean(test(a[0].s));
      if (a[0].is_array()) {
        for (const Value& v : *a[0].arr) {
          if (!v.is_string()) throw_error(name + "() tuple elements must be strings");
          if (test(v.s)) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      throw_error(name + "() argument must be a string or tuple of strings");
    });
  }
  if (name == "split")
    return fn([s](std::vector<Value>& a, Env&) {
      Value sep = a.size() > 0 ? a[0] : Value::null();
      Value maxv = a.size() > 1 ? a[1] : Value::integer(-1);
      if (!sep.is_string() && !sep.is_null()) throw_error("split(): sep must be a string or none");
      if (maxv.kind != ValueKind::kInt) throw_error("split(): maxsplit must be an integer");
      int64_t maxsplit = maxv.i;
      Array out;
      if (sep.is_null()) {
        std::vector<char32_t> cps = code_points(s);
        size_t k = 0;
        while (k < cps.size() && is_js_space(cps[k])) ++k;
        while (k < cps.size()) {
          size_t st = k;
          while (k < cps.size() && !is_js_space(cps[k])) ++k;
          if (maxsplit != -1 && static_cast<int64_t>(out.size()) >= maxsplit) {
            out.push_back(Value::string(from_code_points(cps, st, cps.size())));
            break;
          }
          out.push_back(Value::string(from_code_points(cps, st, k)));
          while (k < cps.size() && is_js_space(cps[k])) ++k;
        }
      } else {
        if (sep.s.empty()) throw_error("split(): empty separator");
        size_t start = 0;
        while (true) {
          if (maxsplit != -1 && static_cast<int64_t>(out.size()) >= maxsplit) {
            out.push_back(Value::string(s.substr(start)));
            break;
          }
          size_t p = s.find(sep.s, start);
          if (p == std::string::npos) {
            out.push_back(Value::string(s.substr(start)));
            break;
          }
          out.push_back(Value::string(s.substr(start, p - start)));
          start = p + sep.s.size();
        }
      }
      return Value::array(std::move(out));
    });
  if (name == "replace")
    return fn([s](std::vector<Value>& a, Env&) {
      if (a.size() < 2) throw_error("replace() requires at least two arguments");
      if (!a[0].is_string() || !a[1].is_string()) throw_error("replace() arguments must be strings");
      int64_t count = -1;
      if (a.size() > 2) {
        const Value* c = a[2].is_kwargs ? a[2].obj->find("count") : &a[2];
        if (c != nullptr && c->kind == ValueKind::kInt) count = c->i;
        else if (c != nullptr && !c->is_null()) throw_error("replace() count must be an integer or none");
      }
      const std::string& from = a[0].s;
      const std::string& to = a[1].s;
      if (count == 0) return Value::string(s);
      std::string out;
      int64_t done = 0;
      if (from.empty()) {
        std::vector<char32_t> cps = code_points(s);
        for (size_t k = 0; k <= cps.size(); ++k) {
          if (count < 0 || done < count) { out += to; ++done; }
          if (k < cps.size()) append_utf8(out, cps[k]);
        }
        return Value::string(out);
      }
      size_t prev = 0;
      for (size_t p = s.find(from); p != std::string::npos && (count < 0 || done < count); p = s.find(from, prev)) {
        out.append(s, prev, p - prev);
        out += to;
        prev = p + from.size();
        ++done;
      }
      out.append(s, prev, std::string::npos);
      return Value::string(out);
    });
  return Value::undefined();
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) throw_error(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) throw_error(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
  auto numeric = [](const Value& v) { return v.is_number() || v.kind == ValueKind::kBool; };
  if (numeric(a) && numeric(b)) return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  if (a.kind != b.kind) throw_error(std::string("cannot compare different types: ") + a.type_name() + " and " + b.type_name());
  if (a.is_string()) {
    std::string x = case_sensitive ? a.s : case_map(a.s, false);
    std::string y = case_sensitive ? b.s : case_map(b.s, false);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  throw_error(std::string("cannot compare type ") + a.type_name());
}

Value object_method(const Value& self, const std::string& name) {
  std::shared_ptr<Object> o = self.obj;
  auto fn = [&](auto body) { return Value::function(body); };
  if (name == "get")
    return fn([o](std::vector<Value>& a, Env&) {
      if (a.empty() || !a[0].is_string()) throw_error("dict.get(): key must be a string");
      if (const Value* v = o->find(a[0].s)) return *v;
      return a.size() > 1 ? a[1] : Value::null();
    });
  if (name == "items" || name == "keys" || name == "values")
    return fn([o, name](std::vector<Value>&, Env&) {
      Array out;
      for (const auto& [k, v] : o->entries) {
        if (name == "items") out.push_back(Value::array({Value::string(k), v}));
        else if (name == "keys") out.push_back(Value::string(k));
        else out.push_back(v);
      }
      return Value::array(std::move(out));
    });
  if (name == "dictsort")
    return fn([o](std::vector<Value>& a, Env&) {
      Object kw;
      std::vector<Value> pos;
      for (const Value& v : a) {
        if (v.is_kwargs) kw = *v.obj;
        else pos.push_back(v);
      }
      const Value* cs = arg_or_kw(pos, 0, kw, "case_sensitive");
      const Value* by = arg_or_kw(pos, 1, kw, "by");
      const Value* rev = arg_or_kw(pos, 2, kw, "reverse");
      bool case_sensitive = cs != nullptr && cs->truthy();
      bool by_value = by != nullptr && by->is_string() && by->s == "value";
      if (by != nullptr && (!by->is_string() || (by->s != "key" && by->s != "value")))
        throw_error("dictsort: by must be 'key' or 'value'");
      bool reverse = rev != nullptr && rev->truthy();
      Array items;
      for (const auto& [k, v] : o->entries) items.push_back(Value::array({Value::string(k), v}));
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        int r = compare_values((*x.arr)[by_value ? 1 : 0], (*y.arr)[by_value ? 1 : 0], case_sensitive);
        return reverse ? r > 0 : r < 0;
      });
      return Value::array(std::move(items));
    });
  return Value::undefined();
}

Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_container()) {
      const Value* f = v.obj->find(part);
      v = f ? *f : Value::undefined();
    } else if (v.is_array()) {
      char* end = nullptr;
      long idx = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || idx < 0 || static_cast<size_t>(idx) >= v.arr->size()) return Value::undefined();
      v = (*v.arr)[idx];
    } else {
      return Value::undefined();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

JsonOptions json_options(const Object& kw) {
  JsonOptions o;
  if (const Value* v = kwarg(kw, "indent")) {
    if (v->kind == ValueKind::kInt) o.indent = static_cast<int>(std::clamp<int64_t>(v->i, -1, 64));
    else if (!v->is_null()) throw_error("tojson: indent must be an integer");
  }
  if (const Value* v = kwarg(kw, "ensure_ascii")) {
    if (v->kind != ValueKind::kBool) throw_error("tojson: ensure_ascii must be a boolean");
    o.ensure_ascii = v->b;
  }
  if (const Value* v = kwarg(kw, "sort_keys")) {
    if (v->kind != ValueKind::kBool) throw_error("tojson: sort_keys must be a boolean");
    o.sort_keys = v->b;
  }
  if (const Value* v = kwarg(kw, "separators")) {
    if (v->is_array()) {
      if (v->arr->size() != 2 || !(*v->arr)[0].is_string() || !(*v->arr)[1].is_string())
        throw_error("tojson: separators must be a tuple of two strings");
      o.has_separators = true;
      o.item_sep = (*v->arr)[0].s;
      o.key_sep = (*v->arr)[1].s;
    } else if (!v->is_null()) {
      throw_error("tojson: separators must be a tuple of two strings");
    }
  }
  return o;
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> k = {
      "safe", "tojson", "list", "first", "last", "length", "reverse", "sort", "join", "string", "unique",
      "upper", "lower", "title", "capitalize", "trim", "indent", "int", "float", "abs", "items", "bool",
      "default", "selectattr", "rejectattr", "map", "replace", "keys", "values", "dictsort", "count", "e", "escape"};
  return k;
}

}  // namespace

bool is_supported_filter(const std::string& name) { return filter_names().count(name) > 0; }

bool is_supported_test(const std::string& name) {
  static const std::set<std::string> k = {"boolean", "callable", "odd", "even", "false", "true", "none", "string",
                                          "number", "integer", "iterable", "mapping", "sequence", "lower", "upper",
                                          "defined", "undefined", "equalto", "eq"};
  return k.count(name) > 0;
}

bool apply_test(const std::string& name, const Value& v) {
  if (name == "boolean") return v.kind == ValueKind::kBool;
  if (name == "callable") return v.kind == ValueKind::kFunction;
  if (name == "odd" || name == "even") {
    if (v.kind != ValueKind::kInt) throw_error("cannot apply test '" + name + "' to " + v.type_name());
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "false") return v.kind == ValueKind::kBool && !v.b;
  if (name == "true") return v.kind == ValueKind::kBool && v.b;
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == ValueKind::kInt;
  if (name == "iterable") return v.is_array() || v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "lower") return v.is_string() && v.s == case_map(v.s, false);
  if (name == "upper") return v.is_string() && v.s == case_map(v.s, true);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "equalto" || name == "eq") throw_error("test '" + name + "' needs an argument, which is not supported");
  throw_error("unknown test '" + name + "'");
}

Value get_member(const Value& obj, const Value& prop) {
  if (obj.is_container()) {
    if (!prop.is_string()) throw_error(std::string("cannot access a dict with a ") + prop.type_name() + " key");
    if (const Value* v = obj.obj->find(prop.s)) return *v;
    if (obj.kind == ValueKind::kObject) return object_method(obj, prop.s);
    return Value::undefined();
  }
  if (obj.is_array() || obj.is_string()) {
    if (prop.kind == ValueKind::kInt) {
      if (obj.is_string()) {
        std::vector<char32_t> cps = code_points(obj.s);
        int64_t n = static_cast<int64_t>(cps.size()), k = prop.i < 0 ? prop.i + n : prop.i;
        if (k < 0 || k >= n) return Value::undefined();
        return Value::string(from_code_points(cps, k, k + 1));
      }
      int64_t n = static_cast<int64_t>(obj.arr->size()), k = prop.i < 0 ? prop.i + n : prop.i;
      if (k < 0 || k >= n) return Value::undefined();
      return (*obj.arr)[k];
    }
    if (prop.is_string()) {
      if (obj.is_string()) return string_method(obj.s, prop.s);
      if (prop.s == "length") return Value::integer(static_cast<int64_t>(obj.arr->size()));
      return Value::undefined();
    }
    throw_error(std::string("cannot index a ") + obj.type_name() + " with a " + prop.type_name());
  }
  if (!prop.is_string()) throw_error(std::string("cannot index a ") + obj.type_name() + " with a " + prop.type_name());
  return Value::undefined();
}

Value slice_value(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (!obj.is_array() && !obj.is_string()) throw_error("slice object must be a list or string");
  for (const Value* v : {&start_v, &stop_v, &step_v})
    if (v->kind != ValueKind::kInt && !v->is_undefined()) throw_error("slice indices must be integers");
  std::vector<char32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = code_points(obj.s);
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(obj.arr->size());
  }
  int64_t step = step_v.is_undefined() ? 1 : step_v.i;
  if (step == 0) throw_error("slice step cannot be zero");
  int64_t start, stop;
  if (step > 0) {
    start = start_v.is_undefined() ? 0 : start_v.i;
    start = start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = stop_v.is_undefined() ? n : stop_v.i;
    stop = stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
  } else {
    start = start_v.is_undefined() ? n - 1 : start_v.i;
    start = start < 0 ? std::max<int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = stop_v.is_undefined() ? -1 : stop_v.i;
    stop = stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
  }
  Array out;
  std::string sout;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (obj.is_string()) append_utf8(sout, cps[k]);
    else out.push_back((*obj.arr)[k]);
  }
  return obj.is_string() ? Value::string(sout) : Value::array(std::move(out));
}

Value apply_filter(const std::string& name, const Value& v, std::vector<Value>& args, Object& kw, bool called) {
  auto cannot = [&]() -> Value { throw_error("cannot apply filter '" + name + "' to a " + v.type_name()); };
  if (name == "safe") return v;
  if (name == "tojson") return Value::string(to_json(v, called ? json_options(kw) : JsonOptions{}));
  if (name == "default") {
    Value def = args.size() > 0 ? args[0] : Value::string("");
    const Value* boolean = arg_or_kw(args, 1, kw, "boolean");
    if (v.is_undefined() || (boolean != nullptr && boolean->truthy() && !v.truthy())) return def;
    return v;
  }
  if (called && name == "join") {
    const Value* sep = arg_or_kw(args, 0, kw, "separator");
    std::string sp = sep != nullptr ? (sep->is_string() ? sep->s : (throw_error("join: separator must be a string"), "")) : "";
    std::string out;
    if (v.is_string()) {
      std::vector<char32_t> cps = code_points(v.s);
      for (size_t k = 0; k < cps.size(); ++k) {
        if (k) out += sp;
        append_utf8(out, cps[k]);
      }
    } else if (v.is_array()) {
      for (size_t k = 0; k < v.arr->size(); ++k) out += (k ? sp : "") + (*v.arr)[k].raw_str();
    } else {
      return cannot();
    }
    return Value::string(out);
  }
  if (called && (name == "int" || name == "float")) {
    Value def = args.size() > 0 ? args[0] : kw.find("default") ? *kw.find("default")
                                                              : (name == "int" ? Value::integer(0) : Value::floating(0));
    if (v.is_string()) {
      char* end = nullptr;
      if (name == "int") {
        long long x = std::strtoll(v.s.c_str(), &end, 10);
        return end == v.s.c_str() ? def : Value::integer(x);
      }
      double x = std::strtod(v.s.c_str(), &end);
      return end == v.s.c_str() ? def : Value::floating(x);
    }
    if (v.is_number()) return v;
    if (v.kind == ValueKind::kBool) return name == "int" ? Value::integer(v.b) : Value::floating(v.b);
    return cannot();
  }
  if (v.is_array()) {
    const Array& a = *v.arr;
    if (name == "list") return v;
    if (name == "first") return a.empty() ? Value::undefined() : a.front();
    if (name == "last") return a.empty() ? Value::undefined() : a.back();
    if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(a.size()));
    if (name == "reverse") return Value::array(Array(a.rbegin(), a.rend()));
    if (name == "join") {
      std::string out;
      for (const Value& x : a) out += x.raw_str();
      return Value::string(out);
    }
    if (name == "string") return Value::string(to_json(v, JsonOptions{}, 0, false));
    if (name == "unique") {
      Array out;
      for (const Value& x : a) {
        bool seen = false;
        for (const Value& y : out) seen = seen || strict_equals(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (name == "sort") {
      const Value* rev = arg_or_kw(args, 0, kw, "reverse");
      const Value* cs = arg_or_kw(args, 1, kw, "case_sensitive");
      const Value* attr = arg_or_kw(args, 2, kw, "attribute");
      bool reverse = rev != nullptr && rev->truthy(), case_sensitive = cs != nullptr && cs->truthy();
      std::string path = attr == nullptr || attr->is_null() ? "" : attr->kind == ValueKind::kInt ? std::to_string(attr->i) : attr->s;
      Array out = a;
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        Value xa = path.empty() ? x : attribute_path(x, path), ya = path.empty() ? y : attribute_path(y, path);
        int r = compare_values(xa, ya, case_sensitive);
        return reverse ? r > 0 : r < 0;
      });
      return Value::array(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") {
      bool select = name == "selectattr";
      if (args.empty() || !args[0].is_string()) throw_error(name + ": arguments must be strings");
      std::string test = args.size() > 1 && args[1].is_string() ? args[1].s : "";
      Array out;
      for (const Value& item : a) {
        if (!item.is_container()) throw_error(name + " can only be applied to a list of dicts");
        const Value* f = item.obj->find(args[0].s);
        bool r = f != nullptr && (test.empty() ? f->truthy() : apply_test(test, *f));
        if (r == select) out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    if (name == "map") {
      const Value* attr = kw.find("attribute");
      if (attr == nullptr || !attr->is_string()) throw_error("map: only map(attribute=...) is supported");
      const Value* def = kw.find("default");
      Array out;
      for (const Value& item : a) {
        if (!item.is_container()) throw_error("map: items must be dicts");
        Value x = attribute_path(item, attr->s);
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return Value::array(std::move(out));
    }
    return cannot();
  }
  if (v.is_string()) {
    if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(utf16_length(v.s)));
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      Value m = string_method(v.s, name);
      std::vector<Value> none;
      Env e;
      return (*m.fn)(none, e);
    }
    if (name == "trim") return Value::string(strip(v.s, true, true, nullptr));
    if (name == "join" || name == "string" || name == "e" || name == "escape") return v;
    if (name == "int") {
      char* end = nullptr;
      long long x = std::strtoll(v.s.c_str(), &end, 10);
      return Value::integer(end == v.s.c_str() ? 0 : x);
    }
    if (name == "float") {
      char* end = nullptr;
      double x = std::strtod(v.s.c_str(), &end);
      return Value::floating(end == v.s.c_str() ? 0 : x);
    }
    if (name == "indent") {
      const Value* w = called ? arg_or_kw(args, 0, kw, "width") : nullptr;
      const Value* first = called ? arg_or_kw(args, 1, kw, "first") : nullptr;
      const Value* blank = called ? arg_or_kw(args, 2, kw, "blank") : nullptr;
      if (w != nullptr && w->kind != ValueKind::kInt) throw_error("indent: width must be an integer");
      std::string pad(w != nullptr ? static_cast<size_t>(std::clamp<int64_t>(w->i, 0, 1024)) : 4, ' ');
      std::string out;
      size_t start = 0, line = 0;
      while (true) {
        size_t nl = v.s.find('\n', start);
        std::string ln = v.s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        bool skip = (line == 0 && !(first && first->truthy())) || (ln.empty() && !(blank && blank->truthy()));
        out += (skip ? "" : pad) + ln;
        if (nl == std::string::npos) break;
        out += "\n";
        start = nl + 1;
        ++line;
      }
      return Value::string(out);
    }
    if (name == "replace" && called) {
      Value m = string_method(v.s, "replace");
      std::vector<Value> a = args;
      a.push_back(Value::object(kw, true));
      Env e;
      return (*m.fn)(a, e);
    }
    return cannot();
  }
  if (v.is_number()) {
    if (name == "abs") return v.kind == ValueKind::kInt ? Value::integer(std::llabs(v.i)) : Value::floating(std::fabs(v.f));
    if (name == "int") return Value::integer(static_cast<int64_t>(std::floor(v.number())));
    if (name == "float") return Value::floating(v.number());
    if (name == "string") return Value::string(v.str());
    return cannot();
  }
  if (v.is_object()) {
    if (name == "items" && !called) return (*object_method(v, "items").fn)(args, *std::make_unique<Env>());
    if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(v.obj->entries.size()));
    Value m = object_method(v, name);
    if (m.kind == ValueKind::kFunction) {
      std::vector<Value> a = args;
      if (!kw.entries.empty()) a.push_back(Value::object(kw, true));
      Env e;
      return (*m.fn)(a, e);
    }
    return cannot();
  }
  if (v.kind == ValueKind::kBool) {
    if (name == "bool") return v;
    if (name == "int") return Value::integer(v.b ? 1 : 0);
    if (name == "float") return Value::floating(v.b ? 1.0 : 0.0);
    if (name == "string") return Value::string(v.b ? "true" : "false");
    return cannot();
  }
  return cannot();
}

void install_globals(Env& env) {
  env.set("false", Value::boolean(false));
  env.set("true", Value::boolean(true));
  env.set("none", Value::null());
  env.set("False", Value::boolean(false));
  env.set("True", Value::boolean(true));
  env.set("None", Value::null());
  env.set("namespace", Value::function([](std::vector<Value>& a, Env&) {
            Object o;
            std::vector<Value> pos;
            const Value* kw = nullptr;
            for (const Value& v : a) {
              if (v.is_kwargs) kw = &v;
              else pos.push_back(v);
            }
            if (pos.size() > 1) throw_error("namespace() takes at most 1 positional argument");
            if (pos.size() == 1) {
              if (pos[0].is_object()) o = *pos[0].obj;
              else throw_error(std::string("namespace(): '") + pos[0].type_name() + "' is not a mapping");
            }
            if (kw != nullptr)
              for (const auto& [k, v] : kw->obj->entries) o.set(k, v);
            return Value::ns(std::move(o));
          }));
  env.set("raise_exception", Value::function([](std::vector<Value>& a, Env&) -> Value {
            throw_error("raise_exception: " + (a.empty() ? std::string() : a[0].raw_str()));
          }));
  env.set("range", Value::function([](std::vector<Value>& a, Env&) {
            for (const Value& v : a)
              if (v.kind != ValueKind::kInt) throw_error("range() arguments must be integers");
            if (a.empty() || a.size() > 3) throw_error("range() takes 1 to 3 arguments");
            int64_t start = a.size() == 1 ? 0 : a[0].i, stop = a.size() == 1 ? a[0].i : a[1].i;
            int64_t step = a.size() == 3 ? a[2].i : 1;
            if (step == 0) throw_error("range() step must not be zero");
            Array out;
            for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
              if (out.size() >= 1000000) throw_error("range() too large");
              out.push_back(Value::integer(k));
            }
            return Value::array(std::move(out));
          }));
  env.set("strftime_now", Value::function([](std::vector<Value>& a, Env&) {
            if (a.empty() || !a[0].is_string()) throw_error("strftime_now() needs a format string");
            std::time_t t = std::time(nullptr);
            std::tm tm{};
            localtime_r(&t, &tm);
            char buf[256];
            size_t n = std::strftime(buf, sizeof(buf), a[0].s.c_str(), &tm);
            return Value::string(std::string(buf, n));
          }));
}

}  // namespace mxserve::tokenizer::jinja
