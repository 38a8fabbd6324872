// The one reader of request fields, by a table of declarations: each field's type, range,
// default, endpoints and allowed values are checked as declared, unknown fields are ignored
// and reported, and the first error names the field and the value. And the server's own
// table (request_fields.cc) is one the reader can trust.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/field_reader.h"
#include "server/request_fields.h"

namespace kvvm::server {
namespace {

// Every member starts where no declared default is, so a default the reader applies shows.
struct Sample {
  double ratio = -1;
  std::int64_t count = -1;
  std::optional<std::int64_t> limit = -1;
  bool flag = true;
  std::uint64_t seed = 99;
  std::string name = "unset";
  bool inner_flag = false;
  const nlohmann::json* list = nullptr;
  std::vector<std::string> read;  // what `note_read` saw: "param=value"
};

IntegerRange up_to_context(const ParseContext& context) {
  return {1, context.context_tokens, " (the context)"};
}
bool is_plain(const nlohmann::json& value) { return value == "plain"; }
Check note_read(const nlohmann::json& value, std::string_view param, const ParseContext&,
                Sample* body) {
  body->read.push_back(std::string(param) + "=" + value.dump());
  return std::nullopt;
}

using D = Declare<Sample>;

constexpr Field<Sample> kInner[] = {
    D::boolean("flag", kInGeneration, &Sample::inner_flag),
};
constexpr Field<Sample> kTable[] = {
    D::number("ratio", kInGeneration, {.lo = 0, .hi = 1, .lo_open = true}, &Sample::ratio, 0.5),
    D::integer("count", kInGeneration, up_to_context, &Sample::count, 3),
    D::integer("limit", kInCompletions, up_to_context, &Sample::limit),
    D::boolean("flag", kInChat, &Sample::flag),
    D::seed("seed", kInGeneration, &Sample::seed, 0),
    D::string("name", kInGeneration, &Sample::name).required_in(kInChat),
    D::object("options", kInGeneration).with_fields(kInner),
    D::string("mode", kInGeneration).only(is_plain, "plain only"),
    D::array("list", kInGeneration, &Sample::list).then(note_read),
};

ParseContext sample_context() {
  ParseContext ctx;
  ctx.context_tokens = 64;
  ctx.max_n = 16;
  ctx.vocab_size = 1000;
  return ctx;
}

struct SampleRead {
  Sample body;
  std::vector<std::string> ignored;
  Check error;
};

SampleRead read_sample(const std::string& text, std::uint8_t endpoint = kInCompletions,
                       const ParseContext& ctx = sample_context()) {
  SampleRead out;
  static nlohmann::json keep;  // the body's JSON slots point into it
  keep = nlohmann::json::parse(text);
  out.error = read_fields<Sample>(kTable, endpoint, keep, ctx, &out.body, &out.ignored);
  return out;
}

// The message of a refusal, or "accepted".
std::string refusal_of(const std::string& text, std::uint8_t endpoint = kInCompletions,
                       const ParseContext& ctx = sample_context()) {
  const SampleRead r = read_sample(text, endpoint, ctx);
  if (!r.error) return "accepted";
  EXPECT_EQ(r.error->status, 400);
  EXPECT_EQ(r.error->message.substr(0, r.error->param.size() + 2), r.error->param + ": ");
  return r.error->message;
}

TEST(FieldReader, AnAbsentOrNullFieldTakesItsDeclaredDefault) {
  for (const char* text : {R"({})", R"({"ratio": null, "count": null, "seed": null,
                                       "name": null, "limit": null, "options": null})"}) {
    SCOPED_TRACE(text);
    const SampleRead r = read_sample(text);
    ASSERT_FALSE(r.error) << r.error->message;
    EXPECT_EQ(r.body.ratio, 0.5);
    EXPECT_EQ(r.body.count, 3);
    EXPECT_EQ(r.body.seed, 0u);
    EXPECT_EQ(r.body.limit, std::nullopt);  // no default: the slot's empty value
    EXPECT_EQ(r.body.name, "");
    EXPECT_FALSE(r.body.inner_flag);
    EXPECT_TRUE(r.ignored.empty());
  }
  // A field another endpoint reads keeps what the body held: no default of this endpoint.
  EXPECT_TRUE(read_sample(R"({})", kInCompletions).body.flag);
  EXPECT_FALSE(read_sample(R"({"name": "a"})", kInChat).body.flag);
  // Values read.
  const SampleRead r =
      read_sample(R"({"ratio": 1, "count": 64.0, "limit": 5, "seed": -1, "name": "a",
                          "options": {"flag": true}})");
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_EQ(r.body.ratio, 1.0);
  EXPECT_EQ(r.body.count, 64);
  EXPECT_EQ(r.body.limit, 5);
  EXPECT_EQ(r.body.seed, ~std::uint64_t{0});
  EXPECT_EQ(r.body.name, "a");
  EXPECT_TRUE(r.body.inner_flag);
}

