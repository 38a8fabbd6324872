#include "bench/drivers/attention/kv_error.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kit/cli_common.h"
#include "kit/kv_dtype_flag.h"
#include "kit/model_loading.h"
#include "kvvm/engine/kv_space.h"
#include "kvvm/model/model.h"

namespace kvvm::cli {
namespace {

constexpr const char* kBenchKvError = "kvvm bench kv-error";
constexpr std::uint64_t kMaxPrompts = 100'000;

// The prompt's last logits after its prefill into a fresh slot of `kv`, in steps of at most
// the model's max_step_tokens.
Result<std::vector<float>> last_logits(model::Model& model, engine::KvSpace& kv,
                                       const std::vector<std::int32_t>& prompt) {
  Result<SlotId> slot = kv.arena().admit(prompt.size());
  if (!slot.ok()) return slot.status().with_context("admitting the prompt");
  std::vector<float> logits(model.config().vocab_size);
  const std::uint32_t step = model.limits().max_step_tokens;
  Status status = Status::Ok();
  for (std::uint32_t start = 0; start < prompt.size() && status.ok(); start += step) {
    const auto tokens =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(step, prompt.size() - start));
    const model::Chunk chunk{*slot, start, tokens};
    status = model.forward({std::span<const std::int32_t>(prompt).subspan(start, tokens),
                            std::span<const model::Chunk>(&chunk, 1),
                            kv.view(),
                            {}},
                           {logits.data(), nullptr, nullptr});
  }
  const Status finished = kv.arena().finish(*slot);
  KVVM_RETURN_IF_ERROR(status);
  KVVM_RETURN_IF_ERROR(finished);
  return logits;
}

struct PromptError {
  double relative = 0;  // max_i |fp8_i - ref_i| / max_i |ref_i|
  bool same_greedy = false;
};

PromptError compare(const std::vector<float>& fp8, const std::vector<float>& reference) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const double d = std::fabs(double{fp8[i]} - double{reference[i]});
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(double{reference[i]}));
  }
  const auto top = [](const std::vector<float>& v) {
    return std::max_element(v.begin(), v.end()) - v.begin();
  };
  return {scale > 0 ? diff / scale : diff, top(fp8) == top(reference)};
}

}  // namespace

