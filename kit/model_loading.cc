#include "kit/model_loading.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <ostream>
#include <utility>

#include "kit/load_progress_printer.h"
#include "kvvm/model/kv_config.h"
#include "kvvm/model/safetensors.h"
#include "kvvm/model/weights.h"
#include "kvvm/vmm/cuda_driver.h"
#include "kvvm/vmm/host_driver.h"

namespace kvvm::cli {
namespace {

namespace fs = std::filesystem;

// Keeps `driver` and a fresh governor in `loaded` and lends both to the weights, whose load
// tells `progress`.
model::WeightOptions lend(LoadedModel& loaded, std::unique_ptr<Driver> driver,
                          const WeightFlags& flags, const model::LoadProgressCallback& progress) {
  loaded.driver = std::move(driver);
  loaded.governor = std::make_unique<Governor>();
  model::WeightOptions placement = weight_options(flags);
  placement.driver = loaded.driver.get();
  placement.governor = loaded.governor.get();
  placement.on_progress = progress;
  return placement;
}

// Makes the model on a driver of the backend chosen and a governor, both kept in `loaded`.
Status make_model(const std::string& backend, const model::ModelWeights& weights,
                  const WeightFlags& flags, const model::LoadProgressCallback& progress,
                  std::string_view command, std::ostream& err, LoadedModel& loaded) {
  if (backend == "cuda" || (backend == "auto" && cuda_available())) {
    Status made = [&]() -> Status {
      KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, make_cuda_driver());
      model::CudaModelOptions options;
      options.weights = lend(loaded, std::move(driver), flags, progress);
      KVVM_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> cuda,
                            model::make_cuda_model(loaded.config, weights, options));
      loaded.model = std::move(cuda);
      return Status::Ok();
    }();
    if (made.ok()) return made;
    loaded.governor.reset();
    loaded.driver.reset();
    // A model that does not fit is the user's to resolve (--weight-budget), not a reason to
    // fall back to a CPU run they did not ask for.
    if (backend == "cuda" || made.code() == StatusCode::kResourceExhausted) {
      return made.with_context("--backend " + backend);
    }
    err << command << ": note: a GPU is present but the CUDA model could not be made ("
        << made.to_string() << "); running on the CPU\n";
  }
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, make_host_driver());
  model::CpuModelOptions options;
  options.weights = lend(loaded, std::move(driver), flags, progress);
  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> cpu,
                        model::make_cpu_model(loaded.config, weights, options));
  loaded.model = std::move(cpu);
  return Status::Ok();
}

// A --model value without a slash or ".json": a built-in model's name, or a folder here.
bool bare_name(std::string_view model) {
  return !model.empty() && model.find('/') == model.npos && !model.ends_with(".json");
}

