// Where the committed test data lives: tests/data, found from this header's own path so the
// tests run from any working directory.
#pragma once

#include <filesystem>
#include <string>

namespace kvvm::test {

inline std::filesystem::path data_dir() {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "data";
}

// tests/data/models/NAME: a checkpoint made by scripts/make_fixtures.py (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json, expected.json).
inline std::string model_fixture_dir(const std::string& name) {
  return (data_dir() / "models" / name).string();
}

}  // namespace kvvm::test
