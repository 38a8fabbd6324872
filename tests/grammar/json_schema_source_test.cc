// grammar_from_json_schema and json_object_grammar, keyword by keyword: what each schema's
// grammar accepts and rejects (read by the Earley oracle, not the matcher), what is refused
// and how the refusal names its place, and that schema bombs stop at a bound, quickly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvvm/grammar/constraint.h"
#include "support/grammar_oracle.h"

namespace kvvm::grammar::json_schema_source_test {

using kvvm::grammar::testing::oracle_accepts;

Grammar compile(std::string_view schema, const JsonSchemaOptions& options = {}) {
  Result<Grammar> grammar = grammar_from_json_schema(schema, options);
  EXPECT_TRUE(grammar.ok()) << schema << ": " << grammar.status().message();
  if (!grammar.ok()) return json_object_grammar();
  return std::move(*grammar);
}

// The refusal's message, or "" when the schema compiled.
std::string refusal(std::string_view schema, StatusCode code = StatusCode::kInvalidArgument,
                    const JsonSchemaOptions& options = {}) {
  Result<Grammar> grammar = grammar_from_json_schema(schema, options);
  if (grammar.ok()) return "";
  EXPECT_EQ(grammar.status().code(), code) << grammar.status().message();
  return grammar.status().message();
}

JsonSchemaOptions strict() {
  JsonSchemaOptions options;
  options.strict = true;
  return options;
}

JsonSchemaOptions flexible(std::uint32_t max_run) {
  JsonSchemaOptions options;
  options.whitespace = {.flexible = true, .max_run = max_run};
  return options;
}

JsonSchemaOptions limited(std::uint32_t max_rules, std::uint32_t max_elements) {
  JsonSchemaOptions options;
  options.limits = {.max_rules = max_rules, .max_elements = max_elements};
  return options;
}

void expect_language(const Grammar& g, const std::vector<std::string>& accepted,
                     const std::vector<std::string>& rejected) {
  for (const std::string& text : accepted) EXPECT_TRUE(oracle_accepts(g, text)) << text;
  for (const std::string& text : rejected) EXPECT_FALSE(oracle_accepts(g, text)) << text;
}

TEST(JsonObjectGrammarTest, AcceptsObjectsOnly) {
  const Grammar g = json_object_grammar();
  ASSERT_TRUE(g.check().ok()) << g.check().message();
  expect_language(g, {"{}", R"({"a":1})", R"({"a":[1,{"b":null}],"c":"x"})", R"({"":{}})"},
                  {"[]", "\"x\"", "1", R"({"a":})", R"({"a":1,})", R"({ "a":1})", R"({a:1})"});
}

TEST(JsonObjectGrammarTest, FlexibleWhitespaceIsBounded) {
  const Grammar g = json_object_grammar({.flexible = true, .max_run = 3});
  ASSERT_TRUE(g.check().ok());
  expect_language(g, {"{ }", "{\n\t\"a\" : [ 1 , 2 ]\n}", "{   }"},
                  {"{    }", " {}", "{\"a\":1 ,}"});
}

TEST(JsonSchemaTest, EmptySchemaIsAnyValue) {
  for (const char* schema : {"{}", "true", R"({"title":"x","description":"y"})"}) {
    const Grammar g = compile(schema);
    expect_language(g,
                    {"1", "-0.5e+3", "\"x\"", "null", "true", "[1,\"a\",[]]", R"({"a":{"b":[]}})",
                     R"("\u00e9\ud83d\ude00\n")", "\"\xc3\xa9\""},
                    {"", "01", "1.", ".5", "+1", "nul", "[1,]", "\"\x01\"", R"("\ud83d")",
                     R"("\x")", "\"\xc3\"", "\"\xed\xa0\x80\""});
  }
}

TEST(JsonSchemaTest, Types) {
  expect_language(compile(R"({"type":"integer"})"), {"0", "-12", "-0", "905"},
                  {"1.0", "01", "1e3", "\"1\""});
  expect_language(compile(R"({"type":"number"})"), {"0", "1.25", "-3e-7", "2E+10"},
                  {"1.", "--1", "0x1"});
  expect_language(compile(R"({"type":["string","null"]})"), {"null", "\"a\""}, {"1", "[]"});
  expect_language(compile(R"({"type":"boolean"})"), {"true", "false"}, {"null", "1"});
  expect_language(compile(R"({"type":"object"})"), {"{}", R"({"x":[1]})"}, {"[]"});
  expect_language(compile(R"({"type":"array"})"), {"[]", "[1,{}]"}, {"{}"});
}

TEST(JsonSchemaTest, PropertiesKeepTheirOrderAndOptionalOnesMayBeLeftOut) {
  const Grammar g = compile(R"({"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"},"d":{"type":"integer"}},
      "required":["b","d"],"additionalProperties":false})");
  // Every subset of {a, c} beside the required b and d, in order.
  expect_language(g,
                  {R"({"b":1,"d":2})", R"({"a":0,"b":1,"d":2})", R"({"b":1,"c":3,"d":2})",
                   R"({"a":0,"b":1,"c":3,"d":2})"},
                  {R"({"d":2,"b":1})", R"({"b":1})", R"({"a":0,"d":2})", R"({,"b":1,"d":2})",
                   R"({"b":1,"d":2,})", R"({"b":1,,"d":2})", R"({"b":1,"d":2,"e":3})",
                   R"({"b":"x","d":2})", "{}"});
}

