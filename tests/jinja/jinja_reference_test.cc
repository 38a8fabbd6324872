// Every case of tests/data/jinja/cases.json renders byte for byte as jinja2 3.1 rendered it
// (scripts/fixtures/jinja_cases.py, configured as transformers configures chat templates), or
// fails where jinja2 failed.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kvvm/jinja/template.h"
#include "support/test_data.h"

namespace kvvm::jinja {
namespace {

nlohmann::ordered_json load_cases() {
  std::ifstream in(test::data_dir() / "jinja" / "cases.json");
  return nlohmann::ordered_json::parse(in);
}

RenderHooks fixed_clock() {
  RenderHooks hooks;
  hooks.strftime_now = [](std::string_view) { return std::string("26 Jul 2024"); };
  return hooks;
}

TEST(JinjaReference, EveryCaseMatchesJinja2) {
  nlohmann::ordered_json data = load_cases();
  const auto& cases = data.at("cases");
  // The generator writes 150+ cases; a truncated file must not pass quietly.
  ASSERT_GE(cases.size(), 150u);
  int errors = 0;
  int real = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const std::string source = c.at("template").get<std::string>();
    const bool want_error = c.contains("error");
    errors += want_error ? 1 : 0;
    real += name.starts_with("real_") ? 1 : 0;
    Result<Template> parsed = Template::parse(source, name);
    if (!parsed.ok()) {
      EXPECT_TRUE(want_error) << "parse failed: " << parsed.status().to_string();
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    Result<std::string> out = parsed->render(c.at("context").dump(), fixed_clock());
    if (want_error) {
      EXPECT_FALSE(out.ok()) << "jinja2 failed (" << c.at("error").get<std::string>()
                             << ") but this rendered: " << *out;
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, c.at("output").get<std::string>());
  }
  // Both kinds of case are there: failures and the real chat templates.
  EXPECT_GE(errors, 20);
  EXPECT_GE(real, 14);
}

TEST(JinjaReference, ErrorsNameTemplateLineAndColumn) {
  nlohmann::ordered_json data = load_cases();
  for (const auto& c : data.at("cases")) {
    if (!c.contains("error")) continue;
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    Result<Template> parsed = Template::parse(c.at("template").get<std::string>(), name);
    Status status = parsed.ok() ? parsed->render(c.at("context").dump()).status() : parsed.status();
    ASSERT_FALSE(status.ok());
    // "NAME:LINE:COLUMN: what", line and column from 1.
    ASSERT_TRUE(status.message().starts_with(name + ":")) << status.message();
    std::string rest = status.message().substr(name.size() + 1);
    std::size_t line_end = rest.find(':');
    ASSERT_NE(line_end, std::string::npos);
    EXPECT_GE(std::stoi(rest.substr(0, line_end)), 1) << status.message();
    std::size_t column_end = rest.find(": ", line_end + 1);
    ASSERT_NE(column_end, std::string::npos) << status.message();
    EXPECT_GE(std::stoi(rest.substr(line_end + 1, column_end - line_end - 1)), 1)
        << status.message();
  }
}

}  // namespace
}  // namespace kvvm::jinja
