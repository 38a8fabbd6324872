// Properties over random JSON contexts (rapidcheck): what tojson prints parses back to the value
// it was given, in one line and indented; a value equals itself; splitting and joining a string
// gives it back; reversing twice is the identity.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kvvm/jinja/template.h"

namespace kvvm::jinja {
namespace {

using Json = nlohmann::ordered_json;

// Text made of pieces that stress escaping and code points: quotes, backslashes, controls,
// two-, three- and four-byte UTF-8, and Jinja's own delimiters.
rc::Gen<std::string> text() {
  static const std::vector<std::string> kPieces = {"a",
                                                   "Z",
                                                   "0",
                                                   " ",
                                                   ",",
                                                   "\"",
                                                   "'",
                                                   "\\",
                                                   "\n",
                                                   "\t",
                                                   "\r",
                                                   "\x01",
                                                   "\x1f",
                                                   "\x7f",
                                                   "\xc3\xa9",
                                                   "\xe6\x97\xa5",
                                                   "\xf0\x9f\x98\x80",
                                                   "\xe2\x80\xa8",
                                                   "{{",
                                                   "}}",
                                                   "{%",
                                                   "%"};
  return rc::gen::map(rc::gen::container<std::vector<std::size_t>>(
                          rc::gen::inRange<std::size_t>(0, kPieces.size())),
                      [](const std::vector<std::size_t>& picks) {
                        std::string s;
                        for (std::size_t i : picks) s += kPieces[i];
                        return s;
                      });
}

rc::Gen<Json> json_value(int depth) {
  rc::Gen<Json> scalar = rc::gen::oneOf(
      rc::gen::just(Json(nullptr)),
      rc::gen::map(rc::gen::arbitrary<bool>(), [](bool b) { return Json(b); }),
      rc::gen::map(rc::gen::arbitrary<std::int64_t>(), [](std::int64_t i) { return Json(i); }),
      rc::gen::map(text(), [](std::string s) { return Json(std::move(s)); }));
  if (depth == 0) return scalar;
  // Up to 5 items a level keeps a value small enough to render thousands of times.
  rc::Gen<Json> array =
      rc::gen::mapcat(rc::gen::inRange<std::size_t>(0, 6), [depth](std::size_t n) {
        return rc::gen::map(rc::gen::container<std::vector<Json>>(n, json_value(depth - 1)),
                            [](std::vector<Json> items) { return Json(std::move(items)); });
      });
  rc::Gen<Json> object =
      rc::gen::mapcat(rc::gen::inRange<std::size_t>(0, 6), [depth](std::size_t n) {
        return rc::gen::map(rc::gen::container<std::vector<std::pair<std::string, Json>>>(
                                n, rc::gen::pair(text(), json_value(depth - 1))),
                            [](const std::vector<std::pair<std::string, Json>>& members) {
                              Json o = Json::object();
                              for (const auto& [k, v] : members)
                                o[k] = v;  // a repeated key keeps its place
                              return o;
                            });
      });
  return rc::gen::oneOf(scalar, array, object);
}

std::string render_with(const std::string& source, const Json& x) {
  Result<Template> t = Template::parse(source, "property");
  RC_ASSERT(t.ok());
  Json context = Json::object();
  context["x"] = x;
  Result<std::string> out = t->render(context.dump());
  if (!out.ok()) RC_FAIL(out.status().to_string());
  return *out;
}

RC_GTEST_PROP(JinjaPropertyTest, ToJsonParsesBackToTheValue, ()) {
  Json x = *json_value(3);
  RC_ASSERT(Json::parse(render_with("{{ x|tojson }}", x)) == x);
  RC_ASSERT(Json::parse(render_with("{{ x|tojson(indent=2) }}", x)) == x);
  RC_ASSERT(Json::parse(render_with("{{ x|tojson(ensure_ascii=true) }}", x)) == x);
  RC_ASSERT(Json::parse(render_with("{{ x|tojson(separators=(',', ':')) }}", x)) == x);
}

RC_GTEST_PROP(JinjaPropertyTest, AValueEqualsItself, ()) {
  Json x = *json_value(3);
  RC_ASSERT(render_with("{{ x == x }} {{ [x] == [x] }} {{ x in [x] }}", x) == "True True True");
}

RC_GTEST_PROP(JinjaPropertyTest, StringOperationsInvertEachOther, ()) {
  Json x = Json(*text());
  const std::string s = x.get<std::string>();
  RC_ASSERT(render_with("{{ x.split(',')|join(',') }}", x) == s);
  RC_ASSERT(render_with("{{ x[::-1][::-1] }}", x) == s);
  RC_ASSERT(render_with("{{ x|list|join }}", x) == s);
  RC_ASSERT(render_with("{{ x.replace('a', 'a') }}", x) == s);
  RC_ASSERT(render_with("{{ x|tojson|length >= x|length }}", x) == "True");
}

}  // namespace
}  // namespace kvvm::jinja