CLI::App* add_bench_kv_error_command(CLI::App& bench, BenchKvErrorOptions& options) {
  CLI::App* cmd = bench.add_subcommand(
      "kv-error",
      "Measure what an fp8 (e4m3) KV cache costs in accuracy: random prompts are each "
      "prefilled into a cache of the model's own type (fp32 on the CPU, the compute type on "
      "CUDA) and into an fp8 one, and the last position's logits compared: per prompt the "
      "relative error max |fp8 - ref| / max |ref| and whether the greedy token agrees; mean, "
      "median and max over the prompts.");
  cmd->add_option("--model", options.model_dir,
                  "Checkpoint directory: config.json, tokenizer.json and the weights (none with "
                  "--load-format dummy)")
      ->required();
  cmd->add_option("--backend", options.backend, "auto, cpu or cuda (default auto)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  add_weight_flags(*cmd, options.weights);
  add_kv_scales_flag(*cmd, options.kv_scales);
  cmd->add_option("--prompts", options.prompts, "Prompts compared (default 64)")
      ->transform(count_validator(1, kMaxPrompts));
  cmd->add_option("--prompt-tokens", options.prompt_tokens,
                  "Tokens of each prompt, random ids (default 512)")
      ->transform(count_validator(1, kMaxTokens));
  cmd->add_option("--seed", options.seed, "Seed of the prompts' token ids (default 1)")
      ->transform(count_validator(0, std::numeric_limits<std::uint64_t>::max()));
  cmd->add_flag("--json", options.json, "Machine-readable report (JSON) on stdout");
  cmd->footer("Progress lines go to stderr. Exit status: 0 ok, 1 a step failed, 2 bad usage.");
  return cmd;
}

int run_bench_kv_error(const BenchKvErrorOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&err](const Status& status) {
    err << kBenchKvError << ": " << status.to_string() << "\n";
    return exit_code(status);
  };
  Result<LoadedModel> loaded =
      load_model(options.model_dir, options.backend, kBenchKvError, err, options.weights);
  if (!loaded.ok()) return fail(loaded.status());
  model::Model& model = *loaded->model;
  const model::ModelConfig& config = loaded->config;
  if (options.prompt_tokens > config.max_position_embeddings) {
    return fail(Status::InvalidArgument("--prompt-tokens " + std::to_string(options.prompt_tokens) +
                                        " is beyond the config's max_position_embeddings " +
                                        std::to_string(config.max_position_embeddings)));
  }
  // Two spaces on the model's driver and governor: its own type, then fp8.
  std::unique_ptr<engine::KvSpace> spaces[2];
  for (int i = 0; i < 2; ++i) {
    engine::KvSpaceOptions kv_options;
    kv_options.backend = model.backend();
    kv_options.kv_dtype = i == 0 ? DType::kUnset : DType::kFp8;
    kv_options.sequences = 1;
    kv_options.max_context = options.prompt_tokens;
    // One prompt at a time: a limit of four prompts' bytes (windows round up), at least 1 GiB,
    // not the default's share of the device, which would leave the other space nothing.
    const DType element = i == 0 ? engine::default_kv_dtype(config, model.backend()) : DType::kFp8;
    kv_options.budget_bytes = std::max<std::uint64_t>(
        4 * config.kv_geometry(element).bytes_per_token() * options.prompt_tokens,
        std::uint64_t{1} << 30);
    kv_options.driver = loaded->driver.get();
    kv_options.governor = loaded->governor.get();
    Result<std::unique_ptr<engine::KvSpace>> made = engine::KvSpace::create(config, kv_options);
    if (!made.ok()) return fail(made.status().with_context("KV space"));
    spaces[i] = std::move(made).value();
  }
  const DType reference = spaces[0]->options().kv_dtype;
  if (Status applied = apply_kv_scales(options.kv_scales, DType::kFp8, model); !applied.ok()) {
    return fail(applied);
  }
  print_kv_scales(DType::kFp8, model, kBenchKvError, err);

  std::mt19937_64 random(options.seed);
  std::uniform_int_distribution<std::int32_t> id(0,
                                                 static_cast<std::int32_t>(config.vocab_size) - 1);
  std::vector<PromptError> errors;
  for (std::uint32_t p = 0; p < options.prompts; ++p) {
    std::vector<std::int32_t> prompt(options.prompt_tokens);
    for (std::int32_t& token : prompt) token = id(random);
    // fp8 first: a calibration (--kv-scales calibrate) measures the first prefill, which then
    // also writes the fp8 cache, as a server's first request would.
    Result<std::vector<float>> fp8 = last_logits(model, *spaces[1], prompt);
    if (!fp8.ok()) return fail(fp8.status().with_context("prompt " + std::to_string(p) + ", fp8"));
    Result<std::vector<float>> ref = last_logits(model, *spaces[0], prompt);
    if (!ref.ok()) {
      return fail(ref.status().with_context("prompt " + std::to_string(p) + ", " +
                                            std::string(to_string(reference))));
    }
    errors.push_back(compare(*fp8, *ref));
    if ((p + 1) % 16 == 0 || p + 1 == options.prompts) {
      err << kBenchKvError << ": " << p + 1 << " / " << options.prompts << " prompts\n";
    }
  }

  std::vector<double> relative;
  std::uint32_t agree = 0;
  for (const PromptError& e : errors) {
    relative.push_back(e.relative);
    agree += e.same_greedy;
  }
  std::sort(relative.begin(), relative.end());
  double sum = 0;
  for (double r : relative) sum += r;
  const double mean = sum / static_cast<double>(relative.size());
  const double median = relative[relative.size() / 2];
  const double most = relative.back();
  const std::string scales = model.kv_scales().describe();
  if (options.json) {
    nlohmann::ordered_json json;
    json["model"] = options.model_dir;
    json["architecture"] = config.architecture;
    json["backend"] = std::string(model::to_string(model.backend()));
    json["reference_kv_dtype"] = std::string(to_string(reference));
    json["kv_scales"] = scales;
    json["prompts"] = options.prompts;
    json["prompt_tokens"] = options.prompt_tokens;
    json["seed"] = options.seed;
    json["relative_error"] = {{"mean", mean}, {"median", median}, {"max", most}};
    json["greedy_agree"] = agree;
    out << dump_json(json) << "\n";
  } else {
    out << config.architecture << " on " << model::to_string(model.backend()) << ": "
        << options.prompts << " prompts of " << options.prompt_tokens << " random tokens, fp8 KV ("
        << scales << ") against " << to_string(reference) << " KV\n"
        << "relative error of the last logits (max |fp8 - " << to_string(reference) << "| / max |"
        << to_string(reference) << "|): mean " << mean << ", median " << median << ", max " << most
        << "\n"
        << "greedy token: " << agree << " of " << options.prompts << " agree\n";
  }
  if (Status written = check_written(out, "standard output"); !written.ok()) return fail(written);
  return kExitOk;
}

}  // namespace kvvm::cli