TEST(JsonSchemaTest, AllOptionalPropertiesPlaceTheirCommas) {
  const Grammar g = compile(R"({"type":"object","properties":{
      "a":{"type":"null"},"b":{"type":"null"},"c":{"type":"null"}},"additionalProperties":false})");
  const char* names[] = {"a", "b", "c"};
  for (int mask = 0; mask < 8; ++mask) {
    std::string text = "{";
    for (int i = 0; i < 3; ++i) {
      if (!(mask & (1 << i))) continue;
      if (text.size() > 1) text += ",";
      text += std::string("\"") + names[i] + "\":null";
    }
    text += "}";
    EXPECT_TRUE(oracle_accepts(g, text)) << text;
  }
  expect_language(
      g, {},
      {R"({,"a":null})", R"({"a":null,})", R"({"b":null,"a":null})", R"({"a":null"b":null})"});
}

TEST(JsonSchemaTest, AdditionalPropertiesFollowTheListedOnesAndNeverReuseTheirNames) {
  const Grammar open = compile(R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  expect_language(open,
                  {"{}", R"({"a":1})", R"({"a":1,"x":"y","ab":[]})", R"({"x":null})", R"({"":1})",
                   "{\"\xc3\xa9\":1}"},
                  {R"({"a":"s"})", R"({"x":1,"a":"s"})", R"({"x":1,"a":1})", R"({"a":1,"a":1})"});
  const Grammar typed = compile(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"],"additionalProperties":{"type":"string"}})");
  expect_language(typed, {R"({"a":1})", R"({"a":1,"b":"x","c":""})"},
                  {R"({"a":1,"b":2})", R"({"b":"x"})", R"({"a":1,"a":"x"})"});
  // A required name beyond "properties" is an additional property that must be there.
  const Grammar required = compile(R"({"type":"object","required":["id"],
      "additionalProperties":{"type":"integer"}})");
  expect_language(required, {R"({"id":1})", R"({"id":1,"x":2})"}, {"{}", R"({"x":2})"});
}

TEST(JsonSchemaTest, StrictModeClosesObjects) {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  const Grammar closed = compile(schema, strict());
  expect_language(closed, {"{}", R"({"a":1})"}, {R"({"a":1,"b":2})"});
}

TEST(JsonSchemaTest, FlexibleWhitespaceBetweenTokens) {
  const Grammar g = compile(R"({"type":"object","properties":{"a":{"type":"array",
      "items":{"type":"integer"}},"b":{"type":"null"}},"additionalProperties":false})",
                            flexible(4));
  expect_language(
      g, {R"({ "a" : [ 1 , 2 ] , "b" : null })", "{\n  \"b\": null\n}", "{ }", R"({"a":[]})"},
      {R"( {"a":[]})", R"({"a":[1 2]})", "{     }"});
}

