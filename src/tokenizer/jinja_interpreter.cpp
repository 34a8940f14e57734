// Jinja interpreter (see jinja_interpreter.h).
#include "tokenizer/jinja_interpreter.h"

#include <algorithm>
#include <cmath>

namespace mxserve::tokenizer::jinja {

namespace {
struct BreakSignal {};
struct ContinueSignal {};

struct DepthGuard {
  int& d;
  explicit DepthGuard(int& depth) : d(depth) {
    if (++d > Interpreter::kMaxDepth) {
      --d;
      throw_error("template recursion or nesting too deep");
    }
  }
  ~DepthGuard() { --d; }
};
}  // namespace

std::string Interpreter::render(const Node& program, Env& globals) { return block(program.body, globals); }

std::string Interpreter::block(const NodeList& stmts, Env& env) {
  std::string out;
  for (const auto& s : stmts) {
    Value v = eval(*s, env);
    if (v.kind == ValueKind::kNull || v.kind == ValueKind::kUndefined) continue;
    out += v.kind == ValueKind::kString ? v.s : v.str();
    if (out.size() > kMaxOutputBytes) throw_error("rendered output exceeds the size limit");
  }
  return out;
}

Value Interpreter::eval(const Node& n, Env& env) {
  DepthGuard guard(depth_);
  try {
    return eval_inner(n, env);
  } catch (RenderError& e) {
    if (e.line == 0) e.line = n.line;
    throw;
  }
}

void Interpreter::eval_args(const NodeList& args, Env& env, std::vector<Value>& pos, Object& kw) {
  for (const auto& a : args) {
    if (a->kind == NodeKind::kSpread) {
      Value v = eval(*a->a, env);
      if (!v.is_array()) throw_error(std::string("cannot unpack a ") + v.type_name());
      pos.insert(pos.end(), v.arr->begin(), v.arr->end());
    } else if (a->kind != NodeKind::kKwArg && a->kind != NodeKind::kKwSpread) {
      pos.push_back(eval(*a, env));
    }
  }
  for (const auto& a : args) {
    if (a->kind == NodeKind::kKwArg) {
      if (kw.find(a->str)) throw_error("got multiple values for keyword argument '" + a->str + "'");
      kw.set(a->str, eval(*a->a, env));
    } else if (a->kind == NodeKind::kKwSpread) {
      Value v = eval(*a->a, env);
      if (!v.is_object()) throw_error(std::string("argument after ** must be a mapping, not ") + v.type_name());
      for (const auto& [k, x] : v.obj->entries) {
        if (kw.find(k)) throw_error("got multiple values for keyword argument '" + k + "'");
        kw.set(k, x);
      }
    }
  }
}

Value Interpreter::eval_inner(const Node& n, Env& env) {
  switch (n.kind) {
    case NodeKind::kProgram: return Value::string(block(n.body, env));
    case NodeKind::kComment: return Value::null();
    case NodeKind::kSet: set_statement(n, env); return Value::null();
    case NodeKind::kIf: {
      Value test = eval(*n.a, env);
      return Value::string(block(test.truthy() ? n.body : n.alt, env));
    }
    case NodeKind::kFor: return Value::string(for_loop(n, env));
    case NodeKind::kMacro: return define_macro(n, env);
    case NodeKind::kBreak: throw BreakSignal{};
    case NodeKind::kContinue: throw ContinueSignal{};
    case NodeKind::kFilterStatement: {
      Value body = Value::string(block(n.body, env));
      return filter(body, *n.a, env);
    }
    case NodeKind::kIntLit: return Value::integer(n.int_val);
    case NodeKind::kFloatLit: return Value::floating(n.float_val);
    case NodeKind::kStrLit: return Value::string(n.str);
    case NodeKind::kArrayLit: case NodeKind::kTupleLit: {
      Array a;
      for (const auto& x : n.args) a.push_back(eval(*x, env));
      return Value::array(std::move(a), n.kind == NodeKind::kTupleLit);
    }
    case NodeKind::kObjectLit: {
      Object o;
      for (size_t k = 0; k + 1 < n.args.size(); k += 2) {
        Value key = eval(*n.args[k], env);
        if (!key.is_string()) throw_error(std::string("dict keys must be strings, got ") + key.type_name());
        o.set(key.s, eval(*n.args[k + 1], env));
      }
      return Value::object(std::move(o));
    }
    case NodeKind::kIdentifier: return env.lookup(n.str);
    case NodeKind::kMember: return member(n, env);
    case NodeKind::kCall: return call(n, env);
    case NodeKind::kUnary: {
      Value v = eval(*n.a, env);
      if (n.str == "not") return Value::boolean(!v.truthy());
      if (v.is_number() || v.kind == ValueKind::kBool) {
        double sign = n.str == "-" ? -1 : 1;
        if (v.kind == ValueKind::kFloat) return Value::floating(sign * v.f);
        return Value::integer(static_cast<int64_t>(sign) * (v.kind == ValueKind::kBool ? (v.b ? 1 : 0) : v.i));
      }
      throw_error("unary '" + n.str + "' is not defined for a " + v.type_name());
    }
    case NodeKind::kBinary: return binary(n, env);
    case NodeKind::kFilter: {
      Value operand = eval(*n.a, env);
      return filter(operand, *n.b, env);
    }
    case NodeKind::kTest: {
      Value operand = eval(*n.a, env);
      bool r = apply_test(n.str, operand);
      return Value::boolean(n.flag ? !r : r);
    }
    case NodeKind::kSelect: {
      Value test = eval(*n.b, env);
      if (!test.truthy()) return Value::undefined();
      return eval(*n.a, env);
    }
    case NodeKind::kTernary: return eval(eval(*n.a, env).truthy() ? *n.b : *n.c, env);
    default: throw_error("unexpected expression");
  }
}

Value Interpreter::binary(const Node& n, Env& env) {
  const std::string& op = n.str;
  Value l = eval(*n.a, env);
  if (op == "and") return l.truthy() ? eval(*n.b, env) : l;
  if (op == "or") return l.truthy() ? l : eval(*n.b, env);
  Value r = eval(*n.b, env);
  if (op == "==") return Value::boolean(loose_equals(l, r));
  if (op == "!=") return Value::boolean(!loose_equals(l, r));
  if (l.is_undefined() || r.is_undefined()) {
    if (r.is_undefined() && (op == "in" || op == "not in")) return Value::boolean(op == "not in");
    throw_error("cannot apply '" + op + "' to an undefined value");
  }
  if (l.is_null() || r.is_null()) throw_error("cannot apply '" + op + "' to none");
  if (op == "~") return Value::string(l.raw_str() + r.raw_str());
  auto numeric_like = [](const Value& v) { return v.is_number() || v.kind == ValueKind::kBool; };
  if (op == "**" && numeric_like(l) && numeric_like(r)) {
    double a = l.number(), b = r.number();
    if (a == 0 && b < 0) throw_error("0.0 cannot be raised to a negative power");
    double res = std::pow(a, b);
    if (!std::isfinite(res)) throw_error("exponentiation result is not a finite real number");
    bool is_float = l.kind == ValueKind::kFloat || r.kind == ValueKind::kFloat || b < 0;
    return is_float ? Value::floating(res) : Value::integer(static_cast<int64_t>(res));
  }
  if (l.is_number() && r.is_number()) {
    bool is_float = l.kind == ValueKind::kFloat || r.kind == ValueKind::kFloat;
    double a = l.number(), b = r.number();
    auto num = [&](double x) {
      if (is_float) return Value::floating(x);
      return Value::integer(static_cast<int64_t>(x));
    };
    if (op == "+") return is_float ? Value::floating(a + b) : Value::integer(l.i + r.i);
    if (op == "-") return is_float ? Value::floating(a - b) : Value::integer(l.i - r.i);
    if (op == "*") return is_float ? Value::floating(a * b) : Value::integer(l.i * r.i);
    if (op == "/") {
      if (b == 0) throw_error("division by zero");
      return Value::floating(a / b);
    }
    if (op == "//") {
      if (b == 0) throw_error("division by zero");
      return num(std::floor(a / b));
    }
    if (op == "%") {
      if (b == 0) throw_error("modulo by zero");
      return is_float ? Value::floating(std::fmod(a, b)) : Value::integer(l.i % r.i);
    }
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == "<=") return Value::boolean(a <= b);
    if (op == ">=") return Value::boolean(a >= b);
  } else if (l.is_array() && r.is_array()) {
    if (op == "+") {
      Array a = *l.arr;
      a.insert(a.end(), r.arr->begin(), r.arr->end());
      return Value::array(std::move(a));
    }
  } else if (r.is_array()) {
    bool member = std::any_of(r.arr->begin(), r.arr->end(), [&](const Value& x) { return strict_equals(x, l); });
    if (op == "in") return Value::boolean(member);
    if (op == "not in") return Value::boolean(!member);
  }
  if ((l.is_string() || r.is_string()) && op == "+") return Value::string(l.raw_str() + r.raw_str());
  if (l.is_string() && r.is_string()) {
    if (op == "in") return Value::boolean(r.s.find(l.s) != std::string::npos);
    if (op == "not in") return Value::boolean(r.s.find(l.s) == std::string::npos);
  }
  if (l.is_string() && r.is_object()) {
    if (op == "in") return Value::boolean(r.obj->find(l.s) != nullptr);
    if (op == "not in") return Value::boolean(r.obj->find(l.s) == nullptr);
  }
  throw_error("operator '" + op + "' is not defined between " + l.type_name() + " and " + r.type_name());
}

