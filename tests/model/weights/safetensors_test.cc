// WeightFiles: safetensors files opened through mmap, one file or the shards an index names,
// and every broken file (truncated, absurd header length, bad JSON, unknown dtype, shape and
// range disagreeing, overlapping or out-of-file ranges, index escaping its directory) refused
// with an error naming the file and the tensor.
#include "kvvm/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "support/safetensors_writer.h"
#include "support/text_match.h"

namespace kvvm::model {
namespace {

using test::TempDir;
using test::TensorSpec;

using test::contains;

std::vector<std::byte> raw(std::size_t count, std::uint8_t first = 1) {
  std::vector<std::byte> bytes(count);
  for (std::size_t i = 0; i < count; ++i) bytes[i] = static_cast<std::byte>(first + i);
  return bytes;
}

bool same_bytes(const TensorView& view, const std::vector<std::byte>& bytes) {
  return view.bytes == bytes.size() &&
         (bytes.empty() || std::memcmp(view.data, bytes.data(), bytes.size()) == 0);
}

// The error opening `path`, which must be refused; it must name the file.
std::string refusal(const std::filesystem::path& path) {
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_file(path.string());
  EXPECT_FALSE(files.ok());
  if (files.ok()) return "";
  EXPECT_EQ(files.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(files.status().message(), path.string())) << files.status().message();
  return files.status().message();
}

// A header written as given, over `data_bytes` bytes of data.
std::string refusal_of_header(const TempDir& dir, const std::string& header,
                              std::size_t data_bytes = 64) {
  const auto path = dir / "bad.safetensors";
  test::write_safetensors_raw(path, header.size(), header, raw(data_bytes));
  return refusal(path);
}

TEST(Safetensors, DTypeNamesAndSizes) {
  EXPECT_EQ(to_string(TensorDType::kBf16), "BF16");
  EXPECT_EQ(to_string(TensorDType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(element_size(TensorDType::kBf16), 2u);
  EXPECT_EQ(element_size(TensorDType::kF32), 4u);
  EXPECT_EQ(element_size(TensorDType::kF64), 8u);
  EXPECT_EQ(element_size(TensorDType::kBool), 1u);
}

TEST(Safetensors, OneFileGivesViewsIntoTheMapping) {
  TempDir dir;
  const std::vector<TensorSpec> tensors = {
      {"b.weight", "F32", {2, 3}, raw(24, 10)},
      {"a.weight", "BF16", {4}, raw(8, 50)},
      {"empty", "F16", {0, 5}, {}},
      {"scalar", "I64", {}, raw(8, 90)},
  };
  test::write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  Result<std::unique_ptr<WeightFiles>> files =
      WeightFiles::open_file((dir / "model.safetensors").string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_EQ((*files)->names(),
            (std::vector<std::string>{"a.weight", "b.weight", "empty", "scalar"}));
  EXPECT_EQ((*files)->total_bytes(), 40u);
  const TensorView* b = (*files)->find("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name, "b.weight");
  EXPECT_EQ(b->dtype, TensorDType::kF32);
  EXPECT_EQ(b->shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(b->elements(), 6u);
  EXPECT_TRUE(same_bytes(*b, tensors[0].bytes));
  const TensorView* a = (*files)->find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, TensorDType::kBf16);
  EXPECT_TRUE(same_bytes(*a, tensors[1].bytes));
  const TensorView* scalar = (*files)->find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_EQ(scalar->elements(), 1u);
  EXPECT_TRUE(same_bytes(*scalar, tensors[3].bytes));
  EXPECT_EQ((*files)->find("empty")->bytes, 0u);
  EXPECT_EQ((*files)->find("missing"), nullptr);
  EXPECT_EQ((*files)->find("a.weigh"), nullptr);

  // open_dir finds the same single file.
  Result<std::unique_ptr<WeightFiles>> from_dir = WeightFiles::open_dir(dir.path().string());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().to_string();
  EXPECT_EQ((*from_dir)->names(), (*files)->names());
}

TEST(Safetensors, DataNeedNotBeCoveredNorAligned) {
  TempDir dir;
  // A 3-byte header length (not a multiple of 8), a gap before the tensor and bytes after it.
  const std::string header = R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  test::write_safetensors_raw(dir / "x.safetensors", header.size(), header, raw(9, 100));
  Result<std::unique_ptr<WeightFiles>> files =
      WeightFiles::open_file((dir / "x.safetensors").string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  const TensorView* view = (*files)->find("t");
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(std::to_integer<int>(view->data[0]), 103);
  EXPECT_EQ(std::to_integer<int>(view->data[1]), 104);
}

TEST(Safetensors, TruncatedFilesAreRefused) {
  TempDir dir;
  const auto path = dir / "t.safetensors";
  test::write_text_file(path, "");
  EXPECT_TRUE(contains(refusal(path), "shorter than the 8-byte header length"));
  test::write_text_file(path, std::string_view("\x10\0\0", 3));
  EXPECT_TRUE(contains(refusal(path), "truncated: 3 bytes"));

  // The length says 1000 bytes of header; 10 follow.
  test::write_safetensors_raw(path, 1000, "{\"a\":1234}");
  EXPECT_TRUE(contains(refusal(path), "the header length is 1000 bytes, but only 10 follow"));

  // An absurd length is refused before anything is read.
  test::write_safetensors_raw(path, std::uint64_t{1} << 40, "{}");
  EXPECT_TRUE(contains(refusal(path), "header length 1099511627776 is over the limit"));
  test::write_safetensors_raw(path, ~std::uint64_t{0}, "{}");
  EXPECT_TRUE(contains(refusal(path), "over the limit"));

  // The data stops before the last tensor's end.
  std::vector<TensorSpec> tensors = {{"w", "F32", {4}, raw(16)}};
  const std::string header = test::safetensors_header(tensors).dump();
  test::write_safetensors_raw(path, header.size(), header, raw(12));
  const std::string message = refusal(path);
  EXPECT_TRUE(contains(message, "tensor 'w'")) << message;
  EXPECT_TRUE(contains(message, "data_offsets [0, 16] run past the end of the data section (12"))
      << message;
}

TEST(Safetensors, HeaderJsonIsBounded) {
  TempDir dir;
  EXPECT_TRUE(contains(refusal_of_header(dir, "{\"w\": {\"dtype\": "), "not valid JSON"));
  EXPECT_TRUE(contains(refusal_of_header(dir, "[1, 2]"), "expected a JSON object of tensors"));
  EXPECT_TRUE(contains(refusal_of_header(dir, std::string(1000, '[') + std::string(1000, ']')),
                       "nested deeper"));
  EXPECT_TRUE(contains(refusal_of_header(dir, "{\"w\xff\": 1}"), "invalid UTF-8"));
  EXPECT_TRUE(contains(refusal_of_header(dir, R"({"__metadata__": [1]})"), "'__metadata__'"));
}

TEST(Safetensors, EntriesAreChecked) {
  TempDir dir;
  struct Case {
    const char* entry;
    const char* expected;
  };
  for (const Case& bad : {
           Case{R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})", "unknown dtype \"F4\""},
           Case{R"({"dtype":"bf16","shape":[2],"data_offsets":[0,4]})", "unknown dtype \"bf16\""},
           Case{R"({"shape":[2],"data_offsets":[0,4]})", "'dtype' is missing"},
           Case{R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})",
                "shape [2, 3] of F32 is 24 bytes, but data_offsets [0, 20] hold 20"},
           Case{R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", "'shape' is [-2]"},
           Case{R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})", "'shape' is \"2\""},
           Case{R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})",
                "more bytes than 64 bits count"},
           Case{R"({"dtype":"U8","shape":[2],"data_offsets":[6,4]})", "begin <= end"},
           Case{R"({"dtype":"U8","shape":[2],"data_offsets":[0]})", "'data_offsets' is [0]"},
           Case{R"({"dtype":"U8","shape":[2]})", "'data_offsets' is missing"},
           Case{R"({"dtype":"U8","shape":[2],"data_offsets":[64,66]})", "run past the end"},
           Case{R"({"dtype":"U8","shape":[2],"data_offsets":[18446744073709551614,0]})",
                "begin <= end"},
           Case{R"([1, 2])", "its header entry is [1,2]"},
       }) {
    const std::string header = std::string(R"({"ok":{"dtype":"U8","shape":[1],)") +
                               R"("data_offsets":[0,1]},"model.x.weight":)" + bad.entry + "}";
    const std::string message = refusal_of_header(dir, header);
    EXPECT_TRUE(contains(message, "tensor 'model.x.weight'")) << message;
    EXPECT_TRUE(contains(message, bad.expected)) << bad.entry << ": " << message;
  }
}

