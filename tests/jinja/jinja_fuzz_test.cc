// Thousands of malformed templates, made by mutating the reference cases' templates (real chat
// templates among them) with fixed seeds: each parse and render ends with a value or a clear
// error, never a crash or a hang (the limits bound the time; no clock is read).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kvvm/jinja/template.h"
#include "support/test_data.h"

namespace kvvm::jinja {
namespace {

constexpr const char* kFragments[] = {
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "{{-",
    "-}}",
    "+%}",
    "{%+",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "|",
    "'",
    "\"",
    "\\",
    ",",
    ":",
    ".",
    "~",
    "**",
    "//",
    "-",
    "+",
    " ",
    "\n",
    "if ",
    "else",
    "elif ",
    "endif",
    "for x in ",
    "endfor",
    "set ",
    "endset",
    "macro m(a)",
    "endmacro",
    "call m()",
    "endcall",
    "raw",
    "endraw",
    "filter upper",
    "endfilter",
    "loop.",
    "caller()",
    "range(99999)",
    "namespace(a=1)",
    " is defined",
    " is not none",
    "|tojson",
    "|join(',')",
    "[::-1]",
    "[1:]",
    "messages",
    "m(m(m(1)))",
    "ns.a",
    "break",
    "continue",
    "generation",
    "endgeneration",
    "\xff",
    "\xe6\x97",
    "__class__",
    "1e309",
    "9999999999999999999",
    "not ",
    " and ",
    " or ",
    " in ",
    "==",
    "!=",
    "<=",
    "%",
    "*",
    "x.y.z",
    "with ",
    "endwith",
};

std::string mutate(const std::string& source, std::mt19937_64& rng) {
  std::string s = source;
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    std::size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:  // delete a run
        if (!s.empty() && pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      case 1:  // insert a fragment
        s.insert(pos, kFragments[rng() % std::size(kFragments)]);
        break;
      case 2:  // duplicate a run
        if (pos < s.size()) s.insert(pos, s.substr(pos, 1 + rng() % 32));
        break;
      case 3:  // overwrite one byte
        if (pos < s.size()) s[pos] = static_cast<char>(rng() % 256);
        break;
      case 4:  // truncate
        s.resize(pos);
        break;
      default:  // move a run elsewhere
        if (pos < s.size()) {
          std::string run = s.substr(pos, 1 + rng() % 16);
          s.erase(pos, run.size());
          s.insert(s.empty() ? 0 : rng() % (s.size() + 1), run);
        }
        break;
    }
  }
  return s;
}

TEST(JinjaFuzz, MutatedTemplatesEndWithValueOrError) {
  std::ifstream in(test::data_dir() / "jinja" / "cases.json");
  nlohmann::ordered_json data = nlohmann::ordered_json::parse(in);
  std::vector<std::pair<std::string, std::string>> seeds;  // template, context
  for (const auto& c : data.at("cases")) {
    seeds.emplace_back(c.at("template").get<std::string>(), c.at("context").dump());
  }
  ASSERT_FALSE(seeds.empty());

  TemplateOptions options;
  options.limits.max_steps = 200'000;
  options.limits.max_depth = 96;
  options.limits.max_output_bytes = 1 << 20;
  std::mt19937_64 rng(20261207);
  int ok = 0;
  int invalid = 0;
  int exhausted = 0;
  constexpr int kRounds = 6000;
  for (int i = 0; i < kRounds; ++i) {
    const auto& [source, context] = seeds[rng() % seeds.size()];
    std::string mutated = mutate(source, rng);
    SCOPED_TRACE(::testing::Message() << "round " << i << ": " << mutated);
    Result<Template> t = Template::parse(mutated, "fuzz", options);
    Status status = t.ok() ? t->render(context).status() : t.status();
    switch (status.code()) {
      case StatusCode::kOk:
        ++ok;
        break;
      case StatusCode::kInvalidArgument:
        ++invalid;
        break;
      case StatusCode::kResourceExhausted:
        ++exhausted;
        break;
      default:
        ADD_FAILURE() << status.to_string();
    }
    if (!status.ok()) {
      EXPECT_TRUE(status.message().starts_with("fuzz:")) << status.message();
    }
  }
  // The mutations reach both sides: templates that still render and templates that fail.
  EXPECT_GT(ok, kRounds / 20);
  EXPECT_GT(invalid, kRounds / 20);
  RecordProperty("ok", ok);
  RecordProperty("invalid", invalid);
  RecordProperty("exhausted", exhausted);
}

}  // namespace
}  // namespace kvvm::jinja
