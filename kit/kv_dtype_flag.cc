#include "kit/kv_dtype_flag.h"

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

#include "kvvm/engine/kv_space.h"

namespace kvvm::cli {

void add_kv_dtype_flag(CLI::App& cmd, DType& kv_dtype) {
  cmd.add_option_function<std::string>(
         "--kv-dtype",
         [&kv_dtype](const std::string& name) {
           // The check below admits only names parse_dtype knows.
           kv_dtype = parse_dtype(name).value();
         },
         "Element type of the KV cache: bf16, fp16, fp8 or fp32 (default: fp32 on the CPU "
         "backend, the model's compute type on CUDA). fp8 is e4m3 with one scale per layer (or "
         "per layer and KV head) for K and one for V (see --kv-scales): half the bytes of bf16 "
         "per token, so about twice the sequences in a KV budget, for a little precision. "
         "fp32 only on the CPU backend; on CUDA a 16-bit type must be the model's compute type")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8", "fp32"}))
      ->type_name("TYPE");
}

Status check_kv_dtype(DType kv_dtype, const model::Model& model, const model::ModelConfig& config) {
  if (kv_dtype == DType::kUnset || model.backend() != model::Backend::kCuda) return Status::Ok();
  const std::string name(to_string(kv_dtype));
  if (kv_dtype == DType::kFp32) {
    return Status::InvalidArgument(
        "--kv-dtype fp32: the CUDA attention kernels read K / V in "
        "fp16, bf16 or fp8; fp32 runs on --backend cpu only");
  }
  // Only an fp8 cache is converted on the way in and out; a 16-bit one is the compute type.
  const DType compute = engine::default_kv_dtype(config, model::Backend::kCuda);
  if (kv_dtype != DType::kFp8 && kv_dtype != compute) {
    return Status::InvalidArgument("--kv-dtype " + name + ": the CUDA model computes in " +
                                   std::string(to_string(compute)) +
                                   " and reads K / V in that type or fp8");
  }
  return Status::Ok();
}

void add_kv_scales_flag(CLI::App& cmd, std::string& kv_scales) {
  cmd.add_option("--kv-scales", kv_scales,
                 "Where an fp8 KV cache's scales come from: checkpoint (its k_scale / v_scale "
                 "tensors, one per layer or per layer and KV head, else 1.0, the range of e4m3 "
                 "itself) or calibrate (measured over the first prefill: each layer's largest "
                 "|K| and |V| map to 224, half of e4m3's 448, leaving room for later tokens "
                 "twice as large; logged once measured)")
      ->check(CLI::IsMember({"checkpoint", "calibrate"}))
      ->type_name("FROM")
      ->default_str("checkpoint");
}

Status apply_kv_scales(const std::string& kv_scales, DType kv_dtype, model::Model& model) {
  if (kv_scales != "calibrate") return Status::Ok();
  if (kv_dtype != DType::kFp8) {
    return Status::InvalidArgument("--kv-scales calibrate: the KV cache is " +
                                   std::string(to_string(kv_dtype)) +
                                   "; scales are for --kv-dtype fp8");
  }
  return model.calibrate_kv_scales();
}

void print_kv_scales(DType kv_dtype, const model::Model& model, std::string_view command,
                     std::ostream& err) {
  if (kv_dtype != DType::kFp8) return;
  err << command << ": fp8 (e4m3) KV scales: ";
  if (model.kv_calibration_pending()) {
    err << "measured over the first prefill (its largest |K| and |V| per layer map to "
        << model::kCalibrationRange << ")\n";
  } else {
    err << model.kv_scales().describe() << "\n";
  }
}

}  // namespace kvvm::cli