TEST(Safetensors, OverlappingRangesAreRefusedNamingBoth) {
  TempDir dir;
  std::string message =
      refusal_of_header(dir, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})");
  EXPECT_TRUE(contains(message, "'a' [0, 16] and 'b' [12, 20] overlap")) << message;

  // A range inside a long earlier one, past a shorter one between them.
  message = refusal_of_header(dir, R"({"long":{"dtype":"U8","shape":[40],"data_offsets":[0,40]},)"
                                   R"("short":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                                   R"("inner":{"dtype":"U8","shape":[2],"data_offsets":[30,32]}})");
  EXPECT_TRUE(contains(message, "'long' [0, 40] and ")) << message;

  // Touching ranges and empty tensors anywhere are fine.
  const auto path = dir / "ok.safetensors";
  const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                             R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})";
  test::write_safetensors_raw(path, header.size(), header, raw(8));
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_file(path.string());
  EXPECT_TRUE(files.ok()) << files.status().to_string();
}

TEST(Safetensors, MissingFilesAreNamed) {
  TempDir dir;
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(contains(files.status().message(), (dir / "model.safetensors").string()));
  EXPECT_TRUE(contains(files.status().message(), (dir / "model.safetensors.index.json").string()));

  files = WeightFiles::open_file((dir / "nope.safetensors").string());
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(files.status().message(), "nope.safetensors' not found"));

  // A directory is not a checkpoint file.
  files = WeightFiles::open_file(dir.path().string());
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(contains(files.status().message(), dir.path().string()));
}