TEST(JsonSchemaTest, ArraysCountTheirItems) {
  expect_language(compile(R"({"type":"array","items":{"type":"integer"},"minItems":1,
      "maxItems":3})"),
                  {"[1]", "[1,2,3]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"});
  expect_language(compile(R"({"type":"array","items":{"type":"integer"},"minItems":2})"),
                  {"[1,2]", "[1,2,3,4,5]"}, {"[1]"});
  const Grammar tuple = compile(R"({"type":"array","prefixItems":[{"type":"string"},
      {"type":"integer"}],"items":false})");
  expect_language(tuple, {"[]", "[\"a\"]", "[\"a\",1]"}, {"[1]", "[\"a\",1,2]", "[\"a\",\"b\"]"});
  const Grammar prefix_rest = compile(R"({"type":"array","prefixItems":[{"type":"string"}],
      "items":{"type":"null"},"minItems":2,"maxItems":3})");
  expect_language(prefix_rest, {"[\"a\",null]", "[\"a\",null,null]"},
                  {"[\"a\"]", "[\"a\",null,null,null]", "[null,null]"});
  // The older tuple form: items as a list, additionalItems for the rest.
  expect_language(compile(R"({"type":"array","items":[{"type":"integer"}],
      "additionalItems":{"type":"string"}})"),
                  {"[]", "[1]", "[1,\"x\",\"y\"]"}, {"[\"x\"]", "[1,2]"});
}

TEST(JsonSchemaTest, EnumAndConst) {
  expect_language(compile(R"({"enum":["red","green",3,null,{"a":[1]}]})"),
                  {"\"red\"", "\"green\"", "3", "null", R"({"a":[1]})"},
                  {"\"blue\"", "4", R"({"a":[2]})"});
  expect_language(compile(R"({"type":"string","enum":["a",1,"b"]})"), {"\"a\"", "\"b\""}, {"1"});
  expect_language(compile(R"({"type":"integer","enum":[1.0,2.5]})"), {"1"}, {"2.5", "1.0"});
  expect_language(compile(R"({"const":"x"})"), {"\"x\""}, {"\"y\""});
  expect_language(compile(R"({"const":"\u00e9\n"})"), {"\"\xc3\xa9\\n\""}, {});
}

TEST(JsonSchemaTest, AnyOfAndOneOf) {
  expect_language(compile(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})"),
                  {"1", "\"a\""}, {"\"ab\"", "null"});
  expect_language(compile(R"({"oneOf":[{"type":"null"},{"type":"boolean"}]})"), {"null", "true"},
                  {"1"});
  // oneOf is anyOf only where its options cannot overlap.
  expect_language(compile(R"({"$defs":{"cat":{"type":"object","properties":{"kind":{"const":"cat"}},
      "required":["kind"]}},"oneOf":[{"$ref":"#/$defs/cat"},{"type":"object","properties":{
      "kind":{"enum":["dog"]}},"required":["kind"]}]})"),
                  {R"({"kind":"cat"})", R"({"kind":"dog"})"}, {R"({"kind":"cow"})"});
  EXPECT_NE(refusal(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})")
                .find("schema at /: \"oneOf\" options 0 and 1 are not told apart"),
            std::string::npos);
  // Keywords beside anyOf hold in every option.
  expect_language(compile(R"({"type":"object","properties":{"k":{"type":"integer"}},
      "required":["k"],"additionalProperties":false,
      "anyOf":[{"properties":{"k":{"minimum":5}}},{"properties":{"k":{"maximum":-5}}}]})"),
                  {R"({"k":5})", R"({"k":-7})"}, {R"({"k":0})", "{}"});
}

