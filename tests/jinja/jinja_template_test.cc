// Template's contract beyond the reference cases: where errors point, the render limits, the
// sandbox, the hooks, options, and renders from many threads at once.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "kvvm/jinja/template.h"

namespace kvvm::jinja {
namespace {

Result<std::string> render(std::string_view source, std::string_view context = "{}",
                           const TemplateOptions& options = {}) {
  Result<Template> t = Template::parse(source, "chat_template", options);
  if (!t.ok()) return t.status();
  return t->render(context);
}

TEST(JinjaTemplate, RendersWithContext) {
  Result<std::string> out = render("{{ greeting }}, {{ names|join(' and ') }}!",
                                   R"({"greeting": "Hi", "names": ["Ann", "Bo"]})");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "Hi, Ann and Bo!");
}

TEST(JinjaTemplate, ParseErrorsNameLineAndColumn) {
  Result<Template> t = Template::parse("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}", "tpl");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.status().message().starts_with("tpl:3:10: ")) << t.status().message();

  Result<Template> unclosed = Template::parse("ab\n  {% for m in messages %}x", "tpl");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_TRUE(unclosed.status().message().starts_with("tpl:2:")) << unclosed.status().message();
  EXPECT_NE(unclosed.status().message().find("endfor"), std::string::npos);

  Result<Template> unknown_filter = Template::parse("\n\n{{ x|nope }}", "tpl");
  ASSERT_FALSE(unknown_filter.ok());
  EXPECT_TRUE(unknown_filter.status().message().starts_with("tpl:3:"))
      << unknown_filter.status().message();
}

TEST(JinjaTemplate, RenderErrorsNameLineAndColumn) {
  Result<std::string> out = render("{% for m in messages %}\n  {{ m.content + 1 }}\n{% endfor %}",
                                   R"({"messages": [{"content": "x"}]})");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.status().message().starts_with("chat_template:2:")) << out.status().message();
  EXPECT_NE(out.status().message().find("unsupported operand"), std::string::npos);
}

TEST(JinjaTemplate, RaiseExceptionKeepsMessage) {
  Result<std::string> out =
      render("x\n  {{ raise_exception('Conversation roles must alternate user/assistant') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chat_template:2:6: Conversation roles must alternate user/assistant");
}