TEST(FieldReader, TheTypeIsCheckedAndTheRefusalNamesFieldAndValue) {
  EXPECT_EQ(refusal_of(R"({"ratio": "1"})"), R"(ratio: must be a number, not string "1")");
  EXPECT_EQ(refusal_of(R"({"ratio": true})"), "ratio: must be a number, not boolean true");
  EXPECT_EQ(refusal_of(R"({"count": 1.5})"), "count: 1.5 is not an integer");
  EXPECT_EQ(refusal_of(R"({"count": [1]})"), "count: must be an integer, not array [1]");
  EXPECT_EQ(refusal_of(R"({"flag": 1, "name": "a"})", kInChat),
            "flag: must be true or false, not number 1");
  EXPECT_EQ(refusal_of(R"({"seed": 0.5})"), "seed: 0.5 is not an integer");
  EXPECT_EQ(refusal_of(R"({"name": 5})"), "name: must be a string, not number 5");
  EXPECT_EQ(refusal_of(R"({"options": []})"), "options: must be an object, not array []");
  EXPECT_EQ(refusal_of(R"({"options": {"flag": "yes"}})"),
            R"(options.flag: must be true or false, not string "yes")");
  EXPECT_EQ(refusal_of(R"({"list": {}})"), "list: must be an array, not object {}");
  const SampleRead r = read_sample(R"({"options": {"flag": "yes"}})");
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->param, "options.flag");
  EXPECT_EQ(r.error->type, "invalid_request_error");
}

TEST(FieldReader, TheRangeIsCheckedWithItsBoundsOpenOrClosed) {
  EXPECT_EQ(refusal_of(R"({"ratio": 0})"), "ratio: 0 is out of range (0, 1]");
  EXPECT_EQ(refusal_of(R"({"ratio": 1.5})"), "ratio: 1.5 is out of range (0, 1]");
  EXPECT_EQ(refusal_of(R"({"ratio": 1e-9})"), "accepted");
  EXPECT_EQ(refusal_of(R"({"ratio": 1})"), "accepted");
  EXPECT_EQ(refusal_of(R"({"count": 0})"), "count: 0 is out of range [1, 64] (the context)");
  EXPECT_EQ(refusal_of(R"({"count": 65})"), "count: 65 is out of range [1, 64] (the context)");
  EXPECT_EQ(refusal_of(R"({"count": 18446744073709551615})"),
            "count: 18446744073709551615 is out of range [1, 64] (the context)");
  // Bounds from the server's context.
  ParseContext small = sample_context();
  small.context_tokens = 8;
  EXPECT_EQ(refusal_of(R"({"count": 9})", kInCompletions, small),
            "count: 9 is out of range [1, 8] (the context)");
  EXPECT_EQ(refusal_of(R"({"count": 8})", kInCompletions, small), "accepted");
}

// A field another endpoint declares is unknown here: ignored and reported, as today's unknown
// fields are (OpenAI's and vLLM's servers do the same).
TEST(FieldReader, AFieldOfAnotherEndpointIsUnknownThere) {
  const SampleRead completion =
      read_sample(R"({"flag": "not even a boolean", "limit": 2})", kInCompletions);
  ASSERT_FALSE(completion.error) << completion.error->message;
  EXPECT_EQ(completion.ignored, (std::vector<std::string>{"flag"}));
  EXPECT_TRUE(completion.body.flag);  // untouched
  EXPECT_EQ(completion.body.limit, 2);
  const SampleRead chat = read_sample(R"({"flag": false, "limit": "x", "name": "a"})", kInChat);
  ASSERT_FALSE(chat.error) << chat.error->message;
  EXPECT_EQ(chat.ignored, (std::vector<std::string>{"limit"}));
  EXPECT_FALSE(chat.body.flag);
}