TEST(JsonSchemaTest, AllOfMergesObjects) {
  const char* schema = R"({"allOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"properties":{"b":{"type":"string"},"a":{"minimum":0}},"required":["b"]}]})";
  expect_language(
      compile(schema, strict()), {R"({"a":0,"b":"x"})"},
      {R"({"a":-1,"b":"x"})", R"({"a":1})", R"({"b":"x"})", R"({"a":0,"b":"x","c":1})"});
  expect_language(compile(schema), {R"({"a":0,"b":"x","c":1})"}, {R"({"a":-1,"b":"x"})"});
  // additionalProperties beside allOf judges the parts' properties too: refused, not merged.
  EXPECT_NE(refusal(R"({"allOf":[{"properties":{"a":{}}}],"properties":{"b":{}},
      "additionalProperties":false})")
                .find("schema at /: allOf: property \"a\" of another part"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"type":"string","pattern":"a"},{"pattern":"b"}]})")
                .find("schema at /allOf/1: allOf: its parts give \"pattern\" different values"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"type":"string"},{"type":"integer"}]})").find("none in common"),
            std::string::npos);
}

TEST(JsonSchemaTest, RefsToDefsAndToTheRootRecurse) {
  const Grammar tree = compile(R"({"$defs":{"node":{"type":"object","properties":{
      "value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["value","children"],"additionalProperties":false}},"$ref":"#/$defs/node"})");
  expect_language(
      tree,
      {R"({"value":1,"children":[]})",
       R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
      {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})"});
  const Grammar root = compile(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},
      {"type":"null"}]}},"required":["next"],"additionalProperties":false})");
  expect_language(root, {R"({"next":null})", R"({"next":{"next":{"next":null}}})"},
                  {R"({"next":{}})"});
  const Grammar definitions = compile(R"({"definitions":{"n":{"type":"integer"}},
      "type":"array","items":{"$ref":"#/definitions/n"}})");
  expect_language(definitions, {"[1,2]"}, {"[\"a\"]"});
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/missing"})").find("names nothing in the schema"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"https://example.com/s.json"})").find("only references within"),
            std::string::npos);
}

TEST(JsonSchemaTest, StringLengthsCountCodePoints) {
  const Grammar g = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  expect_language(g,
                  {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xc3\xa9\"", R"("\u00e9\n")",
                   R"("a\ud83d\ude00")", "\"a\xf0\x9f\x98\x80\""},
                  {"\"a\"", "\"abcd\"", "\"\xc3\xa9\"", R"("\ud83d\ude00")", R"("\n")"});
  expect_language(compile(R"({"type":"string","maxLength":0})"), {"\"\""}, {"\"a\""});
}

TEST(JsonSchemaTest, PatternsSearchUnlessAnchored) {
  expect_language(compile(R"({"type":"string","pattern":"^[a-z]+\\d?$"})"), {"\"abc\"", "\"abc7\""},
                  {"\"\"", "\"Abc\"", "\"ab 7\""});
  expect_language(compile(R"({"type":"string","pattern":"b+c"})"),
                  {"\"bc\"", "\"abbcd\"", R"("\"bc\\")"}, {"\"ac\"", "\"\""});
  // A match is written as itself: its characters that would need escapes are left out.
  expect_language(compile(R"({"type":"string","pattern":"^[^x]$"})"), {"\"a\"", "\"\xc3\xa9\""},
                  {"\"\"\"", "\"\\\"", R"("\"")", "\"x\""});
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^\"$"})").find("matches only strings with"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^a|b$"})").find("top-level |"),
            std::string::npos);
}

TEST(JsonSchemaTest, Formats) {
  expect_language(
      compile(R"({"type":"string","format":"date"})"),
      {"\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"0001-01-01\"", "\"2023-04-30\""},
      {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"0000-01-01\"",
       "\"2023-1-01\"", "\"2023-00-10\"", "\"2023-01-00\""});
  expect_language(compile(R"({"type":"string","format":"time"})"),
                  {"\"23:59:59Z\"", "\"00:00:00.123+05:30\"", "\"12:30:00-08:00\""},
                  {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:00\"", "\"12:00Z\""});
  expect_language(compile(R"({"type":"string","format":"date-time"})"),
                  {"\"2024-01-02T03:04:05Z\""}, {"\"2024-01-02 03:04:05Z\""});
  expect_language(
      compile(R"({"type":"string","format":"uuid"})"), {"\"123e4567-e89b-12d3-a456-426614174000\""},
      {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\""});
  expect_language(compile(R"({"type":"string","format":"email"})"),
                  {"\"a.b+c@example.com\"", "\"x@y\""},
                  {"\"@x.com\"", "\"a@\"", "\"a..b@x.com\"", "\"a@-x.com\"", "\"a b@x.com\""});
  EXPECT_NE(refusal(R"({"type":"string","format":"uri"})")
                .find("schema at /: format \"uri\" is not supported"),
            std::string::npos);
}