TEST(JinjaTemplate, ContextMustBeAJsonObject) {
  Result<Template> t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->render("[1]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->render("{not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t->render("{}").ok());
}

TEST(JinjaTemplate, StepLimitStopsLongLoops) {
  TemplateOptions options;
  options.limits.max_steps = 100'000;
  Result<std::string> out =
      render("{% for i in range(100000000) %}{{ i }}{% endfor %}", "{}", options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("max_steps"), std::string::npos);
  ASSERT_TRUE(out.status().exhaustion().has_value());
  EXPECT_EQ(out.status().exhaustion()->limit, 100'000u);
  EXPECT_GT(out.status().exhaustion()->requested, 100'000u);
  // Nested loops that each stay under range()'s bound still run into the step limit.
  Result<std::string> nested = render(
      "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
      "{% endfor %}{% endfor %}{% endfor %}",
      "{}", options);
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(nested.status().message().find("max_steps"), std::string::npos);
}

TEST(JinjaTemplate, StepLimitCountsWorkNotJustIterations) {
  // Each iteration copies or scans megabytes: steps are charged by size, so these end quickly
  // instead of running for minutes.
  for (const char* heavy : {
           "{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% if s ~ 'y' %}{% endif %}"
           "{% endfor %}",
           "{% set l = range(100000)|list %}{% for i in l %}{% if i in l %}{% endif %}"
           "{% endfor %}",
           "{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ s[5000000:5000001] }}"
           "{% endfor %}",
           "{% set l = range(100000)|list %}{% for i in range(100000) %}{{ l|unique|length }}"
           "{% endfor %}",
           "{% set s = 'ab' * 5000000 %}{% for i in range(100000) %}{{ s.split('a')|length }}"
           "{% endfor %}",
           "{% set s = 'a' * 60000000 %}{% for c in s %}{% endfor %}",
       }) {
    SCOPED_TRACE(heavy);
    Result<std::string> out = render(heavy);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
    // The steps, or for the split, the list's memory counted before it is built.
    EXPECT_TRUE(out.status().message().find("max_steps") != std::string::npos ||
                out.status().message().find("max_output_bytes") != std::string::npos)
        << out.status().message();
  }
}

TEST(JinjaTemplate, DepthLimitStopsRecursion) {
  Result<std::string> out = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("max_depth"), std::string::npos);

  // Parsing bounds nesting too: a hostile template cannot overflow the parser's stack.
  std::string deep = "{{ " + std::string(100'000, '(') + "1" + std::string(100'000, ')') + " }}";
  Result<Template> t = Template::parse(deep);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(t.status().message().find("max_depth"), std::string::npos);

  // So does reading a deeply nested context.
  std::string context = "{\"x\": " + std::string(10'000, '[') + std::string(10'000, ']') + "}";
  Result<Template> x = Template::parse("{{ x|length }}");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->render(context).status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaTemplate, OutputLimitStopsBombs) {
  TemplateOptions options;
  options.limits.max_output_bytes = 1 << 20;
  for (const char* bomb : {
           "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
           "{{ 'x' * 1000000000000 }}",
           "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
           "{% endfor %}{{ ns.s|length }}",
           "{{ ('y' * 100000)|replace('', 'z' * 100) }}",
           "{{ range(1000)|list|tojson(indent=100000) }}",
       }) {
    SCOPED_TRACE(bomb);
    Result<std::string> out = render(bomb, "{}", options);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(out.status().message().find("max_output_bytes"), std::string::npos)
        << out.status().message();
  }
}

TEST(JinjaTemplate, NestingLimitStopsDeepValues) {
  // Values nested in a loop, one level an iteration: printing, comparing and freeing them
  // recurse, so their depth is bounded.
  for (const char* deep : {
           "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}"
           "{% endfor %}{{ ns.x|length }}",
           "{% set ns = namespace(x={}) %}{% for i in range(5000) %}{% set ns.x = {'a': ns.x} %}"
           "{% endfor %}{{ ns.x }}",
           "{% set ns = namespace(cur=none) %}{% for i in range(5000) %}"
           "{% set ns.cur = namespace(prev=ns.cur) %}{% endfor %}{{ ns }}",
       }) {
    SCOPED_TRACE(deep);
    Result<std::string> out = render(deep);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(out.status().message().find("nesting"), std::string::npos) << out.status().message();
  }
  Result<std::string> shallow = render(
      "{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x|tojson|length }}");
  ASSERT_TRUE(shallow.ok()) << shallow.status().to_string();
  EXPECT_EQ(*shallow, "202");
}

TEST(JinjaTemplate, SandboxRefusesPythonInternals) {
  // Unsafe attributes are undefined, as jinja2's sandbox makes them; using one further fails.
  Result<std::string> out = render("[{{ ''.__class__ }}][{{ x.__len__ }}]", R"({"x": [1]})");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "[][]");
  for (const char* escape : {"{{ ''.__class__.__mro__ }}", "{{ x.__len__() }}",
                             "{{ ''.__class__.__base__.__subclasses__() }}",
                             "{{ range.__globals__ }}x{{ range.__globals__.os }}",
                             "{{ cycler.__init__.__globals__ }}{{ lipsum.__globals__.os }}"}) {
    SCOPED_TRACE(escape);
    Result<std::string> r = render(escape, R"({"x": [1]})");
    EXPECT_FALSE(r.ok() && r->find("class") != std::string::npos);
  }
}

TEST(JinjaTemplate, SandboxRefusesMutation) {
  const char* context = R"({"messages": [{"role": "user"}], "d": {"a": 1}})";
  for (const char* mutate :
       {"{{ messages.append(1) }}", "{% set l = [] %}{{ l.append(1) }}", "{{ d.update(b=2) }}",
        "{{ d.pop('a') }}", "{{ messages[0].clear() }}", "{{ messages.insert(0, 1) }}",
        "{% set d.a = 2 %}", "{% set messages[0] = 1 %}"}) {
    SCOPED_TRACE(mutate);
    Result<std::string> r = render(mutate, context);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  // The context is untouched afterwards.
  Result<std::string> after = render("{{ messages }}{{ d }}", context);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, "[{'role': 'user'}]{'a': 1}");
}

TEST(JinjaTemplate, StrftimeNowHook) {
  Result<Template> t = Template::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  RenderHooks hooks;
  std::string seen;
  hooks.strftime_now = [&](std::string_view format) {
    seen = format;
    return std::string("26 Jul 2024");
  };
  Result<std::string> out = t->render("{}", hooks);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "26 Jul 2024");
  EXPECT_EQ(seen, "%d %b %Y");
  // Without a hook: the system clock, as strftime formats it (a four-digit year here).
  Result<std::string> now = t->render("{}");
  ASSERT_TRUE(now.ok());
  ASSERT_EQ(now->size(), 11u) << *now;
  EXPECT_EQ(now->substr(7, 2), "20");
}

TEST(JinjaTemplate, WhitespaceOptions) {
  TemplateOptions plain;
  plain.trim_blocks = false;
  plain.lstrip_blocks = false;
  plain.keep_trailing_newline = true;
  Result<std::string> out = render("  {% if true %}\nx\n  {% endif %}\n", "{}", plain);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "  \nx\n  \n");
  Result<std::string> chat = render("  {% if true %}\nx\n  {% endif %}\n");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(*chat, "x\n");
}

TEST(JinjaTemplate, CopiesShareTheParsedTemplate) {
  Result<Template> t = Template::parse("{{ a }}", "name");
  ASSERT_TRUE(t.ok());
  Template copy = *t;
  Template moved = std::move(copy);
  EXPECT_EQ(moved.name(), "name");
  EXPECT_EQ(moved.source(), "{{ a }}");
  Result<std::string> out = moved.render(R"({"a": 5})");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "5");
}

TEST(JinjaTemplate, RendersFromManyThreadsAtOnce) {
  Result<Template> t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.role }}:{{ m.content|trim }};{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      std::string context = R"({"messages": [{"role": "user", "content": " t)" + std::to_string(i) +
                            R"( "}, {"role": "assistant", "content": "ok"}]})";
      for (int k = 0; k < 200; ++k) {
        Result<std::string> out = t->render(context);
        outputs[static_cast<std::size_t>(i)] = out.ok() ? *out : out.status().to_string();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(outputs[static_cast<std::size_t>(i)],
              "user:t" + std::to_string(i) + ";assistant:ok;2");
  }
}

}  // namespace
}  // namespace kvvm::jinja
