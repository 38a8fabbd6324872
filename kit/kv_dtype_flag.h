// The KV cache options `generate`, `serve` and `bench engine` share (--kv-dtype and, for an
// fp8 cache, --kv-scales), their checks against the backend the model landed on, and what
// their start-up lines say about them.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

#include "kvvm/base/dtype.h"
#include "kvvm/base/status.h"
#include "kvvm/model/config.h"
#include "kvvm/model/model.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvvm::cli {

// Adds --kv-dtype (bf16, fp16, fp8 or fp32) to `cmd`, bound to `kv_dtype`, which stays kUnset
// (the KV space's default: fp32 on the CPU, the model's compute type on CUDA) unless given.
void add_kv_dtype_flag(CLI::App& cmd, DType& kv_dtype);

// InvalidArgument naming --kv-dtype and the value when `model`'s backend cannot read K / V of
// that type: on CUDA, fp32 or a 16-bit type other than the model's compute type. Checked once
// the backend is known (--backend auto may land on either), before the KV space is made, so
// a server does not start only to fail its first request.
Status check_kv_dtype(DType kv_dtype, const model::Model& model, const model::ModelConfig& config);

// Adds --kv-scales (checkpoint or calibrate) to `cmd`, bound to `kv_scales` ("checkpoint"
// unless given).
void add_kv_scales_flag(CLI::App& cmd, std::string& kv_scales);

// "calibrate": the model measures its scales over the first prefill
// (Model::calibrate_kv_scales); InvalidArgument naming both flags when the cache (the default
// resolved) is not fp8. "checkpoint": the scales the model loaded with.
Status apply_kv_scales(const std::string& kv_scales, DType kv_dtype, model::Model& model);

// For an fp8 cache, one line on `err` naming `command` with the scales K and V are stored
// with (model.kv_scales().describe(), or that the first prefill will measure them); nothing
// for another element type.
void print_kv_scales(DType kv_dtype, const model::Model& model, std::string_view command,
                     std::ostream& err);

}  // namespace kvvm::cli
