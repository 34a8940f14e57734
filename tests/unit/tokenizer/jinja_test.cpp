// Jinja renderer unit tests: language features beyond the conformance suite's templates, and
// errors that name the construct and its line (unsupported statements / filters / tests,
// raise_exception, runaway nesting) instead of rendering something different.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace mxserve::tokenizer {
namespace {

using nlohmann::json;

std::string render(const std::string& src, const json& ctx = json::object()) {
  auto t = ChatTemplate::parse(src);
  if (!t.is_ok()) return "PARSE ERROR: " + t.status().message();
  auto r = t->render(ctx);
  if (!r.is_ok()) return "RENDER ERROR: " + r.status().message();
  return *r;
}

TEST(Jinja, LoopsConditionalsAndLoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}:{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
                   {{"xs", {"a", "b", "c"}}}),
            "1:a,2:b,3:c");
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}", {{"xs", {1, 2, 3}}}), "23");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
                   {{"xs", {1, 2, 3, 4, 5}}}),
            "13");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}}}}), "a=1;");
  EXPECT_EQ(render("{{ xs[::-1] | join(',') }}|{{ xs[1:] }}|{{ 'abc'[-1] }}", {{"xs", {1, 2, 3}}}), "3,2,1|[2, 3]|c");
}

TEST(Jinja, SetNamespaceMacroWhitespace) {
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bo') }} {{ greet('Al', punct='?') }}"),
            "Hi Bo! Hi Al?");
  EXPECT_EQ(render("  {%- if true -%}  x  {%- endif -%}  "), "x");
  EXPECT_EQ(render("a\n  {% if true %}\nb\n  {% endif %}\nc\n"), "a\nb\nc");
  EXPECT_EQ(render("{% set x %}block {{ 1 + 2 }}{% endset %}{{ x | upper }}"), "BLOCK 3");
}

TEST(Jinja, StringsFiltersTests) {
  EXPECT_EQ(render("{{ s.strip() }}|{{ s.split(',')[1] }}|{{ s.startswith(' a') }}|{{ 'x' ~ 1 ~ none is none }}",
                   {{"s", " a,b "}}),
            "a,b|b |true|x1true");
  EXPECT_EQ(render("{{ '\\n\\nhi\\n'.strip('\\n') }}"), "hi");
  EXPECT_EQ(render("{{ d | tojson }}|{{ d | tojson(indent=2) }}", {{"d", {{"a", {1, "é"}}}}}),
            "{\"a\": [1, \"é\"]}|{\n  \"a\": [\n    1,\n    \"é\"\n  ]\n}");
  EXPECT_EQ(render("{{ 'é' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
  EXPECT_EQ(render("{{ x is defined }}{{ y is not defined }}{{ [] is iterable }}{{ {} is mapping }}{{ 3 is odd }}"),
            "falsetruetruetruetrue");
  EXPECT_EQ(render("{{ xs | length }} {{ 'abc' | length }} {{ missing | default('d') }} {{ 7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }}",
                   {{"xs", {1, 2}}}),
            "2 3 d 3 3.5 1024");
}

void expect_error(const std::string& src, const std::string& what, int line, const json& ctx = json::object()) {
  std::string r = render(src, ctx);
  EXPECT_NE(r.find("ERROR"), std::string::npos) << src.substr(0, 200) << " rendered: " << r.substr(0, 200);
  EXPECT_NE(r.find(what), std::string::npos) << r.substr(0, 300);
  EXPECT_NE(r.find("line " + std::to_string(line)), std::string::npos) << r.substr(0, 300);
}

TEST(Jinja, UnsupportedConstructsNameThemselvesAndTheirLine) {
  expect_error("a\nb\n{% include 'other.jinja' %}", "include", 3);
  expect_error("{% extends 'base' %}", "extends", 1);
  expect_error("x\n{{ y | wordwrap }}", "wordwrap", 2);
  expect_error("\n\n\n{% if x is divisibleby 3 %}{% endif %}", "divisibleby", 4);
  expect_error("{% raw %}{% endraw %}", "raw", 1);
  expect_error("line1\n{{ raise_exception('bad role') }}", "bad role", 2);
  expect_error("{% for m in messages %}\n{{ m.content.format(1) }}{% endfor %}", "format", 2,
               {{"messages", {{{"content", "x"}}}}});
  expect_error("{% if x %}", "endif", 1);
  expect_error("{{ 'unterminated }}", "unterminated", 1);
}

TEST(Jinja, HostileTemplatesFailCleanly) {
  expect_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "nesting", 1);
  expect_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "too deep", 1);
  std::string r = render("{% for i in range(100000000) %}{% endfor %}");
  EXPECT_NE(r.find("too large"), std::string::npos);
  EXPECT_EQ(render("{{ '\\xff' }}").find("ERROR"), std::string::npos);
  // Invalid UTF-8 nested in the inputs is an error, not garbage in the prompt.
  auto t = ChatTemplate::parse("{{ messages[0].content }}");
  ASSERT_TRUE(t.is_ok());
  OrderedJson ctx = {{"messages", {{{"content", std::string("bad \xC3")}}}}};
  auto r2 = t->render(ctx);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("UTF-8"), std::string::npos);
  json plain = {{"messages", {{{"content", std::string("bad \xC3")}}}}};
  EXPECT_FALSE(t->render(plain).is_ok());
}

}  // namespace
}  // namespace mxserve::tokenizer
