// A checkpoint fixture of tests/data/models loaded for a parity test: its config, weight
// files and bound weights, expected.json, and the sizes its cases need (the parity tests of
// every backend load fixtures the same way).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/json_reader.h"
#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "support/test_data.h"

namespace kvvm::test {

struct FixtureModel {
  model::ModelConfig config;
  std::unique_ptr<model::WeightFiles> files;  // what `weights` points into
  model::ModelWeights weights;
  nlohmann::json expected;
  std::size_t longest = 1;  // tokens of the longest prompt
  std::size_t context = 1;  // tokens of the longest prompt and its continuation
};

// Loads fixture `name` (model_fixture_dir); an error names the file or field that failed.
inline Result<FixtureModel> load_fixture_model(const std::string& name) {
  const std::string dir = model_fixture_dir(name);
  if (!std::filesystem::exists(dir)) return Status::NotFound(dir + " is missing");
  FixtureModel fixture;
  auto config = model::load_model_config(dir);
  if (!config.ok()) return config.status();
  fixture.config = *config;
  auto files = model::WeightFiles::open_dir(dir);
  if (!files.ok()) return files.status();
  fixture.files = std::move(files).value();
  auto weights = model::bind_weights(fixture.config, *fixture.files);
  if (!weights.ok()) return weights.status();
  fixture.weights = *weights;
  auto expected = read_json_file(dir + "/expected.json");
  if (!expected.ok()) return expected.status();
  fixture.expected = *expected;
  for (const auto& entry : fixture.expected.at("logits")) {
    fixture.longest = std::max(fixture.longest, entry.at("prompt_ids").size());
  }
  for (const auto& entry : fixture.expected.at("greedy")) {
    fixture.longest = std::max(fixture.longest, entry.at("prompt_ids").size());
    fixture.context =
        std::max(fixture.context, entry.at("prompt_ids").size() + entry.at("tokens").size());
  }
  fixture.context = std::max(fixture.context, fixture.longest);
  return fixture;
}

// A fixture's token ids (expected.json's arrays) as the model takes them.
inline std::vector<std::int32_t> token_ids(const nlohmann::json& array) {
  return array.get<std::vector<std::int32_t>>();
}

}  // namespace kvvm::test