Value Interpreter::member(const Node& n, Env& env) {
  Value obj = eval(*n.a, env);
  const Node& p = *n.b;
  if (n.flag && p.kind == NodeKind::kSlice) {
    Value start = p.a ? eval(*p.a, env) : Value::undefined();
    Value stop = p.b ? eval(*p.b, env) : Value::undefined();
    Value step = p.c ? eval(*p.c, env) : Value::undefined();
    return slice_value(obj, start, stop, step);
  }
  Value prop;
  if (n.flag) prop = eval(p, env);
  else if (p.kind == NodeKind::kIntLit) prop = Value::integer(p.int_val);
  else prop = Value::string(p.str);
  return get_member(obj, prop);
}

Value Interpreter::call(const Node& n, Env& env) {
  std::vector<Value> args;
  Object kw;
  eval_args(n.args, env, args, kw);
  if (!kw.entries.empty()) args.push_back(Value::object(std::move(kw), true));
  Value fn = eval(*n.a, env);
  if (fn.kind != ValueKind::kFunction) {
    std::string what = n.a->kind == NodeKind::kIdentifier ? "'" + n.a->str + "'"
                       : n.a->kind == NodeKind::kMember && !n.a->flag ? "method '" + n.a->b->str + "'"
                                                                       : "expression";
    throw_error("cannot call " + what + ": it is " + (fn.is_undefined() ? "undefined (unsupported function or method?)" : std::string("a ") + fn.type_name()));
  }
  return (*fn.fn)(args, env);
}

