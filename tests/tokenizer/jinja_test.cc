// The Jinja interpreter (engine/jinja/): table tests of what templates render to (each
// expected text is what jinja2 renders, with transformers' options), of the errors for what
// is unsupported or wrong (with the line and column), and of the bounds that keep a hostile
// template from hanging or exhausting the process. The oracle test (tests/reference/) checks
// the same interpreter against jinja2 and @huggingface/jinja on real chat templates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/jinja/json_value.h"
#include "engine/jinja/py_string.h"
#include "engine/jinja/template.h"

namespace pdserve::jinja {
namespace {

constexpr const char* kContext = R"({
  "messages": [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris", "n": 2}}}]}],
  "tools": null, "add_generation_prompt": true, "bos_token": "<s>", "flag": false, "n": 7, "x": 2.5,
  "text": "caf\u00e9 \ud83d\ude00 ok"})";

StatusOr<std::string> render_text(const std::string& source, RenderOptions options = {}) {
  PD_ASSIGN_OR_RETURN(Template t, Template::compile(source));
  static const Value context = from_json(nlohmann::ordered_json::parse(kContext));
  options.now = std::chrono::system_clock::time_point(std::chrono::seconds(1721985300));
  return t.render(context.as_dict(), options);
}

struct Case {
  const char* source;
  const char* want;
};

void expect_renders(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    auto out = render_text(c.source);
    ASSERT_TRUE(out.ok()) << c.source << "\n" << out.status();
    EXPECT_EQ(*out, c.want) << c.source;
  }
}

TEST(Jinja, WhitespaceControlTrimBlocksAndLstripBlocks) {
  expect_renders({
      {"a  {{- 'b' -}}  c", "abc"},
      {"a\n  {%- if true %}b{% endif %}", "ab"},
      {"{% if true %}\nx\n{% endif %}\ny", "x\ny"},       // trim_blocks: the newline after a block tag goes.
      {"  {% if true %}x{% endif %}", "x"},               // lstrip_blocks: spaces before a block tag go.
      {"  {{ 'x' }}", "  x"},                             // ... but not before {{ }}.
      {"a {% if true %}x{% endif %}", "a x"},             // Only from the start of a line.
      {"{% if true +%}\nx{% endif %}", "\nx"},            // '+' keeps the newline.
      {"line\n{# comment #}\nnext", "line\nnext"},
      {"x\n", "x"},                                       // One trailing newline is dropped.
      {"a\r\nb", "a\nb"},
  });
}

TEST(Jinja, Expressions) {
  expect_renders({
      {"{{ 'a\\tb\\n\\u00e9\\x41' }}", "a\tb\n\xc3\xa9" "A"},
      {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }}",
       "7 9 64 3 -4 2 3.5"},
      {"{{ 1.0 }} {{ 1e20 }} {{ 0.0001 }} {{ 1 / 3 }} {{ 2.5e-7 }} {{ x * 2 }}", "1.0 1e+20 0.0001 0.3333333333333333 2.5e-07 5.0"},
      {"{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ (1, 'a') }} {{ (1,) }}", "a1NoneTrue abab [1, 2] (1, 'a') (1,)"},
      {"{{ {'k': 'it\\'s', 'n': none} }} {{ [true, 1.5, \"q\"] }}", "{'k': \"it's\", 'n': None} [True, 1.5, 'q']"},
      {"{{ 1 < 2 < 3 }} {{ 3 < 2 < 4 }} {{ 'a' in 'cat' }} {{ 'k' not in {'k': 1} }} {{ 2 in [1, 2] }} {{ 1 == 1.0 }}",
       "True False True False True True"},
      {"{{ n if flag else 'no' }} {{ 'yes' if not flag }} [{{ 'x' if flag }}] {{ flag or 'f' }} {{ n and 'both' }}",
       "no yes [] f both"},
      {"{{ messages[0].role }} {{ messages[-1]['role'] }} {{ messages.0.role }} [{{ missing }}] [{{ messages[9] }}]",
       "system assistant system [] []"},
      {"{{ text[:4] }}|{{ text[-2:] }}|{{ text[::-1] }}|{{ [1, 2, 3, 4][1::2] }}|{{ messages[1:] | length }}",
       "caf\xc3\xa9|ok|ko \xf0\x9f\x98\x80 \xc3\xa9" "fac|[2, 4]|2"},
      {"{{ text | length }} {{ text.upper() }}", "9 CAF\xc3\x89 \xf0\x9f\x98\x80 OK"},
  });
}

