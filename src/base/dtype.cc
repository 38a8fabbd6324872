#include "kvvm/base/dtype.h"

#include <cctype>
#include <string>
#include <utility>

namespace kvvm {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp8:
      return "fp8";
    case DType::kFp32:
      return "fp32";
    case DType::kUnset:
      return "unset";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view text) {
  std::string name;
  for (char c : text) name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // torch spells its dtypes "torch.float16" in some older config.json files.
  if (name.starts_with("torch.")) name.erase(0, 6);
  static constexpr std::pair<const char*, DType> kNames[] = {
      {"fp16", DType::kFp16},  {"float16", DType::kFp16},      {"half", DType::kFp16},
      {"bf16", DType::kBf16},  {"bfloat16", DType::kBf16},     {"fp8", DType::kFp8},
      {"float8", DType::kFp8}, {"float8_e4m3fn", DType::kFp8}, {"float8_e5m2", DType::kFp8},
      {"fp32", DType::kFp32},  {"float32", DType::kFp32},      {"float", DType::kFp32},
  };
  for (const auto& [known, dtype] : kNames) {
    if (name == known) return dtype;
  }
  return Status::InvalidArgument("unknown dtype '" + std::string(text) +
                                 "'; known: fp16 (float16, half), bf16 (bfloat16), fp8 "
                                 "(float8, float8_e4m3fn, float8_e5m2), fp32 (float32, float)");
}

}  // namespace kvvm