// Integer ranges are exact: every integer in a window is accepted iff it is in range.
TEST(JsonSchemaTest, IntegerBoundsAreExact) {
  struct Case {
    const char* bounds;
    long lo, hi;  // inclusive, +-1000000 for none
  };
  const Case cases[] = {
      {R"("minimum":0,"maximum":100)", 0, 100},
      {R"("minimum":-57,"maximum":1234)", -57, 1234},
      {R"("minimum":-1234,"maximum":-57)", -1234, -57},
      {R"("exclusiveMinimum":9,"exclusiveMaximum":1000)", 10, 999},
      {R"("minimum":1.5,"maximum":99.5)", 2, 99},
      {R"("exclusiveMinimum":-1.5,"exclusiveMaximum":2)", -1, 1},
      {R"("minimum":7)", 7, 1000000},
      {R"("maximum":-7)", -1000000, -7},
      {R"("maximum":305)", -1000000, 305},
      {R"("minimum":-305)", -305, 1000000},
      {R"("minimum":5,"exclusiveMinimum":5)", 6, 1000000},
  };
  for (const Case& c : cases) {
    const std::string schema = std::string(R"({"type":"integer",)") + c.bounds + "}";
    const Grammar g = compile(schema);
    for (long v = -1500; v <= 1500; ++v) {
      EXPECT_EQ(oracle_accepts(g, std::to_string(v)), v >= c.lo && v <= c.hi) << schema << " " << v;
    }
    EXPECT_FALSE(oracle_accepts(g, "-0")) << schema;
    EXPECT_FALSE(oracle_accepts(g, "007")) << schema;
  }
  expect_language(
      compile(R"({"type":"integer","minimum":-1000000000000,"maximum":999999999999999})"),
      {"-1000000000000", "999999999999999", "0", "-999999999999"},
      {"-1000000000001", "1000000000000000"});
}

TEST(JsonSchemaTest, NumberBoundsAreExactWithoutExponents) {
  struct Case {
    const char* bounds;
    double lo, hi;
    bool lo_strict, hi_strict;
  };
  const Case cases[] = {
      {R"("minimum":0,"maximum":10)", 0, 10, false, false},
      {R"("exclusiveMinimum":0,"exclusiveMaximum":10)", 0, 10, true, true},
      {R"("minimum":-3,"exclusiveMaximum":3)", -3, 3, false, true},
      {R"("exclusiveMinimum":-20,"maximum":-2)", -20, -2, true, false},
      {R"("minimum":2)", 2, 1e9, false, false},
      {R"("exclusiveMaximum":-1)", -1e9, -1, false, true},
  };
  const std::vector<std::string> texts = {
      "0",     "0.0",   "-0",    "-0.0",  "0.5",  "1",     "2",     "2.0",   "1.999",
      "2.001", "3",     "3.00",  "2.99",  "-3",   "-3.0",  "-3.01", "-2.99", "10",
      "10.0",  "10.01", "9.99",  "-1",    "-1.0", "-0.5",  "-20",   "-20.0", "-19.5",
      "-2",    "-2.0",  "-1.99", "-2.01", "25.5", "-25.5", "100",   "0.000", "11"};
  for (const Case& c : cases) {
    const std::string schema = std::string(R"({"type":"number",)") + c.bounds + "}";
    const Grammar g = compile(schema);
    for (const std::string& text : texts) {
      const double v = std::stod(text);
      const bool in = (c.lo_strict ? v > c.lo : v >= c.lo) && (c.hi_strict ? v < c.hi : v <= c.hi);
      EXPECT_EQ(oracle_accepts(g, text), in) << schema << " " << text;
    }
    EXPECT_FALSE(oracle_accepts(g, "1e1")) << schema;
  }
  EXPECT_NE(refusal(R"({"type":"number","minimum":0.5})")
                .find("schema at /: \"minimum\" 0.5 on a number is not supported"),
            std::string::npos);
}

