// Loading a Hugging Face checkpoint directory for a kvvm command (`kvvm generate`, `kvvm
// serve`): its config, tokenizer and a model on the backend asked for.
//
// Why the checks before the loaders: a user who mistyped a directory should hear which path
// is missing, not a parser's complaint about the first file it tried, so the directory,
// config.json, tokenizer.json and the weights are each looked for and named first.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kit/weight_flags.h"
#include "kvvm/base/status.h"
#include "kvvm/governor/governor.h"
#include "kvvm/kv/geometry.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"
#include "kvvm/tokenizer/tokenizer.h"
#include "kvvm/vmm/driver.h"

namespace kvvm::cli {

// InvalidArgument naming the missing directory or file (config.json, tokenizer.json, the
// weights unless `weights_needed` is false: the dummy load format). A bare name that is no
// folder here is told apart from a built-in model's name, which generate and serve cannot load
// (the built-ins are KV shapes, without weights).
Status check_model_dir(const std::string& dir, bool weights_needed = true);

// The KV geometry a --model value names, for plan, simulate and bench alike: a built-in model's
// name (fp16 unless `dtype` says otherwise), a path to a config.json, or a folder holding one
// (with a slash, or a bare name that is a folder in the working directory). A config.json is
// read by the model layer's parser for its KV shape only (model::load_kv_config), so any
// decoder's file will do; `dtype` overrides its torch_dtype. A bare name that is neither is
// refused naming the built-in names and the folder that does not exist.
Result<Geometry> resolve_model_geometry(const std::string& model, std::optional<DType> dtype);

// A model with the memory it stands on: the driver of its backend and the governor whose
// `weights` tier holds its weights. The caller builds the KV space on the same two
// (KvSpaceOptions::driver and ::governor), so weights and KV share one device budget; declared
// first, they outlive the model.
// The whole config a --model value names (as resolve_model_geometry reads it, every field: the
// weights' shapes too), for what sizes the weights (`kvvm plan --weight-budget`).
Result<model::ModelConfig> resolve_model_config(const std::string& model);

struct LoadedModel {
  std::unique_ptr<Driver> driver;
  std::unique_ptr<Governor> governor;
  model::ModelConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<model::Model> model;
};

// `backend`: auto (CUDA when a device is usable and the CUDA model can be made, else the CPU,
// with a note on `err` naming `command` when a GPU was there), cpu or cuda. The weights are
// placed as `weights` says; the split is written to `err` (one line naming `command`). The
// checkpoint's load goes to `err` as it runs (kit/load_progress_printer.h): a line rewritten in
// place when `err` is std::cerr on a terminal, else one line per shard.
Result<LoadedModel> load_model(const std::string& dir, const std::string& backend,
                               std::string_view command, std::ostream& err,
                               const WeightFlags& weights = {});

// A draft model for speculative decoding (--speculative-config's "model"): the checkpoint in
// `dir` on `target`'s backend, its weights a tier of `target`'s governor on `target`'s driver
// (all resident), so both models and both KV caches share one device budget. InvalidArgument
// naming the flag and the path for a directory check_model_dir refuses, and naming both sizes
// for a vocabulary other than the target's. Its load is one line on `err`.
// REQUIRES: `target` outlives the draft.
Result<std::unique_ptr<model::Model>> load_draft_model(const std::string& dir,
                                                       const LoadedModel& target,
                                                       std::string_view command, std::ostream& err);

}  // namespace kvvm::cli
