#include "bench/drivers/tokenizer/tokenizer_load.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "kit/cli_common.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/load_profile.h"
#include "tokenizer/tokenizer_json.h"

namespace kvvm::cli {
namespace {

constexpr const char* kBench = "kvvm bench tokenizer-load";

// Qwen2's split pattern, as its tokenizer.json writes it.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string json_string(const std::string& text) { return nlohmann::json(text).dump(); }

// A byte-level BPE tokenizer.json laid out as Hugging Face writes one (two-space indent, the
// vocabulary in id order, merges as "left right"): each made token joins a random earlier
// token (short ones likelier) to one of the first 2,000, at most 12 characters, which gives a
// file of Qwen2's size and shape. The same `tokens` always give the same bytes.
std::string make_tokenizer_json(std::uint32_t tokens) {
  std::vector<std::string> vocab;
  std::vector<std::size_t> chars;  // each token's length in characters
  for (int byte = 0; byte < 256; ++byte) {
    vocab.push_back(
        tokenizer::detail::bytes_to_byte_level(std::string(1, static_cast<char>(byte))));
    chars.push_back(1);
  }
  std::unordered_set<std::string> seen(vocab.begin(), vocab.end());
  std::vector<std::pair<std::size_t, std::size_t>> merges;
  std::mt19937_64 random(20261202);
  std::exponential_distribution<double> recent(1.0 / 3000);
  while (merges.size() < tokens) {
    const std::size_t count = vocab.size();
    const bool shortish = random() % 2 == 0;
    const std::size_t a =
        shortish ? std::min(count - 1, static_cast<std::size_t>(recent(random))) : random() % count;
    const std::size_t b = random() % std::min<std::size_t>(count, 2000);
    if (chars[a] + chars[b] > 12) continue;
    std::string joined = vocab[a] + vocab[b];
    if (!seen.insert(joined).second) continue;
    vocab.push_back(std::move(joined));
    chars.push_back(chars[a] + chars[b]);
    merges.emplace_back(a, b);
  }
  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": [";
  for (int i = 0; i < 22; ++i) {
    out += i == 0 ? "\n" : ",\n";
    out += "    {\n      \"id\": " + std::to_string(vocab.size() + static_cast<std::size_t>(i)) +
           ",\n      \"content\": \"<|special_" + std::to_string(i) +
           "|>\",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": "
           "false,\n      \"normalized\": false,\n      \"special\": true\n    }";
  }
  out += "\n  ],\n  \"normalizer\": {\n    \"type\": \"NFC\"\n  },\n";
  out +=
      "  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n    \"pretokenizers\": [\n"
      "      {\n        \"type\": \"Split\",\n        \"pattern\": {\n          \"Regex\": " +
      json_string(kQwen2Pattern) +
      "\n        },\n        \"behavior\": \"Isolated\",\n        \"invert\": false\n      },\n"
      "      {\n        \"type\": \"ByteLevel\",\n        \"add_prefix_space\": false,\n"
      "        \"trim_offsets\": false,\n        \"use_regex\": false\n      }\n    ]\n  },\n";
  const std::string byte_level =
      "{\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": false,\n    \"trim_offsets\": "
      "false,\n    \"use_regex\": false\n  }";
  out += "  \"post_processor\": " + byte_level + ",\n  \"decoder\": " + byte_level + ",\n";
  out +=
      "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
      "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
      "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
      "    \"vocab\": {";
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    out += id == 0 ? "\n      " : ",\n      ";
    out += json_string(vocab[id]) + ": " + std::to_string(id);
  }
  out += "\n    },\n    \"merges\": [";
  for (std::size_t i = 0; i < merges.size(); ++i) {
    out += i == 0 ? "\n      " : ",\n      ";
    out += json_string(vocab[merges[i].first] + " " + vocab[merges[i].second]);
  }
  out += "\n    ]\n  }\n}";
  return out;
}

Result<double> time_json_syntax(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto start = std::chrono::steady_clock::now();
  KVVM_RETURN_IF_ERROR(tokenizer::detail::check_json_syntax(text));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

CLI::App* add_bench_tokenizer_load_command(CLI::App& bench, BenchTokenizerLoadOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "tokenizer-load",
      "Time Tokenizer::load on a large tokenizer.json and show where the time goes (reading, "
      "JSON with the vocabulary's table, merges, components and their regexes, by-id tables, "
      "added tokens, tokenizer_config.json, freeing). By default a byte-level BPE of Qwen2's "
      "size (about 9 MB) is made first, the same bytes every run.");
  cmd->add_option("--file", options.file, "Load this tokenizer.json instead of a made one");
  cmd->add_option("--tokens", options.tokens,
                  "Made tokens beyond the 256 byte characters, one merge each (default 150000)")
      ->transform(count_validator(1, 1'000'000));
  cmd->add_option("--loads", options.loads, "Loads timed (default 5)")
      ->transform(count_validator(1, 1000));
  cmd->add_option("--keep", options.keep, "Write the made tokenizer.json to this path and keep it");
  cmd->add_flag("--json", options.json, "Machine-readable report (JSON) on stdout");
  cmd->footer("Progress lines go to stderr. Exit status: 0 ok, 1 a load failed, 2 bad usage.");
  return cmd;
}

int run_bench_tokenizer_load(const BenchTokenizerLoadOptions& options, std::ostream& out,
                             std::ostream& err) {
  const auto fail = [&err](const Status& status) {
    err << kBench << ": " << status.to_string() << "\n";
    return exit_code(status);
  };
  std::string path = options.file;
  std::filesystem::path made_dir;
  if (path.empty()) {
    err << kBench << ": making a tokenizer.json of " << options.tokens << " tokens\n";
    const std::string text = make_tokenizer_json(options.tokens);
    if (!options.keep.empty()) {
      path = options.keep;
    } else {
      made_dir = std::filesystem::temp_directory_path() /
                 ("kvvm-tokenizer-load-" + std::to_string(getpid()));
      std::filesystem::create_directories(made_dir);
      path = (made_dir / "tokenizer.json").string();
    }
    std::ofstream file(path, std::ios::binary);
    file << text;
    if (!file.flush()) return fail(Status::InvalidArgument("cannot write '" + path + "'"));
  }
  std::vector<tokenizer::detail::LoadProfile> profiles;
  std::size_t vocab_size = 0;
  for (std::uint32_t i = 0; i < options.loads; ++i) {
    tokenizer::detail::LoadProfile profile;
    const auto start = std::chrono::steady_clock::now();
    Result<std::unique_ptr<tokenizer::Tokenizer>> loaded = tokenizer::load_profiled(path, &profile);
    if (!loaded.ok()) return fail(loaded.status());
    vocab_size = (*loaded)->vocab_size();
    loaded = Status::Internal("freed");  // a load is only over once its leftovers are freed
    profile.load_and_free_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // What the reading would cost with no table and no DOM: the JSON syntax alone.
    Result<double> syntax = time_json_syntax(path);
    if (!syntax.ok()) return fail(syntax.status());
    profile.syntax_ms = *syntax;
    profiles.push_back(profile);
  }
  if (!made_dir.empty()) std::filesystem::remove_all(made_dir);

  using Profile = tokenizer::detail::LoadProfile;
  const std::pair<const char*, double Profile::*> phases[] = {
      {"read the file", &Profile::read_ms},
      {"reading the JSON, all of it", &Profile::json_ms},
      {"  of which model.vocab (parse + table)", &Profile::vocab_ms},
      {"  of which model.merges (parse + table)", &Profile::merges_ms},
      {"JSON syntax alone (a separate pass, not in total)", &Profile::syntax_ms},
      {"model checks", &Profile::model_ms},
      {"normalizer, pre-tokenizer (regex compile), decoder", &Profile::components_ms},
      {"by-id tables + decoded bytes", &Profile::tables_ms},
      {"added tokens, post-processor", &Profile::added_ms},
      {"tokenizer_config.json", &Profile::config_ms},
      {"freeing the text", &Profile::release_ms},
      {"total", &Profile::total_ms},
      {"load, then free the tokenizer", &Profile::load_and_free_ms}};
  const auto median_of = [&](double Profile::*field) {
    std::vector<double> values;
    for (const Profile& p : profiles) values.push_back(p.*field);
    return median(values);
  };
  if (options.json) {
    nlohmann::ordered_json json;
    json["file"] = options.file.empty() ? std::string("made") : options.file;
    json["file_bytes"] = profiles.front().file_bytes;
    json["vocab_size"] = vocab_size;
    json["loads"] = options.loads;
    nlohmann::ordered_json median_ms, first_ms;
    for (const auto& [name, field] : phases) {
      median_ms[name] = median_of(field);
      first_ms[name] = profiles.front().*field;
    }
    json["median_ms"] = median_ms;
    json["first_ms"] = first_ms;
    out << dump_json(json) << "\n";
  } else {
    char line[160];
    std::snprintf(line, sizeof line, "%s: %.2f MB, %zu ids, %u loads\n",
                  options.file.empty() ? "made tokenizer.json" : options.file.c_str(),
                  static_cast<double>(profiles.front().file_bytes) / 1e6, vocab_size,
                  options.loads);
    out << line;
    std::snprintf(line, sizeof line, "%-52s %10s %10s\n", "phase", "median ms", "first ms");
    out << line;
    for (const auto& [name, field] : phases) {
      std::snprintf(line, sizeof line, "%-52s %10.1f %10.1f\n", name, median_of(field),
                    profiles.front().*field);
      out << line;
    }
  }
  if (Status written = check_written(out, "standard output"); !written.ok()) return fail(written);
  return kExitOk;
}

}  // namespace kvvm::cli