// Two shards and their index.
void write_shards(const TempDir& dir, const nlohmann::json& weight_map) {
  test::write_safetensors(dir / "model-00001-of-00002.safetensors",
                          {{"embed", "F32", {2, 2}, raw(16, 1)}, {"norm", "F32", {2}, raw(8, 20)}});
  test::write_safetensors(dir / "model-00002-of-00002.safetensors",
                          {{"head", "BF16", {2, 2}, raw(8, 40)}});
  test::write_json_file(dir / "model.safetensors.index.json",
                        {{"metadata", {{"total_size", 32}}}, {"weight_map", weight_map}});
}

TEST(Safetensors, ShardsListedByTheIndex) {
  TempDir dir;
  write_shards(dir, {{"embed", "model-00001-of-00002.safetensors"},
                     {"norm", "model-00001-of-00002.safetensors"},
                     {"head", "model-00002-of-00002.safetensors"}});
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_EQ((*files)->names(), (std::vector<std::string>{"embed", "head", "norm"}));
  EXPECT_EQ((*files)->total_bytes(), 32u);
  ASSERT_NE((*files)->find("head"), nullptr);
  EXPECT_TRUE(same_bytes(*(*files)->find("head"), raw(8, 40)));
  EXPECT_TRUE(same_bytes(*(*files)->find("norm"), raw(8, 20)));
  EXPECT_TRUE(same_bytes(*(*files)->find("embed"), raw(16, 1)));
}