Value Interpreter::filter(const Value& operand, const Node& f, Env& env) {
  std::vector<Value> args;
  Object kw;
  if (f.kind == NodeKind::kCall) {
    eval_args(f.args, env, args, kw);
    return apply_filter(f.a->str, operand, args, kw, true);
  }
  return apply_filter(f.str, operand, args, kw, false);
}

void Interpreter::set_statement(const Node& n, Env& env) {
  Value rhs = n.b ? eval(*n.b, env) : Value::string(block(n.body, env));
  const Node& target = *n.a;
  if (target.kind == NodeKind::kIdentifier) {
    env.set(target.str, std::move(rhs));
  } else if (target.kind == NodeKind::kTupleLit) {
    if (!rhs.is_array()) throw_error(std::string("cannot unpack a ") + rhs.type_name() + " in set");
    if (rhs.arr->size() != target.args.size())
      throw_error(std::string("too ") + (target.args.size() > rhs.arr->size() ? "few" : "many") + " items to unpack in set");
    for (size_t k = 0; k < target.args.size(); ++k) {
      if (target.args[k]->kind != NodeKind::kIdentifier) throw_error("cannot unpack to a non-identifier in set");
      env.set(target.args[k]->str, (*rhs.arr)[k]);
    }
  } else if (target.kind == NodeKind::kMember) {
    Value obj = eval(*target.a, env);
    if (obj.kind != ValueKind::kNamespace) throw_error("cannot assign an attribute of a non-namespace object");
    if (target.flag || target.b->kind != NodeKind::kIdentifier) throw_error("cannot assign to a computed member");
    obj.obj->set(target.b->str, std::move(rhs));
  } else {
    throw_error("invalid assignment target");
  }
}