TEST(Jinja, Statements) {
  expect_renders({
      {"{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
       "{{ loop.first | int }}{{ loop.last | int }}{{ loop.length }} {% endfor %}",
       "1032103 2121003 3210013 "},
      {"{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }} {% else %}none{% endfor %}",
       "1:user 2:assistant "},
      {"{% for m in [] %}x{% else %}empty{% endfor %}", "empty"},
      {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;"},
      {"{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
       "024"},
      {"{% for m in messages %}{% if loop.previtem is defined %}{{ loop.previtem.role }}>{% endif %}{% endfor %}",
       "system>user>"},
      // set inside a loop stays in the loop; namespace() carries values out.
      {"{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}", "1"},
      {"{% set ns = namespace(x=1, y='a') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ ns.y }}",
       "4a"},
      {"{% set a, b = [1, 2] %}{{ b }}{{ a }}", "21"},
      {"{% set block %}x{{ 1 + 1 }}{% endset %}{{ block | upper }}", "X2"},
      {"{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}", "mid"},
      {"{% macro m(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(b=3, a=4) }} [{{ m() }}]",
       "1d 12 43 [d]"},
      {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}{{ bos_token }}{% endcall %}",
       "<b><s></b>"},
      {"{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}", "321"},
      {"{% generation %}kept{% endgeneration %}", "kept"},
  });
}

TEST(Jinja, Filters) {
  expect_renders({
      {"[{{ messages[0].content | trim }}] [{{ 'xxhixx' | trim('x') }}]", "[Be brief.] [hi]"},
      {"{{ 'hello world' | upper }} {{ 'HeLLo' | lower }} {{ 'hello wORLD' | capitalize }} {{ \"it's a-b (c)\" | title }}",
       "HELLO WORLD hello Hello world It's A-B (C)"},
      {"{{ 'a-b-c' | replace('-', '+') }} {{ 'a-b-c' | replace('-', '', 1) }} {{ 'one two  three' | wordcount }}",
       "a+b+c ab-c 3"},
      {"{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ 'abc' | first }} {{ [1, 2] | length }} {{ {'a': 1} | count }}",
       "32a 2 1"},
      {"{{ messages | map(attribute='role') | join(', ') }} | {{ [1, 2] | join }} | {{ messages | join('/', attribute='role') }}",
       "system, user, assistant | 12 | system/user/assistant"},
      {"{{ missing | default('d') }} {{ '' | default('e') }}|{{ '' | d('f', true) }} {{ none | default('g') }}",
       "d |f None"},
      {"{{ 'ab' | list }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ '2.5' | float }} {{ 3 | float }} {{ -4 | abs }} {{ 4.7 | int }}",
       "['a', 'b'] 43 0 5 2.5 3.0 4 4"},
      {"{{ {'b': 2, 'a': 1} | items | list }} {{ {'b': 2, 'A': 1} | dictsort }} {{ {'b': 2, 'a': 1} | dictsort(by='value', reverse=true) }}",
       "[('b', 2), ('a', 1)] [('A', 1), ('b', 2)] [('b', 2), ('a', 1)]"},
      {"{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} "
       "{{ messages | rejectattr('tool_calls', 'defined') | length }} {{ messages | selectattr('tool_calls') | length }}",
       "['Hi there'] 2 1"},
      {"{{ [1, 0, none, 2] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [1, 2, 3] | select('gt', 1) | list }}",
       "[1, 2] [2, 4] [2, 3]"},
      {"{{ ['b', 'A', 'a', 'B'] | unique | list }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} "
       "{{ messages | sort(attribute='role') | map(attribute='role') | first }} {{ 'abc' | reverse }} {{ [1, 2] | reverse | list }}",
       "['b', 'A'] ['A', 'b', 'c'] [3, 2, 1] assistant cba [2, 1]"},
      {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent('> ', first=true) }}|{{ 'a\\n\\nb' | indent(1, blank=true) }}",
       "a\n  b\n\n  c|> a\n> b|a\n \n b"},
      {"{{ 5 | string ~ '!' }} {{ '<b>' | safe }} {{ [1, 'a'] | string }}", "5! <b> [1, 'a']"},
      {"{{ messages[2].tool_calls[0].function.arguments | tojson }}", "{\"city\": \"Paris\", \"n\": 2}"},
      {"{{ {'a': [1, {'b': none}], 'e': {}} | tojson(indent=2) }}",
       "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"e\": {}\n}"},
      {"{{ {'b': 'x\"\\n\u00e9', 'a': 1.0} | tojson(separators=(',', ':'), sort_keys=true) }} {{ '\u00e9' | tojson(ensure_ascii=true) }}",
       "{\"a\":1.0,\"b\":\"x\\\"\\n\xc3\xa9\"} \"\\u00e9\""},
  });
}