TEST(JsonSchemaTest, RefusesWhatItCannotEnforceByName) {
  EXPECT_EQ(refusal(R"({"type":"object","properties":{"a":{"if":{"type":"string"}}}})"),
            "schema at /properties/a: \"if\" is not supported");
  EXPECT_EQ(refusal(R"({"properties":{"a/b":{"not":{}}}})"),
            "schema at /properties/a~1b: \"not\" is not supported");
  EXPECT_EQ(refusal(R"({"type":"integer","multipleOf":2})"),
            "schema at /: \"multipleOf\" is not supported");
  EXPECT_EQ(refusal(R"({"name":"x","strict":true,"schema":{}})"),
            "schema at /: \"name\" is not supported");
  EXPECT_NE(refusal(R"({"type":"array","uniqueItems":true})").find("\"uniqueItems\" true"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"patternProperties":{"^a":{}}})").find("\"patternProperties\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","maxProperties":1})").find("\"maxProperties\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"date","maxLength":3})")
                .find("\"format\" beside \"maxLength\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"enum":[1,2],"minimum":2})").find("\"enum\" beside \"minimum\""),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"strin"})").find("type \"strin\" is not a JSON Schema type"),
            std::string::npos);
  EXPECT_NE(refusal("{\"type\":").find("not valid JSON"), std::string::npos);
  // Annotations are read and ignored.
  compile(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"t",
      "description":"d","default":1,"examples":[1],"$comment":"c","deprecated":true,
      "readOnly":true,"writeOnly":false,"type":"integer"})");
}

TEST(JsonSchemaTest, RefusesUnsatisfiableSchemasNamingThePlace) {
  EXPECT_NE(
      refusal(R"({"properties":{"a":{"enum":[]}}})").find("schema at /properties/a: \"enum\""),
      std::string::npos);
  EXPECT_NE(refusal(R"({"type":[]})").find("empty list"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","minLength":3,"maxLength":2})")
                .find("\"minLength\" 3 is more than \"maxLength\" 2"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":3,"maximum":2})").find("no integer lies"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","minimum":3,"exclusiveMaximum":3})").find("no number lies"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"a":{}},"required":["b"],
      "additionalProperties":false})")
                .find("the required property \"b\" is not in \"properties\""),
            std::string::npos);
  EXPECT_NE(refusal("false").find("false matches no value"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","minItems":3,"maxItems":2})").find("\"minItems\" 3"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"a":false},"required":["a"]})")
                .find("/properties/a: the required property \"a\" has the schema false"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"anyOf":[false,false]})").find("no option"), std::string::npos);
  // A false property may only be absent.
  expect_language(compile(R"({"type":"object","properties":{"a":false}})"), {"{}", R"({"b":1})"},
                  {R"({"a":1})"});
}