TEST(FieldReader, UnknownFieldsAreIgnoredAndReportedInKeyOrderByTheirPath) {
  const SampleRead r =
      read_sample(R"({"zeta": 1, "alpha": null, "options": {"other": [], "flag": true},
                          "ratio": 0.25})");
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"alpha", "options.other", "zeta"}));
  EXPECT_EQ(r.body.ratio, 0.25);  // the known fields are read all the same
  EXPECT_TRUE(r.body.inner_flag);
}

TEST(FieldReader, ANeutralValuePassesAndAnyOtherIsNotSupported) {
  EXPECT_EQ(refusal_of(R"({"mode": "plain"})"), "accepted");
  EXPECT_EQ(refusal_of(R"({"mode": "fancy"})"),
            R"(mode: "fancy" (plain only) is not supported by this server)");
  // The type first: a value of the wrong type is a wrong type.
  EXPECT_EQ(refusal_of(R"({"mode": 5})"), "mode: must be a string, not number 5");
}

TEST(FieldReader, ARequiredFieldIsRequiredWhereItsEndpointSaysSo) {
  EXPECT_EQ(refusal_of(R"({})", kInChat), "name: is required");
  EXPECT_EQ(refusal_of(R"({"name": null})", kInChat), "name: is required");
  EXPECT_EQ(refusal_of(R"({})", kInCompletions), "accepted");
  // A bad value of another field is refused first: the keys are read before the check.
  EXPECT_EQ(refusal_of(R"({"ratio": 5})", kInChat), "ratio: 5 is out of range (0, 1]");
}

TEST(FieldReader, ADeclaredReadRunsOnceTheTypeIsCheckedWithTheFieldsPath) {
  const SampleRead r = read_sample(R"({"list": [1, "a"]})");
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_EQ(r.body.read, (std::vector<std::string>{R"(list=[1,"a"])"}));
  ASSERT_NE(r.body.list, nullptr);
  EXPECT_EQ(*r.body.list, nlohmann::json::parse(R"([1, "a"])"));
  const SampleRead wrong = read_sample(R"({"list": "a"})");
  ASSERT_TRUE(wrong.error);
  EXPECT_TRUE(wrong.body.read.empty());
}

TEST(FieldReader, TheFirstErrorInKeyOrderEndsTheReading) {
  EXPECT_EQ(refusal_of(R"({"ratio": 5, "count": 0})"),
            "count: 0 is out of range [1, 64] (the context)");
}

// What the reader trusts of a table is checked, so a wrong line fails a test, not a request.
TEST(FieldReader, ATableIsCheckedForWhatTheReaderTrusts) {
  EXPECT_TRUE(check_declarations<Sample>(kTable, sample_context()).ok());
  const auto fails = [](std::span<const Field<Sample>> table, const std::string& why) {
    const Status status = check_declarations<Sample>(table, sample_context());
    EXPECT_FALSE(status.ok()) << why;
    EXPECT_NE(status.message().find(why), std::string::npos) << status.message();
  };
  const Field<Sample> wrong_slot[] = {D::number("ratio", kInGeneration, {}, &Sample::count)};
  fails(wrong_slot, "ratio: its slot cannot hold its type");
  const Field<Sample> string_slot[] = {D::object("name", kInGeneration, &Sample::name)};
  fails(string_slot, "name: its slot cannot hold its type");
  // The factories type a default by its field's type; a line written by hand may not.
  Field<Sample> wrong_default[] = {D::number("ratio", kInGeneration, {}, &Sample::ratio)};
  wrong_default[0].fallback = std::int64_t{1};
  fails(wrong_default, "ratio: its default is not of its slot's type");
  const Field<Sample> out_of_range[] = {
      D::number("ratio", kInGeneration, {.lo = 0, .hi = 1}, &Sample::ratio, 2)};
  fails(out_of_range, "its default fails its own check: ratio: 2.0 is out of range [0, 1]");
  const Field<Sample> twice[] = {D::boolean("flag", kInChat, &Sample::flag),
                                 D::boolean("flag", kInGeneration, &Sample::inner_flag)};
  fails(twice, "flag: declared twice for one endpoint");
  const Field<Sample> required_elsewhere[] = {
      D::string("name", kInChat).required_in(kInCompletions)};
  fails(required_elsewhere, "name: required where it is not accepted");
}

TEST(RequestFields, TheServersTableIsOneTheReaderCanTrust) {
  const Status status = check_declarations(request_fields(), sample_context());
  EXPECT_TRUE(status.ok()) << status.message();
}

}  // namespace
}  // namespace kvvm::server