TEST(Jinja, TestsMethodsAndGlobals) {
  expect_renders({
      {"{{ missing is defined }}{{ n is defined }}{{ missing is undefined }}{{ none is none }}{{ 'a' is string }}"
       "{{ {} is mapping }}{{ [] is mapping }}{{ 'a' is iterable }}{{ 3 is iterable }}{{ [] is sequence }}",
       "FalseTrueTrueTrueTrueTrueFalseTrueFalseTrue"},
      {"{{ 1 is number }}{{ true is number }}{{ 'a' is number }}{{ true is boolean }}{{ 1 is boolean }}{{ 3 is integer }}"
       "{{ 3.0 is float }}{{ flag is false }}{{ 0 is false }}{{ true is true }}",
       "TrueTrueFalseTrueFalseTrueTrueTrueFalseTrue"},
      {"{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ n is not none }}"
       "{{ 'a' is in 'cat' }}{{ 1 is eq 1 }}{{ none is sameas none }}",
       "TrueFalseTrueFalseTrueTrueTrueTrue"},
      {"[{{ '  a b  '.strip() }}] [{{ '--a--'.lstrip('-') }}] [{{ '--a--'.rstrip('-') }}] {{ ' a  b '.split() }} "
       "{{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }}",
       "[a b] [a--] [--a] ['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b c']"},
      {"{{ 'Hello'.startswith('He') }}{{ 'Hello'.startswith(('x', 'H')) }}{{ 'Hello'.endswith('lo') }} {{ 'Hello'.find('l') }}"
       "{{ 'Hello'.find('z') }} {{ 'Hello'.count('l') }} {{ 'a b'.replace(' ', '_') }} {{ 'ab'.upper() }}{{ 'AB'.lower() }} "
       "{{ 'hi yo'.title() }} {{ 'hI'.capitalize() }} {{ '-'.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
       "TrueTrueTrue 2-1 2 a_b ABab Hi Yo Hi a-b ['a', 'b', 'c']"},
      {"{{ messages[0].keys() | list }} {{ messages[1].get('role') }} {{ messages[1].get('nope', 'dflt') }} "
       "{{ messages[1].get('nope') }} {{ messages[1].values() | list }}",
       "['role', 'content'] user dflt None ['user', 'Hi there']"},
      {"{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }} {{ dict(a=1) }} "
       "{{ strftime_now('%d %b %Y %H:%M') }}",
       "[0, 1, 2] [1, 3, 5] [3, 2, 1] {'a': 1} 26 Jul 2024 09:15"},
  });
}

struct ErrorCase {
  const char* source;
  const char* error;  // A part of the message.
};

void expect_fails(const std::vector<ErrorCase>& cases, RenderOptions options = {}) {
  for (const ErrorCase& c : cases) {
    auto out = render_text(c.source, options);
    ASSERT_FALSE(out.ok()) << c.source << " rendered " << *out;
    EXPECT_NE(out.status().message().find(c.error), std::string::npos) << c.source << "\n" << out.status();
  }
}