TEST(Safetensors, IndexDefectsAreRefused) {
  TempDir dir;
  const std::string index = (dir / "model.safetensors.index.json").string();
  const auto refused = [&](const nlohmann::json& weight_map) {
    write_shards(dir, weight_map);
    Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
    EXPECT_FALSE(files.ok());
    return files.ok() ? std::string() : files.status().message();
  };
  // The index maps a tensor to a shard that does not hold it.
  std::string message = refused({{"embed", "model-00001-of-00002.safetensors"},
                                 {"head", "model-00001-of-00002.safetensors"}});
  EXPECT_TRUE(contains(message, "tensor 'head'")) << message;
  EXPECT_TRUE(contains(message, "model-00001-of-00002.safetensors', which does not hold it"))
      << message;
  EXPECT_TRUE(contains(message, index)) << message;

  message = refused({{"embed", "model-00003-of-00002.safetensors"}});
  EXPECT_TRUE(contains(message, "model-00003-of-00002.safetensors' not found")) << message;

  for (const char* escape :
       {"../model-00001-of-00002.safetensors", "/etc/passwd", "..", "sub/model.safetensors", ""}) {
    message = refused({{"embed", escape}});
    EXPECT_TRUE(contains(message, "expected the name of a file in the same directory"))
        << escape << ": " << message;
    EXPECT_TRUE(contains(message, "'embed'")) << message;
  }
  message = refused({{"embed", 3}});
  EXPECT_TRUE(contains(message, "maps to 3")) << message;
  message = refused(nlohmann::json::object());
  EXPECT_TRUE(contains(message, "'weight_map'")) << message;

  // One name in two shards.
  test::write_safetensors(dir / "model-00002-of-00002.safetensors",
                          {{"embed", "F32", {2, 2}, raw(16)}, {"head", "BF16", {2, 2}, raw(8)}});
  test::write_json_file(dir / "model.safetensors.index.json",
                        {{"weight_map",
                          {{"embed", "model-00001-of-00002.safetensors"},
                           {"head", "model-00002-of-00002.safetensors"}}}});
  Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_dir(dir.path().string());
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(contains(files.status().message(),
                       "tensor 'embed' is in both '" +
                           (dir / "model-00001-of-00002.safetensors").string() + "' and '" +
                           (dir / "model-00002-of-00002.safetensors").string() + "'"))
      << files.status().message();

  // A broken shard is named.
  write_shards(dir, {{"embed", "model-00001-of-00002.safetensors"},
                     {"head", "model-00002-of-00002.safetensors"}});
  test::write_text_file(dir / "model-00002-of-00002.safetensors", "abc");
  files = WeightFiles::open_dir(dir.path().string());
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(contains(files.status().message(), "model-00002-of-00002.safetensors: truncated"))
      << files.status().message();

  test::write_text_file(index, "{\"weight_map\": ");
  files = WeightFiles::open_dir(dir.path().string());
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(contains(files.status().message(), index)) << files.status().message();
}

// Random damage to a valid file (bytes flipped in the length and header, the file cut short):
// every outcome is a view inside the file or an InvalidArgument, never a crash or a read
// past the mapping (the sanitizer builds check the reads).
TEST(Safetensors, DamagedFilesNeverReadOutsideTheFile) {
  TempDir dir;
  const auto good = dir / "good.safetensors";
  test::write_safetensors(good, {{"a", "F32", {2, 3}, raw(24)}, {"b", "BF16", {5}, raw(10)}},
                          {{"format", "pt"}});
  std::ifstream in(good, std::ios::binary);
  const std::vector<char> original((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  std::mt19937_64 random(12345);
  const auto path = dir / "damaged.safetensors";
  int opened = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<char> bytes = original;
    const int damage = static_cast<int>(random() % 4);
    const std::size_t header_end = bytes.size() - 34;  // the data: 24 + 10 bytes
    if (damage == 0) {
      bytes.resize(random() % bytes.size());
    } else if (damage == 3) {
      // A digit of the header's numbers (shapes, offsets) changed to another digit.
      std::vector<std::size_t> digits;
      for (std::size_t i = 8; i < header_end; ++i) {
        if (bytes[i] >= '0' && bytes[i] <= '9') digits.push_back(i);
      }
      bytes[digits[random() % digits.size()]] = static_cast<char>('0' + random() % 10);
    } else {
      const int flips = 1 + static_cast<int>(random() % 4);
      for (int i = 0; i < flips; ++i) {
        // The length (damage 1) or anywhere before the data (damage 2).
        const std::size_t at = random() % (damage == 1 ? std::size_t{8} : header_end);
        bytes[at] = static_cast<char>(random());
      }
    }
    test::write_text_file(path, std::string_view(bytes.data(), bytes.size()));
    Result<std::unique_ptr<WeightFiles>> files = WeightFiles::open_file(path.string());
    if (!files.ok()) {
      EXPECT_EQ(files.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    ++opened;
    for (const std::string& name : (*files)->names()) {
      const TensorView* view = (*files)->find(name);
      ASSERT_NE(view, nullptr);
      const auto* first = reinterpret_cast<const char*>(view->data);
      unsigned sum = 0;
      for (std::uint64_t i = 0; i < view->bytes; ++i) sum += static_cast<unsigned char>(first[i]);
      EXPECT_LE(view->bytes, bytes.size()) << name << sum;
    }
  }
  EXPECT_GT(opened, 0);  // some damage (inside the data) leaves a valid file
}

}  // namespace
}  // namespace kvvm::model