TEST(JsonSchemaTest, SchemaBombsStopAtABound) {
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 100; ++i) deep += "}";
  EXPECT_NE(refusal(deep, StatusCode::kResourceExhausted).find("nest past the bound of 64"),
            std::string::npos);
  EXPECT_NE(
      refusal(std::string(100000, '[') + std::string(100000, ']'), StatusCode::kResourceExhausted)
          .find("nests past the bound"),
      std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","maxLength":1000000000})", StatusCode::kResourceExhausted)
                .find("schema at /: length"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","minItems":1000000000})", StatusCode::kResourceExhausted)
                .find("schema at /items"),
            std::string::npos);
  std::string big_enum = R"({"enum":[)";
  for (int i = 0; i < 200000; ++i) big_enum += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  big_enum += "]}";
  EXPECT_NE(refusal(big_enum, StatusCode::kResourceExhausted).find("\"enum\" passes"),
            std::string::npos);
  // Every definition refers to the one before twice: rules, not copies, so this is small.
  std::string defs = R"({"$defs":{"d0":{"type":"integer"})";
  for (int i = 1; i < 60; ++i) {
    defs += ",\"d" + std::to_string(i) + R"(":{"type":"array","prefixItems":[{"$ref":"#/$defs/d)" +
            std::to_string(i - 1) + R"("},{"$ref":"#/$defs/d)" + std::to_string(i - 1) + "\"}]}";
  }
  defs += R"(},"$ref":"#/$defs/d59"})";
  const Grammar g = compile(defs);
  EXPECT_LT(g.element_count(), 5000u);
  // Options copied per anyOf option grow as a product: stopped by the element bound.
  std::string wide = "{}";
  for (int i = 0; i < 12; ++i) {
    wide = R"({"type":"object","properties":{"p":)" + wide + R"(},"anyOf":[{"required":["p"]},)" +
           R"({"required":["q"]},{"required":["r"]},{"required":["s"]}]})";
  }
  const std::string message =
      refusal(wide, StatusCode::kResourceExhausted, limited(1 << 12, 1 << 16));
  EXPECT_NE(message.find("bound"), std::string::npos) << message;
}

TEST(JsonSchemaTest, PydanticStyleSchema) {
  // As pydantic v2 writes a model with a nested model, an enum, optionals and a list.
  const Grammar g = compile(R"({
    "$defs": {
      "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
      "Address": {"properties": {"street": {"title": "Street", "type": "string"},
                                 "zip": {"anyOf": [{"type": "string"}, {"type": "null"}],
                                         "default": null, "title": "Zip"}},
                  "required": ["street"], "title": "Address", "type": "object"}
    },
    "properties": {
      "name": {"title": "Name", "type": "string", "minLength": 1},
      "age": {"exclusiveMinimum": 0, "title": "Age", "type": "integer"},
      "color": {"$ref": "#/$defs/Color", "default": "red"},
      "address": {"allOf": [{"$ref": "#/$defs/Address"}], "description": "home"},
      "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
      "born": {"format": "date", "title": "Born", "type": "string"}
    },
    "required": ["name", "age", "address"],
    "title": "Person", "type": "object"})");
  expect_language(
      g,
      {R"({"name":"Ann","age":31,"address":{"street":"Main"}})",
       R"({"name":"Ann","age":1,"color":"green","address":{"street":"M","zip":null},"tags":["a"],"born":"1990-05-01"})",
       R"({"name":"Ann","age":1,"address":{"street":"M","zip":"123","x":1},"extra":true})"},
      {R"({"name":"","age":31,"address":{"street":"Main"}})",
       R"({"name":"Ann","age":0,"address":{"street":"Main"}})",
       R"({"name":"Ann","age":1,"color":"blue","address":{"street":"M"}})",
       R"({"name":"Ann","age":1,"address":{}})"});
}

TEST(JsonSchemaTest, OpenAiStrictStyleSchema) {
  const Grammar g = compile(R"({
    "type": "object",
    "properties": {
      "steps": {"type": "array", "items": {"type": "object",
        "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
        "required": ["explanation", "output"], "additionalProperties": false}},
      "final_answer": {"type": "string"},
      "confidence": {"type": ["number", "null"]},
      "kind": {"type": "string", "enum": ["a", "b"]},
      "item": {"anyOf": [{"$ref": "#/$defs/leaf"}, {"type": "null"}]}
    },
    "$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer"}},
                       "required": ["v"], "additionalProperties": false}},
    "required": ["steps", "final_answer", "confidence", "kind", "item"],
    "additionalProperties": false})",
                            strict());
  expect_language(
      g,
      {R"({"steps":[{"explanation":"e","output":"o"}],"final_answer":"x","confidence":0.5,"kind":"a","item":{"v":1}})",
       R"({"steps":[],"final_answer":"","confidence":null,"kind":"b","item":null})"},
      {R"({"steps":[],"final_answer":"","confidence":null,"kind":"b"})",
       R"({"steps":[{"output":"o"}],"final_answer":"","confidence":null,"kind":"b","item":null})"});
}

}  // namespace kvvm::grammar::json_schema_source_test