std::string Interpreter::for_loop(const Node& n, Env& env) {
  Env scope(&env);
  const Node* test = nullptr;
  Value iterable;
  if (n.b->kind == NodeKind::kSelect) {
    iterable = eval(*n.b->a, scope);
    test = n.b->b.get();
  } else {
    iterable = eval(*n.b, scope);
  }
  if (iterable.is_object()) {
    Array keys;
    for (const auto& [k, v] : iterable.obj->entries) keys.push_back(Value::string(k));
    iterable = Value::array(std::move(keys));
  }
  if (!iterable.is_array()) throw_error(std::string("cannot iterate over a ") + iterable.type_name());
  const Node& var = *n.a;
  auto bind = [&](Env& e, const Value& cur) {
    if (var.kind == NodeKind::kIdentifier) {
      e.set(var.str, cur);
      return;
    }
    if (!cur.is_array()) throw_error(std::string("cannot unpack a ") + cur.type_name());
    if (cur.arr->size() != var.args.size())
      throw_error(std::string("too ") + (var.args.size() > cur.arr->size() ? "few" : "many") + " items to unpack");
    for (size_t k = 0; k < var.args.size(); ++k) {
      if (var.args[k]->kind != NodeKind::kIdentifier) throw_error("cannot unpack to a non-identifier");
      e.set(var.args[k]->str, (*cur.arr)[k]);
    }
  };
  std::vector<Value> items;
  for (const Value& cur : *iterable.arr) {
    if (test != nullptr) {
      Env loop_scope(&scope);
      bind(loop_scope, cur);
      if (!eval(*test, loop_scope).truthy()) continue;
    }
    items.push_back(cur);
  }
  std::string out;
  bool no_iteration = true;
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    Object loop;
    loop.entries.reserve(9);
    loop.entries.emplace_back("index", Value::integer(i + 1));
    loop.entries.emplace_back("index0", Value::integer(i));
    loop.entries.emplace_back("revindex", Value::integer(len - i));
    loop.entries.emplace_back("revindex0", Value::integer(len - i - 1));
    loop.entries.emplace_back("first", Value::boolean(i == 0));
    loop.entries.emplace_back("last", Value::boolean(i == len - 1));
    loop.entries.emplace_back("length", Value::integer(len));
    loop.entries.emplace_back("previtem", i > 0 ? items[i - 1] : Value::undefined());
    loop.entries.emplace_back("nextitem", i < len - 1 ? items[i + 1] : Value::undefined());
    scope.set("loop", Value::object(std::move(loop)));
    bind(scope, items[i]);
    try {
      out += block(n.body, scope);
    } catch (const ContinueSignal&) {
      continue;
    } catch (const BreakSignal&) {
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) out += block(n.alt, scope);
  return out;
}

Value Interpreter::define_macro(const Node& n, Env& env) {
  const Node* node = &n;
  Interpreter* self = this;
  bool uses_kwargs = std::find(n.referenced.begin(), n.referenced.end(), "kwargs") != n.referenced.end();
  bool uses_varargs = std::find(n.referenced.begin(), n.referenced.end(), "varargs") != n.referenced.end();
  env.set(n.str, Value::function([node, self, uses_kwargs, uses_varargs](std::vector<Value>& args, Env& caller) {
            Env scope(&caller);
            std::vector<Value> pos = args;
            Object kw;
            if (!pos.empty() && pos.back().is_kwargs) {
              kw = *pos.back().obj;
              pos.pop_back();
            }
            std::vector<std::pair<std::string, const Node*>> pending;
            for (size_t k = 0; k < node->args.size(); ++k) {
              const Node& p = *node->args[k];
              const std::string& name = p.str;
              bool have = k < pos.size();
              Value v = have ? pos[k] : Value::undefined();
              if (!have) {
                for (auto it = kw.entries.begin(); it != kw.entries.end(); ++it) {
                  if (it->first == name) {
                    v = it->second;
                    have = true;
                    kw.entries.erase(it);
                    break;
                  }
                }
              }
              if (!have && p.kind == NodeKind::kKwArg) pending.emplace_back(name, p.a.get());
              scope.set(name, v);
            }
            if (uses_kwargs) scope.set("kwargs", Value::object(kw));
            else if (!kw.entries.empty())
              throw_error("macro '" + node->str + "' takes no keyword argument '" + kw.entries.front().first + "'");
            if (uses_varargs) {
              Array extra;
              for (size_t k = node->args.size(); k < pos.size(); ++k) extra.push_back(pos[k]);
              scope.set("varargs", Value::array(std::move(extra)));
            } else if (pos.size() > node->args.size()) {
              throw_error("macro '" + node->str + "' takes not more than " + std::to_string(node->args.size()) + " argument(s)");
            }
            for (const auto& [name, def] : pending) scope.set(name, self->eval(*def, scope));
            return Value::string(self->block(node->body, scope));
          }));
  return Value::null();
}

}  // namespace mxserve::tokenizer::jinja