TEST(Jinja, UnsupportedAndInvalidTemplatesFailToCompileWithThePlace) {
  expect_fails({
      {"{% include 'x.jinja' %}", "template line 1 column 4: the 'include' tag is not supported"},
      {"a\n{% extends 'base' %}", "template line 2 column 4: the 'extends' tag is not supported"},
      {"{% filter upper %}x{% endfilter %}", "the 'filter' tag is not supported"},
      {"{{ x | nosuch }}", "template line 1 column 8: no filter named 'nosuch'"},
      {"{{ x is nosuch }}", "no test named 'nosuch'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
      {"{% for x in y %}", "unclosed 'for' block"},
      {"{% if x %}{% endfor %}", "unexpected 'endfor'"},
      {"{% endif %}", "unexpected 'endif'"},
      {"{% break %}", "'break' outside a for loop"},
      {"{{ 'open }}", "unclosed string literal"},
      {"{{ x", "unclosed '{{'"},
      {"{# never closed", "unclosed comment"},
      {"{{ x ! y }}", "unexpected character '!'"},
      {"{{ f(*args) }}", "*args and **kwargs in calls are not supported"},
      {"{{ '\\N{DASH}' }}", "\\N{...} escapes are not supported"},
  });
}

TEST(Jinja, RenderErrorsNameTheProblemAndThePlace) {
  expect_fails({
      {"{{ raise_exception('Roles must alternate') }}", "template line 1 column 4: Roles must alternate"},
      {"{{ missing.attr }}", "'missing' is undefined"},
      {"{{ missing() }}", "'missing' is undefined"},
      {"{{ 'a'.nosuch() }}", "'str' object has no attribute or item 'nosuch'"},
      {"{{ 1 + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"},
      {"{{ 1 // 0 }}", "division or modulo by zero"},
      {"{{ '%s' % 1 }}", "printf-style '%' string formatting is not supported"},
      {"{{ none.x }}", "'None' has no attribute"},
      {"{{ n | tojson(indent=true) }}", "indent must be an integer or a string"},
      {"{{ missing | tojson }}", "not JSON serializable"},
      {"{% set n.x = 1 %}", "not a namespace"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "macro 'm' takes 1 argument(s), got 2"},
      {"{{ 'abc' | replace('a') }}", "needs the old and the new text"},
      {"{{ [1, 'a'] | sort }}", "'<' is not supported between"},
      {"{{ n is sameas 7 }}", "only against none, true and false"},
  });
}

TEST(Jinja, BoundsStopRunawayTemplates) {
  RenderOptions tight;
  tight.max_output_bytes = 1000;
  tight.max_loop_iterations = 500;
  tight.max_depth = 50;
  tight.value_limits.max_string_bytes = 1000;
  tight.value_limits.max_list_items = 100;
  expect_fails(
      {
          {"{% for i in range(20) %}{% for j in range(30) %}x{% endfor %}{% endfor %}", "loop iterations"},
          {"{% for i in range(20) %}{{ 'y' * 99 }}{% endfor %}", "the output grew past the template limit of 1000 bytes"},
          {"{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
           "a string grew past the template limit"},
          {"{{ 'x' * 100000 }}", "a repetition past the template's size limit"},
          {"{{ range(1000) | list }}", "past the template limit of 100 items"},
          {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nesting deeper than the template limit"},
      },
      tight);
  // Parsing bounds nesting too, so no input can exhaust the stack.
  auto deep = Template::compile("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nested too deeply"), std::string::npos) << deep.status();
}

TEST(PyString, MatchesPythonStrSemantics) {
  EXPECT_EQ(py_strip("\xe3\x80\x80 a\t\n", StripSide::kBoth, std::nullopt), "a");  // U+3000 is whitespace.
  EXPECT_EQ(py_strip("xyax", StripSide::kBoth, std::string("xy")), "a");
  EXPECT_EQ(py_split("  a  b ", std::nullopt, -1), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(py_split("a b c", std::nullopt, 1), (std::vector<std::string>{"a", "b c"}));
  EXPECT_EQ(py_split("a::b", std::string(":"), -1), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(py_splitlines("a\r\nb\rc\n"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(py_replace("ab", "", "-", -1), "-a-b-");
  EXPECT_EQ(py_title("they're bill's"), "They'Re Bill'S");
  EXPECT_EQ(py_capitalize("\xc3\xa9T\xc3\x89"), "\xc3\x89t\xc3\xa9");
  EXPECT_EQ(py_upper("stra\xc3\x9f" "e"), "STRASSE");  // Python's full mapping: 'ß' is "SS".
  EXPECT_EQ(py_title("\xc3\x9f" "a"), "Ssa");
  EXPECT_EQ(py_find("\xc3\xa9" "ab", "b"), 2);
  EXPECT_EQ(py_count("aaaa", "aa"), 2);
  EXPECT_EQ(py_word_count("it's 2 caf\xc3\xa9s_x!"), 4);
}

TEST(PyString, FloatReprIsPythons) {
  struct FloatCase {
    double v;
    const char* want;
  };
  for (const FloatCase& c : std::vector<FloatCase>{{1.0, "1.0"}, {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
                                                   {1e-5, "1e-05"}, {0.0001, "0.0001"}, {-2.5, "-2.5"}, {123.456, "123.456"},
                                                   {1.5e300, "1.5e+300"}, {-0.0, "-0.0"}})
    EXPECT_EQ(float_repr(c.v), c.want) << c.v;
}

}  // namespace
}  // namespace pdserve::jinja
