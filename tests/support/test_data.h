// Where the committed test data lives: tests/data, an absolute path the build states
// (KVVM_TEST_DATA_DIR), so the tests run from any working directory. (__FILE__ is no help:
// ccache's base directory turns it into a path relative to the build directory.)
#pragma once

#include <filesystem>
#include <string>

namespace kvvm::test {

inline std::filesystem::path data_dir() { return std::filesystem::path(KVVM_TEST_DATA_DIR); }

// tests/data/models/NAME: a checkpoint made by scripts/make_fixtures.py (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json, expected.json).
inline std::string model_fixture_dir(const std::string& name) {
  return (data_dir() / "models" / name).string();
}

// models/kvvm-adder: the embedded demo model, with eval.json (held-out prompts, HF's answers).
inline std::string demo_model_dir() {
  return (data_dir().parent_path().parent_path() / "models" / "kvvm-adder").string();
}

}  // namespace kvvm::test
