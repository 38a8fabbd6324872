#include "kit/kv_dtype_flag.h"

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

namespace kvvm::cli {

void add_kv_dtype_flag(CLI::App& cmd, DType& kv_dtype) {
  cmd.add_option_function<std::string>(
         "--kv-dtype",
         [&kv_dtype](const std::string& name) {
           // The check below admits only names parse_dtype knows.
           kv_dtype = parse_dtype(name).value();
         },
         "Element type of the KV cache: bf16, fp16, fp8 or fp32 (default: fp32 on the CPU "
         "backend, the model's compute type on CUDA). fp8 is e4m3 with one scale per layer for "
         "K and one for V (the checkpoint's k_scale / v_scale, else 1.0): half the bytes of "
         "bf16 per token, so about twice the sequences in a KV budget, for a little precision. "
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
  // The CUDA model computes in the checkpoint's 16-bit type (an F32 checkpoint in bf16), and
  // only an fp8 cache is converted on the way in and out.
  const DType compute = config.dtype == DType::kFp16 ? DType::kFp16 : DType::kBf16;
  if (kv_dtype != DType::kFp8 && kv_dtype != compute) {
    return Status::InvalidArgument("--kv-dtype " + name + ": the CUDA model computes in " +
                                   std::string(to_string(compute)) +
                                   " and reads K / V in that type or fp8");
  }
  return Status::Ok();
}

void print_kv_scales(DType kv_dtype, const model::Model& model, std::string_view command,
                     std::ostream& err) {
  if (kv_dtype != DType::kFp8) return;
  err << command << ": fp8 (e4m3) KV scales: " << model.kv_scales().describe() << "\n";
}

}  // namespace kvvm::cli
