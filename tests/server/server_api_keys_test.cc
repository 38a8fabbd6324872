// ApiKeys: the key file's format, its errors (FILE:LINE, never the key), tenant numbering.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kvvm/server/api_keys.h"

namespace kvvm::server {
namespace {

constexpr const char* kKeyA = "sk-alpha-0123456789";
constexpr const char* kKeyB = "sk-bravo-0123456789";
constexpr const char* kKeyC = "sk-charlie-01234567";

std::string lines(std::initializer_list<std::string> all) {
  std::string text;
  for (const std::string& line : all) text += line + "\n";
  return text;
}

TEST(ServerApiKeys, ParsesKeysTenantsCommentsAndBlankLines) {
  const std::string text = lines({
      "# production keys", "", std::string(kKeyA) + " team-a", "   ",
      std::string(kKeyB) + "\t\tteam-b", "  # indented comment",
      std::string("  ") + kKeyC + "   team-a  \r",  // another key for team-a; CRLF; padding
  });
  Result<ApiKeys> keys = ApiKeys::parse(text, "keys.txt");
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  EXPECT_FALSE(keys->empty());
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_EQ(keys->tenant(kKeyA), 1u);
  EXPECT_EQ(keys->tenant(kKeyB), 2u);
  EXPECT_EQ(keys->tenant(kKeyC), 1u);  // several keys share one tenant (and its cache)
  EXPECT_EQ(keys->tenant_names(), (std::vector<std::string>{"team-a", "team-b"}));
  EXPECT_EQ(keys->tenant("sk-unknown-0123456789"), std::nullopt);
  EXPECT_EQ(keys->tenant(""), std::nullopt);
  EXPECT_EQ(keys->tenant(std::string(kKeyA) + " "), std::nullopt);
}

TEST(ServerApiKeys, NoKeysByDefault) {
  ApiKeys keys;
  EXPECT_TRUE(keys.empty());
  EXPECT_EQ(keys.tenant(kKeyA), std::nullopt);
}

void expect_error(const std::string& text, const std::string& expected, const std::string& secret) {
  Result<ApiKeys> keys = ApiKeys::parse(text, "keys.txt");
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), StatusCode::kInvalidArgument);
  const std::string message = keys.status().to_string();
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  if (!secret.empty()) {
    EXPECT_EQ(message.find(secret), std::string::npos) << message;
  }
}

TEST(ServerApiKeys, DuplicateKeyNamesTheLinesNotTheKey) {
  expect_error(lines({std::string(kKeyA) + " team-a", "# comment", std::string(kKeyA) + " team-b"}),
               "keys.txt:3: duplicate key (first on line 1)", kKeyA);
}

TEST(ServerApiKeys, MalformedLinesAreErrors) {
  expect_error(lines({std::string(kKeyA) + " team-a", kKeyB}), "keys.txt:2: missing tenant", kKeyB);
  expect_error(lines({"short12 team-a"}), "keys.txt:1: the key has 7 characters; it must have 8",
               "short12");
  expect_error(lines({std::string(300, 'k') + " team-a"}), "keys.txt:1: the key has 300",
               std::string(300, 'k'));
  expect_error(lines({std::string(kKeyA) + " " + std::string(129, 't')}),
               "keys.txt:1: the tenant has 129 characters", "");
  expect_error(lines({std::string(kKeyA) + " team-a extra"}), "keys.txt:1: 3 fields", kKeyA);
  expect_error(lines({"sk-caf\xc3\xa9-012345 team-a"}),
               "keys.txt:1: the key has a character that is not printable ASCII at position 7",
               "sk-caf");
  expect_error(lines({std::string("sk-bell\a0123456 team-a")}), "not printable ASCII", "sk-bell");
  expect_error("", "keys.txt: no keys", "");
  expect_error(lines({"# only comments", ""}), "keys.txt: no keys", "");
}

class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("kvvm_api_keys_" + std::to_string(::getpid()) + "_" +
               std::to_string(reinterpret_cast<std::uintptr_t>(this)) + ".txt")) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(ServerApiKeys, LoadsAFile) {
  TempFile file(lines({std::string(kKeyA) + " team-a", std::string(kKeyB) + " team-b"}));
  Result<ApiKeys> keys = ApiKeys::load(file.path());
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  EXPECT_EQ(keys->tenant(kKeyB), 2u);
}

TEST(ServerApiKeys, FileErrorsNameTheFileAndLine) {
  TempFile file(lines({std::string(kKeyA) + " team-a", kKeyA + std::string(" team-a")}));
  Result<ApiKeys> keys = ApiKeys::load(file.path());
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().to_string().find(file.path() + ":2: duplicate key"), std::string::npos)
      << keys.status().to_string();
  EXPECT_EQ(keys.status().to_string().find(kKeyA), std::string::npos);
}

TEST(ServerApiKeys, MissingFileIsNotFound) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "kvvm_no_such_keys.txt").string();
  Result<ApiKeys> keys = ApiKeys::load(path);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), StatusCode::kNotFound);
  EXPECT_NE(keys.status().to_string().find(path), std::string::npos);
}

TEST(ServerApiKeys, DirectoryIsAnError) {
  Result<ApiKeys> keys = ApiKeys::load(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvvm::server
