// The bounded JSON reader: hostile nesting, oversized input, invalid UTF-8 and truncated
// documents are refused with an error that says where; valid documents come back whole.
#include "base/json_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/text_match.h"

namespace kvvm {
namespace {

namespace fs = std::filesystem;

using test::contains;

std::string temp_file(const std::string& name, const std::string& text) {
  const fs::path path =
      fs::temp_directory_path() / ("kvvm_json_reader_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

TEST(JsonReader, AcceptsAValidDocument) {
  Result<nlohmann::json> json =
      read_json(R"({"a": [1, 2, {"b": "caf\u00e9 \"x\" ]]]"}], "c": null, "d": "日本"})");
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  EXPECT_EQ((*json)["a"][1], 2);
  EXPECT_EQ((*json)["a"][2]["b"], "café \"x\" ]]]");
  EXPECT_EQ((*json)["d"], "日本");
}

TEST(JsonReader, DeepNestingIsRefusedBeforeTheParserRecurses) {
  // 100,000 nested arrays overflow the stack of a recursive parser or destructor (SIGSEGV).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Result<nlohmann::json> json = read_json(deep, {}, "deep.json");
  ASSERT_FALSE(json.ok());
  EXPECT_EQ(json.status().code(), StatusCode::kInvalidArgument);
  const std::string message = json.status().message();
  EXPECT_TRUE(contains(message, "deep.json: nested deeper than the limit of 64 levels")) << message;
  EXPECT_TRUE(contains(message, "byte 64")) << message;  // the 65th '['
  // Objects count too, and the same in a file.
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  const std::string path = temp_file("deep.json", objects);
  Result<nlohmann::json> from_file = read_json_file(path);
  fs::remove(path);
  ASSERT_FALSE(from_file.ok());
  EXPECT_TRUE(contains(from_file.status().message(), path)) << from_file.status().message();
  EXPECT_TRUE(contains(from_file.status().message(), "nested deeper"));
}

TEST(JsonReader, DepthIsCountedOutsideStringsOnly) {
  JsonLimits limits;
  limits.max_depth = 2;
  // Brackets and escaped quotes inside strings are not nesting.
  EXPECT_TRUE(read_json(R"([["[[[[\"{{{{"]])", limits).ok());
  Result<nlohmann::json> three = read_json("[[[1]]]", limits);
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(contains(three.status().message(), "limit of 2 levels at byte 2 (column 3)"))
      << three.status().message();
}

TEST(JsonReader, SizeIsBounded) {
  JsonLimits limits;
  limits.max_bytes = 8;
  EXPECT_TRUE(read_json("[1,2,3]", limits).ok());
  Result<nlohmann::json> big = read_json("[1,2,3,4,5]", limits, "big");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(), "big: 11 bytes, over the limit of 8 bytes");
  const std::string path = temp_file("big.json", "[1,2,3,4,5]");
  Result<nlohmann::json> big_file = read_json_file(path, limits);
  fs::remove(path);
  ASSERT_FALSE(big_file.ok());
  EXPECT_TRUE(contains(big_file.status().message(), "over the limit of 8 bytes"))
      << big_file.status().message();
}

TEST(JsonReader, InvalidUtf8IsRefusedWithItsOffset) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"a\": \"x\xff\"}", "byte 8 (column 9): byte 0xFF"},
      {"[\"\xc0\xaf\"]", "byte 2 (column 3): byte 0xC0"},                   // overlong '/'
      {"[\"\xed\xa0\x80\"]", "byte 2 (column 3): byte 0xED"},               // a surrogate
      {"[\"\xf4\x90\x80\x80\"]", "byte 2 (column 3): byte 0xF4"},           // past U+10FFFF
      {"{\n\"a\": \"\xe6\x97\"}", "byte 8 (line 2, column 7): byte 0xE6"},  // truncated
  };
  for (const auto& [text, where] : cases) {
    Result<nlohmann::json> json = read_json(text, {}, "u.json");
    ASSERT_FALSE(json.ok()) << where;
    EXPECT_TRUE(contains(json.status().message(), "u.json: invalid UTF-8 at " + where))
        << json.status().message();
  }
}

TEST(JsonReader, ParseErrorsSayWhere) {
  Result<nlohmann::json> truncated = read_json("{\"a\": [1, 2", {}, "t.json");
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(contains(truncated.status().message(),
                       "t.json: not valid JSON at byte 11, the end of the input (column 12)"))
      << truncated.status().message();
  Result<nlohmann::json> garbage = read_json("{\n  \"a\": 1,\n  oops\n}");
  ASSERT_FALSE(garbage.ok());
  EXPECT_TRUE(contains(garbage.status().message(), "not valid JSON at byte 14 (line 3, column 3)"))
      << garbage.status().message();
  Result<nlohmann::json> trailing = read_json("[1] [2]");
  ASSERT_FALSE(trailing.ok());
  EXPECT_TRUE(contains(trailing.status().message(), "not valid JSON"))
      << trailing.status().message();
  Result<nlohmann::json> overflow = read_json("[1e400]");
  ASSERT_FALSE(overflow.ok());
  EXPECT_TRUE(contains(overflow.status().message(), "1e400")) << overflow.status().message();
  EXPECT_FALSE(read_json("").ok());
}

TEST(JsonReader, DuplicateKeysAreRefusedNamingTheKeyAndWhere) {
  // nlohmann keeps the last value of a repeated key; the reader refuses the document.
  Result<nlohmann::json> flat = read_json(R"({"a": 1, "b": [{"a": 2}], "a": 3})", {}, "t.json");
  ASSERT_FALSE(flat.ok());
  EXPECT_EQ(flat.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      contains(flat.status().message(), "t.json: duplicate key \"a\" at byte 26 (column 27)"))
      << flat.status().message();
  // Nested, on a later line, and spelt with an escape: the same key all the same.
  Result<nlohmann::json> nested = read_json("{\"x\": {\n  \"k\": 1,\n  \"\\u006b\": 2}}");
  ASSERT_FALSE(nested.ok());
  EXPECT_TRUE(
      contains(nested.status().message(), "duplicate key \"k\" at byte 20 (line 3, column 3)"))
      << nested.status().message();
  // A key in another object, or a value equal to a key, is no duplicate.
  Result<nlohmann::json> fine =
      read_json(R"({"a": {"a": "a"}, "b": [{"a": 1}, {"a": 2}], "c": "a"})");
  ASSERT_TRUE(fine.ok()) << fine.status().to_string();
  EXPECT_EQ((*fine)["b"][1]["a"], 2);
  const std::string path = temp_file("dup.json", "{\n\"a\": 1,\n\"a\": 1\n}\n");
  Result<nlohmann::json> from_file = read_json_file(path);
  fs::remove(path);
  ASSERT_FALSE(from_file.ok());
  EXPECT_TRUE(contains(from_file.status().message(), path)) << from_file.status().message();
  EXPECT_TRUE(contains(from_file.status().message(), "duplicate key \"a\" at byte 10 (line 3"))
      << from_file.status().message();
}

TEST(JsonReader, MissingFilesAreNamed) {
  const std::string path = (fs::temp_directory_path() / "kvvm_json_reader_absent.json").string();
  Result<nlohmann::json> json = read_json_file(path);
  ASSERT_FALSE(json.ok());
  EXPECT_TRUE(contains(json.status().message(), "cannot open '" + path + "'"))
      << json.status().message();
}

}  // namespace
}  // namespace kvvm