std::string builtin_names() {
  std::string names;
  for (const std::string& name : model::builtin_model_names()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

std::string here() {
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  return ec ? std::string("the working directory") : "'" + cwd.string() + "'";
}

}  // namespace

Status check_model_dir(const std::string& dir, bool weights_needed) {
  std::error_code ec;
  if (!fs::exists(dir, ec) && bare_name(dir)) {
    return Status::InvalidArgument("--model " + dir + ": no folder '" + dir + "' in " + here() +
                                   "; the built-in models (" + builtin_names() +
                                   ") are KV shapes for plan and simulate, without weights to "
                                   "load: give a checkpoint folder");
  }
  if (!fs::exists(dir, ec))
    return Status::InvalidArgument("--model " + dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument("--model " + dir + ": not a directory");
  }
  const fs::path root(dir);
  const char* kLooksLike =
      " (a Hugging Face checkpoint directory holds config.json, tokenizer.json and "
      "model.safetensors)";
  for (const char* name : {"config.json", "tokenizer.json"}) {
    if (!fs::exists(root / name, ec)) {
      return Status::InvalidArgument("--model " + dir + ": " + (root / name).string() +
                                     " not found" + kLooksLike);
    }
  }
  if (weights_needed && !fs::exists(root / "model.safetensors", ec) &&
      !fs::exists(root / "model.safetensors.index.json", ec)) {
    return Status::InvalidArgument("--model " + dir + ": no weights: neither " +
                                   (root / "model.safetensors").string() + " nor " +
                                   (root / "model.safetensors.index.json").string() + " exists");
  }
  return Status::Ok();
}

namespace {

// The config.json a --model value names, or nullopt for a built-in model's name (or an empty
// value: the default built-in).
std::optional<std::string> config_path(const std::string& model) {
  std::error_code ec;
  const bool folder_here = bare_name(model) && fs::is_directory(model, ec);
  if (model.empty() || (bare_name(model) && !folder_here)) return std::nullopt;
  std::string path = folder_here ? "./" + model : model;
  // A model folder as downloaded from the Hub holds its config.json.
  if (fs::is_directory(path, ec)) path += "/config.json";
  return path;
}

Result<model::ModelConfig> builtin_config(const std::string& model) {
  Result<model::ModelConfig> builtin = model::builtin_model_config(model);
  if (builtin.ok() || model.empty()) return builtin;
  return Status::InvalidArgument("'" + model + "' is neither a built-in model (" + builtin_names() +
                                 ") nor a folder in " + here() +
                                 " (no folder of that name); give a built-in name, a model "
                                 "folder or its config.json");
}

}  // namespace

Result<Geometry> resolve_model_geometry(const std::string& model, std::optional<DType> dtype) {
  const std::optional<std::string> path = config_path(model);
  if (!path) {
    KVVM_ASSIGN_OR_RETURN(model::ModelConfig builtin, builtin_config(model));
    // The built-in shapes are sized at fp16 unless told otherwise, whatever the checkpoint's.
    return model::kv_geometry(builtin, dtype.value_or(DType::kFp16));
  }
  KVVM_ASSIGN_OR_RETURN(model::ModelConfig config, model::load_kv_config(*path, dtype.has_value()));
  return model::kv_geometry(config, dtype);
}

Result<model::ModelConfig> resolve_model_config(const std::string& model) {
  const std::optional<std::string> path = config_path(model);
  return path ? model::load_config_file(*path) : builtin_config(model);
}

Result<LoadedModel> load_model(const std::string& dir, const std::string& backend,
                               std::string_view command, std::ostream& err,
                               const WeightFlags& flags) {
  const bool dummy = dummy_weights(flags);
  KVVM_RETURN_IF_ERROR(check_model_dir(dir, !dummy));
  const fs::path root(dir);
  LoadedModel loaded;
  KVVM_ASSIGN_OR_RETURN(model::ModelConfig config, model::load_model_config(dir));
  loaded.config = std::move(config);

  KVVM_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                        tokenizer::Tokenizer::load((root / "tokenizer.json").string()));
  loaded.tokenizer = std::move(tok);

  // The weights are mapped only while the model copies (CPU: converts) them.
  std::unique_ptr<model::WeightFiles> files;
  model::ModelWeights weights;
  if (!dummy) {
    KVVM_ASSIGN_OR_RETURN(std::unique_ptr<model::WeightFiles> opened,
                          model::WeightFiles::open_dir(dir));
    files = std::move(opened);
    KVVM_ASSIGN_OR_RETURN(model::ModelWeights bound, model::bind_weights(loaded.config, *files));
    weights = std::move(bound);
  }
  {
    // A terminal gets one line rewritten in place, cleared before the weights' line below; a
    // log (or a test's stream) one line per shard.
    const bool terminal = &err == &std::cerr && ::isatty(STDERR_FILENO) == 1;
    LoadProgressPrinter printer(err, command, terminal);
    KVVM_RETURN_IF_ERROR(make_model(
        backend, weights, flags, [&printer](const model::LoadProgress& p) { printer(p); }, command,
        err, loaded));
  }
  const model::WeightStats stats = loaded.model->weight_stats();
  err << command << ": " << stats.split.describe() << (dummy ? " (dummy weights)" : "") << "\n";
  return loaded;
}

Result<std::unique_ptr<model::Model>> load_draft_model(const std::string& dir,
                                                       const LoadedModel& target,
                                                       std::string_view command,
                                                       std::ostream& err) {
  const std::string flag = "--speculative-config \"model\" " + dir;
  KVVM_RETURN_IF_ERROR(check_model_dir(dir).with_context(flag));
  Result<model::ModelConfig> config = model::load_model_config(dir);
  if (!config.ok()) return config.status().with_context(flag);
  // Heard before the weights are read.
  if (config->vocab_size != target.config.vocab_size) {
    return Status::InvalidArgument(flag + ": vocab_size " + std::to_string(config->vocab_size) +
                                   ", the model's is " + std::to_string(target.config.vocab_size) +
                                   " (a draft model must share the target's vocabulary)");
  }
  Result<std::unique_ptr<model::WeightFiles>> files = model::WeightFiles::open_dir(dir);
  if (!files.ok()) return files.status().with_context(flag);
  Result<model::ModelWeights> weights = model::bind_weights(*config, **files);
  if (!weights.ok()) return weights.status().with_context(flag);
  model::WeightOptions placement = weight_options(WeightFlags{});
  placement.driver = target.driver.get();
  placement.governor = target.governor.get();
  Result<std::unique_ptr<model::Model>> made = Status::Internal("no backend");
  if (target.model->backend() == model::Backend::kCuda) {
    model::CudaModelOptions options;
    options.weights = placement;
    made = model::make_cuda_model(*config, *weights, options);
  } else {
    model::CpuModelOptions options;
    options.weights = placement;
    made = model::make_cpu_model(*config, *weights, options);
  }
  if (!made.ok()) return made.status().with_context(flag);
  err << command << ": draft model " << config->architecture << " (" << config->layers
      << " layers) from " << dir << ": " << (*made)->weight_stats().split.describe() << "\n";
  return made;
}

}  // namespace kvvm::cli
